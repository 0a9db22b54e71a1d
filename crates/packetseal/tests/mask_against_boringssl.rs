//! `MaskKey` (QUIC header protection with AES) against published vectors and BoringSSL's
//! `AES_ecb_encrypt`, which quiche uses where packetseal does not.

mod common;

use packetseal::MaskKey;

/// `N` bytes from a hex string.
fn hex<const N: usize>(s: &str) -> [u8; N] {
    common::hex(s).try_into().unwrap()
}

fn boringssl_ecb(key: &[u8], block: &[u8; 16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: an AES_KEY is plain data that AES_set_encrypt_key fills in; `key` has the length
    // in bits passed, and both blocks are 16 bytes.
    unsafe {
        let mut aes: boring_sys::AES_KEY = std::mem::zeroed();
        assert_eq!(
            boring_sys::AES_set_encrypt_key(key.as_ptr(), key.len() as u32 * 8, &mut aes),
            0
        );
        boring_sys::AES_ecb_encrypt(block.as_ptr(), out.as_mut_ptr(), &aes, 1);
    }
    out
}

#[test]
fn rfc9001_appendix_a_header_protection_masks() {
    let Some(client) = MaskKey::new(&hex::<16>("9f50449e04a0e810283a1e9933adedd2")) else {
        eprintln!("skipped: no AES-NI");
        return;
    };
    // A.2: the client Initial's sample and mask.
    let mask = client.mask(&hex("d1b1c98dd7689fb8ec11d242b123dc9b"));
    assert_eq!(mask[..5], hex::<5>("437b9aec36"));
    // A.3: the server Initial's.
    let server = MaskKey::new(&hex::<16>("c206b8d9b9f0f37644430b490eeaa314")).unwrap();
    let mask = server.mask(&hex("2cd0991cd25b0aac406a5816b6394100"));
    assert_eq!(mask[..5], hex::<5>("2ec0d8356a"));
}

#[test]
fn fips197_appendix_c_blocks() {
    let Some(k128) = MaskKey::new(&hex::<16>("000102030405060708090a0b0c0d0e0f")) else {
        return;
    };
    let pt = hex("00112233445566778899aabbccddeeff");
    assert_eq!(k128.mask(&pt), hex("69c4e0d86a7b0430d8cdb78070b4c55a"));
    let k256 = MaskKey::new(&hex::<32>(
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
    ))
    .unwrap();
    assert_eq!(k256.mask(&pt), hex("8ea2b7ca516745bfeafc49904b496089"));
}

#[test]
fn random_keys_and_samples_match_boringssl() {
    if MaskKey::new(&[0; 16]).is_none() {
        return;
    }
    for len in [16, 32] {
        for _ in 0..200 {
            let key: Vec<u8> = (0..len).map(|_| fastrand::u8(..)).collect();
            let sample: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
            let ours = MaskKey::new(&key).unwrap();
            assert_eq!(
                ours.mask(&sample),
                boringssl_ecb(&key, &sample),
                "key {key:02x?}"
            );
        }
    }
}

#[test]
fn other_key_lengths_are_refused() {
    for len in [0, 15, 24, 31, 33] {
        assert!(MaskKey::new(&vec![7; len]).is_none(), "{len} bytes");
    }
}
