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
