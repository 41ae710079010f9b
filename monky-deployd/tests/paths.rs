//! The paths compose and dockerd open, at the agent's level: hostile bundles that read host
//! files through `env_file` / `label_file` / file sources, that set up a bind a container could
//! swap before the next start, or that spell a name the daemon normalises. Each goes through
//! `bundle check`, a real tick (the real `docker compose config` behind the stub) and compose's
//! own model, like the corpus in `policy.rs`.

use crate::policy::{Case, PR, case, check_cases, file_only};

#[rustfmt::skip]
const CASES: &[Case] = &[
    // Files compose reads by path: only a literal `.env`.
    case("env-file-path-var", "env_file: \"${PATH:+/etc/shadow}\"", PR, "web: env_file ${PATH:+/etc/shadow}: a file compose reads must be named literally"),
    case("env-file-docker-config", "env_file: \"${DOCKER_CONFIG:-/root/.docker}/config.json\"", PR, "web: env_file ${DOCKER_CONFIG:-/root/.docker}/config.json:"),
    case("env-file-project-name", "env_file: \"${COMPOSE_PROJECT_NAME:+/etc/os-release}\"", PR, "web: env_file ${COMPOSE_PROJECT_NAME:+/etc/os-release}:"),
    case("env-file-template-var", "env_file: \"${MONKY_ENV_ID:+/etc/hostname}\"", PR, "web: env_file ${MONKY_ENV_ID:+/etc/hostname}:"),
    case("env-file-home-long", "env_file:\n  - path: \"${HOME}/.env\"\n    required: false", PR, "web: env_file ${HOME}/.env:"),
    case("env-file-escaped-dollar", "env_file: \"$$HOME/.env\"", PR, "web: env_file $$HOME/.env:"),
    case("env-file-proc-environ", "env_file: /proc/self/environ", PR, "web: env_file /proc/self/environ: only the release's own .env may be read"),
    case("env-file-parent-env", "env_file: ../.env", PR, "web: env_file ../.env: only the release's own .env"),
    case("env-file-other-env", "env_file: ../../../envs/monky-env-other/current/.env", PR, "web: env_file ../../../envs/monky-env-other/current/.env:"),
    case("env-file-member", "env_file: ./bundle.json", PR, "web: env_file ./bundle.json: only the release's own .env"),
    case("env-file-anchor", "x-e: &e /etc/os-release\nservices:\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    env_file: *e\n", PR, "web: env_file /etc/os-release: only the release's own .env"),
    case("env-file-merge-key", "x-b: &b\n  env_file: /etc/os-release\nservices:\n  web:\n    <<: *b\n    image: 127.0.0.1:5000/monky/web:1\n", PR, "web: env_file /etc/os-release:"),
    case("env-file-extends", "services:\n  base:\n    image: 127.0.0.1:5000/monky/web:1\n    env_file: /etc/os-release\n  web:\n    extends: {service: base}\n", PR, "base: env_file /etc/os-release:"),
    case("label-file-host", "label_file: /etc/os-release", PR, "web: label_file /etc/os-release: only the release's own .env"),
    case("label-file-var", "label_file: \"${PATH:+/etc/passwd}\"", PR, "web: label_file ${PATH:+/etc/passwd}:"),
    case("config-file-var", "configs: [c]\nconfigs:\n  c:\n    file: \"${PATH:+/etc/hostname}\"", PR, "configs.c: file ${PATH:+/etc/hostname}:"),
    case("secret-file-home", "secrets: [s]\nsecrets:\n  s:\n    file: \"${HOME}/.ssh/id_rsa\"", PR, "secrets.s: file ${HOME}/.ssh/id_rsa:"),
    // A bind can never be swapped later.
    case("swap-same-service", "volumes: [./data:/d, ./data/sub:/h]", PR, "web: volumes ./data/sub lies below the writable bind ./data of web"),
    case("swap-second-service", "services:\n  a:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [./data:/d]\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    depends_on: [a]\n    volumes: [\"./data/sub:/h:ro\"]\n", PR, "web: volumes ./data/sub lies below the writable bind ./data of a"),
    case("swap-long-syntax", "volumes:\n  - ./data:/d\n  - type: bind\n    source: ./data/x\n    target: /h\n    read_only: true", PR, "web: volumes ./data/x lies below the writable bind ./data"),
    case("swap-dotdot", "volumes: [./data:/d, ./data/../data/sub:/h]", PR, "web: volumes ./data/sub lies below"),
    case("swap-dot-and-slashes", "volumes: [./data/:/d, .//data/./sub//x:/h]", PR, "web: volumes ./data/sub/x lies below"),
    case("swap-config-file", "volumes: [./data:/d]\nconfigs: [c]\nconfigs:\n  c:\n    file: ./data/app.conf", PR, "configs.c: file ./data/app.conf lies below the writable bind ./data of web"),
    case("swap-secret-file", "volumes: [./data:/d]\nsecrets: [s]\nsecrets:\n  s:\n    file: ./data/s", PR, "secrets.s: file ./data/s lies below the writable bind ./data of web"),
    case("swap-volumes-from", "services:\n  a:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes: [./data:/d]\n  web:\n    image: 127.0.0.1:5000/monky/web:1\n    volumes_from: [a]\n    volumes: [\"./data/link:/h\"]\n", PR, "web: volumes ./data/link lies below"),
    case("swap-restart-always", "restart: always\nvolumes: [\"./data:/d:rw\", \"./data/up:/up:ro\"]", PR, "web: volumes ./data/up lies below"),
    // Names as the daemon reads them.
    case("ulimit-rttime-upper-number", "ulimits:\n  RTTIME: -1", PR, "web: ulimits RTTIME"),
    case("ulimit-rttime-upper", "ulimits:\n  RTTIME: {soft: -1, hard: -1}", PR, "web: ulimits RTTIME"),
    case("ulimit-rtprio-mixed", "ulimits:\n  RtPrio: 99", PR, "web: ulimits RtPrio"),
    case("propagation-upper-long", "volumes:\n  - type: bind\n    source: ./data\n    target: /d\n    bind: {propagation: RSHARED}", PR, "web: volumes ./data propagation RSHARED"),
    // compose drops an upper-case short-syntax mode from its model; the file check refuses it.
    file_only("propagation-upper-short", "volumes: [\"./data:/d:RSLAVE\"]", PR, "web: volumes ./data propagation RSLAVE"),
    case("recursive-writable-upper", "volumes:\n  - type: bind\n    source: /etc/localtime\n    target: /t\n    read_only: true\n    bind: {recursive: WRITABLE}", PR, "web: volumes /etc/localtime recursive writable"),
    case("sysctl-slash-dotdot", "sysctls:\n  net/../kernel/core_pattern: \"|/x\"", PR, "web: sysctls net/../kernel/core_pattern"),
    case("sysctl-dot-slash-dotdot", "sysctls:\n  net.ipv4/../../kernel/core_pattern: \"|/x\"", PR, "web: sysctls net.ipv4/../../kernel/core_pattern"),
    case("sysctl-empty-segment", "sysctls: [\"net..core.x=1\"]", PR, "web: sysctls net..core.x"),
    case("security-opt-colon", "security_opt: [\"seccomp:unconfined\"]", PR, "web: security_opt seccomp:unconfined"),
    case("security-opt-disable", "security_opt: [disable]", PR, "web: security_opt disable"),
    case("cap-padded-mixed-case", "cap_add: [\" Cap_Sys_Admin \"]", PR, "web: cap_add SYS_ADMIN"),
    case("tmpfs-with-source", "volumes:\n  - type: tmpfs\n    source: /etc\n    target: /t", PR, "web: volumes tmpfs with the source /etc"),
    case("bind-windows-drive", "volumes: [\"C:\\\\Windows:/w\"]", PR, "not a path on this box"),
    case("bind-named-pipe", "volumes: [\"//./pipe/docker_engine:/p\"]", PR, "web: volumes //./pipe/docker_engine:/p not a path on this box"),
    case("bind-unc-share", "volumes: [\"//server/share:/s\"]", PR, "web: volumes //server/share:/s not a path on this box"),
    case("bind-long-drive", "volumes:\n  - type: bind\n    source: \"c:/x\"\n    target: /x", PR, "web: volumes c:/x not a path on this box"),
];

fn named(c: &Case, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| c.name.starts_with(p))
}

#[test]
fn the_path_corpus_is_large_and_its_names_are_unique() {
    assert!(CASES.len() >= 40, "{} cases", CASES.len());
    let names: std::collections::BTreeSet<&str> = CASES.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), CASES.len());
    for c in CASES {
        assert!(
            named(
                c,
                &[
                    "env-file",
                    "label-file",
                    "config-file",
                    "secret-file",
                    "swap-"
                ]
            ) || named(
                c,
                &[
                    "ulimit",
                    "propagation",
                    "recursive",
                    "sysctl",
                    "security",
                    "cap-",
                    "tmpfs",
                    "bind-"
                ]
            ),
            "{} is in no class",
            c.name
        );
    }
}

#[test]
fn files_compose_reads_must_be_literal_and_the_releases_own() {
    check_cases(CASES, |c| {
        named(c, &["env-file", "label-file", "config-file", "secret-file"])
    });
}

#[test]
fn nothing_is_bound_below_a_writable_bind() {
    check_cases(CASES, |c| named(c, &["swap-"]));
}

#[test]
fn names_are_compared_as_the_daemon_reads_them() {
    check_cases(CASES, |c| {
        named(
            c,
            &[
                "ulimit",
                "propagation",
                "recursive",
                "sysctl",
                "security",
                "cap-",
                "tmpfs",
                "bind-",
            ],
        )
    });
}
