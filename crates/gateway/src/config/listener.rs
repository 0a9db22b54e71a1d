//! `[[listeners]]`: addresses, certificates, TLS, HTTP/3 and the per-listener limits.

use super::file::hex;
use super::{
    duration, valid_server_name, At, EngineKind, Invalid, KeyEngineConfig, RateLimitConfig,
};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub name: String,
    pub listen: SocketAddr,
    pub certificates: Vec<CertificateConfig>,
    #[serde(default)]
    pub tls: TlsConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub quic: QuicConfig,
    /// A plain-HTTP address whose every request is redirected (308) to this listener over
    /// HTTPS.
    pub http_redirect: Option<SocketAddr>,
    /// Client addresses served (addresses or CIDR blocks); empty: all not denied. Others are
    /// turned away before any TLS or QUIC handshake work.
    #[serde(default)]
    pub allow: Vec<crate::policy::access::Cidr>,
    /// Client addresses turned away, checked before `allow`.
    #[serde(default)]
    pub deny: Vec<crate::policy::access::Cidr>,
    /// Every TCP connection starts with a PROXY protocol header (version 1 or 2) from the
    /// layer-4 balancer in front, whose client address then stands for the connection's peer
    /// (access lists, rate limits, `X-Forwarded-For`, the access log). A connection without
    /// one is closed. QUIC is unaffected.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// What the gateway does with an `X-Forwarded-For` the client sent: `append` its peer's
    /// address to it (the default, as nginx and Envoy), or `replace` it with that address,
    /// so an upstream that reads the first entry cannot be handed a made-up one.
    #[serde(default)]
    pub forwarded_for: ForwardedFor,
    /// How request paths are normalized before routing (`[listeners.paths]`).
    #[serde(default)]
    pub paths: crate::http::request_target::PathPolicy,
}

/// A listener's `forwarded_for`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardedFor {
    /// The client's `X-Forwarded-For`, then its peer's address.
    #[default]
    Append,
    /// The peer's address alone: the gateway is the first hop it trusts.
    Replace,
}

/// HTTP/3 over QUIC beside a TLS listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QuicConfig {
    /// Serve HTTP/3 and advertise it with `Alt-Svc` on TCP responses.
    pub enabled: bool,
    /// UDP address; default: the TCP listener's address and port.
    pub listen: Option<SocketAddr>,
    /// Congestion control: "cubic", "reno", "bbr2" (quiche's names).
    pub congestion_control: String,
    /// Connection-level flow-control window (bytes).
    pub initial_max_data: u64,
    /// Stream-level flow-control window (bytes).
    pub initial_max_stream_data: u64,
    /// Concurrent request streams a client may open.
    pub max_concurrent_streams: u64,
    /// UDP socket send and receive buffer (bytes); the kernel may cap it (a warning says so).
    pub udp_buffer_bytes: usize,
    /// Address validation with Retry: "never", "always" or "when_busy" (while more than
    /// `retry_pending_above` handshakes are pending on this listener).
    pub retry: RetryPolicy,
    /// With `retry = "when_busy"`: Retry while more handshakes than this are pending.
    pub retry_pending_above: usize,
    /// Handshakes pending at once on this listener (all workers); past it new connection
    /// attempts are refused (CONNECTION_REFUSED), Retry token or not, so a flood of Initials
    /// holds bounded memory.
    pub max_pending_handshakes: usize,
    /// Routable connection IDs (QUIC-LB); absent: random 20-byte IDs.
    pub lb: Option<QuicLbConfig>,
    /// Answer each datagram from the address it was sent to (`IP_FREEBIND`, so tokio-quiche
    /// sends with `IP_PKTINFO`): behind `rampart l4`'s direct server return, a listener on
    /// `0.0.0.0` answers clients from the VIP it owns on `lo`.
    pub direct_server_return: bool,
    /// Accept 0-RTT early data on resumed connections: safe methods (GET, HEAD, OPTIONS) are
    /// forwarded with `Early-Data: 1`; any other method in early data gets 425 Too Early.
    pub early_data: bool,
    /// Sign Retry tokens with keys shared through `[fleet] redis` (rotated every
    /// `tls.ticket_key_rotation` by one gateway, read by all), so that a Retry one gateway
    /// issues is accepted by another.
    pub fleet_retry_keys: bool,
    /// The key stateless-reset tokens are derived from (a file whose first line is 64 hex
    /// digits), shared by the fleet so any gateway can reset another's connections. Unset: a
    /// key of the listener's own (or the fleet's, with `fleet_stateless_reset_key`).
    pub stateless_reset_key_file: Option<PathBuf>,
    /// The stateless-reset key shared through `[fleet] redis`: made by the first gateway that
    /// asks, read by the others.
    pub fleet_stateless_reset_key: bool,
    /// Pace outgoing packets (spread over the RTT instead of bursts): each GSO send gets a
    /// release time (`SO_TXTIME`, honoured by the `fq` qdisc) and spans at most 1 ms of them.
    /// bbr2 paces by its own model; cubic and reno by Linux TCP's rule (quiche patch 20).
    pub pacing: bool,
    /// Initial congestion window in packets (RFC 9002 suggests 10).
    pub initial_congestion_window: usize,
    /// Path MTU discovery (RFC 8899 DPLPMTUD, quiche's): a connection starts at QUIC's
    /// 1,200 bytes and probes up to `max_udp_payload`; a probe lost three times is taken as too
    /// big (binary search below it), and probe loss is not taken as congestion.
    pub pmtu_discovery: bool,
    /// Largest UDP payload this server sends (bytes). Unset: 1452 (what a 1,500-byte IPv6
    /// path carries) with `pmtu_discovery`, else 1350 (fits every common path MTU without
    /// discovery). Read it with [`QuicConfig::max_udp_payload`].
    pub max_udp_payload: Option<usize>,
    /// ACK decimation: in-order ack-eliciting packets received before an ACK is sent, unless
    /// a quarter of the RTT (1 ms to `max_ack_delay`) passes first. A gap is acknowledged at
    /// once. 1 acknowledges every batch of received packets, as quiche does by default.
    pub ack_eliciting_threshold: u64,
}

impl QuicConfig {
    /// The UDP payload ceiling in force: `max_udp_payload`, or its default for
    /// `pmtu_discovery`.
    pub fn max_udp_payload(&self) -> usize {
        self.max_udp_payload
            .unwrap_or(if self.pmtu_discovery { 1452 } else { 1350 })
    }
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            enabled: false,
            listen: None,
            congestion_control: "cubic".into(),
            initial_max_data: 10 << 20,
            initial_max_stream_data: 1 << 20,
            max_concurrent_streams: 100,
            udp_buffer_bytes: 4 << 20,
            retry: RetryPolicy::WhenBusy,
            retry_pending_above: 256,
            max_pending_handshakes: 1024,
            lb: None,
            direct_server_return: false,
            early_data: false,
            fleet_retry_keys: false,
            stateless_reset_key_file: None,
            fleet_stateless_reset_key: false,
            pacing: true,
            initial_congestion_window: 10,
            pmtu_discovery: true,
            max_udp_payload: None,
            ack_eliciting_threshold: 10,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryPolicy {
    Never,
    Always,
    WhenBusy,
}

/// QUIC-LB (draft-ietf-quic-load-balancers-21) connection-ID configuration, shared with the
/// L4 balancers in front.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuicLbConfig {
    /// Config rotation id, 0..=6.
    #[serde(default)]
    pub rotation: u8,
    /// This server's ID, hex.
    pub server_id: String,
    /// Nonce bytes (≥ 4; server ID + nonce ≤ 19).
    pub nonce_len: usize,
    /// AES-128 key, 32 hex digits; absent: plaintext server IDs.
    pub key: Option<String>,
}

impl QuicLbConfig {
    /// The quiclb configuration and the server ID bytes.
    pub fn build(&self) -> Result<(quiclb::Config, Vec<u8>), String> {
        let sid = hex(&self.server_id).ok_or("server_id: expected hex digits")?;
        let key = match &self.key {
            Some(k) => Some(
                hex(k)
                    .and_then(|b| <[u8; 16]>::try_from(b).ok())
                    .ok_or("key: expected 32 hex digits (AES-128)")?,
            ),
            None => None,
        };
        let cfg = quiclb::Config {
            rotation: self.rotation,
            server_id_len: sid.len(),
            nonce_len: self.nonce_len,
            key,
            self_encode_length: true,
        };
        cfg.validate().map_err(|e| e.to_string())?;
        Ok((cfg, sid))
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Enabled versions: any of "1.2", "1.3".
    pub versions: Vec<TlsVersion>,
    /// TLS 1.2 cipher suites (OpenSSL names), ECDHE only. TLS 1.3 suites are fixed.
    pub tls12_ciphers: Vec<String>,
    /// How often the session-ticket key rotates; the previous key still decrypts.
    #[serde(deserialize_with = "duration")]
    pub ticket_key_rotation: Duration,
    /// Session-ticket keys shared by a fleet: a file of hex keys, the first sealing new tickets
    /// and every one opening them, re-read every `ticket_key_rotation` (none: keys made and
    /// rotated in process).
    pub ticket_key_file: Option<PathBuf>,
    /// Accept TLS 1.3 early data (0-RTT) on resumed TCP connections, under HTTP/3's rules:
    /// safe methods go upstream with `Early-Data: 1`, others get 425.
    pub early_data: bool,
    /// Session-ticket keys shared by the fleet through `[fleet] redis`: one gateway rotates
    /// them every `ticket_key_rotation` (holding a lease), every gateway reads them.
    pub fleet_ticket_keys: bool,
    /// Time allowed for a client to complete the TLS handshake.
    #[serde(deserialize_with = "duration")]
    pub handshake_timeout: Duration,
    /// Client certificates over TCP: `none`, `optional` (asked for; a client without one is
    /// served, one with an invalid one refused) or `required`.
    pub client_auth: ClientAuth,
    /// CA certificates (PEM) client certificates must chain to.
    pub client_ca: Option<PathBuf>,
    /// Revoked client certificates (a PEM CRL of `client_ca`), checked when given.
    pub client_crl: Option<PathBuf>,
    /// The headers that carry a verified client certificate upstream (and that are removed
    /// from every request first, whatever the client sent in them).
    pub client_cert_headers: ClientCertHeadersConfig,
}

/// Whether a listener asks TCP clients for certificates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    #[default]
    None,
    Optional,
    Required,
}

/// `tls.client_cert_headers`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientCertHeadersConfig {
    /// The certificate's subject, as `CN=client,O=Example`.
    pub subject: String,
    /// Its subject alternative names: `DNS:a.example, email:x@example`.
    pub san: String,
    /// The SHA-256 of its DER, in hex.
    pub sha256: String,
}

impl Default for ClientCertHeadersConfig {
    fn default() -> Self {
        ClientCertHeadersConfig {
            subject: "x-client-cert-subject".into(),
            san: "x-client-cert-san".into(),
            sha256: "x-client-cert-sha256".into(),
        }
    }
}

pub const TLS12_ECDHE_CIPHERS: &[&str] = &[
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
];

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            versions: vec![TlsVersion::Tls12, TlsVersion::Tls13],
            tls12_ciphers: TLS12_ECDHE_CIPHERS.iter().map(|s| s.to_string()).collect(),
            ticket_key_rotation: Duration::from_secs(3600),
            ticket_key_file: None,
            fleet_ticket_keys: false,
            early_data: false,
            client_auth: ClientAuth::None,
            client_ca: None,
            client_crl: None,
            client_cert_headers: Default::default(),
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// Names this certificate serves (exact, or `*.example.com`). The first certificate of a
    /// listener is also the default for clients that send no or an unknown SNI.
    pub server_names: Vec<String>,
    pub rsa: Option<CertKeyPair>,
    pub ecdsa: Option<CertKeyPair>,
    /// Client certificates for these names, instead of the listener's `tls.client_auth`.
    #[serde(default)]
    pub client_auth: Option<ClientAuth>,
    /// The CAs client certificates for these names must chain to (else `tls.client_ca`).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// Revoked client certificates for these names (else `tls.client_crl`).
    #[serde(default)]
    pub client_crl: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertKeyPair {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key, loaded into the key engine (never into a TLS context). Omit it when
    /// the `remote` engine signs with keys held by key servers (the edge then holds none).
    pub key: Option<PathBuf>,
    /// The certificate's OCSP response (DER, as `openssl ocsp -respout` writes it), stapled to
    /// handshakes that ask while it is fresh; read again by a reload. It must verify for this
    /// certificate (the chain's second certificate is its issuer).
    #[serde(default)]
    pub ocsp_response: Option<PathBuf>,
    /// Fetch the certificate's OCSP response from the responder its Authority Information
    /// Access names, and refresh it before it expires (instead of `ocsp_response`).
    #[serde(default)]
    pub ocsp_fetch: bool,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Total bytes of request headers (names + values); more gets 431.
    pub max_header_bytes: usize,
    /// Number of request headers; more gets 431.
    pub max_headers: usize,
    /// Request body bytes; more gets 413.
    pub max_body_bytes: u64,
    /// New connections a client address may open: `per_second` sustained after a `burst`;
    /// beyond it a connection is turned away before any handshake (TCP closed, QUIC
    /// CONNECTION_REFUSED). Off by default: many phones can share one carrier address.
    pub new_connections_per_address: Option<RateLimitConfig>,
    /// Connections a client address (an IPv6 one by `client_ipv6_prefix`) may hold open at
    /// once, TCP and QUIC together (nginx's `limit_conn`); past it a new one is closed before
    /// its handshake (QUIC: once it completes). Off by default, as behind a carrier's NAT
    /// many phones share one address.
    pub max_connections_per_address: Option<usize>,
    /// Close a client connection idle this long between requests (no request in flight,
    /// whatever else arrives: HTTP/2 PINGs keep no connection open).
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Close a connection that sends no request this long after its TLS handshake.
    #[serde(deserialize_with = "duration")]
    pub first_request_timeout: Duration,
    /// While the listener holds more than 3/4 of `max_connections`, idle connections are
    /// closed after this instead of `idle_timeout`, so descriptors go back to new clients.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout_under_pressure: Duration,
    /// A request body whose length is known and at most this is read whole before an
    /// upstream is picked (nginx's `client_body_buffer_size`), so a client trickling it holds
    /// no upstream connection or slot meanwhile; 0: every body is streamed.
    pub buffer_body_bytes: u64,
    /// Longest wait for the next bytes of a request body (nginx's `client_body_timeout`);
    /// past it the request fails with 408 and its upstream slot is freed.
    #[serde(deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// Longest time sent bytes may stay unacknowledged by a client that stopped reading
    /// (nginx's `send_timeout`, kept by the kernel as `TCP_USER_TIMEOUT`); past it the
    /// connection is closed and its requests' upstream slots freed.
    #[serde(deserialize_with = "duration")]
    pub send_timeout: Duration,
    /// HTTP/2 SETTINGS, PING and PRIORITY frames a client may send per second, on average
    /// (with a burst of ten seconds' worth); past it the connection is closed as a flood.
    pub max_control_frames_per_second: u32,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Open client connections on this listener (all workers); beyond it new connections are
    /// closed at once and counted, so overload sheds instead of stalling everyone.
    pub max_connections: usize,
    /// The prefix an IPv6 client is counted by in every per-client limit (routes' rate limits,
    /// clusters' `max_requests_per_client`, `new_connections_per_address`): one client holds
    /// a whole /64 and could otherwise take a fresh share from each of its addresses. 64 by
    /// default; 48 to 128.
    pub client_ipv6_prefix: u8,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_body_bytes: 1 << 30,
            idle_timeout: Duration::from_secs(60),
            first_request_timeout: Duration::from_secs(20),
            idle_timeout_under_pressure: Duration::from_secs(2),
            buffer_body_bytes: 16 * 1024,
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_control_frames_per_second: 100,
            max_concurrent_streams: 256,
            max_connections: 100_000,
            new_connections_per_address: None,
            max_connections_per_address: None,
            client_ipv6_prefix: crate::policy::client_key::DEFAULT_IPV6_PREFIX,
        }
    }
}

impl ListenerConfig {
    /// The listener's own fields (its name and address are checked against the others'
    /// by the caller). Certificates need a key file unless `key_engine` signs remotely.
    pub(super) fn validate(&self, at: &At, key_engine: &KeyEngineConfig) -> Result<(), Invalid> {
        let remote = key_engine.engines.contains(&EngineKind::Remote);
        let certificates = at.field("certificates");
        if self.certificates.is_empty() {
            return certificates.fail("at least one certificate");
        }
        self.tls.validate(&at.field("tls"))?;
        for (j, c) in self.certificates.iter().enumerate() {
            let at = certificates.index(j);
            c.validate(&at, remote)?;
            // The entry's own client-certificate settings, over the listener's.
            if c.client_auth.is_some() || c.client_ca.is_some() || c.client_crl.is_some() {
                c.effective_tls(&self.tls).validate_client_auth(&at)?;
            }
        }
        if self.quic.enabled {
            self.quic.validate(&at.field("quic"), &self.tls)?;
        }
        let limits = at.field("limits");
        if self.limits.max_control_frames_per_second == 0 {
            return limits
                .field("max_control_frames_per_second")
                .fail("at least 1");
        }
        if self.limits.max_header_bytes < 1024 || self.limits.max_headers == 0 {
            return limits
                .field("max_header_bytes")
                .fail("at least 1024 bytes and 1 header");
        }
        if self.limits.max_connections_per_address == Some(0) {
            return limits
                .field("max_connections_per_address")
                .fail("at least 1 connection");
        }
        if !(48..=128).contains(&self.limits.client_ipv6_prefix) {
            return limits
                .field("client_ipv6_prefix")
                .fail("a prefix length from 48 to 128 (64: one client per /64)");
        }
        if let Some(rate) = &self.limits.new_connections_per_address {
            let at = limits.field("new_connections_per_address");
            rate.validate(&at, "connections")?;
            if rate.scope != super::LimitScope::Node {
                return at
                    .field("scope")
                    .fail("\"node\": connections are counted per gateway");
            }
        }
        Ok(())
    }

    /// Whether any of the listener's names asks clients for certificates (`tls.client_auth`,
    /// or a certificate entry's own).
    pub fn asks_client_certs(&self) -> bool {
        self.tls.client_auth != ClientAuth::None
            || self
                .certificates
                .iter()
                .any(|c| c.client_auth.is_some_and(|m| m != ClientAuth::None))
    }

    /// Each certificate entry's client-certificate settings (`client_auth`, `client_ca`,
    /// `client_crl`, its own or the listener's) as a number, equal for entries whose settings
    /// are equal, the first entry's 0.
    pub fn client_auth_policies(&self) -> Vec<usize> {
        let mut seen = Vec::new();
        self.certificates
            .iter()
            .map(|c| {
                let t = c.effective_tls(&self.tls);
                let settings = (t.client_auth, t.client_ca, t.client_crl);
                seen.iter().position(|s| *s == settings).unwrap_or_else(|| {
                    seen.push(settings);
                    seen.len() - 1
                })
            })
            .collect()
    }

    /// Whether some certificate entries' client-certificate settings differ from others':
    /// requests are then checked against the name their connection was made for.
    pub fn client_auth_differs_by_name(&self) -> bool {
        self.client_auth_policies().iter().any(|&p| p != 0)
    }

    /// Relative paths in the listener resolved against the config file's folder.
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        for f in [
            &mut self.tls.ticket_key_file,
            &mut self.quic.stateless_reset_key_file,
            &mut self.tls.client_ca,
            &mut self.tls.client_crl,
        ]
        .into_iter()
        .flatten()
        {
            *f = base.join(&*f);
        }
        for c in &mut self.certificates {
            for f in [&mut c.client_ca, &mut c.client_crl].into_iter().flatten() {
                *f = base.join(&*f);
            }
            for pair in [&mut c.rsa, &mut c.ecdsa].into_iter().flatten() {
                pair.cert = base.join(&pair.cert);
                pair.key = pair.key.as_ref().map(|k| base.join(k));
                pair.ocsp_response = pair.ocsp_response.as_ref().map(|o| base.join(o));
            }
        }
    }
}

impl CertificateConfig {
    /// The listener's TLS settings with this entry's client-certificate settings in place of
    /// the listener's where it has its own.
    pub fn effective_tls(&self, tls: &TlsConfig) -> TlsConfig {
        let mut t = tls.clone();
        if let Some(mode) = self.client_auth {
            t.client_auth = mode;
        }
        if self.client_ca.is_some() {
            t.client_ca = self.client_ca.clone();
        }
        if self.client_crl.is_some() {
            t.client_crl = self.client_crl.clone();
        }
        t
    }

    fn validate(&self, at: &At, remote: bool) -> Result<(), Invalid> {
        let names = at.field("server_names");
        if self.server_names.is_empty() {
            return names.fail("at least one server name");
        }
        for (k, n) in self.server_names.iter().enumerate() {
            if !valid_server_name(n) {
                return names
                    .index(k)
                    .fail(format!("{n:?} is not a DNS name or *.wildcard"));
            }
        }
        if self.rsa.is_none() && self.ecdsa.is_none() {
            return at.fail("an `rsa` or an `ecdsa` certificate (or both)");
        }
        for (kind, pair) in [("rsa", &self.rsa), ("ecdsa", &self.ecdsa)] {
            let Some(pair) = pair else { continue };
            let at = at.field(kind);
            if pair.key.is_none() && !remote {
                return at
                    .field("key")
                    .fail("a private key file, unless key_engine.engines includes \"remote\"");
            }
            if pair.ocsp_fetch && pair.ocsp_response.is_some() {
                return at
                    .field("ocsp_fetch")
                    .fail("either ocsp_fetch or ocsp_response, not both");
            }
            let key = pair.key.iter().map(|k| ("key", k));
            let ocsp = pair.ocsp_response.iter().map(|o| ("ocsp_response", o));
            for (f, path) in std::iter::once(("cert", &pair.cert)).chain(key).chain(ocsp) {
                at.field(f).file_exists(path)?;
            }
        }
        Ok(())
    }
}

impl TlsConfig {
    fn validate(&self, at: &At) -> Result<(), Invalid> {
        self.validate_client_auth(at)?;
        self.validate_rest(at)
    }

    /// `client_auth`, `client_ca` and `client_crl` together (also for a certificate entry's
    /// own, at `at`).
    fn validate_client_auth(&self, at: &At) -> Result<(), Invalid> {
        match (&self.client_auth, &self.client_ca) {
            (ClientAuth::None, _) => {}
            (_, None) => {
                return at
                    .field("client_ca")
                    .fail("a PEM file of the CAs client certificates must chain to");
            }
            (_, Some(ca)) => at.field("client_ca").file_exists(ca)?,
        }
        if let Some(crl) = &self.client_crl {
            if self.client_auth == ClientAuth::None {
                return at
                    .field("client_crl")
                    .fail("client_auth \"optional\" or \"required\"");
            }
            at.field("client_crl").file_exists(crl)?;
        }
        Ok(())
    }

    fn validate_rest(&self, at: &At) -> Result<(), Invalid> {
        let h = &self.client_cert_headers;
        for (name, v) in [
            ("subject", &h.subject),
            ("san", &h.san),
            ("sha256", &h.sha256),
        ] {
            if http::HeaderName::from_bytes(v.as_bytes()).is_err() {
                return at
                    .field("client_cert_headers")
                    .field(name)
                    .fail(format!("a header name, not {v:?}"));
            }
        }
        if self.versions.is_empty() {
            return at
                .field("versions")
                .fail("at least one of \"1.2\", \"1.3\"");
        }
        for (k, c) in self.tls12_ciphers.iter().enumerate() {
            if !TLS12_ECDHE_CIPHERS.contains(&c.as_str()) {
                return at.field("tls12_ciphers").index(k).fail(format!(
                    "{c:?} is not an allowed ECDHE suite; expected one of {}",
                    TLS12_ECDHE_CIPHERS.join(", ")
                ));
            }
        }
        if self.versions.contains(&TlsVersion::Tls12) && self.tls12_ciphers.is_empty() {
            return at
                .field("tls12_ciphers")
                .fail("TLS 1.2 is enabled: at least one suite");
        }
        if self.ticket_key_rotation < Duration::from_secs(1) {
            return at.field("ticket_key_rotation").fail("at least 1s");
        }
        if self.fleet_ticket_keys && self.ticket_key_file.is_some() {
            return at
                .field("fleet_ticket_keys")
                .fail("ticket keys from the fleet or from ticket_key_file, not both");
        }
        Ok(())
    }
}

impl QuicConfig {
    /// An enabled QUIC listener's fields; `tls` is its listener's TLS section.
    fn validate(&self, at: &At, tls: &TlsConfig) -> Result<(), Invalid> {
        if self.fleet_stateless_reset_key && self.stateless_reset_key_file.is_some() {
            return at
                .field("fleet_stateless_reset_key")
                .fail("the key from the fleet or from stateless_reset_key_file, not both");
        }
        if !["cubic", "reno", "bbr2"].contains(&self.congestion_control.as_str()) {
            return at.field("congestion_control").fail(format!(
                "{:?}: expected \"cubic\", \"reno\" or \"bbr2\"",
                self.congestion_control
            ));
        }
        if self.max_pending_handshakes == 0 {
            return at.field("max_pending_handshakes").fail("at least 1");
        }
        if !(2..=1000).contains(&self.initial_congestion_window) {
            return at.field("initial_congestion_window").fail(format!(
                "{}: expected 2..=1000 packets",
                self.initial_congestion_window
            ));
        }
        if !(1..=1000).contains(&self.ack_eliciting_threshold) {
            return at.field("ack_eliciting_threshold").fail(format!(
                "{}: expected 1..=1000 packets",
                self.ack_eliciting_threshold
            ));
        }
        if !(1200..=65527).contains(&self.max_udp_payload()) {
            return at.field("max_udp_payload").fail(format!(
                "{}: expected 1200..=65527 bytes",
                self.max_udp_payload()
            ));
        }
        if !tls.versions.contains(&TlsVersion::Tls13) {
            return at
                .field("enabled")
                .fail("QUIC needs TLS 1.3 in tls.versions");
        }
        if let Some(lb) = &self.lb {
            if let Err(e) = lb.build() {
                return at.field("lb").fail(e);
            }
        }
        Ok(())
    }
}
