//! Who holds the other end of a loopback TCP connection: the uid the kernel records for the
//! socket whose addresses are the connection's, swapped. Asked of sock_diag (netlink, what
//! `ss -e` reads) for that one 4-tuple, which costs microseconds whatever the box holds; the
//! socket table under `/proc/self/net` is read when netlink is refused (a sandbox without
//! `AF_NETLINK`) and for a socket still waiting for its handshake's end, for which sock_diag
//! reports uid 0 while `/proc` names its listener's owner. That table lists every socket, so a
//! read of it costs milliseconds on a box with thousands (measured: 37 ms for 2,600 rows).
//!
//! The kernel gives an accepted socket (and a half-open one still waiting in the listener's
//! queue) the uid of the process that made the listening socket, and no other process can
//! change it. While the agent holds its end, no other socket can have that 4-tuple, so the
//! answer is about this connection and no other: unlike a look at the listener before
//! connecting, nothing can swap the listener between the look and the use.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

/// The tables read, in order: an IPv4 connection can be served by an IPv6 socket (a listener
/// on `[::]` accepts it with v4-mapped addresses), so both are read for either family.
const TABLES: [&str; 2] = ["/proc/self/net/tcp", "/proc/self/net/tcp6"];

/// How long the peer's socket may take to appear: on loopback the server side is made when
/// our final ACK is processed, which can lag `connect`'s return by a softirq.
const APPEAR_WITHIN: Duration = Duration::from_secs(1);

/// The state of a socket in TIME_WAIT, whose uid the kernel shows as 0: never an answer.
const TIME_WAIT: u8 = 0x06;

/// A server socket whose handshake has not ended (`TCP_DEFER_ACCEPT`, a full queue): sock_diag
/// gives it uid 0, so its owner is read from `/proc` instead.
const SYN_RECV: u8 = 0x03;

/// A listening socket: sock_diag's exact lookup falls back to the listener when no connected
/// socket has the 4-tuple (yet), which says nothing about this connection.
const LISTEN: u8 = 0x0A;

/// What the kernel says of one socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Socket {
    /// Its owner: for an accepted socket, the uid of the process that made its listener.
    pub(crate) uid: u32,
    /// sock_diag's cookie: the kernel numbers sockets from one counter per boot and never
    /// gives a number twice, so it names this socket and no other until the next boot.
    /// `None` where the socket table was read instead.
    pub(crate) cookie: Option<u64>,
    /// The id of the (v2) cgroup its maker ran in; an accepted socket has its listener's.
    pub(crate) cgroup: Option<u64>,
    /// Its inode, as `/proc/<pid>/fd` links name it (`socket:[inode]`); `None` where the
    /// socket table was read instead.
    pub(crate) inode: Option<u64>,
}

/// The socket at `peer` connected to our `local`; `Ok(None)` when no such socket appeared
/// within a second (the peer closed and is gone).
///
/// # Errors
/// When the socket table cannot be read.
pub(crate) fn peer_socket(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<Socket>> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(socket) = look(local, peer)? {
            return Ok(Some(socket));
        }
        if started.elapsed() >= APPEAR_WITHIN {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn look(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<Socket>> {
    match diag::lookup(local, peer) {
        Ok(Some((state, socket))) if ![SYN_RECV, TIME_WAIT, LISTEN].contains(&state) => {
            Ok(Some(socket))
        }
        Ok(None | Some((LISTEN, _))) => Ok(None),
        // Waiting for its handshake, or netlink refused: the table knows.
        Ok(Some(_)) | Err(_) => Ok(look_in_proc(local, peer)?.map(|uid| Socket {
            uid,
            cookie: None,
            cgroup: None,
            inode: None,
        })),
    }
}

/// The socket listening for `peer` (its address and port, or a wildcard), as the kernel would
/// pick it for a new connection now: sock_diag's exact lookup with no remote end, which finds
/// no connected socket and falls back to the listener. `None` when nothing listens or
/// netlink is refused.
pub(crate) fn listening(peer: SocketAddr) -> Option<Socket> {
    let nobody = SocketAddr::new(
        match peer.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        },
        0,
    );
    match diag::lookup(nobody, peer) {
        Ok(Some((LISTEN, socket))) => Some(socket),
        _ => None,
    }
}

fn look_in_proc(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    for table in TABLES {
        let text = match std::fs::read_to_string(Path::new(table)) {
            Ok(text) => text,
            // A kernel without IPv6 has no tcp6 table; tcp is always there.
            Err(e) if e.kind() == io::ErrorKind::NotFound && table.ends_with('6') => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{table}: {e}"))),
        };
        if let Some(uid) = find(&text, local, peer) {
            return Ok(Some(uid));
        }
    }
    Ok(None)
}

/// sock_diag's exact lookup of one TCP socket (`SOCK_DIAG_BY_FAMILY` with an
/// `inet_diag_req_v2`): the messages are netlink-packet-sock-diag's, rustix opens the socket.
mod diag {
    use std::io;
    use std::net::{IpAddr, SocketAddr};

    use netlink_packet_core::{
        NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla as _,
    };
    use netlink_packet_sock_diag::inet::{
        ExtensionFlags, InetRequest, SocketId, StateFlags, nlas::Nla,
    };
    use netlink_packet_sock_diag::{AF_INET, AF_INET6, IPPROTO_TCP, SockDiagMessage};
    use rustix::net::netlink::{self, SocketAddrNetlink};
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

    /// `INET_DIAG_CGROUP_ID`: the u64 id of the cgroup (v2) the socket was made in, sent with
    /// every answer by kernels since 5.7; the crate leaves it an attribute without a name.
    const INET_DIAG_CGROUP_ID: u16 = 21;
    /// The error netlink answers for a socket that is not there (yet): `-ENOENT`.
    const NO_SUCH_SOCKET: i32 = -2;

    /// The state and [`Socket`] of the socket whose local address is `peer` and remote
    /// `local`; `None` when there is none. A v4 connection is looked up as v4, then as the
    /// v4-mapped connection a dual-stack listener accepts.
    pub(super) fn lookup(
        local: SocketAddr,
        peer: SocketAddr,
    ) -> io::Result<Option<(u8, super::Socket)>> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(netlink::SOCK_DIAG),
        )?;
        let mapped = |a: SocketAddr| match a.ip() {
            IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), a.port()),
            IpAddr::V6(_) => a,
        };
        if let Some(found) = ask(&fd, peer, local)? {
            return Ok(Some(found));
        }
        if peer.is_ipv4() {
            return ask(&fd, mapped(peer), mapped(local));
        }
        Ok(None)
    }

    fn ask(
        fd: &rustix::fd::OwnedFd,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> io::Result<Option<(u8, super::Socket)>> {
        let request = InetRequest {
            family: if src.is_ipv4() { AF_INET } else { AF_INET6 },
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            // Every state, the bits the crate names and the ones it does not (NEW_SYN_RECV).
            states: StateFlags::from_bits_retain(u32::MAX),
            socket_id: SocketId {
                source_port: src.port(),
                destination_port: dst.port(),
                source_address: src.ip(),
                destination_address: dst.ip(),
                interface_id: 0,
                // No cookie: all ones (INET_DIAG_NOCOOKIE).
                cookie: [0xff; 8],
            },
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        let mut message = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
        message.finalize();
        let mut req = vec![0u8; message.buffer_len()];
        message.serialize(&mut req);
        rustix::net::sendto(fd, &req, SendFlags::empty(), &SocketAddrNetlink::new(0, 0))?;
        let mut answer = [0u8; 1024];
        let (_, n) = rustix::net::recv(fd, &mut answer, RecvFlags::empty())?;
        let answer = answer.get(..n).unwrap_or_default();
        let answer = NetlinkMessage::<SockDiagMessage>::deserialize(answer)
            .map_err(|e| io::Error::other(format!("sock_diag: {e}")))?;
        match answer.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(answer)) => {
                let h = &answer.header;
                // Two u32 words, the low one first, each in the host's order.
                let [a, b, c, d, e, f, g, i] = h.socket_id.cookie;
                let (lo, hi) = (
                    u32::from_ne_bytes([a, b, c, d]),
                    u32::from_ne_bytes([e, f, g, i]),
                );
                let cookie =
                    ((lo, hi) != (u32::MAX, u32::MAX)).then(|| u64::from(hi) << 32 | u64::from(lo));
                let cgroup = answer.nlas.iter().find_map(|nla| match nla {
                    Nla::Other(a) if a.kind() == INET_DIAG_CGROUP_ID && a.value_len() == 8 => {
                        let mut id = [0u8; 8];
                        a.emit_value(&mut id);
                        Some(u64::from_ne_bytes(id))
                    }
                    _ => None,
                });
                let socket = super::Socket {
                    uid: h.uid,
                    cookie,
                    cgroup,
                    inode: Some(u64::from(h.inode)).filter(|i| *i != 0),
                };
                Ok(Some((h.state, socket)))
            }
            NetlinkPayload::Error(e) if e.raw_code() == NO_SUCH_SOCKET => Ok(None),
            NetlinkPayload::Error(e) => Err(e.to_io()),
            _ => Err(io::Error::other("sock_diag: unexpected answer")),
        }
    }
}

/// The uid of the row whose local address is `peer` and remote address is `local`.
fn find(table: &str, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    let (local, peer) = (canonical(local), canonical(peer));
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid ...
        let (Some(own), Some(rem), Some(st), Some(uid)) =
            (fields.get(1), fields.get(2), fields.get(3), fields.get(7))
        else {
            return None;
        };
        if u8::from_str_radix(st, 16).ok()? == TIME_WAIT {
            return None;
        }
        (parse_addr(own)? == peer && parse_addr(rem)? == local).then(|| uid.parse().ok())?
    })
}

/// An address with a v4-mapped IPv6 address read as the IPv4 one.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// `0100007F:4A0B` or its 32-digit IPv6 form: each 32-bit word as the kernel prints it, the
/// word's bytes in memory order (so the host's byte order), then the port in hex.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(canonical(SocketAddr::new(ip, port)))
}

/// The process behind a root-owned listener, when it is a container's: docker's proxy for a
/// published port, or a process in a container's cgroup. Root is trusted as the proxy's user,
/// but dockerd runs a published port's proxy as root, so root alone proves nothing.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Listener {
    /// A process of the box, not a container's (its pid; 0 for a listening socket that an
    /// earlier tick found a process of the box's holding, see `peers::Listeners`).
    Host(u32),
    /// A container's: what it is, for the message.
    Container(String),
    /// No process holds the listening socket (or the tables could not be read).
    Unknown(String),
}

/// Who listens on `peer`'s port for the address `peer` (or a wildcard): the listening sockets'
/// inodes from the socket tables, then the process holding one of them among `/proc`'s. Costs
/// a read of the tables and of every process's descriptors, so it runs only for a listener
/// owned by root.
pub(crate) fn listener(peer: SocketAddr) -> Listener {
    let peer = canonical(peer);
    let mut inodes = Vec::new();
    for table in TABLES {
        let Ok(text) = std::fs::read_to_string(Path::new(table)) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(own), Some(st), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            if u8::from_str_radix(st, 16).ok() != Some(LISTEN) {
                continue;
            }
            let Some(own) = parse_addr(own) else { continue };
            if own.port() == peer.port() && (own.ip() == peer.ip() || own.ip().is_unspecified()) {
                inodes.extend(inode.parse::<u64>().ok().filter(|i| *i != 0));
            }
        }
    }
    holder(&inodes, peer.port())
}

/// The process holding one of the listening sockets `inodes` (on `port`, for the message):
/// a look at every process's descriptors, this process's first (the tests' peers, and the
/// cheapest look).
pub(crate) fn holder(inodes: &[u64], port: u16) -> Listener {
    if inodes.is_empty() {
        return Listener::Unknown(format!("no listening socket on port {port}"));
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Listener::Unknown("/proc cannot be read".to_owned());
    };
    let pids = std::iter::once(std::process::id()).chain(
        procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()),
    );
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|l| wanted.iter().any(|w| l.as_os_str() == w.as_str()))
        });
        if holds {
            return classify(pid);
        }
    }
    Listener::Unknown(format!(
        "no process holds the listening socket on port {port}"
    ))
}

/// A container's process by its name (docker's proxy) or its cgroup (a container's, unless the
/// agent itself runs in that same one: a box that is itself a container).
fn classify(pid: u32) -> Listener {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let comm = comm.trim();
    if matches!(comm, "docker-proxy" | "rootlesskit" | "slirp4netns") {
        return Listener::Container(format!(
            "{comm} (pid {pid}), which serves a container's published port"
        ));
    }
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let ours = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    if theirs != ours && container_cgroup(&theirs) {
        return Listener::Container(format!(
            "{comm} (pid {pid}), a process in a container's cgroup"
        ));
    }
    Listener::Host(pid)
}

/// A cgroup file naming a container's group: dockerd's (`/docker/<id>`, `docker-<id>.scope`),
/// podman's, containerd's or a kubelet's.
fn container_cgroup(text: &str) -> bool {
    text.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or_default();
        [
            "/docker/",
            "/docker-",
            "/libpod-",
            "/kubepods",
            "/containerd/",
            "/lxc/",
            "/lxc.payload",
        ]
        .iter()
        .any(|m| path.contains(m))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table as the kernel writes it, on this host's byte order.
    fn row(own: SocketAddr, rem: SocketAddr, st: u8, uid: u32) -> String {
        let addr = |a: SocketAddr| match a.ip() {
            IpAddr::V4(ip) => format!("{:08X}:{:04X}", u32::from_ne_bytes(ip.octets()), a.port()),
            IpAddr::V6(ip) => {
                let o = ip.octets();
                let words: String = (0..4)
                    .map(|i| {
                        let w = [o[i * 4], o[i * 4 + 1], o[i * 4 + 2], o[i * 4 + 3]];
                        format!("{:08X}", u32::from_ne_bytes(w))
                    })
                    .collect();
                format!("{words}:{:04X}", a.port())
            }
        };
        format!(
            "   0: {} {} {st:02X} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 0 1 0000000000000000\n",
            addr(own),
            addr(rem)
        )
    }

    const HEAD: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

    #[test]
    fn the_row_with_the_swapped_addresses_names_the_owner() {
        let ours: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let theirs: SocketAddr = "127.0.0.1:18443".parse().unwrap();
        let other: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        let table = [
            HEAD.to_owned(),
            // The listener itself, our own end, another client's connection, a TIME_WAIT
            // leftover of an earlier connection on the same tuple: none of them answers.
            row(theirs, "0.0.0.0:0".parse().unwrap(), 0x0A, 997),
            row(ours, theirs, 0x01, 0),
            row(theirs, other, 0x01, 998),
            row(theirs, ours, TIME_WAIT, 0),
            row(theirs, ours, 0x01, 65534),
        ]
        .concat();
        assert_eq!(find(&table, ours, theirs), Some(65534));
        assert_eq!(find(&table, other, theirs), Some(998));
        assert_eq!(find(&table, theirs, ours), Some(0));
        assert_eq!(
            find(&table, "127.0.0.1:40002".parse().unwrap(), theirs),
            None
        );
    }

    #[test]
    fn a_v4_connection_served_by_a_v6_socket_is_found() {
        let ours: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let theirs: SocketAddr = "127.0.0.1:18443".parse().unwrap();
        let mapped = |a: SocketAddr| match a.ip() {
            IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), a.port()),
            IpAddr::V6(_) => a,
        };
        let table = [
            HEAD.to_owned(),
            row(mapped(theirs), mapped(ours), 0x03, 1001),
        ]
        .concat();
        assert_eq!(find(&table, ours, theirs), Some(1001));
        let v6: SocketAddr = "[::1]:18443".parse().unwrap();
        let v6_ours: SocketAddr = "[::1]:40000".parse().unwrap();
        let table = [HEAD.to_owned(), row(v6, v6_ours, 0x01, 42)].concat();
        assert_eq!(find(&table, v6_ours, v6), Some(42));
    }

    #[test]
    fn garbage_rows_are_skipped() {
        let ours: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let theirs: SocketAddr = "127.0.0.1:18443".parse().unwrap();
        let table = format!("{HEAD}x\n   1: zz:zz 0100007F:9C40 01 0 0 0 notauid\n");
        assert_eq!(find(&table, ours, theirs), None);
    }

    #[test]
    fn sock_diag_and_the_table_agree_on_a_real_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (local, peer) = (stream.local_addr().unwrap(), stream.peer_addr().unwrap());
        let _accepted = listener.accept().unwrap();
        let me = rustix::process::geteuid().as_raw();
        let (state, socket) = diag::lookup(local, peer).unwrap().unwrap();
        assert_eq!((state, socket.uid), (0x01, me));
        assert_eq!(look_in_proc(local, peer).unwrap(), Some(me));
        // No connection from this address: sock_diag answers with the listener, which is no
        // answer about a connection.
        let unused: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(look(unused, peer).unwrap(), None);
    }

    #[test]
    fn the_listener_is_named_by_a_cookie_no_other_socket_gets_and_its_connections_share_its_cgroup()
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let first = listening(addr).expect("the listener");
        assert_eq!(first.uid, rustix::process::geteuid().as_raw());
        assert!(first.cookie.is_some());
        // Asked again, the same socket: the same cookie.
        assert_eq!(listening(addr), Some(first));
        let stream = std::net::TcpStream::connect(addr).unwrap();
        let _accepted = listener.accept().unwrap();
        let conn = peer_socket(stream.local_addr().unwrap(), addr)
            .unwrap()
            .unwrap();
        assert_eq!(conn.cgroup, first.cgroup);
        assert_ne!(conn.cookie, first.cookie);
        // A new listener on the same port is another socket: another cookie.
        drop((stream, _accepted, listener));
        let again = std::net::TcpListener::bind(addr).unwrap();
        let second = listening(addr).expect("the new listener");
        assert_ne!(second.cookie, first.cookie);
        drop(again);
        assert_eq!(listening(addr), None);
    }

    #[test]
    fn this_box_s_addresses_are_local_and_others_are_not() {
        for ip in [
            "127.0.0.1",
            "127.5.6.7",
            "::1",
            "0.0.0.0",
            "::ffff:127.0.0.1",
        ] {
            assert!(crate::host::is_local(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["198.51.100.77", "2001:db8::1", "203.0.113.9"] {
            assert!(!crate::host::is_local(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn a_listener_of_this_process_is_the_host_s() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(super::listener(addr), Listener::Host(std::process::id()));
        drop(listener);
        assert!(matches!(super::listener(addr), Listener::Unknown(_)));
    }

    #[test]
    fn container_cgroups_are_told_from_the_host_s() {
        for c in [
            "0::/system.slice/docker-0123abcd.scope\n",
            "12:memory:/docker/0123abcd\n1:name=systemd:/docker/0123abcd\n",
            "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-1.scope\n",
            "0::/machine.slice/libpod-0123.scope/container\n",
        ] {
            assert!(container_cgroup(c), "{c}");
        }
        for c in [
            "0::/system.slice/monky-deployd-proxy.service\n",
            "0::/system.slice/docker.service\n",
            "4:memory:/process_api/abc\n0::/\n",
        ] {
            assert!(!container_cgroup(c), "{c}");
        }
    }

    #[test]
    fn a_real_connection_is_owned_by_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let me = rustix::process::geteuid().as_raw();
        // Not accepted yet: the socket waiting in the queue already carries the owner.
        let uid = peer_socket(stream.local_addr().unwrap(), stream.peer_addr().unwrap())
            .unwrap()
            .map(|s| s.uid);
        assert_eq!(uid, Some(me));
    }
}
