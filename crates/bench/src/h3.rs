//! HTTP/3 load: a small quiche client driven on tokio (one UDP socket per connection).

use crate::stats::Recorder;
use crate::BenchArgs;
use anyhow::{anyhow, bail, Context as _};
use quiche::h3::NameValue;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

const MAX_DATAGRAM: usize = 1350;

pub struct H3Target {
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
    pub sigalgs: Option<String>,
    /// Receive coalesced datagrams (UDP_GRO) where the kernel offers it.
    pub gro: bool,
    /// SO_RCVBUF for each connection's socket; 0: the kernel's default.
    pub recv_buffer: usize,
    /// Send (acknowledge) after at most this many datagrams; 0: once the socket is drained.
    pub ack_every: usize,
    /// Send runs of full-size packets as one GSO buffer (Linux UDP_SEGMENT) where the kernel
    /// offers it.
    pub gso: bool,
    /// Each request stream's receive window (flow-control credit, bytes).
    pub stream_window: u64,
}

/// The most packets one GSO send carries: 48 full datagrams stay under 64 KiB.
const GSO_SEGMENTS: usize = 48;

/// Sets a SOL_UDP integer socket option; false where the kernel refuses it.
#[cfg(target_os = "linux")]
fn set_udp_option(sock: &UdpSocket, option: libc::c_int, value: libc::c_int) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket descriptor, and a pointer to an int that lives for the call with
    // its exact size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// Has the kernel cut every send larger than `MAX_DATAGRAM` into datagrams of that size
/// (Linux UDP_SEGMENT as a socket option); false where it cannot.
#[cfg(target_os = "linux")]
fn enable_gso(sock: &UdpSocket) -> bool {
    set_udp_option(sock, libc::UDP_SEGMENT, MAX_DATAGRAM as libc::c_int)
}

/// Asks the kernel to hand over a GSO train as one buffer (Linux UDP_GRO); false where it
/// cannot, and datagrams then arrive one by one.
#[cfg(target_os = "linux")]
fn enable_gro(sock: &UdpSocket) -> bool {
    set_udp_option(sock, libc::UDP_GRO, 1)
}

#[cfg(not(target_os = "linux"))]
fn enable_gso(_sock: &UdpSocket) -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
fn enable_gro(_sock: &UdpSocket) -> bool {
    false
}

/// One non-blocking receive: (bytes, sender, segment size when the kernel coalesced several
/// datagrams of that size into `buf`).
#[cfg(target_os = "linux")]
fn recv_gro(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddr, Option<usize>)> {
    use std::os::fd::AsRawFd;
    sock.try_io(tokio::io::Interest::READABLE, || {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for one cmsg carrying an int (the GRO segment size).
        let mut control = [0u64; 8];
        let mut segment = None;
        // SAFETY: socket2 hands the closure a zeroed sockaddr_storage and its length; `msg`
        // points at it, at `iov` (over `buf`) and at `control`, all live and writable for the
        // call with their true lengths. The cmsg walk stays inside `control`, bounded by the
        // msg_controllen the kernel wrote back; CMSG_DATA of a SOL_UDP/UDP_GRO header holds
        // one int.
        let (n, from) = unsafe {
            socket2::SockAddr::try_init(|name, name_len| {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_name = name.cast();
                msg.msg_namelen = *name_len;
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = std::mem::size_of_val(&control) as _;
                let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, 0);
                if n < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                *name_len = msg.msg_namelen;
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                        let size =
                            std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                        segment = usize::try_from(size).ok().filter(|&s| s > 0);
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
                Ok(n as usize)
            })?
        };
        let from = from
            .as_socket()
            .ok_or_else(|| std::io::Error::other("recvmsg: sender is not an IP address"))?;
        Ok((n, from, segment))
    })
}

#[cfg(not(target_os = "linux"))]
fn recv_gro(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddr, Option<usize>)> {
    sock.try_recv_from(buf).map(|(n, from)| (n, from, None))
}

fn config(sigalgs: Option<&str>, stream_window: u64) -> anyhow::Result<quiche::Config> {
    let mut b = boring::ssl::SslContextBuilder::new(boring::ssl::SslMethod::tls())?;
    if let Some(s) = sigalgs {
        b.set_verify_algorithm_prefs(&crate::parse_sigalgs(s)?)?;
    }
    let mut c = quiche::Config::with_boring_ssl_ctx_builder(quiche::PROTOCOL_VERSION, b)?;
    c.verify_peer(false);
    c.set_application_protos(quiche::h3::APPLICATION_PROTOCOL)?;
    c.set_max_idle_timeout(10_000);
    c.set_max_recv_udp_payload_size(65527);
    c.set_max_send_udp_payload_size(MAX_DATAGRAM);
    c.set_initial_max_stream_data_bidi_local(stream_window);
    // Fixed: quiche would otherwise grow a small window up to 16 MiB.
    c.set_max_stream_window(stream_window);
    c.set_initial_max_data((64 << 20).max(2 * stream_window));
    c.set_initial_max_stream_data_bidi_remote(1 << 20);
    c.set_initial_max_stream_data_uni(1 << 20);
    c.set_initial_max_streams_bidi(100);
    c.set_initial_max_streams_uni(100);
    c.set_disable_active_migration(true);
    c.enable_early_data();
    Ok(c)
}

/// One client connection.
pub struct H3Conn {
    sock: UdpSocket,
    gro: bool,
    gso: bool,
    /// Packets gathered for one GSO send.
    batch: Vec<u8>,
    ack_every: usize,
    local: SocketAddr,
    conn: quiche::Connection,
    h3: Option<quiche::h3::Connection>,
    h3cfg: quiche::h3::Config,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl H3Conn {
    /// Starts a connection; with `session`, resumes (and may send early data at once).
    pub async fn connect(t: &H3Target, session: Option<&[u8]>) -> anyhow::Result<Self> {
        // Any local address of the server's family; connecting picks the route's source
        // address, which quiche's path needs (loopback, or a veth pair into a namespace).
        let any: SocketAddr = match t.addr {
            SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let sock = UdpSocket::bind(any).await?;
        sock.connect(t.addr).await?;
        if t.recv_buffer > 0 {
            // Best effort: the kernel silently caps it at net.core.rmem_max.
            let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(t.recv_buffer);
        }
        let gro = t.gro && enable_gro(&sock);
        let gso = t.gso && enable_gso(&sock);
        let local = sock.local_addr()?;
        let mut scid = [0u8; 16];
        boring::rand::rand_bytes(&mut scid)?;
        let scid = quiche::ConnectionId::from_ref(&scid);
        let mut cfg = config(t.sigalgs.as_deref(), t.stream_window)?;
        let mut conn = quiche::connect(Some(&t.host), &scid, local, t.addr, &mut cfg)?;
        if let Some(s) = session {
            conn.set_session(s)?;
        }
        Ok(H3Conn {
            sock,
            gro,
            gso,
            batch: Vec::with_capacity(if gso { GSO_SEGMENTS * MAX_DATAGRAM } else { 0 }),
            ack_every: t.ack_every,
            local,
            conn,
            h3: None,
            h3cfg: quiche::h3::Config::new()?,
            buf: vec![0; 65535],
            out: vec![0; MAX_DATAGRAM],
        })
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        loop {
            match self.conn.send(&mut self.out) {
                Ok((n, _)) if self.gso => {
                    // Full-size packets gather into one send; a shorter one ends it, as GSO
                    // allows only the last segment to be short.
                    self.batch.extend_from_slice(&self.out[..n]);
                    if n < MAX_DATAGRAM || self.batch.len() >= GSO_SEGMENTS * MAX_DATAGRAM {
                        self.send_batch().await?;
                    }
                }
                Ok((n, info)) => {
                    self.sock.send_to(&self.out[..n], info.to).await?;
                }
                Err(quiche::Error::Done) => return self.send_batch().await,
                Err(e) => bail!("quic send: {e}"),
            }
        }
    }

    /// Sends the gathered packets (the socket is connected to the server) and empties the batch.
    async fn send_batch(&mut self) -> anyhow::Result<()> {
        if !self.batch.is_empty() {
            self.sock.send(&self.batch).await?;
            self.batch.clear();
        }
        Ok(())
    }

    /// Sends, then waits for one datagram or the timer.
    async fn step(&mut self) -> anyhow::Result<()> {
        self.flush().await?;
        if self.conn.is_closed() {
            bail!(
                "connection closed: {:?}",
                self.conn.peer_error().or(self.conn.local_error())
            );
        }
        let wait = self.conn.timeout().unwrap_or(Duration::from_secs(1));
        tokio::select! {
            r = self.sock.readable() => {
                r?;
                // Drain whatever is queued without waiting, acknowledging every
                // `ack_every` datagrams on the way.
                let mut unacked = 0;
                loop {
                    let got = if self.gro {
                        recv_gro(&self.sock, &mut self.buf)
                    } else {
                        self.sock.try_recv_from(&mut self.buf).map(|(n, f)| (n, f, None))
                    };
                    match got {
                        Ok((n, from, segment)) => self.feed(n, from, segment, &mut unacked).await?,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            _ = tokio::time::sleep(wait) => self.conn.on_timeout(),
        }
        Ok(())
    }

    /// Hands `buf[..n]` to quiche, one datagram per GRO segment, sending (so acknowledging)
    /// whenever `unacked` reaches `ack_every`.
    async fn feed(
        &mut self,
        n: usize,
        from: SocketAddr,
        segment: Option<usize>,
        unacked: &mut usize,
    ) -> anyhow::Result<()> {
        let to = self.local;
        let step = segment.unwrap_or(n).max(1);
        let mut at = 0;
        while at < n {
            let end = (at + step).min(n);
            let _ = self
                .conn
                .recv(&mut self.buf[at..end], quiche::RecvInfo { from, to });
            at = end;
            *unacked += 1;
            if self.ack_every > 0 && *unacked >= self.ack_every {
                self.flush().await?;
                *unacked = 0;
            }
        }
        Ok(())
    }

    /// Drives until the handshake completes.
    pub async fn handshake(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.conn.is_established() {
            if Instant::now() > deadline {
                bail!("handshake timeout");
            }
            self.step().await?;
        }
        Ok(())
    }

    pub fn is_resumed(&self) -> bool {
        self.conn.is_resumed()
    }

    pub fn session(&self) -> Option<Vec<u8>> {
        self.conn.session().map(<[u8]>::to_vec)
    }

    /// GET `path`, reading the whole body; returns (status, body bytes). Works before the
    /// handshake completes when resuming (0-RTT).
    pub async fn get(&mut self, t: &H3Target) -> anyhow::Result<(u16, u64)> {
        self.request(t, b"GET", 0).await
    }

    /// POST `path` with a body of `body_len` bytes, sent as fast as flow control lets it,
    /// then reads the response; returns (status, response body bytes).
    pub async fn post(&mut self, t: &H3Target, body_len: u64) -> anyhow::Result<(u16, u64)> {
        self.request(t, b"POST", body_len).await
    }

    async fn request(
        &mut self,
        t: &H3Target,
        method: &[u8],
        body_len: u64,
    ) -> anyhow::Result<(u16, u64)> {
        while !(self.conn.is_established() || self.conn.is_in_early_data()) {
            self.step().await?;
        }
        if self.h3.is_none() {
            self.h3 = Some(quiche::h3::Connection::with_transport(
                &mut self.conn,
                &self.h3cfg,
            )?);
        }
        let mut req = vec![
            quiche::h3::Header::new(b":method", method),
            quiche::h3::Header::new(b":scheme", b"https"),
            quiche::h3::Header::new(b":authority", t.host.as_bytes()),
            quiche::h3::Header::new(b":path", t.path.as_bytes()),
        ];
        if body_len > 0 {
            req.push(quiche::h3::Header::new(
                b"content-length",
                body_len.to_string().as_bytes(),
            ));
        }
        let h3 = self.h3.as_mut().expect("set above");
        let sid = h3.send_request(&mut self.conn, &req, body_len == 0)?;
        let chunk = [0x5au8; 16_384];
        let mut body_sent = 0u64;
        let (mut status, mut bytes) = (0u16, 0u64);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let h3 = self.h3.as_mut().expect("set above");
            // As much of the request body as the stream's flow control takes now.
            while body_sent < body_len {
                let n = (body_len - body_sent).min(chunk.len() as u64) as usize;
                let fin = body_sent + n as u64 == body_len;
                match h3.send_body(&mut self.conn, sid, &chunk[..n], fin) {
                    Ok(0) | Err(quiche::h3::Error::Done) => break,
                    Ok(w) => body_sent += w as u64,
                    Err(e) => bail!("h3 send_body: {e}"),
                }
            }
            loop {
                match h3.poll(&mut self.conn) {
                    Ok((s, quiche::h3::Event::Headers { list, .. })) if s == sid => {
                        for h in list {
                            if h.name() == b":status" {
                                status = std::str::from_utf8(h.value())?.parse()?;
                            }
                        }
                    }
                    Ok((s, quiche::h3::Event::Data)) => {
                        while let Ok(n) = h3.recv_body(&mut self.conn, s, &mut self.buf) {
                            if s == sid {
                                bytes += n as u64;
                            }
                        }
                    }
                    Ok((s, quiche::h3::Event::Finished)) if s == sid => return Ok((status, bytes)),
                    Ok((s, quiche::h3::Event::Reset(e))) if s == sid => bail!("stream reset {e}"),
                    Ok(_) => {}
                    Err(quiche::h3::Error::Done) => break,
                    Err(e) => bail!("h3: {e}"),
                }
            }
            if Instant::now() > deadline {
                bail!("response timeout");
            }
            self.step().await?;
        }
    }

    pub async fn close(mut self) {
        let _ = self.conn.close(true, 0x100, b"");
        let _ = self.flush().await;
    }
}

/// One worker of `h3-handshake`, `h3-requests`, `h3-download` or `h3-upload`.
pub async fn worker(
    t: std::sync::Arc<H3Target>,
    args: std::sync::Arc<BenchArgs>,
    rec: Recorder,
) -> anyhow::Result<()> {
    use crate::Mode;
    let mut session: Option<Vec<u8>> = None;
    if args.resume || args.early_data {
        // A first full connection yields the ticket later connections resume with.
        let mut c = H3Conn::connect(&t, None).await?;
        c.handshake().await?;
        c.get(&t).await.context("warm-up request")?;
        // Tickets arrive after the handshake; give them a moment.
        let until = Instant::now() + Duration::from_millis(100);
        while c.session().is_none() && Instant::now() < until {
            c.step().await?;
        }
        session = c.session();
        c.close().await;
        if session.is_none() {
            bail!("the server issued no session ticket");
        }
    }
    match args.mode {
        Mode::H3InitialFlood => {
            // Each worker paces its share of the rate.
            let every =
                Duration::from_secs_f64(args.concurrency.max(1) as f64 / args.rate.max(1) as f64);
            let mut next = Instant::now();
            while rec.start_op() {
                tokio::time::sleep_until(next.into()).await;
                next += every;
                let start = Instant::now();
                match H3Conn::connect(&t, None).await {
                    Ok(mut c) => match c.flush().await {
                        Ok(()) => rec.ok(start.elapsed()),
                        Err(e) => rec.error(&e),
                    },
                    Err(e) => rec.error(&e),
                }
            }
        }
        Mode::H3Handshake => {
            while rec.start_op() {
                let start = Instant::now();
                let r = async {
                    let mut c = H3Conn::connect(&t, session.as_deref()).await?;
                    if !args.early_data {
                        c.handshake().await?;
                    }
                    let (status, _) = c.get(&t).await?;
                    if (args.resume || args.early_data) && !c.is_resumed() {
                        c.handshake().await?;
                        if !c.is_resumed() {
                            bail!("not resumed");
                        }
                    }
                    // Only resuming runs carry tickets forward; a full-handshake run must not.
                    if args.resume || args.early_data {
                        if let Some(s) = c.session() {
                            session = Some(s);
                        }
                    }
                    c.close().await;
                    anyhow::Ok(status)
                }
                .await;
                match r {
                    Ok(200) => rec.ok(start.elapsed()),
                    Ok(s) => rec.error(&anyhow!("status {s}")),
                    Err(e) => rec.error(&e),
                }
            }
        }
        _ => {
            let mut c = H3Conn::connect(&t, None).await?;
            c.handshake().await?;
            let upload = args.mode == Mode::H3Upload;
            while rec.start_op() {
                let start = Instant::now();
                let r = if upload {
                    c.post(&t, args.upload_bytes).await
                } else {
                    c.get(&t).await
                };
                match r {
                    Ok((200, n)) => {
                        rec.bytes(if upload { args.upload_bytes } else { n });
                        rec.ok(start.elapsed());
                    }
                    Ok((s, _)) => rec.error(&anyhow!("status {s}")),
                    Err(e) => {
                        rec.error(&e);
                        c = H3Conn::connect(&t, None).await?;
                        c.handshake().await?;
                    }
                }
            }
            c.close().await;
        }
    }
    Ok(())
}
