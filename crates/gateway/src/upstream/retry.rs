//! Sending a request to a cluster, trying again on other endpoints as the route's
//! [`RetryPolicy`] says and the cluster's retry budget allows.
//!
//! A try that failed before anything was sent (no connection) hands its request back whole,
//! so it can go again whatever its body. After a send, a request goes again only from a
//! [`RequestCopy`]: its head and a body read whole before the first try.
//!
//! The budget (Envoy's): retries in flight to a cluster, from every worker and route, may be
//! at most a share of its requests in flight, or a small minimum. When every endpoint fails,
//! retries therefore add at most that share to the load instead of multiplying it.

use super::{Cluster, Exchange, InFlight, Pick, RequestSlots, SendFailure, UpstreamError};
use crate::body::{ClientBody, RequestBody};
use crate::policy::retry::{RetryPolicy, TryFailure};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Uri, Version};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A request's head and whole body, from which it can be sent again (a retry) or copied (a
/// mirror).
pub struct RequestCopy {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    data: Vec<Bytes>,
    trailers: Option<HeaderMap>,
}

impl RequestCopy {
    /// A copy of the request `head` with the body `frames` (read whole).
    pub fn new(head: &http::request::Parts, frames: &[http_body::Frame<Bytes>]) -> Self {
        RequestCopy {
            method: head.method.clone(),
            uri: head.uri.clone(),
            version: head.version,
            headers: head.headers.clone(),
            data: frames
                .iter()
                .filter_map(|f| f.data_ref().cloned())
                .collect(),
            trailers: frames.iter().find_map(|f| f.trailers_ref().cloned()),
        }
    }

    /// The request, again.
    pub fn request(&self) -> Request<RequestBody> {
        let frames: Vec<Result<http_body::Frame<Bytes>, crate::body::BoxError>> = self
            .data
            .iter()
            .map(|d| Ok(http_body::Frame::data(d.clone())))
            .chain(
                self.trailers
                    .iter()
                    .map(|t| Ok(http_body::Frame::trailers(t.clone()))),
            )
            .collect();
        let body = ClientBody::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )));
        let mut req = Request::new(RequestBody::new(body, u64::MAX, Default::default()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        req
    }
}

/// How a request is retried: the route's policy and, when it has one, the request's copy.
pub struct Retry<'a> {
    pub policy: &'a RetryPolicy,
    pub copy: Option<&'a RequestCopy>,
    /// The request's trace: each try is a span of its own, named upstream as the parent.
    pub trace: Option<&'a crate::trace::RequestTrace>,
}

/// One retry's place in its cluster's retry budget, given back when dropped.
pub(super) struct RetryPermit(Arc<RequestSlots>);

impl Drop for RetryPermit {
    fn drop(&mut self) {
        self.0.retries_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RequestSlots {
    /// A place for one more retry in flight, if the budget has one: `percent` of the
    /// requests in flight, at least `min_concurrent`.
    pub(super) fn take_retry(self: &Arc<Self>) -> Option<RetryPermit> {
        let active = self.in_flight.load(Ordering::Relaxed) as f64;
        let percent = f64::from_bits(self.budget_percent.load(Ordering::Relaxed));
        let allowed =
            ((active * percent / 100.0) as usize).max(self.budget_min.load(Ordering::Relaxed));
        if self.retries_in_flight.fetch_add(1, Ordering::Relaxed) >= allowed {
            self.retries_in_flight.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(RetryPermit(self.clone()))
    }
}

/// The endpoints a request has tried, in order (at most the first try and ten retries).
#[derive(Default)]
struct Tried {
    ids: [usize; 11],
    len: usize,
}

impl Tried {
    fn push(&mut self, i: usize) {
        if self.len < self.ids.len() {
            self.ids[self.len] = i;
            self.len += 1;
        }
    }

    fn contains(&self, i: usize) -> bool {
        self.ids[..self.len].contains(&i)
    }
}

/// How one try failed.
pub(super) enum TryError {
    /// No connection: nothing was sent, and here is the request.
    NotSent(UpstreamError, Box<Request<RequestBody>>),
    /// The exchange failed (its unsent body, if any, inside).
    Failed(SendFailure),
}

impl TryError {
    /// The request's failure, when this try was its last (its slot given back now).
    fn into_failure(self) -> SendFailure {
        match self {
            TryError::NotSent(e, req) => SendFailure::with_body(e, *req),
            TryError::Failed(f) => f,
        }
    }

    fn failure(&self) -> TryFailure {
        match self {
            TryError::NotSent(..) => TryFailure::Connect,
            TryError::Failed(SendFailure {
                error: UpstreamError::Timeout(..),
                ..
            }) => TryFailure::Timeout,
            TryError::Failed(_) => TryFailure::Reset,
        }
    }
}

impl Cluster {
    /// Sends `req` (origin-form target) to an endpoint, and again to others (ones not tried
    /// yet, while there are) as `retry` says and the budget allows. The request slot is held
    /// across the tries. The last try's answer or failure is the request's; a failure's
    /// unread body comes back in the error (the caller keeps it until its error response is
    /// written).
    ///
    /// With `upgrade` (an HTTP/1.1 `Upgrade` request, such as a WebSocket handshake) the
    /// request goes over a new HTTP/1.1 connection that can be taken over, whatever the
    /// cluster's protocol, and that connection is never pooled; only a failed connect is
    /// retried.
    pub async fn send(
        &self,
        mut req: Request<RequestBody>,
        upgrade: bool,
        // The client's key (`ConnInfo::client_key`): its share of the slots, and what
        // balancing by client hashes.
        client: IpAddr,
        retry: Retry<'_>,
    ) -> Result<Exchange, SendFailure> {
        let slot = match self.slots.take(client) {
            Ok(s) => s,
            Err(no) => return Err(SendFailure::with_body(no.into(), req)),
        };
        let policy = retry.policy;
        let timeout = policy.per_try_timeout.unwrap_or(self.read_timeout);
        let mut tried = Tried::default();
        let mut permit = None;
        // The last try's outcome is the request's.
        macro_rules! finish {
            ($result:expr) => {
                $result
                    .map(|x| with_slot(x, slot, upgrade))
                    .map_err(TryError::into_failure)
            };
        }
        for n in 0.. {
            let pick = Pick {
                headers: req.headers(),
                client,
            };
            let i = self.pick(Some(&pick), |i| tried.contains(i));
            tried.push(i);
            let idempotent = req.method().is_idempotent();
            // Unsampled, the request's own span (set by the rewrite) stays the upstream's parent.
            let try_span = retry.trace.filter(|t| t.context.sampled).map(|t| {
                let ctx = t.child();
                req.headers_mut()
                    .insert(&crate::trace::TRACEPARENT, ctx.traceparent());
                (t, ctx, std::time::SystemTime::now())
            });
            // One try, written out here rather than awaited as a function of its own: each
            // level of awaited function is one more copy of its whole state per request.
            let result = match self.acquire_at(i, upgrade).await {
                Err(e) => Err(TryError::NotSent(e, Box::new(req))),
                Ok(conn) => {
                    let ep = &self.endpoints[i];
                    ep.in_flight.fetch_add(1, Ordering::Relaxed);
                    let _guard = InFlight(&ep.in_flight);
                    let outcome = tokio::time::timeout(timeout, self.exchange(ep, conn, req)).await;
                    self.record_try(i, &outcome);
                    match outcome {
                        Err(_) => Err(TryError::Failed(
                            UpstreamError::Timeout(ep.addr, timeout).into(),
                        )),
                        Ok(r) => r.map_err(TryError::Failed),
                    }
                }
            };
            drop(permit.take());
            if let Some((t, ctx, start)) = try_span {
                let status = match &result {
                    Ok(x) => Ok(x.response.status().as_u16()),
                    Err(e) => Err(e.failure().as_str()),
                };
                let endpoint = self.endpoints[i].addr;
                t.record(crate::trace::try_span(
                    ctx,
                    t.context.span_id,
                    start,
                    endpoint,
                    status,
                    n,
                ));
            }
            let failure = match &result {
                Ok(x) if policy.retries_status(x.response.status()) => {
                    Some(TryFailure::Status(x.response.status()))
                }
                Ok(_) => None,
                Err(e) => Some(e.failure()),
            };
            let again = failure.filter(|f| {
                n < policy.attempts
                    && policy.retries(*f, idempotent)
                    && (!upgrade || *f == TryFailure::Connect)
                    && (*f == TryFailure::Connect || retry.copy.is_some())
            });
            let Some(why) = again else {
                return finish!(result);
            };
            let Some(p) = self.slots.take_retry() else {
                self.retries_refused.inc();
                return finish!(result);
            };
            req = match (result, retry.copy) {
                (Err(TryError::NotSent(_, r)), _) => *r,
                (_, Some(copy)) => copy.request(),
                (other, None) => return finish!(other),
            };
            self.retries
                .with_label_values(&[&self.name, why.as_str()])
                .inc();
            tracing::debug!(cluster = %self.name, reason = why.as_str(), "retrying on another endpoint");
            let wait = policy.backoff(n + 1);
            if !wait.is_zero() {
                Box::pin(tokio::time::sleep(wait)).await;
            }
            permit = Some(p);
        }
        unreachable!("the loop returns")
    }

    /// Tells outlier detection how a try on endpoint `i` went: every answer, and every wait
    /// for one that timed out. A failed exchange may be the client's doing (its body broke
    /// off), so it is not held against the endpoint.
    fn record_try(
        &self,
        i: usize,
        outcome: &Result<Result<Exchange, SendFailure>, tokio::time::error::Elapsed>,
    ) {
        match outcome {
            Ok(Ok(x)) => self.health.record_response(i, x.response.status().as_u16()),
            Err(_) => self.health.record_exchange_failure(i),
            Ok(Err(_)) => {}
        }
    }
}

/// The request's answer from its last try, holding the request slot until its body ends (an
/// upgraded connection is never pooled).
fn with_slot(x: Exchange, slot: super::RequestSlot, upgrade: bool) -> Exchange {
    Exchange {
        slot: Some(slot),
        conn: if upgrade { None } else { x.conn },
        ..x
    }
}
