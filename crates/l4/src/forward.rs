//! The data path: one worker thread per `SO_REUSEPORT` socket receives a batch of datagrams
//! (`recvmmsg`), chooses each one's gateway, puts its IP and UDP headers back and sends the
//! batch as layer-2 frames to the gateways' MAC addresses (`sendmmsg` on a packet socket).
//! Nothing is kept between batches but counters.

use crate::frame::{self, HEADERS};
use crate::health::Shared;
use crate::metrics::Metrics;
use crate::route::{Choice, DropReason, HashReason, Router};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Receive buffer per datagram: an Ethernet MTU's payload and headroom for our headers. A
/// larger datagram cannot go out as one frame anyway; it is dropped (`too_big`).
const SLOT: usize = 2048;

/// A worker's receiving socket: in the VIP's `SO_REUSEPORT` group, with a short receive
/// timeout so the worker sees a stop request.
pub(crate) fn bind_vip(vip: SocketAddrV4, buffer: usize) -> io::Result<UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    s.set_reuse_port(true)?;
    s.set_recv_buffer_size(buffer)?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    s.bind(&SocketAddr::V4(vip).into())?;
    Ok(s.into())
}

/// A packet socket that only sends: protocol 0 receives nothing, so no copy of the node's
/// traffic queues on it.
pub(crate) fn packet_socket() -> io::Result<OwnedFd> {
    // SAFETY: a plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("packet socket (needs CAP_NET_RAW): {e}"),
        ));
    }
    // SAFETY: `fd` is a new, valid descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) struct Worker {
    pub socket: UdpSocket,
    pub packets: OwnedFd,
    pub vip: SocketAddrV4,
    pub batch: usize,
    pub router: Arc<Router>,
    pub shared: Shared,
    pub metrics: Arc<Metrics>,
}

/// Counts of one batch, added to the metrics once.
struct Tally {
    datagrams: Vec<u64>,
    bytes: Vec<u64>,
    hashed: [u64; HashReason::ALL.len()],
    dropped: [u64; DropReason::ALL.len()],
}

impl Tally {
    fn new(backends: usize) -> Tally {
        Tally {
            datagrams: vec![0; backends],
            bytes: vec![0; backends],
            hashed: [0; HashReason::ALL.len()],
            dropped: [0; DropReason::ALL.len()],
        }
    }

    fn drop(&mut self, r: DropReason) {
        self.dropped[r.index()] += 1;
    }

    fn flush(&mut self, m: &Metrics) {
        for (i, n) in self.datagrams.iter_mut().enumerate() {
            if *n > 0 {
                m.datagrams[i].inc_by(std::mem::take(n));
                m.bytes[i].inc_by(std::mem::take(&mut self.bytes[i]));
            }
        }
        for (i, n) in self.hashed.iter_mut().enumerate() {
            if *n > 0 {
                m.hashed(HashReason::ALL[i], std::mem::take(n));
            }
        }
        for (i, n) in self.dropped.iter_mut().enumerate() {
            if *n > 0 {
                m.dropped(DropReason::ALL[i], std::mem::take(n));
            }
        }
    }
}

impl Worker {
    /// Forwards until `stop`.
    pub fn run(self, stop: Arc<AtomicBool>) -> io::Result<()> {
        let n = self.batch;
        let mut slots = vec![0u8; n * SLOT];
        // Every access to the slots goes through this one pointer: the kernel's (through the
        // iovecs) and ours (through slices made per datagram).
        let base = slots.as_mut_ptr();
        // SAFETY (for the zeroed values below): sockaddr_in, sockaddr_ll, iovec and mmsghdr
        // are plain C structs for which all-zero bytes are valid.
        let mut from: Vec<libc::sockaddr_in> = vec![unsafe { std::mem::zeroed() }; n];
        let mut to: Vec<libc::sockaddr_ll> = vec![unsafe { std::mem::zeroed() }; n];
        let mut rx_iov: Vec<libc::iovec> = (0..n)
            .map(|i| libc::iovec {
                // SAFETY: `i * SLOT + HEADERS` is inside `slots` (n * SLOT bytes).
                iov_base: unsafe { base.add(i * SLOT + HEADERS) }.cast(),
                iov_len: SLOT - HEADERS,
            })
            .collect();
        let mut tx_iov: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; n];
        let mut rx: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; n];
        let mut tx: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; n];
        let backends = self.metrics.datagrams.len();
        let mut tally = Tally::new(backends);
        // Per datagram to send: its gateway and payload length, counted once sent.
        let mut chosen = vec![(0usize, 0usize); n];
        let fd = self.socket.as_raw_fd();
        while !stop.load(Ordering::Relaxed) {
            for i in 0..n {
                let h = &mut rx[i].msg_hdr;
                h.msg_name = (&mut from[i] as *mut libc::sockaddr_in).cast();
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
                h.msg_iov = &mut rx_iov[i];
                h.msg_iovlen = 1;
                h.msg_flags = 0;
            }
            // SAFETY: `rx` holds `n` headers whose name and iovec pointers point into `from`
            // and `slots`, which outlive the call and are not otherwise borrowed during it.
            let got = unsafe {
                libc::recvmmsg(
                    fd,
                    rx.as_mut_ptr(),
                    n as u32,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if got < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let got = got as usize;
            self.metrics.batches.inc();
            self.metrics.received.inc_by(got as u64);
            let snapshot = self.shared.read().expect("health snapshot lock").clone();
            let mut out = 0;
            for i in 0..got {
                let len = rx[i].msg_len as usize;
                if rx[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    tally.drop(DropReason::TooBig);
                    continue;
                }
                let client = SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(from[i].sin_addr.s_addr)),
                    u16::from_be(from[i].sin_port),
                );
                // SAFETY: slot `i` lies inside `slots` (len <= SLOT - HEADERS, as the iovec
                // said), and no other reference to it is alive: the kernel is done with it.
                let slot =
                    unsafe { std::slice::from_raw_parts_mut(base.add(i * SLOT), HEADERS + len) };
                let b = match self
                    .router
                    .choose(&snapshot.table, &slot[HEADERS..], client)
                {
                    Choice::Routed(b) => b,
                    Choice::Hashed(b, reason) => {
                        tally.hashed[reason.index()] += 1;
                        b
                    }
                    Choice::Drop(r) => {
                        tally.drop(r);
                        continue;
                    }
                };
                let Some(link) = &snapshot.links[b] else {
                    tally.drop(DropReason::NoLink);
                    continue;
                };
                frame::write_headers(slot, client, self.vip);
                to[out] = link.sockaddr();
                tx_iov[out] = libc::iovec {
                    iov_base: slot.as_mut_ptr().cast(),
                    iov_len: slot.len(),
                };
                chosen[out] = (b, len);
                out += 1;
            }
            for i in 0..out {
                let h = &mut tx[i].msg_hdr;
                h.msg_name = (&mut to[i] as *mut libc::sockaddr_ll).cast();
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                h.msg_iov = &mut tx_iov[i];
                h.msg_iovlen = 1;
            }
            let mut sent = 0;
            while sent < out {
                // SAFETY: `tx[sent..out]` are headers whose name and iovec pointers point into
                // `to`, `tx_iov` and `slots`, all alive and unaliased for the call.
                let r = unsafe {
                    libc::sendmmsg(
                        self.packets.as_raw_fd(),
                        tx.as_mut_ptr().add(sent),
                        (out - sent) as u32,
                        0,
                    )
                };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    tracing::debug!(error = %e, "sendmmsg on the packet socket");
                    // The first unsent datagram is the one refused; the rest are tried again.
                    tally.drop(DropReason::SendError);
                    sent += 1;
                    continue;
                }
                for &(b, len) in &chosen[sent..sent + r as usize] {
                    tally.datagrams[b] += 1;
                    tally.bytes[b] += len as u64;
                }
                sent += r as usize;
            }
            tally.flush(&self.metrics);
        }
        Ok(())
    }
}
