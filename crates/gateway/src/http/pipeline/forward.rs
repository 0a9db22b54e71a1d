//! Phases: the request body (a small one read whole first), and the exchange with the
//! cluster, whose failures are mapped to a status and to whose fault they were.

use super::rewrite::{ExchangePlan, Prepared};
use super::{local, Fault, Outcome, Phase, RequestCtx};
use crate::body::{BodyProgress, ClientBody, RequestBody, ResponseBody};
use crate::config::LimitsConfig;
use crate::http::router::Route;
use crate::upstream::{Cluster, Exchange, RequestCopy, Retry, SendFailure, UpstreamError};
use futures_util::future::BoxFuture;
use http::{Request, Response, StatusCode};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Why a small body could not be buffered.
#[derive(PartialEq, Eq)]
enum BufferError {
    /// No bytes for `limits.body_timeout`.
    TimedOut,
    /// The client's stream failed (reset, closed).
    Client,
}

/// Phase: the request body. A body whose size is known and at most
/// `limits.buffer_body_bytes` is read whole before an upstream slot is taken (as nginx's
/// `client_body_buffer_size`), so a client trickling it holds no upstream connection or slot
/// while it does; a larger one streams, within `max_body_bytes` and `body_timeout`. A client
/// that stalls (408) or breaks off (400) ends the request as its fault.
///
/// With `keep_copy` (the route may retry after a send, or mirrors this request), a request
/// whose body was read whole (or that has none) is also copied, to be sent again.
pub(super) async fn buffer_body(
    ctx: &mut RequestCtx<'_>,
    prepared: Prepared,
    declared_len: Option<u64>,
    keep_copy: bool,
) -> Phase<(Request<RequestBody>, ExchangePlan, Option<Box<RequestCopy>>)> {
    let Prepared { parts, body, plan } = prepared;
    let limits = &ctx.shared.limits;
    let (body, copy) = match buffer_small_body(body, declared_len, limits).await {
        Ok(BodyRead::Whole(frames)) => {
            // Boxed: held across the exchange, it would otherwise enlarge every request's
            // future.
            let copy = keep_copy.then(|| Box::new(RequestCopy::new(&parts, &frames)));
            (whole_body(frames), copy)
        }
        Ok(BodyRead::Streaming(b)) => (b, None),
        Err(e) => {
            return ControlFlow::Break(client_body_failed(e == BufferError::TimedOut));
        }
    };
    let body = RequestBody::new(body, limits.max_body_bytes, ctx.progress.clone())
        .idle_timeout(limits.body_timeout);
    ControlFlow::Continue((Request::from_parts(parts, body), plan, copy))
}

/// A request body as [`buffer_small_body`] found it.
enum BodyRead {
    /// Read whole (no frames: there was none).
    Whole(Vec<http_body::Frame<bytes::Bytes>>),
    /// Too large or of unknown size: streamed as it comes.
    Streaming(ClientBody),
}

/// Reads `body` whole when its length (declared or known to the protocol) is at most
/// `limits.buffer_body_bytes`, each frame within `limits.body_timeout`; other bodies are
/// returned as they are, to be streamed.
async fn buffer_small_body(
    mut body: ClientBody,
    declared_len: Option<u64>,
    limits: &LimitsConfig,
) -> Result<BodyRead, BufferError> {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    if body.is_end_stream() {
        return Ok(BodyRead::Whole(Vec::new()));
    }
    let known = declared_len.or_else(|| body.size_hint().exact());
    if known.is_none_or(|n| n > limits.buffer_body_bytes) {
        return Ok(BodyRead::Streaming(body));
    }
    let mut frames = Vec::new();
    loop {
        match tokio::time::timeout(limits.body_timeout, body.frame()).await {
            Err(_) => return Err(BufferError::TimedOut),
            Ok(Some(Ok(f))) => frames.push(f),
            Ok(Some(Err(_))) => return Err(BufferError::Client),
            Ok(None) => break,
        }
    }
    Ok(BodyRead::Whole(frames))
}

/// A body of the frames read.
fn whole_body(frames: Vec<http_body::Frame<bytes::Bytes>>) -> ClientBody {
    if frames.is_empty() {
        return crate::body::client_body(http_body_util::Empty::<bytes::Bytes>::new());
    }
    let frames = futures_util::stream::iter(frames.into_iter().map(Ok::<_, crate::body::BoxError>));
    ClientBody::new(http_body_util::StreamBody::new(frames))
}

/// Phase: the exchange with the cluster (a slot, a connection, the request sent, the
/// response's head received), retried as the route says (from `copy`, when kept). Times the
/// upstream and notes which endpoint answered.
pub(super) async fn send(
    ctx: &mut RequestCtx<'_>,
    cluster: &Cluster,
    route: &Route,
    (req, copy): (Request<RequestBody>, Option<&RequestCopy>),
    upgrade: bool,
) -> Phase<Exchange> {
    let sent = Instant::now();
    let retry = Retry {
        policy: &route.retry,
        copy,
        trace: ctx.trace.as_ref(),
    };
    match cluster.send(req, upgrade, ctx.conn.client_key, retry).await {
        Ok(exchange) => {
            let upstream_time = sent.elapsed();
            ctx.upstream_time = Some(upstream_time);
            cluster
                .response_seconds
                .observe(upstream_time.as_secs_f64());
            ctx.rec.upstream = Some(exchange.endpoint);
            ControlFlow::Continue(exchange)
        }
        Err(failure) => ControlFlow::Break(failed(ctx, cluster, failure).await),
    }
}

/// A failed exchange's outcome. One the client's body broke (over the limit, stalled, gone
/// midway) is the client's fault, whatever error the upstream side saw; the rest are
/// counted by kind and mapped by [`upstream_failure`]. Boxed, as every rarely taken branch
/// that awaits is: its state would otherwise enlarge every request's future, which is moved
/// whole when a connection starts serving it.
fn failed<'a>(
    ctx: &'a RequestCtx<'_>,
    cluster: &'a Cluster,
    failure: SendFailure,
) -> BoxFuture<'a, Outcome> {
    Box::pin(async move {
        let e = failure.error;
        let progress = &ctx.progress;
        if progress.client_failed.load(Ordering::Relaxed) {
            tracing::debug!(cluster = %cluster.name, error = %e, "request body ended early");
            return client_body_failed(progress.timed_out.load(Ordering::Relaxed));
        }
        if progress.too_large.load(Ordering::Relaxed) {
            let parked = progress.overflow.lock().ok().and_then(|mut s| s.take());
            let unread = match parked {
                Some(b) => discard_body(RequestBody::new(b, u64::MAX, Default::default())).await,
                None => None,
            };
            let (parts, body) =
                local(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n").into_parts();
            return Outcome::Failed {
                fault: Fault::Client,
                response: Response::from_parts(parts, body.holding(unread)),
            };
        }
        ctx.shared
            .metrics
            .upstream_errors
            .with_label_values(&[&cluster.name, e.kind()])
            .inc();
        tracing::debug!(cluster = %cluster.name, error = %e, "upstream failed");
        let (fault, resp) = upstream_failure(&e);
        // Read and discard a small unread request body first (as nginx does): answering an
        // HTTP/2 stream whose upload is unfinished ends it with RST_STREAM, which some clients
        // report as an error instead of reading the response. A larger body is held until the
        // response is written, then dropped.
        let unread = match failure.unsent_body {
            Some(b) => discard_body(b).await,
            None => None,
        };
        let (parts, body) = resp.into_parts();
        Outcome::Failed {
            fault,
            response: Response::from_parts(parts, body.holding(unread)),
        }
    })
}

/// The status for an upstream-side failure, and whose fault it was.
fn upstream_failure(e: &UpstreamError) -> (Fault, Response<ResponseBody>) {
    match e {
        UpstreamError::Timeout(..) => (
            Fault::Upstream,
            local(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n"),
        ),
        UpstreamError::Connect(..) => (
            Fault::Upstream,
            local(StatusCode::BAD_GATEWAY, "upstream connect failed\n"),
        ),
        UpstreamError::Exchange(..) => (
            Fault::Upstream,
            local(StatusCode::BAD_GATEWAY, "upstream exchange failed\n"),
        ),
        UpstreamError::Overflow(_) => (
            Fault::Gateway,
            local(StatusCode::SERVICE_UNAVAILABLE, "upstream busy\n"),
        ),
        UpstreamError::ClientShare(_) => (
            Fault::Client,
            local(
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests in flight from this client\n",
            ),
        ),
    }
}

/// The answer to a request whose body the client stalled past `limits.body_timeout` (408)
/// or broke off (400).
pub(super) fn client_body_failed(timed_out: bool) -> Outcome {
    let response = if timed_out {
        local(StatusCode::REQUEST_TIMEOUT, "request body timed out\n")
    } else {
        local(StatusCode::BAD_REQUEST, "request body ended early\n")
    };
    Outcome::Failed {
        fault: Fault::Client,
        response,
    }
}

/// `resp` for a request whose body was not read: a little of it is read and dropped first,
/// the rest held until the response is written (see [`discard_body`]).
/// Boxed, as [`failed`] is.
pub(super) fn refuse_unread(
    body: ClientBody,
    progress: &Arc<BodyProgress>,
    resp: Response<ResponseBody>,
) -> BoxFuture<'static, Response<ResponseBody>> {
    let body = RequestBody::new(body, u64::MAX, progress.clone());
    Box::pin(async move {
        let unread = discard_body(body).await;
        let (parts, body) = resp.into_parts();
        Response::from_parts(parts, body.holding(unread))
    })
}

/// Reads and drops up to 64 KiB of a request body for at most one second. Returns the body
/// if it did not end within those bounds.
async fn discard_body(mut body: RequestBody) -> Option<RequestBody> {
    use http_body_util::BodyExt;
    const MAX: usize = 64 * 1024;
    let drained = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        let mut seen = 0;
        while seen <= MAX {
            match body.frame().await {
                Some(Ok(f)) => seen += f.data_ref().map_or(0, |d| d.len()),
                Some(Err(_)) | None => return true,
            }
        }
        false
    })
    .await;
    match drained {
        Ok(true) => None,
        _ => Some(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_failures_map_to_a_status_and_a_fault() {
        let at: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let cases = [
            (
                UpstreamError::Timeout(at, std::time::Duration::from_secs(1)),
                StatusCode::GATEWAY_TIMEOUT,
                Fault::Upstream,
            ),
            (
                UpstreamError::Connect(at, "refused".into()),
                StatusCode::BAD_GATEWAY,
                Fault::Upstream,
            ),
            (
                UpstreamError::Exchange(at, "reset".into()),
                StatusCode::BAD_GATEWAY,
                Fault::Upstream,
            ),
            (
                UpstreamError::Overflow(8),
                StatusCode::SERVICE_UNAVAILABLE,
                Fault::Gateway,
            ),
            (
                UpstreamError::ClientShare(2),
                StatusCode::TOO_MANY_REQUESTS,
                Fault::Client,
            ),
        ];
        for (e, status, fault) in cases {
            let (f, r) = upstream_failure(&e);
            assert_eq!((r.status(), f), (status, fault), "{e}");
        }
        let Outcome::Failed { fault, response } = client_body_failed(true) else {
            panic!("a failure");
        };
        assert_eq!(
            (fault, response.status()),
            (Fault::Client, StatusCode::REQUEST_TIMEOUT)
        );
    }

    #[tokio::test]
    async fn a_small_body_is_read_whole_and_a_stalled_one_times_out() {
        let limits = LimitsConfig {
            body_timeout: std::time::Duration::from_millis(50),
            ..LimitsConfig::default()
        };
        let full =
            crate::body::client_body(http_body_util::Full::new(bytes::Bytes::from_static(b"hi")));
        assert!(matches!(
            buffer_small_body(full, Some(2), &limits).await,
            Ok(BodyRead::Whole(f)) if f.len() == 1
        ));
        // Declared 10 bytes, none arrive.
        let never = futures_util::stream::pending::<
            Result<http_body::Frame<bytes::Bytes>, crate::body::BoxError>,
        >();
        let stalled = ClientBody::new(http_body_util::StreamBody::new(never));
        let r = buffer_small_body(stalled, Some(10), &limits).await;
        assert!(r.err() == Some(BufferError::TimedOut));
    }
}
