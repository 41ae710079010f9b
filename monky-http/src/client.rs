//! The reqwest client both peers' clients use, built with the same hardening, and the address
//! mapping that sends its connections elsewhere while the URL keeps its host name.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use url::Url;

use crate::blocking::Client;
use crate::connect::{CheckLayer, ConnectionCheck};

/// What a hardened client is built with. The rest is not a setting: proxies from the
/// environment are ignored and redirects are never followed.
pub struct Settings {
    /// The total timeout of one request, body included.
    pub timeout: Duration,
    /// The timeout of establishing a connection (TCP, and TLS for `https`).
    pub connect_timeout: Duration,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// A PEM bundle whose certificates are the only trust roots. Without one, an `https` peer
    /// is checked against the system's roots and a plain `http` client loads no roots at all.
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// Where connections go instead of the host name's own address.
    pub mapping: Option<Mapping>,
    /// Run on every new connection before a request's first byte is written on it.
    pub connection_check: Option<ConnectionCheck>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("user_agent", &self.user_agent)
            .field("ca_bundle_pem", &self.ca_bundle_pem.as_ref().map(Vec::len))
            .field("mapping", &self.mapping)
            .field(
                "connection_check",
                &self.connection_check.as_ref().map(|_| "ConnectionCheck"),
            )
            .finish()
    }
}

/// Why [`build_client`] made no client. Exhaustive on purpose: each client maps every case to
/// its own error.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The CA bundle does not parse, or holds no certificate (a trust store that would refuse
    /// every server is refused now rather than at each call).
    #[error("ca bundle: {reason}")]
    CaBundle {
        /// Why, in words.
        reason: String,
    },
    /// reqwest could not build the client.
    #[error("http client: {0}")]
    Build(#[source] reqwest::Error),
    /// The runtime that drives the client could not start (no epoll or eventfd left).
    #[error("http client runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Builds the blocking client for a peer at `base` (whose scheme and host the caller
/// has checked): no proxy, no redirect, [`Settings`]' timeouts, trust roots and user agent,
/// with a mapping's host name resolved to its address and the connection check as a connector
/// layer.
///
/// With a mapping, requests still have to go to [`Mapping::wire_url`] with
/// [`Mapping::host_header`] as `Host`: reqwest's resolver override ignores the port of the
/// mapped address when the URL names one, and an IP literal is not resolved at all.
///
/// # Errors
/// [`BuildError`].
pub fn build_client(base: &Url, settings: Settings) -> Result<Client, BuildError> {
    let mut http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(settings.timeout)
        .connect_timeout(settings.connect_timeout)
        .user_agent(settings.user_agent);
    if let Some(pem) = &settings.ca_bundle_pem {
        let certs =
            reqwest::Certificate::from_pem_bundle(pem).map_err(|e| BuildError::CaBundle {
                reason: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(BuildError::CaBundle {
                reason: "no certificate in the bundle".to_owned(),
            });
        }
        http = http.tls_certs_only(certs);
    } else if base.scheme() == "http" {
        // Plain HTTP needs no trust roots, and loading the system's costs every client built
        // tens of milliseconds of CPU.
        http = http.tls_certs_only(Vec::new());
    }
    if let (Some(mapping), Some(url::Host::Domain(domain))) = (&settings.mapping, base.host()) {
        http = http.resolve(domain, mapping.addr);
    }
    if let Some(check) = settings.connection_check {
        http = http.connector_layer(CheckLayer(check));
    }
    Client::build(http)
}

/// Connections to a peer sent to `addr`, while TLS SNI, the certificate's host-name check and
/// `Host` keep the configured host name and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    addr: SocketAddr,
    host_header: String,
}

impl Mapping {
    /// The mapping of `base`'s host to `addr`; `None` for a URL without a host.
    #[must_use]
    pub fn new(base: &Url, addr: SocketAddr) -> Option<Mapping> {
        let host = base.host_str()?;
        let host_header = match base.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        Some(Mapping { addr, host_header })
    }

    /// The address connections go to.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The `Host` header every request carries: the configured host name and port.
    #[must_use]
    pub fn host_header(&self) -> &str {
        &self.host_header
    }

    /// The URL actually dialled for `url`: the mapped port, and for an IP literal host (which
    /// is not looked up) the mapped address too.
    #[must_use]
    pub fn wire_url(&self, url: &Url) -> Url {
        let mut wire = url.clone();
        if !matches!(wire.host(), Some(url::Host::Domain(_))) {
            let _ = wire.set_ip_host(self.addr.ip());
        }
        let _ = wire.set_port(Some(self.addr.port()));
        wire
    }
}

/// Why a peer's base URL is refused before any client is built. Exhaustive on purpose: each
/// client says each in its own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseRefusal {
    /// The scheme is neither `http` nor `https`.
    Scheme,
    /// The URL names no host.
    NoHost,
    /// The URL carries a user or a password.
    Credentials,
    /// The URL carries a query or a fragment.
    QueryOrFragment,
}

/// Checks a peer's base URL: `http` or `https`, with a host, and without credentials, query or
/// fragment. The configuration chooses the scheme; no client changes it.
///
/// # Errors
/// The first [`BaseRefusal`] that applies, in the order of its variants.
pub fn check_base(base: &Url) -> Result<(), BaseRefusal> {
    if !matches!(base.scheme(), "http" | "https") {
        return Err(BaseRefusal::Scheme);
    }
    if base.cannot_be_a_base() || base.host_str().is_none_or(str::is_empty) {
        return Err(BaseRefusal::NoHost);
    }
    if !base.username().is_empty() || base.password().is_some() {
        return Err(BaseRefusal::Credentials);
    }
    if base.query().is_some() || base.fragment().is_some() {
        return Err(BaseRefusal::QueryOrFragment);
    }
    Ok(())
}

/// `url` for an error message: the user and password a peer's URL must not carry never are.
#[must_use]
pub fn without_credentials(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `base` mapped to `addr`: the wire URL and the `Host` header.
    fn check(base: &str, addr: &str, wire: &str, host: &str) {
        let base: Url = base.parse().unwrap();
        let mapping = Mapping::new(&base, addr.parse().unwrap()).unwrap();
        assert_eq!(mapping.wire_url(&base).as_str(), wire, "{base}");
        assert_eq!(mapping.host_header(), host, "{base}");
    }

    #[test]
    fn a_mapping_keeps_the_name_and_replaces_port_and_ip_literals() {
        check(
            "http://monky.tenancy.deploy:443/v1/x",
            "127.0.0.1:18443",
            "http://monky.tenancy.deploy:18443/v1/x",
            "monky.tenancy.deploy:443",
        );
        check(
            "https://bao.example.test/",
            "127.0.0.1:9",
            "https://bao.example.test:9/",
            "bao.example.test",
        );
        check(
            "https://10.1.2.3:8200/",
            "127.0.0.1:18200",
            "https://127.0.0.1:18200/",
            "10.1.2.3:8200",
        );
        check(
            "http://[::1]:80/",
            "[::1]:8080",
            "http://[::1]:8080/",
            "[::1]",
        );
    }

    #[test]
    fn credentials_never_show() {
        let url: Url = "https://user:secret@bao.example.test/".parse().unwrap();
        assert_eq!(without_credentials(&url), "https://bao.example.test/");
    }

    #[test]
    fn a_ca_bundle_without_a_certificate_is_refused() {
        let base: Url = "https://bao.example.test/".parse().unwrap();
        let settings = |pem: &[u8]| Settings {
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            user_agent: "test".into(),
            ca_bundle_pem: Some(pem.to_vec()),
            mapping: None,
            connection_check: None,
        };
        let err = build_client(&base, settings(b"not a certificate\n")).unwrap_err();
        assert!(matches!(err, BuildError::CaBundle { .. }), "{err:?}");
    }
}
