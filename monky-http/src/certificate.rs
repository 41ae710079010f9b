//! Why a TLS handshake refused the server's certificate, read from rustls's error by its type:
//! its validity dates against this machine's clock ([`CertificateTime`]), or the trust root or
//! the name ([`CertificateRefusal`]). No caller reads it out of the reason's text. Both clients
//! meet the same rustls errors, so both read them here.

use std::fmt;

/// Which way a certificate's validity period missed this machine's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CertificateTime {
    /// The clock is past the certificate's `notAfter`.
    Expired,
    /// The clock is before the certificate's `notBefore`.
    NotYetValid,
}

impl fmt::Display for CertificateTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CertificateTime::Expired => "expired",
            CertificateTime::NotYetValid => "not yet valid",
        })
    }
}

/// Why the TLS check refused a server's certificate, other than its validity dates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CertificateRefusal {
    /// No trust root of this client issued it (or its signature does not verify against one):
    /// a wrong CA bundle, or a server that is not the one meant.
    UnknownIssuer,
    /// It is not valid for the host name the client asked for.
    WrongName,
    /// Any other reason (revoked, bad encoding, unsupported algorithm, ...).
    Other,
}

/// A certificate rustls refused, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Outside its validity dates by this machine's clock.
    Time(CertificateTime),
    /// For its issuer, its name or another reason.
    Refusal(CertificateRefusal),
}

/// Whether `err` is rustls refusing the server's certificate, and why. rustls's error reaches
/// a client's chain wrapped in `io::Error`s (two, from hyper), whose `source()` skips the
/// wrapped error, so each wrapper is opened.
#[must_use]
pub fn refused(err: &(dyn std::error::Error + 'static)) -> Option<Refused> {
    use rustls::CertificateError as C;
    let mut inner = err;
    for _ in 0..4 {
        match inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => inner = wrapped,
            None => break,
        }
    }
    let rustls::Error::InvalidCertificate(c) = inner.downcast_ref::<rustls::Error>()? else {
        return None;
    };
    Some(match c {
        C::Expired | C::ExpiredContext { .. } => Refused::Time(CertificateTime::Expired),
        C::NotValidYet | C::NotValidYetContext { .. } => {
            Refused::Time(CertificateTime::NotYetValid)
        }
        C::UnknownIssuer | C::BadSignature => Refused::Refusal(CertificateRefusal::UnknownIssuer),
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            Refused::Refusal(CertificateRefusal::WrongName)
        }
        _ => Refused::Refusal(CertificateRefusal::Other),
    })
}

/// The first certificate refusal in `err`'s chain of causes, with the cause that says it (its
/// text is the reason a person reads).
#[must_use]
pub fn refused_in<'e>(
    err: &'e (dyn std::error::Error + 'static),
) -> Option<(Refused, &'e (dyn std::error::Error + 'static))> {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(r) = refused(e) {
            return Some((r, e));
        }
        cause = e.source();
    }
    None
}
