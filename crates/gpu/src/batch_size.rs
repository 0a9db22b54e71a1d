//! How many requests a batch may take: the largest batch whose kernel time, as measured, stays
//! within a latency target. A request's wait is about one batch in flight plus its own, so a
//! target of half the p99 goal keeps the p99 within it.
//!
//! Batch times are kept per size class (batches of 2^k to 2^(k+1) − 1 requests) as a moving
//! average. The limit is the top of the largest class measured within the target; when no
//! larger class has been measured, the next class up is tried (the device's time grows in steps
//! of whole waves, so a class twice as large often costs about the same): a class that turns
//! out over the target costs one batch, and lowers the limit from then on. Before anything is
//! measured the limit is `start`.

use std::sync::Mutex;
use std::time::Duration;

/// Size classes: up to 2^CLASSES requests.
const CLASSES: usize = 21;
/// Weight of the newest batch in a class's moving average.
const ALPHA: f64 = 0.25;

pub(crate) struct BatchSizer {
    target: Duration,
    max: usize,
    start: usize,
    /// Moving average of batch seconds per class (`None`: not measured).
    classes: Mutex<[Option<f64>; CLASSES]>,
}

impl BatchSizer {
    /// At most `max` requests; `start` until the first batches are measured.
    pub(crate) fn new(target: Duration, max: usize, start: usize) -> Self {
        let max = max.max(1);
        BatchSizer {
            target,
            max,
            start: start.clamp(1, max),
            classes: Mutex::new([None; CLASSES]),
        }
    }

    fn class(items: usize) -> usize {
        (usize::BITS - 1 - items.max(1).leading_zeros()) as usize
    }

    /// Records a completed batch of `items` requests that took `took` on the device.
    pub(crate) fn record(&self, items: usize, took: Duration) {
        let k = Self::class(items).min(CLASSES - 1);
        let mut c = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        let t = took.as_secs_f64();
        c[k] = Some(c[k].map_or(t, |avg| avg + ALPHA * (t - avg)));
    }

    /// The most requests the next batch may take.
    pub(crate) fn limit(&self) -> usize {
        let c = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        let target = self.target.as_secs_f64();
        let largest_measured = c.iter().rposition(Option::is_some);
        let within = c.iter().rposition(|t| t.is_some_and(|t| t <= target));
        let limit = match (within, largest_measured) {
            (None, None) => self.start,
            // Even the smallest measured class is over the target: one request at a time.
            (None, Some(_)) => 1,
            (Some(k), Some(top)) => {
                let class = if k == top { k + 1 } else { k };
                (1usize << (class + 1).min(CLASSES)) - 1
            }
            (Some(_), None) => unreachable!("a class within the target is measured"),
        };
        limit.clamp(1, self.max)
    }

    /// Whether the target can be met: false once batches were measured and none of any size
    /// was within it.
    pub(crate) fn target_met(&self) -> bool {
        let c = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        let target = self.target.as_secs_f64();
        c.iter().all(Option::is_none) || c.iter().flatten().any(|&t| t <= target)
    }

    pub(crate) fn target(&self) -> Duration {
        self.target
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
        // A launch alone takes longer than the target: one request at a time, and said so.
        let cost = CostModel {
            launch: Duration::from_millis(8),
            per_item: Duration::from_micros(1),
        };
        let (limit, met) = settle(cost, 1024, Duration::from_millis(5), 65_536);
        assert_eq!(limit, 1);
        assert!(!met);
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
        assert_eq!(sizer.limit(), 2047);
    }
}
