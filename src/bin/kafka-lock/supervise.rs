//! The supervisor process (P): `kafka-lock run` (K) re-executes its own binary in this hidden
//! mode to start the command (C) and to stop it on time, whatever happens to K.
//!
//! ```text
//! kafka-lock run (K)       the lock session, events, signals; a child subreaper
//!   └─ kafka-lock __supervise (P)   its own process group; a child subreaper; owns the deadline
//!        └─ COMMAND (C)             its own process group
//! ```
//!
//! P is single-threaded and does nothing that can block for long: it waits in poll() on the
//! socket to K, on a pidfd of C and on a timer at the lease end, and writes only
//! datagrams to K without waiting (never to a pipe). So a stalled stderr, a starved runtime or a
//! stopped K cannot keep it from stopping the command at the lease end: SIGTERM to everything
//! below P then, SIGKILL at lease end + grace, unless K has moved the lease by then. K moves it
//! with each renewal; a lease end can only come from K.
//!
//! P counts on CLOCK_BOOTTIME, which goes on while the host is suspended, as the broker's clock
//! does; K's lease ends arrive as CLOCK_MONOTONIC readings and are moved to CLOCK_BOOTTIME on
//! arrival. A lease that ran out during a suspend is over when the host wakes: the timer (a
//! timerfd on CLOCK_BOOTTIME, since poll's own timeout stops during a suspend) wakes P at once.
//!
//! P also stops everything at once (SIGTERM, SIGKILL after the grace) when K tells it the lock
//! is lost (STOP), when K is gone (end of file on the socket: K died, even by SIGKILL), and
//! when C has ended (whatever C left behind must not outlive the hold). It reports GONE once no
//! descendant is left, and K releases the lock only after that.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::{Errno, FdFlags};
use rustix::net::{RecvFlags, SendFlags, SocketType};
use rustix::process::Signal;
use rustix::time::{Itimerspec, TimerfdTimerFlags};

use crate::proto::{self, ChildExit, FromSupervisor, ToSupervisor, MAX_ENV_MESSAGE};
use crate::trace::stamp;
use crate::{sys, tree};

/// argv[1] that selects this mode. Not a subcommand clap knows: nobody should type it.
pub const MODE: &str = "__supervise";

/// What K passes: `kafka-lock __supervise <fd> <grace_ns> -- COMMAND [ARGS...]`.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    pub fd: i32,
    pub grace_ns: u64,
    pub command: Vec<OsString>,
}

impl Args {
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![
            MODE.into(),
            self.fd.to_string().into(),
            self.grace_ns.to_string().into(),
            "--".into(),
        ];
        argv.extend(self.command.iter().cloned());
        argv
    }

    /// Parses argv\[1..\] (starting with [`MODE`]).
    pub fn parse(argv: &[OsString]) -> Result<Args, String> {
        let field = |i: usize| argv.get(i).and_then(|a| a.to_str());
        if field(0) != Some(MODE) || field(3) != Some("--") || argv.len() < 5 {
            return Err(format!(
                "{MODE} is kafka-lock run's internal supervisor mode; it is not meant to be run by hand"
            ));
        }
        let fd: i32 = field(1)
            .and_then(|s| s.parse().ok())
            .filter(|fd| *fd > 2)
            .ok_or_else(|| format!("{MODE}: bad descriptor argument {:?}", argv[1]))?;
        let grace_ns: u64 = field(2)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{MODE}: bad grace argument {:?}", argv[2]))?;
        Ok(Args {
            fd,
            grace_ns,
            command: argv[4..].to_vec(),
        })
    }
}

/// Runs P. `argv` is the whole command line, argv\[0\] included.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    stamp("supervisor", "start");
    let args = match Args::parse(argv.get(1..).unwrap_or_default()) {
        Ok(a) => a,
        Err(e) => return fatal_before_start(&e),
    };
    let sock = match take_socket(args.fd) {
        Ok(s) => s,
        Err(e) => return fatal_before_start(&e),
    };
    Supervisor::new(sock, args).run()
}

/// Only before any command is started may P write to stderr (and block on it): nothing depends
/// on P yet. Every later problem goes to K over the socket.
fn fatal_before_start(line: &str) -> ExitCode {
    let _ = std::io::stderr().write_all(format!("kafka-lock: {line}\n").as_bytes());
    ExitCode::from(crate::exit::USAGE)
}

/// Takes ownership of the socket K passed by number, marks it close-on-exec at once so the
/// command never inherits it (K's death must be seen as end of file here), and checks that it
/// is what K creates.
#[allow(unsafe_code)]
fn take_socket(fd: i32) -> Result<OwnedFd, String> {
    // SAFETY: K opened this descriptor and left it open across exec for P alone (it cleared
    // close-on-exec on it for this one spawn and closed its own copy after), and passed its
    // number; nothing else in this process refers to it, so P may own and close it. Run by hand
    // with another number (descriptors 0 to 2 are refused before this), the checks below fail on
    // whatever it is, and closing it then harms nothing: P exits at once.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&sock, FdFlags::CLOEXEC)
        .map_err(|e| format!("{MODE}: descriptor {fd} is not usable: {e}"))?;
    match rustix::net::sockopt::socket_type(&sock) {
        Ok(SocketType::SEQPACKET) => Ok(sock),
        _ => Err(format!(
            "{MODE}: descriptor {fd} is not the socket kafka-lock run passes"
        )),
    }
}

#[derive(Debug, Clone, Copy)]
struct Stopping {
    /// SIGKILL for whatever is left from here on (CLOCK_BOOTTIME ns).
    kill_at_ns: u64,
    killing: bool,
}

struct Supervisor {
    sock: OwnedFd,
    /// False once K is gone (end of file) or the socket failed.
    k_alive: bool,
    grace_ns: u64,
    command: Vec<OsString>,
    /// The hold's variables for the command (ENV), sent by K once the lock is held.
    env: Vec<(OsString, OsString)>,
    /// The lease end K sent last, as K sent it (CLOCK_MONOTONIC ns: events report it so).
    lease_end_ns: Option<u64>,
    /// The same lease end on CLOCK_BOOTTIME, which P counts on.
    lease_end_boot: Option<u64>,
    /// CLOCK_BOOTTIME minus CLOCK_MONOTONIC when the last lease end arrived: the suspend so far.
    suspended_at_last_lease: Option<u64>,
    /// A CLOCK_BOOTTIME timer armed at P's next deadline; None where the kernel has none
    /// (before Linux 3.15), and then poll's timeout alone wakes P.
    timer: Option<OwnedFd>,
    /// The command's pid, which is also its process group's id.
    child: Option<u32>,
    /// Readable when the command has ended; None once it is reaped (or without pidfd support).
    child_pidfd: Option<OwnedFd>,
    child_ended: bool,
    stopping: Option<Stopping>,
    /// A LEASE asked for the command to start; it starts once every message K queued has been
    /// read (see `read_messages`).
    start_pending: bool,
}

impl Supervisor {
    fn new(sock: OwnedFd, args: Args) -> Supervisor {
        Supervisor {
            sock,
            k_alive: true,
            grace_ns: args.grace_ns,
            command: args.command,
            env: Vec::new(),
            lease_end_ns: None,
            lease_end_boot: None,
            suspended_at_last_lease: None,
            timer: rustix::time::timerfd_create(
                rustix::time::TimerfdClockId::Boottime,
                rustix::time::TimerfdFlags::CLOEXEC | rustix::time::TimerfdFlags::NONBLOCK,
            )
            .ok(),
            child: None,
            child_pidfd: None,
            child_ended: false,
            stopping: None,
            start_pending: false,
        }
    }

    fn run(mut self) -> ExitCode {
        // Orphans of the command are re-parented here, where they can be found and waited for.
        if let Err(e) = sys::become_subreaper() {
            self.send(&FromSupervisor::Error(format!(
                "cannot become a child subreaper: {e}"
            )));
            self.send(&FromSupervisor::Gone);
            return ExitCode::from(crate::exit::OSERR);
        }
        if let Err(e) = sys::check_proc() {
            self.send(&FromSupervisor::Error(e.to_string()));
            self.send(&FromSupervisor::Gone);
            return ExitCode::from(crate::exit::OSERR);
        }
        loop {
            let children_remain = self.reap();
            let now = sys::boot_ns();
            if self.stopping.is_none() && self.child.is_some() {
                if let (Some(end), Some(_)) = (
                    self.lease_end_ns,
                    self.lease_end_boot.filter(|end| *end <= now),
                ) {
                    self.send(&FromSupervisor::Expired { lease_end_ns: end });
                    self.begin_stop(now);
                }
            }
            if let Some(mut stop) = self.stopping {
                if !stop.killing && now >= stop.kill_at_ns {
                    stop.killing = true;
                    self.stopping = Some(stop);
                }
                let mut remain = children_remain;
                if stop.killing && remain {
                    tree::signal_tree(self.running_group(), Signal::KILL);
                    remain = self.reap();
                }
                if !remain {
                    self.send(&FromSupervisor::Gone);
                    stamp("supervisor", "gone");
                    return ExitCode::SUCCESS;
                }
            }
            self.wait(now);
        }
    }

    /// The command's process group, while the command is not reaped: until then its pid, which
    /// is the group's id, cannot be taken by another process. After that, what is left of the
    /// group is reached one descendant at a time.
    fn running_group(&self) -> Option<u32> {
        self.child.filter(|_| !self.child_ended)
    }

    /// Reaps everything that has ended and reports the command's own end to K. Returns whether
    /// any child remains.
    fn reap(&mut self) -> bool {
        let child = self.child;
        let mut ended = None;
        let remain = tree::reap(|pid, exit| {
            if Some(pid) == child {
                // Without WUNTRACED only exits and deaths by signal are reported; anything else
                // would be a kernel surprise, reported as a kill.
                ended = Some(exit.unwrap_or(ChildExit::Signal(Signal::KILL.as_raw())));
            }
        });
        if ended.is_none() && !remain && child.is_some() && !self.child_ended {
            // Gone without a status to read: only possible with SIGCHLD ignored, which K undoes
            // before starting us. Treated as a death by SIGKILL rather than spinning on a pidfd
            // that stays readable.
            ended = Some(ChildExit::Signal(Signal::KILL.as_raw()));
        }
        if let Some(exit) = ended {
            stamp("supervisor", "command-reaped");
            self.child_ended = true;
            self.child_pidfd = None;
            self.send(&FromSupervisor::Exit(exit));
            if remain {
                // Whatever the command left behind runs without anyone waiting for it: stop it
                // before K may release the lock.
                self.begin_stop(sys::boot_ns());
            } else {
                // ECHILD: as a subreaper, every descendant is our child or has a living parent
                // below us, so nothing is left to signal, and the walk of /proc that a stop
                // begins with would only delay GONE (and the release after it).
                self.stopping = Some(Stopping {
                    kill_at_ns: sys::boot_ns(),
                    killing: true,
                });
            }
        }
        remain
    }

    fn begin_stop(&mut self, now: u64) {
        if self.stopping.is_some() {
            return;
        }
        let mut kill_at_ns = now.saturating_add(self.grace_ns);
        if let Some(end) = self.lease_end_boot {
            // Never later than the lease end plus the grace, however late this is noticed.
            kill_at_ns = kill_at_ns.min(end.saturating_add(self.grace_ns));
        }
        let killing = kill_at_ns <= now;
        if !killing {
            tree::signal_tree(self.running_group(), Signal::TERM);
        }
        self.stopping = Some(Stopping {
            kill_at_ns,
            killing,
        });
    }

    /// Waits for K, the command's end, or the next deadline.
    fn wait(&mut self, now: u64) {
        let deadline = match (self.stopping, self.lease_end_boot, self.child) {
            // While stopping, orphans that end do not wake us: look again every tick.
            (Some(s), _, _) if !s.killing => {
                Some(s.kill_at_ns.min(now.saturating_add(sys::nanos(tree::TICK))))
            }
            (Some(_), _, _) => Some(now.saturating_add(sys::nanos(tree::TICK))),
            (None, Some(end), Some(_)) => Some(if self.child_pidfd.is_some() {
                end
            } else {
                // No pidfd (kernels before 5.3): the command's end is noticed by polling.
                end.min(now.saturating_add(sys::nanos(tree::TICK) * 5))
            }),
            // Before the command starts (while K waits for the lock, too), only K can move
            // things on.
            _ => None,
        };
        let timeout = deadline.map(|d| {
            let ns = d.saturating_sub(now);
            Timespec {
                tv_sec: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
                tv_nsec: (ns % 1_000_000_000) as _,
            }
        });
        // Arming the timer also clears an expiry already counted, so it need not be read.
        let timer = self.timer.as_ref().zip(deadline).filter(|(t, d)| {
            let at = Itimerspec {
                it_interval: Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: Timespec {
                    tv_sec: i64::try_from(d / 1_000_000_000).unwrap_or(i64::MAX),
                    tv_nsec: (d % 1_000_000_000) as _,
                },
            };
            rustix::time::timerfd_settime(t, TimerfdTimerFlags::ABSTIME, &at).is_ok()
        });
        let mut sock_ready = false;
        let polled = {
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(3);
            if self.k_alive {
                fds.push(PollFd::new(&self.sock, PollFlags::IN));
            }
            if let Some(pidfd) = &self.child_pidfd {
                fds.push(PollFd::new(pidfd, PollFlags::IN));
            }
            if let Some((t, _)) = timer {
                fds.push(PollFd::new(t, PollFlags::IN));
            }
            if fds.is_empty() && timeout.is_none() {
                // Nothing can wake us and no deadline is due: only when K is gone before the
                // command started, which begin_stop has already turned into a stop.
                Ok(0)
            } else {
                let r = rustix::event::poll(&mut fds, timeout.as_ref());
                if self.k_alive {
                    sock_ready = !fds[0].revents().is_empty();
                }
                r
            }
        };
        match polled {
            Ok(_) | Err(Errno::INTR) => {}
            // poll cannot fail on valid descriptors; if it does anyway, fall back to ticking so
            // deadlines are still kept.
            Err(_) => std::thread::sleep(tree::TICK),
        }
        if sock_ready {
            self.read_messages();
        }
    }

    fn read_messages(&mut self) {
        self.drain_socket();
        // The command starts only after everything K queued is read: a STOP (the hold was lost)
        // or end of file (K died) queued behind the LEASE, because P woke up late (a starved or
        // stopped P, or one still starting when K got the lock), means it must not start at all,
        // rather than start and be stopped at once under a hold K already knows is gone.
        if std::mem::take(&mut self.start_pending)
            && self.stopping.is_none()
            && self.child.is_none()
        {
            let now = sys::boot_ns();
            match (self.lease_end_ns, self.lease_end_boot) {
                (Some(_), Some(end)) if end > now => self.start(),
                (end_ns, _) => {
                    self.send(&FromSupervisor::Expired {
                        lease_end_ns: end_ns.unwrap_or(0),
                    });
                    self.begin_stop(now);
                }
            }
        }
    }

    fn drain_socket(&mut self) {
        let mut buf = vec![0u8; MAX_ENV_MESSAGE + 1];
        while self.k_alive {
            match rustix::net::recv(
                &self.sock,
                &mut buf[..],
                RecvFlags::DONTWAIT | RecvFlags::TRUNC,
            ) {
                Ok((_, 0)) => self.k_gone(),
                Ok((n, len)) => {
                    let msg = if len > n {
                        Err(crate::proto::ProtoError::TooLong(len))
                    } else if let Some(var) = proto::parse_env(&buf[..n]) {
                        var.map(|(name, value)| {
                            // Only before the command starts: its environment is fixed then.
                            if self.child.is_none() {
                                self.env.push((name, value));
                            }
                        })
                    } else {
                        ToSupervisor::parse(&buf[..n]).map(|m| self.handle(m))
                    };
                    match msg {
                        Ok(()) => {}
                        Err(e) => {
                            self.send(&FromSupervisor::Error(format!(
                                "the supervisor got {e} from kafka-lock run; stopping the command"
                            )));
                            self.begin_stop(sys::boot_ns());
                        }
                    }
                }
                Err(Errno::AGAIN) => return,
                Err(Errno::INTR) => {}
                Err(_) => self.k_gone(),
            }
        }
    }

    fn k_gone(&mut self) {
        self.k_alive = false;
        // Nobody renews the lease any more, and nobody would release the lock after us.
        self.begin_stop(sys::boot_ns());
    }

    fn handle(&mut self, msg: ToSupervisor) {
        match msg {
            ToSupervisor::Lease { end_ns } => {
                stamp("supervisor", "lease");
                if self.stopping.is_some() {
                    return;
                }
                let now = sys::boot_ns();
                let now_mono = sys::mono_ns();
                let end_boot =
                    lease_end_on_boottime(end_ns, now_mono, now, self.suspended_at_last_lease);
                self.suspended_at_last_lease = Some(now.saturating_sub(now_mono));
                self.lease_end_ns = Some(end_ns);
                self.lease_end_boot = Some(end_boot);
                if self.child.is_none() {
                    if end_boot > now {
                        self.start_pending = true;
                    } else {
                        self.send(&FromSupervisor::Expired {
                            lease_end_ns: end_ns,
                        });
                        self.begin_stop(now);
                    }
                }
            }
            ToSupervisor::Stop => self.begin_stop(sys::boot_ns()),
            ToSupervisor::Signal(n) => {
                if let (Some(pgid), false) = (self.child, self.child_ended) {
                    if let Some(sig) = Signal::from_named_raw(n) {
                        let _ = sys::kill_group(pgid, sig);
                    }
                }
            }
        }
    }

    fn start(&mut self) {
        let Some((program, args)) = self.command.split_first() else {
            self.begin_stop(sys::boot_ns());
            return;
        };
        let mut cmd = std::process::Command::new(program);
        // Its own process group: a loss stops everything it started at once, and a terminal's
        // Ctrl-C reaches it only through K, which releases the lock after it is gone.
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        match cmd.spawn() {
            Ok(child) => {
                let pid = child.id();
                // The std handle is not used to wait: every child is reaped in `reap`.
                drop(child);
                self.child = Some(pid);
                self.child_pidfd = sys::pid(pid).and_then(|p| {
                    rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
                });
                self.send(&FromSupervisor::Pid(pid));
                stamp("supervisor", "command-spawned");
            }
            Err(e) => {
                self.send(&FromSupervisor::Failed {
                    errno: e.raw_os_error().unwrap_or(0),
                });
                self.begin_stop(sys::boot_ns());
            }
        }
    }

    /// Sends one datagram without ever waiting: K reads every message at once, and P sends only
    /// a handful per run, so a full socket buffer (a K stopped for long) only loses a message K
    /// can no longer act on in time anyway.
    fn send(&mut self, msg: &FromSupervisor) {
        if !self.k_alive {
            return;
        }
        let bytes = msg.encode();
        match rustix::net::send(
            &self.sock,
            bytes.as_bytes(),
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        ) {
            Ok(_) | Err(Errno::AGAIN) => {}
            Err(_) => self.k_gone(),
        }
    }
}

/// A lease end K sent as a CLOCK_MONOTONIC reading, on CLOCK_BOOTTIME. The library times a
/// renewal from its heartbeat's send; if the host was suspended between that send and this
/// message, moving the end by the whole suspend so far would make it later than the broker's by
/// that suspend (the broker's session ran on). A suspend since the previous lease end arrived
/// may have come after the send, so it is taken off: at worst (it came before the send) this one
/// lease end is early by it, and the next is exact again. `suspended_before`: boottime minus
/// monotonic when the previous lease end arrived.
fn lease_end_on_boottime(
    end_mono: u64,
    now_mono: u64,
    now_boot: u64,
    suspended_before: Option<u64>,
) -> u64 {
    let end = sys::mono_to_boot(end_mono, now_mono, now_boot);
    match suspended_before {
        Some(before) => {
            end.saturating_sub(now_boot.saturating_sub(now_mono).saturating_sub(before))
        }
        None => end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// adversarial review: a renewal whose heartbeat was sent before a host suspend and whose
    /// answer is read after it. The broker counted the session from before the suspend, so the
    /// lease ends at send + lease on the clock that ran on; P must not place it later. Before,
    /// P moved the end by the whole suspend so far and let the command run a whole suspend past
    /// the broker's session (a suspend longer than the session: while another member holds it).
    #[test]
    fn adversarial_review_a_renewal_sent_before_a_suspend_is_not_moved_by_it() {
        let s = 1_000_000_000u64;
        let (lease, suspend) = (9 * s, 60 * s);
        // Boottime is 100 s ahead of monotonic (earlier suspends) when the last lease arrived.
        let offset = 100 * s;
        let sent_mono = 1_000 * s;
        // The answer is read and the lease end reaches P 10 ms after waking.
        let now_mono = sent_mono + 10_000_000;
        let now_boot = now_mono + offset + suspend;
        let broker_end_boot = sent_mono + offset + lease;
        let end = lease_end_on_boottime(sent_mono + lease, now_mono, now_boot, Some(offset));
        assert!(end <= broker_end_boot, "{end} > {broker_end_boot}");
        assert!(end <= now_boot, "the lease must be over on waking");
        // No suspend since the last lease end: moved exactly as before.
        let end =
            lease_end_on_boottime(sent_mono + lease, now_mono, now_mono + offset, Some(offset));
        assert_eq!(end, broker_end_boot);
        assert_eq!(
            lease_end_on_boottime(sent_mono + lease, now_mono, now_mono + offset, None),
            broker_end_boot
        );
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn arguments_round_trip() {
        let a = Args {
            fd: 7,
            grace_ns: 2_000_000_000,
            command: os(&["sh", "-c", "exit 3"]),
        };
        assert_eq!(Args::parse(&a.to_argv()), Ok(a));
        // The shortest command line: a command of one word.
        let a = Args {
            fd: 3,
            grace_ns: 0,
            command: os(&["true"]),
        };
        assert_eq!(Args::parse(&a.to_argv()), Ok(a));
    }

    /// Run by hand, the mode refuses its arguments and exits 64 before it touches any
    /// descriptor.
    #[test]
    fn bad_arguments_exit_64_before_anything_starts() {
        assert_eq!(
            main(os(&["kafka-lock", MODE])),
            ExitCode::from(crate::exit::USAGE)
        );
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            vec![],
            vec![MODE],
            vec![MODE, "7", "1", "--"],
            vec![MODE, "7", "1", "x", "true"],
            vec![MODE, "2", "1", "--", "true"],
            vec![MODE, "-1", "1", "--", "true"],
            vec![MODE, "seven", "1", "--", "true"],
            vec![MODE, "7", "-1", "--", "true"],
            vec!["run", "7", "1", "--", "true"],
        ] {
            assert!(Args::parse(&os(&bad)).is_err(), "{bad:?}");
        }
    }
}
