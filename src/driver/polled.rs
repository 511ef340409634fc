//! Prototype, for a measurement only (BENCHMARKS.md, "Idle CPU per held lock"): a plaintext TCP
//! stream registered with the runtime for writability alone and read on the 20 ms grid of the
//! Heartbeats (the pool's origin), so an answer arriving never wakes a thread by itself: it is
//! read in the next wake-up of the grid, with the Heartbeats of that tick. An idle stream is read
//! ever less often (up to every 640 ms), which delays the answers of every request, parked ones
//! too: not fit to keep as it is.

use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::time::{Instant, Sleep};

pub(crate) static ORIGIN: OnceLock<Instant> = OnceLock::new();

pub(crate) struct PolledTcp {
    fd: AsyncFd<std::net::TcpStream>,
    timer: Pin<Box<Sleep>>,
    idle: u32,
}

impl PolledTcp {
    pub(crate) fn new(tcp: tokio::net::TcpStream) -> io::Result<Self> {
        let std = tcp.into_std()?;
        std.set_nonblocking(true)?;
        let origin = *ORIGIN.get_or_init(Instant::now);
        Ok(PolledTcp {
            fd: AsyncFd::with_interest(std, Interest::WRITABLE)?,
            timer: Box::pin(tokio::time::sleep_until(origin)),
            idle: 0,
        })
    }
}

impl AsyncRead for PolledTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let this = &mut *self;
            let dst = buf.initialize_unfilled();
            match (&*this.fd.get_ref()).read(dst) {
                Ok(n) => {
                    buf.advance(n);
                    this.idle = 0;
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
            if this.timer.is_elapsed() {
                let step_ms = 20u64 << this.idle.min(5);
                this.idle += 1;
                let origin = *ORIGIN.get().expect("set");
                let grid = Duration::from_millis(20).as_nanos();
                let since = Instant::now().duration_since(origin).as_nanos();
                let next = (since / grid + 1) * grid + u128::from(step_ms - 20) * 1_000_000;
                let at = origin + Duration::from_nanos(next as u64);
                this.timer.as_mut().reset(at);
            }
            ready!(this.timer.as_mut().poll(cx));
        }
    }
}

impl AsyncWrite for PolledTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| (&*fd.get_ref()).write(buf)) {
                Ok(r) => return Poll::Ready(r),
                Err(_) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.fd.get_ref().shutdown(std::net::Shutdown::Write))
    }
}
