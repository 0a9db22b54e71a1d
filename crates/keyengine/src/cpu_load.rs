//! How busy this process keeps the CPUs it may run on: the CPU time all its threads used over
//! the last sampling period, as a fraction of the period times the CPUs available to it (its
//! affinity). The scheduler reads it to send signing off the CPU while the CPU is the
//! bottleneck (see [`crate::SchedulerPolicy::offload`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The latest busy fraction, in millionths (0 = idle, 1,000,000 = every CPU fully used).
#[derive(Debug, Default)]
pub struct CpuLoad {
    busy_ppm: AtomicU32,
}

impl CpuLoad {
    /// A load that only changes through [`CpuLoad::set`] (tests, or a caller that samples
    /// itself).
    pub fn fixed(busy: f64) -> Arc<Self> {
        let load = Arc::new(CpuLoad::default());
        load.set(busy);
        load
    }

    /// A load sampled every `period` by a thread of its own, which stops when the last
    /// reference to the load is dropped.
    pub fn sampled(period: Duration) -> std::io::Result<Arc<Self>> {
        let load = Arc::new(CpuLoad::default());
        let weak = Arc::downgrade(&load);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        std::thread::Builder::new()
            .name("rampart-cpu-load".into())
            .spawn(move || {
                let (mut t0, mut c0) = (Instant::now(), process_cpu());
                loop {
                    std::thread::sleep(period);
                    let Some(load) = weak.upgrade() else { return };
                    let (t1, c1) = (Instant::now(), process_cpu());
                    let wall = (t1 - t0).as_secs_f64() * cpus;
                    if wall > 0.0 {
                        load.set(c1.saturating_sub(c0).as_secs_f64() / wall);
                    }
                    (t0, c0) = (t1, c1);
                }
            })?;
        Ok(load)
    }

    /// The busy fraction, 0 to 1.
    pub fn busy(&self) -> f64 {
        f64::from(self.busy_ppm.load(Ordering::Relaxed)) / 1e6
    }

    pub fn set(&self, busy: f64) {
        let ppm = (busy.clamp(0.0, 1.0) * 1e6).round() as u32;
        self.busy_ppm.store(ppm, Ordering::Relaxed);
    }
}

/// User plus system CPU time of every thread of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is given; the result is
    // checked.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinning_thread_shows_in_the_sampled_load() {
        let load = CpuLoad::sampled(Duration::from_millis(50)).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spin = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // One busy thread out of `cpus`: at least half of that share, whatever else runs.
        let mut seen = 0.0f64;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(50));
            seen = seen.max(load.busy());
        }
        stop.store(true, Ordering::Relaxed);
        spin.join().unwrap();
        assert!(
            seen >= 0.5 / cpus,
            "busy {seen} with one of {cpus} CPUs spinning"
        );
        let fixed = CpuLoad::fixed(1.7);
        assert_eq!(fixed.busy(), 1.0, "clamped");
    }
}
