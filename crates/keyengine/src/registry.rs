//! The key registry: keys by subject key identifier. Each entry has the public key (to verify
//! every signature before release) and, when this process holds it, the private key.

use crate::key::{KeyLoadError, PrivateKey, PublicKey};
use crate::key_id::KeyId;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct KeyEntry {
    pub public: PublicKey,
    pub private: Option<Arc<PrivateKey>>,
}

#[derive(Default, Debug)]
pub struct KeyRegistry {
    keys: HashMap<KeyId, KeyEntry>,
}

impl KeyRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads a PEM key file and returns the key's id. Loading the same key twice is harmless.
    pub fn load_pem_file(&mut self, path: &Path) -> Result<KeyId, KeyLoadError> {
        Ok(self.insert(PrivateKey::from_pem_file(path)?))
    }

    /// Adds a private key (and its public half).
    pub fn insert(&mut self, key: PrivateKey) -> KeyId {
        let id = key.id();
        let public = key.public_key();
        self.keys.insert(
            id,
            KeyEntry {
                public,
                private: Some(Arc::new(key)),
            },
        );
        id
    }

    /// Adds a key known only by its public half (signed by a remote engine). A private key
    /// already registered under the same id is kept.
    pub fn insert_public(&mut self, public: PublicKey) -> KeyId {
        let id = public.id();
        self.keys.entry(id).or_insert(KeyEntry {
            public,
            private: None,
        });
        id
    }

    /// Every key, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = &KeyEntry> {
        self.keys.values()
    }

    pub fn get(&self, id: &KeyId) -> Option<&KeyEntry> {
        self.keys.get(id)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many keys have their private half in this process.
    pub fn private_count(&self) -> usize {
        self.keys.values().filter(|e| e.private.is_some()).count()
    }
}
