//! The life of one hold under `run` (and each term of `elect`), sans-I/O: fed what happened (the
//! lease moved, the hold was lost, the supervisor said something or died, a signal came, a
//! deadline passed) with the driver's view of the clock and the lease, it answers with what to do
//! (pass the environment and the lease end to the supervisor, stop or signal the command, report,
//! store the checkpoint, release) and finally how the run ends. It never reads a clock, never
//! touches a socket or a process; `run.rs` `hold` is the driver that does.
//!
//! ```text
//!              granted
//!                 │ ReadCheckpoint, racing the loss
//!                 ▼
//!            Preparing ── read failed / lost / lease over / ENV failed ──┐
//!                 │ read, lease running: SendEnv, then SendLease         │
//!                 ▼                                                      │
//!             Running ◄─ renewed: SendLease; lost: Stop; our signals     │
//!                 │      passed on (a SIGTERM: KILL after the grace)     │
//!                 │ GONE: the supervisor reaped the command's tree, or   │
//!                 │ the supervisor died: StopTree (we are the subreaper) │
//!                 ▼                                                      │
//!              Ending ── store the checkpoint (exit 0, not lost; a loss │
//!                 │      meanwhile ends the hold at once), then report   │
//!                 │      the end, `released` or `lost` ◄─────────────────┘
//!                 │      (after StopTree: straight on)
//!                 ▼
//!            Releasing ── LeaveGroup answered, or cut short by a signal
//!                 │
//!                 ▼
//!               Done: Conclude (the command's status, or kafka-lock's failure)
//! ```
//!
//! # Why the lock is never used by a command that does not hold it
//! - **The command never starts before the hold begins**, and never after its lease ran out: the
//!   environment and the first LEASE go to the supervisor only once the checkpoint has been read
//!   and only if the lease read after that read is still running; the supervisor starts the
//!   command only on a LEASE, and itself refuses one already over (it then reports EXPIRED).
//! - **A lost or expired lease always stops the tree by the lease end**: every renewal the driver
//!   sees goes to the supervisor as a new LEASE, and the supervisor stops the command's whole
//!   tree on its own clock when the last lease it was told ends (TERM at the lease end, KILL
//!   `--kill-grace` later; `--lease-margin` ≥ `--kill-grace` keeps the KILL before the broker
//!   can drop the member, docs/design.md "The CLI: what stops the command"). A loss seen here
//!   only brings the stop forward (Stop); the supervisor does not wait for this process, so a
//!   stalled driver cannot keep the command running. A LEASE dropped on a full socket leaves
//!   the supervisor with the earlier end: the safe side.
//! - **Every process is gone before the release**: Releasing is reached from Running only on
//!   GONE (the supervisor reaped the command and everything it started, docs/design.md "the
//!   process tree"), or after StopTree, which the driver runs to the end (SIGKILL after the
//!   grace) before it feeds [`Input::TreeStopped`]. Before the command started there is nothing
//!   to stop.
//! - **`released` vs `lost`**: the end of a hold is reported once the tree is gone and before
//!   the LeaveGroup. The lease is read once, at that instant: if it still runs the hold is
//!   claimed up to that instant (`released` with `held_until`), never up to a later wake-up
//!   after a pause; otherwise it is `lost` at the lease end, and a command that ended 0 under a
//!   lease that ran out before the release is a loss (74), not a success. The end is reported
//!   once: a loss reported while the command ran is not reported again (docs/events.md).
//! - **A hold is never reported past its lease while its checkpoint is stored**: the commit waits
//!   for the broker's answer, bounded past `offsets.commit.timeout.ms` (seconds); the driver
//!   races it with the guard's loss, which comes at the lease end on the guard's own clock, and
//!   the loss wins: `lost` at the lease end, the checkpoint's fate left to the next holder's
//!   read (the broker stores it only for a member it has not dropped).
//! - **A hold's end is said before the release goes out**: the LeaveGroup's answer lets the
//!   coordinator give the lock away, and the `failed` of a run comes after it (and after the
//!   RELEASED record), so a checkpoint not stored or a supervisor that died ends the hold with
//!   `released` (or `lost` past the lease) first. A `lost` is never dated after the instant it is said (a fenced or
//!   reassigned hold ended then), nor at the grant's lease end of a renewed hold (the guard's
//!   own lease end once the session has ended it).

use std::time::{Duration, Instant};

use kafka_lock::{FencingToken, LossReason};
use rustix::process::Signal;

use crate::exit::Failure;
use crate::proto::{ChildExit, FromSupervisor};

/// How long to wait for the session to report a loss the guard's own timer has seen, so the
/// `lost` event can carry the lease end the session computed. Nothing waits on it: the
/// supervisor was told to stop the command before.
const LOSS_REPORT_BOUND: Duration = Duration::from_millis(500);

const SIGKILL: i32 = Signal::KILL.as_raw();
const SIGTERM: i32 = Signal::TERM.as_raw();

/// What the driver sees when it feeds an input: the time and the hold's lease.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub now: Instant,
    /// The current lease end (`HoldWatch::lease_end`), `None` once the hold is over.
    pub lease_end: Option<Instant>,
    /// `LockGuard::lease_end`: once the hold is over, the lease end of the grant, whatever the
    /// renewals since (the driver passes a later one it saw, if any).
    pub last_lease: Instant,
}

/// What happened.
#[derive(Debug)]
pub enum Input {
    /// The checkpoint was read (`checkpoint`: the command gets one to hand over), or the hold
    /// needs none.
    Prepared {
        checkpoint: bool,
    },
    /// The checkpoint could not be read: the run fails with this.
    PrepareFailed(Failure),
    /// The hold was lost while the checkpoint was being read.
    LostWhilePreparing,
    /// [`Action::SendEnv`] is done.
    EnvSent,
    /// The supervisor could not be given the hold's environment.
    EnvFailed(String),
    /// The hold's watch changed (a renewal, a new token, or its end): `Seen::lease_end` says to
    /// what.
    LeaseMoved,
    /// The hold's watch can no longer change.
    WatchClosed,
    /// The guard saw the hold end (also the answer to [`Action::AwaitLoss`]).
    Lost(LossReason),
    /// The session reported the loss, with the lease end it computed.
    LossReported {
        reason: LossReason,
        lease_end: Instant,
    },
    TokenChanged(FencingToken),
    /// A message from the supervisor other than GONE.
    Supervisor(FromSupervisor),
    /// The supervisor said GONE: the command and its tree are reaped. `queued_loss`: the lease
    /// end of a `Lost` the session had queued, if any.
    Gone {
        queued_loss: Option<Instant>,
    },
    /// The supervisor's socket closed without GONE: it died.
    SupervisorExited {
        queued_loss: Option<Instant>,
    },
    /// The supervisor broke the protocol or its socket failed.
    SupervisorBroken {
        why: String,
        queued_loss: Option<Instant>,
    },
    /// Caught signal N.
    Signal(i32),
    /// [`Hold::deadline`] was reached.
    Deadline,
    /// The supervisor is reaped.
    Reaped,
    /// [`Action::StopTree`] is done: every process is gone. `child`: how the command ended, if
    /// it was among those reaped; `how`: how the supervisor ended.
    TreeStopped {
        child: Option<ChildExit>,
        how: String,
    },
    /// [`Action::CommitCheckpoint`] is done: `Some` failure if it was not stored.
    Committed(Option<Failure>),
    /// [`Action::Release`] is done: `Some(signal)` if a signal cut it short.
    Released(Option<i32>),
}

/// What to do.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Read the last checkpoint (racing the loss of the hold), then feed `Prepared`,
    /// `PrepareFailed` or `LostWhilePreparing`.
    ReadCheckpoint,
    /// Pass the hold's environment to the supervisor; feed `EnvSent`, or `EnvFailed` if it
    /// cannot be.
    SendEnv,
    /// Tell the supervisor the lease end.
    SendLease(Instant),
    /// Tell the supervisor to stop the command's tree (TERM, KILL after the grace).
    Stop,
    /// Pass a signal to the command's process group.
    Signal(i32),
    /// Kill the supervisor, which broke the protocol.
    KillSupervisor,
    /// The command started: pin its group, hand it the terminal, report it.
    ChildStarted(u32),
    /// Print what the supervisor reports.
    SupervisorSays(String),
    /// The command has exited: give the terminal's foreground back to kafka-lock.
    TakeTerminal,
    /// Report how the command ended.
    ChildExited(ChildExit),
    ReportTokenChanged(FencingToken),
    /// Report the loss, with the lease end if known.
    ReportLost {
        reason: LossReason,
        lease_end: Option<Instant>,
    },
    /// Report the lease expiry the supervisor saw (its lease end, in `mono_ns`).
    ReportExpired {
        lease_end_ns: u64,
    },
    /// Report `released`, the hold claimed up to `held_until`.
    ReportReleased {
        held_until: Instant,
    },
    /// Wait for the guard's loss (the lease has run out) and feed `Lost`.
    AwaitLoss,
    /// Reap the supervisor, then feed `Reaped`.
    Reap,
    /// Stop everything the dead supervisor started (the command's group only if `running`),
    /// by `kill_by` at the latest; feed `TreeStopped`.
    StopTree {
        running: bool,
        /// The command's pid, if it was started.
        child: Option<u32>,
        kill_by: Option<Instant>,
    },
    /// Store the command's checkpoint, racing the loss of the hold; feed `Committed`, or
    /// `Lost` if the hold ends first.
    CommitCheckpoint,
    /// Release the lock; feed `Released`.
    Release,
    /// The run is over.
    Conclude {
        outcome: Outcome,
        cut: Option<i32>,
    },
}

/// How the run ends, for the driver to word.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The command's status, the lock released.
    Status(u8),
    /// The checkpoint could not be read.
    PrepareFailed(Failure),
    /// The lease ran out before the command could start.
    LeaseGoneBeforeStart,
    /// The environment could not be passed.
    EnvFailed(String),
    /// The supervisor never started the command (the lease had run out when it got it).
    NeverStarted,
    /// The command could not be executed (errno).
    CannotRun(i32),
    /// The checkpoint was not stored.
    CheckpointFailed(Failure),
    /// The hold was lost while the checkpoint was being stored: the broker may have it or not.
    CheckpointUnknown { reason: LossReason },
    /// The lease ran out after the command ended, before the release.
    RanOut { reason: LossReason, status: u8 },
    /// The hold was lost while the command ran.
    Lost { reason: LossReason, status: u8 },
    /// The supervisor died or broke the protocol.
    SupervisorFailed { why: String, how: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Preparing,
    Running,
    Ending,
    Releasing,
    Done,
}

/// What an Ending hold waits for: only that answer moves it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Nothing,
    Reap,
    Tree,
    Commit,
    Loss,
}

/// What the end report decides.
#[derive(Debug)]
enum AfterEnd {
    /// The outcome is known whatever the report says.
    Fixed(Outcome),
    /// The command ended with `status`: released, or a lease that ran out.
    Decide { status: u8 },
}

/// The hold is over while the command may still run.
#[derive(Debug)]
struct Loss {
    reason: LossReason,
    /// The `lost` event is out: a loss is reported once, with the first lease end known.
    reported: bool,
    /// When to report it without the session's lease end, if the session has not by then.
    report_by: Option<Instant>,
}

#[derive(Debug)]
pub struct Hold {
    phase: Phase,
    kill_grace: Duration,
    checkpoint: bool,
    /// The last lease end sent to the supervisor.
    sent_lease: Option<Instant>,
    child: Option<u32>,
    end: Option<ChildExit>,
    spawn_errno: Option<i32>,
    lost: Option<Loss>,
    watching: bool,
    pending_signal: Option<i32>,
    /// The supervisor's last ERROR, then why it failed, for `SupervisorFailed`.
    sup_error: Option<String>,
    /// A command still running --kill-grace after a SIGTERM passed on to it is killed, as on a
    /// loss: kafka-lock asked to stop must not wait forever for a command that ignores it.
    kill_after_term: Option<Instant>,
    /// The answer an Ending hold waits for.
    wait: Wait,
    /// Waiting for `AwaitLoss`'s answer, then this.
    awaiting_loss: Option<AfterEnd>,
    /// The outcome once the release is done.
    releasing: Option<Outcome>,
    /// The latest lease end seen: a hold the session ended leaves only the grant's in
    /// `Seen::last_lease`, which a renewed hold has long passed.
    latest_lease: Option<Instant>,
}

impl Hold {
    pub fn new(kill_grace: Duration) -> Self {
        Hold {
            phase: Phase::Preparing,
            kill_grace,
            checkpoint: false,
            sent_lease: None,
            child: None,
            end: None,
            spawn_errno: None,
            lost: None,
            watching: true,
            pending_signal: None,
            sup_error: None,
            kill_after_term: None,
            wait: Wait::Nothing,
            awaiting_loss: None,
            releasing: None,
            latest_lease: None,
        }
    }

    /// The first action.
    pub fn start(&self) -> Vec<Action> {
        vec![Action::ReadCheckpoint]
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the driver should feed the guard's loss (`Lost`) and renewals (`LeaseMoved`).
    pub fn wants_loss(&self) -> bool {
        self.phase == Phase::Running && self.lost.is_none()
    }

    pub fn wants_lease(&self) -> bool {
        self.wants_loss() && self.watching
    }

    /// When to feed `Deadline` next.
    pub fn deadline(&self) -> Option<Instant> {
        if self.phase != Phase::Running {
            return None;
        }
        let report = self
            .lost
            .as_ref()
            .filter(|l| !l.reported)
            .and_then(|l| l.report_by);
        let kill = self.kill_after_term.filter(|_| self.end.is_none());
        match (report, kill) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn handle(&mut self, seen: Seen, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(l) = seen.lease_end {
            self.latest_lease = Some(self.latest_lease.map_or(l, |p| p.max(l)));
        }
        let wait = std::mem::replace(&mut self.wait, Wait::Nothing);
        match (self.phase, input) {
            (Phase::Preparing, Input::Prepared { checkpoint }) => {
                self.checkpoint = checkpoint;
                match seen.lease_end.filter(|end| *end > seen.now) {
                    // The environment first: the supervisor starts the command only on the LEASE
                    // after it.
                    Some(end) => {
                        self.sent_lease = Some(end);
                        out.push(Action::SendEnv);
                    }
                    // The lease ran out between the grant and now (a paused process, a slow
                    // checkpoint read): starting the command would run it without the lock.
                    None => self.end_then_release(
                        seen,
                        AfterEnd::Fixed(Outcome::LeaseGoneBeforeStart),
                        &mut out,
                    ),
                }
            }
            (Phase::Preparing, Input::LostWhilePreparing) => self.end_then_release(
                seen,
                AfterEnd::Fixed(Outcome::LeaseGoneBeforeStart),
                &mut out,
            ),
            (Phase::Preparing, Input::PrepareFailed(f)) => {
                self.end_then_release(seen, AfterEnd::Fixed(Outcome::PrepareFailed(f)), &mut out)
            }
            // Caught while preparing: passed on once the command runs.
            (Phase::Preparing, Input::Signal(sig)) => self.signal(seen, sig, &mut out),
            (Phase::Preparing, Input::EnvSent) => {
                if let Some(end) = self.sent_lease {
                    self.phase = Phase::Running;
                    out.push(Action::SendLease(end));
                }
            }
            (Phase::Preparing, Input::EnvFailed(why)) if self.sent_lease.is_some() => {
                self.end_then_release(seen, AfterEnd::Fixed(Outcome::EnvFailed(why)), &mut out)
            }
            (Phase::Running, input) => self.running(seen, input, &mut out),
            (Phase::Ending, Input::Reaped) if wait == Wait::Reap => self.after_reap(seen, &mut out),
            (Phase::Ending, Input::TreeStopped { child, how }) if wait == Wait::Tree => {
                if self.end.is_none() {
                    if let Some(exit) = child {
                        out.push(Action::ChildExited(exit));
                    }
                }
                let why = self.sup_error.take().unwrap_or_default();
                let outcome = Outcome::SupervisorFailed { why, how };
                // A loss is said once (at the supervisor's end); otherwise the end is said
                // before the release: the run's `failed` comes after the LeaveGroup's answer.
                match self.lost.as_ref().is_some_and(|l| l.reported) {
                    true => self.release(outcome, &mut out),
                    false => self.end_then_release(seen, AfterEnd::Fixed(outcome), &mut out),
                }
            }
            (Phase::Ending, Input::Committed(failed)) if wait == Wait::Commit => match failed {
                // Said before the release, `released` inside the lease and `lost` at its end
                // after it: the `failed` of the run comes only after the LeaveGroup's answer,
                // when the coordinator may have given the lock away.
                Some(f) => self.end_then_release(
                    seen,
                    AfterEnd::Fixed(Outcome::CheckpointFailed(f)),
                    &mut out,
                ),
                None => self.report_end_of_command(seen, &mut out),
            },
            // The lease ran out while the checkpoint was on its way (the driver races the commit
            // with the loss): the hold is over now, not when the commit's answer or its bound
            // comes, which may be seconds later; whether the broker stored it is unknown.
            (Phase::Ending, Input::Lost(reason)) if wait == Wait::Commit => {
                out.push(Action::ReportLost {
                    reason: reason.clone(),
                    lease_end: Some(self.lost_at(seen)),
                });
                self.release(Outcome::CheckpointUnknown { reason }, &mut out);
            }
            (Phase::Ending, Input::Lost(reason)) if wait == Wait::Loss => {
                if let Some(after) = self.awaiting_loss.take() {
                    out.push(Action::ReportLost {
                        reason: reason.clone(),
                        lease_end: Some(self.lost_at(seen)),
                    });
                    let outcome = match after {
                        AfterEnd::Fixed(o) => o,
                        AfterEnd::Decide { status } => Outcome::RanOut { reason, status },
                    };
                    self.release(outcome, &mut out);
                }
            }
            (Phase::Releasing, Input::Released(cut)) => {
                self.phase = Phase::Done;
                if let Some(outcome) = self.releasing.take() {
                    out.push(Action::Conclude { outcome, cut });
                }
            }
            // Everything else is stale: the phase it belonged to is over.
            _ => self.wait = wait,
        }
        out
    }

    fn running(&mut self, seen: Seen, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Supervisor(m) => self.on_supervisor(seen, m, out),
            Input::Gone { queued_loss } => self.gone(seen, queued_loss, out),
            Input::SupervisorExited { queued_loss } => {
                let why = self
                    .sup_error
                    .take()
                    .unwrap_or_else(|| "it exited unexpectedly".to_owned());
                self.supervisor_lost(seen, why, queued_loss, out)
            }
            Input::SupervisorBroken { why, queued_loss } => {
                out.push(Action::KillSupervisor);
                self.supervisor_lost(seen, why, queued_loss, out)
            }
            Input::Lost(reason) if self.lost.is_none() => {
                out.push(Action::Stop);
                self.lost = Some(Loss {
                    reason,
                    reported: false,
                    report_by: Some(seen.now + LOSS_REPORT_BOUND),
                });
            }
            Input::LeaseMoved if self.wants_lease() => {
                if let Some(new_end) = seen.lease_end {
                    if Some(new_end) != self.sent_lease {
                        self.sent_lease = Some(new_end);
                        out.push(Action::SendLease(new_end));
                    }
                }
            }
            Input::WatchClosed => self.watching = false,
            Input::LossReported { reason, lease_end } => {
                if self.lost.is_none() {
                    out.push(Action::Stop);
                }
                if self.loss(reason.clone()) {
                    out.push(Action::ReportLost {
                        reason,
                        lease_end: Some(lease_end),
                    });
                }
            }
            Input::TokenChanged(token) if self.lost.is_none() => {
                out.push(Action::ReportTokenChanged(token))
            }
            Input::Signal(sig) => self.signal(seen, sig, out),
            Input::Deadline => {
                if self
                    .lost
                    .as_ref()
                    .is_some_and(|l| !l.reported && l.report_by.is_some_and(|at| at <= seen.now))
                {
                    self.report_lost_fallback(seen, out);
                }
                if self.end.is_none() && self.kill_after_term.is_some_and(|at| at <= seen.now) {
                    self.kill_after_term = None;
                    match self.child {
                        Some(_) => out.push(Action::Signal(SIGKILL)),
                        None => self.pending_signal = Some(SIGKILL),
                    }
                }
            }
            _ => {}
        }
    }

    fn on_supervisor(&mut self, seen: Seen, m: FromSupervisor, out: &mut Vec<Action>) {
        match m {
            FromSupervisor::Pid(pid) => {
                self.child = Some(pid);
                out.push(Action::ChildStarted(pid));
                if let Some(sig) = self.pending_signal.take() {
                    out.push(Action::Signal(sig));
                }
            }
            FromSupervisor::Failed { errno } => self.spawn_errno = Some(errno),
            FromSupervisor::Expired { lease_end_ns } => {
                if self.loss(LossReason::LeaseExpired) {
                    out.push(Action::ReportExpired { lease_end_ns });
                }
            }
            FromSupervisor::Exit(exit) => {
                // The lease may have run out in the same instant the command ended: then it
                // ran without the lock at the end, and that must not pass as success.
                out.push(Action::TakeTerminal);
                let held = seen.lease_end.is_some_and(|end| seen.now < end);
                if self.lost.is_none() && !held && self.loss(LossReason::LeaseExpired) {
                    out.push(Action::ReportLost {
                        reason: LossReason::LeaseExpired,
                        lease_end: seen.lease_end.or(self.sent_lease).map(|l| l.min(seen.now)),
                    });
                }
                self.end = Some(exit);
                out.push(Action::ChildExited(exit));
            }
            FromSupervisor::Error(text) => {
                out.push(Action::SupervisorSays(text.clone()));
                self.sup_error = Some(text);
            }
            FromSupervisor::Gone => self.gone(seen, None, out),
        }
    }

    /// When a hold the guard reports lost ended: its last lease end, or now if that is still to
    /// come (fenced, reassigned), as the session says it (membership.rs `lose`).
    fn lost_at(&self, seen: Seen) -> Instant {
        let last = [seen.lease_end, self.latest_lease]
            .into_iter()
            .flatten()
            .fold(seen.last_lease, Instant::max);
        last.min(seen.now)
    }

    /// Records the loss (the first reason stays); whether it is still to be reported, which
    /// the caller then does.
    fn loss(&mut self, reason: LossReason) -> bool {
        let loss = self.lost.get_or_insert(Loss {
            reason,
            reported: false,
            report_by: None,
        });
        !std::mem::replace(&mut loss.reported, true)
    }

    /// Passed on to the command's group; the lock is released once it is gone.
    fn signal(&mut self, seen: Seen, sig: i32, out: &mut Vec<Action>) {
        match (self.child, self.end) {
            (Some(_), None) => out.push(Action::Signal(sig)),
            (None, None) => self.pending_signal = Some(sig),
            _ => {}
        }
        if sig == SIGTERM && self.end.is_none() && self.kill_after_term.is_none() {
            self.kill_after_term = Some(seen.now + self.kill_grace);
        }
    }

    /// A `lost` event without the session's lease end: the guard's last one, if it has run out.
    fn report_lost_fallback(&mut self, seen: Seen, out: &mut Vec<Action>) {
        let Some(loss) = self.lost.as_mut().filter(|l| !l.reported) else {
            return;
        };
        loss.reported = true;
        let reason = loss.reason.clone();
        let last = seen
            .lease_end
            .or(self.sent_lease)
            .unwrap_or(seen.last_lease);
        out.push(Action::ReportLost {
            reason,
            lease_end: (last <= seen.now).then_some(last),
        });
    }

    /// The supervisor's part is over: a loss not reported yet is, with the session's lease end
    /// if it had one queued.
    fn report_pending_loss(
        &mut self,
        seen: Seen,
        queued_loss: Option<Instant>,
        out: &mut Vec<Action>,
    ) {
        match (queued_loss, self.lost.as_mut().filter(|l| !l.reported)) {
            (_, None) => {}
            (Some(at), Some(loss)) => {
                loss.reported = true;
                out.push(Action::ReportLost {
                    reason: loss.reason.clone(),
                    lease_end: Some(at),
                });
            }
            (None, Some(_)) => self.report_lost_fallback(seen, out),
        }
    }

    fn gone(&mut self, seen: Seen, queued_loss: Option<Instant>, out: &mut Vec<Action>) {
        self.report_pending_loss(seen, queued_loss, out);
        self.phase = Phase::Ending;
        self.wait = Wait::Reap;
        out.push(Action::Reap);
    }

    fn supervisor_lost(
        &mut self,
        seen: Seen,
        why: String,
        queued_loss: Option<Instant>,
        out: &mut Vec<Action>,
    ) {
        self.report_pending_loss(seen, queued_loss, out);
        self.phase = Phase::Ending;
        // Kept for TreeStopped.
        self.sup_error = Some(why);
        // Everything the supervisor started is re-parented to us (a subreaper): stop it all the
        // way the supervisor would have, by the last lease end it was told plus the grace.
        self.wait = Wait::Tree;
        out.push(Action::StopTree {
            running: self.end.is_none(),
            child: self.child,
            kill_by: self
                .sent_lease
                .and_then(|at| at.checked_add(self.kill_grace)),
        });
    }

    fn after_reap(&mut self, seen: Seen, out: &mut Vec<Action>) {
        if let Some(errno) = self.spawn_errno {
            // A loss seen meanwhile was reported at GONE: a hold has at most one `lost`.
            if self.lost.is_some() {
                return self.release(Outcome::CannotRun(errno), out);
            }
            return self.end_then_release(seen, AfterEnd::Fixed(Outcome::CannotRun(errno)), out);
        }
        let Some(exit) = self.end else {
            return self.release(Outcome::NeverStarted, out);
        };
        let status = crate::run::child_end(exit).status;
        // A command that succeeded may leave a checkpoint; it is stored, fenced, before the
        // lock goes: the next holder must see it, and a holder no longer current must not write.
        // Not once the lease is over: that is a loss (RanOut), and the commit would be refused.
        let held = seen.lease_end.is_some_and(|end| seen.now < end);
        if self.lost.is_none() && status == 0 && self.checkpoint && held {
            self.wait = Wait::Commit;
            out.push(Action::CommitCheckpoint);
            return;
        }
        self.report_end_of_command(seen, out);
    }

    fn report_end_of_command(&mut self, seen: Seen, out: &mut Vec<Action>) {
        let status = self
            .end
            .map(|e| crate::run::child_end(e).status)
            .unwrap_or(0);
        match self.lost.as_ref().map(|l| l.reason.clone()) {
            Some(reason) => self.release(Outcome::Lost { reason, status }, out),
            // A lease that ran out after the command ended (kafka-lock stopped or starved in
            // between) is a loss: the hold cannot be claimed up to the release.
            None => self.end_then_release(seen, AfterEnd::Decide { status }, out),
        }
    }

    /// Says how the hold ends, once nothing runs under it: `released` at this instant if the
    /// lease still runs, else `lost` at its lease end (after the guard's loss); then releases.
    fn end_then_release(&mut self, seen: Seen, after: AfterEnd, out: &mut Vec<Action>) {
        self.phase = Phase::Ending;
        if seen.lease_end.is_some_and(|end| seen.now < end) {
            out.push(Action::ReportReleased {
                held_until: seen.now,
            });
            let outcome = match after {
                AfterEnd::Fixed(o) => o,
                AfterEnd::Decide { status } => Outcome::Status(status),
            };
            self.release(outcome, out);
        } else {
            self.awaiting_loss = Some(after);
            self.wait = Wait::Loss;
            out.push(Action::AwaitLoss);
        }
    }

    fn release(&mut self, outcome: Outcome, out: &mut Vec<Action>) {
        self.phase = Phase::Releasing;
        self.releasing = Some(outcome);
        out.push(Action::Release);
    }
}

#[cfg(test)]
#[path = "hold_tests.rs"]
mod tests;
