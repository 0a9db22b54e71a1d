//! Signature encodings on the CPU before a request goes to the GPU: EMSA-PKCS1-v1_5 (RFC 8017
//! §9.2) and EMSA-PSS with MGF1 and a salt as long as the digest (§9.1.1, as TLS 1.3 requires).
//! Adapted from `mbcrypto`'s encoder (crate-private there). Whatever is encoded here is checked
//! by verifying the final signature with the public key, so an encoding bug cannot release a
//! bad signature.

use aws_lc_rs::digest;
use keyengine::{HashAlgorithm, SignError, SignatureAlgorithm};

fn algorithm(h: HashAlgorithm) -> &'static digest::Algorithm {
    match h {
        HashAlgorithm::Sha256 => &digest::SHA256,
        HashAlgorithm::Sha384 => &digest::SHA384,
        HashAlgorithm::Sha512 => &digest::SHA512,
    }
}

/// The DER DigestInfo prefix (AlgorithmIdentifier with NULL parameters, OCTET STRING header).
fn digest_info_prefix(h: HashAlgorithm) -> &'static [u8] {
    match h {
        HashAlgorithm::Sha256 => &[
            0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
            0x01, 0x05, 0x00, 0x04, 0x20,
        ],
        HashAlgorithm::Sha384 => &[
            0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
            0x02, 0x05, 0x00, 0x04, 0x30,
        ],
        HashAlgorithm::Sha512 => &[
            0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
            0x03, 0x05, 0x00, 0x04, 0x40,
        ],
    }
}

/// Encodes `digest` for `alg` under a modulus of `mod_bits` bits: `mod_bits/8` bytes (rounded
/// up), big-endian, below the modulus.
pub(crate) fn encode(
    alg: SignatureAlgorithm,
    digest: &[u8],
    mod_bits: usize,
) -> Result<Vec<u8>, SignError> {
    let hash = alg.hash();
    if !alg.is_rsa() {
        return Err(SignError::UnsupportedAlgorithm(alg));
    }
    if digest.len() != hash.output_len() {
        return Err(SignError::BadDigest {
            expected: hash.output_len(),
            got: digest.len(),
        });
    }
    use SignatureAlgorithm::*;
    match alg {
        RsaPkcs1Sha256 | RsaPkcs1Sha384 | RsaPkcs1Sha512 => {
            Ok(pkcs1_v15(hash, digest, mod_bits.div_ceil(8)))
        }
        _ => pss(hash, digest, mod_bits),
    }
}

/// EMSA-PKCS1-v1_5: 00 01 FF..FF 00 DigestInfo, `em_len` bytes (≥ 256 here, always room).
fn pkcs1_v15(hash: HashAlgorithm, digest: &[u8], em_len: usize) -> Vec<u8> {
    let prefix = digest_info_prefix(hash);
    let t_len = prefix.len() + digest.len();
    let mut em = vec![0xffu8; em_len];
    em[0] = 0;
    em[1] = 1;
    em[em_len - t_len - 1] = 0;
    em[em_len - t_len..em_len - digest.len()].copy_from_slice(prefix);
    em[em_len - digest.len()..].copy_from_slice(digest);
    em
}

/// MGF1 with `hash`, `len` bytes of mask from `seed`.
fn mgf1(hash: HashAlgorithm, seed: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + hash.output_len());
    let mut counter = 0u32;
    while out.len() < len {
        let mut ctx = digest::Context::new(algorithm(hash));
        ctx.update(seed);
        ctx.update(&counter.to_be_bytes());
        out.extend_from_slice(ctx.finish().as_ref());
        counter += 1;
    }
    out.truncate(len);
    out
}

/// EMSA-PSS-ENCODE with a random salt of the digest's length, left-padded with a zero byte to
/// the modulus length when mod_bits ≡ 1 (mod 8).
fn pss(hash: HashAlgorithm, digest: &[u8], mod_bits: usize) -> Result<Vec<u8>, SignError> {
    let h_len = hash.output_len();
    let em_bits = mod_bits - 1;
    let em_len = em_bits.div_ceil(8);
    let mut salt = vec![0u8; h_len];
    aws_lc_rs::rand::fill(&mut salt).map_err(|_| SignError::Crypto("no randomness".into()))?;
    let mut ctx = digest::Context::new(algorithm(hash));
    ctx.update(&[0u8; 8]);
    ctx.update(digest);
    ctx.update(&salt);
    let h = ctx.finish();
    let db_len = em_len - h_len - 1;
    let mut db = vec![0u8; db_len];
    db[db_len - h_len - 1] = 1;
    db[db_len - h_len..].copy_from_slice(&salt);
    let mask = mgf1(hash, h.as_ref(), db_len);
    for (d, m) in db.iter_mut().zip(mask) {
        *d ^= m;
    }
    db[0] &= 0xffu8 >> (8 * em_len - em_bits);
    let mod_len = mod_bits.div_ceil(8);
    let mut em = vec![0u8; mod_len - em_len];
    em.extend_from_slice(&db);
    em.extend_from_slice(h.as_ref());
    em.push(0xbc);
    Ok(em)
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
