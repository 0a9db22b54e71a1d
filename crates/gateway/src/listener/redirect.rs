//! A plain-HTTP listener beside a TLS listener (`http_redirect`) that answers every request
//! with `308 Permanent Redirect` to the same host, path and query over HTTPS, so `http://`
//! links and typed addresses reach the gateway's TLS port. It reads request heads only (a
//! body is never read) and runs on the control-plane runtime.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves redirects to `https_port` until `stop` turns true.
pub async fn run(listener: TcpListener, https_port: u16, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "redirect listener: accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| async move {
                Ok::<_, Infallible>(redirect(&req, https_port))
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

/// The redirect for one request: to `https://HOST[:PORT]/path?query`, or 400 without a usable
/// `Host`.
fn redirect<B>(req: &Request<B>, https_port: u16) -> Response<Full<Bytes>> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok());
    let Some(host) = host else {
        return plain(StatusCode::BAD_REQUEST, "a Host header is required\n");
    };
    let port = match https_port {
        443 => String::new(),
        p => format!(":{p}"),
    };
    let path = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let location = format!("https://{}{port}{path}", host.host());
    let Ok(location) = HeaderValue::from_str(&location) else {
        return plain(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    let mut resp = plain(StatusCode::PERMANENT_REDIRECT, "redirecting to https\n");
    resp.headers_mut().insert(header::LOCATION, location);
    resp
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(host: Option<&str>, target: &str, port: u16) -> (u16, Option<String>) {
        let mut b = Request::get(target);
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        let resp = redirect(&b.body(()).unwrap(), port);
        let loc = resp
            .headers()
            .get(header::LOCATION)
            .map(|v| v.to_str().unwrap().to_string());
        (resp.status().as_u16(), loc)
    }

    #[test]
    fn keeps_host_path_and_query_and_names_the_port_unless_443() {
        let want = |s: &str| (308, Some(s.to_string()));
        assert_eq!(
            location(Some("example.com"), "/a/b?c=1", 443),
            want("https://example.com/a/b?c=1")
        );
        assert_eq!(
            location(Some("example.com:80"), "/", 8443),
            want("https://example.com:8443/")
        );
        assert_eq!(
            location(Some("[::1]:8080"), "/x", 443),
            want("https://[::1]/x")
        );
    }

    #[test]
    fn a_missing_or_bad_host_is_a_400() {
        assert_eq!(location(None, "/", 443).0, 400);
        assert_eq!(location(Some("bad host"), "/", 443).0, 400);
        assert_eq!(location(Some("a/b"), "/", 443).0, 400);
    }
}
