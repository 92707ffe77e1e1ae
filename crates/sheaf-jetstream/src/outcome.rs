//! What each outcome of a held job makes of its record, and the lease rule they share.

use std::time::Duration;

use sheaf_store::{DeadLetterRequest, Lease, Reschedule, Timestamp};

use crate::index::{Dead, Record};
use crate::write::Change;

/// What an outcome makes of a held job's record.
pub(crate) type Outcome<'a> = Box<dyn Fn(&Record) -> Change + Send + Sync + 'a>;

/// Removing completed jobs, as outcomes of their leases.
pub(crate) fn completions(leases: &[Lease]) -> Vec<(Lease, Outcome<'_>)> {
    leases
        .iter()
        .map(|&l| {
            let change: Outcome<'_> = Box::new(|_: &Record| Change::Delete);
            (l, change)
        })
        .collect()
}

/// Moving jobs to a later attempt, as outcomes of their leases.
pub(crate) fn reschedules(jobs: &[Reschedule]) -> Vec<(Lease, Outcome<'_>)> {
    jobs.iter()
        .map(|r| {
            let change: Outcome<'_> = Box::new(move |record: &Record| {
                let mut record = record.clone();
                record.job.due_at = r.due_at;
                record.job.attempt_number = r.attempt_number;
                record.job.last_attempt_time = r.last_attempt_time;
                record.claimed_until = None;
                Change::Put(record)
            });
            (r.lease, change)
        })
        .collect()
}

/// Giving up on jobs at `now`, as outcomes of their leases.
pub(crate) fn dead_letters(
    jobs: &[DeadLetterRequest],
    now: Timestamp,
) -> Vec<(Lease, Outcome<'_>)> {
    jobs.iter()
        .map(|r| {
            let change: Outcome<'_> = Box::new(move |record: &Record| {
                let mut record = record.clone();
                record.claimed_until = None;
                record.dead = Some(Dead {
                    reason: r.reason.clone(),
                    at: now,
                    holds_key: r.hold_key && record.job.order_key.is_some(),
                });
                Change::Put(record)
            });
            (r.lease, change)
        })
        .collect()
}

/// Whether `lease` is the claim on `record`.
pub(crate) fn holds(record: &Record, lease: &Lease) -> bool {
    record.dead.is_none() && record.claimed_until == Some(lease.claimed_until)
}

/// `now + lease`, moved past `previous` if the clock would not get there, so that a claim is
/// later than every earlier claim on the job.
pub(crate) fn lease_end(now: Timestamp, lease: Duration, previous: Option<Timestamp>) -> Timestamp {
    let end = now.saturating_add(lease);
    match previous {
        Some(previous) if end <= previous => previous.saturating_add(Duration::from_micros(1)),
        _ => end,
    }
}
