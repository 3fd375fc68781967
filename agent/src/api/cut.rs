//! Connections the server can cut: at shutdown, and when they go too long without a stream.
//!
//! A graceful shutdown waits for every stream to end, and the stream of a watcher that stopped
//! reading never ends: its final status is queued behind events that the peer's HTTP/2 window
//! does not admit. So after a grace period the server cuts what is left: a [`Cuttable`]
//! connection then reads as closed by the peer and refuses writes, and its connection task ends.
//! The same befalls a connection whose [`Lease`] says it is past its deadline without a stream
//! (a handshake never finished, a preface never sent, a channel left idle): see
//! [`crate::api::admission`]. The lease is given back when the connection goes.

use std::{
    future::Future as _,
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use crate::api::admission::{Admitted, Lease};

/// An accepted connection that ends when its token is cancelled, or when its lease's deadline
/// passes without a stream.
pub struct Cuttable<IO> {
    io: IO,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    lease: Option<Lease>,
    /// Armed at the lease's deadline while the connection has no stream.
    quiet: Pin<Box<Sleep>>,
}

impl<IO> Cuttable<IO> {
    pub fn new(io: IO, cut: &CancellationToken, lease: Option<Lease>) -> Self {
        Self {
            io,
            cut: Box::pin(cut.clone().cancelled_owned()),
            lease,
            quiet: Box::pin(tokio::time::sleep_until(Instant::now())),
        }
    }

    /// Whether the connection is cut; otherwise wakes the task when it is.
    fn is_cut(&mut self, cx: &mut Context<'_>) -> bool {
        if self.cut.as_mut().poll(cx).is_ready() {
            return true;
        }
        let Some(lease) = &self.lease else {
            return false;
        };
        let Some(deadline) = lease.connection.deadline() else {
            return false;
        };
        let deadline = Instant::from_std(deadline);
        if self.quiet.deadline() != deadline {
            self.quiet.as_mut().reset(deadline);
        }
        if self.quiet.as_mut().poll(cx).is_pending() {
            return false;
        }
        lease.connection.closed_quiet();
        // Counted once: the connection reads as cut from here on.
        let cut = CancellationToken::new();
        cut.cancel();
        self.cut = Box::pin(cut.cancelled_owned());
        true
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Cuttable<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.is_cut(cx) {
            // End of stream: the server sees the peer gone and drops the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Cuttable<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.is_cut(cx) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Requests carry the connection's lease ([`crate::api::admission::StreamLayer`] counts their
/// streams on it).
impl<IO> Connected for Cuttable<IO> {
    type ConnectInfo = Admitted;

    fn connect_info(&self) -> Self::ConnectInfo {
        Admitted(self.lease.as_ref().map(|lease| lease.connection.clone()))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn a_cut_connection_reads_as_closed_and_refuses_writes() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let cut = CancellationToken::new();
        let mut conn = Cuttable::new(ours, &cut, None);
        theirs.write_all(b"hi").await.unwrap();
        let mut buf = [0; 2];
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");

        // A read waiting for the peer wakes up when the connection is cut.
        let reader = tokio::spawn(async move {
            let mut rest = Vec::new();
            let n = conn.read_to_end(&mut rest).await.unwrap();
            (n, conn)
        });
        cut.cancel();
        let (n, mut conn) = reader.await.unwrap();
        assert_eq!(n, 0);
        let err = conn.write_all(b"late").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        // The peer is still there: only this side was cut.
        theirs.write_all(b"ignored").await.unwrap();
    }
}
