//! The one process wrapper: every docker and compose command of the agent goes through [`Runner`].
//!
//! A child gets an explicit program path, explicit arguments (paths and names, never secret
//! values: secrets reach compose only through `--env-file <path>`), a working directory, a
//! minimal environment built here rather than inherited, a timeout after which its whole process
//! group is killed, and stdout/stderr captured up to a cap.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result, tail_chars};

/// The `PATH` children get when the agent itself has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long to wait for the output pipes to close after the child has exited.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// The process groups of the children running now. Each child leads a group of its own (so a
/// timeout kills what it started too), which also means the children outlive the agent unless
/// it kills them: [`kill_all`] does, for a process about to end.
static LIVE: Mutex<Live> = Mutex::new(Live {
    groups: Vec::new(),
    closed: false,
});

struct Live {
    groups: Vec<rustix::process::Pid>,
    /// Set by [`kill_all`]: a child started later is killed as soon as it is known.
    closed: bool,
}

fn live() -> std::sync::MutexGuard<'static, Live> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Kills the process group of every child a [`Runner`] has running, and of every child it
/// starts from now on, at once. For a process that is about to exit before its calls return
/// (the agent's tick deadline): the flock it holds goes with it, and no `docker compose pull` or
/// `up` it started may go on without it. The killed calls return [`Error::Timeout`] or a failed
/// [`Output`] to threads that are not waiting for them any more.
pub fn kill_all() {
    let mut live = live();
    live.closed = true;
    for group in live.groups.drain(..) {
        kill_group(group);
    }
}

/// Runs programs with an explicit, minimal environment.
///
/// The environment of every child is exactly: `PATH`, `DOCKER_HOST` (only if the agent has one),
/// `DOCKER_CONFIG` (the agent's own directory) and `COMPOSE_INTERACTIVE_NO_CLI=1`. Nothing else
/// from the agent's environment (`HOME`, tokens, proxies) reaches a child.
#[derive(Debug, Clone)]
pub struct Runner {
    env: Vec<(OsString, OsString)>,
    path: OsString,
    max_output: usize,
    ledger: Option<PathBuf>,
}

/// Builds a [`Runner`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RunnerBuilder {
    docker_config: PathBuf,
    path: Option<OsString>,
    docker_host: Option<OsString>,
    inherit_docker_host: bool,
    max_output: usize,
    ledger: Option<PathBuf>,
}

impl Runner {
    /// Starts a builder; `docker_config` is the agent's own `DOCKER_CONFIG` directory.
    pub fn builder(docker_config: impl Into<PathBuf>) -> RunnerBuilder {
        RunnerBuilder {
            docker_config: docker_config.into(),
            path: None,
            docker_host: None,
            inherit_docker_host: true,
            max_output: 4 * 1024 * 1024,
            ledger: None,
        }
    }

    /// The complete environment a child gets.
    #[must_use]
    pub fn env(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    /// The `PATH` children get, also used to resolve bare program names.
    #[must_use]
    pub fn path_env(&self) -> &OsStr {
        &self.path
    }

    /// The number of bytes kept of each output stream (the tail is kept).
    #[must_use]
    pub fn max_output(&self) -> usize {
        self.max_output
    }

    /// Finds `name` in the children's `PATH`, as an executable regular file.
    #[must_use]
    pub fn which(&self, name: &str) -> Option<PathBuf> {
        std::env::split_paths(&self.path)
            .filter(|dir| dir.is_absolute())
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
    }

    /// Runs one invocation to completion or until its timeout.
    ///
    /// A non-zero exit is not an error here: the caller reads [`Output::code`] and decides
    /// (a failed pull needs its output). Errors are: the program cannot be started
    /// ([`Error::Spawn`]) and the timeout ([`Error::Timeout`]), after which the child's whole
    /// process group has been killed.
    pub fn run(&self, inv: &Invocation) -> Result<Output> {
        let what = inv.describe();
        let mut cmd = Command::new(&inv.program);
        cmd.args(&inv.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout also kills what it started (the docker CLI
            // runs the compose plugin as a child process).
            .process_group(0);
        if let Some(dir) = &inv.cwd {
            // As a shell in that dir would have it: compose interpolates `$PWD` from its
            // environment, and a file's `$PWD/x` is the release's own file (the policy judges
            // it with the same value).
            cmd.current_dir(dir).env("PWD", dir);
        }
        tracing::debug!(command = %what, "running");
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            program: inv.program.clone(),
            source,
        })?;
        let group = rustix::process::Pid::from_child(&child);
        {
            let mut live = live();
            if live.closed {
                kill_group(group);
            } else {
                live.groups.push(group);
            }
        }
        let entry = self.ledger.as_deref().map(|dir| Ledger::add(dir, group));
        let (tx, rx) = mpsc::channel();
        let readers = [
            spawn_reader(
                child.stdout.take(),
                Stream::Stdout,
                self.max_output,
                tx.clone(),
            ),
            spawn_reader(child.stderr.take(), Stream::Stderr, self.max_output, tx),
        ];
        let status = wait_with_deadline(&mut child, started + inv.timeout);
        if status.is_none() {
            kill_group(group);
            // Reap it; after SIGKILL this returns at once.
            let _ = child.wait();
        }
        let mut captured = Captured::default();
        let mut pending = readers.iter().filter(|r| r.is_some()).count();
        let mut drain_deadline = Instant::now() + DRAIN_GRACE;
        let mut killed_for_pipes = false;
        while pending > 0 {
            let left = drain_deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((stream, buf)) => {
                    captured.put(stream, buf);
                    pending -= 1;
                }
                Err(mpsc::RecvTimeoutError::Timeout) if !killed_for_pipes => {
                    // Something the child started still holds a pipe open.
                    kill_group(group);
                    killed_for_pipes = true;
                    drain_deadline = Instant::now() + Duration::from_secs(1);
                }
                Err(_) => break,
            }
        }
        live().groups.retain(|g| *g != group);
        if let Some(entry) = entry {
            entry.remove();
        }
        let elapsed = started.elapsed();
        match status {
            None => Err(Error::Timeout {
                what,
                after: inv.timeout,
                stderr: tail_chars(&captured.stderr.text(), 2048),
            }),
            Some(status) => {
                let code = status.code();
                tracing::debug!(command = %what, ?code, ?elapsed, "finished");
                Ok(Output {
                    what,
                    code,
                    stdout: captured.stdout.text(),
                    stderr: captured.stderr.text(),
                    stdout_truncated: captured.stdout.truncated,
                    stderr_truncated: captured.stderr.truncated,
                    elapsed,
                })
            }
        }
    }
}

impl RunnerBuilder {
    /// The `PATH` children get (default: the agent's own `PATH`, else [`DEFAULT_PATH`]).
    pub fn path_env(mut self, path: impl Into<OsString>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The `DOCKER_HOST` children get (default: the agent's own, if set). `None` removes it.
    pub fn docker_host(mut self, host: Option<OsString>) -> Self {
        self.docker_host = host;
        self.inherit_docker_host = false;
        self
    }

    /// How many bytes of each output stream to keep (the tail). Default 4 MiB.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output = bytes.max(1);
        self
    }

    /// A directory of the agent's own (0700) where the process group of every running child
    /// is written down while it runs, so that a process that was killed before its children
    /// ended leaves them named for [`end_orphans`]. Default: none.
    pub fn ledger(mut self, dir: impl Into<PathBuf>) -> Self {
        self.ledger = Some(dir.into());
        self
    }

    /// Builds the runner; the agent's environment is read here, once.
    pub fn build(self) -> Result<Runner> {
        if !self.docker_config.is_absolute() {
            return Err(Error::RelativeDockerConfig {
                path: self.docker_config,
            });
        }
        let path = self
            .path
            .or_else(|| std::env::var_os("PATH").filter(|p| !p.is_empty()))
            .unwrap_or_else(|| DEFAULT_PATH.into());
        let docker_host = if self.inherit_docker_host {
            std::env::var_os("DOCKER_HOST").filter(|h| !h.is_empty())
        } else {
            self.docker_host
        };
        let env = child_env(&path, docker_host, &self.docker_config);
        Ok(Runner {
            env,
            path,
            max_output: self.max_output,
            ledger: self.ledger,
        })
    }
}

fn child_env(
    path: &OsStr,
    docker_host: Option<OsString>,
    docker_config: &Path,
) -> Vec<(OsString, OsString)> {
    let mut env = vec![(OsString::from("PATH"), path.to_owned())];
    if let Some(host) = docker_host {
        env.push(("DOCKER_HOST".into(), host));
    }
    env.push(("DOCKER_CONFIG".into(), docker_config.as_os_str().to_owned()));
    env.push(("COMPOSE_INTERACTIVE_NO_CLI".into(), "1".into()));
    env
}

/// One command to run: program, arguments, working directory and timeout.
#[derive(Debug, Clone)]
pub struct Invocation {
    program: PathBuf,
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    timeout: Duration,
}

impl Invocation {
    /// A command running `program` with no arguments, in the agent's working directory.
    pub fn new(program: impl Into<PathBuf>, timeout: Duration) -> Self {
        Invocation {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            timeout,
        }
    }

    /// Appends one argument. Arguments must never carry secret values.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Runs in `dir`.
    #[must_use]
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// The program.
    #[must_use]
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The command line as shown in logs and errors: the program's file name and the
    /// arguments.
    #[must_use]
    pub fn describe(&self) -> String {
        let name = self.program.file_name().map_or_else(
            || self.program.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let mut out = name;
        for a in &self.args {
            out.push(' ');
            out.push_str(&a.to_string_lossy());
        }
        out
    }
}

/// What a finished process left behind. Its `Debug` shows the streams' lengths, not their text:
/// `compose config` prints every interpolated secret.
#[derive(Clone)]
pub struct Output {
    /// The command line (see [`Invocation::describe`]).
    pub what: String,
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Its stdout (lossy UTF-8; the tail when truncated).
    pub stdout: String,
    /// Its stderr (lossy UTF-8; the tail when truncated).
    pub stderr: String,
    /// Whether stdout was longer than the cap.
    pub stdout_truncated: bool,
    /// Whether stderr was longer than the cap.
    pub stderr_truncated: bool,
    /// How long it ran.
    pub elapsed: Duration,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output")
            .field("what", &self.what)
            .field("code", &self.code)
            .field("stdout_bytes", &self.stdout.len())
            .field("stderr_bytes", &self.stderr.len())
            .field("stdout_truncated", &self.stdout_truncated)
            .field("stderr_truncated", &self.stderr_truncated)
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

impl Output {
    /// Exit code 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Turns a non-zero exit into [`Error::Failed`] with the tail of stderr.
    pub fn check(self) -> Result<Output> {
        if self.success() {
            Ok(self)
        } else {
            Err(Error::Failed {
                stderr: tail_chars(&self.stderr, 2048),
                what: self.what,
                code: self.code,
            })
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug, Default)]
struct Capped {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Capped {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

#[derive(Debug, Default)]
struct Captured {
    stdout: Capped,
    stderr: Capped,
}

impl Captured {
    fn put(&mut self, stream: Stream, buf: Capped) {
        match stream {
            Stream::Stdout => self.stdout = buf,
            Stream::Stderr => self.stderr = buf,
        }
    }
}

fn spawn_reader<R: Read + Send + 'static>(
    pipe: Option<R>,
    stream: Stream,
    cap: usize,
    tx: mpsc::Sender<(Stream, Capped)>,
) -> Option<thread::JoinHandle<()>> {
    let mut pipe = pipe?;
    let spawned = thread::Builder::new()
        .name("monky-compose-pipe".into())
        .spawn(move || {
            let mut out = Capped::default();
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        out.bytes.extend_from_slice(&chunk[..n]);
                        // Keep the tail; trim in batches so long outputs stay linear.
                        if out.bytes.len() > cap.saturating_mul(2) {
                            let cut = out.bytes.len() - cap;
                            out.bytes.drain(..cut);
                            out.truncated = true;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            if out.bytes.len() > cap {
                let cut = out.bytes.len() - cap;
                out.bytes.drain(..cut);
                out.truncated = true;
            }
            let _ = tx.send((stream, out));
        });
    spawned.ok()
}

/// Polls the child until it exits or the deadline passes (`None`).
fn wait_with_deadline(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            // The child cannot be waited on; treat it like a hang so it gets killed.
            Err(_) => return None,
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn kill_group(group: rustix::process::Pid) {
    // ESRCH (already gone) is fine.
    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
}

/// One running child's line in a ledger ([`RunnerBuilder::ledger`]): a file named for its
/// process group that holds its leader's start time, so a later reader can tell that group
/// from a new one that reused the number.
struct Ledger(PathBuf);

impl Ledger {
    fn add(dir: &Path, group: rustix::process::Pid) -> Self {
        let path = dir.join(group.as_raw_nonzero().to_string());
        let start = proc_stat(group.as_raw_nonzero().get()).map_or(0, |s| s.start);
        let flags = rustix::fs::OFlags::WRONLY
            | rustix::fs::OFlags::CREATE
            | rustix::fs::OFlags::TRUNC
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC;
        let written = rustix::fs::open(
            &path,
            flags,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .map_err(std::io::Error::from)
        .and_then(|fd| {
            use std::io::Write as _;
            std::fs::File::from(fd).write_all(format!("{start}\n").as_bytes())
        });
        if let Err(e) = written {
            tracing::warn!(
                "cannot write down child group {group:?} in {}: {e}",
                dir.display()
            );
        }
        Self(path)
    }

    fn remove(self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What `/proc/<pid>/stat` says of a process that matters here.
#[derive(Debug, Clone, Copy)]
struct ProcStat {
    group: i32,
    /// Clock ticks after boot.
    start: u64,
    zombie: bool,
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything, parentheses included.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        zombie: *fields.first()? == "Z",
        group: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The live processes of the agent's user in process group `group` that a child started at
/// `start` (its leader's start time) can have made: the leader itself, or processes started
/// after it. A group that reused the number has a leader started later.
fn group_members(group: i32, start: u64) -> Vec<i32> {
    let me = rustix::process::geteuid().as_raw();
    let own = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut members = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Some(st) = proc_stat(pid) else { continue };
        let uid = rustix::fs::stat(entry.path()).map(|m| m.st_uid).ok();
        let ours = st.group == group
            && pid != own
            && !st.zombie
            && uid == Some(me)
            && if pid == group {
                st.start == start
            } else {
                st.start >= start
            };
        if ours {
            members.push(pid);
        }
    }
    members
}

/// A child group of a process that ended before it, found by [`end_orphans`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// The process group.
    pub group: i32,
    /// Whether it is gone now (else it outlived a SIGTERM and a SIGKILL).
    pub ended: bool,
}

/// Ends the children a killed process left running, as its ledger names them: each group
/// still alive gets a SIGTERM (compose stops what it was doing), then a SIGKILL if it is
/// still there after `grace`, and is waited for until none of its processes is left, so the
/// caller's own commands never run beside it. Lines whose group is gone are removed.
///
/// # Errors
/// When the ledger cannot be listed.
pub fn end_orphans(ledger: &Path, grace: Duration) -> std::io::Result<Vec<Orphan>> {
    let entries = match std::fs::read_dir(ledger) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let group = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok());
        let start = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok());
        let (Some(group), Some(start)) = (group.filter(|g| *g > 1), start) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if group_members(group, start).is_empty() {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Some(pid) = rustix::process::Pid::from_raw(group) else {
            continue;
        };
        let gone = |signal| {
            let _ = rustix::process::kill_process_group(pid, signal);
            let until = Instant::now() + grace;
            loop {
                if group_members(group, start).is_empty() {
                    return true;
                }
                if Instant::now() >= until {
                    return false;
                }
                thread::sleep(Duration::from_millis(20));
            }
        };
        let ended = gone(rustix::process::Signal::TERM) || gone(rustix::process::Signal::KILL);
        if ended {
            let _ = std::fs::remove_file(&path);
        }
        found.push(Orphan { group, ended });
    }
    Ok(found)
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(max: usize) -> Runner {
        Runner::builder("/tmp/monky-agent-docker")
            .path_env(DEFAULT_PATH)
            .docker_host(None)
            .max_output_bytes(max)
            .build()
            .unwrap()
    }

    #[test]
    fn env_is_exactly_the_minimal_set() {
        let r = Runner::builder("/var/lib/monky-deployd/docker")
            .path_env("/usr/bin:/bin")
            .docker_host(Some("unix:///run/docker.sock".into()))
            .build()
            .unwrap();
        let env: Vec<(String, String)> = r
            .env()
            .iter()
            .map(|(k, v)| (k.to_string_lossy().into(), v.to_string_lossy().into()))
            .collect();
        let expected: Vec<(String, String)> = [
            ("PATH", "/usr/bin:/bin"),
            ("DOCKER_HOST", "unix:///run/docker.sock"),
            ("DOCKER_CONFIG", "/var/lib/monky-deployd/docker"),
            ("COMPOSE_INTERACTIVE_NO_CLI", "1"),
        ]
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
        assert_eq!(env, expected);
    }

    #[test]
    fn relative_docker_config_is_refused() {
        let err = Runner::builder("docker").build().unwrap_err();
        assert!(matches!(err, Error::RelativeDockerConfig { .. }), "{err}");
    }

    #[test]
    fn captures_output_code_and_cwd() {
        let r = runner(1024);
        let dir = tempfile::tempdir().unwrap();
        let out = r
            .run(
                &Invocation::new("/bin/sh", Duration::from_secs(10))
                    .args(["-c", "pwd; echo err >&2; exit 3"])
                    .current_dir(dir.path()),
            )
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(
            out.stdout.trim(),
            dir.path().canonicalize().unwrap().to_str().unwrap()
        );
        assert_eq!(out.stderr.trim(), "err");
        // Debug shows the sizes of the streams, never what a child printed.
        let debug = format!("{out:?}");
        assert!(
            debug.contains("stderr_bytes: 4") && !debug.contains("err\\n"),
            "{debug}"
        );
        let err = out.check().unwrap_err();
        assert_eq!(err.exit_code(), Some(3));
        assert!(err.to_string().ends_with("(exit code 3): err"), "{err}");
    }

    #[test]
    fn keeps_the_tail_when_output_is_too_long() {
        let r = runner(100);
        let out = r
            .run(&Invocation::new("/bin/sh", Duration::from_secs(10)).args(["-c", "seq 1 100000"]))
            .unwrap();
        assert!(out.stdout_truncated);
        assert_eq!(out.stdout.len(), 100);
        assert!(out.stdout.ends_with("99999\n100000\n"), "{}", out.stdout);
    }

    #[test]
    fn timeout_kills_the_whole_group() {
        let r = runner(1024);
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!(
            "sleep 300 & echo $! > {}; echo started >&2; sleep 300",
            pidfile.display()
        );
        let started = Instant::now();
        let err = r
            .run(&Invocation::new("/bin/sh", Duration::from_millis(500)).args(["-c", &script]))
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        match &err {
            Error::Timeout { stderr, after, .. } => {
                assert_eq!(stderr, "started");
                assert_eq!(*after, Duration::from_millis(500));
            }
            other => panic!("expected a timeout, got {other}"),
        }
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        assert!(!process_alive(pid.trim()), "grandchild {pid} survived");
    }

    /// Alive means present and not a zombie waiting for its reaper.
    pub(crate) fn process_alive(pid: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let alive = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Ok(stat) => stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, rest)| !rest.starts_with('Z')),
                Err(_) => false,
            };
            if !alive || Instant::now() > deadline {
                return alive;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let err = runner(10)
            .run(&Invocation::new(
                "/nonexistent/docker",
                Duration::from_secs(1),
            ))
            .unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err}");
        assert_eq!(err.kind(), crate::ErrorKind::Setup);
    }

    #[test]
    fn which_finds_executables_only() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("tool");
        let plain = dir.path().join("plain");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::write(&plain, "").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = Runner::builder("/x")
            .path_env(dir.path().as_os_str())
            .build()
            .unwrap();
        assert_eq!(r.which("tool"), Some(exe));
        assert_eq!(r.which("plain"), None);
        assert_eq!(r.which("absent"), None);
    }
}
