//! Conversions between big-endian bytes and little-endian limbs, and per-modulus constants,
//! all constant time in the values.

use crate::lanes::MASK52;

/// Big-endian bytes to `limbs` little-endian 52-bit limbs. The value must fit. Reads the bytes
/// as 64-bit words, then cuts each limb out of at most two words (positions are public).
pub(crate) fn bytes_to_limbs(be: &[u8], limbs: usize) -> Vec<u64> {
    // One spare word, so that the last limb's upper word always exists.
    let words = bytes_to_words(
        be,
        (be.len().div_ceil(8)).max((limbs * 52).div_ceil(64)) + 1,
    );
    let mut out = vec![0u64; limbs];
    for (i, limb) in out.iter_mut().enumerate() {
        let (w, s) = (i * 52 / 64, i * 52 % 64);
        let mut v = words[w] >> s;
        if s > 12 {
            v |= words[w + 1] << (64 - s);
        }
        *limb = v & MASK52;
    }
    out
}

/// 52-bit limbs to `len` big-endian bytes (the value must fit). Packs the limbs into 64-bit
/// words, then writes the words big-endian.
pub(crate) fn limbs_to_bytes(limbs: &[u64], len: usize) -> Vec<u8> {
    let mut words = vec![0u64; len.div_ceil(8).max((limbs.len() * 52).div_ceil(64)) + 1];
    for (i, &limb) in limbs.iter().enumerate() {
        let (w, s) = (i * 52 / 64, i * 52 % 64);
        words[w] |= limb << s;
        if s > 12 {
            words[w + 1] |= limb >> (64 - s);
        }
    }
    let mut out = vec![0u8; len];
    for (k, chunk) in out.rchunks_mut(8).enumerate() {
        let bytes = words[k].to_be_bytes();
        chunk.copy_from_slice(&bytes[8 - chunk.len()..]);
    }
    out
}

/// Big-endian bytes to `words` little-endian 64-bit words (bytes beyond them are dropped).
pub(crate) fn bytes_to_words(be: &[u8], words: usize) -> Vec<u64> {
    let mut out = vec![0u64; words];
    for (w, chunk) in out.iter_mut().zip(be.rchunks(8)) {
        let mut bytes = [0u8; 8];
        bytes[8 - chunk.len()..].copy_from_slice(chunk);
        *w = u64::from_be_bytes(bytes);
    }
    out
}

/// Number of significant bits of a big-endian value (public values only).
pub(crate) fn bit_len(be: &[u8]) -> usize {
    match be.iter().position(|&b| b != 0) {
        Some(i) => (be.len() - i) * 8 - be[i].leading_zeros() as usize,
        None => 0,
    }
}

/// -m⁻¹ mod 2^52 for odd m0 (Newton iteration: a fixed number of steps).
pub(crate) fn neg_inv52(m0: u64) -> u64 {
    let mut inv: u64 = 1;
    for _ in 0..6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(m0.wrapping_mul(inv)));
    }
    inv.wrapping_neg() & MASK52
}

/// x - m when x >= m, in place; limbs stay 52-bit. Constant time.
fn cond_sub(x: &mut [u64], m: &[u64]) {
    let mut d = vec![0u64; x.len()];
    let mut borrow = 0u64;
    for j in 0..x.len() {
        let t = x[j].wrapping_sub(m[j]).wrapping_sub(borrow);
        borrow = t >> 63;
        d[j] = t & MASK52;
    }
    let take = borrow.wrapping_sub(1); // all ones when no borrow (x >= m)
    for j in 0..x.len() {
        x[j] ^= take & (x[j] ^ d[j]);
    }
}

/// 2^k mod m for m of `m.len()` 52-bit limbs (constant time: k doublings, each followed by a
/// conditional subtraction). Used for R² = 2^(2·52·L) mod m.
pub(crate) fn pow2_mod(k: usize, m: &[u64]) -> Vec<u64> {
    let mut x = vec![0u64; m.len()];
    x[0] = 1;
    for _ in 0..k {
        let mut carry = 0;
        for l in x.iter_mut() {
            let t = (*l << 1) | carry;
            carry = t >> 52;
            *l = t & MASK52;
        }
        // x < 2m < 2^(52·L), so nothing carried out.
        cond_sub(&mut x, m);
    }
    x
}

/// x - small for x > small (big-endian bytes).
pub(crate) fn sub_small(be: &[u8], small: u8) -> Vec<u8> {
    let mut out = be.to_vec();
    let mut borrow = small as u16;
    for b in out.iter_mut().rev() {
        let t = (*b as u16).wrapping_sub(borrow);
        *b = t as u8;
        borrow = (t >> 15) & 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-at-a-time conversions the word-wise ones replaced.
    fn bytes_to_limbs_bytewise(be: &[u8], limbs: usize) -> Vec<u64> {
        let mut out = vec![0u64; limbs + 2];
        for (k, &b) in be.iter().rev().enumerate() {
            let (i, s) = (k * 8 / 52, k * 8 % 52);
            out[i] |= (b as u64) << s;
            if s > 44 {
                out[i + 1] |= (b as u64) >> (52 - s);
            }
        }
        out.iter_mut().for_each(|l| *l &= MASK52);
        out.truncate(limbs);
        out
    }

    #[test]
    fn word_wise_conversions_match_byte_wise() {
        let mut rng = fastrand::Rng::with_seed(11);
        for len in [1usize, 5, 8, 9, 13, 64, 127, 128, 256, 384, 512] {
            for _ in 0..20 {
                let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                let limbs = (len * 8).div_ceil(52);
                for extra in [0, 1, 3] {
                    let got = bytes_to_limbs(&bytes, limbs + extra);
                    assert_eq!(got, bytes_to_limbs_bytewise(&bytes, limbs + extra));
                    assert_eq!(limbs_to_bytes(&got, len), bytes);
                }
                let mut padded = vec![0u8; 3];
                padded.extend_from_slice(&bytes);
                assert_eq!(
                    limbs_to_bytes(&bytes_to_limbs(&bytes, limbs), len + 3),
                    padded
                );
            }
        }
        assert_eq!(
            bytes_to_words(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 2),
            vec![0x0203_0405_0607_0809, 1]
        );
    }

    #[test]
    fn limbs_round_trip() {
        let mut rng = fastrand::Rng::with_seed(7);
        for len in [1usize, 7, 13, 64, 128, 256, 384, 512] {
            let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let limbs = bytes_to_limbs(&bytes, (len * 8).div_ceil(52));
            assert!(limbs.iter().all(|l| *l <= MASK52));
            assert_eq!(limbs_to_bytes(&limbs, len), bytes);
        }
    }

    #[test]
    fn neg_inv_is_an_inverse() {
        for m0 in [1u64, 3, 0xF_FFFF_FFFF_FFFF, 0x1234_5678_9ABD] {
            let k0 = neg_inv52(m0);
            assert_eq!(m0.wrapping_mul(k0).wrapping_add(1) & MASK52, 0);
        }
    }

    #[test]
    fn pow2_mod_small() {
        // 2^100 mod 1000003
        let m = bytes_to_limbs(&1_000_003u64.to_be_bytes(), 2);
        let r = pow2_mod(100, &m);
        let expect = (0..100).fold(1u128, |x, _| (x * 2) % 1_000_003);
        assert_eq!(r[0] as u128 | (r[1] as u128) << 52, expect);
    }

    #[test]
    fn sub_small_borrows() {
        assert_eq!(sub_small(&[1, 0, 1], 2), vec![0, 255, 255]);
        assert_eq!(bit_len(&[0, 0, 5]), 3);
    }
}
