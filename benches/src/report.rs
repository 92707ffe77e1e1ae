//! What a scenario hands back: its tables, its targets met or missed, the peak memory of
//! each Sheaf process, the raw figures, and a figure to plot. Printed as Markdown (so a table can
//! go into `docs/benchmarks.md` as is) and written as `<scenario>.json` and `<scenario>.svg`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use crate::context::Ctx;
use crate::plot::Figure;

/// One table: headers and rows of already formatted cells.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Self {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn markdown(&self) -> String {
        let mut out = format!("{}\n\n", self.title);
        out.push_str(&format!("| {} |\n", self.headers.join(" | ")));
        out.push_str(&format!("|{}\n", "---|".repeat(self.headers.len())));
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

/// One target (docs/benchmarks.md, "Targets at a glance"), and what this run measured for it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub what: String,
    pub goal: String,
    pub measured: String,
    /// `None` when this run could not judge it (e.g. a quick run).
    pub met: Option<bool>,
}

/// The peak resident set of one Sheaf process (or of the bench process, for in-process work).
#[derive(Debug, Clone, Serialize)]
pub struct PeakRss {
    pub process: String,
    pub peak_mib: f64,
}

impl PeakRss {
    pub fn new(process: impl Into<String>, peak_kib: Option<u64>) -> Self {
        PeakRss {
            process: process.into(),
            peak_mib: peak_kib.unwrap_or(0) as f64 / 1024.0,
        }
    }
}

/// A scenario's results.
#[derive(Debug, Serialize)]
pub struct Report {
    pub scenario: &'static str,
    /// The question the scenario answers, one sentence.
    pub question: &'static str,
    pub quick: bool,
    pub tables: Vec<Table>,
    pub targets: Vec<Target>,
    pub memory: Vec<PeakRss>,
    /// How the figures were measured, and anything a reader must know to read them.
    pub notes: Vec<String>,
    /// Every measured figure, for whoever wants to plot or compare runs.
    pub raw: serde_json::Value,
    #[serde(skip)]
    pub figure: Option<Figure>,
}

impl Report {
    pub fn new(scenario: &'static str, question: &'static str, ctx: &Ctx) -> Self {
        Report {
            scenario,
            question,
            quick: ctx.quick,
            tables: Vec::new(),
            targets: Vec::new(),
            memory: Vec::new(),
            notes: Vec::new(),
            raw: serde_json::Value::Null,
            figure: None,
        }
    }

    /// A target judged by this run; quick runs never judge (their sizes prove nothing).
    pub fn target(&mut self, what: &str, goal: &str, measured: String, met: bool) {
        self.targets.push(Target {
            what: what.to_owned(),
            goal: goal.to_owned(),
            measured,
            met: (!self.quick).then_some(met),
        });
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Prints the tables, targets, memory and notes as Markdown on stdout.
    pub fn print(&self) {
        println!(
            "\n## {}{}\n",
            self.scenario,
            if self.quick {
                " (quick: sizes too small to mean anything)"
            } else {
                ""
            }
        );
        println!("{}\n", self.question);
        for table in &self.tables {
            println!("{}", table.markdown());
        }
        if !self.targets.is_empty() {
            println!("Targets:\n");
            for t in &self.targets {
                let verdict = match t.met {
                    Some(true) => "met",
                    Some(false) => "MISSED",
                    None => "not judged (quick run)",
                };
                println!(
                    "- {}: goal {}; measured {}: **{verdict}**",
                    t.what, t.goal, t.measured
                );
            }
            println!();
        }
        if !self.memory.is_empty() {
            println!("Peak RSS:\n");
            for m in &self.memory {
                println!("- {}: {:.1} MiB", m.process, m.peak_mib);
            }
            println!();
        }
        for note in &self.notes {
            println!("- {note}");
        }
    }

    /// Writes `<out>/<scenario>.json` and, with a figure, `<out>/<scenario>.svg`; returns the paths.
    pub fn write(&self, ctx: &Ctx, elapsed: Duration) -> anyhow::Result<Vec<String>> {
        std::fs::create_dir_all(&ctx.out_dir)
            .with_context(|| format!("cannot create {}", ctx.out_dir.display()))?;
        let (cpus, mem_gib) = crate::proc::machine();
        let json = serde_json::json!({
            "report": self,
            "command": format!("cargo xtask bench {}{}", self.scenario, if self.quick { " --quick" } else { "" }),
            "machine": { "cpus": cpus, "memory_gib": (mem_gib * 10.0).round() / 10.0 },
            "finished_at_unix": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            "elapsed_s": elapsed.as_secs_f64(),
        });
        let json_path = ctx.out_dir.join(format!("{}.json", self.scenario));
        std::fs::write(&json_path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("cannot write {}", json_path.display()))?;
        let mut written = vec![display(&json_path)];
        if let Some(figure) = &self.figure {
            let svg_path = ctx.out_dir.join(format!("{}.svg", self.scenario));
            figure
                .draw(&svg_path)
                .with_context(|| format!("cannot draw {}", svg_path.display()))?;
            written.push(display(&svg_path));
        }
        Ok(written)
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// `x` with a thousands separator and no decimals: `1,286`.
pub fn count(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// Bytes in the unit that reads best: `812 B`, `26.4 KB`, `6.20 MB` (decimal units, as
/// ClickHouse's `formatReadableSize` uses binary ones; the docs say which).
pub fn bytes(b: f64) -> String {
    if b < 1_000.0 {
        format!("{b:.0} B")
    } else if b < 1_000_000.0 {
        format!("{:.1} KB", b / 1_000.0)
    } else {
        format!("{:.2} MB", b / 1_000_000.0)
    }
}

/// Milliseconds with precision that suits the size: `0.412 ms`, `9.81 ms`, `154 ms`.
pub fn millis(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.3} ms")
    } else if ms < 100.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// A ratio such as `12.4x`.
pub fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}x")
    } else {
        "n/a".to_owned()
    }
}

/// The median of `values` (the upper of the middle two for an even count); 0 for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The `p`-th percentile (0..=100) by nearest rank; 0 for none.
pub fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}
