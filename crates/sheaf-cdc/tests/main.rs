//! sheaf-cdc's tests, one binary: the decoder on bytes captured from Postgres 15 and on
//! malformed input, the reader core on synthetic streams, property tests of the decoder,
//! and the whole source against the real server, in plaintext and over TLS (skipped
//! without `SHEAF_TEST_POSTGRES_URL` and the TLS variables, failing under CI).

mod batching;
mod decoder;
mod postgres;
mod properties;
mod support;
mod tls;
