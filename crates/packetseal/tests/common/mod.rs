//! Test helpers shared by packetseal's integration tests.

// Each test binary compiles this module and uses only some of its helpers.
#![allow(dead_code)]

use packetseal::TAG_LEN;

/// BoringSSL's AES-GCM seal of a contiguous plaintext: ciphertext ‖ tag.
pub fn boring_seal(key: &[u8], nonce: &[u8; 12], aad: &[u8], plain: &[u8]) -> Vec<u8> {
    // SAFETY: plain FFI on buffers sized here; the context is freed before returning.
    unsafe {
        let aead = match key.len() {
            16 => boring_sys::EVP_aead_aes_128_gcm(),
            _ => boring_sys::EVP_aead_aes_256_gcm(),
        };
        let ctx = boring_sys::EVP_AEAD_CTX_new(aead, key.as_ptr(), key.len(), TAG_LEN);
        assert!(!ctx.is_null());
        let mut out = vec![0u8; plain.len() + TAG_LEN];
        let mut out_len = 0usize;
        let rc = boring_sys::EVP_AEAD_CTX_seal(
            ctx,
            out.as_mut_ptr(),
            &mut out_len,
            out.len(),
            nonce.as_ptr(),
            nonce.len(),
            plain.as_ptr(),
            plain.len(),
            aad.as_ptr(),
            aad.len(),
        );
        boring_sys::EVP_AEAD_CTX_free(ctx);
        assert_eq!(rc, 1);
        out.truncate(out_len);
        out
    }
}

/// The bytes a hex string spells.
pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
