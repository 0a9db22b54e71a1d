//! Body wrappers: request bodies streamed upstream under a size limit, and response bodies
//! that count bytes, tell how they ended and finish the access-log record then.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Any error a client body stream reports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client's request body as it arrives, whatever the protocol (HTTP/1.1 and HTTP/2 from
/// hyper, HTTP/3 from the QUIC driver).
pub type ClientBody = UnsyncBoxBody<Bytes, BoxError>;

/// Boxes a hyper body as a [`ClientBody`].
pub fn client_body<B>(b: B) -> ClientBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    UnsyncBoxBody::new(b.map_err(Into::into))
}

/// Why a request body stopped.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    #[error("request body exceeds the limit of {0} bytes")]
    TooLarge(u64),
    #[error("reading the request body: {0}")]
    Client(BoxError),
    #[error("no request body bytes for {0:?}")]
    Idle(std::time::Duration),
}

/// An idle timer over a body stream: it fires when no frame has come for its duration, and
/// restarts at each frame. Armed only while the stream is waited on.
struct IdleTimer {
    limit: std::time::Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl IdleTimer {
    fn new(limit: std::time::Duration) -> Self {
        IdleTimer { limit, sleep: None }
    }

    /// Called after each poll of the stream: a frame (or its end) restarts the wait; a
    /// Pending one checks it. True when the stream has been waited on past the limit.
    fn expired_after<T>(&mut self, polled: &Poll<T>, cx: &mut Context<'_>) -> bool {
        let limit = self.limit;
        if polled.is_ready() {
            if let Some(s) = self.sleep.as_mut() {
                s.as_mut().reset(tokio::time::Instant::now() + limit);
            }
            return false;
        }
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        sleep.as_mut().poll(cx).is_ready()
    }
}

/// Progress of a request body, shared with the request handler.
#[derive(Default)]
pub struct BodyProgress {
    pub bytes: AtomicU64,
    pub too_large: AtomicBool,
    /// The client's body stream failed (the client reset the stream or closed the connection
    /// mid-body): a failed upstream exchange is then the client's doing.
    pub client_failed: AtomicBool,
    /// The client sent no body bytes for `limits.body_timeout` (with `client_failed`).
    pub timed_out: AtomicBool,
    /// The client's body stream, parked here when the limit tripped, so the handler can read
    /// and discard a little more of it before answering 413 (a client still uploading would
    /// otherwise see its connection reset instead of the response).
    pub overflow: std::sync::Mutex<Option<ClientBody>>,
}

/// A client's request body on its way upstream: streamed, counted, limited.
pub struct RequestBody {
    inner: Option<ClientBody>,
    limit: u64,
    seen: u64,
    progress: Arc<BodyProgress>,
    /// The client's `limits.body_timeout`: a body that stalls longer fails, so a slow client
    /// cannot hold an upstream connection and slot.
    idle: Option<IdleTimer>,
}

impl RequestBody {
    pub fn new(inner: ClientBody, limit: u64, progress: Arc<BodyProgress>) -> Self {
        let inner = (!inner.is_end_stream()).then_some(inner);
        RequestBody {
            inner,
            limit,
            seen: 0,
            progress,
            idle: None,
        }
    }

    /// Fails the body when the client sends nothing for `limit` while it is read.
    pub fn idle_timeout(mut self, limit: std::time::Duration) -> Self {
        self.idle = Some(IdleTimer::new(limit));
        self
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Some(idle) = this.idle.as_mut() {
            if idle.expired_after(&polled, cx) {
                this.progress.client_failed.store(true, Ordering::Relaxed);
                this.progress.timed_out.store(true, Ordering::Relaxed);
                this.inner = None;
                return Poll::Ready(Some(Err(RequestBodyError::Idle(idle.limit))));
            }
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.seen += d.len() as u64;
                    this.progress.bytes.store(this.seen, Ordering::Relaxed);
                    if this.seen > this.limit {
                        this.progress.too_large.store(true, Ordering::Relaxed);
                        if let Ok(mut slot) = this.progress.overflow.lock() {
                            *slot = this.inner.take();
                        }
                        return Poll::Ready(Some(Err(RequestBodyError::TooLarge(this.limit))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.progress.client_failed.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(RequestBodyError::Client(e))))
            }
            Poll::Ready(None) => {
                this.inner = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

/// How a response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseEnd {
    /// Sent to its end.
    Complete,
    /// The upstream's body failed midway (its connection closed or broke the framing); the
    /// client's connection or stream was ended with an error, never as if the body were whole.
    UpstreamFailed,
    /// Dropped before its end without an upstream failure: the client went away or cancelled
    /// the stream, or the gateway closed the connection (shutdown).
    Abandoned,
}

impl ResponseEnd {
    /// The access log's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseEnd::Complete => "complete",
            ResponseEnd::UpstreamFailed => "upstream_error",
            ResponseEnd::Abandoned => "abandoned",
        }
    }
}

/// What an upstream response holds until its body ends (its pooled connection, its place
/// among the cluster's requests); the upstream module implements it, so bodies need not know
/// about pools.
pub(crate) trait UpstreamLease: Send + 'static {
    /// The body ended: `reusable` when it was read to its end, so the connection can serve
    /// another request; otherwise the connection is closed. Dropping a lease without calling
    /// this closes it too.
    fn end(self: Box<Self>, reusable: bool);
}

/// Called once when a response body is finished or dropped, with the bytes sent.
pub trait OnResponseDone: Send + 'static {
    fn done(self: Box<Self>, bytes_out: u64, end: ResponseEnd);
}

/// The counters an upstream response body adds to when it does not end whole.
pub struct EndCounters {
    /// `rampart_upstream_errors_total{cluster, kind="body"}`.
    pub upstream_failed: prometheus::IntCounter,
    /// `rampart_http_responses_abandoned_total{listener}`.
    pub abandoned: prometheus::IntCounter,
}

enum Source {
    Upstream(Incoming),
    Local(Full<Bytes>),
}

/// A response body going to the client: the upstream's stream or a local page.
pub struct ResponseBody {
    source: Source,
    /// The source's first frames, read ahead (to inspect them) and sent before the rest.
    read_ahead: std::collections::VecDeque<Frame<Bytes>>,
    bytes: u64,
    /// The upstream's body returned an error.
    failed: bool,
    on_done: Option<Box<dyn OnResponseDone>>,
    counters: Option<EndCounters>,
    /// The upstream connection (returned to its pool once this body has been read to its
    /// end) and the request's place among its cluster's `max_requests`.
    lease: Option<Box<dyn UpstreamLease>>,
    /// A request body kept alive (unread) until this response is done.
    _held: Option<RequestBody>,
    /// Compressing the body as it passes ([`ResponseBody::gzip`]).
    gzip: Option<Box<Gzipping>>,
    /// The cluster's `body_timeout` over the upstream's body.
    upstream_idle: Option<IdleTimer>,
    /// The request counted in flight on its client connection until this body is done.
    _active: Option<crate::listener::conn_timers::Active>,
}

/// A gzipped body's state: the stream, and the trailers held back until its last bytes are out.
#[derive(Default)]
struct Gzipping {
    stream: crate::http::compress::Gzip,
    trailers: Option<http::HeaderMap>,
}

impl ResponseBody {
    pub fn upstream(
        b: Incoming,
        lease: Option<Box<dyn UpstreamLease>>,
        counters: EndCounters,
    ) -> Self {
        ResponseBody {
            source: Source::Upstream(b),
            read_ahead: Default::default(),
            bytes: 0,
            failed: false,
            on_done: None,
            counters: Some(counters),
            lease,
            gzip: None,
            _held: None,
            upstream_idle: None,
            _active: None,
        }
    }

    pub fn local(b: impl Into<Bytes>) -> Self {
        ResponseBody {
            source: Source::Local(Full::new(b.into())),
            read_ahead: Default::default(),
            bytes: 0,
            failed: false,
            on_done: None,
            counters: None,
            lease: None,
            gzip: None,
            _held: None,
            upstream_idle: None,
            _active: None,
        }
    }

    /// Cuts the upstream's body (ending as an upstream failure) when it sends nothing for
    /// `limit` while the client waits for it.
    pub fn idle_timeout(mut self, limit: std::time::Duration) -> Self {
        self.upstream_idle = Some(IdleTimer::new(limit));
        self
    }

    /// Sends `frames`, read from the source ahead of time, before the rest of it.
    pub fn read_ahead(mut self, frames: Vec<Frame<Bytes>>) -> Self {
        self.read_ahead = frames.into();
        self
    }

    /// Keeps the request counted in flight on its connection until this body is done.
    pub fn while_active(mut self, active: crate::listener::conn_timers::Active) -> Self {
        self._active = Some(active);
        self
    }

    /// Keeps `body` alive until this response body is finished or dropped.
    pub fn holding(mut self, body: Option<RequestBody>) -> Self {
        self._held = body;
        self
    }

    /// Gzips the body as it passes (the caller has marked the headers: `compress::mark`).
    pub fn gzip(mut self) -> Self {
        self.gzip = Some(Box::default());
        self
    }

    pub fn on_done(mut self, f: Box<dyn OnResponseDone>) -> Self {
        self.on_done = Some(f);
        self
    }

    fn finish(&mut self, read_to_end: bool) {
        let end = if read_to_end || (!self.failed && self.is_end_stream()) {
            ResponseEnd::Complete
        } else if self.failed {
            ResponseEnd::UpstreamFailed
        } else {
            ResponseEnd::Abandoned
        };
        // An upstream body read to its end leaves the connection reusable; one abandoned
        // midway is closed by dropping it.
        if let Some(lease) = self.lease.take() {
            lease.end(end == ResponseEnd::Complete);
        }
        if let Some(c) = self.counters.take() {
            match end {
                ResponseEnd::Complete => {}
                ResponseEnd::UpstreamFailed => c.upstream_failed.inc(),
                ResponseEnd::Abandoned => c.abandoned.inc(),
            }
        }
        if let Some(f) = self.on_done.take() {
            f.done(self.bytes, end);
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.finish(false);
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let r = loop {
            let r = match &mut this.source {
                _ if !this.read_ahead.is_empty() => {
                    Poll::Ready(this.read_ahead.pop_front().map(Ok))
                }
                Source::Upstream(b) => {
                    let r = Pin::new(b).poll_frame(cx).map_err(BoxError::from);
                    let stalled = match this.upstream_idle.as_mut() {
                        Some(idle) => idle.expired_after(&r, cx).then_some(idle.limit),
                        None => None,
                    };
                    match stalled {
                        Some(limit) => {
                            let e = format!("no upstream body bytes for {limit:?}");
                            Poll::Ready(Some(Err(e.into())))
                        }
                        None => r,
                    }
                }
                Source::Local(b) => Pin::new(b).poll_frame(cx).map_err(|never| match never {}),
            };
            let Some(gz) = this.gzip.as_mut() else {
                break r;
            };
            // Gzipping: data in, compressed data out; at the end (or before trailers) the
            // stream's last bytes, then the trailers, then the end.
            break match r {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = gz.stream.chunk(&data);
                        if out.is_empty() {
                            continue;
                        }
                        Poll::Ready(Some(Ok(Frame::data(out))))
                    }
                    Err(frame) => {
                        gz.trailers = frame.into_trailers().ok();
                        Poll::Ready(Some(Ok(Frame::data(gz.stream.finish()))))
                    }
                },
                Poll::Ready(None) if !gz.stream.is_finished() => {
                    Poll::Ready(Some(Ok(Frame::data(gz.stream.finish()))))
                }
                Poll::Ready(None) => match gz.trailers.take() {
                    Some(t) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
                    None => Poll::Ready(None),
                },
                other => other,
            };
        };
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.bytes += d.len() as u64;
                }
            }
            Poll::Ready(None) => this.finish(true),
            Poll::Ready(Some(Err(_))) => this.failed = true,
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        let source_ended = self.read_ahead.is_empty()
            && match &self.source {
                Source::Upstream(b) => b.is_end_stream(),
                Source::Local(b) => b.is_end_stream(),
            };
        source_ended
            && self
                .gzip
                .as_ref()
                .is_none_or(|gz| gz.stream.is_finished() && gz.trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        if self.gzip.is_some() {
            return SizeHint::default();
        }
        let rest = match &self.source {
            Source::Upstream(b) => b.size_hint(),
            Source::Local(b) => b.size_hint(),
        };
        with_held(&self.read_ahead, rest)
    }
}

/// A request body whose first frames were already read (to inspect them): those frames, then
/// the rest as it arrives. Memory holds only what was read.
pub(crate) fn prefixed(frames: Vec<Frame<Bytes>>, rest: Option<ClientBody>) -> ClientBody {
    UnsyncBoxBody::new(Prefixed {
        frames: frames.into(),
        rest,
    })
}

struct Prefixed {
    frames: std::collections::VecDeque<Frame<Bytes>>,
    rest: Option<ClientBody>,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(f) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |r| r.size_hint());
        with_held(&self.frames, rest)
    }
}

/// How many data bytes `frames` hold (trailers hold none).
pub(crate) fn data_len<'a>(frames: impl IntoIterator<Item = &'a Frame<Bytes>>) -> u64 {
    frames
        .into_iter()
        .filter_map(Frame::data_ref)
        .map(|d| d.len() as u64)
        .sum()
}

/// The size of a body that sends `held` (frames already read from its source) before what
/// its source has left, sized `rest`.
fn with_held(held: &std::collections::VecDeque<Frame<Bytes>>, rest: SizeHint) -> SizeHint {
    let held = data_len(held);
    let mut hint = SizeHint::new();
    hint.set_lower(rest.lower() + held);
    if let Some(upper) = rest.upper() {
        hint.set_upper(upper + held);
    }
    hint
}

#[cfg(test)]
mod tests {
    use super::{ResponseBody, ResponseEnd};
    use bytes::Bytes;
    use http_body::{Body as _, Frame};
    use http_body_util::BodyExt as _;

    struct Ended(std::sync::mpsc::Sender<(u64, ResponseEnd)>);

    impl super::OnResponseDone for Ended {
        fn done(self: Box<Self>, bytes_out: u64, end: ResponseEnd) {
            let _ = self.0.send((bytes_out, end));
        }
    }

    #[tokio::test]
    async fn frames_read_ahead_go_out_first_and_count_in_the_size() {
        let (tx, rx) = std::sync::mpsc::channel();
        let ahead = vec![
            Frame::data(Bytes::from_static(b"first ")),
            Frame::data(Bytes::from_static(b"second ")),
        ];
        let body = ResponseBody::local("rest")
            .read_ahead(ahead)
            .on_done(Box::new(Ended(tx)));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(17));
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"first second rest");
        assert_eq!(rx.recv().unwrap(), (17, ResponseEnd::Complete));
        // Everything read ahead, nothing left: the body ends after those frames.
        let ahead = vec![Frame::data(Bytes::from_static(b"all"))];
        let body = ResponseBody::local(Bytes::new()).read_ahead(ahead);
        assert!(!body.is_end_stream());
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"all");
    }
}
