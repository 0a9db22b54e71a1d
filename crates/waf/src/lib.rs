//! A thin, safe layer over ModSecurity v3's C API (`libmodsecurity.so.3`, loaded at run time
//! so a gateway without a WAF route needs no ModSecurity installed), made for inspecting one
//! request at a time on a thread that may block:
//!
//! - [`RuleSet`]: rules compiled once from ModSecurity directives ([`crs_profile`] writes the
//!   OWASP Core Rule Set's, with a paranoia level, an anomaly threshold and exclusions), shared
//!   by every inspection that uses them.
//! - [`inspect`]: one request's connection, URI, headers and body (or the first part of it)
//!   through phases 1 and 2; the [`Verdict`] says whether a disruptive rule (in the Core Rule
//!   Set, the anomaly-score evaluation) stopped it, and lists the rules that matched.
//!   [`inspect_keeping`] keeps the transaction [`Open`] for [`inspect_response`], which runs
//!   the response's status and headers through phase 3 and, when asked, its body (or its
//!   first part) through phase 4 (or [`close`], when none came); the logging phase (5) runs
//!   last either way.
//!
//! A [`Match`] carries a rule's id, message, severity and the *name* of the variable it matched
//! (`ARGS:q`, `REQUEST_HEADERS:User-Agent`); ModSecurity's own log line also quotes the matched
//! value and data, which are the client's bytes and are dropped here, never kept or logged.

mod ffi;
mod log_line;
mod profile;
mod rules;
mod transaction;

pub use log_line::{parse as parse_log_line, Match, MAX_FIELD};
pub use profile::{
    crs_profile, valid_argument, valid_file_path, valid_media_type, valid_method,
    valid_path_prefix, CrsPaths, Exclusion, Mode, Profile, ResponseBodies,
};
pub use rules::RuleSet;
pub use transaction::{
    close, inspect, inspect_keeping, inspect_response, Open, Request, Response, ResponseVerdict,
    Verdict,
};

/// What can go wrong loading ModSecurity or its rules.
#[derive(Debug, thiserror::Error)]
pub enum WafError {
    /// `libmodsecurity.so.3` could not be loaded or lacks a function this layer calls.
    #[error("ModSecurity (libmodsecurity.so.3) is not usable: {0}")]
    Library(String),
    /// ModSecurity refused the rules; its message names the file and line.
    #[error("ModSecurity refused the rules: {0}")]
    Rules(String),
    /// A transaction could not be created or fed.
    #[error("ModSecurity transaction failed: {0}")]
    Transaction(String),
}

/// Whether ModSecurity can be loaded here (a test or a config check asks before building).
pub fn available() -> Result<(), WafError> {
    ffi::api().map(|_| ())
}
