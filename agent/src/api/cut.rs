//! Connections the server can cut at shutdown.
//!
//! A graceful shutdown waits for every stream to end, and the stream of a watcher that stopped
//! reading never ends: its final status is queued behind events that the peer's HTTP/2 window
//! does not admit. So after a grace period the server cuts what is left: a [`Cuttable`]
//! connection then reads as closed by the peer and refuses writes, and its connection task ends.

use std::{
    future::Future as _,
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

/// An accepted connection that ends when its token is cancelled.
pub struct Cuttable<IO> {
    io: IO,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<IO> Cuttable<IO> {
    pub fn new(io: IO, cut: &CancellationToken) -> Self {
        Self {
            io,
            cut: Box::pin(cut.clone().cancelled_owned()),
        }
    }

    /// Whether the connection is cut; otherwise wakes the task when it is.
    fn is_cut(&mut self, cx: &mut Context<'_>) -> bool {
        self.cut.as_mut().poll(cx).is_ready()
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

impl<IO: Connected> Connected for Cuttable<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
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
        let mut conn = Cuttable::new(ours, &cut);
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
