//! The `inline` engine: signs at once on the calling thread. The baseline, and the lowest
//! latency path at light load.

use crate::engine::{Engine, SignFuture, SignRequest};

#[derive(Debug, Default)]
pub struct InlineEngine;

impl Engine for InlineEngine {
    fn name(&self) -> &'static str {
        "inline"
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let result = request.sign_locally();
        Box::pin(std::future::ready(result))
    }

    fn queue_depth(&self) -> usize {
        0
    }
}
