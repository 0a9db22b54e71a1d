//! Lane types: the vector registers the generic Montgomery kernel runs over.
//!
//! Every operation works lane by lane on 64-bit elements holding 52-bit limbs. The kernel in
//! [`crate::mont`] is written once against [`Lanes`] and instantiated per backend inside a
//! `#[target_feature]` entry point, so the intrinsics inline into it.

use std::fmt;

/// 2^52 - 1: the limb mask.
pub(crate) const MASK52: u64 = (1 << 52) - 1;

/// The lane operations the kernel needs. All are constant time: no lane value ever selects a
/// branch or a memory address.
pub(crate) trait Lanes: Copy {
    /// Independent requests per vector.
    const LANES: usize;
    /// A per-lane predicate.
    type Mask: Copy;

    /// # Safety
    /// The CPU must support the backend's features (checked by [`Backend::available`]).
    unsafe fn zero() -> Self;
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn splat(x: u64) -> Self;
    /// # Safety
    /// `src` must point at `LANES` readable `u64`s; CPU features as [`Lanes::zero`].
    unsafe fn load(src: *const u64) -> Self;
    /// # Safety
    /// `dst` must point at `LANES` writable `u64`s; CPU features as [`Lanes::zero`].
    unsafe fn store(self, dst: *mut u64);
    /// `self + low52(lo52(a) * lo52(b))`.
    unsafe fn madd_lo(self, a: Self, b: Self) -> Self;
    /// `self + high52(lo52(a) * lo52(b))`.
    unsafe fn madd_hi(self, a: Self, b: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    unsafe fn and(self, b: Self) -> Self;
    unsafe fn shr52(self) -> Self;
    unsafe fn shr63(self) -> Self;
    unsafe fn shl1(self) -> Self;
    /// Lanes where `self == b`.
    unsafe fn eq_mask(self, b: Self) -> Self::Mask;
    /// `b` in the lanes of `mask`, `a` elsewhere.
    unsafe fn blend(mask: Self::Mask, a: Self, b: Self) -> Self;
}

/// Which lane type signs. `Ifma512` and `Ifma256` need AVX-512 IFMA and VL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// 8 lanes in 512-bit registers.
    Ifma512,
    /// 4 lanes in 256-bit registers.
    Ifma256,
    /// One lane, plain 64-bit arithmetic: any CPU.
    Portable,
}

impl Backend {
    /// Requests signed per kernel pass.
    pub fn lanes(self) -> usize {
        match self {
            Backend::Ifma512 => 8,
            Backend::Ifma256 => 4,
            Backend::Portable => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Ifma512 => "ifma512",
            Backend::Ifma256 => "ifma256",
            Backend::Portable => "portable",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Backend::Ifma512, Backend::Ifma256, Backend::Portable]
            .into_iter()
            .find(|b| b.as_str() == name)
    }

    /// Whether this CPU can run the backend.
    pub fn available(self) -> bool {
        match self {
            Backend::Portable => true,
            Backend::Ifma512 | Backend::Ifma256 => ifma_detected(),
        }
    }

    /// Every backend this CPU runs, widest first.
    pub fn all_available() -> Vec<Backend> {
        [Backend::Ifma512, Backend::Ifma256, Backend::Portable]
            .into_iter()
            .filter(|b| b.available())
            .collect()
    }

    /// The default: the backend measured fastest on AVX-512 IFMA machines (see
    /// docs/benchmarks-history.md), or the portable one.
    pub fn best() -> Backend {
        if ifma_detected() {
            Backend::Ifma512
        } else {
            Backend::Portable
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(target_arch = "x86_64")]
fn ifma_detected() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512ifma")
        && std::is_x86_feature_detected!("avx512vl")
}

#[cfg(not(target_arch = "x86_64"))]
fn ifma_detected() -> bool {
    false
}

/// One lane of plain 64-bit arithmetic (the portable path).
#[derive(Clone, Copy)]
pub(crate) struct Scalar(u64);

impl Lanes for Scalar {
    const LANES: usize = 1;
    type Mask = u64;

    #[inline(always)]
    unsafe fn zero() -> Self {
        Scalar(0)
    }
    #[inline(always)]
    unsafe fn splat(x: u64) -> Self {
        Scalar(x)
    }
    #[inline(always)]
    unsafe fn load(src: *const u64) -> Self {
        // SAFETY: the caller guarantees `src` points at one readable u64.
        Scalar(unsafe { *src })
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u64) {
        // SAFETY: the caller guarantees `dst` points at one writable u64.
        unsafe { *dst = self.0 }
    }
    #[inline(always)]
    unsafe fn madd_lo(self, a: Self, b: Self) -> Self {
        let p = ((a.0 & MASK52) as u128) * ((b.0 & MASK52) as u128);
        Scalar(self.0.wrapping_add(p as u64 & MASK52))
    }
    #[inline(always)]
    unsafe fn madd_hi(self, a: Self, b: Self) -> Self {
        let p = ((a.0 & MASK52) as u128) * ((b.0 & MASK52) as u128);
        Scalar(self.0.wrapping_add((p >> 52) as u64))
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        Scalar(self.0.wrapping_add(b.0))
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        Scalar(self.0.wrapping_sub(b.0))
    }
    #[inline(always)]
    unsafe fn and(self, b: Self) -> Self {
        Scalar(self.0 & b.0)
    }
    #[inline(always)]
    unsafe fn shr52(self) -> Self {
        Scalar(self.0 >> 52)
    }
    #[inline(always)]
    unsafe fn shr63(self) -> Self {
        Scalar(self.0 >> 63)
    }
    #[inline(always)]
    unsafe fn shl1(self) -> Self {
        Scalar(self.0 << 1)
    }
    #[inline(always)]
    unsafe fn eq_mask(self, b: Self) -> u64 {
        // All ones when equal, without a branch: (x | -x) has its top bit set iff x != 0.
        let x = std::hint::black_box(self.0 ^ b.0);
        ((x | x.wrapping_neg()) >> 63).wrapping_sub(1)
    }
    #[inline(always)]
    unsafe fn blend(mask: u64, a: Self, b: Self) -> Self {
        Scalar(a.0 ^ (mask & (a.0 ^ b.0)))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Ymm, Zmm};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    /// Eight lanes in a 512-bit register.
    #[derive(Clone, Copy)]
    pub(crate) struct Zmm(__m512i);

    /// Four lanes in a 256-bit register (AVX-512 VL encodings of IFMA).
    #[derive(Clone, Copy)]
    pub(crate) struct Ymm(__m256i);

    // SAFETY (both impls): every method is an AVX-512F/IFMA/VL intrinsic; the trait's contract
    // makes the caller guarantee the CPU has them (entry points are `#[target_feature]` and are
    // reached only after `Backend::available`). Loads and stores are unaligned and touch exactly
    // LANES u64s, which the caller guarantees are valid.
    impl Lanes for Zmm {
        const LANES: usize = 8;
        type Mask = __mmask8;

        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_setzero_si512()) }
        }
        #[inline(always)]
        unsafe fn splat(x: u64) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_set1_epi64(x as i64)) }
        }
        #[inline(always)]
        unsafe fn load(src: *const u64) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_loadu_si512(src as *const _)) }
        }
        #[inline(always)]
        unsafe fn store(self, dst: *mut u64) {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { _mm512_storeu_si512(dst as *mut _, self.0) }
        }
        #[inline(always)]
        unsafe fn madd_lo(self, a: Self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_madd52lo_epu64(self.0, a.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn madd_hi(self, a: Self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_madd52hi_epu64(self.0, a.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_add_epi64(self.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_sub_epi64(self.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn and(self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_and_si512(self.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn shr52(self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_srli_epi64::<52>(self.0)) }
        }
        #[inline(always)]
        unsafe fn shr63(self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_srli_epi64::<63>(self.0)) }
        }
        #[inline(always)]
        unsafe fn shl1(self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_slli_epi64::<1>(self.0)) }
        }
        #[inline(always)]
        unsafe fn eq_mask(self, b: Self) -> __mmask8 {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { _mm512_cmpeq_epi64_mask(self.0, b.0) }
        }
        #[inline(always)]
        unsafe fn blend(mask: __mmask8, a: Self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Zmm(_mm512_mask_blend_epi64(mask, a.0, b.0)) }
        }
    }

    impl Lanes for Ymm {
        const LANES: usize = 4;
        type Mask = __mmask8;

        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_setzero_si256()) }
        }
        #[inline(always)]
        unsafe fn splat(x: u64) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_set1_epi64x(x as i64)) }
        }
        #[inline(always)]
        unsafe fn load(src: *const u64) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_loadu_si256(src as *const _)) }
        }
        #[inline(always)]
        unsafe fn store(self, dst: *mut u64) {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { _mm256_storeu_si256(dst as *mut _, self.0) }
        }
        #[inline(always)]
        unsafe fn madd_lo(self, a: Self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_madd52lo_epu64(self.0, a.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn madd_hi(self, a: Self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_madd52hi_epu64(self.0, a.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_add_epi64(self.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_sub_epi64(self.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn and(self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_and_si256(self.0, b.0)) }
        }
        #[inline(always)]
        unsafe fn shr52(self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_srli_epi64::<52>(self.0)) }
        }
        #[inline(always)]
        unsafe fn shr63(self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_srli_epi64::<63>(self.0)) }
        }
        #[inline(always)]
        unsafe fn shl1(self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_slli_epi64::<1>(self.0)) }
        }
        #[inline(always)]
        unsafe fn eq_mask(self, b: Self) -> __mmask8 {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { _mm256_cmpeq_epi64_mask(self.0, b.0) }
        }
        #[inline(always)]
        unsafe fn blend(mask: __mmask8, a: Self, b: Self) -> Self {
            // SAFETY: trait contract: CPU features checked, pointers valid for LANES u64s.
            unsafe { Ymm(_mm256_mask_blend_epi64(mask, a.0, b.0)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_madd_matches_u128() {
        let a = 0xF_FFFF_FFFF_FFFFu64;
        let b = 0x8_1234_5678_9ABCu64;
        let p = (a as u128) * (b as u128);
        // SAFETY: the scalar lane needs no CPU feature.
        unsafe {
            assert_eq!(
                Scalar(5).madd_lo(Scalar(a), Scalar(b)).0,
                5 + (p as u64 & MASK52)
            );
            assert_eq!(
                Scalar(7).madd_hi(Scalar(a), Scalar(b)).0,
                7 + (p >> 52) as u64
            );
            assert_eq!(Scalar(3).eq_mask(Scalar(3)), u64::MAX);
            assert_eq!(Scalar(3).eq_mask(Scalar(4)), 0);
        }
    }

    #[test]
    fn backend_names_round_trip() {
        for b in [Backend::Ifma512, Backend::Ifma256, Backend::Portable] {
            assert_eq!(Backend::from_name(b.as_str()), Some(b));
        }
        assert!(Backend::Portable.available());
    }
}
