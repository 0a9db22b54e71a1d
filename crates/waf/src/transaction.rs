//! One request through ModSecurity's phases 1 (headers) and 2 (body), and optionally its
//! response's headers through phase 3.

use crate::ffi::{self, Intervention};
use crate::log_line::{Collector, Match};
use crate::{RuleSet, WafError};
use std::ffi::{c_int, c_void, CString};
use std::net::SocketAddr;

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

/// What ModSecurity sees of a response (phase 3: its status line and headers).
#[derive(Debug, Clone)]
pub struct Response<'a> {
    pub status: u16,
    /// `HTTP/1.1`, `HTTP/2.0` or `HTTP/3.0`: the protocol the client is answered in.
    pub protocol: &'a str,
    pub headers: Vec<(&'a [u8], &'a [u8])>,
}

/// Frees the transaction whatever way `inspect` leaves.
struct Transaction(*mut c_void);

/// A request's transaction kept open after phases 1 and 2 ([`inspect_keeping`]), for
/// [`inspect_response`] to run its response's headers through phase 3 with everything the
/// request phases collected (the anomaly scores among it). Dropped unused (the exchange
/// failed), it is freed without its logging phase.
pub struct Open {
    t: Transaction,
    /// Where the log callback writes this transaction's matches: boxed, so its address (given
    /// to ModSecurity at creation) stays put while `Open` moves.
    matches: Box<Collector>,
}

// SAFETY: a ModSecurity transaction belongs to no thread; `Open` is the only handle to it
// (and to its collector), so it is used by one thread at a time, as connectors that hand a
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

impl Drop for Transaction {
    fn drop(&mut self) {
        if let Ok(api) = ffi::api() {
            // SAFETY: the transaction is live and freed once.
            unsafe { (api.transaction_cleanup)(self.0) };
        }
    }
}

/// Runs `req` through `rules` on this thread (it may take a millisecond: call it where
/// blocking is fine). Stops at the first phase a disruptive rule ends.
pub fn inspect(rules: &RuleSet, req: &Request<'_>) -> Result<Verdict, WafError> {
    inspect_request(rules, req, false).map(|(v, _)| v)
}

/// As [`inspect`], and when no rule stopped the request, keeps its transaction open for
/// [`inspect_response`]. The rule set must outlive the returned [`Open`]: ModSecurity's
/// transaction points into it (the caller keeps its `Arc` beside it).
pub fn inspect_keeping(
    rules: &RuleSet,
    req: &Request<'_>,
) -> Result<(Verdict, Option<Open>), WafError> {
    inspect_request(rules, req, true)
}

/// Runs a response's status and headers through phase 3 of the transaction its request
/// opened, then the logging phase, and frees it. The verdict lists only what matched from
/// phase 3 on (the request's matches were in its own verdict).
pub fn inspect_response(mut open: Open, resp: &Response<'_>) -> Result<Verdict, WafError> {
    let api = ffi::api()?;
    let t = open.t.0;
    let protocol = CString::new(resp.protocol)
        .map_err(|_| WafError::Transaction("the protocol holds a NUL byte".into()))?;
    for (name, value) in &resp.headers {
        // SAFETY: t is the live transaction `open` owns; the slices are valid for their
        // lengths and libmodsecurity copies them.
        unsafe {
            (api.add_n_response_header)(t, name.as_ptr(), name.len(), value.as_ptr(), value.len())
        };
    }
    // SAFETY: as above; `protocol` is NUL-terminated.
    unsafe { (api.process_response_headers)(t, c_int::from(resp.status), protocol.as_ptr()) };
    let blocked = disruption(api, t, &mut open.matches);
    // SAFETY: as above.
    unsafe { (api.process_logging)(t) };
    let Open { t, matches } = open;
    drop(t);
    Ok(Verdict {
        blocked,
        matches: *matches,
    })
}

fn inspect_request(
    rules: &RuleSet,
    req: &Request<'_>,
    keep: bool,
) -> Result<(Verdict, Option<Open>), WafError> {
    let api = ffi::api()?;
    let mut matches: Box<Collector> = Box::default();
    let data: *mut Collector = &mut *matches;
    // SAFETY: the instance and rule set are live for the call and the transaction (the rule
    // set is borrowed for all of this function); `data` outlives the transaction (dropped
    // first, below) and is only written by the log callback during the calls made here.
    let t = Transaction(unsafe { (api.new_transaction)(api.msc, rules.as_ptr(), data.cast()) });
    if t.0.is_null() {
        return Err(WafError::Transaction(
            "msc_new_transaction returned nothing".into(),
        ));
    }
    let cstr = |s: &str, what: &str| {
        CString::new(s).map_err(|_| WafError::Transaction(format!("the {what} holds a NUL byte")))
    };
    let blocked = (|| -> Result<Option<u16>, WafError> {
        let client = cstr(&req.client.ip().to_string(), "client address")?;
        let server = cstr(&req.server.ip().to_string(), "server address")?;
        // SAFETY (every call below): t.0 is the live transaction, strings NUL-terminated,
        // slices valid for their lengths; libmodsecurity copies what it keeps.
        unsafe {
            (api.process_connection)(
                t.0,
                client.as_ptr(),
                c_int::from(req.client.port()),
                server.as_ptr(),
                c_int::from(req.server.port()),
            )
        };
        if let Some(s) = disruption(api, t.0, &mut matches) {
            return Ok(Some(s));
        }
        let uri = cstr(req.uri, "URI")?;
        let method = cstr(req.method, "method")?;
        let version = cstr(req.http_version, "HTTP version")?;
        // SAFETY: as above.
        unsafe { (api.process_uri)(t.0, uri.as_ptr(), method.as_ptr(), version.as_ptr()) };
        for (name, value) in &req.headers {
            // SAFETY: as above.
            unsafe {
                (api.add_n_request_header)(
                    t.0,
                    name.as_ptr(),
                    name.len(),
                    value.as_ptr(),
                    value.len(),
                )
            };
        }
        // SAFETY: as above.
        unsafe { (api.process_request_headers)(t.0) };
        if let Some(s) = disruption(api, t.0, &mut matches) {
            return Ok(Some(s));
        }
        if !req.body.is_empty() {
            // SAFETY: as above.
            unsafe { (api.append_request_body)(t.0, req.body.as_ptr(), req.body.len()) };
        }
        // Phase 2 runs for every request: the Core Rule Set decides there (949110).
        // SAFETY: as above.
        unsafe { (api.process_request_body)(t.0) };
        Ok(disruption(api, t.0, &mut matches))
    })();
    if keep && matches!(blocked, Ok(None)) {
        // The request's matches go in its verdict; the collector starts again for phase 3.
        let verdict = Verdict {
            blocked: None,
            matches: std::mem::take(&mut *matches),
        };
        return Ok((verdict, Some(Open { t, matches })));
    }
    // SAFETY: as above.
    unsafe { (api.process_logging)(t.0) };
    drop(t);
    let verdict = Verdict {
        blocked: blocked?,
        matches: *matches,
    };
    Ok((verdict, None))
}

/// The status a disruptive intervention asks for, if one is pending; its rule (whose line
/// goes to the intervention, not the log callback) joins `matches`.
fn disruption(api: &ffi::Api, t: *mut c_void, matches: &mut Collector) -> Option<u16> {
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
