//! Facts about the box for checkin, read from the kernel and os-release (no process spawned).

use std::path::Path;

/// The agent's version, reported in checkin.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The box's host name.
pub(crate) fn hostname() -> String {
    read_trim("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into())
}

/// The running kernel's release.
pub(crate) fn kernel() -> String {
    read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into())
}

/// `<id>-<version_id>` from os-release, e.g. `ubuntu-26.04`.
pub(crate) fn os() -> String {
    let text = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .unwrap_or_default();
    os_from_release(&text)
}

fn os_from_release(text: &str) -> String {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_string())
    };
    match (field("ID"), field("VERSION_ID")) {
        (Some(id), Some(v)) => format!("{id}-{v}"),
        (Some(id), None) => id,
        _ => "unknown".into(),
    }
}

/// The box's memory (`MemTotal`), the default of `budget.max_memory`: the kernel's count, as
/// `sysinfo(2)` gives it, not `/proc/meminfo`, whose every read makes the kernel add up all
/// of its memory counters.
pub(crate) fn memory_bytes() -> Option<u64> {
    let info = rustix::system::sysinfo();
    // `totalram` is a C `unsigned long`: the same type as `u64` only on 64-bit targets.
    #[allow(clippy::useless_conversion)]
    let total = u64::from(info.totalram);
    total.checked_mul(u64::from(info.mem_unit.max(1)))
}

/// The box's CPUs, the default of `budget.max_cpus`: those the agent may be scheduled on, as
/// dockerd counts its `NCPU`. Not the agent's own cgroup quota (what the standard library's
/// `available_parallelism` would apply): the containers do not run in the agent's cgroup, and
/// reading it cost every tick four files.
pub(crate) fn cpus() -> Option<f64> {
    let n = rustix::thread::sched_getaffinity(None).ok()?.count();
    (n > 0).then_some(f64::from(n))
}

fn read_trim(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether `ip` is an address of this box: loopback, or one the kernel lets a socket bind
/// (its interfaces' addresses, docker's bridge gateways, the unspecified address). A
/// connection to such an address is served by a socket on this box, whose owner the kernel
/// knows, so it is judged like a loopback one.
pub(crate) fn is_local(ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || std::net::UdpSocket::bind(std::net::SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn os_release_becomes_id_dash_version() {
        assert_eq!(
            super::os_from_release("NAME=\"Ubuntu\"\nID=ubuntu\nVERSION_ID=\"26.04\"\n"),
            "ubuntu-26.04"
        );
        assert_eq!(super::os_from_release("ID=arch\n"), "arch");
        assert_eq!(super::os_from_release(""), "unknown");
    }

    /// The CPUs are the scheduler's, as `nproc` counts them, whatever quota the agent's own
    /// cgroup has.
    #[test]
    fn cpus_are_the_ones_the_scheduler_offers() {
        // `nproc` would lower its count to these.
        let out = std::process::Command::new("nproc")
            .env_remove("OMP_NUM_THREADS")
            .env_remove("OMP_THREAD_LIMIT")
            .output()
            .expect("nproc");
        let nproc: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(super::cpus(), Some(nproc));
    }

    /// The memory is `MemTotal` of `/proc/meminfo`, in bytes.
    #[test]
    fn memory_is_mem_total() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .expect("MemTotal in /proc/meminfo");
        assert_eq!(super::memory_bytes(), Some(kib * 1024));
    }
}
