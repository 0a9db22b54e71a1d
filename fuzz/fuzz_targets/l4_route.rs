//! Fuzzes the layer-4 balancer's decision (`l4::route::Router::choose`), which reads the
//! destination connection ID of every datagram sent to the VIP. For a QUIC-LB configuration,
//! a set of gateways up or down and a datagram taken from the input:
//! - no panic, whatever the bytes;
//! - a datagram goes only to a gateway that is up, or is dropped only when none is up or
//!   it has no readable connection ID;
//! - the decision depends on the datagram, not on the client's address (`quic_lb` routing
//!   keeps no state and ignores the 4-tuple), and is the same when asked twice.
#![no_main]

use l4::route::{Choice, DropReason, Router, Table};
use l4::config::{Backend, Routing};
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddrV4;

fuzz_target!(|data: &[u8]| {
    let [flags, up_mask, key_byte, datagram @ ..] = data else {
        return;
    };
    let sid_len = 1 + (*flags as usize & 3);
    let nonce_len = 4 + ((*flags as usize >> 2) & 7);
    let lb = quiclb::Config {
        rotation: (flags >> 5) % 7,
        server_id_len: sid_len,
        nonce_len,
        key: (flags & 0x10 != 0).then_some([*key_byte; 16]),
        self_encode_length: true,
    };
    if lb.validate().is_err() {
        return;
    }
    let n = 1 + (*up_mask as usize & 3);
    let backends: Vec<Backend> = (0..n)
        .map(|i| Backend {
            server_id: vec![i as u8 + 1; sid_len],
            address: [10, 0, 0, i as u8 + 1].into(),
            health: ([10, 0, 0, i as u8 + 1], 443).into(),
        })
        .collect();
    let up: Vec<bool> = (0..n).map(|i| up_mask & (0x10 << i) != 0).collect();
    let table = Table::new(&backends, &up);
    let router = Router::new(lb, Routing::QuicLb, 20);
    let a = SocketAddrV4::new([192, 0, 2, 1].into(), 1000);
    let b = SocketAddrV4::new([198, 51, 100, 7].into(), 61000);
    let choice = router.choose(&table, datagram, a);
    assert_eq!(choice, router.choose(&table, datagram, b));
    assert_eq!(choice, router.choose(&table, datagram, a));
    match choice {
        Choice::Routed(i) | Choice::Hashed(i, _) => assert!(i < n && up[i]),
        Choice::Drop(DropReason::NoBackend) => assert!(up.iter().all(|u| !u)),
        Choice::Drop(DropReason::Malformed) => {}
        Choice::Drop(other) => panic!("the router does not decide {other:?}"),
    }
});
