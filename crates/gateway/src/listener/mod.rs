//! Accepting connections: TCP listeners (PROXY protocol, plain-HTTP redirects), QUIC, the
//! per-connection timers, and the socket I/O helpers they share.

pub(crate) mod conn_timers;
pub mod h2_flood;
pub mod proxy_protocol;
pub(crate) mod quic;
pub(crate) mod recv_buffer;
pub(crate) mod redirect;
pub(crate) mod send_coalescer;
pub(crate) mod tcp;
