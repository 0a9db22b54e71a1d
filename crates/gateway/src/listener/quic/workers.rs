//! HTTP/3 on every worker: one UDP socket per worker in a `SO_REUSEPORT` group, with the
//! kernel steering each datagram by its destination connection ID.
//!
//! The kernel's default for a reuseport group hashes the 4-tuple, so a client that moves to a
//! new address (a phone going from 4G to Wi-Fi) would land on another worker that does not
//! know its connection. Instead, a classic BPF program attached to the group reads the last
//! byte of the destination connection ID and picks worker `byte % workers`, and each worker
//! only issues connection IDs whose last byte maps to itself ([`WorkerIds`]). A client's first
//! Initial carries a connection ID the client chose; its last byte picks a worker just the
//! same, every later packet of that client's handshake carries the same ID, and from the
//! server's first reply on the client uses an ID that worker issued.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use tokio_quiche::quiche::ConnectionId;
use tokio_quiche::{ConnectionIdGenerator, QuicResult};

/// Length of the connection IDs rampart issues (tokio-quiche routes by 20-byte IDs).
pub const CID_LEN: usize = quiclb::MAX_CID_LEN;

/// The socket-steering program: the reuseport group index for a datagram's UDP payload.
///
/// Short header (first bit 0): the destination connection ID is bytes `1..=CID_LEN`. Long
/// header: byte 5 is its length and it starts at byte 6. The index is the ID's last byte
/// modulo `workers`. A datagram too short to read makes the program return 0 (worker 0,
/// which drops it as tokio-quiche would anywhere).
pub fn steering_program(workers: u32) -> Vec<libc::sock_filter> {
    const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const LD_B_IND: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_IND) as u16;
    const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
    const TAX: u16 = (libc::BPF_MISC | libc::BPF_TAX) as u16;
    const MOD_K: u16 = (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16;
    const RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    vec![
        op(LD_B_ABS, 0, 0, 0),              // 0: A = first byte
        op(JSET_K, 2, 0, 0x80),             // 1: long header? to 4
        op(LD_B_ABS, 0, 0, CID_LEN as u32), // 2: A = last byte of a short header's ID
        op(JA, 0, 0, 3),                    // 3: to 7
        op(LD_B_ABS, 0, 0, 5),              // 4: A = ID length
        op(TAX, 0, 0, 0),                   // 5: X = A
        op(LD_B_IND, 0, 0, 5),              // 6: A = byte 5 + length: the ID's last byte
        op(MOD_K, 0, 0, workers),           // 7: A %= workers
        op(RET_A, 0, 0, 0),                 // 8: socket index A
    ]
}

/// Binds `workers` UDP sockets on `addr` as one reuseport group steered by connection ID;
/// socket `i` is worker `i`'s. With one worker, or where the kernel refuses the steering
/// program, returns a single socket (HTTP/3 then runs on worker 0 only).
pub fn bind(addr: SocketAddr, buffer: usize, workers: usize) -> std::io::Result<Vec<UdpSocket>> {
    if workers <= 1 {
        return Ok(vec![bind_udp(addr, buffer, false)?]);
    }
    // A reuseport bind would quietly join another process's group on the same port (another
    // gateway running as the same user): probe with a plain bind first.
    if addr.port() != 0 {
        drop(UdpSocket::bind(addr)?);
    }
    let first = bind_udp(addr, buffer, true)?;
    if let Err(e) = attach_steering(&first, workers as u32) {
        tracing::warn!(%addr, error = %e, "cannot steer QUIC by connection ID; HTTP/3 runs on worker 0 only");
        return Ok(vec![first]);
    }
    // The first socket fixes the port (when 0 was asked for); the others join its group, in
    // order, so group index i is socket i.
    let addr = first.local_addr()?;
    let mut socks = vec![first];
    for _ in 1..workers {
        socks.push(bind_udp(addr, buffer, true)?);
    }
    Ok(socks)
}

fn attach_steering(sock: &UdpSocket, workers: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut program = steering_program(workers);
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `sock` is an open socket for the duration of the call; `prog` points at
    // `program`, which outlives the call (the kernel copies it), and its `len` is the
    // program's length; the option length is the size of `sock_fprog`.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Connection IDs from `inner` whose last byte steers to `worker` of `workers`.
pub struct WorkerIds {
    pub inner: Arc<dyn ConnectionIdGenerator<'static>>,
    pub worker: usize,
    pub workers: usize,
}

impl WorkerIds {
    /// How many IDs to draw before giving up on steering one (a generator whose last byte
    /// never varies); each draw matches with probability 1/workers.
    const MAX_DRAWS: usize = 256;

    fn steers_here(&self, cid: &ConnectionId<'_>) -> bool {
        cid.last()
            .is_some_and(|b| *b as usize % self.workers == self.worker)
    }
}

impl ConnectionIdGenerator<'static> for WorkerIds {
    fn new_connection_id(&self) -> ConnectionId<'static> {
        let mut cid = self.inner.new_connection_id();
        for _ in 1..Self::MAX_DRAWS {
            if self.steers_here(&cid) {
                break;
            }
            cid = self.inner.new_connection_id();
        }
        cid
    }

    fn verify_connection_id(&self, cid: &ConnectionId<'_>) -> QuicResult<()> {
        self.inner.verify_connection_id(cid)
    }
}

/// Binds a UDP socket of a QUIC listener, with large buffers (warning when capped), in a
/// `SO_REUSEPORT` group when `reuse_port` (one socket per worker).
fn bind_udp(
    addr: SocketAddr,
    buffer: usize,
    reuse_port: bool,
) -> std::io::Result<std::net::UdpSocket> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    for (name, set, get) in [
        (
            "receive",
            socket2::Socket::set_recv_buffer_size
                as fn(&socket2::Socket, usize) -> std::io::Result<()>,
            socket2::Socket::recv_buffer_size as fn(&socket2::Socket) -> std::io::Result<usize>,
        ),
        (
            "send",
            socket2::Socket::set_send_buffer_size,
            socket2::Socket::send_buffer_size,
        ),
    ] {
        set(&sock, buffer)?;
        // Linux reports twice the granted size.
        let got = get(&sock)? / 2;
        if got < buffer {
            tracing::warn!(%addr, asked = buffer, got, "UDP {name} buffer capped by the kernel (raise net.core.{}mem_max)", if name == "receive" { "r" } else { "w" });
        }
    }
    sock.set_nonblocking(true)?;
    if reuse_port {
        sock.set_reuse_port(true)?;
    }
    sock.bind(&addr.into())?;
    Ok(sock.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio_quiche::quic::SimpleConnectionIdGenerator;

    /// A datagram with a short header whose 20-byte destination ID ends in `last`.
    fn short_header(last: u8) -> Vec<u8> {
        let mut d = vec![0x40; 1 + CID_LEN + 16];
        d[CID_LEN] = last;
        d
    }

    /// A long-header (Initial-like) datagram whose `len`-byte destination ID ends in `last`.
    fn long_header(len: usize, last: u8) -> Vec<u8> {
        let mut d = vec![0xc0, 0, 0, 0, 1, len as u8];
        d.extend(std::iter::repeat_n(0xaa, len - 1));
        d.push(last);
        d.extend([0; 32]);
        d
    }

    /// Which socket of `socks` receives `datagram` sent from `from`.
    fn receiver(socks: &[UdpSocket], from: &UdpSocket, datagram: &[u8]) -> usize {
        from.send_to(datagram, socks[0].local_addr().unwrap())
            .unwrap();
        let mut buf = [0u8; 256];
        for _ in 0..200 {
            for (i, s) in socks.iter().enumerate() {
                if s.recv_from(&mut buf).is_ok() {
                    return i;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("datagram not received");
    }

    #[test]
    fn the_kernel_steers_datagrams_by_the_connection_ids_last_byte() {
        let workers = 3;
        let socks = bind("127.0.0.1:0".parse().unwrap(), 1 << 20, workers).unwrap();
        assert_eq!(socks.len(), workers, "steering program refused");
        let port = socks[0].local_addr().unwrap().port();
        assert!(socks.iter().all(|s| s.local_addr().unwrap().port() == port));
        // Two client sockets: the same connection ID from a new address (a migrated client)
        // must reach the same worker.
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        for last in [0u8, 1, 2, 3, 100, 254, 255] {
            let want = last as usize % workers;
            for client in [&a, &b] {
                assert_eq!(
                    receiver(&socks, client, &short_header(last)),
                    want,
                    "short {last}"
                );
                assert_eq!(
                    receiver(&socks, client, &long_header(8, last)),
                    want,
                    "long/8 {last}"
                );
                assert_eq!(
                    receiver(&socks, client, &long_header(20, last)),
                    want,
                    "long/20 {last}"
                );
            }
        }
    }

    #[test]
    fn each_worker_issues_ids_that_steer_to_itself() {
        for worker in 0..3 {
            let ids = WorkerIds {
                inner: Arc::new(SimpleConnectionIdGenerator),
                worker,
                workers: 3,
            };
            for _ in 0..200 {
                let cid = ids.new_connection_id();
                assert_eq!(cid.len(), CID_LEN);
                assert_eq!(*cid.last().unwrap() as usize % 3, worker);
            }
        }
    }
}
