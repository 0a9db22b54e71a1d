//! `rampart bench quic-send`: what quiche's server side costs per packet of a bulk download,
//! in process: no sockets, no kernel, no event loop, no upstream.
//!
//! A client and a server connection exchange datagrams in memory. The server keeps one
//! response stream's send buffer topped up; each round it writes up to one GSO batch of
//! packets, the client takes them, reads the data and acknowledges, and the server reads the
//! acknowledgements. Only the server's calls are timed: `stream_send` (buffering the body),
//! `send` (building and sealing packets) and `recv` (processing ACKs). Their sum per packet is
//! the user-space budget the HTTP/3 bulk goal is about (see docs/benchmarks-history.md), measured
//! without the loopback's noise, so a change to the packet writer can be compared in seconds.

use crate::BenchArgs;
use anyhow::{anyhow, Context as _};
use boring::asn1::Asn1Time;
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::x509::{X509Name, X509};
use serde::Serialize;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The largest UDP payload sent: 1350, the gateway's size without path MTU discovery, kept so
/// that figures compare across runs (the gateway now discovers up to 1452 by default).
const PAYLOAD: usize = 1350;
/// Packets per round: one 64 KB GSO buffer's worth, as tokio-quiche writes them.
const BATCH: usize = 48;
/// Body bytes offered to the stream at a time.
const CHUNK: usize = 256 * 1024;
/// The response stream (the client's first bidirectional stream).
const STREAM: u64 = 0;

/// One run's figures, server side only.
#[derive(Debug, Serialize)]
pub struct QuicSendRun {
    pub packets: u64,
    /// Stream bytes the client received.
    pub bytes: u64,
    /// Server time in quiche calls, all three kinds.
    pub server_seconds: f64,
    pub ns_per_packet: f64,
    /// Of it: building and sealing packets (`send`).
    pub send_ns_per_packet: f64,
    /// Of it: processing the client's ACKs (`recv`).
    pub ack_ns_per_packet: f64,
    /// Of it: buffering the body (`stream_send`, a copy).
    pub buffer_ns_per_packet: f64,
    /// `server_seconds` per GB (10^9 bytes) of stream data: comparable with the user-space
    /// part of `h3-download`'s server CPU per GB.
    pub server_seconds_per_gb: f64,
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let r = measure(args.duration, args.requests)?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "quic-send: {} packets, {} bytes in {:.2} s of server calls\n  {:.0} ns per packet (send {:.0}, ACKs {:.0}, buffering {:.0})  →  {:.3} s per GB",
            r.packets,
            r.bytes,
            r.server_seconds,
            r.ns_per_packet,
            r.send_ns_per_packet,
            r.ack_ns_per_packet,
            r.buffer_ns_per_packet,
            r.server_seconds_per_gb
        );
    }
    Ok(())
}

/// Runs the download for `duration` (or until `max_packets` were sent).
pub fn measure(duration: Duration, max_packets: Option<u64>) -> anyhow::Result<QuicSendRun> {
    let (mut server, mut client) = connected_pair()?;
    let (caddr, saddr) = addrs();
    let mut to_server = Vec::new();
    // One buffer of PAYLOAD-sized slots, as a GSO buffer: packet i at i × PAYLOAD.
    let mut batch = vec![0u8; PAYLOAD * BATCH];
    let mut lens = [0usize; BATCH];
    let mut sink = vec![0u8; 1 << 16];
    let body = vec![0x5a_u8; CHUNK];

    // The request, then the response body, one stream.
    client.stream_send(STREAM, b"GET /", true)?;
    flush(&mut client, &mut server, &mut to_server, caddr, saddr)?;
    while server.stream_recv(STREAM, &mut sink).is_ok() {}

    let (mut send_t, mut ack_t, mut buffer_t) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut packets, mut bytes, mut idle_rounds) = (0u64, 0u64, 0u32);
    let deadline = Instant::now() + duration;
    let max_packets = max_packets.unwrap_or(u64::MAX);
    while Instant::now() < deadline && packets < max_packets {
        let t = Instant::now();
        let cap = server.stream_capacity(STREAM)?;
        if cap > 0 {
            server.stream_send(STREAM, &body[..cap.min(CHUNK)], false)?;
        }
        buffer_t += t.elapsed();

        // As tokio-quiche fills a GSO buffer: packet by packet, except that once the first
        // has set the segment size, quiche writes what it can of the rest in one burst.
        let t = Instant::now();
        let now = t;
        let mut n = 0;
        while n < BATCH {
            let slot = &mut batch[n * PAYLOAD..(n + 1) * PAYLOAD];
            match server.send_on_path_at(slot, None, None, now) {
                Ok((len, _)) => {
                    lens[n] = len;
                    n += 1;
                }
                Err(quiche::Error::Done) => break,
                Err(e) => return Err(e).context("server send"),
            }
            if n == 1 && lens[0] == PAYLOAD {
                let (packets, bytes) = server
                    .send_stream_burst_at(
                        &mut batch[PAYLOAD..],
                        PAYLOAD,
                        BATCH - 1,
                        None,
                        None,
                        now,
                        None,
                    )
                    .context("server burst")?;
                for (i, len) in lens[1..=packets].iter_mut().enumerate() {
                    *len = (bytes - i * PAYLOAD).min(PAYLOAD);
                }
                n += packets;
            }
        }
        send_t += t.elapsed();
        packets += n as u64;

        // The client (not timed): takes the packets, reads the data, acknowledges.
        for (pkt, len) in batch.chunks_mut(PAYLOAD).zip(&lens[..n]) {
            let info = quiche::RecvInfo {
                from: saddr,
                to: caddr,
            };
            client.recv(&mut pkt[..*len], info)?;
        }
        while let Ok((len, _)) = client.stream_recv(STREAM, &mut sink) {
            bytes += len as u64;
        }
        to_server.clear();
        collect(&mut client, &mut to_server)?;

        let t = Instant::now();
        for pkt in &mut to_server {
            let info = quiche::RecvInfo {
                from: caddr,
                to: saddr,
            };
            server.recv(pkt, info)?;
        }
        ack_t += t.elapsed();

        if n == 0 && to_server.is_empty() {
            // Nothing moved: let due timers fire, and give up if that does not help.
            idle_rounds += 1;
            if idle_rounds > 1000 {
                return Err(anyhow!("quic-send stalled after {packets} packets"));
            }
            server.on_timeout();
            client.on_timeout();
        } else {
            idle_rounds = 0;
        }
        if server.is_closed() || client.is_closed() {
            return Err(anyhow!("connection closed: {:?}", server.local_error()));
        }
    }
    let total = send_t + ack_t + buffer_t;
    let per_packet = |d: Duration| d.as_nanos() as f64 / packets.max(1) as f64;
    Ok(QuicSendRun {
        packets,
        bytes,
        server_seconds: total.as_secs_f64(),
        ns_per_packet: per_packet(total),
        send_ns_per_packet: per_packet(send_t),
        ack_ns_per_packet: per_packet(ack_t),
        buffer_ns_per_packet: per_packet(buffer_t),
        server_seconds_per_gb: total.as_secs_f64() / (bytes.max(1) as f64 / 1e9),
    })
}

fn addrs() -> (SocketAddr, SocketAddr) {
    (
        ([127, 0, 0, 1], 40001).into(),
        ([127, 0, 0, 1], 40002).into(),
    )
}

/// A server and a client connection, handshake done, with windows large enough that flow
/// control never holds the server back.
fn connected_pair() -> anyhow::Result<(quiche::Connection, quiche::Connection)> {
    let (key, cert) = self_signed()?;
    let mut ctx = boring::ssl::SslContextBuilder::new(boring::ssl::SslMethod::tls())?;
    ctx.set_private_key(&key)?;
    ctx.set_certificate(&cert)?;
    let mut scfg = quiche::Config::with_boring_ssl_ctx_builder(quiche::PROTOCOL_VERSION, ctx)?;
    let mut ccfg = quiche::Config::new(quiche::PROTOCOL_VERSION)?;
    ccfg.verify_peer(false);
    for c in [&mut scfg, &mut ccfg] {
        c.set_application_protos(&[b"bench"])?;
        c.set_max_idle_timeout(30_000);
        c.set_max_send_udp_payload_size(PAYLOAD);
        c.set_max_recv_udp_payload_size(PAYLOAD);
        c.set_initial_max_data(1 << 30);
        c.set_initial_max_stream_data_bidi_local(1 << 30);
        c.set_initial_max_stream_data_bidi_remote(1 << 30);
        c.set_initial_max_streams_bidi(10);
    }
    let (caddr, saddr) = addrs();
    let scid = quiche::ConnectionId::from_ref(&[1; 16]);
    let ccid = quiche::ConnectionId::from_ref(&[2; 16]);
    let mut client = quiche::connect(Some("localhost"), &ccid, caddr, saddr, &mut ccfg)?;
    let mut server = quiche::accept(&scid, None, saddr, caddr, &mut scfg)?;
    let mut buf = Vec::new();
    for _ in 0..50 {
        flush(&mut client, &mut server, &mut buf, caddr, saddr)?;
        flush(&mut server, &mut client, &mut buf, saddr, caddr)?;
        if client.is_established() && server.is_established() {
            return Ok((server, client));
        }
    }
    Err(anyhow!("in-memory QUIC handshake did not complete"))
}

/// Everything `from` has to send, as datagrams.
fn collect(from: &mut quiche::Connection, out: &mut Vec<Vec<u8>>) -> anyhow::Result<()> {
    let mut buf = [0u8; PAYLOAD];
    loop {
        match from.send(&mut buf) {
            Ok((len, _)) => out.push(buf[..len].to_vec()),
            Err(quiche::Error::Done) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Delivers everything `from` has to send to `to`.
fn flush(
    from: &mut quiche::Connection,
    to: &mut quiche::Connection,
    buf: &mut Vec<Vec<u8>>,
    from_addr: SocketAddr,
    to_addr: SocketAddr,
) -> anyhow::Result<()> {
    buf.clear();
    collect(from, buf)?;
    for pkt in buf.iter_mut() {
        let info = quiche::RecvInfo {
            from: from_addr,
            to: to_addr,
        };
        to.recv(pkt, info)?;
    }
    Ok(())
}

/// A throwaway P-256 key and self-signed certificate for `localhost`.
fn self_signed() -> anyhow::Result<(PKey<Private>, X509)> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
    let mut name = X509Name::builder()?;
    name.append_entry_by_nid(Nid::COMMONNAME, "localhost")?;
    let name = name.build();
    let mut b = X509::builder()?;
    b.set_version(2)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(&name)?;
    b.set_pubkey(&key)?;
    let (from, to) = (Asn1Time::days_from_now(0)?, Asn1Time::days_from_now(1)?);
    b.set_not_before(&from)?;
    b.set_not_after(&to)?;
    b.sign(&key, MessageDigest::sha256())?;
    Ok((key, b.build()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_sends_full_packets_and_the_client_gets_the_stream() {
        let r = measure(Duration::from_secs(10), Some(2_000)).unwrap();
        assert!(r.packets >= 2_000, "{r:?}");
        // Each packet carries one STREAM frame filling it but for headers and the tag.
        let per_packet = r.bytes as f64 / r.packets as f64;
        assert!((1_250.0..1_350.0).contains(&per_packet), "{r:?}");
        let parts = r.send_ns_per_packet + r.ack_ns_per_packet + r.buffer_ns_per_packet;
        assert!((parts - r.ns_per_packet).abs() < 1.0, "{r:?}");
        assert!(
            r.ack_ns_per_packet > 0.0 && r.send_ns_per_packet > 0.0,
            "{r:?}"
        );
    }
}
