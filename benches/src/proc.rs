//! Memory of processes, from `/proc/<pid>/status`: the peak resident set (`VmHWM`) every
//! scenario reports (docs/benchmarks.md, "How things are measured"), and the current one
//! (`VmRSS`) for growth per item.

use sheaf_testenv::process::status_kib;

/// Peak resident set of a process in KiB (`VmHWM`).
pub fn peak_rss_kib(pid: Option<u32>) -> Option<u64> {
    status_kib(pid, "VmHWM")
}

/// Current resident set of a process in KiB (`VmRSS`).
pub fn rss_kib(pid: Option<u32>) -> Option<u64> {
    status_kib(pid, "VmRSS")
}

/// Resets this process's `VmHWM` to its current RSS (Linux 4.0+, `clear_refs` value 5), so each
/// part of an in-process scenario reports its own peak. Returns whether the kernel accepted it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Number of CPUs and total memory in GiB, for the machine line of every report.
pub fn machine() -> (usize, f64) {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    (cpus, mem_kib as f64 / 1024.0 / 1024.0)
}
