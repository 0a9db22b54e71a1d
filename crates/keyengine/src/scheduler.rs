//! Routes each request to the engine expected to finish it soonest.
//!
//! The estimate for engine *e* is `(queue_depth(e) + 1) / parallelism(e) * service_time(e)`,
//! where `service_time` is an exponentially weighted moving average of measured signing times
//! per key kind. Configuration may pin a key kind to one engine. While this process keeps its
//! CPUs busy past a threshold ([`CpuOffload`]), engines that sign off the CPU (a GPU) are
//! preferred even when a CPU engine would finish sooner: the CPU is then the bottleneck, and a
//! signature a CPU engine makes costs handshakes. Pure logic: tests drive it with fake
//! engines, fake durations and a fixed [`CpuLoad`].

use crate::algorithm::KeyKind;
use crate::cpu_load::CpuLoad;
use crate::engine::Engine;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Routing rules.
#[derive(Debug, Clone, Default)]
pub struct SchedulerPolicy {
    /// Key kinds that always go to the named engine.
    pub pins: HashMap<KeyKind, String>,
    /// Prefer engines that sign off the CPU while the CPU is busy; `None`: never.
    pub offload: Option<CpuOffload>,
}

/// When to prefer engines that sign off the CPU ([`Engine::offloads_cpu`]): from the moment
/// `load` reaches `enter` until it falls below `leave` (a gap, so that the load the offload
/// itself takes away does not flip the choice back at once).
#[derive(Debug, Clone)]
pub struct CpuOffload {
    pub load: Arc<CpuLoad>,
    pub enter: f64,
    pub leave: f64,
}

const KINDS: [KeyKind; 3] = [KeyKind::Rsa, KeyKind::EcdsaP256, KeyKind::EcdsaP384];

struct Slot {
    engine: Arc<dyn Engine>,
    /// EWMA of service time in nanoseconds, per key kind (index into KINDS).
    service_ns: [AtomicU64; 3],
}

/// Folds a measured duration into an exponentially weighted moving average (ns, weight 1/8;
/// the first sample is taken as is).
pub(crate) fn ewma(cell: &AtomicU64, sample: Duration) {
    let sample = sample.as_nanos().min(u64::MAX as u128) as u64;
    let old = cell.load(Ordering::Relaxed);
    let new = if old == 0 {
        sample
    } else {
        (old * 7 + sample) / 8
    };
    cell.store(new, Ordering::Relaxed);
}

pub struct Scheduler {
    slots: Vec<Slot>,
    pins: HashMap<KeyKind, usize>,
    offload: Option<CpuOffload>,
    /// Whether the CPU is taken to be saturated now (between `enter` and `leave`).
    offloading: AtomicBool,
}

/// The error when a policy names an engine that is not configured.
#[derive(Debug, thiserror::Error)]
#[error(
    "pin for {kind} names engine '{engine}', which is not among the configured engines ({known})"
)]
pub struct UnknownEngine {
    pub kind: &'static str,
    pub engine: String,
    pub known: String,
}

fn kind_index(k: KeyKind) -> usize {
    KINDS
        .iter()
        .position(|x| *x == k)
        .expect("all kinds listed")
}

impl Scheduler {
    /// `engines` must not be empty.
    pub fn new(
        engines: Vec<Arc<dyn Engine>>,
        policy: &SchedulerPolicy,
    ) -> Result<Self, UnknownEngine> {
        assert!(!engines.is_empty(), "at least one engine");
        let mut pins = HashMap::new();
        for (kind, name) in &policy.pins {
            let idx = engines
                .iter()
                .position(|e| e.name() == name)
                .ok_or_else(|| UnknownEngine {
                    kind: kind.as_str(),
                    engine: name.clone(),
                    known: engines
                        .iter()
                        .map(|e| e.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            pins.insert(*kind, idx);
        }
        let slots = engines
            .into_iter()
            .map(|engine| Slot {
                engine,
                // Optimistic start: every engine is tried, then measurements take over.
                service_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            })
            .collect();
        Ok(Scheduler {
            slots,
            pins,
            offload: policy.offload.clone(),
            offloading: AtomicBool::new(false),
        })
    }

    /// Picks the engine for a request on a key of `kind`; `private_held` says whether this
    /// process has the private key (if not, only engines that sign elsewhere qualify).
    /// `None` when no configured engine can sign it.
    pub fn pick(&self, kind: KeyKind, private_held: bool) -> Option<(usize, &Arc<dyn Engine>)> {
        self.pick_except(kind, private_held, None)
    }

    /// Like [`Scheduler::pick`], never choosing slot `except` (for failing over).
    pub fn pick_except(
        &self,
        kind: KeyKind,
        private_held: bool,
        except: Option<usize>,
    ) -> Option<(usize, &Arc<dyn Engine>)> {
        let eligible = |i: usize, s: &Slot| {
            Some(i) != except
                && s.engine.available()
                && (private_held || !s.engine.needs_private_key())
        };
        if let Some(&i) = self.pins.get(&kind) {
            if eligible(i, &self.slots[i]) {
                return Some((i, &self.slots[i].engine));
            }
        }
        let k = kind_index(kind);
        let off_cpu = self.cpu_saturated()
            && self
                .slots
                .iter()
                .enumerate()
                .any(|(i, s)| eligible(i, s) && s.engine.offloads_cpu());
        self.slots
            .iter()
            .enumerate()
            .filter(|(i, s)| eligible(*i, s) && (!off_cpu || s.engine.offloads_cpu()))
            .min_by_key(|(_, s)| {
                if let Some(d) = s.engine.expected_completion(kind) {
                    return d.as_nanos().min(u64::MAX as u128) as u64;
                }
                let depth = s.engine.queue_depth() as u64 + 1;
                let par = s.engine.parallelism().max(1) as u64;
                depth.div_ceil(par) * s.service_ns[k].load(Ordering::Relaxed)
            })
            .map(|(i, s)| (i, &s.engine))
    }

    /// Whether the CPU counts as saturated now: the load reached `enter` and has not yet
    /// fallen below `leave`.
    fn cpu_saturated(&self) -> bool {
        let Some(o) = &self.offload else {
            return false;
        };
        let busy = o.load.busy();
        let was = self.offloading.load(Ordering::Relaxed);
        let now = if was {
            busy >= o.leave
        } else {
            busy >= o.enter
        };
        if now != was {
            self.offloading.store(now, Ordering::Relaxed);
        }
        now
    }

    /// Whether requests are being sent off the CPU because it is saturated (for metrics).
    pub fn offloading(&self) -> bool {
        self.offloading.load(Ordering::Relaxed)
    }

    /// The CPU-load offload's state for `/metrics` (none without [`CpuOffload`]).
    pub fn metrics(&self) -> Vec<prometheus::proto::MetricFamily> {
        use crate::metrics::{Families, Kind};
        let Some(o) = &self.offload else {
            return Vec::new();
        };
        let mut f = Families::new();
        f.single(
            Kind::Gauge,
            "rampart_keyengine_cpu_busy_ratio",
            "Share of the CPUs this process may use that it kept busy over the last 100 ms.",
            o.load.busy(),
        )
        .single(
            Kind::Gauge,
            "rampart_keyengine_cpu_offloading",
            "1 while signatures go to engines off the CPU because the CPU is saturated.",
            f64::from(u8::from(self.offloading())),
        );
        f.into_vec()
    }

    /// Feeds a measured service time back into the estimate.
    pub fn record(&self, slot: usize, kind: KeyKind, took: Duration) {
        ewma(&self.slots[slot].service_ns[kind_index(kind)], took);
    }

    pub fn engines(&self) -> impl Iterator<Item = &Arc<dyn Engine>> {
        self.slots.iter().map(|s| &s.engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{SignFuture, SignRequest};
    use std::sync::atomic::AtomicUsize;

    struct Fake {
        name: &'static str,
        depth: AtomicUsize,
        par: usize,
        /// The engine's own completion estimate (µs), as a batching engine gives.
        estimate_us: AtomicUsize,
        available: bool,
        offloads: bool,
    }
    impl Engine for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn submit(&self, _: SignRequest) -> SignFuture {
            unreachable!()
        }
        fn queue_depth(&self) -> usize {
            self.depth.load(Ordering::Relaxed)
        }
        fn parallelism(&self) -> usize {
            self.par
        }
        fn expected_completion(&self, _: KeyKind) -> Option<Duration> {
            match self.estimate_us.load(Ordering::Relaxed) {
                0 => None,
                us => Some(Duration::from_micros(us as u64)),
            }
        }
        fn available(&self) -> bool {
            self.available
        }
        fn offloads_cpu(&self) -> bool {
            self.offloads
        }
    }

    fn fake(name: &'static str, depth: usize, par: usize) -> Arc<Fake> {
        Arc::new(Fake {
            name,
            depth: AtomicUsize::new(depth),
            par,
            estimate_us: AtomicUsize::new(0),
            available: true,
            offloads: false,
        })
    }

    #[test]
    fn picks_engine_with_earliest_expected_completion() {
        let a = fake("a", 0, 1);
        let b = fake("b", 0, 4);
        let s = Scheduler::new(vec![a.clone(), b.clone()], &SchedulerPolicy::default()).unwrap();
        s.record(0, KeyKind::Rsa, Duration::from_micros(300));
        s.record(1, KeyKind::Rsa, Duration::from_micros(400));
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 0, "idle and faster");
        a.depth.store(8, Ordering::Relaxed); // 9 * 300us on one lane
        b.depth.store(8, Ordering::Relaxed); // ceil(9/4) * 400us
        assert_eq!(
            s.pick(KeyKind::Rsa, true).unwrap().0,
            1,
            "queue grew: the parallel engine finishes first"
        );
    }

    #[test]
    fn pins_override_estimates_and_unknown_pins_are_errors() {
        let a = fake("a", 0, 1);
        let b = fake("b", 100, 1);
        let mut policy = SchedulerPolicy::default();
        policy.pins.insert(KeyKind::Rsa, "b".into());
        let s = Scheduler::new(vec![a.clone(), b.clone()], &policy).unwrap();
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 1);
        policy.pins.insert(KeyKind::EcdsaP256, "gpu".into());
        let err = Scheduler::new(vec![a, b], &policy).err().unwrap();
        assert!(err.to_string().contains("'gpu'"), "{err}");
    }

    #[test]
    fn an_engine_estimate_wins_when_it_is_sooner_and_unavailable_engines_are_skipped() {
        let inline = fake("inline", 0, 1);
        let batch = fake("batch", 0, 8);
        let s = Scheduler::new(
            vec![inline.clone(), batch.clone()],
            &SchedulerPolicy::default(),
        )
        .unwrap();
        s.record(0, KeyKind::Rsa, Duration::from_micros(280));
        // Light load: a lone request costs the batch engine a single operation too.
        batch.estimate_us.store(300, Ordering::Relaxed);
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 0);
        // Deep queue on the event loop's inline path vs one more batch pass.
        inline.depth.store(20, Ordering::Relaxed);
        batch.estimate_us.store(1_500, Ordering::Relaxed);
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 1);
        let gpu = Arc::new(Fake {
            name: "gpu",
            depth: AtomicUsize::new(0),
            par: 65536,
            estimate_us: AtomicUsize::new(1),
            available: false,
            offloads: true,
        });
        let s = Scheduler::new(vec![gpu, inline], &SchedulerPolicy::default()).unwrap();
        assert_eq!(
            s.pick(KeyKind::Rsa, true).unwrap().0,
            1,
            "no device: never picked"
        );
    }

    #[test]
    fn a_saturated_cpu_sends_requests_off_the_cpu_until_it_has_room_again() {
        let batch = fake("batch", 0, 8);
        batch.estimate_us.store(300, Ordering::Relaxed);
        let gpu = Arc::new(Fake {
            name: "gpu",
            depth: AtomicUsize::new(0),
            par: 65536,
            estimate_us: AtomicUsize::new(5_000),
            available: true,
            offloads: true,
        });
        let load = CpuLoad::fixed(0.5);
        let policy = SchedulerPolicy {
            offload: Some(CpuOffload {
                load: load.clone(),
                enter: 0.9,
                leave: 0.7,
            }),
            ..SchedulerPolicy::default()
        };
        let s = Scheduler::new(vec![batch.clone(), gpu.clone()], &policy).unwrap();
        // Room on the CPU: the sooner finish wins (the batch engine).
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 0);
        assert!(!s.offloading());
        // Saturated: off the CPU although the GPU finishes later.
        load.set(0.95);
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 1);
        assert!(s.offloading());
        let text = crate::metrics::encode(&s.metrics());
        assert!(
            text.contains("rampart_keyengine_cpu_busy_ratio 0.95"),
            "{text}"
        );
        assert!(
            text.contains("rampart_keyengine_cpu_offloading 1"),
            "{text}"
        );
        // Between leave and enter it stays off the CPU; below leave it comes back.
        load.set(0.8);
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 1);
        load.set(0.6);
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 0);
        assert!(!s.offloading());
        // A pin still wins, and failing over from the GPU still reaches the CPU.
        load.set(0.95);
        assert_eq!(s.pick_except(KeyKind::Rsa, true, Some(1)).unwrap().0, 0);
        let pinned = SchedulerPolicy {
            pins: [(KeyKind::Rsa, "batch".to_string())].into(),
            ..policy.clone()
        };
        let s = Scheduler::new(vec![batch, gpu], &pinned).unwrap();
        assert_eq!(s.pick(KeyKind::Rsa, true).unwrap().0, 0);
    }
}
