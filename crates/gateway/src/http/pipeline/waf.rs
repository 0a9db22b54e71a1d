//! Phase: the route's web application firewall ([`crate::policy::waf`]): the request's
//! headers and the first `body_limit` bytes of its body inspected on an inspection thread;
//! a blocking route's verdict answers 403 with the request id, and a request it cannot have
//! inspected (overload) 503; a detecting route passes both on. The access log says which.
//! With `waf.response_headers`, [`inspect_response`] runs the upstream's status and headers
//! through the same transaction's phase 3; with `waf.response_body`, the first
//! `response_body_limit` bytes of its body too (phase 4), held until they are inspected and
//! then sent on ahead of the rest; such a route asks its upstream only for codings the
//! inspection reads through (see [`crate::policy::waf`]).

use super::forward::{client_body_failed, refuse_unread};
use super::{local, Fault, Outcome, Phase, RequestCtx};
use crate::body::{data_len, ClientBody};
use crate::config::WafMode;
use crate::http::router::Route;
use crate::policy::waf::{BodyRead, CodedPrefix, Coding, Input, Inspection, RouteWaf};
use crate::upstream::{Cluster, Exchange};
use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body::Frame;
use std::ops::ControlFlow;

/// Phase: inspects `req` when its route has a WAF; passes it on (its body whole again: the
/// frames read for inspection first, then the rest as it comes) or ends it. A body in gzip or
/// deflate is inspected decoded; one in a coding the WAF cannot read is refused with 415 on a
/// blocking route (the application might decode what the WAF could not see), and passed
/// uninspected on a detecting one. A body past the route's `body_limit` has its rest streamed
/// uninspected, or with `body_past_limit = "refuse"` on a blocking route is refused with 413.
pub(super) async fn inspect(
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    req: Request<ClientBody>,
) -> Phase<Request<ClientBody>> {
    let Some(waf) = &route.waf else {
        return ControlFlow::Continue(req);
    };
    let (parts, body) = req.into_parts();
    let read = read_body_prefix(ctx, route, waf, &parts.headers, body).await?;
    let (prefix, coding) = readable_prefix(ctx, route, waf, &parts.headers, read).await?;
    let mut body_complete = coding.is_some() && !prefix.past_limit;
    let input = Input {
        client: ctx.conn.client,
        client_key: ctx.conn.client_key,
        method: parts.method.to_string(),
        uri: parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string(),
        http_version: match parts.version {
            Version::HTTP_10 => "1.0",
            Version::HTTP_2 => "2.0",
            Version::HTTP_3 => "3.0",
            _ => "1.1",
        },
        headers: parts.headers.clone(),
        authority: parts.uri.authority().map(|a| a.to_string()),
        body: prefix.inspected,
        body_complete,
        request_id: ctx.request_id.clone(),
        route: route.name.clone(),
    };
    let (verdict, pending, cut) = waf.inspect(input).await;
    ctx.waf_response = pending;
    let body = crate::body::prefixed(prefix.frames, prefix.rest);
    if waf.refuse_past_limit && cut && verdict == Inspection::Pass {
        // Decoded past the limit (or not decodable): the rest could not be inspected.
        return ControlFlow::Break(refuse_past_limit(ctx, route, waf, body).await);
    }
    body_complete &= !cut;
    if !body_complete && coding.is_some() {
        waf.count_partial(&route.name);
    }
    if ctx.logging() {
        ctx.rec.waf = match (verdict, body_complete) {
            (Inspection::Blocked(_), _) => Some("blocked"),
            (Inspection::Unavailable, _) => Some("unavailable"),
            (Inspection::ClientShare, _) => Some("client_share"),
            (Inspection::Pass, _) if coding.is_none() => Some("encoded"),
            (Inspection::Pass, false) => Some("partial"),
            (Inspection::Pass, true) => Some("inspected"),
        };
    }
    let resp = match (verdict, waf.mode) {
        (Inspection::Pass, _)
        | (Inspection::Unavailable | Inspection::ClientShare, WafMode::Detect) => {
            return ControlFlow::Continue(Request::from_parts(parts, body))
        }
        (Inspection::Blocked(status), _) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
            // 403 from the anomaly evaluation; 400 for a body it could not parse.
            let how = match status {
                StatusCode::FORBIDDEN => "forbidden",
                _ => "refused",
            };
            local(
                status,
                format!(
                    "{how} by the web application firewall (request id {})\n",
                    ctx.request_id
                ),
            )
        }
        (Inspection::ClientShare, WafMode::Block) => try_again(
            StatusCode::TOO_MANY_REQUESTS,
            "too many of this client's requests are being inspected; try again\n",
        ),
        (Inspection::Unavailable, WafMode::Block) => try_again(
            StatusCode::SERVICE_UNAVAILABLE,
            "the web application firewall cannot inspect this request now; try again\n",
        ),
    };
    ControlFlow::Break(Outcome::Refused(
        refuse_unread(body, &ctx.progress, resp).await,
    ))
}

/// `status` with `msg` and `Retry-After: 1`: a request the WAF could not take now.
fn try_again(status: StatusCode, msg: &'static str) -> http::Response<crate::body::ResponseBody> {
    let mut r = local(status, msg);
    r.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    r
}

/// A request body's first part as read for inspection.
struct BodyPrefix {
    /// The frames read (they go upstream first).
    frames: Vec<Frame<Bytes>>,
    /// The rest of the body, unless it ended.
    rest: Option<ClientBody>,
    /// What the inspection reads: the first `body_limit` bytes of `frames`, in their coding.
    inspected: CodedPrefix,
    /// Whether the body ran past `body_limit` ([`ran_past`]).
    past_limit: bool,
}

/// Step: reads the body's first `body_limit` bytes (each frame within the listener's body
/// timeout). A route that refuses bodies past its limit refuses one here: at once when its
/// `Content-Length` says so, or once the limit's worth has been read.
async fn read_body_prefix(
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    waf: &RouteWaf,
    headers: &http::HeaderMap,
    body: ClientBody,
) -> Phase<BodyPrefix> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if waf.refuse_past_limit && declared.is_some_and(|n| n > waf.body_limit) {
        return ControlFlow::Break(refuse_past_limit(ctx, route, waf, body).await);
    }
    let read = read_prefix(body, waf.body_limit, ctx.shared.limits.body_timeout).await;
    let (frames, rest) = match read {
        Ok(r) => r,
        Err(timed_out) => return ControlFlow::Break(client_body_failed(timed_out)),
    };
    let prefix = BodyPrefix {
        inspected: CodedPrefix {
            parts: first_bytes(&frames, waf.body_limit),
            coding: Coding::Identity,
            limit: waf.body_limit,
        },
        past_limit: ran_past(&frames, rest.is_none(), waf.body_limit),
        frames,
        rest,
    };
    if waf.refuse_past_limit && prefix.past_limit {
        let body = crate::body::prefixed(prefix.frames, prefix.rest);
        return ControlFlow::Break(refuse_past_limit(ctx, route, waf, body).await);
    }
    ControlFlow::Continue(prefix)
}

/// Step: the body's coding, which the inspection decodes (gzip, deflate). In a coding it
/// cannot read, a blocking route refuses the request with 415, and a detecting one has it
/// inspected without its body (`None`); a coding named over no body hides nothing.
async fn readable_prefix(
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    waf: &RouteWaf,
    headers: &http::HeaderMap,
    mut prefix: BodyPrefix,
) -> Phase<(BodyPrefix, Option<Coding>)> {
    let empty = prefix.rest.is_none() && data_len(&prefix.frames) == 0;
    match Coding::of_message(headers) {
        Some(coding) => {
            prefix.inspected.coding = coding;
            ControlFlow::Continue((prefix, Some(coding)))
        }
        None if empty => ControlFlow::Continue((prefix, Some(Coding::Identity))),
        None => {
            waf.count(&route.name, "encoded");
            if waf.mode == WafMode::Detect {
                prefix.inspected = CodedPrefix::empty();
                return ControlFlow::Continue((prefix, None));
            }
            if ctx.logging() {
                ctx.rec.waf = Some("encoded");
            }
            let body = crate::body::prefixed(prefix.frames, prefix.rest);
            let resp = unreadable_coding(&ctx.request_id);
            ControlFlow::Break(Outcome::Refused(
                refuse_unread(body, &ctx.progress, resp).await,
            ))
        }
    }
}

/// Ends a request whose body is longer than its blocking route's WAF inspects, on a route
/// that refuses such bodies: 413, counted as `too_large`.
async fn refuse_past_limit(
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    waf: &RouteWaf,
    body: ClientBody,
) -> Outcome {
    waf.count(&route.name, "too_large");
    if ctx.logging() {
        ctx.rec.waf = Some("too_large");
    }
    let resp = local(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body longer than the web application firewall inspects ({} bytes; \
             request id {})\n",
            waf.body_limit, ctx.request_id
        ),
    );
    Outcome::Refused(refuse_unread(body, &ctx.progress, resp).await)
}

/// 415 for a request body in a content coding the WAF cannot read, naming the ones it can
/// (RFC 7694: `Accept-Encoding` on the response).
fn unreadable_coding(request_id: &str) -> http::Response<crate::body::ResponseBody> {
    let mut r = local(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!(
            "the web application firewall cannot read a request body in this content coding; \
             send it as gzip, deflate or uncoded (request id {request_id})\n"
        ),
    );
    r.headers_mut().insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("gzip, deflate"),
    );
    r
}

/// Reads frames of `body` until `limit` data bytes are in or it ends, each frame within
/// `timeout`. Returns the frames and, unless it ended, the rest. Err(true): the client
/// stalled; Err(false): its stream failed.
async fn read_prefix(
    mut body: ClientBody,
    limit: u64,
    timeout: std::time::Duration,
) -> Result<(Vec<Frame<Bytes>>, Option<ClientBody>), bool> {
    let (frames, ended) = read_frames(&mut body, limit, timeout).await?;
    Ok((frames, (!ended).then_some(body)))
}

/// Reads frames of `body` until `limit` data bytes are in or it ends, each frame within
/// `timeout`: the frames, and whether it ended. Err(true): it stalled; Err(false): its stream
/// failed.
async fn read_frames<B>(
    body: &mut B,
    limit: u64,
    timeout: std::time::Duration,
) -> Result<(Vec<Frame<Bytes>>, bool), bool>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    use http_body_util::BodyExt as _;
    let mut frames = Vec::new();
    let mut seen = 0u64;
    loop {
        if body.is_end_stream() {
            return Ok((frames, true));
        }
        if seen >= limit {
            return Ok((frames, false));
        }
        match tokio::time::timeout(timeout, body.frame()).await {
            Err(_) => return Err(true),
            Ok(Some(Ok(f))) => {
                seen += f.data_ref().map_or(0, |d| d.len() as u64);
                frames.push(f);
            }
            Ok(Some(Err(_))) => return Err(false),
            Ok(None) => return Ok((frames, true)),
        }
    }
}

/// Whether a body ran past `limit` in the `frames` read of it: more of it to come (it had not
/// `ended`), or the last frame read went over.
fn ran_past(frames: &[Frame<Bytes>], ended: bool, limit: u64) -> bool {
    !ended || data_len(frames) > limit
}

/// The first `limit` data bytes of `frames`, as the inspection reads them.
fn first_bytes(frames: &[Frame<Bytes>], limit: u64) -> Vec<Bytes> {
    let mut body = Vec::new();
    let mut left = usize::try_from(limit).unwrap_or(usize::MAX);
    for d in frames.iter().filter_map(Frame::data_ref) {
        let take = d.len().min(left);
        if take > 0 {
            body.push(d.slice(..take));
        }
        left -= take;
    }
    body
}

/// Phase: the upstream's response status and headers inspected (phase 3) in the transaction
/// its request kept open, when the route asks for it, and with `response_body` the first
/// bytes of its body (phase 4), read here (each frame within the cluster's `body_timeout`)
/// and returned to go out ahead of the rest. A blocking verdict replaces the response (its
/// body dropped, its upstream connection closed) with the status the rule asked for and the
/// request id.
pub(super) async fn inspect_response(
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    cluster: &Cluster,
    mut exchange: Exchange,
) -> Phase<(Exchange, Vec<Frame<Bytes>>)> {
    let (Some(waf), Some(pending)) = (&route.waf, ctx.waf_response.take()) else {
        return ControlFlow::Continue((exchange, Vec::new()));
    };
    let r = &mut exchange.response;
    let (mut read_ahead, mut body, mut note) = (Vec::new(), None, None);
    let mut past_limit = false;
    match waf.body_read(r.status(), r.headers()) {
        BodyRead::HeadersOnly => {}
        BodyRead::NotRead => body = Some(CodedPrefix::empty()),
        BodyRead::Encoded => {
            waf.count(&route.name, "response_encoded");
            (body, note) = (Some(CodedPrefix::empty()), Some("response_encoded"));
        }
        BodyRead::UpTo { limit, coding } => {
            match read_frames(r.body_mut(), limit, cluster.body_timeout).await {
                Ok((frames, all)) => {
                    let parts = first_bytes(&frames, limit);
                    body = Some(CodedPrefix {
                        parts,
                        coding,
                        limit,
                    });
                    past_limit = ran_past(&frames, all, limit);
                    read_ahead = frames;
                }
                Err(stalled) => {
                    // Nothing was sent yet: the client gets a whole error, not a cut body.
                    waf.close(pending);
                    cluster.body_errors.inc();
                    let why = if stalled {
                        "upstream response body stalled\n"
                    } else {
                        "upstream response body failed\n"
                    };
                    return ControlFlow::Break(Outcome::Failed {
                        fault: Fault::Upstream,
                        response: local(StatusCode::BAD_GATEWAY, why),
                    });
                }
            }
        }
    }
    let r = &exchange.response;
    let (verdict, cut) = waf
        .inspect_response(pending, r.status().as_u16(), r.headers(), body)
        .await;
    if (past_limit || cut) && verdict == Inspection::Pass {
        // Part of what goes out was not inspected: past the limit, or not decodable.
        waf.count(&route.name, "response_partial");
        note = Some("response_partial");
    }
    match verdict {
        Inspection::Blocked(status) => {
            if ctx.logging() {
                ctx.rec.waf = Some("response_blocked");
            }
            ControlFlow::Break(Outcome::Refused(local(
                StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
                format!(
                    "response withheld by the web application firewall (request id {})\n",
                    ctx.request_id
                ),
            )))
        }
        // A response's inspection is never refused for its client's share (its request
        // held that).
        Inspection::Unavailable | Inspection::ClientShare => {
            if ctx.logging() {
                ctx.rec.waf = Some("response_unavailable");
            }
            ControlFlow::Continue((exchange, read_ahead))
        }
        Inspection::Pass => {
            if let (Some(n), true) = (note, ctx.logging()) {
                ctx.rec.waf = Some(n);
            }
            ControlFlow::Continue((exchange, read_ahead))
        }
    }
}

/// After the phases: a transaction kept for a response that never came (the exchange failed
/// or was refused) gets its logging phase on an inspection thread.
pub(super) fn close_unanswered(ctx: &mut RequestCtx<'_>) {
    if let (Some(pending), Some(waf)) = (
        ctx.waf_response.take(),
        ctx.route.and_then(|r| r.waf.as_ref()),
    ) {
        waf.close(pending);
    }
}
