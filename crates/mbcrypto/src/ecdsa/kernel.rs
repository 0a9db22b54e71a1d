//! P-256 arithmetic over [`Lanes`]: the field mod p and the scalars mod n as 5 × 52-bit limbs
//! (R = 2^260), complete mixed point addition, the fixed-base comb and the batch nonce pipeline.
//!
//! Everything here is constant time in the secret values (nonces and their inverses): no lane
//! value selects a branch or an address. Table entries are picked by scanning every entry of a
//! window with lane masks. Exponents (p − 2, n − 2) and sizes are public.
//!
//! Like [`crate::mont`], every kernel is a generic `#[inline(always)]` function instantiated
//! inside `#[target_feature]` entry points at the bottom, so the lane intrinsics inline.

use crate::bignum::pow2_mod;
use crate::lanes::{Lanes, Scalar, MASK52};
use crate::mont::{amm, ams};
use std::sync::OnceLock;

/// Limbs per field element or scalar.
pub(crate) const NL: usize = 5;

/// Bits per comb window; the table holds `2^W - 1` affine multiples per window.
pub(crate) const W: usize = 6;
/// Windows covering 256-bit scalars.
pub(crate) const NW: usize = 256_usize.div_ceil(W);
const ENTRIES: usize = (1 << W) - 1;
/// u64s per table entry: x and y, 5 limbs each.
const ENTRY_LEN: usize = 2 * NL;

type Fe<V> = [V; NL];

/// 4 little-endian 64-bit words to 5 little-endian 52-bit limbs.
pub(crate) const fn words_to_limbs(w: [u64; 4]) -> [u64; NL] {
    [
        w[0] & MASK52,
        ((w[0] >> 52) | (w[1] << 12)) & MASK52,
        ((w[1] >> 40) | (w[2] << 24)) & MASK52,
        ((w[2] >> 28) | (w[3] << 36)) & MASK52,
        w[3] >> 16,
    ]
}

/// 5 × 52-bit limbs (value below 2^256) to 4 little-endian words.
#[cfg(test)]
pub(crate) const fn limbs_to_words(l: &[u64; NL]) -> [u64; 4] {
    [
        l[0] | (l[1] << 52),
        (l[1] >> 12) | (l[2] << 40),
        (l[2] >> 24) | (l[3] << 28),
        (l[3] >> 36) | (l[4] << 16),
    ]
}

pub(crate) const P_WORDS: [u64; 4] = [
    0xFFFF_FFFF_FFFF_FFFF,
    0x0000_0000_FFFF_FFFF,
    0x0000_0000_0000_0000,
    0xFFFF_FFFF_0000_0001,
];
pub(crate) const N_WORDS: [u64; 4] = [
    0xF3B9_CAC2_FC63_2551,
    0xBCE6_FAAD_A717_9E84,
    0xFFFF_FFFF_FFFF_FFFF,
    0xFFFF_FFFF_0000_0000,
];
pub(crate) const B_WORDS: [u64; 4] = [
    0x3BCE_3C3E_27D2_604B,
    0x651D_06B0_CC53_B0F6,
    0xB3EB_BD55_7698_86BC,
    0x5AC6_35D8_AA3A_93E7,
];
pub(crate) const GX_WORDS: [u64; 4] = [
    0xF4A1_3945_D898_C296,
    0x7703_7D81_2DEB_33A0,
    0xF8BC_E6E5_63A4_40F2,
    0x6B17_D1F2_E12C_4247,
];
pub(crate) const GY_WORDS: [u64; 4] = [
    0xCBB6_4068_37BF_51F5,
    0x2BCE_3357_6B31_5ECE,
    0x8EE7_EB4A_7C0F_9E16,
    0x4FE3_42E2_FE1A_7F9B,
];

/// Per-curve constants, in limbs.
pub(crate) struct Consts {
    pub p: [u64; NL],
    pub two_p: [u64; NL],
    pub n: [u64; NL],
    /// −n⁻¹ mod 2^52 (−p⁻¹ mod 2^52 is 1: p ≡ −1 mod 2^96).
    pub n_k0: u64,
    /// R² mod p, R² mod n.
    pub rr_p: [u64; NL],
    pub rr_n: [u64; NL],
    /// R mod p, R mod n (Montgomery one).
    pub one_p: [u64; NL],
    pub one_n: [u64; NL],
    /// b·R mod p.
    pub b_m: [u64; NL],
    /// Public Fermat exponents.
    pub p_minus_2: [u64; 4],
    pub n_minus_2: [u64; 4],
}

fn to_arr(v: Vec<u64>) -> [u64; NL] {
    v.try_into().expect("5 limbs")
}

pub(crate) fn consts() -> &'static Consts {
    static C: OnceLock<Consts> = OnceLock::new();
    C.get_or_init(|| {
        let p = words_to_limbs(P_WORDS);
        let n = words_to_limbs(N_WORDS);
        let mut two_p = [0u64; NL];
        let mut c = 0;
        for j in 0..NL {
            let t = (p[j] << 1) + c;
            two_p[j] = t & MASK52;
            c = t >> 52;
        }
        let rr_p = to_arr(pow2_mod(2 * 52 * NL, &p));
        let rr_n = to_arr(pow2_mod(2 * 52 * NL, &n));
        let one_p = to_arr(pow2_mod(52 * NL, &p));
        let one_n = to_arr(pow2_mod(52 * NL, &n));
        let b_m = to_arr(crate::mont::prep::mont_mul::<NL>(
            &words_to_limbs(B_WORDS),
            &rr_p,
            &p,
            1,
        ));
        let mut p_minus_2 = P_WORDS;
        p_minus_2[0] -= 2;
        let mut n_minus_2 = N_WORDS;
        n_minus_2[0] -= 2;
        Consts {
            p,
            two_p,
            n,
            n_k0: crate::bignum::neg_inv52(n[0]),
            rr_p,
            rr_n,
            one_p,
            one_n,
            b_m,
            p_minus_2,
            n_minus_2,
        }
    })
}

/// The same constants splatted across lanes.
struct VConsts<V> {
    p: Fe<V>,
    two_p: Fe<V>,
    n: Fe<V>,
    k0_p: V,
    k0_n: V,
    rr_n: Fe<V>,
    one_p: Fe<V>,
    one_n: Fe<V>,
    b_m: Fe<V>,
}

#[inline(always)]
unsafe fn splat5<V: Lanes>(c: &[u64; NL]) -> Fe<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let mut o = [V::zero(); NL];
        for j in 0..NL {
            o[j] = V::splat(c[j]);
        }
        o
    }
}

#[inline(always)]
unsafe fn vconsts<V: Lanes>(c: &Consts) -> VConsts<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        VConsts {
            p: splat5(&c.p),
            two_p: splat5(&c.two_p),
            n: splat5(&c.n),
            k0_p: V::splat(1),
            k0_n: V::splat(c.n_k0),
            rr_n: splat5(&c.rr_n),
            one_p: splat5(&c.one_p),
            one_n: splat5(&c.one_n),
            b_m: splat5(&c.b_m),
        }
    }
}

/// Carries each limb's excess into the next (the carry out of the top limb is dropped).
#[inline(always)]
unsafe fn carry<V: Lanes>(x: &mut Fe<V>) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { crate::mont::normalize(x) }
}

/// x − m where x ≥ m, else x (52-bit limbs).
#[inline(always)]
unsafe fn csub<V: Lanes>(x: &Fe<V>, m: &Fe<V>) -> Fe<V> {
    let mut out = *x;
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { crate::mont::cond_sub(&mut out, m) };
    out
}

/// (a + b) mod 2p-ish: inputs below 2p, output below 2p.
#[inline(always)]
unsafe fn fadd<V: Lanes>(a: &Fe<V>, b: &Fe<V>, c: &VConsts<V>) -> Fe<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let mut t = *a;
        for j in 0..NL {
            t[j] = t[j].add(b[j]);
        }
        carry(&mut t);
        csub(&t, &c.two_p)
    }
}

/// (a − b) mod 2p-ish: inputs below 2p, output below 2p.
#[inline(always)]
unsafe fn fsub<V: Lanes>(a: &Fe<V>, b: &Fe<V>, c: &VConsts<V>) -> Fe<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { crate::mont::sub_mod(a, b, &c.two_p) }
}

#[inline(always)]
unsafe fn fmul<V: Lanes>(a: &Fe<V>, b: &Fe<V>, c: &VConsts<V>) -> Fe<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { amm(a, b, &c.p, c.k0_p) }
}

#[inline(always)]
unsafe fn ftriple<V: Lanes>(a: &Fe<V>, c: &VConsts<V>) -> Fe<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { fadd(&fadd(a, a, c), a, c) }
}

/// A point in homogeneous projective coordinates (x = X/Z, y = Y/Z), Montgomery form.
#[derive(Clone, Copy)]
struct Proj<V> {
    x: Fe<V>,
    y: Fe<V>,
    z: Fe<V>,
}

/// P + Q for Q affine (not the identity), complete for a = −3: Renes–Costello–Batina 2016,
/// algorithm 5 (11M + 2 multiplications by b). P may be the identity (0 : 1 : 0) or equal Q.
#[inline(always)]
unsafe fn add_mixed<V: Lanes>(p: &Proj<V>, qx: &Fe<V>, qy: &Fe<V>, c: &VConsts<V>) -> Proj<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let xx = fmul(&p.x, qx, c);
        let yy = fmul(&p.y, qy, c);
        let s1 = fadd(&p.x, &p.y, c);
        let s2 = fadd(qx, qy, c);
        let xy = fsub(&fmul(&s1, &s2, c), &fadd(&xx, &yy, c), c);
        let yz = fadd(&fmul(qy, &p.z, c), &p.y, c);
        let xz = fadd(&fmul(qx, &p.z, c), &p.x, c);
        let bz = fsub(&xz, &fmul(&c.b_m, &p.z, c), c);
        let bz3 = ftriple(&bz, c);
        let yy_m = fsub(&yy, &bz3, c);
        let yy_p = fadd(&yy, &bz3, c);
        let z3 = ftriple(&p.z, c);
        let bxz = fsub(&fmul(&c.b_m, &xz, c), &fadd(&z3, &xx, c), c);
        let bxz3 = ftriple(&bxz, c);
        let xx3_m = fsub(&ftriple(&xx, c), &z3, c);
        Proj {
            x: fsub(&fmul(&yy_p, &xy, c), &fmul(&yz, &bxz3, c), c),
            y: fadd(&fmul(&yy_p, &yy_m, c), &fmul(&xx3_m, &bxz3, c), c),
            z: fadd(&fmul(&yy_m, &yz, c), &fmul(&xy, &xx3_m, c), c),
        }
    }
}

/// a^e in Montgomery form for a public exponent `e` (4-bit fixed window).
#[inline(always)]
unsafe fn pow_public<V: Lanes>(a: &Fe<V>, e: &[u64; 4], m: &Fe<V>, k0: V, one: &Fe<V>) -> Fe<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let mut t = [*one; 16];
        t[1] = *a;
        for i in 2..16 {
            t[i] = amm(&t[i - 1], a, m, k0);
        }
        let nib = |i: usize| ((e[i / 16] >> (4 * (i % 16))) & 15) as usize;
        let mut acc = t[nib(63)];
        for i in (0..63).rev() {
            for _ in 0..4 {
                acc = ams::<V, NL, { 2 * NL }>(&acc, m, k0);
            }
            let d = nib(i);
            if d != 0 {
                acc = amm(&acc, &t[d], m, k0);
            }
        }
        acc
    }
}

/// Inverts every lane of every element in place (Montgomery form, inputs nonzero, below 2m):
/// Montgomery's trick per lane over the elements, then one vector inversion by Fermat.
#[inline(always)]
unsafe fn batch_invert<V: Lanes>(
    vals: &mut [Fe<V>],
    m: &Fe<V>,
    k0: V,
    one: &Fe<V>,
    m_minus_2: &[u64; 4],
) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let count = vals.len();
        let mut prefix = Vec::with_capacity(count);
        let mut acc = vals[0];
        prefix.push(acc);
        for v in vals.iter().skip(1) {
            acc = amm(&acc, v, m, k0);
            prefix.push(acc);
        }
        let mut inv = pow_public(&acc, m_minus_2, m, k0, one);
        for i in (1..count).rev() {
            let next = amm(&inv, &vals[i], m, k0);
            vals[i] = amm(&inv, &prefix[i - 1], m, k0);
            inv = next;
        }
        vals[0] = inv;
        for v in prefix.iter_mut() {
            *v = [V::zero(); NL];
        }
        std::hint::black_box(&prefix);
    }
}

#[inline(always)]
unsafe fn load5<V: Lanes>(src: &[u64]) -> Fe<V> {
    assert!(src.len() >= NL * V::LANES);
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    let mut out = [unsafe { V::zero() }; NL];
    for (j, o) in out.iter_mut().enumerate() {
        // SAFETY: `src` holds NL·LANES values (asserted).
        *o = unsafe { V::load(src.as_ptr().add(j * V::LANES)) };
    }
    out
}

#[inline(always)]
unsafe fn store5<V: Lanes>(x: &Fe<V>, dst: &mut [u64]) {
    assert!(dst.len() >= NL * V::LANES);
    for (j, v) in x.iter().enumerate() {
        // SAFETY: `dst` holds NL·LANES values (asserted).
        unsafe { v.store(dst.as_mut_ptr().add(j * V::LANES)) };
    }
}

/// Entries actually used in window `w`: the top window sees only the scalar's top bits.
const fn window_entries(w: usize) -> usize {
    let bits = 256 - w * W;
    if bits >= W {
        ENTRIES
    } else {
        (1 << bits) - 1
    }
}

/// k·G for each lane: `digits` holds the NW window digits (`[w * LANES + lane]`), public table.
#[inline(always)]
unsafe fn comb<V: Lanes>(digits: &[u64], table: &[u64], c: &VConsts<V>) -> Proj<V> {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let zero = V::zero();
        let mut acc = Proj {
            x: [zero; NL],
            y: c.one_p,
            z: [zero; NL],
        };
        for w in 0..NW {
            let d = V::load(digits.as_ptr().add(w * V::LANES));
            let base = &table[w * ENTRIES * ENTRY_LEN..(w + 1) * ENTRIES * ENTRY_LEN];
            let mut qx = [zero; NL];
            let mut qy = [zero; NL];
            for e in 0..window_entries(w) {
                let hit = d.eq_mask(V::splat(e as u64 + 1));
                let entry = &base[e * ENTRY_LEN..(e + 1) * ENTRY_LEN];
                for j in 0..NL {
                    qx[j] = V::blend(hit, qx[j], V::splat(entry[j]));
                    qy[j] = V::blend(hit, qy[j], V::splat(entry[NL + j]));
                }
            }
            let is_zero = d.eq_mask(zero);
            let sum = if w == 0 {
                // The accumulator is the identity: the sum is Q itself.
                Proj {
                    x: qx,
                    y: qy,
                    z: c.one_p,
                }
            } else {
                add_mixed(&acc, &qx, &qy, c)
            };
            for j in 0..NL {
                acc.x[j] = V::blend(is_zero, sum.x[j], acc.x[j]);
                acc.y[j] = V::blend(is_zero, sum.y[j], acc.y[j]);
                acc.z[j] = V::blend(is_zero, sum.z[j], acc.z[j]);
            }
        }
        acc
    }
}

/// Projective k·G for `m` groups of LANES scalars: `digits` `[(g * NW + w) * LANES + lane]`,
/// `xyz` out `[(g * 3 + coord) * NL * LANES ..]` (Montgomery form).
#[inline(always)]
unsafe fn comb_batch<V: Lanes>(k: &Consts, table: &[u64], digits: &[u64], xyz: &mut [u64]) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let c = vconsts::<V>(k);
        let stride = NW * V::LANES;
        let out = 3 * NL * V::LANES;
        for (g, d) in digits.chunks_exact(stride).enumerate() {
            let pt = comb::<V>(d, table, &c);
            let o = &mut xyz[g * out..(g + 1) * out];
            store5(&pt.x, &mut o[..NL * V::LANES]);
            store5(&pt.y, &mut o[NL * V::LANES..2 * NL * V::LANES]);
            store5(&pt.z, &mut o[2 * NL * V::LANES..]);
        }
    }
}

/// The nonce pipeline for `m` groups of LANES nonces: k·G, affine x by one batch inversion,
/// r = x mod n, and k⁻¹·R mod n by a second batch inversion. `ks` holds k (< n, nonzero) as
/// limbs `[(g * NL + j) * LANES + lane]`; `r` and `kinv` come out in the same layout, fully
/// reduced.
#[inline(always)]
unsafe fn nonce_batch<V: Lanes>(
    k: &Consts,
    table: &[u64],
    digits: &[u64],
    ks: &[u64],
    r: &mut [u64],
    kinv: &mut [u64],
) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe {
        let c = vconsts::<V>(k);
        let stride = NW * V::LANES;
        let fe = NL * V::LANES;
        let m = digits.len() / stride;
        let mut xs: Vec<Fe<V>> = Vec::with_capacity(m);
        let mut zs: Vec<Fe<V>> = Vec::with_capacity(m);
        for d in digits.chunks_exact(stride) {
            let pt = comb::<V>(d, table, &c);
            xs.push(pt.x);
            zs.push(pt.z);
        }
        batch_invert(&mut zs, &c.p, c.k0_p, &c.one_p, &k.p_minus_2);
        let mut unit = [V::zero(); NL];
        unit[0] = V::splat(1);
        for g in 0..m {
            let x_m = fmul(&xs[g], &zs[g], &c);
            // Out of Montgomery form: at most p, then fully reduced, then mod n (p < 2n).
            let x = csub(&amm(&x_m, &unit, &c.p, c.k0_p), &c.p);
            store5(&csub(&x, &c.n), &mut r[g * fe..(g + 1) * fe]);
        }
        let mut kms: Vec<Fe<V>> = Vec::with_capacity(m);
        for g in 0..m {
            let kk = load5::<V>(&ks[g * fe..(g + 1) * fe]);
            kms.push(amm(&kk, &c.rr_n, &c.n, c.k0_n));
        }
        batch_invert(&mut kms, &c.n, c.k0_n, &c.one_n, &k.n_minus_2);
        for (g, ki) in kms.iter_mut().enumerate() {
            *ki = csub(ki, &c.n);
            store5(ki, &mut kinv[g * fe..(g + 1) * fe]);
        }
        // Best effort: the secret intermediates on the heap.
        for v in xs.iter_mut().chain(zs.iter_mut()).chain(kms.iter_mut()) {
            *v = [V::zero(); NL];
        }
        std::hint::black_box((&xs, &zs, &kms));
    }
}

/// Window digits of one scalar (4 little-endian words), constant time.
pub(crate) fn digits_of(k: &[u64; 4]) -> [u64; NW] {
    let mut d = [0u64; NW];
    for (w, out) in d.iter_mut().enumerate() {
        let bit = w * W;
        let (i, s) = (bit / 64, bit % 64);
        let mut v = k[i] >> s;
        if s + W > 64 && i + 1 < 4 {
            v |= k[i + 1] << (64 - s);
        }
        *out = v & ((1 << W) - 1);
    }
    d
}

// ---- Single-lane helpers (portable) for key preparation, signing and the table ----

#[inline(always)]
fn sl(a: &[u64; NL]) -> Fe<Scalar> {
    // SAFETY: the scalar lane needs no CPU feature.
    unsafe { splat5(a) }
}

#[inline(always)]
fn unsl(a: &Fe<Scalar>) -> [u64; NL] {
    let mut out = [0u64; NL];
    // SAFETY: the scalar lane needs no CPU feature; `out` holds NL values.
    unsafe { store5(a, &mut out) };
    out
}

/// a·b·R⁻¹ mod n, fully reduced (a, b below 2n).
pub(crate) fn mul_n(a: &[u64; NL], b: &[u64; NL]) -> [u64; NL] {
    let k = consts();
    // SAFETY: the scalar lane needs no CPU feature.
    unsafe {
        let n = sl(&k.n);
        unsl(&csub(&amm(&sl(a), &sl(b), &n, Scalar::splat(k.n_k0)), &n))
    }
}

/// (a + b) mod n for a, b below n.
pub(crate) fn add_n(a: &[u64; NL], b: &[u64; NL]) -> [u64; NL] {
    let k = consts();
    let mut t = [0u64; NL];
    for j in 0..NL {
        t[j] = a[j] + b[j];
    }
    // SAFETY: the scalar lane needs no CPU feature.
    unsafe {
        let mut v = sl(&t);
        carry(&mut v);
        unsl(&csub(&v, &sl(&k.n)))
    }
}

/// x mod n for x below 2^256 (< 2n), constant time.
pub(crate) fn reduce_n(x: &[u64; NL]) -> [u64; NL] {
    // SAFETY: the scalar lane needs no CPU feature.
    unsafe { unsl(&csub(&sl(x), &sl(&consts().n))) }
}

/// The precomputed comb table: for each window w, the affine multiples j·2^(W·w)·G for
/// j = 1..2^W−1, Montgomery form, `[((w * ENTRIES + j − 1) * 2 + coord) * NL + limb]`. Public.
pub(crate) fn table() -> &'static [u64] {
    static T: OnceLock<Vec<u64>> = OnceLock::new();
    T.get_or_init(build_table)
}

fn build_table() -> Vec<u64> {
    let k = consts();
    // SAFETY: the scalar lane needs no CPU feature.
    unsafe {
        let c = vconsts::<Scalar>(k);
        let rr_p = sl(&k.rr_p);
        let mut bx = fmul(&sl(&words_to_limbs(GX_WORDS)), &rr_p, &c);
        let mut by = fmul(&sl(&words_to_limbs(GY_WORDS)), &rr_p, &c);
        let mut out = vec![0u64; NW * ENTRIES * ENTRY_LEN];
        for w in 0..NW {
            // j·base for j = 1..=2^W, projective, then all to affine with one inversion.
            let mut pts = Vec::with_capacity(ENTRIES + 1);
            let mut acc = Proj {
                x: bx,
                y: by,
                z: c.one_p,
            };
            pts.push(acc);
            for _ in 1..=ENTRIES {
                acc = add_mixed(&acc, &bx, &by, &c);
                pts.push(acc);
            }
            let mut zs: Vec<Fe<Scalar>> = pts.iter().map(|p| p.z).collect();
            batch_invert(&mut zs, &c.p, c.k0_p, &c.one_p, &k.p_minus_2);
            let affine: Vec<([u64; NL], [u64; NL])> = pts
                .iter()
                .zip(&zs)
                .map(|(p, zi)| {
                    let x = csub(&fmul(&p.x, zi, &c), &c.p);
                    let y = csub(&fmul(&p.y, zi, &c), &c.p);
                    (unsl(&x), unsl(&y))
                })
                .collect();
            for (j, (x, y)) in affine.iter().take(ENTRIES).enumerate() {
                let at = (w * ENTRIES + j) * ENTRY_LEN;
                out[at..at + NL].copy_from_slice(x);
                out[at + NL..at + ENTRY_LEN].copy_from_slice(y);
            }
            let next = affine[ENTRIES];
            bx = sl(&next.0);
            by = sl(&next.1);
        }
        out
    }
}

/// Affine (x, y) (plain form, fully reduced) of a projective point given in Montgomery form,
/// one lane. Used by the test hook only.
pub(crate) fn to_affine(x: &[u64; NL], y: &[u64; NL], z: &[u64; NL]) -> ([u64; NL], [u64; NL]) {
    let k = consts();
    // SAFETY: the scalar lane needs no CPU feature.
    unsafe {
        let c = vconsts::<Scalar>(k);
        let zi = pow_public(&sl(z), &k.p_minus_2, &c.p, c.k0_p, &c.one_p);
        let mut unit = [Scalar::zero(); NL];
        unit[0] = Scalar::splat(1);
        let ax = amm(&fmul(&sl(x), &zi, &c), &unit, &c.p, c.k0_p);
        let ay = amm(&fmul(&sl(y), &zi, &c), &unit, &c.p, c.k0_p);
        (unsl(&csub(&ax, &c.p)), unsl(&csub(&ay, &c.p)))
    }
}

/// Two vectors side by side: every operation is issued for both halves, so two independent
/// dependency chains interleave (the kernel is latency-bound with one vector).
#[derive(Clone, Copy)]
pub(crate) struct Pair<V>(V, V);

impl<V: Lanes> Lanes for Pair<V> {
    const LANES: usize = 2 * V::LANES;
    type Mask = (V::Mask, V::Mask);

    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(V::zero(), V::zero()) }
    }
    #[inline(always)]
    unsafe fn splat(x: u64) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(V::splat(x), V::splat(x)) }
    }
    #[inline(always)]
    unsafe fn load(src: *const u64) -> Self {
        // SAFETY: the caller guarantees 2·V::LANES readable u64s at `src`.
        unsafe { Pair(V::load(src), V::load(src.add(V::LANES))) }
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u64) {
        // SAFETY: the caller guarantees 2·V::LANES writable u64s at `dst`.
        unsafe {
            self.0.store(dst);
            self.1.store(dst.add(V::LANES));
        }
    }
    #[inline(always)]
    unsafe fn madd_lo(self, a: Self, b: Self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.madd_lo(a.0, b.0), self.1.madd_lo(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn madd_hi(self, a: Self, b: Self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.madd_hi(a.0, b.0), self.1.madd_hi(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.add(b.0), self.1.add(b.1)) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.sub(b.0), self.1.sub(b.1)) }
    }
    #[inline(always)]
    unsafe fn and(self, b: Self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.and(b.0), self.1.and(b.1)) }
    }
    #[inline(always)]
    unsafe fn shr52(self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.shr52(), self.1.shr52()) }
    }
    #[inline(always)]
    unsafe fn shr63(self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.shr63(), self.1.shr63()) }
    }
    #[inline(always)]
    unsafe fn shl1(self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(self.0.shl1(), self.1.shl1()) }
    }
    #[inline(always)]
    unsafe fn eq_mask(self, b: Self) -> Self::Mask {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { (self.0.eq_mask(b.0), self.1.eq_mask(b.1)) }
    }
    #[inline(always)]
    unsafe fn blend(mask: Self::Mask, a: Self, b: Self) -> Self {
        // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
        unsafe { Pair(V::blend(mask.0, a.0, b.0), V::blend(mask.1, a.1, b.1)) }
    }
}

/// Nonces per kernel group for a backend: two registers' worth (see [`Pair`]).
pub(crate) fn group_lanes(backend: crate::Backend) -> usize {
    2 * backend.lanes()
}

// ---- Entry points ----

pub(crate) type NonceFn = unsafe fn(&Consts, &[u64], &[u64], &[u64], &mut [u64], &mut [u64]);
pub(crate) type CombFn = unsafe fn(&Consts, &[u64], &[u64], &mut [u64]);

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512ifma,avx512vl")]
unsafe fn nonce_zmm(k: &Consts, t: &[u64], d: &[u64], ks: &[u64], r: &mut [u64], ki: &mut [u64]) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { nonce_batch::<Pair<crate::lanes::Zmm>>(k, t, d, ks, r, ki) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512ifma,avx512vl")]
unsafe fn nonce_ymm(k: &Consts, t: &[u64], d: &[u64], ks: &[u64], r: &mut [u64], ki: &mut [u64]) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { nonce_batch::<Pair<crate::lanes::Ymm>>(k, t, d, ks, r, ki) }
}

unsafe fn nonce_scalar(
    k: &Consts,
    t: &[u64],
    d: &[u64],
    ks: &[u64],
    r: &mut [u64],
    ki: &mut [u64],
) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { nonce_batch::<Pair<Scalar>>(k, t, d, ks, r, ki) }
}

/// One nonce on the portable lane: for direct signing, where a wider pass would compute
/// nonces nobody uses.
pub(crate) unsafe fn nonce_single(
    k: &Consts,
    t: &[u64],
    d: &[u64],
    ks: &[u64],
    r: &mut [u64],
    ki: &mut [u64],
) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { nonce_batch::<Scalar>(k, t, d, ks, r, ki) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512ifma,avx512vl")]
unsafe fn comb_zmm(k: &Consts, t: &[u64], d: &[u64], xyz: &mut [u64]) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { comb_batch::<Pair<crate::lanes::Zmm>>(k, t, d, xyz) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512ifma,avx512vl")]
unsafe fn comb_ymm(k: &Consts, t: &[u64], d: &[u64], xyz: &mut [u64]) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { comb_batch::<Pair<crate::lanes::Ymm>>(k, t, d, xyz) }
}

unsafe fn comb_scalar(k: &Consts, t: &[u64], d: &[u64], xyz: &mut [u64]) {
    // SAFETY: this `unsafe fn`'s contract holds (the lane type's CPU features).
    unsafe { comb_batch::<Pair<Scalar>>(k, t, d, xyz) }
}

/// The nonce pipeline for a backend (the caller checks `backend.available()`).
pub(crate) fn nonce_fn(backend: crate::Backend) -> NonceFn {
    match backend {
        #[cfg(target_arch = "x86_64")]
        crate::Backend::Ifma512 => nonce_zmm,
        #[cfg(target_arch = "x86_64")]
        crate::Backend::Ifma256 => nonce_ymm,
        _ => nonce_scalar,
    }
}

/// The fixed-base multiplication for a backend (the caller checks `backend.available()`).
pub(crate) fn comb_fn(backend: crate::Backend) -> CombFn {
    match backend {
        #[cfg(target_arch = "x86_64")]
        crate::Backend::Ifma512 => comb_zmm,
        #[cfg(target_arch = "x86_64")]
        crate::Backend::Ifma256 => comb_ymm,
        _ => comb_scalar,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limb_conversions_round_trip() {
        for w in [P_WORDS, N_WORDS, B_WORDS, GX_WORDS, [u64::MAX; 4]] {
            assert_eq!(limbs_to_words(&words_to_limbs(w)), w);
        }
    }

    #[test]
    fn p_inverse_constant_is_one() {
        let p = words_to_limbs(P_WORDS);
        assert_eq!(crate::bignum::neg_inv52(p[0]), 1);
    }

    #[test]
    fn mod_n_inverse_by_fermat() {
        let k = consts();
        let a = words_to_limbs([12345, 678, 9, 0x1234]);
        let a_m = mul_n(&a, &k.rr_n);
        // SAFETY: the scalar lane needs no CPU feature.
        let inv = unsafe {
            let c = vconsts::<Scalar>(k);
            unsl(&pow_public(&sl(&a_m), &k.n_minus_2, &c.n, c.k0_n, &c.one_n))
        };
        // a_m · inv_m · R⁻¹ = R, then out of Montgomery form: 1.
        let prod = mul_n(&mul_n(&a_m, &inv), &[1, 0, 0, 0, 0]);
        assert_eq!(prod, [1, 0, 0, 0, 0]);
    }
}
