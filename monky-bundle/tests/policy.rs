//! The compose policy on compose files as a bundle carries them: what each rule refuses, what
//! passes, that interpolation and YAML expansion happen first, and that the table classifies
//! every key of the compose specification.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use monky_bundle::policy::{Rule, TABLE, rule_of};
use monky_bundle::{AllowedBind, ComposePolicy};

const PROJECT: &str = "monky-env-qa-02";

fn policy() -> ComposePolicy {
    ComposePolicy::new(PROJECT)
}

/// Checks one compose file with the given known values; `secrets` are the unknown ones.
fn check_with(p: &ComposePolicy, yaml: &str, env: &[(&str, &str)], expected: &str) {
    let map: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = |name: &str| map.get(name).cloned();
    let secrets = BTreeSet::from(["SECRET".to_string()]);
    let got = match p.check_file(yaml, &lookup, &secrets) {
        Ok(()) => "ok".to_owned(),
        Err(r) => r.to_string(),
    };
    // The allowed_binds hint is asserted where a case spells it out
    // (`a_host_path_names_the_allowed_binds_line`); the other cases name the finding.
    let got = if expected.contains("(a host path;") {
        got
    } else {
        without_bind_hints(&got)
    };
    assert_eq!(got, expected, "\n{yaml}");
}

fn without_bind_hints(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(start) = out.find(" (a host path;") {
        let end = out[start..].find(')').map_or(out.len(), |e| start + e + 1);
        out.replace_range(start..end, "");
    }
    out.replace(" (a host path)", "")
}

#[test]
fn a_host_path_names_the_allowed_binds_line() {
    check(
        &svc("volumes: [\"/var/run/docker.sock:/s:z\", \"/srv/data:/d:ro\"]"),
        &format!(
            "{P}volumes /var/run/docker.sock (a host path; the box's admin may allow it with allowed_binds: [/var/run/docker.sock:rw]), \
             web: volumes /srv/data (a host path; the box's admin may allow it with allowed_binds: [/srv/data:ro])"
        ),
    );
}

fn check(yaml: &str, expected: &str) {
    check_with(&policy(), yaml, &[], expected);
}

/// A one-service compose file with `body` indented under the service.
fn svc(body: &str) -> String {
    let mut out = String::from("services:\n  web:\n    image: nginx\n");
    for line in body.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

const P: &str = "PRIVILEGED_REFUSED: web: ";
const I: &str = "BUNDLE_INVALID: ";
/// Why a file key with a variable is refused.
const LITERAL: &str = "a file compose reads must be named literally, without $ (a variable's value is only known when compose opens it)";

#[test]
fn each_rule_refuses_what_it_names() {
    #[rustfmt::skip]
    let cases: &[(&str, String)] = &[
        // Confinement.
        ("privileged: true", format!("{P}privileged")),
        ("privileged: \"yes\"", format!("{P}privileged")),
        ("cap_add: [SYS_MODULE]", format!("{P}cap_add SYS_MODULE")),
        ("cap_add: [cap_sys_admin, ALL]", format!("{P}cap_add SYS_ADMIN, web: cap_add ALL")),
        ("cap_add: [NET_ADMIN]", format!("{P}cap_add NET_ADMIN")),
        ("security_opt: [seccomp=unconfined]", format!("{P}security_opt seccomp=unconfined")),
        ("security_opt: [\"apparmor:unconfined\"]", format!("{P}security_opt apparmor:unconfined")),
        ("devices: [\"/dev/sda:/dev/sda\"]", format!("{P}devices")),
        ("device_cgroup_rules: [\"b 8:* rmw\"]", format!("{P}device_cgroup_rules")),
        ("cgroup_parent: /", format!("{P}cgroup_parent")),
        ("runtime: runsc", format!("{P}runtime")),
        ("userns_mode: host", format!("{P}userns_mode")),
        ("isolation: process", format!("{P}isolation")),
        ("gpus: all", format!("{P}gpus")),
        ("deploy:\n  resources:\n    reservations:\n      devices:\n        - capabilities: [gpu]", format!("{P}deploy.resources.reservations.devices")),
        ("sysctls: [kernel.core_pattern=|/x]", format!("{P}sysctls kernel.core_pattern")),
        ("sysctls:\n  kernel.domainname: x", format!("{P}sysctls kernel.domainname")),
        ("oom_kill_disable: true", format!("{P}oom_kill_disable")),
        ("oom_score_adj: -1000", format!("{P}oom_score_adj -1000")),
        ("ulimits:\n  rttime: -1", format!("{P}ulimits rttime")),
        ("use_api_socket: true", format!("{P}use_api_socket")),
        ("annotations: {a: b}", format!("{P}annotations")),
        ("logging: {driver: fluentd}", format!("{P}logging.driver fluentd")),
        ("post_start:\n  - command: id\n    privileged: true", format!("{P}post_start.privileged")),
        // Namespaces.
        ("network_mode: host", format!("{P}network_mode host")),
        ("network_mode: bridge", format!("{P}network_mode bridge")),
        ("network_mode: \"container:other\"", format!("{P}network_mode container:other")),
        ("pid: host", format!("{P}pid host")),
        ("ipc: \"container:x\"", format!("{P}ipc container:x")),
        ("uts: host", format!("{P}uts host")),
        ("cgroup: host", format!("{P}cgroup host")),
        ("pid: \"service:nosuch\"", format!("{P}pid service:nosuch")),
        ("volumes_from: [\"container:other\"]", format!("{P}volumes_from container:other")),
        ("external_links: [other_db_1]", format!("{P}external_links")),
        // Host paths.
        ("volumes: [\"/etc:/h\"]", format!("{P}volumes /etc")),
        ("volumes: [\"/etc/localtime:/etc/localtime\"]", format!("{P}volumes /etc/localtime")),
        ("volumes: [\"/:/h:ro\"]", format!("{P}volumes /")),
        ("volumes: [\"../../..:/h\"]", format!("{P}volumes ../../..")),
        ("volumes: [\"~/.ssh:/h\"]", format!("{P}volumes ~/.ssh")),
        ("volumes: [\".:/cfg\"]", format!("{P}volumes . writable over the release's own files")),
        ("volumes: [\"./.env:/e\"]", format!("{P}volumes ./.env writable over the release's own files")),
        ("volumes: [\"./docker-compose.yml:/c:rw\"]", format!("{P}volumes ./docker-compose.yml writable over the release's own files")),
        ("volumes: [\"./data/..:/c\"]", format!("{P}volumes ./data/.. writable over the release's own files")),
        ("volumes: [\"./data:/d:rshared\"]", format!("{P}volumes ./data propagation rshared")),
        ("volumes:\n  - type: bind\n    source: /var/lib/docker\n    target: /d", format!("{P}volumes /var/lib/docker")),
        ("volumes:\n  - type: bind\n    source: ./d\n    target: /d\n    bind: {propagation: shared}", format!("{P}volumes ./d propagation shared")),
        ("volumes:\n  - type: npipe\n    source: x\n    target: /d", format!("{P}volumes type npipe")),
        ("volumes:\n  - type: volume\n    source: v\n    target: /d\n    volume: {subpath: ../..}", format!("{P}volumes v subpath ../..")),
        ("env_file: /etc/shadow", format!("{P}env_file /etc/shadow: only the release's own .env may be read")),
        ("env_file: [./.env, ../../bao.token]", format!("{P}env_file ../../bao.token: only the release's own .env may be read")),
        ("env_file: ${SECRET}", format!("{P}env_file ${{SECRET}}: {LITERAL} (${{SECRET}} is a secret)")),
        // Identity and integrity.
        ("container_name: monky-env-other-web", "BUNDLE_NONCONFORMING: web: container_name monky-env-other-web (accepted: monky-env-qa-02-monky-env-other-web)".to_string()),
        // The default names of a longer project, `monky-env-qa-02-b`, that may come later.
        ("container_name: monky-env-qa-02-b-web-1", "BUNDLE_NONCONFORMING: web: container_name monky-env-qa-02-b-web-1 (accepted: monky-env-qa-02-b-web)".to_string()),
        ("container_name: monky-env-qa-02-b-web-run-0a1b2c3d4e5f", "BUNDLE_NONCONFORMING: web: container_name monky-env-qa-02-b-web-run-0a1b2c3d4e5f (accepted: monky-env-qa-02-b-web)".to_string()),
        ("container_name: b-web-1", "BUNDLE_NONCONFORMING: web: container_name b-web-1 (accepted: monky-env-qa-02-b-web)".to_string()),
        ("labels: {com.docker.compose.project: monky-env-other}", format!("{I}web: labels com.docker.compose.project")),
        ("build: .", format!("{I}web: build")),
        ("extends: {service: base, file: /etc/other.yml}", format!("{I}web: extends.file")),
        ("pull_policy: build", format!("{I}web: pull_policy build")),
        ("develop: {watch: [{path: /, action: sync}]}", format!("{I}web: develop")),
        ("frobnicate: true", format!("{I}web: unknown key frobnicate")),
        ("deploy: {resources: {limits: {cpus: 1, gpus: 1}}}", format!("{I}web: unknown key deploy.resources.limits.gpus")),
    ];
    for (body, expected) in cases {
        check(&svc(body), expected);
    }
}

#[test]
fn top_level_volumes_networks_configs_and_identity() {
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("include: [../other.yml]\nservices: {}\n", "BUNDLE_INVALID: include"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: root, target: /data}]\nvolumes:\n  root:\n    driver_opts: {type: none, o: bind, device: /}\n", "PRIVILEGED_REFUSED: volumes.root: driver_opts"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    driver: rclone\n", "PRIVILEGED_REFUSED: volumes.v: driver rclone"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    external: true\n", "PRIVILEGED_REFUSED: volumes.v: external v (the box's admin may allow it with allowed_external_volumes: [v])"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    external: true\n    name: monky-env-other_pgdata\n", "PRIVILEGED_REFUSED: volumes.v: external monky-env-other_pgdata (the box's admin may allow it with allowed_external_volumes: [monky-env-other_pgdata])"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    name: monky-env-other_pgdata\n", "BUNDLE_NONCONFORMING: volumes.v: name monky-env-other_pgdata (accepted: monky-env-qa-02_monky-env-other-pgdata)"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    name: monky-env-qa-02_b_data\n", "BUNDLE_NONCONFORMING: volumes.v: name monky-env-qa-02_b_data (accepted: monky-env-qa-02_b-data)"),
        ("services:\n  s:\n    image: x\n    networks: [n]\nnetworks:\n  n:\n    name: monky-env-qa-02_b_default\n", "BUNDLE_NONCONFORMING: networks.n: name monky-env-qa-02_b_default (accepted: monky-env-qa-02_b-default)"),
        ("services:\n  s:\n    image: x\n    networks: [n]\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    name: monky-env-qa-02_pgdata\nnetworks:\n  n:\n    name: monky-env-qa-02_back-end\n", "ok"),
        ("services:\n  s:\n    image: x\n    networks: [n]\nnetworks:\n  n:\n    external: true\n    name: host\n", "PRIVILEGED_REFUSED: networks.n: external host (the box's admin may allow it with allowed_external_networks: [host])"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    driver_opts: {type: tmpfs, device: tmpfs, o: \"size=64m,uid=1000\"}\n", "ok"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    driver_opts: {type: tmpfs, device: /dev/sda1, o: size=1m}\n", "PRIVILEGED_REFUSED: volumes.v: driver_opts"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    driver_opts: {type: tmpfs, o: \"bind,size=1m\"}\n", "PRIVILEGED_REFUSED: volumes.v: driver_opts"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    driver_opts: {type: tmpfs, o: \"size =1m\"}\n", "PRIVILEGED_REFUSED: volumes.v: driver_opts"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    driver_opts: {type: tmpfs, o: \" size=1m, ,mode=1777 \"}\n", "ok"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    driver_opts: {type: tmpfs, o: \"size=1m,nr_blocks=16777216\"}\n", "PRIVILEGED_REFUSED: volumes.v: driver_opts"),
        ("name: monky-env-other\nservices:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\n    networks: [n]\nvolumes:\n  v:\n    name: ${COMPOSE_PROJECT_NAME}_v\nnetworks:\n  n:\n    name: \"${COMPOSE_PROJECT_NAME}_n\"\n", "ok"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    name: ${SECRET}\n", "ok"),
        ("services:\n  s:\n    image: x\n    networks: [n]\nnetworks:\n  n:\n    driver: macvlan\n", "PRIVILEGED_REFUSED: networks.n: driver macvlan"),
        ("services:\n  s:\n    image: x\n    networks: [n]\nnetworks:\n  n:\n    driver_opts: {com.docker.network.bridge.name: docker0}\n", "PRIVILEGED_REFUSED: networks.n: driver_opts"),
        ("services:\n  s:\n    image: x\n    networks: [n]\nnetworks:\n  n:\n    ipam: {config: [{subnet: 10.0.0.0/8}]}\n", "PRIVILEGED_REFUSED: networks.n: ipam"),
        ("services: {}\nconfigs:\n  c:\n    file: /\n", "PRIVILEGED_REFUSED: configs.c: file /: only a file inside the release dir"),
        ("services: {}\nsecrets:\n  s:\n    file: /var/lib/monky-deployd/bao.token\n", "PRIVILEGED_REFUSED: secrets.s: file /var/lib/monky-deployd/bao.token: only a file inside the release dir"),
        ("services: {}\nsecrets:\n  s:\n    external: true\n", "BUNDLE_INVALID: secrets.s: external"),
        ("services: {}\nmodels: {m: {model: x}}\n", "BUNDLE_INVALID: models"),
        ("services: {}\nfrob: 1\n", "BUNDLE_INVALID: unknown key frob"),
        ("services:\n  s:\n    image: x\n    volumes: [{type: volume, source: v, target: /data}]\nvolumes:\n  v:\n    labels: [com.docker.compose.volume=x]\n", "BUNDLE_INVALID: volumes.v: labels com.docker.compose.volume"),
    ];
    for (yaml, expected) in cases {
        check(yaml, expected);
    }
}

#[test]
fn realistic_files_pass() {
    check(
        &(svc(
            "ports: [\"8080:80\", {target: 443, published: 8443, host_ip: 0.0.0.0}]\n\
             volumes: [./data:/data, pgdata:/var/lib/pg, \".:/cfg:ro\", ./conf/app.yml:/app.yml:ro,\n  \
             /etc/localtime:/etc/localtime:ro, /tmp/anon]\n\
             tmpfs: [/run]\n\
             security_opt: [no-new-privileges:true]\n\
             cap_drop: [ALL]\n\
             cap_add: [NET_BIND_SERVICE, CHOWN]\n\
             sysctls: {net.core.somaxconn: 1024}\n\
             logging: {driver: json-file, options: {max-size: 10m}}\n\
             healthcheck: {test: [CMD, true], interval: 5s}\n\
             depends_on: {db: {condition: service_healthy}}\n\
             deploy: {resources: {limits: {cpus: \"0.5\", memory: 256M}}, restart_policy: {condition: on-failure}}\n\
             profiles: [web]\n\
             env_file: [.env]\n\
             environment: {NOTE: \"privileged: true, network_mode: host\"}\n\
             container_name: monky-env-qa-02-web\n\
             network_mode: \"service:db\"\n\
             privileged: false\n\
             read_only: true\n\
             x-notes: {anything: [goes, here]}\n\
             ulimits: {nofile: {soft: 1024, hard: 2048}}",
        )
        .replace("services:\n", "x-top: 1\nservices:\n  db:\n    image: postgres\n    ipc: shareable\n    volumes_from: [web]\n")
            + "volumes:\n  pgdata: {}\nnetworks:\n  back: {internal: true}\nconfigs:\n  c: {file: ./conf/c.txt}\nsecrets:\n  s: {environment: POSTGRES_PASSWORD}\n"),
        "ok",
    );
    check("services: {}\n", "ok");
    check("version: '3'\n", "ok");
    check(&svc("command: echo $$HOME ${MISSING:-ok}"), "ok");
}

#[test]
fn the_box_admin_widens_never_the_bundle() {
    let yaml = svc(
        "volumes: [\"/srv/shared:/s\", \"/srv/ro:/r:ro\", \"ext:/e\"]\nnetworks: [proxy]",
    ) + "volumes:\n  ext: {external: true}\nnetworks:\n  proxy: {external: true, name: edge}\n";
    check(
        &yaml,
        "PRIVILEGED_REFUSED: networks.proxy: external edge (the box's admin may allow it with allowed_external_networks: [edge]), web: volumes /srv/shared (a host path; the box's admin may allow it with allowed_binds: [/srv/shared:rw]), web: volumes /srv/ro (a host path; the box's admin may allow it with allowed_binds: [/srv/ro:ro]), volumes.ext: external ext (the box's admin may allow it with allowed_external_volumes: [ext])",
    );
    let widened = policy()
        .allowed_binds(vec![
            "/srv/shared:rw".parse::<AllowedBind>().unwrap(),
            "/srv/ro:ro".parse().unwrap(),
        ])
        .allowed_external_volumes(["ext".to_string()])
        .allowed_external_networks(["edge".to_string()]);
    check_with(&widened, &yaml, &[], "ok");
    // A read-only entry never allows a writable bind.
    check_with(
        &widened,
        &svc("volumes: [\"/srv/ro/x:/r\"]"),
        &[],
        "PRIVILEGED_REFUSED: web: volumes /srv/ro/x",
    );
    // allow_privileged waives host power, never identity or integrity.
    let allowed = policy().allow_privileged(true);
    check_with(&allowed, &yaml, &[], "ok");
    check_with(
        &allowed,
        &svc("privileged: true\nnetwork_mode: host"),
        &[],
        "ok",
    );
    check_with(
        &allowed,
        &svc("container_name: other"),
        &[],
        "BUNDLE_NONCONFORMING: web: container_name other (accepted: monky-env-qa-02-other)",
    );
    // allow_unprefixed_names waives the names, never host power.
    let names = policy().allow_unprefixed_names(true);
    check_with(&names, &svc("container_name: other"), &[], "ok");
    check_with(
        &names,
        &svc("container_name: other\nprivileged: true"),
        &[],
        &format!("{P}privileged"),
    );
    check_with(
        &allowed,
        &svc("include_me: 1"),
        &[],
        "BUNDLE_INVALID: web: unknown key include_me",
    );
}

#[test]
fn interpolation_and_expansion_happen_before_the_check() {
    let p = policy();
    check(&svc("privileged: ${PRIV:-true}"), &format!("{P}privileged"));
    check_with(
        &p,
        &svc("privileged: ${PRIV:-true}"),
        &[("PRIV", "false")],
        "ok",
    );
    check_with(
        &p,
        &svc("network_mode: ${NET}"),
        &[("NET", "host")],
        &format!("{P}network_mode host"),
    );
    check(
        &svc("volumes: [\"${SOCK:-/var/run/docker.sock}:/s\"]"),
        &format!("{P}volumes /var/run/docker.sock"),
    );
    check(
        &svc("volumes: [\"${A:-${B:-/}}:/h\"]"),
        &format!("{P}volumes /"),
    );
    check_with(
        &p,
        &svc("network_mode: \"$$NM\""),
        &[("NM", "host")],
        &format!("{P}network_mode $NM"),
    );
    check(
        "x-danger: &danger\n  privileged: true\n  network_mode: host\nservices:\n  web:\n    <<: *danger\n    image: nginx\n",
        &format!("{P}network_mode host, web: privileged"),
    );
    check(
        "x-caps: &caps [SYS_ADMIN]\nservices:\n  web:\n    image: nginx\n    cap_add: *caps\n",
        &format!("{P}cap_add SYS_ADMIN"),
    );
}

#[test]
fn hostile_yaml_is_refused_not_expanded() {
    let mut bomb = String::from(
        "x-a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let prev = format!("*a{}", i - 1);
        bomb.push_str(&format!(
            "x-a{i}: &a{i} [{}]\n",
            [prev.as_str(); 9].join(",")
        ));
    }
    bomb.push_str("services:\n  web:\n    image: nginx\n    labels: *a9\n");
    let got = policy()
        .check_file(&bomb, &|_| None, &BTreeSet::new())
        .expect_err("alias bomb");
    assert!(
        got.to_string()
            .starts_with("BUNDLE_INVALID: compose file: yaml anchors over their budget of 100000 events or 4 MiB at line "),
        "{got}"
    );
    check(
        "services:\n  web:\n    image: nginx\n    privileged: false\n    privileged: true\n",
        "BUNDLE_INVALID: compose file: duplicate key at line 5 column 5",
    );
    check(
        "services:\n  web: [unclosed\n",
        "BUNDLE_INVALID: compose file: invalid yaml at line 2 column 8",
    );
    check(
        "a: 1\n---\nb: 2\n",
        "BUNDLE_INVALID: compose file: more than one yaml document at line 2 column 1",
    );
    let mut deep = String::from("/");
    for _ in 0..40 {
        deep = format!("${{X:-{deep}}}");
    }
    check(
        &svc(&format!("volumes: [\"{deep}:/h\"]")),
        "BUNDLE_INVALID: compose file: interpolation nested too deeply",
    );
}

#[test]
fn interpolation_cannot_amplify_a_value_without_bound() {
    // A 20 KiB compose file referencing a 4 KiB value 5,000 times would interpolate to 20 MB.
    let refs = "${LONG}".repeat(5_000);
    let yaml = format!("services:\n  web:\n    image: nginx\n    command: \"{refs}\"\n");
    let long = "v".repeat(4096);
    let none = BTreeSet::new();
    let err = policy()
        .check_file(&yaml, &|n| (n == "LONG").then(|| long.clone()), &none)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "BUNDLE_TOO_LARGE: compose file interpolates over 8388608 bytes of values"
    );
    let yaml = yaml.replace(&refs, &"${LONG}".repeat(1_000));
    assert!(
        policy()
            .check_file(&yaml, &|n| (n == "LONG").then(|| long.clone()), &none)
            .is_ok()
    );
}

/// compose's model of a release at `/r/releases/abc`, reached through `/r/current`.
fn model_check(model: serde_json::Value, raw: &str) -> String {
    let links = |p: &Path| match p.to_str()? {
        "/r/current" => Some(PathBuf::from("releases/abc")),
        "/r/releases/abc/data/escape" => Some(PathBuf::from("/etc")),
        _ => None,
    };
    match policy().check_model(model, raw, Path::new("/r/current"), &links) {
        Ok(()) => "ok".into(),
        Err(r) => r.to_string(),
    }
}

#[test]
fn the_model_is_judged_with_its_absolute_paths_and_links() {
    use serde_json::json;
    let web = |extra: serde_json::Value| {
        let mut svc = json!({"image": "x", "command": null, "entrypoint": null, "networks": {"default": null}});
        svc.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"name": PROJECT, "services": {"web": svc},
               "networks": {"default": {"name": format!("{PROJECT}_default"), "ipam": {}}}})
    };
    let bind = |src: &str, ro: bool| json!({"volumes": [{"type": "bind", "source": src, "target": "/d", "read_only": ro, "bind": {"create_host_path": true}}]});
    let raw = "services:\n  web:\n    image: x\n    volumes: [./data:/d]\n";
    assert_eq!(model_check(web(bind("/r/current/data", false)), raw), "ok");
    assert_eq!(
        model_check(web(bind("/r/releases/abc/conf", false)), raw),
        "ok"
    );
    assert_eq!(
        model_check(web(bind("/r/current", false)), raw),
        "PRIVILEGED_REFUSED: web: volumes /r/current writable over the release's own files"
    );
    assert_eq!(model_check(web(bind("/r/current", true)), raw), "ok");
    // A link planted inside a bound dir leads out of the release.
    assert_eq!(
        model_check(web(bind("/r/current/data/escape/shadow", true)), raw),
        "PRIVILEGED_REFUSED: web: volumes /r/current/data/escape/shadow (a host path; the box's admin may allow it with allowed_binds: [/etc/shadow:ro]), web: volumes ./data/escape/shadow is a symlink or passes one: a container could have planted it"
    );
    // A value that came from a variable is named by it, never printed.
    let raw_secret =
        "services:\n  web:\n    image: x\n    privileged: ${PRIV}\n    cap_add: [\"${CAP}\"]\n";
    assert_eq!(
        model_check(
            web(json!({"privileged": true, "cap_add": ["s3cr3t-value"]})),
            raw_secret
        ),
        "PRIVILEGED_REFUSED: web: cap_add from ${CAP}, web: privileged"
    );
    // A key the compose file does not have (it came from elsewhere) is not printed either.
    assert_eq!(
        model_check(web(json!({"cap_add": ["SYS_PTRACE"]})), raw),
        "PRIVILEGED_REFUSED: web: cap_add (value not shown: not in the compose file)"
    );
    // A name from a variable is named by it, without the accepted form that would print it.
    assert_eq!(
        model_check(
            {
                let mut m =
                    web(json!({"volumes": [{"type": "volume", "source": "v", "target": "/v"}]}));
                m["volumes"] = json!({"v": {"name": "secret-value"}});
                m
            },
            "services:\n  web:\n    image: x\n    volumes: [{type: volume, source: v, target: /v}]\nvolumes:\n  v:\n    name: ${SECRET}\n"
        ),
        "BUNDLE_NONCONFORMING: volumes.v: name from ${SECRET}"
    );
}

/// A file by its path from this crate's directory.
fn crate_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The table against the compose specification's own key list
/// (`tests/data/compose-spec-keys.txt`): every key is classified, by a row of its own or by a
/// refused or constrained key above it whose rule judges the whole value.
#[test]
fn the_table_classifies_every_key_of_the_compose_specification() {
    let text = crate_file("tests/data/compose-spec-keys.txt");
    let has_children = |p: &str| {
        TABLE
            .iter()
            .any(|r| r.path.starts_with(&format!("{p}.")) || r.path.starts_with(&format!("{p}[]")))
    };
    let mut unclassified = Vec::new();
    let mut count = 0;
    for key in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        count += 1;
        if rule_of(key).is_some() {
            continue;
        }
        // The nearest ancestor with a row.
        let mut p = key;
        let mut covered = false;
        while let Some(cut) = p.rfind(['.', '[']) {
            p = &p[..cut];
            if let Some(rule) = rule_of(p) {
                covered = match rule {
                    Rule::Privileged | Rule::Refused => true,
                    Rule::Constrained(_) => !has_children(p),
                    Rule::Allowed => false,
                    // A rule this test does not know covers nothing: its keys show up below.
                    _ => false,
                };
                break;
            }
        }
        if !covered {
            unclassified.push(key);
        }
    }
    assert!(count > 300, "the key list has {count} keys");
    assert!(
        unclassified.is_empty(),
        "keys the policy table does not classify: {unclassified:?}"
    );
}

/// docs/compose-policy.md names every row of the table.
#[test]
fn every_row_is_documented() {
    let doc = crate_file("../docs/compose-policy.md");
    let missing: Vec<&str> = TABLE
        .iter()
        .map(|r| r.path)
        .filter(|p| !doc.contains(&format!("`{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/compose-policy.md: {missing:?}"
    );
}

/// A hint never suggests a waiver wider than the finding: the exact path an absolute source
/// names; none for a path the check can only guess (`~`, relative) or for `/` and a home
/// directory.
#[test]
fn a_bind_hint_names_the_exact_path_and_never_root_or_a_home() {
    let secrets = std::collections::BTreeSet::new();
    for (bind, hint) in [
        ("~/x:/x", None),
        ("../../cmd:/c", None),
        ("/:/host:ro", None),
        ("/root:/r", None),
        ("/home/admin:/h:ro", None),
        (
            "/home/admin/.cache/app:/c:ro",
            Some("[/home/admin/.cache/app:ro]"),
        ),
        ("/srv/data/app:/d", Some("[/srv/data/app:rw]")),
    ] {
        let yaml = format!("services:\n  web:\n    image: x\n    volumes: [\"{bind}\"]\n");
        let text = ComposePolicy::new("p")
            .check_file(&yaml, &|_| None, &secrets)
            .unwrap_err()
            .to_string();
        match hint {
            Some(h) => assert!(
                text.ends_with(&format!("allowed_binds: {h})")),
                "{bind}: {text}"
            ),
            None => assert!(!text.contains("allowed_binds"), "{bind}: {text}"),
        }
    }
}

/// Routing labels name only the env's own hosts (bundle.json's `address`, the box's
/// `allowed_route_hosts`); neither the bundle's `allow_privileged` nor the box's
/// `allow_unprefixed_names` widens them.
#[test]
fn routing_labels_name_only_the_envs_own_hosts() {
    let own = policy().route_hosts(["qa-02.example.com", "*.qa-02.example.com"]);
    let rule = |r: &str| svc(&format!("labels: {{traefik.http.routers.x.rule: \"{r}\"}}"));
    check_with(
        &own,
        &rule("Host(`qa-02.example.com`) && PathPrefix(`/api`)"),
        &[],
        "ok",
    );
    check_with(
        &own,
        &svc("labels: [caddy=api.qa-02.example.com]"),
        &[],
        "ok",
    );
    let foreign = "BUNDLE_NONCONFORMING: web: labels traefik.http.routers.x.rule names \
                   other.example.com, not this env's own address (the box's admin may allow it \
                   with allowed_route_hosts: [other.example.com])";
    for p in [
        own.clone(),
        own.clone().allow_privileged(true),
        own.clone().allow_unprefixed_names(true),
    ] {
        check_with(&p, &rule("Host(`other.example.com`)"), &[], foreign);
    }
    check_with(
        &own,
        &rule("PathPrefix(`/`)"),
        &[],
        "BUNDLE_NONCONFORMING: web: labels traefik.http.routers.x.rule cannot be judged: it does \
         not limit the router to named hosts (the box's admin may allow any host for this env \
         with allowed_route_hosts: [\"*\"])",
    );
    check_with(
        &own.clone().route_hosts(["other.example.com"]),
        &rule("Host(`other.example.com`)"),
        &[],
        "ok",
    );
    check_with(&own.route_hosts(["*"]), &rule("PathPrefix(`/`)"), &[], "ok");
}
