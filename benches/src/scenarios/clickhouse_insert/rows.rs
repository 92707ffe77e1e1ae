//! The rows the `clickhouse-insert` scenario writes, shaped like the store's, and where the
//! cluster puts each one: ClickHouse's `sipHash64(tenant_id, event_id)` in Rust.

use std::collections::HashMap;

use rand::Rng as _;
use serde::Serialize;

use super::{Kind, Way};

/// One row of `events`, as the store writes it (`sheaf-clickhouse`'s `EventRow`).
#[derive(Debug, Clone, clickhouse::Row, Serialize)]
pub(super) struct EventRow {
    tenant_id: String,
    event_id: String,
    topic: String,
    event_time: i64,
    data: String,
    traceparent: String,
    tracestate: String,
}

/// One row of `attempts`, as the store writes it (`sheaf-clickhouse`'s `AttemptRow`).
#[derive(Debug, Clone, clickhouse::Row, Serialize)]
pub(super) struct AttemptRow {
    tenant_id: String,
    event_id: String,
    #[serde(with = "clickhouse::serde::uuid")]
    destination_id: uuid::Uuid,
    attempt_time: i64,
    #[serde(with = "clickhouse::serde::uuid")]
    attempt_id: uuid::Uuid,
    number: u32,
    status: i8,
    trigger: i8,
    response_code: Option<u16>,
    duration_ms: u32,
    response_body: Option<String>,
    error: Option<String>,
    event_topic: String,
    event_data: String,
    event_traceparent: String,
    event_tracestate: String,
}

/// A row either table takes, and the two columns the cluster shards by.
pub(super) trait LogRow:
    clickhouse::Row + clickhouse::RowOwned + clickhouse::RowWrite + Serialize + Send + Sync + 'static
{
    /// The table it goes to through the `Distributed` table; its local table is
    /// `<TABLE>_local`.
    const TABLE: &'static str;
    /// The columns the cluster shards by: `(tenant_id, event_id)`.
    fn shard_key(&self) -> (&str, &str);
}

impl LogRow for EventRow {
    const TABLE: &'static str = "events";
    fn shard_key(&self) -> (&str, &str) {
        (&self.tenant_id, &self.event_id)
    }
}

impl LogRow for AttemptRow {
    const TABLE: &'static str = "attempts";
    fn shard_key(&self) -> (&str, &str) {
        (&self.tenant_id, &self.event_id)
    }
}

/// ClickHouse's `sipHash64(tenant_id, event_id)`: SipHash-2-4 with a zero key of each argument,
/// the second combined into the first as ClickHouse combines hashes (the SipHash of the two
/// 64-bit values, little-endian).
pub(super) fn sip_hash64(tenant: &str, event: &str) -> u64 {
    let combined = [sip24(tenant.as_bytes()), sip24(event.as_bytes())];
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&combined[0].to_le_bytes());
    bytes[8..].copy_from_slice(&combined[1].to_le_bytes());
    sip24(&bytes)
}

/// The shard the `Distributed` table puts a row in: the sharding key modulo the shards' total
/// weight (every shard weighs 1 here), shards in `remote_servers` order.
pub(super) fn shard_of(tenant: &str, event: &str, shards: usize) -> usize {
    (sip_hash64(tenant, event) % shards as u64) as usize
}

/// SipHash-2-4 with the key (0, 0), as ClickHouse's `SipHash` computes it.
fn sip24(data: &[u8]) -> u64 {
    let mut v = [
        0x736f_6d65_7073_6575_u64,
        0x646f_7261_6e64_6f6d,
        0x6c79_6765_6e65_7261,
        0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    fn compress(word: u64, v: &mut [u64; 4]) {
        v[3] ^= word;
        round(v);
        round(v);
        v[0] ^= word;
    }
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        compress(word, &mut v);
    }
    let mut last = [0u8; 8];
    let tail = chunks.remainder();
    last[..tail.len()].copy_from_slice(tail);
    last[7] = data.len() as u8;
    compress(u64::from_le_bytes(last), &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// Fresh rows, shaped like a webhook service's log, and how many of each table and way it
/// placed on each shard (by [`shard_of`], which the run checks against the server).
pub(super) struct Generator {
    tenants: usize,
    shards: usize,
    topics: [&'static str; 4],
    destinations: Vec<uuid::Uuid>,
    placed: HashMap<(Kind, Way, usize), u64>,
    payload_bytes: usize,
    payloads: usize,
}

impl Generator {
    pub(super) fn new(tenants: usize, shards: usize) -> Self {
        Generator {
            tenants,
            shards,
            topics: [
                "order.created",
                "order.paid",
                "invoice.finalized",
                "customer.updated",
            ],
            destinations: (0..20).map(|_| uuid::Uuid::now_v7()).collect(),
            placed: HashMap::new(),
            payload_bytes: 0,
            payloads: 0,
        }
    }

    /// The mean size of the payloads made so far, in bytes.
    pub(super) fn mean_payload_bytes(&self) -> f64 {
        self.payload_bytes as f64 / self.payloads.max(1) as f64
    }

    pub(super) fn placed(&self, kind: Kind, way: Way, shard: usize) -> u64 {
        self.placed.get(&(kind, way, shard)).copied().unwrap_or(0)
    }

    /// A fresh `(tenant_id, event_id)`, the event id starting with `tag`.
    fn key(&self, tag: &str, rng: &mut impl rand::Rng) -> (String, String) {
        let tenant = format!("tenant-{:04}", rng.random_range(0..self.tenants));
        // 26 characters after the tag's prefix, like a ULID.
        let event = format!("{tag}{:026x}", rng.random::<u128>() >> 24);
        (tenant, event)
    }

    /// Keys that no batch writes, for checking the hash.
    pub(super) fn keys(&self, n: usize) -> Vec<(String, String)> {
        let mut rng = rand::rng();
        (0..n).map(|_| self.key("evt_check", &mut rng)).collect()
    }

    /// A fresh key of a row `way` writes to `kind`'s table, counted on its shard.
    fn placed_key(&mut self, kind: Kind, way: Way, rng: &mut impl rand::Rng) -> (String, String) {
        let (tenant, event) = self.key(way.tag(), rng);
        let shard = shard_of(&tenant, &event, self.shards);
        *self.placed.entry((kind, way, shard)).or_default() += 1;
        (tenant, event)
    }

    /// A JSON payload of about 300 bytes: an order with two items.
    fn payload(&mut self, rng: &mut impl rand::Rng) -> String {
        let hex = |rng: &mut dyn rand::RngCore, n: usize| -> String {
            (0..n)
                .map(|_| char::from_digit(rng.next_u32() % 16, 16).unwrap_or('0'))
                .collect()
        };
        let data = format!(
            r#"{{"order_id":"ord_{}","customer":{{"id":"cus_{}","email":"{}@example.com"}},"amount":{},"currency":"EUR","status":"paid","items":[{{"sku":"sku_{}","qty":{},"price":{}}},{{"sku":"sku_{}","qty":{},"price":{}}}],"shipping":{{"city":"Berlin","postcode":"{:05}","country":"DE"}}}}"#,
            hex(rng, 16),
            hex(rng, 12),
            hex(rng, 10),
            rng.random_range(100..100_000),
            hex(rng, 8),
            rng.random_range(1..5),
            rng.random_range(100..10_000),
            hex(rng, 8),
            rng.random_range(1..5),
            rng.random_range(100..10_000),
            rng.random_range(10_000..99_999),
        );
        self.payload_bytes += data.len();
        self.payloads += 1;
        data
    }

    fn traceparent(rng: &mut impl rand::Rng) -> String {
        // Half the publishes traced, as a mixed fleet sends them.
        if rng.random_bool(0.5) {
            format!(
                "00-{:032x}-{:016x}-01",
                rng.random::<u128>(),
                rng.random::<u64>()
            )
        } else {
            String::new()
        }
    }

    pub(super) fn events(&mut self, way: Way, n: usize) -> Vec<EventRow> {
        let mut rng = rand::rng();
        let now = now_micros();
        (0..n)
            .map(|i| {
                let (tenant_id, event_id) = self.placed_key(Kind::Events, way, &mut rng);
                EventRow {
                    tenant_id,
                    event_id,
                    topic: self.topics[i % self.topics.len()].to_owned(),
                    event_time: now + i as i64,
                    data: self.payload(&mut rng),
                    traceparent: Self::traceparent(&mut rng),
                    tracestate: String::new(),
                }
            })
            .collect()
    }

    pub(super) fn attempts(&mut self, way: Way, n: usize) -> Vec<AttemptRow> {
        let mut rng = rand::rng();
        let now = now_micros();
        (0..n)
            .map(|i| {
                let (tenant_id, event_id) = self.placed_key(Kind::Attempts, way, &mut rng);
                let failed = rng.random_bool(0.1);
                AttemptRow {
                    tenant_id,
                    event_id,
                    destination_id: self.destinations[i % self.destinations.len()],
                    attempt_time: now + i as i64,
                    attempt_id: uuid::Uuid::now_v7(),
                    number: if failed { 2 } else { 1 },
                    status: i8::from(!failed),
                    trigger: 0,
                    response_code: Some(if failed { 503 } else { 200 }),
                    duration_ms: rng.random_range(5..400),
                    response_body: Some(if failed {
                        "service unavailable".to_owned()
                    } else {
                        r#"{"ok":true}"#.to_owned()
                    }),
                    error: None,
                    event_topic: self.topics[i % self.topics.len()].to_owned(),
                    event_data: self.payload(&mut rng),
                    event_traceparent: Self::traceparent(&mut rng),
                    event_tracestate: String::new(),
                }
            })
            .collect()
    }
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sip24_is_siphash_2_4_with_a_zero_key() {
        // The standard library's deprecated `SipHasher` is SipHash-2-4 with the key (0, 0);
        // `write` feeds it raw bytes.
        #[allow(deprecated)]
        fn reference(data: &[u8]) -> u64 {
            use std::hash::Hasher as _;
            let mut hasher = std::hash::SipHasher::new();
            hasher.write(data);
            hasher.finish()
        }
        for len in 0..40 {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(sip24(&data), reference(&data), "{len} bytes");
        }
    }
}
