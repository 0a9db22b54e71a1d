//! Phase: the upstream's response checked and rewritten for the client. A switch of
//! protocols only to what was asked for (and, for an HTTP/2 WebSocket, with the matching
//! `Sec-WebSocket-Accept`), then the tunnel; no transfer coding the client would not see
//! declared; hop-by-hop headers out, `Via` in; gzip where the route and the client want it.

use super::checks::only_chunked;
use super::rewrite::{strip_hop_by_hop, ExchangePlan};
use super::{local, Fault, Outcome, RequestCtx};
use crate::body::{EndCounters, ResponseBody};
use crate::http::{compress, websocket};
use crate::upstream::{Cluster, Exchange};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body::Frame;

/// An upstream that broke the protocol in its answer: the upstream's fault, 502.
fn bad_answer(cluster: &Cluster, why: &'static str, msg: &'static str) -> Outcome {
    tracing::debug!(cluster = %cluster.name, "{why}");
    Outcome::Failed {
        fault: Fault::Upstream,
        response: local(StatusCode::BAD_GATEWAY, msg),
    }
}

/// Phase: the response (see the module's documentation). `read_ahead`: the first frames of
/// its body, already read (to inspect them), sent before the rest.
pub(super) fn response(
    ctx: &RequestCtx<'_>,
    cluster: &Cluster,
    (exchange, read_ahead): (Exchange, Vec<Frame<Bytes>>),
    plan: ExchangePlan,
) -> Outcome {
    let ExchangePlan {
        upgrade,
        client_upgrade,
        tunnel_active,
        gzip_for,
        websocket_key,
        via,
    } = plan;
    let mut response = exchange.response;
    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upstream_protocol = response.headers().get(header::UPGRADE).cloned();
    // A switch only to what was asked for: any other 101 would turn the connection into a
    // tunnel no rule sees.
    let asked = |p: &HeaderValue| {
        upgrade
            .as_ref()
            .is_some_and(|u| u.as_bytes().eq_ignore_ascii_case(p.as_bytes()))
    };
    if switched && !upstream_protocol.as_ref().is_some_and(asked) {
        return bad_answer(
            cluster,
            "upstream switched protocols unasked",
            "upstream switched protocols unasked\n",
        );
    }
    // An upstream's transfer coding other than chunked would reach the client undeclared
    // once hyper has removed the chunking.
    if !only_chunked(response.headers()) {
        return bad_answer(
            cluster,
            "upstream used a transfer coding other than chunked",
            "upstream transfer coding not supported\n",
        );
    }
    // RFC 9112 §6.3: with Transfer-Encoding, a Content-Length is wrong and must not be passed.
    if response.headers().contains_key(header::TRANSFER_ENCODING) {
        response.headers_mut().remove(header::CONTENT_LENGTH);
    }
    if let (true, Some(key)) = (switched, &websocket_key) {
        // Only the gateway saw the key it sent, so only it can check the upstream's answer.
        let accept = response.headers().get(header::SEC_WEBSOCKET_ACCEPT);
        if accept != Some(&websocket::accept_for(key)) {
            return bad_answer(
                cluster,
                "upstream answered a WebSocket upgrade without the matching Sec-WebSocket-Accept",
                "upstream WebSocket handshake failed\n",
            );
        }
    }
    if let (true, Some(client), Some(_)) = (switched, client_upgrade, &upstream_protocol) {
        let upstream = hyper::upgrade::on(&mut response);
        let idle = ctx.shared.limits.idle_timeout;
        ctx.shared.tunnels.spawn(async move {
            websocket::tunnel(client, upstream, idle).await;
            drop(tunnel_active);
        });
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let gzip =
        !switched && gzip_for.is_some_and(|m| compress::worth_it(&m, parts.status, &parts.headers));
    if gzip {
        compress::mark(&mut parts.headers);
    }
    match (switched, upstream_protocol) {
        // HTTP/2: the stream itself is the tunnel once answered 200 (RFC 8441 §5).
        (true, Some(_)) if websocket_key.is_some() => {
            parts.status = StatusCode::OK;
            parts.headers.remove(header::SEC_WEBSOCKET_ACCEPT);
        }
        (true, Some(protocol)) => {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol);
        }
        _ => {}
    }
    parts.headers.append(header::VIA, via);
    let body = ResponseBody::upstream(
        body,
        Some(Exchange::lease(exchange.conn, exchange.slot)),
        EndCounters {
            upstream_failed: cluster.body_errors.clone(),
            abandoned: ctx.shared.abandoned_responses.clone(),
        },
    )
    .idle_timeout(cluster.body_timeout)
    .read_ahead(read_ahead);
    let body = if gzip { body.gzip() } else { body };
    Outcome::Proxied(Response::from_parts(parts, body))
}
