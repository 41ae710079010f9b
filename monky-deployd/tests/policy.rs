//! The compose policy at the agent's level: a corpus of hostile compose files, one per way a
//! bundle could take the box, each refused by `bundle check`, by a real tick (with the real
//! `docker compose config` behind the stub), and by compose's own model on its own; a corpus of
//! realistic backends that still applies; and values from secrets that only compose's model
//! shows.

use std::path::{Path, PathBuf};

use monky_agent_proto::ReportResult;
use serde_json::json;

use crate::util::*;

const PROJECT: &str = "monky-env-qa-02";

/// One hostile compose file: the body under `services.web` (or a whole file), the code and the
/// names the refusal must carry.
pub(crate) struct Case {
    pub(crate) name: &'static str,
    /// Lines under `services.web` (indented by the harness), then top-level keys; or a whole
    /// file when it has a `services:` line.
    compose: &'static str,
    code: &'static str,
    names: &'static str,
    /// Whether compose's model alone must show it too. False only where compose consumes the
    /// key while building the model (an `env_file` is read into `environment`; `-p` overrides
    /// `name`): the file check before the lease is the guard there.
    model: bool,
}

pub(crate) const fn case(
    name: &'static str,
    compose: &'static str,
    code: &'static str,
    names: &'static str,
) -> Case {
    Case {
        name,
        compose,
        code,
        names,
        model: true,
    }
}

pub(crate) const fn file_only(
    name: &'static str,
    compose: &'static str,
    code: &'static str,
    names: &'static str,
) -> Case {
    Case {
        model: false,
        ..case(name, compose, code, names)
    }
}

pub(crate) const PR: &str = "PRIVILEGED_REFUSED";
const BI: &str = "BUNDLE_INVALID";
const NC: &str = "BUNDLE_NONCONFORMING";

/// The web service every whole-file case starts from.
const WEB: &str = "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n";

/// The box's own registry in every world (`registry_host`).
const BOX_REGISTRY: &str = "127.0.0.1:5000";

/// A whole file whose web service runs `image`.
macro_rules! image {
    ($image:literal) => {
        concat!("services:\n  web:\n    image: ", $image, "\n")
    };
}

#[rustfmt::skip]
const CASES: &[Case] = &[
    // Capabilities and confinement.
    case("cap-sys-module", "cap_add: [SYS_MODULE]", PR, "web: cap_add SYS_MODULE"),
    case("cap-dac-read-search", "cap_add: [DAC_READ_SEARCH]", PR, "web: cap_add DAC_READ_SEARCH"),
    case("cap-sys-ptrace", "cap_add: [SYS_PTRACE]", PR, "web: cap_add SYS_PTRACE"),
    case("cap-sys-rawio", "cap_add: [SYS_RAWIO]", PR, "web: cap_add SYS_RAWIO"),
    case("cap-bpf", "cap_add: [BPF]", PR, "web: cap_add BPF"),
    case("cap-perfmon", "cap_add: [PERFMON]", PR, "web: cap_add PERFMON"),
    case("cap-net-admin", "cap_add: [NET_ADMIN]", PR, "web: cap_add NET_ADMIN"),
    case("cap-sys-admin-lowercase", "cap_add: [cap_sys_admin]", PR, "web: cap_add SYS_ADMIN"),
    case("cap-all", "cap_add: [ALL]", PR, "web: cap_add ALL"),
    case("cap-sys-boot-among-defaults", "cap_add: [CHOWN, SYS_BOOT]", PR, "web: cap_add SYS_BOOT"),
    case("seccomp-unconfined", "security_opt: [seccomp=unconfined]", PR, "web: security_opt seccomp=unconfined"),
    case("apparmor-unconfined", "security_opt: [apparmor=unconfined]", PR, "web: security_opt apparmor=unconfined"),
    case("label-disable", "security_opt: [label=disable]", PR, "web: security_opt label=disable"),
    case("systempaths-unconfined", "security_opt: [systempaths=unconfined]", PR, "web: security_opt systempaths=unconfined"),
    case("device-cgroup-rules", "device_cgroup_rules: [\"a *:* rwm\"]", PR, "web: device_cgroup_rules"),
    case("cgroup-parent", "cgroup_parent: system.slice", PR, "web: cgroup_parent"),
    case("privileged", "privileged: true", PR, "web: privileged"),
    case("privileged-string", "privileged: \"true\"", PR, "web: privileged"),
    case("devices", "devices: [\"/dev/mem:/dev/mem\"]", PR, "web: devices"),
    case("gpu-request", "deploy:\n  resources:\n    reservations:\n      devices:\n        - driver: nvidia\n          capabilities: [gpu]", PR, "web: deploy.resources.reservations.devices"),
    case("runtime", "runtime: runc", PR, "web: runtime"),
    case("userns-host", "userns_mode: host", PR, "web: userns_mode"),
    case("isolation", "isolation: default", PR, "web: isolation"),
    case("sysctl-kernel-list", "sysctls: [kernel.panic=1]", PR, "web: sysctls kernel.panic"),
    case("sysctl-kernel-map", "sysctls:\n  kernel.randomize_va_space: 0", PR, "web: sysctls kernel.randomize_va_space"),
    case("oom-kill-disable", "oom_kill_disable: true", PR, "web: oom_kill_disable"),
    case("oom-score-negative", "oom_score_adj: -999", PR, "web: oom_score_adj -999"),
    case("ulimit-rtprio", "ulimits:\n  rtprio: 99", PR, "web: ulimits rtprio"),
    case("realtime-runtime", "cpu_rt_runtime: 950000", PR, "web: cpu_rt_runtime"),
    case("log-driver-plugin", "logging:\n  driver: fluentd", PR, "web: logging.driver fluentd"),
    // Host paths, bound directly.
    case("bind-etc", "volumes: [\"/etc:/host-etc\"]", PR, "web: volumes /etc"),
    case("bind-sys", "volumes: [\"/sys:/host-sys\"]", PR, "web: volumes /sys"),
    case("bind-dev", "volumes: [\"/dev:/host-dev\"]", PR, "web: volumes /dev"),
    case("bind-root-home", "volumes: [\"/root:/r\"]", PR, "web: volumes /root"),
    case("bind-usr-local-bin", "volumes: [\"/usr/local/bin:/b\"]", PR, "web: volumes /usr/local/bin"),
    case("bind-agent-config", "volumes: [\"/etc/monky-deployd:/c:ro\"]", PR, "web: volumes /etc/monky-deployd"),
    case("bind-agent-state", "volumes: [\"/var/lib/monky-deployd:/s\"]", PR, "web: volumes /var/lib/monky-deployd"),
    case("bind-docker-data", "volumes: [\"/var/lib/docker:/d\"]", PR, "web: volumes /var/lib/docker"),
    case("bind-containerd-data", "volumes: [\"/var/lib/containerd:/d\"]", PR, "web: volumes /var/lib/containerd"),
    case("bind-containerd-socket", "volumes: [\"/run/containerd/containerd.sock:/c.sock\"]", PR, "web: volumes /run/containerd/containerd.sock"),
    case("bind-docker-socket", "volumes: [\"/var/run/docker.sock:/var/run/docker.sock\"]", PR, "web: volumes /var/run/docker.sock"),
    case("bind-dbus", "volumes: [\"/run/dbus/system_bus_socket:/bus\"]", PR, "web: volumes /run/dbus/system_bus_socket"),
    case("bind-systemd-private", "volumes: [\"/run/systemd/private:/p\"]", PR, "web: volumes /run/systemd/private"),
    case("bind-root-read-only", "volumes: [\"/:/host:ro\"]", PR, "web: volumes /"),
    case("bind-proc-1-root", "volumes: [\"/proc/1/root:/h\"]", PR, "web: volumes /proc/1/root"),
    // The agent runs compose without HOME, so compose's model places `~` inside the release
    // dir; the file check refuses it anyway, as a compose with HOME would mean root's home.
    file_only("bind-home-tilde", "volumes: [\"~/.ssh:/k\"]", PR, "web: volumes ~/.ssh"),
    case("bind-localtime-writable", "volumes: [\"/etc/localtime:/etc/localtime\"]", PR, "web: volumes /etc/localtime"),
    case("bind-long-syntax", "volumes:\n  - type: bind\n    source: /etc\n    target: /e\n    read_only: true", PR, "web: volumes /etc"),
    case("bind-propagation-short", "volumes: [\"./data:/d:rshared\"]", PR, "web: volumes ./data propagation rshared"),
    // Host paths mounted by a volume driver.
    case("volume-bind-root", "volumes: [\"vol:/v\"]\nvolumes:\n  vol:\n    driver_opts: {type: none, o: bind, device: /}", PR, "volumes.vol: driver_opts"),
    case("volume-proc", "volumes: [\"vol:/v\"]\nvolumes:\n  vol:\n    driver_opts: {type: proc, device: proc}", PR, "volumes.vol: driver_opts"),
    case("volume-sysfs", "volumes: [\"vol:/v\"]\nvolumes:\n  vol:\n    driver_opts: {type: sysfs, device: sysfs}", PR, "volumes.vol: driver_opts"),
    case("volume-block-device", "volumes: [\"vol:/v\"]\nvolumes:\n  vol:\n    driver_opts: {type: ext4, device: /dev/sda1}", PR, "volumes.vol: driver_opts"),
    case("volume-overlay", "volumes: [\"vol:/v\"]\nvolumes:\n  vol:\n    driver_opts: {type: overlay, o: \"lowerdir=/,upperdir=/tmp/u,workdir=/tmp/w\", device: overlay}", PR, "volumes.vol: driver_opts"),
    case("volume-plugin-driver", "volumes: [\"vol:/v\"]\nvolumes:\n  vol:\n    driver: vieux/sshfs", PR, "volumes.vol: driver vieux/sshfs"),
    // Host files read in other ways.
    case("config-file-root", "configs: [c]\nconfigs:\n  c:\n    file: /", PR, "configs.c: file /"),
    case("config-file-shadow", "configs: [c]\nconfigs:\n  c:\n    file: /etc/shadow", PR, "configs.c: file /etc/shadow"),
    case("secret-file-token", "secrets: [s]\nsecrets:\n  s:\n    file: /var/lib/monky-deployd/bao.token", PR, "secrets.s: file /var/lib/monky-deployd/bao.token"),
    case("secret-file-climbs", "secrets: [s]\nsecrets:\n  s:\n    file: ../../bao.token", PR, "secrets.s: file ../../bao.token"),
    file_only("env-file-absolute", "env_file: /etc/os-release", PR, "web: env_file /etc/os-release"),
    file_only("env-file-climbs", "env_file: [.env, ../../../../etc/os-release]", PR, "web: env_file ../../../../etc/os-release"),
    case("build-context-root", "build: /", BI, "web: build"),
    case("build-additional-contexts", "build:\n  context: .\n  additional_contexts:\n    etc: /etc", BI, "web: build"),
    case("pull-policy-build", "pull_policy: build", BI, "web: pull_policy build"),
    // Other envs.
    case("pid-container", "pid: \"container:monky-env-other-db-1\"", PR, "web: pid container:monky-env-other-db-1"),
    case("ipc-container", "ipc: \"container:monky-env-other-db-1\"", PR, "web: ipc container:monky-env-other-db-1"),
    case("network-container", "network_mode: \"container:monky-env-other-db-1\"", PR, "web: network_mode container:monky-env-other-db-1"),
    case("network-host", "network_mode: host", PR, "web: network_mode host"),
    case("network-default-bridge", "network_mode: bridge", PR, "web: network_mode bridge"),
    case("pid-host", "pid: host", PR, "web: pid host"),
    case("ipc-host", "ipc: host", PR, "web: ipc host"),
    case("uts-host", "uts: host", PR, "web: uts host"),
    case("cgroup-host", "cgroup: host", PR, "web: cgroup host"),
    case("volumes-from-container", "volumes_from: [\"container:monky-env-other-db-1\"]", PR, "web: volumes_from container:monky-env-other-db-1"),
    case("external-volume", "volumes: [\"pg:/pg\"]\nvolumes:\n  pg:\n    external: true\n    name: monky-env-other_pgdata", PR, "volumes.pg: external monky-env-other_pgdata"),
    case("external-volume-by-key", "volumes: [\"shared:/s\"]\nvolumes:\n  shared:\n    external: true", PR, "volumes.shared: external shared"),
    case("external-network-host", "networks: [h]\nnetworks:\n  h:\n    external: true\n    name: host", PR, "networks.h: external host"),
    case("external-network-other", "networks: [o]\nnetworks:\n  o:\n    external: true\n    name: monky-env-other_default", PR, "networks.o: external monky-env-other_default"),
    case("volume-named-like-another-env", "volumes: [\"pg:/pg\"]\nvolumes:\n  pg:\n    name: monky-env-other_pgdata", NC, "volumes.pg: name monky-env-other_pgdata (accepted: monky-env-qa-02_monky-env-other-pgdata)"),
    case("network-named-like-another-env", "networks: [n]\nnetworks:\n  n:\n    name: monky-env-other_default", NC, "networks.n: name monky-env-other_default (accepted: monky-env-qa-02_monky-env-other-default)"),
    case("network-macvlan", "networks: [n]\nnetworks:\n  n:\n    driver: macvlan", PR, "networks.n: driver macvlan"),
    case("network-bridge-options", "networks: [n]\nnetworks:\n  n:\n    driver_opts:\n      com.docker.network.bridge.name: docker0", PR, "networks.n: driver_opts"),
    case("network-subnet", "networks: [n]\nnetworks:\n  n:\n    ipam:\n      config: [{subnet: 10.0.0.0/8}]", PR, "networks.n: ipam"),
    case("external-links", "external_links: [monky-env-other-db-1]", PR, "web: external_links"),
    // A top-level `name` is no longer a case: compose ignores it under the agent's `-p`.
    case("project-label-on-network", "networks: [n]\nnetworks:\n  n:\n    labels: {com.docker.compose.project: monky-env-other}", BI, "networks.n: labels com.docker.compose.project"),
    case("container-name", "container_name: monky-env-other-web-1", NC, "web: container_name monky-env-other-web-1 (accepted: monky-env-qa-02-monky-env-other-web)"),
    case("compose-labels", "labels:\n  com.docker.compose.project: monky-env-other", BI, "web: labels com.docker.compose.project"),
    // Files outside the bundle, re-read at every pull, up and revert.
    case("include-relative", "include: [../other/docker-compose.yml]\nservices:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n", BI, "include"),
    case("include-absolute", "include:\n  - path: /etc/monky/other.yml\nservices:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n", BI, "include"),
    case("extends-file-absolute", "extends:\n  service: web\n  file: /etc/monky/other.yml", BI, "web: extends.file"),
    case("extends-file-relative", "extends:\n  service: web\n  file: ../other/docker-compose.yml", BI, "web: extends.file"),
    // The release's own files, writable by its containers.
    case("bind-release-dir", "volumes: [\".:/cfg\"]", PR, "web: volumes . writable over the release's own files"),
    case("bind-release-dir-long", "volumes:\n  - type: bind\n    source: .\n    target: /cfg", PR, "web: volumes . writable over the release's own files"),
    case("bind-compose-file", "volumes: [\"./docker-compose.yml:/c.yml\"]", PR, "web: volumes ./docker-compose.yml writable over the release's own files"),
    case("bind-env", "volumes: [\"./.env:/e\"]", PR, "web: volumes ./.env writable over the release's own files"),
    case("bind-bundle-json", "volumes: [\"./bundle.json:/b.json:rw\"]", PR, "web: volumes ./bundle.json writable over the release's own files"),
    case("bind-back-into-release", "volumes: [\"./data/..:/cfg\"]", PR, "web: volumes ./data/.. writable over the release's own files"),
    case("bind-out-of-release", "volumes: [\"../../..:/up\"]", PR, "web: volumes ../../.."),
    // Keys the table does not know: refused, never waved through.
    case("unknown-service-key", "frobnicate: true", BI, "web: unknown key frobnicate"),
    case("unknown-top-level-key", "x-ok: 1\nfrobnicate: true\nservices:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n", BI, "unknown key frobnicate"),
    case("unknown-nested-key", "deploy:\n  resources:\n    limits:\n      gpus: 1", BI, "web: unknown key deploy.resources.limits.gpus"),
    case("develop-watch", "develop:\n  watch:\n    - path: /\n      action: sync\n      target: /host", BI, "web: develop"),
    // Images this env cannot prove its own, and bundle fields that point dockerd at the box.
    case("image-local-id", image!("\"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\""), PR, "web: image local image ID: sha256:9f86d081884c"),
    case("image-local-id-upper", image!("\"SHA256:9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08\""), PR, "web: image local image ID: "),
    case("image-id-prefix", image!("\"9f86d081884c\""), PR, "web: image image ID prefix: 9f86d081884c"),
    case("image-id-prefix-short", image!("beef"), PR, "web: image image ID prefix: beef"),
    case("image-loopback-registry", image!("127.0.0.1:5001/monky/web:1"), PR, "web: image registry on loopback: 127.0.0.1:5001/monky/web:1"),
    case("image-loopback-registry-no-port", image!("127.0.0.1/monky/web:1"), PR, "web: image registry on loopback: "),
    case("image-loopback-other-address", image!("127.0.1.1:5000/monky/web:1"), PR, "web: image registry on loopback: "),
    case("image-localhost-registry", image!("localhost:5000/monky/web:1"), PR, "web: image registry on loopback: localhost:5000/monky/web:1"),
    case("image-localhost-capitals", image!("LocalHost:5000/monky/web:1"), PR, "web: image registry on loopback: LocalHost:5000/monky/web:1"),
    case("image-localhost-subdomain", image!("registry.localhost:5000/monky/web:1"), PR, "web: image registry on loopback: "),
    case("image-ipv6-loopback", image!("\"[::1]:5000/monky/web:1\""), PR, "web: image registry on loopback: "),
    case("image-unspecified-address", image!("0.0.0.0:5000/monky/web:1"), PR, "web: image registry on loopback: "),
    case("image-loopback-by-digest", image!("\"127.0.0.1:5001/monky/web@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\""), PR, "web: image registry on loopback: "),
    case("image-mapped-v6-loopback", image!("\"[::ffff:127.0.0.1]:5000/monky/web:1\""), PR, "web: image registry on loopback: "),
    case("image-localhost-trailing-dot", image!("localhost.:5000/monky/web:1"), PR, "web: image registry on loopback: localhost.:5000/monky/web:1"),
    case("image-short-ip", image!("127.1:5000/monky/web:1"), PR, "web: image registry on loopback: 127.1:5000/monky/web:1"),
    case("image-decimal-ip", image!("2130706433:5000/monky/web:1"), PR, "web: image registry on loopback: 2130706433:5000"),
    case("image-hex-ip", image!("0x7f000001:5000/monky/web:1"), PR, "web: image registry on loopback: 0x7f000001:5000"),
    case("image-zero-host", image!("0:5000/monky/web:1"), PR, "web: image registry on loopback: 0:5000/monky/web:1"),
    case("image-ipv6-loopback-long", image!("\"[0:0:0:0:0:0:0:1]:5000/monky/web:1\""), PR, "web: image registry on loopback: "),
    case("image-ipv6-unspecified", image!("\"[::]:5000/monky/web:1\""), PR, "web: image registry on loopback: "),
    case("image-mapped-v6-loopback-hex", image!("\"[::ffff:7f00:1]:5000/monky/web:1\""), PR, "web: image registry on loopback: "),
    case("image-link-local-metadata", image!("169.254.169.254/monky/web:1"), PR, "web: image registry on loopback: 169.254.169.254/monky/web:1"),
    case("image-ipv6-link-local", image!("\"[fe80::1]:5000/monky/web:1\""), PR, "web: image registry on loopback: "),
    case("dns-loopback", "dns: 127.0.0.1", PR, "web: dns 127.0.0.1"),
    case("dns-mapped-v6-loopback", "dns: [\"::ffff:127.0.0.1\"]", PR, "web: dns ::ffff:127.0.0.1"),
    case("dns-loopback-top", "dns: [127.255.255.254]", PR, "web: dns 127.255.255.254"),
    case("dns-loopback-in-list", "dns: [192.0.2.53, 127.0.0.53]", PR, "web: dns 127.0.0.53"),
    case("dns-ipv6-loopback", "dns: [\"::1\"]", PR, "web: dns ::1"),
    case("dns-unspecified", "dns: [0.0.0.0]", PR, "web: dns 0.0.0.0"),
    case("blkio-device-read-bps", "blkio_config:\n  device_read_bps:\n    - path: /dev/sda\n      rate: 1mb", PR, "web: blkio_config.device_read_bps"),
    case("blkio-device-read-iops", "blkio_config:\n  device_read_iops:\n    - path: /etc/shadow\n      rate: 100", PR, "web: blkio_config.device_read_iops"),
    case("blkio-device-write-bps", "blkio_config:\n  device_write_bps:\n    - path: /dev/nvme0n1\n      rate: 1mb", PR, "web: blkio_config.device_write_bps"),
    case("blkio-device-write-iops", "blkio_config:\n  device_write_iops:\n    - path: /root/.ssh/id_rsa\n      rate: 100", PR, "web: blkio_config.device_write_iops"),
    case("blkio-weight-device", "blkio_config:\n  weight_device:\n    - path: /dev/sda\n      weight: 400", PR, "web: blkio_config.weight_device"),
];

/// The compose file of a case.
fn compose_of(c: &Case) -> String {
    if c.compose.lines().any(|l| l.starts_with("services:")) {
        return c.compose.to_string();
    }
    // Lines go under the service until a bare `volumes:` (networks, configs, secrets) follows
    // the service's own use of that key: from there on, the lines are top-level.
    let mut out = String::from(WEB);
    let mut top = false;
    let mut used: Vec<&str> = Vec::new();
    for line in c.compose.lines() {
        if let Some((key, _)) = line.split_once(':')
            && !line.starts_with(' ')
        {
            if line == format!("{key}:") && used.contains(&key) {
                top = true;
            }
            used.push(key);
        }
        if top {
            out.push_str(line);
        } else {
            out.push_str("    ");
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

fn bundle_of(c: &Case) -> TestBundle {
    TestBundle {
        compose: compose_of(c),
        ..TestBundle::default()
    }
}

/// The real docker CLI; the corpus needs real compose (not the engine).
pub(crate) fn docker() -> Option<PathBuf> {
    crate::e2e::real_docker_cli()
}

pub(crate) fn write_dir(dir: &Path, b: &TestBundle) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("docker-compose.yml"), &b.compose).unwrap();
    std::fs::write(dir.join(".env.template"), &b.env_template).unwrap();
    std::fs::write(dir.join("secrets.manifest.json"), b.manifest.to_string()).unwrap();
    std::fs::write(dir.join("bundle.json"), b.meta.to_string()).unwrap();
}

/// `bundle check` of `b`, written out to `<world>/<rel>`, with the real docker on PATH, as the
/// world's box judges it (its config: the defaults, and its own registry on loopback).
pub(crate) fn bundle_check(w: &World, docker: &Path, rel: &str, b: &TestBundle) -> Run {
    let dir = w.path(rel);
    write_dir(&dir, b);
    let path = format!("{}:/usr/bin:/bin", docker.parent().unwrap().display());
    // The world's config with the real docker in place of the stub.
    let config = w.path("bundle-check-config.yaml");
    let text: String = std::fs::read_to_string(w.config_path())
        .unwrap()
        .lines()
        .map(|l| match l.starts_with("docker_bin:") {
            true => format!("docker_bin: {}\n", docker.display()),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&config, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monky-deployd"))
        .arg("--config")
        .arg(&config)
        .args(["bundle", "check"])
        .arg(&dir)
        .args(["--env", ENV])
        .env("PATH", path)
        .output()
        .unwrap();
    Run(out)
}

/// `bundle check` with the real docker on PATH: exit 1, a `FAIL CODE: ...names...` line.
pub(crate) fn through_bundle_check(w: &World, docker: &Path, c: &Case) {
    let run = bundle_check(w, docker, &format!("bundles/{}", c.name), &bundle_of(c));
    assert_eq!(
        run.code(),
        1,
        "{}: {}{}",
        c.name,
        run.stdout(),
        run.stderr()
    );
    let want = format!("FAIL {}: ", c.code);
    assert!(
        run.stdout()
            .lines()
            .any(|l| l.starts_with(&want) && l.contains(c.names)),
        "{}: wanted {want}...{} in\n{}{}",
        c.name,
        c.names,
        run.stdout(),
        run.stderr()
    );
}

/// A real tick (compose's `config` is the real one behind the stub): exit 1, a failed report
/// with the code and the names, no pull, no up, nothing promoted.
pub(crate) fn through_a_tick(w: &World, c: &Case) {
    w.clear_stub();
    std::fs::remove_file(w.stub_dir().join("calls.log")).ok();
    w.stub("REAL_COMPOSE", docker().unwrap().to_str().unwrap());
    w.publish(&bundle_of(c));
    // Past tenancy's checkin rate bucket: one tick a minute, as on a box.
    w.tenancy.advance_clock(std::time::Duration::from_secs(60));
    let run = w.tick();
    run.expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some(&format!("{}: ", c.code)));
    let detail = r.detail.clone().unwrap_or_default();
    assert!(detail.contains(c.names), "{}: {detail}", c.name);
    let calls = w.docker_calls();
    assert!(
        !calls
            .iter()
            .any(|call| call.contains(" pull") || call.contains(" up ") || call.ends_with(" up")),
        "{}: {calls:#?}",
        c.name
    );
    assert_eq!(w.current_target(), None, "{}", c.name);
}

/// compose's own model of the case, built by the real `docker compose config` in a release
/// dir: refused by the policy, or not built at all. Either way nothing could start.
pub(crate) fn through_the_model(w: &World, docker: &Path, c: &Case) {
    let dir = w.path(&format!("releases/{}", c.name));
    let b = bundle_of(c);
    write_dir(&dir, &b);
    std::fs::write(dir.join(".env"), "").unwrap();
    let d = monky_compose::Docker::builder(docker)
        .docker_config(w.path("model-docker-config"))
        .build()
        .unwrap();
    let project = d.compose(
        PROJECT,
        &dir,
        &dir.join("docker-compose.yml"),
        &dir.join(".env"),
    );
    let verdict = match project.config_json() {
        Err(_) => "COMPOSE_CONFIG_FAILED".to_string(),
        Ok(model) => match monky_bundle::ComposePolicy::new(PROJECT)
            .registry_host(Some(BOX_REGISTRY))
            .check_model(model, &b.compose, &dir, &|p| std::fs::read_link(p).ok())
        {
            Ok(()) => "ok".to_string(),
            Err(r) => r.to_string(),
        },
    };
    if c.model {
        assert!(
            verdict.starts_with(&format!("{}: ", c.code)) || verdict == "COMPOSE_CONFIG_FAILED",
            "{}: compose's model gave {verdict}",
            c.name
        );
    }
}

/// Each of `cases` that `filter` keeps, through `bundle check`, a tick and compose's model, in
/// one world; none of them may lead to a secret read.
pub(crate) fn check_cases(cases: &[Case], filter: impl Fn(&Case) -> bool) {
    let Some(docker) = docker() else { return };
    let w = World::new();
    w.stage_grant();
    let mut n = 0;
    for c in cases.iter().filter(|c| filter(c)) {
        through_bundle_check(&w, &docker, c);
        through_a_tick(&w, c);
        through_the_model(&w, &docker, c);
        n += 1;
    }
    assert!(n > 0);
    // Refused before the lease: no secret was ever read.
    assert!(
        w.bao
            .agent_requests()
            .iter()
            .all(|r| !r.path.contains("/data/")),
        "a hostile bundle led to a secret read"
    );
}

#[test]
fn the_corpus_is_large_and_its_names_are_unique() {
    assert!(CASES.len() >= 80, "{} cases", CASES.len());
    let names: std::collections::BTreeSet<&str> = CASES.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), CASES.len());
}

/// Which cases belong to a class, by name.
type Filter = fn(&Case) -> bool;

/// The corpus in classes, each a filter on the case names; every class is one test below.
const CLASSES: &[(&str, Filter)] = &[
    ("capabilities and confinement", |c| {
        prefixed(
            c,
            &[
                "cap-",
                "seccomp",
                "apparmor",
                "label-",
                "systempaths",
                "device",
                "cgroup-parent",
                "privileged",
                "gpu",
                "runtime",
                "userns",
                "isolation",
                "sysctl",
                "oom",
                "ulimit",
                "realtime",
                "log-",
            ],
        )
    }),
    ("host paths", |c| {
        c.name.starts_with("bind-") && !writes_the_release(c) || c.name.starts_with("volume-")
    }),
    ("host files read other ways", |c| {
        prefixed(
            c,
            &["config-", "secret-", "env-file", "build", "pull-policy"],
        )
    }),
    ("other envs", |c| {
        prefixed(
            c,
            &[
                "pid-",
                "ipc-",
                "network-",
                "uts-",
                "cgroup-host",
                "volumes-from",
                "external-",
                "project-",
                "container-",
                "compose-labels",
            ],
        )
    }),
    ("images and dockerd", |c| {
        prefixed(c, &["image-", "dns-", "blkio-"])
    }),
    ("files outside the bundle and unknown keys", |c| {
        prefixed(c, &["include-", "extends-", "unknown-", "develop"])
    }),
    ("a release writing its own files", writes_the_release),
];

fn prefixed(c: &Case, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| c.name.starts_with(p))
}

fn writes_the_release(c: &Case) -> bool {
    c.name.contains("release")
        || ["bind-compose-file", "bind-env", "bind-bundle-json"].contains(&c.name)
}

/// Every case of the class named `class` goes through [`check_cases`].
fn check_class(class: &str) {
    let (_, filter) = CLASSES
        .iter()
        .find(|(name, _)| *name == class)
        .unwrap_or_else(|| panic!("no class {class:?}"));
    check_cases(CASES, filter);
}

#[test]
fn capabilities_and_confinement_are_refused() {
    check_class("capabilities and confinement");
}

#[test]
fn host_paths_are_refused() {
    check_class("host paths");
}

#[test]
fn host_files_read_other_ways_are_refused() {
    check_class("host files read other ways");
}

#[test]
fn other_envs_are_out_of_reach() {
    check_class("other envs");
}

#[test]
fn images_this_env_cannot_prove_and_fields_that_point_dockerd_at_the_box_are_refused() {
    check_class("images and dockerd");
}

#[test]
fn files_outside_the_bundle_and_unknown_keys_are_refused() {
    check_class("files outside the bundle and unknown keys");
}

#[test]
fn a_release_cannot_be_made_to_write_its_own_files() {
    check_class("a release writing its own files");
}

#[test]
fn every_case_belongs_to_a_class() {
    // The classes together cover the corpus, so no case is silently unchecked.
    for c in CASES {
        assert!(
            CLASSES.iter().any(|(_, f)| f(c)),
            "{} is in no class",
            c.name
        );
    }
}

// ---- values only compose's model shows ----------------------------------------------------------

/// A compose file whose danger comes from a secret's value: the file check cannot see it, the
/// tick refuses it on compose's model after the lease, names the variable and never the value.
struct FromSecret {
    body: &'static str,
    value: &'static str,
    names: &'static str,
}

#[rustfmt::skip]
const FROM_SECRET: &[FromSecret] = &[
    FromSecret { body: "privileged: ${HOSTILE:-false}", value: "true", names: "web: privileged" },
    FromSecret { body: "network_mode: ${HOSTILE:-none}", value: "host", names: "web: network_mode from ${HOSTILE}" },
    FromSecret { body: "cap_add: [\"${HOSTILE}\"]", value: "SYS_MODULE", names: "web: cap_add from ${HOSTILE}" },
    FromSecret { body: "volumes: [\"${HOSTILE:-./data}:/h\"]", value: "/etc/monky-deployd", names: "web: volumes from ${HOSTILE}" },
    FromSecret { body: "pid: ${HOSTILE:-}", value: "host", names: "web: pid from ${HOSTILE}" },
];

#[test]
fn values_from_secrets_are_judged_on_composes_model_and_named_by_variable() {
    let Some(docker) = docker() else { return };
    let w = World::new();
    w.stage_grant();
    for (n, case) in FROM_SECRET.iter().enumerate() {
        w.clear_stub();
        std::fs::remove_file(w.stub_dir().join("calls.log")).ok();
        w.stub("REAL_COMPOSE", docker.to_str().unwrap());
        let mut b = TestBundle {
            compose: format!("{WEB}    env_file: .env\n    {}\n", case.body),
            ..TestBundle::default()
        };
        b.manifest["entries"].as_array_mut().unwrap().push(json!({
            "var": "HOSTILE", "path": format!("monky/{ENV}/see/hostile{n}"), "kind": "supplied", "version": null}));
        b.env_template.push_str("HOSTILE=${HOSTILE}\n");
        w.bao.put_secret(ENV, &format!("hostile{n}"), case.value);
        // The file as the bundle carries it passes: only the secret makes it hostile.
        let policy = monky_bundle::ComposePolicy::new(PROJECT);
        assert!(
            policy
                .check_file(&b.compose, &|_| None, &["HOSTILE".to_string()].into())
                .is_ok(),
            "{}",
            case.body
        );
        w.publish(&b);
        w.tenancy.advance_clock(std::time::Duration::from_secs(60));
        let run = w.tick();
        run.expect(1);
        let r = w.last_report();
        assert_report(&r, ReportResult::Failed, Some("PRIVILEGED_REFUSED: "));
        let detail = r.detail.clone().unwrap_or_default();
        assert!(detail.contains(case.names), "{}: {detail}", case.body);
        if case.value.len() > 4 {
            assert!(
                !detail.contains(case.value),
                "{}: the value leaked: {detail}",
                case.body
            );
            assert!(
                !run.stderr().contains(case.value),
                "{}: the value leaked",
                case.body
            );
        }
        let calls = w.docker_calls();
        assert!(calls.iter().any(|c| c.contains(" config ")), "{calls:#?}");
        assert!(
            !calls
                .iter()
                .any(|c| c.contains(" pull") || c.ends_with(" up") || c.contains(" up ")),
            "{calls:#?}"
        );
        assert_eq!(w.current_target(), None);
        // The refusal waits out the backoff: the next tick reads no secret and says why.
        let kv_reads = || {
            w.bao
                .agent_requests()
                .iter()
                .filter(|r| r.path.contains("/data/"))
                .count()
        };
        let reads = kv_reads();
        w.tick().expect(1);
        assert_eq!(kv_reads(), reads, "{}: read the secrets again", case.body);
        let detail = w.last_report().detail.unwrap_or_default();
        assert!(
            detail.starts_with("PRIVILEGED_REFUSED: ") && detail.contains("next attempt"),
            "{detail}"
        );
    }
}

// ---- realistic backends still apply --------------------------------------------------------------

#[rustfmt::skip]
const BENIGN: &[&str] = &[
    // A web app with published ports, a named volume and a health check.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    env_file: .env\n    ports: [\"8080:80\", \"127.0.0.1:8443:443\"]\n    volumes: [appdata:/var/lib/app]\n    healthcheck:\n      test: [CMD, wget, -qO-, http://localhost/health]\n      interval: 10s\n      timeout: 3s\n      retries: 5\n      start_period: 20s\nvolumes:\n  appdata: {}\n",
    // Postgres and an API with depends_on on health, a relative read-only config bind.
    "services:\n  db:\n    image: postgres:16\n    env_file: .env\n    volumes: [pgdata:/var/lib/postgresql/data]\n    healthcheck: {test: [CMD-SHELL, pg_isready], interval: 5s}\n  api:\n    image: 127.0.0.1:5000/monky/api:3\n    env_file: .env\n    depends_on:\n      db: {condition: service_healthy}\n    volumes: [\"./conf/api.yml:/etc/api.yml:ro\"]\n    ports: [\"9000:9000\"]\nvolumes:\n  pgdata: {}\n",
    // Hardened: read-only root, tmpfs, no-new-privileges, capabilities dropped and one default back.
    "services:\n  web:\n    image: nginx:1.27\n    read_only: true\n    tmpfs: [/var/cache/nginx, /run]\n    security_opt: [\"no-new-privileges:true\"]\n    cap_drop: [ALL]\n    cap_add: [NET_BIND_SERVICE, CHOWN, SETUID, SETGID]\n    user: \"101:101\"\n",
    // Logging options and resource limits.
    "services:\n  worker:\n    image: 127.0.0.1:5000/monky/worker:7\n    logging:\n      driver: json-file\n      options: {max-size: 10m, max-file: \"3\"}\n    deploy:\n      resources:\n        limits: {cpus: \"1.5\", memory: 512M, pids: 256}\n        reservations: {cpus: \"0.25\", memory: 128M}\n      restart_policy: {condition: on-failure, max_attempts: 3}\n    shm_size: 64m\n    ulimits: {nofile: {soft: 4096, hard: 8192}}\n",
    // Profiles: a debug tool that only starts when asked.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n  adminer:\n    image: adminer:4\n    profiles: [debug]\n    ports: [\"127.0.0.1:8081:8080\"]\n",
    // Redis with a writable relative data dir and a journald log driver.
    "services:\n  redis:\n    image: redis:7\n    command: [redis-server, --appendonly, \"yes\"]\n    volumes: [\"./redis-data:/data\"]\n    logging: {driver: journald}\n    restart: unless-stopped\n",
    // A sidecar in the web service's network and IPC namespaces.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    ipc: shareable\n  metrics:\n    image: 127.0.0.1:5000/monky/exporter:1\n    network_mode: \"service:web\"\n    ipc: \"service:web\"\n    pid: \"service:web\"\n",
    // Project networks: a front and an internal back network, aliases and a fixed address.
    "services:\n  proxy:\n    image: caddy:2\n    ports: [\"8080:80\", \"8443:443\"]\n    networks: [front]\n  app:\n    image: 127.0.0.1:5000/monky/app:2\n    networks:\n      front: {aliases: [app.internal]}\n      back: {}\n  db:\n    image: mariadb:11\n    networks: [back]\nnetworks:\n  front: {}\n  back: {internal: true}\n",
    // The box's time zone, read-only, and net sysctls.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [\"/etc/localtime:/etc/localtime:ro\", \"/etc/timezone:/etc/timezone:ro\"]\n    sysctls: {net.core.somaxconn: 1024, net.ipv4.tcp_syncookies: 0}\n",
    // File-based configs and secrets from the release dir and .env.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    configs: [{source: motd, target: /etc/motd}]\n    secrets: [db_password]\nconfigs:\n  motd: {file: ./.env.template}\nsecrets:\n  db_password: {environment: POSTGRES_PASSWORD}\n",
    // Extensions and anchors shared between services.
    "x-common: &common\n  restart: always\n  logging: {driver: local}\n  env_file: .env\nservices:\n  a:\n    <<: *common\n    image: 127.0.0.1:5000/monky/a:1\n  b:\n    <<: *common\n    image: 127.0.0.1:5000/monky/b:1\n    extends: {service: a}\n",
    // Named volume options compose itself writes: labels, nocopy, subpath.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes:\n      - type: volume\n        source: data\n        target: /data\n        volume: {nocopy: true}\n      - type: tmpfs\n        target: /scratch\n        tmpfs: {size: 67108864}\nvolumes:\n  data:\n    labels: {io.monky.backup: daily}\n",
    // A fixed container name under the project's own name; init and stop settings.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    container_name: monky-env-qa-02-web\n    init: true\n    stop_grace_period: 30s\n    stop_signal: SIGQUIT\n    hostname: web\n    extra_hosts: [\"db.internal:10.1.2.3\"]\n    dns: [1.1.1.1]\n",
    // A one-shot migration the web waits for.
    "services:\n  migrate:\n    image: 127.0.0.1:5000/monky/api:3\n    command: [migrate]\n    env_file: .env\n    restart: \"no\"\n  web:\n    image: 127.0.0.1:5000/monky/api:3\n    depends_on:\n      migrate: {condition: service_completed_successfully}\n    ports: [\"8000:8000\"]\n",
    // The release dir read-only into a container, and an anonymous volume.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [\".:/srv/release:ro\", /var/cache/app]\n    working_dir: /srv\n    environment: {MODE: production, NOTE: \"privileged: true is only text\"}\n",
    // Shells that name no secret, an image entrypoint that reads its password from its own
    // environment, a client that reads its password from a variable, a multi-line value.
    "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    env_file: .env\n    command: [sh, -c, \"exec gunicorn -w $${WORKERS:-2} -b 0.0.0.0:8000 app:app\"]\n  db:\n    image: postgres:16\n    environment:\n      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD}\n      PGPASSWORD: ${POSTGRES_PASSWORD}\n    healthcheck:\n      test: [\"CMD-SHELL\", \"pg_isready -U $${POSTGRES_USER:-postgres} -h 127.0.0.1\"]\n  cache:\n    image: redis:7\n    environment: {REDISCLI_AUTH: \"${POSTGRES_PASSWORD}\"}\n    healthcheck:\n      test: redis-cli ping\n",
    // Swarm-only deploy keys compose ignores, and replicas.
    "version: \"3.9\"\nservices:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    deploy:\n      replicas: 2\n      update_config: {parallelism: 1, delay: 10s}\n      labels: {tier: web}\n",
];

#[test]
fn realistic_backends_pass_every_check_and_apply() {
    let Some(docker) = docker() else { return };
    assert!(BENIGN.len() >= 15);
    let w = World::new();
    w.stage_grant();
    for (n, yaml) in BENIGN.iter().enumerate() {
        let c = Case {
            name: "benign",
            compose: yaml,
            code: "",
            names: "",
            model: true,
        };
        let b = bundle_of(&c);
        // bundle check: ok with the model checked too.
        let run = bundle_check(&w, &docker, &format!("benign/{n}"), &b);
        assert_eq!(
            run.code(),
            0,
            "benign {n}:\n{yaml}\n{}{}",
            run.stdout(),
            run.stderr()
        );
        assert!(
            !run.stderr().contains("not checked"),
            "benign {n}: {}",
            run.stderr()
        );
        // A tick with the real compose model applies it (the stub plays pull and up).
        w.clear_stub();
        w.stub("REAL_COMPOSE", docker.to_str().unwrap());
        w.publish(&b);
        w.tenancy.advance_clock(std::time::Duration::from_secs(60));
        w.tick().ok();
        assert_report(&w.last_report(), ReportResult::Applied, None);
    }
}

// ---- the box's allowlists ---------------------------------------------------------------------

#[test]
fn bundle_check_and_the_tick_use_the_boxs_allowlists() {
    let w = World::new();
    let b = TestBundle {
        compose: format!(
            "{WEB}    volumes: [\"/srv/shared:/s\"]\n    networks: [edge]\nnetworks:\n  edge:\n    external: true\n"
        ),
        ..TestBundle::default()
    };
    let dir = w.path("allowlists");
    write_dir(&dir, &b);
    let check = || w.run(&["bundle", "check", dir.to_str().unwrap(), "--env", ENV]);
    let run = check();
    run.expect(1);
    assert!(
        run.stdout().contains(
            "FAIL PRIVILEGED_REFUSED: networks.edge: external edge (the box's admin may allow it with allowed_external_networks: [edge]), web: volumes /srv/shared (a host path; the box's admin may allow it with allowed_binds: [/srv/shared:rw])"
        ),
        "{}",
        run.stdout()
    );
    w.stage_grant();
    w.publish(&b);
    w.tick().expect(1);
    assert_report(
        &w.last_report(),
        ReportResult::Failed,
        Some("PRIVILEGED_REFUSED: "),
    );

    // The box's admin widens the lists: the same bundle passes and applies.
    w.config_extra("allowed_binds: [/srv/shared:rw]\nallowed_external_networks: [edge]\n");
    check().ok();
    w.tenancy
        .advance_clock(std::time::Duration::from_secs(3600));
    w.tick().ok();
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

/// compose runs the bytes the agent judged: a line break only compose's YAML parser sees
/// (U+2028, U+2029, U+0085 inside a comment) hides an `env_file` of a host file from the
/// agent's parser. Read by compose from the bundle's own file, the host file's contents reach
/// the model; the agent hands compose its own rewrite instead, where the comment and what it
/// hid are gone, and the apply goes ahead with what was judged.
#[test]
fn a_key_hidden_from_the_agents_parser_never_reaches_compose() {
    let Some(docker) = docker() else { return };
    let w = World::new();
    w.stage_grant();
    for brk in ['\u{2028}', '\u{2029}', '\u{85}'] {
        let compose = format!(
            "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1 # note{brk}    env_file: /etc/os-release\n"
        );
        // The difference is real: compose reads the bundle's own file with the host file in it.
        let dir = w.path(&format!("original-{}", u32::from(brk)));
        write_dir(
            &dir,
            &TestBundle {
                compose: compose.clone(),
                ..TestBundle::default()
            },
        );
        let original = std::process::Command::new(&docker)
            .args(["compose", "-p", "probe", "-f"])
            .arg(dir.join("docker-compose.yml"))
            .args(["config", "--format", "json"])
            .output()
            .unwrap();
        let model = String::from_utf8_lossy(&original.stdout);
        assert!(
            model.contains("PRETTY_NAME") || !original.status.success(),
            "this compose reads U+{:04X} as a line break no longer: {model}",
            u32::from(brk)
        );
        // The tick: applied, and compose's model of what it runs holds no host file.
        w.clear_stub();
        w.stub("REAL_COMPOSE", docker.to_str().unwrap());
        w.publish(&TestBundle {
            compose,
            ..TestBundle::default()
        });
        w.tenancy
            .advance_clock(std::time::Duration::from_secs(3600));
        w.tick().ok();
        assert_report(&w.last_report(), ReportResult::Applied, None);
        let release = w.env_dir().join(w.current_target().unwrap());
        let ran = std::process::Command::new(&docker)
            .args(["compose", "-p", "probe", "-f"])
            .arg(release.join(".monky-compose.yaml"))
            .args(["config", "--format", "json"])
            .output()
            .unwrap();
        assert!(
            ran.status.success(),
            "{}",
            String::from_utf8_lossy(&ran.stderr)
        );
        let ran = String::from_utf8_lossy(&ran.stdout);
        assert!(!ran.contains("PRETTY_NAME"), "{ran}");
        let up = w
            .docker_call_records()
            .into_iter()
            .rev()
            .find(|c| c.args.iter().any(|a| a == "up"))
            .unwrap();
        assert!(
            up.args.iter().any(|a| a.ends_with("/.monky-compose.yaml"))
                && !up.args.iter().any(|a| a.ends_with("/docker-compose.yml")),
            "{}",
            up.command_line()
        );
    }
}

/// The differential test of the rewrite compose runs, with compose's own parser: for every file
/// of the hostile and benign corpora and for generated YAML in the shapes where two parsers
/// part ways (every Unicode line break and space, a BOM, tabs, duplicate keys, several
/// documents, block scalars, tags, merge keys, anchors), compose's model of the plain-ASCII
/// rewrite holds no key the agent's parse lacks (beyond what compose adds itself) and every
/// string both hold at the same place is the same: what compose reads is what the agent
/// judged. For the benign corpus compose's model of the bundle's own file equals the
/// rewrite's: an ordinary file runs as before.
#[test]
fn compose_reads_the_rewrite_as_the_agent_judged_it() {
    use serde_json::Value;
    let Some(docker) = docker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = |name: &str, text: &str| -> Option<Value> {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(&docker)
            .args(["compose", "-p", "diff", "--project-directory"])
            .arg(dir.path())
            .arg("-f")
            .arg(&path)
            .args(["config", "--no-interpolate", "--format", "json"])
            .env("HOME", dir.path())
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    };
    // What compose adds to every model on its own: the project name, the default network.
    fn agree(judged: &Value, read: &Value, at: &str) -> Result<(), String> {
        match (judged, read) {
            (Value::Object(j), Value::Object(r)) => {
                for (k, v) in r {
                    let here = format!("{at}.{k}");
                    match j.get(k) {
                        Some(jv) => agree(jv, v, &here)?,
                        // compose's own defaults: the project's name, its default network (also
                        // next to the file's own networks),
                        // a service's networks, a volume's or network's full name.
                        None if matches!(
                            here.as_str(),
                            ".name" | ".networks" | ".networks.default"
                        ) || (here.starts_with(".services.")
                            && here.ends_with(".networks"))
                            || matches!(
                                k.as_str(),
                                "name" | "required" | "count" | "dockerfile"
                            )
                            || v.is_null() => {}
                        None => return Err(format!("compose reads {here}, the agent does not")),
                    }
                }
                Ok(())
            }
            (Value::Array(j), Value::Array(r)) if j.len() == r.len() => j
                .iter()
                .zip(r)
                .enumerate()
                .try_for_each(|(n, (a, b))| agree(a, b, &format!("{at}[{n}]"))),
            // compose names the project by `-p`, and makes relative paths absolute.
            (Value::String(j), Value::String(r))
                if j != r
                    && at != ".name"
                    && !(r.starts_with('/') && (j.starts_with('.') || j.starts_with('~'))) =>
            {
                Err(format!("{at}: the agent judged {j:?}, compose reads {r:?}"))
            }
            _ => Ok(()),
        }
    }
    let mut inputs: Vec<(String, String, bool)> = Vec::new();
    let benign = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/benign");
    for e in std::fs::read_dir(&benign).unwrap() {
        let p = e.unwrap().path();
        inputs.push((
            p.display().to_string(),
            std::fs::read_to_string(&p).unwrap(),
            true,
        ));
    }
    for c in CASES {
        inputs.push((c.name.to_string(), compose_of(c), false));
    }
    let web = "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n";
    for ws in [
        '\u{85}', '\u{a0}', '\u{1680}', '\u{2000}', '\u{2007}', '\u{200b}', '\u{2028}', '\u{2029}',
        '\u{202f}', '\u{205f}', '\u{3000}', '\u{feff}', '\t', '\u{b}', '\u{c}', '\r',
    ] {
        let n = u32::from(ws);
        inputs.push((
            format!("comment-{n:04x}"),
            format!("{web}    # c{ws}    env_file: /etc/os-release\n"),
            false,
        ));
        inputs.push((
            format!("value-{n:04x}"),
            format!("{web}    labels: {{a: \"x{ws}y\", b: x{ws}y}}\n"),
            false,
        ));
        inputs.push((
            format!("key-{n:04x}"),
            format!("{web}    labels:\n      \"k{ws}\": v\n"),
            false,
        ));
        inputs.push((
            format!("block-{n:04x}"),
            format!("{web}    entrypoint: |\n      a{ws}    env_file: /etc/os-release\n"),
            false,
        ));
    }
    // YAML 1.1's booleans are strings to compose: the rewrite keeps them strings, so compose
    // reads it as it reads the original.
    inputs.push((
        "yaml11-scalars".to_string(),
        format!(
            "{web}    networks: [n]\n    environment: {{A: y, B: n, C: yes, D: no, E: on, F: off, G: Y, H: NO}}\n\
             networks:\n  n: {{}}\n"
        ),
        true,
    ));
    // File modes spelled as YAML 1.1 octals, as compose files write them: go-yaml reads `0440`
    // as octal, and so must the rewrite, or a secret's file gets mode 0670 (440 decimal).
    inputs.push((
        "octal-modes".to_string(),
        format!(
            "{web}    secrets:\n      - source: s\n        target: s\n        mode: 0440\n    configs:\n      - source: c\n        target: /c\n        mode: 0644\n    labels: {{a: 010, b: -0_7}}\n\
             secrets:\n  s:\n    environment: S\nconfigs:\n  c:\n    content: x\n"
        ),
        true,
    ));
    for (name, text) in [
        ("bom", format!("\u{feff}{web}")),
        ("tabs", format!("{web}    labels: {{a:\t1}}\n")),
        ("duplicate-key", format!("{web}    image: other\n")),
        ("two-documents", format!("{web}---\nservices:\n  db:\n    image: x\n")),
        ("block-literal", format!("{web}    entrypoint: |\n      a\n        b\n    # not a comment?\n")),
        ("block-folded", format!("{web}    command: >-\n      a\n      b\n")),
        ("tags", format!("{web}    labels: !!map {{a: !!str 1, b: !!binary aGk=}}\n")),
        ("compose-tags", format!("{web}    ports: !reset []\n")),
        ("merge", "x-a: &a {image: nginx, labels: {a: \"1\"}}\nservices:\n  web:\n    <<: *a\n    labels: {b: \"2\"}\n".to_string()),
        ("anchors", "services:\n  web: &w\n    image: nginx\n  api: *w\n".to_string()),
        ("escapes", format!("{web}    labels: {{a: \"\\u2028\\x41\\U0001F600\\N\\_\\L\\P\"}}\n")),
        ("single-quotes", format!("{web}    labels: {{a: 'it''s # not'}}\n")),
        ("flow-comment", format!("{web}    labels: {{a: b #c\n      , d: e}}\n")),
        ("numbers", format!("{web}    labels: {{a: 010, b: 0o10, c: 0x1F, d: 1e3, e: .inf, f: yes, g: ~}}\n")),
    ] {
        inputs.push((name.to_string(), text, false));
    }
    let (mut compared, mut refused, mut neither) = (0, 0, 0);
    let mut failures = Vec::new();
    for (name, text, ordinary) in &inputs {
        let Ok(plain) = monky_bundle::plain_compose(text) else {
            refused += 1;
            continue;
        };
        // The agent's parse, read back from its rewrite (the rewrite reads back as the parse:
        // monky-bundle's plain tests and the compose_plain fuzz target).
        let judged: Value = serde_saphyr::from_str(&plain).unwrap();
        match model("plain.yaml", &plain) {
            Some(read) => {
                compared += 1;
                if let Err(e) = agree(&judged, &read, "") {
                    failures.push(format!("{name}: {e}"));
                }
                if *ordinary {
                    assert_eq!(model("original.yaml", text).as_ref(), Some(&read), "{name}");
                }
            }
            None if *ordinary => failures.push(format!("{name}: compose cannot read the rewrite")),
            None => neither += 1,
        }
    }
    println!(
        "{} inputs: {compared} read by compose as judged, {neither} refused by compose's own \
         model, {refused} refused by the agent's parser",
        inputs.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(compared >= 100, "{compared}");
}

/// Through a tick with the real compose's model and the fake engine (no userns-remap, images
/// without a `USER`, a `passwd` with `nobody` at 65534); the box's own `/etc/passwd` has
/// `nobody` at 65534 too. `extra` is the service's further keys and the file's after it.
fn shared_uid_tick(w: &World, extra: &str) -> Run {
    let docker = docker().expect("the real docker CLI");
    w.clear_stub();
    std::fs::remove_file(w.stub_dir().join("calls.log")).ok();
    w.stub("REAL_COMPOSE", docker.to_str().unwrap());
    w.publish(&TestBundle {
        compose: format!("{WEB}{extra}"),
        ..TestBundle::default()
    });
    w.tenancy.advance_clock(std::time::Duration::from_secs(60));
    w.tick()
}

fn ups(w: &World) -> usize {
    w.docker_calls()
        .iter()
        .filter(|c| c.ends_with(" up") || c.contains(" up "))
        .count()
}

/// A secret given only as a file (compose's `secrets:` from the release's `.env`) is read
/// through `/proc/<pid>/root` by an account at the container's uid as its environment would
/// be: refused at a shared uid before the pull (its `user:` names the uid), nothing started;
/// the box admin's waiver lets it apply.
#[test]
fn a_secret_only_as_a_file_at_a_shared_uid_is_refused_through_a_tick() {
    if docker().is_none() {
        return;
    }
    let w = World::new();
    w.stage_grant();
    let file = "    user: \"65534\"\n    secrets:\n      - source: pg\n        uid: \"65534\"\n        \
                mode: 0400\nsecrets:\n  pg:\n    environment: POSTGRES_PASSWORD\n";
    let run = shared_uid_tick(&w, file);
    run.expect(1);
    let r = w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("SECRET_READABLE_ON_HOST: web: runs as uid 65534"),
    );
    let detail = r.detail.unwrap_or_default();
    assert!(
        detail.contains("nobody")
            && detail.contains("POSTGRES_PASSWORD as a file under /run/secrets")
            && !detail.contains(PGPASS),
        "{detail}"
    );
    assert!(!w.docker_calls().iter().any(|c| c.contains(" pull")));
    assert_eq!(ups(&w), 0, "{:#?}", w.docker_calls());
    assert_eq!(w.current_target(), None);

    w.config_extra("allowed_shared_uids: [65534]\n");
    let run = w.run(&["run", "--once", "--force"]);
    run.ok();
    assert_eq!(ups(&w), 1, "{}", run.stderr());
}

/// Every route a secret takes into a service counts at a shared uid, each refused before the
/// pull and named on the service that runs; its benign twin (the same shape, no secret in it)
/// applies. Through a tick with the real compose's model.
#[test]
fn every_route_of_a_secret_into_a_service_at_a_shared_uid_is_refused_before_the_pull() {
    if docker().is_none() {
        return;
    }
    let user = "    user: \"65534\"\n";
    let config = |def: &str| format!("{user}    configs: [c]\nconfigs:\n  c:\n{def}");
    let base = |value: &str| {
        format!(
            "{user}    extends: {{service: base}}\n  base:\n    image: 127.0.0.1:5000/monky/web:1\n    \
             environment:\n      TOKEN: \"{value}\"\n"
        )
    };
    let template = |extra: &str| format!("{}{extra}", TestBundle::default().env_template);
    let url = "DATABASE_URL=postgres://app:${POSTGRES_PASSWORD}@db/app\n";
    let multi = "MULTI=\"x\n${POSTGRES_PASSWORD}\"\n";
    // (compose's extra lines, the .env template's extra lines, what the finding names; "" for
    // a twin that applies)
    let cases: Vec<(String, String, &str)> = vec![
        (
            config("    environment: POSTGRES_PASSWORD\n"),
            template(""),
            "POSTGRES_PASSWORD as a config file",
        ),
        (config("    environment: LOG_LEVEL\n"), template(""), ""),
        (
            config("    content: \"password=${POSTGRES_PASSWORD}\"\n"),
            template(""),
            "POSTGRES_PASSWORD as a config file",
        ),
        (
            config("    content: \"password=$${POSTGRES_PASSWORD}\"\n"),
            template(""),
            "",
        ),
        (
            config("    environment: DATABASE_URL\n"),
            template(url),
            "DATABASE_URL as a config file",
        ),
        (
            config("    environment: MULTI\n"),
            template(multi),
            "MULTI as a config file",
        ),
        (
            config("    environment: MULTI\n"),
            template("MULTI=\"x\ny\"\n"),
            "",
        ),
        (
            config("    file: ./.env\n"),
            template(""),
            "POSTGRES_PASSWORD as a config file",
        ),
        (config("    file: ./.env.template\n"), template(""), ""),
        (
            format!("{user}    secrets: [s]\nsecrets:\n  s:\n    file: .env\n"),
            template(""),
            "as a file under /run/secrets",
        ),
        (
            base("${POSTGRES_PASSWORD}"),
            template(""),
            "POSTGRES_PASSWORD in its environment",
        ),
        (base("not-a-secret"), template(""), ""),
    ];
    for (extra, env_template, names) in &cases {
        let w = World::new();
        w.stage_grant();
        let docker = docker().unwrap();
        w.stub("REAL_COMPOSE", docker.to_str().unwrap());
        w.publish(&TestBundle {
            compose: format!("{WEB}{extra}"),
            env_template: env_template.clone(),
            ..TestBundle::default()
        });
        let run = w.tick();
        if names.is_empty() {
            assert_eq!(run.code(), 0, "{extra}: {}", run.stderr());
            assert_eq!(ups(&w), 1, "{extra}");
            continue;
        }
        run.expect(1);
        let detail = w.last_report().detail.unwrap_or_default();
        assert!(
            detail.starts_with("SECRET_READABLE_ON_HOST: web: runs as uid 65534")
                && detail.contains(names)
                && !detail.contains("base:")
                && !detail.contains(PGPASS),
            "{extra}: {detail}"
        );
        assert!(
            !w.docker_calls().iter().any(|c| c.contains(" pull")),
            "{extra}: pulled before the refusal"
        );
        assert_eq!(ups(&w), 0, "{extra}");
    }
}

/// A `.env` value can bring a `$NAME` into a command that the compose file shows only as
/// `${KEY}` (`CMD=$$POSTGRES_PASSWORD` reads back as `$POSTGRES_PASSWORD`): judged on compose's
/// interpolated model, after the secrets are read and before anything is pulled or started.
#[test]
fn a_shell_variable_a_env_value_brings_is_refused_on_the_model_before_the_pull() {
    let Some(docker) = docker() else { return };
    for (value, refused) in [("$$POSTGRES_PASSWORD", true), ("$$WORKERS", false)] {
        let w = World::new();
        w.stage_grant();
        w.stub("REAL_COMPOSE", docker.to_str().unwrap());
        w.publish(&TestBundle {
            compose: "services:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    \
                      env_file: .env\n    command: [sh, -c, \"exec app ${CMD}\"]\n"
                .into(),
            env_template: format!("{}CMD={value}\n", TestBundle::default().env_template),
            ..TestBundle::default()
        });
        let run = w.tick();
        if !refused {
            assert_eq!(run.code(), 0, "{value}: {}", run.stderr());
            assert_eq!(ups(&w), 1);
            continue;
        }
        run.expect(1);
        assert_report(
            &w.last_report(),
            ReportResult::Failed,
            Some(
                "SECRET_ON_COMMAND_LINE: web: command has the container expand $POSTGRES_PASSWORD",
            ),
        );
        assert_eq!(w.tenancy.lease_count(ENV), 1, "judged after the lease");
        assert!(!w.docker_calls().iter().any(|c| c.contains(" pull")));
        assert_eq!(ups(&w), 0);
    }
}

/// A `user` given by name is resolved as the runtime will, from the image's own `/etc/passwd`
/// (a container created, never started, removed); a name the image does not have is a
/// finding too, never passed.
#[test]
fn a_user_name_is_resolved_from_the_images_passwd_through_a_tick() {
    if docker().is_none() {
        return;
    }
    let w = World::new();
    w.stage_grant();
    let run = shared_uid_tick(&w, "    user: nobody\n    env_file: .env\n");
    run.expect(1);
    let detail = w.last_report().detail.unwrap_or_default();
    assert!(
        detail.starts_with("SECRET_READABLE_ON_HOST: web: runs as uid 65534")
            && detail.contains("GEMINI_API_KEY, POSTGRES_PASSWORD in its environment"),
        "{detail}"
    );
    let probe = w.engine_requests();
    let created = probe.iter().position(|r| r == "POST /containers/create");
    let read = probe.iter().position(|r| r.contains("/archive?"));
    let removed = probe
        .iter()
        .position(|r| r.starts_with("DELETE /containers/"));
    assert!(
        created < read && read < removed && created.is_some(),
        "{probe:#?}"
    );
    assert!(!probe.iter().any(|r| r.ends_with("/start")), "{probe:#?}");
    assert_eq!(ups(&w), 0);

    let run = shared_uid_tick(&w, "    user: app\n    env_file: .env\n");
    run.expect(1);
    let detail = w.last_report().detail.unwrap_or_default();
    assert!(
        detail.starts_with("SECRET_READABLE_ON_HOST: web: cannot tell which uid it runs as")
            && detail.contains("\"app\" is not in the image's /etc/passwd"),
        "{detail}"
    );
    assert_eq!(ups(&w), 0);
}

/// Root, by number or by name, and a service that gets no secret apply as before: no probe.
#[test]
fn root_and_services_without_secrets_are_no_finding_through_a_tick() {
    if docker().is_none() {
        return;
    }
    for (n, extra) in [
        "    user: root\n    env_file: .env\n",
        "    user: \"0:0\"\n    env_file: .env\n",
        "    user: \"65534\"\n",
    ]
    .iter()
    .enumerate()
    {
        let w = World::new();
        w.stage_grant();
        let run = shared_uid_tick(&w, extra);
        assert_eq!(run.code(), 0, "{n}: {}", run.stderr());
        assert_eq!(ups(&w), 1, "{extra}");
        assert!(
            !w.engine_requests()
                .iter()
                .any(|r| r == "POST /containers/create"),
            "{extra}"
        );
    }
}

/// The engine decides: one that remaps user namespaces has no shared uid, and one whose answer
/// cannot be read starts nothing (`ENGINE_ANSWER_INVALID`, not an engine that did not answer),
/// never an unjudged secret.
#[test]
fn the_engines_user_namespaces_decide_and_an_unreadable_answer_starts_nothing() {
    if docker().is_none() {
        return;
    }
    let w = World::new();
    w.stage_grant();
    w.set_engine_info(
        "{\"ServerVersion\":\"28.3.0\",\"SecurityOptions\":[\"name=seccomp,profile=builtin\"",
    );
    let run = shared_uid_tick(&w, "    user: \"65534\"\n    env_file: .env\n");
    run.expect(1);
    let detail = w.last_report().detail.unwrap_or_default();
    assert!(
        detail.starts_with("ENGINE_ANSWER_INVALID: cannot ask the engine whether it remaps"),
        "{detail}"
    );
    assert_eq!(ups(&w), 0);

    let w = World::new();
    w.stage_grant();
    let info = serde_json::json!({
        "ServerVersion": "28.3.0",
        "DockerRootDir": w.stub_dir(),
        "SecurityOptions": ["name=seccomp,profile=builtin", "name=userns"],
    });
    w.set_engine_info(&info.to_string());
    let run = shared_uid_tick(&w, "    user: \"65534\"\n    env_file: .env\n");
    assert_eq!(run.code(), 0, "{}", run.stderr());
    assert_eq!(ups(&w), 1);
}

// ---- registries by the box's resolver -----------------------------------------------------------

/// A case of the registry rule whose name only the box's resolver turns into an address: a
/// unique name mapped in `/etc/hosts` for the test (dockerd and the agent read the same file).
fn leaked(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Hostile: names the hosts file maps to the box, in every family and spelling dockerd takes
/// for the same name. Each is refused by `bundle check` on the box and by a tick, before any
/// lease or secret read, naming the image, the registry, the address and the keys.
#[test]
fn registries_whose_names_lead_to_the_box_are_refused_in_every_spelling_and_family() {
    let Some(docker) = docker() else { return };
    let v4 = HostsEntry::add(&["127.0.0.1"], ".test");
    let v6 = HostsEntry::add(&["::1"], ".test");
    let both = HostsEntry::add(&["192.0.2.10", "::ffff:127.0.0.1"], ".test");
    let metadata = HostsEntry::add(&["169.254.169.254"], ".test");
    let any = HostsEntry::add(&["0.0.0.0"], ".test");
    let w = World::new();
    let proxy = w.tenancy.addr().port();
    let cases: Vec<(String, String, &str)> = vec![
        (
            format!("{}:{proxy}/x/y:1", v4.name),
            format!("{}:{proxy}", v4.name),
            "127.0.0.1 (loopback)",
        ),
        (
            format!("{}:{proxy}/x/y:1", v4.name.to_uppercase()),
            format!("{}:{proxy}", v4.name),
            "127.0.0.1 (loopback)",
        ),
        (
            format!("{}.:{proxy}/x/y:1", v4.name),
            format!("{}.:{proxy}", v4.name),
            "127.0.0.1 (loopback)",
        ),
        (
            format!("{}/x/y@sha256:{}", v4.name, "0".repeat(64)),
            v4.name.clone(),
            "127.0.0.1 (loopback)",
        ),
        (
            format!("{}:5000/x/y:1", v6.name),
            format!("{}:5000", v6.name),
            "::1 (loopback)",
        ),
        (
            format!("{}:5000/x/y:1", both.name),
            format!("{}:5000", both.name),
            "::ffff:127.0.0.1 (loopback)",
        ),
        (
            format!("{}/latest/meta-data:1", metadata.name),
            metadata.name.clone(),
            "169.254.169.254 (link-local)",
        ),
        (
            format!("{}:5000/x/y:1", any.name),
            format!("{}:5000", any.name),
            "0.0.0.0 (the unspecified address, this box)",
        ),
    ];
    w.stage_grant();
    for (n, (image, registry, address)) in cases.iter().enumerate() {
        let names = leaked(format!(
            "web: image {image}: registry {registry} resolves to {address}"
        ));
        let c = case(
            leaked(format!("registry-by-resolver-{n}")),
            leaked(format!("services:\n  web:\n    image: \"{image}\"\n")),
            "REGISTRY_NOT_ALLOWED",
            names,
        );
        through_bundle_check(&w, &docker, &c);
        through_a_tick(&w, &c);
        let detail = w.last_report().detail.unwrap_or_default();
        assert!(
            detail.contains("registry_host or trusted_registries"),
            "{detail}"
        );
    }
    assert!(
        w.bao
            .agent_requests()
            .iter()
            .all(|r| !r.path.contains("/data/")),
        "a registry of the box led to a secret read"
    );
}

/// Benign: a registry on a host name of the network, and the box's own mirror on loopback,
/// named in `trusted_registries` by the box's admin, pass `bundle check` and apply.
#[test]
fn a_registry_of_the_network_and_the_boxs_own_mirror_named_in_config_apply() {
    let Some(docker) = docker() else { return };
    let network = HostsEntry::add(&["192.0.2.10", "2001:db8::10"], ".test");
    let mirror = HostsEntry::add(&["127.0.0.1"], ".test");
    let w = World::new();
    w.config_extra(&format!("trusted_registries: [\"{}:5000\"]\n", mirror.name));
    w.stage_grant();
    for (n, image) in [
        format!("{}:5000/monky/web:1", network.name),
        format!("{}/monky/web:1", network.name),
        format!("{}:5000/monky/web:1", mirror.name),
    ]
    .iter()
    .enumerate()
    {
        let b = TestBundle {
            compose: format!("services:\n  web:\n    image: {image}\n    env_file: .env\n"),
            ..TestBundle::default()
        };
        let run = bundle_check(&w, &docker, &format!("benign-registry/{n}"), &b);
        assert_eq!(run.code(), 0, "{image}: {}{}", run.stdout(), run.stderr());
        w.clear_stub();
        w.stub("REAL_COMPOSE", docker.to_str().unwrap());
        w.publish(&b);
        w.tenancy.advance_clock(std::time::Duration::from_secs(60));
        w.tick().ok();
        assert_report(&w.last_report(), ReportResult::Applied, None);
    }
}
