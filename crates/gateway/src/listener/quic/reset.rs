//! Stateless resets (RFC 9000 §10.3). Every connection ID a QUIC listener issues carries a
//! reset token derived from the ID with a key (HMAC-SHA256, §10.3.2), so the listener can
//! answer a short-header packet for an ID it does not know (a connection it forgot, or one of
//! another gateway) with a reset the client accepts and closes on. With a key shared by the
//! fleet (`quic.stateless_reset_key_file`, or through `[fleet] redis` with
//! `quic.fleet_stateless_reset_key`), any gateway resets any other's connections: when a
//! gateway stops and the layer-4 balancer moves its clients, they learn at once instead of at
//! their idle timeout. Without either, a key of the listener's own. Key material is never
//! logged.

use boring::sha::Sha256;
use std::path::Path;
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;
use tokio_quiche::quiche::ConnectionId;
use tokio_quiche::{ConnectionIdGenerator, QuicResult};
use zeroize::Zeroize;

/// Bytes of a reset key.
const KEY_LEN: usize = 32;

/// A listener's reset key; replaced once if the fleet's is read after start.
#[derive(Clone)]
pub struct ResetKey(Arc<RwLock<[u8; KEY_LEN]>>);

impl ResetKey {
    fn new(key: [u8; KEY_LEN]) -> ResetKey {
        ResetKey(Arc::new(RwLock::new(key)))
    }

    /// A random key of the listener's own.
    pub fn local() -> ResetKey {
        let mut key = [0u8; KEY_LEN];
        boring::rand::rand_bytes(&mut key).expect("rng");
        ResetKey::new(key)
    }

    /// The key in `path`: its first line, 64 hex digits.
    pub fn from_file(path: &Path) -> Result<ResetKey, String> {
        let mut text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let key = crate::fleet::key_list::parse_hex_keys::<KEY_LEN>(&text);
        text.zeroize();
        match key {
            Ok(keys) if !keys.is_empty() => Ok(ResetKey::new(keys[0])),
            Ok(_) => Err(format!(
                "{}: no key (expected 64 hex digits)",
                path.display()
            )),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The fleet's key for listener `listener`: made by the first gateway that asks (`SET NX`)
    /// and read by every other; the listener's own until it is read (asked again while Redis
    /// cannot be reached).
    pub fn fleet(store: Arc<crate::fleet::FleetStore>, listener: &str) -> ResetKey {
        static GET_OR_SET: LazyLock<redis::Script> = LazyLock::new(|| {
            redis::Script::new(
                "redis.call('SET', KEYS[1], ARGV[1], 'NX')\nreturn redis.call('GET', KEYS[1])",
            )
        });
        let key = ResetKey::local();
        let weak = Arc::downgrade(&key.0);
        let name = format!("{}:reset:{listener}", store.key_prefix);
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            loop {
                let Some(slot) = weak.upgrade() else { return };
                let mut mine = [0u8; KEY_LEN];
                boring::rand::rand_bytes(&mut mine).expect("rng");
                let mut hex = crate::config::file::to_hex(&mine);
                mine.zeroize();
                let answer: Result<Vec<u8>, _> = store
                    .eval_within(&GET_OR_SET, &[&name], &[&hex], Duration::from_secs(1))
                    .await;
                hex.zeroize();
                match answer.map(|mut t| {
                    let k = crate::fleet::key_list::hex_key::<KEY_LEN>(t.trim_ascii());
                    t.zeroize();
                    k
                }) {
                    Ok(Some(k)) => {
                        *slot.write().unwrap_or_else(|e| e.into_inner()) = k;
                        return;
                    }
                    Ok(None) => {
                        tracing::warn!(key = %name, "the fleet's stateless-reset key is not 64 hex digits; this listener keeps its own");
                        return;
                    }
                    Err(e) => {
                        if wait >= Duration::from_secs(1) {
                            tracing::warn!(key = %name, error = %e, "the fleet's stateless-reset key not read yet; this listener's own in use");
                        }
                    }
                }
                drop(slot);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        });
        key
    }

    /// The token for connection ID `cid`: the first 16 bytes of HMAC-SHA256(key, cid).
    pub fn token(&self, cid: &[u8]) -> u128 {
        let key = self.0.read().unwrap_or_else(|e| e.into_inner());
        let mac = hmac_sha256(&key, cid);
        u128::from_be_bytes(mac[..16].try_into().expect("32-byte MAC"))
    }
}

/// HMAC-SHA256 (RFC 2104) with a 32-byte key: the key zero-padded to SHA-256's 64-byte block.
fn hmac_sha256(key: &[u8; KEY_LEN], message: &[u8]) -> [u8; 32] {
    let mut pad = [0u8; 64];
    let mut digest = Sha256::new();
    for (p, k) in pad.iter_mut().zip(key) {
        *p = k ^ 0x36;
    }
    pad[KEY_LEN..].fill(0x36);
    digest.update(&pad);
    digest.update(message);
    let inner = digest.finish();
    for (p, k) in pad.iter_mut().zip(key) {
        *p = k ^ 0x5c;
    }
    pad[KEY_LEN..].fill(0x5c);
    let mut digest = Sha256::new();
    digest.update(&pad);
    digest.update(&inner);
    pad.zeroize();
    digest.finish()
}

/// A listener's connection-ID generator with reset tokens derived by [`ResetKey`]: outermost,
/// around the QUIC-LB and worker-steering generators.
pub(crate) struct ResettingIds {
    pub inner: Arc<dyn ConnectionIdGenerator<'static>>,
    pub key: ResetKey,
}

impl ConnectionIdGenerator<'static> for ResettingIds {
    fn new_connection_id(&self) -> ConnectionId<'static> {
        self.inner.new_connection_id()
    }

    fn verify_connection_id(&self, cid: &ConnectionId<'_>) -> QuicResult<()> {
        self.inner.verify_connection_id(cid)
    }

    fn stateless_reset_token(&self, cid: &ConnectionId<'_>) -> Option<u128> {
        Some(self.key.token(cid.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_a_keyed_hash_of_the_id() {
        let a = ResetKey::new([7; KEY_LEN]);
        let b = ResetKey::new([7; KEY_LEN]);
        let c = ResetKey::new([8; KEY_LEN]);
        let cid = [1u8; 20];
        assert_eq!(a.token(&cid), b.token(&cid), "the same key, the same token");
        assert_ne!(a.token(&cid), c.token(&cid));
        assert_ne!(a.token(&cid), a.token(&[2u8; 20]));
        // RFC 4231 test case 2's key and data give HMAC-SHA256 5bdcc146bf60754e6a042426089575c7…
        let mut key = [0u8; KEY_LEN];
        key[..4].copy_from_slice(b"Jefe");
        let rfc = ResetKey::new(key);
        // A 32-byte zero-padded key is the same HMAC key as "Jefe" (HMAC pads keys with zeros).
        assert_eq!(
            rfc.token(b"what do ya want for nothing?"),
            0x5bdcc146bf60754e6a042426089575c7
        );
    }

    #[test]
    fn a_key_file_needs_64_hex_digits() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("reset.key");
        std::fs::write(&p, format!("{}\n", "ab".repeat(32))).unwrap();
        assert_eq!(
            ResetKey::from_file(&p).unwrap().token(b"x"),
            ResetKey::new([0xab; KEY_LEN]).token(b"x")
        );
        std::fs::write(&p, "abcd\n").unwrap();
        let e = ResetKey::from_file(&p).err().unwrap();
        assert!(
            e.contains("reset.key") && e.contains("64 hex digits"),
            "{e}"
        );
        std::fs::write(&p, "\n").unwrap();
        assert!(ResetKey::from_file(&p).is_err());
    }
}
