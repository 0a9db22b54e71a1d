//! Multi-buffer private-key cryptography.
//!
//! * [`rsa`]: the RSA private-key operation (CRT, 2048/3072/4096-bit keys) over several
//!   independent requests at once. Each vector lane holds one request; limbs are 52 bits wide
//!   so AVX-512 IFMA (`vpmadd52luq`/`vpmadd52huq`) multiplies them. Montgomery arithmetic,
//!   fixed-window exponentiation with constant-time table selection, base blinding, PKCS#1 v1.5
//!   and PSS padding, and every signature checked against the public key before release.
//! * [`ecdsa`]: P-256 signing from a pool of precomputed nonces.
//!
//! The same generic kernel runs over three lane types ([`Backend`]): 8 lanes in 512-bit
//! registers, 4 lanes in 256-bit registers (both need AVX-512 IFMA + VL, detected at run time)
//! and a portable one-lane path used everywhere else.

mod bignum;
pub mod der;
pub mod ecdsa;
mod lanes;
mod mont;
pub mod padding;
pub mod rsa;

pub use lanes::Backend;
pub use padding::Hash;
