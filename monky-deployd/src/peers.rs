//! The peers as the agent sees them: clients built for the configured transport, and their errors
//! turned into exit statuses.
//!
//! Transports: `system` dials the configured hosts; `proxy` sends tenancy's and OpenBao's TCP
//! connections to the loopback ports of `ziti tunnel proxy` while the URLs (and so the Host header,
//! TLS SNI and certificate checks) keep the real names. Environment proxies never apply.
//!
//! Whatever the transport, a connection to an address of this box (loopback, its interfaces',
//! docker's bridges') carries a request only when the socket that answers it belongs to root,
//! the agent's own user or the section's `listener_user`, and, unless it is the agent's own
//! user's, is not held by a container's process (docker's proxy for a published port runs as
//! root): see [`listener_check`]. Any local user can listen on a port the proxy left free, and
//! the bearer is the box's OpenBao token.

mod memory;
mod owner;

pub(crate) use memory::Listeners;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use monky_agent_proto as proto;
use monky_bao_client as bao;

use crate::code::{Code, CodePolicy as _};
use crate::config::Config;
use crate::exit::{Exit, Failure};

/// Builds the tenancy client for the configured transport; `memory` spares the look for a
/// listener judged before (the tick's; `None` looks every time).
pub(crate) fn tenancy(
    cfg: &Config,
    memory: Option<&Arc<Listeners>>,
) -> anyhow::Result<proto::Client> {
    let mut b = proto::Client::builder(cfg.tenancy_url()?)
        .timeout(Duration::from_secs(cfg.tenancy.timeout_s))
        // The download stops where the parser would refuse: one limit, not two that can drift.
        .max_bundle_bytes(monky_bundle::Limits::default().max_bytes)
        .user_agent(format!("monky-deployd/{}", crate::host::VERSION))
        .connection_check(listener_check(cfg, Peer::Tenancy, memory)?);
    remember_target(cfg, Peer::Tenancy)?;
    if let Some(addr) = cfg.tenancy_mapping()? {
        b = b.connect_to(addr);
    }
    b.build().map_err(|e| {
        Failure::wrap(
            Code::ConfigInvalid,
            anyhow::Error::new(e).context("tenancy client"),
        )
    })
}

/// Builds the OpenBao client for the configured transport and CA bundle; `memory` as for
/// [`tenancy`].
pub(crate) fn openbao(
    cfg: &Config,
    memory: Option<&Arc<Listeners>>,
) -> anyhow::Result<bao::BaoClient> {
    let mut b = bao::BaoClient::builder(cfg.bao_url()?)
        .timeout(Duration::from_secs(cfg.bao.timeout_s))
        .connection_check(listener_check(cfg, Peer::Bao, memory)?);
    remember_target(cfg, Peer::Bao)?;
    if let Some(ca) = &cfg.bao.ca_bundle {
        let pem = std::fs::read(ca)
            .with_context(|| format!("bao.ca_bundle: cannot read {}", ca.display()))
            .map_err(|e| Failure::wrap(Code::ConfigInvalid, e))?;
        b = b.ca_bundle_pem(pem);
    }
    if let Some(addr) = cfg.bao_mapping()? {
        b = b.connect_to(addr);
    }
    b.build().map_err(|e| {
        // The client knows the bundle's bytes only; the file to fix is the config's.
        let e = match (&e, &cfg.bao.ca_bundle) {
            (bao::Error::CaBundle { .. }, Some(ca)) => {
                anyhow::Error::new(e).context(format!("bao.ca_bundle {}", ca.display()))
            }
            _ => anyhow::Error::new(e),
        };
        Failure::wrap(Code::ConfigInvalid, e.context("openbao client"))
    })
}

/// A peer the agent dials: the config section, code and wording of its listener check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// Tenancy (`tenancy.proxy_addr`, or the URL's address under `system`).
    Tenancy,
    /// OpenBao (`bao.proxy_addr`, or `bao.addr`'s address under `system`).
    Bao,
    /// The registry of the registry credential, when it is on an address of this box: dockerd
    /// sends the credential there, in the clear on loopback.
    Registry,
}

impl Peer {
    /// The config key that names a further user who may serve this peer's loopback address.
    #[must_use]
    pub(crate) fn key(self) -> &'static str {
        match self {
            Peer::Tenancy => "tenancy.listener_user",
            Peer::Bao => "bao.listener_user",
            Peer::Registry => "trusted_registries",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Peer::Tenancy => "tenancy",
            Peer::Bao => "openbao",
            Peer::Registry => "the registry",
        }
    }

    fn untrusted(self) -> Code {
        match self {
            Peer::Tenancy => Code::TenancyListenerUntrusted,
            Peer::Bao => Code::BaoListenerUntrusted,
            Peer::Registry => Code::RegistryListenerUntrusted,
        }
    }

    fn unavailable(self) -> Code {
        match self {
            Peer::Tenancy => Code::TenancyUnavailable,
            Peer::Bao => Code::BaoUnavailable,
            Peer::Registry => Code::ComposePullFailed,
        }
    }

    fn listener_user(self, cfg: &Config) -> Option<&str> {
        match self {
            Peer::Tenancy => cfg.tenancy.listener_user.as_deref(),
            Peer::Bao => cfg.bao.listener_user.as_deref(),
            Peer::Registry => None,
        }
    }
}

/// The loopback address the agent dials for `peer`, if it dials one: the proxy's port, or a
/// loopback IP (or `localhost`) in the URL under `system`.
///
/// # Errors
/// A config whose addresses do not parse.
pub(crate) fn loopback_target(cfg: &Config, peer: Peer) -> anyhow::Result<Option<SocketAddr>> {
    match peer {
        Peer::Tenancy => cfg.tenancy_loopback(),
        Peer::Bao => cfg.bao_loopback(),
        Peer::Registry => Ok(None),
    }
}

/// What a failed call to a loopback peer is checked against: the peer's address and who may
/// serve it, per peer, for the one config this process runs with.
static TARGETS: std::sync::Mutex<Vec<(Peer, SocketAddr, Trusted)>> =
    std::sync::Mutex::new(Vec::new());

fn remember_target(cfg: &Config, peer: Peer) -> anyhow::Result<()> {
    let Some(addr) = loopback_target(cfg, peer)? else {
        return Ok(());
    };
    let trusted = Trusted::of(cfg, peer)?;
    let mut targets = TARGETS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    targets.retain(|(p, _, _)| *p != peer);
    targets.push((peer, addr, trusted));
    Ok(())
}

/// After a transport failure (over `https` the handshake comes before the connection check,
/// so a squatter fails it and the check never runs): whether `peer`'s loopback address is now
/// held by an untrusted user, which then is the failure's real cause. A look before or after a
/// connection is racy, so this only names a cause; the check on the connection itself is what
/// keeps the token from a squatter.
fn diagnose(peer: Peer) -> Option<Untrusted> {
    let (addr, trusted) = TARGETS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find(|(p, _, _)| *p == peer)
        .map(|(_, addr, trusted)| (*addr, trusted.clone()))?;
    trusted.probe(addr).err()
}

/// The users whose sockets may answer on a loopback address for a peer.
#[derive(Debug, Clone)]
pub(crate) struct Trusted {
    peer: Peer,
    /// Root, the agent's own uid (and the state dir's owner), and `listener_user`'s when set.
    uids: Vec<u32>,
    /// The listeners judged the box's before, when the caller keeps them (the tick).
    memory: Option<Arc<Listeners>>,
    /// Whether a container's listener (docker-proxy for a published port) is the box's too: a
    /// registry the box's admin names in `trusted_registries`.
    containers: bool,
}

impl Trusted {
    /// Root and the agent's own user always, `listener_user` too when the config names one.
    /// Both can read `bao.token` anyway, so trusting them costs nothing, and the packaged
    /// proxy unit runs as the agent's user, so a box needs no key for it. The agent's user is
    /// this process's, and for a process run as root (`doctor` by an admin) the state dir's
    /// owner too, so root judges as the agent would.
    ///
    /// # Errors
    /// A `listener_user` that is no user on this box (exit 78).
    pub(crate) fn of(cfg: &Config, peer: Peer) -> anyhow::Result<Self> {
        let me = rustix::process::geteuid().as_raw();
        let mut uids = vec![0, me];
        // Only root stands in for the agent's user (`doctor` run by an admin); the agent itself
        // is that user, and must not trust whoever a planted state dir belongs to.
        if me == 0
            && let Ok(meta) = std::fs::metadata(&cfg.state_dir)
        {
            uids.push(std::os::unix::fs::MetadataExt::uid(&meta));
        }
        if let Some(name) = peer.listener_user(cfg) {
            let user = nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| {
                    Failure::coded(
                        Code::ConfigInvalid,
                        format!(
                            "{}: no user {name:?} on this box: name the user the proxy runs as, \
                             or remove the key",
                            peer.key()
                        ),
                    )
                })?;
            uids.push(user.uid.as_raw());
        }
        uids.sort_unstable();
        uids.dedup();
        Ok(Self {
            peer,
            uids,
            memory: None,
            containers: false,
        })
    }

    /// Keeps the verdicts in `memory`, and trusts a listener found there without the look
    /// through `/proc`.
    #[must_use]
    pub(crate) fn remembering(mut self, memory: Option<&Arc<Listeners>>) -> Self {
        self.memory = memory.cloned();
        self
    }

    /// Judges the connection from `local` to `peer`: a loopback peer must be served by a
    /// trusted uid; any other address is the network's, whose sockets the kernel cannot name.
    ///
    /// # Errors
    /// [`Untrusted`] or [`Vanished`], boxed for the client's connection check.
    pub(crate) fn judge(
        &self,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Result<(), proto::CheckError> {
        self.owner(local, peer).map(drop)
    }

    /// [`judge`](Self::judge), with the trusted owner's uid (`None` for a peer that is not on
    /// loopback), so a caller that reports it looks the socket up once.
    fn owner(&self, local: SocketAddr, peer: SocketAddr) -> Result<Option<u32>, proto::CheckError> {
        if !crate::host::is_local(peer.ip()) {
            return Ok(None);
        }
        let me = rustix::process::geteuid().as_raw();
        let owner = match owner::peer_socket(local, peer) {
            // The agent's own user runs no container's listener; root does (docker's proxy for
            // a published port), and so may a trusted proxy user under rootless docker.
            Ok(Some(s)) if self.uids.contains(&s.uid) && s.uid == me && me != 0 => {
                return Ok(Some(s.uid));
            }
            Ok(Some(s)) if self.uids.contains(&s.uid) => match self.listener_of(peer, &s) {
                owner::Listener::Host(_) => return Ok(Some(s.uid)),
                owner::Listener::Container(_) if self.containers => return Ok(Some(s.uid)),
                owner::Listener::Container(what) => Owner::Container(what),
                // Not visible to this process (the unit's `ProtectProc=invisible` hides root's
                // processes): the engine says whether a container publishes the port.
                owner::Listener::Unknown(_) => match published_by_container(peer) {
                    Some(what) if !self.containers => Owner::Container(what),
                    _ => return Ok(Some(s.uid)),
                },
            },
            Ok(Some(s)) => Owner::Uid(s.uid),
            Ok(None) => {
                return Err(Box::new(Vanished {
                    peer: self.peer,
                    addr: peer,
                }));
            }
            Err(e) => Owner::Unreadable(e.to_string()),
        };
        Err(Box::new(Untrusted {
            peer: self.peer,
            addr: peer,
            owner,
        }))
    }
}

impl Trusted {
    /// Who holds the listening socket that accepted `conn` (a trusted uid's connection to
    /// `peer`): the listener the kernel picks for `peer` now, when it has the connection's
    /// owner and cgroup (an accepted socket inherits both from its listener). A listener
    /// remembered as the box's is taken at its word; any other is looked up through `/proc`,
    /// and remembered when it is the box's.
    fn listener_of(&self, peer: SocketAddr, conn: &owner::Socket) -> owner::Listener {
        let listening = owner::listening(peer)
            .filter(|l| l.uid == conn.uid && l.cgroup == conn.cgroup && l.inode.is_some());
        let Some(l) = listening else {
            return owner::listener(peer);
        };
        if self.memory.as_ref().is_some_and(|m| m.knows(peer, &l)) {
            return owner::Listener::Host(0);
        }
        let found = owner::holder(&l.inode.into_iter().collect::<Vec<_>>(), peer.port());
        if let (owner::Listener::Host(_), Some(m)) = (&found, &self.memory) {
            m.learn(peer, &l);
        }
        found
    }
}

impl Trusted {
    /// Connects to `addr`, reads the owner of the socket that answered and closes without
    /// sending anything: `doctor`'s look, and the diagnosis of a failed call. `Ok(None)` when
    /// nothing answered (nobody to distrust), else the trusted owner's uid.
    ///
    /// # Errors
    /// [`Untrusted`] for a listener of another user.
    pub(crate) fn probe(&self, addr: SocketAddr) -> Result<Option<u32>, Untrusted> {
        let Ok(stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            return Ok(None);
        };
        let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
            return Ok(None);
        };
        match self.owner(local, peer) {
            Ok(uid) => Ok(uid),
            Err(e) => match e.downcast::<Untrusted>() {
                Ok(untrusted) => Err(*untrusted),
                Err(_) => Ok(None),
            },
        }
    }
}

impl Trusted {
    /// The registry's look at `addr`: [`probe`](Self::probe), where a connection that is
    /// refused, times out or whose owner cannot be read is never a pass. A connection not
    /// accepted in time (a full accept queue) is named by the listening socket's owner when
    /// the kernel shows one.
    fn prove(&self, addr: SocketAddr) -> Proof {
        let unjudged = |why: String| Untrusted {
            peer: self.peer,
            addr,
            owner: Owner::Unreadable(why),
        };
        let stream = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(stream) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Proof::Nothing("connection refused".to_owned());
            }
            Err(e) => {
                return Proof::Refused(match owner::listening(addr) {
                    Some(l) if !self.uids.contains(&l.uid) => Untrusted {
                        peer: self.peer,
                        addr,
                        owner: Owner::Uid(l.uid),
                    },
                    _ => unjudged(format!("the connection was not accepted: {e}")),
                });
            }
        };
        let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
            return Proof::Refused(unjudged("the connection closed at once".to_owned()));
        };
        match self.owner(local, peer) {
            Ok(Some(uid)) => Proof::Served(uid),
            Ok(None) => Proof::Refused(unjudged("no socket of this box answers".to_owned())),
            Err(e) => match e.downcast::<Untrusted>() {
                Ok(untrusted) => Proof::Refused(*untrusted),
                Err(e) => Proof::Refused(unjudged(e.to_string())),
            },
        }
    }
}

/// `doctor`'s look at who serves `peer`'s loopback address; `None` when the agent dials no
/// loopback address for it.
pub(crate) fn listener_report(cfg: &Config, peer: Peer) -> Option<Result<String, String>> {
    let addr = match loopback_target(cfg, peer) {
        Ok(Some(addr)) => addr,
        Ok(None) => return None,
        Err(e) => return Some(Err(format!("{e:#}"))),
    };
    let trusted = match Trusted::of(cfg, peer) {
        Ok(t) => t,
        Err(e) => return Some(Err(format!("{e:#}"))),
    };
    let name = peer.name();
    Some(match trusted.probe(addr) {
        Ok(Some(uid)) => Ok(format!(
            "{name} at {addr} is served by uid {uid} ({})",
            user_name(uid)
        )),
        Ok(None) => Ok(format!("nothing answers for {name} at {addr}")),
        Err(u) => Err(format!("{name}: {u}")),
    })
}

/// The addresses of this box that `registry` (`host[:port]`, as a credential names it) leads
/// to, with the ports dockerd dials there: every address its name resolves to, by the box's
/// resolver as dockerd asks it (`/etc/hosts` first, then DNS, both families), that is
/// loopback, link-local, unspecified or one of the box's own. dockerd tries https and then,
/// for a registry it takes for insecure (loopback), plain http on the same port; with no port
/// named, 443 and then 80. Empty for a registry of the network.
///
/// # Errors
/// `REGISTRY_UNAVAILABLE` when the resolver does not answer: where dockerd would send the
/// credential is then not known.
fn local_registry(
    resolver: &crate::resolve::Resolver,
    registry: &str,
) -> Result<Vec<SocketAddr>, Failure> {
    use monky_bundle::policy::registries::{Lookup, Place, RegistryName};
    let name = RegistryName::of_domain(registry);
    let port = match name.domain.strip_prefix('[') {
        Some(v6) => v6.split_once("]:").map(|(_, p)| p),
        None => name.domain.rsplit_once(':').map(|(_, p)| p),
    };
    let ports: Vec<u16> = match port {
        Some(p) => vec![p.parse().map_err(|_| {
            Failure::coded(
                Code::RegistryNotAllowed,
                format!("registry {registry}: its port is not a port number"),
            )
        })?],
        None => vec![443, 80],
    };
    let addrs = match resolver.lookup(&name.host) {
        Lookup::Found(addrs) => addrs,
        Lookup::NoAddress => Vec::new(),
        Lookup::Failed(why) => {
            return Err(Failure::coded(
                Code::RegistryUnavailable,
                format!(
                    "registry {registry}: the resolver did not answer ({why}), so where dockerd \
                     would send the credential is not known; nothing was pulled"
                ),
            ));
        }
    };
    let mut local: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| Place::of(*a) != Place::Network)
        .flat_map(|a| ports.iter().map(move |p| SocketAddr::new(a.ip, *p)))
        .collect();
    local.sort_unstable();
    local.dedup();
    Ok(local)
}

/// Before the registry credential is handed to dockerd, for a registry on an address of this
/// box: every address its name resolves to must have a listener proven the box's own, by the
/// tenancy channel's rules (root or the agent's user, and not a container's unless the box's
/// admin names the registry in `trusted_registries`, for a pull-through cache in a container).
/// A look that cannot see is no pass: nothing listening is `REGISTRY_UNAVAILABLE` (exit 75), a
/// connection that is not accepted in time, or whose owner cannot be read, is refused.
/// `Ok(None)` for a registry of the network; else who serves it, for the journal.
///
/// # Errors
/// `REGISTRY_LISTENER_UNTRUSTED`, naming the listener; `REGISTRY_UNAVAILABLE`.
pub(crate) fn registry_check(cfg: &Config, registry: &str) -> anyhow::Result<Option<String>> {
    registry_check_with(cfg, &crate::resolve::Resolver::default(), registry)
}

fn registry_check_with(
    cfg: &Config,
    resolver: &crate::resolve::Resolver,
    registry: &str,
) -> anyhow::Result<Option<String>> {
    let addrs = local_registry(resolver, registry)?;
    if addrs.is_empty() {
        return Ok(None);
    }
    let mut trusted = Trusted::of(cfg, Peer::Registry)?;
    trusted.containers = cfg.trusted_registries.iter().any(|r| {
        monky_bundle::policy::registries::RegistryName::of_domain(registry).is_named_by(r)
    });
    let refused = |u: &Untrusted| {
        Failure::coded(
            Code::RegistryListenerUntrusted,
            format!(
                "registry credential for {registry}: {u}; dockerd would send it there, so it is \
                 not handed to dockerd (nothing pulled or started): stop that process, or name \
                 the registry in trusted_registries if the box's admin runs it in a container \
                 on purpose"
            ),
        )
    };
    let mut seen = Vec::new();
    for addr in addrs {
        match trusted.prove(addr) {
            Proof::Served(uid) => seen.push(format!(
                "registry {registry} at {addr} is served by uid {uid} ({})",
                user_name(uid)
            )),
            Proof::Nothing(why) => {
                return Err(Failure::coded(
                    Code::RegistryUnavailable,
                    format!(
                        "registry credential for {registry}: nothing answers at {addr} ({why}), \
                         one of the addresses its name resolves to, where any local user could \
                         listen; not handed to dockerd, nothing pulled: start the registry there, \
                         or name it so it resolves only where it runs"
                    ),
                )
                .into());
            }
            Proof::Refused(u) => return Err(refused(&u).into()),
        }
    }
    Ok(Some(seen.join("; ")))
}

/// What a look at a registry's address found.
enum Proof {
    /// A listener proven the box's, by its owner's uid.
    Served(u32),
    /// Nothing listens there (the connection was refused).
    Nothing(String),
    /// Another's listener, or one that could not be judged.
    Refused(Untrusted),
}

/// The registries the stored registry credential names: `auths` of `docker/config.json` and of
/// the credential at rest (`docker/credential.json`). `None` when neither file is there.
#[must_use]
pub(crate) fn stored_registries(cfg: &Config) -> Option<Vec<String>> {
    let mut found = None;
    for path in [
        crate::layout::docker_config_json(&cfg.state_dir),
        crate::layout::credential_json(&cfg.state_dir),
    ] {
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        let text = zeroize::Zeroizing::new(text);
        let names: &mut Vec<String> = found.get_or_insert_with(Vec::new);
        names.extend(auths_of(&text));
    }
    if let Some(names) = &mut found {
        names.sort();
        names.dedup();
    }
    found
}

/// The registries a docker `config.json`'s `auths` names (the keys only).
#[must_use]
pub(crate) fn auths_of(json: &[u8]) -> Vec<String> {
    serde_json::from_slice::<serde_json::Value>(json)
        .ok()
        .and_then(|v| {
            v.get("auths")?
                .as_object()
                .map(|m| m.keys().cloned().collect())
        })
        .unwrap_or_default()
}

/// [`registry_check`] for every registry of the stored credential: made before every pull
/// (an apply's, a heal's, a fallback's), since dockerd sends the credential on each, and the
/// listener may have changed since the credential was written. The lines say who serves each.
///
/// # Errors
/// `REGISTRY_LISTENER_UNTRUSTED`, naming the listener.
pub(crate) fn stored_registry_check(cfg: &Config) -> anyhow::Result<Vec<String>> {
    let mut seen = Vec::new();
    for registry in stored_registries(cfg).unwrap_or_default() {
        seen.extend(registry_check(cfg, &registry)?);
    }
    Ok(seen)
}

/// [`registry_check`] for every registry of `docker/config.json` alone, the credential the
/// docker CLI hands to dockerd now: made before every `up` (compose pulls there too, for a
/// service's `pull_policy: always`). The credential at rest reaches dockerd only for the
/// agent's own pull, which proves its registry then.
///
/// # Errors
/// As [`registry_check`].
pub(crate) fn handed_registry_check(cfg: &Config) -> anyhow::Result<Vec<String>> {
    let path = crate::layout::docker_config_json(&cfg.state_dir);
    let Ok(text) = std::fs::read(&path) else {
        return Ok(Vec::new());
    };
    let text = zeroize::Zeroizing::new(text);
    let mut seen = Vec::new();
    for registry in auths_of(&text) {
        seen.extend(registry_check(cfg, &registry)?);
    }
    Ok(seen)
}

/// The connection check for `peer`'s client: [`Trusted::judge`] on every new connection.
///
/// # Errors
/// As [`Trusted::of`].
pub(crate) fn listener_check(
    cfg: &Config,
    peer: Peer,
    memory: Option<&Arc<Listeners>>,
) -> anyhow::Result<proto::ConnectionCheck> {
    let trusted = Trusted::of(cfg, peer)?.remembering(memory);
    Ok(Arc::new(move |local, remote| trusted.judge(local, remote)))
}

/// Whether a running container publishes `peer`'s port on its address (or on all addresses),
/// by the engine's own list: one Engine API request, made only for a trusted uid's listener
/// whose process this agent cannot see. An engine that does not answer runs no
/// `docker-proxy` to ask about, so the listener is then taken as the box's.
///
/// The connection check runs on the HTTP client's own event loop, where the engine's blocking
/// client may not be made or dropped: the request runs on a thread of its own.
fn published_by_container(peer: SocketAddr) -> Option<String> {
    let ports = std::thread::spawn(|| monky_compose::Engine::from_env().published_ports())
        .join()
        .ok()?
        .ok()?;
    let ip = peer.ip().to_canonical();
    ports
        .iter()
        .any(|(host, port)| {
            *port == peer.port()
                && (host.is_empty()
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|h| h.is_unspecified() || h.to_canonical() == ip))
        })
        .then(|| format!("docker's proxy for a port a container publishes ({peer})"))
}

/// Who answered on a loopback address, when it is no trusted user.
#[derive(Debug)]
enum Owner {
    Uid(u32),
    /// A trusted uid's socket, held by a container's process.
    Container(String),
    Unreadable(String),
}

/// A loopback listener that is not the one the box's admin set up; nothing was sent to it.
#[derive(Debug)]
pub(crate) struct Untrusted {
    peer: Peer,
    addr: SocketAddr,
    owner: Owner,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (addr, key) = (self.addr, self.peer.key());
        match &self.owner {
            Owner::Uid(uid) => write!(
                f,
                "{addr} is served by uid {uid} ({}), which is not root, the agent's user or \
                 {key}; no request was sent to it",
                user_name(*uid)
            ),
            Owner::Container(what) => write!(
                f,
                "{addr} is served by {what}, never a peer; no request was sent to it"
            ),
            Owner::Unreadable(why) => write!(
                f,
                "cannot tell who serves {addr} ({why}); no request was sent to it"
            ),
        }
    }
}

impl std::error::Error for Untrusted {}

/// The peer's socket was gone before its owner could be read: the connection is dead anyway.
#[derive(Debug)]
pub(crate) struct Vanished {
    peer: Peer,
    addr: SocketAddr,
}

impl fmt::Display for Vanished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the connection to {} closed before its owner could be read; nothing was sent",
            self.addr
        )
    }
}

impl std::error::Error for Vanished {}

/// `nobody`, or `no such user` for a uid without a passwd entry.
fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| "no such user".to_owned(), |u| u.name)
}

/// The failure for an untrusted listener.
fn untrusted_failure(what: &str, u: &Untrusted) -> Failure {
    Failure::coded(
        u.peer.untrusted(),
        format!(
            "{what}: {}'s address {u}: stop that process and restart \
             monky-deployd-proxy.service, or name the proxy's user in {}",
            u.peer.name(),
            u.peer.key()
        ),
    )
}

/// The failure for a connection check's refusal, when `refusal` is one.
fn listener_failure(
    what: &str,
    refusal: Option<&(dyn std::error::Error + Send + Sync + 'static)>,
) -> Option<Failure> {
    let refusal = refusal?;
    if let Some(u) = refusal.downcast_ref::<Untrusted>() {
        return Some(untrusted_failure(what, u));
    }
    let v = refusal.downcast_ref::<Vanished>()?;
    Some(Failure::coded(v.peer.unavailable(), format!("{what}: {v}")))
}

/// Turns a tenancy error into a failure with the right exit status and tenancy's code.
pub(crate) fn tenancy_failure(what: &str, e: proto::Error) -> Failure {
    if let Some(f) = listener_failure(what, e.check_refusal()) {
        return f;
    }
    if matches!(e, proto::Error::Transport { .. })
        && let Some(u) = diagnose(Peer::Tenancy)
    {
        return untrusted_failure(what, &u);
    }
    // The kind decides the exit class, and a code of that class for the kind of failure, so
    // that a report's detail always starts with one. Tenancy's own code is taken when the agent
    // knows it and it is of the same class (a known code on a 5xx is still a retry, exit 75);
    // any other code of tenancy's stays in the message, which quotes tenancy's answer.
    let by_kind = match e.kind() {
        proto::ErrorKind::Temporary => Code::TenancyUnavailable,
        proto::ErrorKind::Unauthenticated => Code::AgentUnauthenticated,
        proto::ErrorKind::EnvMismatch => Code::AgentEnvMismatch,
        _ => Code::TenancyRefused,
    };
    let code = e
        .code()
        .and_then(Code::of_tenancy)
        .filter(|c| c.exit() == by_kind.exit())
        .unwrap_or(by_kind);
    if let Some(problem) = e.certificate_time() {
        // Exit 1, not 75: the next tick meets the same clock.
        return Failure::coded(
            Code::TlsClock,
            format!(
                "{what}: tenancy's certificate is {problem} by this machine's clock: {}",
                with_causes(&e)
            ),
        );
    }
    let mut msg = format!("{what}: {}", tenancy_text(code.exit(), &e));
    if code.exit() == Exit::Config {
        msg.push_str(
            "; the token is pinned to another env than config.yaml's env_id: \
             fix env_id or re-run the install kit for this env",
        );
    }
    Failure::coded(code, msg).with_retry_after(e.retry_after())
}

/// The tenancy client's words for `e`, without the code its own refusals print first: the
/// failure carries that code and shows it.
fn tenancy_text(exit: Exit, e: &proto::Error) -> String {
    match e {
        proto::Error::Invalid { url, detail, .. } => format!("answer from {url}: {detail}"),
        proto::Error::LeaseShape { url } => {
            format!("lease from {url} has the retired approle shape; tenancy is stale")
        }
        proto::Error::BundleTooLarge { url, limit } => {
            format!("bundle from {url} exceeds {limit} bytes")
        }
        _ => failure_text(exit, e),
    }
}

/// Turns an OpenBao error into a failure: unreachable or sealed is temporary, the rest fails.
pub(crate) fn bao_failure(what: &str, e: bao::Error) -> Failure {
    if let Some(f) = listener_failure(what, e.check_refusal()) {
        return f;
    }
    if matches!(e, bao::Error::Network { .. } | bao::Error::Tls { .. })
        && let Some(u) = diagnose(Peer::Bao)
    {
        return untrusted_failure(what, &u);
    }
    if let Some(code) = bao_specific(&e) {
        return Failure::coded(code, format!("{what}: {}", failure_text(code.exit(), &e)));
    }
    let code = match e.kind() {
        bao::ErrorKind::Temporary => Code::BaoUnavailable,
        bao::ErrorKind::PermissionDenied => Code::BaoPermissionDenied,
        bao::ErrorKind::NotFound => Code::SecretNotFound,
        bao::ErrorKind::LoginRejected => Code::BaoLoginRejected,
        // Exit 1, not 75: a retry at the next tick meets the same clock, and a unit that stays
        // green would hide it.
        bao::ErrorKind::CertificateTime => Code::TlsClock,
        _ => Code::BaoRefused,
    };
    Failure::coded(code, format!("{what}: {}", failure_text(code.exit(), &e)))
}

/// The OpenBao failures whose cause has a code of its own: sealed (its operators' move, not the
/// proxy's), and a certificate that no retry will make acceptable (wrong CA, wrong name). A
/// certificate outside its validity dates is left to the clock check: a stepped clock, not the
/// trust root, is the usual cause.
fn bao_specific(e: &bao::Error) -> Option<Code> {
    match e {
        bao::Error::Sealed { .. } => Some(Code::BaoSealed),
        bao::Error::Tls { refusal, .. } => tls_code(*refusal),
        _ => None,
    }
}

/// The verifier's refusal of OpenBao's certificate as a code: a wrong trust root or a wrong
/// name is no transport failure a retry fixes.
fn tls_code(refusal: bao::CertificateRefusal) -> Option<Code> {
    match refusal {
        bao::CertificateRefusal::UnknownIssuer => Some(Code::BaoTlsUnknownCa),
        bao::CertificateRefusal::WrongName => Some(Code::BaoTlsWrongName),
        _ => None,
    }
}

/// A peer error's text: with its causes for a temporary (transport) failure, alone otherwise.
fn failure_text(exit: Exit, e: &dyn std::error::Error) -> String {
    if exit == Exit::Temporary {
        with_causes(e)
    } else {
        e.to_string()
    }
}

/// An error and its causes on one line: "request to ... failed" alone does not say whether the
/// connection was refused, timed out or failed its certificate check. Only for transport
/// failures: a decoding error's cause can quote the body, and a body can hold a secret.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let dir = std::env::temp_dir().join("monky-peers-test-no-such-dir");
        Config::parse(
            &format!("env_id: e1\nstate_dir: {}\n{extra}", dir.display()),
            std::path::Path::new("config.yaml"),
        )
        .unwrap()
    }

    #[test]
    fn trusted_is_the_agents_user_and_the_named_one() {
        let me = rustix::process::geteuid().as_raw();
        let mut base = vec![0, me];
        base.dedup();
        assert_eq!(Trusted::of(&config(""), Peer::Tenancy).unwrap().uids, base);
        let t = Trusted::of(&config("bao:\n  listener_user: nobody\n"), Peer::Bao).unwrap();
        assert!(
            t.uids.contains(&65534) && t.uids.contains(&me),
            "{:?}",
            t.uids
        );
        // The key of the other section does not count.
        let t = Trusted::of(&config("bao:\n  listener_user: nobody\n"), Peer::Tenancy).unwrap();
        assert_eq!(t.uids, base);

        let err = Trusted::of(
            &config("tenancy:\n  listener_user: no-such-user-x\n"),
            Peer::Tenancy,
        )
        .unwrap_err();
        assert_eq!(crate::exit::Exit::of(&err), Exit::Config);
        let text = format!("{err:#}");
        assert!(
            text.contains("tenancy.listener_user") && text.contains("no-such-user-x"),
            "{text}"
        );
    }

    #[test]
    fn only_this_boxs_peers_are_judged_and_all_of_them() {
        let t = Trusted {
            peer: Peer::Tenancy,
            uids: vec![],
            memory: None,
            containers: false,
        };
        // The network's peers are not in the box's socket table; the check lets them be.
        let local: SocketAddr = "10.0.0.5:40000".parse().unwrap();
        assert!(t.judge(local, "10.0.0.9:443".parse().unwrap()).is_ok());
        // A loopback listener of this process, judged by a policy that trusts nobody.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let err = t
            .judge(stream.local_addr().unwrap(), stream.peer_addr().unwrap())
            .unwrap_err();
        let untrusted = err.downcast_ref::<Untrusted>().expect("untrusted");
        let me = rustix::process::geteuid().as_raw();
        assert!(
            untrusted.to_string().contains(&format!("uid {me} (")),
            "{untrusted}"
        );
        assert_eq!(
            t.probe(listener.local_addr().unwrap()).unwrap_err().addr,
            listener.local_addr().unwrap()
        );
        // The box's own routable address (the one a packet to the documentation net would
        // leave from) is this box's socket too: a listener on 0.0.0.0 answers there.
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        probe
            .connect("198.51.100.1:9")
            .expect("this box has a route");
        let own = probe.local_addr().unwrap().ip();
        assert!(!own.is_loopback(), "{own}");
        let wide = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let addr = SocketAddr::new(own, wide.local_addr().unwrap().port());
        let stream = std::net::TcpStream::connect(addr).unwrap();
        let err = t
            .judge(stream.local_addr().unwrap(), stream.peer_addr().unwrap())
            .unwrap_err();
        assert!(err.downcast_ref::<Untrusted>().is_some(), "{err}");
        assert_eq!(t.probe(addr).unwrap_err().addr, addr);
        let mine = Trusted {
            peer: Peer::Tenancy,
            uids: vec![me],
            memory: None,
            containers: false,
        };
        assert_eq!(
            mine.probe(listener.local_addr().unwrap()).unwrap(),
            Some(me)
        );
    }

    #[test]
    fn a_listener_judged_the_box_s_is_not_looked_up_again_until_it_is_another_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = crate::layout::Layout::open_at(tmp.path(), "env-test").unwrap();
        let me = rustix::process::geteuid().as_raw();
        let memory = Arc::new(Listeners::load(&layout));
        let t = Trusted {
            peer: Peer::Tenancy,
            uids: vec![me],
            memory: None,
            containers: false,
        }
        .remembering(Some(&memory));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let conn = |addr| {
            let stream = std::net::TcpStream::connect(addr).unwrap();
            let socket = owner::peer_socket(stream.local_addr().unwrap(), addr)
                .unwrap()
                .unwrap();
            (stream, socket)
        };
        let (_s, socket) = conn(addr);
        let pid = std::process::id();
        // First the look through /proc, which finds this process.
        assert_eq!(t.listener_of(addr, &socket), owner::Listener::Host(pid));
        memory.save(&layout).unwrap();
        // The next tick's memory knows the socket: no look (the pid is not known then).
        let memory = Arc::new(Listeners::load(&layout));
        let t = t.remembering(Some(&memory));
        let (_s2, socket) = conn(addr);
        assert_eq!(t.listener_of(addr, &socket), owner::Listener::Host(0));
        // Another listening socket on the same port is looked up again.
        drop((_s, _s2, listener));
        let again = std::net::TcpListener::bind(addr).unwrap();
        let (_s3, socket) = conn(addr);
        assert_eq!(t.listener_of(addr, &socket), owner::Listener::Host(pid));
        drop(again);
    }

    #[test]
    fn a_registry_is_judged_on_every_address_its_name_resolves_to() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(
            &hosts,
            "127.0.0.1 localhost\n::1 localhost\n127.0.0.1 vm\n10.255.0.9 lan-mirror.test\n\
             169.254.169.254 metadata.test\n",
        )
        .unwrap();
        let r = crate::resolve::Resolver::with_hosts_file(hosts);
        let addrs = |reg: &str| -> Vec<String> {
            local_registry(&r, reg)
                .unwrap()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        // Both families of a hosts-file name, on the port the credential names.
        assert_eq!(addrs("localhost:5000"), ["127.0.0.1:5000", "[::1]:5000"]);
        assert_eq!(addrs("LocalHost.:5000"), ["127.0.0.1:5000", "[::1]:5000"]);
        // A name the hosts file maps to loopback; https and then http without a port.
        assert_eq!(addrs("vm"), ["127.0.0.1:80", "127.0.0.1:443"]);
        assert_eq!(addrs("metadata.test:8080"), ["169.254.169.254:8080"]);
        assert_eq!(addrs("[::1]:5000"), ["[::1]:5000"]);
        assert_eq!(
            addrs("[::ffff:127.0.0.1]:5000"),
            ["[::ffff:127.0.0.1]:5000"]
        );
        // The network's, and a name that resolves to nothing.
        assert!(addrs("lan-mirror.test:5000").is_empty());
        assert!(addrs("192.0.2.10:5000").is_empty());
        assert!(addrs("registry.invalid:5000").is_empty());
    }

    #[test]
    fn a_look_at_a_registry_that_cannot_see_is_no_pass() {
        let me = rustix::process::geteuid().as_raw();
        let t = Trusted {
            peer: Peer::Registry,
            uids: vec![0, me],
            memory: None,
            containers: false,
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(matches!(t.prove(addr), Proof::Served(uid) if uid == me));
        drop(listener);
        assert!(matches!(t.prove(addr), Proof::Nothing(_)));
        let nobody = Trusted {
            uids: vec![],
            ..t.clone()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let Proof::Refused(u) = nobody.prove(listener.local_addr().unwrap()) else {
            panic!("a listener of a user not trusted passed")
        };
        assert!(u.to_string().contains(&format!("uid {me} (")), "{u}");
    }

    #[test]
    fn loopback_targets_are_the_proxy_ports_or_a_loopback_url() {
        let proxy = config("");
        assert_eq!(
            loopback_target(&proxy, Peer::Tenancy).unwrap(),
            Some("127.0.0.1:18443".parse().unwrap())
        );
        assert_eq!(
            loopback_target(&proxy, Peer::Bao).unwrap(),
            Some("127.0.0.1:18200".parse().unwrap())
        );
        let system = config(
            "transport: system\ntenancy:\n  base_url: http://localhost:8081\nbao:\n  addr: https://bao.example.test:8200\n",
        );
        assert_eq!(
            loopback_target(&system, Peer::Tenancy).unwrap(),
            Some("127.0.0.1:8081".parse().unwrap())
        );
        assert_eq!(loopback_target(&system, Peer::Bao).unwrap(), None);
    }

    #[test]
    fn certificate_refusals_get_their_own_codes() {
        use bao::CertificateRefusal as R;
        assert_eq!(tls_code(R::UnknownIssuer), Some(Code::BaoTlsUnknownCa));
        assert_eq!(tls_code(R::WrongName), Some(Code::BaoTlsWrongName));
        // Anything else stays a transport failure the operator reads in the reason.
        assert_eq!(tls_code(R::Other), None);
    }

    #[test]
    fn causes_are_kept_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = anyhow::Error::new(io).context("request to http://t.test/v1 failed");
        let e: &dyn std::error::Error = e.as_ref();
        assert_eq!(
            with_causes(e),
            "request to http://t.test/v1 failed: connection refused"
        );
        let plain = std::io::Error::other("sealed");
        assert_eq!(with_causes(&plain), "sealed");
    }
}
