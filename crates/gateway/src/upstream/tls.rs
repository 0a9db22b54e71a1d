//! TLS to upstream endpoints (`[clusters.tls]`): one client context per cluster, shared by every
//! worker's copy, verifying the endpoint's certificate for the configured server name against
//! the configured CA file (or the system's roots), offering ALPN for the cluster's protocol,
//! optionally presenting a client certificate (mTLS to the origin).

use crate::config::{UpstreamProtocol, UpstreamTlsConfig};
use anyhow::Context as _;
use boring::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_boring::SslStream;

pub struct UpstreamTls {
    connector: SslConnector,
    server_name: String,
}

impl UpstreamTls {
    pub fn new(cfg: &UpstreamTlsConfig, protocol: UpstreamProtocol) -> anyhow::Result<Self> {
        let mut b = SslConnector::builder(SslMethod::tls())?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
        b.set_verify(SslVerifyMode::PEER);
        match &cfg.ca {
            Some(ca) => b
                .set_ca_file(ca)
                .with_context(|| format!("ca: cannot load {}", ca.display()))?,
            None => b
                .set_default_verify_paths()
                .context("the system's CA roots")?,
        }
        if let (Some(cert), Some(key)) = (&cfg.client_cert, &cfg.client_key) {
            b.set_certificate_chain_file(cert)
                .with_context(|| format!("client_cert: cannot load {}", cert.display()))?;
            b.set_private_key_file(key, SslFiletype::PEM)
                .with_context(|| format!("client_key: cannot load {}", key.display()))?;
            b.check_private_key()
                .context("client_key does not match client_cert")?;
        }
        let alpn: &[u8] = match protocol {
            UpstreamProtocol::H2 => b"\x02h2",
            _ => b"\x08http/1.1",
        };
        b.set_alpn_protos(alpn)?;
        Ok(UpstreamTls {
            connector: b.build(),
            server_name: cfg.server_name.clone(),
        })
    }

    /// The TLS handshake over `tcp`: the certificate verified for the server name.
    pub async fn handshake(&self, tcp: TcpStream) -> Result<SslStream<TcpStream>, String> {
        let cfg = self.connector.configure().map_err(|e| e.to_string())?;
        tokio_boring::connect(cfg, &self.server_name, tcp)
            .await
            .map_err(|e| format!("TLS handshake with {:?}: {e}", self.server_name))
    }
}

/// A connection to `addr` within `timeout`: TCP, then TLS when the cluster has it. The error
/// says what failed (for logs; clients see only that the connect failed).
pub async fn dial(
    addr: std::net::SocketAddr,
    tls: Option<&UpstreamTls>,
    timeout: std::time::Duration,
) -> Result<UpstreamIo, String> {
    let attempt = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        match tls {
            None => Ok(UpstreamIo::Plain(tcp)),
            Some(t) => Ok(UpstreamIo::Tls(Box::new(t.handshake(tcp).await?))),
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no connection within {timeout:?}")))
}

/// An upstream connection: plain TCP or TLS over it.
pub enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, data),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(s) => s.is_write_vectored(),
            UpstreamIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
