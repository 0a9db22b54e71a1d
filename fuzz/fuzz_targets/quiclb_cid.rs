//! Fuzzes the QUIC-LB decoder (it reads the destination connection ID of arriving packets,
//! and an L4 balancer runs it on every packet): for a config taken from the input's first
//! bytes, decoding the rest never panics and yields a server ID of the configured length, and
//! an ID encoded from the input's bytes decodes to the server ID it was made with.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiclb::{Config, Decoder, Encoder};

const KEY: [u8; 16] = *b"rampart-fuzz-key";

fuzz_target!(|data: &[u8]| {
    let [a, b, rest @ ..] = data else { return };
    let server_id_len = 1 + (*a as usize & 0x0f) % 15;
    let nonce_len = 4 + *b as usize % (16 - server_id_len);
    let cfg = Config {
        rotation: (a >> 4) % 7,
        server_id_len,
        nonce_len,
        key: (a & 0x80 != 0).then_some(KEY),
        self_encode_length: b & 0x80 != 0,
    };
    let decoder = Decoder::new(vec![cfg.clone()]).expect("valid config");

    if let Some(sid) = decoder.server_id(rest) {
        assert_eq!(sid.len(), server_id_len);
    }

    // Round trip: server ID and nonce from the input, padded with zeros.
    let take = |n: usize, skip: usize| -> Vec<u8> {
        (0..n)
            .map(|i| rest.get(skip + i).copied().unwrap_or(0))
            .collect()
    };
    let sid = take(server_id_len, 0);
    let nonce = take(nonce_len, server_id_len);
    let encoder = Encoder::new(cfg.clone(), &sid).expect("valid config");
    let first = (cfg.rotation << 5) | (rest.first().copied().unwrap_or(0) & 0x1f);
    let cid = encoder.encode(first, &nonce);
    assert_eq!(decoder.server_id(&cid), Some(sid));
});
