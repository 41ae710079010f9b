//! The docker CLI as setup, teardown and the self-check use it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::cmd;

/// The docker CLI found on PATH.
#[derive(Debug, Clone)]
pub struct Docker {
    bin: PathBuf,
}

impl Docker {
    /// Finds `docker` on PATH.
    pub fn find() -> Option<Self> {
        cmd::which("docker").map(|bin| Self { bin })
    }

    /// The absolute path of the CLI.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// A `docker <args>` command.
    pub fn cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::new(&self.bin, args)
    }

    /// A `docker <args>` command using `config` as DOCKER_CONFIG.
    pub fn cmd_with_config<I, S>(&self, config: &Path, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.cmd(args);
        c.env("DOCKER_CONFIG", config);
        c
    }

    /// Trimmed stdout of `docker <args>`; failure carries stderr.
    pub fn capture<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::capture(&mut self.cmd(args))
    }

    /// True when the engine answers `docker info`.
    pub fn engine_up(&self) -> bool {
        cmd::succeeds(&mut self.cmd(["info"]))
    }

    /// (client version, engine version).
    pub fn versions(&self) -> Result<(String, String)> {
        let client = self.capture(["version", "--format", "{{.Client.Version}}"])?;
        let server = self.capture(["version", "--format", "{{.Server.Version}}"])?;
        Ok((client, server))
    }

    /// The version `docker compose version` reports, if the plugin works.
    pub fn compose_plugin_version(&self) -> Option<String> {
        let out = self.capture(["compose", "version"]).ok()?;
        parse_compose_version(&out)
    }

    /// The path of the compose CLI plugin as the docker CLI reports it.
    pub fn compose_plugin_path(&self) -> Option<PathBuf> {
        let format =
            "{{range .ClientInfo.Plugins}}{{if eq .Name \"compose\"}}{{.Path}}{{end}}{{end}}";
        let path = self.capture(["info", "--format", format]).ok()?;
        (!path.is_empty()).then(|| PathBuf::from(path))
    }

    /// True when `docker buildx version` works (else builds use the legacy builder).
    pub fn has_buildx(&self) -> bool {
        cmd::succeeds(&mut self.cmd(["buildx", "version"]))
    }

    /// `docker login` to `registry` into the DOCKER_CONFIG `config`, password on stdin.
    /// Returns the raw output so callers can assert a failure too.
    pub fn login(
        &self,
        config: &Path,
        registry: &str,
        user: &str,
        password: &str,
    ) -> Result<std::process::Output> {
        std::fs::create_dir_all(config)
            .with_context(|| format!("cannot create {}", config.display()))?;
        cmd::output_with_stdin(
            &mut self.cmd_with_config(
                config,
                ["login", registry, "--username", user, "--password-stdin"],
            ),
            Some(password),
        )
    }
}

/// The version out of `docker compose version` / `docker-compose version` output:
/// `Docker Compose version v2.26.1` -> `2.26.1`; `docker-compose version 1.29.2, build x` -> `1.29.2`.
pub fn parse_compose_version(output: &str) -> Option<String> {
    let first = output.lines().next()?;
    let mut words = first.split_whitespace();
    words.find(|w| w.eq_ignore_ascii_case("version"))?;
    let version = words.next()?.trim_end_matches(',');
    let version = version.strip_prefix('v').unwrap_or(version);
    version
        .starts_with(|c: char| c.is_ascii_digit())
        .then(|| version.to_owned())
}

/// The major version of a compose version string.
pub fn major(version: &str) -> Option<u32> {
    version.split(['.', '-', '+']).next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_versions() {
        let check = |out: &str, expected: Option<&str>| {
            assert_eq!(parse_compose_version(out).as_deref(), expected, "{out}");
        };
        check("Docker Compose version 2.26.1-4\n", Some("2.26.1-4"));
        check("Docker Compose version v2.29.7", Some("2.29.7"));
        check(
            "docker-compose version 1.29.2, build unknown\ndocker-py version: 5.0.3",
            Some("1.29.2"),
        );
        check("docker: unknown command: docker compose", None);
        check("", None);
        assert_eq!(major("2.26.1-4"), Some(2));
        assert_eq!(major("1.29.2"), Some(1));
        assert_eq!(major("x"), None);
    }
}
