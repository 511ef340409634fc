//! K's link to its supervisor (P, `supervise.rs`): P's start, on a thread of its own beside the
//! acquire, and the socket K tells it the hold's environment and lease end on, watches it by, and
//! reaps it through. `run.rs` drives it; what the two say is `proto.rs`.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use rustix::io::{Errno, FdFlags};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use rustix::process::Signal;
use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::exit::{self, Failure};
use crate::proto::{self, FromSupervisor, ProtoError, ToSupervisor, MAX_MESSAGE};
use crate::run::RunConfig;
use crate::trace::stamp;
use crate::{settings, supervise, sys};

/// The supervisor's start, begun beside the acquire ([`Link::start`]), and how it went.
pub(crate) enum Start<L> {
    /// On its thread, which sends how it went.
    Pending(tokio::sync::oneshot::Receiver<Result<L, Failure>>),
    Started(L),
    /// The failure, until it is taken.
    Failed(Option<Failure>),
}

impl<L> Start<L> {
    pub(crate) fn pending(&self) -> bool {
        matches!(self, Start::Pending(_))
    }

    /// The started supervisor, waiting for its start if it is under way; a failure is handed
    /// out once. Cancel-safe: what the thread sent is kept once received.
    pub(crate) async fn settle(&mut self) -> Result<&L, Failure> {
        if let Start::Pending(rx) = self {
            *self = match rx.await {
                Ok(Ok(link)) => Start::Started(link),
                Ok(Err(f)) => Start::Failed(Some(f)),
                // The thread ended without an answer: it panicked (a bug).
                Err(_) => Start::Failed(Some(Failure::new(
                    exit::OSERR,
                    "the supervisor process's start ended without an answer; this is a bug; the \
                     command was not run",
                ))),
            };
        }
        match self {
            Start::Started(link) => Ok(link),
            Start::Failed(f) => Err(f.take().unwrap_or_else(|| {
                Failure::new(
                    exit::OSERR,
                    "the supervisor process could not be started; the command was not run",
                )
            })),
            Start::Pending(_) => unreachable!("settled above"),
        }
    }

    /// The started supervisor once its start is over, if it started.
    pub(crate) async fn finish(mut self) -> Option<L> {
        let _ = self.settle().await;
        match self {
            Start::Started(link) => Some(link),
            _ => None,
        }
    }
}

/// The acquire with the supervisor's start beside it: the acquire's answer as soon as it comes,
/// whether or not the start is over (the caller waits for that when it needs the link); a start
/// that fails first ends the wait, and the acquire, dropped, leaves the group.
pub(crate) async fn beside<O, L>(
    acquire: impl Future<Output = O>,
    start: &mut Start<L>,
) -> Result<O, Failure> {
    tokio::pin!(acquire);
    loop {
        tokio::select! {
            biased;
            o = &mut acquire => return Ok(o),
            r = start.settle(), if start.pending() => {
                r?;
            }
        }
    }
}

/// The granted lock with its started supervisor. A supervisor that could not be started
/// releases the lock first (`release` answers a note for the failure's line), so the lock was
/// held without anything having run under it, and ends the term with the start's failure.
pub(crate) async fn with_supervisor<G, L, R: Future<Output = String>>(
    guard: G,
    start: &mut Start<L>,
    release: impl FnOnce(G) -> R,
) -> Result<(G, &L), Failure> {
    match start.settle().await {
        Ok(link) => Ok((guard, link)),
        Err(mut f) => {
            f.line.push_str(&release(guard).await);
            Err(f)
        }
    }
}

/// K's end of the socket to the supervisor, and the supervisor's pid.
pub(crate) struct Link {
    /// A SOCK_SEQPACKET socket; tokio's UnixStream only provides the readiness, every read and
    /// write is a rustix recv/send of one whole datagram.
    sock: UnixStream,
    pub(crate) pid: u32,
    /// Readable once the supervisor has exited; None without pidfd support (Linux before 5.3).
    pidfd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// Set once the supervisor is reaped (its pid may then be another process's).
    pub(crate) reaped: std::cell::Cell<bool>,
}

impl Link {
    /// Starts the supervisor on a thread of its own, beside the caller's acquire: the fork and
    /// exec block, and this runtime has one thread. Where no thread can be started the
    /// supervisor is started here, in line, as it was before the acquire began.
    ///
    /// While the thread runs, the supervisor's end of the socket is open across exec (see
    /// [`Link::spawn`]); the acquire beside it runs no program, and this process starts no
    /// other (the command is the supervisor's child), so that end still reaches no one else.
    pub(crate) fn start(c: &RunConfig, grace: Duration) -> Start<Link> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (command, lock) = (c.command.clone(), c.lock.clone());
        // The link's socket and pidfd are registered with this runtime from the thread.
        let runtime = tokio::runtime::Handle::current();
        let thread = std::thread::Builder::new()
            .name("supervisor-start".into())
            .spawn(move || {
                let _entered = runtime.enter();
                let started = Link::spawn(&command, &lock, grace);
                stamp("run", "supervisor-spawned");
                if let Err(Ok(link)) = tx.send(started) {
                    // Nobody waits for it any more (the run was dropped mid-way). It was told
                    // nothing, so it has started nothing: it is killed and reaped here, not
                    // left behind.
                    link.kill();
                    if let Some(p) = sys::pid(link.pid) {
                        let _ = rustix::process::waitpid(
                            Some(p),
                            rustix::process::WaitOptions::empty(),
                        );
                    }
                }
            });
        match thread {
            Ok(_) => Start::Pending(rx),
            Err(_) => match Link::spawn(&c.command, &c.lock, grace) {
                Ok(link) => Start::Started(link),
                Err(f) => Start::Failed(Some(f)),
            },
        }
    }

    /// Starts the supervisor (this binary, re-executed) with the command to run. It waits for
    /// the hold's environment ([`Link::send_env`]) and a lease end before it starts anything.
    /// Blocks for the fork and exec: called on a thread of its own ([`Link::start`]).
    pub(crate) fn spawn(
        command: &[OsString],
        lock: &str,
        grace: Duration,
    ) -> Result<Link, Failure> {
        let oserr = |what: &str, e: &dyn std::fmt::Display| {
            Failure::new(
                exit::OSERR,
                format!(
                    "{what}: {e}; the command was not run (kafka-lock run needs Linux with /proc \
                     mounted)"
                ),
            )
        };
        let exe = std::env::current_exe().map_err(|e| {
            oserr(
                "cannot find kafka-lock's own executable to start the supervisor process",
                &e,
            )
        })?;
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| oserr("cannot create a socket pair for the supervisor", &e))?;
        // Only the supervisor may inherit this end: this process starts no other program (not
        // on the thread running the acquire beside this one either), so clearing close-on-exec
        // here, for the one spawn below, leaks it nowhere else (the supervisor sets it again at
        // once, before starting the command).
        rustix::io::fcntl_setfd(&theirs, FdFlags::empty())
            .map_err(|e| oserr("cannot pass a socket to the supervisor", &e))?;
        let argv = supervise::Args {
            fd: theirs.as_raw_fd(),
            grace_ns: sys::nanos(grace),
            command: command.to_vec(),
        }
        .to_argv();
        let mut cmd = std::process::Command::new(&exe);
        // The secrets stay in this (non-dumpable) process: neither the supervisor's nor the
        // command's /proc/<pid>/environ may hold them, since the command can read both.
        for (name, _) in std::env::vars_os() {
            if settings::is_secret_variable(&name) {
                cmd.env_remove(name);
            }
        }
        cmd.args(argv)
            .env("KAFKA_LOCK_NAME", lock)
            // Its own process group: a signal to ours (a terminal's Ctrl-C, `kill -9 -PGID`)
            // must not take the supervisor along with us.
            .process_group(0);
        let child = cmd.spawn().map_err(|e| {
            oserr(
                &format!("cannot start the supervisor process ({})", exe.display()),
                &e,
            )
        })?;
        drop(theirs);
        let pid = child.id();
        // Reaped with waitpid below, not through the std handle.
        drop(child);
        let sock = UnixStream::from_std(std::os::unix::net::UnixStream::from(ours))
            .map_err(|e| oserr("cannot watch the supervisor's socket", &e))?;
        // Our unreaped child: the pid is still the supervisor's.
        let pidfd = sys::pid(pid)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
            .and_then(watch_pidfd);
        Ok(Link {
            sock,
            pid,
            pidfd,
            reaped: std::cell::Cell::new(false),
        })
    }

    /// Passes the variables the command gets for this hold, one ENV datagram each. Unlike the
    /// other messages a failed send is an error: the command must not start without them.
    pub(crate) fn send_env(&self, env: &[(&str, OsString)]) -> io::Result<()> {
        for (name, value) in env {
            let msg = proto::encode_env(name, value)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            rustix::net::send(&self.sock, &msg, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)?;
        }
        Ok(())
    }

    /// Ends the link: the supervisor, if it still runs, sees end of file and exits (it has
    /// started nothing, or stops what it started); then it is reaped.
    pub(crate) async fn close(&self) {
        let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
        self.reap().await;
    }

    /// Sends without waiting. A full socket (a stopped supervisor) drops the message: the
    /// supervisor then keeps the older, earlier lease end, which is the safe side.
    pub(crate) fn send(&self, msg: ToSupervisor) {
        let _ = rustix::net::send(
            &self.sock,
            msg.encode().as_bytes(),
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        );
    }

    /// The next message; `None` at end of file (the supervisor has exited). Cancel-safe: a
    /// datagram is only taken off the socket by a call that returns it.
    pub(crate) async fn recv(&self) -> io::Result<Option<Result<FromSupervisor, ProtoError>>> {
        let mut buf = [0u8; MAX_MESSAGE + 1];
        loop {
            self.sock.readable().await?;
            let got = self.sock.try_io(Interest::READABLE, || {
                rustix::net::recv(
                    &self.sock,
                    &mut buf[..],
                    RecvFlags::DONTWAIT | RecvFlags::TRUNC,
                )
                .map_err(io::Error::from)
            });
            match got {
                Ok((_, 0)) => return Ok(None),
                Ok((n, len)) if len > n => return Ok(Some(Err(ProtoError::TooLong(len)))),
                Ok((n, _)) => return Ok(Some(FromSupervisor::parse(&buf[..n]))),
                // ECONNRESET: the supervisor exited with one of our LEASE messages unread. It is
                // reported once, before the datagrams still queued for us (GONE among them) and
                // the end of file.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::WouldBlock
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// SIGKILLs a supervisor that broke the protocol. It is our unreaped child, so its pid is
    /// still its own.
    pub(crate) fn kill(&self) {
        if let Some(p) = sys::pid(self.pid) {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
    }

    /// Reaps the supervisor after it said GONE (it exits right after). Its pidfd, readable once
    /// it has exited, wakes us the moment it has, instead of a poll: the release waits on this.
    pub(crate) async fn reap(&self) {
        if self.reaped.get() {
            return;
        }
        let Some(p) = sys::pid(self.pid) else { return };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        if let Some(fd) = &self.pidfd {
            let _ = tokio::time::timeout_at(deadline, fd.readable()).await;
        }
        loop {
            match rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG) {
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(2)).await
                }
                Err(Errno::INTR) => {}
                Ok(Some(_)) | Err(Errno::CHILD) => {
                    self.reaped.set(true);
                    return;
                }
                _ => return,
            }
        }
    }
}

/// A pidfd registered with the runtime, readable once its process has exited.
#[allow(unsafe_code)]
pub(crate) fn watch_pidfd(
    fd: std::os::fd::OwnedFd,
) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the AsyncFd takes the descriptor by value and owns it from here on; nothing else
    // holds, replaces or closes it while it is registered.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, Interest::READABLE).ok() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The supervisor's start beside the acquire (`beside`, `with_supervisor`, `Start`), with
    /// stand-ins for the acquire, the lock and the link. A time-out here means the step waited
    /// for something it must not wait for; the clock is paused, so it fires as soon as nothing
    /// else can happen.
    const NEVER: Duration = Duration::from_secs(3600);

    fn cannot_start() -> Failure {
        Failure::new(exit::OSERR, "cannot start the supervisor process")
    }

    /// Sets its flag when dropped.
    struct OnDrop(std::rc::Rc<std::cell::Cell<bool>>);

    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_acquire_answers_while_the_supervisors_start_is_under_way() {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Failure>>();
        let mut start = Start::Pending(rx);
        let answer = tokio::time::timeout(NEVER, beside(async { "granted" }, &mut start)).await;
        assert_eq!(
            answer,
            Ok(Ok("granted")),
            "the acquire's answer waited for the supervisor's start"
        );
        assert!(start.pending(), "the start was taken as over before it was");
        // The link is waited for once the hold needs it.
        let sent = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(Ok(7)).is_ok()
        });
        let joined = with_supervisor("guard", &mut start, |_| async {
            panic!("a started supervisor released the lock")
        })
        .await
        .map(|(guard, link)| (guard, *link));
        assert_eq!(joined, Ok(("guard", 7)));
        assert!(sent.await.unwrap());
        // A settled start is not waited on again: `beside` would otherwise settle it in a loop
        // that never lets the acquire's I/O run.
        assert!(
            !start.pending(),
            "a started supervisor still counts as pending"
        );
        assert!(!Start::<u32>::Failed(None).pending());
    }

    #[tokio::test(start_paused = true)]
    async fn a_supervisor_that_cannot_start_ends_the_wait_and_drops_the_acquire() {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Failure>>();
        let mut start = Start::Pending(rx);
        let dropped = std::rc::Rc::new(std::cell::Cell::new(false));
        let held = OnDrop(dropped.clone());
        let acquire = async move {
            let _held = &held;
            std::future::pending::<()>().await
        };
        let failed = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(Err(cannot_start())).is_ok()
        });
        let answer = tokio::time::timeout(NEVER, beside(acquire, &mut start)).await;
        assert_eq!(
            answer,
            Ok(Err(cannot_start())),
            "the wait went on after the supervisor could not start"
        );
        assert!(
            dropped.get(),
            "the acquire was not dropped (its session would not leave)"
        );
        assert!(failed.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_supervisor_that_cannot_start_after_the_grant_releases_the_lock() {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Failure>>();
        let mut start = Start::Pending(rx);
        let answer = tokio::time::timeout(NEVER, beside(async { "granted" }, &mut start)).await;
        assert_eq!(answer, Ok(Ok("granted")));
        tx.send(Err(cannot_start())).unwrap();
        let released = std::cell::Cell::new(None);
        let released = &released;
        let joined = tokio::time::timeout(
            NEVER,
            with_supervisor("guard", &mut start, |guard| async move {
                released.set(Some(guard));
                "; released".to_owned()
            }),
        )
        .await
        .expect("the start's failure was not waited for")
        .map(|(guard, link)| (guard, *link));
        assert_eq!(
            joined,
            Err(Failure::new(
                exit::OSERR,
                "cannot start the supervisor process; released"
            ))
        );
        assert_eq!(
            released.get(),
            Some("guard"),
            "the lock was not released after the supervisor could not start"
        );
    }

    /// A start thread that ended without an answer (it panicked) is a failure of its own, 71
    /// and named a bug, handed out once; it neither hangs the wait nor passes for a start.
    #[tokio::test(start_paused = true)]
    async fn a_start_that_ends_without_an_answer_is_a_failure_not_a_hang() {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Failure>>();
        let mut start = Start::Pending(rx);
        drop(tx);
        let answer = tokio::time::timeout(NEVER, beside(std::future::pending::<()>(), &mut start))
            .await
            .expect("the wait went on after the start's thread was gone");
        let f = answer.expect_err("a start without an answer passed for one");
        assert_eq!(f.status, exit::OSERR);
        assert!(f.line.contains("this is a bug"), "{}", f.line);
        assert_eq!(start.finish().await, None);
    }

    /// A term that ends while the start is under way (a signal, `--wait` running out) gets the
    /// supervisor it made, to close and reap: none is left behind.
    #[tokio::test(start_paused = true)]
    async fn a_start_under_way_when_the_term_ends_is_waited_for() {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Failure>>();
        let start = Start::Pending(rx);
        let sent = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(Ok(7)).is_ok()
        });
        assert_eq!(
            tokio::time::timeout(NEVER, start.finish()).await,
            Ok(Some(7))
        );
        assert!(sent.await.unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<u32, Failure>>();
        tx.send(Err(cannot_start())).unwrap();
        assert_eq!(Start::Pending(rx).finish().await, None);
    }

    /// A link to a stand-in for the supervisor: `child`, a real child of this process (so that
    /// the link can kill and reap it as it does the supervisor), and the socket's other end,
    /// which the test reads and writes as the supervisor would.
    fn link_to(child: &std::process::Child) -> (Link, std::os::fd::OwnedFd) {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .unwrap();
        let sock = UnixStream::from_std(std::os::unix::net::UnixStream::from(ours)).unwrap();
        let pidfd = sys::pid(child.id())
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
            .and_then(watch_pidfd);
        let link = Link {
            sock,
            pid: child.id(),
            pidfd,
            reaped: std::cell::Cell::new(false),
        };
        (link, theirs)
    }

    /// A child of the test, killed and reaped when dropped if it is still there: a failing
    /// test leaves no process behind (which would also hold the test's output open).
    struct Proc(std::process::Child);

    impl Drop for Proc {
        fn drop(&mut self) {
            // Err: already reaped (by the link under test).
            if let Ok(None) = self.0.try_wait() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }

    impl std::ops::Deref for Proc {
        type Target = std::process::Child;
        fn deref(&self) -> &std::process::Child {
            &self.0
        }
    }

    impl std::ops::DerefMut for Proc {
        fn deref_mut(&mut self) -> &mut std::process::Child {
            &mut self.0
        }
    }

    /// A process that runs until its stdin is closed.
    fn until_stdin_closes() -> Proc {
        Proc(
            std::process::Command::new("cat")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn sleeper() -> Proc {
        Proc(
            std::process::Command::new("sleep")
                .arg("3600")
                .spawn()
                .unwrap(),
        )
    }

    fn supervisor_sends(theirs: &std::os::fd::OwnedFd, bytes: &[u8]) {
        assert_eq!(
            rustix::net::send(theirs, bytes, SendFlags::DONTWAIT).unwrap(),
            bytes.len()
        );
    }

    fn supervisor_reads(theirs: &std::os::fd::OwnedFd) -> Vec<u8> {
        let mut buf = vec![0u8; proto::MAX_ENV_MESSAGE + 1];
        let (n, len) = rustix::net::recv(theirs, &mut buf, RecvFlags::DONTWAIT | RecvFlags::TRUNC)
            .expect("nothing was sent");
        assert_eq!(n, len, "a datagram larger than any message");
        buf.truncate(n);
        buf
    }

    async fn recv(link: &Link) -> Option<Result<FromSupervisor, ProtoError>> {
        tokio::time::timeout(Duration::from_secs(60), link.recv())
            .await
            .expect("the link waited for a message already sent")
            .expect("the link's read failed")
    }

    /// Each datagram is one message, read whole up to MAX_MESSAGE bytes; a longer one is named
    /// by its own length (not by what fitted the buffer), so the supervisor's breach is said as
    /// it was.
    #[tokio::test]
    async fn the_supervisors_datagrams_are_read_whole_and_an_overlong_one_is_refused() {
        let mut child = sleeper();
        let (link, theirs) = link_to(&child);
        supervisor_sends(&theirs, b"PID 42\n");
        let longest = format!("ERROR {}", "x".repeat(MAX_MESSAGE - 6));
        assert_eq!(longest.len(), MAX_MESSAGE);
        supervisor_sends(&theirs, longest.as_bytes());
        supervisor_sends(&theirs, &[b'A'; 1000]);
        supervisor_sends(&theirs, b"GONE\n");
        assert_eq!(recv(&link).await, Some(Ok(FromSupervisor::Pid(42))));
        assert_eq!(
            recv(&link).await,
            Some(Ok(FromSupervisor::Error("x".repeat(MAX_MESSAGE - 6))))
        );
        assert_eq!(recv(&link).await, Some(Err(ProtoError::TooLong(1000))));
        assert_eq!(recv(&link).await, Some(Ok(FromSupervisor::Gone)));
        drop(theirs);
        assert_eq!(
            recv(&link).await,
            None,
            "no end of file once the supervisor's end closed"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A supervisor that exits with our messages unread resets the connection (ECONNRESET):
    /// what it said before it went, GONE above all, is still read, then the end of file.
    #[tokio::test]
    async fn a_supervisor_gone_with_our_messages_unread_is_still_heard_to_the_end() {
        let mut child = sleeper();
        let (link, theirs) = link_to(&child);
        link.send(ToSupervisor::Lease { end_ns: 5 });
        supervisor_sends(&theirs, b"EXIT CODE 0\n");
        supervisor_sends(&theirs, b"GONE\n");
        drop(theirs);
        assert_eq!(
            recv(&link).await,
            Some(Ok(FromSupervisor::Exit(proto::ChildExit::Code(0))))
        );
        assert_eq!(recv(&link).await, Some(Ok(FromSupervisor::Gone)));
        assert_eq!(recv(&link).await, None);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The hold's variables go one ENV datagram each, then the lease end; once the supervisor is
    /// gone, a variable that cannot be passed is an error (the command must not start without
    /// it), while a lease end is dropped silently.
    #[tokio::test]
    async fn the_supervisor_is_told_one_datagram_a_message() {
        let mut child = sleeper();
        let (link, theirs) = link_to(&child);
        let env = [
            ("KAFKA_LOCK_NAME", OsString::from("jobs")),
            ("KAFKA_LOCK_CHECKPOINT", OsString::from("a b\nc")),
        ];
        link.send_env(&env).unwrap();
        link.send(ToSupervisor::Lease { end_ns: 5 });
        for (name, value) in &env {
            let got = supervisor_reads(&theirs);
            assert_eq!(got, proto::encode_env(name, value).unwrap());
            assert_eq!(
                proto::parse_env(&got),
                Some(Ok((OsString::from(name), value.clone())))
            );
        }
        assert_eq!(
            ToSupervisor::parse(&supervisor_reads(&theirs)),
            Ok(ToSupervisor::Lease { end_ns: 5 })
        );
        // Shut down rather than closed: a child another test forks meanwhile holds a copy of
        // the descriptor until it execs, and a close would only take effect then.
        rustix::net::shutdown(&theirs, rustix::net::Shutdown::Both).unwrap();
        assert!(link.send_env(&env[..1]).is_err(), "an ENV to no one passed");
        link.send(ToSupervisor::Stop);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Closing the link is the supervisor's end of input: it exits on it, and is reaped.
    #[tokio::test]
    async fn closing_the_link_ends_the_supervisors_input_and_reaps_it() {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .unwrap();
        // `cat` reads the supervisor's end until end of file, then exits.
        let child = Proc(
            std::process::Command::new("cat")
                .stdin(std::process::Stdio::from(theirs))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let (mut link, _unused) = link_to(&child);
        link.sock = UnixStream::from_std(std::os::unix::net::UnixStream::from(ours)).unwrap();
        tokio::time::timeout(Duration::from_secs(60), link.close())
            .await
            .expect("the close waited past the supervisor's exit");
        assert!(link.reaped.get(), "the supervisor was not reaped");
        assert!(
            matches!(
                rustix::process::waitpid(
                    sys::pid(child.id()),
                    rustix::process::WaitOptions::NOHANG
                ),
                Err(Errno::CHILD)
            ),
            "the supervisor is left to reap"
        );
    }

    /// The reap waits for the supervisor's exit (its pidfd wakes it) and reaps it then.
    #[tokio::test]
    async fn the_reap_waits_for_the_supervisors_exit() {
        let mut child = until_stdin_closes();
        let (link, _theirs) = link_to(&child);
        let mut reap = std::pin::pin!(link.reap());
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(reap.as_mut().poll(cx))).await;
        assert!(
            first.is_pending(),
            "the reap gave up on a supervisor that still runs"
        );
        drop(child.stdin.take());
        tokio::time::timeout(Duration::from_secs(60), reap)
            .await
            .expect("the reap did not see the supervisor's exit");
        assert!(link.reaped.get(), "the supervisor was not reaped");
        assert!(matches!(
            rustix::process::waitpid(sys::pid(child.id()), rustix::process::WaitOptions::NOHANG),
            Err(Errno::CHILD)
        ));
    }

    /// Without a pidfd (Linux before 5.3) the reap polls for the supervisor's exit until its
    /// bound, and reaps it once it has exited.
    #[tokio::test]
    async fn without_a_pidfd_the_reap_polls_for_the_supervisors_exit() {
        let mut child = until_stdin_closes();
        let (mut link, _theirs) = link_to(&child);
        link.pidfd = None;
        let mut reap = std::pin::pin!(link.reap());
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(reap.as_mut().poll(cx))).await;
        assert!(
            first.is_pending(),
            "the reap gave up on a supervisor that still runs"
        );
        drop(child.stdin.take());
        tokio::time::timeout(Duration::from_secs(60), reap)
            .await
            .expect("the reap did not see the supervisor's exit");
        assert!(link.reaped.get(), "the supervisor was not reaped");
    }

    /// A supervisor that does not exit is given up on after the reap's 5 s, not waited for
    /// without end (the release waits on the reap), and is not taken as reaped.
    #[tokio::test]
    async fn the_reap_gives_up_on_a_supervisor_that_does_not_exit() {
        let mut child = sleeper();
        let (link, _theirs) = link_to(&child);
        tokio::time::timeout(Duration::from_secs(60), link.reap())
            .await
            .expect("the reap waited without end");
        assert!(
            !link.reaped.get(),
            "a running supervisor was taken as reaped"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The kill is a SIGKILL to the supervisor, and its pidfd wakes whoever waits on its exit.
    #[tokio::test]
    async fn a_killed_supervisor_ends_by_sigkill_and_its_pidfd_says_so() {
        use std::os::unix::process::ExitStatusExt;
        let mut child = sleeper();
        let (link, _theirs) = link_to(&child);
        let pidfd = link.pidfd.as_ref().expect("no pidfd on this kernel");
        link.kill();
        tokio::time::timeout(Duration::from_secs(60), pidfd.readable())
            .await
            .expect("the pidfd did not wake on the supervisor's exit")
            .unwrap()
            .retain_ready();
        assert_eq!(child.wait().unwrap().signal(), Some(9));
    }
}
