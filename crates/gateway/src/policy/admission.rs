//! Admission at accept: a listener's access list, its per-address rate of new connections and
//! share of open ones, its `limits.max_connections` and the overload manager's refusal,
//! checked before a connection costs anything.

use crate::ops::metrics::{GaugeGuard, Metrics};
use crate::policy::access::SharedAccessList;
use crate::policy::client_share::{ClientShare, ClientShares};
use crate::policy::overload::{Action, Overload};
use crate::policy::ratelimit::RateLimiter;
use std::net::IpAddr;
use std::sync::Arc;

/// What a listener limits per client at accept, one count for its workers, TCP and QUIC:
/// `limits.new_connections_per_address`, `limits.max_connections_per_address`, and the
/// prefix (`limits.client_ipv6_prefix`) an IPv6 client is counted by in every per-client
/// limit, its requests' too ([`PerClient::key`]).
#[derive(Clone)]
pub struct PerClient {
    rate: Option<Arc<RateLimiter>>,
    open: Option<Arc<ClientShares>>,
    ipv6_prefix: u8,
}

impl PerClient {
    pub fn new(limits: &crate::config::LimitsConfig) -> Self {
        PerClient {
            rate: limits
                .new_connections_per_address
                .as_ref()
                .map(|r| Arc::new(RateLimiter::new(r.per_second, r.burst()))),
            open: limits.max_connections_per_address.map(ClientShares::new),
            ipv6_prefix: limits.client_ipv6_prefix,
        }
    }

    /// What per-client limits count `client` by ([`crate::policy::client_key`]).
    pub fn key(&self, client: IpAddr) -> IpAddr {
        crate::policy::client_key::client_key(client, self.ipv6_prefix)
    }
}

/// `limits.max_connections` for one listener and transport (`"NAME"` for TCP, `"NAME/quic"`):
/// its open-connections gauge, its rejected counter and the cap, looked up once.
#[derive(Clone)]
pub struct ConnectionCap {
    open: prometheus::IntGauge,
    rejected: prometheus::IntCounter,
    max: i64,
    access: SharedAccessList,
    denied: prometheus::IntCounter,
    per_client: PerClient,
    over_share: prometheus::IntCounter,
    rate_limited: prometheus::IntCounter,
    overload: Arc<Overload>,
}

impl ConnectionCap {
    pub fn new(
        m: &Metrics,
        label: &str,
        max: usize,
        access: SharedAccessList,
        per_client: PerClient,
        overload: Arc<Overload>,
    ) -> Self {
        ConnectionCap {
            open: m.open_connections.with_label_values(&[label]),
            rejected: m.rejected_connections.with_label_values(&[label]),
            max: max as i64,
            access,
            denied: m.denied_connections.with_label_values(&[label]),
            per_client,
            over_share: m.over_share_connections.with_label_values(&[label]),
            rate_limited: m.rate_limited_connections.with_label_values(&[label]),
            overload,
        }
    }

    /// Whether a new connection from `client` must be refused: the listener's access list
    /// turns it away, or the cap is reached. Counted either way.
    pub fn refuse(&self, client: std::net::IpAddr) -> bool {
        if self.deny(client) {
            return true;
        }
        self.full()
    }

    /// Whether the listener's access list turns `client` away (counted).
    pub fn deny(&self, client: std::net::IpAddr) -> bool {
        if !self.access.current().permits(client) {
            self.denied.inc();
            return true;
        }
        false
    }

    /// Whether `client` opens new connections faster than
    /// `limits.new_connections_per_address` (counted; each call takes a token). Only for an
    /// address the transport has validated: a TCP peer, or a QUIC client whose handshake
    /// completed. A QUIC Initial's address can be forged, and a connection may send more
    /// than one Initial (Retry).
    pub fn too_fast(&self, client: std::net::IpAddr) -> bool {
        let rate = self.per_client.rate.as_ref();
        if rate.is_some_and(|r| r.take(self.per_client.key(client)).is_err()) {
            self.rate_limited.inc();
            return true;
        }
        false
    }

    /// The connection's unit of its client's `limits.max_connections_per_address`, held
    /// while it is open: `Ok(None)` without that limit, `Err` (counted) when the client
    /// holds its share already. Only for a validated address (as [`Self::too_fast`]).
    pub fn client_share(&self, client: std::net::IpAddr) -> Result<Option<ClientShare>, ()> {
        let Some(open) = &self.per_client.open else {
            return Ok(None);
        };
        match open.take(self.per_client.key(client)) {
            Some(share) => Ok(Some(share)),
            None => {
                self.over_share.inc();
                Err(())
            }
        }
    }

    /// Whether a TCP peer's address is turned away: by the access list, or for opening
    /// connections too fast (counted). TCP has validated the address by its handshake.
    pub fn deny_address(&self, client: std::net::IpAddr) -> bool {
        self.deny(client) || self.too_fast(client)
    }

    /// Whether the cap itself is reached (not counted).
    pub fn at_cap(&self) -> bool {
        self.open.get() >= self.max
    }

    /// Whether the overload manager stops accepting (not counted).
    pub fn stopped(&self) -> bool {
        self.overload.is_active(Action::StopAccepting)
    }

    /// Counts a connection refused for the cap, overload or another limit (pending QUIC
    /// handshakes).
    pub fn count_rejected(&self) {
        self.rejected.inc();
    }

    /// The open connections.
    pub fn open_count(&self) -> usize {
        self.open.get().max(0) as usize
    }

    /// Whether the cap is reached, or the overload manager stops accepting (counted).
    pub fn full(&self) -> bool {
        let full = self.at_cap() || self.stopped();
        if full {
            self.count_rejected();
        }
        full
    }

    /// Whether the listener holds more than 3/4 of its cap, or the overload manager closes
    /// idle connections: idle connections then get the shorter `idle_timeout_under_pressure`.
    pub fn under_pressure(&self) -> bool {
        self.open.get() * 4 > self.max * 3 || self.overload.is_active(Action::CloseIdleConnections)
    }

    /// Counts one open connection until the guard drops.
    pub fn open(&self) -> GaugeGuard {
        GaugeGuard::new(self.open.clone())
    }
}
