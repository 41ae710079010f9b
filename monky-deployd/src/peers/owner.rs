//! Who holds the other end of a loopback TCP connection: the uid the kernel's socket table
//! (`/proc/self/net/tcp` and `tcp6`, what `ss -e` shows) records for the socket whose addresses
//! are the connection's, swapped.
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

/// The uid that owns the socket at `peer` connected to our `local`; `Ok(None)` when no such
/// socket appeared within a second (the peer closed and is gone).
///
/// # Errors
/// When the socket table cannot be read.
pub fn peer_uid(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(uid) = look(local, peer)? {
            return Ok(Some(uid));
        }
        if started.elapsed() >= APPEAR_WITHIN {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn look(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
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
    fn a_real_connection_is_owned_by_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let me = rustix::process::geteuid().as_raw();
        // Not accepted yet: the socket waiting in the queue already carries the owner.
        let uid = peer_uid(stream.local_addr().unwrap(), stream.peer_addr().unwrap()).unwrap();
        assert_eq!(uid, Some(me));
    }
}
