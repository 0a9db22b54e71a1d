//! The bridge from BoringSSL's asynchronous private-key callback to the key engine.
//! The TLS context holds the certificate only; every signature goes through here.

use boring::hash::{hash, MessageDigest};
use boring::ssl::{SslRef, SslSignatureAlgorithm};
use keyengine::{HashAlgorithm, KeyEngine, KeyId, KeyKind, SignatureAlgorithm};
use std::sync::Arc;
use tokio_boring::{
    AsyncPrivateKeyMethod, AsyncPrivateKeyMethodError, BoxPrivateKeyMethodFinish,
    BoxPrivateKeyMethodFuture,
};

use super::handshake_info;

pub struct EngineKeyMethod {
    pub engine: Arc<KeyEngine>,
    pub key: KeyId,
    /// The key's kind: in TLS 1.2, 0x0503 with a P-256 key is that key with SHA-384.
    pub kind: KeyKind,
}

fn to_engine_algorithm(a: SslSignatureAlgorithm, kind: KeyKind) -> Option<SignatureAlgorithm> {
    SignatureAlgorithm::ALL
        .into_iter()
        .find(|x| SslSignatureAlgorithm::from(x.tls_code()) == a && x.key_kind() == kind)
}

fn digest(h: HashAlgorithm, input: &[u8]) -> Option<Vec<u8>> {
    let md = match h {
        HashAlgorithm::Sha256 => MessageDigest::sha256(),
        HashAlgorithm::Sha384 => MessageDigest::sha384(),
        HashAlgorithm::Sha512 => MessageDigest::sha512(),
    };
    hash(md, input).ok().map(|d| d.to_vec())
}

/// Sends a fatal `internal_error` alert on `ssl`, whose handshake is about to fail.
fn send_internal_error(ssl: &mut SslRef) {
    use foreign_types::ForeignTypeRef;
    // SAFETY: `ssl` is a valid SSL exclusively borrowed for this call (the private-key
    // completion callback), which is where BoringSSL allows SSL_send_fatal_alert.
    unsafe {
        boring_sys::SSL_send_fatal_alert(ssl.as_ptr(), boring_sys::SSL_AD_INTERNAL_ERROR as u8);
    }
}

impl AsyncPrivateKeyMethod for EngineKeyMethod {
    fn sign(
        &self,
        ssl: &mut SslRef,
        input: &[u8],
        signature_algorithm: SslSignatureAlgorithm,
        _output: &mut [u8],
    ) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        let alg = to_engine_algorithm(signature_algorithm, self.kind).ok_or_else(|| {
            tracing::warn!(
                ?signature_algorithm,
                "signature algorithm not supported by the key engine"
            );
            AsyncPrivateKeyMethodError
        })?;
        let digest = digest(alg.hash(), input).ok_or(AsyncPrivateKeyMethodError)?;
        handshake_info::set_signature_algorithm(ssl, alg);
        let fut = self.engine.sign(&self.key, alg, digest);
        let start = std::time::SystemTime::now();
        Ok(Box::pin(async move {
            let signed = fut.await;
            let time = handshake_info::SignTime {
                start,
                end: std::time::SystemTime::now(),
            };
            let sig = match signed {
                Ok(sig) => sig,
                Err(e) => {
                    tracing::debug!(error = %e, "handshake signature failed");
                    // BoringSSL fails the handshake without a word to the client; say why,
                    // as a TLS stack whose own key failed would (RFC 8446 §6.2).
                    return Ok(Box::new(|ssl: &mut SslRef, _out: &mut [u8]| {
                        send_internal_error(ssl);
                        Err(AsyncPrivateKeyMethodError)
                    }) as BoxPrivateKeyMethodFinish);
                }
            };
            Ok(Box::new(move |ssl: &mut SslRef, out: &mut [u8]| {
                handshake_info::set_sign_time(ssl, time);
                let dst = out.get_mut(..sig.len()).ok_or(AsyncPrivateKeyMethodError)?;
                dst.copy_from_slice(&sig);
                Ok(sig.len())
            }) as BoxPrivateKeyMethodFinish)
        }))
    }

    fn decrypt(
        &self,
        _ssl: &mut SslRef,
        _input: &[u8],
        _output: &mut [u8],
    ) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        // Only static-RSA key exchange decrypts, and rampart offers ECDHE only.
        Err(AsyncPrivateKeyMethodError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_algorithm_maps_from_boring() {
        for a in SignatureAlgorithm::ALL {
            assert_eq!(
                to_engine_algorithm(SslSignatureAlgorithm::from(a.tls_code()), a.key_kind()),
                Some(a)
            );
        }
        assert_eq!(
            to_engine_algorithm(SslSignatureAlgorithm::RSA_PKCS1_SHA1, KeyKind::Rsa),
            None
        );
        assert_eq!(
            to_engine_algorithm(
                SslSignatureAlgorithm::ECDSA_SECP384R1_SHA384,
                KeyKind::EcdsaP256
            ),
            Some(SignatureAlgorithm::EcdsaP256Sha384)
        );
    }
}
