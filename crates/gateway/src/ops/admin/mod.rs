//! The admin listener: `/healthz` and `/metrics` for everyone on loopback, and on a gateway
//! the configuration API ([`api`]), behind a bearer token when one is set. Beyond loopback
//! (which the configuration allows only with a token and TLS) every path needs the token.

mod api;

pub use api::{Api, Token};

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

/// A plain-text response.
fn text(status: StatusCode, ctype: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    r
}

/// `/healthz` and `/metrics`; `None` for any other path.
fn open_paths(path: &str, render: &Render, draining: bool) -> Option<Response<Full<Bytes>>> {
    match path {
        "/healthz" if draining => Some(text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "draining\n".into(),
        )),
        "/healthz" => Some(text(StatusCode::OK, "text/plain", "ok\n".into())),
        "/metrics" => Some(text(StatusCode::OK, "text/plain; version=0.0.4", render())),
        _ => None,
    }
}

/// Serves `/healthz` and `/metrics` only (the key server's admin listener).
pub async fn run(listener: TcpListener, render: Render, stop: watch::Receiver<bool>) {
    serve(listener, render, None, None, stop).await
}

/// Serves `/healthz`, `/metrics` and the configuration API, over TLS with `tls`.
pub async fn run_with_api(
    listener: TcpListener,
    render: Render,
    api: Arc<Api>,
    tls: Option<Arc<boring::ssl::SslAcceptor>>,
    stop: watch::Receiver<bool>,
) {
    serve(listener, render, Some(api), tls, stop).await
}

/// The admin listener's TLS context from `[admin.tls]`.
pub fn tls_acceptor(
    cfg: &crate::config::AdminTlsConfig,
) -> Result<Arc<boring::ssl::SslAcceptor>, boring::error::ErrorStack> {
    use boring::ssl::{SslAcceptor, SslFiletype, SslMethod};
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls())?;
    b.set_certificate_chain_file(&cfg.cert)?;
    b.set_private_key_file(&cfg.key, SslFiletype::PEM)?;
    b.check_private_key()?;
    Ok(Arc::new(b.build()))
}

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn serve(
    listener: TcpListener,
    render: Render,
    api: Option<Arc<Api>>,
    tls: Option<Arc<boring::ssl::SslAcceptor>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
            _ = stop.wait_for(|s| *s) => return,
        };
        let render = render.clone();
        let stop = stop.clone();
        let api = api.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let draining = *stop.borrow();
                // Beyond loopback, /healthz and /metrics take the token too.
                let open_to_peer =
                    peer.ip().is_loopback() || api.as_ref().is_none_or(|a| a.admits(&req));
                let open = open_paths(req.uri().path(), &render, draining).filter(|_| open_to_peer);
                let api = api.clone();
                async move {
                    Ok::<_, Infallible>(match (open, api) {
                        (Some(r), _) => r,
                        (None, Some(api)) => api.handle(req).await,
                        (None, None) => text(
                            StatusCode::NOT_FOUND,
                            "text/plain",
                            "not found: try /healthz or /metrics\n".into(),
                        ),
                    })
                }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                None => {
                    let _ = http.serve_connection(TokioIo::new(tcp), svc).await;
                }
                Some(acceptor) => {
                    let accepted = tokio::time::timeout(
                        HANDSHAKE_TIMEOUT,
                        tokio_boring::accept(&acceptor, tcp),
                    )
                    .await;
                    if let Ok(Ok(stream)) = accepted {
                        let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
            }
        });
    }
}
