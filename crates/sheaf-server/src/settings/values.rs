//! The raw values of one load (the TOML file overlaid by the environment) and the typed
//! getters that read them through a [`Setting`]'s [`Kind`], so every bound comes from the table.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use super::ConfigError;
use super::table::{CONFIG_FILE, Kind, SETTINGS, Setting};

/// Setting names to the values given for them; a missing name takes its default.
#[derive(Debug, Default)]
pub struct Values {
    given: HashMap<String, String>,
}

impl Values {
    /// The values of `env` (variable name to value) over those of the TOML file its
    /// `SHEAF_CONFIG_FILE` names. Names that are not settings are ignored: the environment
    /// holds much else.
    pub fn gather(env: HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut given = match env.get(CONFIG_FILE.name).filter(|p| !p.is_empty()) {
            Some(path) => read_file(Path::new(path))?,
            None => HashMap::new(),
        };
        for (name, value) in env {
            if SETTINGS.iter().any(|s| s.name == name) {
                given.insert(name, value);
            }
        }
        Ok(Self { given })
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

    /// A [`Kind::Integer`] counted in milliseconds.
    pub fn millis(&self, setting: &Setting) -> Result<Duration, ConfigError> {
        self.int(setting).map(Duration::from_millis)
    }

    /// A [`Kind::Duration`], or a [`Kind::DurationOrOff`] (`0s` is [`Duration::ZERO`]).
    pub fn duration(&self, setting: &Setting) -> Result<Duration, ConfigError> {
        parse_one_duration(setting, &self.raw(setting))
    }

    /// A [`Kind::DurationList`].
    pub fn durations(&self, setting: &Setting) -> Result<Vec<Duration>, ConfigError> {
        parse_duration_list(setting, &self.raw(setting))
    }

    /// A [`Kind::OneOf`]: the index of the word in the kind's list.
    pub fn choice(&self, setting: &Setting) -> Result<usize, ConfigError> {
        parse_choice(setting, &self.raw(setting))
    }
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

fn parse_choice(setting: &Setting, raw: &str) -> Result<usize, ConfigError> {
    let Kind::OneOf(words) = setting.kind else {
        panic!("{} is not a one-of setting", setting.name);
    };
    words.iter().position(|w| *w == raw).ok_or_else(|| {
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
    let by_key: BTreeMap<String, &'static Setting> =
        SETTINGS.iter().map(|s| (s.file_key(), s)).collect();
    let mut values = HashMap::new();
    for (key, value) in table {
        let setting = by_key
            .get(&key)
            .ok_or_else(|| file_error(format!("{} sets unknown key {key:?}", path.display())))?;
        if setting.name == CONFIG_FILE.name {
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
                    setting.name,
                    format!(
                        "{} in {} is not a string, number or boolean",
                        other.type_str(),
                        path.display()
                    ),
                ));
            }
        };
        values.insert(setting.name.to_owned(), text);
    }
    Ok(values)
}
