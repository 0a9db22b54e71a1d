//! The request pipeline: the target normalized and checked, the route chosen, the request
//! forwarded and the response compressed where asked.

pub(crate) mod compress;
pub(crate) mod headers;
pub(crate) mod pattern;
pub(crate) mod pipeline;
pub mod request_target;
pub(crate) mod route_match;
pub(crate) mod router;
pub(crate) mod websocket;
