//! Memory-aware overload actions, as Envoy's overload manager: the process's resident memory
//! is sampled against `[server.overload] memory_limit_bytes`, and as it climbs, actions turn
//! on in order, each at its share of the limit, and off again only once memory has fallen 5
//! points below it (hysteresis, so an action does not flap at its threshold):
//!
//! | share | action | where it acts |
//! |---|---|---|
//! | 0.70 | every QUIC Initial without a token gets a Retry | the listeners' Retry gates |
//! | 0.75 | 0-RTT requests are refused (425) | `pipeline::refuse_early_data` |
//! | 0.80 | new HTTP/2 connections get small receive windows (16 KiB a stream, 64 KiB the connection) | `server` |
//! | 0.85 | idle connections close after `idle_timeout_under_pressure` | `conn_timers` |
//! | 0.90 | new connections are refused at accept (TCP closed, QUIC CONNECTION_REFUSED) | `admission::ConnectionCap` |
//! | 0.95 | every open TCP connection drains: GOAWAY on HTTP/2, close once idle on HTTP/1.1 | `server::drive` |
//!
//! Each activation and release is logged and counted
//! (`rampart_overload_actions_total{action}`), and each action's state is a gauge
//! (`rampart_overload_action_active{action}`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An overload action, in the order they turn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    RetryAllInitials,
    RefuseEarlyData,
    ShrinkWindows,
    CloseIdleConnections,
    StopAccepting,
    GoAway,
}

impl Action {
    pub const ALL: [Action; 6] = [
        Action::RetryAllInitials,
        Action::RefuseEarlyData,
        Action::ShrinkWindows,
        Action::CloseIdleConnections,
        Action::StopAccepting,
        Action::GoAway,
    ];

    /// The share of the memory limit at which the action turns on.
    pub fn threshold(self) -> f64 {
        match self {
            Action::RetryAllInitials => 0.70,
            Action::RefuseEarlyData => 0.75,
            Action::ShrinkWindows => 0.80,
            Action::CloseIdleConnections => 0.85,
            Action::StopAccepting => 0.90,
            Action::GoAway => 0.95,
        }
    }

    /// The `action` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::RetryAllInitials => "retry_all_initials",
            Action::RefuseEarlyData => "refuse_early_data",
            Action::ShrinkWindows => "shrink_windows",
            Action::CloseIdleConnections => "close_idle_connections",
            Action::StopAccepting => "stop_accepting",
            Action::GoAway => "goaway",
        }
    }
}

/// How far below its threshold memory must fall before an action turns off.
const HYSTERESIS: f64 = 0.05;

/// The overload state one gateway shares among its listeners.
pub struct Overload {
    /// `None`: no limit, no action ever.
    limit: Option<u64>,
    active: [AtomicBool; Action::ALL.len()],
    used: AtomicU64,
    /// Called when RetryAllInitials turns on or off (the listeners' Retry gates).
    on_retry: std::sync::Mutex<Vec<Arc<tokio_quiche::quic::RetryGate>>>,
    /// GoAway's state, for connections to wait on.
    goaway: tokio::sync::watch::Sender<bool>,
    gauges: Vec<prometheus::IntGauge>,
    counters: Vec<prometheus::IntCounter>,
    memory: prometheus::IntGauge,
}

impl Overload {
    pub fn new(limit: Option<u64>, m: &crate::ops::metrics::Metrics) -> Arc<Self> {
        Arc::new(Overload {
            limit,
            active: Default::default(),
            used: AtomicU64::new(0),
            on_retry: Default::default(),
            goaway: tokio::sync::watch::channel(false).0,
            gauges: Action::ALL
                .iter()
                .map(|a| m.overload_active.with_label_values(&[a.as_str()]))
                .collect(),
            counters: Action::ALL
                .iter()
                .map(|a| m.overload_actions.with_label_values(&[a.as_str()]))
                .collect(),
            memory: m.process_memory.clone(),
        })
    }

    /// Whether `action` is in force.
    pub fn is_active(&self, action: Action) -> bool {
        self.active[action as usize].load(Ordering::Relaxed)
    }

    /// Turns true while the GoAway action is on.
    pub fn goaway(&self) -> tokio::sync::watch::Receiver<bool> {
        self.goaway.subscribe()
    }

    /// A listener's Retry gate, forced to Retry every Initial while RetryAllInitials is on.
    pub fn watch_retry_gate(&self, gate: Arc<tokio_quiche::quic::RetryGate>) {
        gate.force_retry(self.is_active(Action::RetryAllInitials));
        self.on_retry.lock().expect("overload lock").push(gate);
    }

    /// Takes a reading of the memory in use (bytes) and turns actions on or off.
    pub fn observe(&self, used: u64) {
        self.used.store(used, Ordering::Relaxed);
        self.memory.set(used as i64);
        let Some(limit) = self.limit else { return };
        let share = used as f64 / limit as f64;
        for action in Action::ALL {
            let on = self.is_active(action);
            let next = if on {
                share >= action.threshold() - HYSTERESIS
            } else {
                share >= action.threshold()
            };
            if next == on {
                continue;
            }
            self.active[action as usize].store(next, Ordering::Relaxed);
            self.gauges[action as usize].set(next as i64);
            if next {
                self.counters[action as usize].inc();
                tracing::warn!(action = action.as_str(), used, limit, "overload action on");
            } else {
                tracing::info!(action = action.as_str(), used, limit, "overload action off");
            }
            if action == Action::GoAway {
                self.goaway.send_replace(next);
            }
            if action == Action::RetryAllInitials {
                for g in self.on_retry.lock().expect("overload lock").iter() {
                    g.force_retry(next);
                }
            }
        }
    }

    /// Samples the process's resident memory every `interval` until `stop` turns true.
    pub async fn run(
        self: Arc<Self>,
        interval: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            if let Some(rss) = resident_bytes() {
                self.observe(rss);
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// This process's resident memory, from `/proc/self/statm`.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_turn_on_in_order_and_off_with_hysteresis() {
        let m = crate::ops::metrics::Metrics::new();
        let o = Overload::new(Some(1000), &m);
        let gate = tokio_quiche::quic::RetryGate::when_pending_above(usize::MAX);
        o.watch_retry_gate(gate.clone());
        let on = |o: &Overload| -> Vec<&str> {
            Action::ALL
                .iter()
                .filter(|a| o.is_active(**a))
                .map(|a| a.as_str())
                .collect()
        };
        o.observe(600);
        assert!(on(&o).is_empty());
        o.observe(760);
        assert_eq!(on(&o), ["retry_all_initials", "refuse_early_data"]);
        assert!(gate.take_retry(), "the gate retries every Initial now");
        o.observe(920);
        assert_eq!(on(&o).len(), 5);
        // Just below the thresholds: nothing turns off yet.
        o.observe(860);
        assert_eq!(on(&o).len(), 5);
        // 5 points below StopAccepting's 0.90: it turns off, the others stay.
        o.observe(849);
        assert_eq!(
            on(&o),
            [
                "retry_all_initials",
                "refuse_early_data",
                "shrink_windows",
                "close_idle_connections"
            ]
        );
        o.observe(100);
        assert!(on(&o).is_empty());
        assert!(!gate.take_retry(), "released");
        let text = m.render();
        assert!(text.contains("rampart_overload_actions_total{action=\"stop_accepting\"} 1"));
        assert!(text.contains("rampart_overload_action_active{action=\"stop_accepting\"} 0"));
        assert!(text.contains("rampart_process_memory_bytes 100"));
    }

    #[test]
    fn without_a_limit_nothing_turns_on() {
        let o = Overload::new(None, &crate::ops::metrics::Metrics::new());
        o.observe(u64::MAX);
        assert!(Action::ALL.iter().all(|a| !o.is_active(*a)));
    }

    #[test]
    fn resident_memory_is_read() {
        let rss = resident_bytes().unwrap();
        assert!(rss > 1 << 20, "{rss}");
    }
}
