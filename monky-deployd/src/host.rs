//! Facts about the box for checkin, read from the kernel and os-release (no process spawned).

use std::path::Path;

/// The box's host name.
pub fn hostname() -> String {
    read_trim("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into())
}

/// The running kernel's release.
pub fn kernel() -> String {
    read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into())
}

/// `<id>-<version_id>` from os-release, e.g. `ubuntu-26.04`.
pub fn os() -> String {
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

fn read_trim(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
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
}
