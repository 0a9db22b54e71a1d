//! The admin listener (loopback only): `/healthz` and `/metrics`.

use crate::metrics::Metrics;
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use tokio::net::TcpListener;
use tokio::sync::watch;

fn respond(req: &Request<Incoming>, metrics: &Metrics, draining: bool) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match req.uri().path() {
        "/healthz" if draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "draining\n".to_string(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /healthz or /metrics\n".to_string(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    r
}

pub async fn run(listener: TcpListener, metrics: Metrics, mut stop: watch::Receiver<bool>) {
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
            _ = stop.wait_for(|s| *s) => return,
        };
        let metrics = metrics.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let r = respond(&req, &metrics, *stop.borrow());
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
