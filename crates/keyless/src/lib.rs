//! The keyless protocol v1 (Cloudflare's keyless SSL, as gokeyless speaks it): the wire
//! [`codec`], a key [`server`] that signs through a [`keyengine::KeyEngine`], and the
//! [`client`] side: [`client::RemoteEngine`], a key engine whose keys live on key servers.
//!
//! Wire facts: `shared/keyless-protocol.md` (copied in `docs/keyless-protocol.md`).

pub mod client;
pub mod codec;
pub mod server;
pub mod tls;
