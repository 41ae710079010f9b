//! A box as the original (Python) agent left it, upgraded with `apt-get install ./…deb` under
//! systemd: for each transport the original's install.sh wrote, the first tick afterwards
//! heartbeats the running sha with no lease and no `compose up`; a box on `sdk` without the
//! `ziti` CLI is refused by preinst and keeps the original agent.

use std::process::Command;
use std::time::{Duration, Instant};

use monky_agent_proto::ReportResult;
use monky_testkit::bao::FakeBao;
use monky_testkit::peers::Peers;
use monky_testkit::tenancy::{Desired, FakeTenancy};
use serde_json::json;

use super::{BoxTest, ENV, Machine, SEE_VALUE, run_ok, text, wait_for};
use crate::util::TestBundle;

const IDENTITY: &str = "/opt/openziti/etc/identities/monky-host.env-qa-02.json";
const STATE: &str = "/var/lib/monky-deployd";

/// A stand-in for the original agent's package (0.1.7): its binary, its three units (the
/// proxy running `ziti tunnel proxy` as user `ziti` with the identity on its command line) and
/// its system user. Built with dpkg-deb, so the real package's install is a real upgrade.
fn original_package(dir: &std::path::Path) -> std::path::PathBuf {
    let root = dir.join("original");
    let put = |rel: &str, text: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    put(
        "DEBIAN/control",
        "Package: monky-deployd\nVersion: 0.1.7\nArchitecture: all\n\
         Maintainer: stand-in <x@example.invalid>\nDepends: adduser\n\
         Description: the original agent, as a stand-in\n",
        0o644,
    );
    put(
        "DEBIAN/postinst",
        "#!/bin/sh\nset -e\n\
         getent passwd monky-deployd >/dev/null || adduser --quiet --system --group \
         --home /var/lib/monky-deployd --no-create-home monky-deployd\n\
         getent passwd ziti >/dev/null || adduser --quiet --system --group --no-create-home ziti\n\
         install -d -o monky-deployd -g monky-deployd -m 0700 /var/lib/monky-deployd\n",
        0o755,
    );
    put(
        "usr/bin/monky-deployd",
        "#!/bin/sh\necho 'monky-deployd 0.1.7 (original stand-in)'\n",
        0o755,
    );
    put(
        "lib/systemd/system/monky-deployd.service",
        "[Unit]\nDescription=original agent tick\n[Service]\nType=oneshot\n\
         ExecStart=/usr/bin/monky-deployd run --once\nSuccessExitStatus=75\n\
         User=monky-deployd\n",
        0o644,
    );
    put(
        "lib/systemd/system/monky-deployd.timer",
        "[Unit]\nDescription=original agent timer\n[Timer]\nOnUnitInactiveSec=60s\n\
         Unit=monky-deployd.service\n[Install]\nWantedBy=timers.target\n",
        0o644,
    );
    put(
        "lib/systemd/system/monky-deployd-proxy.service",
        &format!(
            "[Unit]\nDescription=original proxy\n[Service]\n\
             ExecStart=/usr/bin/ziti tunnel proxy -i {IDENTITY} monky.tenancy.deploy:18443 openbao:18200\n\
             User=ziti\nRestart=always\n[Install]\nWantedBy=multi-user.target\n"
        ),
        0o644,
    );
    let deb = dir.join("monky-deployd_0.1.7_all.deb");
    run_ok(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&root)
            .arg(&deb),
    );
    deb
}

/// Builds a file-based apt repository in `dir` (`deb [trusted=yes] file:DIR ./`) with stand-ins
/// for what install.sh takes from OpenZiti's suite and the archive: `ziti-edge-tunnel` (enrols by
/// writing the identity, runs as a service), `openziti` (the `ziti` CLI, whose proxy must be able
/// to read the identity) and `acl` (a `setfacl` that grants the read with group permissions).
pub(super) fn stand_in_apt_repo(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let build = |name: &str, files: &[(&str, &str, u32)]| {
        let root = dir.join(format!("{name}-root"));
        let mut all = vec![(
            "DEBIAN/control".to_string(),
            format!(
                "Package: {name}\nVersion: 99.0-standin\nArchitecture: all\n\
                 Maintainer: stand-in <x@example.invalid>\nDescription: test stand-in for {name}\n"
            ),
            0o644,
        )];
        all.extend(
            files
                .iter()
                .map(|(p, t, m)| (p.to_string(), t.to_string(), *m)),
        );
        for (rel, text, mode) in all {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        run_ok(
            Command::new("dpkg-deb")
                .args(["--root-owner-group", "--build"])
                .arg(&root)
                .arg(dir.join(format!("{name}_99.0-standin_all.deb"))),
        );
        std::fs::remove_dir_all(&root).unwrap();
    };
    build(
        "ziti-edge-tunnel",
        &[
            (
                "usr/bin/ziti-edge-tunnel",
                "#!/bin/sh\ncase \"$1\" in\nenroll)\n  while [ $# -gt 0 ]; do [ \"$1\" = --identity ] && id=$2; shift; done\n  \
                 echo '{\"ztAPI\": \"stand-in\"}' > \"$id\"; chmod 0600 \"$id\" ;;\n\
                 run|run-host) exec sleep infinity ;;\n*) exit 2 ;;\nesac\n",
                0o755,
            ),
            (
                "lib/systemd/system/ziti-edge-tunnel.service",
                "[Unit]\nDescription=tunneler stand-in\n[Service]\nExecStart=/usr/bin/ziti-edge-tunnel run\n\
                 [Install]\nWantedBy=multi-user.target\n",
                0o644,
            ),
        ],
    );
    build(
        "openziti",
        &[(
            "usr/bin/ziti",
            "#!/bin/sh\n[ \"$1 $2 $3\" = 'tunnel proxy -i' ] && [ -r \"$4\" ] || exit 3\nexec sleep infinity\n",
            0o755,
        )],
    );
    build(
        "acl",
        &[(
            "usr/bin/setfacl",
            "#!/bin/sh\n# -m u:USER:PERM PATH\nuser=${2#u:}; perm=${user#*:}; user=${user%%:*}\n\
             chgrp \"$user\" \"$3\" && chmod \"g+$perm\" \"$3\"\n",
            0o755,
        )],
    );
    let index = run_ok(
        Command::new("dpkg-scanpackages")
            .args(["--multiversion", "."])
            .current_dir(dir),
    );
    std::fs::write(dir.join("Packages"), index).unwrap();
}

/// The config the original install.sh (0.1.5 to 0.1.7) wrote, key for key; only the addresses
/// point at this process's fakes instead of the mesh. `transport` is left out when `None`, as in
/// a hand-written config that relied on the original default.
fn original_config(
    transport: Option<&str>,
    tenancy: &FakeTenancy,
    bao: &FakeBao,
    project: &str,
    registry: &str,
) -> String {
    let t = tenancy.addr();
    let b = bao.addr();
    let transport = transport.map_or(String::new(), |t| format!("transport: {t}\n"));
    format!(
        "# /etc/monky-deployd/config.yaml — written by install.sh 0.1.7\n\
         env_id: {ENV}\nsite: cbs\n{transport}identity: {IDENTITY}\n\
         tenancy:\n  service: monky.tenancy.deploy\n  host: {ip}\n  port: {tp}       # intercept port\n  \
         scheme: http\n  proxy_addr: {t}\n\
         bao:\n  service: openbao\n  addr: http://{b}\n  auth_mount: jwt-tenancy\n  role: see-env\n  \
         proxy_addr: {b}\n\
         interval_s: 60\nlaptop_mode: false\nvolumes_on_absent: keep\nlog_level: INFO\n\
         compose_project: {project}\nregistry_host: {registry}\n",
        ip = t.ip(),
        tp = t.port(),
    )
}

#[test]
#[ignore = "needs the .deb, the Debian image and docker: run by `cargo xtask dist --test` (ci's packaging step)"]
fn a_box_of_the_original_agent_upgrades_under_systemd() {
    let started = Instant::now();
    let t = BoxTest::load();
    let (deb, deb_name, image, e2e) = (&t.deb, &t.deb_name, &t.image, &t.e2e);
    let (docker, prefix, registry) = (&t.docker, &t.prefix, &t.registry);
    let deb_dir = deb.parent().unwrap().to_path_buf();
    let scratch = tempfile::tempdir().unwrap();
    let original_deb = original_package(scratch.path())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();

    let Peers { tenancy, bao } = Peers::fake();
    bao.put_secret(ENV, "see_value", SEE_VALUE);

    let b = Machine::boot(
        e2e,
        image,
        (
            format!("{prefix}pkg-upgrade"),
            "pkgupgrade",
            format!("{prefix}pkg-upgrade"),
        ),
        &[
            format!("{}:/pkg:ro", deb_dir.display()),
            format!("{}:/orig:ro", scratch.path().display()),
        ],
    );

    // The release the original agent applied, running under its compose project.
    let bundle = TestBundle {
        compose: format!(
            "services:\n  web:\n    image: {}\n    env_file: .env\n",
            e2e.get("MONKY_E2E_IMAGE_WEB_1")
        ),
        env_template: "SEE_VALUE=${SEE_VALUE}\n".into(),
        manifest: json!({"vault_mode": "openbao", "entries": [
            {"var": "SEE_VALUE", "path": format!("monky/{ENV}/see/see_value"), "kind": "supplied", "version": null},
        ]}),
        meta: json!({"env_id": ENV, "tier": "prod", "site": "cbs", "renderer": "compose"}),
    };
    let sha = bundle.sha();
    tenancy.publish_bundle(ENV, &sha, bundle.tar());
    tenancy.set_desired(ENV, Desired::sha(sha.clone()));

    // Lays the box out as the original agent left it: its package and units, the identity, the
    // state dir with bao.token and an original-shape state.json, releases/<sha> and current,
    // the agent's own DOCKER_CONFIG, and the release's containers up.
    let lay_out = |transport: Option<&str>, ziti: bool, token_times: bool| {
        b.sh(
            "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q monky-deployd; \
              rm -rf /etc/monky-deployd /var/lib/monky-deployd /usr/bin/ziti \
              /etc/systemd/system/*.wants/monky-deployd*; systemctl daemon-reload",
        );
        b.ok(&format!(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q /orig/{original_deb}"
        ));
        if ziti {
            // OpenZiti's CLI, standing in: the proxy it runs must be able to read the identity.
            b.put(
                "/usr/bin/ziti",
                "#!/bin/sh\n[ \"$1 $2 $3\" = 'tunnel proxy -i' ] && [ -r \"$4\" ] || exit 3\nexec sleep infinity\n",
            );
            b.ok("chmod 755 /usr/bin/ziti");
        }
        b.ok(&format!(
            "mkdir -p $(dirname {IDENTITY}) && echo '{{\"ztAPI\": \"stand-in\"}}' > {IDENTITY} && \
             chgrp monky-deployd {IDENTITY} && chmod 0640 {IDENTITY} && \
             install -d -o monky-deployd -g monky-deployd -m 0750 /etc/monky-deployd"
        ));
        b.put(
            "/etc/monky-deployd/config.yaml",
            &original_config(transport, &tenancy, &bao, &b.project, registry),
        );
        let grant = tenancy.mint_grant(ENV);
        let login = monky_bao_client::BaoClient::builder(bao.url())
            .build()
            .unwrap()
            .login_jwt("jwt-tenancy", "see-env", &grant)
            .unwrap();
        b.put(&format!("{STATE}/bao.token"), login.token.expose_secret());
        let now = monky_deployd::clock::wall();
        let token = if token_times {
            json!({"source": "lease", "obtained_at": now as f64 - 13.0 * 3600.0,
                   "expires_at": now as f64 + 11.0 * 3600.0})
        } else {
            json!({"source": "lease"})
        };
        b.put(
            &format!("{STATE}/state.json"),
            &json!({"env_id": ENV, "applied_sha": sha, "desired_sha": sha,
                    "last_checkin": now as f64 - 60.0, "last_result": "applied",
                    "last_error": null, "token": token})
            .to_string(),
        );
        let release = format!("{STATE}/{ENV}/releases/{sha}");
        b.ok(&format!("mkdir -p {release}"));
        b.put(&format!("{release}/docker-compose.yml"), &bundle.compose);
        b.put(&format!("{release}/.env.template"), &bundle.env_template);
        b.put(
            &format!("{release}/secrets.manifest.json"),
            &bundle.manifest.to_string(),
        );
        b.put(&format!("{release}/bundle.json"), &bundle.meta.to_string());
        b.put(
            &format!("{release}/.env"),
            &format!("SEE_VALUE={SEE_VALUE}\n"),
        );
        // The pull credential in the agent's own DOCKER_CONFIG, as 0.1.7 wrote it.
        b.put(
            "/tmp/cred",
            &format!(
                "{}:{}",
                e2e.get("MONKY_E2E_REGISTRY_USER"),
                e2e.get("MONKY_E2E_REGISTRY_PASSWORD")
            ),
        );
        b.ok(&format!(
            "mkdir -p {STATE}/docker && printf '{{\"auths\": {{\"%s\": {{\"auth\": \"%s\"}}}}}}\\n' \
             '{registry}' \"$(base64 -w0 /tmp/cred)\" > {STATE}/docker/config.json && rm /tmp/cred && \
             chmod 0700 {STATE}/docker && chmod 0600 {STATE}/docker/config.json"
        ));
        b.ok(&format!(
            "ln -sfn releases/{sha} {STATE}/{ENV}/current && chmod 0600 {STATE}/bao.token \
             {STATE}/state.json {release}/.env && chown -R monky-deployd:monky-deployd {STATE} && \
             DOCKER_CONFIG={STATE}/docker docker compose -p {p} -f {STATE}/{ENV}/current/docker-compose.yml up -d",
            p = b.project
        ));
        b.ok("systemctl enable monky-deployd.timer");
        if transport == Some("proxy") {
            b.ok("systemctl enable --now monky-deployd-proxy.service");
        }
        wait_for("the release to be healthy", Duration::from_secs(90), || {
            running_id(&b).filter(|id| {
                run_ok(Command::new(docker).args(["inspect", "-f", "{{.State.Health.Status}}", id]))
                    .trim()
                    == "healthy"
            })
        })
    };

    // 1. sdk without the ziti CLI: preinst refuses before anything is replaced.
    lay_out(Some("sdk"), false, true);
    let refused = b.sh(&format!(
        "cd /pkg && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ./{deb_name}"
    ));
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("sudo apt-get install openziti"), "{said}");
    assert_eq!(
        b.ok("dpkg-query -W -f '${Version} ${db:Status-Abbrev}' monky-deployd"),
        "0.1.7 ii "
    );
    assert!(b.ok("monky-deployd").contains("original stand-in"));
    assert!(b.sh("test -e /etc/monky-deployd/proxy.env").status.code() != Some(0));
    println!("sdk without ziti: refused by preinst, the original agent kept");

    // 2. Each transport the original wrote (and none, which meant sdk), carried over.
    for (transport, token_times) in [
        (Some("sdk"), true),
        (None, false),
        (Some("proxy"), true),
        (Some("system"), false),
    ] {
        let container = lay_out(transport, true, token_times);
        let leases = tenancy.lease_count(ENV);
        let reports = tenancy.reports(ENV).len();
        bao.clear_requests();
        let upgraded = Instant::now();
        b.ok(&format!(
            "cd /pkg && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ./{deb_name}"
        ));
        assert_eq!(
            b.ok("dpkg-query -W -f '${Version}' monky-deployd"),
            monky_deployd::VERSION
        );
        let proxied = transport != Some("system");
        if proxied {
            assert_eq!(
                b.ok("cat /etc/monky-deployd/proxy.env | grep -v '^#'"),
                format!("MONKY_ZITI_IDENTITY={IDENTITY}\n")
            );
            assert_eq!(
                b.ok("systemctl show -p User --value monky-deployd-proxy.service"),
                "monky-deployd\n"
            );
            wait_for("the proxy to run", Duration::from_secs(30), || {
                (b.ok(
                    "systemctl show -p ActiveState -p SubState --value monky-deployd-proxy.service",
                ) == "active\nrunning\n")
                    .then_some(())
            });
        }
        assert_eq!(
            b.ok("systemctl is-enabled monky-deployd.timer"),
            "enabled\n"
        );
        // The first tick after the upgrade (the timer's, or this one if it has not fired yet).
        b.sh("systemctl start monky-deployd.service");
        let report = wait_for("the first tick's report", Duration::from_secs(60), || {
            tenancy.reports(ENV).into_iter().nth(reports)
        });
        let journal = b.ok("journalctl -u monky-deployd.service --no-pager -o cat");
        assert_eq!(
            report.result,
            ReportResult::Applied,
            "{transport:?}: {report:?}\n{journal}"
        );
        assert_eq!(
            report.sha.as_ref().map(|s| s.as_str()),
            Some(sha.as_str()),
            "{transport:?}"
        );
        assert_eq!(
            tenancy.lease_count(ENV),
            leases,
            "{transport:?}: a lease was made"
        );
        assert_eq!(
            running_id(&b).as_deref(),
            Some(container.as_str()),
            "{transport:?}: the release's container was recreated"
        );
        assert!(!journal.contains("compose up"), "{transport:?}:\n{journal}");
        let st: serde_json::Value =
            serde_json::from_str(&b.ok(&format!("cat {STATE}/state.json"))).unwrap();
        assert_eq!(st["version"], 1, "{transport:?}");
        assert_eq!(st["applied_prod"], true, "{transport:?}");
        // The token was 13 h into its 24 h: renewed in that tick (its facts learnt first when
        // the original had not kept them).
        let renewed = bao
            .agent_requests()
            .iter()
            .any(|r| r.path.ends_with("auth/token/renew-self"));
        assert_eq!(renewed, token_times, "{transport:?}");
        println!(
            "{transport:?}: upgraded and heartbeat applied in {:.1}s",
            upgraded.elapsed().as_secs_f64()
        );
    }

    // 3. A release of the original's that publishes host port 80, after the upgrade: refused
    // by the budget with the key that would allow it named (OPERATIONS.md, "Host ports below
    // 1024"), before any lease or pull, and the running release left alone. (Setting the key
    // and applying is tests/upgrade.rs's: here it would bind the shared engine's port 80.)
    let running = running_id(&b).expect("the release runs");
    let port_80 = TestBundle {
        compose: format!(
            "services:\n  web:\n    image: {}\n    env_file: .env\n    ports: [\"80:{}\"]\n",
            e2e.get("MONKY_E2E_IMAGE_WEB_2"),
            e2e.get("MONKY_E2E_WEB_PORT")
        ),
        ..bundle.clone()
    };
    let refused_sha = port_80.sha();
    tenancy.publish_bundle(ENV, &refused_sha, port_80.tar());
    tenancy.set_desired(ENV, Desired::sha(refused_sha.clone()));
    let (leases, reports) = (tenancy.lease_count(ENV), tenancy.reports(ENV).len());
    b.sh("systemctl start monky-deployd.service");
    let report = wait_for("the refusal's report", Duration::from_secs(60), || {
        tenancy
            .reports(ENV)
            .into_iter()
            .skip(reports)
            .find(|r| r.sha.as_ref().map(|s| s.as_str()) == Some(refused_sha.as_str()))
    });
    let detail = report.detail.clone().unwrap_or_default();
    assert_eq!(report.result, ReportResult::Failed, "{report:?}");
    assert!(
        detail.starts_with("BUDGET_EXCEEDED: ")
            && detail.contains("web: ports 80 below budget.min_published_port 1024"),
        "{detail}"
    );
    assert_eq!(tenancy.lease_count(ENV), leases, "a refusal leases nothing");
    assert_eq!(running_id(&b).as_deref(), Some(running.as_str()));
    let explain = b.ok("monky-deployd explain");
    assert!(explain.contains("budget.min_published_port"), "{explain}");
    println!("a release publishing port 80: refused naming budget.min_published_port");
    println!("upgrade test: {:.1}s", started.elapsed().as_secs_f64());
}

/// The id of the release's running container, if one runs.
fn running_id(b: &Machine) -> Option<String> {
    let out = Command::new(&b.docker)
        .args(["ps", "-q", "--filter"])
        .arg(format!("label=com.docker.compose.project={}", b.project))
        .output()
        .ok()?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!id.is_empty() && !id.contains('\n')).then_some(id)
}
