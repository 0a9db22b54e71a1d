//! Helpers over header fields shared by the pipeline's phases.

use http::{HeaderMap, HeaderName};

/// The elements of a comma-separated header list, over all of its fields, trimmed (their
/// parameters, after `;`, kept).
pub(crate) fn list_elements<'a>(
    h: &'a HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'a str> {
    h.get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// The value of cookie `name` in `h`'s `Cookie` headers (the first, as sent).
pub(crate) fn cookie<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}
