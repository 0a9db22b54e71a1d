//! One request through ModSecurity's phases 1 (headers) and 2 (body), and optionally its
//! response's headers through phase 3 and its body through phase 4.

use crate::ffi::{self, Intervention};
use crate::log_line::{Collector, Match};
use crate::{RuleSet, WafError};
use std::ffi::{c_int, c_void, CString};
use std::net::SocketAddr;
use std::sync::Arc;

/// What ModSecurity sees of a request.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub client: SocketAddr,
    /// The gateway's address the request arrived on.
    pub server: SocketAddr,
    pub method: &'a str,
    /// The request target as the client sent it (path and query).
    pub uri: &'a str,
    /// `1.1`, `2.0` or `3.0`.
    pub http_version: &'a str,
    pub headers: Vec<(&'a [u8], &'a [u8])>,
    /// The body, or its first part (see [`Request::body_complete`]).
    pub body: &'a [u8],
    /// Whether `body` is all of it.
    pub body_complete: bool,
}

/// An inspection's result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The status a disruptive rule asked for (a blocking rule set's verdict); `None` when
    /// the request may pass (always, in detection-only mode).
    pub blocked: Option<u16>,
    /// Every rule that matched, in order.
    pub matches: Vec<Match>,
}

/// What ModSecurity sees of a response: its status line and headers (phase 3) and, when the
/// rule set reads response bodies, its body (phase 4).
#[derive(Debug, Clone)]
pub struct Response<'a> {
    pub status: u16,
    /// `1.1`, `2.0` or `3.0`, as [`Request::http_version`]: the protocol the client is
    /// answered in.
    pub http_version: &'a str,
    pub headers: Vec<(&'a [u8], &'a [u8])>,
    /// `None`: phase 3 only. `Some`: phase 4 too, over these bytes (the body, or its first
    /// part; empty for a body not read, so that phase 4's rules, such as the Core Rule Set's
    /// outbound anomaly evaluation, still run).
    pub body: Option<&'a [u8]>,
}

/// What a response's inspection found ([`inspect_response`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseVerdict {
    /// Phases 3 and 4: the status a disruptive rule asked for, and what matched there.
    pub blocked: Option<u16>,
    pub matches: Vec<Match>,
    /// The logging phase's matches (phase 5: the Core Rule Set's reports on the whole
    /// transaction, such as 980130, the inbound anomaly score in detection-only mode): about
    /// the request as much as the response.
    pub logging: Vec<Match>,
}

/// One transaction and the collector its log callback writes to, freed together whatever way
/// an inspection leaves. The collector is reached only through `matches`, the raw pointer
/// ModSecurity was given, so Rust and the callback use the same pointer.
struct Tx {
    t: *mut c_void,
    matches: *mut Collector,
    /// The rule set the transaction points into, kept at least as long.
    _rules: Arc<RuleSet>,
}

impl Tx {
    fn new(api: &ffi::Api, rules: &Arc<RuleSet>) -> Result<Self, WafError> {
        let matches = Box::into_raw(Box::<Collector>::default());
        // SAFETY: the instance is live for the process and the rule set for the transaction
        // (`_rules`); `matches` is a live collector until Drop, after the transaction is
        // freed, and the log callback writes it only during the calls this module makes.
        let t = unsafe { (api.new_transaction)(api.msc, rules.as_ptr(), matches.cast()) };
        let tx = Tx {
            t,
            matches,
            _rules: rules.clone(),
        };
        if t.is_null() {
            return Err(WafError::Transaction(
                "msc_new_transaction returned nothing".into(),
            ));
        }
        Ok(tx)
    }

    /// The matches collected so far; the collector starts again.
    fn take_matches(&mut self) -> Vec<Match> {
        // SAFETY: `matches` is live (freed only in Drop) and no ModSecurity call is running.
        std::mem::take(unsafe { &mut *self.matches })
    }

    /// The logging phase (5), then its matches.
    fn log(&mut self, api: &ffi::Api) -> Vec<Match> {
        let before = self.take_matches();
        debug_assert!(before.is_empty(), "matches left before the logging phase");
        // SAFETY: t is the live transaction.
        unsafe { (api.process_logging)(self.t) };
        self.take_matches()
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if !self.t.is_null() {
            if let Ok(api) = ffi::api() {
                // SAFETY: the transaction is live and freed once, here.
                unsafe { (api.transaction_cleanup)(self.t) };
            }
        }
        // SAFETY: made by Box::into_raw in Tx::new and freed once, here, after the
        // transaction whose callback could write it.
        drop(unsafe { Box::from_raw(self.matches) });
    }
}

/// A request's transaction kept open after phases 1 and 2 ([`inspect_keeping`]), for
/// [`inspect_response`] to run its response's headers through phase 3 with everything the
/// request phases collected (the anomaly scores among it), or for [`close`] when no response
/// came. It holds its rule set. Dropped unused, it is freed without its logging phase.
pub struct Open(Tx);

// SAFETY: a ModSecurity transaction belongs to no thread; `Open` is the only handle to it
// and to its collector, so it is used by one thread at a time, as connectors that hand a
// request between threads use it.
unsafe impl Send for Open {}
// SAFETY: nothing reaches the transaction or the collector through `&Open` (every use takes
// `Open` by value), so shared references to it cannot race.
unsafe impl Sync for Open {}

impl std::fmt::Debug for Open {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Open").finish_non_exhaustive()
    }
}

/// Runs `req` through `rules` on this thread (it may take a millisecond: call it where
/// blocking is fine). Stops at the first phase a disruptive rule ends; the verdict includes
/// the logging phase's matches.
pub fn inspect(rules: &Arc<RuleSet>, req: &Request<'_>) -> Result<Verdict, WafError> {
    inspect_request(rules, req, false).map(|(v, _)| v)
}

/// As [`inspect`], and when no rule stopped the request, keeps its transaction open (before
/// its logging phase) for [`inspect_response`] or [`close`].
pub fn inspect_keeping(
    rules: &Arc<RuleSet>,
    req: &Request<'_>,
) -> Result<(Verdict, Option<Open>), WafError> {
    inspect_request(rules, req, true)
}

/// Runs a response's status and headers through phase 3 of the transaction its request
/// opened, and its body (when given) through phase 4 unless phase 3 stopped it, then the
/// logging phase, and frees it. The verdict has only what matched from phase 3 on (the
/// request's matches were in its own verdict).
pub fn inspect_response(open: Open, resp: &Response<'_>) -> Result<ResponseVerdict, WafError> {
    let api = ffi::api()?;
    let Open(mut tx) = open;
    let protocol = CString::new(format!("HTTP/{}", resp.http_version))
        .map_err(|_| WafError::Transaction("the HTTP version holds a NUL byte".into()))?;
    for (name, value) in &resp.headers {
        // SAFETY: tx.t is the live transaction; the slices are valid for their lengths and
        // libmodsecurity copies them.
        unsafe {
            (api.add_n_response_header)(
                tx.t,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        };
    }
    // SAFETY: as above; `protocol` is NUL-terminated.
    unsafe { (api.process_response_headers)(tx.t, c_int::from(resp.status), protocol.as_ptr()) };
    let mut blocked = disruption(api, &mut tx);
    if let (None, Some(body)) = (blocked, resp.body) {
        if !body.is_empty() {
            // SAFETY: tx.t is the live transaction; the slice is valid for its length and
            // libmodsecurity copies it (up to SecResponseBodyLimit).
            unsafe { (api.append_response_body)(tx.t, body.as_ptr(), body.len()) };
        }
        // SAFETY: tx.t is the live transaction.
        unsafe { (api.process_response_body)(tx.t) };
        blocked = disruption(api, &mut tx);
    }
    let matches = tx.take_matches();
    let logging = tx.log(api);
    Ok(ResponseVerdict {
        blocked,
        matches,
        logging,
    })
}

/// Ends a kept transaction whose response never came (the exchange failed): its logging
/// phase, whose matches it returns, then frees it.
pub fn close(open: Open) -> Result<Vec<Match>, WafError> {
    let api = ffi::api()?;
    let Open(mut tx) = open;
    Ok(tx.log(api))
}

fn inspect_request(
    rules: &Arc<RuleSet>,
    req: &Request<'_>,
    keep: bool,
) -> Result<(Verdict, Option<Open>), WafError> {
    let api = ffi::api()?;
    let mut tx = Tx::new(api, rules)?;
    let t = tx.t;
    let cstr = |s: &str, what: &str| {
        CString::new(s).map_err(|_| WafError::Transaction(format!("the {what} holds a NUL byte")))
    };
    let blocked = (|| -> Result<Option<u16>, WafError> {
        let client = cstr(&req.client.ip().to_string(), "client address")?;
        let server = cstr(&req.server.ip().to_string(), "server address")?;
        // SAFETY (every call below): t is the live transaction `tx` owns, strings
        // NUL-terminated, slices valid for their lengths; libmodsecurity copies what it keeps.
        unsafe {
            (api.process_connection)(
                t,
                client.as_ptr(),
                c_int::from(req.client.port()),
                server.as_ptr(),
                c_int::from(req.server.port()),
            )
        };
        if let Some(s) = disruption(api, &mut tx) {
            return Ok(Some(s));
        }
        let uri = cstr(req.uri, "URI")?;
        let method = cstr(req.method, "method")?;
        let version = cstr(req.http_version, "HTTP version")?;
        // SAFETY: as above.
        unsafe { (api.process_uri)(t, uri.as_ptr(), method.as_ptr(), version.as_ptr()) };
        // Only the inspection says whether the body was cut (the client cannot).
        let partial = (!req.body_complete)
            .then_some((crate::profile::PARTIAL_BODY_HEADER.as_bytes(), &b"1"[..]));
        let headers = req
            .headers
            .iter()
            .copied()
            .filter(|(name, _)| {
                !name.eq_ignore_ascii_case(crate::profile::PARTIAL_BODY_HEADER.as_bytes())
            })
            .chain(partial);
        for (name, value) in headers {
            // SAFETY: as above.
            unsafe {
                (api.add_n_request_header)(
                    t,
                    name.as_ptr(),
                    name.len(),
                    value.as_ptr(),
                    value.len(),
                )
            };
        }
        // SAFETY: as above.
        unsafe { (api.process_request_headers)(t) };
        if let Some(s) = disruption(api, &mut tx) {
            return Ok(Some(s));
        }
        if !req.body.is_empty() {
            // SAFETY: as above.
            unsafe { (api.append_request_body)(t, req.body.as_ptr(), req.body.len()) };
        }
        // Phase 2 runs for every request: the Core Rule Set decides there (949110).
        // SAFETY: as above.
        unsafe { (api.process_request_body)(t) };
        Ok(disruption(api, &mut tx))
    })();
    let mut matches = tx.take_matches();
    if keep && matches!(blocked, Ok(None)) {
        // The logging phase waits for the response (or `close`).
        let verdict = Verdict {
            blocked: None,
            matches,
        };
        return Ok((verdict, Some(Open(tx))));
    }
    matches.extend(tx.log(api));
    drop(tx);
    Ok((
        Verdict {
            blocked: blocked?,
            matches,
        },
        None,
    ))
}

/// The status a disruptive intervention asks for, if one is pending; its rule (whose line
/// goes to the intervention, not the log callback) joins `matches`.
fn disruption(api: &ffi::Api, tx: &mut Tx) -> Option<u16> {
    let t = tx.t;
    let mut it = Intervention {
        status: 200,
        pause: 0,
        url: std::ptr::null_mut(),
        log: std::ptr::null_mut(),
        disruptive: 0,
    };
    // SAFETY: t is live; `it` is a valid intervention whose strings, if set, are malloc'd by
    // libmodsecurity and freed here.
    unsafe { (api.intervention)(t, &mut it) };
    if !it.log.is_null() {
        // SAFETY: a NUL-terminated string from libmodsecurity, freed below.
        let line = unsafe { std::ffi::CStr::from_ptr(it.log) }.to_string_lossy();
        if let Some(m) = crate::log_line::parse(&line) {
            // SAFETY: the collector is live and no ModSecurity call is running.
            let matches = unsafe { &mut *tx.matches };
            if !matches.contains(&m) {
                matches.push(m);
            }
        }
    }
    ffi::free_c_string(it.url);
    ffi::free_c_string(it.log);
    (it.disruptive != 0).then(|| {
        u16::try_from(it.status)
            .ok()
            .filter(|s| (400..600).contains(s))
            .unwrap_or(403)
    })
}
