//! Gateway metrics. Names and labels are a documented interface (README, "Metrics").

use keyengine::metrics::{Families, Kind, MetricFamily};
use prometheus::core::{Collector, Desc};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use std::sync::{Arc, Mutex};
use tokio_quiche::quic::RetryGate;

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub handshakes: IntCounterVec,
    pub handshake_errors: IntCounterVec,
    pub handshake_seconds: HistogramVec,
    pub requests: IntCounterVec,
    /// Requests of routes with a traffic split, by route and the cluster chosen.
    pub split_requests: IntCounterVec,
    pub upstream_seconds: HistogramVec,
    pub upstream_errors: IntCounterVec,
    pub upstream_in_flight: IntGaugeVec,
    pub upstream_healthy: IntGaugeVec,
    /// Endpoints ejected by outlier detection, by cluster, endpoint and reason.
    pub upstream_ejections: IntCounterVec,
    pub upstream_retries: IntCounterVec,
    pub upstream_retries_refused: IntCounterVec,
    pub mirror_requests: IntCounterVec,
    pub fleet_redis_seconds: prometheus::Histogram,
    pub fleet_redis_errors: IntCounterVec,
    pub fleet_limit_decisions: IntCounterVec,
    pub early_data_checks: IntCounterVec,
    /// Upstream responses whose client left (or cancelled the stream) before their end.
    pub responses_abandoned: IntCounterVec,
    pub denied_connections: IntCounterVec,
    /// Connections turned away for opening faster than `limits.new_connections_per_address`.
    pub rate_limited_connections: IntCounterVec,
    /// Connections closed because their client held `limits.max_connections_per_address`.
    pub over_share_connections: IntCounterVec,
    /// Configuration reloads (SIGHUP), by result: `ok` or `error` (the configuration in
    /// force kept whole).
    pub config_reloads: IntCounterVec,
    pub open_connections: IntGaugeVec,
    pub rejected_connections: IntCounterVec,
    /// Connections the gateway closed for what the client did or did not do (`reason`:
    /// `no_request`, `idle`, `control_flood`).
    pub closed_connections: IntCounterVec,
    /// Overload actions in force (1) or not (0), by `action`.
    pub overload_active: IntGaugeVec,
    /// Times each overload action turned on.
    pub overload_actions: IntCounterVec,
    /// The process's resident memory at the overload manager's last reading.
    pub process_memory: prometheus::IntGauge,
    pub quic_connections: IntCounterVec,
    pub early_data_accepted: prometheus::IntCounter,
    /// Requests answered 421: their host has other client-certificate settings than the name
    /// their connection was made for.
    pub misdirected_requests: prometheus::IntCounter,
    pub early_data_rejected: prometheus::IntCounter,
    pub quic_handshakes: IntCounterVec,
    pub quic_packets: IntCounterVec,
    pub quic_path_migrations: IntCounterVec,
    pub quic_path_mtu: HistogramVec,
    pub quic_open_streams: IntGaugeVec,
    retry_gates: RetryGates,
}

/// A listener's name and its Retry gate.
type ListenerGate = (String, Arc<RetryGate>);

/// The QUIC listeners' Retry gates (tokio-quiche counts pending handshakes and Retries sent),
/// read at scrape time.
#[derive(Clone)]
struct RetryGates {
    gates: Arc<Mutex<Vec<ListenerGate>>>,
    pending: IntGaugeVec,
    retries: IntCounterVec,
}

impl RetryGates {
    fn new() -> Self {
        RetryGates {
            gates: Default::default(),
            pending: IntGaugeVec::new(
                Opts::new(
                    "rampart_quic_handshakes_pending",
                    "QUIC handshakes accepted and not yet complete, per listener with Retry configured",
                ),
                &["listener"],
            )
            .unwrap(),
            retries: IntCounterVec::new(
                Opts::new(
                    "rampart_quic_retries_total",
                    "Retry packets sent (address validation), per listener",
                ),
                &["listener"],
            )
            .unwrap(),
        }
    }
}

impl Collector for RetryGates {
    fn desc(&self) -> Vec<&Desc> {
        self.pending
            .desc()
            .into_iter()
            .chain(self.retries.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        self.pending.reset();
        self.retries.reset();
        for (listener, gate) in gates.iter() {
            self.pending
                .with_label_values(&[listener])
                .set(gate.pending() as i64);
            self.retries
                .with_label_values(&[listener])
                .inc_by(gate.retries_sent());
        }
        let mut out = self.pending.collect();
        out.extend(self.retries.collect());
        out
    }
}

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let m = Metrics {
            handshakes: IntCounterVec::new(
                Opts::new("rampart_tls_handshakes_total", "Completed TLS handshakes"),
                &[
                    "listener",
                    "protocol",
                    "version",
                    "cipher",
                    "signature_algorithm",
                    "resumed",
                ],
            )
            .unwrap(),
            handshake_errors: IntCounterVec::new(
                Opts::new(
                    "rampart_tls_handshake_errors_total",
                    "Failed TLS handshakes by reason",
                ),
                &["listener", "reason"],
            )
            .unwrap(),
            handshake_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "rampart_tls_handshake_duration_seconds",
                    "From accepted connection to completed handshake",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["listener", "protocol", "resumed"],
            )
            .unwrap(),
            upstream_ejections: IntCounterVec::new(
                Opts::new(
                    "rampart_upstream_ejections_total",
                    "Endpoints ejected by outlier detection, by cluster, endpoint and reason",
                ),
                &["cluster", "endpoint", "reason"],
            )
            .unwrap(),
            upstream_retries: IntCounterVec::new(
                Opts::new(
                    "rampart_upstream_retries_total",
                    "Retries sent to another endpoint, by cluster and the failure retried",
                ),
                &["cluster", "reason"],
            )
            .unwrap(),
            upstream_retries_refused: IntCounterVec::new(
                Opts::new(
                    "rampart_upstream_retries_refused_total",
                    "Retries a route's policy asked for and the cluster's retry budget refused",
                ),
                &["cluster"],
            )
            .unwrap(),
            fleet_redis_seconds: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "rampart_fleet_redis_duration_seconds",
                    "Calls to the fleet's Redis, from sent to answered (or to the deadline)",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05,
                ]),
            )
            .unwrap(),
            fleet_redis_errors: IntCounterVec::new(
                Opts::new(
                    "rampart_fleet_redis_errors_total",
                    "Calls to the fleet's Redis without an answer, by kind (unavailable: not \
                     connected; timeout: past [fleet] deadline; error; connect: a failed \
                     connection attempt)",
                ),
                &["kind"],
            )
            .unwrap(),
            fleet_limit_decisions: IntCounterVec::new(
                Opts::new(
                    "rampart_fleet_limit_decisions_total",
                    "Fleet rate-limit decisions by route: allowed, limited, or by this gateway \
                     alone while Redis gave no answer (fallback_allowed, fallback_limited)",
                ),
                &["route", "decision"],
            )
            .unwrap(),
            early_data_checks: IntCounterVec::new(
                Opts::new(
                    "rampart_early_data_replay_checks_total",
                    "ClientHellos offering 0-RTT early data checked against the fleet's \
                     records, by listener (`NAME` over TCP, `NAME/quic`) and result (first: accepted; replay: seen before, \
                     early data rejected; unanswered: no answer from Redis, early data rejected)",
                ),
                &["listener", "result"],
            )
            .unwrap(),
            mirror_requests: IntCounterVec::new(
                Opts::new(
                    "rampart_mirror_requests_total",
                    "Requests copied to a route's shadow cluster, by route, cluster and result \
                     (answered, failed, skipped: body not read whole)",
                ),
                &["route", "cluster", "result"],
            )
            .unwrap(),
            split_requests: IntCounterVec::new(
                Opts::new(
                    "rampart_split_requests_total",
                    "Requests of routes with a traffic split, by route and the cluster chosen",
                ),
                &["route", "cluster"],
            )
            .unwrap(),
            requests: IntCounterVec::new(
                Opts::new(
                    "rampart_http_requests_total",
                    "Requests by route and response status",
                ),
                &["route", "status"],
            )
            .unwrap(),
            upstream_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "rampart_upstream_response_duration_seconds",
                    "From sending a request upstream to its response headers",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["cluster"],
            )
            .unwrap(),
            upstream_errors: IntCounterVec::new(
                Opts::new("rampart_upstream_errors_total", "Upstream failures by kind"),
                &["cluster", "kind"],
            )
            .unwrap(),
            upstream_in_flight: IntGaugeVec::new(
                Opts::new(
                    "rampart_upstream_requests_in_flight",
                    "Requests in flight to a cluster, from sending to the end of the response body",
                ),
                &["cluster"],
            )
            .unwrap(),
            upstream_healthy: IntGaugeVec::new(
                Opts::new(
                    "rampart_upstream_endpoint_healthy",
                    "1 while an endpoint passes its cluster's health checks (or has none), else 0",
                ),
                &["cluster", "endpoint"],
            )
            .unwrap(),
            denied_connections: IntCounterVec::new(
                Opts::new(
                    "rampart_connections_denied_total",
                    "Connections turned away by the listener's access list, before any handshake",
                ),
                &["listener"],
            )
            .unwrap(),
            rate_limited_connections: IntCounterVec::new(
                Opts::new(
                    "rampart_connections_rate_limited_total",
                    "Connections turned away before any handshake because their client address opened new ones faster than limits.new_connections_per_address",
                ),
                &["listener"],
            )
            .unwrap(),
            over_share_connections: IntCounterVec::new(
                Opts::new(
                    "rampart_connections_over_share_total",
                    "Connections closed before any handshake (QUIC: once it completes) because their client already held limits.max_connections_per_address",
                ),
                &["listener"],
            )
            .unwrap(),
            config_reloads: IntCounterVec::new(
                Opts::new(
                    "rampart_config_reloads_total",
                    "Certificate and key reloads (SIGHUP) by result; on error the certificates in force are kept",
                ),
                &["result"],
            )
            .unwrap(),
            responses_abandoned: IntCounterVec::new(
                Opts::new(
                    "rampart_http_responses_abandoned_total",
                    "Upstream responses the client left or cancelled before their end",
                ),
                &["listener"],
            )
            .unwrap(),
            open_connections: IntGaugeVec::new(
                Opts::new(
                    "rampart_open_connections",
                    "Client connections currently open",
                ),
                &["listener"],
            )
            .unwrap(),
            rejected_connections: IntCounterVec::new(
                Opts::new(
                    "rampart_connections_rejected_total",
                    "Connections closed at accept because the listener was at max_connections",
                ),
                &["listener"],
            )
            .unwrap(),
            closed_connections: IntCounterVec::new(
                Opts::new(
                    "rampart_connections_closed_total",
                    "Client connections the gateway closed: no request after the handshake, \
                     idle past the idle limit, or an HTTP/2 control-frame flood",
                ),
                &["listener", "reason"],
            )
            .unwrap(),
            overload_active: IntGaugeVec::new(
                Opts::new(
                    "rampart_overload_action_active",
                    "Overload actions in force (1) or not (0)",
                ),
                &["action"],
            )
            .unwrap(),
            overload_actions: IntCounterVec::new(
                Opts::new(
                    "rampart_overload_actions_total",
                    "Times each overload action turned on as memory crossed its share of server.overload.memory_limit_bytes",
                ),
                &["action"],
            )
            .unwrap(),
            process_memory: prometheus::IntGauge::new(
                "rampart_process_memory_bytes",
                "The gateway's resident memory at the overload manager's last reading",
            )
            .unwrap(),
            quic_connections: IntCounterVec::new(
                Opts::new(
                    "rampart_quic_connections_total",
                    "QUIC connections accepted, per listener and the worker that serves them",
                ),
                &["listener", "worker"],
            )
            .unwrap(),
            early_data_accepted: prometheus::IntCounter::new(
                "rampart_quic_early_data_requests_total",
                "Requests answered from 0-RTT early data (safe methods), over HTTP/3 and (with tls.early_data) TCP",
            )
            .unwrap(),
            misdirected_requests: prometheus::IntCounter::new(
                "rampart_http_misdirected_requests_total",
                "Requests answered 421: their host has other client-certificate settings than the name their connection was made for",
            )
            .unwrap(),
            early_data_rejected: prometheus::IntCounter::new(
                "rampart_quic_early_data_rejected_total",
                "Requests in 0-RTT early data refused with 425 Too Early (unsafe methods), over HTTP/3 and TCP",
            )
            .unwrap(),
            quic_handshakes: IntCounterVec::new(
                Opts::new(
                    "rampart_quic_handshakes_total",
                    "Completed QUIC handshakes by QUIC version, resumption and 0-RTT outcome (BoringSSL's early-data reason: accepted, peer_declined, no_session_offered, ticket_age_skew, ...)",
                ),
                &["listener", "version", "resumed", "early_data"],
            )
            .unwrap(),
            quic_packets: IntCounterVec::new(
                Opts::new(
                    "rampart_quic_packets_total",
                    "QUIC packets of closed connections by kind: sent, received, lost, spurious_lost (declared lost, then acknowledged), retransmitted",
                ),
                &["listener", "kind"],
            )
            .unwrap(),
            quic_path_migrations: IntCounterVec::new(
                Opts::new(
                    "rampart_quic_path_migrations_total",
                    "Network paths a closed QUIC connection used beyond its first (client migrations)",
                ),
                &["listener"],
            )
            .unwrap(),
            quic_path_mtu: HistogramVec::new(
                HistogramOpts::new(
                    "rampart_quic_path_mtu_bytes",
                    "Largest UDP payload a closed QUIC connection's active path carried (found by path MTU discovery, or the configured size without it)",
                )
                .buckets(vec![1200.0, 1280.0, 1350.0, 1400.0, 1452.0, 1500.0, 9000.0]),
                &["listener"],
            )
            .unwrap(),
            quic_open_streams: IntGaugeVec::new(
                Opts::new(
                    "rampart_quic_open_streams",
                    "HTTP/3 request streams being served",
                ),
                &["listener"],
            )
            .unwrap(),
            retry_gates: RetryGates::new(),
            registry,
        };
        m.registry
            .register(Box::new(m.retry_gates.clone()))
            .unwrap();
        for c in [&m.quic_handshakes, &m.quic_packets, &m.quic_path_migrations] {
            m.registry.register(Box::new(c.clone())).unwrap();
        }
        m.registry
            .register(Box::new(m.quic_open_streams.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.quic_connections.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.early_data_accepted.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.misdirected_requests.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.early_data_rejected.clone()))
            .unwrap();
        for c in [
            &m.handshakes,
            &m.handshake_errors,
            &m.requests,
            &m.upstream_errors,
            &m.responses_abandoned,
            &m.denied_connections,
            &m.rate_limited_connections,
            &m.over_share_connections,
            &m.config_reloads,
            &m.split_requests,
            &m.upstream_ejections,
            &m.upstream_retries,
            &m.upstream_retries_refused,
            &m.mirror_requests,
            &m.fleet_redis_errors,
            &m.fleet_limit_decisions,
            &m.early_data_checks,
            &m.rejected_connections,
            &m.closed_connections,
            &m.overload_actions,
        ] {
            m.registry.register(Box::new(c.clone())).unwrap();
        }
        m.registry
            .register(Box::new(m.fleet_redis_seconds.clone()))
            .unwrap();
        for h in [&m.handshake_seconds, &m.upstream_seconds, &m.quic_path_mtu] {
            m.registry.register(Box::new(h.clone())).unwrap();
        }
        m.registry
            .register(Box::new(m.open_connections.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.overload_active.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.process_memory.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.upstream_in_flight.clone()))
            .unwrap();
        m.registry
            .register(Box::new(m.upstream_healthy.clone()))
            .unwrap();
        m
    }

    /// Exports a QUIC listener's pending handshakes and Retries sent.
    pub fn watch_retry_gate(&self, listener: &str, gate: Arc<RetryGate>) {
        let mut gates = self
            .retry_gates
            .gates
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        gates.retain(|(l, _)| l != listener);
        gates.push((listener.to_string(), gate));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.render_with(Vec::new())
    }

    /// [`Metrics::render`] with `extra` families (the key engines' own), encoded together.
    pub fn render_with(&self, extra: Vec<MetricFamily>) -> String {
        let mut families = Families::new();
        families.extend(self.registry.gather());
        if let Some(n) = udp_rcvbuf_errors() {
            families.single(
                Kind::Counter,
                "rampart_udp_receive_buffer_errors_total",
                "Datagrams the kernel dropped for a full UDP receive buffer since boot (all sockets; /proc/net/snmp RcvbufErrors)",
                n as f64,
            );
        }
        for (name, help, n) in [
            (
                "rampart_tls_ocsp_stale_total",
                "Handshakes whose certificate's OCSP response was stale (past nextUpdate, less a minute): none stapled",
                &crate::tls::ocsp::STALE,
            ),
            (
                "rampart_tls_ocsp_fetches_total",
                "OCSP responses fetched from certificates' responders that checked (ocsp_fetch)",
                &crate::tls::ocsp::FETCHED,
            ),
            (
                "rampart_tls_ocsp_fetch_errors_total",
                "OCSP fetches that failed or brought a response that did not check (the last good one stays until stale)",
                &crate::tls::ocsp::FETCH_ERRORS,
            ),
            (
                "rampart_tracing_spans_exported_total",
                "Spans the OTLP collector took ([tracing])",
                &crate::trace::otlp::EXPORTED,
            ),
            (
                "rampart_tracing_spans_dropped_total",
                "Spans dropped: the export queue full, or the collector failed or did not answer their batch in time",
                &crate::trace::otlp::DROPPED,
            ),
        ] {
            let n = n.load(std::sync::atomic::Ordering::Relaxed) as f64;
            families.single(Kind::Counter, name, help, n);
        }
        families.extend(extra);
        keyengine::metrics::encode(&families.into_vec())
    }
}

/// `RcvbufErrors` from the `Udp:` lines of /proc/net/snmp.
fn udp_rcvbuf_errors() -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let idx = names.split_whitespace().position(|n| n == "RcvbufErrors")?;
    values.split_whitespace().nth(idx)?.parse().ok()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Decrements a gauge when dropped: an open connection counted for exactly its lifetime.
pub struct GaugeGuard(prometheus::IntGauge);

impl GaugeGuard {
    pub fn new(g: prometheus::IntGauge) -> Self {
        g.inc();
        GaugeGuard(g)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The control plane's metrics, in the gateway's registry.
pub struct ControlMetrics {
    pub changes: IntCounterVec,
    pub apply_seconds: Histogram,
    pub connected: IntGauge,
    pub revision: IntGauge,
    pub objects: IntGaugeVec,
    pub refused: IntGauge,
}

impl ControlMetrics {
    /// Registered in `m`'s registry by a gateway with a control plane (one without shows none
    /// of these series).
    pub fn register(m: &Metrics) -> Self {
        let c = ControlMetrics {
            changes: IntCounterVec::new(
                Opts::new(
                    "rampart_control_changes_total",
                    "Control-plane object changes by kind and result (applied, refused)",
                ),
                &["kind", "result"],
            )
            .unwrap(),
            apply_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "rampart_control_apply_seconds",
                    "From a change's arrival from etcd to its configuration in force",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
                ]),
            )
            .unwrap(),
            connected: IntGauge::new(
                "rampart_control_etcd_connected",
                "1 while the gateway watches etcd, 0 while it cannot reach it",
            )
            .unwrap(),
            revision: IntGauge::new(
                "rampart_control_revision",
                "The etcd revision whose objects are in force",
            )
            .unwrap(),
            objects: IntGaugeVec::new(
                Opts::new(
                    "rampart_control_objects",
                    "Control-plane objects in force, by kind",
                ),
                &["kind"],
            )
            .unwrap(),
            refused: IntGauge::new(
                "rampart_control_objects_refused",
                "Objects in etcd refused now (invalid; their last good version, if any, in force)",
            )
            .unwrap(),
        };
        let r = &m.registry;
        let _ = r.register(Box::new(c.changes.clone()));
        let _ = r.register(Box::new(c.apply_seconds.clone()));
        let _ = r.register(Box::new(c.connected.clone()));
        let _ = r.register(Box::new(c.revision.clone()));
        let _ = r.register(Box::new(c.objects.clone()));
        let _ = r.register(Box::new(c.refused.clone()));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric the README documents is registered (a vector without series renders
    /// nothing, so each gets one here).
    #[test]
    fn every_documented_metric_is_registered() {
        let m = Metrics::new();
        m.handshakes
            .with_label_values(&["l", "tcp", "v", "c", "s", "r"])
            .inc();
        m.handshake_errors.with_label_values(&["l", "tls"]).inc();
        m.handshake_seconds
            .with_label_values(&["l", "tcp", "false"])
            .observe(0.1);
        m.requests.with_label_values(&["r", "200"]).inc();
        m.upstream_seconds.with_label_values(&["c"]).observe(0.1);
        m.upstream_errors.with_label_values(&["c", "connect"]).inc();
        m.open_connections.with_label_values(&["l"]).inc();
        m.rejected_connections.with_label_values(&["l"]).inc();
        m.closed_connections.with_label_values(&["l", "idle"]).inc();
        m.overload_active
            .with_label_values(&["stop_accepting"])
            .set(0);
        m.overload_actions
            .with_label_values(&["stop_accepting"])
            .inc();
        m.process_memory.set(1);
        m.early_data_accepted.inc();
        m.misdirected_requests.inc();
        m.quic_connections.with_label_values(&["l", "0"]).inc();
        m.quic_handshakes
            .with_label_values(&["l", "1", "false", "accepted"])
            .inc();
        m.quic_packets.with_label_values(&["l", "lost"]).inc();
        m.quic_path_migrations.with_label_values(&["l"]).inc();
        m.quic_path_mtu.with_label_values(&["l"]).observe(1452.0);
        m.quic_open_streams.with_label_values(&["l"]).inc();
        m.responses_abandoned.with_label_values(&["l"]).inc();
        m.denied_connections.with_label_values(&["l"]).inc();
        m.rate_limited_connections.with_label_values(&["l"]).inc();
        m.over_share_connections.with_label_values(&["l"]).inc();
        m.config_reloads.with_label_values(&["ok"]).inc();
        m.split_requests.with_label_values(&["r", "c"]).inc();
        m.upstream_retries.with_label_values(&["c", "reset"]).inc();
        m.upstream_retries_refused.with_label_values(&["c"]).inc();
        m.mirror_requests
            .with_label_values(&["r", "c", "answered"])
            .inc();
        m.early_data_checks
            .with_label_values(&["l", "replay"])
            .inc();
        m.fleet_redis_errors.with_label_values(&["timeout"]).inc();
        m.fleet_limit_decisions
            .with_label_values(&["r", "allowed"])
            .inc();
        m.upstream_ejections
            .with_label_values(&["c", "e", "consecutive_5xx"])
            .inc();
        m.upstream_in_flight.with_label_values(&["c"]).inc();
        m.upstream_healthy.with_label_values(&["c", "e"]).set(1);
        m.watch_retry_gate("l", RetryGate::always());
        let control = ControlMetrics::register(&m);
        control
            .changes
            .with_label_values(&["routes", "applied"])
            .inc();
        control.objects.with_label_values(&["routes"]).set(1);
        let engine = keyengine::EngineMetrics::new(&m.registry).unwrap();
        drop(engine);
        let waf = crate::policy::waf::Inspector::start(
            &crate::config::WafConfig {
                threads: 1,
                ..Default::default()
            },
            &m,
        )
        .unwrap();
        waf.touch_metrics();
        let text = m.render();
        let readme = include_str!("../../../../README.md");
        // The gateway's metrics table (key-server metrics are documented elsewhere).
        let section = readme.split("## Metrics").nth(1).unwrap_or_default();
        let section = section.split("\n## ").next().unwrap_or_default();
        let documented: Vec<&str> = section
            .split('`')
            .filter(|w| w.starts_with("rampart_") && !w.starts_with("rampart_keyengine"))
            .collect();
        assert!(documented.len() >= 8, "{documented:?}");
        for name in documented {
            // A series selector (`name{label="..."}`) names its metric before the brace.
            let name = name.split('{').next().unwrap_or(name);
            assert!(
                text.contains(name),
                "{name} is documented but not registered"
            );
        }
    }
}
