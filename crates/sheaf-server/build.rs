//! Embeds the web portal (`portal/`, without its browser tests in `portal/test/`) in the binary:
//! writes `portal_assets.rs` into `OUT_DIR`, a table of every file's path under `/portal/` and
//! its bytes, so `sheaf serve` serves the portal with no files beside it.

use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("portal");
    println!("cargo::rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    if root.is_dir() {
        collect(&root, &root, &mut files);
    }
    files.sort();
    let mut table = String::from("&[\n");
    for (name, path) in &files {
        table.push_str(&format!(
            "    ({name:?}, include_bytes!({:?})),\n",
            path.display()
        ));
    }
    table.push_str("]\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("portal_assets.rs"), table).expect("OUT_DIR is writable");
}

/// Every file under `dir` but `root/test/` and hidden ones, as (path relative to `root`, path).
fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a readable directory entry").path();
        let name = path
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        if name == "test" || name.rsplit('/').next().is_some_and(|n| n.starts_with('.')) {
            continue;
        }
        if path.is_dir() {
            collect(root, &path, files);
        } else {
            files.push((name, path));
        }
    }
}
