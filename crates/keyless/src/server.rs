//! The key server: answers keyless requests over mutually authenticated TLS. Requests are
//! pipelined: each is signed as soon as it is read (through the key engine, so batching applies
//! across every connected gateway) and answered when done, out of order, matched by id.

use crate::codec::{self, ErrorCode, Message, Op};
use boring::ssl::SslAcceptor;
use keyengine::{KeyEngine, KeyId, KeyKind, SignError, SignatureAlgorithm};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

/// Counters a key server keeps (exported by its admin listener).
#[derive(Default, Debug)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub open_connections: AtomicU64,
    pub tls_failures: AtomicU64,
    pub requests: AtomicU64,
    pub pings: AtomicU64,
    /// Error responses by code (index = code byte).
    pub errors: [AtomicU64; 10],
}

impl ServerStats {
    pub fn errors_by_code(&self) -> Vec<(ErrorCode, u64)> {
        (1u8..=9)
            .filter_map(|c| {
                Some((
                    ErrorCode::from_byte(c)?,
                    self.errors[c as usize].load(Ordering::Relaxed),
                ))
            })
            .collect()
    }
}

pub struct KeyServer {
    pub engine: Arc<KeyEngine>,
    pub acceptor: Arc<SslAcceptor>,
    /// Requests a single connection may have in flight; reading pauses beyond it.
    pub max_in_flight: usize,
    pub handshake_timeout: Duration,
    pub stats: Arc<ServerStats>,
}

/// Maps a signing opcode to the key engine's algorithm for a key of `kind` (the ECDSA opcodes
/// name a hash, not a curve). `None`: not supported here.
pub fn algorithm_for(op: Op, kind: Option<KeyKind>) -> Option<SignatureAlgorithm> {
    let p256 = kind == Some(KeyKind::EcdsaP256);
    Some(match op {
        Op::EcdsaSignSha384 if p256 => SignatureAlgorithm::EcdsaP256Sha384,
        Op::EcdsaSignSha512 if p256 => SignatureAlgorithm::EcdsaP256Sha512,
        Op::RsaSignSha256 => SignatureAlgorithm::RsaPkcs1Sha256,
        Op::RsaSignSha384 => SignatureAlgorithm::RsaPkcs1Sha384,
        Op::RsaSignSha512 => SignatureAlgorithm::RsaPkcs1Sha512,
        Op::RsaPssSignSha256 => SignatureAlgorithm::RsaPssSha256,
        Op::RsaPssSignSha384 => SignatureAlgorithm::RsaPssSha384,
        Op::RsaPssSignSha512 => SignatureAlgorithm::RsaPssSha512,
        Op::EcdsaSignSha256 => SignatureAlgorithm::EcdsaP256Sha256,
        Op::EcdsaSignSha384 => SignatureAlgorithm::EcdsaP384Sha384,
        _ => return None,
    })
}

/// The opcode for an algorithm (client side).
pub fn opcode_for(alg: SignatureAlgorithm) -> Op {
    match alg {
        SignatureAlgorithm::RsaPkcs1Sha256 => Op::RsaSignSha256,
        SignatureAlgorithm::RsaPkcs1Sha384 => Op::RsaSignSha384,
        SignatureAlgorithm::RsaPkcs1Sha512 => Op::RsaSignSha512,
        SignatureAlgorithm::RsaPssSha256 => Op::RsaPssSignSha256,
        SignatureAlgorithm::RsaPssSha384 => Op::RsaPssSignSha384,
        SignatureAlgorithm::RsaPssSha512 => Op::RsaPssSignSha512,
        SignatureAlgorithm::EcdsaP256Sha256 => Op::EcdsaSignSha256,
        SignatureAlgorithm::EcdsaP384Sha384 | SignatureAlgorithm::EcdsaP256Sha384 => {
            Op::EcdsaSignSha384
        }
        SignatureAlgorithm::EcdsaP256Sha512 => Op::EcdsaSignSha512,
    }
}

impl KeyServer {
    /// Answers one request. Never fails: every problem is an error response.
    pub async fn answer(&self, req: Message) -> Message {
        let id = req.id;
        let Some(op) = req.opcode else {
            return Message::error(id, ErrorCode::Format);
        };
        if op == Op::Ping {
            self.stats.pings.fetch_add(1, Ordering::Relaxed);
            return Message {
                opcode: Some(Op::Pong),
                ..Message::ping(id, req.payload.unwrap_or_default())
            };
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if op.is_response() {
            return Message::error(id, ErrorCode::UnexpectedOpcode);
        }
        // Existing key servers answer a request without SKI (digest or SNI only) with
        // "internal error"; rampart does the same.
        let Some(ski) = req.ski else {
            return Message::error(id, ErrorCode::Internal);
        };
        let kind = self.engine.key(&KeyId(ski)).map(|k| k.public.kind());
        let Some(alg) = algorithm_for(op, kind) else {
            return Message::error(id, ErrorCode::BadOpcode);
        };
        let Some(payload) = req.payload else {
            return Message::error(id, ErrorCode::Format);
        };
        let key = KeyId(ski);
        match self.engine.sign(&key, alg, payload).await {
            Ok(sig) => Message::response(id, sig),
            Err(SignError::KeyNotFound(k)) => {
                tracing::warn!(key = %k, "key not found");
                Message::error(id, ErrorCode::KeyNotFound)
            }
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "signing failed");
                Message::error(id, ErrorCode::CryptoFailed)
            }
        }
    }

    fn count_error(&self, m: &Message) {
        if m.opcode == Some(Op::Error) {
            if let Some(&c) = m.payload.as_ref().and_then(|p| p.first()) {
                if let Some(slot) = self.stats.errors.get(c as usize) {
                    slot.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Accepts connections until `stop` turns true.
pub async fn serve(listener: TcpListener, server: Arc<KeyServer>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(tcp, peer, server.clone(), stop.clone()));
    }
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    server: Arc<KeyServer>,
    stop: watch::Receiver<bool>,
) {
    let stats = server.stats.clone();
    let tls = match tokio::time::timeout(
        server.handshake_timeout,
        tokio_boring::accept(&server.acceptor, tcp),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            stats.tls_failures.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, error = %e, "key server TLS handshake failed");
            return;
        }
        Err(_) => {
            stats.tls_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    stats.connections.fetch_add(1, Ordering::Relaxed);
    stats.open_connections.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = pipeline(tls, server, stop).await {
        tracing::debug!(%peer, error = %e, "key server connection ended");
    }
    stats.open_connections.fetch_sub(1, Ordering::Relaxed);
}

/// Reads frames, answers each concurrently (bounded), writes answers as they complete.
async fn pipeline<S>(
    stream: S,
    server: Arc<KeyServer>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(server.max_in_flight.max(1));
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            wr.write_all(&frame).await?;
            // Batch what is ready into one flush.
            while let Ok(more) = rx.try_recv() {
                wr.write_all(&more).await?;
            }
            wr.flush().await?;
        }
        wr.shutdown().await
    });
    let permits = Arc::new(Semaphore::new(server.max_in_flight.max(1)));
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 16 * 1024];
    'read: loop {
        // Decode every complete frame in the buffer.
        loop {
            match codec::decode(&buf) {
                Ok(Some((msg, used))) => {
                    buf.drain(..used);
                    let permit = permits
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("semaphore open");
                    let server = server.clone();
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let answer = server.answer(msg).await;
                        server.count_error(&answer);
                        if let Ok(bytes) = codec::encode(&answer, true) {
                            let _ = tx.send(bytes).await;
                        }
                        drop(permit);
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    // The header delimited the frame: answer it and skip it.
                    let used = codec::frame_len(&buf).unwrap_or(buf.len()).min(buf.len());
                    buf.drain(..used);
                    tracing::debug!(error = %e, "malformed keyless frame");
                    if let Some(id) = e.id() {
                        let answer = Message::error(id, e.code());
                        server.count_error(&answer);
                        if let Ok(bytes) = codec::encode(&answer, true) {
                            if tx.send(bytes).await.is_err() {
                                break 'read;
                            }
                        }
                    }
                }
            }
        }
        let n = tokio::select! {
            r = rd.read(&mut chunk) => r?,
            _ = stop.wait_for(|s| *s) => 0,
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    // Let in-flight answers finish, then close.
    drop(tx);
    let _ = permits
        .acquire_many(server.max_in_flight.max(1) as u32)
        .await;
    writer.await.unwrap_or(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyengine::testing::generate_rsa_pkcs8;
    use keyengine::{
        EngineMetrics, InlineEngine, KeyRegistry, PrivateKey, Scheduler, SchedulerPolicy,
    };

    fn server() -> (Arc<KeyServer>, KeyId) {
        let mut reg = KeyRegistry::new();
        let id = reg.insert(PrivateKey::from_der("PRIVATE KEY", &generate_rsa_pkcs8()).unwrap());
        let sched =
            Scheduler::new(vec![Arc::new(InlineEngine)], &SchedulerPolicy::default()).unwrap();
        let engine = KeyEngine::new(reg, sched, EngineMetrics::unregistered());
        // The acceptor is not used by `answer`/`pipeline`; a minimal one satisfies the type.
        let acceptor = SslAcceptor::mozilla_intermediate_v5(boring::ssl::SslMethod::tls())
            .unwrap()
            .build();
        let s = KeyServer {
            engine,
            acceptor: Arc::new(acceptor),
            max_in_flight: 4,
            handshake_timeout: Duration::from_secs(1),
            stats: Default::default(),
        };
        (Arc::new(s), id)
    }

    #[tokio::test]
    async fn answers_sign_ping_and_errors() {
        let (s, id) = server();
        let digest = SignatureAlgorithm::RsaPssSha256.hash().digest(b"hello");
        let r = s
            .answer(Message::request(
                1,
                Op::RsaPssSignSha256,
                id.0,
                digest.clone(),
            ))
            .await;
        assert_eq!(r.opcode, Some(Op::Response));
        let sig = r.payload.unwrap();
        let key = s.engine.key(&id).unwrap();
        assert!(key
            .public
            .verify_digest(SignatureAlgorithm::RsaPssSha256, &digest, &sig));
        let pong = s.answer(Message::ping(2, vec![7, 7])).await;
        assert_eq!(
            (pong.opcode, pong.payload),
            (Some(Op::Pong), Some(vec![7, 7]))
        );
        let cases = [
            (
                Message::request(3, Op::RsaPssSignSha256, [9; 20], digest.clone()),
                ErrorCode::KeyNotFound,
            ),
            (
                Message::request(4, Op::RsaDecrypt, id.0, vec![0; 256]),
                ErrorCode::BadOpcode,
            ),
            (
                Message::request(5, Op::Response, id.0, vec![]),
                ErrorCode::UnexpectedOpcode,
            ),
            (
                Message {
                    ski: None,
                    ..Message::request(6, Op::RsaSignSha256, id.0, digest.clone())
                },
                ErrorCode::Internal,
            ),
            (
                Message::request(7, Op::EcdsaSignSha256, id.0, digest),
                ErrorCode::CryptoFailed,
            ),
        ];
        for (req, code) in cases {
            let id = req.id;
            assert_eq!(s.answer(req).await, Message::error(id, code));
        }
    }

    #[tokio::test]
    async fn pipelined_requests_and_malformed_frames_on_one_stream() {
        let (s, id) = server();
        let (client, server_side) = tokio::io::duplex(1 << 16);
        let (_stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(pipeline(server_side, s.clone(), stop));
        let (mut rd, mut wr) = tokio::io::split(client);
        let digest = SignatureAlgorithm::RsaPkcs1Sha256.hash().digest(b"x");
        let mut out = Vec::new();
        for i in 0..10u32 {
            out.extend(
                codec::encode(
                    &Message::request(i, Op::RsaSignSha256, id.0, digest.clone()),
                    true,
                )
                .unwrap(),
            );
        }
        // A frame with an unknown tag (id 99), then a valid ping (id 100).
        out.extend_from_slice(&[1, 0, 0, 4, 0, 0, 0, 99, 0x7E, 0, 1, 0]);
        out.extend(codec::encode(&Message::ping(100, vec![1]), true).unwrap());
        wr.write_all(&out).await.unwrap();
        wr.shutdown().await.unwrap();
        let mut all = Vec::new();
        rd.read_to_end(&mut all).await.unwrap();
        task.await.unwrap().unwrap();
        let mut got = std::collections::BTreeMap::new();
        let mut rest = &all[..];
        while let Some((m, used)) = codec::decode(rest).unwrap() {
            assert_eq!(used, codec::PADDED_LEN, "responses are padded");
            got.insert(m.id, m);
            rest = &rest[used..];
        }
        assert_eq!(got.len(), 12);
        assert!((0..10).all(|i| got[&i].opcode == Some(Op::Response)));
        assert_eq!(got[&99], Message::error(99, ErrorCode::Format));
        assert_eq!(got[&100].opcode, Some(Op::Pong));
    }
}
