//! Which names the settings answer to, beside the table's own: the former names still read
//! ([`RENAMED`]), the `SHEAF_` names set aside for the development tools ([`NOT_SETTINGS`]),
//! the variant each word of `SHEAF_LOG_FORMAT` binds ([`LOG_FORMAT_WORDS`]), and the
//! closest setting to a name that is none of these, for the refusal that names it.

use std::path::Path;

use super::table::{LOG_WRITE_MAX_WAIT, RETRY_LOOKUP_BATCH_WAIT, SETTINGS, Setting, file_key_of};
use super::{ConfigError, LogFormat};

/// A setting's former name, still read so an existing deployment keeps starting: its value,
/// a whole number of milliseconds, is read as the same number of `ms` by [`Renamed::new`],
/// and start-up warns ([`super::deprecation_warnings`]). Setting both names is
/// refused, naming both, rather than one silently winning.
#[derive(Debug, Clone, Copy)]
pub struct Renamed {
    /// The former variable.
    pub old: &'static str,
    /// The setting that replaces it.
    pub new: &'static Setting,
}

impl Renamed {
    /// The key that set it in the TOML file.
    pub fn old_file_key(&self) -> String {
        file_key_of(self.old)
    }
}

/// Every setting still read under a former name. The `_MS` settings took plain integers where
/// every other duration takes a unit; their successors take `50ms` or `2s` like the rest.
pub const RENAMED: &[Renamed] = &[
    Renamed {
        old: "SHEAF_RETRY_LOOKUP_BATCH_WAIT_MS",
        new: &RETRY_LOOKUP_BATCH_WAIT,
    },
    Renamed {
        old: "SHEAF_LOG_WRITE_MAX_WAIT_MS",
        new: &LOG_WRITE_MAX_WAIT,
    },
];

/// `SHEAF_*` variables that are not settings: those of the test suites, benchmarks, fault
/// suite and xtask, which a developer's shell exports (`cargo xtask services env`) next to the
/// settings of a `sheaf` started by hand. An entry ending in `_` sets aside every name it
/// starts; any other is one name. Every other `SHEAF_*` variable must be a setting: start-up
/// refuses an unknown one, naming the closest setting, because a mistyped name
/// (`SHEAF_LOGSTORE`) would otherwise run silently on the default (the memory log).
/// `docs/configuration.md` lists the same, and a test keeps the two in step.
pub const NOT_SETTINGS: &[&str] = &[
    "SHEAF_TEST_",
    "SHEAF_BENCH_",
    "SHEAF_CHAOS_",
    "SHEAF_PARITY_",
    "SHEAF_FILTER_SEED",
    "SHEAF_UPDATE_GENERATED",
    "SHEAF_CACHE_DIR",
    "SHEAF_URL",
];

/// Whether `name` is not a setting although it starts with `SHEAF_`: set aside for the tools
/// by [`NOT_SETTINGS`], or one of the variables Kubernetes gives every pod for a Service whose
/// name starts `sheaf` ([`is_service_link`]).
pub fn is_not_a_setting(name: &str) -> bool {
    is_service_link(name)
        || NOT_SETTINGS.iter().any(|entry| {
            if entry.ends_with('_') {
                name.starts_with(entry)
            } else {
                name == *entry
            }
        })
}

/// Whether `name` has the shape of a Kubernetes service link: for a Service `sheaf` (or
/// `sheaf-postgres`) in its namespace, every pod gets `SHEAF_SERVICE_HOST`,
/// `SHEAF_SERVICE_PORT[_<port name>]`, `SHEAF_PORT` and
/// `SHEAF_PORT_<port>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]` (`enableServiceLinks`, on by
/// default). Sheaf's own Service is most likely called `sheaf`,
/// so refusing these would stop every pod beside it. No setting ends in `_PORT` or has
/// `_SERVICE_HOST`/`_SERVICE_PORT` in it, and a test keeps it so.
pub fn is_service_link(name: &str) -> bool {
    if name.ends_with("_SERVICE_HOST")
        || name.ends_with("_SERVICE_PORT")
        || name.contains("_SERVICE_PORT_")
        || name.ends_with("_PORT")
    {
        return true;
    }
    // `…_PORT_8470_TCP`, `…_PORT_8470_TCP_ADDR` and the like.
    name.match_indices("_PORT_").any(|(at, marker)| {
        let rest = &name[at + marker.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Some(protocol) = rest[digits..].strip_prefix('_') else {
            return false;
        };
        let protocol = ["TCP", "UDP", "SCTP"]
            .into_iter()
            .find(|p| protocol.starts_with(p));
        digits > 0
            && protocol.is_some_and(|p| {
                matches!(
                    &rest[digits + 1 + p.len()..],
                    "" | "_PROTO" | "_PORT" | "_ADDR"
                )
            })
    })
}

/// The variant each word of [`SHEAF_LOG_FORMAT`](super::table::LOG_FORMAT) names. Words are
/// bound to variants by name, so the order of the table's [`Kind::OneOf`](super::Kind::OneOf)
/// list (the order the docs show) cannot swap them; a test checks that the two lists hold the
/// same words. The store settings' words are the engine's (`sheaf_engine::LogStoreKind::WORDS`
/// and the like), checked by the same test.
pub const LOG_FORMAT_WORDS: &[(&str, LogFormat)] =
    &[("text", LogFormat::Text), ("json", LogFormat::Json)];

/// The refusal of an unknown `SHEAF_` variable, naming the setting it most likely meant.
pub(super) fn unknown_variable(name: &str) -> ConfigError {
    let candidates = SETTINGS
        .iter()
        .map(|s| (s.name, s.name))
        .chain(RENAMED.iter().map(|r| (r.old, r.new.name)));
    let message = match closest(name, candidates) {
        Some(meant) => format!("unknown setting; did you mean {meant}?"),
        None => "unknown setting: `sheaf --help` lists the settings, and docs/configuration.md the SHEAF_ names set aside for tools".to_owned(),
    };
    ConfigError::new(name, message)
}

/// Of `candidates` (a name, and what to suggest when it is the closest), the suggestion for
/// the name nearest `name` by edit distance, if near enough to be a typo: at most 2 edits, or
/// a third of the name past `SHEAF_` when that is more (a longer name has room for more slips),
/// so an unrelated name gets no suggestion that would mislead.
pub(super) fn closest<'a>(
    name: &str,
    candidates: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<&'a str> {
    let wanted = name.to_ascii_uppercase();
    let bound = (wanted.trim_start_matches("SHEAF_").len() / 3).max(2);
    candidates
        .map(|(candidate, suggestion)| {
            (
                edit_distance(&wanted, &candidate.to_ascii_uppercase()),
                suggestion,
            )
        })
        .filter(|(distance, _)| *distance <= bound)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, suggestion)| suggestion)
}

/// Levenshtein distance: the fewest single-character insertions, deletions and substitutions
/// that turn `a` into `b`. One row of the table at a time; names are short.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The refusal of a key the file should not hold, naming the key it most likely meant.
pub(super) fn unknown_key(path: &Path, key: &str) -> String {
    let keys: Vec<(String, String)> = SETTINGS
        .iter()
        .map(|s| (s.file_key(), s.file_key()))
        .chain(RENAMED.iter().map(|r| (r.old_file_key(), r.new.file_key())))
        .collect();
    match closest(key, keys.iter().map(|(k, s)| (k.as_str(), s.as_str()))) {
        Some(meant) => format!(
            "{} sets unknown key {key:?}; did you mean {meant:?}?",
            path.display()
        ),
        None => format!("{} sets unknown key {key:?}", path.display()),
    }
}
