//! The delivery engine: one dispatcher, a pool of workers and one completer per process.
//!
//! ```text
//!  JobQueue ──claim(free slots)──> dispatcher ──bounded channel (capacity = workers)──> workers
//!     ^                                                                                   │
//!     └── complete / reschedule / dead-letter, batched ── completer <── outcome ──────────┘
//! ```
//!
//! - The **group commit** of publishes ([`crate::state::handoff`]) leases the jobs of the events
//!   it accepts to this process in the same commit, as many as the channel has free slots, and
//!   puts them in the channel itself: most first deliveries are never claimed.
//! - The **dispatcher** ([`dispatcher`]) is the only task that claims, so claim queries scale
//!   with processes, not with workers × processes. It claims only as many jobs as the channel
//!   has free slots, so claimed-but-unstarted work is bounded by the worker count and a
//!   saturated process leaves due jobs to others. When a claim returns fewer jobs than it had room for
//!   it sleeps `SHEAF_QUEUE_POLL_INTERVAL`, or until a publish in this process wakes it.
//! - A **worker** ([`worker`]) takes a job from the channel (never from the database), renews
//!   its lease first when more than half of it is spent, resolves what to send — a first
//!   delivery's payload from the fresh-event cache or the coalesced event read; a retry's
//!   through the coalesced latest-attempt lookup — delivers through the destination's type
//!   (`Core::destinations`, a `sheaf_destination::Registry`: the engine never names a type),
//!   and hands the job's outcome to the completer: with an outbox, the attempt travels with it;
//!   without one, the worker first writes it through the log write coalescer. A type's
//!   `Verdict` decides what follows: done, retried on schedule, every delivery to the
//!   destination paused (`Throttled`), or dead-lettered at once (`Permanent`).
//! - The **completer** ([`completer`]) gathers outcomes from every worker for
//!   `SHEAF_COMPLETER_FLUSH_INTERVAL` or `SHEAF_COMPLETER_MAX_BATCH` outcomes and writes each
//!   kind as one statement: one commit per job is bound by WAL writes, and batched completions
//!   beat it several times over (docs/benchmarks.md, `queue`). With an outbox the whole flush,
//!   attempts included, is one transaction (`Outbox::settle`).
//!
//! - **Housekeeping** ([`housekeeping`]) asks the queue every few seconds for its upkeep
//!   (`JobQueue::maintain`: on Postgres, a vacuum of `jobs` after 10,000 dead rows).
//!
//! Shutdown: stop claiming; let workers finish what they hold until `SHEAF_SHUTDOWN_TIMEOUT`,
//! then abandon it (its lease runs out and another claim picks it up); release the claims
//! still in the channel, unstarted; flush the completer, for at most `SHEAF_SHUTDOWN_TIMEOUT`
//! again.

mod completer;
mod dispatcher;
mod housekeeping;
mod resolve;
mod span;
mod transform;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sheaf_store::{Attempt, DeadLetterRequest, Lease, Reschedule};

use crate::state::turns::TurnReport;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::state::Core;
use crate::state::handoff::Dispatched;
use crate::state::metrics::Metrics;

/// What the completer writes for one job.
#[derive(Debug)]
enum Outcome {
    Complete(Lease),
    Reschedule(Reschedule),
    DeadLetter(DeadLetterRequest),
}

/// A job's turn as the completer receives it: the outcome, and the attempt made when an
/// outbox commits the two together.
#[derive(Debug)]
struct Turn {
    outcome: Outcome,
    attempt: Option<Attempt>,
    /// For destination health and operator events, when the process wants them.
    report: Option<TurnReport>,
    /// The job had an order key and this outcome ends it: the key's next job becomes
    /// claimable once the outcome is written, so the completer wakes the dispatcher then
    /// (else a key's next event would wait for the dispatcher's next poll).
    frees_key: bool,
}

impl From<Outcome> for Turn {
    fn from(outcome: Outcome) -> Self {
        Turn {
            outcome,
            attempt: None,
            report: None,
            frees_key: false,
        }
    }
}

/// The running delivery side: dispatcher, workers, completer, housekeeping.
#[derive(Debug)]
pub struct Delivery {
    core: Arc<Core>,
    stop: CancellationToken,
    abort: CancellationToken,
    dispatcher: JoinHandle<()>,
    housekeeping: JoinHandle<()>,
    workers: TaskTracker,
    completer: JoinHandle<()>,
    completer_tx: mpsc::Sender<Turn>,
    jobs_rx: Arc<Mutex<mpsc::Receiver<Dispatched>>>,
}

impl Delivery {
    /// Starts the dispatcher, the workers and the completer.
    pub fn start(core: Arc<Core>) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let abort = CancellationToken::new();
        let workers_count = core.config.delivery_workers;
        let jobs_rx = core
            .jobs
            .take_receiver()
            .context("the delivery engine starts once per process")?;
        let jobs_tx = core.jobs.sender();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let (completer_tx, completer_rx) =
            mpsc::channel::<Turn>(core.config.completer_max_batch.saturating_mul(4).max(64));

        let completer = tokio::spawn(completer::run(
            Arc::clone(&core),
            completer_rx,
            abort.clone(),
        ));
        let dispatcher = tokio::spawn(dispatcher::run(Arc::clone(&core), jobs_tx, stop.clone()));
        let housekeeping = tokio::spawn(housekeeping::run(Arc::clone(&core), stop.clone()));
        let workers = TaskTracker::new();
        for _ in 0..workers_count {
            workers.spawn(worker::run(
                Arc::clone(&core),
                Arc::clone(&jobs_rx),
                completer_tx.clone(),
                stop.clone(),
                abort.clone(),
            ));
        }
        workers.close();
        Ok(Self {
            core,
            stop,
            abort,
            dispatcher,
            housekeeping,
            workers,
            completer,
            completer_tx,
            jobs_rx,
        })
    }

    /// Stops gracefully: see the module docs. `deadline` bounds the wait for in-flight deliveries.
    pub async fn shutdown(self, deadline: Duration) {
        self.stop.cancel();
        let _ = self.dispatcher.await;
        let _ = self.housekeeping.await;
        if tokio::time::timeout(deadline, self.workers.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "in-flight deliveries did not finish within {deadline:?}; abandoning them to their leases"
            );
            self.abort.cancel();
            self.workers.wait().await;
        }
        // Claims still in the channel were never started: give them back at once.
        let mut unstarted = Vec::new();
        {
            let mut rx = self.jobs_rx.lock().await;
            rx.close();
            while let Ok(dispatched) = rx.try_recv() {
                unstarted.push(dispatched.claimed.lease);
            }
        }
        if !unstarted.is_empty() {
            match self.core.stores.queue.release(&unstarted).await {
                Ok(_) => Metrics::add(&self.core.metrics.jobs_released, unstarted.len()),
                Err(err) => tracing::warn!(error = %err, jobs = unstarted.len(),
                    "could not release unstarted jobs; they come back when their leases end"),
            }
        }
        drop(self.completer_tx);
        // A settlement that cannot commit (its database is down) is tried until this bound.
        let mut completer = self.completer;
        if tokio::time::timeout(deadline, &mut completer)
            .await
            .is_err()
        {
            self.abort.cancel();
            let _ = completer.await;
        }
    }
}
