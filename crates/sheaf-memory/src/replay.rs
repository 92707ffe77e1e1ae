//! [`MemoryReplayStore`]: bulk replays' progress in memory, on the process's clock.
//!
//! With the memory stores only one process uses them, so nothing here is shared with another
//! process; the store still keeps the lease rule, so the service runs the same code (and a
//! replay whose task stopped is resumed by the same process) on every backend.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use sheaf_store::{
    Error, NewReplay, Replay, ReplayLease, ReplayProgress, ReplaySaved, ReplayState, ReplayStep,
    ReplayStore, Result, TenantId, Timestamp, validate_lease, validate_replay_step,
};
use uuid::Uuid;

/// The replay store in memory. Cheap to share: wrap it in an `Arc` (`Arc<dyn ReplayStore>`).
#[derive(Default)]
pub struct MemoryReplayStore {
    replays: Mutex<HashMap<Uuid, Replay>>,
}

impl MemoryReplayStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Debug for MemoryReplayStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryReplayStore")
            .field("replays", &self.replays.lock().len())
            .finish()
    }
}

/// `now + lease`, but later than `previous`: a renewal or takeover always ends after every
/// lease before it on the same replay, which is what makes an old lease lost.
fn lease_end(now: Timestamp, lease: Duration, previous: Option<Timestamp>) -> Timestamp {
    let end = now.saturating_add(lease);
    match previous {
        Some(previous) if end <= previous => previous.saturating_add(Duration::from_micros(1)),
        _ => end,
    }
}

/// `now`, or `previous` if the clock has not passed it: `updated_at` never goes back.
fn touch(previous: Timestamp) -> Timestamp {
    Timestamp::now().max(previous)
}

fn holds(replay: &Replay, lease: &ReplayLease) -> bool {
    replay.state == ReplayState::Running
        && replay.owner == Some(lease.owner)
        && replay.lease_until == Some(lease.lease_until)
}

#[async_trait]
impl ReplayStore for MemoryReplayStore {
    async fn create_replay(
        &self,
        replay: &NewReplay,
        owner: Uuid,
        lease: Duration,
    ) -> Result<(Replay, ReplayLease)> {
        validate_lease(lease)?;
        let mut replays = self.replays.lock();
        if replays.contains_key(&replay.id) {
            return Err(Error::conflict(format!("replay {} exists", replay.id)));
        }
        let now = Timestamp::now();
        let lease_until = lease_end(now, lease, None);
        let stored = Replay {
            id: replay.id,
            tenant_id: replay.tenant_id.clone(),
            request: replay.request.clone(),
            state: ReplayState::Running,
            progress: ReplayProgress::default(),
            error: None,
            started_at: now,
            updated_at: now,
            finished_at: None,
            owner: Some(owner),
            lease_until: Some(lease_until),
            takeovers: 0,
        };
        replays.insert(replay.id, stored.clone());
        Ok((
            stored,
            ReplayLease {
                replay_id: replay.id,
                owner,
                lease_until,
            },
        ))
    }

    async fn get_replay(&self, tenant: &TenantId, id: Uuid) -> Result<Option<Replay>> {
        Ok(self
            .replays
            .lock()
            .get(&id)
            .filter(|r| r.tenant_id == *tenant)
            .cloned())
    }

    async fn save_replay(
        &self,
        lease: &ReplayLease,
        progress: &ReplayProgress,
        step: &ReplayStep,
    ) -> Result<ReplaySaved> {
        validate_replay_step(step)?;
        let mut replays = self.replays.lock();
        let Some(replay) = replays
            .get_mut(&lease.replay_id)
            .filter(|r| holds(r, lease))
        else {
            return Ok(ReplaySaved::Lost);
        };
        let now = touch(replay.updated_at);
        replay.progress = progress.clone();
        replay.updated_at = now;
        match step {
            ReplayStep::Continue { lease: length } => {
                let lease_until = lease_end(now, *length, replay.lease_until);
                replay.lease_until = Some(lease_until);
                return Ok(ReplaySaved::Renewed(ReplayLease {
                    lease_until,
                    ..*lease
                }));
            }
            ReplayStep::Release => {}
            ReplayStep::Complete => {
                replay.state = ReplayState::Completed;
                replay.finished_at = Some(now);
            }
            ReplayStep::Fail { error } => {
                replay.state = ReplayState::Failed;
                replay.error = Some(error.clone());
                replay.finished_at = Some(now);
            }
        }
        replay.owner = None;
        replay.lease_until = None;
        Ok(ReplaySaved::Ended)
    }

    async fn take_over_replays(
        &self,
        owner: Uuid,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<(Replay, ReplayLease)>> {
        validate_lease(lease)?;
        let mut replays = self.replays.lock();
        let now = Timestamp::now();
        let mut free: Vec<&mut Replay> = replays
            .values_mut()
            .filter(|r| {
                r.state == ReplayState::Running && r.lease_until.is_none_or(|until| until < now)
            })
            .collect();
        free.sort_by_key(|r| (r.started_at, r.id));
        Ok(free
            .into_iter()
            .take(max)
            .map(|replay| {
                let lease_until = lease_end(now, lease, replay.lease_until);
                replay.owner = Some(owner);
                replay.lease_until = Some(lease_until);
                replay.takeovers = replay.takeovers.saturating_add(1);
                replay.updated_at = touch(replay.updated_at);
                let taken = ReplayLease {
                    replay_id: replay.id,
                    owner,
                    lease_until,
                };
                (replay.clone(), taken)
            })
            .collect())
    }

    async fn delete_finished_replays(&self, before: Timestamp, max: usize) -> Result<u64> {
        let mut replays = self.replays.lock();
        let mut old: Vec<(Timestamp, Uuid)> = replays
            .values()
            .filter_map(|r| r.finished_at.filter(|f| *f < before).map(|f| (f, r.id)))
            .collect();
        old.sort();
        old.truncate(max);
        for (_, id) in &old {
            replays.remove(id);
        }
        Ok(old.len() as u64)
    }
}
