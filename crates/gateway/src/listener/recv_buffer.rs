//! Several TLS records per `recv`, with no large buffer held by an idle connection.
//!
//! BoringSSL reads a record's 5-byte header, then its body (up to 16 KiB and 17 bytes). Read
//! straight from the socket that is two `recv` calls per record; through a small buffer
//! (the 4 KiB `BufReader` this replaces) one for the header and one for each body larger than
//! the buffer. [`RecvBuffer`] reads up to 64 KiB at a time, several records of an upload, and
//! serves BoringSSL's reads from there.
//!
//! Memory: a 64 KiB buffer is freed when the socket has nothing more (the read returns
//! `Pending` with nothing held), so a connection waiting for its client holds at most the
//! 4 KiB one, allocated on its first read. Writes pass straight through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How much one `recv` may take: four full TLS records.
pub const CAPACITY: usize = 64 * 1024;

/// How much it takes while the connection carries only small messages (requests, not
/// uploads): the allocation a keep-alive request costs.
const SMALL: usize = 4096;

pub struct RecvBuffer<S> {
    inner: S,
    /// Received bytes not yet read are `buf[pos..]`.
    buf: Vec<u8>,
    pos: usize,
    capacity: usize,
    /// The size of the next allocation: `SMALL`, or `capacity` once a read has filled its
    /// buffer, until one returns less than `SMALL`.
    want: usize,
}

impl<S> RecvBuffer<S> {
    pub fn new(inner: S) -> Self {
        Self::with_capacity(CAPACITY, inner)
    }

    /// A buffer already holding `received`: bytes read off the socket before it was wrapped
    /// (those after a PROXY protocol header), served first.
    pub fn with_received(inner: S, received: Vec<u8>) -> Self {
        Self {
            buf: received,
            ..Self::new(inner)
        }
    }

    pub fn with_capacity(capacity: usize, inner: S) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            pos: 0,
            capacity,
            want: SMALL.min(capacity),
        }
    }

    /// Received bytes not yet read.
    fn held(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Copies held bytes into `out`; true if there were any.
    fn serve(&mut self, out: &mut ReadBuf<'_>) -> bool {
        let held = self.held();
        if held.is_empty() {
            return false;
        }
        let n = held.len().min(out.remaining());
        out.put_slice(&held[..n]);
        self.pos += n;
        if self.pos == self.buf.len() {
            // Keep the allocation for the next read; it goes when the socket runs dry.
            self.buf.clear();
            self.pos = 0;
        }
        true
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for RecvBuffer<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if out.remaining() == 0 || me.serve(out) {
            return Poll::Ready(Ok(()));
        }
        if out.remaining() >= me.capacity {
            // As much room as the buffer has: read straight into it.
            me.buf = Vec::new();
            return Pin::new(&mut me.inner).poll_read(cx, out);
        }
        if me.buf.capacity() < me.want {
            me.buf = Vec::with_capacity(me.want);
        }
        let mut fill = ReadBuf::uninit(me.buf.spare_capacity_mut());
        let room = fill.remaining();
        match Pin::new(&mut me.inner).poll_read(cx, &mut fill) {
            Poll::Ready(Ok(())) => {
                let n = fill.filled().len();
                // SAFETY: `fill` covers the vector's spare capacity (the vector is empty
                // here), and its first `n` bytes are filled, which `ReadBuf` guarantees are
                // initialized; `n` is at most that capacity.
                unsafe { me.buf.set_len(n) };
                if n == room {
                    me.want = me.capacity;
                } else if n < SMALL {
                    me.want = SMALL.min(me.capacity);
                }
                me.serve(out);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // Nothing to read for now: a waiting connection keeps at most the small
                // buffer (as the 4 KiB `BufReader` before it did), not 64 KiB.
                if me.buf.capacity() > SMALL {
                    me.buf = Vec::new();
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for RecvBuffer<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A TLS stream whose reads take every record already received, not one record per call.
///
/// BoringSSL's `SSL_read` returns at most one record's plaintext (16 KiB), so each read by
/// hyper became one request-body chunk and, after it, one `writev` to the upstream. With
/// [`RecvBuffer`] below the TLS stream several records are often in memory already: this
/// reads on while bytes are held there (or inside BoringSSL) and the caller has room, so a
/// chunk carries all of them. It never reads on into an empty buffer: that read would come
/// back `Pending` and cost a wake-up.
pub struct ReadAvailable<S>(
    pub tokio_boring::SslStream<RecvBuffer<S>>,
    /// While the handshake is still open after early data (0-RTT) was accepted: true until a
    /// read completes it, then dropped. Requests read while it is true arrived in early data.
    pub Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
);

impl<S> ReadAvailable<S> {
    fn more_held(&self) -> bool {
        !self.0.get_ref().held().is_empty() || self.0.ssl().pending() > 0
    }

    /// After a read: whether the handshake is still in early data, told to the connection.
    fn watch_early_data(&mut self) {
        if let Some(flag) = &self.1 {
            if !in_early_data(self.0.ssl()) {
                flag.store(false, std::sync::atomic::Ordering::Relaxed);
                self.1 = None;
            }
        }
    }
}

/// Whether `ssl`'s handshake has accepted early data and is not complete yet.
pub fn in_early_data(ssl: &boring::ssl::SslRef) -> bool {
    use foreign_types::ForeignTypeRef;
    // SAFETY: `ssl` is a live SSL; SSL_in_early_data only reads its handshake state.
    unsafe { boring_sys::SSL_in_early_data(ssl.as_ptr()) == 1 }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for ReadAvailable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let first = Pin::new(&mut self.0).poll_read(cx, out);
        if !matches!(first, Poll::Ready(Ok(()))) {
            return first;
        }
        self.watch_early_data();
        // Go on while bytes are held; a read that brings none (a record not whole yet, the
        // end of the stream, an error) ends this call with the bytes read so far. The caller's
        // next read meets the end of the stream or the error again (a socket error as the
        // closed socket that follows it).
        while out.remaining() > 0 && self.more_held() {
            let before = out.filled().len();
            match Pin::new(&mut self.0).poll_read(cx, out) {
                Poll::Ready(Ok(())) if out.filled().len() > before => {}
                _ => break,
            }
        }
        self.watch_early_data();
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ReadAvailable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Hands out its bytes `per_read` at most per read, answering `Pending` (waking at once)
    /// between reads, and counts the reads that returned data.
    struct Source {
        data: Vec<u8>,
        at: usize,
        per_read: usize,
        pending_next: bool,
        reads: usize,
    }

    impl AsyncRead for Source {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if std::mem::take(&mut self.pending_next) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.pending_next = true;
            let n = (self.data.len() - self.at)
                .min(self.per_read)
                .min(out.remaining());
            let at = self.at;
            out.put_slice(&self.data[at..at + n]);
            self.at += n;
            self.reads += 1;
            Poll::Ready(Ok(()))
        }
    }

    fn source(len: usize, per_read: usize) -> Source {
        Source {
            data: (0..len).map(|i| (i * 7 + i / 251) as u8).collect(),
            at: 0,
            per_read,
            pending_next: false,
            reads: 0,
        }
    }

    #[tokio::test]
    async fn small_reads_are_served_from_one_large_recv() {
        // As BoringSSL reads: a 5-byte header, then a record body, four times over.
        let mut r = RecvBuffer::with_capacity(1000, source(4 * 205, 10_000));
        let mut got = Vec::new();
        for _ in 0..4 {
            let mut header = [0; 5];
            r.read_exact(&mut header).await.unwrap();
            let mut body = [0; 200];
            r.read_exact(&mut body).await.unwrap();
            got.extend_from_slice(&header);
            got.extend_from_slice(&body);
        }
        assert_eq!(got, r.inner.data);
        assert_eq!(r.inner.reads, 1, "one recv for all four records");
    }

    #[tokio::test]
    async fn bytes_arrive_whole_and_in_order_whatever_the_read_sizes() {
        let mut r = RecvBuffer::with_capacity(64, source(10_000, 37));
        let mut got = Vec::new();
        let mut step = 1;
        while got.len() < 10_000 {
            let mut chunk = vec![0; step];
            let n = r.read(&mut chunk).await.unwrap();
            got.extend_from_slice(&chunk[..n]);
            step = step * 3 % 97 + 1;
        }
        assert_eq!(got, r.inner.data);
    }

    #[tokio::test]
    async fn a_read_as_large_as_the_buffer_goes_straight_to_the_socket() {
        let mut r = RecvBuffer::with_capacity(100, source(500, 10_000));
        let mut big = [0; 300];
        let n = r.read(&mut big).await.unwrap();
        assert_eq!(n, 300);
        assert_eq!(r.buf.capacity(), 0, "nothing went through the buffer");
    }

    #[tokio::test]
    async fn the_buffer_grows_when_a_read_fills_it_and_shrinks_for_small_ones() {
        let mut r = RecvBuffer::with_capacity(64 * 1024, source(200_000, 100_000));
        let mut five = [0; 5];
        r.read_exact(&mut five).await.unwrap();
        assert_eq!(r.buf.len(), SMALL, "the first read takes 4 KiB");
        let mut rest = vec![0; SMALL - 5];
        r.read_exact(&mut rest).await.unwrap();
        r.read_exact(&mut five).await.unwrap();
        assert_eq!(
            r.buf.len(),
            64 * 1024,
            "a filled read makes the next one 64 KiB"
        );
        // A source that now brings 100 bytes a read: back to 4 KiB after the first.
        let mut r = RecvBuffer::with_capacity(64 * 1024, source(10_000, 100));
        r.want = 64 * 1024;
        r.read_exact(&mut five).await.unwrap();
        assert_eq!(r.want, SMALL);
    }

    #[test]
    fn a_waiting_connection_keeps_no_large_buffer() {
        let mut r = RecvBuffer::with_capacity(64 * 1024, source(0, 10));
        r.want = 64 * 1024;
        r.inner.pending_next = true;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut space = [0; 10];
        let mut out = ReadBuf::new(&mut space);
        assert!(Pin::new(&mut r).poll_read(&mut cx, &mut out).is_pending());
        assert_eq!(r.buf.capacity(), 0);
    }
}
