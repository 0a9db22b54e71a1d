//! TLS for the key-server link: mutual authentication, TLS 1.3 preferred, and the two TLS 1.2
//! suites existing key servers (gokeyless) accept.

use anyhow::Context as _;
use boring::ssl::{SslAcceptor, SslConnector, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use std::path::Path;

/// ECDHE-ECDSA/RSA-AES256-GCM-SHA384 (what gokeyless accepts), then the AES-128 variants.
const TLS12_SUITES: &str = "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256";

/// A key server's acceptor: its own certificate, and client certificates required and
/// checked against `client_ca`.
pub fn server_acceptor(cert: &Path, key: &Path, client_ca: &Path) -> anyhow::Result<SslAcceptor> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_strict_cipher_list(TLS12_SUITES)?;
    b.set_certificate_chain_file(cert)
        .with_context(|| format!("{}: server certificate", cert.display()))?;
    b.set_private_key_file(key, SslFiletype::PEM)
        .with_context(|| format!("{}: server key", key.display()))?;
    b.check_private_key()
        .context("server certificate and key do not match")?;
    b.set_ca_file(client_ca)
        .with_context(|| format!("{}: client CA", client_ca.display()))?;
    b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    Ok(b.build())
}

/// A gateway's connector to key servers: its client certificate, servers checked against `ca`.
pub fn client_connector(ca: &Path, cert: &Path, key: &Path) -> anyhow::Result<SslConnector> {
    let mut b = SslConnector::builder(SslMethod::tls())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_strict_cipher_list(TLS12_SUITES)?;
    b.set_ca_file(ca)
        .with_context(|| format!("{}: key server CA", ca.display()))?;
    b.set_certificate_chain_file(cert)
        .with_context(|| format!("{}: client certificate", cert.display()))?;
    b.set_private_key_file(key, SslFiletype::PEM)
        .with_context(|| format!("{}: client key", key.display()))?;
    b.check_private_key()
        .context("client certificate and key do not match")?;
    Ok(b.build())
}
