//! How many requests a batch may take: the largest batch whose kernel time, as measured, stays
//! within a latency target. A request's wait is about one batch in flight plus its own, so a
//! target of half the p99 goal keeps the p99 within it.
//!
//! Batch times are kept per size class (batches of 2^k to 2^(k+1) − 1 requests) as a moving
//! average. The limit is the top of the largest class measured within the target; the next
//! class up is tried while it is unmeasured or measured over the target fewer than `CONFIRM`
//! times (the device's time grows in steps of whole waves, so a class twice as large often
//! costs about the same; and a first launch or a burst on the other stream can make one batch
//! slow), and once every `RETRY` batches after that (the device may have become faster). Before
//! anything is measured the limit is `start`. Where no batch size meets the target, the bound is
//! twice the fastest batch measured instead (said by `target_met`): batching then adds at most
//! one such batch of latency. The engine keeps one sizer per key size.

use std::sync::Mutex;
use std::time::Duration;

/// Size classes: up to 2^CLASSES requests.
const CLASSES: usize = 21;
/// Weight of the newest batch in a class's moving average.
const ALPHA: f64 = 0.25;
/// Batches of a class over the target before the class is taken to be over it.
const CONFIRM: u32 = 3;
/// Batches between retries of the class above the limit.
const RETRY: u64 = 256;

/// A size class's moving average of batch seconds and how many batches it has seen.
#[derive(Clone, Copy, Default)]
struct Class {
    seconds: f64,
    batches: u32,
}

#[derive(Default)]
struct State {
    classes: [Class; CLASSES],
    /// Batches recorded, all classes.
    batches: u64,
}

pub(crate) struct BatchSizer {
    target: Duration,
    max: usize,
    start: usize,
    state: Mutex<State>,
}

impl BatchSizer {
    /// At most `max` requests; `start` until the first batches are measured.
    pub(crate) fn new(target: Duration, max: usize, start: usize) -> Self {
        let max = max.max(1);
        BatchSizer {
            target,
            max,
            start: start.clamp(1, max),
            state: Mutex::new(State::default()),
        }
    }

    fn class(items: usize) -> usize {
        (usize::BITS - 1 - items.max(1).leading_zeros()) as usize
    }

    /// Records a completed batch of `items` requests that took `took` on the device.
    pub(crate) fn record(&self, items: usize, took: Duration) {
        let k = Self::class(items).min(CLASSES - 1);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.batches += 1;
        let c = &mut st.classes[k];
        let t = took.as_secs_f64();
        c.seconds = if c.batches == 0 {
            t
        } else {
            c.seconds + ALPHA * (t - c.seconds)
        };
        c.batches = c.batches.saturating_add(1);
    }

    /// The most requests the next batch may take.
    pub(crate) fn limit(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let c = &st.classes;
        let measured = |k: &usize| c[*k].batches > 0;
        let Some(fastest) = (0..CLASSES)
            .filter(measured)
            .map(|k| c[k].seconds)
            .min_by(f64::total_cmp)
        else {
            return self.start.clamp(1, self.max);
        };
        // The target where some batch size meets it; where none does, twice the fastest batch
        // measured, so batching adds at most one such batch of latency.
        let target = self.target.as_secs_f64();
        let bound = if fastest <= target {
            target
        } else {
            2.0 * fastest
        };
        let k = (0..CLASSES)
            .rev()
            .find(|&k| measured(&k) && c[k].seconds <= bound)
            .expect("the fastest class is within the bound");
        let next = (k + 1).min(CLASSES - 1);
        let confirmed_over = c[next].batches >= CONFIRM && c[next].seconds > bound;
        let retry = st.batches.is_multiple_of(RETRY);
        let class = if !confirmed_over || retry { next } else { k };
        ((1usize << (class + 1)) - 1).clamp(1, self.max)
    }

    /// Whether the target can be met: false once batches were measured and none of any size
    /// was within it.
    pub(crate) fn target_met(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let target = self.target.as_secs_f64();
        let measured = st.classes.iter().filter(|c| c.batches > 0);
        st.batches == 0 || measured.clone().any(|c| c.seconds <= target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CostModel;

    /// Drives the sizer with a simulated device (the cost model of `SimulatedGpu`, in waves:
    /// `wave` requests run at once) under a queue that always has more than the limit.
    fn settle(cost: CostModel, wave: usize, target: Duration, max: usize) -> (usize, bool) {
        let sizer = BatchSizer::new(target, max, 64);
        let mut limit = sizer.limit();
        for _ in 0..200 {
            let waves = limit.div_ceil(wave) as u32;
            sizer.record(limit, cost.launch + cost.per_item * (wave as u32) * waves);
            limit = sizer.limit();
        }
        (limit, sizer.target_met())
    }

    #[test]
    fn settles_on_the_largest_batch_within_the_target() {
        // 1 ms per launch, waves of 1,024 requests at 2 ms each: 2 waves fit in 5 ms.
        let cost = CostModel {
            launch: Duration::from_millis(1),
            per_item: Duration::from_nanos(2_000_000 / 1024),
        };
        let (limit, met) = settle(cost, 1024, Duration::from_millis(5), 65_536);
        assert!(met);
        assert!((1024..=2047).contains(&limit), "{limit}");
        // Each batch it settles on is within the target, and the class above is not.
        let time = |b: usize| cost.launch + cost.per_item * 1024 * b.div_ceil(1024) as u32;
        assert!(time(limit) <= Duration::from_millis(5));
        assert!(time(2 * (limit + 1)) > Duration::from_millis(5));
        // A looser target takes larger batches; the configured maximum still caps them.
        let (loose, _) = settle(cost, 1024, Duration::from_millis(50), 65_536);
        assert!(loose >= 16_383, "{loose}");
        let (capped, _) = settle(cost, 1024, Duration::from_millis(50), 3000);
        assert_eq!(capped, 3000);
    }

    #[test]
    fn says_so_when_the_target_cannot_be_met() {
        // A launch alone takes longer than the target: said so, and batches grow only while
        // they take at most twice the fastest batch (one wave: 9 ms; up to 8 waves in 18 ms).
        let cost = CostModel {
            launch: Duration::from_millis(8),
            per_item: Duration::from_nanos(1000),
        };
        let (limit, met) = settle(cost, 1024, Duration::from_millis(5), 65_536);
        assert!(!met);
        let time = |b: usize| cost.launch + cost.per_item * 1024 * b.div_ceil(1024) as u32;
        assert!(time(limit) <= time(1) * 2, "{limit}");
        assert!(time(2 * (limit + 1)) > time(1) * 2, "{limit}");
    }

    #[test]
    fn a_slower_device_lowers_the_limit() {
        let sizer = BatchSizer::new(Duration::from_millis(5), 65_536, 64);
        for _ in 0..10 {
            sizer.record(4096, Duration::from_millis(4));
            sizer.record(1024, Duration::from_millis(2));
        }
        // 4,096 is within the target and nothing larger was tried: the next class is.
        assert_eq!(sizer.limit(), 16_383);
        // The device slows down (another tenant, clocks): 4,096 now takes 9 ms.
        for _ in 0..10 {
            sizer.record(4096, Duration::from_millis(9));
        }
        // 4,096's class is over now; 1,024's is within and the class between untried: tried.
        assert_eq!(sizer.limit(), 4095);
        for _ in 0..3 {
            sizer.record(2048, Duration::from_millis(6));
        }
        assert_eq!(sizer.limit(), 2047);
    }

    #[test]
    fn one_slow_first_batch_does_not_stick() {
        // The first launch of a kernel is slow (lazy module loading): 60 ms for 256 requests.
        let sizer = BatchSizer::new(Duration::from_millis(5), 65_536, 256);
        sizer.record(256, Duration::from_millis(60));
        assert!(!sizer.target_met(), "nothing within the target yet");
        sizer.record(1, Duration::from_millis(2));
        // Class 256 was over once only: it is tried again, and then is within.
        assert_eq!(sizer.limit(), 3);
        for _ in 0..30 {
            sizer.record(256, Duration::from_millis(2));
        }
        assert!(sizer.limit() >= 1023, "{}", sizer.limit());
    }
}
