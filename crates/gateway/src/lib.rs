//! rampart's gateway: listeners, TLS termination, the request pipeline, upstream pools,
//! policies, and the admin side. Each folder is one role:
//!
//! - [`bootstrap`]: start-up, the key engine's assembly, workers, reload.
//! - [`config`]: the TOML configuration, typed and validated.
//! - `listener`: accepting connections: TCP (with PROXY protocol and redirects), QUIC, and
//!   the per-connection timers and socket I/O helpers.
//! - [`tls`]: certificates, SNI, session tickets and the asynchronous key method.
//! - `http`: the request pipeline: target normalization, routing, compression, forwarding.
//! - `body`: request and response bodies between client and upstream.
//! - `upstream`: clusters, connection pools, health checks, upstream TLS.
//! - `policy`: access lists, rate limits, the overload manager, the WAF (its response
//!   codings are [`waf_codings`], public for the fuzz target).
//! - `control`: the fleet control plane: objects in etcd, watched and applied.
//! - `fleet`: state shared by the fleet's gateways in Redis: fleet rate limits.
//! - `ops`: the admin listener and its API, metrics and the access log.
//! - `trace`: distributed tracing: W3C trace context, spans, the OTLP exporter.
//! - [`demo`]: the self-signed demo kit.
//!
//! The key-server process (the `keyserver` crate) is built from the same parts: [`config`]'s
//! sections and file helpers, [`assemble_key_engine`], [`admin`] and [`bind_listener`].
//!
//! [`start`] turns a validated [`config::Config`] into running listeners; [`Running`] reloads
//! and stops them.

mod body;
pub mod bootstrap;
pub mod config;
mod control;
pub mod demo;
mod fleet;
mod http;
mod listener;
mod ops;
mod policy;
mod swappable;
pub mod tls;
mod trace;
mod upstream;

pub use bootstrap::{
    assemble_key_engine, build_key_engine, start, start_engines, Running, StartOptions,
};
pub use http::request_target;
pub use listener::tcp::bind as bind_listener;
pub use listener::{h2_flood, proxy_protocol};
pub use ops::admin;
pub use ops::metrics;
pub use policy::waf::codings as waf_codings;
