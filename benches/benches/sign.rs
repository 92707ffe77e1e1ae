//! What signing a webhook costs per delivery: the `webhook-signature` header of one 1 KB event
//! under an HMAC-SHA256 secret (`v1`) and under an Ed25519 key (`v1a`), as the webhook sender
//! signs (its `Signer` keeps each Ed25519 key pair once read), and under an Ed25519 key read
//! afresh for every message (what keeping the pair saves). During a rotation a delivery carries
//! two signatures, so `rotation_*` signs with both keys of a rotation.
//!
//! After criterion's figures, one interleaved run prints the ratios side by side (Ed25519 to
//! HMAC), since the machine's noise moves both alike.
//!
//! `cargo bench -p sheaf-benches --bench sign -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sheaf_destination::signing::SigningAlgorithm;
use sheaf_store::Secret;
use sheaf_webhook::{Signer, sign};

const ID: &str = "evt_01J9Z3K4M5N6P7Q8R9S0T1V2W3";
const TIMESTAMP: i64 = 1_764_000_000;

/// A 1 KB JSON body.
fn body() -> Vec<u8> {
    let mut body = br#"{"order":"ord_8472","items":["#.to_vec();
    while body.len() < 1000 {
        body.extend_from_slice(br#"{"sku":"SKU-01","qty":2},"#);
    }
    body.extend_from_slice(br#"{"sku":"SKU-99","qty":1}]}"#);
    body
}

fn cases() -> [(&'static str, Vec<Secret>); 4] {
    let hmac = SigningAlgorithm::HmacSha256.generate();
    let ed = SigningAlgorithm::Ed25519.generate();
    [
        ("hmac", vec![hmac.clone()]),
        ("ed25519", vec![ed.clone()]),
        (
            "rotation_hmac",
            vec![hmac, SigningAlgorithm::HmacSha256.generate()],
        ),
        (
            "rotation_ed25519",
            vec![ed, SigningAlgorithm::Ed25519.generate()],
        ),
    ]
}

fn per_delivery(c: &mut Criterion) {
    let body = body();
    let signer = Signer::default();
    let mut group = c.benchmark_group("sign");
    for (name, secrets) in cases() {
        let secrets: Vec<&Secret> = secrets.iter().collect();
        group.bench_function(name, |b| {
            b.iter(|| signer.sign(black_box(&secrets), ID, TIMESTAMP, black_box(&body)));
        });
    }
    let fresh = SigningAlgorithm::Ed25519.generate();
    group.bench_function("ed25519_key_read_each_time", |b| {
        b.iter(|| sign(black_box(&[&fresh]), ID, TIMESTAMP, black_box(&body)));
    });
    group.finish();
    ratios(&body, &signer);
}

/// One interleaved run of every case, then each one's mean and its ratio to HMAC's.
fn ratios(body: &[u8], signer: &Signer) {
    let cases = cases();
    let fresh = SigningAlgorithm::Ed25519.generate();
    let mut spent = [Duration::ZERO; 5];
    let rounds = 200;
    let per_round = 100;
    for _ in 0..rounds {
        for (i, (_, secrets)) in cases.iter().enumerate() {
            let secrets: Vec<&Secret> = secrets.iter().collect();
            let start = Instant::now();
            for _ in 0..per_round {
                black_box(signer.sign(black_box(&secrets), ID, TIMESTAMP, body));
            }
            spent[i] += start.elapsed();
        }
        let start = Instant::now();
        for _ in 0..per_round {
            black_box(sign(black_box(&[&fresh]), ID, TIMESTAMP, body));
        }
        spent[4] += start.elapsed();
    }
    let n = f64::from(rounds * per_round);
    let micros = |d: Duration| d.as_secs_f64() * 1e6 / n;
    let hmac = micros(spent[0]);
    let names = cases
        .iter()
        .map(|(name, _)| *name)
        .chain(["ed25519_key_read_each_time"]);
    println!(
        "\nsign, one interleaved run of {} per case (1 KB body):",
        rounds * per_round
    );
    for (name, d) in names.zip(spent) {
        println!(
            "  {name:<28} {:>7.2} µs  {:>5.1}x hmac",
            micros(d),
            micros(d) / hmac
        );
    }
}

criterion_group!(benches, per_delivery);
criterion_main!(benches);
