//! [`Pacer`]: when a delivery to a destination may start, in this process, so that a
//! destination's rate limit holds across every process sharing the queue without a database
//! round trip per delivery, and a `Retry-After` slows down all its deliveries.
//!
//! # How the limit is shared
//!
//! Each process takes an equal share of a destination's `rate_limit.per_second`: the limit
//! divided by the number of processes delivering from the queue, which the queue's heartbeat
//! counts every few seconds (`JobQueue::heartbeat`). Within a process the share is a schedule of
//! slots, one every `processes / per_second` seconds per destination. A claimed job whose slot
//! has not come is not delivered: it is rescheduled to its slot (not an attempt, so it does not
//! count towards the retry limit), and its slot is kept for it, so it goes when it comes back
//! instead of queueing again. The reschedules go through the completer's batched writes like
//! every outcome.
//!
//! A held job rarely comes back exactly at its slot: claims poll, and a busy process claims late.
//! Jobs that come back late would start close together with the jobs whose slots come next, so
//! every start is also checked against the process's recent starts: at most `N` in any window of
//! `N` slots (a second's worth, at most [`WINDOW_STARTS`]); a job that would exceed that is held
//! until the window has room, keeping its place. So every process starts at most its share per
//! second, measured at any instant, and all of them together start at most the limit. A held job
//! may come back to another process, which does not know its slot: it
//! takes a slot of its own there, so the job waits a little longer but no share is exceeded.
//! While processes start or stop, the count is up to one heartbeat behind, and the share with it.
//!
//! # Pauses
//!
//! An answer with `Retry-After` (or a 429) pauses the destination in this process: no delivery
//! to it starts before the pause ends, whichever job it is. Other processes learn of it from
//! their own deliveries' answers.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sheaf_store::{DestinationId, JobId, RateLimit};
use tokio::time::Instant;

/// A job that comes back this much before its slot still takes it (claims are not exact).
const EARLY: Duration = Duration::from_millis(5);

/// Slots kept for jobs that have not come back this long after their slot are forgotten (the
/// job went to another process, or its destination changed).
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// The most recent starts a destination's lane remembers to check its share against: the window
/// is this many slots long, or a second's worth when that is fewer.
const WINDOW_STARTS: usize = 100;

/// Whether a delivery may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Deliver now.
    Go,
    /// Not before this long from now: reschedule the job to then.
    Hold(Duration),
}

#[derive(Debug, Default)]
struct Lane {
    /// The earliest instant the next new slot may be.
    next_free: Option<Instant>,
    /// Slots handed to held jobs, by job.
    reserved: HashMap<JobId, Instant>,
    /// When the last deliveries under a limit started, oldest first (at most a window's worth).
    started: VecDeque<Instant>,
}

impl Lane {
    /// Records a start at `now` if the window of the last `interval`-spaced slots has room;
    /// otherwise says when it will have.
    fn start(&mut self, now: Instant, interval: Duration) -> Result<(), Instant> {
        if interval.is_zero() {
            return Ok(());
        }
        let per_second = (Duration::from_secs(1).as_secs_f64() / interval.as_secs_f64()) as usize;
        let capacity = per_second.clamp(1, WINDOW_STARTS);
        let window = interval * capacity as u32;
        while self
            .started
            .front()
            .is_some_and(|first| *first + window <= now)
        {
            self.started.pop_front();
        }
        if self.started.len() >= capacity {
            return Err(self.started[0] + window);
        }
        self.started.push_back(now);
        Ok(())
    }
}

/// The process's delivery schedule per destination.
#[derive(Debug)]
pub struct Pacer {
    lanes: Mutex<HashMap<DestinationId, Lane>>,
    /// Processes delivering from the queue, as its last heartbeat counted them.
    processes: AtomicU32,
}

impl Pacer {
    /// A pacer for a process alone on its queue until the first heartbeat says otherwise.
    pub fn new() -> Self {
        Pacer {
            lanes: Mutex::new(HashMap::new()),
            processes: AtomicU32::new(1),
        }
    }

    /// Records how many processes share the queue (at least 1).
    pub fn set_processes(&self, count: u32) {
        self.processes.store(count.max(1), Ordering::Relaxed);
    }

    /// How many processes share the queue, as last recorded.
    pub fn processes(&self) -> u32 {
        self.processes.load(Ordering::Relaxed)
    }

    /// Whether `job` to `destination` may start now, under `limit` and any pause.
    pub fn admit(
        &self,
        destination: DestinationId,
        job: JobId,
        limit: Option<RateLimit>,
    ) -> Admission {
        let now = Instant::now();
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        if limit.is_none() && !lanes.contains_key(&destination) {
            return Admission::Go;
        }
        let interval = limit.map_or(Duration::ZERO, |limit| {
            Duration::from_secs_f64(f64::from(self.processes()) / f64::from(limit.per_second))
        });
        let lane = lanes.entry(destination).or_default();
        if let Some(slot) = lane.reserved.get(&job).copied() {
            if slot > now + EARLY {
                return Admission::Hold(slot - now);
            }
            return match lane.start(now, interval) {
                Ok(()) => {
                    lane.reserved.remove(&job);
                    Admission::Go
                }
                Err(room) => {
                    lane.reserved.insert(job, room);
                    Admission::Hold(room - now)
                }
            };
        }
        let slot = lane.next_free.map_or(now, |free| free.max(now));
        lane.next_free = Some(slot + interval);
        if lane.reserved.len() > 1_000 {
            lane.reserved.retain(|_, kept| *kept + FORGET_AFTER > now);
        }
        if slot <= now + EARLY {
            match lane.start(now, interval) {
                Ok(()) => {
                    if limit.is_none() && lane.reserved.is_empty() {
                        // The pause is over and nothing waits: the destination is unpaced again.
                        lanes.remove(&destination);
                    }
                    return Admission::Go;
                }
                Err(room) => {
                    lane.reserved.insert(job, room);
                    return Admission::Hold(room - now);
                }
            }
        }
        lane.reserved.insert(job, slot);
        Admission::Hold(slot - now)
    }

    /// Pauses `destination`: no delivery to it starts within `pause` from now.
    pub fn pause(&self, destination: DestinationId, pause: Duration) {
        let until = Instant::now() + pause;
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let lane = lanes.entry(destination).or_default();
        lane.next_free = Some(lane.next_free.map_or(until, |free| free.max(until)));
    }
}

impl Default for Pacer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(admission: Admission) -> Duration {
        match admission {
            Admission::Hold(wait) => wait,
            Admission::Go => Duration::ZERO,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn slots_follow_the_share_of_the_limit_and_held_jobs_keep_theirs() {
        let pacer = Pacer::new();
        let d = DestinationId::generate();
        let limit = Some(RateLimit::new(50).unwrap());
        let jobs: Vec<JobId> = (0..5).map(|_| JobId::generate()).collect();
        assert_eq!(pacer.admit(d, jobs[0], limit), Admission::Go);
        let waits: Vec<Duration> = jobs[1..]
            .iter()
            .map(|j| held(pacer.admit(d, *j, limit)))
            .collect();
        assert_eq!(
            waits,
            [20, 40, 60, 80].map(Duration::from_millis),
            "one slot every 20 ms at 50/s"
        );
        // Back at its slot, a held job goes, without taking a new one.
        tokio::time::advance(Duration::from_millis(40)).await;
        assert_eq!(pacer.admit(d, jobs[2], limit), Admission::Go);
        assert_eq!(
            held(pacer.admit(d, jobs[3], limit)),
            Duration::from_millis(20),
            "early: it waits for its own slot"
        );
        // Two processes: each takes half, one slot every 40 ms.
        pacer.set_processes(2);
        let other = DestinationId::generate();
        assert_eq!(pacer.admit(other, JobId::generate(), limit), Admission::Go);
        assert_eq!(
            held(pacer.admit(other, JobId::generate(), limit)),
            Duration::from_millis(40)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn held_jobs_that_come_back_late_do_not_burst_past_the_share() {
        let pacer = Pacer::new();
        let d = DestinationId::generate();
        let limit = Some(RateLimit::new(10).unwrap());
        // Ten jobs take the first second's ten slots; the nine held ones all come back late,
        // together, just as the next second's jobs arrive on time.
        let first: Vec<JobId> = (0..10).map(|_| JobId::generate()).collect();
        let mut started = 0;
        for job in &first {
            if pacer.admit(d, *job, limit) == Admission::Go {
                started += 1;
            }
        }
        assert_eq!(started, 1);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        let mut went = Vec::new();
        for job in first.iter().skip(1) {
            if pacer.admit(d, *job, limit) == Admission::Go {
                went.push(*job);
            }
        }
        assert_eq!(
            went.len(),
            9,
            "late slots may still be used, within the window"
        );
        assert_eq!(
            pacer.admit(d, JobId::generate(), limit),
            Admission::Go,
            "the tenth start in the last second"
        );
        let next = JobId::generate();
        assert_eq!(
            held(pacer.admit(d, next, limit)),
            Duration::from_millis(100)
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(
            held(pacer.admit(d, next, limit)),
            Duration::from_millis(900),
            "its slot has come, but the last second already had its ten starts"
        );
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(
            pacer.admit(d, next, limit),
            Admission::Go,
            "it keeps its place"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_delivery_of_its_destination_then_ends() {
        let pacer = Pacer::new();
        let d = DestinationId::generate();
        assert_eq!(pacer.admit(d, JobId::generate(), None), Admission::Go);
        pacer.pause(d, Duration::from_secs(2));
        assert_eq!(
            held(pacer.admit(d, JobId::generate(), None)),
            Duration::from_secs(2)
        );
        assert_eq!(
            pacer.admit(DestinationId::generate(), JobId::generate(), None),
            Admission::Go,
            "other destinations go on"
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(pacer.admit(d, JobId::generate(), None), Admission::Go);
    }
}
