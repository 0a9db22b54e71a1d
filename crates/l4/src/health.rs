//! Whether each gateway takes traffic, and where on the link it is.
//!
//! The probe is a QUIC long-header packet of a reserved version (RFC 9000 §15's
//! `0x?a?a?a?a`), padded to 1,200 bytes: every QUIC server must answer it with a Version
//! Negotiation packet echoing the probe's connection IDs, so the check needs nothing of the
//! gateway but its QUIC listener. A gateway is taken out after `fall` probes in a row go
//! unanswered and back after `rise` are answered. Once a probe is answered, the kernel has
//! resolved the gateway's link address; it is read from the neighbour table
//! (`/proc/net/arp`), which also says the interface frames leave by.

use crate::config::{Backend, HealthConfig};
use crate::link::Link;
use crate::metrics::Metrics;
use crate::route::Table;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// A reserved version (RFC 9000 §15): never supported, always negotiated.
const PROBE_VERSION: [u8; 4] = [0x1a, 0x2a, 0x3a, 0x4a];
const PROBE_LEN: usize = 1200;
const PROBE_CID: usize = 8;

/// A probe and the connection IDs its answer must echo.
pub(crate) struct Probe {
    pub datagram: Vec<u8>,
    dcid: [u8; PROBE_CID],
    scid: [u8; PROBE_CID],
}

impl Probe {
    pub fn new() -> Probe {
        let mut dcid = [0u8; PROBE_CID];
        let mut scid = [0u8; PROBE_CID];
        fastrand::fill(&mut dcid);
        fastrand::fill(&mut scid);
        let mut d = Vec::with_capacity(PROBE_LEN);
        // Long header, fixed bit set, type Initial (some servers, tokio-quiche among them,
        // negotiate versions only for what would be an Initial in version 1).
        d.push(0xc0 | fastrand::u8(..0x10));
        d.extend(PROBE_VERSION);
        d.push(PROBE_CID as u8);
        d.extend(dcid);
        d.push(PROBE_CID as u8);
        d.extend(scid);
        d.resize(PROBE_LEN, 0);
        Probe {
            datagram: d,
            dcid,
            scid,
        }
    }

    /// Whether `reply` is a Version Negotiation packet answering this probe: version 0, its
    /// destination ID our source ID and its source ID our destination ID (RFC 9000 §17.2.1).
    pub fn answered_by(&self, reply: &[u8]) -> bool {
        let ids = |d: &[u8]| -> Option<(usize, usize)> {
            let dl = *d.get(5)? as usize;
            let sl = *d.get(6 + dl)? as usize;
            Some((dl, sl))
        };
        let Some((dl, sl)) = ids(reply) else {
            return false;
        };
        reply[0] & 0x80 != 0
            && reply[1..5] == [0, 0, 0, 0]
            && reply[6..6 + dl] == self.scid
            && reply.get(7 + dl..7 + dl + sl) == Some(&self.dcid[..])
            // At least one version offered.
            && reply.len() >= 7 + dl + sl + 4
    }
}

/// Sends one probe to `to` and waits up to `timeout` for its answer.
fn probe(to: SocketAddr, timeout: Duration) -> io::Result<bool> {
    let sock = UdpSocket::bind(match to {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    })?;
    // Connected: only the gateway's answers arrive, and an ICMP unreachable fails fast.
    sock.connect(to)?;
    let p = Probe::new();
    sock.send(&p.datagram)?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        sock.set_read_timeout(Some(left))?;
        match sock.recv(&mut buf) {
            Ok(n) if p.answered_by(&buf[..n]) => return Ok(true),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(false)
            }
            Err(e) => return Err(e),
        }
    }
}

/// The link address of `ip` from a neighbour table in `/proc/net/arp`'s format: complete
/// entries only (flag 0x2).
pub(crate) fn parse_neighbour(table: &str, ip: Ipv4Addr) -> Option<([u8; 6], String)> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [addr, _hw_type, flags, mac, _mask, dev] = f.as_slice() else {
            return None;
        };
        if addr.parse::<Ipv4Addr>().ok()? != ip {
            return None;
        }
        let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
        if flags & 0x2 == 0 {
            return None;
        }
        let mut out = [0u8; 6];
        let mut parts = mac.split(':');
        for b in &mut out {
            *b = u8::from_str_radix(parts.next()?, 16).ok()?;
        }
        Some((out, dev.to_string()))
    })
}

fn link_of(ip: Ipv4Addr) -> Option<Link> {
    let table = std::fs::read_to_string("/proc/net/arp").ok()?;
    let (mac, dev) = parse_neighbour(&table, ip)?;
    Link::new(&dev, mac)
}

/// One gateway's health as the checker sees it.
struct State {
    up: bool,
    /// Probes in a row with the same result, against the state.
    streak: u32,
    ever_up: bool,
    link: Option<Link>,
}

/// What the workers read: the routing table and each gateway's link.
pub(crate) struct Snapshot {
    pub table: Table,
    pub links: Vec<Option<Link>>,
}

/// The snapshot the workers read; replaced whole when anything changes.
pub(crate) type Shared = Arc<RwLock<Arc<Snapshot>>>;

/// Probes every gateway once per interval, until `stop`.
pub(crate) struct Checker {
    backends: Vec<Backend>,
    cfg: HealthConfig,
    states: Vec<State>,
    shared: Shared,
    metrics: Arc<Metrics>,
}

impl Checker {
    pub fn new(backends: Vec<Backend>, cfg: HealthConfig, metrics: Arc<Metrics>) -> Checker {
        let states = backends
            .iter()
            .map(|_| State {
                up: false,
                streak: 0,
                ever_up: false,
                link: None,
            })
            .collect();
        let snapshot = Snapshot {
            table: Table::new(&backends, &vec![false; backends.len()]),
            links: vec![None; backends.len()],
        };
        Checker {
            backends,
            cfg,
            states,
            shared: Arc::new(RwLock::new(Arc::new(snapshot))),
            metrics,
        }
    }

    pub fn shared(&self) -> Shared {
        self.shared.clone()
    }

    /// Probes every gateway at once and applies the results. A gateway that was never up
    /// comes up on its first answer, so a balancer starts taking traffic after one round.
    pub fn round(&mut self) {
        let results: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .backends
                .iter()
                .map(|b| {
                    let (to, timeout) = (b.health, self.cfg.timeout);
                    s.spawn(move || probe(to, timeout))
                })
                .collect();
            handles
                .into_iter()
                .zip(&self.backends)
                .map(|(h, b)| match h.join().expect("probe thread") {
                    Ok(answered) => answered,
                    Err(e) => {
                        tracing::debug!(backend = %b.health, error = %e, "health probe failed");
                        false
                    }
                })
                .collect()
        });
        let mut changed = false;
        for (i, answered) in results.into_iter().enumerate() {
            let b = &self.backends[i];
            let st = &mut self.states[i];
            // Answered, but with no neighbour entry the gateway cannot be reached by frame.
            let link = if answered { link_of(b.address) } else { None };
            let ok = answered && link.is_some();
            if answered && link.is_none() {
                tracing::warn!(gateway = %b.address, "gateway answered but is not on this node's link (no neighbour entry): direct server return needs layer-2 adjacency");
            }
            self.metrics.health_check(i, ok);
            if link.is_some() && link != st.link {
                st.link = link;
                changed = true;
            }
            if ok == st.up {
                st.streak = 0;
                continue;
            }
            st.streak += 1;
            let needed = match (st.up, st.ever_up) {
                (false, false) => 1,
                (false, true) => self.cfg.rise,
                (true, _) => self.cfg.fall,
            };
            if st.streak >= needed {
                st.up = ok;
                st.ever_up |= ok;
                st.streak = 0;
                changed = true;
                self.metrics.set_up(i, ok);
                if ok {
                    tracing::info!(gateway = %b.address, server_id = ?b.server_id, "gateway up");
                } else {
                    tracing::warn!(gateway = %b.address, server_id = ?b.server_id, "gateway down");
                }
            }
        }
        if changed {
            let up: Vec<bool> = self.states.iter().map(|s| s.up).collect();
            let snapshot = Snapshot {
                table: Table::new(&self.backends, &up),
                links: self.states.iter().map(|s| s.link.clone()).collect(),
            };
            *self.shared.write().expect("health snapshot lock") = Arc::new(snapshot);
        }
    }

    /// Rounds every interval until `stop`.
    pub fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            let next = Instant::now() + self.cfg.interval;
            self.round();
            while !stop.load(Ordering::Relaxed) {
                let left = next.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(50)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_is_answered_only_by_its_own_version_negotiation() {
        let p = Probe::new();
        assert_eq!(p.datagram.len(), PROBE_LEN);
        assert_eq!(&p.datagram[1..5], &PROBE_VERSION);
        assert_eq!(p.datagram[0] & 0xf0, 0xc0, "an Initial's first octet");
        // quiche's answer to it is what a gateway sends.
        let hdr = quiche::Header::from_slice(&mut p.datagram.clone(), 0).unwrap();
        let mut vn = [0u8; 256];
        let n = quiche::negotiate_version(&hdr.scid, &hdr.dcid, &mut vn).unwrap();
        assert!(p.answered_by(&vn[..n]));
        // Another probe's answer, a cut answer, a non-VN packet: not ours.
        assert!(!Probe::new().answered_by(&vn[..n]));
        assert!(!p.answered_by(&vn[..n - 4]));
        let mut not_vn = vn;
        not_vn[4] = 1;
        assert!(!p.answered_by(&not_vn[..n]));
        assert!(!p.answered_by(&[]));
        assert!(!p.answered_by(&[0xc0, 0, 0, 0, 0, 30]));
    }

    #[test]
    fn neighbour_entries_are_read_when_complete() {
        let table = "IP address       HW type     Flags       HW address            Mask     Device\n\
                     10.77.0.21       0x1         0x2         aa:bb:cc:00:11:22     *        veth0\n\
                     10.77.0.22       0x1         0x0         00:00:00:00:00:00     *        veth0\n";
        assert_eq!(
            parse_neighbour(table, "10.77.0.21".parse().unwrap()),
            Some(([0xaa, 0xbb, 0xcc, 0, 0x11, 0x22], "veth0".to_string()))
        );
        assert_eq!(parse_neighbour(table, "10.77.0.22".parse().unwrap()), None);
        assert_eq!(parse_neighbour(table, "10.77.0.23".parse().unwrap()), None);
    }

    #[test]
    fn a_quic_server_on_loopback_answers_and_a_closed_port_does_not() {
        // A socket answering like a QUIC server (quiche's version negotiation).
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            let (n, from) = server.recv_from(&mut buf).unwrap();
            let hdr = quiche::Header::from_slice(&mut buf[..n], 0).unwrap();
            let mut out = [0u8; 256];
            let m = quiche::negotiate_version(&hdr.scid, &hdr.dcid, &mut out).unwrap();
            server.send_to(&out[..m], from).unwrap();
        });
        assert!(probe(addr, Duration::from_secs(5)).unwrap());
        t.join().unwrap();
        // Nothing listens there now: refused (ICMP) or unanswered, never "up".
        assert!(!probe(addr, Duration::from_millis(200)).unwrap_or(false));
    }
}
