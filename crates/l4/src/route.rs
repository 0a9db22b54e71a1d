//! Which gateway a datagram goes to: pure, from the datagram and the health table alone, so
//! that every balancer holding the same configuration decides the same.

use crate::config::{Backend, Routing};
use crate::packet::{self, Dcid};
use std::collections::HashMap;
use std::net::SocketAddrV4;

/// The gateways and which of them take traffic now. Rebuilt by the health checker on a
/// change; the workers read a snapshot per batch.
#[derive(Debug, Clone)]
pub struct Table {
    seeds: Vec<u64>,
    by_server_id: HashMap<Vec<u8>, usize>,
    up: Vec<bool>,
    /// Indices of the gateways that are up, in configuration order.
    healthy: Vec<usize>,
}

impl Table {
    /// `up[i]` says whether `backends[i]` takes traffic.
    pub fn new(backends: &[Backend], up: &[bool]) -> Table {
        Table {
            // Seeded by server ID, not position: balancers whose lists differ in order still
            // place hashed datagrams alike.
            seeds: backends.iter().map(|b| hash(&b.server_id)).collect(),
            by_server_id: backends
                .iter()
                .enumerate()
                .map(|(i, b)| (b.server_id.clone(), i))
                .collect(),
            up: up.to_vec(),
            healthy: (0..backends.len()).filter(|&i| up[i]).collect(),
        }
    }

    pub fn healthy(&self) -> usize {
        self.healthy.len()
    }

    /// Rendezvous (highest random weight) hashing over the gateways that are up: removing
    /// one of N moves only the keys it held (about 1/N), and adding it back moves them back.
    fn rendezvous(&self, key: u64) -> Option<usize> {
        self.healthy
            .iter()
            .copied()
            .max_by_key(|&i| mix(key ^ self.seeds[i]))
    }
}

/// Why a datagram was placed by hashing rather than by its server ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashReason {
    /// A long header whose ID carries no known server ID: a client's first Initial or 0-RTT.
    ClientChosen,
    /// A short header whose ID carries no known server ID (another rotation, a gateway not
    /// configured here).
    UnknownServerId,
    /// The server ID's gateway is down; its connections are lost, new ones go elsewhere.
    BackendDown,
    /// `routing = "four_tuple"`: every datagram is placed by its client's address.
    FourTuple,
}

impl HashReason {
    pub const ALL: [HashReason; 4] = [
        HashReason::ClientChosen,
        HashReason::UnknownServerId,
        HashReason::BackendDown,
        HashReason::FourTuple,
    ];

    /// Its place in [`HashReason::ALL`] (the declaration order), for per-reason counters.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn label(self) -> &'static str {
        match self {
            HashReason::ClientChosen => "client_chosen_id",
            HashReason::UnknownServerId => "unknown_server_id",
            HashReason::BackendDown => "backend_down",
            HashReason::FourTuple => "four_tuple",
        }
    }
}

/// Why a datagram was not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Not a QUIC packet (no readable destination connection ID).
    Malformed,
    /// No gateway is up.
    NoBackend,
    /// The gateway's link address is not known yet (no neighbour entry).
    NoLink,
    /// Larger than the receive buffer (cannot be forwarded whole).
    TooBig,
    /// The packet socket refused it.
    SendError,
}

impl DropReason {
    pub const ALL: [DropReason; 5] = [
        DropReason::Malformed,
        DropReason::NoBackend,
        DropReason::NoLink,
        DropReason::TooBig,
        DropReason::SendError,
    ];

    /// Its place in [`DropReason::ALL`] (the declaration order), for per-reason counters.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn label(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::NoBackend => "no_backend",
            DropReason::NoLink => "no_link_address",
            DropReason::TooBig => "too_big",
            DropReason::SendError => "send_error",
        }
    }
}

/// A routing decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// By the server ID in the connection ID.
    Routed(usize),
    /// By hashing, for the reason given.
    Hashed(usize, HashReason),
    Drop(DropReason),
}

/// Decodes server IDs with the gateways' QUIC-LB configuration and chooses.
pub struct Router {
    decoder: quiclb::Decoder,
    rotation: u8,
    routing: Routing,
    cid_len: usize,
}

impl Router {
    pub fn new(lb: quiclb::Config, routing: Routing, cid_len: usize) -> Router {
        let rotation = lb.rotation;
        Router {
            decoder: quiclb::Decoder::new(vec![lb]).expect("validated at load"),
            rotation,
            routing,
            cid_len,
        }
    }

    /// The gateway for `datagram`, received from `client`.
    pub fn choose(&self, table: &Table, datagram: &[u8], client: SocketAddrV4) -> Choice {
        let Some(dcid) = packet::dcid(datagram) else {
            return Choice::Drop(DropReason::Malformed);
        };
        if self.routing == Routing::FourTuple {
            let mut key = [0u8; 6];
            key[..4].copy_from_slice(&client.ip().octets());
            key[4..].copy_from_slice(&client.port().to_be_bytes());
            return hashed(table, &key, HashReason::FourTuple);
        }
        let (id, unknown) = match dcid {
            Dcid::Long(id) => (id, HashReason::ClientChosen),
            Dcid::Short(prefix) => (self.short_id(prefix), HashReason::UnknownServerId),
        };
        let server = self
            .decoder
            .server_id(id)
            .and_then(|sid| table.by_server_id.get(&sid).copied());
        match server {
            Some(i) if table.up[i] => Choice::Routed(i),
            Some(_) => hashed(table, id, HashReason::BackendDown),
            None => hashed(table, id, unknown),
        }
    }

    /// A short header's connection ID: the length its first octet encodes when the ID is of
    /// our configuration (QUIC-LB's self-encoded length), else the configured `cid_len`.
    fn short_id<'a>(&self, prefix: &'a [u8]) -> &'a [u8] {
        let first = prefix[0];
        let len = if first >> 5 == self.rotation {
            1 + (first & 0x1f) as usize
        } else {
            self.cid_len
        };
        &prefix[..len.min(prefix.len())]
    }
}

fn hashed(table: &Table, key: &[u8], reason: HashReason) -> Choice {
    match table.rendezvous(hash(key)) {
        Some(i) => Choice::Hashed(i, reason),
        None => Choice::Drop(DropReason::NoBackend),
    }
}

/// FNV-1a: fixed, so every balancer (of any build) hashes alike.
fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's finalizer: spreads FNV's output over all 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The gateway `routing = "four_tuple"` would choose for `client` among `backends`, all up
/// (for tests that need a client address landing on a given gateway).
pub fn four_tuple_choice(backends: &[Backend], client: SocketAddrV4) -> usize {
    let table = Table::new(backends, &vec![true; backends.len()]);
    let mut key = [0u8; 6];
    key[..4].copy_from_slice(&client.ip().octets());
    key[4..].copy_from_slice(&client.port().to_be_bytes());
    table.rendezvous(hash(&key)).expect("at least one backend")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(key: Option<[u8; 16]>) -> quiclb::Config {
        quiclb::Config {
            rotation: 0,
            server_id_len: 1,
            nonce_len: 8,
            key,
            self_encode_length: true,
        }
    }

    fn backends(n: u8) -> Vec<Backend> {
        (1..=n)
            .map(|i| Backend {
                server_id: vec![i],
                address: [10, 0, 0, i].into(),
                health: ([10, 0, 0, i], 443).into(),
            })
            .collect()
    }

    /// A short-header packet for a connection ID the gateway with `sid` made.
    fn short_packet(cfg: &quiclb::Config, sid: u8) -> Vec<u8> {
        let enc = quiclb::Encoder::new(cfg.clone(), &[sid])
            .unwrap()
            .padded_to(20)
            .unwrap();
        let mut d = vec![0x40];
        d.extend(enc.generate());
        d.extend((0..60).map(|_| fastrand::u8(..)));
        d
    }

    fn initial(dcid: &[u8]) -> Vec<u8> {
        let mut d = vec![0xc0, 0, 0, 0, 1, dcid.len() as u8];
        d.extend_from_slice(dcid);
        d.extend([8; 9]);
        d.resize(1200, 0);
        d
    }

    const CLIENT: SocketAddrV4 = SocketAddrV4::new(std::net::Ipv4Addr::new(10, 1, 1, 1), 5000);

    #[test]
    fn ids_route_to_their_gateway_from_any_address_while_it_is_up() {
        for key in [None, Some([7u8; 16])] {
            let cfg = lb(key);
            let b = backends(3);
            let r = Router::new(cfg.clone(), Routing::QuicLb, 20);
            let all_up = Table::new(&b, &[true; 3]);
            for sid in 1..=3u8 {
                for _ in 0..50 {
                    let d = short_packet(&cfg, sid);
                    let from = SocketAddrV4::new(
                        [10, 1, fastrand::u8(..), 1].into(),
                        fastrand::u16(1024..),
                    );
                    assert_eq!(
                        r.choose(&all_up, &d, from),
                        Choice::Routed(sid as usize - 1)
                    );
                }
            }
            // Gateway 2 down: its IDs are hashed onto the others, each ID always alike.
            let two_down = Table::new(&b, &[true, false, true]);
            let d = short_packet(&cfg, 2);
            let Choice::Hashed(i, HashReason::BackendDown) = r.choose(&two_down, &d, CLIENT) else {
                panic!("expected hashing");
            };
            assert_ne!(i, 1);
            assert_eq!(
                r.choose(&two_down, &d, CLIENT),
                Choice::Hashed(i, HashReason::BackendDown)
            );
        }
    }

    #[test]
    fn client_chosen_ids_hash_consistently_and_spread() {
        let cfg = lb(Some([9u8; 16]));
        let b = backends(3);
        let r = Router::new(cfg, Routing::QuicLb, 20);
        let t = Table::new(&b, &[true; 3]);
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            let id: Vec<u8> = (0..8).map(|_| fastrand::u8(..)).collect();
            let Choice::Hashed(i, HashReason::ClientChosen) = r.choose(&t, &initial(&id), CLIENT)
            else {
                panic!("expected hashing");
            };
            // The same ID from another address: the same gateway.
            let other = SocketAddrV4::new([10, 9, 9, 9].into(), 1);
            assert_eq!(
                r.choose(&t, &initial(&id), other),
                Choice::Hashed(i, HashReason::ClientChosen)
            );
            counts[i] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn removing_one_of_ten_gateways_moves_only_its_keys() {
        let b = backends(10);
        let all = Table::new(&b, &[true; 10]);
        let mut up = [true; 10];
        up[3] = false;
        let nine = Table::new(&b, &up);
        let (mut moved, n) = (0, 10_000);
        for k in 0..n as u64 {
            let before = all.rendezvous(hash(&k.to_be_bytes())).unwrap();
            let after = nine.rendezvous(hash(&k.to_be_bytes())).unwrap();
            if before != after {
                assert_eq!(before, 3, "a key moved off a gateway that stayed");
                moved += 1;
            }
        }
        assert!(moved > n / 20 && moved < n * 15 / 100, "{moved}");
    }

    #[test]
    fn four_tuple_routing_follows_the_address_not_the_id() {
        let cfg = lb(None);
        let b = backends(3);
        let r = Router::new(cfg.clone(), Routing::FourTuple, 20);
        let t = Table::new(&b, &[true; 3]);
        let d = short_packet(&cfg, 1);
        let mut seen = std::collections::HashSet::new();
        for port in 1000..1100 {
            let from = SocketAddrV4::new([10, 1, 1, 1].into(), port);
            let c = r.choose(&t, &d, from);
            let Choice::Hashed(i, HashReason::FourTuple) = c else {
                panic!("{c:?}");
            };
            assert_eq!(i, four_tuple_choice(&b, from));
            seen.insert(i);
        }
        assert_eq!(seen.len(), 3);
    }

    /// The fuzz target's invariants (fuzz/fuzz_targets/l4_route.rs) on seeded random input.
    #[test]
    fn random_datagrams_go_only_to_gateways_that_are_up() {
        let mut rng = fastrand::Rng::with_seed(36);
        let b = backends(4);
        for round in 0..20_000 {
            let cfg = lb((round % 2 == 0).then(|| [rng.u8(..); 16]));
            let r = Router::new(cfg.clone(), Routing::QuicLb, 20);
            let up: Vec<bool> = (0..4).map(|_| rng.bool()).collect();
            let t = Table::new(&b, &up);
            let mut d: Vec<u8> = (0..rng.usize(..80)).map(|_| rng.u8(..)).collect();
            if round % 3 == 0 {
                d = short_packet(&cfg, rng.u8(1..=5));
            }
            let c = r.choose(&t, &d, CLIENT);
            let other = SocketAddrV4::new([10, 2, 2, 2].into(), rng.u16(..));
            assert_eq!(c, r.choose(&t, &d, other));
            match c {
                Choice::Routed(i) | Choice::Hashed(i, _) => assert!(up[i], "{c:?} {up:?}"),
                Choice::Drop(DropReason::NoBackend) => assert!(up.iter().all(|u| !u)),
                Choice::Drop(DropReason::Malformed) => assert!(packet::dcid(&d).is_none()),
                Choice::Drop(other) => panic!("the router does not decide {other:?}"),
            }
        }
    }

    #[test]
    fn reasons_are_listed_in_index_order() {
        for (i, r) in HashReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
    }

    #[test]
    fn nothing_up_or_nothing_readable_drops() {
        let cfg = lb(None);
        let b = backends(2);
        let r = Router::new(cfg.clone(), Routing::QuicLb, 20);
        let none = Table::new(&b, &[false, false]);
        assert_eq!(
            r.choose(&none, &short_packet(&cfg, 1), CLIENT),
            Choice::Drop(DropReason::NoBackend)
        );
        let t = Table::new(&b, &[true, true]);
        assert_eq!(
            r.choose(&t, &[], CLIENT),
            Choice::Drop(DropReason::Malformed)
        );
        assert_eq!(
            r.choose(&t, &[0x40], CLIENT),
            Choice::Drop(DropReason::Malformed)
        );
    }
}
