//! Several TLS records per `send`, and one `send` per wake-up of a connection's task.
//!
//! BoringSSL hands each sealed record (at most 16 KiB of plaintext) to its BIO as its own
//! write, and tokio-boring turns each into a `send`. The protocol code above it flushes often:
//! hyper's HTTP/1.1 after each batch of response bytes, and the `h2` crate after **every**
//! DATA frame, because it holds only one frame's payload at a time. Each `send` then leaves
//! as its own TCP segment (unless the kernel happens to merge them, which loopback rarely
//! allows), with an ACK coming back for every second one.
//!
//! [`CoalescingSocket`] sits between the TLS stream and the TCP socket. It holds writes, up
//! to its capacity, and sends what it holds together with the write that would overflow it
//! in one `writev`. Inside a connection task wrapped by [`SendHandle::flush_at_yield`] a
//! flush only marks the held bytes as owed; the wrapper sends them when the task's poll
//! returns, before the task can wait for anything. (Netty's flush consolidation works the
//! same way.) Outside such a poll, during the TLS handshake for instance, a flush sends at
//! once. Shutdown always sends first.
//!
//! Memory: the buffer is allocated on the first held write and freed when it is emptied,
//! so an idle connection holds none.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The default capacity: four full TLS records do not fit, so three are held and the fourth
/// goes out with them in one `writev` of about 64 KiB, the largest TCP segment the kernel
/// builds (TSO/GSO).
pub const DEFAULT_CAPACITY: usize = 64 * 1024;

/// What the coalescer needs from a socket. Both the stream side and the task wrapper use it
/// through a shared reference.
pub trait SharedSocket: Send + Sync + 'static {
    fn poll_send(&self, cx: &mut Context<'_>, parts: &[IoSlice<'_>]) -> Poll<io::Result<usize>>;
    fn poll_recv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>>;
    fn shutdown_send(&self) -> io::Result<()>;
}

impl SharedSocket for TcpStream {
    fn poll_send(&self, cx: &mut Context<'_>, parts: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.poll_write_ready(cx))?;
            // One part: `send`, as tokio's own `poll_write` does, rather than a one-element
            // `writev`.
            let sent = match parts {
                [one] => self.try_write(one),
                _ => self.try_write_vectored(parts),
            };
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_recv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.poll_read_ready(cx))?;
            // Into the unfilled part as it is: `RecvBuffer` hands over uninitialized room,
            // which zeroing first would cost a 64 KiB memset per read.
            // SAFETY: only written through (by the kernel, via `try_read_buf`), never read.
            let mut room = unsafe { buf.unfilled_mut() };
            match self.try_read_buf(&mut room) {
                Ok(n) => {
                    // SAFETY: `try_read_buf` initialized the first `n` bytes of the room.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn shutdown_send(&self) -> io::Result<()> {
        socket2::SockRef::from(self).shutdown(std::net::Shutdown::Write)
    }
}

struct Shared<S> {
    socket: S,
    state: Mutex<SendState>,
}

struct SendState {
    /// Held bytes are `buf[sent..]`; `sent` moves on a partial send instead of shifting.
    buf: Vec<u8>,
    sent: usize,
    capacity: usize,
    /// A [`FlushAtYield`] is polling its future: flushes may wait for the poll's end.
    in_task_poll: bool,
    /// A flush was asked for during that poll and its bytes are not sent yet.
    owed: bool,
    /// A deferred send failed; the next write or flush reports it.
    failed: Option<io::Error>,
}

impl SendState {
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

    /// Sends every held byte.
    fn poll_send_held<S: SharedSocket>(
        &mut self,
        cx: &mut Context<'_>,
        socket: &S,
    ) -> Poll<io::Result<()>> {
        while !self.held().is_empty() {
            let n = ready!(socket.poll_send(cx, &[IoSlice::new(self.held())]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.consume(n);
        }
        self.owed = false;
        Poll::Ready(Ok(()))
    }
}

impl<S> Shared<S> {
    fn lock(&self) -> MutexGuard<'_, SendState> {
        // Nothing panics while holding the lock; recover the state if something ever does.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The socket under a TLS stream: reads pass straight through, writes are held as described
/// in the module documentation.
pub struct CoalescingSocket<S = TcpStream> {
    shared: Arc<Shared<S>>,
}

/// Wraps a connection's task so that flushes inside it wait for the end of its poll.
pub struct SendHandle<S = TcpStream> {
    shared: Arc<Shared<S>>,
}

/// Makes a coalescing socket of `socket` and the handle for its connection task.
pub fn coalescing<S: SharedSocket>(socket: S) -> (CoalescingSocket<S>, SendHandle<S>) {
    with_capacity(DEFAULT_CAPACITY, socket)
}

pub fn with_capacity<S: SharedSocket>(
    capacity: usize,
    socket: S,
) -> (CoalescingSocket<S>, SendHandle<S>) {
    let shared = Arc::new(Shared {
        socket,
        state: Mutex::new(SendState {
            buf: Vec::new(),
            sent: 0,
            capacity,
            in_task_poll: false,
            owed: false,
            failed: None,
        }),
    });
    (
        CoalescingSocket {
            shared: shared.clone(),
        },
        SendHandle { shared },
    )
}

impl<S: SharedSocket> SendHandle<S> {
    /// `fut` with flushes of this socket deferred to the end of each of its polls.
    pub fn flush_at_yield<F: std::future::Future>(self, fut: F) -> FlushAtYield<F, S> {
        FlushAtYield {
            fut: Box::pin(fut),
            shared: self.shared,
        }
    }
}

pub struct FlushAtYield<F, S = TcpStream> {
    fut: Pin<Box<F>>,
    shared: Arc<Shared<S>>,
}

impl<F, S> FlushAtYield<F, S> {
    /// The wrapped future (a connection, to ask it for a graceful shutdown).
    pub fn inner(&mut self) -> Pin<&mut F> {
        self.fut.as_mut()
    }
}

impl<F: std::future::Future, S: SharedSocket> std::future::Future for FlushAtYield<F, S> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.shared.lock().in_task_poll = true;
        let out = self.fut.as_mut().poll(cx);
        let shared = &*self.shared;
        let mut st = shared.lock();
        // Cleared before sending, under the same lock as the flag that flushes read, so no
        // flush can be deferred after this point and left unsent.
        st.in_task_poll = false;
        if st.owed {
            match st.poll_send_held(cx, &shared.socket) {
                Poll::Ready(Ok(())) | Poll::Pending => {} // Pending: woken when writable.
                Poll::Ready(Err(e)) => {
                    st.owed = false;
                    st.buf = Vec::new();
                    st.sent = 0;
                    st.failed = Some(e);
                    cx.waker().wake_by_ref();
                }
            }
        }
        out
    }
}

impl<S: SharedSocket> AsyncWrite for CoalescingSocket<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        if let Some(e) = st.failed.take() {
            return Poll::Ready(Err(e));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            let held = st.held().len();
            if held + data.len() <= st.capacity {
                st.hold(data);
                return Poll::Ready(Ok(data.len()));
            }
            if held == 0 {
                // Larger than the whole buffer on its own: nothing to merge it with.
                return shared.socket.poll_send(cx, &[IoSlice::new(data)]);
            }
            let parts = [IoSlice::new(st.held()), IoSlice::new(data)];
            let n = ready!(shared.socket.poll_send(cx, &parts))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n >= held {
                st.consume(held);
                if n > held {
                    return Poll::Ready(Ok(n - held));
                }
                // Exactly the held bytes went: go round and hold `data` in the empty buffer.
            } else {
                st.consume(n);
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        if let Some(e) = st.failed.take() {
            return Poll::Ready(Err(e));
        }
        if st.in_task_poll {
            st.owed |= !st.held().is_empty();
            return Poll::Ready(Ok(()));
        }
        st.poll_send_held(cx, &shared.socket)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        if let Some(e) = st.failed.take() {
            return Poll::Ready(Err(e));
        }
        ready!(st.poll_send_held(cx, &shared.socket))?;
        Poll::Ready(shared.socket.shutdown_send())
    }
}

impl<S: SharedSocket> AsyncRead for CoalescingSocket<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.shared.socket.poll_recv(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{poll_fn, Future};
    use tokio::io::AsyncWriteExt;

    /// Records every send; accepts at most `per_call` bytes of each, and answers `Pending`
    /// (waking at once) on every other call when `stall` is set.
    #[derive(Default)]
    struct Recorder {
        log: Mutex<Log>,
        per_call: Option<usize>,
        stall: bool,
    }

    #[derive(Default)]
    struct Log {
        sends: Vec<Vec<u8>>,
        stalled_last: bool,
        shut: bool,
    }

    impl SharedSocket for Recorder {
        fn poll_send(
            &self,
            cx: &mut Context<'_>,
            parts: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut log = self.log.lock().unwrap();
            if self.stall && !log.stalled_last {
                log.stalled_last = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            log.stalled_last = false;
            let mut call: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
            if let Some(limit) = self.per_call {
                call.truncate(limit);
            }
            let n = call.len();
            log.sends.push(call);
            Poll::Ready(Ok(n))
        }

        fn poll_recv(&self, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }

        fn shutdown_send(&self) -> io::Result<()> {
            self.log.lock().unwrap().shut = true;
            Ok(())
        }
    }

    fn sends(s: &CoalescingSocket<Recorder>) -> Vec<Vec<u8>> {
        s.shared.socket.log.lock().unwrap().sends.clone()
    }

    fn record(n: usize, fill: u8) -> Vec<u8> {
        vec![fill; n]
    }

    fn small(inner: Recorder) -> (CoalescingSocket<Recorder>, SendHandle<Recorder>) {
        with_capacity(100, inner)
    }

    #[tokio::test]
    async fn outside_a_task_poll_a_flush_sends_the_held_writes_in_one_call() {
        let (mut w, _) = small(Recorder::default());
        w.write_all(&record(30, 1)).await.unwrap();
        w.write_all(&record(30, 2)).await.unwrap();
        assert!(sends(&w).is_empty(), "nothing sent before the flush");
        w.flush().await.unwrap();
        assert_eq!(sends(&w), vec![[record(30, 1), record(30, 2)].concat()]);
        assert_eq!(
            w.shared.lock().buf.capacity(),
            0,
            "an empty buffer is freed"
        );
    }

    #[tokio::test]
    async fn a_write_that_overflows_goes_out_with_the_held_bytes() {
        let (mut w, _) = small(Recorder::default());
        for fill in 1..=4 {
            w.write_all(&record(40, fill)).await.unwrap();
        }
        // 40 + 40 held, the third overflowed: one call of 120; the fourth is held.
        assert_eq!(sends(&w).len(), 1);
        assert_eq!(sends(&w)[0].len(), 120);
        w.flush().await.unwrap();
        let expect: Vec<u8> = (1..=4).flat_map(|f| record(40, f)).collect();
        assert_eq!(sends(&w).concat(), expect);
        assert_eq!(sends(&w).len(), 2);
    }

    #[tokio::test]
    async fn a_write_larger_than_the_capacity_passes_straight_through() {
        let (mut w, _) = small(Recorder::default());
        w.write_all(&record(250, 7)).await.unwrap();
        assert_eq!(sends(&w).len(), 1);
        assert_eq!(w.shared.lock().buf.capacity(), 0);
    }

    #[tokio::test]
    async fn inside_a_task_poll_flushes_wait_for_the_poll_to_end() {
        let (mut w, handle) = small(Recorder::default());
        let probe = CoalescingSocket {
            shared: w.shared.clone(),
        };
        // One poll of the task: three small writes, each flushed, as h2 does per frame.
        let mut first_poll = true;
        let task = handle.flush_at_yield(poll_fn(|cx| {
            if !first_poll {
                return Poll::Ready(());
            }
            first_poll = false;
            for fill in 1..=3 {
                assert!(Pin::new(&mut w)
                    .poll_write(cx, &record(20, fill))
                    .is_ready());
                assert!(matches!(
                    Pin::new(&mut w).poll_flush(cx),
                    Poll::Ready(Ok(()))
                ));
                assert!(sends(&probe).is_empty(), "sent during the poll");
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }));
        task.await;
        let expect: Vec<u8> = (1..=3).flat_map(|f| record(20, f)).collect();
        assert_eq!(sends(&probe), vec![expect], "one send when the poll ended");
    }

    #[test]
    fn a_deferred_send_that_stalls_goes_on_at_the_next_polls() {
        let inner = Recorder {
            per_call: Some(7),
            stall: true,
            ..Recorder::default()
        };
        let (mut w, handle) = small(inner);
        let probe = CoalescingSocket {
            shared: w.shared.clone(),
        };
        let mut first = true;
        // After its first poll the task only waits, as a connection waiting for the client.
        let task = handle.flush_at_yield(poll_fn(|cx| {
            if std::mem::take(&mut first) {
                assert!(Pin::new(&mut w)
                    .poll_write(cx, b"0123456789abcdef")
                    .is_ready());
                assert!(Pin::new(&mut w).poll_flush(cx).is_ready());
            }
            Poll::<()>::Pending
        }));
        let mut task = std::pin::pin!(task);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for polls in 0.. {
            assert!(polls < 20, "the owed bytes were never sent");
            assert!(task.as_mut().poll(&mut cx).is_pending());
            if probe.shared.lock().held().is_empty() {
                break;
            }
        }
        assert_eq!(sends(&probe).concat(), b"0123456789abcdef");
        assert_eq!(sends(&probe).len(), 3, "7 + 7 + 2 bytes, one send per poll");
        assert!(!probe.shared.lock().owed);
    }

    #[tokio::test]
    async fn partial_and_pending_sends_lose_and_reorder_nothing() {
        let inner = Recorder {
            per_call: Some(33),
            stall: true,
            ..Recorder::default()
        };
        let (mut w, _) = small(inner);
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
        assert!(w.shared.socket.log.lock().unwrap().shut);
        assert!(sends(&w).iter().all(|c| c.len() <= 33));
        assert_eq!(sends(&w).concat(), expect);
    }

    #[tokio::test]
    async fn shutdown_sends_held_bytes_first_even_inside_a_task_poll() {
        let (mut w, handle) = small(Recorder::default());
        let probe = CoalescingSocket {
            shared: w.shared.clone(),
        };
        handle
            .flush_at_yield(async {
                w.write_all(b"close_notify").await.unwrap();
                w.shutdown().await.unwrap();
                assert_eq!(sends(&probe).concat(), b"close_notify");
            })
            .await;
        assert!(probe.shared.socket.log.lock().unwrap().shut);
    }
}
