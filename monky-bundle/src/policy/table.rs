//! The policy's table: for every key of the compose specification and of compose's model, its
//! [`Rule`] and why, and the index [`rule_of`] and the walk read it through.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// How the table classifies a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rule {
    /// Any value. When the table lists keys below this one, those are judged too.
    Allowed,
    /// Allowed when the constraint holds; a violation is refused like a privileged key, or as
    /// `BUNDLE_INVALID` for the constraints that keep the project's identity.
    Constrained(Constraint),
    /// Refused with `PRIVILEGED_REFUSED` unless the bundle's `allow_privileged` is set.
    Privileged,
    /// Refused with `BUNDLE_INVALID` whatever the bundle says: a feature the agent never
    /// runs, or one that would make what was checked differ from what runs.
    Refused,
}

/// The constraint of a [`Rule::Constrained`] key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Constraint {
    /// The value must be false (or absent).
    False,
    /// A `container_name` must start with `<project>-`.
    ContainerName,
    /// No label in compose's own `com.docker.compose.` namespace.
    Labels,
    /// Only capabilities of docker's default set.
    CapAdd,
    /// Only `no-new-privileges`.
    SecurityOpt,
    /// Only sysctls docker namespaces per container: `net.*` and the IPC ones.
    Sysctls,
    /// `service:<a service of this project>`, or one of the listed private modes.
    Namespace(&'static [&'static str]),
    /// Only services of this project.
    VolumesFrom,
    /// Binds inside the release dir (never writable over its own files) or on the box's
    /// allowlist; named volumes and tmpfs; no mount propagation.
    ServiceVolumes,
    /// A file bound into a container (`configs.*.file`, `secrets.*.file`): a literal path
    /// inside the release dir, not a link, not below a writable bind.
    InRelease,
    /// A file compose reads into its model (`env_file`, `label_file`): the literal `.env`.
    EnvFile,
    /// `oom_score_adj` of 0 or more.
    OomScoreAdj,
    /// No `rtprio` or `rttime` ulimit; `memlock` only under a memory limit.
    Ulimits,
    /// A logging driver that writes on the box: `json-file`, `local`, `journald`, `none`.
    LogDriver,
    /// Not `build`.
    PullPolicy,
    /// A registry reference, not a local image ID, on no registry of the box's loopback but
    /// the box's own `registry_host`.
    Image,
    /// No DNS server on the box's loopback.
    Dns,
    /// `external` only for a name on the box's allowlist.
    ExternalVolume,
    /// See [`Constraint::ExternalVolume`].
    ExternalNetwork,
    /// A custom name must start with `<project>_`, as compose names the project's own.
    OwnName,
    /// The default volume driver (`local`) only.
    VolumeDriver,
    /// Only the local driver's tmpfs shape: memory, not a host path.
    VolumeDriverOpts,
    /// The default network driver (`bridge`) only.
    NetworkDriver,
    /// Present only as an empty object (compose writes `ipam: {}` into its model).
    Empty,
}

/// One row of the policy table: a key path, its rule and why.
///
/// Key paths: `a.b` is key `b` of the object at `a`; `a.*` every entry of the named map at `a`
/// (a service, a volume); `a[]` every item of the list at `a`.
#[derive(Debug, Clone, Copy)]
pub struct TableRow {
    /// The key path.
    pub path: &'static str,
    /// Its rule.
    pub rule: Rule,
    /// Why, in a sentence for the renderer's authors.
    pub why: &'static str,
}

const fn row(path: &'static str, rule: Rule, why: &'static str) -> TableRow {
    TableRow { path, rule, why }
}

use Constraint as C;
use Rule::{Allowed as A, Constrained as K, Privileged as P, Refused as R};

const LIMIT: &str = "A resource limit on the service's own containers.";
const PLAIN: &str = "Shapes the service's own containers; nothing on the host.";
const SWARM: &str = "Swarm scheduling; compose ignores it or uses it for its own containers only.";
const HOOK: &str = "Runs inside the service's own container.";
const DEVICE: &str = "Hands a host device to the container.";
const BLKIO_DEVICE: &str = "dockerd stats the named host device as root, and its error tells the bundle's author which host files exist.";

/// The policy table: every key of the compose specification and of compose's model.
#[rustfmt::skip]
pub const TABLE: &[TableRow] = &[
    // Top level.
    row("version", A, "Ignored by compose v2."),
    row("name", A, "compose ignores it under the agent's `-p`: the project is always the agent's own (measured with compose 2.26)."),
    row("include", R, "Reads more compose files at every pull, up and revert: what was checked would not be what runs."),
    row("services", A, "The services; each is judged below."),
    row("services.*", A, "One service; its keys are judged below."),
    row("networks", A, "The project's own networks; each is judged below."),
    row("networks.*", A, "One network; its keys are judged below."),
    row("volumes", A, "The project's own named volumes; each is judged below."),
    row("volumes.*", A, "One volume; its keys are judged below."),
    row("secrets", A, "File-based secrets; each is judged below."),
    row("secrets.*", A, "One secret; its keys are judged below."),
    row("configs", A, "File-based configs; each is judged below."),
    row("configs.*", A, "One config; its keys are judged below."),
    row("models", R, "AI model runner integration: not something a box runs."),
    // A service.
    row("services.*.annotations", P, "OCI annotations reach the runtime, which may act on them (device injection)."),
    row("services.*.attach", A, PLAIN),
    row("services.*.blkio_config", A, LIMIT),
    row("services.*.blkio_config.device_read_bps", P, BLKIO_DEVICE),
    row("services.*.blkio_config.device_read_iops", P, BLKIO_DEVICE),
    row("services.*.blkio_config.device_write_bps", P, BLKIO_DEVICE),
    row("services.*.blkio_config.device_write_iops", P, BLKIO_DEVICE),
    row("services.*.blkio_config.weight", A, LIMIT),
    row("services.*.blkio_config.weight_device", P, BLKIO_DEVICE),
    row("services.*.build", R, "The agent pulls images and builds nothing on a box; build contexts read host paths."),
    row("services.*.cap_add", K(C::CapAdd), "Only docker's default capabilities; every other one (SYS_MODULE, SYS_PTRACE, NET_ADMIN, BPF ...) widens what a container can do to the host kernel."),
    row("services.*.cap_drop", A, "Dropping capabilities only narrows the container."),
    row("services.*.cgroup", K(C::Namespace(&["private"])), "The host's cgroup namespace is refused."),
    row("services.*.cgroup_parent", P, "Places the container in a cgroup of the host's choosing, outside docker's limits."),
    row("services.*.command", A, PLAIN),
    row("services.*.configs", A, "Grants the service a config of this project."),
    row("services.*.configs[].source", A, PLAIN),
    row("services.*.configs[].target", A, PLAIN),
    row("services.*.configs[].uid", A, PLAIN),
    row("services.*.configs[].gid", A, PLAIN),
    row("services.*.configs[].mode", A, PLAIN),
    row("services.*.container_name", K(C::ContainerName), "A fixed name must start with the project's name, so it cannot take another env's container name."),
    row("services.*.cpu_count", A, LIMIT),
    row("services.*.cpu_percent", A, LIMIT),
    row("services.*.cpu_shares", A, LIMIT),
    row("services.*.cpu_quota", A, LIMIT),
    row("services.*.cpu_period", A, LIMIT),
    row("services.*.cpu_rt_period", P, "Real-time scheduling can starve the host."),
    row("services.*.cpu_rt_runtime", P, "Real-time scheduling can starve the host."),
    row("services.*.cpus", A, LIMIT),
    row("services.*.cpuset", A, LIMIT),
    row("services.*.credential_spec", P, "Windows credential specs read host files and registry keys."),
    row("services.*.depends_on", A, "Start order between the project's own services."),
    row("services.*.depends_on.*", A, "One dependency."),
    row("services.*.depends_on.*.condition", A, PLAIN),
    row("services.*.depends_on.*.required", A, PLAIN),
    row("services.*.depends_on.*.restart", A, PLAIN),
    row("services.*.deploy", A, "Resources and restart policy; each key is judged below."),
    row("services.*.deploy.mode", A, SWARM),
    row("services.*.deploy.endpoint_mode", A, SWARM),
    row("services.*.deploy.replicas", A, SWARM),
    row("services.*.deploy.labels", A, SWARM),
    row("services.*.deploy.placement", A, SWARM),
    row("services.*.deploy.placement.constraints", A, SWARM),
    row("services.*.deploy.placement.preferences", A, SWARM),
    row("services.*.deploy.placement.preferences[].spread", A, SWARM),
    row("services.*.deploy.placement.max_replicas_per_node", A, SWARM),
    row("services.*.deploy.resources", A, LIMIT),
    row("services.*.deploy.resources.limits", A, LIMIT),
    row("services.*.deploy.resources.limits.cpus", A, LIMIT),
    row("services.*.deploy.resources.limits.memory", A, LIMIT),
    row("services.*.deploy.resources.limits.pids", A, LIMIT),
    row("services.*.deploy.resources.reservations", A, LIMIT),
    row("services.*.deploy.resources.reservations.cpus", A, LIMIT),
    row("services.*.deploy.resources.reservations.memory", A, LIMIT),
    row("services.*.deploy.resources.reservations.devices", P, "GPU and device requests hand host devices to the container."),
    row("services.*.deploy.resources.reservations.generic_resources", P, "Reserves host hardware."),
    row("services.*.deploy.restart_policy", A, SWARM),
    row("services.*.deploy.restart_policy.condition", A, SWARM),
    row("services.*.deploy.restart_policy.delay", A, SWARM),
    row("services.*.deploy.restart_policy.max_attempts", A, SWARM),
    row("services.*.deploy.restart_policy.window", A, SWARM),
    row("services.*.deploy.rollback_config", A, SWARM),
    row("services.*.deploy.rollback_config.parallelism", A, SWARM),
    row("services.*.deploy.rollback_config.delay", A, SWARM),
    row("services.*.deploy.rollback_config.failure_action", A, SWARM),
    row("services.*.deploy.rollback_config.monitor", A, SWARM),
    row("services.*.deploy.rollback_config.max_failure_ratio", A, SWARM),
    row("services.*.deploy.rollback_config.order", A, SWARM),
    row("services.*.deploy.update_config", A, SWARM),
    row("services.*.deploy.update_config.parallelism", A, SWARM),
    row("services.*.deploy.update_config.delay", A, SWARM),
    row("services.*.deploy.update_config.failure_action", A, SWARM),
    row("services.*.deploy.update_config.monitor", A, SWARM),
    row("services.*.deploy.update_config.max_failure_ratio", A, SWARM),
    row("services.*.deploy.update_config.order", A, SWARM),
    row("services.*.develop", R, "Only `compose watch` uses it, and it names host paths; a box never runs it."),
    row("services.*.device_cgroup_rules", P, DEVICE),
    row("services.*.devices", P, DEVICE),
    row("services.*.dns", K(C::Dns), "A server on the box's loopback would be asked from the host's own namespace by the engine's resolver."),
    row("services.*.dns_opt", A, PLAIN),
    row("services.*.dns_search", A, PLAIN),
    row("services.*.domainname", A, PLAIN),
    row("services.*.entrypoint", A, PLAIN),
    row("services.*.env_file", K(C::EnvFile), "Read by compose as root into the environment, with every variable of compose's process and the rendered .env at hand: only the literal .env, or it reads any host file into the container."),
    row("services.*.env_file[].path", A, "Judged by the env_file constraint."),
    row("services.*.env_file[].format", A, PLAIN),
    row("services.*.env_file[].required", A, PLAIN),
    row("services.*.environment", A, PLAIN),
    row("services.*.expose", A, PLAIN),
    row("services.*.extends", A, "Another service of the same file; the file form is refused below."),
    row("services.*.extends.service", A, "A service of the same file."),
    row("services.*.extends.file", R, "Reads another compose file at every pull, up and revert: what was checked would not be what runs."),
    row("services.*.external_links", P, "Links to containers outside the project: another env's processes."),
    row("services.*.extra_hosts", A, PLAIN),
    row("services.*.gpus", P, DEVICE),
    row("services.*.group_add", A, "Groups inside the container; host files are reachable only through allowed binds."),
    row("services.*.healthcheck", A, "The agent waits on it."),
    row("services.*.healthcheck.disable", A, PLAIN),
    row("services.*.healthcheck.interval", A, PLAIN),
    row("services.*.healthcheck.retries", A, PLAIN),
    row("services.*.healthcheck.test", A, PLAIN),
    row("services.*.healthcheck.timeout", A, PLAIN),
    row("services.*.healthcheck.start_period", A, PLAIN),
    row("services.*.healthcheck.start_interval", A, PLAIN),
    row("services.*.hostname", A, PLAIN),
    row("services.*.image", K(C::Image), "Pulled before every apply with this env's own credential; a local image ID proves nothing, and a registry on the box's loopback is spoken to in plain HTTP."),
    row("services.*.init", A, PLAIN),
    row("services.*.ipc", K(C::Namespace(&["private", "shareable", "none"])), "The host's or another container's IPC namespace is refused."),
    row("services.*.isolation", P, "Selects another isolation technology than the box's default."),
    row("services.*.label_file", K(C::EnvFile), "Read by compose as root into the labels, like env_file: only the literal .env."),
    row("services.*.labels", K(C::Labels), "compose's own labels decide which project a container belongs to; a reverse proxy's routing labels (traefik rules, caddy addresses) may name only the env's own hosts."),
    row("services.*.links", A, "Links between the project's own services."),
    row("services.*.logging", A, "Log options of the service's own containers."),
    row("services.*.logging.driver", K(C::LogDriver), "Drivers that write on the box only; a plugin driver is code on the host."),
    row("services.*.logging.options", A, PLAIN),
    row("services.*.mac_address", A, PLAIN),
    row("services.*.mem_limit", A, LIMIT),
    row("services.*.mem_reservation", A, LIMIT),
    row("services.*.mem_swappiness", A, LIMIT),
    row("services.*.memswap_limit", A, LIMIT),
    row("services.*.models", R, "AI model runner integration: not something a box runs."),
    row("services.*.network_mode", K(C::Namespace(&["none"])), "Host networking, another container's network and docker's shared default bridge are refused."),
    row("services.*.networks", A, "The project's own networks."),
    row("services.*.networks.*", A, "One network attachment."),
    row("services.*.networks.*.aliases", A, PLAIN),
    row("services.*.networks.*.interface_name", A, PLAIN),
    row("services.*.networks.*.ipv4_address", A, PLAIN),
    row("services.*.networks.*.ipv6_address", A, PLAIN),
    row("services.*.networks.*.link_local_ips", A, PLAIN),
    row("services.*.networks.*.mac_address", A, PLAIN),
    row("services.*.networks.*.driver_opts", P, "Driver options can join host interfaces."),
    row("services.*.networks.*.priority", A, PLAIN),
    row("services.*.networks.*.gw_priority", A, PLAIN),
    row("services.*.oom_kill_disable", K(C::False), "A container the OOM killer may not kill takes the host down instead."),
    row("services.*.oom_score_adj", K(C::OomScoreAdj), "A negative score makes the kernel kill host processes first."),
    row("services.*.pid", K(C::Namespace(&[])), "The host's or another container's PID namespace is refused."),
    row("services.*.pids_limit", A, LIMIT),
    row("services.*.platform", A, PLAIN),
    row("services.*.ports", A, "Published ports are how a backend is reached."),
    row("services.*.ports[].name", A, PLAIN),
    row("services.*.ports[].mode", A, PLAIN),
    row("services.*.ports[].host_ip", A, PLAIN),
    row("services.*.ports[].target", A, PLAIN),
    row("services.*.ports[].published", A, PLAIN),
    row("services.*.ports[].protocol", A, PLAIN),
    row("services.*.ports[].app_protocol", A, PLAIN),
    row("services.*.post_start", A, HOOK),
    row("services.*.post_start[].command", A, HOOK),
    row("services.*.post_start[].user", A, HOOK),
    row("services.*.post_start[].privileged", K(C::False), "A privileged hook is a privileged process."),
    row("services.*.post_start[].working_dir", A, HOOK),
    row("services.*.post_start[].environment", A, HOOK),
    row("services.*.pre_stop", A, HOOK),
    row("services.*.pre_stop[].command", A, HOOK),
    row("services.*.pre_stop[].user", A, HOOK),
    row("services.*.pre_stop[].privileged", K(C::False), "A privileged hook is a privileged process."),
    row("services.*.pre_stop[].working_dir", A, HOOK),
    row("services.*.pre_stop[].environment", A, HOOK),
    row("services.*.privileged", K(C::False), "A privileged container is root on the host."),
    row("services.*.profiles", A, PLAIN),
    row("services.*.provider", P, "Delegates the service to a provider plugin: a program on the host."),
    row("services.*.pull_policy", K(C::PullPolicy), "`build` is refused with build itself."),
    row("services.*.pull_refresh_after", A, PLAIN),
    row("services.*.read_only", A, PLAIN),
    row("services.*.restart", A, PLAIN),
    row("services.*.runtime", P, "Selects another container runtime than the box's default."),
    row("services.*.scale", A, PLAIN),
    row("services.*.secrets", A, "Grants the service a secret of this project."),
    row("services.*.secrets[].source", A, PLAIN),
    row("services.*.secrets[].target", A, PLAIN),
    row("services.*.secrets[].uid", A, PLAIN),
    row("services.*.secrets[].gid", A, PLAIN),
    row("services.*.secrets[].mode", A, PLAIN),
    row("services.*.security_opt", K(C::SecurityOpt), "Only no-new-privileges; seccomp, apparmor, label and systempaths options lift the container's confinement."),
    row("services.*.shm_size", A, LIMIT),
    row("services.*.stdin_open", A, PLAIN),
    row("services.*.stop_grace_period", A, PLAIN),
    row("services.*.stop_signal", A, PLAIN),
    row("services.*.storage_opt", A, LIMIT),
    row("services.*.sysctls", K(C::Sysctls), "Only the sysctls docker namespaces per container: net.*, and the IPC ones (kernel.msgmax, kernel.msgmnb, kernel.msgmni, kernel.sem, kernel.shmall, kernel.shmmax, kernel.shmmni, kernel.shm_rmid_forced, fs.mqueue.*)."),
    row("services.*.tmpfs", A, "Memory-backed scratch space inside the container."),
    row("services.*.tty", A, PLAIN),
    row("services.*.ulimits", K(C::Ulimits), "rtprio and rttime let a container starve the host; memlock is allowed under the service's memory limit, which bounds locked pages too; nproc, sigpending and msgqueue count per host uid across every env, so such a limit binds only the container asking for it: each applies up to its budget key (max_ulimit_nproc, max_ulimit_sigpending, max_ulimit_msgqueue)."),
    row("services.*.use_api_socket", K(C::False), "The docker API socket is root on the host."),
    row("services.*.user", A, PLAIN),
    row("services.*.userns_mode", P, "Leaves the box's user namespace setup."),
    row("services.*.uts", K(C::Namespace(&[])), "The host's UTS namespace is refused."),
    row("services.*.volumes", K(C::ServiceVolumes), "Binds only inside the release dir (read-only over the release's own files, nothing below another writable bind, no links) or on the box's allowed_binds; named volumes of this project; tmpfs."),
    row("services.*.volumes[].type", A, "Judged by the volumes constraint."),
    row("services.*.volumes[].source", A, "Judged by the volumes constraint."),
    row("services.*.volumes[].target", A, PLAIN),
    row("services.*.volumes[].read_only", A, "Judged by the volumes constraint."),
    row("services.*.volumes[].consistency", A, PLAIN),
    row("services.*.volumes[].bind", A, "Bind options, judged by the volumes constraint."),
    row("services.*.volumes[].bind.propagation", A, "Judged by the volumes constraint: only private."),
    row("services.*.volumes[].bind.create_host_path", A, PLAIN),
    row("services.*.volumes[].bind.recursive", A, "Judged by the volumes constraint: not writable."),
    row("services.*.volumes[].bind.selinux", A, "Judged by the volumes constraint: relabels only inside the release dir."),
    row("services.*.volumes[].volume", A, PLAIN),
    row("services.*.volumes[].volume.labels", A, PLAIN),
    row("services.*.volumes[].volume.nocopy", A, PLAIN),
    row("services.*.volumes[].volume.subpath", A, "Judged by the volumes constraint: stays inside the volume."),
    row("services.*.volumes[].tmpfs", A, PLAIN),
    row("services.*.volumes[].tmpfs.size", A, PLAIN),
    row("services.*.volumes[].tmpfs.mode", A, PLAIN),
    row("services.*.volumes[].image", A, "Judged by the volumes constraint: image mounts are refused."),
    row("services.*.volumes[].image.subpath", A, PLAIN),
    row("services.*.volumes_from", K(C::VolumesFrom), "Only the project's own services; another container's volumes are another env's data."),
    row("services.*.working_dir", A, PLAIN),
    // Networks.
    row("networks.*.name", K(C::OwnName), "Another name would join another env's network."),
    row("networks.*.driver", K(C::NetworkDriver), "Other drivers (host, macvlan, ipvlan, overlay) reach the host's networks."),
    row("networks.*.driver_opts", P, "Bridge options can take over host interfaces."),
    row("networks.*.ipam", K(C::Empty), "A chosen subnet can capture the host's traffic to that range."),
    row("networks.*.external", K(C::ExternalNetwork), "Only networks on the box's allowed_external_networks; an external `host` network is host networking."),
    row("networks.*.external.name", A, "Judged by the external constraint."),
    row("networks.*.internal", A, PLAIN),
    row("networks.*.enable_ipv4", A, PLAIN),
    row("networks.*.enable_ipv6", A, PLAIN),
    row("networks.*.attachable", A, PLAIN),
    row("networks.*.labels", K(C::Labels), "compose's own labels decide which project a network belongs to."),
    // Volumes.
    row("volumes.*.name", K(C::OwnName), "Another name would open another env's volume."),
    row("volumes.*.driver", K(C::VolumeDriver), "Other drivers are plugins: code and mounts on the host."),
    row("volumes.*.driver_opts", K(C::VolumeDriverOpts), "Only `type: tmpfs` (device `tmpfs`, size/mode/uid/gid/inode options): memory, not a host path. Other options mount host paths, block devices, proc or overlays."),
    row("volumes.*.external", K(C::ExternalVolume), "Only volumes on the box's allowed_external_volumes."),
    row("volumes.*.external.name", A, "Judged by the external constraint."),
    row("volumes.*.labels", K(C::Labels), "compose's own labels decide which project a volume belongs to."),
    // Secrets and configs.
    row("secrets.*.name", A, PLAIN),
    row("secrets.*.environment", A, "Taken from the release's own .env."),
    row("secrets.*.file", K(C::InRelease), "compose binds the file into the container: only a literal path inside the release dir, not a link, not below a writable bind."),
    row("secrets.*.external", R, "Swarm secrets; compose cannot use them."),
    row("secrets.*.labels", A, PLAIN),
    row("secrets.*.driver", R, "Swarm secret drivers; compose cannot use them."),
    row("secrets.*.driver_opts", R, "Swarm secret drivers; compose cannot use them."),
    row("secrets.*.template_driver", R, "Swarm templating; compose cannot use it."),
    row("configs.*.name", A, PLAIN),
    row("configs.*.content", A, "Inline content, part of the checked file."),
    row("configs.*.environment", A, "Taken from the release's own .env."),
    row("configs.*.file", K(C::InRelease), "compose binds the file into the container: only a literal path inside the release dir, not a link, not below a writable bind."),
    row("configs.*.external", R, "Swarm configs; compose cannot use them."),
    row("configs.*.labels", A, PLAIN),
    row("configs.*.template_driver", R, "Swarm templating; compose cannot use it."),
];

pub(super) struct Index {
    pub(super) rules: BTreeMap<&'static str, Rule>,
    /// Paths that have rows below them (`a.b` or `a[].b`).
    pub(super) parents: BTreeSet<String>,
}

pub(super) fn index() -> &'static Index {
    static INDEX: OnceLock<Index> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut rules = BTreeMap::new();
        let mut parents = BTreeSet::new();
        for r in TABLE {
            rules.insert(r.path, r.rule);
            let mut p = r.path;
            while let Some(cut) = p.rfind(['.', '[']) {
                p = &p[..cut];
                parents.insert(p.to_string());
            }
        }
        Index { rules, parents }
    })
}

/// The rule of a key path, if the table has one.
#[must_use]
pub fn rule_of(path: &str) -> Option<Rule> {
    index().rules.get(path).copied()
}
