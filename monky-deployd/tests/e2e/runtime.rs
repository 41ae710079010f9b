//! What runs, judged on the real engine: a root image whose command drops to a uid a host
//! account has, a program that puts a secret into its own arguments, and the ordinary
//! backends that drop to their own uid. Each image is the suite's web image (root, busybox)
//! with a command the compose file gives: nothing the checks before start can see.

use super::*;

/// A command that makes the named account in the container's `/etc/passwd` and drops to it
/// with busybox `su`, as the official postgres, redis and mysql entrypoints drop with gosu or
/// su-exec, then sleeps; the healthcheck passes at once.
fn drops_to(name: &str, uid: u32) -> String {
    format!(
        "    entrypoint: [\"/bin/sh\", \"-c\", \"echo '{name}:x:{uid}:{uid}::/:/bin/sh' >> \
         /etc/passwd && exec su -s /bin/sh {name} -c 'exec /bin/busybox sleep 3600'\"]\n    \
         healthcheck:\n      test: [\"CMD\", \"/bin/busybox\", \"true\"]\n      interval: 1s\n"
    )
}

/// Each container by its id and start time: a recreated one differs.
fn started(seen: Vec<Seen>) -> Vec<(String, String)> {
    seen.into_iter().map(|c| (c.id, c.started_at)).collect()
}

/// The processes of `container` on the host, with their four uids.
fn uids_of(b: &E2eBox, container: &str) -> Vec<String> {
    b.project
        .docker_ok(["top", container, "-eo", "pid,ruid,euid,suid,fsuid"])
        .lines()
        .skip(1)
        .map(str::to_owned)
        .collect()
}

/// A service with no `user:` runs as root and passes every check before start; its command
/// then drops to uid 65534, which the box's `nobody` has too, so `nobody` could read its
/// secrets in `/proc/<pid>/environ`. Seen right after `up`: stopped, the last good release
/// back, `SECRET_READABLE_ON_HOST` naming the service, the uid and the account.
#[test]
fn a_root_image_that_drops_to_a_shared_uid_is_caught_after_up_and_falls_back() {
    let Some(b) = E2eBox::new("rt-drop") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    let before = started(b.project.containers());
    let dropping = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        &drops_to("nobody", 65534),
        &[],
    ));
    b.w.publish(&dropping);
    let run = b.w.tick();
    run.expect(1);
    run.says(&["SECRET_READABLE_ON_HOST", "runs as uid 65534", "nobody"]);
    let r = b.w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("SECRET_READABLE_ON_HOST: web: process "),
    );
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("runs as uid 65534, which the host account nobody has too")
            && detail.contains(&format!("reverted to {}", &first[..12])),
        "{detail}"
    );
    // The first release runs again, healthy; the dropped process is gone.
    assert_eq!(b.current(), Some(release(&first)));
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_ne!(
        started(b.project.containers()),
        before,
        "not brought up again"
    );
    let web = b.web();
    assert!(
        uids_of(&b, &web).iter().all(|l| !l.contains("65534")),
        "{:?}",
        uids_of(&b, &web)
    );
    assert_no_secret(&b, &run);

    // The box's admin accepts the uid: it applies.
    b.w.config_extra("allowed_shared_uids: [65534]\n");
    b.w.run(&["run", "--once", "--force"]).ok();
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
}

/// A program that puts its environment into its own arguments (here `$(env)`, its argument 5, escaped from
/// compose so the container's shell expands it) shows every secret to every local user in
/// `/proc/<pid>/cmdline`: no compose key names the secret, so only the look sees it. With no
/// earlier release, its containers are stopped and nothing runs.
#[test]
fn an_argument_that_carries_a_secret_at_runtime_is_caught() {
    let Some(b) = E2eBox::new("rt-argv") else {
        return;
    };
    let service = "    entrypoint: [\"/bin/sh\", \"-c\", \"exec /bin/busybox sh -c 'sleep 3600; true' \
                   holder \\\"$$(env)\\\"\"]\n    healthcheck:\n      test: [\"CMD\", \
                   \"/bin/busybox\", \"true\"]\n      interval: 1s\n";
    let bundle = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        service,
        &[],
    ));
    b.w.stage_grant();
    let sha = b.w.publish(&bundle);
    let run = b.w.tick();
    run.expect(1);
    run.says(&["SECRET_ON_COMMAND_LINE", "in its argument 5"]);
    let r = b.w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("SECRET_ON_COMMAND_LINE: web: process "),
    );
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("no earlier healthy release to fall back to"),
        "{detail}"
    );
    let seen = b.project.containers();
    assert!(
        seen.iter().all(|c| c.state != "running"),
        "a container still runs: {seen:?}"
    );
    assert_eq!(b.w.current_target(), Some(release(&sha)));
    assert_no_secret(&b, &run);
}

/// A release the box's admin waived applies; once the waiver is taken back, the next
/// heartbeat sees the uid, stops the release and brings back the one applied before it.
#[test]
fn a_heartbeat_sees_a_shared_uid_once_the_waiver_is_gone() {
    let Some(b) = E2eBox::new("rt-heartbeat") else {
        return;
    };
    let first = b.first_apply(&b.bundle(&b.e2e.image_1));
    b.w.config_extra("allowed_shared_uids: [65534]\n");
    let dropping = web_bundle(compose_yaml(
        b.e2e,
        &b.e2e.image_1,
        Some(b.port),
        &drops_to("nobody", 65534),
        &[],
    ));
    let second = b.w.publish(&dropping);
    b.w.tick().ok();
    assert_eq!(b.current(), Some(release(&second)));
    // A heartbeat with the waiver: nothing to say.
    b.w.tick().ok();
    assert_report(&b.w.last_report(), ReportResult::Applied, None);

    b.w.set_config_extra("");
    let run = b.w.tick();
    run.expect(1);
    let r = b.w.last_report();
    assert_report(
        &r,
        ReportResult::Failed,
        Some("SECRET_READABLE_ON_HOST: web: process "),
    );
    let detail = r.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("nobody") && detail.contains(&format!("reverted to {}", &first[..12])),
        "{detail}"
    );
    assert_eq!(b.current(), Some(release(&first)));
    assert_healthy(&b.project.containers(), &b.project.name);
    assert_no_secret(&b, &run);
}

/// The ordinary backends: postgres, redis and mysql images start as root and drop to their
/// own uid (999) before the server starts. On a box where no host account has that uid they
/// apply and stay applied through a heartbeat; where one has it, the admin's waiver does.
#[test]
fn backends_that_drop_to_their_own_uid_still_apply() {
    let Some(b) = E2eBox::new("rt-backends") else {
        return;
    };
    let shared = monky_deployd::shared_uid::HostAccounts::read();
    if !shared.at(999).is_empty() {
        b.w.config_extra("allowed_shared_uids: [999]\n");
    }
    let mut compose = String::from("services:\n");
    for (service, account) in [("db", "postgres"), ("cache", "redis"), ("mysql", "mysql")] {
        compose.push_str(&format!(
            "  {service}:\n    image: {}\n    env_file: .env\n{}",
            b.e2e.image_1,
            drops_to(account, 999)
        ));
    }
    let bundle = web_bundle(compose);
    b.w.stage_grant();
    b.w.publish(&bundle);
    let run = b.w.tick();
    run.ok();
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
    let seen = b.project.containers();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for c in &seen {
        assert!(
            uids_of(&b, &c.name).iter().any(|l| l.contains("999")),
            "{} did not drop: {:?}",
            c.name,
            uids_of(&b, &c.name)
        );
    }
    b.w.tick().ok();
    assert_report(&b.w.last_report(), ReportResult::Applied, None);
    assert_no_secret(&b, &run);
}

/// Per-uid kernel counters cross envs: a container at uid 65534 (the box's `nobody`) holding
/// inotify instances uses up `nobody`'s own `fs.inotify.max_user_instances`, and every other
/// container's at that uid. No compose key limits it, so nothing refuses it; `doctor` names
/// the class and shows the instances in use at that uid, and the engine's lack of remapping.
/// The hog (testimages/inotify-hog) runs in the container's cgroup at its uid.
#[test]
fn an_inotify_hog_at_a_shared_uid_is_shown_by_doctor() {
    let Some(b) = E2eBox::new("rt-inotify") else {
        return;
    };
    let hogs = 6;
    let compose = format!(
        "services:\n  hog:\n    image: {}\n    user: \"65534:65534\"\n    {AS_ANY_UID}",
        b.e2e.image_1
    );
    b.w.stage_grant();
    b.w.publish(&web_bundle(compose));
    b.w.tick().ok();
    let built = b.project.scratch.path().join("hog");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testimages/inotify-hog/hog.c");
    let cc = Command::new("cc")
        .args(["-static", "-Os", "-o"])
        .arg(&built)
        .arg(&source)
        .output()
        .expect("a C compiler (cc) builds the inotify hog");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let hog = format!("{}-hog-1", b.project.name);
    b.project
        .docker_ok(["cp", built.to_str().unwrap(), &format!("{hog}:/hog")]);
    b.project
        .docker_ok(["exec", "-d", &hog, "/hog", &hogs.to_string()]);
    // One tick: the look records the uids the release runs as.
    b.w.tick().ok();
    let doctor = b.w.run(&["doctor", "--json"]);
    let doc: Value = serde_json::from_str(&doctor.stdout()).unwrap();
    let check = |name: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} check: {doc:#}"))
    };
    let inotify = check("inotify per uid");
    let detail = inotify["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("shares that uid's inotify instances"),
        "{detail}"
    );
    let in_use: u64 = detail
        .split("uid 65534 (nobody): ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("uid 65534 not shown: {detail}"));
    assert!(in_use >= hogs, "{detail}");
    let userns = check("userns");
    assert_eq!(userns["verdict"], "warn", "{userns:#}");
    let detail = userns["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("nobody (65534)") && detail.contains("inotify, mqueue, nproc"),
        "{detail}"
    );
    assert!(
        detail.contains("host accounts at uids this box's releases ran as: nobody (65534)"),
        "{detail}"
    );
}
