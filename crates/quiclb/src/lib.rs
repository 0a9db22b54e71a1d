//! QUIC-LB routable connection IDs (draft-ietf-quic-load-balancers-21).
//!
//! A connection ID is `first octet | server ID | nonce`, optionally encrypted, so that an L4
//! balancer holding the same configuration can read the server ID from any packet of the
//! connection, even after the client's address changed. [`Encoder`] makes IDs on the server;
//! [`Decoder`] is what the balancer runs (and what tests check the encoder against).
//! Pure logic: no I/O, no clock; nonces come from the caller or from `fastrand`.
//!
//! Layout of the first octet: the top 3 bits are the config rotation id (`0b111` is reserved
//! for unroutable ids); with `self_encode_length`, the low 5 bits hold the length of the rest
//! of the id, otherwise they are random.

use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use aes::Aes128;

/// Maximum QUIC connection ID length.
pub const MAX_CID_LEN: usize = 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config rotation id {0} out of range 0..=6 (7 is reserved for unroutable ids)")]
    Rotation(u8),
    #[error("server ID must be at least 1 byte")]
    EmptyServerId,
    #[error("nonce must be at least 4 bytes, got {0}")]
    ShortNonce(usize),
    #[error("server ID + nonce must be at most 19 bytes, got {0}")]
    TooLong(usize),
    #[error("with a key, server ID + nonce must be at least 5 bytes")]
    TooShortForKey,
    #[error("server ID has {got} bytes; the config says {expected}")]
    ServerIdLength { expected: usize, got: usize },
}

/// One QUIC-LB configuration, shared by the servers and the balancer.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    pub rotation: u8,
    pub server_id_len: usize,
    pub nonce_len: usize,
    /// AES-128 key; `None` = plaintext mode.
    pub key: Option<[u8; 16]>,
    /// Put the id's length in the first octet's low 5 bits.
    pub self_encode_length: bool,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("rotation", &self.rotation)
            .field("server_id_len", &self.server_id_len)
            .field("nonce_len", &self.nonce_len)
            .field("encrypted", &self.key.is_some())
            .finish()
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.rotation > 6 {
            return Err(ConfigError::Rotation(self.rotation));
        }
        if self.server_id_len == 0 {
            return Err(ConfigError::EmptyServerId);
        }
        if self.nonce_len < 4 {
            return Err(ConfigError::ShortNonce(self.nonce_len));
        }
        let l = self.server_id_len + self.nonce_len;
        if l > 19 {
            return Err(ConfigError::TooLong(l));
        }
        if self.key.is_some() && l < 5 {
            return Err(ConfigError::TooShortForKey);
        }
        Ok(())
    }

    /// Length of the whole connection ID.
    pub fn cid_len(&self) -> usize {
        1 + self.server_id_len + self.nonce_len
    }

    fn plain_len(&self) -> usize {
        self.server_id_len + self.nonce_len
    }
}

/// The block cipher and the Feistel network shared by encoder and decoder.
struct Crypto {
    aes: Aes128,
}

impl Crypto {
    fn new(key: &[u8; 16]) -> Self {
        Crypto {
            aes: Aes128::new(key.into()),
        }
    }

    /// First `h` bytes of AES(expand(L, pass, half)).
    fn round(&self, l: usize, pass: u8, half: &[u8], h: usize) -> [u8; 16] {
        let mut block = [0u8; 16];
        block[..half.len()].copy_from_slice(half);
        block[14] = l as u8;
        block[15] = pass;
        let mut b = block.into();
        self.aes.encrypt_block(&mut b);
        let mut out = [0u8; 16];
        out[..h].copy_from_slice(&b[..h]);
        out
    }

    fn encrypt(&self, plain: &[u8]) -> Vec<u8> {
        let l = plain.len();
        if l == 16 {
            let mut b = <[u8; 16]>::try_from(plain).expect("16 bytes").into();
            self.aes.encrypt_block(&mut b);
            return b.to_vec();
        }
        let (mut left, mut right, h) = split(plain);
        xor(&mut right, &self.round(l, 1, &left[..h], h), h);
        mask_right(&mut right, l);
        xor(&mut left, &self.round(l, 2, &right[..h], h), h);
        mask_left(&mut left, l, h);
        xor(&mut right, &self.round(l, 3, &left[..h], h), h);
        mask_right(&mut right, l);
        xor(&mut left, &self.round(l, 4, &right[..h], h), h);
        mask_left(&mut left, l, h);
        join(&left[..h], &right[..h], l)
    }

    fn decrypt(&self, cipher: &[u8]) -> Vec<u8> {
        let l = cipher.len();
        if l == 16 {
            let mut b = <[u8; 16]>::try_from(cipher).expect("16 bytes").into();
            self.aes.decrypt_block(&mut b);
            return b.to_vec();
        }
        let (mut left, mut right, h) = split(cipher);
        xor(&mut left, &self.round(l, 4, &right[..h], h), h);
        mask_left(&mut left, l, h);
        xor(&mut right, &self.round(l, 3, &left[..h], h), h);
        mask_right(&mut right, l);
        xor(&mut left, &self.round(l, 2, &right[..h], h), h);
        mask_left(&mut left, l, h);
        xor(&mut right, &self.round(l, 1, &left[..h], h), h);
        mask_right(&mut right, l);
        join(&left[..h], &right[..h], l)
    }
}

/// Splits `bytes` (length L) into left and right halves of h = ceil(L/2) bytes; for odd L the
/// middle byte is shared, left keeping its high nibble and right its low nibble.
fn split(bytes: &[u8]) -> ([u8; 10], [u8; 10], usize) {
    let l = bytes.len();
    let h = l.div_ceil(2);
    let mut left = [0u8; 10];
    let mut right = [0u8; 10];
    left[..h].copy_from_slice(&bytes[..h]);
    right[..h].copy_from_slice(&bytes[l - h..]);
    mask_left(&mut left, l, h);
    mask_right(&mut right, l);
    (left, right, h)
}

fn mask_left(left: &mut [u8; 10], l: usize, h: usize) {
    if l % 2 == 1 {
        left[h - 1] &= 0xF0;
    }
}

fn mask_right(right: &mut [u8; 10], l: usize) {
    if l % 2 == 1 {
        right[0] &= 0x0F;
    }
}

fn xor(dst: &mut [u8; 10], src: &[u8; 16], h: usize) {
    for i in 0..h {
        dst[i] ^= src[i];
    }
}

fn join(left: &[u8], right: &[u8], l: usize) -> Vec<u8> {
    let h = left.len();
    let mut out = Vec::with_capacity(l);
    if l % 2 == 1 {
        out.extend_from_slice(&left[..h - 1]);
        out.push(left[h - 1] | right[0]);
        out.extend_from_slice(&right[1..]);
    } else {
        out.extend_from_slice(left);
        out.extend_from_slice(right);
    }
    out
}

fn first_octet(cfg: &Config) -> u8 {
    let low = if cfg.self_encode_length {
        cfg.plain_len() as u8
    } else {
        fastrand::u8(..) & 0x1F
    };
    (cfg.rotation << 5) | (low & 0x1F)
}

/// Makes connection IDs that carry this server's ID.
pub struct Encoder {
    cfg: Config,
    server_id: Vec<u8>,
    crypto: Option<Crypto>,
    /// Total id length when the server appends bytes of its own (same on every id).
    total_len: usize,
}

impl Encoder {
    pub fn new(cfg: Config, server_id: &[u8]) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if server_id.len() != cfg.server_id_len {
            return Err(ConfigError::ServerIdLength {
                expected: cfg.server_id_len,
                got: server_id.len(),
            });
        }
        Ok(Encoder {
            crypto: cfg.key.as_ref().map(Crypto::new),
            server_id: server_id.to_vec(),
            total_len: cfg.cid_len(),
            cfg,
        })
    }

    /// Appends random bytes of the server's own so every id is `total` bytes (the draft allows
    /// a fixed-length server-specific suffix; QUIC stacks that route short-header packets by a
    /// fixed connection-ID length need it). The first octet's length bits then count the
    /// whole id after it.
    pub fn padded_to(mut self, total: usize) -> Result<Self, ConfigError> {
        if total < self.cfg.cid_len() || total > MAX_CID_LEN {
            return Err(ConfigError::TooLong(total));
        }
        self.total_len = total;
        Ok(self)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The connection ID for `nonce` (`nonce_len` bytes). Deterministic: tests use it; servers
    /// use [`Encoder::generate`].
    pub fn encode(&self, first_octet: u8, nonce: &[u8]) -> Vec<u8> {
        assert_eq!(nonce.len(), self.cfg.nonce_len, "nonce length");
        let mut plain = Vec::with_capacity(self.cfg.plain_len());
        plain.extend_from_slice(&self.server_id);
        plain.extend_from_slice(nonce);
        let body = match &self.crypto {
            Some(c) => c.encrypt(&plain),
            None => plain,
        };
        let mut cid = Vec::with_capacity(self.cfg.cid_len());
        cid.push(first_octet);
        cid.extend_from_slice(&body);
        cid
    }

    /// A fresh connection ID with a random nonce (and random suffix, when padded).
    pub fn generate(&self) -> Vec<u8> {
        let mut nonce = vec![0u8; self.cfg.nonce_len];
        fastrand::fill(&mut nonce);
        let first = if self.cfg.self_encode_length {
            (self.cfg.rotation << 5) | ((self.total_len - 1) as u8 & 0x1F)
        } else {
            first_octet(&self.cfg)
        };
        let mut cid = self.encode(first, &nonce);
        let extra = self.total_len - cid.len();
        cid.extend((0..extra).map(|_| fastrand::u8(..)));
        cid
    }
}

/// Reads the server ID out of connection IDs: the balancer's side.
pub struct Decoder {
    configs: Vec<(Config, Option<Crypto>)>,
}

impl Decoder {
    /// One config per rotation id in use.
    pub fn new(configs: Vec<Config>) -> Result<Self, ConfigError> {
        let mut out = Vec::new();
        for c in configs {
            c.validate()?;
            let crypto = c.key.as_ref().map(Crypto::new);
            out.push((c, crypto));
        }
        Ok(Decoder { configs: out })
    }

    /// The server ID, or `None` when the id is unroutable (unknown rotation, too short).
    pub fn server_id(&self, cid: &[u8]) -> Option<Vec<u8>> {
        let (&first, rest) = cid.split_first()?;
        let rotation = first >> 5;
        let (cfg, crypto) = self.configs.iter().find(|(c, _)| c.rotation == rotation)?;
        let body = rest.get(..cfg.plain_len())?;
        let plain = match crypto {
            Some(c) => c.decrypt(body),
            None => body.to_vec(),
        };
        Some(plain[..cfg.server_id_len].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn cfg(rotation: u8, sid: usize, nonce: usize, key: Option<&str>) -> Config {
        Config {
            rotation,
            server_id_len: sid,
            nonce_len: nonce,
            key: key.map(|k| hex(k).try_into().unwrap()),
            self_encode_length: true,
        }
    }

    #[test]
    fn plaintext_vector() {
        let c = cfg(0, 3, 4, None);
        let e = Encoder::new(c.clone(), &hex("c4605e")).unwrap();
        assert_eq!(e.encode(0x07, &hex("4504cc4f")), hex("07c4605e4504cc4f"));
        let d = Decoder::new(vec![c]).unwrap();
        assert_eq!(d.server_id(&hex("07c4605e4504cc4f")), Some(hex("c4605e")));
    }

    const KEY: &str = "8f95f09245765f80256934e50c66207f";

    #[test]
    fn encrypted_vectors_single_and_four_pass() {
        let rows = [
            // (first octet, server id, nonce, connection id)
            (0x07, "ed793a", "ee080dbf", "0720b1d07b359d3c"),
            (
                0x2f,
                "ed793a51d49b8f5fab65",
                "ee080dbf48",
                "2fcc381bc74cb4fbad2823a3d1f8fed2",
            ),
            (
                0x50,
                "ed793a51d49b8f5f",
                "ee080dbf48c0d1e5",
                "504dd2d05a7b0de9b2b9907afb5ecf8cc3",
            ),
            (
                0x12,
                "ed793a51d49b8f5fab",
                "ee080dbf48c0d1e55d",
                "125779c9cc86beb3a3a4a3ca96fce4bfe0cdbc",
            ),
        ];
        for (first, sid, nonce, want) in rows {
            let (sid, nonce, want) = (hex(sid), hex(nonce), hex(want));
            let c = cfg(first >> 5, sid.len(), nonce.len(), Some(KEY));
            let e = Encoder::new(c.clone(), &sid).unwrap();
            assert_eq!(e.encode(first, &nonce), want, "server id {sid:02x?}");
            let d = Decoder::new(vec![c]).unwrap();
            assert_eq!(d.server_id(&want), Some(sid));
        }
    }

    #[test]
    fn four_pass_worked_example() {
        let c = cfg(0, 3, 4, Some("fdf726a9893ec05c0632d3956680baf0"));
        let e = Encoder::new(c, &hex("31441a")).unwrap();
        assert_eq!(e.encode(0x07, &hex("9c69c275")), hex("0767947d29be054a"));
    }

    #[test]
    fn decoder_round_trips_random_ids_for_every_length() {
        for sid_len in 1..=15 {
            for nonce_len in 4..=(19 - sid_len) {
                for key in [None, Some(KEY)] {
                    if key.is_some() && sid_len + nonce_len < 5 {
                        continue;
                    }
                    let c = cfg((sid_len % 7) as u8, sid_len, nonce_len, key);
                    let mut sid = vec![0u8; sid_len];
                    fastrand::fill(&mut sid);
                    let e = Encoder::new(c.clone(), &sid).unwrap();
                    let d = Decoder::new(vec![c.clone()]).unwrap();
                    for _ in 0..20 {
                        let cid = e.generate();
                        assert_eq!(cid.len(), c.cid_len());
                        assert_eq!(cid[0] >> 5, c.rotation);
                        assert_eq!((cid[0] & 0x1F) as usize, sid_len + nonce_len);
                        assert_eq!(
                            d.server_id(&cid),
                            Some(sid.clone()),
                            "sid {sid_len} nonce {nonce_len} key {}",
                            key.is_some()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn encrypted_ids_do_not_show_the_server_id_and_nonces_differ() {
        let c = cfg(1, 4, 8, Some(KEY));
        let sid = hex("0a0b0c0d");
        let e = Encoder::new(c, &sid).unwrap();
        let a = e.generate();
        let b = e.generate();
        assert_ne!(a, b);
        assert!(!a.windows(4).any(|w| w == sid.as_slice()));
    }

    #[test]
    fn padded_ids_keep_the_server_id_readable() {
        let c = cfg(2, 3, 8, Some(KEY));
        let sid = hex("0a0b0c");
        let e = Encoder::new(c.clone(), &sid)
            .unwrap()
            .padded_to(20)
            .unwrap();
        let d = Decoder::new(vec![c]).unwrap();
        for _ in 0..50 {
            let cid = e.generate();
            assert_eq!(cid.len(), 20);
            assert_eq!(cid[0], (2 << 5) | 19);
            assert_eq!(d.server_id(&cid), Some(sid.clone()));
        }
        assert!(Encoder::new(cfg(0, 3, 8, None), &sid)
            .unwrap()
            .padded_to(21)
            .is_err());
    }

    #[test]
    fn random_bytes_never_panic_the_decoder() {
        // The decoder reads the connection IDs of arriving packets: any bytes at all.
        let decoders: Vec<Decoder> = [
            vec![cfg(0, 3, 4, None)],
            vec![cfg(1, 8, 8, Some(KEY))],
            vec![cfg(2, 3, 4, Some(KEY))],
            vec![cfg(3, 15, 4, Some(KEY)), cfg(4, 1, 18, None)],
        ]
        .into_iter()
        .map(|c| Decoder::new(c).unwrap())
        .collect();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 24) as usize;
            let cid: Vec<u8> = (0..len).map(|i| (x >> (i % 57)) as u8).collect();
            for d in &decoders {
                if let Some(sid) = d.server_id(&cid) {
                    let rotation = cid[0] >> 5;
                    let c = &d
                        .configs
                        .iter()
                        .find(|(c, _)| c.rotation == rotation)
                        .unwrap()
                        .0;
                    assert_eq!(sid.len(), c.server_id_len);
                    assert!(cid.len() > c.plain_len());
                }
            }
        }
    }

    #[test]
    fn invalid_configs_and_unroutable_ids() {
        assert_eq!(cfg(7, 3, 4, None).validate(), Err(ConfigError::Rotation(7)));
        assert_eq!(
            cfg(0, 0, 4, None).validate(),
            Err(ConfigError::EmptyServerId)
        );
        assert_eq!(
            cfg(0, 3, 3, None).validate(),
            Err(ConfigError::ShortNonce(3))
        );
        assert_eq!(
            cfg(0, 10, 10, None).validate(),
            Err(ConfigError::TooLong(20))
        );
        let d = Decoder::new(vec![cfg(0, 3, 4, None)]).unwrap();
        assert_eq!(d.server_id(&hex("e7c4605e4504cc4f")), None, "rotation 7");
        assert_eq!(d.server_id(&hex("07c4")), None, "too short");
        assert_eq!(d.server_id(&[]), None);
        assert!(matches!(
            Encoder::new(cfg(0, 3, 4, None), &[1, 2]),
            Err(ConfigError::ServerIdLength {
                expected: 3,
                got: 2
            })
        ));
    }
}
