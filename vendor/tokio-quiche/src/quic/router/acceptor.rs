// Copyright (C) 2025, Cloudflare, Inc.
// All rights reserved.
//
// Redistribution and use in source and binary forms, with or without
// modification, are permitted provided that the following conditions are
// met:
//
//     * Redistributions of source code must retain the above copyright notice,
//       this list of conditions and the following disclaimer.
//
//     * Redistributions in binary form must reproduce the above copyright
//       notice, this list of conditions and the following disclaimer in the
//       documentation and/or other materials provided with the distribution.
//
// THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS
// IS" AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO,
// THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
// PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR
// CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
// EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO,
// PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR
// PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF
// LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING
// NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS
// SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use datagram_socket::DatagramSocketSend;
use datagram_socket::DatagramSocketSendExt;
use datagram_socket::MAX_DATAGRAM_SIZE;
use qlog::writer::make_qlog_writer_from_path;
use qlog::writer::qlog_file_name;
use qlog::writer::QlogCompression;
use quiche::ConnectionId;
use quiche::Header;
use quiche::RetryConnectionIds;
use quiche::Type as PacketType;
use task_killswitch::spawn_with_killswitch;

use crate::metrics::labels;
use crate::metrics::Metrics;
use crate::quic::addr_validation_token::AddrValidationTokenManager;
use crate::quic::connection::SharedConnectionIdGenerator;
use crate::quic::router::NewConnection;
use crate::quic::Incoming;
use crate::QuicResultExt;

use super::InitialPacketHandler;

/// A [`ConnectionAcceptor`] is an [`InitialPacketHandler`] that acts as a
/// server and accepts quic connections.
pub(crate) struct ConnectionAcceptor<S, M> {
    config: ConnectionAcceptorConfig,
    socket: Arc<S>,
    token_manager: AddrValidationTokenManager,
    cid_generator: SharedConnectionIdGenerator,
    metrics: M,
    /// rampart: stateless resets sent in the current second, at most.
    reset_budget: ResetBudget,
}

/// rampart: stateless resets one acceptor sends per second, at most, so a flood
/// of packets with unknown IDs costs a bounded number of replies.
const STATELESS_RESETS_PER_SECOND: u32 = 1000;

/// rampart: a fixed window of `STATELESS_RESETS_PER_SECOND`.
struct ResetBudget {
    window_start: Instant,
    sent: u32,
}

impl ResetBudget {
    fn take(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window_start) >= std::time::Duration::from_secs(1) {
            self.window_start = now;
            self.sent = 0;
        }
        if self.sent >= STATELESS_RESETS_PER_SECOND {
            return false;
        }
        self.sent += 1;
        true
    }
}

/// rampart: how long a stateless reset answering a packet of `received` bytes
/// is: shorter than that packet, so two endpoints cannot keep resetting each
/// other (RFC 9000 §10.3.3), and at most 43 bytes; `None` when the packet is
/// too short to answer with the 22 bytes a reset needs at least (a fixed bit,
/// unpredictable bits, the 16-byte token).
fn stateless_reset_len(received: usize) -> Option<usize> {
    let len = received.checked_sub(1)?.min(43);
    (len >= 22).then_some(len)
}

/// rampart: a stateless reset of `len` bytes into `buf`: a short header's first
/// octet (fixed bit set), unpredictable bytes, then `token`.
fn write_stateless_reset(token: u128, len: usize, buf: &mut [u8]) -> usize {
    let out = &mut buf[..len];
    boring::rand::rand_bytes(out).expect("random bytes");
    out[0] = 0x40 | (out[0] & 0x3f);
    out[len - 16..].copy_from_slice(&token.to_be_bytes());
    len
}

pub(crate) struct ConnectionAcceptorConfig {
    pub(crate) disable_client_ip_validation: bool,
    /// rampart: when set, decides Retry per Initial and counts pending handshakes.
    pub(crate) retry_gate: Option<Arc<crate::quic::RetryGate>>,
    /// rampart: when it returns true, new connection attempts get CONNECTION_REFUSED.
    pub(crate) refuse_new_connections: Option<crate::quic::RefusePredicate>,
    pub(crate) enable_per_connection_dscp: bool,
    pub(crate) qlog_dir: Option<String>,
    pub(crate) qlog_compression: QlogCompression,
    pub(crate) keylog_file: Option<File>,
    #[cfg(target_os = "linux")]
    pub(crate) with_pktinfo: bool,
}

impl<S, M> ConnectionAcceptor<S, M>
where
    S: DatagramSocketSend + Send + 'static,
    M: Metrics,
{
    pub(crate) fn new(
        config: ConnectionAcceptorConfig, socket: Arc<S>,
        token_manager: AddrValidationTokenManager,
        cid_generator: SharedConnectionIdGenerator, metrics: M,
    ) -> Self {
        Self {
            config,
            socket,
            token_manager,
            cid_generator,
            metrics,
            reset_budget: ResetBudget {
                window_start: Instant::now(),
                sent: 0,
            },
        }
    }

    fn accept_conn(
        &mut self, incoming: Incoming, retry_cids: Option<RetryConnectionIds>,
        pending_cid: ConnectionId<'static>, quiche_config: &mut quiche::Config,
    ) -> io::Result<Option<NewConnection>> {
        let handshake_start_time = Instant::now();
        let scid = self.cid_generator.new_connection_id();
        // rampart: the first ID's token goes in the transport parameters.
        quiche_config
            .set_stateless_reset_token(self.cid_generator.stateless_reset_token(&scid));

        let mut conn = if let Some(retry_cids) = retry_cids {
            quiche::accept_with_retry(
                &scid,
                retry_cids,
                incoming.local_addr,
                incoming.peer_addr,
                quiche_config,
            )
        } else {
            quiche::accept_with_buf_factory(
                &scid,
                None,
                incoming.local_addr,
                incoming.peer_addr,
                quiche_config,
            )
        }
        .into_io()?;

        if let Some(qlog_dir) = &self.config.qlog_dir {
            let id = format!("{:?}", scid);
            let path = std::path::Path::new(qlog_dir)
                .join(qlog_file_name(&id, self.config.qlog_compression));
            if let Ok(writer) =
                make_qlog_writer_from_path(&path, self.config.qlog_compression)
            {
                conn.set_qlog(
                    writer,
                    "tokio-quiche qlog".to_string(),
                    format!("tokio-quiche qlog id={id}"),
                );
            }
        }

        if let Some(keylog_file) = &self.config.keylog_file {
            if let Ok(keylog_clone) = keylog_file.try_clone() {
                conn.set_keylog(Box::new(keylog_clone));
            }
        }

        Ok(Some(NewConnection {
            conn: Box::new(conn),
            handshake_start_time,
            pending_cid: Some(pending_cid),
            cid_generator: Some(Arc::clone(&self.cid_generator)),
            initial_pkt: Some(incoming),
            enable_per_connection_dscp: self.config.enable_per_connection_dscp,
            pending_handshake: self.config.retry_gate.as_ref().map(|g| g.enter()),
        }))
    }

    fn handshake_reply(
        &self, incoming: Incoming,
        writer: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<Option<NewConnection>> {
        let mut send_buf = [0u8; MAX_DATAGRAM_SIZE];
        let written = writer(&mut send_buf)?;
        let socket = Arc::clone(&self.socket);
        #[cfg(target_os = "linux")]
        let with_pktinfo = self.config.with_pktinfo;
        #[cfg(target_os = "linux")]
        let would_block_metric = self
            .metrics
            .write_errors(labels::QuicWriteError::WouldBlock);
        #[cfg(target_os = "linux")]
        let send_to_wouldblock_duration_s =
            self.metrics.send_to_wouldblock_duration_s();

        spawn_with_killswitch(async move {
            let send_buf = &send_buf[..written];
            let to = incoming.peer_addr;

            #[allow(unused_variables)]
            let Some(udp) = socket.as_udp_socket() else {
                let _ = socket.send_to(send_buf, to).await;
                return;
            };

            #[cfg(target_os = "linux")]
            {
                let from = with_pktinfo.then_some(incoming.local_addr);
                let _ = crate::quic::io::gso::send_to(
                    udp,
                    to,
                    from,
                    send_buf,
                    Some(send_buf.len()),
                    None,
                    None,
                    &would_block_metric,
                    &send_to_wouldblock_duration_s,
                )
                .await;
            }

            #[cfg(not(target_os = "linux"))]
            let _ = socket.send_to(send_buf, to).await;
        });

        Ok(None)
    }

    fn stateless_retry(
        &mut self, incoming: Incoming, hdr: Header,
    ) -> io::Result<Option<NewConnection>> {
        let scid = self.cid_generator.new_connection_id();

        let token = self.token_manager.gen(&hdr.dcid, incoming.peer_addr);

        self.handshake_reply(incoming, move |buf| {
            quiche::retry(&hdr.scid, &hdr.dcid, &scid, &token, hdr.version, buf)
                .into_io()
        })
    }
}

impl<S, M> InitialPacketHandler for ConnectionAcceptor<S, M>
where
    S: DatagramSocketSend + Send + 'static,
    M: Metrics,
{
    fn handle_initials(
        &mut self, incoming: Incoming, hdr: quiche::Header<'static>,
        quiche_config: &mut quiche::Config,
    ) -> io::Result<Option<NewConnection>> {
        if hdr.ty != PacketType::Initial {
            // Non-initial packets should have a valid CID, but we want to have
            // some telemetry if this isn't the case.
            if let Err(e) = self.cid_generator.verify_connection_id(&hdr.dcid) {
                self.metrics.invalid_cid_packet_count(e).inc();
            }

            // rampart: a short-header packet for an ID no connection here has:
            // a stateless reset, when the generator derives reset tokens.
            if hdr.ty == PacketType::Short {
                if let Some(token) = self.cid_generator.stateless_reset_token(&hdr.dcid) {
                    let received = incoming.buf.len();
                    if let Some(len) = stateless_reset_len(received) {
                        if self.reset_budget.take(Instant::now()) {
                            return self.handshake_reply(incoming, |buf| {
                                Ok(write_stateless_reset(token, len, buf))
                            });
                        }
                    }
                }
            }

            Err(labels::QuicInvalidInitialPacketError::WrongType(hdr.ty))?;
        }

        if !quiche::version_is_supported(hdr.version) {
            return self.handshake_reply(incoming, |buf| {
                quiche::negotiate_version(&hdr.scid, &hdr.dcid, buf).into_io()
            });
        }

        // rampart: at capacity, or from an address the listener does not serve, a new
        // connection attempt is refused at once with a stateless CONNECTION_CLOSE
        // (CONNECTION_REFUSED, 0x2) rather than handshaking.
        if self
            .config
            .refuse_new_connections
            .as_ref()
            .is_some_and(|f| f(incoming.peer_addr))
        {
            let scid = self.cid_generator.new_connection_id();
            return self.handshake_reply(incoming, move |buf| {
                quiche::refuse(&hdr.scid, &hdr.dcid, &scid, hdr.version, 0x2, buf)
                    .into_io()
            });
        }

        // NOTE: token is always present in Initial packets
        let token = hdr.token.as_ref().unwrap();

        // rampart: with a gate, Retry depends on the pending handshakes; a client that
        // already carries a token is validated below either way.
        if let Some(gate) = &self.config.retry_gate {
            if token.is_empty() {
                if gate.take_retry() {
                    return self.stateless_retry(incoming, hdr);
                }
                return self.accept_conn(incoming, None, hdr.dcid, quiche_config);
            }
        } else if self.config.disable_client_ip_validation {
            return self.accept_conn(incoming, None, hdr.dcid, quiche_config);
        } else if token.is_empty() {
            return self.stateless_retry(incoming, hdr);
        }

        let original_dcid = self
            .token_manager
            .validate_and_extract_original_dcid(token, incoming.peer_addr)
            .or(Err(
                labels::QuicInvalidInitialPacketError::TokenValidationFail,
            ))?;

        let retry_cids = Some(RetryConnectionIds {
            original_destination_cid: &original_dcid,
            retry_source_cid: &hdr.dcid,
        });

        self.accept_conn(incoming, retry_cids, hdr.dcid.clone(), quiche_config)
    }
}

#[cfg(all(target_os = "linux", test, not(feature = "fuzzing")))]
mod tests {
    use super::*;
    use crate::metrics::DefaultMetrics;
    use crate::quic::connection::SimpleConnectionIdGenerator;
    use crate::quic::io::gso::test::enable_tos;
    use crate::quic::io::gso::test::recv_tos;
    use nix::sys::socket::setsockopt;
    use nix::sys::socket::sockopt;
    use tokio::net::UdpSocket;

    /// rampart: a stateless reset is shorter than the packet it answers (no
    /// reset loops), at least 22 bytes, a short header ending in the token; at
    /// most STATELESS_RESETS_PER_SECOND go out a second.
    #[test]
    fn stateless_resets_are_shorter_than_what_they_answer_and_bounded() {
        assert_eq!(stateless_reset_len(0), None);
        assert_eq!(stateless_reset_len(22), None);
        assert_eq!(stateless_reset_len(23), Some(22));
        assert_eq!(stateless_reset_len(30), Some(29));
        assert_eq!(stateless_reset_len(1200), Some(43));
        let token = 0x0011_2233_4455_6677_8899_aabb_ccdd_eeffu128;
        let mut buf = [0u8; 64];
        assert_eq!(write_stateless_reset(token, 29, &mut buf), 29);
        assert_eq!(buf[0] & 0xc0, 0x40, "short header, fixed bit set");
        assert_eq!(&buf[13..29], &token.to_be_bytes());

        let t0 = Instant::now();
        let mut budget = ResetBudget {
            window_start: t0,
            sent: 0,
        };
        for _ in 0..STATELESS_RESETS_PER_SECOND {
            assert!(budget.take(t0));
        }
        assert!(!budget.take(t0 + std::time::Duration::from_millis(999)));
        assert!(budget.take(t0 + std::time::Duration::from_secs(1)));
    }

    async fn check_stateless_reply_inherits_socket_dscp(
        bind_addr: &str, dscp: u8,
    ) {
        let sender = Arc::new(UdpSocket::bind(bind_addr).await.unwrap());
        let receiver = UdpSocket::bind(bind_addr).await.unwrap();
        enable_tos(&receiver);
        let tos = i32::from(dscp) << 2;
        if sender.local_addr().unwrap().is_ipv4() {
            setsockopt(sender.as_ref(), sockopt::Ipv4Tos, &tos).unwrap();
        } else {
            setsockopt(sender.as_ref(), sockopt::Ipv6TClass, &tos).unwrap();
        }

        let acceptor = ConnectionAcceptor::new(
            ConnectionAcceptorConfig {
                disable_client_ip_validation: false,
                retry_gate: None,
                refuse_new_connections: None,
                enable_per_connection_dscp: dscp != 0,
                qlog_dir: None,
                qlog_compression: QlogCompression::None,
                keylog_file: None,
                with_pktinfo: true,
            },
            Arc::clone(&sender),
            Default::default(),
            Arc::new(SimpleConnectionIdGenerator),
            DefaultMetrics,
        );

        let incoming = Incoming {
            peer_addr: receiver.local_addr().unwrap(),
            local_addr: sender.local_addr().unwrap(),
            rx_time: None,
            buf: Vec::new(),
            gro: None,
            so_mark_data: None,
        };
        acceptor
            .handshake_reply(incoming, |buf| {
                buf[..5].copy_from_slice(b"reply");
                Ok(5)
            })
            .unwrap();

        let (payload, tos) = recv_tos(&receiver).await;
        assert_eq!(payload, b"reply");
        assert_eq!(tos >> 2, dscp);
    }

    #[tokio::test]
    async fn stateless_reply_inherits_ipv4_socket_dscp() {
        for dscp in [34, 0] {
            check_stateless_reply_inherits_socket_dscp("127.0.0.1:0", dscp).await;
        }
    }

    #[tokio::test]
    async fn stateless_reply_inherits_ipv6_socket_dscp() {
        for dscp in [34, 0] {
            check_stateless_reply_inherits_socket_dscp("[::1]:0", dscp).await;
        }
    }
}
