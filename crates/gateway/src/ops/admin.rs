//! The admin listener (loopback only): `/healthz` and `/metrics`.

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Produces the `/metrics` text.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

fn respond(req: &Request<Incoming>, render: &Render, draining: bool) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match req.uri().path() {
        "/healthz" if draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "draining\n".to_string(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/metrics" => (StatusCode::OK, "text/plain; version=0.0.4", render()),
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

pub async fn run(listener: TcpListener, render: Render, mut stop: watch::Receiver<bool>) {
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
            _ = stop.wait_for(|s| *s) => return,
        };
        let render = render.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let r = respond(&req, &render, *stop.borrow());
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
