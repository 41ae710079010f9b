//! `check_privileged` over compose YAML: what is refused, what passes, and that values which
//! only become dangerous after interpolation are caught.

use std::collections::BTreeMap;

use monky_bundle::check_privileged;

/// Checks one compose file with the given interpolation values.
fn check_env(yaml: &str, env: &[(&str, &str)], expected: &str) {
    let map: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = |name: &str| map.get(name).cloned();
    let got = match check_privileged(yaml, &lookup) {
        Ok(()) => "ok".to_owned(),
        Err(r) => r.to_string(),
    };
    assert_eq!(got, expected, "\n{yaml}");
    for value in map.values() {
        if value.len() > 8 {
            assert!(
                !got.contains(value.as_str()),
                "refusal leaks an interpolated value"
            );
        }
    }
}

fn check(yaml: &str, expected: &str) {
    check_env(yaml, &[], expected);
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

#[test]
fn harmless_files_pass() {
    check(
        "services:\n  web:\n    image: nginx\n    volumes: [./data:/data, pgdata:/var/lib/pg, /srv/app:/app:ro]\n",
        "ok",
    );
    check(
        &svc(
            "network_mode: bridge\npid: \"service:db\"\ncap_add: [NET_BIND_SERVICE, CHOWN]\nprivileged: false",
        ),
        "ok",
    );
    check(
        &svc("environment:\n  NOTE: \"privileged: true, network_mode: host\""),
        "ok",
    );
    check("services: {}\n", "ok");
    check("version: '3'\n", "ok");
    check(&svc("command: echo $$HOME ${MISSING:-ok}"), "ok");
}

#[test]
fn each_privilege_is_named() {
    check(
        &svc("privileged: true"),
        "PRIVILEGED_REFUSED: web: privileged",
    );
    check(
        &svc("privileged: \"TRUE\""),
        "PRIVILEGED_REFUSED: web: privileged",
    );
    check(
        &svc("privileged: yes"),
        "PRIVILEGED_REFUSED: web: privileged",
    );
    check(
        &svc("network_mode: host"),
        "PRIVILEGED_REFUSED: web: network_mode host",
    );
    check(
        &svc("network_mode: \"Host \""),
        "PRIVILEGED_REFUSED: web: network_mode host",
    );
    for key in ["pid", "ipc", "userns_mode", "uts", "cgroup"] {
        check(
            &svc(&format!("{key}: host")),
            &format!("PRIVILEGED_REFUSED: web: {key} host"),
        );
    }
    check(
        &svc("devices: [\"/dev/sda:/dev/sda\"]"),
        "PRIVILEGED_REFUSED: web: devices",
    );
    check(
        &svc("build:\n  context: .\n  privileged: true\n  network: host"),
        "PRIVILEGED_REFUSED: web: build privileged, web: build network host",
    );
}

#[test]
fn cap_add_spellings() {
    for cap in [
        "SYS_ADMIN",
        "sys_admin",
        "CAP_SYS_ADMIN",
        "cap_Sys_Admin",
        " SYS_ADMIN ",
    ] {
        check(
            &svc(&format!("cap_add: [\"{cap}\"]")),
            "PRIVILEGED_REFUSED: web: cap_add SYS_ADMIN",
        );
    }
    for cap in ["ALL", "all", "CAP_ALL"] {
        check(
            &svc(&format!("cap_add:\n  - {cap}")),
            "PRIVILEGED_REFUSED: web: cap_add ALL",
        );
    }
    check(
        &svc("cap_add: [SYS_ADMIN, CAP_SYS_ADMIN, all]"),
        "PRIVILEGED_REFUSED: web: cap_add SYS_ADMIN, web: cap_add ALL",
    );
    check(&svc("cap_drop: [ALL]"), "ok");
}

#[test]
fn binds_short_and_long_syntax() {
    check(
        &svc("volumes: [\"/:/host\"]"),
        "PRIVILEGED_REFUSED: web: bind /",
    );
    check(
        &svc("volumes: [\"/var/run/docker.sock:/var/run/docker.sock\"]"),
        "PRIVILEGED_REFUSED: web: bind /var/run/docker.sock",
    );
    check(
        &svc("volumes: [\"/run/docker.sock:/s:ro\"]"),
        "PRIVILEGED_REFUSED: web: bind /run/docker.sock",
    );
    check(
        &svc("volumes: [\"/var/run:/r\"]"),
        "PRIVILEGED_REFUSED: web: bind /var/run",
    );
    check(
        &svc("volumes: [\"/proc/1/root:/h\"]"),
        "PRIVILEGED_REFUSED: web: bind /proc",
    );
    check(
        &svc("volumes: [\"../../../../../../:/h\"]"),
        "PRIVILEGED_REFUSED: web: bind outside the project directory",
    );
    check(
        &svc("volumes:\n  - type: bind\n    source: /var/run/docker.sock\n    target: /sock"),
        "PRIVILEGED_REFUSED: web: bind /var/run/docker.sock",
    );
    check(
        &svc("volumes:\n  - type: bind\n    source: /\n    target: /host\n    read_only: true"),
        "PRIVILEGED_REFUSED: web: bind /",
    );
    check(
        &svc("volumes:\n  - type: volume\n    source: data\n    target: /data"),
        "ok",
    );
    check(&svc("volumes:\n  - /data"), "ok");
    check(
        "services:\n  web:\n    image: x\n    volumes: [root:/host]\nvolumes:\n  root:\n    driver: local\n    driver_opts: {type: none, o: bind, device: /}\n",
        "PRIVILEGED_REFUSED: volume root: bind /",
    );
}

#[test]
fn interpolation_happens_before_the_check() {
    check(
        &svc("privileged: ${PRIV:-true}"),
        "PRIVILEGED_REFUSED: web: privileged",
    );
    check_env(
        &svc("privileged: ${PRIV:-true}"),
        &[("PRIV", "false")],
        "ok",
    );
    check_env(
        &svc("privileged: ${PRIV}"),
        &[("PRIV", "true")],
        "PRIVILEGED_REFUSED: web: privileged",
    );
    check(
        &svc("network_mode: ${NM-host}"),
        "PRIVILEGED_REFUSED: web: network_mode host",
    );
    check_env(&svc("network_mode: ${NM-host}"), &[("NM", "")], "ok");
    check(
        &svc("volumes: [\"${SOCK:-/var/run/docker.sock}:/s\"]"),
        "PRIVILEGED_REFUSED: web: bind /var/run/docker.sock",
    );
    check_env(
        &svc("volumes: [\"$ROOT:/h\"]"),
        &[("ROOT", "/")],
        "PRIVILEGED_REFUSED: web: bind /",
    );
    check(
        &svc("volumes: [\"${A:-${B:-/}}:/h\"]"),
        "PRIVILEGED_REFUSED: web: bind /",
    );
    check_env(
        &svc("cap_add: [\"${CAP}\"]"),
        &[("CAP", "cap_sys_admin")],
        "PRIVILEGED_REFUSED: web: cap_add SYS_ADMIN",
    );
    // `$$` is an escaped dollar, not a reference.
    check_env(&svc("network_mode: \"$$NM\""), &[("NM", "host")], "ok");
    // A secret-looking value that makes something dangerous is never echoed.
    check_env(
        &svc("volumes: [\"${DATA_DIR}/../../../../../../..:/h\"]"),
        &[("DATA_DIR", "/very/secret/path-value")],
        "PRIVILEGED_REFUSED: web: bind /",
    );
}

#[test]
fn anchors_and_merge_keys_are_expanded() {
    check(
        "x-danger: &danger\n  privileged: true\n  network_mode: host\nservices:\n  web:\n    <<: *danger\n    image: nginx\n",
        "PRIVILEGED_REFUSED: web: privileged, web: network_mode host",
    );
    check(
        "x-caps: &caps [SYS_ADMIN]\nservices:\n  web:\n    image: nginx\n    cap_add: *caps\n",
        "PRIVILEGED_REFUSED: web: cap_add SYS_ADMIN",
    );
}

#[test]
fn hostile_yaml_is_refused_not_expanded() {
    let mut bomb = String::from(
        "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let prev = format!("*a{}", i - 1);
        bomb.push_str(&format!("a{i}: &a{i} [{}]\n", [prev.as_str(); 9].join(",")));
    }
    bomb.push_str("services:\n  web:\n    image: nginx\n    labels: *a9\n");
    let got = check_privileged(&bomb, &|_| None).expect_err("alias bomb");
    assert!(
        got.to_string()
            .starts_with("BUNDLE_INVALID: compose file: yaml over the alias/size budget at line "),
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
    let err = check_privileged(&yaml, &|n| (n == "LONG").then(|| long.clone())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "BUNDLE_TOO_LARGE: compose file interpolates over 8388608 bytes of values"
    );
    // A thousand of them fit.
    let yaml = yaml.replace(&refs, &"${LONG}".repeat(1_000));
    assert!(check_privileged(&yaml, &|n| (n == "LONG").then(|| long.clone())).is_ok());
}

#[test]
fn a_parsed_model_is_judged_like_its_yaml() {
    use monky_bundle::check_privileged_model;
    let model = serde_json::json!({"services": {"web": {"image": "x", "privileged": true}}});
    assert_eq!(
        check_privileged_model(model).unwrap_err().to_string(),
        "PRIVILEGED_REFUSED: web: privileged"
    );
    let model = serde_json::json!({"services": {"web": {"image": "x", "network_mode": "bridge"}}});
    assert!(check_privileged_model(model).is_ok());
}
