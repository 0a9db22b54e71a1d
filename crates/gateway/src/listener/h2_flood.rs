//! A cap on the HTTP/2 control frames a client sends: SETTINGS and PING (each of which the
//! server must answer) and PRIORITY (which it must process), counted per connection in a
//! token bucket. Past it the connection is closed, as nghttp2 and Envoy close such floods.
//!
//! The counter reads the decrypted byte stream as it goes to hyper: it parses only the
//! 9-byte frame headers and skips payloads arithmetically, so it costs a few instructions
//! per frame. Fuzzed (`fuzz/fuzz_targets/h2_frames.rs`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const PRIORITY: u8 = 0x2;
const ACK: u8 = 0x1;

/// Counts control frames in a client's HTTP/2 byte stream against a token bucket.
pub struct FrameCounter {
    /// Preface bytes still to skip.
    preface_left: usize,
    header: [u8; 9],
    header_len: usize,
    /// Payload bytes of the current frame still to skip.
    payload_left: usize,
    tokens: f64,
    per_second: f64,
    burst: f64,
    last: Option<Instant>,
}

/// The client sent control frames faster than its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flood;

impl FrameCounter {
    /// `per_second` control frames on average, with a burst of ten seconds' worth (at
    /// least 100).
    pub fn new(per_second: u32) -> Self {
        let burst = (per_second as f64 * 10.0).max(100.0);
        FrameCounter {
            preface_left: PREFACE_LEN,
            header: [0; 9],
            header_len: 0,
            payload_left: 0,
            tokens: burst,
            per_second: per_second as f64,
            burst,
            last: None,
        }
    }

    /// Takes the next bytes of the stream; `now` refills the bucket.
    pub fn feed(&mut self, mut bytes: &[u8], now: Instant) -> Result<(), Flood> {
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.last = Some(now);
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                self.preface_left -= n;
                bytes = &bytes[n..];
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = &bytes[n..];
            } else {
                let n = (9 - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len == 9 {
                    self.header_len = 0;
                    let h = &self.header;
                    self.payload_left =
                        (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
                    let (kind, flags) = (h[3], h[4]);
                    let control = match kind {
                        SETTINGS | PING => flags & ACK == 0,
                        PRIORITY => true,
                        _ => false,
                    };
                    if control {
                        if self.tokens < 1.0 {
                            return Err(Flood);
                        }
                        self.tokens -= 1.0;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A client's HTTP/2 stream whose control frames are counted as hyper reads them; a flood
/// ends the read with an error, so hyper closes the connection.
pub struct Counted<S> {
    inner: S,
    counter: FrameCounter,
    flooded: Option<prometheus::IntCounter>,
}

impl<S> Counted<S> {
    /// `flooded` counts connections closed for a flood.
    pub fn new(inner: S, per_second: u32, flooded: prometheus::IntCounter) -> Self {
        Counted {
            inner,
            counter: FrameCounter::new(per_second),
            flooded: Some(flooded),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let new = &buf.filled()[before..];
            if !new.is_empty() && this.counter.feed(new, Instant::now()).is_err() {
                if let Some(c) = this.flooded.take() {
                    c.inc();
                }
                return Poll::Ready(Err(io::Error::other("HTTP/2 control frame flood")));
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn frame(kind: u8, flags: u8, payload: usize) -> Vec<u8> {
        let mut f = vec![
            (payload >> 16) as u8,
            (payload >> 8) as u8,
            payload as u8,
            kind,
            flags,
            0,
            0,
            0,
            0,
        ];
        f.resize(9 + payload, 0xAB);
        f
    }

    fn preface() -> Vec<u8> {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
    }

    #[test]
    fn a_ping_flood_trips_and_acks_and_data_do_not_count() {
        let t = Instant::now();
        let mut c = FrameCounter::new(10);
        c.feed(&preface(), t).unwrap();
        // DATA, HEADERS, WINDOW_UPDATE and ACKs are free, however many.
        for _ in 0..10_000 {
            c.feed(&frame(0x0, 0, 100), t).unwrap();
            c.feed(&frame(0x8, 0, 4), t).unwrap();
            c.feed(&frame(PING, ACK, 8), t).unwrap();
            c.feed(&frame(SETTINGS, ACK, 0), t).unwrap();
        }
        // The burst: 100 (ten seconds at 10/s), then the 101st trips.
        for _ in 0..100 {
            c.feed(&frame(PING, 0, 8), t).unwrap();
        }
        assert_eq!(c.feed(&frame(PING, 0, 8), t), Err(Flood));
    }

    #[test]
    fn the_bucket_refills_at_its_rate() {
        let t = Instant::now();
        let mut c = FrameCounter::new(10);
        c.feed(&preface(), t).unwrap();
        for _ in 0..100 {
            c.feed(&frame(SETTINGS, 0, 6), t).unwrap();
        }
        // One second later, ten more (and not eleven).
        let later = t + Duration::from_secs(1);
        for _ in 0..10 {
            c.feed(&frame(PRIORITY, 0, 5), later).unwrap();
        }
        assert_eq!(c.feed(&frame(PRIORITY, 0, 5), later), Err(Flood));
    }

    #[test]
    fn frames_split_anywhere_are_counted_the_same() {
        let t = Instant::now();
        let mut stream = preface();
        for i in 0..150 {
            stream.extend(frame(if i % 2 == 0 { PING } else { 0x0 }, 0, i % 40));
        }
        // 75 PINGs: within the burst of 100, whatever the split.
        for chunk in [1, 2, 7, 9, 10, 64, 4096] {
            let mut c = FrameCounter::new(10);
            for piece in stream.chunks(chunk) {
                c.feed(piece, t).unwrap();
            }
            assert_eq!(c.header_len, 0, "ended on a frame boundary (split {chunk})");
            assert_eq!(c.payload_left, 0);
            assert_eq!(c.tokens, 25.0, "split {chunk}");
        }
    }
}
