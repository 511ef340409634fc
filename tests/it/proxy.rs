//! A loopback TCP proxy for cutting a client off from the broker without closing anything.
//!
//! In [`Proxy::blackhole`] mode it stops forwarding in both directions but keeps every socket
//! open, and new connections are accepted and then ignored: to the client this looks like a
//! network partition (requests time out), not like a broker that went away (connection reset).
//! It runs on its own thread and runtime, so it works from plain `#[test]` functions, and
//! everything it holds is closed when it is dropped.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// Where to forward; connections that arrive before it is set are held silently.
    target: Mutex<Option<SocketAddr>>,
    blackhole: watch::Sender<bool>,
    accepted: AtomicUsize,
}

impl Proxy {
    /// Listens on a free loopback port. Forwarding starts once [`Proxy::set_target`] is called.
    ///
    /// # Panics
    /// When no loopback port can be bound or the runtime cannot start.
    pub fn start() -> Proxy {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("proxy cannot bind a loopback port: {e}"));
        std_listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("proxy cannot make its socket non-blocking: {e}"));
        let addr = std_listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy has no local address: {e}"));
        let (blackhole, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            target: Mutex::new(None),
            blackhole,
            accepted: AtomicUsize::new(0),
        });
        let (shutdown, stop) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("proxy cannot start a runtime: {e}"));
        let task_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => panic!("proxy cannot register its socket: {e}"),
                    };
                    tokio::select! {
                        _ = stop => {}
                        _ = accept_loop(listener, task_shared) => {}
                    }
                });
                // Dropping the runtime here drops every connection task and closes their sockets.
            })
            .unwrap_or_else(|e| panic!("cannot start the proxy thread: {e}"));
        Proxy {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The port clients should connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `127.0.0.1:PORT`, for a client's bootstrap list.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }

    /// Forward new connections to `target`.
    pub fn set_target(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
    }

    /// Stop forwarding in both directions on every connection, old and new; keep them open.
    pub fn blackhole(&self) {
        self.shared.blackhole.send_replace(true);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = serve(client, shared).await;
        });
    }
}

async fn serve(client: TcpStream, shared: Arc<Shared>) -> io::Result<()> {
    let mut cut = shared.blackhole.subscribe();
    let target = *shared.target.lock().unwrap_or_else(|p| p.into_inner());
    let (Some(target), false) = (target, *cut.borrow_and_update()) else {
        // Accepted but never answered, as a partitioned broker would look.
        let _keep_open = client;
        std::future::pending::<()>().await;
        return Ok(());
    };
    let upstream = TcpStream::connect(target).await?;
    client.set_nodelay(true)?;
    upstream.set_nodelay(true)?;
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let up = pump(cr, uw, shared.blackhole.subscribe());
    let down = pump(ur, cw, shared.blackhole.subscribe());
    // Either side closing ends the pair; in black-hole mode neither pump ever returns.
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}

/// Copies `from` to `to` while not black-holed; bytes read while black-holed are dropped.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if *cut.borrow_and_update() {
            // Neither read nor write: the peer's data piles up in the kernel buffers, like on
            // a link that went dark.
            if cut.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            continue;
        }
        tokio::select! {
            n = from.read(&mut buf) => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                if *cut.borrow() {
                    continue;
                }
                to.write_all(&buf[..n]).await?;
            }
            _ = cut.changed() => {}
        }
    }
}
