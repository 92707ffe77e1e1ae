//! `sheaf secrets reseal`: every stored destination credential (signing secret, previous
//! secret, `config.url` password) re-sealed under the current `SHEAF_SECRETS_KEY`, while servers
//! keep running on the same database.
//!
//! The pass reads the destinations of every tenant in pages of `batch`, in id order
//! ([`sheaf_store::EntityStore::scan_destinations`]), opens each credential that is not under the current
//! key with whichever key it is under (`SHEAF_SECRETS_KEY_PREVIOUS` for the old one), seals it
//! again, and writes a page's changes back in one compare-and-set statement
//! ([`sheaf_store::EntityStore::swap_credentials`]). A destination that a server changed in between (a
//! secret rotation, a new config) is not overwritten: it is read again and re-sealed from what
//! it holds now, a few times at most. Servers never see a change: the plaintext is the same, only
//! its stored form moves to the new key, so caches stay valid and deliveries go on.
//!
//! Memory entity stores keep nothing across processes, so there is nothing a separate command
//! could re-seal there; the command says so rather than pass over an empty store.

use std::collections::HashSet;

use anyhow::Context as _;
use sheaf_store::{Destination, DestinationId, Error, Result};

use crate::backends::{Migrate, Stores};
use crate::config::EngineConfig;
use crate::state::secrets::SealedEntityStore;

/// How many times a destination changed by a server during the pass is read and re-sealed
/// again before it is left for the next pass. A change is a rare API call, so a second try
/// almost always succeeds; the bound only keeps a destination rotated in a loop from holding
/// the pass up.
const MAX_TRIES: usize = 5;

/// The largest page: a page's swaps go in one statement, whose arrays stay far below any
/// limit at this size.
pub const MAX_BATCH: usize = 10_000;

/// What a pass does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResealOptions {
    /// Destinations read, and re-sealed, per page (1 to [`MAX_BATCH`]).
    pub batch: usize,
    /// Only count what needs re-sealing; write nothing.
    pub check_only: bool,
}

/// What a pass found and did, counted in destinations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResealReport {
    /// The id of the key that seals (`SHEAF_SECRETS_KEY`).
    pub key_id: String,
    /// Destinations read.
    pub examined: u64,
    /// Destinations whose credentials this pass re-sealed.
    pub resealed: u64,
    /// Destinations still holding a credential that is not under the current key (plaintext
    /// from before a key, or sealed with another one); with `check_only`, every such one.
    pub remaining: u64,
    /// Why some of the remaining ones could not be re-sealed (a credential under a key that is
    /// neither setting, a damaged row), one line each, at most [`ResealReport::MAX_ERRORS`].
    pub errors: Vec<String>,
}

impl ResealReport {
    /// How many errors a report keeps word for word.
    pub const MAX_ERRORS: usize = 20;

    fn failed(&mut self, error: &Error) {
        self.remaining += 1;
        if self.errors.len() < Self::MAX_ERRORS {
            self.errors.push(error.to_string());
        }
    }
}

impl SealedEntityStore {
    /// Re-seals every stored destination credential under the current key (see the module
    /// docs); with `check_only`, counts the destinations that need it.
    pub async fn reseal(&self, options: ResealOptions) -> Result<ResealReport> {
        let Some(key) = self.key() else {
            return Err(Error::invalid_input(
                "SHEAF_SECRETS_KEY is not set: there is no key to seal with",
            ));
        };
        if !(1..=MAX_BATCH).contains(&options.batch) {
            return Err(Error::invalid_input(format!(
                "the batch size must be 1 to {MAX_BATCH}, got {}",
                options.batch
            )));
        }
        let mut report = ResealReport {
            key_id: key.id().to_owned(),
            ..ResealReport::default()
        };
        let mut after: Option<DestinationId> = None;
        loop {
            let page = self.inner().scan_destinations(after, options.batch).await?;
            let Some(last) = page.last() else {
                break;
            };
            after = Some(last.id);
            report.examined += page.len() as u64;
            let pending: Vec<Destination> = page
                .into_iter()
                .filter(|d| self.fully_sealed(d) == Some(false))
                .collect();
            if options.check_only {
                report.remaining += pending.len() as u64;
                continue;
            }
            self.reseal_page(pending, &mut report).await?;
            tracing::info!(
                examined = report.examined,
                resealed = report.resealed,
                remaining = report.remaining,
                "re-sealing destination credentials"
            );
        }
        Ok(report)
    }

    /// Re-seals `pending` (as stored), trying again those that changed meanwhile.
    async fn reseal_page(
        &self,
        mut pending: Vec<Destination>,
        report: &mut ResealReport,
    ) -> Result<()> {
        for _ in 0..MAX_TRIES {
            if pending.is_empty() {
                return Ok(());
            }
            let mut swaps = Vec::with_capacity(pending.len());
            for destination in &pending {
                match self.reseal_swap(destination) {
                    Ok(swap) => swaps.push(swap),
                    Err(e) => report.failed(&e),
                }
            }
            let swapped: HashSet<DestinationId> = self
                .inner()
                .swap_credentials(&swaps)
                .await?
                .into_iter()
                .collect();
            report.resealed += swapped.len() as u64;
            // The others changed since they were read (or were deleted): read each again and
            // re-seal what it holds now, if that still needs it. Rare, so one at a time.
            pending.clear();
            for swap in swaps
                .iter()
                .filter(|s| !swapped.contains(&s.destination_id))
            {
                if let Some(now) = self
                    .inner()
                    .get_destination(&swap.tenant_id, &swap.destination_id)
                    .await?
                    && self.fully_sealed(&now) == Some(false)
                {
                    pending.push(now);
                }
            }
        }
        report.remaining += pending.len() as u64;
        Ok(())
    }
}

/// Connects the entity store `config` names and re-seals it (`sheaf secrets reseal`); `None`
/// when that store is the memory one, which keeps nothing across processes.
pub async fn reseal_configured(
    config: &EngineConfig,
    options: ResealOptions,
) -> anyhow::Result<Option<ResealReport>> {
    let Some(home) = config.stores.entity_home().describe() else {
        return Ok(None);
    };
    let key = config.secrets_key.clone().context(
        "SHEAF_SECRETS_KEY is not set: it is the key every credential is re-sealed under",
    )?;
    let stores = Stores::connect(config, Migrate::No).await?;
    let sealed = SealedEntityStore::new(stores.entities, Some(key));
    let report = sealed
        .reseal(options)
        .await
        .with_context(|| format!("re-sealing destination credentials in {home}"))?;
    Ok(Some(report))
}
