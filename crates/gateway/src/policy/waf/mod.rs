//! The web application firewall (`[waf]`, a route's `waf`): ModSecurity v3 with the OWASP
//! Core Rule Set ([`waf`] crate).
//!
//! - Rule sets are compiled once per profile (a route's settings and rule files) and shared by
//!   every route, worker and reload that asks for the same one.
//! - Inspections run on `[waf] threads` threads of their own behind a bounded queue, never on
//!   a thread that serves connections: a slow inspection delays its own request only. A full
//!   queue is overload: a blocking route answers 503, a detecting one passes the request
//!   uninspected; both are counted. One client may have at most `[waf] queue_per_client`
//!   requests waiting or in inspection (429 past it on a blocking route), so it cannot fill
//!   the queue for the others.
//! - Every match is a JSON line in the WAF log (rule id, message, matched variable's name,
//!   never the client's bytes) and counted by rule.
//! - With `response_headers` or `response_body`, a request's transaction stays open across
//!   the exchange for its response's phase 3 (status, headers) and phase 4 (the body's first
//!   `response_body_limit` bytes, of the route's media types, decoded from gzip or deflate
//!   where the upstream used one: [`codings`]).

pub mod codings;

use crate::config::{Config, WafConfig, WafMode};
use crate::ops::metrics::Metrics;
use anyhow::Context as _;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};
use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Instant, SystemTime};
use waf::RuleSet;

pub(crate) use codings::{accept_readable, CodedPrefix, Coding};

/// One request as the inspection threads receive it (owned: it crosses threads).
pub(crate) struct Input {
    pub client: SocketAddr,
    /// What the client's share of the queue is counted by (`ConnInfo::client_key`).
    pub client_key: std::net::IpAddr,
    pub method: String,
    /// Path and query as the client sent them.
    pub uri: String,
    pub http_version: &'static str,
    pub headers: http::HeaderMap,
    /// The `Host` ModSecurity sees when the request carried it in `:authority` (HTTP/2, 3).
    pub authority: Option<String>,
    /// The body's first chunks (at most the route's `body_limit` bytes), in their coding.
    pub body: CodedPrefix,
    /// Whether `body` is all of it.
    pub body_complete: bool,
    /// For the log: the request id and the route.
    pub request_id: String,
    pub route: String,
}

/// What the pipeline does with a request after its inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inspection {
    /// Nothing stopped it (in detect mode, whatever matched).
    Pass,
    /// A blocking route's rules stopped it: answer this status.
    Blocked(u16),
    /// It could not be inspected (the queue full, or ModSecurity failed): a blocking route
    /// refuses it with 503, a detecting one passes it on uninspected.
    Unavailable,
    /// Its client already has `[waf] queue_per_client` requests waiting or in inspection: a
    /// blocking route refuses it with 429, a detecting one passes it on uninspected.
    ClientShare,
}

/// A route's WAF: its compiled rules and how it acts on them.
pub struct RouteWaf {
    pub(crate) mode: WafMode,
    pub(crate) body_limit: u64,
    /// Whether a blocking route refuses a body past `body_limit` (413) instead of streaming
    /// the rest uninspected.
    pub(crate) refuse_past_limit: bool,
    /// Whether the response's headers are inspected too (phase 3).
    pub(crate) response_headers: bool,
    /// Which response bodies are read for phase 4, and how much of each (`None`: none): the
    /// compiled profile's own setting.
    response_body: Option<waf::ResponseBodies>,
    rules: Arc<RuleSet>,
    inspector: Arc<Inspector>,
}

impl std::fmt::Debug for RouteWaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteWaf")
            .field("mode", &self.mode)
            .field("body_limit", &self.body_limit)
            .field("rules", &self.rules.len())
            .finish()
    }
}

/// How much of a response's body its inspection reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyRead {
    /// Phase 3 only (the route reads no response bodies).
    HeadersOnly,
    /// Phase 4 without the body: its type is not one the route reads, or there is none (a
    /// switch of protocols, 204, 304).
    NotRead,
    /// Phase 4 without the body: it has a content coding the inspection cannot read through
    /// (`br`, `zstd`, codings stacked).
    Encoded,
    /// Phase 4 over at most `limit` of its first bytes as they arrive, decoded from `coding`
    /// (and then at most `limit` of those).
    UpTo { limit: u64, coding: Coding },
}

/// How much of a response with `status` and `headers` phase 4 reads under `rb`: bodies of the
/// route's media types in a coding it reads through, up to the limit.
fn read_under(
    rb: &waf::ResponseBodies,
    status: http::StatusCode,
    headers: &http::HeaderMap,
) -> BodyRead {
    let bodiless = status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED;
    let media_type = crate::http::headers::media_type(headers);
    if bodiless || !media_type.is_some_and(|t| rb.types.contains(&t)) {
        return BodyRead::NotRead;
    }
    match Coding::of_message(headers) {
        Some(coding) => BodyRead::UpTo {
            limit: rb.limit,
            coding,
        },
        None => BodyRead::Encoded,
    }
}

impl RouteWaf {
    /// Whether a request's transaction is kept for its response.
    fn keeps_transaction(&self) -> bool {
        self.response_headers || self.response_body.is_some()
    }

    /// Whether the route reads response bodies (phase 4), and so asks its upstream only for
    /// codings it reads through ([`accept_readable`]).
    pub(crate) fn reads_response_bodies(&self) -> bool {
        self.response_body.is_some()
    }

    /// How much of a response with `status` and `headers` its inspection reads.
    pub(crate) fn body_read(
        &self,
        status: http::StatusCode,
        headers: &http::HeaderMap,
    ) -> BodyRead {
        match &self.response_body {
            None => BodyRead::HeadersOnly,
            Some(rb) => read_under(rb, status, headers),
        }
    }

    /// Counts a `result` the pipeline decides (`encoded`, `too_large`, `response_partial`,
    /// `response_encoded`).
    pub(crate) fn count(&self, route: &str, result: &str) {
        self.inspector.count(route, result);
    }

    /// Inspects `input` on an inspection thread and says what to do with the request. With
    /// `response_headers` on, a request that may pass also gets its transaction back, for
    /// [`RouteWaf::inspect_response`]. Also says whether some of the body read went
    /// uninspected in decoding ([`CodedPrefix::decoded`]).
    pub(crate) async fn inspect(
        &self,
        input: Input,
    ) -> (Inspection, Option<PendingResponse>, bool) {
        let route = input.route.clone();
        let Some(share) = self.inspector.shares.take(input.client_key) else {
            self.inspector.count(&route, "client_share");
            return (Inspection::ClientShare, None, false);
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job::Request {
            rules: self.rules.clone(),
            mode: self.mode,
            keep: self.keeps_transaction(),
            input,
            reply,
            _share: share,
        };
        let verdict = match self.inspector.jobs.try_send(job) {
            Ok(()) => answer.await.ok(),
            Err(_) => {
                self.inspector.count(&route, "overloaded");
                return (Inspection::Unavailable, None, false);
            }
        };
        match verdict {
            Some(Ok((v, pending, cut))) => match (v.blocked, self.mode) {
                (Some(status), WafMode::Block) => (Inspection::Blocked(status), None, cut),
                _ => (Inspection::Pass, pending, cut),
            },
            // The error is counted and logged by the thread.
            Some(Err(())) | None => (Inspection::Unavailable, None, false),
        }
    }

    /// Runs the upstream's response status and headers through phase 3 of the transaction
    /// its request kept open, and with `body` (its first bytes, possibly none) phase 4, on an
    /// inspection thread. A response that cannot be inspected (overload, a ModSecurity
    /// error) is `Unavailable`: the phase passes it on (its request was inspected) and logs it.
    /// Also says whether some of `body` went uninspected in decoding
    /// ([`CodedPrefix::decoded`]).
    pub(crate) async fn inspect_response(
        &self,
        pending: PendingResponse,
        status: u16,
        headers: &http::HeaderMap,
        body: Option<CodedPrefix>,
    ) -> (Inspection, bool) {
        let route = pending.who.route.clone();
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job::Response {
            pending,
            status,
            headers: headers.clone(),
            body,
            reply,
        };
        if self.inspector.jobs.try_send(job).is_err() {
            self.inspector.count(&route, "response_overloaded");
            return (Inspection::Unavailable, false);
        }
        match answer.await {
            Ok(Ok((Some(status), cut))) if self.mode == WafMode::Block => {
                (Inspection::Blocked(status), cut)
            }
            Ok(Ok((_, cut))) => (Inspection::Pass, cut),
            Ok(Err(())) | Err(_) => (Inspection::Unavailable, false),
        }
    }

    /// Ends a kept transaction whose response never came (the exchange failed): its logging
    /// phase runs on an inspection thread, and its matches are logged. With the queue full it
    /// is freed here, unlogged.
    pub(crate) fn close(&self, pending: PendingResponse) {
        let _ = self.inspector.jobs.try_send(Job::Close { pending });
    }

    /// Counts a body larger than the route inspects.
    pub(crate) fn count_partial(&self, route: &str) {
        self.inspector
            .metrics
            .partial_bodies
            .with_label_values(&[route])
            .inc();
    }
}

/// Work for an inspection thread.
enum Job {
    /// A request through phases 1 and 2; with `keep`, its transaction kept for the response.
    Request {
        rules: Arc<RuleSet>,
        mode: WafMode,
        keep: bool,
        input: Input,
        reply: tokio::sync::oneshot::Sender<RequestReply>,
        /// The client's unit of `[waf] queue_per_client`, held until the job is done.
        _share: crate::policy::client_share::ClientShare,
    },
    /// A response's status and headers through phase 3, and with a body (its first bytes)
    /// phase 4; the reply is the status a disruptive rule asked for, if one did (Err:
    /// ModSecurity failed).
    Response {
        pending: PendingResponse,
        status: u16,
        headers: http::HeaderMap,
        body: Option<CodedPrefix>,
        /// The blocking status, if any, and whether decoding left some of the body unread.
        reply: tokio::sync::oneshot::Sender<Result<(Option<u16>, bool), ()>>,
    },
    /// A kept transaction whose response never came: its logging phase, then freed.
    Close { pending: PendingResponse },
}

/// The verdict, the transaction kept for the response, and whether decoding left some of the
/// body read uninspected.
type RequestReply = Result<(waf::Verdict, Option<PendingResponse>, bool), ()>;

/// A request's ModSecurity transaction kept open across the exchange (it holds its rule
/// set), with what the match log says about the request.
pub(crate) struct PendingResponse {
    open: waf::Open,
    mode: WafMode,
    /// The request's `1.1`, `2.0`, `3.0`: what the client is answered in.
    http_version: &'static str,
    who: Who,
}

/// The request a log line is about.
struct Who {
    request_id: String,
    route: String,
    client: SocketAddr,
    method: String,
    path: String,
}

/// The gateway's WAF: inspection threads, the match log, the metrics and the compiled rule
/// sets. Made at start from `[waf]` (its threads, queue and log stay until a restart).
pub struct Inspector {
    jobs: crossbeam_channel::Sender<Job>,
    /// What each client has waiting or in inspection (`[waf] queue_per_client`).
    shares: Arc<crate::policy::client_share::ClientShares>,
    metrics: WafMetrics,
    /// Compiled rule sets by their directives and the rule files' modification times (a
    /// changed file is compiled again at the next reload).
    compiled: Mutex<HashMap<RuleSetKey, Weak<RuleSet>>>,
}

/// A compiled rule set's directives and its files' modification times.
type RuleSetKey = (String, Vec<(PathBuf, Option<SystemTime>)>);

#[derive(Clone)]
struct WafMetrics {
    requests: IntCounterVec,
    matches: IntCounterVec,
    partial_bodies: IntCounterVec,
    seconds: Histogram,
}

/// Where match lines go.
enum Sink {
    Off,
    Stderr,
    File(std::io::BufWriter<std::fs::File>),
}

impl Inspector {
    /// Opens the match log, registers the metrics and starts the inspection threads (which
    /// sleep until a route with a `waf` sends them work; nothing loads ModSecurity until then).
    pub fn start(cfg: &WafConfig, metrics: &Metrics) -> anyhow::Result<Arc<Inspector>> {
        let sink = match cfg.log.as_str() {
            "off" => Sink::Off,
            "stderr" => Sink::Stderr,
            path => Sink::File(std::io::BufWriter::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("waf.log: cannot open {path}"))?,
            )),
        };
        let sink = Arc::new(Mutex::new(sink));
        let m = WafMetrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "rampart_waf_requests_total",
                    "Requests of routes with a WAF by result: pass, detected (matched, detect mode), blocked, overloaded (queue full), client_share (past [waf] queue_per_client), encoded (a request body in a coding other than gzip or deflate), too_large (past body_limit, body_past_limit = refuse), error; with response_headers or response_body also response_blocked, response_detected, response_overloaded, response_error; with response_body also response_partial (the body past response_body_limit or not decodable, its rest uninspected), response_encoded (a body in a coding other than gzip or deflate, not read)",
                ),
                &["route", "result"],
            )?,
            matches: IntCounterVec::new(
                Opts::new(
                    "rampart_waf_rule_matches_total",
                    "WAF rule matches by rule id",
                ),
                &["rule"],
            )?,
            partial_bodies: IntCounterVec::new(
                Opts::new(
                    "rampart_waf_partial_bodies_total",
                    "Request bodies larger than the route's waf.body_limit, or not decodable: the rest streamed upstream uninspected",
                ),
                &["route"],
            )?,
            seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "rampart_waf_inspection_seconds",
                    "Time an inspection thread spent on one request's phases 1 and 2",
                )
                .buckets(vec![
                    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1,
                ]),
            )?,
        };
        metrics.registry.register(Box::new(m.requests.clone()))?;
        metrics.registry.register(Box::new(m.matches.clone()))?;
        metrics
            .registry
            .register(Box::new(m.partial_bodies.clone()))?;
        metrics.registry.register(Box::new(m.seconds.clone()))?;
        let (jobs, queue) = crossbeam_channel::bounded::<Job>(cfg.queue);
        let threads = match cfg.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        for i in 0..threads {
            let (queue, sink, m) = (queue.clone(), sink.clone(), m.clone());
            std::thread::Builder::new()
                .name(format!("rampart-waf-{i}"))
                .spawn(move || {
                    // Ends when every sender (the Inspector) is gone.
                    while let Ok(job) = queue.recv() {
                        run(job, &sink, &m);
                    }
                })
                .context("waf: cannot start an inspection thread")?;
        }
        Ok(Arc::new(Inspector {
            jobs,
            shares: crate::policy::client_share::ClientShares::new(cfg.queue_per_client()),
            metrics: m,
            compiled: Mutex::new(HashMap::new()),
        }))
    }

    fn count(&self, route: &str, result: &str) {
        self.metrics
            .requests
            .with_label_values(&[route, result])
            .inc();
    }

    /// Every route's WAF, by route index (`None` for routes without one): rule sets compiled
    /// (or reused) from the Core Rule Set in `cfg.waf`. Fails, naming the route, when
    /// ModSecurity cannot be loaded or refuses the rules; nothing is put in force then.
    pub fn route_wafs(
        self: &Arc<Self>,
        cfg: &Config,
    ) -> anyhow::Result<Vec<Option<Arc<RouteWaf>>>> {
        let crs = cfg.waf.crs_paths();
        cfg.routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let Some(w) = &r.waf else { return Ok(None) };
                let profile = w.profile();
                let rules = self
                    .compile(&profile, &crs)
                    .with_context(|| format!("routes[{i}].waf ({})", r.effective_name()))?;
                Ok(Some(Arc::new(RouteWaf {
                    mode: w.mode,
                    body_limit: w.body_limit,
                    refuse_past_limit: w.mode == WafMode::Block
                        && w.body_past_limit == crate::config::BodyPastLimit::Refuse,
                    response_headers: w.response_headers,
                    response_body: profile.response_bodies,
                    rules,
                    inspector: self.clone(),
                })))
            })
            .collect()
    }

    fn compile(&self, profile: &waf::Profile, crs: &waf::CrsPaths) -> anyhow::Result<Arc<RuleSet>> {
        let directives = waf::crs_profile(profile, crs).map_err(anyhow::Error::msg)?;
        let stamps = [&crs.setup]
            .into_iter()
            .chain(&profile.extra_rules)
            .map(|p| {
                (
                    p.clone(),
                    std::fs::metadata(p).and_then(|m| m.modified()).ok(),
                )
            })
            .collect();
        let key = (directives, stamps);
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        compiled.retain(|_, w| w.strong_count() > 0);
        if let Some(r) = compiled.get(&key).and_then(Weak::upgrade) {
            return Ok(r);
        }
        let t = Instant::now();
        let rules = Arc::new(RuleSet::new(&key.0)?);
        tracing::info!(
            rules = rules.len(),
            took_ms = t.elapsed().as_millis() as u64,
            "waf: rule set compiled"
        );
        compiled.insert(key, Arc::downgrade(&rules));
        Ok(rules)
    }
}

#[cfg(test)]
impl Inspector {
    /// One sample in each WAF family, so that they render (the metrics table's test).
    pub(crate) fn touch_metrics(&self) {
        self.count("r", "pass");
        self.metrics.matches.with_label_values(&["942100"]).inc();
        self.metrics.partial_bodies.with_label_values(&["r"]).inc();
        self.metrics.seconds.observe(0.001);
    }
}

/// One job on an inspection thread: ModSecurity, the log lines, the counts, the reply.
fn run(job: Job, sink: &Mutex<Sink>, m: &WafMetrics) {
    match job {
        // The client's unit of its share is given back once the job is done.
        Job::Request {
            rules,
            mode,
            keep,
            input,
            reply,
            _share,
        } => {
            if reply.is_closed() {
                return; // the request is gone
            }
            let _ = reply.send(run_request(rules, mode, keep, input, sink, m));
        }
        Job::Response {
            pending,
            status,
            headers,
            body,
            reply,
        } => {
            if reply.is_closed() {
                run_close(pending, sink, m); // the request is gone: its logging phase only
                return;
            }
            // Decoded here, off the connection threads (at most the route's limit of it).
            let (body, cut) = match body.map(CodedPrefix::decoded) {
                Some((b, cut)) => (Some(b), cut),
                None => (None, false),
            };
            let response = (status, &headers, body.as_deref());
            let _ = reply.send(run_response(pending, response, sink, m).map(|v| (v, cut)));
        }
        Job::Close { pending } => run_close(pending, sink, m),
    }
}

/// Phases 1 and 2 of one request.
fn run_request(
    rules: Arc<RuleSet>,
    mode: WafMode,
    keep: bool,
    input: Input,
    sink: &Mutex<Sink>,
    m: &WafMetrics,
) -> RequestReply {
    let t = Instant::now();
    let (body, cut) = input.body.decoded();
    let body_complete = input.body_complete && !cut;
    let mut headers = header_pairs(&input.headers);
    if let (Some(a), false) = (
        &input.authority,
        input.headers.contains_key(http::header::HOST),
    ) {
        headers.push((b"host", a.as_bytes()));
    }
    let req = waf::Request {
        client: input.client,
        server: SocketAddr::from(([0, 0, 0, 0], 0)),
        method: &input.method,
        uri: &input.uri,
        http_version: input.http_version,
        headers,
        body: &body,
        body_complete,
    };
    let inspected = match keep {
        true => waf::inspect_keeping(&rules, &req),
        false => waf::inspect(&rules, &req).map(|v| (v, None)),
    };
    m.seconds.observe(t.elapsed().as_secs_f64());
    let who = Who {
        request_id: input.request_id,
        route: input.route,
        client: input.client,
        path: input.uri.split('?').next().unwrap_or("").to_string(),
        method: input.method,
    };
    let (verdict, open) = match inspected {
        Ok(v) => v,
        Err(e) => {
            m.requests.with_label_values(&[&who.route, "error"]).inc();
            tracing::error!(route = %who.route, request_id = %who.request_id, error = %e, "waf: inspection failed");
            return Err(());
        }
    };
    let result = match &verdict {
        v if v.blocked.is_some() && mode == WafMode::Block => "blocked",
        v if !v.matches.is_empty() => "detected",
        _ => "pass",
    };
    m.requests.with_label_values(&[&who.route, result]).inc();
    let body_fields = serde_json::json!({
        "body_inspected": body.len(),
        "body_complete": body_complete,
    });
    log_matches(
        sink,
        m,
        &who,
        "request",
        result == "blocked",
        &verdict.matches,
        body_fields,
    );
    let pending = open.map(|open| PendingResponse {
        open,
        mode,
        http_version: input.http_version,
        who,
    });
    Ok((verdict, pending, cut))
}

/// Phase 3, phase 4 with a body (its first bytes), and the logging phase of a response: the
/// status a disruptive rule asked for.
fn run_response(
    pending: PendingResponse,
    (status, headers, body): (u16, &http::HeaderMap, Option<&[u8]>),
    sink: &Mutex<Sink>,
    m: &WafMetrics,
) -> Result<Option<u16>, ()> {
    let PendingResponse {
        open,
        mode,
        http_version,
        who,
    } = pending;
    let resp = waf::Response {
        status,
        http_version,
        headers: header_pairs(headers),
        body,
    };
    let verdict = match waf::inspect_response(open, &resp) {
        Ok(v) => v,
        Err(e) => {
            m.requests
                .with_label_values(&[&who.route, "response_error"])
                .inc();
            tracing::error!(route = %who.route, request_id = %who.request_id, error = %e, "waf: response inspection failed");
            return Err(());
        }
    };
    let result = match &verdict {
        v if v.blocked.is_some() && mode == WafMode::Block => Some("response_blocked"),
        v if !v.matches.is_empty() => Some("response_detected"),
        _ => None, // counted with its request
    };
    if let Some(result) = result {
        m.requests.with_label_values(&[&who.route, result]).inc();
    }
    let status_field = match body {
        Some(b) => serde_json::json!({ "status": status, "body_inspected": b.len() }),
        None => serde_json::json!({ "status": status }),
    };
    let blocked = result == Some("response_blocked");
    log_matches(
        sink,
        m,
        &who,
        "response",
        blocked,
        &verdict.matches,
        status_field.clone(),
    );
    log_matches(
        sink,
        m,
        &who,
        "logging",
        false,
        &verdict.logging,
        status_field,
    );
    Ok(verdict.blocked)
}

/// The logging phase of a kept transaction whose response never came.
fn run_close(pending: PendingResponse, sink: &Mutex<Sink>, m: &WafMetrics) {
    let PendingResponse { open, who, .. } = pending;
    match waf::close(open) {
        Ok(logged) => log_matches(
            sink,
            m,
            &who,
            "logging",
            false,
            &logged,
            serde_json::json!({}),
        ),
        Err(e) => {
            tracing::error!(route = %who.route, request_id = %who.request_id, error = %e, "waf: closing a transaction failed");
        }
    }
}

/// Header pairs as ModSecurity takes them.
fn header_pairs(headers: &http::HeaderMap) -> Vec<(&[u8], &[u8])> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .collect()
}

/// Counts each match by rule and writes its JSON line: rule id, message, the matched
/// variable's name and severity, what was inspected (`extra`), never the client's bytes.
fn log_matches(
    sink: &Mutex<Sink>,
    m: &WafMetrics,
    who: &Who,
    phase: &str,
    blocked: bool,
    matches: &[waf::Match],
    extra: serde_json::Value,
) {
    let action = if blocked { "blocked" } else { "logged" };
    let mut lines = String::new();
    for hit in matches {
        m.matches.with_label_values(&[&hit.id.to_string()]).inc();
        let mut line = serde_json::json!({
            "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            "request_id": who.request_id,
            "route": who.route,
            "client": who.client.ip().to_string(),
            "method": who.method,
            "path": who.path,
            "phase": phase,
            "action": action,
            "rule": hit.id,
            "msg": hit.msg,
            "variable": hit.variable,
            "severity": hit.severity,
        });
        if let (Some(line), Some(extra)) = (line.as_object_mut(), extra.as_object()) {
            line.extend(extra.clone());
        }
        lines.push_str(&line.to_string());
        lines.push('\n');
    }
    if !lines.is_empty() {
        let mut sink = sink.lock().unwrap_or_else(|e| e.into_inner());
        let _ = match &mut *sink {
            Sink::Off => Ok(()),
            Sink::Stderr => std::io::stderr().write_all(lines.as_bytes()),
            Sink::File(f) => f.write_all(lines.as_bytes()).and_then(|_| f.flush()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::{read_under, BodyRead, Coding};
    use http::{HeaderMap, StatusCode};

    #[test]
    fn only_bodies_of_the_routes_types_in_a_readable_coding_are_read() {
        let rb = waf::ResponseBodies {
            limit: 4096,
            types: vec!["text/html".into(), "application/json".into()],
        };
        let read = |status: u16, headers: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in headers {
                h.append(
                    http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            read_under(&rb, StatusCode::from_u16(status).unwrap(), &h)
        };
        let html = ("content-type", "Text/HTML; charset=utf-8");
        let up_to = |coding| BodyRead::UpTo {
            limit: 4096,
            coding,
        };
        assert_eq!(read(200, &[html]), up_to(Coding::Identity));
        assert_eq!(
            read(500, &[("content-type", "application/json")]),
            up_to(Coding::Identity)
        );
        assert_eq!(
            read(200, &[html, ("content-encoding", "identity")]),
            up_to(Coding::Identity)
        );
        assert_eq!(
            read(200, &[html, ("content-encoding", "gzip")]),
            up_to(Coding::Gzip)
        );
        assert_eq!(
            read(200, &[html, ("content-encoding", "br")]),
            BodyRead::Encoded
        );
        assert_eq!(
            read(
                200,
                &[
                    html,
                    ("content-encoding", "identity"),
                    ("content-encoding", "br")
                ]
            ),
            BodyRead::Encoded
        );
        for (status, headers) in [
            (200, vec![("content-type", "image/png")]),
            (200, vec![]),
            (204, vec![html]),
            (304, vec![html]),
            (101, vec![html]),
        ] {
            assert_eq!(
                read(status, &headers),
                BodyRead::NotRead,
                "{status} {headers:?}"
            );
        }
    }
}
