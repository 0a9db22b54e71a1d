//! Fuzzes packetseal, the SIMD AES-GCM that seals every QUIC packet rampart sends and opens
//! every one it receives (the opening side reads bytes straight from the network), against
//! BoringSSL. For a key, nonce, header and payload taken from the input:
//! - `SealKey::seal`, in every width the CPU runs and split at an input-chosen point between
//!   the in-place part and `extra_in` (as quiche's writer splits frame headers from stream
//!   data), gives BoringSSL's ciphertext and tag;
//! - `OpenKey::open` returns that packet's payload, refuses it with any one bit flipped
//!   (payload, tag or header) and leaves the refused payload zeroed;
//! - opening the input's own bytes as a packet agrees with BoringSSL (refused, almost always).
//!
//! On a CPU without VAES and VPCLMULQDQ there is nothing to compare: quiche keeps BoringSSL.
#![no_main]

use boring::symm::{decrypt_aead, encrypt_aead, Cipher};
use libfuzzer_sys::fuzz_target;
use packetseal::{OpenError, OpenKey, SealKey, Width, NONCE_LEN, TAG_LEN};

fuzz_target!(|data: &[u8]| {
    let [flags, split, flip_lo, flip_hi, rest @ ..] = data else {
        return;
    };
    let key_len = if flags & 1 == 0 { 16 } else { 32 };
    let aad_len = (*flags as usize >> 1) % 64;
    if rest.len() < key_len + NONCE_LEN + aad_len {
        return;
    }
    let (key, rest) = rest.split_at(key_len);
    let (nonce, rest) = rest.split_at(NONCE_LEN);
    let nonce: &[u8; NONCE_LEN] = nonce.try_into().unwrap();
    let (aad, payload) = rest.split_at(aad_len);
    let cipher = if key_len == 16 {
        Cipher::aes_128_gcm()
    } else {
        Cipher::aes_256_gcm()
    };

    let mut want_tag = [0u8; TAG_LEN];
    let want = encrypt_aead(cipher, key, Some(nonce), aad, payload, &mut want_tag).unwrap();
    let mut packet = want.clone();
    packet.extend_from_slice(&want_tag);

    for width in Width::ALL.into_iter().filter(|w| w.available()) {
        let seal = SealKey::with_width(key, width).expect("a 16- or 32-byte key");
        let in_len = *split as usize % (payload.len() + 1);
        let mut buf = vec![0u8; payload.len() + TAG_LEN];
        buf[..in_len].copy_from_slice(&payload[..in_len]);
        let n = seal
            .seal(nonce, aad, &mut buf, in_len, &payload[in_len..])
            .unwrap();
        assert_eq!(n, packet.len());
        assert!(buf == packet, "{width:?}: sealed packet differs from BoringSSL's");
    }

    let Some(open) = OpenKey::new(key) else {
        return;
    };
    let mut buf = packet.clone();
    assert_eq!(open.open(nonce, aad, &mut buf), Ok(payload.len()));
    assert!(&buf[..payload.len()] == payload, "opened payload differs");

    // One bit flipped anywhere in the packet or its header: refused, payload wiped.
    let bit = u16::from_le_bytes([*flip_lo, *flip_hi]) as usize % ((packet.len() + aad.len()) * 8);
    let (mut buf, mut header) = (packet.clone(), aad.to_vec());
    if bit / 8 < packet.len() {
        buf[bit / 8] ^= 1 << (bit % 8);
    } else {
        header[bit / 8 - packet.len()] ^= 1 << (bit % 8);
    }
    assert_eq!(open.open(nonce, &header, &mut buf), Err(OpenError::Forged));
    assert!(buf[..payload.len()].iter().all(|&b| b == 0), "refused payload not wiped");

    // The input's own bytes as a received packet.
    if payload.len() >= TAG_LEN {
        let (ct, tag) = payload.split_at(payload.len() - TAG_LEN);
        let reference = decrypt_aead(cipher, key, Some(nonce), aad, ct, tag).ok();
        let mut buf = payload.to_vec();
        match open.open(nonce, aad, &mut buf) {
            Ok(n) => assert_eq!(Some(&buf[..n]), reference.as_deref()),
            Err(e) => {
                assert_eq!(e, OpenError::Forged);
                assert!(reference.is_none(), "BoringSSL opened what packetseal refused");
            }
        }
    }
});
