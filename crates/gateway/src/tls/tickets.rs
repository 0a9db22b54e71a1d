//! Session-ticket keys. New tickets are sealed with the first key; every other key still opens
//! tickets (and the client gets a fresh one), so a rotation never forces full handshakes on
//! recent clients.
//!
//! By default the keys are made and rotated in process (the current and the previous one).
//! With `tls.ticket_key_file` they come from a file a fleet shares, so a client resumes, and
//! sends 0-RTT early data, on whichever gateway it reaches next: one key per line, 160 hex
//! digits (80 bytes, nginx's layout: 16-byte name, 32-byte HMAC key, 32-byte AES key; make one
//! with `openssl rand -hex 80`), the first sealing, blank lines and `#` comments skipped. The
//! file is read again each rotation interval; a file that has become unreadable or malformed
//! keeps the keys in use (and says so in the log). Key material is never logged.
//!
//! With `tls.fleet_ticket_keys` they come from the fleet's Redis, in the same layout (one key
//! per line), rotated every `ticket_key_rotation` by one gateway and read by all
//! ([`crate::fleet::key_list`]). Until the first read a gateway uses a key of its own.

use boring::hash::MessageDigest;
use boring::ssl::{SslContextBuilder, TicketKeyCallbackResult};
use boring::symm::Cipher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use zeroize::Zeroize;

struct TicketKey {
    name: [u8; 16],
    aes: [u8; 32],
    hmac: [u8; 32],
}

impl TicketKey {
    fn generate() -> Self {
        let mut k = TicketKey {
            name: [0; 16],
            aes: [0; 32],
            hmac: [0; 32],
        };
        boring::rand::rand_bytes(&mut k.name).expect("rng");
        boring::rand::rand_bytes(&mut k.aes).expect("rng");
        boring::rand::rand_bytes(&mut k.hmac).expect("rng");
        k
    }
}

impl Drop for TicketKey {
    fn drop(&mut self) {
        self.aes.zeroize();
        self.hmac.zeroize();
    }
}

/// The ticket keys of one listener: the first seals, all open.
pub struct TicketKeys {
    keys: RwLock<Vec<TicketKey>>,
    /// Where shared keys come from; `None`: made in process (or read from the fleet, by
    /// [`TicketKeys::spawn_fleet_sync`] instead of [`TicketKeys::spawn_rotation`]).
    file: Option<PathBuf>,
}

/// The bytes of one key in a key file.
const FILE_KEY_LEN: usize = 80;

impl TicketKeys {
    /// Keys made and rotated in process.
    pub fn new() -> Arc<Self> {
        Arc::new(TicketKeys {
            keys: RwLock::new(vec![TicketKey::generate()]),
            file: None,
        })
    }

    /// Keys shared through `path` (see the module's notes); an error names the file and line.
    pub fn from_file(path: &Path) -> Result<Arc<Self>, String> {
        Ok(Arc::new(TicketKeys {
            keys: RwLock::new(read_key_file(path)?),
            file: Some(path.to_path_buf()),
        }))
    }

    /// In process: a fresh key seals, the sealing one becomes the only other; from a file:
    /// the file is read again.
    pub fn rotate(&self) {
        match &self.file {
            None => {
                let mut k = self.keys.write().expect("ticket key lock");
                let old = std::mem::replace(&mut k[0], TicketKey::generate());
                k.truncate(1);
                k.push(old);
            }
            Some(path) => match read_key_file(path) {
                Ok(keys) => *self.keys.write().expect("ticket key lock") = keys,
                Err(e) => tracing::warn!(error = %e, "session-ticket keys kept as they were"),
            },
        }
    }

    /// Rotates every `interval` until the runtime stops.
    pub fn spawn_rotation(self: &Arc<Self>, interval: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(k) => k.rotate(),
                    None => return,
                }
            }
        });
    }

    /// Reads (and, holding the lease, rotates) listener `listener`'s keys in the fleet's
    /// Redis ([`crate::fleet::key_list`]), until the runtime stops.
    pub fn spawn_fleet_sync(
        self: &Arc<Self>,
        store: Arc<crate::fleet::FleetStore>,
        listener: &str,
        period: Duration,
    ) {
        let weak = Arc::downgrade(self);
        let apply: crate::fleet::key_list::Apply = Box::new(move |text| {
            let keys = weak.upgrade()?;
            Some(parse_keys(text).map(|list| {
                *keys.keys.write().expect("ticket key lock") = list;
            }))
        });
        crate::fleet::key_list::spawn_sync(
            store,
            &format!("tickets:{listener}"),
            period,
            FILE_KEY_LEN,
            apply,
        );
    }

    /// Installs the ticket callback on a context.
    pub fn install(self: &Arc<Self>, builder: &mut SslContextBuilder) {
        let keys = self.clone();
        // SAFETY: the callback sets the key name, IV, cipher and HMAC contexts exactly as
        // SSL_CTX_set_tlsext_ticket_key_cb requires (16-byte name, random IV, AES-256-CBC and
        // HMAC-SHA256 keyed with 32-byte keys).
        unsafe {
            builder.set_ticket_key_callback(move |_ssl, name, iv, cipher, hmac, encrypt| {
                let k = keys.keys.read().expect("ticket key lock");
                let (key, result) = if encrypt {
                    name.copy_from_slice(&k[0].name);
                    if boring::rand::rand_bytes(iv).is_err() {
                        return TicketKeyCallbackResult::Error;
                    }
                    (&k[0], TicketKeyCallbackResult::Success)
                } else {
                    match k.iter().position(|key| key.name == *name) {
                        Some(0) => (&k[0], TicketKeyCallbackResult::Success),
                        Some(i) => (&k[i], TicketKeyCallbackResult::DecryptSuccessRenew),
                        None => return TicketKeyCallbackResult::Noop,
                    }
                };
                let c = if encrypt {
                    cipher.init_encrypt(&Cipher::aes_256_cbc(), &key.aes, iv)
                } else {
                    cipher.init_decrypt(&Cipher::aes_256_cbc(), &key.aes, iv)
                };
                if c.is_err() || hmac.init(&key.hmac, &MessageDigest::sha256()).is_err() {
                    return TicketKeyCallbackResult::Error;
                }
                result
            });
        }
    }
}

/// The keys of a key file, in order; an error names the file and the line, never a key.
fn read_key_file(path: &Path) -> Result<Vec<TicketKey>, String> {
    let mut text =
        std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let parsed = parse_keys(&text).map_err(|e| format!("{}: {e}", path.display()));
    text.zeroize();
    parsed
}

fn parse_keys(text: &[u8]) -> Result<Vec<TicketKey>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let expected = || {
            format!(
                "line {}: expected {} hex digits (80 bytes: a 16-byte name, a 32-byte HMAC key, \
                 a 32-byte AES key; `openssl rand -hex 80` makes one), found {} characters",
                i + 1,
                FILE_KEY_LEN * 2,
                line.len()
            )
        };
        // Wiped in hex_key when the line did not decode (it may have held most of a key).
        let Some(mut raw) = crate::fleet::key_list::hex_key::<FILE_KEY_LEN>(line) else {
            return Err(expected());
        };
        let mut k = TicketKey {
            name: [0; 16],
            aes: [0; 32],
            hmac: [0; 32],
        };
        k.name.copy_from_slice(&raw[..16]);
        k.hmac.copy_from_slice(&raw[16..48]);
        k.aes.copy_from_slice(&raw[48..]);
        raw.zeroize();
        if keys.iter().any(|o: &TicketKey| o.name == k.name) {
            return Err(format!("line {}: a second key with the same name", i + 1));
        }
        keys.push(k);
    }
    if keys.is_empty() {
        return Err("no key in the file".into());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key line: `name` (16 bytes, hex), HMAC key bytes all `hmac`, AES key bytes all `aes`.
    fn line(name: &str, hmac: u8, aes: u8) -> String {
        format!(
            "{name}{}{}",
            format!("{hmac:02x}").repeat(32),
            format!("{aes:02x}").repeat(32)
        )
    }

    #[test]
    fn key_files_are_parsed_in_order_and_bad_lines_named() {
        let a = line("00112233445566778899aabbccddeeff", 0x00, 0x11);
        let b = line("ffeeddccbbaa99887766554433221100", 0x22, 0x33);
        let text = format!("# fleet keys\n{a}\n\n  {b}  \n");
        let keys = parse_keys(text.as_bytes()).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].name[..2], [0x00, 0x11]);
        assert_eq!(keys[1].name[..2], [0xff, 0xee]);
        assert_eq!(keys[0].hmac, [0; 32]);
        assert_eq!(keys[0].aes, [0x11; 32]);
        let e = parse_keys(format!("{a}\n{}", &b[..150]).as_bytes())
            .err()
            .unwrap();
        assert!(e.starts_with("line 2: expected 160 hex digits"), "{e}");
        let e = parse_keys(format!("{}zz", &a[..158]).as_bytes())
            .err()
            .unwrap();
        assert!(e.starts_with("line 1:"), "{e}");
        let e = parse_keys(format!("{a}\n{a}").as_bytes()).err().unwrap();
        assert!(e.contains("same name"), "{e}");
        assert_eq!(
            parse_keys(b"# nothing\n").err().unwrap(),
            "no key in the file"
        );
    }

    #[test]
    fn a_key_file_is_read_again_at_rotation_and_a_broken_one_keeps_the_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tickets.keys");
        let a = line("00112233445566778899aabbccddeeff", 0x00, 0x11);
        let b = line("ffeeddccbbaa99887766554433221100", 0x22, 0x33);
        std::fs::write(&path, format!("{a}\n")).unwrap();
        let keys = TicketKeys::from_file(&path).unwrap();
        std::fs::write(&path, format!("{b}\n{a}\n")).unwrap();
        keys.rotate();
        let names: Vec<u8> = keys
            .keys
            .read()
            .unwrap()
            .iter()
            .map(|k| k.name[0])
            .collect();
        assert_eq!(names, [0xff, 0x00]);
        std::fs::write(&path, "not a key\n").unwrap();
        keys.rotate();
        assert_eq!(keys.keys.read().unwrap().len(), 2, "kept");
        let e = TicketKeys::from_file(&dir.path().join("missing"))
            .err()
            .unwrap();
        assert!(e.contains("missing: cannot read"), "{e}");
    }
}
