//! The test PKI: a private CA and a server certificate it signed, in PEM, made fresh for each
//! use with rcgen (on AWS-LC, the one crypto backend). Every TLS test of the workspace takes its
//! certificates from here.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The names [`Pki::new`] certifies: the host name the tests give OpenBao, and the loopback
/// address for a client that dials the IP itself.
pub const TEST_HOSTS: [&str; 2] = ["bao.example.test", "127.0.0.1"];

/// A private CA and one server certificate (with its PKCS#8 key) for some host names, PEM.
///
/// Each value is new: two `Pki`s share nothing, so one's CA is an unrelated CA to the other.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate: the trust root a client is given.
    pub ca_pem: String,
    /// The server certificate, signed by the CA.
    pub cert_pem: String,
    /// The server certificate's private key.
    pub key_pem: String,
}

impl Default for Pki {
    fn default() -> Self {
        Self::for_hosts(&TEST_HOSTS)
    }
}

impl Pki {
    /// A CA and a certificate for [`TEST_HOSTS`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A CA and a certificate for `host` alone.
    #[must_use]
    pub fn for_host(host: &str) -> Self {
        Self::for_hosts(&[host])
    }

    /// A CA and a certificate for every name of `hosts` (DNS names or IP addresses; the first
    /// is also the subject's common name).
    ///
    /// # Panics
    /// When rcgen cannot make a key or a certificate, or `hosts` is empty.
    #[must_use]
    pub fn for_hosts(hosts: &[&str]) -> Self {
        Self::valid_in_years(hosts, 1975, 4096)
    }

    /// As [`Pki::for_hosts`], with a server certificate valid from the first of January of
    /// `from` to that of `until` (UTC): a certificate expired, or not yet valid, by the
    /// machine's clock for the certificate time tests. The CA stays valid throughout.
    ///
    /// # Panics
    /// As [`Pki::for_hosts`].
    #[must_use]
    pub fn valid_in_years(hosts: &[&str], from: i32, until: i32) -> Self {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "monky test ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
            .expect("self-signed ca");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let mut leaf_params = CertificateParams::new(names).expect("leaf params");
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, *hosts.first().expect("a host name"));
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf_params.not_before = rcgen::date_time_ymd(from, 1, 1);
        leaf_params.not_after = rcgen::date_time_ymd(until, 1, 1);
        let leaf = leaf_params.signed_by(&leaf_key, &ca).expect("signed leaf");
        Pki {
            ca_pem: ca.pem(),
            cert_pem: leaf.pem(),
            key_pem: leaf_key.serialize_pem(),
        }
    }

    /// The CA certificate as the bytes a client builder's `ca_bundle_pem` takes.
    #[must_use]
    pub fn ca_bytes(&self) -> Vec<u8> {
        self.ca_pem.clone().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pki_is_its_own() {
        let (a, b) = (Pki::new(), Pki::new());
        assert_ne!(a.ca_pem, b.ca_pem);
        assert!(a.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(a.key_pem.contains("PRIVATE KEY"));
    }
}
