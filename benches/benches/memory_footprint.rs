//! What the memory log store holds per retained event beyond its payload, counted by the
//! allocator: this binary's global allocator is `stats_alloc`'s counting wrapper around the
//! system allocator (no other binary of the crate has it), so the live bytes of the heap are the
//! bytes requested minus the bytes freed, reallocations included.
//!
//! The store has the default retention's counts and no age bound
//! (`LogRetention { max_age: None, max_events: 25_000, max_attempts: 100_000 }`), and is written as
//! the service writes it: one tenant, ~1 KB JSON payloads (`{"seq": n, "pad": "x" × 1000}`, the
//! service scenarios' payload), publisher-chosen ids, each event with one successful attempt,
//! in batches of 100 (one `insert_many` of the events, then one of their attempts, as the
//! publish path and the workers write them). The figure is
//! (live bytes after − live bytes before − Σ retained payloads' compact JSON text) ÷ retained
//! events, measured once the store holds 25,000 events (every event retained) and again after
//! 100,000 more went through it (retention's steady state: the newest 25,000 kept). Between
//! measurements nothing but the store is alive: each batch is built, written and dropped.
//!
//! The counts are of bytes requested; the allocator's own rounding and headers (glibc: 8 bytes
//! per block, sizes rounded up to 16, at least 32) come on top, so live blocks per event are
//! printed beside it.
//!
//! `cargo bench -p sheaf-benches --bench memory_footprint`

use std::alloc::System;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use serde_json::json;
use sheaf_memory::{LogRetention, MemoryLogStore};
use sheaf_store::{
    Attempt, AttemptId, AttemptStatus, AttemptTrigger, DestinationId, Event, EventId, LogStore,
    Payload, TenantId, Timestamp,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The default retention's event count.
const RETAINED: usize = 25_000;
/// Pushed through after the store is full, for the steady state.
const MORE: usize = 100_000;
const BATCH: usize = 100;
/// The `pad` of each payload, as the service scenarios publish.
const PAD_BYTES: usize = 1_000;

/// The heap's live bytes and blocks now.
fn live() -> (i64, i64) {
    let s = GLOBAL.stats();
    (
        s.bytes_allocated as i64 - s.bytes_deallocated as i64,
        s.allocations as i64 - s.deallocations as i64,
    )
}

/// Runs a future that never waits: the memory store's calls complete on their first poll (they
/// take a lock and return), so no runtime (whose own allocations would be counted) is needed.
fn ready<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// Writes events `first..first + count` with one attempt each, in batches; returns the compact
/// JSON text bytes of each payload, in order, and the most live heap bytes seen after a batch.
fn write(
    store: &MemoryLogStore,
    tenant: &TenantId,
    destination: DestinationId,
    base: i64,
    first: usize,
    count: usize,
) -> (Vec<usize>, i64) {
    let pad = "x".repeat(PAD_BYTES);
    let mut sizes = Vec::with_capacity(count);
    let mut most = 0;
    for start in (first..first + count).step_by(BATCH) {
        let end = (start + BATCH).min(first + count);
        let events: Vec<Event> = (start..end)
            .map(|seq| {
                let data = json!({ "seq": seq, "pad": pad });
                sizes.push(serde_json::to_vec(&data).expect("a payload encodes").len());
                Event::new(
                    tenant.clone(),
                    EventId::new(format!("bench-{seq}")).expect("a valid id"),
                    "bench.event",
                    Timestamp::from_micros(base + seq as i64 * 10).expect("in range"),
                    Payload::new(data),
                )
            })
            .collect();
        let attempts: Vec<Attempt> = events
            .iter()
            .map(|event| Attempt {
                tenant_id: event.tenant_id.clone(),
                id: AttemptId::generate(),
                event_id: event.id.clone(),
                destination_id: destination,
                number: 1,
                time: Timestamp::from_micros(event.time.as_micros() + 5).expect("in range"),
                status: AttemptStatus::Success,
                trigger: AttemptTrigger::Scheduled,
                response_code: Some(200),
                duration_ms: 2,
                response_body: None,
                error: None,
                event_topic: event.topic.clone(),
                event_data: event.data.clone(),
                event_trace: None,
            })
            .collect();
        ready(store.insert_many(&events, &[])).expect("events written");
        ready(store.insert_many(&[], &attempts)).expect("attempts written");
        drop((events, attempts));
        most = most.max(live().0);
    }
    (sizes, most)
}

/// One measurement: what the store holds beyond its payloads, per retained event.
struct Measured {
    label: &'static str,
    events: usize,
    attempts: usize,
    live_bytes: i64,
    payload_bytes: usize,
    live_blocks: i64,
    footprint: usize,
    /// The most live bytes after any batch of this phase.
    most_bytes: i64,
}

impl Measured {
    fn row(&self) -> String {
        let per = |x: f64| x / self.events.max(1) as f64;
        format!(
            "| {} | {} | {} | {:.2} MB | {:.2} MB | {:.0} B | {:.2} MB | {:.1} | {:.0} B |",
            self.label,
            self.events,
            self.attempts,
            self.live_bytes as f64 / 1e6,
            self.payload_bytes as f64 / 1e6,
            per(self.live_bytes as f64 - self.payload_bytes as f64),
            self.most_bytes as f64 / 1e6,
            per(self.live_blocks as f64),
            per(self.footprint as f64 - self.payload_bytes as f64),
        )
    }
}

fn measure(
    label: &'static str,
    store: &MemoryLogStore,
    before: (i64, i64),
    payload_bytes: usize,
    most: i64,
) -> Measured {
    let (bytes, blocks) = live();
    let (events, attempts) = store.len();
    Measured {
        label,
        events,
        attempts,
        live_bytes: bytes - before.0,
        payload_bytes,
        live_blocks: blocks - before.1,
        footprint: store.footprint(),
        most_bytes: most - before.0,
    }
}

fn main() {
    let tenant = TenantId::new("bench").expect("a valid tenant");
    let destination = DestinationId::generate();
    let base = Timestamp::now().as_micros();
    let store = MemoryLogStore::new(LogRetention {
        max_age: None,
        max_events: RETAINED,
        max_attempts: 100_000,
    });
    let before = live();
    let (sizes, most) = write(&store, &tenant, destination, base, 0, RETAINED);
    let full = measure(
        "25,000 written, all retained",
        &store,
        before,
        sizes.iter().sum(),
        most,
    );
    let (sizes, most) = write(&store, &tenant, destination, base, RETAINED, MORE);
    // The newest `RETAINED` are kept: retention drops the oldest by time.
    let kept: usize = sizes[sizes.len() - RETAINED..].iter().sum();
    let steady = measure(
        "125,000 written, newest 25,000 retained",
        &store,
        before,
        kept,
        most,
    );
    println!(
        "MemoryLogStore, LogRetention {{ max_age: None, max_events: 25,000, max_attempts: \
         100,000 }}; ~{} B JSON payloads, one attempt each, batches of {BATCH}; live heap bytes \
         from a counting global allocator (stats_alloc over the system allocator)\n",
        full.payload_bytes / full.events.max(1)
    );
    println!(
        "| state | events | attempts | live bytes | payload text | beyond payload per event | \
         most live bytes after a batch | live blocks per event | footprint() beyond payload per \
         event |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    println!("{}", full.row());
    println!("{}", steady.row());
}
