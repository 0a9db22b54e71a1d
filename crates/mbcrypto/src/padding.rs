//! Signature encodings: PKCS#1 v1.5 (RFC 8017 §9.2) and PSS with MGF1 and a salt as long as
//! the digest (RFC 8017 §9.1.1, as TLS 1.3 requires).

use aws_lc_rs::digest;

/// The digest a signature covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    pub fn output_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    fn algorithm(self) -> &'static digest::Algorithm {
        match self {
            Hash::Sha256 => &digest::SHA256,
            Hash::Sha384 => &digest::SHA384,
            Hash::Sha512 => &digest::SHA512,
        }
    }

    /// The DER DigestInfo prefix (AlgorithmIdentifier with NULL parameters, OCTET STRING header).
    fn digest_info_prefix(self) -> &'static [u8] {
        match self {
            Hash::Sha256 => &[
                0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
                0x01, 0x05, 0x00, 0x04, 0x20,
            ],
            Hash::Sha384 => &[
                0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
                0x02, 0x05, 0x00, 0x04, 0x30,
            ],
            Hash::Sha512 => &[
                0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
                0x03, 0x05, 0x00, 0x04, 0x40,
            ],
        }
    }
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaddingError {
    #[error("digest has {got} bytes, expected {expected}")]
    BadDigest { expected: usize, got: usize },
    #[error("modulus too small for this digest")]
    ModulusTooSmall,
}

fn check(hash: Hash, digest: &[u8]) -> Result<(), PaddingError> {
    if digest.len() != hash.output_len() {
        return Err(PaddingError::BadDigest {
            expected: hash.output_len(),
            got: digest.len(),
        });
    }
    Ok(())
}

/// EMSA-PKCS1-v1_5: 00 01 FF..FF 00 DigestInfo, `em_len` bytes.
pub fn pkcs1_v15(hash: Hash, digest: &[u8], em_len: usize) -> Result<Vec<u8>, PaddingError> {
    check(hash, digest)?;
    let prefix = hash.digest_info_prefix();
    let t_len = prefix.len() + digest.len();
    if em_len < t_len + 11 {
        return Err(PaddingError::ModulusTooSmall);
    }
    let mut em = vec![0xffu8; em_len];
    em[0] = 0;
    em[1] = 1;
    em[em_len - t_len - 1] = 0;
    em[em_len - t_len..em_len - digest.len()].copy_from_slice(prefix);
    em[em_len - digest.len()..].copy_from_slice(digest);
    Ok(em)
}

/// MGF1 with `hash`, `len` bytes of mask from `seed`.
fn mgf1(hash: Hash, seed: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + hash.output_len());
    let mut counter = 0u32;
    while out.len() < len {
        let mut ctx = digest::Context::new(hash.algorithm());
        ctx.update(seed);
        ctx.update(&counter.to_be_bytes());
        out.extend_from_slice(ctx.finish().as_ref());
        counter += 1;
    }
    out.truncate(len);
    out
}

/// EMSA-PSS-ENCODE with a random salt of the digest's length, for a modulus of `mod_bits`.
/// The result is ceil((mod_bits-1)/8) bytes, left-padded with a zero byte to the modulus
/// length when mod_bits ≡ 1 (mod 8).
pub fn pss(hash: Hash, digest: &[u8], mod_bits: usize) -> Result<Vec<u8>, PaddingError> {
    check(hash, digest)?;
    let h_len = hash.output_len();
    let em_bits = mod_bits - 1;
    let em_len = em_bits.div_ceil(8);
    if em_len < 2 * h_len + 2 {
        return Err(PaddingError::ModulusTooSmall);
    }
    let mut salt = vec![0u8; h_len];
    aws_lc_rs::rand::fill(&mut salt).map_err(|_| PaddingError::ModulusTooSmall)?;
    let mut ctx = digest::Context::new(hash.algorithm());
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
        let em = pkcs1_v15(Hash::Sha256, &d, 256).unwrap();
        assert_eq!(em.len(), 256);
        assert_eq!(&em[..3], &[0, 1, 0xff]);
        assert_eq!(em[256 - 32 - 19 - 1], 0);
        assert_eq!(&em[256 - 32..], &d);
        assert!(matches!(
            pkcs1_v15(Hash::Sha256, &d[..31], 256),
            Err(PaddingError::BadDigest { .. })
        ));
    }

    #[test]
    fn pss_layout_and_randomness() {
        let d = [9u8; 48];
        let a = pss(Hash::Sha384, &d, 2048).unwrap();
        let b = pss(Hash::Sha384, &d, 2048).unwrap();
        assert_eq!(a.len(), 256);
        assert_eq!(a[255], 0xbc);
        assert!(a[0] & 0x80 == 0);
        assert_ne!(a, b, "salt must be random");
    }
}
