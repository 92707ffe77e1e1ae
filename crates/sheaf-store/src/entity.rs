//! Tenants and their destinations, and the [`EntityStore`] trait that keeps them.
//!
//! Longer than 600 lines because a destination's every field, its patch and the rules each
//! backend must apply to them are documented here, in one place, for backends written outside.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{DestinationId, Error, Filter, Result, TenantId, Timestamp};

/// A tenant: the owner of destinations and events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// Chosen by whoever created it.
    pub id: TenantId,
    /// Free-form labels for operators; Sheaf does not interpret them.
    pub metadata: BTreeMap<String, String>,
    /// When it was first created.
    pub created_at: Timestamp,
    /// When it was last upserted.
    pub updated_at: Timestamp,
}

/// What [`EntityStore::upsert_tenant`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantUpsert {
    /// The tenant as stored afterwards.
    pub tenant: Tenant,
    /// `true` if the call created it, `false` if it updated an existing one.
    pub created: bool,
}

/// A destination's type: the name of the destination type that delivers to it (`webhook`,
/// `rabbitmq`, …). The store keeps the name and the type's `config`; which names exist is the
/// service's business (its registry of destination types), so the store only checks that a
/// name is one: 1 to 32 characters, lower-case ASCII letters, digits, `_` or `-`, starting with
/// a letter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DestinationKind(String);

impl DestinationKind {
    /// The longest name.
    pub const MAX_LEN: usize = 32;

    /// `name`, if it is a well-formed type name ([`Error::InvalidInput`] otherwise).
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let well_formed = (1..=Self::MAX_LEN).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !well_formed {
            return Err(Error::invalid_input(format!(
                "{name:?} is not a destination type name (1 to {} lower-case letters, digits, `_` or `-`, starting with a letter)",
                Self::MAX_LEN
            )));
        }
        Ok(DestinationKind(name))
    }

    /// The name, as the API and stores' columns use it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DestinationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for DestinationKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        DestinationKind::new(s)
    }
}

impl TryFrom<String> for DestinationKind {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        DestinationKind::new(s)
    }
}

impl From<DestinationKind> for String {
    fn from(kind: DestinationKind) -> String {
        kind.0
    }
}

/// Which topics a destination receives. Serialized as a JSON list: `["*"]` for all, or the topics.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Topics {
    /// Every topic (`["*"]`).
    All,
    /// Only these topics: non-empty, sorted, without repeats or `*`.
    Only(Vec<String>),
}

impl Topics {
    /// Parses the API's list form: `["*"]` is [`Topics::All`]; otherwise every entry must pass
    /// [`crate::validate_topic`]. An empty list, or `*` next to other topics, is
    /// [`Error::InvalidInput`]. The list is sorted and deduplicated so equal filters compare equal.
    pub fn from_list(list: Vec<String>) -> Result<Self> {
        if list.iter().any(|t| t == "*") {
            return if list.len() == 1 {
                Ok(Topics::All)
            } else {
                Err(Error::invalid_input(
                    "\"*\" must be the only entry of a topics filter",
                ))
            };
        }
        if list.is_empty() {
            return Err(Error::invalid_input(
                "a topics filter needs at least one entry",
            ));
        }
        for topic in &list {
            crate::validate_topic(topic)?;
        }
        let mut list = list;
        list.sort();
        list.dedup();
        Ok(Topics::Only(list))
    }

    /// The API's list form.
    pub fn to_list(&self) -> Vec<String> {
        match self {
            Topics::All => vec!["*".to_owned()],
            Topics::Only(topics) => topics.clone(),
        }
    }

    /// Whether an event with `topic` goes to a destination with this filter.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            Topics::All => true,
            Topics::Only(topics) => topics.iter().any(|t| t == topic),
        }
    }
}

impl Serialize for Topics {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_list().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Topics {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let list = Vec::<String>::deserialize(deserializer)?;
        Topics::from_list(list).map_err(serde::de::Error::custom)
    }
}

/// A signing secret (Standard Webhooks: `whsec_` followed by base64). `Debug` never prints it.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret. The store does not generate secrets (the service does, with its own
    /// random source); it only requires one to be non-empty.
    pub fn new(secret: impl Into<String>) -> Result<Self> {
        let secret = secret.into();
        if secret.is_empty() {
            return Err(Error::invalid_input("a secret must not be empty"));
        }
        Ok(Secret(secret))
    }

    /// The secret itself, for signing and for storing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The secret a rotation replaced, still valid until `expires_at` so receivers can switch over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousSecret {
    /// The replaced secret.
    pub secret: Secret,
    /// When it stops being used to sign.
    pub expires_at: Timestamp,
}

/// Where a tenant's events are delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destination {
    /// Generated when it is created; unique across tenants.
    pub id: DestinationId,
    /// Its owner.
    pub tenant_id: TenantId,
    /// Which destination type delivers to it.
    pub kind: DestinationKind,
    /// Where and how, in the shape its type defines (a webhook's `{"url": …}`, a broker's URL
    /// and exchange). The service's destination type validates it; the store keeps it as given.
    pub config: serde_json::Value,
    /// Which events it receives.
    pub topics: Topics,
    /// Of the events whose topic it receives, which it receives: `None` for all.
    pub filter: Option<Filter>,
    /// At most this many deliveries started per second, across every process; `None`: no limit.
    pub rate_limit: Option<RateLimit>,
    /// Extra HTTP headers sent with every delivery, by name.
    pub headers: BTreeMap<String, String>,
    /// A jq program that reshapes each event into what the destination receives (or drops it);
    /// `None`: the event's `data` as published. The service checks it compiles before saving;
    /// the store keeps the source as given (text without NUL characters, which Postgres cannot
    /// hold).
    pub transform: Option<String>,
    /// Per-key ordering: a JSON pointer into the event `{"id", "topic", "data"}` whose value is
    /// each event's order key (`/data/order_id`); a key's events go one at a time, in the order
    /// they were accepted. `None`: in parallel, in no promised order.
    pub ordering_key: Option<String>,
    /// With an ordering key: whether a dead letter blocks its key, so that the key's later
    /// events wait until it is retried or discarded (`true`), or lets them go on without it
    /// (`false`). Meaningless without an ordering key.
    pub dead_letter_blocks_key: bool,
    /// Disabled destinations keep their configuration but receive nothing.
    pub enabled: bool,
    /// Why it is disabled and since when; `None` while it is enabled.
    pub disabled_reason: Option<DisabledReason>,
    /// Failed attempts since its last successful one, as [`EntityStore::record_delivery_health`]
    /// counted them; re-enabling a destination keeps the count until a success resets it.
    pub consecutive_failures: u32,
    /// The current signing secret.
    pub secret: Secret,
    /// The secret before the last rotation, while it is still valid.
    pub previous_secret: Option<PreviousSecret>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was last changed (patched, enabled, disabled or rotated).
    pub updated_at: Timestamp,
}

impl Destination {
    /// Whether an event with `topic` and `data` is for this destination: its topic is one it
    /// receives and its payload filter, if any, matches. Says nothing about `enabled`.
    pub fn wants(&self, topic: &str, data: &serde_json::Value) -> bool {
        self.topics.matches(topic) && self.filter.as_ref().is_none_or(|f| f.matches(topic, data))
    }

    /// The secrets to sign with at `now`: the current one, then the previous one if it has not
    /// expired (Standard Webhooks sends one signature per secret during a rotation).
    pub fn signing_secrets(&self, now: Timestamp) -> Vec<&Secret> {
        let mut secrets = vec![&self.secret];
        if let Some(previous) = &self.previous_secret
            && previous.expires_at > now
        {
            secrets.push(&previous.secret);
        }
        secrets
    }
}

/// How many deliveries to a destination may start per second, across every process sharing the
/// queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RateLimit {
    /// Deliveries started per second: 1 to [`RateLimit::MAX`].
    pub per_second: u32,
}

impl RateLimit {
    /// The highest limit: above it, a limit is no limit in practice.
    pub const MAX: u32 = 10_000;

    /// A limit of `per_second`, [`Error::InvalidInput`] outside 1..=[`RateLimit::MAX`].
    pub fn new(per_second: u32) -> Result<Self> {
        if !(1..=Self::MAX).contains(&per_second) {
            return Err(Error::invalid_input(format!(
                "rate_limit.per_second must be 1 to {}, got {per_second}",
                Self::MAX
            )));
        }
        Ok(RateLimit { per_second })
    }
}

/// Why a destination is disabled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisabledReason {
    /// In words, for people: "disabled through the API", "10 consecutive failed attempts; …".
    pub reason: String,
    /// When it was disabled.
    pub since: Timestamp,
    /// `true` when Sheaf disabled it after failed attempts, `false` when someone did.
    pub automatic: bool,
}

impl DisabledReason {
    /// Disabled by someone, now.
    pub fn by_request() -> Self {
        DisabledReason {
            reason: "disabled through the API".to_owned(),
            since: Timestamp::now(),
            automatic: false,
        }
    }

    /// Disabled by [`EntityStore::record_delivery_health`] at `since`, after `failures`
    /// consecutive failed attempts, the last of which got `last_error`. Every backend words it
    /// so: "`failures` consecutive failed attempts; the last: `last_error`".
    pub fn after_failures(failures: u32, last_error: &str, since: Timestamp) -> Self {
        DisabledReason {
            reason: format!("{failures} consecutive failed attempts; the last: {last_error}"),
            since,
            automatic: true,
        }
    }
}

/// One destination's delivery results since its previous report, summarized for
/// [`EntityStore::record_delivery_health`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryHealth {
    /// The destination's tenant.
    pub tenant_id: TenantId,
    /// The destination.
    pub destination_id: DestinationId,
    /// Whether one of the attempts succeeded.
    pub succeeded: bool,
    /// Failed attempts after the last successful one (all of them when none succeeded).
    pub failures_after: u32,
    /// What the last failed attempt got, in words (empty when there was none).
    pub last_error: String,
}

/// The checks every backend makes on [`EntityStore::record_delivery_health`]'s arguments: a
/// limit of at least 1, and each destination reported once.
pub fn validate_health_reports(reports: &[DeliveryHealth], disable_after: u32) -> Result<()> {
    if disable_after == 0 {
        return Err(Error::invalid_input(
            "the limit of consecutive failures must be at least 1",
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(reports.len());
    for report in reports {
        if !seen.insert(report.destination_id) {
            return Err(Error::invalid_input(format!(
                "destination {} is reported twice",
                report.destination_id
            )));
        }
    }
    Ok(())
}

/// What [`EntityStore::record_delivery_health`] changed, with the destination as stored
/// afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthChange {
    /// It reached the limit of consecutive failures while enabled, and was disabled.
    Disabled(Destination),
    /// It succeeded after having reached the limit (it had been disabled for it, and was
    /// enabled again since).
    Recovered(Destination),
}

/// A partial update of a destination: `None` fields stay as they are.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DestinationPatch {
    /// A new `config`, replacing the old one whole.
    pub config: Option<serde_json::Value>,
    /// A new topics filter.
    pub topics: Option<Topics>,
    /// A new payload filter (`Some(Some(_))`), or none any more (`Some(None)`).
    pub filter: Option<Option<Filter>>,
    /// A new rate limit (`Some(Some(_))`), or none any more (`Some(None)`).
    pub rate_limit: Option<Option<RateLimit>>,
    /// A new set of custom headers (replacing the old set whole).
    pub headers: Option<BTreeMap<String, String>>,
    /// A new transformation (`Some(Some(_))`), or none any more (`Some(None)`).
    pub transform: Option<Option<String>>,
    /// A new ordering key pointer (`Some(Some(_))`), or no ordering any more (`Some(None)`).
    pub ordering_key: Option<Option<String>>,
    /// Whether a dead letter blocks its key from now on.
    pub dead_letter_blocks_key: Option<bool>,
    /// Enable (which clears `disabled_reason`) or disable (which sets it to the patch's
    /// `disabled_reason`).
    pub enabled: Option<bool>,
    /// Why, when the patch disables; ignored otherwise.
    pub disabled_reason: Option<DisabledReason>,
}

impl DestinationPatch {
    /// A patch that only enables, or disables by request ([`DisabledReason::by_request`]).
    pub fn enabled(enabled: bool) -> Self {
        DestinationPatch {
            enabled: Some(enabled),
            disabled_reason: (!enabled).then(DisabledReason::by_request),
            ..Default::default()
        }
    }

    /// Applies the patch to `destination` as every backend must: each field given replaces
    /// the stored one; `enabled: true` clears the disabled reason and `enabled: false` records
    /// the patch's; `updated_at` moves to now, never backwards.
    pub fn apply_to(&self, destination: &mut Destination) {
        if let Some(config) = &self.config {
            destination.config = config.clone();
        }
        if let Some(topics) = &self.topics {
            destination.topics = topics.clone();
        }
        if let Some(filter) = &self.filter {
            destination.filter = filter.clone();
        }
        if let Some(rate_limit) = self.rate_limit {
            destination.rate_limit = rate_limit;
        }
        if let Some(headers) = &self.headers {
            destination.headers = headers.clone();
        }
        if let Some(transform) = &self.transform {
            destination.transform = transform.clone();
        }
        if let Some(ordering_key) = &self.ordering_key {
            destination.ordering_key = ordering_key.clone();
        }
        if let Some(blocks) = self.dead_letter_blocks_key {
            destination.dead_letter_blocks_key = blocks;
        }
        if let Some(enabled) = self.enabled {
            destination.enabled = enabled;
            destination.disabled_reason = if enabled {
                None
            } else {
                self.disabled_reason.clone()
            };
        }
        destination.updated_at = Timestamp::now().max(destination.updated_at);
    }
}

/// What a destination keeps of its credentials, as stored: the values a service that seals
/// them at rest re-seals under a new key ([`EntityStore::swap_credentials`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCredentials {
    /// The current signing secret.
    pub secret: Secret,
    /// The previous signing secret, if any (its expiry is not part of the swap).
    pub previous_secret: Option<Secret>,
    /// The whole `config`, which may carry a credential (a password in a URL).
    pub config: serde_json::Value,
}

impl StoredCredentials {
    /// The credentials `destination` holds.
    pub fn of(destination: &Destination) -> Self {
        StoredCredentials {
            secret: destination.secret.clone(),
            previous_secret: destination
                .previous_secret
                .as_ref()
                .map(|p| p.secret.clone()),
            config: destination.config.clone(),
        }
    }
}

/// One compare-and-set of [`EntityStore::swap_credentials`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialsSwap {
    /// The destination's tenant.
    pub tenant_id: TenantId,
    /// The destination.
    pub destination_id: DestinationId,
    /// What it must still hold for the swap to happen.
    pub expected: StoredCredentials,
    /// What it holds afterwards. Without a previous secret in `expected`, this one has none
    /// either.
    pub replacement: StoredCredentials,
}

/// Tenants and destinations: small, rarely written, read through the service's cache.
///
/// Getters return `Ok(None)` for something that does not exist; mutations of something that does
/// not exist return [`Error::NotFound`]. A destination is only reachable through its own tenant:
/// naming it with another tenant is the same as naming one that does not exist.
#[async_trait]
pub trait EntityStore: fmt::Debug + Send + Sync + 'static {
    /// Creates the tenant, or replaces the metadata of an existing one (keeping its `created_at`).
    /// The store sets `created_at` and `updated_at` from its clock.
    async fn upsert_tenant(
        &self,
        id: &TenantId,
        metadata: &BTreeMap<String, String>,
    ) -> Result<TenantUpsert>;

    /// The tenant, or `None`.
    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>>;

    /// Deletes the tenant and all its destinations, atomically. [`Error::NotFound`] if it does
    /// not exist. (The log and the queue are cleaned separately: log retention, and
    /// [`crate::JobQueue::purge_tenant`].)
    async fn delete_tenant(&self, id: &TenantId) -> Result<()>;

    /// Stores a new destination exactly as given (the caller generates the id and the secret and
    /// sets the times). [`Error::NotFound`] if its tenant does not exist; [`Error::Conflict`] if its
    /// id is taken, in any tenant.
    async fn create_destination(&self, destination: &Destination) -> Result<()>;

    /// The tenant's destination, or `None` (also when the id belongs to another tenant).
    async fn get_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> Result<Option<Destination>>;

    /// All the tenant's destinations, oldest first (by id, which sorts by creation time). Empty for
    /// a tenant that does not exist. A tenant has few destinations, so there is no paging.
    async fn list_destinations(&self, tenant: &TenantId) -> Result<Vec<Destination>>;

    /// Applies `patch` atomically (no read-modify-write race between two patches), sets
    /// `updated_at` from the store's clock, and returns the destination as stored afterwards.
    /// [`Error::NotFound`] if the tenant has no such destination.
    async fn update_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        patch: &DestinationPatch,
    ) -> Result<Destination>;

    /// Makes `new_secret` the signing secret and keeps the one it replaces as the previous secret
    /// until `previous_expires_at` (replacing any older previous secret), atomically; sets
    /// `updated_at` and returns the destination as stored afterwards. [`Error::NotFound`] if the
    /// tenant has no such destination.
    async fn rotate_secret(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        new_secret: &Secret,
        previous_expires_at: Timestamp,
    ) -> Result<Destination>;

    /// Deletes the destination. [`Error::NotFound`] if the tenant has no such destination.
    async fn delete_destination(&self, tenant: &TenantId, id: &DestinationId) -> Result<()>;

    /// Counts consecutive failed attempts per destination and disables the ones that reach
    /// `disable_after` (at least 1), atomically per destination and in one round trip for the
    /// whole slice (the service calls it once per batch of outcomes, not once per attempt).
    ///
    /// For each report, with `old` the stored `consecutive_failures`: the new count is
    /// `failures_after` if it `succeeded`, else `old + failures_after` (saturating). Then
    ///
    /// - if it `succeeded` and `old >= disable_after`: [`HealthChange::Recovered`];
    /// - if it is enabled, `failures_after > 0` and the new count `>= disable_after`: it is
    ///   disabled, with a [`DisabledReason`] (`automatic`, the store's clock, the count and
    ///   `last_error` in its `reason`) and `updated_at` moved, and [`HealthChange::Disabled`].
    ///
    /// Both can come from one report, in that order. A destination that is re-enabled with its
    /// count at the limit is therefore disabled again by its next failure, unless a success came
    /// first. Reports of destinations that do not exist (in that tenant) are skipped; a
    /// destination reported twice in one call is a caller error ([`Error::InvalidInput`]).
    /// Counting alone does not move `updated_at`.
    async fn record_delivery_health(
        &self,
        reports: &[DeliveryHealth],
        disable_after: u32,
    ) -> Result<Vec<HealthChange>>;

    /// Every tenant's destinations, in id order, those after `after` (all with `None`), at most
    /// `limit`: a pass over the whole table in pages, for maintenance such as re-sealing
    /// credentials under a new key. The default refuses: a store that keeps nothing across
    /// processes (the memory one) has nothing such a pass could change for another process.
    async fn scan_destinations(
        &self,
        after: Option<DestinationId>,
        limit: usize,
    ) -> Result<Vec<Destination>> {
        let _ = (after, limit);
        Err(Error::Backend {
            message: "this entity store cannot scan every tenant's destinations".to_owned(),
            source: None,
        })
    }

    /// For each swap whose destination still holds exactly its `expected` credentials, stores
    /// its `replacement` ones, all in one round trip, and returns the ids of the destinations
    /// swapped; the others (changed meanwhile, or gone) are left as they are, for the caller to
    /// read again. Nothing else changes, `updated_at` included: a swap stores the same
    /// credentials in another form. The default refuses, as [`Self::scan_destinations`] does.
    async fn swap_credentials(&self, swaps: &[CredentialsSwap]) -> Result<Vec<DestinationId>> {
        let _ = swaps;
        Err(Error::Backend {
            message: "this entity store cannot swap stored credentials".to_owned(),
            source: None,
        })
    }

    /// Whether the store is reachable, for readiness checks. The default says yes.
    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}
