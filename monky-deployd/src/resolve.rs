//! Where a registry's name leads on this box, found as dockerd finds it: `/etc/hosts` first
//! (every entry of the name, both families), then the system resolver (DNS, both families).
//! dockerd's Go resolver reads the same two sources in that order and dials every address it
//! gets until one answers, so each one is judged. The bundle crate's registry rule takes the
//! answers; this module does the IO.

use std::net::{IpAddr, ToSocketAddrs as _};
use std::path::PathBuf;
use std::sync::Arc;

use monky_bundle::policy::registries::{Address, Lookup, LookupFn};

/// The hosts file dockerd's resolver reads first.
const HOSTS: &str = "/etc/hosts";

/// The largest hosts file read; a longer one is read up to here.
const MAX_HOSTS_BYTES: u64 = 4 << 20;

/// A resolver for registry hosts: the hosts file at a path (tests give their own), then the
/// system resolver.
#[derive(Debug, Clone)]
pub(crate) struct Resolver {
    hosts: PathBuf,
}

impl Default for Resolver {
    fn default() -> Self {
        Self {
            hosts: PathBuf::from(HOSTS),
        }
    }
}

impl Resolver {
    /// The resolver that reads `hosts` instead of `/etc/hosts`.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn with_hosts_file(hosts: PathBuf) -> Self {
        Self { hosts }
    }

    /// Every address `host` resolves to, each marked whether it is an address of this box.
    #[must_use]
    pub(crate) fn lookup(&self, host: &str) -> Lookup {
        let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
        if let Ok(ip) = host.parse::<IpAddr>() {
            return found(vec![ip]);
        }
        let from_hosts = self.in_hosts_file(&host);
        if !from_hosts.is_empty() {
            return found(from_hosts);
        }
        match (host.as_str(), 0).to_socket_addrs() {
            Ok(addrs) => found(addrs.map(|a| a.ip()).collect()),
            // std gives getaddrinfo's failure as its text only: "no such name" and "a name
            // without an address" leave nothing to dial; anything else (a DNS server that
            // does not answer) is a look that could not see.
            Err(e) => {
                let text = e.to_string();
                if text.contains("Name or service not known")
                    || text.contains("No address associated with hostname")
                {
                    Lookup::NoAddress
                } else {
                    Lookup::Failed(text)
                }
            }
        }
    }

    /// The hosts file's addresses for `host` (lower case): every line that names it, as
    /// canonical name or alias, in any case.
    fn in_hosts_file(&self, host: &str) -> Vec<IpAddr> {
        let Ok(file) = std::fs::File::open(&self.hosts) else {
            return Vec::new();
        };
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(
            &mut std::io::Read::take(file, MAX_HOSTS_BYTES),
            &mut text,
        );
        hosts_entries(&text, host)
    }

    /// This resolver as the policy's lookup.
    #[must_use]
    pub(crate) fn into_lookup(self) -> Arc<LookupFn> {
        Arc::new(move |host: &str| self.lookup(host))
    }
}

/// The addresses of `host` in a hosts file's text.
fn hosts_entries(text: &str, host: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        // A link-local address may carry its zone (`fe80::1%eth0`): the address is judged.
        let address = |f: &str| f.split('%').next().unwrap_or(f).parse::<IpAddr>().ok();
        let Some(ip) = fields.next().and_then(address) else {
            continue;
        };
        if fields.any(|name| name.trim_end_matches('.').eq_ignore_ascii_case(host))
            && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    out
}

fn found(ips: Vec<IpAddr>) -> Lookup {
    if ips.is_empty() {
        return Lookup::NoAddress;
    }
    Lookup::Found(
        ips.into_iter()
            .map(|ip| Address {
                ip,
                this_box: crate::host::is_local(ip),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(l: &Lookup) -> Vec<String> {
        match l {
            Lookup::Found(a) => a.iter().map(|a| a.ip.to_string()).collect(),
            other => vec![format!("{other:?}")],
        }
    }

    #[test]
    fn the_hosts_file_is_read_first_with_every_entry_of_both_families() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(
            &hosts,
            "# a comment naming reg.test\n127.0.0.1 localhost\n::1 localhost ip6-localhost\n\
             127.0.1.1\tBox.Example box\n10.9.8.7 mirror.test # trailing comment\n\
             fe80::1%eth0 mirror.test\nnot-an-ip reg.test\n",
        )
        .unwrap();
        let r = Resolver::with_hosts_file(hosts);
        assert_eq!(ips(&r.lookup("localhost")), ["127.0.0.1", "::1"]);
        assert_eq!(ips(&r.lookup("LOCALHOST.")), ["127.0.0.1", "::1"]);
        assert_eq!(ips(&r.lookup("box")), ["127.0.1.1"]);
        assert_eq!(ips(&r.lookup("box.example")), ["127.0.1.1"]);
        assert_eq!(ips(&r.lookup("mirror.test")), ["10.9.8.7", "fe80::1"]);
        // An IP literal is itself, and loopback is the box's.
        let Lookup::Found(a) = r.lookup("127.0.0.1") else {
            panic!()
        };
        assert!(a[0].this_box);
        // No such name anywhere: nothing to dial.
        assert_eq!(r.lookup("reg.invalid"), Lookup::NoAddress);
    }
}
