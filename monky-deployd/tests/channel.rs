//! The tenancy channel from the box's side (issue 20): a local user who listens on the proxy's
//! loopback ports while the proxy is down or restarting gets no bearer and moves nothing, and a
//! 401 from tenancy alone never deletes a token OpenBao still accepts.
//!
//! The squatter is a real listener run as uid 65534 through `setpriv`, as the attacks in
//! `boxfiles` are; it records every byte it is sent and answers what an attacker would.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use monky_agent_proto::ReportResult;
use monky_testkit::tenancy::{Endpoint, Fault};
use serde_json::json;

use crate::util::*;

const NOBODY: u32 = 65534;

/// A listener on 127.0.0.1:`port` run as uid 65534. Each connection: read what comes (until a
/// request head, a close or 3 s), record it, answer `answer`. It ends by itself after a minute.
/// With `defer`, the kernel completes a connection only once data arrives (`TCP_DEFER_ACCEPT`),
/// so until the agent sends, the squatter's side is a half-open socket. With `v6` it listens
/// on `[::1]` instead; with `full` its accept queue is kept full by connections of its own and
/// nothing is accepted, so another connection is never accepted in time.
const SQUATTER: &str = r#"
import binascii, socket, sys, time
port, answer = int(sys.argv[1]), sys.argv[2].encode()
v6 = sys.argv[3] == "v6"
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if sys.argv[3] == "defer":
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
s.bind(("::1" if v6 else "0.0.0.0" if sys.argv[3] == "wide" else "127.0.0.1", port))
if sys.argv[3] == "full":
    s.listen(0)
    own = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        own.append(c)
    time.sleep(0.5)
    print("listening", flush=True)
    time.sleep(60)
    sys.exit(0)
s.listen(16)
print("listening", flush=True)
s.settimeout(60)
end = time.time() + 60
while time.time() < end:
    try:
        c, _ = s.accept()
    except OSError:
        break
    c.settimeout(3)
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            chunk = c.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    print("got", len(got), binascii.hexlify(got).decode(), flush=True)
    try:
        c.sendall(answer)
    except OSError:
        pass
    c.close()
"#;

struct Squatter {
    child: Child,
}

impl Squatter {
    fn start(port: u16, answer: &str) -> Self {
        Self::start_with(port, answer, "plain")
    }

    fn start_with(port: u16, answer: &str, mode: &str) -> Self {
        let mut child = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                SQUATTER,
                &port.to_string(),
                answer,
                mode,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("setpriv python3");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "listening", "the squatter did not start");
        Self { child }
    }

    /// Stops the squatter; what each connection sent it.
    fn finish(mut self) -> Vec<Vec<u8>> {
        let _ = self.child.kill();
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let _ = self.child.wait();
        out.lines()
            .filter_map(|l| l.strip_prefix("got "))
            .map(|l| {
                let hex = l.split_once(' ').map_or("", |(_, h)| h);
                hex::decode(hex).unwrap()
            })
            .collect()
    }
}

/// A 401 as tenancy words it.
fn unauthenticated() -> String {
    let body = r#"{"code":"AGENT_UNAUTHENTICATED","detail":"unknown or revoked token"}"#;
    http_answer("401 Unauthorized", body)
}

/// A retire with a volume purge for the box's own env.
fn down_and_purge() -> String {
    let body = json!({"env_id": ENV, "action": "down", "purge_volumes": true}).to_string();
    http_answer("200 OK", &body)
}

fn http_answer(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A loopback port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Rewrites the config so `key` (`tenancy` or `bao`) is dialled at `port`.
fn dial_at(w: &World, section_addr: SocketAddr, port: u16) {
    dial_at_ip(w, section_addr, "127.0.0.1".parse().unwrap(), port);
}

fn dial_at_ip(w: &World, section_addr: SocketAddr, ip: std::net::IpAddr, port: u16) {
    let text = std::fs::read_to_string(w.config_path()).unwrap();
    let from = format!("proxy_addr: {section_addr}\n");
    assert!(text.contains(&from), "{text}");
    let to = SocketAddr::new(ip, port);
    let text = text.replace(&from, &format!("proxy_addr: {to}\n"));
    std::fs::write(w.config_path(), text).unwrap();
}

/// The box's own routable address: where a packet to the documentation network would leave
/// from (nothing is sent).
fn own_address() -> std::net::IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    probe
        .connect("198.51.100.1:9")
        .expect("this box has a route");
    let ip = probe.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "{ip}");
    ip
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .unwrap()
        .map_or_else(|| "no such user".to_owned(), |u| u.name)
}

fn token_text(w: &World) -> String {
    std::fs::read_to_string(w.state_dir().join("bao.token")).expect("bao.token is kept")
}

/// A box whose default release is applied through the proxy transport; its sha.
fn applied_box() -> (World, String) {
    let w = World::with(WorldOptions { tls_proxy: true });
    let sha = w.applied();
    assert_report(&w.last_report(), ReportResult::Applied, None);
    (w, sha)
}

/// Asserts that the tick was refused for `code` naming uid 65534, and that the box is as it
/// was: the same token, the same `current`, no compose call.
#[track_caller]
fn refused_and_untouched(w: &World, run: &Run, code: &str, token: &str, sha: &str, calls: usize) {
    run.expect(1);
    run.says(&[code, "uid 65534", &format!("({})", user_name(NOBODY))]);
    assert_eq!(token_text(w), token, "the token changed");
    w.assert_current(sha);
    let calls_now = w.docker_calls();
    assert_eq!(
        calls_now.len(),
        calls,
        "compose ran: {:?}",
        &calls_now[calls..]
    );
}

#[test]
fn a_squatter_on_tenancys_port_with_the_proxy_down_gets_no_bearer_and_moves_nothing() {
    for answer in [unauthenticated(), down_and_purge()] {
        let (w, sha) = applied_box();
        let token = token_text(&w);
        let calls = w.docker_calls().len();
        let seen_by_tenancy = w.requests().len();
        let port = free_port();
        dial_at(&w, w.tenancy.addr(), port);

        let squatter = Squatter::start(port, &answer);
        let run = w.tick();
        let sent = squatter.finish();

        assert!(!sent.is_empty(), "the agent never dialled the squatter");
        for bytes in &sent {
            assert!(
                bytes.is_empty(),
                "the squatter was sent {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        refused_and_untouched(&w, &run, "TENANCY_LISTENER_UNTRUSTED", &token, &sha, calls);
        assert_eq!(w.requests().len(), seen_by_tenancy);
        assert_eq!(w.state()["last_code"], json!("TENANCY_LISTENER_UNTRUSTED"));
    }
}

#[test]
fn a_squatter_on_the_boxs_own_address_gets_no_bearer_and_moves_nothing() {
    // Not loopback, yet a socket of this box: the kernel names its owner just the same.
    let (w, sha) = applied_box();
    let token = token_text(&w);
    let calls = w.docker_calls().len();
    let seen_by_tenancy = w.requests().len();
    let port = free_port();
    let ip = own_address();
    dial_at_ip(&w, w.tenancy.addr(), ip, port);
    let squatter = Squatter::start_with(port, &down_and_purge(), "wide");
    let run = w.tick();
    let sent = squatter.finish();
    assert!(!sent.is_empty(), "the agent never dialled the squatter");
    assert!(sent.iter().all(Vec::is_empty), "{sent:?}");
    refused_and_untouched(&w, &run, "TENANCY_LISTENER_UNTRUSTED", &token, &sha, calls);
    assert_eq!(w.requests().len(), seen_by_tenancy);
    assert!(
        run.stderr()
            .contains(&format!("{ip}:{port} is served by uid {NOBODY}")),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_squatter_that_defers_accepting_is_named_by_its_half_open_socket() {
    // sock_diag reports a socket still waiting for data as uid 0; the agent must read the
    // listener's owner for it instead of trusting "root".
    let (w, sha) = applied_box();
    let token = token_text(&w);
    let calls = w.docker_calls().len();
    let port = free_port();
    dial_at(&w, w.tenancy.addr(), port);
    let squatter = Squatter::start_with(port, &unauthenticated(), "defer");
    let run = w.tick();
    let sent = squatter.finish();
    assert!(sent.iter().all(Vec::is_empty), "{sent:?}");
    refused_and_untouched(&w, &run, "TENANCY_LISTENER_UNTRUSTED", &token, &sha, calls);
}

/// A loopback relay to `upstream` on 127.0.0.1:`port`, run by the test's own user as the
/// proxy would be; it stops taking connections when dropped.
struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(port: u16, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                let Ok((down, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let Ok(up) = TcpStream::connect(upstream) else {
                    continue;
                };
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                };
                pipe(down.try_clone().unwrap(), up.try_clone().unwrap());
                pipe(up, down);
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_squatter_while_the_proxy_restarts_is_refused_and_the_proxy_back_serves_again() {
    let (w, sha) = applied_box();
    let token = token_text(&w);
    let port = free_port();
    dial_at(&w, w.tenancy.addr(), port);
    w.tenancy
        .set_desired(ENV, monky_testkit::tenancy::Desired::sha(sha.clone()));

    // The proxy serves: a heartbeat through it.
    let relay = Relay::start(port, w.tenancy.addr());
    w.tick().ok();
    drop(relay);

    // It restarts; a local user takes the port in the gap.
    let calls = w.docker_calls().len();
    let squatter = Squatter::start(port, &unauthenticated());
    let run = w.tick();
    let sent = squatter.finish();
    assert!(
        !sent.is_empty() && sent.iter().all(Vec::is_empty),
        "{sent:?}"
    );
    refused_and_untouched(&w, &run, "TENANCY_LISTENER_UNTRUSTED", &token, &sha, calls);

    // The proxy is back on the same port: the same token works, nothing to do by hand.
    let _relay = Relay::start(port, w.tenancy.addr());
    w.tick().ok();
    assert_eq!(token_text(&w), token);
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn a_squatter_on_openbaos_port_gets_no_token_and_is_named() {
    let (w, sha) = applied_box();
    let token = token_text(&w);
    let calls = w.docker_calls().len();
    let port = free_port();
    dial_at(&w, w.bao.addr(), port);
    // A new sha: the apply leases a grant and logs in to OpenBao, at the squatter.
    w.publish(&TestBundle::tagged("2"));

    let squatter = Squatter::start(port, &unauthenticated());
    let run = w.tick();
    let sent = squatter.finish();
    assert!(!sent.is_empty(), "the agent never dialled the squatter");
    // Over TLS the squatter sees a handshake it cannot finish, never a request or a token.
    for bytes in &sent {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains(token.trim())
                && !text.contains("X-Vault-Token")
                && !text.contains("jwt"),
            "{text:?}"
        );
    }
    refused_and_untouched(&w, &run, "BAO_LISTENER_UNTRUSTED", &token, &sha, calls);
}

#[test]
fn a_401_for_a_token_openbao_accepts_keeps_the_token() {
    let (w, sha) = applied_box();
    let token = token_text(&w);
    w.tenancy.set_fault(
        Endpoint::Checkin,
        Fault::Status {
            status: 401,
            body: r#"{"code":"AGENT_UNAUTHENTICATED","detail":"unknown or revoked token"}"#.into(),
        },
    );
    let run = w.tick();
    run.expect(1);
    run.says(&["TENANCY_REFUSED_TOKEN", "OpenBao still accepts the token"]);
    assert_eq!(token_text(&w), token);
    assert_eq!(w.state()["last_code"], json!("TENANCY_REFUSED_TOKEN"));
    w.assert_current(&sha);

    // Tenancy is right again: the same token serves.
    w.tenancy.clear_faults();
    w.tick().ok();
    assert_eq!(token_text(&w), token);
    assert_report(&w.last_report(), ReportResult::Applied, None);
}

#[test]
fn doctor_names_who_serves_each_loopback_port() {
    let (w, _) = applied_box();
    let check = |doc: &serde_json::Value, name: &str| -> (String, String) {
        let c = doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {doc}"))
            .clone();
        (
            c["verdict"].as_str().unwrap().to_owned(),
            c["detail"].as_str().unwrap().to_owned(),
        )
    };
    let doctor = || {
        let run = w.run(&["doctor", "--json"]);
        let doc: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
        (run.code(), doc)
    };
    let me = rustix::process::geteuid().as_raw();
    let (code, doc) = doctor();
    assert_eq!(code, 0, "{doc:#}");
    let (verdict, detail) = check(&doc, "tenancy listener");
    assert_eq!(verdict, "ok", "{detail}");
    assert!(
        detail.contains(&format!("served by uid {me} (")),
        "{detail}"
    );
    assert_eq!(check(&doc, "openbao listener").0, "ok");

    let port = free_port();
    dial_at(&w, w.tenancy.addr(), port);
    let squatter = Squatter::start(port, &unauthenticated());
    let (code, doc) = doctor();
    let sent = squatter.finish();
    assert_ne!(code, 0);
    let (verdict, detail) = check(&doc, "tenancy listener");
    assert_eq!(verdict, "fail", "{detail}");
    assert!(
        detail.contains("uid 65534") && detail.contains(&format!("({})", user_name(NOBODY))),
        "{detail}"
    );
    assert!(sent.iter().all(Vec::is_empty), "{sent:?}");
}

/// A registry credential naming a port of this box that another user holds: dockerd would send
/// `Authorization: Basic` there in the clear, so the credential is never handed over, the
/// release is not applied, and the listener is named. Named in `trusted_registries`, the same
/// squatter is still no registry of the box's: that key waives only the rule against a
/// container's listener, never the owner's uid.
#[test]
fn a_registry_credential_for_a_squatted_local_port_is_never_written() {
    let (w, sha) = applied_box();
    let token = token_text(&w);
    let calls = w.docker_calls().len();
    let port = free_port();
    let registry = format!("127.0.0.1:{port}");
    w.bao.put_secret(
        ENV,
        "registry",
        &json!({"registry": registry, "username": "robot", "password": "registry-pw-7c1f"})
            .to_string(),
    );
    let docker_dir = w.state_dir().join("docker");
    let before = (
        std::fs::read(docker_dir.join("config.json")).ok(),
        std::fs::read(docker_dir.join("credential.json")).ok(),
    );
    let next = w.publish(&TestBundle::tagged("reg").with_registry_auth());
    assert_ne!(next, sha);

    for trusted in ["", &format!("trusted_registries: [\"{registry}\"]\n")] {
        w.set_config_extra(trusted);
        let squatter = Squatter::start(port, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let run = w.tick();
        let sent = squatter.finish();
        assert!(sent.iter().all(Vec::is_empty), "{sent:?}");
        let calls_now = w.docker_calls().len();
        refused_and_untouched(
            &w,
            &run,
            "REGISTRY_LISTENER_UNTRUSTED",
            &token,
            &sha,
            calls_now,
        );
        assert!(
            w.docker_calls()[calls..]
                .iter()
                .all(|c| !c.contains(" pull") && !c.contains(" up ")),
            "{trusted}"
        );
        assert_eq!(
            (
                std::fs::read(docker_dir.join("config.json")).ok(),
                std::fs::read(docker_dir.join("credential.json")).ok(),
            ),
            before,
            "the credential was written"
        );
        assert!(!run.stderr().contains("registry-pw-7c1f"));
        w.tenancy.advance_clock(Duration::from_secs(60));
    }
    let doctor = w.run(&["doctor"]);
    assert!(
        !doctor.stdout().contains("registry-pw-7c1f"),
        "{}",
        doctor.stdout()
    );

    // The box's own registry there (a listener of root's, this test's): the apply goes on, the
    // credential is kept at rest and was in config.json for the pull alone.
    w.set_config_extra("");
    let own = TcpListener::bind(("127.0.0.1", port)).unwrap();
    w.tick().ok();
    w.assert_current(&next);
    assert!(!docker_dir.join("config.json").exists());
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(docker_dir.join("credential.json")).unwrap())
            .unwrap();
    assert!(doc["auths"][&registry]["auth"].is_string(), "{doc}");
    drop(own);

    // A squatter there by the next pull: the credential at rest is proven again before it
    // reaches dockerd, and nothing pulls.
    let calls = w.docker_calls().len();
    let third = w.publish(&TestBundle::tagged("reg-later").with_registry_auth());
    assert_ne!(third, next);
    let squatter = Squatter::start(port, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    w.tenancy.advance_clock(Duration::from_secs(60));
    let run = w.tick();
    let sent = squatter.finish();
    assert!(sent.iter().all(Vec::is_empty), "{sent:?}");
    run.expect(1);
    run.says(&["REGISTRY_LISTENER_UNTRUSTED", "uid 65534"]);
    w.assert_current(&next);
    let after = &w.docker_calls()[calls..];
    assert!(
        after
            .iter()
            .all(|c| !c.contains(" pull") && !c.contains(" up ")),
        "{after:?}"
    );
    assert!(!docker_dir.join("config.json").exists());
    assert!(!run.stderr().contains("registry-pw-7c1f"));
}

/// The red team's stalled probe: a squatter whose accept queue is full, so no connection to
/// it is accepted in time, is no registry of the box's. The look names it by its listening
/// socket, and the credential is never handed to dockerd.
#[test]
fn a_squatter_with_a_full_accept_queue_is_refused_not_passed() {
    let (w, sha) = applied_box();
    let token = token_text(&w);
    let calls = w.docker_calls().len();
    let port = free_port();
    w.bao.put_secret(
        ENV,
        "registry",
        &json!({"registry": format!("127.0.0.1:{port}"), "username": "robot",
                "password": "registry-pw-7c1f"})
        .to_string(),
    );
    w.publish(&TestBundle::tagged("reg-full").with_registry_auth());
    let squatter = Squatter::start_with(port, "", "full");
    let run = w.tick();
    drop(squatter.finish());
    refused_and_untouched(&w, &run, "REGISTRY_LISTENER_UNTRUSTED", &token, &sha, calls);
    run.says(&[&format!("127.0.0.1:{port}")]);
    assert!(!w.state_dir().join("docker/config.json").exists());
    assert!(!w.state_dir().join("docker/credential.json").exists());
}

/// A look that cannot see is no pass: nothing answers where the credential's registry
/// resolves (the registry down), so any local user could take the port by the pull. Nothing is
/// handed over or pulled, the running release stays, and the tick is temporary (exit 75).
#[test]
fn a_registry_of_the_box_that_does_not_answer_gets_nothing_and_the_tick_retries() {
    let (w, sha) = applied_box();
    let port = free_port();
    w.bao.put_secret(
        ENV,
        "registry",
        &json!({"registry": format!("127.0.0.1:{port}"), "username": "robot",
                "password": "registry-pw-7c1f"})
        .to_string(),
    );
    let calls = w.docker_calls().len();
    w.publish(&TestBundle::tagged("reg-down").with_registry_auth());
    let run = w.tick();
    run.expect(75);
    run.says(&[
        "REGISTRY_UNAVAILABLE",
        &format!("127.0.0.1:{port}"),
        "connection refused",
    ]);
    w.assert_current(&sha);
    assert!(
        w.docker_calls()[calls..]
            .iter()
            .all(|c| !c.contains(" pull") && !c.contains(" up ")),
    );
    assert!(!w.state_dir().join("docker/config.json").exists());
}

/// The `::1` relay: the credential's registry name resolves to 127.0.0.1, where the box's
/// registry runs, and to `::1`, where another user listens. dockerd dials every address, so
/// every one is proven, and the relay gets nothing.
#[test]
fn a_relay_on_ipv6_loopback_gets_nothing_while_the_registry_on_127_0_0_1_is_up() {
    assert!(
        std::net::TcpListener::bind("[::1]:0").is_ok(),
        "this test needs IPv6 loopback (::1) on this machine, and it has none: the case it \
         covers is not tested here"
    );
    // A `.localhost` name, as Debian's `localhost` is mapped to both: a spelling an older
    // agent took for 127.0.0.1 alone.
    let hosts = HostsEntry::add(&["127.0.0.1", "::1"], ".localhost");
    let (w, sha) = applied_box();
    let token = token_text(&w);
    let calls = w.docker_calls().len();
    let own = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = own.local_addr().unwrap().port();
    let registry = format!("{}:{port}", hosts.name);
    w.bao.put_secret(
        ENV,
        "registry",
        &json!({"registry": registry, "username": "robot", "password": "registry-pw-7c1f"})
            .to_string(),
    );
    w.publish(&TestBundle::tagged("reg-v6").with_registry_auth());
    let relay = Squatter::start_with(
        port,
        "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n",
        "v6",
    );
    let run = w.tick();
    let sent = relay.finish();
    assert!(sent.iter().all(Vec::is_empty), "{sent:?}");
    refused_and_untouched(&w, &run, "REGISTRY_LISTENER_UNTRUSTED", &token, &sha, calls);
    run.says(&[&format!("[::1]:{port}")]);
    assert!(!w.state_dir().join("docker/config.json").exists());
    drop(own);
}

/// A name that `/etc/hosts` maps to loopback (the red team's `vm`, `runsc`) names the agent's
/// own peers' ports: an image there is refused before any lease or secret read, naming the
/// image, the registry, the address and the keys that would allow it; named in
/// `trusted_registries` by the box's admin, it is allowed.
#[test]
fn an_image_on_a_hosts_file_name_of_loopback_is_refused_before_the_lease() {
    let hosts = HostsEntry::add(&["127.0.0.1"], ".test");
    let w = World::new();
    w.stage_grant();
    let port = w.tenancy.addr().port();
    let image = format!("{}:{port}/x/y:1", hosts.name);
    let mut b = TestBundle::tagged("hosts-name");
    b.compose = format!("services:\n  web:\n    image: {image}\n    env_file: .env\n");
    w.publish(&b);
    let run = w.tick();
    run.expect(1);
    let r = w.last_report();
    assert_report(&r, ReportResult::Failed, Some("REGISTRY_NOT_ALLOWED: "));
    let detail = r.detail.unwrap_or_default();
    for want in [
        image.as_str(),
        &format!("registry {}:{port}", hosts.name),
        "resolves to 127.0.0.1 (loopback)",
        "registry_host or trusted_registries",
    ] {
        assert!(detail.contains(want), "{want}: {detail}");
    }
    assert!(
        w.bao
            .agent_requests()
            .iter()
            .all(|r| !r.path.contains("/data/")),
        "a secret was read"
    );
    assert!(
        w.docker_calls().iter().all(|c| !c.contains(" pull")),
        "{:?}",
        w.docker_calls()
    );
    run.says(&["owner=\"box admin\""]);
    w.config_extra(&format!(
        "trusted_registries: [\"{}:{port}\"]\n",
        hosts.name
    ));
    w.tenancy.advance_clock(Duration::from_secs(60));
    w.tick().ok();
}
