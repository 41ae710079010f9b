//! The paths compose and dockerd open, judged for what they will be when they are opened: the
//! files compose reads by path, bind sources a container could swap before the next start, and
//! names the daemon normalises. Each hostile case is a class member, not a one-off; ordinary
//! backends still pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use monky_bundle::{AllowedBind, ComposePolicy};
use serde_json::json;

const PROJECT: &str = "monky-env-qa-02";

/// The compose file check with `F=.env` known from the template and `SECRET` a secret.
fn file_verdict(p: &ComposePolicy, yaml: &str) -> String {
    let known = BTreeMap::from([("F".to_string(), ".env".to_string())]);
    let secrets = BTreeSet::from(["SECRET".to_string()]);
    match p.check_file(yaml, &|n| known.get(n).cloned(), &secrets) {
        Ok(()) => "ok".into(),
        Err(r) => r.to_string(),
    }
}

/// A one-service compose file with `body` indented under `web`; a whole file when `body`
/// already has a `services:` line.
fn file_of(body: &str) -> String {
    if body.lines().any(|l| l.starts_with("services:")) {
        return body.to_string();
    }
    let mut out = String::from("services:\n  web:\n    image: nginx\n");
    for line in body.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

const WEB_DATA: &str = "services:\n  web:\n    image: nginx\n    volumes: [./data:/data]\n";

/// `(name, compose file or service body, what the PRIVILEGED_REFUSED refusal must name)`.
#[rustfmt::skip]
const FILE_CASES: &[(&str, &str, &str)] = &[
    // Files compose reads by path: a literal `.env` only, whatever a variable would give.
    ("env-file-path-var", "env_file: \"${PATH:+/etc/shadow}\"", "web: env_file ${PATH:+/etc/shadow}: a file compose reads must be named literally"),
    ("env-file-docker-config", "env_file: \"${DOCKER_CONFIG:-/root/.docker}/config.json\"", "web: env_file ${DOCKER_CONFIG:-/root/.docker}/config.json: a file compose reads"),
    ("env-file-project-name", "env_file: \"${COMPOSE_PROJECT_NAME:+/etc/os-release}\"", "web: env_file ${COMPOSE_PROJECT_NAME:+/etc/os-release}:"),
    ("env-file-secret", "env_file: \"${SECRET}\"", "(${SECRET} is a secret)"),
    ("env-file-known-template-value", "env_file: \"${F}\"", "web: env_file ${F}: a file compose reads must be named literally"),
    ("env-file-home-long", "env_file:\n  - path: \"${HOME}/.env\"\n    required: false", "web: env_file ${HOME}/.env:"),
    ("env-file-escaped-dollar", "env_file: \"$$HOME/.env\"", "web: env_file $$HOME/.env:"),
    ("env-file-proc-environ", "env_file: /proc/self/environ", "web: env_file /proc/self/environ: only the release's own .env may be read"),
    ("env-file-parent-env", "env_file: ../.env", "web: env_file ../.env: only the release's own .env"),
    ("env-file-other-env", "env_file: ../../../envs/monky-env-other/current/.env", "web: env_file ../../../envs/monky-env-other/current/.env:"),
    ("env-file-member", "env_file: ./bundle.json", "web: env_file ./bundle.json: only the release's own .env"),
    ("env-file-template", "env_file: [.env, .env.template]", "web: env_file .env.template: only the release's own .env"),
    ("env-file-windows", "env_file: \"C:\\\\Windows\\\\env\"", "not a path on this box"),
    ("env-file-anchor", "x-e: &e /etc/shadow\nservices:\n  web:\n    image: nginx\n    env_file: *e\n", "web: env_file /etc/shadow: only the release's own .env"),
    ("env-file-merge-key", "x-b: &b\n  env_file: /etc/shadow\nservices:\n  web:\n    <<: *b\n    image: nginx\n", "web: env_file /etc/shadow:"),
    ("env-file-extends", "services:\n  base:\n    image: nginx\n    env_file: /var/lib/monky-deployd/bao.token\n  web:\n    extends: {service: base}\n", "base: env_file /var/lib/monky-deployd/bao.token:"),
    ("label-file-host", "label_file: /etc/shadow", "web: label_file /etc/shadow: only the release's own .env"),
    ("label-file-var", "label_file: \"${PATH:+/etc/passwd}\"", "web: label_file ${PATH:+/etc/passwd}: a file compose reads"),
    ("label-file-token", "label_file: [./.env, /var/lib/monky-deployd/bao.token]", "web: label_file /var/lib/monky-deployd/bao.token:"),
    ("config-file-var", "configs: [c]\nconfigs:\n  c:\n    file: \"${PATH:+/etc/shadow}\"\n", "configs.c: file ${PATH:+/etc/shadow}: a file compose reads"),
    ("secret-file-home", "secrets: [s]\nsecrets:\n  s:\n    file: \"${HOME}/.ssh/id_rsa\"\n", "secrets.s: file ${HOME}/.ssh/id_rsa:"),
    ("secret-file-tilde", "secrets: [s]\nsecrets:\n  s:\n    file: ~/.docker/config.json\n", "secrets.s: file ~/.docker/config.json: only a file inside the release dir"),
    ("config-file-climbs", "configs: [c]\nconfigs:\n  c:\n    file: ./data/../../../bao.token\n", "configs.c: file ./data/../../../bao.token:"),
    // A bind can never be swapped later: nothing below a writable bind.
    ("swap-same-service", "volumes: [./data:/d, ./data/sub:/h]", "web: volumes ./data/sub lies below the writable bind ./data of web"),
    ("swap-second-service", "services:\n  a:\n    image: busybox\n    volumes: [./data:/d]\n  b:\n    image: busybox\n    depends_on: [a]\n    volumes: [\"./data/sub:/h:ro\"]\n", "b: volumes ./data/sub lies below the writable bind ./data of a"),
    ("swap-long-syntax", "volumes:\n  - ./data:/d\n  - type: bind\n    source: ./data/x\n    target: /h\n    read_only: true", "web: volumes ./data/x lies below the writable bind ./data"),
    ("swap-long-writer", "volumes:\n  - type: bind\n    source: ./data\n    target: /d\n  - ./data/x:/h", "web: volumes ./data/x lies below"),
    ("swap-dotdot", "volumes: [./data:/d, ./data/../data/sub:/h]", "web: volumes ./data/sub lies below the writable bind ./data"),
    ("swap-dot-and-slashes", "volumes: [./data/:/d, .//data/./sub//x:/h]", "web: volumes ./data/sub/x lies below"),
    ("swap-deep", "volumes: [./a:/a, ./a/b/c/d/e:/h]", "web: volumes ./a/b/c/d/e lies below the writable bind ./a"),
    ("swap-config-file", "configs: [c]\nconfigs:\n  c:\n    file: ./data/app.conf\n", "configs.c: file ./data/app.conf lies below the writable bind ./data of web"),
    ("swap-secret-file", "secrets: [s]\nsecrets:\n  s:\n    file: ./data/s\n", "secrets.s: file ./data/s lies below the writable bind ./data of web"),
    ("swap-volumes-from", "services:\n  a:\n    image: busybox\n    volumes: [./data:/d]\n  b:\n    image: busybox\n    volumes_from: [a]\n    volumes: [\"./data/link:/h\"]\n", "b: volumes ./data/link lies below"),
    ("swap-restart-same-service", "restart: always\nvolumes: [\"./data:/d:rw\", \"./data/up:/up:ro\"]", "web: volumes ./data/up lies below"),
    // Names compared the way the daemon reads them.
    ("ulimit-rttime-upper-number", "ulimits:\n  RTTIME: -1", "web: ulimits RTTIME"),
    ("ulimit-rttime-upper", "ulimits:\n  RTTIME: {soft: -1, hard: -1}", "web: ulimits RTTIME"),
    ("ulimit-rtprio-mixed", "ulimits:\n  RtPrio: 99", "web: ulimits RtPrio"),
    ("ulimit-padded", "ulimits:\n  \" rtprio \": -1", "web: ulimits rtprio"),
    ("propagation-upper-long", "volumes:\n  - type: bind\n    source: ./data\n    target: /d\n    bind: {propagation: RSHARED}", "web: volumes ./data propagation RSHARED"),
    ("propagation-upper-short", "volumes: [\"./data:/d:RSLAVE\"]", "web: volumes ./data propagation RSLAVE"),
    ("recursive-writable-upper", "volumes:\n  - type: bind\n    source: /etc/localtime\n    target: /t\n    read_only: true\n    bind: {recursive: WRITABLE}", "web: volumes /etc/localtime recursive writable"),
    ("sysctl-slash-dotdot", "sysctls:\n  net/../kernel/core_pattern: \"|/x\"", "web: sysctls net/../kernel/core_pattern"),
    ("sysctl-dot-slash-dotdot", "sysctls:\n  net.ipv4/../../kernel/core_pattern: \"|/x\"", "web: sysctls net.ipv4/../../kernel/core_pattern"),
    ("sysctl-empty-segment", "sysctls: [\"net..core.x=1\"]", "web: sysctls net..core.x"),
    ("sysctl-padded-kernel", "sysctls:\n  \" kernel.core_pattern\": x", "web: sysctls kernel.core_pattern"),
    ("security-opt-colon", "security_opt: [\"seccomp:unconfined\"]", "web: security_opt seccomp:unconfined"),
    ("security-opt-disable", "security_opt: [disable]", "web: security_opt disable"),
    ("cap-padded-mixed-case", "cap_add: [\" Cap_Sys_Admin \"]", "web: cap_add SYS_ADMIN"),
    ("tmpfs-with-source", "volumes:\n  - type: tmpfs\n    source: /etc\n    target: /t", "web: volumes tmpfs with the source /etc"),
    ("bind-windows-drive", "volumes: [\"C:\\\\Windows:/w\"]", "web: volumes C:\\Windows:/w not a path on this box"),
    ("bind-unc-share", "volumes: [\"\\\\\\\\server\\\\share:/s\"]", "not a path on this box"),
    ("bind-named-pipe", "volumes: [\"//./pipe/docker_engine:/p\"]", "web: volumes //./pipe/docker_engine:/p not a path on this box"),
    ("bind-long-drive", "volumes:\n  - type: bind\n    source: \"c:/x\"\n    target: /x", "web: volumes c:/x not a path on this box"),
];

#[test]
fn hostile_paths_and_names_are_refused_before_the_lease() {
    assert!(FILE_CASES.len() >= 50, "{} cases", FILE_CASES.len());
    let names: BTreeSet<&str> = FILE_CASES.iter().map(|c| c.0).collect();
    assert_eq!(names.len(), FILE_CASES.len(), "case names are unique");
    let p = ComposePolicy::new(PROJECT);
    for (name, body, names) in FILE_CASES {
        let mut yaml = file_of(body);
        // The top-level keys of a service-body case follow the service.
        if let Some(at) = body
            .find("\nconfigs:\n")
            .or_else(|| body.find("\nsecrets:\n"))
        {
            yaml = format!("{}{}", WEB_DATA, &body[at + 1..]).replace(
                "    volumes: [./data:/data]\n",
                &format!("    volumes: [./data:/data]\n    {}\n", &body[..at]),
            );
        }
        let got = file_verdict(&p, &yaml);
        assert!(
            got.starts_with("PRIVILEGED_REFUSED: ") && got.contains(names),
            "{name}: wanted ...{names}... got {got}\n{yaml}"
        );
        // The box's blanket waiver is the bundle's to ask for, and it is the only one.
        assert_eq!(
            file_verdict(&p.clone().allow_privileged(true), &yaml),
            "ok",
            "{name}"
        );
    }
}

/// compose's model of a release at `/r/releases/abc` with `data/sub` and `conf` links on disk
/// (planted by a container, or by whoever) and a host writable allowlist entry above it.
fn model_verdict(
    p: &ComposePolicy,
    svc: serde_json::Value,
    top: serde_json::Value,
    raw: &str,
) -> String {
    let links = |p: &Path| match p.to_str()? {
        "/r/releases/abc/data/sub" => Some(PathBuf::from("/")),
        "/r/releases/abc/conf" => Some(PathBuf::from("data")),
        "/r/releases/abc/up" => Some(PathBuf::from("..")),
        _ => None,
    };
    let mut model = json!({"name": PROJECT, "services": {"web": svc}});
    model
        .as_object_mut()
        .unwrap()
        .extend(top.as_object().unwrap().clone());
    match p.check_model(model, raw, Path::new("/r/releases/abc"), &links) {
        Ok(()) => "ok".into(),
        Err(r) => r.to_string(),
    }
}

fn bind(source: &str, ro: bool) -> serde_json::Value {
    json!({"type": "bind", "source": source, "target": "/t", "read_only": ro})
}

#[test]
fn links_below_the_release_and_writable_parents_are_refused_on_the_model() {
    let p = ComposePolicy::new(PROJECT);
    // The compose file as written: literal values, so the findings may print them.
    let raw = "services:\n  web:\n    image: x\n    volumes: [./literal:/l]\nconfigs:\n  c:\n    file: ./literal\nsecrets:\n  s:\n    file: ./literal\n";
    #[rustfmt::skip]
    let cases: &[(&str, serde_json::Value, serde_json::Value, &str)] = &[
        ("bind-through-link", json!({"image": "x", "volumes": [bind("/r/releases/abc/data/sub/etc", true)]}), json!({}), "web: volumes ./data/sub/etc is a symlink or passes one"),
        ("bind-is-link", json!({"image": "x", "volumes": [bind("/r/releases/abc/data/sub", true)]}), json!({}), "web: volumes ./data/sub is a symlink or passes one"),
        ("bind-link-back-in", json!({"image": "x", "volumes": [bind("/r/releases/abc/conf", true)]}), json!({}), "web: volumes ./conf is a symlink or passes one"),
        ("bind-link-climbs", json!({"image": "x", "volumes": [bind("/r/releases/abc/up/other", true)]}), json!({}), "web: volumes ./up/other is a symlink or passes one"),
        ("config-through-link", json!({"image": "x", "configs": [{"source": "c"}]}), json!({"configs": {"c": {"file": "/r/releases/abc/conf/app.conf"}}}), "configs.c: file ./conf/app.conf is a symlink or passes one"),
        ("secret-through-link", json!({"image": "x", "secrets": [{"source": "s"}]}), json!({"secrets": {"s": {"file": "/r/releases/abc/data/sub/etc/shadow"}}}), "secrets.s: file ./data/sub/etc/shadow is a symlink or passes one"),
        ("bind-not-absolute", json!({"image": "x", "volumes": [bind("C:\\foo", false)]}), json!({}), "web: volumes C:\\foo not a path on this box"),
        ("swap-on-the-model", json!({"image": "x", "volumes": [bind("/r/releases/abc/data", false), bind("/r/releases/abc/data/x", true)]}), json!({}), "web: volumes ./data/x lies below the writable bind ./data of web"),
    ];
    for (name, svc, top, names) in cases {
        let got = model_verdict(&p, svc.clone(), top.clone(), raw);
        assert!(
            got.starts_with("PRIVILEGED_REFUSED: ") && got.contains(names),
            "{name}: wanted ...{names}... got {got}"
        );
    }
    // A writable allowlisted host path that holds the release dir would let a container
    // rewrite the release's .env and compose file before the next start.
    let widened = p
        .clone()
        .allowed_binds(vec!["/r:rw".parse::<AllowedBind>().unwrap()]);
    let got = model_verdict(
        &widened,
        json!({"image": "x", "volumes": [bind("/r", false)]}),
        json!({}),
        raw,
    );
    assert!(
        got.contains("web: volumes /r is writable and holds the release dir"),
        "{got}"
    );
    assert_eq!(
        model_verdict(
            &widened,
            json!({"image": "x", "volumes": [bind("/r", true)]}),
            json!({}),
            raw
        ),
        "ok"
    );
    // A value from a secret is named by its variable, never printed.
    let raw_secret =
        "services:\n  web:\n    image: x\n    volumes: [\"${SECRET}:/d\", \"./data/x:/x\"]\n";
    let got = model_verdict(
        &p,
        json!({"image": "x", "volumes": [bind("/r/releases/abc/data", false), bind("/r/releases/abc/data/x", true)]}),
        json!({}),
        raw_secret,
    );
    assert!(
        got.contains("web: volumes from ${SECRET} lies below"),
        "{got}"
    );
    assert!(!got.contains("./data/x"), "{got}");
    // env_file is gone from compose's model; the model check judges it on the compose file.
    let got = model_verdict(
        &p,
        json!({"image": "x", "environment": {"A": "1"}}),
        json!({}),
        "services:\n  web:\n    image: x\n    env_file: \"${PATH:+/etc/shadow}\"\n",
    );
    assert!(
        got.contains("web: env_file ${PATH:+/etc/shadow}: a file compose reads"),
        "{got}"
    );
}

#[test]
fn ordinary_backends_still_pass() {
    let p = ComposePolicy::new(PROJECT);
    #[rustfmt::skip]
    let ok: &[&str] = &[
        "volumes: [./data:/data, \"./nginx.conf:/etc/nginx/nginx.conf:ro\", pgdata:/var/lib/pg]\nenv_file: .env\ntmpfs: [/run]\nvolumes:\n  pgdata: {}\n",
        "env_file: ./.env\nlabel_file: .env",
        "env_file:\n  - path: ./.env\n    required: false\n    format: raw",
        "services:\n  app:\n    image: x\n    volumes: [./uploads:/u]\n  worker:\n    image: x\n    volumes: [./uploads:/u]\n",
        "services:\n  app:\n    image: x\n    volumes: [./data:/d]\n  sidecar:\n    image: x\n    volumes_from: [app]\n",
        "volumes: [./data:/d, \"./conf:/c:ro\", \"./conf/extra.yml:/x.yml:ro\"]",
        "configs: [c]\nconfigs:\n  c:\n    file: ./conf/c.txt\n",
        "sysctls:\n  net.core.somaxconn: 1024\n  net/ipv4/ip_unprivileged_port_start: 0\n  net.ipv4.conf.eth0/100.rp_filter: 1",
        "ulimits:\n  NOFILE: {soft: 1024, hard: 2048}\n  core: 0",
        "security_opt: [\"no-new-privileges=1\", \"no-new-privileges:true\"]",
        "volumes:\n  - type: bind\n    source: ./data\n    target: /d\n    bind: {propagation: RPRIVATE, create_host_path: true}\n  - type: tmpfs\n    target: /cache\n    tmpfs: {size: 1000000}",
        "volumes: [\"/etc/localtime:/etc/localtime:ro\", \"/etc/timezone:/etc/timezone:ro\"]",
        "volumes:\n  - type: bind\n    source: data\n    target: /d",
    ];
    for body in ok {
        let mut yaml = file_of(body);
        if let Some(at) = body
            .find("\nconfigs:\n")
            .or_else(|| body.find("\nvolumes:\n  pgdata"))
        {
            yaml = file_of(&body[..at]) + &body[at + 1..];
        }
        assert_eq!(file_verdict(&p, &yaml), "ok", "\n{yaml}");
    }
}
