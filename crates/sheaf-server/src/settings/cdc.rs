//! The `SHEAF_CDC_*` settings: which tables feed which tenant ([`TableTenants`]) and the
//! `sheaf-cdc` configuration of the source ([`CdcSettings`]), checked whether or not the source
//! is enabled.

use sheaf_cdc::{BatchingPolicy, CdcConfig, ConnectionConfig, PublicationTables, StreamOptions};
pub use sheaf_engine::{CdcSettings, TableTenants};

use super::ConfigError;
use super::table::{
    CDC_BATCH_SIZE, CDC_BATCH_TRANSACTIONS, CDC_BATCH_WAIT, CDC_CHECKPOINT_LIMIT,
    CDC_CREATE_MISSING, CDC_ENABLED, CDC_HEARTBEAT_INTERVAL, CDC_MAX_IN_FLIGHT, CDC_POSTGRES_URL,
    CDC_PUBLICATION, CDC_SLOT, CDC_TENANTS,
};
use super::values::Values;

/// The `SHEAF_CDC_*` settings. Every value is checked whether or not the source is enabled;
/// the URL and the tenants are required only when it is. `sheaf_schema` is
/// `SHEAF_POSTGRES_SCHEMA` when a store lives in Postgres: its tables never feed the source.
/// `ca_file` is `SHEAF_TLS_CA_FILE`, trusted when the URL names no `sslrootcert`.
pub(super) fn parse_cdc(
    values: &Values,
    sheaf_schema: Option<&str>,
    ca_file: Option<&std::path::Path>,
) -> Result<Option<CdcSettings>, ConfigError> {
    let enabled = values.bool(&CDC_ENABLED)?;
    let url = values.optional(&CDC_POSTGRES_URL);
    let slot = values.get(&CDC_SLOT).unwrap_or_default();
    let publication = values.get(&CDC_PUBLICATION).unwrap_or_default();
    let create_missing = values.bool(&CDC_CREATE_MISSING)?;
    let tenants = values
        .optional(&CDC_TENANTS)
        .map(|t| TableTenants::parse(&t))
        .transpose()
        .map_err(|m| ConfigError::new(CDC_TENANTS.name, m))?;
    let batch_transactions = values.bool(&CDC_BATCH_TRANSACTIONS)?;
    let batch_size = values.usize(&CDC_BATCH_SIZE)?;
    let batch_wait = values.duration(&CDC_BATCH_WAIT)?;
    let checkpoint_limit = values.usize(&CDC_CHECKPOINT_LIMIT)?;
    let max_in_flight = values.usize(&CDC_MAX_IN_FLIGHT)?;
    let heartbeat = values.duration(&CDC_HEARTBEAT_INTERVAL)?;
    let stream = StreamOptions {
        checkpoint_limit,
        batch_transactions,
        batching: (batch_size > 0).then_some(BatchingPolicy {
            count: batch_size,
            max_wait: batch_wait,
        }),
        filter: None,
    };
    // sheaf-cdc names the fields in conflict; the error names the settings too.
    stream.validate().map_err(|e| cdc_error(&e, batch_size))?;
    if !enabled {
        return Ok(None);
    }
    let url = url.ok_or_else(|| {
        ConfigError::new(
            CDC_POSTGRES_URL.name,
            "is required when SHEAF_CDC_ENABLED is true",
        )
    })?;
    let mut connection = ConnectionConfig::from_url(&url)
        .map_err(|e| ConfigError::new(CDC_POSTGRES_URL.name, e.to_string()))?;
    connection.ca_file = ca_file.map(std::path::Path::to_owned);
    let mut tenants = tenants.ok_or_else(|| {
        ConfigError::new(
            CDC_TENANTS.name,
            "is required when SHEAF_CDC_ENABLED is true (a tenant id, or schema.table=tenant,…)",
        )
    })?;
    if let Some(schema) = sheaf_schema {
        if tenants.schemas().contains(schema) {
            return Err(ConfigError::new(
                CDC_TENANTS.name,
                format!(
                    "names a table in {schema:?}, the schema of Sheaf's own tables (SHEAF_POSTGRES_SCHEMA): its changes would feed Sheaf its own writes"
                ),
            ));
        }
        tenants.exclude_schema(schema);
    }
    let mut source = CdcConfig::new(connection, slot, publication);
    if create_missing {
        let tables = tenants.tables();
        if tables.is_empty() {
            return Err(ConfigError::new(
                CDC_CREATE_MISSING.name,
                "is true but SHEAF_CDC_TENANTS names no table to publish; name them (schema.table=tenant,…) or create the publication yourself",
            ));
        }
        source.create_missing = Some(PublicationTables::Tables(tables));
    }
    source.stream = stream;
    source.heartbeat_interval = (!heartbeat.is_zero()).then_some(heartbeat);
    source.application_name = "sheaf".to_owned();
    source.validate().map_err(|e| cdc_error(&e, batch_size))?;
    Ok(Some(CdcSettings {
        source,
        tenants,
        max_in_flight,
    }))
}

/// A `sheaf-cdc` configuration error as a [`ConfigError`] naming the setting of the field it
/// names (`sheaf-cdc` writes field names in backquotes).
fn cdc_error(error: &sheaf_cdc::Error, batch_size: usize) -> ConfigError {
    let text = error.to_string();
    if text.contains("`batch_transactions`") {
        return ConfigError::new(
            CDC_BATCH_TRANSACTIONS.name,
            format!(
                "true cannot be combined with SHEAF_CDC_BATCH_SIZE={batch_size} (a batching policy): {text}"
            ),
        );
    }
    let setting = [
        ("`slot`", CDC_SLOT.name),
        ("`publication`", CDC_PUBLICATION.name),
        ("`checkpoint_limit`", CDC_CHECKPOINT_LIMIT.name),
        ("`batching", CDC_BATCH_SIZE.name),
        ("`create_missing`", CDC_CREATE_MISSING.name),
        ("`heartbeat_interval`", CDC_HEARTBEAT_INTERVAL.name),
        ("connection URL", CDC_POSTGRES_URL.name),
    ]
    .into_iter()
    .find(|(field, _)| text.contains(field))
    .map_or(CDC_ENABLED.name, |(_, setting)| setting);
    ConfigError::new(setting, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tenant_or_a_map_with_a_fallback() {
        let one = TableTenants::parse("acme").unwrap();
        assert_eq!(one.tenant_for("public", "orders").unwrap().as_str(), "acme");
        assert!(one.tables().is_empty());

        let mut map = TableTenants::parse("public.orders=acme, app.users = beta ,*=rest").unwrap();
        assert_eq!(map.tables(), ["app.users", "public.orders"]);
        assert_eq!(map.tenant_for("app", "users").unwrap().as_str(), "beta");
        assert_eq!(map.tenant_for("x", "y").unwrap().as_str(), "rest");
        map.exclude_schema("sheaf");
        assert_eq!(
            map.tenant_for("sheaf", "events"),
            None,
            "`*` skips Sheaf's own schema"
        );

        let only = TableTenants::parse("public.orders=acme").unwrap();
        assert_eq!(only.tenant_for("public", "other"), None);

        for bad in [
            "",
            "orders=acme",
            "public.orders=acme,public.orders=beta",
            "*=a,*=b",
            "public.orders=bad tenant!",
            "public.orders=acme,",
        ] {
            assert!(TableTenants::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
