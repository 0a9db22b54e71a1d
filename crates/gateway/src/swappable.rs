//! A value a configuration reload replaces whole, while each reader keeps the one it took:
//! a request its routing, a handshake its certificate store, a connection its access list.

use std::sync::{Arc, RwLock};

/// Shared by every clone; [`Swappable::current`] is an uncontended read lock and an `Arc`
/// clone.
#[derive(Debug)]
pub struct Swappable<T>(Arc<RwLock<Arc<T>>>);

impl<T> Clone for Swappable<T> {
    fn clone(&self) -> Self {
        Swappable(self.0.clone())
    }
}

impl<T> Swappable<T> {
    pub fn new(value: T) -> Self {
        Swappable(Arc::new(RwLock::new(Arc::new(value))))
    }

    /// The value in force now.
    pub fn current(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `value` in force for every later [`Swappable::current`].
    pub fn replace(&self, value: T) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }
}
