//! Finding, signalling and reaping every process below this one.
//!
//! The supervisor (and `kafka-lock run` itself, should the supervisor die) is a child subreaper:
//! a process its descendants abandon is re-parented to it, not to init. So "everything the
//! command started" is exactly "every descendant of this process", which /proc lists, and it is
//! all gone exactly when waitpid says there are no children left (ECHILD): a grandchild always
//! has a living parent below us, or has been re-parented to us.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};

use crate::proto::ChildExit;
use crate::sys;

/// How often a stop looks again for processes that are still there: orphans that exit do not
/// wake the supervisor, so it polls while (and only while) it is stopping a tree.
pub const TICK: Duration = Duration::from_millis(10);

/// The fields of /proc/<pid>/stat this module needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub state: u8,
    pub ppid: u32,
    pub pgrp: u32,
}

/// Parses /proc/<pid>/stat. The command name in parentheses may hold anything, spaces and ')'
/// included, so the fields are read after the last ')'.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    if state.len() != 1 {
        return None;
    }
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Stat {
        state: state.as_bytes()[0],
        ppid,
        pgrp,
    })
}

fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process on the host as (pid, stat). Processes that end during the walk are skipped.
fn all_processes() -> Vec<(u32, Stat)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut procs = dir
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            let pid: u32 = name.to_str()?.parse().ok()?;
            Some((pid, read_stat(pid)?))
        })
        .collect();
    settle(&mut procs, read_stat);
    procs
}

/// Reads again each process of `procs` whose parent is not in it. /proc is read in pid order,
/// and once pids wrap around a child can come before its parent; if the parent ended and was
/// reaped before its turn (of the group's SIGTERM, sent just before a stop's walk), the child
/// names a parent the walk never saw, and it and all below it would be missed. Read again, it
/// names the subreaper it was re-parented to, which the walk did see (or is the walk's root).
/// Processes whose parent is outside this PID namespace show 0 and are left as read.
///
/// A process read again may be gone (its parent reaped it meanwhile), and then its children
/// name a parent the walk no longer has, as they would if the walk had missed it: they are
/// read again in turn. Each round drops at least one process, so this ends.
fn settle(procs: &mut Vec<(u32, Stat)>, read: impl Fn(u32) -> Option<Stat>) {
    let seen: HashSet<u32> = procs.iter().map(|(pid, _)| *pid).collect();
    let mut gone = read_again(procs, &read, |ppid| ppid != 0 && !seen.contains(&ppid));
    while !gone.is_empty() {
        gone = read_again(procs, &read, |ppid| gone.contains(&ppid));
    }
}

/// Reads again each process of `procs` whose parent is `stale`, dropping those that are gone;
/// returns the pids dropped.
fn read_again(
    procs: &mut Vec<(u32, Stat)>,
    read: impl Fn(u32) -> Option<Stat>,
    stale: impl Fn(u32) -> bool,
) -> HashSet<u32> {
    let mut gone = HashSet::new();
    procs.retain_mut(|(pid, stat)| {
        if !stale(stat.ppid) {
            return true;
        }
        let now = read(*pid);
        if let Some(now) = now {
            *stat = now;
        } else {
            gone.insert(*pid);
        }
        now.is_some()
    });
    gone
}

/// The descendants of `root` in `procs`, parents before their children.
pub fn descendants_in(root: u32, procs: &[(u32, Stat)]) -> Vec<(u32, Stat)> {
    let mut found: Vec<(u32, Stat)> = Vec::new();
    let mut frontier = vec![root];
    // A pid is a child of exactly one parent, so no process is found twice; the bound guards
    // against a /proc snapshot that is inconsistent (pids reused during the walk).
    while let Some(parent) = frontier.pop() {
        for (pid, stat) in procs {
            if stat.ppid == parent && *pid != root && found.len() < procs.len() {
                found.push((*pid, *stat));
                frontier.push(*pid);
            }
        }
    }
    found
}

/// Sends `signal` (and SIGCONT, see [`and_continue`]) to the process group `pgid` (if any) and
/// to every descendant of this process outside that group (processes that called setsid or
/// setpgid, or were re-parented to us).
pub fn signal_tree(pgid: Option<u32>, signal: Signal) {
    if let Some(g) = pgid {
        for s in and_continue(signal) {
            let _ = sys::kill_group(g, s);
        }
    }
    let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
    signal_found(me, pgid, &descendants_in(me, &all_processes()), signal);
}

/// Signals what a walk of /proc found below `me`, except the members of `pgid` (the group was
/// signalled as a whole). Apart from [`signal_tree`] so that a test can hand it a walk that the
/// tree has changed since, as it does while the signals go out.
fn signal_found(me: u32, pgid: Option<u32>, found: &[(u32, Stat)], signal: Signal) {
    let below: HashSet<u32> = found.iter().map(|(pid, _)| *pid).collect();
    for (pid, stat) in found {
        if Some(stat.pgrp) == pgid {
            continue;
        }
        signal_descendant(me, &below, *pid, stat.ppid, signal);
    }
}

/// Signals `pid`, which /proc showed as a child of `ppid`, without hitting an unrelated process
/// that took over the pid since. Our own children cannot be replaced: their pid stays theirs
/// until we reap them, which this thread is not doing now. Deeper ones are pinned with a pidfd
/// and checked again before the signal: still the child of a process the walk found `below`
/// us, or of ours by then.
fn signal_descendant(me: u32, below: &HashSet<u32>, pid: u32, ppid: u32, signal: Signal) {
    let Some(p) = sys::pid(pid) else { return };
    if ppid == me {
        for s in and_continue(signal) {
            let _ = rustix::process::kill_process(p, s);
        }
        return;
    }
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => {
            // Not only the walk's `ppid`: a parent that died since (to the group's SIGTERM,
            // say) left it to the nearest subreaper above it, which is us or a process of the
            // command's the walk found. Nothing leaves the tree of a subreaper, so a child of
            // ours or of one of those is below us; the pidfd names the process checked.
            if read_stat(pid).is_some_and(|s| s.ppid == me || below.contains(&s.ppid)) {
                for s in and_continue(signal) {
                    let _ = rustix::process::pidfd_send_signal(&fd, s);
                }
            }
        }
        // Kernels before 5.3: a plain kill, with the (tiny) pid-reuse race pidfds close.
        Err(Errno::NOSYS) => {
            for s in and_continue(signal) {
                let _ = rustix::process::kill_process(p, s);
            }
        }
        Err(_) => {}
    }
}

/// `signal`, then SIGCONT unless it is SIGKILL: a stopped process (^Z, or SIGTTIN for reading
/// the terminal from a background group) acts on nothing else until it is continued, and would
/// sit a SIGTERM out until the SIGKILL. SIGCONT comes second so the signal is already pending
/// when the process runs again.
fn and_continue(signal: Signal) -> impl Iterator<Item = Signal> {
    std::iter::once(signal).chain((signal != Signal::KILL).then_some(Signal::CONT))
}

/// How a reaped child ended.
pub fn exit_of(status: WaitStatus) -> Option<ChildExit> {
    if let Some(code) = status.exit_status() {
        Some(ChildExit::Code(code))
    } else {
        status.terminating_signal().map(ChildExit::Signal)
    }
}

/// Reaps every child that has ended, passing each to `on_exit`. Returns whether any child (living
/// or not yet reaped) remains.
pub fn reap(mut on_exit: impl FnMut(u32, Option<ChildExit>)) -> bool {
    loop {
        // wait(), i.e. waitpid(-1): rustix's waitpid(None) would be waitpid(0), our own group only.
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => on_exit(raw(pid), exit_of(status)),
            Ok(None) => return true,
            Err(Errno::INTR) => {}
            Err(Errno::CHILD) => return false,
            // Nothing else is documented for a valid call; assume children remain and look
            // again on the next tick rather than declare the tree gone.
            Err(_) => return true,
        }
    }
}

pub fn raw(pid: Pid) -> u32 {
    pid.as_raw_nonzero().get() as u32
}

/// The command's process group, for `kafka-lock run` to signal should the supervisor die: the
/// group's leader (the command) pinned by a pidfd taken while /proc showed it as a child of the
/// supervisor or of this process.
///
/// The group's id is the leader's pid, and a pid is not given to another process while its
/// process is unreaped. Once the supervisor dies, the command is this process's child, and only
/// this process reaps it; so while a wait for the pinned process (WNOWAIT: it stays unreaped)
/// succeeds, the id is still the command's group. If the supervisor reaped the command before it
/// died, the wait fails, and the group is not signalled as a whole: what is left of it is
/// reached one descendant at a time, never through an id another group may have taken since.
#[derive(Debug)]
pub struct PinnedGroup {
    pgid: u32,
    leader: OwnedFd,
}

impl PinnedGroup {
    /// Pins the process `pid` if it is now a child of one of `parents`.
    pub fn pin(pid: u32, parents: &[u32]) -> Option<PinnedGroup> {
        let leader =
            rustix::process::pidfd_open(sys::pid(pid)?, rustix::process::PidfdFlags::empty())
                .ok()?;
        // Checked after the pidfd exists: the process it refers to is the one /proc shows now.
        read_stat(pid).filter(|s| parents.contains(&s.ppid))?;
        Some(PinnedGroup { pgid: pid, leader })
    }

    /// The group's id while its leader is this process's unreaped child.
    pub fn group(&self) -> Option<u32> {
        use rustix::process::{WaitId, WaitIdOptions};
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        rustix::process::waitid(WaitId::PidFd(self.leader.as_fd()), options)
            .ok()
            .map(|_| self.pgid)
    }
}

/// Stops everything below this process, blocking: SIGTERM to the command's group (while it is
/// provably the command's, see [`PinnedGroup`]) and every other descendant, then SIGKILL to
/// whatever is left after `grace` (or at `kill_by`, if earlier), again and again until no child
/// remains. Used by `kafka-lock run` when its supervisor is gone. Counts on CLOCK_BOOTTIME, as
/// the supervisor does: `kill_by` is a CLOCK_BOOTTIME reading, and a host suspend while waiting
/// counts as time passed (a sleep on CLOCK_MONOTONIC would not see it, and the command would
/// outlive the lease by the suspend).
pub fn stop_everything(
    group: Option<PinnedGroup>,
    grace: Duration,
    kill_by: Option<u64>,
    mut on_exit: impl FnMut(u32, Option<ChildExit>),
) {
    // Asked again before each signal: this thread is the only reaper, so nothing can reap the
    // leader between the question and the signal.
    let pgid = || group.as_ref().and_then(PinnedGroup::group);
    let now = sys::boot_ns();
    let kill_at = kill_deadline(now, grace, kill_by);
    if kill_at > now {
        signal_tree(pgid(), Signal::TERM);
        loop {
            if !reap(&mut on_exit) {
                return;
            }
            let left = kill_at.saturating_sub(sys::boot_ns());
            if left == 0 {
                break;
            }
            // Never longer than a tick: a sleep does not count a suspend, the next look does.
            std::thread::sleep(Duration::from_nanos(left).min(TICK));
        }
    }
    loop {
        signal_tree(pgid(), Signal::KILL);
        if !reap(&mut on_exit) {
            return;
        }
        std::thread::sleep(TICK);
    }
}

/// When [`stop_everything`] sends SIGKILL: `grace` after `now`, but never after `kill_by`
/// (CLOCK_BOOTTIME ns, like `now`); at once if `kill_by` has passed.
fn kill_deadline(now: u64, grace: Duration, kill_by: Option<u64>) -> u64 {
    let after_grace = now.saturating_add(sys::nanos(grace));
    match kill_by {
        Some(by) => after_grace.min(by.max(now)),
        None => after_grace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// adversarial review: the fallback's SIGKILL deadline is a CLOCK_BOOTTIME reading, so a
    /// lease end moved to boottime (`sys::mono_to_boot`) is kept as is, and never pushed later
    /// by the grace. Before, `kill_by` was an `Instant` (CLOCK_MONOTONIC) and the wait slept on
    /// it: an hour of host suspend during the grace left the command running an hour past the
    /// lease the broker had already ended.
    #[test]
    fn adversarial_review_the_fallback_kills_by_the_boottime_lease_end() {
        let hour = 3_600_000_000_000u64;
        let grace = Duration::from_secs(2);
        // An hour of suspend so far; the lease (monotonic 10h + 1s) ends at boottime 11h + 1s.
        let (now_mono, now_boot) = (10 * hour, 11 * hour);
        let lease_end_boot = sys::mono_to_boot(now_mono + 1_000_000_000, now_mono, now_boot);
        assert_eq!(
            kill_deadline(now_boot, grace, Some(lease_end_boot)),
            lease_end_boot
        );
        // Woken after the lease end (the suspend came during the grace): SIGKILL at once.
        let woke = lease_end_boot + hour;
        assert_eq!(kill_deadline(woke, grace, Some(lease_end_boot)), woke);
        assert_eq!(
            kill_deadline(now_boot, grace, None),
            now_boot + 2_000_000_000
        );
    }

    fn stat(ppid: u32, pgrp: u32) -> Stat {
        Stat {
            state: b'S',
            ppid,
            pgrp,
        }
    }

    #[test]
    fn stat_fields_are_read_after_the_last_parenthesis() {
        let line = "4242 (sh) S 4000 4242 4242 34816 4242 4194560 117 0 0 0 0 0 0 0 20 0 1 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: b'S',
                ppid: 4000,
                pgrp: 4242
            })
        );
        // A name with spaces and parentheses, as `prctl(PR_SET_NAME)` allows.
        let tricky = "77 (a) b) 9 (c) Z 1 77 77 0 -1 0";
        assert_eq!(
            parse_stat(tricky),
            Some(Stat {
                state: b'Z',
                ppid: 1,
                pgrp: 77
            })
        );
    }

    #[test]
    fn malformed_stat_lines_are_refused() {
        for bad in [
            "",
            "12 sh S 1 1",
            "12 (sh)",
            "12 (sh) S",
            "12 (sh) S x 1",
            "12 (sh) S 1",
            "12 (sh) SS 1 1",
            "12 (sh) S -1 1",
            "12 (sh) S 99999999999 1",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn descendants_are_found_at_every_depth_and_nothing_else() {
        let procs = vec![
            (1, stat(0, 1)),
            (10, stat(1, 10)), // us
            (11, stat(10, 11)),
            (12, stat(11, 11)),
            (13, stat(12, 13)), // left the group
            (14, stat(10, 14)), // re-parented orphan
            (20, stat(1, 20)),  // unrelated
            (21, stat(20, 20)),
        ];
        let mut found: Vec<u32> = descendants_in(10, &procs).iter().map(|p| p.0).collect();
        found.sort();
        assert_eq!(found, [11, 12, 13, 14]);
        assert!(descendants_in(21, &procs).is_empty());
    }

    #[test]
    fn only_a_process_whose_parent_the_walk_did_not_see_is_read_again() {
        let mut procs = vec![
            (1, stat(0, 1)),  // its parent is outside the namespace
            (4, stat(9, 4)),  // parent gone; re-parented to 1 since
            (5, stat(8, 5)),  // parent gone, and itself gone since
            (6, stat(4, 4)),  // parent seen
            (10, stat(1, 1)), // parent seen
        ];
        settle(&mut procs, |pid| match pid {
            4 => Some(stat(1, 4)),
            5 => None,
            _ => panic!("{pid} read again"),
        });
        assert_eq!(
            procs,
            [
                (1, stat(0, 1)),
                (4, stat(1, 4)),
                (6, stat(4, 4)),
                (10, stat(1, 1))
            ]
        );
    }

    /// A process read again and found gone leaves its children naming a parent the walk no
    /// longer has: they are read again in turn (here the child of 7, whose own parent 9 the walk
    /// missed, and which ended before the re-read). Fails if only the processes whose parent
    /// the first reading missed are read again.
    #[test]
    fn the_children_of_a_process_gone_by_its_re_read_are_read_again() {
        let mut procs = vec![
            (1, stat(0, 1)),
            (3, stat(7, 3)), // read while 7 lived; re-parented to 1 since
            (5, stat(3, 3)), // its parent 3 is still there: not read again
            (7, stat(9, 7)), // parent 9 missed; 7 itself gone since
        ];
        settle(&mut procs, |pid| match pid {
            3 => Some(stat(1, 3)),
            7 => None,
            _ => panic!("{pid} read again"),
        });
        assert_eq!(procs, [(1, stat(0, 1)), (3, stat(1, 3)), (5, stat(3, 3))]);
        assert_eq!(descendants_in(1, &procs).len(), 2);
    }

    #[test]
    fn an_inconsistent_snapshot_cannot_loop_forever() {
        // A cycle cannot exist in a real process tree, but a snapshot taken while pids are
        // reused could show one.
        let procs = vec![(5, stat(6, 5)), (6, stat(5, 6))];
        assert!(descendants_in(5, &procs).len() <= procs.len());
        // A pid listed twice, once as its own parent: the walk finds it again and again, and
        // only the bound stops it, at one entry per line of the snapshot.
        let procs = vec![(2, stat(1, 2)), (2, stat(2, 2))];
        assert_eq!(descendants_in(1, &procs).len(), procs.len());
    }

    /// The pin answers with the group only while the leader is our unreaped child: after it is
    /// reaped its pid may belong to anyone. Fails if the group is taken on trust.
    #[test]
    fn a_pinned_group_is_given_up_once_its_leader_is_reaped() {
        use std::os::unix::process::CommandExt;
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("start sleep");
        let pid = child.id();
        assert!(
            PinnedGroup::pin(pid, &[me + 1_000_000]).is_none(),
            "not our child"
        );
        let pin = PinnedGroup::pin(pid, &[me]).expect("a child of ours");
        assert_eq!(pin.group(), Some(pid));
        child.kill().expect("kill sleep");
        // Exited but not reaped: still ours, still its group's id.
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_stat(pid).is_some_and(|s| s.state != b'Z') {
            assert!(Instant::now() < deadline, "sleep did not exit");
            std::thread::sleep(TICK);
        }
        assert_eq!(pin.group(), Some(pid));
        child.wait().expect("reap sleep");
        assert_eq!(pin.group(), None);
    }

    /// Set in the process [`alone`] starts.
    const ALONE: &str = "KAFKA_LOCK_TREE_TEST_ALONE";

    /// In the test harness: runs the test `name` again as the first process of a PID namespace
    /// of its own, with its own /proc (`unshare`, as root or in a user namespace), bounded, and
    /// fails if it failed; returns false. In that process: true.
    ///
    /// `reap` waits for any child and `signal_tree` signals every descendant /proc shows; in the
    /// harness that would include the processes of the tests running beside these, and a mutant
    /// that widens the walk (`descendants_in` keeping every process) would signal every process
    /// of the host. In the namespace /proc shows only what the test started, and when its first
    /// process ends (even killed at the bound) the kernel kills everything left in it.
    fn alone(name: &str) -> bool {
        use std::io::Read;
        use std::process::Stdio;
        if std::env::var_os(ALONE).is_some() {
            assert_eq!(std::process::id(), 1, "not alone in a PID namespace");
            return true;
        }
        let exe = std::env::current_exe().expect("this test");
        let mut child = std::process::Command::new("unshare")
            .args([
                "--map-root-user",
                "--pid",
                "--mount-proc",
                "--kill-child",
                "--",
            ])
            .arg(exe)
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run unshare (util-linux) to give the test a PID namespace of its own");
        let pid = child.id();
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut o, mut e) = (String::new(), String::new());
            let _ = out.read_to_string(&mut o);
            let _ = err.read_to_string(&mut e);
            let _ = tx.send((child.wait(), o, e));
        });
        // A stop takes well under a second; the longest grace below is 10 s.
        let bound = Duration::from_secs(20);
        let (status, out, err) = rx.recv_timeout(bound).unwrap_or_else(|_| {
            // Our unreaped child, so the pid is still unshare's; with --kill-child its death
            // kills the namespace's first process, and with it everything in the namespace.
            let _ = rustix::process::kill_process(sys::pid(pid).expect("a pid"), Signal::KILL);
            rx.recv_timeout(bound)
                .expect("the killed test process's output")
        });
        let status = status.expect("wait for unshare");
        assert!(
            status.success(),
            "{name} in a PID namespace of its own {status}:\n{out}\n{err}"
        );
        assert!(
            out.contains("1 passed"),
            "{name} did not run in the namespace:\n{out}\n{err}"
        );
        false
    }

    /// Starts `sh -c script` in its own process group, as the supervisor starts a command, and
    /// pins its group. The script prints the pids of what it starts, then `ready`; the shell's
    /// pid comes first in the list.
    fn start_command(script: &str) -> (PinnedGroup, Vec<u32>) {
        let pids = start_tree(script);
        assert_eq!(pids.len(), 4, "{pids:?}");
        let pin = PinnedGroup::pin(pids[0], &[std::process::id()]).expect("a child of ours");
        (pin, pids)
    }

    /// Starts `sh -c script` in its own process group and returns the shell's pid, then the
    /// pids the script prints before `ready`. The shell is left to the test to reap.
    fn start_tree(script: &str) -> Vec<u32> {
        start_tree_of(std::process::Command::new("sh"), script)
    }

    /// [`start_tree`] with the shell a child subreaper, as an init in the command (tini, or a
    /// nested `kafka-lock run`) is: what its descendants abandon goes to it, not to us.
    #[allow(unsafe_code)]
    fn start_subreaper_tree(script: &str) -> Vec<u32> {
        use std::os::unix::process::CommandExt;
        let mut sh = std::process::Command::new("sh");
        // SAFETY: the closure runs in the forked child before exec and makes one system call
        // (prctl), which allocates nothing and takes no lock. The flag outlives the exec.
        unsafe {
            sh.pre_exec(|| {
                rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
                    .map_err(Into::into)
            });
        }
        start_tree_of(sh, script)
    }

    fn start_tree_of(mut sh: std::process::Command, script: &str) -> Vec<u32> {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        use std::process::Stdio;
        let mut sh = sh
            .args(["-c", script])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sh");
        let mut pids = vec![sh.id()];
        let out = std::io::BufReader::new(sh.stdout.take().expect("piped"));
        for line in out.lines() {
            let line = line.expect("the script's output");
            if line == "ready" {
                break;
            }
            pids.push(line.parse().expect("a pid"));
        }
        // Reaped by the test (`stop_everything`, `waitpid`), not through std.
        drop(sh);
        pids
    }

    /// Waits until `done` holds, failing after `bound`.
    fn await_until(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + bound;
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
            std::thread::sleep(TICK);
        }
    }

    /// One process in the command's group, one that left it (setsid) and still has the shell as
    /// its parent, and one that left it and was orphaned (re-parented to this process, the
    /// namespace's init, as it would be to the subreaper the supervisor is).
    const LEAVES: &str = r#"sleep 60 & echo $!
setsid sleep 60 & echo $!
(setsid sleep 60 & echo $!)
echo ready; exec sleep 60"#;

    /// Stops the tree and checks that every process was reaped, each ended by `signal`; returns
    /// how long the stop took.
    fn stop_and_check(
        pin: PinnedGroup,
        pids: &[u32],
        grace: Duration,
        kill_by: Option<u64>,
        signal: Signal,
    ) -> Duration {
        let started = Instant::now();
        let mut exits = Vec::new();
        stop_everything(Some(pin), grace, kill_by, |pid, e| exits.push((pid, e)));
        let took = started.elapsed();
        for pid in pids {
            assert_eq!(
                exits.iter().find(|(p, _)| p == pid).map(|(_, e)| *e),
                Some(Some(ChildExit::Signal(signal.as_raw()))),
                "process {pid} (of {pids:?}): {exits:?}"
            );
            assert!(read_stat(*pid).is_none(), "process {pid} is still there");
        }
        took
    }

    /// SIGTERM reaches the command's group, a descendant that left it and an orphan: each ends
    /// by it, and the stop returns as soon as they are gone, not at the SIGKILL a grace later.
    #[test]
    fn a_stop_terms_the_group_and_every_descendant_outside_it() {
        if !alone("tree::tests::a_stop_terms_the_group_and_every_descendant_outside_it") {
            return;
        }
        let (pin, pids) = start_command(LEAVES);
        let grace = Duration::from_secs(10);
        let took = stop_and_check(pin, &pids, grace, None, Signal::TERM);
        assert!(took < grace, "the stop took {took:?}");
    }

    /// The race `signal_descendant`'s re-check meets, made certain: the walk saw a descendant
    /// outside the command's group as the child of a group member, and the group's SIGTERM
    /// killed that member before the descendant's turn came, re-parenting the descendant to us.
    /// It must get its SIGTERM now, not only the SIGKILL a grace later.
    #[test]
    fn a_descendant_orphaned_after_the_walk_still_gets_sigterm() {
        if !alone("tree::tests::a_descendant_orphaned_after_the_walk_still_gets_sigterm") {
            return;
        }
        let me = std::process::id();
        // The command (which becomes a sleep), a shell in its group, and the shell's child
        // that left the group.
        let pids = start_tree(
            "sh -c 'setsid sleep 60 & echo $$; echo $!; echo ready; wait' &\nexec sleep 60",
        );
        let [command, member, left] = pids[..] else {
            panic!("{pids:?}")
        };
        // `$!` is printed before the child's setsid, maybe.
        await_until("the child leaves the group", TICK * 1000, || {
            read_stat(left).is_some_and(|s| s.pgrp == left)
        });
        let walk = descendants_in(me, &all_processes());
        assert!(
            walk.iter().any(|(p, s)| *p == left && s.ppid == member),
            "{walk:?}"
        );
        sys::kill_group(command, Signal::TERM).expect("the group's SIGTERM");
        await_until(
            "the member's death re-parents its child to us",
            TICK * 1000,
            || read_stat(left).is_some_and(|s| s.ppid == me),
        );
        signal_found(me, Some(command), &walk, Signal::TERM);
        let left_pid = sys::pid(left).expect("a pid");
        let mut exit = None;
        await_until("the descendant ends", TICK * 1000, || {
            exit = rustix::process::waitpid(Some(left_pid), WaitOptions::NOHANG)
                .expect("our child")
                .map(|(_, status)| exit_of(status));
            exit.is_some()
        });
        assert_eq!(exit, Some(Some(ChildExit::Signal(Signal::TERM.as_raw()))));
        stop_everything(None, Duration::ZERO, None, |_, _| {});
    }

    /// The same race, where the member's child is orphaned not to us but to a subreaper of the
    /// command's (the shell here), which the walk found below us too. It must get its SIGTERM.
    #[test]
    fn a_descendant_orphaned_to_a_subreaper_below_us_after_the_walk_still_gets_sigterm() {
        if !alone("tree::tests::a_descendant_orphaned_to_a_subreaper_below_us_after_the_walk_still_gets_sigterm") {
            return;
        }
        let me = std::process::id();
        let pids = start_subreaper_tree(
            "sh -c 'setsid sleep 60 & echo $$; echo $!; echo ready; wait' &\nexec sleep 60",
        );
        let [reaper, member, left] = pids[..] else {
            panic!("{pids:?}")
        };
        // `$!` is printed before the child's setsid, maybe.
        await_until("the child leaves the group", TICK * 1000, || {
            read_stat(left).is_some_and(|s| s.pgrp == left)
        });
        let walk = descendants_in(me, &all_processes());
        assert!(
            walk.iter().any(|(p, s)| *p == left && s.ppid == member),
            "{walk:?}"
        );
        let member_pid = sys::pid(member).expect("a pid");
        rustix::process::kill_process(member_pid, Signal::KILL).expect("kill the member");
        await_until(
            "the member's death re-parents its child",
            TICK * 1000,
            || read_stat(left).is_some_and(|s| s.ppid == reaper),
        );
        signal_found(me, Some(reaper), &walk, Signal::TERM);
        // The subreaper (a sleep by now) never reaps it: its status stays in /proc.
        await_until("the descendant ends", TICK * 1000, || {
            read_stat(left).is_some_and(|s| s.state == b'Z')
        });
        let stat = std::fs::read_to_string(format!("/proc/{left}/stat")).expect("a zombie's stat");
        // The last field is the status waitpid would report: the signal that ended it.
        let status = stat.split_ascii_whitespace().last();
        assert_eq!(
            status,
            Some(Signal::TERM.as_raw().to_string().as_str()),
            "{stat}"
        );
        stop_everything(None, Duration::ZERO, None, |_, _| {});
    }

    /// The other side of that re-check: a process whose parent is neither us nor anything the
    /// walk found below us (what a pid the walk saw may belong to by the signal's turn) is left
    /// alone. Stopped, it keeps a signal pending where /proc shows it.
    #[test]
    fn a_process_whose_parent_the_walk_did_not_find_is_not_signalled() {
        if !alone("tree::tests::a_process_whose_parent_the_walk_did_not_find_is_not_signalled") {
            return;
        }
        let me = std::process::id();
        let pids = start_tree("sleep 60 & echo $!; echo ready; exec sleep 60");
        let [shell, other] = pids[..] else {
            panic!("{pids:?}")
        };
        let other_pid = sys::pid(other).expect("a pid");
        rustix::process::kill_process(other_pid, Signal::STOP).expect("stop it");
        await_until("it stops", TICK * 1000, || {
            read_stat(other).is_some_and(|s| s.state == b'T')
        });
        // Its parent is the shell, which this walk did not find.
        let walk = [(other, stat(u32::MAX, other))];
        signal_found(me, None, &walk, Signal::TERM);
        let status = std::fs::read_to_string(format!("/proc/{other}/status")).expect("status");
        let pending = status.lines().find(|l| l.starts_with("ShdPnd:"));
        assert_eq!(pending, Some("ShdPnd:\t0000000000000000"), "{status}");
        assert_eq!(read_stat(other).map(|s| s.state), Some(b'T'));
        // Found, and with its parent found, it is signalled: the check above is not vacuous.
        let walk = [(shell, stat(me, shell)), (other, stat(shell, shell))];
        signal_found(me, None, &walk, Signal::TERM);
        let status = std::fs::read_to_string(format!("/proc/{other}/status")).expect("status");
        assert!(
            status.contains("ShdPnd:\t0000000000004000") || !status.contains("State:\tT"),
            "{status}"
        );
        stop_everything(None, Duration::ZERO, None, |_, _| {});
    }

    /// /proc is read in pid order, and once pids wrap around a child can come before its
    /// parent: the walk may read the child, then find its parent gone (reaped after dying of
    /// the group's SIGTERM, say). Made certain here with a walk that lacks the parent. The child,
    /// re-parented to us, must be found and get its SIGTERM, not only the SIGKILL a grace later.
    #[test]
    fn a_descendant_whose_parent_ends_during_the_walk_is_found() {
        if !alone("tree::tests::a_descendant_whose_parent_ends_during_the_walk_is_found") {
            return;
        }
        let me = std::process::id();
        let pids =
            start_tree("sh -c 'setsid sleep 60 & echo $$; echo $!; echo ready; wait' &\nwait");
        let [_, member, left] = pids[..] else {
            panic!("{pids:?}")
        };
        await_until("the child leaves the group", TICK * 1000, || {
            read_stat(left).is_some_and(|s| s.pgrp == left)
        });
        let mut walk = all_processes();
        walk.retain(|(p, _)| *p != member);
        assert!(
            walk.iter().any(|(p, s)| *p == left && s.ppid == member),
            "{walk:?}"
        );
        let member_pid = sys::pid(member).expect("a pid");
        rustix::process::kill_process(member_pid, Signal::KILL).expect("kill the member");
        // The shell reaps it: gone from /proc, as the walk above pretends.
        await_until("the member is reaped", TICK * 1000, || {
            read_stat(member).is_none()
        });
        settle(&mut walk, read_stat);
        signal_found(me, None, &descendants_in(me, &walk), Signal::TERM);
        let left_pid = sys::pid(left).expect("a pid");
        let mut exit = None;
        await_until("the descendant ends", TICK * 1000, || {
            exit = rustix::process::waitpid(Some(left_pid), WaitOptions::NOHANG)
                .expect("our child")
                .map(|(_, status)| exit_of(status));
            exit.is_some()
        });
        assert_eq!(exit, Some(Some(ChildExit::Signal(Signal::TERM.as_raw()))));
        stop_everything(None, Duration::ZERO, None, |_, _| {});
    }

    /// The same one level down: the walk read a descendant that left the group as the child
    /// of a member, and that member as the child of one it missed (reaped before its turn);
    /// the member then ended too, and its own parent reaped it before the walk's re-read. The
    /// descendant, re-parented to us, must be found and get its SIGTERM.
    #[test]
    fn a_descendant_whose_parent_and_grandparent_end_during_the_walk_is_found() {
        if !alone(
            "tree::tests::a_descendant_whose_parent_and_grandparent_end_during_the_walk_is_found",
        ) {
            return;
        }
        let me = std::process::id();
        let pids = start_tree(
            "sh -c 'echo $$; sh -c \"setsid sleep 60 & echo \\$\\$; echo \\$!; echo ready; wait\" & wait' &\nwait",
        );
        let [_, grandparent, parent, left] = pids[..] else {
            panic!("{pids:?}")
        };
        await_until("the child leaves the group", TICK * 1000, || {
            read_stat(left).is_some_and(|s| s.pgrp == left)
        });
        let mut walk = all_processes();
        walk.retain(|(p, _)| *p != grandparent);
        assert!(
            walk.iter().any(|(p, s)| *p == left && s.ppid == parent)
                && walk
                    .iter()
                    .any(|(p, s)| *p == parent && s.ppid == grandparent),
            "{walk:?}"
        );
        let parent_pid = sys::pid(parent).expect("a pid");
        rustix::process::kill_process(parent_pid, Signal::KILL).expect("kill the parent");
        // The grandparent's `wait` reaps it: gone from /proc before the re-read.
        await_until("the parent is reaped", TICK * 1000, || {
            read_stat(parent).is_none()
        });
        settle(&mut walk, read_stat);
        signal_found(me, None, &descendants_in(me, &walk), Signal::TERM);
        let left_pid = sys::pid(left).expect("a pid");
        let mut exit = None;
        await_until("the descendant ends", TICK * 1000, || {
            exit = rustix::process::waitpid(Some(left_pid), WaitOptions::NOHANG)
                .expect("our child")
                .map(|(_, status)| exit_of(status));
            exit.is_some()
        });
        assert_eq!(exit, Some(Some(ChildExit::Signal(Signal::TERM.as_raw()))));
        stop_everything(None, Duration::ZERO, None, |_, _| {});
    }

    /// A stopped process acts on no signal but SIGKILL until it is continued: a command stopped
    /// by ^Z, or a descendant stopped for reading the terminal from outside its foreground group
    /// (SIGTTIN), must still end by the stop's SIGTERM, not sit it out until the SIGKILL.
    #[test]
    fn stopped_processes_end_by_sigterm() {
        if !alone("tree::tests::stopped_processes_end_by_sigterm") {
            return;
        }
        let (pin, pids) = start_command(LEAVES);
        for pid in &pids {
            let p = sys::pid(*pid).expect("a pid");
            rustix::process::kill_process(p, Signal::STOP).expect("stop it");
        }
        await_until("every process stops", TICK * 1000, || {
            pids.iter()
                .all(|p| read_stat(*p).is_some_and(|s| s.state == b'T'))
        });
        let grace = Duration::from_secs(10);
        let took = stop_and_check(pin, &pids, grace, None, Signal::TERM);
        assert!(took < grace, "the stop took {took:?}");
    }

    /// What ignores SIGTERM is SIGKILLed at `kill_by` when that comes before the grace is over,
    /// and not sooner.
    #[test]
    fn what_ignores_sigterm_is_killed_at_kill_by_and_not_sooner() {
        if !alone("tree::tests::what_ignores_sigterm_is_killed_at_kill_by_and_not_sooner") {
            return;
        }
        // SIG_IGN survives fork and exec: every process of the script ignores SIGTERM.
        let (pin, pids) = start_command(&format!("trap '' TERM\n{LEAVES}"));
        let (grace, by) = (Duration::from_secs(10), Duration::from_millis(500));
        let took = stop_and_check(
            pin,
            &pids,
            grace,
            Some(sys::boot_ns() + sys::nanos(by)),
            Signal::KILL,
        );
        assert!(took >= by && took < grace, "the stop took {took:?}");
    }

    /// A `kill_by` already past (the lease ended during the stop's wait for its turn): SIGKILL
    /// at once, no SIGTERM first, even for a command that would end on SIGTERM.
    #[test]
    fn a_kill_by_already_past_kills_at_once_without_a_sigterm() {
        if !alone("tree::tests::a_kill_by_already_past_kills_at_once_without_a_sigterm") {
            return;
        }
        let (pin, pids) = start_command(LEAVES);
        let grace = Duration::from_secs(10);
        let took = stop_and_check(pin, &pids, grace, Some(sys::boot_ns() - 1), Signal::KILL);
        assert!(took < grace, "the stop took {took:?}");
    }

    #[test]
    fn this_process_is_found_in_proc() {
        let me = std::process::id();
        let s = read_stat(me).expect("our own /proc stat");
        assert_eq!(s.ppid, std::os::unix::process::parent_id());
    }
}
