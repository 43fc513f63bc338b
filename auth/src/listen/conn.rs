//! The connection tonic serves: plain TCP or TLS over it, with the bytes read during the
//! handshake handed out first; every byte it moves is activity, and once its listener closes it
//! (idle, or to make room at a cap) reads and writes fail.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::guard::{Guard, Slot};

/// The byte stream of a connection: plain TCP, or TLS over it.
#[allow(clippy::large_enum_variant)]
pub(super) enum Inner {
    Plain(TcpStream),
    Tls(TlsStream<TcpStream>),
}

/// An accepted connection that has spoken: what [`super::incoming`] yields. Every byte it moves
/// counts as activity; its listener may close it (idle, or to make room at a cap), after
/// which reads and writes fail.
pub struct Conn {
    inner: Inner,
    /// Bytes read during the handshake, handed out first.
    first: Vec<u8>,
    first_at: usize,
    id: u64,
    slot: Arc<Slot>,
    guard: Arc<Guard>,
    info: tonic::transport::server::TcpConnectInfo,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.guard.remove(self.id, &self.slot);
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.info.remote_addr)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// The connection `id` of `guard`'s table, which read `first` in its handshake; its
    /// activity starts now.
    pub(super) fn new(
        inner: Inner,
        first: Vec<u8>,
        id: u64,
        slot: Arc<Slot>,
        guard: Arc<Guard>,
        info: tonic::transport::server::TcpConnectInfo,
    ) -> Conn {
        let conn = Conn {
            inner,
            first,
            first_at: 0,
            id,
            slot,
            guard,
            info,
        };
        conn.touch();
        conn
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        self.info.remote_addr
    }

    fn touch(&self) {
        self.slot.last.store(self.guard.now_ms(), Ordering::Relaxed);
    }

    fn closed(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "closed by the listener (idle, or room made at its connection cap)",
        )
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.slot.killed.load(Ordering::Acquire) {
            return Poll::Ready(Err(this.closed()));
        }
        if this.first_at < this.first.len() {
            let n = buf.remaining().min(this.first.len() - this.first_at);
            buf.put_slice(&this.first[this.first_at..this.first_at + n]);
            this.first_at += n;
            return Poll::Ready(Ok(()));
        }
        {
            let mut w = this.slot.waker.lock().expect("no panic under the lock");
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        // Closed between the check and the waker's registration: seen now.
        if this.slot.killed.load(Ordering::Acquire) {
            return Poll::Ready(Err(this.closed()));
        }
        let before = buf.filled().len();
        let r = match &mut this.inner {
            Inner::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Tls(s) => Pin::new(s).poll_read(cx, buf),
        };
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.touch();
        }
        r
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.slot.killed.load(Ordering::Acquire) {
            return Poll::Ready(Err(this.closed()));
        }
        let r = match &mut this.inner {
            Inner::Plain(s) => Pin::new(s).poll_write(cx, data),
            Inner::Tls(s) => Pin::new(s).poll_write(cx, data),
        };
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_flush(cx),
            Inner::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
