//! Thin helpers around `std::process::Command` used by every xtask subcommand.

use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

/// A command line as a person would type it (program and arguments, no environment).
pub fn display(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Builds a `Command` from a program and its arguments.
pub fn new<I, S>(program: impl AsRef<OsStr>, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}

/// Runs the command with inherited stdout/stderr; fails on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("failed to start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed with {status}");
    }
    Ok(())
}

/// Runs the command with stdin closed and captures its output, whatever its exit status.
pub fn output(cmd: &mut Command) -> Result<Output> {
    output_with_stdin(cmd, None)
}

/// Like [`output`], feeding `input` (if any) on stdin.
pub fn output_with_stdin(cmd: &mut Command, input: Option<&str>) -> Result<Output> {
    let line = display(cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .with_context(|| format!("failed to start `{line}`"))?;
    if let Some(input) = input {
        let mut stdin = child.stdin.take().context("child stdin missing")?;
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("failed to write stdin of `{line}`"))?;
    }
    child
        .wait_with_output()
        .with_context(|| format!("failed to wait for `{line}`"))
}

/// Runs the command and returns its trimmed stdout; a non-zero exit is an error carrying stderr.
pub fn capture(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let out = output(cmd)?;
    check(&line, &out)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Fails with the command line, status and stderr when `out` is not a success.
pub fn check(line: &str, out: &Output) -> Result<()> {
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = if stderr.trim().is_empty() {
        stdout.trim()
    } else {
        stderr.trim()
    };
    bail!("`{line}` failed with {}: {}", out.status, tail(text, 20))
}

/// True when the command starts and exits 0; its output is discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `lines` lines of a log file, or a note that it cannot be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), lines),
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Finds `program` on PATH, returning its absolute path.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_last_lines() {
        let check = |text: &str, n: usize, expected: &str| assert_eq!(tail(text, n), expected);
        check("a\nb\nc", 2, "b\nc");
        check("a\nb\nc", 5, "a\nb\nc");
        check("", 3, "");
    }

    #[test]
    fn capture_reports_stderr_of_failures() {
        let err = capture(&mut new("sh", ["-c", "echo boom >&2; exit 3"])).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("boom"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
        assert_eq!(
            capture(&mut new("sh", ["-c", "echo ' hi '"])).unwrap(),
            "hi"
        );
    }

    #[test]
    fn stdin_reaches_the_child() {
        let out = output_with_stdin(&mut new("cat", [] as [&str; 0]), Some("secret-in")).unwrap();
        assert_eq!(out.stdout, b"secret-in");
    }
}
