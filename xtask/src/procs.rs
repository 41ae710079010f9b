//! Background services started by setup (dockerd, the registry): spawn detached, check, stop by PID.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cmd;

/// Spawns `cmd` in its own process group (so a Ctrl-C of xtask does not reach it), with stdin
/// closed and stdout/stderr appended to `log`. The child outlives xtask (dropping the handle
/// neither waits for nor kills it); use the handle's `try_wait` while xtask still runs.
pub fn spawn_background(cmd: &mut Command, log: &Path) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let line = cmd::display(cmd);
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let err = out.try_clone().context("cannot clone log handle")?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("failed to start `{line}` in the background"))
}

/// True while a child spawned by [`spawn_background`] has not exited.
pub fn running(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(None))
}

/// True when `pid` is a live (not zombie) process whose command line contains `name`.
/// Guards against acting on a PID that was reused by some other program.
pub fn is_alive(pid: u32, name: &str) -> bool {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else {
        return false;
    };
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    if !cmdline.contains(name) {
        return false;
    }
    // Field 3 of /proc/<pid>/stat is the state; `Z` (zombie) and `X` (dead) do not count.
    let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("X");
    !matches!(state, "Z" | "X")
}

/// Stops `pid` (if it is still `name`): SIGTERM, wait up to `grace`, then SIGKILL.
/// Returns whether a live process was found.
pub fn stop(pid: u32, name: &str, grace: Duration) -> Result<bool> {
    if !is_alive(pid, name) {
        return Ok(false);
    }
    signal(pid, "TERM")?;
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !is_alive(pid, name) {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("    {name} (pid {pid}) ignored SIGTERM for {grace:?}; sending SIGKILL");
    signal(pid, "KILL")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_alive(pid, name) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(true)
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    // A process that exits between the check and the signal makes `kill` fail: not an error.
    let out = cmd::output(&mut cmd::new("kill", [format!("-{sig}"), pid.to_string()]))?;
    if !out.status.success() && Path::new("/proc").join(pid.to_string()).exists() {
        cmd::check(&format!("kill -{sig} {pid}"), &out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_check_and_stop_a_background_sleep() {
        let dir = std::env::temp_dir().join(format!("xtask-procs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleep.log");
        let mut child = spawn_background(&mut cmd::new("sleep", ["30"]), &log).unwrap();
        let pid = child.id();
        assert!(running(&mut child));
        std::thread::sleep(Duration::from_millis(100));
        assert!(is_alive(pid, "sleep"));
        assert!(!is_alive(pid, "docker-registry"), "name must match");
        assert!(stop(pid, "sleep", Duration::from_secs(5)).unwrap());
        // The test process is the parent, so the child may linger as a zombie: that is dead.
        assert!(!is_alive(pid, "sleep"));
        // The kernel may not have made the exit status reapable yet: give it a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while running(&mut child) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!running(&mut child));
        assert!(!stop(pid, "sleep", Duration::from_secs(1)).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
