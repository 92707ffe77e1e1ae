//! A CPU profile of a running `sheaf`: `perf record` with DWARF call stacks while a scenario
//! loads it, folded (inferno's perf collapser) and drawn as a flame graph (SVG), with a summary:
//! the share of samples that ran inside each area of the stack (inclusive) and the functions
//! that were on the CPU themselves (self). Optional: without `perf` on the PATH, or when the
//! kernel refuses it, the scenario says so and goes on.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context as _;
use inferno::collapse::Collapse as _;

/// Areas of the stack, by what a frame's name contains, in the order the summary prints them.
/// A sample counts for every area one of its frames belongs to.
const AREAS: &[(&str, &[&str])] = &[
    ("kernel (syscalls, network, scheduling)", &["_[k]"]),
    (
        "waking and parking threads (futex, tokio's park)",
        &["futex", "tokio::runtime::park", "multi_thread::park"],
    ),
    (
        "receiving publishes (axum, hyper server)",
        &["axum::", "hyper::server", "dispatch::Server"],
    ),
    (
        "publishing (sheaf-engine ingest)",
        &["sheaf_engine::ingest"],
    ),
    (
        "delivering (sheaf-engine delivery)",
        &["sheaf_engine::delivery"],
    ),
    (
        "webhook requests (sheaf-webhook, reqwest, hyper client)",
        &[
            "sheaf_webhook::",
            "reqwest::",
            "hyper_util::client",
            "hyper::client",
        ],
    ),
    (
        "signing (HMAC-SHA256)",
        &["sheaf_webhook::sign", "sha2::", "hmac::"],
    ),
    ("JSON (serde_json)", &["serde_json::"]),
    ("the log and queue (sheaf-memory)", &["sheaf_memory::"]),
    ("coalescers (sheaf-coalesce)", &["sheaf_coalesce::"]),
    ("caches (moka)", &["moka::"]),
    (
        "metrics and tracing",
        // Not `tracing::instrument::Instrumented`, which wraps whole futures.
        &[
            "sheaf_engine::state::metrics",
            "tracing_core::",
            "tracing_subscriber::",
            "tracing::span::Span::new",
            "tracing::span::Span::record",
            "tracing::span::Span::enter",
            "tracing::span::Span::exit",
        ],
    ),
    (
        "hashing (SipHash)",
        &["core::hash::sip::", "BuildHasher::hash_one"],
    ),
    (
        "allocation (malloc, free)",
        &["malloc", "_int_free", "cfree", "realloc"],
    ),
];

/// A recording under way.
pub struct Recording {
    child: Child,
    data: PathBuf,
}

/// What a profile found (the flame graph, and the folded stacks beside it as `.folded`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// CPU time sampled, in milliseconds (the `cpu-clock` event's weight is nanoseconds).
    pub sampled_ms: f64,
    /// Each area's share of the samples (inclusive), in percent.
    pub areas: Vec<(String, f64)>,
    /// The functions most often on the CPU themselves, with their share in percent.
    pub top_self: Vec<(String, f64)>,
    /// Where the flame graph was written.
    pub svg: PathBuf,
}

/// Starts sampling `pid` on the `cpu-clock` event (CPU time, in a virtual machine too) at 999 Hz
/// with DWARF stacks (Rust's release builds keep no frame pointers) into `data`; `None` (said
/// on stderr) when `perf` is missing or refuses to start.
pub fn start(pid: u32, data: &Path) -> Option<Recording> {
    let child = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "999"])
        .args(["--call-graph", "dwarf,16384", "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    match child {
        Ok(child) => Some(Recording {
            child,
            data: data.to_owned(),
        }),
        Err(e) => {
            eprintln!("sheaf-bench: no profile: cannot run perf ({e})");
            None
        }
    }
}

impl Recording {
    /// Stops the recording (SIGINT, as perf expects), folds its stacks, writes the flame graph to
    /// `svg` titled `title`, and summarizes.
    pub fn finish(self, svg: &Path, title: &str) -> anyhow::Result<Summary> {
        // perf writes its data and exits on SIGINT, as on ctrl-c.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let output = self.child.wait_with_output().context("waiting for perf")?;
        anyhow::ensure!(
            self.data.is_file(),
            "perf wrote no data: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let script = Command::new("perf")
            .args(["script", "-i"])
            .arg(&self.data)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("running perf script")?;
        let mut folded = Vec::new();
        let mut options = inferno::collapse::perf::Options::default();
        options.annotate_kernel = true;
        inferno::collapse::perf::Folder::from(options)
            .collapse(
                BufReader::new(script.stdout.context("perf script's output")?),
                &mut folded,
            )
            .context("folding perf's stacks")?;
        let folded = String::from_utf8_lossy(&folded).into_owned();
        // Kept beside the graph, for questions the summary does not answer (who calls what).
        let _ = std::fs::write(svg.with_extension("folded"), &folded);
        let mut graph = inferno::flamegraph::Options::default();
        graph.title = title.to_owned();
        let mut out =
            std::fs::File::create(svg).with_context(|| format!("creating {}", svg.display()))?;
        inferno::flamegraph::from_lines(&mut graph, folded.lines(), &mut out)
            .context("drawing the flame graph")?;
        let _ = std::fs::remove_file(&self.data);
        Ok(summarize(&folded, svg))
    }
}

/// Inclusive shares of [`AREAS`] and the top self frames of folded stacks (`a;b;c 42` lines).
fn summarize(folded: &str, svg: &Path) -> Summary {
    let mut samples = 0u64;
    let mut areas = vec![0u64; AREAS.len()];
    let mut leaves: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        samples += count;
        let frames: Vec<&str> = stack.split(';').collect();
        for (i, (_, prefixes)) in AREAS.iter().enumerate() {
            let inside = frames
                .iter()
                .any(|frame| prefixes.iter().any(|p| frame.contains(p)));
            if inside {
                areas[i] += count;
            }
        }
        if let Some(leaf) = frames.last() {
            *leaves.entry(leaf).or_default() += count;
        }
    }
    let share = |n: u64| 100.0 * n as f64 / samples.max(1) as f64;
    let mut top: Vec<(&str, u64)> = leaves.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    Summary {
        sampled_ms: samples as f64 / 1e6,
        areas: AREAS
            .iter()
            .zip(areas)
            .map(|((name, _), n)| ((*name).to_owned(), share(n)))
            .collect(),
        top_self: top
            .into_iter()
            .take(15)
            .map(|(name, n)| (name.to_owned(), share(n)))
            .collect(),
        svg: svg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_count_inclusively_and_leaves_count_for_themselves() {
        let folded = "main;tokio::runtime::scheduler::run;sheaf_engine::delivery::worker::run;sheaf_webhook::sign::Signer::sign;sha2::compress 3\n\
                      main;tokio::runtime::scheduler::run;axum::serve;serde_json::de::from_slice 1\n\
                      main;write_[k] 1\n";
        let summary = summarize(folded, Path::new("x.svg"));
        assert_eq!(summary.sampled_ms, 5e-6);
        let area = |name: &str| {
            summary
                .areas
                .iter()
                .find(|(n, _)| n.starts_with(name))
                .map(|(_, s)| *s)
                .unwrap()
        };
        assert_eq!(area("delivering"), 60.0);
        assert_eq!(area("signing"), 60.0);
        assert_eq!(area("receiving"), 20.0);
        assert_eq!(area("JSON"), 20.0);
        assert_eq!(area("kernel"), 20.0);
        assert_eq!(area("hashing"), 0.0);
        assert_eq!(summary.top_self[0], ("sha2::compress".to_owned(), 60.0));
    }
}
