//! The look at what runs: the processes of an env's containers, judged by what they are,
//! not by what the compose file and the image declare. An image that starts as root and
//! drops to another uid (`su`, `gosu`, `su-exec`, `setpriv`), or a program that puts a
//! secret from its environment into its own arguments, passes every check before start.
//!
//! A container's processes are its cgroup's members (`cgroup.procs`), found from the main
//! process the engine names: `docker exec`'d processes included, no process of another
//! container. For each, `/proc/<pid>/status` gives the real, effective, saved and filesystem
//! uids and `/proc/<pid>/cmdline` the arguments. Secret values are compared in memory and
//! never leave this module: a finding names the service, the process, the uid and the host
//! account, or the argument's position and the secret's `.env` key.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

use crate::code::Code;
use crate::shared_uid::HostAccounts;

/// Where the kernel's process and cgroup files are (another root in tests).
#[derive(Debug, Clone)]
pub struct Roots {
    /// `/proc`.
    pub(crate) proc: PathBuf,
    /// `/sys/fs/cgroup`.
    pub(crate) cgroup: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            proc: PathBuf::from("/proc"),
            cgroup: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

/// One process of a container, as the host sees it.
#[derive(Clone, PartialEq, Eq)]
pub struct Proc {
    /// Its pid on the host.
    pub(crate) pid: u32,
    /// Real, effective, saved and filesystem uid (`/proc/<pid>/status`'s `Uid:` line).
    pub(crate) uids: [u32; 4],
    /// Its arguments (`/proc/<pid>/cmdline`): the app's, maybe a secret; never shown.
    argv: Vec<Vec<u8>>,
}

impl fmt::Debug for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proc")
            .field("pid", &self.pid)
            .field("uids", &self.uids)
            .field("argc", &self.argv.len())
            .finish()
    }
}

impl Proc {
    /// A process from its `status` and `cmdline` texts.
    #[must_use]
    pub(crate) fn parse(pid: u32, status: &str, cmdline: &[u8]) -> Option<Self> {
        let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
        let ids: Vec<u32> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let uids: [u32; 4] = ids.try_into().ok()?;
        let argv = cmdline
            .split(|b| *b == 0)
            .map(<[u8]>::to_vec)
            .collect::<Vec<_>>();
        // cmdline ends with a NUL, which leaves one empty piece behind.
        let argv = match argv.split_last() {
            Some((last, rest)) if last.is_empty() => rest.to_vec(),
            _ => argv,
        };
        Some(Self { pid, uids, argv })
    }
}

impl From<monky_compose::TopProcess> for Proc {
    /// A process as the engine's `top` shows it: its arguments are the words of `ps`'s line,
    /// and the line itself once more, so a secret value with a space in it is found too.
    fn from(p: monky_compose::TopProcess) -> Self {
        let mut argv: Vec<Vec<u8>> = p.args.split(' ').map(|w| w.as_bytes().to_vec()).collect();
        if argv.len() > 1 {
            argv.push(p.args.into_bytes());
        }
        Self {
            pid: p.pid,
            uids: p.uids,
            argv,
        }
    }
}

/// Whether the kernel's process files under `roots` show process `pid`: not when the agent's
/// `/proc` is another pid namespace's than the engine's, whose pids the engine gives.
#[must_use]
pub(crate) fn shows(roots: &Roots, pid: u32) -> bool {
    roots.proc.join(pid.to_string()).exists()
}

/// The processes of container `id` whose main process is `init`: every member of its cgroup
/// (the `pids` hierarchy of cgroup v1, else the unified one), read from `/proc`. The cgroup
/// must be named for the container (the engine names it by the full id, with either cgroup
/// driver), so a pid of another pid namespace is never taken for it. A process that ends
/// meanwhile is no longer there to judge. `Err` says why they cannot be seen: the caller
/// judges that as a finding, never as a pass.
pub fn processes(roots: &Roots, id: &str, init: u32) -> Result<Vec<Proc>, String> {
    let cgroup_file = roots.proc.join(format!("{init}/cgroup"));
    let text = read_proc_text(&cgroup_file)
        .map_err(|e| format!("cannot read {}: {e}", cgroup_file.display()))?;
    let procs_file = cgroup_procs(roots, &text)
        .ok_or_else(|| format!("process {init} is in no cgroup of its own"))?;
    if id.is_empty() || !procs_file.to_string_lossy().contains(id) {
        return Err(format!(
            "process {init} is in the cgroup {}, not the container's",
            procs_file.display()
        ));
    }
    let listed = read_proc_text(&procs_file)
        .map_err(|e| format!("cannot read {}: {e}", procs_file.display()))?;
    let pids: Vec<u32> = listed
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if !pids.contains(&init) {
        return Err(format!(
            "{} does not list the container's main process {init}",
            procs_file.display()
        ));
    }
    let mut out = Vec::with_capacity(pids.len());
    for pid in pids {
        let dir = roots.proc.join(pid.to_string());
        let (status, cmdline) = match (
            read_proc_text(&dir.join("status")),
            read_proc(&dir.join("cmdline")),
        ) {
            (Ok(s), Ok(c)) => (s, c),
            // Gone between the listing and the read: nothing of it runs.
            (Err(e), _) | (_, Err(e)) if gone(&e) => continue,
            (Err(e), _) | (_, Err(e)) => {
                return Err(format!("cannot read {}: {e}", dir.display()));
            }
        };
        let proc = Proc::parse(pid, &status, &cmdline)
            .ok_or_else(|| format!("{} has no Uid: line", dir.join("status").display()))?;
        out.push(proc);
    }
    Ok(out)
}

/// A file the kernel makes as it is read (`/proc`, cgroupfs), whole: no size is asked first,
/// the kernel gives none (`std::fs::read` would ask it with a `statx` a file, and a look reads
/// a few files for every process). Read through `Take`, which asks no size.
fn read_proc(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::with_capacity(4096);
    std::io::Read::read_to_end(&mut std::io::Read::take(&file, u64::MAX), &mut bytes)?;
    Ok(bytes)
}

/// As [`read_proc`], as text.
fn read_proc_text(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_proc(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(3)
}

/// The `cgroup.procs` of the cgroup a `/proc/<pid>/cgroup` text names: the `pids`
/// controller's (cgroup v1, present wherever the engine limits pids), else the unified
/// hierarchy's (cgroup v2). The root cgroup is no container's.
fn cgroup_procs(roots: &Roots, text: &str) -> Option<PathBuf> {
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if path == "/" || !path.starts_with('/') || path.split('/').any(|p| p == "..") {
            continue;
        }
        if controllers.split(',').any(|c| c == "pids") {
            v1 = Some(roots.cgroup.join("pids").join(&path[1..]));
        } else if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        }
    }
    // The unified hierarchy is looked for only without a `pids` one: at the root on a v2 box,
    // under `unified/` on a hybrid one.
    let v2 = || {
        v2.and_then(|path: &str| {
            [roots.cgroup.clone(), roots.cgroup.join("unified")]
                .into_iter()
                .find(|root| root.join("cgroup.controllers").is_file())
                .map(|root| root.join(&path[1..]))
        })
    };
    v1.or_else(v2).map(|dir| dir.join("cgroup.procs"))
}

/// The secret values of a release, by their `.env` key, compared in memory only.
pub struct SecretValues(Vec<(String, SecretString)>);

impl SecretValues {
    /// Values shorter than this match only a whole argument or variable value: a short
    /// value (`on`, `1`) is in many an unrelated argument.
    pub(crate) const MIN_SUBSTRING: usize = 6;

    /// From `(key, value)` pairs; empty values are dropped (they are in every text).
    #[must_use]
    pub fn new(entries: Vec<(String, SecretString)>) -> Self {
        Self(
            entries
                .into_iter()
                .filter(|(_, v)| !v.expose_secret().is_empty())
                .collect(),
        )
    }

    /// Whether there is any value to look for.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key of the first secret whose value is in `text`.
    fn found_in(&self, text: &[u8]) -> Option<&str> {
        self.0.iter().find_map(|(key, value)| {
            let v = value.expose_secret().as_bytes();
            let hit = if v.len() >= Self::MIN_SUBSTRING {
                text.windows(v.len()).any(|w| w == v)
            } else {
                text == v
            };
            hit.then_some(key.as_str())
        })
    }

    /// Whether a container's environment (`NAME=value` each) holds a secret value: it gets a
    /// secret, whatever route it took (an `env_file`, a variable built from one, a value that
    /// spans lines).
    #[must_use]
    pub fn in_env(&self, env: &[String]) -> bool {
        env.iter().any(|kv| {
            let value = kv.split_once('=').map_or("", |(_, v)| v);
            self.found_in(value.as_bytes()).is_some()
        })
    }
}

/// One container to judge, with what is known of it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Its compose service.
    pub service: &'a str,
    /// Whether it gets a secret (by the count of the routes, or its environment).
    pub holds_a_secret: bool,
    /// Whether its processes' arguments are judged: not where the box's admin waived
    /// `SECRET_ON_COMMAND_LINE` (`allow_secrets_on_command_lines`, a `/proc` mounted hidepid).
    pub args_judged: bool,
}

/// What the look found wrong with one process, names only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A process of a container that gets a secret runs at a uid a host account has.
    SharedUid {
        /// The service.
        service: String,
        /// The process, on the host.
        pid: u32,
        /// The uid.
        uid: u32,
        /// The host accounts at that uid.
        accounts: Vec<String>,
    },
    /// A process's arguments hold a secret value, readable by every local user.
    OnCommandLine {
        /// The service.
        service: String,
        /// The process, on the host.
        pid: u32,
        /// The argument's position (0: the program).
        position: usize,
        /// The `.env` key of the secret.
        key: String,
    },
    /// The processes of a container could not be seen: not judged is not passed.
    Unseen {
        /// The service.
        service: String,
        /// Why.
        why: String,
    },
}

impl Finding {
    /// The code a finding is reported under.
    #[must_use]
    pub(crate) fn code(&self) -> Code {
        match self {
            Self::OnCommandLine { .. } => Code::SecretOnCommandLine,
            Self::SharedUid { .. } | Self::Unseen { .. } => Code::SecretReadableOnHost,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SharedUid {
                service,
                pid,
                uid,
                accounts,
            } => write!(
                f,
                "{service}: process {pid} runs as uid {uid}, which the host account {} has \
                 too, and the service gets a secret",
                accounts.join(", ")
            ),
            Self::OnCommandLine {
                service,
                pid,
                position,
                key,
            } => write!(
                f,
                "{service}: process {pid} has the value of {key} in its argument {position}"
            ),
            Self::Unseen { service, why } => {
                write!(f, "{service}: its processes cannot be seen ({why})")
            }
        }
    }
}

/// Who shares a uid with the box: its accounts, unless the engine remaps user namespaces
/// (then no container uid is a host one), less the uids the box's admin waived.
pub struct Sharing<'a> {
    /// The box's accounts (`None`: the engine remaps).
    pub accounts: Option<&'a HostAccounts>,
    /// `allowed_shared_uids`.
    pub allowed: &'a [u32],
}

/// The findings for the processes `procs` of `subject`: any of a process's four uids that a
/// host account has, when the container gets a secret; any argument that holds a secret
/// value, whichever container it is in (`/proc/<pid>/cmdline` is every local user's to read).
#[must_use]
pub fn judge(
    subject: Subject<'_>,
    procs: &[Proc],
    sharing: &Sharing<'_>,
    secrets: &SecretValues,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in procs {
        if subject.holds_a_secret
            && let Some(accounts) = sharing.accounts
        {
            let shared = p.uids.iter().copied().collect::<BTreeSet<u32>>();
            for uid in shared {
                let names = accounts.at(uid);
                if uid != 0 && !sharing.allowed.contains(&uid) && !names.is_empty() {
                    out.push(Finding::SharedUid {
                        service: subject.service.to_owned(),
                        pid: p.pid,
                        uid,
                        accounts: names.to_vec(),
                    });
                }
            }
        }
        for (position, arg) in p.argv.iter().enumerate().filter(|_| subject.args_judged) {
            if let Some(key) = secrets.found_in(arg) {
                out.push(Finding::OnCommandLine {
                    service: subject.service.to_owned(),
                    pid: p.pid,
                    position,
                    key: key.to_owned(),
                });
                break;
            }
        }
    }
    out
}

/// The report's code and message for `findings` (not empty): `SECRET_READABLE_ON_HOST` when a
/// secret is readable at a shared uid or the look could not see, else `SECRET_ON_COMMAND_LINE`.
#[must_use]
pub(crate) fn failure(findings: &[Finding]) -> (Code, String) {
    let code = if findings
        .iter()
        .any(|f| f.code() == Code::SecretReadableOnHost)
    {
        Code::SecretReadableOnHost
    } else {
        Code::SecretOnCommandLine
    };
    let mut seen = BTreeSet::new();
    let listed: Vec<String> = findings
        .iter()
        .map(ToString::to_string)
        .filter(|t| seen.insert(t.clone()))
        .collect();
    let why = match code {
        Code::SecretReadableOnHost => {
            "seen running: without userns-remap a container's uid is the host's, and that \
             account could read /proc/<pid>/environ and the secret's files through \
             /proc/<pid>/root; the release's containers were stopped: enable userns-remap, \
             keep the uid free of host accounts, or name it in allowed_shared_uids"
        }
        _ => {
            "seen running: /proc/<pid>/cmdline is every local user's to read; the release's \
             containers were stopped: let the program read the secret from its environment \
             or a file (a _FILE variable, a config file its entrypoint writes)"
        }
    };
    (code, format!("{}; {why}", listed.join("; ")))
}

/// The services of `runs` that get a secret, by the one count of the routes a secret takes
/// into a service ([`monky_bundle::RunsAs::gets_a_secret`]), as the check before start counts.
#[must_use]
pub(crate) fn holders(runs: &[monky_bundle::RunsAs]) -> BTreeSet<String> {
    runs.iter()
        .filter(|r| r.gets_a_secret())
        .map(|r| r.service.clone())
        .collect()
}

/// What the last look at a release saw, kept in state.json: which services get a secret by
/// the count of routes (a heartbeat does not build compose's model), and the uids its
/// processes ran as (for `doctor`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Looked {
    /// The release.
    pub(crate) sha: Option<monky_agent_proto::Sha>,
    /// The services that get a secret, by the count.
    pub(crate) holders: BTreeSet<String>,
    /// Every uid a process of the release ran as.
    pub(crate) uids: BTreeSet<u32>,
}

/// state.json's record, read leniently: one that does not parse is dropped, and the next
/// look writes it again.
pub(crate) fn lenient<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Looked>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0::/root:/bin/sh\n\
        nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n\
        dev:x:1000:1000::/home/dev:/bin/bash\n";

    fn proc(pid: u32, uids: [u32; 4], argv: &[&str]) -> Proc {
        let status = format!(
            "Name:\tx\nUid:\t{}\t{}\t{}\t{}\nGid:\t0\t0\t0\t0\n",
            uids[0], uids[1], uids[2], uids[3]
        );
        let mut cmdline = Vec::new();
        for a in argv {
            cmdline.extend_from_slice(a.as_bytes());
            cmdline.push(0);
        }
        Proc::parse(pid, &status, &cmdline).unwrap()
    }

    fn secrets() -> SecretValues {
        SecretValues::new(vec![
            ("DB_PASSWORD".into(), SecretString::from("s3cret-value")),
            ("PIN".into(), SecretString::from("42")),
            ("EMPTY".into(), SecretString::from("")),
        ])
    }

    fn web(holds: bool) -> Subject<'static> {
        Subject {
            service: "web",
            holds_a_secret: holds,
            args_judged: true,
        }
    }

    #[test]
    fn a_status_and_a_cmdline_are_read_as_the_kernel_writes_them() {
        let p = proc(7, [0, 65534, 65534, 65534], &["httpd", "-f"]);
        assert_eq!(p.uids, [0, 65534, 65534, 65534]);
        assert_eq!(p.argv, [b"httpd".to_vec(), b"-f".to_vec()]);
        assert!(Proc::parse(1, "Name:\tx\n", b"").is_none());
        assert!(!format!("{p:?}").contains("httpd"), "argv in Debug");
    }

    #[test]
    fn a_dropped_uid_a_host_account_has_is_a_finding_unless_remapped_or_waived() {
        let accounts = HostAccounts::parse(PASSWD, "");
        let procs = [
            proc(1, [0; 4], &["su"]),
            proc(9, [65534; 4], &["httpd"]),
            proc(10, [999; 4], &["postgres"]),
        ];
        let shared = Sharing {
            accounts: Some(&accounts),
            allowed: &[],
        };
        let found = judge(web(true), &procs, &shared, &secrets());
        assert_eq!(
            found,
            [Finding::SharedUid {
                service: "web".into(),
                pid: 9,
                uid: 65534,
                accounts: vec!["nobody".into()],
            }]
        );
        // Any of the four: an effective uid alone is enough.
        let half = [proc(3, [0, 1000, 0, 0], &["x"])];
        assert_eq!(judge(web(true), &half, &shared, &secrets()).len(), 1);
        // No secret held; the engine remaps; the admin's waiver: nothing.
        assert!(judge(web(false), &procs, &shared, &secrets()).is_empty());
        let remapped = Sharing {
            accounts: None,
            allowed: &[],
        };
        assert!(judge(web(true), &procs, &remapped, &secrets()).is_empty());
        let waived = Sharing {
            accounts: Some(&accounts),
            allowed: &[65534],
        };
        assert!(judge(web(true), &procs, &waived, &secrets()).is_empty());
    }

    /// The engine's `top` joins a process's arguments with spaces: its words are judged as
    /// arguments (a short value as a whole word), and the line once more, so a value with a
    /// space in it is found too; the uids are judged as `/proc`'s.
    #[test]
    fn a_process_the_engines_top_shows_is_judged_as_one_from_proc() {
        let values = SecretValues::new(vec![
            ("PIN".into(), SecretString::from("42")),
            ("PHRASE".into(), SecretString::from("correct horse battery")),
        ]);
        let top = |pid, args: &str| {
            Proc::from(monky_compose::TopProcess {
                pid,
                uids: [65534, 65534, 65534, 65534],
                args: args.into(),
            })
        };
        let procs = [
            top(7, "sleep 42"),
            top(8, "server --phrase correct horse battery"),
            top(9, "sleep 420"),
        ];
        let accounts = HostAccounts::parse(PASSWD, "");
        let sharing = Sharing {
            accounts: Some(&accounts),
            allowed: &[],
        };
        let found = judge(web(true), &procs, &sharing, &values);
        let on_line: Vec<(u32, &str)> = found
            .iter()
            .filter_map(|f| match f {
                Finding::OnCommandLine { pid, key, .. } => Some((*pid, key.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(on_line, [(7, "PIN"), (8, "PHRASE")]);
        assert!(
            found.iter().any(|f| matches!(
                f,
                Finding::SharedUid {
                    pid: 9,
                    uid: 65534,
                    ..
                }
            )),
            "{found:?}"
        );
    }

    #[test]
    fn a_secret_in_an_argument_is_a_finding_in_any_container_by_position_and_key() {
        let accounts = HostAccounts::parse(PASSWD, "");
        let remapped = Sharing {
            accounts: None,
            allowed: &[],
        };
        let _ = accounts;
        let procs = [
            proc(4, [0; 4], &["httpd", "-r", "x-s3cret-value-y"]),
            proc(5, [0; 4], &["sleep", "42"]),
            proc(6, [0; 4], &["sleep", "420"]),
        ];
        let found = judge(web(false), &procs, &remapped, &secrets());
        assert_eq!(
            found,
            [
                Finding::OnCommandLine {
                    service: "web".into(),
                    pid: 4,
                    position: 2,
                    key: "DB_PASSWORD".into(),
                },
                // A short value only as a whole argument.
                Finding::OnCommandLine {
                    service: "web".into(),
                    pid: 5,
                    position: 1,
                    key: "PIN".into(),
                },
            ]
        );
        let waived = Subject {
            args_judged: false,
            ..web(false)
        };
        assert!(judge(waived, &procs, &remapped, &secrets()).is_empty());
        let (code, message) = failure(&found);
        assert_eq!(code, Code::SecretOnCommandLine);
        assert!(message.contains("argument 2") && message.contains("DB_PASSWORD"));
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[test]
    fn an_environment_holding_a_secret_value_holds_a_secret() {
        let s = secrets();
        assert!(s.in_env(&["URL=postgres://u:s3cret-value@db/x".into()]));
        assert!(s.in_env(&["PIN=42".into()]));
        assert!(!s.in_env(&["PORT=4242".into(), "MODE=prod".into()]));
        assert!(
            !SecretValues::new(vec![("E".into(), SecretString::from(""))]).in_env(&["A=".into()])
        );
    }

    #[test]
    fn the_cgroup_of_a_container_is_found_on_v1_and_v2_and_the_root_is_none() {
        let roots = Roots {
            proc: "/p".into(),
            cgroup: "/c".into(),
        };
        let v1 = "9:name=systemd:/docker/ab\n8:pids:/docker/ab\n0::/docker/ab\n";
        assert_eq!(
            cgroup_procs(&roots, v1),
            Some(PathBuf::from("/c/pids/docker/ab/cgroup.procs"))
        );
        assert_eq!(cgroup_procs(&roots, "8:pids:/\n0::/\n"), None);
        assert_eq!(cgroup_procs(&roots, "8:pids:/docker/../../x\n"), None);
        // A v2 line whose hierarchy is not mounted is not guessed at.
        assert_eq!(
            cgroup_procs(&roots, "0::/system.slice/docker-ab.scope\n"),
            None
        );
    }

    #[test]
    fn a_findings_message_names_the_uid_and_the_account_never_a_value() {
        let found = [Finding::SharedUid {
            service: "web".into(),
            pid: 9,
            uid: 65534,
            accounts: vec!["nobody".into()],
        }];
        let (code, message) = failure(&found);
        assert_eq!(code, Code::SecretReadableOnHost);
        assert!(
            message.starts_with("web: process 9 runs as uid 65534, which the host account nobody")
        );
    }
}
