//! Session-ticket keys rotated in process. New tickets are sealed with the current key; the
//! previous key still opens tickets (and the client gets a fresh one), so a rotation never
//! forces full handshakes on recent clients.

use boring::hash::MessageDigest;
use boring::ssl::{SslContextBuilder, TicketKeyCallbackResult};
use boring::symm::Cipher;
use std::sync::{Arc, RwLock};
use std::time::Duration;

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
        // Best-effort wipe; volatile writes keep the compiler from eliding it.
        for b in self.aes.iter_mut().chain(self.hmac.iter_mut()) {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a u8.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// The current and previous ticket keys of one listener.
pub struct TicketKeys {
    keys: RwLock<(TicketKey, Option<TicketKey>)>,
}

impl TicketKeys {
    pub fn new() -> Arc<Self> {
        Arc::new(TicketKeys {
            keys: RwLock::new((TicketKey::generate(), None)),
        })
    }

    /// Makes a fresh key current; the current one becomes previous; the old previous is gone.
    pub fn rotate(&self) {
        let mut k = self.keys.write().expect("ticket key lock");
        let old = std::mem::replace(&mut k.0, TicketKey::generate());
        k.1 = Some(old);
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
                    name.copy_from_slice(&k.0.name);
                    if boring::rand::rand_bytes(iv).is_err() {
                        return TicketKeyCallbackResult::Error;
                    }
                    (&k.0, TicketKeyCallbackResult::Success)
                } else if *name == k.0.name {
                    (&k.0, TicketKeyCallbackResult::Success)
                } else if let Some(prev) = k.1.as_ref().filter(|p| p.name == *name) {
                    (prev, TicketKeyCallbackResult::DecryptSuccessRenew)
                } else {
                    return TicketKeyCallbackResult::Noop;
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
