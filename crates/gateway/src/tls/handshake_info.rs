//! Per-connection facts recorded during the handshake (for metrics and the access log).

use boring::ssl::{Ssl, SslRef};
use keyengine::SignatureAlgorithm;
use std::sync::OnceLock;

type Index = boring::ex_data::Index<Ssl, SignatureAlgorithm>;

fn index() -> Index {
    static INDEX: OnceLock<Index> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("ssl ex_data index"))
}

pub fn set_signature_algorithm(ssl: &mut SslRef, alg: SignatureAlgorithm) {
    ssl.set_ex_data(index(), alg);
}

/// The algorithm the server signed with, or `None` for a resumed handshake.
pub fn signature_algorithm(ssl: &SslRef) -> Option<SignatureAlgorithm> {
    ssl.ex_data(index()).copied()
}

/// When the handshake's signature was asked of the key engine and when it came back.
#[derive(Debug, Clone, Copy)]
pub struct SignTime {
    pub start: std::time::SystemTime,
    pub end: std::time::SystemTime,
}

fn sign_time_index() -> boring::ex_data::Index<Ssl, SignTime> {
    static INDEX: OnceLock<boring::ex_data::Index<Ssl, SignTime>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("ssl ex_data index"))
}

pub fn set_sign_time(ssl: &mut SslRef, t: SignTime) {
    ssl.set_ex_data(sign_time_index(), t);
}

/// The handshake's signature's times (for its trace span), or `None` for a resumed one.
pub fn sign_time(ssl: &SslRef) -> Option<SignTime> {
    ssl.ex_data(sign_time_index()).copied()
}

/// A client certificate the handshake verified, as it goes upstream in headers.
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// `CN=client,O=Example` (RFC 4514 order reversed: as the certificate lists them).
    pub subject: http::HeaderValue,
    /// `DNS:a.example, email:x@example, URI:spiffe://…`; none when it has no such names.
    pub san: Option<http::HeaderValue>,
    /// SHA-256 of the certificate's DER, in hex.
    pub sha256: http::HeaderValue,
}

impl ClientCert {
    /// The verified certificate the client presented, if any (with `tls.client_auth`, a
    /// presented one that did not verify ended the handshake).
    pub fn of(ssl: &SslRef) -> Option<ClientCert> {
        let cert = ssl.peer_certificate()?;
        Self::from_x509(&cert)
    }

    /// The same from the certificate's DER (QUIC: quiche hands it over as bytes).
    pub fn from_der(der: &[u8]) -> Option<ClientCert> {
        let cert = boring::x509::X509::from_der(der).ok()?;
        Self::from_x509(&cert)
    }

    fn from_x509(cert: &boring::x509::X509Ref) -> Option<ClientCert> {
        let subject: Vec<String> = cert
            .subject_name()
            .entries()
            .filter_map(|e| {
                let key = e.object().nid().short_name().ok()?;
                let value = e.data().as_utf8().ok()?;
                Some(format!("{key}={value}"))
            })
            .collect();
        let san: Vec<String> = cert
            .subject_alt_names()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| {
                        n.dnsname()
                            .map(|d| format!("DNS:{d}"))
                            .or_else(|| n.email().map(|e| format!("email:{e}")))
                            .or_else(|| n.uri().map(|u| format!("URI:{u}")))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let digest = cert.digest(boring::hash::MessageDigest::sha256()).ok()?;
        let hex = crate::config::file::to_hex(&digest);
        // Names a header cannot carry (control characters) leave the certificate out.
        Some(ClientCert {
            subject: http::HeaderValue::from_str(&subject.join(",")).ok()?,
            san: (!san.is_empty())
                .then(|| http::HeaderValue::from_str(&san.join(", ")).ok())
                .flatten(),
            sha256: http::HeaderValue::from_str(&hex).ok()?,
        })
    }
}
