//! Settings of the two coalescers and their validation.
//!
//! The structs are plain data so a caller can fill them from its own configuration
//! and pass them explicitly; nothing here reads the environment.

use std::time::Duration;

/// Why a configuration was refused. Each variant names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field that counts or sizes something was zero where zero means nothing can ever pass.
    #[error("{field} must be greater than zero")]
    Zero {
        /// The offending field, e.g. `write.max_records`.
        field: &'static str,
    },
    /// A coalescer was built outside a Tokio runtime, so its worker task had nowhere to run.
    #[error("{what} must be built inside a tokio runtime")]
    NoRuntime {
        /// Which coalescer was being built.
        what: &'static str,
    },
}

/// Settings of a [`LookupCoalescer`](crate::LookupCoalescer).
///
/// A caller sets `max_batch` (how many distinct keys close a batch; 0 turns coalescing
/// off) and `max_wait` (how long a batch may gather) from its own configuration. This
/// crate only refuses values that cannot work ([`validate`](Self::validate)); an upper
/// bound on `max_batch` that suits the caller's store is the caller's to enforce (for
/// Sheaf's retry lookups it is 100 keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupConfig {
    /// Distinct keys that close a batch. Zero disables coalescing: every lookup goes
    /// straight to the backend's single-key path, as before the coalescer existed.
    pub max_batch: usize,
    /// How long a batch may gather after its first key before it is flushed anyway.
    /// Zero flushes whatever was already queued when the first key was taken.
    pub max_wait: Duration,
    /// Flush at once while no batch query is in flight and gather only while one is
    /// (see [`LookupCoalescer`](crate::LookupCoalescer) for the exact rule).
    pub adaptive: bool,
    /// With `adaptive`: under load, gather like the fixed mode (until `max_batch` or
    /// `max_wait`) instead of flushing as soon as a query completes; only the first key after
    /// a quiet spell (no query in flight and none finished within `max_wait`) goes at once.
    /// For lookups whose callers can wait `max_wait` but should not pay it when alone (a
    /// retry, due seconds after its failure): batches as large as the fixed mode's, no
    /// added wait at idle. Without `adaptive` it changes nothing.
    pub gather_under_load: bool,
    /// Batch queries that may run at the same time; a flush beyond it waits for one to finish.
    pub max_in_flight: usize,
    /// Capacity of the queue between callers and the worker; a full queue makes callers wait.
    pub queue_depth: usize,
}

impl LookupConfig {
    /// The configuration that turns coalescing off (`max_batch = 0`).
    pub fn disabled() -> Self {
        Self {
            max_batch: 0,
            ..Self::default()
        }
    }

    /// Whether lookups go through the worker at all.
    pub fn is_enabled(&self) -> bool {
        self.max_batch > 0
    }

    /// Refuses values with which no lookup could ever complete.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(ConfigError::Zero {
                field: "lookup.max_in_flight",
            });
        }
        if self.queue_depth == 0 {
            return Err(ConfigError::Zero {
                field: "lookup.queue_depth",
            });
        }
        Ok(())
    }
}

impl Default for LookupConfig {
    /// Off, with a 50 ms wait ready for when a batch size is set.
    ///
    /// Off by default in the library (`max_batch = 0`): turning coalescing on is the
    /// caller's choice; the sheaf service turns it on with its own default. Off is
    /// exactly the behaviour before the coalescer existed, so a caller that only puts
    /// one in front of its backend changes nothing until it sets a batch size.
    ///
    /// The 50 ms wait is the one the retry-lookup experiment ran with: batches of up to
    /// 50 keys with a 50 ms wait turned 8,416 single queries into 1,286 batch queries
    /// (~9 keys each) and cut ClickHouse's mean CPU from 73 % to 29 %
    /// (docs/benchmarks.md, "burst", earlier measurements). Two queries in flight match
    /// the two cores measured here: ClickHouse spent a fixed ~8 ms of CPU per query
    /// (docs/benchmarks.md, "lookup", earlier measurements), so more concurrent batch
    /// queries than cores only queue inside the server. A queue of 1,024 holds ten full
    /// batches of 100 keys, enough for a burst like that experiment's, ~6,000 retries
    /// coming due within ~20 s, to wait in the queue rather than in the callers.
    fn default() -> Self {
        Self {
            max_batch: 0,
            max_wait: Duration::from_millis(50),
            adaptive: false,
            gather_under_load: false,
            max_in_flight: 2,
            queue_depth: 1024,
        }
    }
}

/// Settings of a [`WriteCoalescer`](crate::WriteCoalescer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteConfig {
    /// Records in one write, at most; a single handed-off batch larger than this is written alone.
    pub max_records: usize,
    /// Bytes (as the writer measures records) in one write, at most; same exception as above.
    pub max_bytes: usize,
    /// How long an under-filled write may wait for more batches once the queue is empty.
    /// Zero turns the wait off: the worker writes whatever was already queued.
    pub max_wait: Duration,
    /// Handed-off batches the queue holds before writers have to wait.
    pub queue_depth: usize,
}

impl WriteConfig {
    /// Refuses values with which no record could ever be written.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_records == 0 {
            return Err(ConfigError::Zero {
                field: "write.max_records",
            });
        }
        if self.max_bytes == 0 {
            return Err(ConfigError::Zero {
                field: "write.max_bytes",
            });
        }
        if self.queue_depth == 0 {
            return Err(ConfigError::Zero {
                field: "write.queue_depth",
            });
        }
        Ok(())
    }
}

impl Default for WriteConfig {
    /// Bounds sized for ClickHouse parts, with the wait off until an operator sets it.
    ///
    /// The wait is off by default so that nothing changes without an operator's
    /// decision, as in the write-wait experiment, which measured that a 500 ms wait
    /// brought part creation from ten workers (5,210 parts of 58 rows) back to the level
    /// of the build before them, and recommended 1-2 s for hot partitioned tables
    /// (docs/benchmarks.md, "parts", earlier measurements). 10,000 records keep a loaded
    /// write several times above the ~1,500-row parts that experiment's single worker
    /// made, and 16 MiB bounds the memory one write holds when payloads are large (the
    /// `lookup` benchmark uses ~2 KB payloads, see docs/benchmarks.md, "lookup", and
    /// 10,000 of them are ~20 MB).
    /// A queue of 64 batches lets writers run ahead of one slow write without holding
    /// unbounded memory.
    fn default() -> Self {
        Self {
            max_records: 10_000,
            max_bytes: 16 * 1024 * 1024,
            max_wait: Duration::ZERO,
            queue_depth: 64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_lookup_default_is_off() {
        assert_eq!(LookupConfig::default().validate(), Ok(()));
        assert!(!LookupConfig::default().is_enabled());
        assert_eq!(LookupConfig::disabled().validate(), Ok(()));
        assert_eq!(WriteConfig::default().validate(), Ok(()));
    }

    #[test]
    fn zero_max_batch_is_valid_and_means_disabled() {
        let config = LookupConfig {
            max_batch: 0,
            ..LookupConfig::default()
        };
        assert_eq!(config.validate(), Ok(()));
        assert!(!config.is_enabled());
    }

    #[test]
    fn lookup_zero_counts_are_refused_with_the_field_name() {
        let config = LookupConfig {
            max_batch: 10,
            max_in_flight: 0,
            ..LookupConfig::default()
        };
        let err = config.validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "lookup.max_in_flight must be greater than zero"
        );

        let config = LookupConfig {
            max_batch: 10,
            queue_depth: 0,
            ..LookupConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::Zero {
                field: "lookup.queue_depth"
            })
        );
    }

    #[test]
    fn write_zero_bounds_are_refused_with_the_field_name() {
        let zero_records = WriteConfig {
            max_records: 0,
            ..WriteConfig::default()
        };
        assert_eq!(
            zero_records.validate().unwrap_err().to_string(),
            "write.max_records must be greater than zero"
        );
        let zero_bytes = WriteConfig {
            max_bytes: 0,
            ..WriteConfig::default()
        };
        assert_eq!(
            zero_bytes.validate(),
            Err(ConfigError::Zero {
                field: "write.max_bytes"
            })
        );
        let zero_queue = WriteConfig {
            queue_depth: 0,
            ..WriteConfig::default()
        };
        assert_eq!(
            zero_queue.validate(),
            Err(ConfigError::Zero {
                field: "write.queue_depth"
            })
        );
    }
}
