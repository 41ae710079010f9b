//! `monky-deployd doctor [--json]`: the box checklist, automated. Each check says ok, fail (with
//! the fix) or skip; the exit status is 1 when any check fails.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use monky_bao_client as bao;
use monky_compose as compose;
use serde::Serialize;
use serde_json::json;

use crate::code::CodePolicy as _;
use crate::config::{Config, TransportKind};
use crate::exit::Exit;
use crate::layout::Layout;
use crate::peers;
use crate::redact::redact;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    /// Fine.
    Ok,
    /// Broken; `fix` says what to do.
    Fail,
    /// Not applicable on this box.
    Skip,
    /// Works, but weaker than it should be; `fix` says what to do. Does not fail `doctor`.
    Warn,
}

/// One line of the checklist.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    /// What was checked.
    pub(crate) name: &'static str,
    /// Its verdict.
    pub(crate) verdict: Verdict,
    /// What was found.
    pub(crate) detail: String,
    /// What to do when it failed.
    pub(crate) fix: &'static str,
}

fn check(name: &'static str, fix: &'static str, result: Result<String, String>) -> Check {
    let (verdict, detail) = match result {
        Ok(d) => (Verdict::Ok, d),
        Err(d) => (Verdict::Fail, d),
    };
    Check {
        name,
        verdict,
        detail: redact(&detail).into_string(),
        fix,
    }
}

fn skip(name: &'static str, detail: &str) -> Check {
    Check {
        name,
        verdict: Verdict::Skip,
        detail: detail.into(),
        fix: "",
    }
}

/// Runs every check.
pub(crate) fn run(cfg: &Config) -> Vec<Check> {
    // Read only, once: doctor may run as root, and creates nothing.
    let layout = Layout::peek(cfg);
    let mut out = vec![check(
        "config",
        "",
        Ok(format!(
            "{} parses (env {})",
            cfg.path.display(),
            cfg.env_id
        )),
    )];
    out.push(check(
        "state dir",
        "make it a directory owned by the agent's user, mode 0700, with nothing planted below it \
         (`chown -R monky-deployd: <state_dir> && chmod 0700 <state_dir>`; the package does this)",
        state_dir(cfg, &layout),
    ));
    out.push(grant(cfg, &layout));
    out.push(match &cfg.metrics_textfile {
        Some(path) => check(
            "metrics dir",
            "make the textfile's directory owned by the agent's user (or root) and not writable by \
             group or others (`chown monky-deployd: <dir> && chmod 0755 <dir>`)",
            path.parent()
                .map_or(Err("the metrics textfile has no directory".into()), |d| {
                    crate::fsx::check_dir_owner(d)
                        .map(|()| format!("{} owned and not shared", d.display()))
                }),
        ),
        None => skip("metrics dir", "metrics_textfile is not set"),
    });
    let docker = compose::Docker::builder(cfg.docker_bin.clone())
        .docker_config(crate::layout::docker_config_dir(&cfg.state_dir))
        .build();
    out.push(check(
        "compose v2",
        "install the docker compose v2 plugin system-wide (/usr/libexec/docker/cli-plugins); a plugin in a user's ~/.docker is invisible to the agent",
        match &docker {
            Ok(d) => d
                .compose_info()
                .map(|i| format!("compose {} ({})", i.version, i.program.display()))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
    ));
    let engine = compose::Engine::from_env();
    out.push(check(
        "docker socket",
        "start the docker daemon and add the agent's user to the docker group",
        engine
            .info()
            .map(|i| {
                format!(
                    "engine {} (data root {})",
                    i.server_version,
                    i.docker_root_dir.display()
                )
            })
            .map_err(|e| e.to_string()),
    ));
    out.push(match (&cfg.transport, &cfg.identity) {
        (TransportKind::Proxy, Some(id)) => check(
            "identity",
            "grant the agent read access: setfacl -m u:monky-deployd:r <identity file>",
            std::fs::File::open(id)
                .map(|_| format!("{} readable", id.display()))
                .map_err(|e| format!("{}: {e}", id.display())),
        ),
        _ => skip("identity", "not configured or not used by this transport"),
    });
    out.extend(mesh(cfg));
    for peer in [peers::Peer::Tenancy, peers::Peer::Bao] {
        let name = match peer {
            peers::Peer::Tenancy => "tenancy listener",
            _ => "openbao listener",
        };
        out.push(match peers::listener_report(cfg, peer) {
            Some(result) => check(
                name,
                "another user's process holds the loopback port the agent dials: find it with `ss -ltnpe`, stop it and `systemctl restart monky-deployd-proxy`; if the proxy runs as that user, name it in tenancy.listener_user / bao.listener_user",
                result,
            ),
            None => skip(name, "no loopback address is dialled for it"),
        });
    }
    out.push(registry_listener(cfg));
    out.push(check(
        "tenancy",
        "check the mesh: the proxy service (monky-deployd-proxy) or the tunneler, and tenancy.* in config",
        tenancy_reachable(cfg),
    ));
    out.extend(openbao(cfg, &layout));
    out.extend(max_ttl(&layout));
    out.push(disk(cfg, &layout, docker.as_ref().ok()));
    out.push(state_disk(cfg));
    out.push(release_dirs(cfg, &layout));
    out.push(hold(&layout));
    out.push(last_tick(&layout));
    out.push(secrets(&layout));
    if let Some(c) = per_uid_ulimits(&layout) {
        out.push(c);
    }
    out.push(proc_hidepid(
        &std::fs::read_to_string("/proc/self/mounts").unwrap_or_default(),
    ));
    let info = compose::Engine::from_env().info().ok();
    let accounts = crate::shared_uid::HostAccounts::read();
    let ran_as = crate::state::State::peek(&layout)
        .looked()
        .map(|l| l.uids.clone())
        .unwrap_or_default();
    out.push(userns(info.as_ref(), &accounts, &ran_as));
    out.push(inotify(
        info.as_ref(),
        &accounts,
        &crate::runtime_look::Roots::default().proc,
    ));
    out.push(timer(cfg.laptop_mode));
    out
}

/// Whether `/proc` hides other users' processes (`hidepid`), from `/proc/self/mounts`: without
/// it every local user reads every process's command line, which is why a secret is refused
/// there (`SECRET_ON_COMMAND_LINE`) but stays a risk for what the images' own scripts do.
fn proc_hidepid(mounts: &str) -> Check {
    const NAME: &str = "proc hidepid";
    let options = mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, at, kind, opts) = (f.next()?, f.next()?, f.next()?, f.next()?);
        (at == "/proc" && kind == "proc").then_some(opts)
    });
    let Some(options) = options else {
        return skip(NAME, "/proc is not mounted");
    };
    let hidepid = options
        .split(',')
        .find_map(|o| o.strip_prefix("hidepid="))
        .filter(|v| !matches!(*v, "0" | "off"));
    match hidepid {
        Some(v) => check(
            NAME,
            "",
            Ok(format!(
                "/proc is mounted hidepid={v}: other users' command lines are hidden"
            )),
        ),
        None => Check {
            name: NAME,
            verdict: Verdict::Warn,
            detail: "/proc is mounted without hidepid: every local user can read every \
                     process's command line (/proc/<pid>/cmdline), containers' included"
                .into(),
            fix: "mount /proc with hidepid=invisible (or 2) and a gid= for the monitoring users \
                  that need to see all processes (an /etc/fstab line for proc); bundles with a \
                  secret on a command line are refused either way (SECRET_ON_COMMAND_LINE)",
        },
    }
}

/// Whether a host account can read a container's environment, secrets included: without
/// `userns-remap` a container's uid is the host's, and the account with that uid reads
/// `/proc/<pid>/environ` of the container's processes and shares its per-user kernel limits.
/// CIS Docker Benchmark 2.8's question. Names the accounts at the uids ordinary images run as
/// and at the uids this box's releases were seen running as (`ran_as`).
fn userns(
    info: Option<&compose::EngineInfo>,
    accounts: &crate::shared_uid::HostAccounts,
    ran_as: &std::collections::BTreeSet<u32>,
) -> Check {
    const NAME: &str = "userns";
    let Some(info) = info else {
        return skip(NAME, "the docker engine does not answer");
    };
    if info.userns_remap() {
        return check(
            NAME,
            "",
            Ok("the engine remaps user namespaces: a container's uid is no host account's".into()),
        );
    }
    let named = |uids: &mut dyn Iterator<Item = u32>| -> Vec<String> {
        uids.flat_map(|uid| accounts.at(uid).iter().map(move |n| format!("{n} ({uid})")))
            .collect()
    };
    let usual = named(&mut USUAL_UIDS.iter().copied());
    let seen = named(&mut ran_as.iter().copied().filter(|u| *u != 0));
    let mut detail = "the engine does not remap user namespaces: a container running as a host \
                      account's uid shares it, and that account can read the container's \
                      environment and files (/proc/<pid>/environ, /proc/<pid>/root), secrets \
                      included, and shares its per-user kernel limits (inotify, mqueue, nproc)"
        .to_string();
    if usual.is_empty() {
        detail.push_str(
            "; no host account has a uid ordinary images run as (33, 101, 999, 1000, 65534)",
        );
    } else {
        detail.push_str(&format!(
            "; host accounts at uids ordinary images run as: {}",
            usual.join(", ")
        ));
    }
    if !seen.is_empty() {
        detail.push_str(&format!(
            "; host accounts at uids this box's releases ran as: {}",
            seen.join(", ")
        ));
    }
    Check {
        name: NAME,
        verdict: Verdict::Warn,
        detail,
        fix: "enable userns-remap (install.sh --userns-remap, or the role's \
              monky_deployd_userns_remap), or keep the uids containers run as (the image's USER, \
              a service's user:, the uid its entrypoint drops to) free of host accounts",
    }
}

/// The uids ordinary images run as: www-data's 33, nginx's and postgres' 101 (Debian and
/// Alpine), the database images' 999, node's 1000, nobody's 65534.
const USUAL_UIDS: [u32; 5] = [33, 101, 999, 1000, 65534];

/// The per-uid inotify counter a container shares with the host account at its uid when the
/// engine does not remap: one env's container that holds every instance the kernel allows the
/// uid (`fs.inotify.max_user_instances`) makes `inotify_init` fail for the account and for
/// every other container at that uid. No compose key limits it; only remapping separates the
/// uids. Shows the instances in use at each uid a host account has.
fn inotify(
    info: Option<&compose::EngineInfo>,
    accounts: &crate::shared_uid::HostAccounts,
    proc_root: &std::path::Path,
) -> Check {
    const NAME: &str = "inotify per uid";
    if info.is_some_and(compose::EngineInfo::userns_remap) {
        return check(
            NAME,
            "",
            Ok(
                "the engine remaps user namespaces: no container shares a host account's \
                inotify limit"
                    .into(),
            ),
        );
    }
    let max: u64 = std::fs::read_to_string(proc_root.join("sys/fs/inotify/max_user_instances"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(128);
    let shared: Vec<(u32, u64)> = inotify_instances(proc_root)
        .into_iter()
        .filter(|(uid, _)| *uid != 0 && !accounts.at(*uid).is_empty())
        .collect();
    let listed: Vec<String> = shared
        .iter()
        .map(|(uid, n)| format!("uid {uid} ({}): {n} of {max}", accounts.at(*uid).join(", ")))
        .collect();
    let class = format!(
        "a container at a host account's uid shares that uid's inotify instances \
         (fs.inotify.max_user_instances = {max}) with the account and every other container at \
         that uid: one that holds them all makes inotify_init fail for the others"
    );
    let full = shared
        .iter()
        .any(|(_, n)| n.saturating_mul(10) >= max.saturating_mul(9));
    let detail = if listed.is_empty() {
        format!("{class}; no uid a host account has holds an inotify instance now")
    } else {
        format!("{class}; in use now: {}", listed.join(", "))
    };
    Check {
        name: NAME,
        verdict: if full { Verdict::Warn } else { Verdict::Ok },
        detail,
        fix: "find the processes at that uid holding inotify instances (`find /proc/*/fd -lname \
              'anon_inode:inotify'`); enable userns-remap so containers' uids are their own",
    }
}

/// Inotify instances open, by the real uid of the process holding them (each fd of
/// `anon_inode:inotify`).
fn inotify_instances(proc_root: &std::path::Path) -> std::collections::BTreeMap<u32, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return out;
    };
    for entry in dir.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let count = fds
            .flatten()
            .filter(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:inotify")
            })
            .count() as u64;
        if count == 0 {
            continue;
        }
        let uid = std::fs::read_to_string(entry.path().join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))?
                    .split_whitespace()
                    .next()?
                    .parse::<u32>()
                    .ok()
            });
        if let Some(uid) = uid {
            *out.entry(uid).or_insert(0) += count;
        }
    }
    out
}

/// The bootstrap grant, when one is staged: a regular file, private, owned, small.
fn grant(cfg: &Config, layout: &Layout) -> Check {
    let path = &cfg.bootstrap_file;
    if std::fs::symlink_metadata(path).is_err() {
        return skip(
            "grant",
            "no bootstrap grant staged (consumed, or a token is in use)",
        );
    }
    let token_stored = layout.has_token();
    let mut c = check(
        "grant",
        "stage the grant again as a regular file, mode 0600, owned by the agent's user \
         (re-run the install kit); a kit's grant lives one hour, so reveal it again when it expired",
        crate::fsx::read_private(path, crate::tick::MAX_GRANT_BYTES)
            .map_err(|p| format!("{}: {p}", path.display()))
            .and_then(|bytes| match grant_expiry(&bytes) {
                Some(exp) if exp <= crate::clock::wall() => Err(format!(
                    "{} expired at {}: OpenBao will refuse it",
                    path.display(),
                    crate::clock::rfc3339(exp)
                )),
                Some(exp) => Ok(format!(
                    "{} is a private regular file, valid until {}",
                    path.display(),
                    crate::clock::rfc3339(exp)
                )),
                None => Ok(format!("{} is a private regular file", path.display())),
            }),
    );
    if c.verdict == Verdict::Ok && token_stored {
        // The tick keeps using a token that works; a grant staged to rotate it would sit
        // unused and expire within the hour without a word.
        c.verdict = Verdict::Warn;
        c.detail = format!(
            "grant staged but a working token is in use, so the tick ignores it; {}",
            c.detail
        );
        c.fix = "to rotate the token now: `sudo -u monky-deployd monky-deployd bootstrap --force` \
                 (OPERATIONS.md, \"Rotate the token\"); else remove the grant";
    }
    c
}

/// The `exp` claim of a grant, read without verifying it (OpenBao verifies): only to say
/// "expired" before the tick spends a login on it. Never logs any part of the grant.
fn grant_expiry(jwt: &[u8]) -> Option<u64> {
    use base64::Engine as _;
    let text = std::str::from_utf8(jwt).ok()?.trim();
    let payload = text.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()?
        .get("exp")?
        .as_u64()
}

fn state_dir(cfg: &Config, layout: &Layout) -> Result<String, String> {
    let meta = std::fs::metadata(&cfg.state_dir)
        .map_err(|e| format!("{}: {e}", cfg.state_dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", cfg.state_dir.display()));
    }
    let st = rustix::fs::stat(&cfg.state_dir).map_err(|e| e.to_string())?;
    let euid = rustix::process::geteuid().as_raw();
    let agent = agent_uid(
        euid,
        &std::fs::read_to_string("/etc/passwd").unwrap_or_default(),
    );
    if let Some(p) = crate::fsx::owner_mode_problem(&st, &[agent]) {
        return Err(format!(
            "{}: {p} (the agent's user)",
            cfg.state_dir.display()
        ));
    }
    if let Some(p) = layout.planted_links().first() {
        return Err(format!(
            "{} is a symlink the agent did not make",
            p.display()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {mode:o}; it holds the token and must be 0700",
            cfg.state_dir.display()
        ));
    }
    if euid != agent {
        // Another user (root, as the docs run doctor) proves nothing by writing here, and a
        // file it left would be one the agent did not make.
        return Ok(format!(
            "{} (mode {mode:o}, owned by the agent's user, uid {agent})",
            cfg.state_dir.display()
        ));
    }
    Layout::open(cfg)
        .and_then(|layout| layout.probe_writable())
        .map_err(|e| format!("{} is not writable: {e:#}", cfg.state_dir.display()))?;
    Ok(format!(
        "{} (mode {mode:o}, writable)",
        cfg.state_dir.display()
    ))
}

/// The uid the agent runs as: whoever runs doctor, unless that is root, which judges the box
/// for the unit's `User=monky-deployd` (root itself on a box without that user).
fn agent_uid(euid: u32, passwd: &str) -> u32 {
    if euid != 0 {
        return euid;
    }
    passwd
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let uid = f.nth(1)?.parse::<u32>().ok()?;
            (name == "monky-deployd").then_some(uid)
        })
        .next()
        .unwrap_or(0)
}

fn tenancy_reachable(cfg: &Config) -> Result<String, String> {
    let url = cfg.tenancy_url().map_err(|e| e.to_string())?;
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let addrs: Vec<SocketAddr> = match cfg.tenancy_mapping().map_err(|e| e.to_string())? {
        Some(mapped) => vec![mapped],
        None => (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("{host}:{port}: {e}"))?
            .collect(),
    };
    let timeout = Duration::from_secs(cfg.tenancy.timeout_s.clamp(1, 10));
    for a in &addrs {
        if TcpStream::connect_timeout(a, timeout).is_ok() {
            return Ok(format!("{host}:{port} reachable via {a}"));
        }
    }
    Err(format!("{host}:{port} not reachable (tried {addrs:?})"))
}

fn openbao(cfg: &Config, layout: &Layout) -> Vec<Check> {
    const FIX_REACH: &str = "check bao.addr, bao.ca_bundle and the proxy service; the certificate must be for bao.addr's host name";
    let client = match peers::openbao(cfg, None) {
        Ok(c) => c,
        Err(e) => return vec![check("openbao", FIX_REACH, Err(format!("{e:#}")))],
    };
    let mut checks = openbao_token(cfg, layout, &client);
    checks.push(clock(&client));
    checks
}

/// The box's clock against OpenBao's, from the `Date` of the answer the token check just got
/// (no request of its own): off by more than a certificate check tolerates is `TLS_CLOCK`.
fn clock(client: &bao::BaoClient) -> Check {
    const NAME: &str = "clock";
    let Some(d) = client.server_date() else {
        return skip(NAME, "no dated answer from OpenBao");
    };
    let ahead = crate::clock::ClockReading::of(d.date, d.sent, d.received, None).box_ahead_s;
    let code = crate::code::Code::TlsClock;
    match crate::clock::skew_problem(ahead) {
        Some(problem) => Check {
            name: NAME,
            verdict: Verdict::Fail,
            detail: format!("{code}: {problem} ({}'s move)", code.owner()),
            fix: code.next_step(),
        },
        None => check(
            NAME,
            "",
            Ok(format!(
                "within {}s of OpenBao's (its Date header; {} s tolerated)",
                ahead.unsigned_abs(),
                crate::clock::SKEW_TOLERANCE_S
            )),
        ),
    }
}

/// OpenBao's reachability and the stored token's verdict, by one `lookup-self`.
fn openbao_token(cfg: &Config, layout: &Layout, client: &bao::BaoClient) -> Vec<Check> {
    const FIX_REACH: &str = "check bao.addr, bao.ca_bundle and the proxy service; the certificate must be for bao.addr's host name";
    // A lease needs a working token as its bearer: without one, only a new grant brings one.
    const FIX_TOKEN: &str = "rotate the token: stage a fresh bootstrap grant (reveal the kit again) and run `monky-deployd bootstrap --force` (OPERATIONS.md, \"Rotate the token\"), or re-run the install kit";
    // Bounded and regular-only, as the tick reads it: a FIFO planted here cannot hang doctor.
    let token = layout.peek_token();
    let Some(token) =
        token.map(|t| bao::Token::new(String::from_utf8_lossy(&t).trim().to_string()))
    else {
        // No token: a lookup with an empty one still proves reachability and TLS (403 is fine).
        let probe = client.lookup_self(&bao::Token::new(String::new()));
        let reach = match probe {
            Err(e) if e.kind() == bao::ErrorKind::Temporary => bao_failed(e),
            _ => check(
                "openbao",
                FIX_REACH,
                Ok(format!("{} reachable, certificate valid", cfg.bao.addr)),
            ),
        };
        // A staged grant is the next tick's login (the first tick's on a fresh install): the
        // `grant` check judges it, and no token yet is no failure.
        let st = crate::statefile::peek(layout);
        let token = match crate::verdict::token_absence(
            &st,
            crate::verdict::grant_staged(&cfg.bootstrap_file),
        ) {
            (true, said) => skip("token", &said),
            (false, said) => check("token", FIX_TOKEN, Err(said)),
        };
        return vec![reach, token];
    };
    match client.lookup_self(&token) {
        Ok(info) => vec![
            check(
                "openbao",
                FIX_REACH,
                Ok(format!("{} reachable, certificate valid", cfg.bao.addr)),
            ),
            check(
                "token",
                FIX_TOKEN,
                match info.meta.get("env_id") {
                    Some(other) if *other != cfg.env_id => Err(format!(
                        "valid, but minted for env {other:?}, not {:?} (AGENT_ENV_MISMATCH): fix env_id in config.yaml or re-run this env's install kit",
                        cfg.env_id
                    )),
                    _ => Ok(format!("valid, ttl {}s", info.ttl.as_secs())),
                },
            ),
        ],
        Err(e) if e.kind() == bao::ErrorKind::Temporary => {
            vec![bao_failed(e), skip("token", "OpenBao not reachable")]
        }
        Err(e) => vec![
            check(
                "openbao",
                FIX_REACH,
                Ok(format!("{} reachable, certificate valid", cfg.bao.addr)),
            ),
            check("token", FIX_TOKEN, Err(format!("refused: {e}"))),
        ],
    }
}

/// The token near its max TTL with no lease to replace it (the last tick's record): a warning
/// while there is time, a failure in its last hours or once it has passed, so a person acts
/// before the box needs the kit.
fn max_ttl(layout: &Layout) -> Option<Check> {
    let end = crate::verdict::token_max_ttl(&crate::statefile::peek(layout), crate::clock::wall())?;
    Some(Check {
        name: "token max TTL",
        verdict: if end.urgent() {
            Verdict::Fail
        } else {
            Verdict::Warn
        },
        detail: redact(&end.to_string()).into_string(),
        fix: "bring tenancy back so the next tick leases a new token (`monky-deployd run --once`), \
              or stage a fresh bootstrap grant (re-run the install kit) before the time given",
    })
}

/// An OpenBao failure in words, with its code (sealed, wrong CA, wrong name, ...) and its owner,
/// so the fix line's owner is clear.
/// The `openbao` check failed with `e`: its fix is the one its code gives (a sealed OpenBao is
/// its operators' to unseal, not this box's transport to check), so the check never gives two.
fn bao_failed(e: bao::Error) -> Check {
    let failure = peers::bao_failure("lookup-self", e);
    Check {
        name: "openbao",
        verdict: Verdict::Fail,
        detail: redact(&format!("{failure} ({}'s move)", failure.code.owner())).into_string(),
        fix: failure.code.next_step(),
    }
}

fn disk(cfg: &Config, layout: &Layout, docker: Option<&compose::Docker>) -> Check {
    const FIX: &str = "free space on the docker data root (OPERATIONS.md, \"Free disk\": \
         `docker image prune -a` of images no release names, old releases by a pruning tick), \
         or grow the disk";
    let Some(docker) = docker else {
        return skip("disk", "docker not usable");
    };
    // Docker down is the docker socket check's failure; a disk verdict from a guess of the
    // data root would be a second, false one.
    if let Err(e) = compose::Engine::from_env().info() {
        return skip("disk", &format!("the docker engine does not answer ({e})"));
    }
    let st = crate::statefile::peek(layout);
    let need = st.last_disk_need_bytes().unwrap_or(0);
    let want = disk_wanted(need, cfg.disk_factor, cfg.disk_headroom_bytes);
    check(
        "disk",
        FIX,
        match docker.free_bytes() {
            Ok(free) if free >= want => Ok(format!("{} free, {} needed", gib(free), gib(want))),
            Ok(free) => Err(format!("{} free, {} needed", gib(free), gib(want))),
            Err(e) => Err(e.to_string()),
        },
    )
}

/// The state dir's own free space: a tick that cannot save its record leaves state.json, and
/// so `status` and `explain`, saying what an older tick found.
fn state_disk(cfg: &Config) -> Check {
    check(
        "state disk",
        "free space on the state dir's file system (old releases go with a pruning tick, \
         `monky-deployd run --once --prune`), or grow it",
        match compose::engine::free_bytes(&cfg.state_dir) {
            Ok(free) => match crate::verdict::state_disk_problem(free) {
                None => Ok(format!(
                    "{} free on {}",
                    crate::verdict::human_bytes(free),
                    cfg.state_dir.display()
                )),
                Some(problem) => Err(format!("{problem} ({})", cfg.state_dir.display())),
            },
            Err(e) => Err(e.to_string()),
        },
    )
}

/// What the release dirs hold: the agent's own files against `releases_max_bytes`, and what
/// containers wrote through binds below their release dirs, apart: never capped (it must not
/// block the next release), but shown, and a warning once it is larger than the cap.
fn release_dirs(cfg: &Config, layout: &Layout) -> Check {
    const NAME: &str = "release dirs";
    let Ok(u) = crate::release::usage(layout) else {
        return skip(NAME, "no release dir can be read yet");
    };
    let b = crate::verdict::human_bytes;
    if !u.partial.is_empty() {
        // A tree the measure cannot walk to its end is one the prune cannot remove either:
        // both walk with the same budget.
        return Check {
            name: NAME,
            verdict: Verdict::Warn,
            detail: format!(
                "the agent's files {} of releases_max_bytes {}; not walked to the end, so \
                 neither measured nor prunable by the agent: {}",
                b(u.agent),
                b(cfg.releases_max_bytes),
                u.partial.join("; ")
            ),
            fix: "stop the container that writes there and remove the tree by hand, then move \
                  that data to a named volume",
        };
    }
    let detail = format!(
        "the agent's files {} of releases_max_bytes {}; written by containers into their \
         release dirs {} (not capped)",
        b(u.agent),
        b(cfg.releases_max_bytes),
        b(u.container)
    );
    Check {
        name: NAME,
        verdict: if u.container > cfg.releases_max_bytes {
            Verdict::Warn
        } else {
            Verdict::Ok
        },
        detail,
        fix: "a container writes its data through a relative bind into its release dir: find it \
              with `du -sh <state_dir>/<env_id>/releases/*/*` and move that data to a named volume",
    }
}

/// The operator's hold: a warning while one is in force (the agent applies, heals and retires
/// nothing meanwhile), so doctor never calls a held box simply fine.
fn hold(layout: &Layout) -> Check {
    let clock = crate::statefile::peek(layout).clock().cloned();
    match crate::hold::peek(layout, clock.as_ref()) {
        Some(h) => Check {
            name: "hold",
            verdict: Verdict::Warn,
            detail: redact(&format!(
                "{}; nothing is applied, healed or retired meanwhile (the operator's move)",
                h.describe()
            ))
            .into_string(),
            fix: "`monky-deployd unhold` once the work on the box is done",
        },
        None => skip("hold", "the box is not held"),
    }
}

/// The last tick's outcome: a failure that is the box admin's to fix fails doctor, one that
/// is someone else's (the bundle author's, tenancy's, OpenBao's operators') warns with whose
/// move it is, so doctor never says all is well while ticks fail.
fn last_tick(layout: &Layout) -> Check {
    const NAME: &str = "last tick";
    let st = crate::statefile::peek(layout);
    let (Some(code), Some(error)) = (st.last_code(), st.last_error()) else {
        return match st.last_success() {
            Some(t) => check(
                NAME,
                "",
                Ok(format!("succeeded at {}", crate::clock::rfc3339(t))),
            ),
            None => skip(NAME, "no tick has run yet"),
        };
    };
    // A tick that failed for want of a token, before the token now stored: the failure is
    // over (the rotation runbook ends here), and the next tick uses the token.
    if matches!(
        code,
        crate::code::Code::NoCredentials
            | crate::code::Code::AgentUnauthenticated
            | crate::code::Code::GrantUnsafe
    ) && layout.has_token()
        && let Some(t) = st.token()
    {
        return check(
            NAME,
            "",
            Ok(redact(&format!(
                "failed with {code} before the token now stored (minted {}); the next tick uses \
                 it",
                crate::clock::rfc3339(t.obtained_at)
            ))
            .into_string()),
        );
    }
    let verdict = if code.owner() == crate::code::Owner::BoxAdmin {
        Verdict::Fail
    } else {
        Verdict::Warn
    };
    Check {
        name: NAME,
        verdict,
        detail: redact(&format!("{error} ({}'s move)", code.owner())).into_string(),
        fix: code.next_step(),
    }
}

/// The running release's `ulimits` that the kernel counts per host uid (`nproc`,
/// `sigpending`, `msgqueue`): shown, never failed, with what the count means on a box shared
/// with other envs. None when the release sets none.
fn per_uid_ulimits(layout: &Layout) -> Option<Check> {
    let rel = crate::release::Release::current(layout).ok().flatten()?;
    let limits = monky_bundle::Budget::per_uid_ulimits_of(&rel.compose_yaml().ok()?);
    (!limits.is_empty()).then(|| Check {
        name: "ulimits",
        verdict: Verdict::Warn,
        detail: redact(&format!(
            "{}: {}",
            limits.join(", "),
            crate::refusals::PER_UID_ULIMIT
        ))
        .into_string(),
        fix: "nothing to do while the service starts and forks; if it cannot, run it as a uid \
              no other env's containers or host accounts use",
    })
}

/// The running release's secrets that the redactor cannot mask everywhere, by `.env` key.
fn secrets(layout: &Layout) -> Check {
    const NAME: &str = "secrets";
    let Some(rel) = crate::release::Release::current(layout).ok().flatten() else {
        return skip(NAME, "no release deployed");
    };
    let entries = rel.secrets();
    if entries.is_empty() {
        return skip(NAME, "the running release reads no secret");
    }
    let weak: Vec<String> = entries
        .iter()
        .filter_map(|(key, value)| {
            crate::redact::weakness(secrecy::ExposeSecret::expose_secret(value))
                .map(|why| format!("{key} is {why}"))
        })
        .collect();
    if weak.is_empty() {
        return check(
            NAME,
            "",
            Ok(format!(
                "{} secret value(s), each masked wherever it appears",
                entries.len()
            )),
        );
    }
    Check {
        name: NAME,
        verdict: Verdict::Warn,
        detail: redact(&weak.join("; ")).into_string(),
        fix: "rotate these secrets in OpenBao to random values of 12 bytes or more; shorter ones \
              are masked in logs and reports only in part (see Redaction in OPERATIONS.md)",
    }
}

/// Free bytes a release needs: its need (a bundle's number, so any u64) times the factor, plus
/// the headroom, saturating rather than overflowing.
fn disk_wanted(need: u64, factor: f64, headroom: u64) -> u64 {
    // `as` saturates a float beyond u64::MAX.
    ((need as f64 * factor) as u64).saturating_add(headroom)
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
}

fn timer(laptop_mode: bool) -> Check {
    if laptop_mode {
        // A laptop runs the loop by hand (`monky-deployd run`); install.sh leaves the timer off.
        return skip("timer", "laptop mode: the loop runs without the timer");
    }
    if !std::path::Path::new("/run/systemd/system").is_dir() {
        return skip(
            "timer",
            "systemd is not running here (loop mode: `monky-deployd run`)",
        );
    }
    let runner = compose::process::Runner::builder(std::env::temp_dir()).build();
    let inv = compose::process::Invocation::new("systemctl", Duration::from_secs(10))
        .args(["is-active", "monky-deployd.timer"]);
    check(
        "timer",
        "systemctl enable --now monky-deployd.timer",
        match runner
            .map_err(|e| e.to_string())
            .and_then(|r| r.run(&inv).map_err(|e| e.to_string()))
        {
            Ok(out) if out.success() => Ok("monky-deployd.timer active".into()),
            Ok(out) => Err(format!("monky-deployd.timer {}", out.stdout.trim())),
            Err(e) => Err(e),
        },
    )
}

/// The proxy unit's `ziti` (its `ExecStart` and `ConditionFileIsExecutable` name this path).
const ZITI_CLI: &str = "/usr/bin/ziti";

/// What the transport needs of OpenZiti on the box: the `ziti` CLI that the proxy unit runs
/// (transport proxy), and the tunneler's mode: `run-host` beside the proxy, `run` (intercepting
/// the services' names) for transport system. Both are systemd units' business: without systemd
/// (the loop run by hand) neither unit runs, and whatever serves the proxy's port is judged by
/// the listener checks.
fn mesh(cfg: &Config) -> Vec<Check> {
    if !std::path::Path::new("/run/systemd/system").is_dir() {
        let why = "systemd is not running here: no OpenZiti unit to check";
        return vec![skip("ziti CLI", why), skip("tunneler", why)];
    }
    let ziti = match cfg.transport {
        TransportKind::Proxy => check(
            "ziti CLI",
            "install OpenZiti's `openziti` package (install.sh does), which puts `ziti` at /usr/bin/ziti",
            {
                use std::os::unix::fs::PermissionsExt;
                match std::fs::metadata(ZITI_CLI) {
                    Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
                        Ok(format!("{ZITI_CLI} for monky-deployd-proxy"))
                    }
                    Ok(_) => Err(format!("{ZITI_CLI} is not an executable file")),
                    Err(e) => Err(format!("{ZITI_CLI}: {e}")),
                }
            },
        ),
        _ => skip("ziti CLI", "transport system dials without the proxy"),
    };
    let runner = compose::process::Runner::builder(std::env::temp_dir()).build();
    let inv = compose::process::Invocation::new("systemctl", Duration::from_secs(10)).args([
        "show",
        "-p",
        "LoadState",
        "-p",
        "ActiveState",
        "-p",
        "ExecStart",
        "ziti-edge-tunnel.service",
    ]);
    let shown = runner
        .map_err(|e| e.to_string())
        .and_then(|r| r.run(&inv).map_err(|e| e.to_string()))
        .map(|out| out.stdout);
    let tunneler = match shown {
        Ok(shown) => tunneler_mode(&shown, cfg.transport),
        Err(e) => check("tunneler", "", Err(format!("systemctl show: {e}"))),
    };
    vec![ziti, tunneler]
}

/// Judges `systemctl show -p LoadState -p ActiveState -p ExecStart ziti-edge-tunnel.service`
/// for `transport`.
fn tunneler_mode(shown: &str, transport: TransportKind) -> Check {
    let prop = |key: &str| {
        shown
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_default()
    };
    // ExecStart is `{ path=… ; argv[]=<binary> <mode> <flags…> ; … }`: the mode is the word
    // after the binary.
    let mode = prop("ExecStart")
        .split("argv[]=")
        .nth(1)
        .and_then(|argv| argv.split_whitespace().nth(1))
        .unwrap_or("");
    let (wanted, fix) = match transport {
        TransportKind::System => (
            "run",
            "transport system needs the tunneler to intercept the services' names: run it in `run` mode (drop install.sh's run-host drop-in), or use transport proxy",
        ),
        _ => (
            "run-host",
            "install.sh's drop-in (ziti-edge-tunnel.service.d/run-host.conf) runs it as run-host beside the proxy: re-run install.sh, then `systemctl restart ziti-edge-tunnel`",
        ),
    };
    let system = transport == TransportKind::System;
    let state = prop("ActiveState");
    let warn = |detail: String| Check {
        name: "tunneler",
        verdict: Verdict::Warn,
        detail,
        fix,
    };
    // Transport system needs the names intercepted, which a tunneler of another kind (or plain
    // DNS on a dev box) may do too: only a tunneler that is there and cannot intercept fails.
    if prop("LoadState") != "loaded" {
        return if system {
            skip(
                "tunneler",
                "no ziti-edge-tunnel.service: the names must resolve and route some other way",
            )
        } else {
            check(
                "tunneler",
                fix,
                Err("ziti-edge-tunnel.service is not installed: the box's services are not on the mesh".into()),
            )
        };
    }
    if state != "active" {
        let detail = format!("ziti-edge-tunnel.service is {state} (mode {mode})");
        return if system {
            warn(detail)
        } else {
            check("tunneler", fix, Err(detail))
        };
    }
    if mode == wanted {
        return check(
            "tunneler",
            fix,
            Ok(format!("ziti-edge-tunnel active, mode {mode}")),
        );
    }
    let detail = format!(
        "ziti-edge-tunnel runs `{mode}`; transport {} needs `{wanted}`",
        transport.as_str()
    );
    if system {
        check("tunneler", fix, Err(detail))
    } else {
        // Beside the proxy, `run` also intercepts the services' names: the agent still dials
        // through the proxy, but the box is not set up as install.sh leaves it.
        warn(detail)
    }
}

/// Prints the checklist; exit 1 when any check failed.
pub(crate) fn show(cfg: &Config, as_json: bool) -> anyhow::Result<Exit> {
    let checks = run(cfg);
    let ok = checks.iter().all(|c| c.verdict != Verdict::Fail);
    if as_json {
        outblock!(
            "{}",
            serde_json::to_string_pretty(&json!({"ok": ok, "checks": checks}))?
        );
    } else {
        for c in &checks {
            let v = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Fail => "FAIL",
                Verdict::Skip => "skip",
                Verdict::Warn => "warn",
            };
            outln!("{v} {:<14} {}", c.name, c.detail);
            if matches!(c.verdict, Verdict::Fail | Verdict::Warn) && !c.fix.is_empty() {
                outln!("     {:<14} fix: {}", "", c.fix);
            }
        }
    }
    Ok(if ok { Exit::Ok } else { Exit::Fail })
}

/// Who serves the registry of the stored credential, when it is on an address of this box: the
/// check the agent makes before writing it, made again now.
fn registry_listener(cfg: &Config) -> Check {
    const NAME: &str = "registry listener";
    if peers::stored_registries(cfg).is_none() {
        return skip(NAME, "no registry credential stored yet");
    }
    match peers::stored_registry_check(cfg) {
        Err(e) => check(
            NAME,
            "stop the process that holds the registry's port on this box, or name the registry in trusted_registries when the box's admin runs it there on purpose",
            Err(format!("{e:#}")),
        ),
        Ok(seen) if seen.is_empty() => skip(
            NAME,
            "the credential's registry is not on an address of this box",
        ),
        Ok(seen) => check(NAME, "", Ok(seen.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn release_dirs_show_what_containers_wrote_apart_from_the_agents_files() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::parse(
            &format!(
                "env_id: e1\nstate_dir: {}\nreleases_max_bytes: 16777216\n",
                tmp.path().join("state").display()
            ),
            std::path::Path::new("test.yaml"),
        )
        .unwrap();
        let layout = crate::layout::Layout::open(&cfg).unwrap();
        let rel = layout
            .releases()
            .unwrap()
            .ensure_sub(&"a".repeat(64), 0o700)
            .unwrap();
        rel.write_atomic("docker-compose.yml", b"services: {}\n", 0o600)
            .unwrap();
        let data = rel.ensure_sub("data", 0o700).unwrap();
        data.write_atomic("db", &vec![7u8; 64 * 1024], 0o600)
            .unwrap();
        let small = super::release_dirs(&cfg, &layout);
        assert_eq!(small.verdict, super::Verdict::Ok, "{}", small.detail);
        assert!(
            small.detail.contains("of releases_max_bytes 16.0 MiB")
                && small
                    .detail
                    .contains("written by containers into their release dirs 6"),
            "{}",
            small.detail
        );
        // Grown past the cap: a warning naming what to do, never a failure.
        data.write_atomic("big", &vec![7u8; 17 << 20], 0o600)
            .unwrap();
        let big = super::release_dirs(&cfg, &layout);
        assert_eq!(big.verdict, super::Verdict::Warn, "{}", big.detail);
        assert!(big.fix.contains("named volume"));
    }

    #[test]
    fn userns_names_the_host_accounts_a_container_could_share_a_uid_with() {
        let info = |opts: &[&str]| monky_compose::EngineInfo {
            server_version: "28.3.0".into(),
            docker_root_dir: "/var/lib/docker".into(),
            security_options: opts.iter().map(|o| (*o).to_string()).collect(),
        };
        let passwd = "root:x:0:0::/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\n\
                      admin:x:1000:1000::/home/admin:/bin/bash\nsshd:x:105:65534::/:/bin/false\n\
                      app:x:4243:4243::/:/bin/false\n";
        let accounts = crate::shared_uid::HostAccounts::parse(passwd, "");
        let ran: std::collections::BTreeSet<u32> = [0, 4243, 4244].into();
        let open = super::userns(
            Some(&info(&["name=seccomp,profile=builtin"])),
            &accounts,
            &ran,
        );
        assert_eq!(open.verdict, super::Verdict::Warn);
        assert!(
            open.detail.contains(
                "images run as: admin (1000), nobody (65534); host accounts at uids this box's \
                 releases ran as: app (4243)"
            ),
            "{}",
            open.detail
        );
        assert!(open.detail.contains("inotify, mqueue, nproc"));
        let none = std::collections::BTreeSet::new();
        let remapped = super::userns(Some(&info(&["name=userns"])), &accounts, &none);
        assert_eq!(remapped.verdict, super::Verdict::Ok);
        assert_eq!(
            super::userns(None, &accounts, &none).verdict,
            super::Verdict::Skip
        );
    }

    use super::*;

    #[test]
    fn hidepid_is_read_from_the_proc_mount() {
        let at = |line: &str| super::proc_hidepid(line);
        assert_eq!(
            at("proc /proc proc rw,nosuid,relatime,hidepid=invisible 0 0\n").verdict,
            Verdict::Ok
        );
        assert_eq!(
            at("proc /proc proc rw,relatime,gid=4,hidepid=2 0 0\n").verdict,
            Verdict::Ok
        );
        assert_eq!(
            at("proc /proc proc rw,relatime 0 0\n").verdict,
            Verdict::Warn
        );
        assert_eq!(
            at("proc /proc proc rw,hidepid=0 0 0\n").verdict,
            Verdict::Warn
        );
        assert_eq!(
            at("proc /x/proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n").verdict,
            Verdict::Skip
        );
    }

    #[test]
    fn root_judges_the_state_dir_for_the_agents_user() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nmonky-deployd:x:998:998::/var/lib/monky-deployd:/usr/sbin/nologin\n";
        assert_eq!(agent_uid(0, passwd), 998);
        assert_eq!(agent_uid(1000, passwd), 1000);
        assert_eq!(agent_uid(0, "root:x:0:0::/root:/bin/sh\n"), 0);
        assert_eq!(agent_uid(0, "monky-deployd:x:notanumber:1::/:/bin/sh\n"), 0);
    }

    #[test]
    fn a_grants_expiry_is_read_without_trusting_it() {
        use base64::Engine as _;
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let jwt = format!(
            "{}.{}.sig",
            b64(r#"{"alg":"ES256"}"#),
            b64(r#"{"exp":1700000000,"env_id":"e"}"#)
        );
        assert_eq!(grant_expiry(jwt.as_bytes()), Some(1_700_000_000));
        assert_eq!(grant_expiry(b"not a jwt"), None);
        assert_eq!(grant_expiry(format!("a.{}.c", b64("{}")).as_bytes()), None);
    }

    #[test]
    fn the_tunnelers_mode_is_judged_for_the_transport() {
        let show = |state: &str, mode: &str| {
            format!(
                "LoadState=loaded\nActiveState={state}\nExecStart={{ path=/opt/openziti/bin/ziti-edge-tunnel ; argv[]=/opt/openziti/bin/ziti-edge-tunnel {mode} --verbose=2 --identity-dir /opt/openziti/etc/identities ; ignore_errors=no ; start_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }}\n"
            )
        };
        let cases = [
            (
                show("active", "run-host"),
                TransportKind::Proxy,
                Verdict::Ok,
            ),
            (show("active", "run"), TransportKind::Proxy, Verdict::Warn),
            (
                show("inactive", "run-host"),
                TransportKind::Proxy,
                Verdict::Fail,
            ),
            (show("active", "run"), TransportKind::System, Verdict::Ok),
            (
                show("active", "run-host"),
                TransportKind::System,
                Verdict::Fail,
            ),
            (show("failed", "run"), TransportKind::System, Verdict::Warn),
            (
                "LoadState=not-found\nActiveState=inactive\nExecStart=\n".to_string(),
                TransportKind::Proxy,
                Verdict::Fail,
            ),
            (
                "LoadState=not-found\nActiveState=inactive\nExecStart=\n".to_string(),
                TransportKind::System,
                Verdict::Skip,
            ),
        ];
        for (shown, transport, verdict) in cases {
            let c = tunneler_mode(&shown, transport);
            assert_eq!(c.verdict, verdict, "{transport:?} {shown}: {}", c.detail);
            assert_eq!(c.name, "tunneler");
        }
        assert!(
            tunneler_mode(&show("active", "run"), TransportKind::Proxy)
                .detail
                .contains("runs `run`; transport proxy needs `run-host`")
        );
    }

    #[test]
    fn a_bundles_disk_need_cannot_overflow_the_check() {
        assert_eq!(disk_wanted(u64::MAX, 1.5, 2 << 30), u64::MAX);
        assert_eq!(disk_wanted(1 << 30, 1.5, 2 << 30), (1 << 29) * 7);
    }
}
