//! Scripted tests of the hold machine: a manual clock and a manual lease, the hard orders of
//! events fed by hand, and every order of them fed at random against the safety argument.

use proptest::prelude::*;

use super::*;

const GRACE: Duration = Duration::from_secs(2);
const LEASE: Duration = Duration::from_secs(8);
const TERM: i32 = 15;
const INT: i32 = 2;
const PID: u32 = 4242;

/// A machine, a manual clock and the lease as the driver would see it.
struct H {
    m: Hold,
    t0: Instant,
    now: Instant,
    lease: Option<Instant>,
    /// `LockGuard::lease_end` once the hold is over: the lease of the grant, whatever the
    /// renewals since (lock.rs, `a_guard_and_its_watch_read_the_hold_the_session_publishes`).
    last: Instant,
}

impl H {
    fn new() -> H {
        let t0 = Instant::now();
        let h = H {
            m: Hold::new(GRACE),
            t0,
            now: t0,
            lease: Some(t0 + LEASE),
            last: t0 + LEASE,
        };
        assert_eq!(h.m.start(), vec![Action::ReadCheckpoint]);
        h
    }

    fn seen(&self) -> Seen {
        Seen {
            now: self.now,
            lease_end: self.lease,
            last_lease: self.last,
        }
    }

    fn feed(&mut self, input: Input) -> Vec<Action> {
        let seen = self.seen();
        self.m.handle(seen, input)
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// The hold is over in the driver's view (a loss, or the lease end passed).
    fn lose(&mut self) {
        self.lease = None;
    }

    fn renew(&mut self, to: Instant) {
        self.lease = Some(to);
    }

    /// Prepared with the lease running: the environment, then the lease end.
    fn running(checkpoint: bool) -> H {
        let mut h = H::new();
        assert_eq!(
            h.feed(Input::Prepared { checkpoint }),
            vec![Action::SendEnv]
        );
        assert_eq!(
            h.feed(Input::EnvSent),
            vec![Action::SendLease(h.t0 + LEASE)]
        );
        h
    }

    /// The command runs.
    fn started(checkpoint: bool) -> H {
        let mut h = H::running(checkpoint);
        assert_eq!(
            h.feed(Input::Supervisor(FromSupervisor::Pid(PID))),
            vec![Action::ChildStarted(PID)]
        );
        h
    }

    /// The command exited 0 and its tree is reaped: the checkpoint is being stored.
    fn committing() -> H {
        let mut h = H::started(true);
        h.feed(exit(0));
        h.feed(Input::Gone { queued_loss: None });
        assert_eq!(h.feed(Input::Reaped), vec![Action::CommitCheckpoint]);
        h
    }

    /// Feeds the release's answer and returns the outcome.
    fn released(&mut self, cut: Option<i32>) -> Outcome {
        match self.feed(Input::Released(cut)).as_slice() {
            [Action::Conclude { outcome, cut: c }] if *c == cut => outcome.clone(),
            other => panic!("expected the conclusion, got {other:?}"),
        }
    }
}

fn exit(code: i32) -> Input {
    Input::Supervisor(FromSupervisor::Exit(ChildExit::Code(code)))
}

#[test]
fn a_command_that_ends_under_its_lease_is_released_and_passes_its_status_on() {
    let mut h = H::started(false);
    h.advance(Duration::from_secs(3));
    let later = h.now + LEASE;
    h.renew(later);
    assert_eq!(h.feed(Input::LeaseMoved), vec![Action::SendLease(later)]);
    // The same lease again (a token change) is not sent twice.
    assert_eq!(h.feed(Input::LeaseMoved), vec![]);
    assert_eq!(
        h.feed(exit(3)),
        vec![
            Action::TakeTerminal,
            Action::ChildExited(ChildExit::Code(3))
        ]
    );
    assert_eq!(
        h.feed(Input::Gone { queued_loss: None }),
        vec![Action::Reap]
    );
    assert_eq!(
        h.feed(Input::Reaped),
        vec![
            Action::ReportReleased { held_until: h.now },
            Action::Release
        ]
    );
    assert_eq!(h.released(None), Outcome::Status(3));
    assert_eq!(h.m.phase(), Phase::Done);
}

#[test]
fn no_renewal_after_a_loss_moves_the_supervisors_deadline() {
    let mut h = H::started(false);
    assert_eq!(
        h.feed(Input::LossReported {
            reason: LossReason::Reassigned,
            lease_end: h.t0 + LEASE
        }),
        vec![
            Action::Stop,
            Action::ReportLost {
                reason: LossReason::Reassigned,
                lease_end: Some(h.t0 + LEASE)
            }
        ]
    );
    // A watch that still shows a later lease (a renewal answered after the loss) changes nothing.
    h.renew(h.now + LEASE * 2);
    assert_eq!(h.feed(Input::LeaseMoved), vec![]);
    assert_eq!(h.feed(Input::Lost(LossReason::Reassigned)), vec![]);
}

#[test]
fn the_driver_waits_for_the_loss_and_renewals_only_while_they_can_change_something() {
    let mut h = H::new();
    // Preparing: the checkpoint read races the loss itself.
    assert!(!h.m.wants_loss() && !h.m.wants_lease());
    h.feed(Input::Prepared { checkpoint: false });
    h.feed(Input::EnvSent);
    assert!(h.m.wants_loss() && h.m.wants_lease());
    // A closed watch is not polled again (it would answer at once, forever).
    h.feed(Input::WatchClosed);
    assert!(h.m.wants_loss() && !h.m.wants_lease());
    // Nor is a loss already had: the guard's `lost` answers at once from then on.
    h.lose();
    h.feed(Input::Lost(LossReason::LeaseExpired));
    assert!(!h.m.wants_loss() && !h.m.wants_lease());

    let mut h = H::started(false);
    h.feed(Input::Gone { queued_loss: None });
    assert!(!h.m.wants_loss() && !h.m.wants_lease());
}

#[test]
fn a_signal_while_preparing_is_passed_on_once_the_command_runs() {
    let mut h = H::new();
    assert_eq!(h.feed(Input::Signal(INT)), vec![]);
    h.feed(Input::Prepared { checkpoint: false });
    h.feed(Input::EnvSent);
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Pid(PID))),
        vec![Action::ChildStarted(PID), Action::Signal(INT)]
    );
}

/// Every answer the driver can give to an action of the ending hold.
fn answers() -> Vec<Input> {
    vec![
        Input::Reaped,
        Input::TreeStopped {
            child: None,
            how: "x".into(),
        },
        Input::Committed(None),
        Input::Lost(LossReason::LeaseExpired),
        Input::Released(None),
        Input::EnvSent,
        Input::EnvFailed("x".into()),
    ]
}

#[test]
fn only_the_answer_waited_for_moves_the_hold_on() {
    // Before anything was asked of the supervisor.
    let mut h = H::new();
    for a in [Input::EnvSent, Input::EnvFailed("x".into()), Input::Reaped] {
        assert_eq!(h.feed(a), vec![]);
    }
    // Waiting for the supervisor's reaping, then the checkpoint's storing (which the loss also
    // ends: a_loss_while_the_checkpoint_is_stored_ends_the_hold_at_once).
    let mut h = H::started(true);
    h.feed(exit(0));
    h.feed(Input::Gone { queued_loss: None });
    let is = |i: &Input, want: &Input| std::mem::discriminant(i) == std::mem::discriminant(want);
    let loss = Input::Lost(LossReason::LeaseExpired);
    for want in [Input::Reaped, Input::Committed(None)] {
        let moves =
            |a: &Input| is(a, &want) || (is(&want, &Input::Committed(None)) && is(a, &loss));
        for other in answers().into_iter().filter(|a| !moves(a)) {
            assert_eq!(h.feed(other), vec![], "waiting for {want:?}");
        }
        assert!(!h.feed(want).is_empty());
    }
    // Released, waiting for the release.
    for other in answers()
        .into_iter()
        .filter(|a| !matches!(a, Input::Released(_)))
    {
        assert_eq!(h.feed(other), vec![]);
    }
    // Waiting for the tree to be stopped.
    let mut h = H::started(false);
    h.feed(Input::SupervisorExited { queued_loss: None });
    for other in answers()
        .into_iter()
        .filter(|a| !matches!(a, Input::TreeStopped { .. }))
    {
        assert_eq!(h.feed(other), vec![], "waiting for the tree");
    }
    // Waiting for the loss of a lease that ran out after the command ended.
    let mut h = H::started(false);
    h.feed(exit(0));
    h.lose();
    h.feed(Input::Gone { queued_loss: None });
    assert_eq!(h.feed(Input::Reaped), vec![Action::AwaitLoss]);
    for other in answers()
        .into_iter()
        .filter(|a| !matches!(a, Input::Lost(_)))
    {
        assert_eq!(h.feed(other), vec![], "waiting for the loss");
    }
}

#[test]
fn a_loss_during_the_checkpoint_read_never_starts_the_command() {
    let mut h = H::new();
    h.lose();
    // The guard's loss won the race with the read.
    assert_eq!(h.feed(Input::LostWhilePreparing), vec![Action::AwaitLoss]);
    let reason = LossReason::Fenced(kafka_lock::KafkaCode::UNKNOWN_MEMBER_ID);
    // Fenced at once: the hold ended now, not at the lease end of the grant, 8 s away (the
    // session says the same: membership.rs `lose`).
    assert_eq!(
        h.feed(Input::Lost(reason.clone())),
        vec![
            Action::ReportLost {
                reason,
                lease_end: Some(h.now)
            },
            Action::Release
        ]
    );
    // Nothing that arrives now starts anything.
    assert_eq!(h.feed(Input::Prepared { checkpoint: false }), vec![]);
    assert_eq!(h.feed(Input::EnvSent), vec![]);
    assert_eq!(h.released(None), Outcome::LeaseGoneBeforeStart);
}

#[test]
fn a_lease_that_ran_out_during_the_checkpoint_read_never_starts_the_command() {
    let mut h = H::new();
    // A read that took the whole lease: the lease end is still the one known, but past.
    h.advance(LEASE);
    assert_eq!(
        h.feed(Input::Prepared { checkpoint: true }),
        vec![Action::AwaitLoss]
    );
    h.lose();
    let out = h.feed(Input::Lost(LossReason::LeaseExpired));
    assert_eq!(out.last(), Some(&Action::Release));
    assert!(!out
        .iter()
        .any(|a| matches!(a, Action::SendEnv | Action::SendLease(_))));
    assert_eq!(h.released(None), Outcome::LeaseGoneBeforeStart);
}

#[test]
fn a_checkpoint_that_cannot_be_read_is_reported_after_the_release() {
    let mut h = H::new();
    let f = Failure::new(69, "cannot read");
    assert_eq!(
        h.feed(Input::PrepareFailed(f)),
        vec![
            Action::ReportReleased { held_until: h.now },
            Action::Release
        ]
    );
    assert_eq!(
        h.released(None),
        Outcome::PrepareFailed(Failure::new(69, "cannot read"))
    );
}

#[test]
fn an_environment_that_cannot_be_passed_sends_no_lease() {
    let mut h = H::new();
    assert_eq!(
        h.feed(Input::Prepared { checkpoint: false }),
        vec![Action::SendEnv]
    );
    assert_eq!(
        h.feed(Input::EnvFailed("full".into())),
        vec![
            Action::ReportReleased { held_until: h.now },
            Action::Release
        ]
    );
    assert_eq!(h.released(None), Outcome::EnvFailed("full".into()));
}

#[test]
fn sigterm_twice_during_the_stop_kills_after_one_grace_from_the_first() {
    let mut h = H::started(false);
    assert_eq!(h.m.deadline(), None);
    assert_eq!(h.feed(Input::Signal(TERM)), vec![Action::Signal(TERM)]);
    let kill_at = h.now + GRACE;
    assert_eq!(h.m.deadline(), Some(kill_at));
    h.advance(GRACE / 2);
    // Passed on again, but the second one does not push the kill back.
    assert_eq!(h.feed(Input::Signal(TERM)), vec![Action::Signal(TERM)]);
    assert_eq!(h.m.deadline(), Some(kill_at));
    // A wake-up before the deadline kills nothing.
    assert_eq!(h.feed(Input::Deadline), vec![]);
    h.advance(GRACE / 2);
    assert_eq!(h.feed(Input::Deadline), vec![Action::Signal(9)]);
    assert_eq!(h.m.deadline(), None);
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Exit(ChildExit::Signal(
            9
        )))),
        vec![
            Action::TakeTerminal,
            Action::ChildExited(ChildExit::Signal(9))
        ]
    );
    assert_eq!(h.feed(Input::Signal(TERM)), vec![]);
    assert_eq!(h.m.deadline(), None);
}

#[test]
fn a_signal_before_the_command_started_is_passed_on_once_it_has() {
    let mut h = H::running(false);
    assert_eq!(h.feed(Input::Signal(INT)), vec![]);
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Pid(PID))),
        vec![Action::ChildStarted(PID), Action::Signal(INT)]
    );
}

#[test]
fn a_sigterm_before_the_command_started_turns_into_a_kill_after_the_grace() {
    let mut h = H::running(false);
    assert_eq!(h.feed(Input::Signal(TERM)), vec![]);
    h.advance(GRACE);
    assert_eq!(h.feed(Input::Deadline), vec![]);
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Pid(PID))),
        vec![Action::ChildStarted(PID), Action::Signal(9)]
    );
}

#[test]
fn supervisor_death_stops_the_whole_tree_before_the_release() {
    let mut h = H::started(false);
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Error("boom".into()))),
        vec![Action::SupervisorSays("boom".into())]
    );
    let out = h.feed(Input::SupervisorExited { queued_loss: None });
    assert_eq!(
        out,
        vec![Action::StopTree {
            running: true,
            child: Some(PID),
            kill_by: Some(h.t0 + LEASE + GRACE)
        }]
    );
    // The lease runs out: nothing is released until the tree is gone.
    h.advance(LEASE);
    h.lose();
    assert_eq!(h.feed(Input::Lost(LossReason::LeaseExpired)), vec![]);
    assert_eq!(h.feed(Input::Deadline), vec![]);
    // The tree gone past the lease end: the hold ended there, said before the release (the
    // run's `failed` comes after the LeaveGroup's answer). Break: `Release` alone.
    assert_eq!(
        h.feed(Input::TreeStopped {
            child: Some(ChildExit::Signal(15)),
            how: "status 1".into()
        }),
        vec![
            Action::ChildExited(ChildExit::Signal(15)),
            Action::AwaitLoss
        ]
    );
    assert_eq!(
        h.feed(Input::Lost(LossReason::LeaseExpired)),
        vec![
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(h.last)
            },
            Action::Release
        ]
    );
    assert_eq!(
        h.released(None),
        Outcome::SupervisorFailed {
            why: "boom".into(),
            how: "status 1".into()
        }
    );
}

/// A supervisor dead inside the lease, its tree stopped: `released` before the release, as any
/// other end. Break: `Release` alone (the hold ends in the events only at the run's `failed`,
/// after the LeaveGroup's answer, when the next holder may hold).
#[test]
fn a_dead_supervisors_hold_is_released_before_the_release() {
    let mut h = H::started(false);
    h.feed(Input::SupervisorExited { queued_loss: None });
    assert_eq!(
        h.feed(Input::TreeStopped {
            child: None,
            how: "signal 9".into()
        }),
        vec![
            Action::ReportReleased { held_until: h.now },
            Action::Release
        ]
    );
}

#[test]
fn a_supervisor_breaking_the_protocol_is_killed_and_a_pending_loss_reported_first() {
    let mut h = H::started(false);
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::Reassigned)),
        vec![Action::Stop]
    );
    let out = h.feed(Input::SupervisorBroken {
        why: "it sent garbage".into(),
        queued_loss: Some(h.t0 + LEASE),
    });
    assert_eq!(
        out,
        vec![
            Action::KillSupervisor,
            Action::ReportLost {
                reason: LossReason::Reassigned,
                lease_end: Some(h.t0 + LEASE)
            },
            Action::StopTree {
                running: true,
                child: Some(PID),
                kill_by: Some(h.t0 + LEASE + GRACE)
            }
        ]
    );
}

#[test]
fn a_command_exit_racing_a_loss_is_a_loss_not_a_success() {
    // The lease ran out in the same instant the command ended 0, before the loss was fed.
    let mut h = H::started(true);
    h.advance(LEASE);
    h.lose();
    assert_eq!(
        h.feed(exit(0)),
        vec![
            Action::TakeTerminal,
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(h.t0 + LEASE)
            },
            Action::ChildExited(ChildExit::Code(0))
        ]
    );
    // The loss the guard then sees is the same one, reported once.
    assert_eq!(h.feed(Input::Lost(LossReason::LeaseExpired)), vec![]);
    assert_eq!(
        h.feed(Input::LossReported {
            reason: LossReason::LeaseExpired,
            lease_end: h.t0 + LEASE
        }),
        vec![]
    );
    assert_eq!(
        h.feed(Input::Gone { queued_loss: None }),
        vec![Action::Reap]
    );
    // No checkpoint is stored and nothing is claimed as released.
    assert_eq!(h.feed(Input::Reaped), vec![Action::Release]);
    assert_eq!(
        h.released(None),
        Outcome::Lost {
            reason: LossReason::LeaseExpired,
            status: 0
        }
    );
}

#[test]
fn a_loss_before_the_exit_stops_the_command_and_is_reported_at_gone() {
    let mut h = H::started(false);
    h.advance(Duration::from_secs(1));
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::Reassigned)),
        vec![Action::Stop]
    );
    assert_eq!(h.m.deadline(), Some(h.now + LOSS_REPORT_BOUND));
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Exit(ChildExit::Signal(
            15
        )))),
        vec![
            Action::TakeTerminal,
            Action::ChildExited(ChildExit::Signal(15))
        ]
    );
    // The session never said when the lease ended: the last one sent, not yet over, is not
    // claimed as the end.
    assert_eq!(
        h.feed(Input::Gone { queued_loss: None }),
        vec![
            Action::ReportLost {
                reason: LossReason::Reassigned,
                lease_end: None
            },
            Action::Reap
        ]
    );
    assert_eq!(h.feed(Input::Reaped), vec![Action::Release]);
    assert_eq!(
        h.released(None),
        Outcome::Lost {
            reason: LossReason::Reassigned,
            status: 143
        }
    );
}

#[test]
fn a_loss_the_session_does_not_report_in_time_is_reported_by_the_bound() {
    let mut h = H::started(false);
    h.advance(LEASE);
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::LeaseExpired)),
        vec![Action::Stop]
    );
    h.advance(LOSS_REPORT_BOUND);
    assert_eq!(
        h.feed(Input::Deadline),
        vec![Action::ReportLost {
            reason: LossReason::LeaseExpired,
            lease_end: Some(h.t0 + LEASE)
        }]
    );
    assert_eq!(h.m.deadline(), None);
}

#[test]
fn the_lease_end_reached_while_releasing_changes_nothing() {
    let mut h = H::started(true);
    assert_eq!(
        h.feed(exit(0)),
        vec![
            Action::TakeTerminal,
            Action::ChildExited(ChildExit::Code(0))
        ]
    );
    assert_eq!(
        h.feed(Input::Gone { queued_loss: None }),
        vec![Action::Reap]
    );
    assert_eq!(h.feed(Input::Reaped), vec![Action::CommitCheckpoint]);
    assert_eq!(
        h.feed(Input::Committed(None)),
        vec![
            Action::ReportReleased { held_until: h.now },
            Action::Release
        ]
    );
    // The LeaveGroup is slow; the lease runs out meanwhile. The hold was claimed only up to the
    // instant the end was reported, inside the lease.
    h.advance(LEASE);
    h.lose();
    assert_eq!(h.feed(Input::Deadline), vec![]);
    assert_eq!(h.feed(Input::Lost(LossReason::LeaseExpired)), vec![]);
    assert_eq!(h.feed(Input::LeaseMoved), vec![]);
    assert_eq!(h.released(Some(INT)), Outcome::Status(0));
}

#[test]
fn a_lease_that_ran_out_after_the_command_ended_is_a_loss() {
    let mut h = H::started(false);
    assert_eq!(
        h.feed(exit(0)),
        vec![
            Action::TakeTerminal,
            Action::ChildExited(ChildExit::Code(0))
        ]
    );
    // kafka-lock was stopped between the exit and GONE.
    h.advance(LEASE);
    h.lose();
    assert_eq!(
        h.feed(Input::Gone { queued_loss: None }),
        vec![Action::Reap]
    );
    assert_eq!(h.feed(Input::Reaped), vec![Action::AwaitLoss]);
    assert_eq!(
        h.feed(Input::Lost(LossReason::LeaseExpired)),
        vec![
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(h.last)
            },
            Action::Release
        ]
    );
    assert_eq!(
        h.released(None),
        Outcome::RanOut {
            reason: LossReason::LeaseExpired,
            status: 0
        }
    );
}

/// The refusal inside the lease: the hold ends with `released` before the LeaveGroup goes out,
/// since its answer lets the coordinator give the lock away, and the `failed` that ends the run
/// comes after that answer (and the RELEASED record), when the next holder may already hold.
/// Break: `Release` alone (the hold then ends in the events only at `failed`).
#[test]
fn a_checkpoint_not_stored_fails_the_run_after_the_release() {
    let mut h = H::committing();
    assert_eq!(
        h.feed(Input::Committed(Some(Failure::new(74, "stale")))),
        vec![
            Action::ReportReleased { held_until: h.now },
            Action::Release
        ]
    );
    assert_eq!(
        h.released(None),
        Outcome::CheckpointFailed(Failure::new(74, "stale"))
    );
}

/// A holder whose checkpoint commit waits in a cut: the commit's answer (or its bound, past the
/// broker's offsets.commit.timeout.ms) may come seconds after the lease end, and the hold must
/// not be claimed that long. Break: `Lost` ignored while the commit is awaited (the hold then
/// ends only at `Committed`, past its lease).
#[test]
fn a_loss_while_the_checkpoint_is_stored_ends_the_hold_at_once() {
    let mut h = H::committing();
    h.advance(LEASE);
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::LeaseExpired)),
        vec![
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(h.last)
            },
            Action::Release
        ]
    );
    assert_eq!(
        h.released(None),
        Outcome::CheckpointUnknown {
            reason: LossReason::LeaseExpired
        }
    );
}

/// A renewed hold whose session sees its lease out while the checkpoint is stored: the guard's
/// `lost` then answers from the session's end, and `LockGuard::lease_end` falls back to the
/// lease of the grant; the hold ended at the last lease end it was renewed to. Break: the
/// guard's lease end taken (`lost` at the grant's lease end, before the command even exited).
#[test]
fn a_renewed_hold_lost_while_its_checkpoint_is_stored_ends_at_its_last_lease() {
    let mut h = H::started(true);
    h.advance(Duration::from_secs(3));
    let renewed = h.now + LEASE;
    h.renew(renewed);
    assert_eq!(h.feed(Input::LeaseMoved), vec![Action::SendLease(renewed)]);
    h.advance(Duration::from_secs(6));
    h.feed(exit(0));
    h.feed(Input::Gone { queued_loss: None });
    assert_eq!(h.feed(Input::Reaped), vec![Action::CommitCheckpoint]);
    h.advance(LEASE);
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::LeaseExpired)),
        vec![
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(renewed)
            },
            Action::Release
        ]
    );
}

/// Fenced while the checkpoint is stored, the lease still running: the hold ended at the
/// fence. Break: the lease end of the grant taken as is (`lost` says a hold up to an instant
/// still to come, which the coordinator may have given to someone else already).
#[test]
fn a_fenced_hold_lost_while_its_checkpoint_is_stored_is_not_claimed_past_the_loss() {
    let mut h = H::committing();
    h.advance(Duration::from_secs(1));
    h.lose();
    let reason = LossReason::Fenced(kafka_lock::KafkaCode::UNKNOWN_MEMBER_ID);
    assert_eq!(
        h.feed(Input::Lost(reason.clone())),
        vec![
            Action::ReportLost {
                reason: reason.clone(),
                lease_end: Some(h.now)
            },
            Action::Release
        ]
    );
    assert_eq!(h.released(None), Outcome::CheckpointUnknown { reason });
}

/// The command's exit read before the session's loss (the supervisor's news comes first), the
/// hold reassigned with its lease still running: `lost` says now, not the lease end sent to the
/// supervisor. Break: that lease end taken as is (a hold claimed past its loss).
#[test]
fn an_exit_read_after_a_loss_before_the_lease_end_is_lost_now() {
    let mut h = H::started(false);
    h.advance(Duration::from_secs(2));
    h.lose();
    assert_eq!(
        h.feed(exit(0)),
        vec![
            Action::TakeTerminal,
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(h.now)
            },
            Action::ChildExited(ChildExit::Code(0))
        ]
    );
}

/// A lease over by the time the tree is reaped: no commit is tried (the library would refuse
/// it), the hold is lost at its lease end. Break: the lease not checked before the commit (a
/// commit is asked for, and its race with the loss calls the checkpoint's fate unknown).
#[test]
fn no_checkpoint_is_stored_once_the_lease_is_over() {
    let mut h = H::started(true);
    h.feed(exit(0));
    h.feed(Input::Gone { queued_loss: None });
    // At its end instant, still shown by the watch, the lease is over (a `<=` instead of `<`).
    h.advance(LEASE);
    assert_eq!(h.feed(Input::Reaped), vec![Action::AwaitLoss]);
    h.lose();
    h.feed(Input::Lost(LossReason::LeaseExpired));
    assert_eq!(
        h.released(None),
        Outcome::RanOut {
            reason: LossReason::LeaseExpired,
            status: 0
        }
    );
}

/// The commit refused after the lease end: the hold ended at the lease end, and `lost` says so
/// before the run fails. Break: `CheckpointFailed` released at once whatever the lease (the
/// hold then ends at `failed`, past its lease).
#[test]
fn a_checkpoint_refused_after_the_lease_end_reports_the_loss_first() {
    let mut h = H::committing();
    // At its end instant, still shown by the watch, the lease is over (a `<=` instead of `<`).
    h.advance(LEASE);
    assert_eq!(
        h.feed(Input::Committed(Some(Failure::new(74, "stale")))),
        vec![Action::AwaitLoss]
    );
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::LeaseExpired)),
        vec![
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(h.last)
            },
            Action::Release
        ]
    );
    assert_eq!(
        h.released(None),
        Outcome::CheckpointFailed(Failure::new(74, "stale"))
    );
}

#[test]
fn a_command_that_cannot_be_executed_releases_without_running() {
    let mut h = H::running(false);
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Failed { errno: 2 })),
        vec![]
    );
    h.feed(Input::Gone { queued_loss: None });
    assert_eq!(
        h.feed(Input::Reaped),
        vec![
            Action::ReportReleased { held_until: h.now },
            Action::Release
        ]
    );
    assert_eq!(h.released(None), Outcome::CannotRun(2));
}

#[test]
fn a_lease_the_supervisor_found_over_never_starts_the_command() {
    let mut h = H::running(false);
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Expired {
            lease_end_ns: 7
        })),
        vec![Action::ReportExpired { lease_end_ns: 7 }]
    );
    h.feed(Input::Gone { queued_loss: None });
    assert_eq!(h.feed(Input::Reaped), vec![Action::Release]);
    assert_eq!(h.released(None), Outcome::NeverStarted);
}

/// adversarial review: the session's own `lost` event can be the first news of a loss (the guard
/// not polled yet); it alone must stop the command and carry the session's lease end.
#[test]
fn a_loss_the_session_reports_first_stops_the_command_with_its_lease_end() {
    let mut h = H::started(false);
    h.advance(Duration::from_secs(1));
    h.lose();
    assert_eq!(
        h.feed(Input::LossReported {
            reason: LossReason::Reassigned,
            lease_end: h.t0 + LEASE
        }),
        vec![
            Action::Stop,
            Action::ReportLost {
                reason: LossReason::Reassigned,
                lease_end: Some(h.t0 + LEASE)
            }
        ]
    );
    // The guard's view of the same loss changes nothing and waits for no bound.
    assert_eq!(h.feed(Input::Lost(LossReason::Reassigned)), vec![]);
    assert_eq!(h.m.deadline(), None);
    h.feed(Input::Supervisor(FromSupervisor::Exit(ChildExit::Signal(
        15,
    ))));
    assert_eq!(
        h.feed(Input::Gone { queued_loss: None }),
        vec![Action::Reap]
    );
    assert_eq!(h.feed(Input::Reaped), vec![Action::Release]);
    assert_eq!(
        h.released(None),
        Outcome::Lost {
            reason: LossReason::Reassigned,
            status: 143
        }
    );
}

/// adversarial review: the driver polls the guard's loss and the watch only while the machine
/// wants them. A loss already known must switch both off, or the resolved loss is fed again at
/// once, forever (a busy loop until GONE), and a renewal after the loss would reach the
/// supervisor as a new LEASE.
#[test]
fn once_the_hold_is_lost_neither_the_loss_nor_renewals_are_asked_for() {
    let h = H::new();
    assert!(!h.m.wants_loss() && !h.m.wants_lease(), "preparing");
    let mut h = H::started(false);
    assert!(h.m.wants_loss() && h.m.wants_lease());
    assert_eq!(
        h.feed(Input::Lost(LossReason::LeaseExpired)),
        vec![Action::Stop]
    );
    assert!(!h.m.wants_loss(), "the loss is asked for again");
    assert!(!h.m.wants_lease(), "renewals are asked for after the loss");
    // A renewal the session still applied after the guard's timer saw the lease out.
    let later = h.now + LEASE * 2;
    h.renew(later);
    assert_eq!(h.feed(Input::LeaseMoved), vec![]);
}

/// adversarial review: a watch that can no longer change resolves at once every time; the
/// machine must stop asking for it or the driver spins.
#[test]
fn a_closed_watch_is_not_asked_for_again() {
    let mut h = H::started(false);
    assert_eq!(h.feed(Input::WatchClosed), vec![]);
    assert!(!h.m.wants_lease(), "a closed watch is asked for again");
    assert!(h.m.wants_loss(), "the loss is still wanted");
}

/// adversarial review: a new token is reported while the hold lasts, never after its loss.
#[test]
fn token_changes_are_reported_while_held_and_not_after_a_loss() {
    let mut h = H::started(false);
    let token = FencingToken::new(Some(7), 3, "m");
    assert_eq!(
        h.feed(Input::TokenChanged(token.clone())),
        vec![Action::ReportTokenChanged(token.clone())]
    );
    h.feed(Input::Lost(LossReason::Reassigned));
    assert_eq!(h.feed(Input::TokenChanged(token)), vec![]);
}

/// adversarial review: the kill after a SIGTERM's grace shares the deadline with the loss
/// report; the kill's wake-up must not use up the report of a loss that comes after it.
#[test]
fn a_kill_after_the_grace_does_not_swallow_a_later_loss_report() {
    let mut h = H::started(false);
    assert_eq!(h.feed(Input::Signal(TERM)), vec![Action::Signal(TERM)]);
    h.advance(GRACE);
    assert_eq!(h.feed(Input::Deadline), vec![Action::Signal(9)]);
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::Reassigned)),
        vec![Action::Stop]
    );
    assert_eq!(h.m.deadline(), Some(h.now + LOSS_REPORT_BOUND));
    h.advance(LOSS_REPORT_BOUND);
    assert_eq!(
        h.feed(Input::Deadline),
        vec![Action::ReportLost {
            reason: LossReason::Reassigned,
            lease_end: None
        }]
    );
}

/// adversarial review: a loss the session reported before the bound is not reported again by
/// the wake-up for the kill after a SIGTERM.
#[test]
fn a_loss_reported_in_time_is_not_reported_again_at_the_kill() {
    let mut h = H::started(false);
    h.feed(Input::Signal(TERM));
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::Reassigned)),
        vec![Action::Stop]
    );
    assert_eq!(
        h.feed(Input::LossReported {
            reason: LossReason::Reassigned,
            lease_end: h.t0 + LEASE
        }),
        vec![Action::ReportLost {
            reason: LossReason::Reassigned,
            lease_end: Some(h.t0 + LEASE)
        }]
    );
    assert_eq!(h.m.deadline(), Some(h.now + GRACE));
    h.advance(GRACE);
    assert_eq!(h.feed(Input::Deadline), vec![Action::Signal(9)]);
}

/// The kill after a SIGTERM's grace may fall due before the bound on a loss seen just before
/// it: that wake-up kills and leaves the loss to the session until the bound, so that the
/// `lost` event carries the lease end the session computed.
#[test]
fn a_kill_due_before_the_loss_bound_leaves_the_loss_to_the_session() {
    let mut h = H::started(false);
    assert_eq!(h.feed(Input::Signal(TERM)), vec![Action::Signal(TERM)]);
    let kill_at = h.now + GRACE;
    h.advance(GRACE - LOSS_REPORT_BOUND / 2);
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::Reassigned)),
        vec![Action::Stop]
    );
    assert_eq!(h.m.deadline(), Some(kill_at));
    h.advance(LOSS_REPORT_BOUND / 2);
    assert_eq!(h.feed(Input::Deadline), vec![Action::Signal(9)]);
    assert_eq!(h.m.deadline(), Some(h.now + LOSS_REPORT_BOUND / 2));
    assert_eq!(
        h.feed(Input::LossReported {
            reason: LossReason::Reassigned,
            lease_end: h.t0 + LEASE
        }),
        vec![Action::ReportLost {
            reason: LossReason::Reassigned,
            lease_end: Some(h.t0 + LEASE)
        }]
    );
    assert_eq!(h.m.deadline(), None);
}

/// adversarial review: the lease is held strictly before its end; a command that ends at the
/// very instant the lease ends ran without it for that instant.
#[test]
fn a_command_ending_at_the_instant_its_lease_ends_is_a_loss() {
    let mut h = H::started(false);
    h.advance(LEASE);
    // The driver still sees the lease end it knew: the session has not ended the hold yet.
    assert_eq!(h.seen().lease_end, Some(h.now));
    assert_eq!(
        h.feed(exit(0)),
        vec![
            Action::TakeTerminal,
            Action::ReportLost {
                reason: LossReason::LeaseExpired,
                lease_end: Some(h.now)
            },
            Action::ChildExited(ChildExit::Code(0))
        ]
    );
}

/// adversarial review: docs/events.md promises at most one `lost` per hold. A loss seen while
/// the supervisor's exec of the command failed is reported at GONE; the end of a command that
/// never ran must not report it a second time. (Before: after the reap the machine asked for the
/// loss again and reported it again, as `run` did before the machine.)
#[test]
fn a_command_that_could_not_run_under_a_lost_hold_reports_the_loss_once() {
    let mut h = H::running(false);
    h.advance(Duration::from_secs(1));
    h.lose();
    assert_eq!(
        h.feed(Input::Lost(LossReason::Reassigned)),
        vec![Action::Stop]
    );
    assert_eq!(
        h.feed(Input::Supervisor(FromSupervisor::Failed { errno: 2 })),
        vec![]
    );
    let mut reports = 0;
    let mut count = |out: &[Action]| {
        reports += out
            .iter()
            .filter(|a| matches!(a, Action::ReportLost { .. } | Action::ReportReleased { .. }))
            .count();
    };
    let out = h.feed(Input::Gone {
        queued_loss: Some(h.t0 + LEASE),
    });
    count(&out);
    assert_eq!(out.last(), Some(&Action::Reap));
    let mut out = h.feed(Input::Reaped);
    count(&out);
    if out == vec![Action::AwaitLoss] {
        out = h.feed(Input::Lost(LossReason::Reassigned));
        count(&out);
    }
    assert_eq!(out.last(), Some(&Action::Release));
    assert_eq!(
        reports, 1,
        "the end of the hold is reported {reports} times"
    );
    assert_eq!(h.released(None), Outcome::CannotRun(2));
}

/// Anything the driver can feed, in any order.
fn input() -> impl Strategy<Value = (u8, u64)> {
    (0u8..26, 0u64..4_000)
}

fn pick(h: &mut H, k: u8, ms: u64) -> Input {
    match k {
        0 => Input::Prepared {
            checkpoint: ms.is_multiple_of(2),
        },
        1 => Input::PrepareFailed(Failure::new(69, "x")),
        2 => Input::LostWhilePreparing,
        3 => Input::EnvSent,
        4 => Input::EnvFailed("x".into()),
        5 => {
            h.renew(h.now + Duration::from_millis(ms));
            Input::LeaseMoved
        }
        6 => Input::WatchClosed,
        7 => {
            h.lose();
            Input::Lost(LossReason::LeaseExpired)
        }
        // The session's lease end of a loss is never after the loss (membership.rs `lose`).
        8 => Input::LossReported {
            reason: LossReason::Reassigned,
            lease_end: h.last.min(h.now),
        },
        9 => Input::Supervisor(FromSupervisor::Pid(PID)),
        10 => Input::Supervisor(FromSupervisor::Failed { errno: 2 }),
        11 => Input::Supervisor(FromSupervisor::Expired { lease_end_ns: 1 }),
        12 => exit((ms % 3) as i32),
        13 => Input::Supervisor(FromSupervisor::Error("e".into())),
        14 => Input::Gone { queued_loss: None },
        15 => Input::SupervisorExited { queued_loss: None },
        16 => Input::Signal(if ms.is_multiple_of(2) { TERM } else { INT }),
        17 => {
            h.advance(Duration::from_millis(ms));
            Input::Deadline
        }
        18 => Input::Reaped,
        19 => Input::TreeStopped {
            child: None,
            how: "x".into(),
        },
        20 => Input::Committed(None),
        21 => Input::Committed(Some(Failure::new(74, "x"))),
        22 => Input::TokenChanged(FencingToken::new(Some(7), 3, "m")),
        23 => Input::SupervisorBroken {
            why: "x".into(),
            queued_loss: None,
        },
        24 => Input::Released(Some(INT)),
        _ => Input::Released(None),
    }
}

/// What the properties hold the machine to, fed one input at a time.
#[derive(Default)]
struct Judge {
    /// The supervisor may start the command from the first LEASE until GONE (it has reaped
    /// everything) or the driver's StopTree has (TreeStopped).
    may_run: bool,
    stopped: bool,
    released_at: Option<Instant>,
    released: bool,
    concluded: bool,
    /// docs/events.md: at most one `lost`, and `released` not after a loss.
    ends: u32,
    /// Whether `released` or `lost` was said before the release went out.
    said_before_release: bool,
}

impl Judge {
    fn feed(&mut self, h: &mut H, k: u8, ms: u64) -> Result<(), TestCaseError> {
        let input = pick(h, k, ms);
        let gone = matches!(input, Input::Gone { .. } | Input::TreeStopped { .. });
        // Nothing runs and the driver waits on the broker or the guard alone: the guard's
        // loss, which comes at the lease end, is the hold's end then, not a later answer.
        let waited = h.m.wait;
        let must_end = matches!(input, Input::Lost(_))
            && h.m.phase() == Phase::Ending
            && matches!(waited, Wait::Commit | Wait::Loss);
        let seen = h.seen();
        let out = h.m.handle(seen, input);
        if gone {
            self.may_run = false;
        }
        for a in out {
            prop_assert!(!self.concluded, "{a:?} after the conclusion");
            match a {
                Action::SendLease(_) | Action::SendEnv => {
                    prop_assert!(!self.released, "{a:?} after the release");
                    if a == Action::SendEnv {
                        prop_assert!(
                            seen.lease_end.is_some_and(|end| seen.now < end),
                            "the environment sent without a running lease"
                        );
                    }
                    // A lease sent after the loss would move the supervisor's stop back.
                    prop_assert!(self.ends == 0 && !self.stopped, "{a:?} after the loss");
                    if matches!(a, Action::SendLease(_)) {
                        self.may_run = true;
                    }
                }
                Action::Stop => self.stopped = true,
                Action::Release => {
                    prop_assert!(!self.may_run, "released while the command may run");
                    prop_assert!(!self.released, "released twice");
                    self.released = true;
                    self.said_before_release = self.ends == 1;
                }
                Action::ReportLost { lease_end, .. } => {
                    self.ends += 1;
                    prop_assert!(
                        self.ends == 1,
                        "the end of the hold reported {} times",
                        self.ends
                    );
                    // A `lost` says when the hold ended, which is not after the instant it is
                    // said: a later one claims the hold past the loss.
                    prop_assert!(
                        lease_end.is_none_or(|l| l <= seen.now),
                        "lost at {:?} after now",
                        lease_end.map(|l| l - seen.now)
                    );
                }
                Action::ReportExpired { .. } => {
                    self.ends += 1;
                    prop_assert!(
                        self.ends == 1,
                        "the end of the hold reported {} times",
                        self.ends
                    );
                }
                Action::ReportReleased { held_until } => {
                    self.ends += 1;
                    prop_assert!(
                        self.ends == 1,
                        "the end of the hold reported {} times",
                        self.ends
                    );
                    prop_assert!(seen.lease_end.is_some_and(|end| held_until < end));
                    self.released_at = Some(held_until);
                }
                Action::Conclude { outcome, .. } => {
                    prop_assert!(self.released);
                    // The LeaveGroup's answer lets the coordinator give the lock away, and the
                    // `failed` of the conclusion comes after it: the hold's end is said before
                    // the release goes out. Not for a command never started: the supervisor's
                    // EXPIRED says it, an input a script may leave out.
                    if outcome != Outcome::NeverStarted {
                        prop_assert!(
                            self.said_before_release,
                            "{outcome:?}: released without `released` or `lost` first"
                        );
                    }
                    if let Outcome::Status(_) = outcome {
                        prop_assert!(self.released_at.is_some(), "a success without `released`");
                    }
                    self.concluded = true;
                }
                _ => {}
            }
        }
        prop_assert!(
            !must_end || self.ends == 1,
            "the guard's loss while waiting for {waited:?} left the hold's end unsaid"
        );
        Ok(())
    }
}

/// Where the ending scripts start: the command ran and exited 0 or 1 (`k` picks), the tree is
/// gone or the supervisor died, the lease may have run out; random scripts from the grant reach
/// these states too seldom to judge the ending hold (the checkpoint's commit above all).
fn ended(k: u8) -> (H, Judge) {
    let mut h = H::started(k.is_multiple_of(2));
    let mut j = Judge {
        may_run: true,
        ..Judge::default()
    };
    h.feed(exit(i32::from(k % 3 == 2)));
    if k % 5 == 4 {
        h.advance(LEASE);
        h.lose();
    }
    let gone = match k % 7 {
        6 => Input::SupervisorExited { queued_loss: None },
        _ => Input::Gone { queued_loss: None },
    };
    h.feed(gone);
    j.may_run = false;
    (h, j)
}

proptest! {
    // Cheap: a case is a few dozen calls, and most scripts die in Preparing.
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn nothing_is_released_while_the_command_may_run_and_success_needs_a_running_lease(
        script in proptest::collection::vec(input(), 0..60)
    ) {
        let mut h = H::new();
        let mut j = Judge::default();
        for (k, ms) in script {
            j.feed(&mut h, k, ms)?;
        }
    }

    /// The same, from a command that has ended: the reaping, the checkpoint's commit, the
    /// loss and the release in any order.
    #[test]
    fn an_ending_hold_reports_its_end_once_and_before_the_release(
        start in 0u8..210,
        script in proptest::collection::vec(input(), 0..20)
    ) {
        let (mut h, mut j) = ended(start);
        for (k, ms) in script {
            j.feed(&mut h, k, ms)?;
        }
    }
}
