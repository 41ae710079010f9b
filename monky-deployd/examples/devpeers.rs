//! devpeers: the testkit tenancy and an OpenBao in one process on 127.0.0.1, driven over a pipe
//! by `cargo xtask demo` (which links neither peer itself).
//!
//! `devpeers --env-id ENV [--fake-bao]` starts the testkit tenancy and a real OpenBao server
//! (`RealBao`: the `bao` binary `cargo xtask setup` installs, in memory, set up as production),
//! or with `--fake-bao` the in-repo `FakeBao`. It prints
//! `ready tenancy=<url> bao=<url> bao_kind=<real|fake> bao_version=<version|->` and then
//! reads one command per line on stdin, answering each with one line on stdout (`ok ...` or
//! `error <message>`):
//!
//! | command | effect |
//! | --- | --- |
//! | `secret NAME VALUE` | a new version of `<kv>/data/ENV/see/NAME` (the value never echoes) |
//! | `publish DIR` | packs the bundle members found in DIR, publishes them and makes them desired: `ok <sha>` |
//! | `grant PATH` | mints a bootstrap grant for ENV into PATH (0600), as install.sh stages it |
//! | `bao-tokens` | `ok N`: how many live OpenBao tokens the env holds (minted by its logins) |
//! | `last-report` | `ok 0`, or `ok COUNT RESULT SHA CONTAINERS DETAIL` for the latest report, where CONTAINERS is `name=state/health,...` and `-` stands for none (the log tail is left out) |
//! | `guard DOCKER PROJECT DIR` | arms the dead-man switch below for this compose project and run folder |
//! | `disarm` | the xtask tears down itself from here on: the switch is off |
//! | `detach` | `ok`, then stops reading stdin and serves until SIGTERM or SIGINT (`cargo xtask demo --keep`), then stops the OpenBao server |
//!
//! End of stdin (the xtask exited, was interrupted or killed) stops the process, so a demo never
//! leaves a peer behind; when the switch is armed it first runs `DOCKER compose -p PROJECT down
//! -v` and removes DIR, so a Ctrl-C in the middle of the demo leaves no container either. The
//! process runs in its own process group: the Ctrl-C reaches the xtask, not this cleanup.
//! Values arrive on stdin rather than argv so that `ps` never shows them.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use monky_bundle::MemberName;
use monky_testkit::bao::BaoPeer;
use monky_testkit::peers::Peers as TestPeers;
use monky_testkit::tenancy::{Desired, FakeTenancy};
use secrecy::ExposeSecret;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: devpeers --env-id ENV [--fake-bao] (then commands on stdin; see the file's docs)";
    let mut env_id = None;
    let mut fake_bao = false;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "--env-id" => env_id = words.next().filter(|e| !e.is_empty()).cloned(),
            "--fake-bao" => fake_bao = true,
            _ => bail!("{usage}"),
        }
    }
    let env_id = env_id.context(usage)?;
    let (tenancy, bao, version): (_, Box<dyn BaoPeer>, _) = if fake_bao {
        let TestPeers { tenancy, bao } = TestPeers::fake();
        (tenancy, Box::new(bao), "-".to_owned())
    } else {
        let TestPeers { tenancy, bao } = TestPeers::builder().real().map_err(|e| {
            anyhow::anyhow!(
                "cannot start the real OpenBao: {e} (or use the in-repo fake: --fake-bao)"
            )
        })?;
        let version = bao.version().to_owned();
        (tenancy, Box::new(bao), version)
    };
    let peers = Peers {
        env_id,
        tenancy,
        bao,
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "ready tenancy={} bao={} bao_kind={} bao_version={version}",
        peers.tenancy.url(),
        peers.bao.url(),
        peers.bao.kind()
    )?;
    out.flush()?;
    let mut guard: Option<Guard> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.context("cannot read a command from stdin")?;
        let (verb, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let answer = match verb {
            "detach" => {
                writeln!(out, "ok")?;
                out.flush()?;
                // Serve on the peers' threads until a signal; returning drops the peers, which
                // stops a real OpenBao server with this process instead of orphaning it.
                let mut signals = signal_hook::iterator::Signals::new([
                    signal_hook::consts::SIGTERM,
                    signal_hook::consts::SIGINT,
                ])
                .context("cannot wait for signals")?;
                let _ = signals.forever().next();
                return Ok(());
            }
            "guard" => Guard::parse(rest).map(|g| {
                guard = Some(g);
                String::new()
            }),
            "disarm" => {
                guard = None;
                Ok(String::new())
            }
            _ => peers.command(verb, rest),
        };
        let answer = match answer {
            Ok(text) if text.is_empty() => "ok".to_owned(),
            Ok(text) => format!("ok {text}"),
            Err(e) => format!("error {}", format!("{e:#}").replace('\n', " ")),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    if let Some(guard) = guard {
        guard.clean_up();
    }
    Ok(())
}

/// What to take down when the xtask goes away without tearing down itself.
struct Guard {
    docker: PathBuf,
    project: String,
    dir: PathBuf,
}

impl Guard {
    fn parse(rest: &str) -> anyhow::Result<Guard> {
        let mut words = rest.splitn(3, ' ');
        let (Some(docker), Some(project), Some(dir)) = (words.next(), words.next(), words.next())
        else {
            bail!("guard needs DOCKER PROJECT DIR");
        };
        let dir = PathBuf::from(dir);
        // Only a run folder named after a suite project is ever removed, whatever the input.
        if !project.starts_with("monky-e2e-")
            || dir.file_name().and_then(|n| n.to_str()) != Some(project)
        {
            bail!(
                "guard: {} is not a run folder of project {project}",
                dir.display()
            );
        }
        Ok(Guard {
            docker: PathBuf::from(docker),
            project: project.to_owned(),
            dir,
        })
    }

    fn clean_up(self) {
        eprintln!(
            "devpeers: the demo ended without its teardown; removing compose project {} and {}",
            self.project,
            self.dir.display()
        );
        // The xtask's process group (the agent, compose) got the same Ctrl-C: let it finish dying.
        std::thread::sleep(Duration::from_millis(500));
        let down = std::process::Command::new(&self.docker)
            .args([
                "compose",
                "-p",
                &self.project,
                "down",
                "-v",
                "--remove-orphans",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if !down.is_ok_and(|s| s.success()) {
            eprintln!(
                "devpeers: `docker compose -p {} down -v` failed; `cargo xtask teardown` removes it",
                self.project
            );
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("devpeers: cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// Both peers and the env they serve.
struct Peers {
    env_id: String,
    tenancy: FakeTenancy,
    bao: Box<dyn BaoPeer>,
}

impl Peers {
    fn command(&self, verb: &str, rest: &str) -> anyhow::Result<String> {
        match verb {
            "secret" => {
                let (name, value) = rest
                    .split_once(' ')
                    .context("secret needs a name and a value")?;
                let version = self.bao.put_secret(&self.env_id, name, value);
                Ok(format!("{name} v{version}"))
            }
            "publish" => self.publish(Path::new(rest)),
            "bao-tokens" => Ok(self.bao.live_tokens_for_env(&self.env_id).to_string()),
            "grant" => self.grant(Path::new(rest)).map(|()| String::new()),
            "last-report" => {
                let reports = self.tenancy.reports(&self.env_id);
                let Some(last) = reports.last() else {
                    return Ok("0".to_owned());
                };
                let containers: Vec<String> = last
                    .containers
                    .iter()
                    .map(|c| {
                        format!(
                            "{}={}/{}",
                            c.name,
                            c.state,
                            c.health.as_deref().unwrap_or("-")
                        )
                    })
                    .collect();
                let result = serde_json::to_value(last.result)?;
                Ok(format!(
                    "{} {} {} {} {}",
                    reports.len(),
                    result.as_str().unwrap_or("?"),
                    last.sha.as_ref().map(|s| s.as_str()).unwrap_or("-"),
                    if containers.is_empty() {
                        "-".to_owned()
                    } else {
                        containers.join(",")
                    },
                    last.detail.as_deref().unwrap_or("-")
                ))
            }
            other => {
                bail!(
                    "unknown command {other:?}: use secret, publish, grant, bao-tokens, last-report, detach"
                )
            }
        }
    }

    fn publish(&self, dir: &Path) -> anyhow::Result<String> {
        let mut files = BTreeMap::new();
        for name in MemberName::all() {
            let path = dir.join(name.as_str());
            if path.exists() {
                let bytes = std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                files.insert(name, bytes);
            }
        }
        if files.is_empty() {
            bail!("no bundle member in {}", dir.display());
        }
        let sha = monky_bundle::bundle_sha(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())))
            .to_string();
        self.tenancy
            .publish_bundle(&self.env_id, &sha, monky_bundle::pack_tar(&files));
        self.tenancy
            .set_desired(&self.env_id, Desired::sha(sha.clone()));
        Ok(sha)
    }

    fn grant(&self, path: &Path) -> anyhow::Result<()> {
        let grant = self.tenancy.mint_grant(&self.env_id);
        // Created 0600, so the grant is never readable by anyone else, not even for a moment.
        let mut file = std::fs::File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        file.write_all(grant.expose_secret().as_bytes())?;
        Ok(())
    }
}
