//! The registry rule on addresses: an image's registry is judged by every address the box's
//! resolver gives its name, as dockerd dials them. The resolving is the agent's (this crate
//! does no network IO); it hands the answers in as a [`Lookup`], and the judgement here is pure.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// The registry an image reference names, split as dockerd splits it: the first path
/// component is the registry when it holds a `.` or a `:`, is `localhost`, or holds a capital
/// letter; any other reference is Docker Hub's, which dockerd pulls from
/// `registry-1.docker.io`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryName {
    /// `host[:port]` as the reference spells it, lower-cased (`docker.io` for Docker Hub): what
    /// `registry_host`, `trusted_registries` and a credential name.
    pub domain: String,
    /// The host dockerd resolves: brackets and a trailing dot removed, lower-cased.
    pub host: String,
}

impl RegistryName {
    /// The registry of `image`, `None` for a local image ID (`sha256:...`), which names none.
    #[must_use]
    pub fn of_image(image: &str) -> Option<Self> {
        let image = image.trim();
        if image.to_ascii_lowercase().starts_with("sha256:") {
            return None;
        }
        let name = image.split_once('@').map_or(image, |(n, _)| n);
        let first = name.split_once('/').map(|(first, _)| first);
        let domain = first.filter(|f| {
            f.contains(['.', ':']) || *f == "localhost" || f.bytes().any(|b| b.is_ascii_uppercase())
        });
        let Some(domain) = domain else {
            return Some(Self {
                domain: "docker.io".to_owned(),
                host: "registry-1.docker.io".to_owned(),
            });
        };
        Some(Self::of_domain(domain))
    }

    /// A registry named as a credential or the config names one, `host[:port]`.
    #[must_use]
    pub fn of_domain(domain: &str) -> Self {
        let domain = domain.trim().to_ascii_lowercase();
        let host = match domain.strip_prefix('[') {
            Some(v6) => v6.split_once(']').map_or(v6, |(h, _)| h),
            None => domain.rsplit_once(':').map_or(domain.as_str(), |(h, _)| h),
        };
        // A trailing dot is the same name to the resolver; Docker Hub's names are one
        // registry, which dockerd reaches at `registry-1.docker.io`.
        let host = match host.strip_suffix('.').unwrap_or(host) {
            "docker.io" | "index.docker.io" => "registry-1.docker.io",
            h => h,
        }
        .to_owned();
        Self { domain, host }
    }

    /// Whether `named` (`host[:port]`, as a config key or a credential holds it) names this
    /// registry: the same spelling, any case, a trailing dot on the host aside.
    #[must_use]
    pub fn is_named_by(&self, named: &str) -> bool {
        let other = Self::of_domain(named);
        let port = |d: &str| match d.strip_prefix('[') {
            Some(v6) => v6.split_once("]:").map(|(_, p)| p.to_owned()),
            None => d.rsplit_once(':').map(|(_, p)| p.to_owned()),
        };
        other.host == self.host && port(&other.domain) == port(&self.domain)
    }
}

impl fmt::Display for RegistryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.domain)
    }
}

/// One address the resolver gave a registry's host, and whether the kernel lets a socket on
/// this box bind it (an interface's address, a docker bridge's): only the agent can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// The address.
    pub ip: IpAddr,
    /// Whether it is an address of this box.
    pub this_box: bool,
}

/// What the box's resolver answered for a registry's host (`/etc/hosts` first, then DNS, both
/// families, as dockerd asks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Every address it gave.
    Found(Vec<Address>),
    /// No such name, or a name with no address: there is nothing for dockerd to dial.
    NoAddress,
    /// The resolver could not answer (a DNS server down, a timeout): not judged, so not passed.
    Failed(String),
}

/// Where an address leads, for the rule and its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Place {
    /// 127.0.0.0/8, `::1`, and their IPv4-mapped forms.
    Loopback,
    /// 169.254.0.0/16 and `fe80::/10`: the box's own link, a cloud's metadata service.
    LinkLocal,
    /// `0.0.0.0` and `::`, which reach the box itself.
    Unspecified,
    /// Any other address a socket on this box can bind.
    ThisBox,
    /// The network's.
    Network,
}

impl Place {
    /// Where `a` leads.
    #[must_use]
    pub fn of(a: Address) -> Self {
        let ip = a.ip.to_canonical();
        let link_local = match ip {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        };
        if ip.is_loopback() {
            Place::Loopback
        } else if ip.is_unspecified() {
            Place::Unspecified
        } else if link_local {
            Place::LinkLocal
        } else if a.this_box {
            Place::ThisBox
        } else {
            Place::Network
        }
    }

    fn words(self) -> &'static str {
        match self {
            Place::Loopback => "loopback",
            Place::LinkLocal => "link-local",
            Place::Unspecified => "the unspecified address, this box",
            Place::ThisBox => "an address of this box",
            Place::Network => "the network",
        }
    }
}

/// How the agent resolves a host: called once per registry host judged.
pub type LookupFn = dyn Fn(&str) -> Lookup + Send + Sync;

/// The box's view of registries, which the agent gives the policy: its resolver, and the
/// registries its admin allows on the box's own addresses (`registry_host`,
/// `trusted_registries`, and the env's credential's registry, which the agent proves before
/// it hands the credential to dockerd).
#[derive(Clone)]
pub struct Registries {
    allowed: Vec<String>,
    lookup: Arc<LookupFn>,
}

impl fmt::Debug for Registries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registries")
            .field("allowed", &self.allowed)
            .finish_non_exhaustive()
    }
}

impl Registries {
    /// The box's `lookup` and the registries allowed on its own addresses.
    pub fn new(lookup: Arc<LookupFn>, allowed: Vec<String>) -> Self {
        Self { allowed, lookup }
    }

    /// One more allowed registry (the credential's, once the agent knows it).
    #[must_use]
    pub fn allowing(mut self, registry: &str) -> Self {
        self.allowed.push(registry.to_owned());
        self
    }

    /// The judgement of `image`'s registry: `None` when it is allowed by name, names no
    /// registry, or every address of its host is the network's (or there is none).
    #[must_use]
    pub fn judge(&self, image: &str) -> Option<RegistryFinding> {
        let registry = RegistryName::of_image(image)?;
        if self.allowed.iter().any(|a| registry.is_named_by(a)) {
            return None;
        }
        judge(image, &registry, &(self.lookup)(&registry.host))
    }
}

/// Why an image's registry is refused on this box.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryFinding {
    /// Its name resolves to an address of this box (`REGISTRY_NOT_ALLOWED`).
    OnTheBox {
        /// The image as the compose file names it.
        image: String,
        /// The registry.
        registry: String,
        /// The first address of the box the name resolves to.
        ip: IpAddr,
        /// Where it leads.
        place: Place,
    },
    /// The resolver could not answer for it (`REGISTRY_UNAVAILABLE`, temporary).
    Unresolved {
        /// The image as the compose file names it.
        image: String,
        /// The registry.
        registry: String,
        /// The resolver's words.
        why: String,
    },
}

impl fmt::Display for RegistryFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryFinding::OnTheBox {
                image,
                registry,
                ip,
                place,
            } => write!(
                f,
                "image {image}: registry {registry} resolves to {ip} ({}), where dockerd would \
                 dial it; the box's admin allows a registry of this box by naming it in \
                 registry_host or trusted_registries",
                place.words()
            ),
            RegistryFinding::Unresolved {
                image,
                registry,
                why,
            } => write!(
                f,
                "image {image}: the resolver did not answer for registry {registry} ({why}), so \
                 where dockerd would dial it is not known"
            ),
        }
    }
}

impl RegistryFinding {
    /// The finding without the image, the registry or the address, for an image that came
    /// from a secret.
    #[must_use]
    pub fn unnamed(&self) -> String {
        match self {
            RegistryFinding::OnTheBox { place, .. } => format!(
                "its registry resolves to {}; the box's admin allows a registry of this box by \
                 naming it in registry_host or trusted_registries",
                place.words()
            ),
            RegistryFinding::Unresolved { .. } => {
                "the resolver did not answer for its registry".to_owned()
            }
        }
    }
}

/// The rule itself: `registry` (of `image`) is refused when any address in `lookup` leads to
/// this box, and not judged (so not passed) when the resolver failed.
#[must_use]
pub fn judge(image: &str, registry: &RegistryName, lookup: &Lookup) -> Option<RegistryFinding> {
    match lookup {
        Lookup::NoAddress => None,
        Lookup::Failed(why) => Some(RegistryFinding::Unresolved {
            image: image.trim().to_owned(),
            registry: registry.domain.clone(),
            why: why.clone(),
        }),
        Lookup::Found(addrs) => addrs.iter().find_map(|a| {
            let place = Place::of(*a);
            (place != Place::Network).then(|| RegistryFinding::OnTheBox {
                image: image.trim().to_owned(),
                registry: registry.domain.clone(),
                ip: a.ip,
                place,
            })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(ip: &str) -> Address {
        Address {
            ip: ip.parse().unwrap(),
            this_box: false,
        }
    }

    #[test]
    fn the_registry_is_split_as_dockerd_splits_it() {
        for (image, domain, host) in [
            ("nginx", "docker.io", "registry-1.docker.io"),
            ("library/nginx:1", "docker.io", "registry-1.docker.io"),
            (
                "docker.io/library/nginx",
                "docker.io",
                "registry-1.docker.io",
            ),
            (
                "index.docker.io/x/y",
                "index.docker.io",
                "registry-1.docker.io",
            ),
            ("ghcr.io/acme/api:2", "ghcr.io", "ghcr.io"),
            ("vm:18443/x/y:1", "vm:18443", "vm"),
            ("VM/x/y:1", "vm", "vm"),
            ("localhost/x", "localhost", "localhost"),
            (
                "Reg.Example.com.:5000/x",
                "reg.example.com.:5000",
                "reg.example.com",
            ),
            ("[::1]:5000/x", "[::1]:5000", "::1"),
            ("[fe80::1]/x@sha256:00", "[fe80::1]", "fe80::1"),
        ] {
            let r = RegistryName::of_image(image).unwrap();
            assert_eq!(
                (r.domain.as_str(), r.host.as_str()),
                (domain, host),
                "{image}"
            );
        }
        assert_eq!(RegistryName::of_image("sha256:0123"), None);
    }

    #[test]
    fn a_registry_is_named_by_its_spelling_with_its_port() {
        let r = RegistryName::of_image("Mirror.Box.:5000/x").unwrap();
        assert!(r.is_named_by("mirror.box:5000"));
        assert!(r.is_named_by("MIRROR.BOX.:5000"));
        assert!(!r.is_named_by("mirror.box"));
        assert!(!r.is_named_by("mirror.box:5001"));
        let v6 = RegistryName::of_image("[::1]:5000/x").unwrap();
        assert!(v6.is_named_by("[::1]:5000"));
        assert!(!v6.is_named_by("[::1]"));
    }

    #[test]
    fn every_address_that_leads_to_the_box_is_refused_and_the_networks_pass() {
        let reg = RegistryName::of_domain("vm:18443");
        for (addrs, place) in [
            (vec![net("127.0.0.1")], Some(Place::Loopback)),
            (vec![net("127.0.1.1")], Some(Place::Loopback)),
            (vec![net("::1")], Some(Place::Loopback)),
            (vec![net("::ffff:127.0.0.1")], Some(Place::Loopback)),
            (vec![net("0.0.0.0")], Some(Place::Unspecified)),
            (vec![net("::")], Some(Place::Unspecified)),
            (vec![net("169.254.169.254")], Some(Place::LinkLocal)),
            (vec![net("fe80::1")], Some(Place::LinkLocal)),
            (vec![net("febf::1")], Some(Place::LinkLocal)),
            (
                vec![Address {
                    ip: "10.1.2.3".parse().unwrap(),
                    this_box: true,
                }],
                Some(Place::ThisBox),
            ),
            // One address of the box among the network's is enough: dockerd tries them all.
            (vec![net("192.0.2.7"), net("::1")], Some(Place::Loopback)),
            (vec![net("192.0.2.7"), net("2001:db8::7")], None),
            (vec![net("fec0::1")], None),
        ] {
            let got = judge("vm:18443/x/y:1", &reg, &Lookup::Found(addrs.clone()));
            let got = got.map(|f| match f {
                RegistryFinding::OnTheBox { place, .. } => place,
                other => panic!("{other}"),
            });
            assert_eq!(got, place, "{addrs:?}");
        }
        assert_eq!(judge("x", &reg, &Lookup::NoAddress), None);
        let failed = judge("vm:18443/x/y:1", &reg, &Lookup::Failed("timed out".into())).unwrap();
        assert_eq!(
            failed.to_string(),
            "image vm:18443/x/y:1: the resolver did not answer for registry vm:18443 (timed \
             out), so where dockerd would dial it is not known"
        );
    }

    #[test]
    fn the_refusal_names_the_image_the_registry_the_address_and_the_keys() {
        let lookup: Arc<LookupFn> = Arc::new(|host: &str| match host {
            "vm" => Lookup::Found(vec![net("127.0.0.1")]),
            _ => Lookup::NoAddress,
        });
        let r = Registries::new(lookup, vec!["127.0.0.1:5000".into()]);
        assert_eq!(
            r.judge("vm:18443/x/y:1").unwrap().to_string(),
            "image vm:18443/x/y:1: registry vm:18443 resolves to 127.0.0.1 (loopback), where \
             dockerd would dial it; the box's admin allows a registry of this box by naming it \
             in registry_host or trusted_registries"
        );
        assert_eq!(r.judge("ghcr.io/a/b"), None);
        assert_eq!(r.clone().allowing("VM:18443").judge("vm:18443/x/y:1"), None);
        // Allowed by name means that spelling and port only.
        assert!(r.allowing("vm:18444").judge("vm:18443/x/y:1").is_some());
    }
}

#[cfg(test)]
mod on_the_policy {
    use super::*;
    use crate::ComposePolicy;

    fn policy() -> ComposePolicy {
        let lookup: Arc<LookupFn> = Arc::new(|host: &str| match host {
            "vm" => Lookup::Found(vec![Address {
                ip: "127.0.0.1".parse().unwrap(),
                this_box: true,
            }]),
            "dns-down.example" => Lookup::Failed("temporary failure in name resolution".into()),
            _ => Lookup::NoAddress,
        });
        ComposePolicy::new("p").registries(Some(Registries::new(lookup, Vec::new())))
    }

    #[test]
    fn the_file_names_the_image_and_a_value_from_a_secret_is_named_by_its_variable() {
        let secrets = Default::default();
        let file = "services:\n  web:\n    image: vm:18443/x/y:1\n";
        let err = policy().check_file(file, &|_| None, &secrets).unwrap_err();
        assert_eq!(err.code, crate::RefusalCode::RegistryNotAllowed);
        assert!(err.to_string().starts_with(
            "REGISTRY_NOT_ALLOWED: web: image vm:18443/x/y:1: registry vm:18443 resolves to \
             127.0.0.1 (loopback)"
        ));
        // compose's model carries the secret's value; the finding names the variable only.
        let raw = "services:\n  web:\n    image: ${IMAGE}\n";
        let model = serde_json::json!({"services": {"web": {"image": "vm:18443/s3cr3t/y:1"}}});
        let err = policy()
            .check_model(model, raw, std::path::Path::new("/r"), &|_| None)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            !text.contains("s3cr3t") && !text.contains("vm:18443"),
            "{text}"
        );
        assert!(
            text.contains("${IMAGE}") && text.contains("loopback"),
            "{text}"
        );
        // A resolver that cannot answer is not judged, so not passed.
        let down = "services:\n  web:\n    image: dns-down.example/x:1\n";
        let err = policy().check_file(down, &|_| None, &secrets).unwrap_err();
        assert_eq!(err.code, crate::RefusalCode::RegistryUnresolved);
        assert!(
            err.to_string().starts_with("REGISTRY_UNAVAILABLE: "),
            "{err}"
        );
        // A registry of the network, and a name without an address, pass.
        let fine = "services:\n  web:\n    image: ghcr.io/acme/api:2\n";
        assert!(policy().check_file(fine, &|_| None, &secrets).is_ok());
    }
}
