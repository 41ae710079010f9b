//! `cargo xtask release`: publishes what `cargo xtask dist` built (the `.deb`, its `.sha256` and
//! `install.sh`) where boxes download it from.
//!
//! - GitLab (the tag pipeline's `release` job): each file is uploaded to the project's generic
//!   package registry at `$CI_API_V4_URL/projects/$CI_PROJECT_ID/packages/generic/monky-deployd/
//!   <version>/<file>`, which is what `install.sh --source gitlab` downloads, then the release of
//!   `$CI_COMMIT_TAG` is created with a link to each file. The job's `CI_JOB_TOKEN` is sent as
//!   `JOB-TOKEN`; by hand, `GITLAB_PRIVATE_TOKEN` as `PRIVATE-TOKEN`.
//! - Gitea (the `release:gitea` job, or by hand): with `GITEA_URL` and `GITEA_TOKEN`, the release
//!   of the tag is created on the mirror (`GITEA_REPO`, default `mdella/monky-deployd`) and each
//!   file attached to it, which is what `install.sh --source gitea` downloads.
//!
//! Before anything is sent, the tag must be `v<version>` of the package in the folder (and of
//! this workspace), and the `.sha256` must name the `.deb` and match its bytes. A 5xx or a failed
//! connection is tried again (four tries in all); a 4xx stops the release with the server's
//! message. `--dry-run` prints every request instead, with the name of the variable a token
//! comes from, never its value. HTTP goes through `curl` (tidy keeps TLS out of xtask), with the
//! token header on its stdin, so no token reaches a process's arguments.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};

use crate::cmd;
use crate::state;

/// The package `cargo xtask dist` builds (its `PACKAGE`, named here rather than imported: dist
/// runs the packaging step, which publishes with this module).
const PACKAGE: &str = "monky-deployd";
/// The workspace's version, which `cargo xtask dist` gives the package.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The Gitea repository when `GITEA_REPO` is unset: the mirror install.sh's `--source gitea`
/// downloads from.
const DEFAULT_GITEA_REPO: &str = "mdella/monky-deployd";

/// A secret read from the environment: the value, and the variable's name, which is all that is
/// ever printed.
#[derive(Clone)]
pub struct Secret {
    var: &'static str,
    value: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${}", self.var)
    }
}

impl Secret {
    fn from_env(var: &'static str) -> Option<Self> {
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|value| Self { var, value })
    }

    /// A token handed over in-process (the packaging step's, and tests').
    pub fn new(var: &'static str, value: &str) -> Self {
        Self {
            var,
            value: value.to_string(),
        }
    }
}

/// Where to publish on GitLab.
#[derive(Debug, Clone)]
pub struct GitLab {
    /// `CI_API_V4_URL`, e.g. `https://gitlab.example/api/v4`.
    pub api: String,
    /// `CI_PROJECT_ID` (a number, or the URL-encoded path).
    pub project: String,
    /// The header the token goes in (`JOB-TOKEN` or `PRIVATE-TOKEN`) and the token.
    pub auth: (&'static str, Secret),
}

/// Where to publish on Gitea.
#[derive(Debug, Clone)]
pub struct Gitea {
    /// `GITEA_URL`, the server's base URL.
    pub url: String,
    /// `GITEA_REPO`, `owner/name`.
    pub repo: String,
    /// `GITEA_TOKEN`.
    pub token: Secret,
}

/// How often and how patiently a request is tried.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Tries in all, the first included.
    pub tries: u32,
    /// The wait before the second try; doubled before each further one.
    pub base: Duration,
}

impl Default for Retry {
    /// Four tries, 2 s, 4 s and 8 s apart: a registry restarting behind its load balancer.
    fn default() -> Self {
        Self {
            tries: 4,
            base: Duration::from_secs(2),
        }
    }
}

/// One release to publish.
#[derive(Debug, Clone)]
pub struct Release {
    /// The folder `cargo xtask dist` filled.
    pub dir: PathBuf,
    /// The tag being released, `v<version>`.
    pub tag: String,
    /// GitLab, when publishing there.
    pub gitlab: Option<GitLab>,
    /// Gitea, when publishing there.
    pub gitea: Option<Gitea>,
    /// Print the requests instead of sending them.
    pub dry_run: bool,
    /// The retry policy.
    pub retry: Retry,
}

/// The files of a release, checked.
#[derive(Debug)]
pub struct Assets {
    /// The package version, from the `.deb`'s name.
    pub version: String,
    /// `.deb`, `.deb.sha256`, `install.sh`: name and path.
    pub files: Vec<(String, PathBuf)>,
    /// The `.deb`'s sha256, hex.
    pub sha256: String,
}

/// Runs release with the command-line `args` (after `release`).
pub fn main(args: &[String]) -> Result<()> {
    let mut dir = state::workspace_root().join("target").join("dist-pkg");
    let mut tag = std::env::var("CI_COMMIT_TAG")
        .ok()
        .filter(|t| !t.is_empty());
    let (mut to_gitlab, mut to_gitea, mut dry_run) = (false, false, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--dir" => dir = PathBuf::from(it.next().context("--dir needs a folder")?),
            "--tag" => tag = Some(it.next().context("--tag needs a tag")?.clone()),
            "--gitlab" => to_gitlab = true,
            "--gitea" => to_gitea = true,
            "--dry-run" => dry_run = true,
            "-h" | "--help" => {
                println!(
                    "cargo xtask release [--gitlab] [--gitea] [--tag vX.Y.Z] [--dir DIR] [--dry-run]\n  \
                     publishes DIR (default target/dist-pkg, what `cargo xtask dist` built): the .deb,\n  \
                     its .sha256 and install.sh\n  \
                     --gitlab   to the generic package registry and the release of the tag\n             \
                     (CI_API_V4_URL, CI_PROJECT_ID, CI_JOB_TOKEN or GITLAB_PRIVATE_TOKEN)\n  \
                     --gitea    to the Gitea release of the tag (GITEA_URL, GITEA_TOKEN, GITEA_REPO)\n  \
                     neither: GitLab, and Gitea too when GITEA_TOKEN is set\n  \
                     --tag      the tag (default CI_COMMIT_TAG); it must be v<package version>\n  \
                     --dry-run  print every request, send none"
                );
                return Ok(());
            }
            other => bail!("release: unknown argument {other:?} (try --help)"),
        }
    }
    if !to_gitlab && !to_gitea {
        to_gitlab = true;
        to_gitea = Secret::from_env("GITEA_TOKEN").is_some();
    }
    let tag =
        tag.context("release: no tag: set CI_COMMIT_TAG (a tag pipeline does) or pass --tag")?;
    let release = Release {
        dir,
        tag,
        gitlab: to_gitlab.then(gitlab_from_env).transpose()?,
        gitea: to_gitea.then(gitea_from_env).transpose()?,
        dry_run,
        retry: Retry::default(),
    };
    publish(&release).map(drop)
}

fn var(name: &str) -> Result<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .with_context(|| format!("release: {name} is not set (GitLab CI sets it in a job)"))
}

fn gitlab_from_env() -> Result<GitLab> {
    let auth = match Secret::from_env("GITLAB_PRIVATE_TOKEN") {
        Some(token) => ("PRIVATE-TOKEN", token),
        None => (
            "JOB-TOKEN",
            Secret::from_env("CI_JOB_TOKEN").context(
                "release: neither CI_JOB_TOKEN (a CI job) nor GITLAB_PRIVATE_TOKEN (by hand, \
                 scope api) is set",
            )?,
        ),
    };
    Ok(GitLab {
        api: var("CI_API_V4_URL")?,
        project: var("CI_PROJECT_ID")?,
        auth,
    })
}

fn gitea_from_env() -> Result<Gitea> {
    Ok(Gitea {
        url: std::env::var("GITEA_URL")
            .ok()
            .filter(|v| !v.is_empty())
            .context(
                "release: GITEA_URL is not set (the Gitea server, e.g. https://gitea.example)",
            )?,
        repo: std::env::var("GITEA_REPO")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_GITEA_REPO.to_string()),
        token: Secret::from_env("GITEA_TOKEN")
            .context("release: GITEA_TOKEN is not set (a Gitea token that may write releases)")?,
    })
}

/// Checks the release's files and publishes them where `release` says; returns the requests
/// as printed.
pub fn publish(release: &Release) -> Result<Vec<String>> {
    let assets = assets(&release.dir, &release.tag)?;
    println!(
        "==> release {} of {PACKAGE} {} ({}){}",
        release.tag,
        assets.version,
        assets
            .files
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        if release.dry_run { ", dry run" } else { "" }
    );
    let http = Http {
        dry_run: release.dry_run,
        retry: release.retry,
        shown: std::cell::RefCell::new(Vec::new()),
    };
    if let Some(gitlab) = &release.gitlab {
        publish_gitlab(&http, gitlab, &release.tag, &assets)?;
    }
    if let Some(gitea) = &release.gitea {
        publish_gitea(&http, gitea, &release.tag, &assets)?;
    }
    if release.gitlab.is_none() && release.gitea.is_none() {
        bail!("release: nowhere to publish (pass --gitlab or --gitea)");
    }
    Ok(http.shown.into_inner())
}

/// The files in `dir`, checked against `tag` and each other.
pub fn assets(dir: &Path, tag: &str) -> Result<Assets> {
    let version = tag.strip_prefix('v').with_context(|| {
        format!("release: tag {tag:?} is not v<version>: tag the release commit v{VERSION}")
    })?;
    ensure!(
        version == VERSION,
        "release: tag {tag} does not match the package version {VERSION}: tag v{VERSION}, or \
         bump the workspace version and re-run `cargo xtask dist`"
    );
    let prefix = format!("{PACKAGE}_");
    let mut debs = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| {
        format!(
            "release: cannot read {}: run `cargo xtask dist`",
            dir.display()
        )
    })? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            debs.push(name);
        }
    }
    let deb = match debs.as_slice() {
        [one] => one.clone(),
        [] => bail!(
            "release: no {PACKAGE}_*.deb in {}: run `cargo xtask dist`",
            dir.display()
        ),
        many => bail!(
            "release: {} holds several packages ({}): keep only the one to release",
            dir.display(),
            many.join(", ")
        ),
    };
    // monky-deployd_<version>_<arch>.deb
    let deb_version = deb[prefix.len()..deb.len() - ".deb".len()]
        .rsplit_once('_')
        .map(|(v, _)| v)
        .unwrap_or_default();
    ensure!(
        deb_version == version,
        "release: {deb} is version {deb_version:?}, not the tag's {version}: re-run `cargo xtask dist`"
    );
    let deb_path = dir.join(&deb);
    let bytes =
        fs::read(&deb_path).with_context(|| format!("cannot read {}", deb_path.display()))?;
    let sha256 = hex(&Sha256::digest(&bytes));
    let sum_name = format!("{deb}.sha256");
    let sum_path = dir.join(&sum_name);
    let sum = fs::read_to_string(&sum_path)
        .with_context(|| format!("release: cannot read {}", sum_path.display()))?;
    // `sha256sum` format, as install.sh reads it: one line, "<hex>  <name>" (or " *<name>").
    let mut words = sum.split_whitespace();
    let (said, named) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    ensure!(
        named.trim_start_matches('*') == deb && words.next().is_none(),
        "release: {sum_name} does not name {deb} alone: re-run `cargo xtask dist`"
    );
    ensure!(
        said == sha256,
        "release: {sum_name} does not match {deb} (it says {said}, the file is {sha256}): \
         re-run `cargo xtask dist`"
    );
    let install = dir.join("install.sh");
    let script = fs::read_to_string(&install)
        .with_context(|| format!("release: cannot read {}", install.display()))?;
    let pinned = format!("DEFAULT_VERSION=\"{version}\"");
    ensure!(
        script.lines().any(|l| l.trim() == pinned),
        "release: {} does not say {pinned}: re-run `cargo xtask dist`",
        install.display()
    );
    Ok(Assets {
        version: version.to_string(),
        files: vec![
            (deb, deb_path),
            (sum_name, sum_path),
            ("install.sh".to_string(), install),
        ],
        sha256,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The generic package registry's URL of `file`: what install.sh's `--source gitlab` fetches.
pub fn package_url(gitlab: &GitLab, version: &str, file: &str) -> String {
    format!(
        "{}/projects/{}/packages/generic/{PACKAGE}/{version}/{file}",
        gitlab.api.trim_end_matches('/'),
        gitlab.project
    )
}

fn publish_gitlab(http: &Http, gitlab: &GitLab, tag: &str, assets: &Assets) -> Result<()> {
    let mut links = Vec::new();
    for (name, path) in &assets.files {
        let url = package_url(gitlab, &assets.version, name);
        http.send(&Request {
            method: "PUT",
            url: url.clone(),
            auth: Some((gitlab.auth.0.to_string(), gitlab.auth.1.clone())),
            body: Body::File(path.clone()),
        })?;
        links.push(serde_json::json!({
            "name": name,
            "url": url,
            "link_type": if name.ends_with(".deb") { "package" } else { "other" },
        }));
    }
    let release = serde_json::json!({
        "tag_name": tag,
        "name": format!("{PACKAGE} {}", assets.version),
        "description": description(assets),
        "assets": { "links": links },
    });
    http.send(&Request {
        method: "POST",
        url: format!(
            "{}/projects/{}/releases",
            gitlab.api.trim_end_matches('/'),
            gitlab.project
        ),
        auth: Some((gitlab.auth.0.to_string(), gitlab.auth.1.clone())),
        body: Body::Json(release.to_string()),
    })?;
    println!(
        "<== GitLab: {tag} released with {} files",
        assets.files.len()
    );
    Ok(())
}

fn description(assets: &Assets) -> String {
    format!(
        "{PACKAGE} {v}. On a box: `install.sh --version {v}` (the generic package registry, with \
         the kit's deploy token) or `install.sh --source gitea --version {v}`.\n\n\
         sha256 of the .deb: `{sha}`",
        v = assets.version,
        sha = assets.sha256
    )
}

fn publish_gitea(http: &Http, gitea: &Gitea, tag: &str, assets: &Assets) -> Result<()> {
    let base = format!(
        "{}/api/v1/repos/{}/releases",
        gitea.url.trim_end_matches('/'),
        gitea.repo
    );
    let auth = Some(("Authorization".to_string(), gitea.token.clone()));
    let created = http.send(&Request {
        method: "POST",
        url: base.clone(),
        auth: auth.clone(),
        body: Body::Json(
            serde_json::json!({
                "tag_name": tag,
                "name": format!("{PACKAGE} {}", assets.version),
                "body": description(assets),
            })
            .to_string(),
        ),
    })?;
    let id = match created {
        Some(body) => serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["id"].as_u64())
            .context("release: Gitea created the release but its answer has no id")?
            .to_string(),
        None => "<the id of the release created above>".to_string(),
    };
    for (name, path) in &assets.files {
        http.send(&Request {
            method: "POST",
            url: format!("{base}/{id}/assets?name={name}"),
            auth: auth.clone(),
            body: Body::Attachment(path.clone()),
        })?;
    }
    println!(
        "<== Gitea: {tag} released on {} with {} files",
        gitea.repo,
        assets.files.len()
    );
    Ok(())
}

enum Body {
    /// The file's bytes, as the request body (`curl --upload-file`).
    File(PathBuf),
    /// A JSON document.
    Json(String),
    /// The file as the multipart form field `attachment`.
    Attachment(PathBuf),
}

struct Request {
    method: &'static str,
    url: String,
    /// The header's name and its secret value. Gitea's `Authorization` takes `token <value>`.
    auth: Option<(String, Secret)>,
    body: Body,
}

impl Request {
    /// The request as printed: the token by the variable it comes from.
    fn display(&self) -> String {
        let mut s = format!("{} {}", self.method, self.url);
        if let Some((header, secret)) = &self.auth {
            let _ = write!(s, "\n    {header}: <${}>", secret.var);
        }
        match &self.body {
            Body::File(p) => {
                let _ = write!(s, "\n    body: {} ({} bytes)", p.display(), size(p));
            }
            Body::Json(j) => {
                let _ = write!(s, "\n    body: {j}");
            }
            Body::Attachment(p) => {
                let _ = write!(
                    s,
                    "\n    body: multipart attachment={} ({} bytes)",
                    p.display(),
                    size(p)
                );
            }
        }
        s
    }
}

fn size(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Sends requests with curl, or prints them.
struct Http {
    dry_run: bool,
    retry: Retry,
    /// Every request as printed.
    shown: std::cell::RefCell<Vec<String>>,
}

/// One try's outcome.
enum Outcome {
    /// 2xx, with the body.
    Done(Vec<u8>),
    /// Worth another try: a 5xx, or no answer at all.
    Again(String),
    /// A 4xx (or anything else): the server's message.
    Refused(String),
}

impl Http {
    /// Sends `request`; the answer's body on success, `None` in a dry run.
    fn send(&self, request: &Request) -> Result<Option<Vec<u8>>> {
        let shown = request.display();
        println!("  {shown}");
        self.shown.borrow_mut().push(shown);
        if self.dry_run {
            return Ok(None);
        }
        let mut wait = self.retry.base;
        let mut last = String::new();
        for attempt in 1..=self.retry.tries.max(1) {
            if attempt > 1 {
                println!("    try {attempt} in {wait:?}: {last}");
                std::thread::sleep(wait);
                wait = wait.saturating_mul(2);
            }
            match self.try_once(request)? {
                Outcome::Done(body) => return Ok(Some(body)),
                Outcome::Again(why) => last = why,
                Outcome::Refused(why) => {
                    bail!("release: {} {}: {why}", request.method, request.url)
                }
            }
        }
        bail!(
            "release: {} {} failed {} times, last: {last}",
            request.method,
            request.url,
            self.retry.tries
        )
    }

    fn try_once(&self, request: &Request) -> Result<Outcome> {
        let scratch = scratch_dir()?;
        let answer = scratch.join("answer");
        let mut curl = cmd::new(
            "curl",
            ["--silent", "--show-error", "--config", "-", "--request"],
        );
        curl.arg(request.method)
            .arg("--output")
            .arg(&answer)
            .args(["--write-out", "%{http_code}", "--connect-timeout", "30"])
            .args(["--max-time", "600"]);
        match &request.body {
            Body::File(path) => {
                curl.arg("--upload-file").arg(path);
            }
            Body::Json(json) => {
                let file = scratch.join("body.json");
                fs::write(&file, json)?;
                curl.args([
                    "--header",
                    "Content-Type: application/json",
                    "--data-binary",
                ])
                .arg(format!("@{}", file.display()));
            }
            Body::Attachment(path) => {
                curl.arg("--form")
                    .arg(format!("attachment=@{}", path.display()));
            }
        }
        curl.arg(&request.url);
        // The token header goes to curl on stdin as its config, never in its arguments.
        let mut config = String::new();
        if let Some((header, secret)) = &request.auth {
            ensure!(
                !secret.value.contains(['"', '\\', '\n', '\r']),
                "release: ${} holds a character no token has (a quote, a backslash or a line \
                 break): check the variable",
                secret.var
            );
            let value = if header == "Authorization" {
                format!("token {}", secret.value)
            } else {
                secret.value.clone()
            };
            config = format!("header = \"{header}: {value}\"\n");
        }
        let out = cmd::output_with_stdin(&mut curl, Some(&config));
        let body = fs::read(&answer).unwrap_or_default();
        let _ = fs::remove_dir_all(&scratch);
        let out = out.context("release: curl is needed to publish (apt-get install curl)")?;
        let code: u16 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0);
        if !out.status.success() || code == 0 {
            return Ok(Outcome::Again(format!(
                "no answer ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let said = server_message(&body);
        Ok(match code {
            200..=299 => Outcome::Done(body),
            500..=599 => Outcome::Again(format!("{code} {said}")),
            _ => Outcome::Refused(format!("{code} {said}")),
        })
    }
}

/// What the server said: GitLab's and Gitea's `message` (or GitLab's `error`), else the start of
/// the body.
fn server_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        for key in ["message", "error"] {
            match &v[key] {
                serde_json::Value::String(s) => return s.clone(),
                serde_json::Value::Null => {}
                other => return other.to_string(),
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    text.trim().chars().take(300).collect()
}

/// A private folder for one request's answer and body.
fn scratch_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "xtask-release-{}-{}",
        std::process::id(),
        state::random_hex(8)?
    ));
    fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::{self, Forge, Tokens};

    const JOB: &str = "job-token-7f3a";
    const DEPLOY: &str = "deploy-token-51c2";
    const GITEA: &str = "gitea-token-9e0d";

    fn tokens() -> Tokens {
        Tokens {
            job: JOB.into(),
            deploy: DEPLOY.into(),
            gitea: GITEA.into(),
        }
    }

    /// A folder as `cargo xtask dist` leaves it, with a stand-in package.
    fn dist_dir() -> (PathBuf, Vec<u8>) {
        let dir = std::env::temp_dir().join(format!(
            "xtask-release-test-{}-{}",
            std::process::id(),
            state::random_hex(6).unwrap()
        ));
        fs::create_dir_all(&dir).unwrap();
        let deb = format!("{PACKAGE}_{VERSION}_amd64.deb");
        let bytes: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(dir.join(&deb), &bytes).unwrap();
        fs::write(
            dir.join(format!("{deb}.sha256")),
            format!("{}  {deb}\n", hex(&Sha256::digest(&bytes))),
        )
        .unwrap();
        fs::write(
            dir.join("install.sh"),
            format!("#!/bin/bash\nDEFAULT_VERSION=\"{VERSION}\"\n"),
        )
        .unwrap();
        (dir, bytes)
    }

    fn release(dir: &Path, forge: &Forge) -> Release {
        Release {
            dir: dir.to_path_buf(),
            tag: format!("v{VERSION}"),
            gitlab: Some(GitLab {
                api: forge.api_v4_url(),
                project: forge::PROJECT_ID.into(),
                auth: ("JOB-TOKEN", Secret::new("CI_JOB_TOKEN", JOB)),
            }),
            gitea: Some(Gitea {
                url: forge.url(),
                repo: forge::GITEA_REPO.into(),
                token: Secret::new("GITEA_TOKEN", GITEA),
            }),
            dry_run: false,
            retry: Retry {
                tries: 4,
                base: Duration::ZERO,
            },
        }
    }

    #[test]
    fn publishes_each_file_where_install_sh_downloads_it_and_creates_both_releases() {
        let forge = Forge::start(tokens()).unwrap();
        let (dir, deb_bytes) = dist_dir();
        publish(&release(&dir, &forge)).unwrap();
        let deb = format!("{PACKAGE}_{VERSION}_amd64.deb");
        let names = [deb.clone(), format!("{deb}.sha256"), "install.sh".into()];
        // GitLab: the very path install.sh's --source gitlab builds, <base>/<version>/<file>,
        // byte for byte, with the job token.
        let puts: Vec<_> = forge
            .received()
            .into_iter()
            .filter(|r| r.method == "PUT")
            .collect();
        assert_eq!(puts.len(), 3);
        for (put, name) in puts.iter().zip(&names) {
            assert_eq!(
                put.path,
                format!("/api/v4/projects/69/packages/generic/monky-deployd/{VERSION}/{name}")
            );
            assert_eq!(put.header("job-token"), Some(JOB));
            assert_eq!(put.body, fs::read(dir.join(name)).unwrap());
        }
        assert_eq!(
            forge
                .file(&format!(
                    "/api/v4/projects/69/packages/generic/monky-deployd/{VERSION}/{deb}"
                ))
                .unwrap(),
            deb_bytes
        );
        let rel = forge.gitlab_release(&format!("v{VERSION}")).unwrap();
        let links = rel["assets"]["links"].as_array().unwrap();
        let urls: Vec<&str> = links.iter().map(|l| l["url"].as_str().unwrap()).collect();
        let base = forge.generic_base();
        assert_eq!(
            urls,
            names
                .iter()
                .map(|n| format!("{base}/{VERSION}/{n}"))
                .collect::<Vec<_>>()
        );
        assert_eq!(links[0]["link_type"], "package");
        // The release comes after the uploads it links to.
        let order: Vec<_> = forge.received().iter().map(|r| r.method.clone()).collect();
        assert_eq!(&order[..4], ["PUT", "PUT", "PUT", "POST"]);
        // Gitea: the release of the tag, then each file where --source gitea downloads it.
        assert_eq!(forge.gitea_release_tags(), vec![format!("v{VERSION}")]);
        for name in &names {
            let path = format!("/mdella/monky-deployd/releases/download/v{VERSION}/{name}");
            assert_eq!(
                forge.file(&path).as_deref(),
                Some(fs::read(dir.join(name)).unwrap().as_slice()),
                "{path}"
            );
        }
        for r in forge
            .received()
            .iter()
            .filter(|r| r.path.starts_with("/api/v1/"))
        {
            assert_eq!(
                r.header("authorization"),
                Some(format!("token {GITEA}").as_str())
            );
        }
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn refuses_a_tag_that_is_not_the_package_version() {
        let (dir, _) = dist_dir();
        for tag in ["v0.0.1", VERSION, &format!("v{VERSION}-rc1"), "release"] {
            let err = assets(&dir, tag).unwrap_err().to_string();
            assert!(err.contains(tag) || err.contains("not v<version>"), "{err}");
        }
        assert!(assets(&dir, &format!("v{VERSION}")).is_ok());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn refuses_a_sha256_that_does_not_match_its_deb_before_sending_anything() {
        let forge = Forge::start(tokens()).unwrap();
        let (dir, _) = dist_dir();
        let deb = format!("{PACKAGE}_{VERSION}_amd64.deb");
        let sum = dir.join(format!("{deb}.sha256"));
        let cases = [
            (format!("{}  {deb}\n", "0".repeat(64)), "does not match"),
            (
                format!(
                    "{}  other.deb\n",
                    hex(&Sha256::digest(fs::read(dir.join(&deb)).unwrap()))
                ),
                "does not name",
            ),
        ];
        for (content, said) in cases {
            fs::write(&sum, content).unwrap();
            let err = format!("{:#}", publish(&release(&dir, &forge)).unwrap_err());
            assert!(err.contains(said), "{err}");
        }
        assert!(forge.received().is_empty());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn retries_a_5xx_and_stops_on_a_4xx_with_the_servers_message() {
        let (dir, _) = dist_dir();
        let only_gitlab = |forge: &Forge| Release {
            gitea: None,
            ..release(&dir, forge)
        };
        let forge = Forge::start(tokens()).unwrap();
        forge.answer_next(502, "bad gateway");
        forge.answer_next(503, "try later");
        publish(&only_gitlab(&forge)).unwrap();
        // Two refused tries of the first upload, then three uploads and the release.
        assert_eq!(forge.received().len(), 6);
        assert!(forge.gitlab_release(&format!("v{VERSION}")).is_some());

        let forge = Forge::start(tokens()).unwrap();
        forge.answer_next(403, "403 Forbidden - insufficient_scope");
        let err = format!("{:#}", publish(&only_gitlab(&forge)).unwrap_err());
        assert!(
            err.contains("403 403 Forbidden - insufficient_scope"),
            "{err}"
        );
        assert_eq!(forge.received().len(), 1, "a 4xx is not tried again");

        // A release that already exists is the server's 409, said as it said it.
        let forge = Forge::start(tokens()).unwrap();
        publish(&only_gitlab(&forge)).unwrap();
        let err = format!("{:#}", publish(&only_gitlab(&forge)).unwrap_err());
        assert!(err.contains("409 Release already exists"), "{err}");

        // A 5xx on every try ends the release after the tries it is given.
        let forge = Forge::start(tokens()).unwrap();
        for _ in 0..4 {
            forge.answer_next(500, "down");
        }
        let err = format!("{:#}", publish(&only_gitlab(&forge)).unwrap_err());
        assert!(err.contains("failed 4 times, last: 500 down"), "{err}");
        assert_eq!(forge.received().len(), 4);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_wrong_token_is_the_servers_401() {
        let forge = Forge::start(tokens()).unwrap();
        let (dir, _) = dist_dir();
        let mut rel = release(&dir, &forge);
        rel.gitlab.as_mut().unwrap().auth = ("JOB-TOKEN", Secret::new("CI_JOB_TOKEN", "nope"));
        let err = format!("{:#}", publish(&rel).unwrap_err());
        assert!(err.contains("401 401 Unauthorized"), "{err}");
        assert!(!err.contains("nope"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_dry_run_shows_every_request_and_no_token() {
        let forge = Forge::start(tokens()).unwrap();
        let (dir, _) = dist_dir();
        let mut rel = release(&dir, &forge);
        rel.dry_run = true;
        let shown = publish(&rel).unwrap();
        assert!(forge.received().is_empty(), "a dry run sends nothing");
        // Three uploads and the release on GitLab; the release and three attachments on Gitea.
        assert_eq!(shown.len(), 8, "{shown:#?}");
        let text = shown.join("\n");
        for token in [JOB, GITEA, DEPLOY] {
            assert!(!text.contains(token), "{text}");
        }
        assert_eq!(
            text.matches("JOB-TOKEN: <$CI_JOB_TOKEN>").count(),
            4,
            "{text}"
        );
        assert_eq!(
            text.matches("Authorization: <$GITEA_TOKEN>").count(),
            4,
            "{text}"
        );
        assert!(text.contains(&format!(
            "PUT {}/{VERSION}/{PACKAGE}_{VERSION}_amd64.deb",
            forge.generic_base()
        )));
        assert!(text.contains("\"tag_name\":\"v"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }
}
