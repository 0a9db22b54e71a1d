//! Conversions between big-endian bytes and little-endian limbs, and per-modulus constants,
//! all constant time in the values.

use crate::lanes::MASK52;

/// Big-endian bytes to `limbs` little-endian 52-bit limbs. The value must fit.
pub(crate) fn bytes_to_limbs(be: &[u8], limbs: usize) -> Vec<u64> {
    let mut out = vec![0u64; limbs + 1];
    for (k, &b) in be.iter().rev().enumerate() {
        let bit = k * 8;
        let (i, s) = (bit / 52, bit % 52);
        out[i] |= (b as u64) << s;
        if s > 44 {
            out[i + 1] |= (b as u64) >> (52 - s);
        }
    }
    for l in out.iter_mut() {
        *l &= MASK52;
    }
    out.truncate(limbs);
    out
}

/// 52-bit limbs to `len` big-endian bytes (the value must fit).
pub(crate) fn limbs_to_bytes(limbs: &[u64], len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (k, o) in out.iter_mut().rev().enumerate() {
        let bit = k * 8;
        let (i, s) = (bit / 52, bit % 52);
        let mut v = limbs.get(i).copied().unwrap_or(0) >> s;
        if s > 44 {
            v |= limbs.get(i + 1).copied().unwrap_or(0) << (52 - s);
        }
        *o = v as u8;
    }
    out
}

/// Big-endian bytes to `words` little-endian 64-bit words.
pub(crate) fn bytes_to_words(be: &[u8], words: usize) -> Vec<u64> {
    let mut out = vec![0u64; words];
    for (k, &b) in be.iter().rev().enumerate() {
        out[k / 8] |= (b as u64) << (8 * (k % 8));
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
