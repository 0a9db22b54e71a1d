//! A per-client share of something bounded (a cluster's request slots, the WAF's inspection
//! queue): each client (by its key, [`crate::policy::client_key`]) may hold at most `max` of
//! it at once, so one client cannot take all of it from the others.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What each client holds (entries removed at zero), and the share in force.
pub(crate) struct ClientShares {
    held: Mutex<HashMap<IpAddr, usize>>,
    max: AtomicUsize,
}

/// One unit of a client's share, given back when dropped.
pub(crate) struct ClientShare {
    shares: Arc<ClientShares>,
    client: IpAddr,
}

impl ClientShares {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(ClientShares {
            held: Mutex::new(HashMap::new()),
            max: AtomicUsize::new(max),
        })
    }

    /// The share in force.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// A new share (a reload); what clients hold stays counted.
    pub(crate) fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// One more unit for `client`, unless it holds its share already.
    pub(crate) fn take(self: &Arc<Self>, client: IpAddr) -> Option<ClientShare> {
        let max = self.max();
        let mut held = self.held.lock().expect("client shares lock");
        let n = held.entry(client).or_insert(0);
        if *n >= max {
            if *n == 0 {
                held.remove(&client);
            }
            return None;
        }
        *n += 1;
        Some(ClientShare {
            shares: self.clone(),
            client,
        })
    }

    /// How many clients hold some share now.
    #[cfg(test)]
    pub(crate) fn clients(&self) -> usize {
        self.held.lock().expect("client shares lock").len()
    }
}

impl Drop for ClientShare {
    fn drop(&mut self) {
        if let Ok(mut held) = self.shares.held.lock() {
            if let Entry::Occupied(mut e) = held.entry(self.client) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_its_share_and_gives_it_back() {
        let shares = ClientShares::new(2);
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let first = shares.take(a).expect("1 of 2");
        let second = shares.take(a).expect("2 of 2");
        assert!(shares.take(a).is_none(), "a holds its share");
        let other = shares.take(b).expect("b has its own");
        drop(first);
        let again = shares.take(a).expect("given back, taken again");
        shares.set_max(1);
        drop((second, again));
        let only = shares.take(a).expect("1 of 1");
        assert!(shares.take(a).is_none());
        drop((only, other));
        assert_eq!(shares.clients(), 0, "no entry left at zero");
        shares.set_max(0);
        assert!(shares.take(a).is_none());
        assert_eq!(shares.clients(), 0, "a refusal leaves no entry");
    }
}
