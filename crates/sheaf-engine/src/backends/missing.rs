//! Stand-ins for the backends a build leaves out (their cargo feature off): a configuration that
//! names one is refused at start-up, naming the feature, and the stand-in types can never be
//! built.

/// Without the `sqlite` feature.
#[cfg(not(feature = "sqlite"))]
pub(super) mod sqlite {
    use std::path::Path;
    use std::sync::Arc;

    use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};

    use crate::backends::SqliteSettings;

    /// Never built: [`open`] refuses.
    pub(in crate::backends) enum SqliteStores {}

    impl SqliteStores {
        pub(in crate::backends) fn log(&self) -> Arc<dyn LogStore> {
            match *self {}
        }

        pub(in crate::backends) fn queue(&self) -> Arc<dyn JobQueue> {
            match *self {}
        }

        pub(in crate::backends) fn outbox(&self) -> Arc<dyn Outbox> {
            match *self {}
        }

        pub(in crate::backends) fn entities(&self) -> Arc<dyn EntityStore> {
            match *self {}
        }

        pub(in crate::backends) fn replays(&self) -> Arc<dyn ReplayStore> {
            match *self {}
        }
    }

    const MISSING: &str = "SHEAF_LOG_STORE or SHEAF_QUEUE names sqlite, but this build of sheaf-engine has no SQLite support (cargo feature `sqlite`)";

    pub(in crate::backends) async fn open(
        _settings: &SqliteSettings,
        _retention: &sheaf_memory::LogRetention,
    ) -> anyhow::Result<SqliteStores> {
        anyhow::bail!(MISSING)
    }

    pub(in crate::backends) async fn backup(
        _settings: &SqliteSettings,
        _destination: &Path,
    ) -> anyhow::Result<()> {
        anyhow::bail!(MISSING)
    }
}

/// Without the `postgres` feature.
#[cfg(not(feature = "postgres"))]
pub(super) mod postgres {
    use std::path::Path;
    use std::sync::Arc;

    use sheaf_store::{EntityStore, JobQueue, LogStore, Outbox, ReplayStore};

    use crate::backends::PostgresSettings;

    /// Never built: [`connect`] refuses.
    pub(in crate::backends) enum PostgresStores {}

    impl PostgresStores {
        pub(in crate::backends) fn log(&self) -> Arc<dyn LogStore> {
            match *self {}
        }

        pub(in crate::backends) fn queue(&self) -> Arc<dyn JobQueue> {
            match *self {}
        }

        pub(in crate::backends) fn entities(&self) -> Arc<dyn EntityStore> {
            match *self {}
        }

        pub(in crate::backends) fn replays(&self) -> Arc<dyn ReplayStore> {
            match *self {}
        }

        pub(in crate::backends) fn outbox(&self, _in_the_log: bool) -> Arc<dyn Outbox> {
            match *self {}
        }
    }

    pub(in crate::backends) async fn connect(
        _settings: &PostgresSettings,
        _ca_file: Option<&Path>,
        _migrate: bool,
    ) -> anyhow::Result<PostgresStores> {
        anyhow::bail!(
            "SHEAF_LOG_STORE or SHEAF_QUEUE names postgres, but this build of sheaf-engine has no Postgres support (cargo feature `postgres`)"
        )
    }
}

/// Without the `clickhouse` feature.
#[cfg(not(feature = "clickhouse"))]
pub(super) mod clickhouse {
    use std::path::Path;
    use std::sync::Arc;

    use sheaf_coalesce::WriteConfig;
    use sheaf_store::LogStore;

    use crate::backends::ClickHouseSettings;

    pub(in crate::backends) async fn connect(
        _settings: &ClickHouseSettings,
        _ca_file: Option<&Path>,
        _write: WriteConfig,
        _migrate: bool,
    ) -> anyhow::Result<Arc<dyn LogStore>> {
        anyhow::bail!(
            "SHEAF_LOG_STORE is clickhouse, but this build of sheaf-engine has no ClickHouse support (cargo feature `clickhouse`)"
        )
    }
}

/// Without the `jetstream` feature.
#[cfg(not(feature = "jetstream"))]
pub(super) mod jetstream {
    use std::sync::Arc;

    use sheaf_store::{JobQueue, Outbox};

    use crate::backends::JetStreamSettings;

    pub(in crate::backends) async fn connect(
        _settings: &JetStreamSettings,
    ) -> anyhow::Result<(Arc<dyn JobQueue>, Option<Arc<dyn Outbox>>)> {
        anyhow::bail!(
            "SHEAF_QUEUE is jetstream, but this build of sheaf-engine has no JetStream support (cargo feature `jetstream`)"
        )
    }
}
