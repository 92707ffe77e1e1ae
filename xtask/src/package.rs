//! `cargo xtask package`: every publishable crate packaged as it would be published, and its
//! documentation built with rustdoc's warnings denied.
//!
//! Which crates are publishable comes from `cargo metadata` (a package whose `publish` is not
//! `false`), so a crate joins the check by dropping `publish = false` from its manifest; nothing
//! here names a crate.
//!
//! Packaging runs offline against the workspace: `cargo package` with one `-p` per crate puts
//! them in dependency order and resolves each crate's dependencies on the others through a local
//! overlay of the ones packaged before it, so no registry is asked for Sheaf's own crates, and
//! the external ones come from the lockfile's versions already fetched for the build. Each
//! package is then verified (built from its `.crate` alone), which catches what the workspace
//! build cannot: a file the crate uses but does not ship, a dependency the manifest lost.

use crate::process::{describe, output_of, run_step, workspace_root};
use anyhow::{Context, bail};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// Whether `cargo package` builds each package after making it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Build every package from its `.crate` (the full check).
    Yes,
    /// Make the packages only: manifest, versions, file list and README are checked, nothing
    /// is compiled.
    No,
}

/// `cargo xtask package [--no-verify]`.
pub fn package(args: &[&str]) -> anyhow::Result<ExitCode> {
    let verify = match args {
        [] => Verify::Yes,
        ["--no-verify"] => Verify::No,
        _ => bail!("usage: cargo xtask package [--no-verify]"),
    };
    Ok(if run(verify)? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Packages every publishable crate, then documents them; `Ok(false)` when a step failed.
pub fn run(verify: Verify) -> anyhow::Result<bool> {
    let started = Instant::now();
    let crates = publishable_crates()?;
    if crates.is_empty() {
        bail!("cargo metadata lists no publishable crate: is every crate `publish = false`?");
    }
    println!(
        "xtask: {} publishable crates: {}",
        crates.len(),
        crates.join(", ")
    );
    let selected: Vec<String> = crates
        .iter()
        .map(|name| format!("--package={name}"))
        .collect();

    forget_unpacked_packages(&crates)?;

    // `--allow-dirty`: this is a check of what the working tree would publish, run before a
    // commit as much as after one; publishing itself is not done here.
    let mut package = cargo(&["package", "--offline", "--allow-dirty"]);
    if verify == Verify::No {
        package.arg("--no-verify");
    }
    // The verification builds each `.crate` as a workspace of its own, so the root manifest's
    // `[profile.dev]` (no debug info for dependencies) does not reach it, and its dependencies
    // are compiled again with their own features. Those builds are only checked to compile:
    // debug info and incremental state would be written for nothing, and cost minutes here.
    package
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env("CARGO_INCREMENTAL", "0");
    package.args(&selected);
    let packaged = run_step(&mut package)?;

    // `--all-features`: the crate docs link to feature-gated modules (the `testkit` suites),
    // which is also how they are documented for readers (`package.metadata.docs.rs`).
    let mut doc = cargo(&["doc", "--no-deps", "--offline", "--all-features"]);
    doc.args(&selected).env("RUSTDOCFLAGS", "-D warnings");
    let documented = run_step(&mut doc)?;

    println!(
        "xtask: package: {} crates {} and documented in {:.0?}",
        crates.len(),
        match verify {
            Verify::Yes => "packaged, verified",
            Verify::No => "packaged (not verified)",
        },
        started.elapsed()
    );
    Ok(packaged && documented)
}

/// Removes the sources cargo unpacked from earlier packagings of `crates`.
///
/// The verification builds a crate's dependencies on the others from the `.crate` files just
/// made, through a local registry in `target/package`. Cargo unpacks each into
/// `$CARGO_HOME/registry/src/-<hash of that registry's path>/<name>-<version>` and, as it does
/// for any registry, never unpacks a version it finds there again: registry sources are
/// supposed to be immutable. Ours are not (every commit is `0.1.0`), so a second packaging
/// from the same checkout path (a CI that clones into one directory every time) would build
/// the previous run's sources and fail on what changed since. The local registries are the
/// directories whose names start with `-`; only Sheaf's own crates are removed from them.
fn forget_unpacked_packages(crates: &[String]) -> anyhow::Result<()> {
    let home = match std::env::var_os("CARGO_HOME") {
        Some(home) => std::path::PathBuf::from(home),
        None => std::path::PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
            .join(".cargo"),
    };
    let Ok(registries) = std::fs::read_dir(home.join("registry").join("src")) else {
        return Ok(()); // nothing was ever unpacked
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for unpacked in std::fs::read_dir(registry.path())?.flatten() {
            let name = unpacked.file_name().to_string_lossy().into_owned();
            let ours = crates.iter().any(|krate| {
                name.strip_prefix(krate.as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
            });
            if ours {
                std::fs::remove_dir_all(unpacked.path())
                    .with_context(|| format!("cannot remove {}", unpacked.path().display()))?;
            }
        }
    }
    Ok(())
}

fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(args).current_dir(workspace_root());
    cmd
}

/// The names of the workspace's packages whose `publish` is not `false` (`[]` in the metadata),
/// sorted.
pub fn publishable_crates() -> anyhow::Result<Vec<String>> {
    let mut metadata = cargo(&["metadata", "--format-version=1", "--no-deps", "--offline"]);
    let output = output_of(&mut metadata)?;
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(&metadata),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8(output.stdout).context("cargo metadata printed non-UTF-8")?;
    let root = json::parse(&text).context("cannot read cargo metadata's output")?;
    let packages = root
        .get("packages")
        .and_then(json::Value::as_array)
        .context("cargo metadata has no `packages` array")?;
    let mut names = Vec::new();
    for package in packages {
        let name = package
            .get("name")
            .and_then(json::Value::as_str)
            .context("a package in cargo metadata has no name")?;
        // `null`: any registry; a list: only those (none, for `publish = false`).
        let publishable = match package.get("publish") {
            None | Some(json::Value::Null) => true,
            Some(json::Value::Array(registries)) => !registries.is_empty(),
            Some(other) => bail!("package {name}: unexpected `publish` {other:?}"),
        };
        if publishable {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

mod json {
    //! Just enough JSON to read `cargo metadata`: xtask stays on std (see its manifest).

    use anyhow::{Context, bail};

    #[derive(Debug, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Number(String),
        String(String),
        Array(Vec<Value>),
        Object(Vec<(String, Value)>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }

        pub fn as_array(&self) -> Option<&Vec<Value>> {
            match self {
                Value::Array(items) => Some(items),
                _ => None,
            }
        }

        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::String(s) => Some(s),
                _ => None,
            }
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<Value> {
        let mut parser = Parser {
            chars: text.char_indices().peekable(),
        };
        let value = parser.value()?;
        parser.space();
        if let Some((at, c)) = parser.chars.next() {
            bail!("unexpected {c:?} at byte {at} after the value");
        }
        Ok(value)
    }

    struct Parser<'a> {
        chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    }

    impl Parser<'_> {
        fn space(&mut self) {
            while self.chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        }

        fn expect(&mut self, want: char) -> anyhow::Result<()> {
            match self.chars.next() {
                Some((_, c)) if c == want => Ok(()),
                Some((at, c)) => bail!("expected {want:?} at byte {at}, found {c:?}"),
                None => bail!("expected {want:?}, found the end"),
            }
        }

        fn word(&mut self, word: &str, value: Value) -> anyhow::Result<Value> {
            for want in word.chars() {
                self.expect(want)?;
            }
            Ok(value)
        }

        fn value(&mut self) -> anyhow::Result<Value> {
            self.space();
            let (at, c) = *self
                .chars
                .peek()
                .context("expected a value, found the end")?;
            match c {
                'n' => self.word("null", Value::Null),
                't' => self.word("true", Value::Bool(true)),
                'f' => self.word("false", Value::Bool(false)),
                '"' => Ok(Value::String(self.string()?)),
                '[' => {
                    self.expect('[')?;
                    let mut items = Vec::new();
                    self.space();
                    if self.chars.next_if(|(_, c)| *c == ']').is_some() {
                        return Ok(Value::Array(items));
                    }
                    loop {
                        items.push(self.value()?);
                        self.space();
                        match self.chars.next() {
                            Some((_, ',')) => continue,
                            Some((_, ']')) => return Ok(Value::Array(items)),
                            other => bail!("expected ',' or ']' in an array, found {other:?}"),
                        }
                    }
                }
                '{' => {
                    self.expect('{')?;
                    let mut fields = Vec::new();
                    self.space();
                    if self.chars.next_if(|(_, c)| *c == '}').is_some() {
                        return Ok(Value::Object(fields));
                    }
                    loop {
                        self.space();
                        let key = self.string()?;
                        self.space();
                        self.expect(':')?;
                        fields.push((key, self.value()?));
                        self.space();
                        match self.chars.next() {
                            Some((_, ',')) => continue,
                            Some((_, '}')) => return Ok(Value::Object(fields)),
                            other => bail!("expected ',' or '}}' in an object, found {other:?}"),
                        }
                    }
                }
                '-' | '0'..='9' => {
                    let mut number = String::new();
                    while let Some((_, c)) = self
                        .chars
                        .next_if(|(_, c)| matches!(c, '-' | '+' | '.' | 'e' | 'E' | '0'..='9'))
                    {
                        number.push(c);
                    }
                    Ok(Value::Number(number))
                }
                other => bail!("unexpected {other:?} at byte {at}"),
            }
        }

        fn string(&mut self) -> anyhow::Result<String> {
            self.expect('"')?;
            let mut out = String::new();
            loop {
                match self
                    .chars
                    .next()
                    .context("a string without its closing quote")?
                {
                    (_, '"') => return Ok(out),
                    (_, '\\') => match self.chars.next().context("a string ends in '\\'")?.1 {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'u' => {
                            let hex: String = (0..4)
                                .filter_map(|_| self.chars.next())
                                .map(|(_, c)| c)
                                .collect();
                            let code = u32::from_str_radix(&hex, 16)
                                .with_context(|| format!("bad escape \\u{hex}"))?;
                            // Surrogate pairs do not occur in what is read here (names, paths,
                            // `publish`); an unpaired one becomes the replacement character.
                            out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                        }
                        c => out.push(c),
                    },
                    (_, c) => out.push(c),
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn reads_what_cargo_metadata_prints() {
            let text = r#"{"packages":[{"name":"a","publish":null,"n":-1.5e3},
                {"name":"b\"\u00e9","publish":[],"f":[true,false,{}]}],"version":1}"#;
            let value = parse(text).unwrap();
            let packages = value.get("packages").unwrap().as_array().unwrap();
            assert_eq!(packages[0].get("publish"), Some(&Value::Null));
            assert_eq!(packages[1].get("name").unwrap().as_str(), Some("b\"é"));
            assert_eq!(packages[1].get("publish"), Some(&Value::Array(vec![])));
            assert!(parse("{\"a\":1} x").is_err());
        }
    }
}
