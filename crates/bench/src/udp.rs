//! Datagram load for `rampart l4` (`udp-flood`) and the anchor it is measured against, a plain
//! userspace UDP forwarder (`udp-forward`). `scripts/bench-l4.py` runs both in network
//! namespaces and divides datagrams forwarded by the forwarder's CPU seconds.

use crate::BenchArgs;
use anyhow::{anyhow, bail, Context as _};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Datagrams per sendmmsg call.
const BATCH: usize = 64;
/// Source sockets (ports) the flood spreads over, as many clients would.
const SOURCES: usize = 16;

fn udp_target(url: &str) -> anyhow::Result<SocketAddr> {
    url.strip_prefix("udp://")
        .ok_or_else(|| anyhow!("--url: expected udp://ADDR:PORT, got {url:?}"))?
        .parse()
        .with_context(|| format!("--url: {url:?}"))
}

fn hex(s: &str) -> anyhow::Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        bail!("{s:?}: expected an even number of hex digits");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).with_context(|| format!("{s:?}: not hex")))
        .collect()
}

/// One short-header datagram per connection: a QUIC-LB connection ID of one of the gateways,
/// then random bytes standing for the protected packet.
fn datagrams(args: &BenchArgs) -> anyhow::Result<Vec<Vec<u8>>> {
    let ids: Vec<Vec<u8>> = args
        .lb_server_ids
        .split(',')
        .map(hex)
        .collect::<anyhow::Result<_>>()?;
    let key = match &args.lb_key {
        Some(k) => Some(
            <[u8; 16]>::try_from(hex(k)?)
                .map_err(|_| anyhow!("--lb-key: expected 32 hex digits"))?,
        ),
        None => None,
    };
    let size = args.datagram_bytes.max(1 + quiclb::MAX_CID_LEN + 1);
    (0..args.concurrency.max(1) * SOURCES)
        .map(|i| {
            let sid = &ids[i % ids.len()];
            let cfg = quiclb::Config {
                rotation: 0,
                server_id_len: sid.len(),
                nonce_len: args.lb_nonce_len,
                key,
                self_encode_length: true,
            };
            let enc = quiclb::Encoder::new(cfg, sid)
                .and_then(|e| e.padded_to(quiclb::MAX_CID_LEN))
                .map_err(|e| anyhow!("--lb-*: {e}"))?;
            let mut d = vec![0x40 | fastrand::u8(..0x40)];
            d.extend(enc.generate());
            d.extend((d.len()..size).map(|_| fastrand::u8(..)));
            Ok(d)
        })
        .collect()
}

/// `udp-flood`: sends for `--duration` (or `-n` datagrams), then prints what it sent.
pub fn flood(args: &BenchArgs) -> anyhow::Result<()> {
    let to = udp_target(&args.url)?;
    let payloads = datagrams(args)?;
    let socks: Vec<UdpSocket> = (0..SOURCES)
        .map(|_| {
            let s = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
            s.connect(to)?;
            Ok(s)
        })
        .collect::<std::io::Result<_>>()?;
    let limit = args.requests.unwrap_or(u64::MAX);
    let deadline = Instant::now() + args.duration;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut round = 0usize;
    while sent < limit && Instant::now() < deadline {
        let sock = &socks[round % SOURCES];
        let n = BATCH.min((limit - sent) as usize);
        let mut iov: Vec<libc::iovec> = (0..n)
            .map(|i| {
                let p = &payloads[(round * BATCH + i) % payloads.len()];
                libc::iovec {
                    iov_base: p.as_ptr() as *mut libc::c_void,
                    iov_len: p.len(),
                }
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: mmsghdr is a plain C struct; all-zero is valid, and the fields set
                // below are the only ones read for a connected socket.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: `msgs` holds `n` headers whose iovecs point into `payloads`, alive and
        // unmodified for the call; the socket is connected, so no address is needed.
        let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
        if r > 0 {
            sent += r as u64;
        }
        round += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "mode": "udp-flood",
            "sent": sent,
            "seconds": secs,
            "datagrams_per_sec": sent as f64 / secs,
            "datagram_bytes": payloads[0].len(),
        })
    );
    Ok(())
}

/// `udp-forward`: forwards one datagram at a time for `--duration`, then prints what it
/// forwarded and the CPU it took.
pub fn forward(args: &BenchArgs) -> anyhow::Result<()> {
    let listen = udp_target(&args.url)?;
    let to = args
        .forward_to
        .ok_or_else(|| anyhow!("udp-forward needs --forward-to"))?;
    let sock = UdpSocket::bind(listen).with_context(|| format!("bind {listen}"))?;
    let out = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let cpu0 = crate::cpu::process_cpu(std::process::id())?;
    let deadline = Instant::now() + args.duration;
    let mut buf = [0u8; 2048];
    let mut forwarded = 0u64;
    while Instant::now() < deadline {
        match sock.recv_from(&mut buf) {
            Ok((n, _from)) => {
                if out.send_to(&buf[..n], to).is_ok() {
                    forwarded += 1;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let cpu = crate::cpu::process_cpu(std::process::id())?;
    println!(
        "{}",
        serde_json::json!({
            "mode": "udp-forward",
            "forwarded": forwarded,
            "cpu_user": cpu.user - cpu0.user,
            "cpu_system": cpu.system - cpu0.system,
        })
    );
    Ok(())
}
