//! The key registry: private keys by subject key identifier.

use crate::key::{KeyId, KeyLoadError, PrivateKey};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

#[derive(Default, Debug)]
pub struct KeyRegistry {
    keys: HashMap<KeyId, Arc<PrivateKey>>,
}

impl KeyRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads a PEM key file and returns the key's id. Loading the same key twice is harmless.
    pub fn load_pem_file(&mut self, path: &Path) -> Result<KeyId, KeyLoadError> {
        Ok(self.insert(PrivateKey::from_pem_file(path)?))
    }

    pub fn insert(&mut self, key: PrivateKey) -> KeyId {
        let id = key.id();
        self.keys.entry(id).or_insert_with(|| Arc::new(key));
        id
    }

    pub fn get(&self, id: &KeyId) -> Option<&Arc<PrivateKey>> {
        self.keys.get(id)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}
