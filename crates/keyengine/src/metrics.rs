//! Key-engine metrics, registered into a Prometheus registry owned by the caller, and the
//! [`Families`] engines export their own through.
//! Names are part of rampart's documented interface (README, "Metrics").

pub use prometheus::proto::MetricFamily;
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricType};
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

/// Metric families built from values read when `/metrics` is scraped. Engines keep their own
/// counters (atomics on their hot paths) and export them through this; the gateway encodes
/// them together with its registry's ([`encode`]): one exposition path for every metric.
#[derive(Default)]
pub struct Families(Vec<MetricFamily>);

/// A metric's type, as Prometheus declares it.
#[derive(Clone, Copy)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Families {
    pub fn new() -> Self {
        Self::default()
    }

    /// One family without labels.
    pub fn single(&mut self, kind: Kind, name: &str, help: &str, value: f64) -> &mut Self {
        self.push(kind, name, help, None, [(String::new(), value)])
    }

    /// One family with a sample per `(value of label, sample)`.
    pub fn by_label(
        &mut self,
        kind: Kind,
        name: &str,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (String, f64)>,
    ) -> &mut Self {
        self.push(kind, name, help, Some(label), samples)
    }

    /// Families gathered elsewhere (a registry of the engine's own).
    pub fn extend(&mut self, families: impl IntoIterator<Item = MetricFamily>) -> &mut Self {
        self.0.extend(families);
        self
    }

    pub fn into_vec(self) -> Vec<MetricFamily> {
        self.0
    }

    fn push(
        &mut self,
        kind: Kind,
        name: &str,
        help: &str,
        label: Option<&str>,
        samples: impl IntoIterator<Item = (String, f64)>,
    ) -> &mut Self {
        let mut family = MetricFamily::default();
        family.set_name(name.into());
        family.set_help(help.into());
        family.set_field_type(match kind {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
        });
        for (label_value, value) in samples {
            let mut metric = Metric::default();
            if let Some(label) = label {
                let mut pair = LabelPair::default();
                pair.set_name(label.into());
                pair.set_value(label_value);
                metric.set_label(vec![pair]);
            }
            match kind {
                Kind::Counter => {
                    let mut c = Counter::default();
                    c.set_value(value);
                    metric.set_counter(c);
                }
                Kind::Gauge => {
                    let mut g = Gauge::default();
                    g.set_value(value);
                    metric.set_gauge(g);
                }
            }
            family.mut_metric().push(metric);
        }
        // A family with no sample (a labelled one with nothing to report) is not valid
        // exposition: the encoder would refuse the whole page.
        if !family.get_metric().is_empty() {
            self.0.push(family);
        }
        self
    }
}

/// Prometheus text for `families`.
pub fn encode(families: &[MetricFamily]) -> String {
    use prometheus::Encoder as _;
    let mut out = Vec::new();
    prometheus::TextEncoder::new()
        .encode(families, &mut out)
        .expect("text encoding");
    String::from_utf8(out).expect("utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_encode_as_prometheus_text() {
        let mut f = Families::new();
        f.single(Kind::Gauge, "rampart_x_size", "Size.", 3.0)
            .by_label(
                Kind::Counter,
                "rampart_x_total",
                "Things.",
                "server",
                [("a:1".to_string(), 2.0), ("b:2".to_string(), 5.0)],
            );
        let text = encode(&f.into_vec());
        assert_eq!(
            text,
            "# HELP rampart_x_size Size.\n# TYPE rampart_x_size gauge\nrampart_x_size 3\n\
             # HELP rampart_x_total Things.\n# TYPE rampart_x_total counter\n\
             rampart_x_total{server=\"a:1\"} 2\nrampart_x_total{server=\"b:2\"} 5\n"
        );
    }
}
