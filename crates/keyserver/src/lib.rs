//! The key-server process (`rampart keyserver`): holds private keys, answers keyless requests
//! from gateways over mutual TLS (the protocol is the `keyless` crate's), signs through its
//! own key engine, assembled from the same `[key_engine]` section as a gateway's, and serves
//! `/healthz` and `/metrics`.

mod config;
mod process;

pub use config::{KeyServerConfig, KeyServerSection};
pub use process::{start, RunningKeyServer};
