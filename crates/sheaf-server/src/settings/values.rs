//! The raw values of one load (the TOML file overlaid by the environment, former names read as
//! their settings, unknown `SHEAF_` names refused) and the typed getters that read them through
//! a [`Setting`]'s [`Kind`], so every bound comes from the table.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use sheaf_engine::SettingError;

use super::ConfigError;
use super::names::{RENAMED, is_not_a_setting, unknown_key, unknown_variable};
use super::table::{CONFIG_FILE, Kind, SETTINGS, Setting};

/// Setting names to the values given for them; a missing name takes its default.
#[derive(Debug, Default)]
pub struct Values {
    given: HashMap<String, String>,
    /// One line per former name in use ([`RENAMED`]), for [`deprecation_warnings`].
    deprecated: Vec<String>,
}

impl Values {
    /// The values of `env` (variable name to value) over those of the TOML file its
    /// `SHEAF_CONFIG_FILE` names, with former names read as their settings. Names without
    /// the `SHEAF_` prefix are ignored (the environment holds much else); a `SHEAF_` name
    /// that is neither a setting, a former name nor set aside for the tools
    /// ([`is_not_a_setting`]) is refused, with the closest setting named.
    pub fn gather(env: HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut given = match env.get(CONFIG_FILE.name).filter(|p| !p.is_empty()) {
            Some(path) => read_file(Path::new(path))?,
            None => HashMap::new(),
        };
        let mut unknown = Vec::new();
        for (name, value) in env {
            if is_known(&name) {
                given.insert(name, value);
            } else if name.starts_with("SHEAF_") && !is_not_a_setting(&name) {
                unknown.push(name);
            }
        }
        // The first in name order, so the same environment always names the same variable.
        if let Some(name) = unknown.iter().min() {
            return Err(unknown_variable(name));
        }
        let deprecated = read_former_names(&mut given)?;
        Ok(Self { given, deprecated })
    }

    /// The value given for `setting`, trimmed, or its default; `None` when unset without one.
    pub fn get(&self, setting: &Setting) -> Option<String> {
        match self.given.get(setting.name) {
            Some(value) => Some(value.trim().to_owned()),
            None => setting.default.map(str::to_owned),
        }
    }

    /// A value that is set and not empty.
    pub fn optional(&self, setting: &Setting) -> Option<String> {
        self.get(setting).filter(|v| !v.is_empty())
    }

    /// A setting that has a default (the table guarantees it for the kinds below).
    fn raw(&self, setting: &Setting) -> String {
        self.get(setting).unwrap_or_default()
    }

    /// A [`Kind::Bool`].
    pub fn bool(&self, setting: &Setting) -> Result<bool, ConfigError> {
        parse_bool(setting, &self.raw(setting))
    }

    /// A [`Kind::Integer`].
    pub fn int(&self, setting: &Setting) -> Result<u64, ConfigError> {
        parse_int(setting, &self.raw(setting))
    }

    /// A [`Kind::Integer`] as a `usize`.
    pub fn usize(&self, setting: &Setting) -> Result<usize, ConfigError> {
        let n = self.int(setting)?;
        usize::try_from(n).map_err(|_| ConfigError::new(setting.name, format!("{n} is too large")))
    }

    /// A [`Kind::Integer`] as a `u32`.
    pub fn u32(&self, setting: &Setting) -> Result<u32, ConfigError> {
        let n = self.int(setting)?;
        u32::try_from(n).map_err(|_| ConfigError::new(setting.name, format!("{n} is too large")))
    }

    /// A [`Kind::Duration`], or a [`Kind::DurationOrOff`] (`0s` is [`Duration::ZERO`]).
    pub fn duration(&self, setting: &Setting) -> Result<Duration, ConfigError> {
        parse_one_duration(setting, &self.raw(setting))
    }

    /// A [`Kind::DurationList`].
    pub fn durations(&self, setting: &Setting) -> Result<Vec<Duration>, ConfigError> {
        parse_duration_list(setting, &self.raw(setting))
    }

    /// A [`Kind::OneOf`], as the variant `variants` binds its word to. The word is checked
    /// against the kind's list first, so the message lists what the docs list; a word the
    /// table accepts and `variants` lacks is a mistake in the table that its test catches.
    pub fn choice_of<T: Copy>(
        &self,
        setting: &Setting,
        variants: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let word = parse_choice(setting, &self.raw(setting))?;
        variants
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, variant)| *variant)
            .ok_or_else(|| {
                ConfigError::new(
                    setting.name,
                    format!("{word:?} is listed in the settings table but bound to nothing"),
                )
            })
    }
}

/// The engine reads its store settings by name ([`sheaf_engine::StoreConfig::from_settings`]);
/// each is found in the table, which checks the value against the setting's kind and bounds.
impl sheaf_engine::SettingSource for Values {
    fn text(&self, name: &'static str) -> Result<Option<String>, SettingError> {
        Ok(self.get(in_table(name)?))
    }

    fn word(&self, name: &'static str) -> Result<Option<String>, SettingError> {
        let setting = in_table(name)?;
        // Given empty is unset, as for every optional setting.
        match self.optional(setting) {
            Some(raw) => Ok(Some(parse_choice(setting, &raw).map_err(back)?.to_owned())),
            None => Ok(None),
        }
    }

    fn integer(&self, name: &'static str) -> Result<u64, SettingError> {
        self.int(in_table(name)?).map_err(back)
    }
}

/// The table's refusal, handed to the engine (which hands it back as the same [`ConfigError`]).
fn back(e: ConfigError) -> SettingError {
    SettingError::new(&e.setting, e.message)
}

/// The table's entry for `name`: a name the engine reads and the table lacks is a mistake its
/// tests catch (every default loads).
fn in_table(name: &str) -> Result<&'static Setting, SettingError> {
    SETTINGS
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| SettingError::new(name, "is not in the settings table"))
}

/// The deprecation warnings of the settings `env` gives (see [`Values::gather`]): one line per
/// former name in use, saying what to set instead. Tracing starts after the configuration is
/// read (it is configured by it), so the warnings are not logged while reading; `main` logs
/// these once tracing runs. An invalid configuration has none (its load already failed).
pub fn deprecation_warnings(env: HashMap<String, String>) -> Vec<String> {
    Values::gather(env)
        .map(|v| v.deprecated)
        .unwrap_or_default()
}

/// Whether `name` is read: a setting or a former name of one.
fn is_known(name: &str) -> bool {
    SETTINGS.iter().any(|s| s.name == name) || RENAMED.iter().any(|r| r.old == name)
}

/// Replaces each former name in `given` by its setting, its whole milliseconds written as
/// `ms`, and says so in the returned warnings. Both names given is refused, naming both: one
/// silently winning would leave the other a setting that seems to work and does nothing.
fn read_former_names(given: &mut HashMap<String, String>) -> Result<Vec<String>, ConfigError> {
    let mut warnings = Vec::new();
    for renamed in RENAMED {
        let Some(raw) = given.remove(renamed.old) else {
            continue;
        };
        let (old, new) = (renamed.old, renamed.new.name);
        if given.contains_key(new) {
            return Err(ConfigError::new(
                old,
                format!("is the former name of {new}, which is set too; keep only {new}"),
            ));
        }
        let millis: u64 = raw.trim().parse().map_err(|_| {
            ConfigError::new(
                old,
                format!("{raw:?} is not a whole number of milliseconds (its successor {new} takes a unit: 50ms, 2s)"),
            )
        })?;
        let value = format!("{millis}ms");
        check_kind(renamed.new, &value).map_err(|e| ConfigError::new(old, e.message))?;
        warnings.push(format!(
            "{old} is deprecated and will be removed: read as {new}={value}; set {new} instead"
        ));
        given.insert(new.to_owned(), value);
    }
    Ok(warnings)
}

/// Checks `raw` against the kind of `setting` (the table's test runs every default through it).
pub fn check_kind(setting: &Setting, raw: &str) -> Result<(), ConfigError> {
    match setting.kind {
        Kind::Bool => parse_bool(setting, raw).map(drop),
        Kind::Integer { .. } => parse_int(setting, raw).map(drop),
        Kind::Duration { .. } | Kind::DurationOrOff { .. } => {
            parse_one_duration(setting, raw).map(drop)
        }
        Kind::DurationList { .. } => parse_duration_list(setting, raw).map(drop),
        Kind::OneOf(_) => parse_choice(setting, raw).map(drop),
        Kind::Text(_) => Ok(()),
    }
}

fn parse_bool(setting: &Setting, raw: &str) -> Result<bool, ConfigError> {
    match raw.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::new(
            setting.name,
            format!("{raw:?} is not a boolean (use true or false)"),
        )),
    }
}

fn parse_int(setting: &Setting, raw: &str) -> Result<u64, ConfigError> {
    let Kind::Integer { min, max } = setting.kind else {
        panic!("{} is not an integer setting", setting.name);
    };
    let n: u64 = raw.parse().map_err(|_| {
        ConfigError::new(
            setting.name,
            format!("{raw:?} is not a whole non-negative number"),
        )
    })?;
    if n < min {
        return Err(ConfigError::new(
            setting.name,
            format!("{n} is below the minimum of {min}"),
        ));
    }
    if n > max {
        return Err(ConfigError::new(
            setting.name,
            format!("{n} is above the maximum of {max}"),
        ));
    }
    Ok(n)
}

fn parse_one_duration(setting: &Setting, raw: &str) -> Result<Duration, ConfigError> {
    let (min, max, off) = match setting.kind {
        Kind::Duration { min, max } => (min, max, false),
        Kind::DurationOrOff { min, max } => (min, max, true),
        _ => panic!("{} is not a duration setting", setting.name),
    };
    let d = parse_duration(raw).map_err(|m| ConfigError::new(setting.name, m))?;
    if off && d.is_zero() {
        return Ok(d);
    }
    check_range(setting, raw, d, min, max).map_err(|e| {
        if off {
            ConfigError::new(setting.name, format!("{} (0s turns it off)", e.message))
        } else {
            e
        }
    })?;
    Ok(d)
}

fn parse_duration_list(setting: &Setting, raw: &str) -> Result<Vec<Duration>, ConfigError> {
    let Kind::DurationList { min, max } = setting.kind else {
        panic!("{} is not a duration list setting", setting.name);
    };
    let mut list = Vec::new();
    for part in raw.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(ConfigError::new(
                setting.name,
                format!("{raw:?} has an empty entry"),
            ));
        }
        let d = parse_duration(part).map_err(|m| ConfigError::new(setting.name, m))?;
        check_range(setting, part, d, min, max)?;
        list.push(d);
    }
    Ok(list)
}

fn parse_choice(setting: &Setting, raw: &str) -> Result<&'static str, ConfigError> {
    let Kind::OneOf(words) = setting.kind else {
        panic!("{} is not a one-of setting", setting.name);
    };
    words.iter().find(|w| **w == raw).copied().ok_or_else(|| {
        ConfigError::new(
            setting.name,
            format!("{raw:?} is not one of {}", words.join(", ")),
        )
    })
}

fn check_range(
    setting: &Setting,
    raw: &str,
    d: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if d < min {
        return Err(ConfigError::new(
            setting.name,
            format!("{raw} is below the minimum of {}", format_duration(min)),
        ));
    }
    if d > max {
        return Err(ConfigError::new(
            setting.name,
            format!("{raw} is above the maximum of {}", format_duration(max)),
        ));
    }
    Ok(())
}

/// Parses `500ms`, `5s`, `1m`, `2h`, `1d`.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let split = raw
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{raw:?} has no unit (write e.g. 500ms, 5s, 1m, 2h or 1d)"))?;
    let (digits, unit) = raw.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{raw:?} is not a duration such as 500ms, 5s, 1m, 2h or 1d"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{raw:?} has an unknown unit {unit:?} (use ms, s, m, h or d)"
            ));
        }
    };
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{raw:?} is too long"))
}

/// The shortest exact spelling of `d` that [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Reads the TOML file into setting names and string values.
fn read_file(path: &Path) -> Result<HashMap<String, String>, ConfigError> {
    let file_error = |message: String| ConfigError::new(CONFIG_FILE.name, message);
    let text = std::fs::read_to_string(path)
        .map_err(|e| file_error(format!("cannot read {}: {e}", path.display())))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| file_error(format!("{} is not valid TOML: {e}", path.display())))?;
    // A key names a setting, or a former name of one, by its variable's name.
    let by_key: BTreeMap<String, &'static str> = SETTINGS
        .iter()
        .map(|s| (s.file_key(), s.name))
        .chain(RENAMED.iter().map(|r| (r.old_file_key(), r.old)))
        .collect();
    let mut values = HashMap::new();
    for (key, value) in table {
        let Some(&name) = by_key.get(&key) else {
            return Err(file_error(unknown_key(path, &key)));
        };
        if name == CONFIG_FILE.name {
            return Err(file_error("the file cannot name another file".to_owned()));
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
                .join(","),
            other => {
                return Err(ConfigError::new(
                    name,
                    format!(
                        "{} in {} is not a string, number or boolean",
                        other.type_str(),
                        path.display()
                    ),
                ));
            }
        };
        values.insert(name.to_owned(), text);
    }
    Ok(values)
}
