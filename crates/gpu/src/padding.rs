//! Signature encodings on the CPU before a request goes to the GPU: `mbcrypto`'s EMSA-PKCS1-v1_5
//! and EMSA-PSS encoders, with keyengine's algorithm names and errors. Whatever is encoded here
//! is checked by verifying the final signature with the public key, so an encoding bug cannot
//! release a bad signature.

use keyengine::{HashAlgorithm, SignError, SignatureAlgorithm};
use mbcrypto::padding::{self, PaddingError};
use mbcrypto::Hash;

/// Encodes `digest` for `alg` under a modulus of `mod_bits` bits: `mod_bits/8` bytes (rounded
/// up), big-endian, below the modulus.
pub(crate) fn encode(
    alg: SignatureAlgorithm,
    digest: &[u8],
    mod_bits: usize,
) -> Result<Vec<u8>, SignError> {
    if !alg.is_rsa() {
        return Err(SignError::UnsupportedAlgorithm(alg));
    }
    let hash = match alg.hash() {
        HashAlgorithm::Sha256 => Hash::Sha256,
        HashAlgorithm::Sha384 => Hash::Sha384,
        HashAlgorithm::Sha512 => Hash::Sha512,
    };
    use SignatureAlgorithm::*;
    let em = match alg {
        RsaPkcs1Sha256 | RsaPkcs1Sha384 | RsaPkcs1Sha512 => {
            padding::pkcs1_v15(hash, digest, mod_bits.div_ceil(8))
        }
        _ => padding::pss(hash, digest, mod_bits),
    };
    em.map_err(|e| match e {
        PaddingError::BadDigest { expected, got } => SignError::BadDigest { expected, got },
        e => SignError::Crypto(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkcs1_layout() {
        let d = [7u8; 32];
        let em = encode(SignatureAlgorithm::RsaPkcs1Sha256, &d, 2048).unwrap();
        assert_eq!(em.len(), 256);
        assert_eq!(&em[..3], &[0, 1, 0xff]);
        assert_eq!(em[256 - 32 - 19 - 1], 0);
        assert_eq!(&em[256 - 32..], &d);
        assert!(matches!(
            encode(SignatureAlgorithm::RsaPkcs1Sha256, &d[..31], 2048),
            Err(SignError::BadDigest { .. })
        ));
        assert!(matches!(
            encode(SignatureAlgorithm::EcdsaP256Sha256, &d, 2048),
            Err(SignError::UnsupportedAlgorithm(_))
        ));
    }

    #[test]
    fn pss_layout_and_randomness() {
        let d = [9u8; 48];
        let a = encode(SignatureAlgorithm::RsaPssSha384, &d, 2048).unwrap();
        let b = encode(SignatureAlgorithm::RsaPssSha384, &d, 2048).unwrap();
        assert_eq!(a.len(), 256);
        assert_eq!(a[255], 0xbc);
        assert!(a[0] & 0x80 == 0);
        assert_ne!(a, b, "salt must be random");
    }
}
