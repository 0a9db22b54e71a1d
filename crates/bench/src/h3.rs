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
}

fn config(sigalgs: Option<&str>) -> anyhow::Result<quiche::Config> {
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
    c.set_initial_max_data(64 << 20);
    c.set_initial_max_stream_data_bidi_local(32 << 20);
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
        let sock = UdpSocket::bind("127.0.0.1:0").await?;
        let local = sock.local_addr()?;
        let mut scid = [0u8; 16];
        boring::rand::rand_bytes(&mut scid)?;
        let scid = quiche::ConnectionId::from_ref(&scid);
        let mut cfg = config(t.sigalgs.as_deref())?;
        let mut conn = quiche::connect(Some(&t.host), &scid, local, t.addr, &mut cfg)?;
        if let Some(s) = session {
            conn.set_session(s)?;
        }
        Ok(H3Conn {
            sock,
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
                Ok((n, info)) => {
                    self.sock.send_to(&self.out[..n], info.to).await?;
                }
                Err(quiche::Error::Done) => return Ok(()),
                Err(e) => bail!("quic send: {e}"),
            }
        }
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
            r = self.sock.recv_from(&mut self.buf) => {
                let (n, from) = r?;
                let to = self.local;
                let _ = self.conn.recv(&mut self.buf[..n], quiche::RecvInfo { from, to });
                // Drain whatever else is queued without waiting.
                while let Ok((n, from)) = self.sock.try_recv_from(&mut self.buf) {
                    let _ = self.conn.recv(&mut self.buf[..n], quiche::RecvInfo { from, to });
                }
            }
            _ = tokio::time::sleep(wait) => self.conn.on_timeout(),
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
        while !(self.conn.is_established() || self.conn.is_in_early_data()) {
            self.step().await?;
        }
        if self.h3.is_none() {
            self.h3 = Some(quiche::h3::Connection::with_transport(
                &mut self.conn,
                &self.h3cfg,
            )?);
        }
        let req = [
            quiche::h3::Header::new(b":method", b"GET"),
            quiche::h3::Header::new(b":scheme", b"https"),
            quiche::h3::Header::new(b":authority", t.host.as_bytes()),
            quiche::h3::Header::new(b":path", t.path.as_bytes()),
        ];
        let h3 = self.h3.as_mut().expect("set above");
        let sid = h3.send_request(&mut self.conn, &req, true)?;
        let (mut status, mut bytes) = (0u16, 0u64);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let h3 = self.h3.as_mut().expect("set above");
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

/// One worker of `h3-handshake`, `h3-requests` or `h3-download`.
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
            while rec.start_op() {
                let start = Instant::now();
                match c.get(&t).await {
                    Ok((200, n)) => {
                        rec.bytes(n);
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
