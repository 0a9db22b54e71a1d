//! Key-engine metrics, registered into a Prometheus registry owned by the caller.
//! Names are part of rampart's documented interface (README, "Metrics").

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub struct EngineMetrics {
    pub(crate) operations: IntCounterVec,
    pub(crate) sign_seconds: HistogramVec,
    pub(crate) queue_depth: IntGaugeVec,
    pub(crate) overload: IntCounterVec,
    pub(crate) faults: IntCounterVec,
    pub(crate) failovers: IntCounterVec,
}

impl EngineMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let m = EngineMetrics {
            operations: IntCounterVec::new(
                Opts::new(
                    "rampart_keyengine_operations_total",
                    "Private-key operations by engine, algorithm and result",
                ),
                &["engine", "algorithm", "result"],
            )?,
            sign_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "rampart_keyengine_sign_duration_seconds",
                    "Time from submission to a verified signature",
                )
                .buckets(vec![
                    0.00002, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                    0.05, 0.1, 0.25, 1.0,
                ]),
                &["engine", "algorithm"],
            )?,
            queue_depth: IntGaugeVec::new(
                Opts::new(
                    "rampart_keyengine_queue_depth",
                    "Requests accepted by an engine and not yet finished",
                ),
                &["engine"],
            )?,
            overload: IntCounterVec::new(
                Opts::new(
                    "rampart_keyengine_overload_rejections_total",
                    "Requests refused because an engine's queue was full",
                ),
                &["engine"],
            )?,
            faults: IntCounterVec::new(
                Opts::new(
                    "rampart_keyengine_faults_total",
                    "Signatures that failed verification against the public key before release",
                ),
                &["engine", "algorithm"],
            )?,
            failovers: IntCounterVec::new(
                Opts::new(
                    "rampart_keyengine_failovers_total",
                    "Requests an engine could not take, signed by another engine instead",
                ),
                &["from", "to"],
            )?,
        };
        registry.register(Box::new(m.failovers.clone()))?;
        registry.register(Box::new(m.operations.clone()))?;
        registry.register(Box::new(m.sign_seconds.clone()))?;
        registry.register(Box::new(m.queue_depth.clone()))?;
        registry.register(Box::new(m.overload.clone()))?;
        registry.register(Box::new(m.faults.clone()))?;
        Ok(m)
    }

    /// Metrics registered nowhere (for tests and tools).
    pub fn unregistered() -> Self {
        Self::new(&Registry::new()).expect("fresh registry")
    }

    /// Faults counted so far for `engine` (all algorithms).
    pub fn faults_total(&self, engine: &str) -> u64 {
        crate::SignatureAlgorithm::ALL
            .iter()
            .map(|a| self.faults.with_label_values(&[engine, a.as_str()]).get())
            .sum()
    }

    /// Overload rejections counted so far for `engine`.
    pub fn overload_total(&self, engine: &str) -> u64 {
        self.overload.with_label_values(&[engine]).get()
    }
}
