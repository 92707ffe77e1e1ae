//! What the CDC source runs with: which tables feed which tenant ([`TableTenants`]) and the
//! `sheaf-cdc` configuration of the source ([`CdcSettings`]).

use std::collections::{BTreeMap, BTreeSet};

use sheaf_cdc::CdcConfig;
use sheaf_store::TenantId;

/// Which tables feed which tenant (`SHEAF_CDC_TENANTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableTenants {
    tables: BTreeMap<(String, String), TenantId>,
    other: Option<TenantId>,
    /// `*` does not cover this schema (Sheaf's own tables, when a store lives in Postgres).
    excluded_schema: Option<String>,
}

impl TableTenants {
    /// Parses `tenant` (every table) or `schema.table=tenant,…[,*=tenant]`.
    ///
    /// # Errors
    /// A message (lower-case) saying what is wrong.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err("is empty".to_owned());
        }
        let tenant = |s: &str| TenantId::new(s.trim()).map_err(|e| e.to_string());
        if !raw.contains('=') {
            return Ok(Self {
                tables: BTreeMap::new(),
                other: Some(tenant(raw)?),
                excluded_schema: None,
            });
        }
        let mut tables = BTreeMap::new();
        let mut other = None;
        for entry in raw.split(',') {
            let entry = entry.trim();
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| format!("entry {entry:?} is not `schema.table=tenant`"))?;
            let (key, value) = (key.trim(), tenant(value)?);
            if key == "*" {
                if other.replace(value).is_some() {
                    return Err("`*` appears twice".to_owned());
                }
                continue;
            }
            let (schema, table) = key
                .split_once('.')
                .filter(|(s, t)| !s.is_empty() && !t.is_empty())
                .ok_or_else(|| format!("{key:?} is not `schema.table` (the schema is required)"))?;
            if tables
                .insert((schema.to_owned(), table.to_owned()), value)
                .is_some()
            {
                return Err(format!("{key:?} appears twice"));
            }
        }
        Ok(Self {
            tables,
            other,
            excluded_schema: None,
        })
    }

    /// Keeps `*` away from `schema`: Sheaf's own tables must never feed Sheaf.
    pub fn exclude_schema(&mut self, schema: &str) {
        self.excluded_schema = Some(schema.to_owned());
    }

    /// The tables named explicitly, as `schema.table`.
    pub fn tables(&self) -> Vec<String> {
        self.tables
            .keys()
            .map(|(schema, table)| format!("{schema}.{table}"))
            .collect()
    }

    /// The schemas of the tables named explicitly.
    pub fn schemas(&self) -> BTreeSet<&str> {
        self.tables.keys().map(|(s, _)| s.as_str()).collect()
    }

    /// The tenant whose events the changes of `schema.table` become; `None`: dropped.
    pub fn tenant_for(&self, schema: &str, table: &str) -> Option<&TenantId> {
        // A lookup by borrowed (schema, table) without allocating is not possible with a
        // tuple key; maps are small, so a scan of the explicit entries is cheap enough.
        if let Some(tenant) = self
            .tables
            .iter()
            .find(|((s, t), _)| s == schema && t == table)
            .map(|(_, tenant)| tenant)
        {
            return Some(tenant);
        }
        if self.excluded_schema.as_deref() == Some(schema) {
            return None;
        }
        self.other.as_ref()
    }
}

/// Everything the CDC source runs with, from the `SHEAF_CDC_*` settings.
#[derive(Debug, Clone)]
pub struct CdcSettings {
    /// The `sheaf-cdc` configuration (validated; its filter is set when the source starts).
    pub source: CdcConfig,
    /// `SHEAF_CDC_TENANTS`.
    pub tenants: TableTenants,
    /// `SHEAF_CDC_MAX_IN_FLIGHT`.
    pub max_in_flight: usize,
}
