//! `rampart l4`: a layer-4 UDP balancer for a fleet of QUIC gateways.
//!
//! Each datagram sent to the virtual address (VIP) goes to one gateway, chosen from the
//! datagram alone, so any number of balancers route the same way and none keeps
//! per-connection state:
//!
//! 1. [`packet`] reads the destination connection ID (long or short header).
//! 2. [`route`] decodes its QUIC-LB server ID ([`quiclb::Decoder`], the gateways' own
//!    configuration) and picks that gateway while it is healthy; client-chosen IDs (Initials),
//!    unknown server IDs and IDs of gateways that are down are placed by rendezvous hashing
//!    of the ID over the healthy gateways, so every packet of one ID lands on one gateway.
//! 3. [`frame`] writes the IPv4 and UDP headers back around the payload, the client still the
//!    source and the VIP the destination, and [`forward`] sends it as a layer-2 frame to the
//!    gateway's MAC address (direct server return, as LVS's "DR" mode): the gateway owns the
//!    VIP too and answers the client directly, so replies never pass through the balancer.
//!
//! [`health`] probes every gateway with a QUIC version-negotiation probe (any QUIC server
//! answers one) and learns its MAC address from the kernel's neighbour table. I/O is batched
//! (`recvmmsg` on one `SO_REUSEPORT` socket per worker, `sendmmsg` on a packet socket).

pub mod config;
mod forward;
mod frame;
mod health;
mod link;
mod metrics;
mod packet;
pub mod process;
pub mod route;

pub use config::L4Config;
