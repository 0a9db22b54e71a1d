// rampart: pacing for the legacy congestion controllers (cubic, reno).
//
// quiche 0.30 gives these controllers no pacer: every packet is released at
// once, as far as the congestion window allows, so a window's worth leaves in
// one burst at the sender's line rate. This gives each in-flight packet a
// release time instead, by Linux TCP's rule (`tcp_update_pacing_rate`): the
// window spread over the smoothed RTT, at twice that rate in slow start and
// 1.2 times it after, so that pacing never holds the window back. The release
// times reach the socket through `SendInfo::at` (SO_TXTIME, honoured by the
// `fq` qdisc); quiche itself still writes whatever the window allows.

use std::time::Duration;
use std::time::Instant;

use crate::recovery::ReleaseDecision;
use crate::recovery::ReleaseTime;

/// Packets released at once after the connection was idle (nothing in
/// flight), as Linux's `fq` lets a flow's initial quantum go: the first flight
/// is not delayed, and no RTT may be known yet.
const INITIAL_BURST: usize = 10;

/// Pacing gain in slow start (Linux `tcp_pacing_ss_ratio`, 200%).
const SLOW_START_GAIN: f64 = 2.0;

/// Pacing gain in congestion avoidance (Linux `tcp_pacing_ca_ratio`, 120%).
const AVOIDANCE_GAIN: f64 = 1.2;

/// The congestion controller's state a packet's pacing depends on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PacingInput {
    pub(crate) congestion_window: usize,
    pub(crate) smoothed_rtt: Duration,
    /// No RTT sample yet: the smoothed RTT is the configured initial one.
    pub(crate) rtt_unknown: bool,
    pub(crate) slow_start: bool,
    /// Bytes in flight before this packet.
    pub(crate) bytes_in_flight: usize,
}

#[derive(Debug)]
pub(crate) struct Pacer {
    enabled: bool,
    /// Bytes per second, from the configured Mbit/s.
    max_rate: Option<f64>,
    /// When the next in-flight packet may leave (`None`: at once).
    next_release: Option<Instant>,
    /// The release time given to the last packet sent, if it was in flight.
    last_release: Option<Instant>,
    /// Packets still to go without delay.
    burst_tokens: usize,
    /// The last gap computed, with what it was computed from: a burst's
    /// packets share one size, window and RTT (they change only with ACKs),
    /// so the division and conversion run once per ACK, not per packet.
    gap_cache: Option<(GapKey, Option<Duration>)>,
}

/// What a packet's gap depends on besides the fixed maximum rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GapKey {
    size: usize,
    congestion_window: usize,
    smoothed_rtt: Duration,
    rtt_unknown: bool,
    slow_start: bool,
}

impl Pacer {
    pub(crate) fn new(enabled: bool, max_rate_mbps: Option<u64>) -> Self {
        Pacer {
            enabled,
            max_rate: max_rate_mbps.map(|m| m as f64 * 1e6 / 8.0),
            next_release: None,
            last_release: None,
            burst_tokens: INITIAL_BURST,
            gap_cache: None,
        }
    }

    /// The time a packet of `size` bytes takes at the paced rate (`None`:
    /// not paced), from the cache when its inputs are the last packet's.
    fn gap(&mut self, size: usize, input: &PacingInput) -> Option<Duration> {
        let key = GapKey {
            size,
            congestion_window: input.congestion_window,
            smoothed_rtt: input.smoothed_rtt,
            rtt_unknown: input.rtt_unknown,
            slow_start: input.slow_start,
        };
        if let Some((cached, gap)) = self.gap_cache {
            if cached == key {
                return gap;
            }
        }
        let gap = self
            .rate(input)
            .and_then(|rate| Duration::try_from_secs_f64(size as f64 / rate).ok());
        self.gap_cache = Some((key, gap));
        gap
    }

    /// The rate the window is paced at, in bytes per second; `None` while no
    /// RTT is known.
    fn rate(&self, input: &PacingInput) -> Option<f64> {
        if input.rtt_unknown || input.smoothed_rtt.is_zero() {
            return None;
        }

        let gain = if input.slow_start {
            SLOW_START_GAIN
        } else {
            AVOIDANCE_GAIN
        };
        let rate = gain * input.congestion_window as f64 /
            input.smoothed_rtt.as_secs_f64();

        // A cap of 0 (or a rate that is not a positive number) paces nothing
        // rather than never releasing.
        Some(self.max_rate.map_or(rate, |max| rate.min(max)))
            .filter(|rate| *rate > 0.0 && rate.is_finite())
    }

    /// Records a packet of `size` bytes sent at `now`; `in_flight` packets are
    /// paced, others (ACK-only) leave at once and change nothing.
    pub(crate) fn on_packet_sent(
        &mut self, size: usize, in_flight: bool, input: PacingInput,
        now: Instant,
    ) {
        if !self.enabled || !in_flight {
            self.last_release = None;
            return;
        }

        if input.bytes_in_flight == 0 {
            // Idle: start over with a burst, as after quiescence.
            self.burst_tokens = INITIAL_BURST;
            self.next_release = None;
        }

        let at = self.next_release.map_or(now, |t| t.max(now));
        self.last_release = Some(at);

        if self.burst_tokens > 0 {
            self.burst_tokens -= 1;
            return;
        }

        self.next_release =
            self.gap(size, &input).and_then(|gap| at.checked_add(gap));
    }

    /// When the packet just sent should leave: its release time, or `now`.
    pub(crate) fn sent_packet_time(&self, now: Instant) -> Instant {
        self.last_release.map_or(now, |t| t.max(now))
    }

    /// When the next in-flight packet may leave.
    #[cfg(test)]
    pub(crate) fn next_release(&self, now: Instant) -> Instant {
        self.next_release.map_or(now, |t| t.max(now))
    }

    pub(crate) fn release_decision(&self) -> ReleaseDecision {
        ReleaseDecision {
            // Never set while pacing is off.
            time: self.next_release.map_or(ReleaseTime::Immediate, ReleaseTime::At),
            allow_burst: self.burst_tokens > 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn rate_for(&self, input: &PacingInput) -> Option<f64> {
        self.rate(input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(bytes_in_flight: usize, slow_start: bool) -> PacingInput {
        PacingInput {
            congestion_window: 120_000,
            smoothed_rtt: Duration::from_millis(10),
            rtt_unknown: false,
            slow_start,
            bytes_in_flight,
        }
    }

    // After the initial burst, packets are spaced by size ÷ (gain × cwnd ÷
    // srtt), from the later of the previous release and now.
    #[test]
    fn spaces_packets_at_the_window_over_the_rtt() {
        let start = Instant::now();
        let mut p = Pacer::new(true, None);
        let mut in_flight = 0;
        for _ in 0..INITIAL_BURST {
            p.on_packet_sent(1200, true, input(in_flight, false), start);
            assert_eq!(p.sent_packet_time(start), start);
            in_flight += 1200;
        }

        // 1.2 × 120,000 B / 10 ms = 14.4 MB/s: 1,200 B every 83.3 µs.
        let gap = Duration::from_secs_f64(1200.0 / 14.4e6);
        let mut expect = start;
        for _ in 0..5 {
            p.on_packet_sent(1200, true, input(in_flight, false), start);
            assert_eq!(p.sent_packet_time(start), expect);
            expect += gap;
            assert_eq!(p.next_release(start), expect);
            in_flight += 1200;
        }

        // Later than the schedule: the next packet leaves now.
        let late = expect + Duration::from_millis(5);
        p.on_packet_sent(1200, true, input(in_flight, false), late);
        assert_eq!(p.sent_packet_time(late), late);
        assert_eq!(p.next_release(late), late + gap);

        // Slow start paces at twice the window over the RTT.
        let ss = p.rate_for(&input(in_flight, true)).unwrap();
        assert!((ss - 24e6).abs() < 1.0, "{ss}");
    }

    // ACK-only packets leave at once; nothing in flight restarts the burst;
    // without an RTT sample or with pacing off nothing is delayed.
    #[test]
    fn idle_ack_only_unknown_rtt_and_disabled() {
        let now = Instant::now();
        let mut p = Pacer::new(true, None);
        for i in 0..INITIAL_BURST + 3 {
            p.on_packet_sent(1200, true, input(1 + i * 1200, false), now);
        }
        assert!(p.next_release(now) > now);
        assert!(!p.release_decision().can_burst());

        p.on_packet_sent(50, false, input(100, false), now);
        assert_eq!(p.sent_packet_time(now), now);

        p.on_packet_sent(1200, true, input(0, false), now);
        assert_eq!(p.sent_packet_time(now), now);
        assert_eq!(p.next_release(now), now);
        assert!(p.release_decision().can_burst());

        let mut unknown = input(1, false);
        unknown.rtt_unknown = true;
        let mut p = Pacer::new(true, None);
        for _ in 0..INITIAL_BURST + 5 {
            p.on_packet_sent(1200, true, unknown, now);
        }
        assert_eq!(p.next_release(now), now);

        let mut p = Pacer::new(false, None);
        for _ in 0..INITIAL_BURST + 5 {
            p.on_packet_sent(1200, true, input(1, false), now);
        }
        assert_eq!(p.sent_packet_time(now), now);
        assert_eq!(p.release_decision().time(now), None);
    }

    // The cached gap follows every input it depends on: a changed size,
    // window, RTT or phase gives the gap computed afresh.
    #[test]
    fn cached_gap_follows_its_inputs() {
        let mut p = Pacer::new(true, None);
        let base = input(1, false);
        let fresh = |size: usize, i: &PacingInput| {
            Pacer::new(true, None)
                .rate(i)
                .and_then(|r| Duration::try_from_secs_f64(size as f64 / r).ok())
        };
        let mut changed = Vec::new();
        let mut i = base;
        i.congestion_window *= 2;
        changed.push((1200, i));
        let mut i = base;
        i.smoothed_rtt *= 3;
        changed.push((1200, i));
        changed.push((1200, input(1, true)));
        let mut i = base;
        i.rtt_unknown = true;
        changed.push((1200, i));
        changed.push((700, base));
        for (size, i) in changed {
            assert_eq!(p.gap(1200, &base), fresh(1200, &base));
            assert_eq!(p.gap(size, &i), fresh(size, &i), "{size} {i:?}");
            assert_ne!(p.gap(size, &i), p.gap(1200, &base), "{size} {i:?}");
        }
    }

    // A configured maximum (Mbit/s) caps the rate.
    #[test]
    fn max_rate_caps() {
        let p = Pacer::new(true, Some(8));
        assert_eq!(p.rate_for(&input(0, false)), Some(1e6));
        let p = Pacer::new(true, Some(1_000));
        assert!((p.rate_for(&input(0, false)).unwrap() - 14.4e6).abs() < 1.0);

        // A cap of 0 paces nothing (and does not divide by zero).
        let now = Instant::now();
        let mut p = Pacer::new(true, Some(0));
        assert_eq!(p.rate_for(&input(0, false)), None);
        for i in 0..INITIAL_BURST + 3 {
            p.on_packet_sent(1200, true, input(1 + i * 1200, false), now);
        }
        assert_eq!(p.sent_packet_time(now), now);
        assert_eq!(p.next_release(now), now);
    }
}
