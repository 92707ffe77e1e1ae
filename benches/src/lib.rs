//! Holds no code: this package exists for its criterion benchmarks under `benches/`,
//! which measure Sheaf's crates together (`cargo bench -p sheaf-benches`).
