//! The registry credential against the real engine (issue 39): dockerd resolves and dials a
//! registry itself, so a squatter whose accept queue is full, a relay on `[::1]` beside the
//! box's registry on 127.0.0.1, and a name `/etc/hosts` maps to loopback each get nothing. The
//! squatter and the relay run as uid 65534 and pass what they get on to the suite's registry,
//! as the red team's did, recording every byte dockerd sends them.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};

use super::*;

/// A relay on `host`:`port` run as uid 65534 to the suite's registry at 127.0.0.1:`upstream`,
/// printing every chunk a client sends (`got <hex>`). With `full`, its accept queue is kept
/// full by connections of its own for `hold` seconds first, so no connection is accepted in
/// time; then it drains the queue and relays. It ends by itself after 90 s.
const RELAY: &str = r#"
import binascii, socket, sys, threading, time
mode, host, port, upstream, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
own = []
if mode == "full":
    s.listen(0)
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect((host, port))
        except BlockingIOError:
            pass
        own.append(c)
    time.sleep(0.5)
else:
    s.listen(64)
print("listening", flush=True)
if mode == "full":
    time.sleep(hold)
lock = threading.Lock()
def pipe(a, b, record):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            if record:
                with lock:
                    print("got", binascii.hexlify(data).decode(), flush=True)
            b.sendall(data)
    except OSError:
        pass
    for x in (a, b):
        try:
            x.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
s.settimeout(1)
end = time.time() + 90
while time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    if c.getpeername()[1] in [o.getsockname()[1] for o in own]:
        continue
    try:
        u = socket.create_connection(("127.0.0.1", upstream))
    except OSError:
        c.close()
        continue
    threading.Thread(target=pipe, args=(c, u, True), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c, False), daemon=True).start()
"#;

struct Relay {
    child: Child,
}

impl Relay {
    fn start(mode: &str, host: &str, port: u16, upstream: u16, hold_s: u32) -> Self {
        let mut child = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                RELAY,
                mode,
                host,
                &port.to_string(),
                &upstream.to_string(),
                &hold_s.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("setpriv python3");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "listening", "the relay did not start");
        Self { child }
    }

    /// Stops the relay; every byte clients sent it, joined.
    fn finish(mut self) -> Vec<u8> {
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
            .flat_map(|hex| hex::decode(hex.trim()).unwrap())
            .collect()
    }
}

/// The registry port of the suite's registry (`127.0.0.1:<port>`).
fn registry_port(e2e: &E2e) -> u16 {
    e2e.registry
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("the suite's registry is host:port")
}

/// A box whose config and credential name `registry` (`host:port`) for the suite's
/// registry's user, and a bundle of the web image spelled on it.
fn box_naming(short: &str, registry: &str) -> Option<(E2eBox, TestBundle)> {
    let b = E2eBox::new(short)?;
    let config: String = std::fs::read_to_string(b.w.config_path())
        .unwrap()
        .lines()
        .map(|l| match l.starts_with("registry_host:") {
            true => format!("registry_host: {registry}\n"),
            false => format!("{l}\n"),
        })
        .collect();
    std::fs::write(b.w.config_path(), config).unwrap();
    b.w.bao.put_secret(
        ENV,
        "registry",
        &json!({"registry": registry, "username": b.e2e.user, "password": b.e2e.password})
            .to_string(),
    );
    let image = format!("{registry}/monky/web:1");
    let bundle = web_bundle(compose_yaml(b.e2e, &image, Some(b.port), "", &[]));
    Some((b, bundle))
}

/// Whatever the relay got holds no `Authorization` header, and the tick was refused with
/// `code`, the box unchanged: no release, no container, no credential for dockerd.
#[track_caller]
fn got_nothing(b: &E2eBox, run: &Run, sent: &[u8], code: &str) {
    let text = String::from_utf8_lossy(sent).to_ascii_lowercase();
    // The header's value is the suite's test password: the message says it came, not what.
    assert!(
        !text.contains("authorization"),
        "the relay got an Authorization header ({} bytes sent to it)",
        sent.len()
    );
    assert!(!text.contains(&b.e2e.password.to_ascii_lowercase()));
    run.expect(1);
    run.says(&[code]);
    assert_eq!(b.current(), None);
    assert!(b.project.containers().is_empty());
    assert!(!b.w.state_dir().join("docker/config.json").exists());
    assert_no_secret(b, run);
}

#[test]
fn a_squatter_with_a_full_accept_queue_never_gets_the_credential() {
    let Some(e2e) = e2e() else { return };
    let port = free_port();
    let Some((b, bundle)) = box_naming("reg-full-queue", &format!("127.0.0.1:{port}")) else {
        return;
    };
    // Full for longer than the agent's look and its pull's start take, then a relay to the
    // real registry, as the red team's was.
    let relay = Relay::start("full", "127.0.0.1", port, registry_port(e2e), 12);
    b.w.stage_grant();
    b.w.publish(&bundle);
    let run = b.w.tick();
    let sent = relay.finish();
    got_nothing(&b, &run, &sent, "REGISTRY_LISTENER_UNTRUSTED");
    run.says(&["uid 65534"]);
}

#[test]
fn a_relay_on_ipv6_loopback_beside_the_boxs_registry_never_gets_the_credential() {
    let Some(e2e) = e2e() else { return };
    assert!(
        TcpListener::bind("[::1]:0").is_ok(),
        "this test needs IPv6 loopback (::1) on this machine, and it has none: the `::1` relay \
         is not tested here"
    );
    // `/etc/hosts` gives the name both loopbacks, as Debian's gives `localhost`; the suite's
    // registry answers on 127.0.0.1, the relay on [::1] at the same port.
    let hosts = HostsEntry::add(&["127.0.0.1", "::1"], ".localhost");
    let port = registry_port(e2e);
    let Some((b, bundle)) = box_naming("reg-v6-relay", &format!("{}:{port}", hosts.name)) else {
        return;
    };
    let relay = Relay::start("plain", "::1", port, port, 0);
    b.w.stage_grant();
    b.w.publish(&bundle);
    let run = b.w.tick();
    let sent = relay.finish();
    got_nothing(&b, &run, &sent, "REGISTRY_LISTENER_UNTRUSTED");
    run.says(&[&format!("[::1]:{port}"), "uid 65534"]);
}

/// The red team's `vm:<tenancy port>`: a name `/etc/hosts` maps to loopback, on a port where
/// a listener of the box waits (here one that records what it is sent). The image is refused
/// before the lease, dockerd is never asked to pull it, and the listener gets nothing at all.
#[test]
fn an_image_on_a_hosts_file_name_of_loopback_never_reaches_the_boxs_listeners() {
    let hosts = HostsEntry::add(&["127.0.0.1"], ".test");
    let Some(b) = E2eBox::new("reg-hosts-name") else {
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let image = format!("{}:{port}/monky/web:1", hosts.name);
    b.w.stage_grant();
    b.w.publish(&web_bundle(compose_yaml(
        b.e2e,
        &image,
        Some(b.port),
        "",
        &[],
    )));
    let run = b.w.tick();
    listener.set_nonblocking(true).unwrap();
    let connected = listener.accept();
    assert!(
        connected.is_err(),
        "dockerd (or someone) connected to the box's listener: {connected:?}"
    );
    run.expect(1);
    run.says(&["REGISTRY_NOT_ALLOWED", &image, "127.0.0.1 (loopback)"]);
    assert_eq!(b.current(), None);
    assert!(b.project.containers().is_empty());
}
