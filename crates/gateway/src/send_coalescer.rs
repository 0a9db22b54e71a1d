//! Several TLS records per `send`.
//!
//! BoringSSL hands each sealed record (at most 16 KiB of plaintext) to its BIO as its own
//! write, and tokio-boring turns each into a `send` on the socket. A 64 KiB response body
//! would leave as four sends and, unless the kernel happens to merge them (autocorking, which
//! loopback rarely allows), four TCP segments and twice as many ACKs coming back.
//! [`SendCoalescer`] sits between the TLS stream and the socket: it keeps writes until
//! [`poll_flush`](AsyncWrite::poll_flush) (hyper flushes after every batch of response bytes,
//! BoringSSL after every handshake flight and fatal alert) or until they would pass its
//! capacity, then sends what it holds and the write that overflowed it in one `writev`.
//!
//! Memory: the buffer is allocated on the first held write and freed when a flush empties it,
//! so an idle connection holds none.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The default capacity: four full TLS records do not fit, so three are held and the fourth
/// goes out with them in one `writev` of about 64 KiB, the largest TCP segment the kernel
/// builds (TSO/GSO).
pub const DEFAULT_CAPACITY: usize = 64 * 1024;

/// Holds writes to `S` until flushed or full; reads pass straight through.
pub struct SendCoalescer<S> {
    inner: S,
    /// Held bytes are `buf[sent..]`; `sent` moves on a partial send instead of shifting.
    buf: Vec<u8>,
    sent: usize,
    capacity: usize,
}

impl<S> SendCoalescer<S> {
    pub fn new(inner: S) -> Self {
        Self::with_capacity(DEFAULT_CAPACITY, inner)
    }

    pub fn with_capacity(capacity: usize, inner: S) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            sent: 0,
            capacity,
        }
    }

    #[cfg(test)]
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn held(&self) -> &[u8] {
        &self.buf[self.sent..]
    }

    /// Marks `n` held bytes as sent; frees the buffer once all are.
    fn consume(&mut self, n: usize) {
        self.sent += n;
        if self.sent == self.buf.len() {
            self.buf = Vec::new();
            self.sent = 0;
        }
    }

    fn hold(&mut self, data: &[u8]) {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(self.capacity);
        }
        self.buf.extend_from_slice(data);
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendCoalescer<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            let held = me.held().len();
            if held + data.len() <= me.capacity {
                me.hold(data);
                return Poll::Ready(Ok(data.len()));
            }
            if held == 0 {
                // Larger than the whole buffer on its own: nothing to merge it with.
                return Pin::new(&mut me.inner).poll_write(cx, data);
            }
            let parts = [IoSlice::new(&me.buf[me.sent..]), IoSlice::new(data)];
            let n = ready!(Pin::new(&mut me.inner).poll_write_vectored(cx, &parts))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n >= held {
                me.consume(held);
                if n > held {
                    return Poll::Ready(Ok(n - held));
                }
                // Exactly the held bytes went: go round and hold `data` in the empty buffer.
            } else {
                me.consume(n);
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        while !me.held().is_empty() {
            let n = ready!(Pin::new(&mut me.inner).poll_write(cx, &me.buf[me.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            me.consume(n);
        }
        Pin::new(&mut me.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendCoalescer<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Records every write call; accepts at most `per_call` bytes of each, and answers
    /// `Pending` (waking at once) on every other call when `stall` is set.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<Vec<u8>>,
        per_call: Option<usize>,
        stall: bool,
        stalled_last: bool,
        flushes: usize,
        shut: bool,
    }

    impl Recorder {
        fn all(&self) -> Vec<u8> {
            self.calls.concat()
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(data)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            parts: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            if self.stall && !self.stalled_last {
                self.stalled_last = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.stalled_last = false;
            let mut call: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
            if let Some(limit) = self.per_call {
                call.truncate(limit);
            }
            let n = call.len();
            self.calls.push(call);
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    fn record(n: usize, fill: u8) -> Vec<u8> {
        vec![fill; n]
    }

    #[tokio::test]
    async fn holds_writes_until_flush_then_sends_them_in_one_call() {
        let mut w = SendCoalescer::with_capacity(100, Recorder::default());
        w.write_all(&record(30, 1)).await.unwrap();
        w.write_all(&record(30, 2)).await.unwrap();
        assert!(
            w.get_ref().calls.is_empty(),
            "nothing sent before the flush"
        );
        w.flush().await.unwrap();
        let inner = w.get_ref();
        assert_eq!(inner.calls.len(), 1);
        assert_eq!(inner.all(), [record(30, 1), record(30, 2)].concat());
        assert_eq!(inner.flushes, 1);
        assert_eq!(w.buf.capacity(), 0, "an empty buffer is freed");
    }

    #[tokio::test]
    async fn a_write_that_overflows_goes_out_with_the_held_bytes() {
        let mut w = SendCoalescer::with_capacity(100, Recorder::default());
        for fill in 1..=4 {
            w.write_all(&record(40, fill)).await.unwrap();
        }
        // 40 + 40 held, the third overflowed: one call of 120; the fourth is held.
        assert_eq!(w.get_ref().calls.len(), 1);
        assert_eq!(w.get_ref().calls[0].len(), 120);
        w.flush().await.unwrap();
        let inner = w.get_ref();
        assert_eq!(inner.calls.len(), 2);
        let expect: Vec<u8> = (1..=4).flat_map(|f| record(40, f)).collect();
        assert_eq!(inner.all(), expect);
    }

    #[tokio::test]
    async fn a_write_larger_than_the_capacity_passes_straight_through() {
        let mut w = SendCoalescer::with_capacity(100, Recorder::default());
        w.write_all(&record(250, 7)).await.unwrap();
        assert_eq!(w.get_ref().calls.len(), 1);
        assert_eq!(w.buf.capacity(), 0);
    }

    #[tokio::test]
    async fn partial_and_pending_sends_lose_and_reorder_nothing() {
        let inner = Recorder {
            per_call: Some(33),
            stall: true,
            ..Recorder::default()
        };
        let mut w = SendCoalescer::with_capacity(100, inner);
        let mut expect = Vec::new();
        for i in 0..40u8 {
            let r: Vec<u8> = (0..(17 + usize::from(i) * 7 % 90))
                .map(|j| i ^ j as u8)
                .collect();
            expect.extend_from_slice(&r);
            w.write_all(&r).await.unwrap();
            if i % 9 == 0 {
                w.flush().await.unwrap();
            }
        }
        w.shutdown().await.unwrap();
        let inner = w.get_ref();
        assert!(inner.shut);
        assert!(inner.calls.iter().all(|c| c.len() <= 33));
        assert_eq!(inner.all(), expect);
    }

    #[tokio::test]
    async fn shutdown_sends_held_bytes_first() {
        let mut w = SendCoalescer::with_capacity(100, Recorder::default());
        w.write_all(b"close_notify").await.unwrap();
        w.shutdown().await.unwrap();
        assert_eq!(w.get_ref().all(), b"close_notify");
        assert!(w.get_ref().shut);
    }
}
