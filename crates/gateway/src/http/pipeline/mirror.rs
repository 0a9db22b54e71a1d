//! Phase: request mirroring. A share of a route's requests is copied to its shadow cluster,
//! on a task of its own: the copy's answer is read and dropped, and nothing about it (slow,
//! failed, refused) reaches the original request. The copy's `Host` gets `-shadow` after the
//! host name, so the shadow's logs tell copies from real traffic.
//!
//! Only requests whose body was read whole (or that have none) are copied; a streamed body
//! cannot be read twice without holding it, so such a request is counted as skipped.

use super::RequestCtx;
use crate::http::router::{Mirror, Route};
use crate::policy::retry::RetryPolicy;
use crate::upstream::{Cluster, RequestCopy, Retry};
use http::HeaderValue;
use std::sync::{Arc, LazyLock};

/// Copies are tried once.
static ONCE: LazyLock<RetryPolicy> = LazyLock::new(|| {
    RetryPolicy::new(&crate::config::RetryConfig {
        attempts: 0,
        ..crate::config::RetryConfig::connect_only()
    })
});

/// Whether this request of `route` is to be mirrored (drawn against the mirror's share).
pub(super) fn chosen(route: &Route) -> Option<Mirror> {
    route
        .mirror
        .filter(|m| m.percent >= 100.0 || fastrand::f64() * 100.0 < m.percent)
}

/// Phase: sends a copy of the request (`copy`, `None` when its body streams) to the mirror's
/// cluster on a task of its own.
pub(super) fn send_copy(
    ctx: &RequestCtx<'_>,
    route: &Route,
    mirror: Mirror,
    copy: Option<&RequestCopy>,
) {
    let cluster: Arc<Cluster> = ctx.routing.clusters[mirror.cluster].clone();
    let counter = |result: &str| {
        ctx.shared.metrics.mirror_requests.with_label_values(&[
            route.name.as_str(),
            cluster.name.as_str(),
            result,
        ])
    };
    let Some(copy) = copy else {
        counter("skipped").inc();
        return;
    };
    let mut req = copy.request();
    shadow_host(req.headers_mut());
    let (answered, failed) = (counter("answered"), counter("failed"));
    let client = ctx.conn.client_key;
    tokio::spawn(async move {
        let retry = Retry {
            policy: &ONCE,
            copy: None,
            trace: None,
        };
        match cluster.send(req, false, client, retry).await {
            Ok(x) => {
                let read = drain(x.response.into_body(), cluster.body_timeout).await;
                if read {
                    if let Some(c) = x.conn {
                        c.release();
                    }
                }
                drop(x.slot);
                answered.inc();
            }
            Err(_) => failed.inc(),
        }
    });
}

/// `Host: name[:port]` becomes `name-shadow[:port]`.
fn shadow_host(h: &mut http::HeaderMap) {
    let Some(host) = h.get(http::header::HOST).and_then(|v| v.to_str().ok()) else {
        return;
    };
    // A bracketed IPv6 literal's colons are not a port's.
    let split = host
        .rfind(':')
        .filter(|&i| !host[i..].contains(']'))
        .unwrap_or(host.len());
    let shadow = format!("{}-shadow{}", &host[..split], &host[split..]);
    if let Ok(v) = HeaderValue::from_str(&shadow) {
        h.insert(http::header::HOST, v);
    }
}

/// Reads a response body to its end, each frame within `timeout`. Whether it ended.
async fn drain(mut body: hyper::body::Incoming, timeout: std::time::Duration) -> bool {
    use http_body_util::BodyExt;
    loop {
        match tokio::time::timeout(timeout, body.frame()).await {
            Ok(Some(Ok(_))) => {}
            Ok(None) => return true,
            Ok(Some(Err(_))) | Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_is_addressed_to_the_shadow_host() {
        for (host, want) in [
            ("www.example", "www.example-shadow"),
            ("www.example:8443", "www.example-shadow:8443"),
            ("[::1]:443", "[::1]-shadow:443"),
            ("[::1]", "[::1]-shadow"),
        ] {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::HOST, HeaderValue::from_static(host));
            shadow_host(&mut h);
            assert_eq!(h[http::header::HOST], want);
        }
    }
}
