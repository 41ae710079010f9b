//! The agent's configuration file (`/etc/monky-deployd/config.yaml`): keys, defaults, validation.
//!
//! The keys and their defaults are those the install kit and the ansible role already write on
//! real boxes. An unknown key is an error naming the key and its line, because a typo that silently
//! falls back to a default (the 8081/443 port mix-up) costs a field visit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde::de::IgnoredAny;
use url::Url;

use crate::code::Code;
use crate::exit::Failure;

/// `releases_max_bytes` by default: 1 GiB, some two hundred releases of the largest bundle.
pub(crate) const DEFAULT_RELEASES_MAX_BYTES: u64 = 1 << 30;
/// The smallest `releases_max_bytes` accepted.
pub(crate) const MIN_RELEASES_MAX_BYTES: u64 = 16 << 20;

/// Where the config lives unless `--config` or `MONKY_DEPLOYD_CONFIG` says otherwise.
pub(crate) const DEFAULT_CONFIG_PATH: &str = "/etc/monky-deployd/config.yaml";

/// `tick_timeout_s` when the file does not set it: 25 minutes, inside the unit's 30-minute
/// `TimeoutStartSec`, so the agent ends a stuck tick itself (exit 75, children killed) before
/// systemd would. Raised to `healthy_timeout_s` + 300 when that is longer.
pub(crate) const DEFAULT_TICK_TIMEOUT_S: u64 = 1500;

/// The values `tick_timeout_s` may take, in seconds: at least 5, at most a day.
pub(crate) const TICK_TIMEOUT_BOUNDS: (u64, u64) = (5, 86_400);

/// How the agent reaches tenancy and OpenBao.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// The original agent's OpenZiti SDK transport; this build carries it onto `Proxy`, so a
    /// parsed [`Config`] never holds it.
    Sdk,
    /// `ziti tunnel proxy` listening on loopback; the agent maps the service hosts onto it.
    #[default]
    Proxy,
    /// Plain DNS and TCP, for boxes whose tunneler intercepts names itself.
    System,
}

impl TransportKind {
    /// The name used in the config file and in checkin's host facts.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Sdk => "sdk",
            Self::Proxy => "proxy",
            Self::System => "system",
        }
    }
}

/// What `down` does with named volumes when tenancy did not ask for a purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum VolumesOnAbsent {
    /// Volumes survive a retire (the default).
    #[default]
    Keep,
    /// Volumes are removed on retire (never on prod).
    Purge,
}

/// What a failed release leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnFailure {
    /// Point `current` back at the last healthy release and bring it up again.
    Revert,
    /// Leave the failed release in place for a human to look at.
    Leave,
}

/// The `tenancy:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenancyConfig {
    /// The mesh service bound by tenancy's agent entrypoint.
    pub service: String,
    /// The intercept host name; empty means `service`.
    pub(crate) host: String,
    /// The service's intercept port (443), not the in-pod listener.
    pub port: u16,
    /// `http` inside the mesh: the mesh is the transport security.
    pub(crate) scheme: String,
    /// Where `ziti tunnel proxy` listens for tenancy (transport `proxy`).
    pub proxy_addr: String,
    /// Per-request timeout.
    pub(crate) timeout_s: u64,
    /// Alias for scheme, host and port together, for hand-written configs.
    pub(crate) base_url: Option<String>,
    /// A user, besides root and the agent's own, whose socket may answer on a loopback
    /// address the agent dials for tenancy (`proxy_addr`, or a loopback `base_url`).
    pub(crate) listener_user: Option<String>,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        Self {
            service: "monky.tenancy.deploy".into(),
            host: String::new(),
            port: 443,
            scheme: "http".into(),
            proxy_addr: "127.0.0.1:18443".into(),
            timeout_s: 30,
            base_url: None,
            listener_user: None,
        }
    }
}

/// The `bao:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BaoConfig {
    /// The mesh service OpenBao is reached through.
    pub(crate) service: String,
    /// OpenBao's address; its host name is what TLS checks, whatever the transport.
    pub addr: String,
    /// PEM file that becomes the only trust root for OpenBao's certificate.
    pub ca_bundle: Option<PathBuf>,
    /// The JWT auth mount tenancy's grants log in to.
    pub auth_mount: String,
    /// The role on that mount.
    pub role: String,
    /// The KV v2 mount holding the env's secrets (tenancy's `vault.mount` wins when it differs).
    pub(crate) kv_mount: String,
    /// Where `ziti tunnel proxy` listens for OpenBao (transport `proxy`).
    pub proxy_addr: String,
    /// Per-request timeout.
    pub(crate) timeout_s: u64,
    /// Renew the token when its remaining TTL falls below this many seconds.
    pub(crate) renew_below_s: u64,
    /// A user, besides root and the agent's own, whose socket may answer on a loopback
    /// address the agent dials for OpenBao (`proxy_addr`, or a loopback `addr`).
    pub(crate) listener_user: Option<String>,
    /// The retired AppRole section; present only so its presence can be refused clearly.
    #[serde(default)]
    approle: Option<IgnoredAny>,
}

impl Default for BaoConfig {
    fn default() -> Self {
        Self {
            service: "openbao".into(),
            addr: "https://bao.cbs.tikali.net:8200".into(),
            ca_bundle: None,
            auth_mount: "jwt-tenancy".into(),
            role: "see-env".into(),
            kv_mount: "monky".into(),
            proxy_addr: "127.0.0.1:18200".into(),
            timeout_s: 30,
            renew_below_s: 12 * 3600,
            listener_user: None,
            approle: None,
        }
    }
}

/// The file as written, before defaults that depend on other keys are applied.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    env_id: String,
    #[serde(default)]
    site: String,
    #[serde(default)]
    transport: TransportKind,
    #[serde(default)]
    identity: Option<PathBuf>,
    #[serde(default)]
    state_dir: Option<PathBuf>,
    #[serde(default)]
    bootstrap_file: Option<PathBuf>,
    #[serde(default)]
    interval_s: Option<u64>,
    #[serde(default)]
    laptop_mode: bool,
    #[serde(default)]
    volumes_on_absent: VolumesOnAbsent,
    #[serde(default)]
    prod: Option<bool>,
    #[serde(default)]
    healthy_timeout_s: Option<u64>,
    #[serde(default)]
    tick_timeout_s: Option<u64>,
    #[serde(default)]
    compose_project: Option<String>,
    #[serde(default)]
    docker_bin: Option<PathBuf>,
    #[serde(default)]
    log_level: Option<LevelValue>,
    #[serde(default)]
    registry_host: Option<String>,
    #[serde(default)]
    disk_factor: Option<f64>,
    #[serde(default)]
    disk_headroom_bytes: Option<u64>,
    #[serde(default)]
    keep_releases: Option<usize>,
    #[serde(default)]
    releases_max_bytes: Option<u64>,
    #[serde(default)]
    self_heal: Option<bool>,
    #[serde(default)]
    on_failure: Option<OnFailure>,
    #[serde(default)]
    metrics_textfile: Option<PathBuf>,
    #[serde(default)]
    allowed_binds: Option<Vec<String>>,
    #[serde(default)]
    allowed_external_volumes: Vec<String>,
    #[serde(default)]
    allowed_external_networks: Vec<String>,
    #[serde(default)]
    allowed_route_hosts: Vec<String>,
    #[serde(default)]
    allow_unprefixed_names: bool,
    #[serde(default)]
    allow_secrets_on_command_lines: bool,
    #[serde(default)]
    trusted_registries: Vec<String>,
    #[serde(default)]
    allowed_shared_uids: Vec<u32>,
    #[serde(default)]
    budget: RawBudget,
    #[serde(default)]
    tenancy: TenancyConfig,
    #[serde(default)]
    bao: BaoConfig,
}

/// The `budget:` section as written: sizes (`1g`) and durations (`5m`) as compose spells them,
/// every key optional (see [`monky_bundle::Budget`] for the defaults).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawBudget {
    max_pids: Option<u64>,
    max_ulimit_nproc: Option<u64>,
    max_ulimit_sigpending: Option<u64>,
    max_ulimit_msgqueue: Option<String>,
    max_replicas: Option<u64>,
    max_services: Option<usize>,
    max_networks: Option<usize>,
    min_published_port: Option<u16>,
    reserved_ports: Option<Vec<u16>>,
    max_port_range: Option<u32>,
    max_shm_size: Option<String>,
    max_tmpfs_size: Option<String>,
    max_memory: Option<String>,
    max_cpus: Option<f64>,
    max_cpu_shares: Option<u64>,
    max_stop_grace_period: Option<String>,
    min_healthcheck_interval: Option<String>,
    max_log_size: Option<String>,
    max_log_files: Option<u64>,
    default_memory: Option<String>,
    default_log_size: Option<String>,
    default_log_files: Option<u64>,
    allow_journald: Option<bool>,
    max_project_pids: Option<u64>,
    max_project_memory: Option<String>,
    max_project_tmpfs: Option<String>,
    max_project_ports: Option<u64>,
    max_project_containers: Option<u64>,
}

impl RawBudget {
    /// The budget, over the defaults; memory and CPUs default to the host's.
    fn resolve(self) -> anyhow::Result<monky_bundle::Budget> {
        use monky_bundle::budget::{parse_duration, parse_size};
        let d = monky_bundle::Budget::default();
        let size = |key: &str, v: Option<String>, default: u64| -> anyhow::Result<u64> {
            match v {
                None => Ok(default),
                Some(t) => parse_size(&t).with_context(|| {
                    format!("budget.{key}: {t:?} is not a size (write it as 512m, 1g, ...)")
                }),
            }
        };
        let duration =
            |key: &str, v: Option<String>, default: Duration| -> anyhow::Result<Duration> {
                match v {
                    None => Ok(default),
                    Some(t) => parse_duration(&t).with_context(|| {
                        format!("budget.{key}: {t:?} is not a duration (write it as 30s, 5m, ...)")
                    }),
                }
            };
        let max_memory = match self.max_memory {
            Some(t) => Some(size("max_memory", Some(t), 0)?),
            None => crate::host::memory_bytes(),
        };
        if let Some(c) = self.max_cpus
            && !(c.is_finite() && c > 0.0)
        {
            bail!("budget.max_cpus: must be a number above 0");
        }
        // What the agent supplies must be something dockerd starts: a memory limit of at least
        // its 6 MiB minimum, a positive max-size, at least one log file.
        let default_memory = size("default_memory", self.default_memory, d.default_memory)?;
        if default_memory < 6 << 20 {
            bail!("budget.default_memory: must be at least 6m (dockerd's minimum)");
        }
        let default_log_size = size(
            "default_log_size",
            self.default_log_size,
            d.default_log_size,
        )?;
        if default_log_size == 0 {
            bail!("budget.default_log_size: must be above 0");
        }
        let default_log_files = self.default_log_files.unwrap_or(d.default_log_files);
        if default_log_files == 0 {
            bail!("budget.default_log_files: must be at least 1");
        }
        Ok(monky_bundle::Budget {
            max_ulimit_nproc: self.max_ulimit_nproc.unwrap_or(d.max_ulimit_nproc),
            max_ulimit_sigpending: self
                .max_ulimit_sigpending
                .unwrap_or(d.max_ulimit_sigpending),
            max_ulimit_msgqueue: size(
                "max_ulimit_msgqueue",
                self.max_ulimit_msgqueue,
                d.max_ulimit_msgqueue,
            )?,
            max_pids: self.max_pids.unwrap_or(d.max_pids),
            default_pids: d.default_pids,
            max_replicas: self.max_replicas.unwrap_or(d.max_replicas),
            max_services: self.max_services.unwrap_or(d.max_services),
            max_networks: self.max_networks.unwrap_or(d.max_networks),
            min_published_port: self.min_published_port.unwrap_or(d.min_published_port),
            reserved_ports: self.reserved_ports.unwrap_or(d.reserved_ports),
            max_port_range: self.max_port_range.unwrap_or(d.max_port_range),
            max_shm_size: size("max_shm_size", self.max_shm_size, d.max_shm_size)?,
            max_tmpfs_size: size("max_tmpfs_size", self.max_tmpfs_size, d.max_tmpfs_size)?,
            max_memory,
            max_cpus: self.max_cpus.or_else(crate::host::cpus),
            max_cpu_shares: self.max_cpu_shares.unwrap_or(d.max_cpu_shares),
            max_stop_grace_period: duration(
                "max_stop_grace_period",
                self.max_stop_grace_period,
                d.max_stop_grace_period,
            )?,
            min_healthcheck_interval: duration(
                "min_healthcheck_interval",
                self.min_healthcheck_interval,
                d.min_healthcheck_interval,
            )?,
            max_log_size: size("max_log_size", self.max_log_size, d.max_log_size)?,
            max_log_files: self.max_log_files.unwrap_or(d.max_log_files),
            default_memory,
            default_log_size,
            default_log_files,
            allow_journald: self.allow_journald.unwrap_or(d.allow_journald),
            max_project_pids: self.max_project_pids.unwrap_or(d.max_project_pids),
            max_project_memory: self
                .max_project_memory
                .map(|t| size("max_project_memory", Some(t), 0))
                .transpose()?,
            max_project_tmpfs: self
                .max_project_tmpfs
                .map(|t| size("max_project_tmpfs", Some(t), 0))
                .transpose()?,
            max_project_ports: self.max_project_ports.unwrap_or(d.max_project_ports),
            max_project_containers: self
                .max_project_containers
                .unwrap_or(d.max_project_containers),
        })
    }
}

/// The validated configuration the agent runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub(crate) path: PathBuf,
    /// The backend environment this box hosts.
    pub env_id: String,
    /// The site, reported in checkin.
    pub site: String,
    /// How tenancy and OpenBao are reached.
    pub transport: TransportKind,
    /// The box's mesh identity file (proxy transport reads it through the tunneler).
    pub identity: Option<PathBuf>,
    /// The agent's own state directory.
    pub state_dir: PathBuf,
    /// The kit's one-time bootstrap grant.
    pub bootstrap_file: PathBuf,
    /// Loop interval until tenancy says otherwise.
    pub(crate) interval: Duration,
    /// Offline is not an error on a laptop.
    pub laptop_mode: bool,
    /// Retire behaviour for volumes.
    pub(crate) volumes_on_absent: VolumesOnAbsent,
    /// Overrides the bundle's tier when set.
    pub(crate) prod: Option<bool>,
    /// How long `up` may take to become healthy.
    pub(crate) healthy_timeout: Duration,
    /// How long a whole tick may take before it ends with exit 75 (see [`TICK_TIMEOUT_BOUNDS`]).
    pub(crate) tick_timeout: Duration,
    /// The compose project name.
    pub(crate) compose_project: String,
    /// The docker CLI.
    pub(crate) docker_bin: PathBuf,
    /// The least severe level logged; errors are always logged.
    pub(crate) log_level: tracing::Level,
    /// Registry for a bare `username:password` pull credential.
    pub(crate) registry_host: String,
    /// Free space needed = need x factor + headroom.
    pub disk_factor: f64,
    /// See `disk_factor`.
    pub disk_headroom_bytes: u64,
    /// Releases kept on disk after every successful apply (the current one and the last good
    /// one always among them).
    pub(crate) keep_releases: usize,
    /// The most bytes `<env_id>/releases/` plus `staging/` may hold; checked before a new
    /// release is staged, older releases pruned first.
    pub(crate) releases_max_bytes: u64,
    /// Whether drift of the current release is healed locally (default on).
    pub(crate) self_heal: bool,
    /// After a failed release: revert or leave (unset: revert, but leave on prod).
    pub(crate) on_failure: Option<OnFailure>,
    /// The Prometheus textfile written after every tick, when set.
    pub(crate) metrics_textfile: Option<PathBuf>,
    /// Host paths a bundle may bind (`path:ro|rw`); the box's admin owns this, never a bundle.
    pub(crate) allowed_binds: Vec<monky_bundle::AllowedBind>,
    /// External volumes a bundle may use.
    pub(crate) allowed_external_volumes: Vec<String>,
    /// External networks a bundle may use.
    pub(crate) allowed_external_networks: Vec<String>,
    /// Hosts besides bundle.json's `address` that this env's routing labels (traefik rules,
    /// caddy-docker-proxy addresses) may name: exact names, `*.suffix`, or `*` for any.
    pub(crate) allowed_route_hosts: Vec<String>,
    /// Waives `BUNDLE_NONCONFORMING` (names outside the project's), never a host-access finding.
    pub(crate) allow_unprefixed_names: bool,
    /// Registries (`host:port`, as an image or the credential spells them) on an address of
    /// this box that the box's admin allows: images may name them, and their listener may be a
    /// container's (a pull-through cache); it must still be root's or the agent's user's, and
    /// answer on every address their name resolves to, before the credential reaches dockerd.
    pub(crate) trusted_registries: Vec<String>,
    /// Waives `SECRET_ON_COMMAND_LINE`: the box's admin knows no other account reads a
    /// process's arguments here (`/proc` mounted `hidepid`, no host account at a container's
    /// uid).
    pub(crate) allow_secrets_on_command_lines: bool,
    /// Waives `SECRET_READABLE_ON_HOST` for these uids: the box's admin accepts that the host
    /// accounts at them read the environment of a container running as them.
    pub(crate) allowed_shared_uids: Vec<u32>,
    /// What one project may take of this box (`BUDGET_EXCEEDED`).
    pub(crate) budget: monky_bundle::Budget,
    /// The tenancy section.
    pub tenancy: TenancyConfig,
    /// The OpenBao section.
    pub bao: BaoConfig,
}

impl Config {
    /// Reads and validates the file; every problem is a [`Code::ConfigInvalid`] failure (exit 78) naming the key.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))
            .map_err(|e| Failure::wrap(Code::ConfigInvalid, e))?;
        let mut cfg = Self::parse(&text, path).map_err(|e| {
            Failure::wrap(
                Code::ConfigInvalid,
                e.context(format!("config {} is unusable", path.display())),
            )
        })?;
        // Every agent on the box trusts root's listeners on its peer ports, and docker's proxy
        // for a published port is root: another env's bundle must not publish this agent's
        // peer ports, nor this env's bundle theirs. A sibling that does not parse is its own
        // agent's problem, and reserves nothing here.
        for (sibling, text) in crate::names::sibling_configs(path) {
            let Ok(other) = Self::parse(&text, &sibling) else {
                continue;
            };
            for port in other.peer_ports().unwrap_or_default() {
                if !cfg.budget.reserved_ports.contains(&port) {
                    cfg.budget.reserved_ports.push(port);
                }
            }
        }
        Ok(cfg)
    }

    /// Parses config text; `path` is only recorded.
    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Self> {
        let raw: RawConfig = serde_saphyr::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        if raw.bao.approle.is_some() {
            bail!(
                "bao.approle: AppRole is gone; the agent logs in with tenancy's deploy grant \
                 (bao.auth_mount/bao.role); delete the approle section"
            );
        }
        // `sdk` (the original agent's default, and what an omitted key meant to it) dialled the
        // services with the box's host identity. This build has no SDK; the same identity
        // through `ziti tunnel proxy` (monky-deployd-proxy.service, which the package's
        // maintainer scripts set up on upgrade) reaches the same services, so the box is
        // carried onto the proxy transport instead of failing every tick.
        let transport = match raw.transport {
            TransportKind::Sdk => TransportKind::Proxy,
            other => other,
        };
        let env_id = raw.env_id.trim().to_string();
        if env_id.is_empty()
            || !env_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!("env_id: must be a non-empty name of letters, digits, '-' or '_'");
        }
        let mut tenancy = raw.tenancy;
        if tenancy.host.is_empty() {
            tenancy.host = tenancy.service.clone();
        }
        let healthy_timeout_s = raw.healthy_timeout_s.unwrap_or(300);
        let tick_timeout_s = raw.tick_timeout_s.unwrap_or_else(|| {
            DEFAULT_TICK_TIMEOUT_S
                .max(healthy_timeout_s.saturating_add(300))
                .min(TICK_TIMEOUT_BOUNDS.1)
        });
        let (low, high) = TICK_TIMEOUT_BOUNDS;
        if !(low..=high).contains(&tick_timeout_s) {
            bail!("tick_timeout_s: must be between {low} and {high} seconds");
        }
        if tick_timeout_s <= healthy_timeout_s {
            bail!(
                "tick_timeout_s: must be longer than healthy_timeout_s ({healthy_timeout_s}), \
                 or no apply could wait for its containers"
            );
        }
        let disk_factor = raw.disk_factor.unwrap_or(1.5);
        if !(disk_factor.is_finite() && disk_factor >= 1.0) {
            bail!("disk_factor: must be a number >= 1.0");
        }
        let releases_max_bytes = raw.releases_max_bytes.unwrap_or(DEFAULT_RELEASES_MAX_BYTES);
        if releases_max_bytes < MIN_RELEASES_MAX_BYTES {
            bail!(
                "releases_max_bytes: must be at least {MIN_RELEASES_MAX_BYTES} (16 MiB: a few \
                 releases of the largest bundle); the default is {DEFAULT_RELEASES_MAX_BYTES}"
            );
        }
        let allowed_binds = match raw.allowed_binds {
            None => monky_bundle::AllowedBind::defaults(),
            Some(list) => list
                .iter()
                .map(|b| b.parse().map_err(|e| anyhow::anyhow!("allowed_binds: {e}")))
                .collect::<anyhow::Result<_>>()?,
        };
        let mut cfg = Self {
            path: path.to_path_buf(),
            site: raw.site,
            transport,
            identity: raw.identity,
            state_dir: raw
                .state_dir
                .unwrap_or_else(|| PathBuf::from("/var/lib/monky-deployd")),
            bootstrap_file: raw
                .bootstrap_file
                .unwrap_or_else(|| PathBuf::from("/etc/monky-deployd/bootstrap.jwt")),
            interval: Duration::from_secs(raw.interval_s.unwrap_or(60).max(1)),
            laptop_mode: raw.laptop_mode,
            volumes_on_absent: raw.volumes_on_absent,
            prod: raw.prod,
            healthy_timeout: Duration::from_secs(healthy_timeout_s),
            tick_timeout: Duration::from_secs(tick_timeout_s),
            compose_project: raw
                .compose_project
                .unwrap_or_else(|| format!("monky-{env_id}")),
            docker_bin: raw.docker_bin.unwrap_or_else(|| PathBuf::from("docker")),
            log_level: match raw.log_level {
                None => tracing::Level::INFO,
                Some(LevelValue::Text(text)) => parse_log_level(&text)?,
                Some(LevelValue::Number(n)) => parse_log_level(&n.to_string())?,
            },
            registry_host: raw
                .registry_host
                .unwrap_or_else(|| "harbor.tikali.net".into()),
            disk_factor,
            disk_headroom_bytes: raw.disk_headroom_bytes.unwrap_or(2 << 30),
            keep_releases: raw.keep_releases.unwrap_or(5).max(1),
            releases_max_bytes,
            self_heal: raw.self_heal.unwrap_or(true),
            on_failure: raw.on_failure,
            metrics_textfile: raw.metrics_textfile,
            allowed_binds,
            allowed_external_volumes: raw.allowed_external_volumes,
            allowed_external_networks: raw.allowed_external_networks,
            allowed_route_hosts: raw.allowed_route_hosts,
            allow_unprefixed_names: raw.allow_unprefixed_names,
            trusted_registries: raw.trusted_registries,
            allow_secrets_on_command_lines: raw.allow_secrets_on_command_lines,
            allowed_shared_uids: raw.allowed_shared_uids,
            budget: raw.budget.resolve()?,
            env_id,
            tenancy,
            bao: raw.bao,
        };
        cfg.tenancy_url()?;
        cfg.bao_url()?;
        cfg.tenancy_mapping()?;
        cfg.bao_mapping()?;
        for port in cfg.peer_ports()? {
            if !cfg.budget.reserved_ports.contains(&port) {
                cfg.budget.reserved_ports.push(port);
            }
        }
        Ok(cfg)
    }

    /// The host ports of the local peers this agent is set up to dial: both `proxy_addr`s
    /// (whatever the transport, as the tunneler listens there) and a loopback tenancy or
    /// OpenBao URL. They join `budget.reserved_ports` whatever the config says, because the
    /// listener check trusts root and docker's proxy for a published port runs as root: a
    /// bundle publishing one of them could answer the agent's own calls.
    fn peer_ports(&self) -> anyhow::Result<Vec<u16>> {
        let mut ports: Vec<u16> = [&self.tenancy.proxy_addr, &self.bao.proxy_addr]
            .into_iter()
            .filter_map(|a| a.parse::<SocketAddr>().ok())
            .map(|a| a.port())
            .collect();
        for a in [self.tenancy_loopback()?, self.bao_loopback()?]
            .into_iter()
            .flatten()
        {
            ports.push(a.port());
        }
        Ok(ports)
    }

    /// The loopback address the agent dials for tenancy, if it dials one: the proxy's port, or
    /// a loopback IP (or `localhost`) in the URL under `system`.
    ///
    /// # Errors
    /// A config whose addresses do not parse.
    pub(crate) fn tenancy_loopback(&self) -> anyhow::Result<Option<SocketAddr>> {
        Ok(loopback_of(self.tenancy_mapping()?, &self.tenancy_url()?))
    }

    /// The loopback address the agent dials for OpenBao, if it dials one (as
    /// [`Config::tenancy_loopback`]).
    ///
    /// # Errors
    /// A config whose addresses do not parse.
    pub(crate) fn bao_loopback(&self) -> anyhow::Result<Option<SocketAddr>> {
        Ok(loopback_of(self.bao_mapping()?, &self.bao_url()?))
    }

    /// Tenancy's base URL: `base_url` when given, else scheme://host:port.
    pub fn tenancy_url(&self) -> anyhow::Result<Url> {
        let t = &self.tenancy;
        let text = match &t.base_url {
            Some(u) => u.clone(),
            None => format!("{}://{}:{}/", t.scheme, t.host, t.port),
        };
        let url = Url::parse(&text).with_context(|| format!("tenancy: bad url {text:?}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            bail!("tenancy: url {text:?} must be http(s)://host[:port]");
        }
        Ok(url)
    }

    /// OpenBao's address as a URL.
    pub fn bao_url(&self) -> anyhow::Result<Url> {
        let url = Url::parse(&self.bao.addr)
            .with_context(|| format!("bao.addr: bad url {:?}", self.bao.addr))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            bail!(
                "bao.addr: {:?} must be http(s)://host[:port]",
                self.bao.addr
            );
        }
        Ok(url)
    }

    /// Where tenancy's TCP connection really goes, under the proxy transport.
    pub fn tenancy_mapping(&self) -> anyhow::Result<Option<SocketAddr>> {
        self.mapping("tenancy.proxy_addr", &self.tenancy.proxy_addr)
    }

    /// Where OpenBao's TCP connection really goes, under the proxy transport.
    pub fn bao_mapping(&self) -> anyhow::Result<Option<SocketAddr>> {
        self.mapping("bao.proxy_addr", &self.bao.proxy_addr)
    }

    fn mapping(&self, key: &str, value: &str) -> anyhow::Result<Option<SocketAddr>> {
        match self.transport {
            TransportKind::Proxy => value
                .parse()
                .map(Some)
                .with_context(|| format!("{key}: {value:?} is not an ip:port address")),
            _ => Ok(None),
        }
    }

    /// Whether the env counts as prod (config wins over the bundle's tier).
    pub(crate) fn is_prod(&self, bundle_says_prod: bool) -> bool {
        self.prod.unwrap_or(bundle_says_prod)
    }

    /// What a failed release leaves behind on this env.
    pub(crate) fn on_failure(&self, bundle_says_prod: bool) -> OnFailure {
        self.on_failure
            .unwrap_or(if self.is_prod(bundle_says_prod) {
                OnFailure::Leave
            } else {
                OnFailure::Revert
            })
    }

    /// The compose policy of this box for a bundle: the project name and the admin's
    /// allowlists, plus the bundle's own `allow_privileged`.
    pub(crate) fn compose_policy(&self, allow_privileged: bool) -> monky_bundle::ComposePolicy {
        monky_bundle::ComposePolicy::new(&self.compose_project)
            .allowed_binds(self.allowed_binds.clone())
            .allowed_external_volumes(self.allowed_external_volumes.iter().cloned())
            .allowed_external_networks(self.allowed_external_networks.iter().cloned())
            .route_hosts(self.allowed_route_hosts.iter().cloned())
            .allow_unprefixed_names(self.allow_unprefixed_names)
            .allow_secrets_on_command_lines(self.allow_secrets_on_command_lines)
            .registry_host(Some(&self.registry_host))
            .registries(Some(self.registries()))
            .budget(self.budget.clone())
            .allow_privileged(allow_privileged)
    }
}

impl Config {
    /// The box's view of registries for the policy: the system's resolver, and the registries
    /// its admin allows on the box's own addresses (`registry_host`, `trusted_registries`).
    pub(crate) fn registries(&self) -> monky_bundle::policy::registries::Registries {
        let allowed = std::iter::once(self.registry_host.clone())
            .chain(self.trusted_registries.iter().cloned())
            .collect();
        monky_bundle::policy::registries::Registries::new(
            crate::resolve::Resolver::default().into_lookup(),
            allowed,
        )
    }
}

/// `log_level` as written: a word, or a number as Python's `logging` takes (`log_level: 10`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LevelValue {
    Number(i64),
    Text(String),
}

/// A `log_level` value: every spelling Python's `logging` takes (CRITICAL, FATAL, ERROR,
/// WARNING, WARN, INFO, DEBUG, NOTSET, and a number: 10 debug, 20 info, 30 warning, 40 error,
/// 50 critical, what lies between rounding down to the level that shows it) and tracing's
/// TRACE, in any case. There is no level that hides errors, so an unknown word is refused
/// instead of becoming a filter that matches nothing.
fn parse_log_level(text: &str) -> anyhow::Result<tracing::Level> {
    let text = text.trim();
    if let Ok(n) = text.parse::<i64>() {
        return Ok(match n {
            // NOTSET (0) on the root logger lets everything through.
            ..=10 => tracing::Level::DEBUG,
            11..=20 => tracing::Level::INFO,
            21..=30 => tracing::Level::WARN,
            _ => tracing::Level::ERROR,
        });
    }
    Ok(match text.to_ascii_uppercase().as_str() {
        "TRACE" => tracing::Level::TRACE,
        "DEBUG" | "NOTSET" => tracing::Level::DEBUG,
        "INFO" => tracing::Level::INFO,
        "WARNING" | "WARN" => tracing::Level::WARN,
        "ERROR" | "CRITICAL" | "FATAL" => tracing::Level::ERROR,
        _ => {
            bail!(
                "log_level: {text:?} is not a level; use DEBUG, INFO, WARNING, ERROR, CRITICAL (or FATAL, WARN, NOTSET, or a number as Python's logging takes)"
            )
        }
    })
}

/// The address of this box that a peer's proxy mapping or URL dials, if it dials one.
fn loopback_of(mapping: Option<SocketAddr>, url: &Url) -> Option<SocketAddr> {
    let addr = match (mapping, url.host(), url.port_or_known_default()) {
        (Some(addr), _, _) => Some(addr),
        (None, Some(url::Host::Ipv4(ip)), Some(port)) => Some(SocketAddr::from((ip, port))),
        (None, Some(url::Host::Ipv6(ip)), Some(port)) => Some(SocketAddr::from((ip, port))),
        (None, Some(url::Host::Domain("localhost")), Some(port)) => {
            Some(SocketAddr::from(([127, 0, 0, 1], port)))
        }
        _ => None,
    };
    addr.filter(|a| crate::host::is_local(a.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Config> {
        Config::parse(text, Path::new("test.yaml"))
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn minimal_config_gets_the_documented_defaults() {
        let c = parse("env_id: env-qa-02\n").unwrap();
        assert_eq!(c.tenancy.port, 443);
        assert_eq!(c.tenancy.host, "monky.tenancy.deploy");
        assert_eq!(
            c.tenancy_url().unwrap().as_str(),
            "http://monky.tenancy.deploy:443/"
        );
        assert_eq!(c.transport, TransportKind::Proxy);
        assert_eq!(c.compose_project, "monky-env-qa-02");
        assert_eq!(c.bao.renew_below_s, 43200);
        assert_eq!(c.disk_headroom_bytes, 2 << 30);
        assert_eq!(c.releases_max_bytes, 1 << 30);
        assert_eq!(
            c.tenancy_mapping().unwrap(),
            Some("127.0.0.1:18443".parse().unwrap())
        );
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/monky-deployd"));
        assert_eq!(c.tick_timeout, Duration::from_secs(1500));
    }

    #[test]
    fn the_tick_timeout_is_bounded_and_outlasts_the_health_wait() {
        let secs = |text: &str| parse(text).unwrap().tick_timeout.as_secs();
        assert_eq!(
            secs(
                "env_id: e1
tick_timeout_s: 600
"
            ),
            600
        );
        assert_eq!(
            secs(
                "env_id: e1
healthy_timeout_s: 1800
"
            ),
            2100
        );
        for bad in ["4", "86401", "18446744073709551615"] {
            let e = err(&format!("env_id: e1\ntick_timeout_s: {bad}\n"));
            assert!(
                e.contains("tick_timeout_s: must be between 5 and 86400"),
                "{bad}: {e}"
            );
        }
        let e = err("env_id: e1\nhealthy_timeout_s: 300\ntick_timeout_s: 300\n");
        assert!(e.contains("longer than healthy_timeout_s"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let e = err("env_id: e1\ntenancy:\n  prot: 443\n");
        assert!(e.contains("prot"), "{e}");
        assert!(e.contains('3'), "line missing: {e}");
        let e = err("env_id: e1\nintervall_s: 5\n");
        assert!(e.contains("intervall_s"), "{e}");
    }

    #[test]
    fn approle_is_refused_and_sdk_is_carried_onto_the_proxy() {
        assert!(err("env_id: e1\nbao:\n  approle:\n    role_id: x\n").contains("AppRole is gone"));
        let c = parse("env_id: e1\ntransport: sdk\n").unwrap();
        assert_eq!(c.transport, TransportKind::Proxy);
        assert_eq!(
            c.tenancy_mapping().unwrap(),
            Some("127.0.0.1:18443".parse().unwrap())
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        assert!(err("env_id: ''\n").contains("env_id"));
        assert!(
            err("env_id: e1\ntransport: proxy\nbao:\n  proxy_addr: nowhere\n")
                .contains("bao.proxy_addr")
        );
        assert!(err("env_id: e1\ndisk_factor: 0.5\n").contains("disk_factor"));
        assert!(err("env_id: e1\nreleases_max_bytes: 1000\n").contains("releases_max_bytes"));
        assert!(err("env_id: e1\ntenancy:\n  base_url: 'ftp://x'\n").contains("tenancy"));
    }

    #[test]
    fn log_levels_take_the_original_spellings_in_any_case() {
        use tracing::Level;
        for (text, level) in [
            ("DEBUG", Level::DEBUG),
            ("info", Level::INFO),
            ("WARNING", Level::WARN),
            ("Warning", Level::WARN),
            ("warn", Level::WARN),
            ("ERROR", Level::ERROR),
            ("CRITICAL", Level::ERROR),
            ("critical", Level::ERROR),
            ("trace", Level::TRACE),
            ("FATAL", Level::ERROR),
            ("NOTSET", Level::DEBUG),
            ("'10'", Level::DEBUG),
            ("10", Level::DEBUG),
            ("15", Level::INFO),
            ("20", Level::INFO),
            ("30", Level::WARN),
            ("40", Level::ERROR),
            ("50", Level::ERROR),
            ("0", Level::DEBUG),
        ] {
            let c = parse(&format!("env_id: e1\nlog_level: {text}\n")).unwrap();
            assert_eq!(c.log_level, level, "{text}");
        }
        assert_eq!(parse("env_id: e1\n").unwrap().log_level, Level::INFO);
        for bad in ["verbose", "off", "''", "1.5"] {
            let e = err(&format!("env_id: e1\nlog_level: {bad}\n"));
            assert!(e.contains("log_level"), "{bad}: {e}");
        }
    }

    #[test]
    fn base_url_is_an_alias() {
        let c = parse("env_id: e1\ntenancy:\n  base_url: http://127.0.0.1:9000\n").unwrap();
        assert_eq!(c.tenancy_url().unwrap().as_str(), "http://127.0.0.1:9000/");
    }

    #[test]
    fn listener_users_are_per_section_and_unset_by_default() {
        let c = parse("env_id: e1\n").unwrap();
        assert_eq!((c.tenancy.listener_user, c.bao.listener_user), (None, None));
        let c = parse("env_id: e1\ntenancy:\n  listener_user: ziti\nbao:\n  listener_user: root\n")
            .unwrap();
        assert_eq!(c.tenancy.listener_user.as_deref(), Some("ziti"));
        assert_eq!(c.bao.listener_user.as_deref(), Some("root"));
    }

    #[test]
    fn shipped_example_parses() {
        let text = include_str!("../../packaging/config.example.yaml");
        let c = parse(text).unwrap();
        assert_eq!(c.env_id, "env-qa-02");
        assert!(c.self_heal);
    }

    #[test]
    fn the_project_totals_and_supplied_defaults_are_read_from_budget() {
        let d = monky_bundle::Budget::default();
        // An old config without the keys, and the shipped example, get the documented defaults.
        for text in [
            "env_id: e1\n",
            include_str!("../../packaging/config.example.yaml"),
        ] {
            let b = parse(text).unwrap().budget;
            assert_eq!(
                (b.default_memory, b.default_log_size, b.default_log_files),
                (d.default_memory, d.default_log_size, d.default_log_files)
            );
            assert_eq!(
                (
                    b.max_project_pids,
                    b.max_project_ports,
                    b.max_project_containers
                ),
                (16384, 200, 60)
            );
            assert_eq!((b.max_project_memory, b.max_project_tmpfs), (None, None));
            assert!(b.allow_journald);
        }
        let b = parse("env_id: e1\nbudget:\n  default_memory: 512m\n  default_log_size: 5m\n  default_log_files: 2\n  allow_journald: false\n  max_project_pids: 8000\n  max_project_memory: 8g\n  max_project_tmpfs: 1g\n  max_project_ports: 20\n  max_project_containers: 12\n")
            .unwrap()
            .budget;
        assert_eq!(
            (b.default_memory, b.default_log_size, b.default_log_files),
            (512 << 20, 5 << 20, 2)
        );
        assert!(!b.allow_journald);
        assert_eq!(
            (
                b.max_project_pids,
                b.max_project_ports,
                b.max_project_containers
            ),
            (8000, 20, 12)
        );
        assert_eq!(
            (b.max_project_memory, b.max_project_tmpfs),
            (Some(8 << 30), Some(1 << 30))
        );
        for (text, want) in [
            (
                "default_memory: 1m",
                "budget.default_memory: must be at least 6m",
            ),
            (
                "default_log_files: 0",
                "budget.default_log_files: must be at least 1",
            ),
            (
                "default_log_size: 0",
                "budget.default_log_size: must be above 0",
            ),
            (
                "max_project_memory: lots",
                "budget.max_project_memory: \"lots\" is not a size",
            ),
        ] {
            let err = format!(
                "{:#}",
                parse(&format!("env_id: e1\nbudget:\n  {text}\n")).unwrap_err()
            );
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn self_heal_is_on_unless_turned_off() {
        assert!(
            parse(
                "env_id: e1
"
            )
            .unwrap()
            .self_heal
        );
        assert!(
            !parse(
                "env_id: e1
self_heal: false
"
            )
            .unwrap()
            .self_heal
        );
        let err = format!(
            "{:#}",
            parse(
                "env_id: e1
self_heal: maybe
"
            )
            .unwrap_err()
        );
        assert!(err.contains("self_heal"), "{err}");
    }

    #[test]
    fn the_compose_policy_allowlists_are_the_admins() {
        let c = parse("env_id: e1\n").unwrap();
        assert_eq!(
            c.allowed_binds
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["/etc/localtime:ro", "/etc/timezone:ro"]
        );
        assert!(c.allowed_external_volumes.is_empty() && c.allowed_external_networks.is_empty());
        let c = parse(
            "env_id: e1\nallowed_binds: [/srv/shared:rw]\nallowed_external_networks: [edge]\n",
        )
        .unwrap();
        assert_eq!(c.allowed_binds.len(), 1);
        assert_eq!(c.allowed_external_networks, ["edge"]);
        let err = parse("env_id: e1\nallowed_binds: [srv:rw]\n").unwrap_err();
        assert!(format!("{err:#}").starts_with("allowed_binds: "), "{err:#}");
        let err = parse("env_id: e1\nallowed_binds: [/srv:rwx]\n").unwrap_err();
        assert!(format!("{err:#}").contains("ro or rw"), "{err:#}");
    }

    #[test]
    fn alias_bombs_are_refused_quickly() {
        // Billion laughs: nine levels of ten aliases would expand to 10^9 strings.
        let mut text = String::from("a0: &a0 lol\n");
        for n in 1..10 {
            let refs = vec![format!("*a{}", n - 1); 10].join(", ");
            text.push_str(&format!("a{n}: &a{n} [{refs}]\n"));
        }
        text.push_str("env_id: e1\n");
        let started = std::time::Instant::now();
        assert!(parse(&text).is_err());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    mod prop {
        use super::parse;
        use proptest::prelude::*;

        /// Scalars a hand-written config may hold: right, wrong and YAML-tricky shapes.
        fn scalar() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9._:/-]{0,20}",
                "'[^'\n]{0,20}'",
                "\"[^\"\\\\\n]{0,20}\"",
                "-?[0-9]{1,22}",
                prop::sample::select(vec![
                    "true",
                    "no",
                    "yes",
                    "on",
                    "~",
                    "null",
                    "",
                    "[1, 2]",
                    "{a: b}",
                    "&a x",
                    "*a",
                    "!!str 010",
                    "0x1F",
                    "1e3",
                    ".inf",
                    "-.nan",
                    "0o17",
                    "|",
                    ">-",
                    "[",
                    "{",
                    "'unterminated",
                    "@x",
                    "`x",
                    "%x",
                    "127.0.0.1:1",
                    "http://127.0.0.1:9/",
                    "https://bao.example.test:8200",
                ])
                .prop_map(str::to_string),
                "[^\n]{0,30}",
            ]
        }

        fn key() -> impl Strategy<Value = String> {
            prop::sample::select(vec![
                "env_id",
                "site",
                "transport",
                "identity",
                "state_dir",
                "bootstrap_file",
                "interval_s",
                "laptop_mode",
                "volumes_on_absent",
                "prod",
                "healthy_timeout_s",
                "compose_project",
                "docker_bin",
                "log_level",
                "registry_host",
                "disk_factor",
                "disk_headroom_bytes",
                "keep_releases",
                "releases_max_bytes",
                "self_heal",
                "tenancy",
                "bao",
                "service",
                "host",
                "port",
                "scheme",
                "proxy_addr",
                "timeout_s",
                "base_url",
                "addr",
                "ca_bundle",
                "auth_mount",
                "role",
                "kv_mount",
                "renew_below_s",
                "approle",
                "<<",
                "unknown",
            ])
            .prop_map(str::to_string)
        }

        fn line() -> impl Strategy<Value = String> {
            prop_oneof![
                6 => ("( {2}){0,2}", key(), scalar()).prop_map(|(i, k, v)| format!("{i}{k}: {v}")),
                2 => prop::sample::select(vec!["tenancy:", "bao:", "  approle:"]).prop_map(str::to_string),
                1 => prop::sample::select(vec!["---", "...", "- x", "# comment", "\t", "x: &a {y: 1}", "z: *a", "<<: *a"])
                    .prop_map(str::to_string),
                1 => "[^\n]{0,40}",
            ]
        }

        /// Valid env ids, including the ones YAML would read as something else when plain.
        fn env_id() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z][a-z0-9-]{0,20}",
                "[A-Za-z0-9_-]{1,24}",
                prop::sample::select(vec![
                    "007",
                    "1e3",
                    "0x1F",
                    "0o17",
                    "yes",
                    "no",
                    "on",
                    "off",
                    "true",
                    "null",
                    "nan",
                    "inf",
                    "123",
                    "1_000",
                    "-1",
                    "12-34",
                    "env_qa_02",
                    "Y",
                    "n",
                    "NULL",
                    "True",
                ])
                .prop_map(str::to_string),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

            #[test]
            fn yaml_ish_text_never_panics(lines in prop::collection::vec(line(), 0..14)) {
                let _ = parse(&lines.join("\n"));
            }

            #[test]
            fn arbitrary_text_never_panics(text in any::<String>()) {
                let _ = parse(&text);
            }

            #[test]
            fn an_accepted_env_id_is_the_one_written(
                id in env_id(),
                style in 0..3u8,
                rest in prop::collection::vec(("[a-z_]{1,10}", "[a-z0-9]{0,8}"), 0..3),
            ) {
                let written = match style {
                    0 => id.clone(),
                    1 => format!("'{id}'"),
                    _ => format!("\"{id}\""),
                };
                let alone = rest.is_empty();
                let mut text = format!("env_id: {written}\n");
                for (k, v) in rest {
                    text.push_str(&format!("{k}: {v}\n"));
                }
                if let Ok(cfg) = parse(&text) {
                    // Whatever YAML made of a plain scalar, the agent talks as exactly this env.
                    prop_assert_eq!(&cfg.env_id, &id, "{}", text);
                    prop_assert_eq!(&cfg.compose_project, &format!("monky-{id}"));
                }
                // Quoted, a valid name is always accepted.
                if style != 0 && alone {
                    prop_assert!(parse(&text).is_ok(), "{}", text);
                }
            }
        }
    }

    #[test]
    fn every_agent_on_the_box_reserves_every_agents_peer_ports() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("config.yaml");
        std::fs::write(
            &ours,
            "env_id: env-qa\nbudget:\n  reserved_ports: []\ntenancy:\n  proxy_addr: 127.0.0.1:19443\n\
             bao:\n  proxy_addr: 127.0.0.1:19200\n",
        )
        .unwrap();
        // The second env's agent, its proxy on other ports; a broken file and a non-YAML one
        // reserve nothing.
        std::fs::write(
            dir.path().join("env-qa-b.yaml"),
            "env_id: env-qa-b\nstate_dir: /var/lib/monky-deployd-b\ntenancy:\n  proxy_addr: 127.0.0.1:28443\n\
             bao:\n  proxy_addr: 127.0.0.1:28200\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "env_id: [").unwrap();
        std::fs::write(
            dir.path().join("notes.txt"),
            "tenancy:\n  proxy_addr: 127.0.0.1:1\n",
        )
        .unwrap();
        let c = Config::load(&ours).unwrap();
        assert_eq!(c.budget.reserved_ports, [19443, 19200, 28443, 28200]);
        let err = c
            .compose_policy(true)
            .check_file(
                "services:\n  web:\n    image: x\n    ports: [\"127.0.0.1:28443:80\"]\n",
                &|_| None,
                &Default::default(),
            )
            .expect_err("another agent's peer port")
            .to_string();
        assert!(err.contains("reserved_ports"), "{err}");
    }

    #[test]
    fn the_agents_own_peer_ports_are_always_reserved() {
        // The admin empties reserved_ports and moves both proxies; a loopback OpenBao URL
        // under `system` adds its own port.
        let c = parse(
            "env_id: e1\nbudget:\n  reserved_ports: []\ntenancy:\n  proxy_addr: 127.0.0.1:19443\n\
             bao:\n  proxy_addr: 127.0.0.1:19200\n",
        )
        .unwrap();
        assert_eq!(c.budget.reserved_ports, [19443, 19200]);
        let c = parse(
            "env_id: e1\ntransport: system\nbudget:\n  reserved_ports: [22]\n\
             bao:\n  addr: https://localhost:8300\n",
        )
        .unwrap();
        assert_eq!(c.budget.reserved_ports, [22, 18443, 18200, 8300]);

        // Whatever host ip a bundle names, and in a range or the long syntax, it is refused.
        let c = parse(
            "env_id: e1\nbudget:\n  reserved_ports: []\ntenancy:\n  proxy_addr: 127.0.0.1:19443\n",
        )
        .unwrap();
        let policy = c.compose_policy(true);
        for port in [
            "\"19443:80\"",
            "\"127.0.0.1:19443:80\"",
            "\"0.0.0.0:19443:80\"",
            "\"[::]:19443:80\"",
            "\"[::1]:19443:80/tcp\"",
            "\":19443:80\"",
            "\"19440-19450:80\"",
            "{target: 80, published: \"19443\", host_ip: \"::\"}",
            "{target: 80, published: 19443, host_ip: \"\"}",
        ] {
            let yaml = format!("services:\n  web:\n    image: x\n    ports:\n      - {port}\n");
            let err = policy
                .check_file(&yaml, &|_| None, &Default::default())
                .expect_err(&yaml)
                .to_string();
            assert!(err.contains("reserved_ports"), "{port}: {err}");
        }
        let ok = "services:\n  web:\n    image: x\n    ports:\n      - \"19444:80\"\n";
        policy
            .check_file(ok, &|_| None, &Default::default())
            .unwrap();
    }
}
