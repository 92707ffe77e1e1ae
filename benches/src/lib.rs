//! Holds no code: the library target exists for the criterion benchmarks under `benches/`
//! (`cargo bench -p sheaf-benches`). The experiments on real servers (docs/benchmarks.md) are the
//! `sheaf-bench` binary (`src/main.rs`), driven by `cargo xtask bench <scenario>`.
