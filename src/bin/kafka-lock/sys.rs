//! The operating-system calls std does not offer, through rustix (raw Linux system calls, no C
//! library bindings): the CLOCK_MONOTONIC reading, signals, the child-subreaper flag, the dumpable
//! flag, the host name, the terminal width and its foreground process group. The one exception,
//! and the one `unsafe`, is blocking SIGTTOU for a moment (pthread_sigmask, which rustix does not
//! offer).

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// CLOCK_MONOTONIC in nanoseconds: the clock `Instant` uses on Linux, and one that every process
/// on the host shares, so kafka-lock and its supervisor agree on a lease end, and event
/// timestamps of two kafka-lock processes can be compared.
pub fn mono_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// CLOCK_BOOTTIME in nanoseconds: CLOCK_MONOTONIC plus the time the host spent suspended. The
/// broker's clock runs on while this host sleeps, so the supervisor counts a lease down on this
/// clock: a lease that ran out during a suspend has run out when the host wakes.
pub fn boot_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// A CLOCK_MONOTONIC reading `mono` as a CLOCK_BOOTTIME one, given both clocks read now: the
/// two differ by the suspend time so far, which is the same for a moment in the future.
pub fn mono_to_boot(mono: u64, now_mono: u64, now_boot: u64) -> u64 {
    now_boot
        .saturating_add(mono.saturating_sub(now_mono))
        .saturating_sub(now_mono.saturating_sub(mono))
}

/// The CLOCK_MONOTONIC reading of `at`, an `Instant` in the past or the future.
pub fn mono_ns_of(at: Instant) -> u64 {
    let (now_ns, now) = (mono_ns(), Instant::now());
    match now.checked_duration_since(at) {
        Some(ago) => now_ns.saturating_sub(nanos(ago)),
        None => now_ns.saturating_add(nanos(at.duration_since(now))),
    }
}

/// A duration in whole nanoseconds, saturating (u64 nanoseconds cover 584 years).
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A process id from a number read off the wire or /proc; 0 and values beyond pid_t are not one.
pub fn pid(n: u32) -> Option<Pid> {
    i32::try_from(n).ok().and_then(Pid::from_raw)
}

/// Sends `signal` to every process in the process group `pgid`. A group that no longer exists is
/// not an error: the processes we meant to reach are gone.
pub fn kill_group(pgid: u32, signal: Signal) -> io::Result<()> {
    // Group 1 would be init's; kill(-1) or kill(0) are never what is meant.
    let Some(pgid) = pid(pgid).filter(|p| !p.is_init()) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    match rustix::process::kill_process_group(pgid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Makes this process the reaper of its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER):
/// whatever the command starts and abandons is re-parented here instead of to init, so it can
/// still be found, signalled and waited for.
pub fn become_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(Into::into)
}

/// Whether /proc shows this process's own PID namespace. kafka-lock and its supervisor find the
/// command's descendants by walking /proc and signal the pids it lists: in a PID namespace
/// without a /proc of its own (`unshare --pid` without `--mount-proc`) those pids are the
/// mount's namespace's, and name other processes here, or none.
pub fn check_proc() -> io::Result<()> {
    let me = std::process::id();
    let seen = std::fs::read_link("/proc/self")?;
    if seen.to_str().and_then(|s| s.parse::<u32>().ok()) == Some(me) {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "/proc/self is {} but this process is {me}: the /proc mounted here belongs to another \
         PID namespace, so the command's processes cannot be found in it (mount this \
         namespace's own, as `unshare --pid --mount-proc` does)",
        seen.display()
    )))
}

/// Marks this process non-dumpable (PR_SET_DUMPABLE 0): it writes no core dump, and other
/// processes of the same user (the command among them) can neither ptrace it nor read its
/// /proc files that reveal memory: environ, mem, maps. kafka-lock holds the broker's password;
/// the command runs as the same user. The flag is reset by execve, so the supervisor sets it
/// again for itself, and the command, started by execve, is dumpable as usual.
pub fn forbid_dumping() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(Into::into)
}

/// The host name, or "localhost" if the system will not say.
pub fn hostname() -> String {
    let uname = rustix::system::uname();
    match String::from_utf8_lossy(uname.nodename().to_bytes()).trim() {
        "" => "localhost".to_owned(),
        name => name.to_owned(),
    }
}

/// The width of the terminal on stderr, if it is one and says.
pub fn terminal_width() -> Option<usize> {
    let ws = rustix::termios::tcgetwinsize(io::stderr().as_fd()).ok()?;
    (ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// The signal's conventional name, for messages.
pub fn signal_name(signal: i32) -> String {
    let name = match Signal::from_named_raw(signal) {
        Some(Signal::HUP) => "SIGHUP",
        Some(Signal::INT) => "SIGINT",
        Some(Signal::QUIT) => "SIGQUIT",
        Some(Signal::ILL) => "SIGILL",
        Some(Signal::ABORT) => "SIGABRT",
        Some(Signal::BUS) => "SIGBUS",
        Some(Signal::FPE) => "SIGFPE",
        Some(Signal::KILL) => "SIGKILL",
        Some(Signal::USR1) => "SIGUSR1",
        Some(Signal::SEGV) => "SIGSEGV",
        Some(Signal::USR2) => "SIGUSR2",
        Some(Signal::PIPE) => "SIGPIPE",
        Some(Signal::ALARM) => "SIGALRM",
        Some(Signal::TERM) => "SIGTERM",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// Formats a duration for people: "5s", "1m 30s", "250ms".
pub fn human(d: Duration) -> String {
    // Whole milliseconds: humantime would otherwise print nanoseconds of timer noise.
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// Makes the process group `pgid` (the command's) the foreground group of the terminal on stdin,
/// as a shell does for the job it runs, and wakes it in case it already stopped on reading the
/// terminal (SIGTTIN) before it got it. Only when kafka-lock itself is in the terminal's
/// foreground; returns whether it handed the terminal over.
pub fn give_terminal(pgid: u32) -> bool {
    let stdin = io::stdin();
    let Ok(fg) = rustix::termios::tcgetpgrp(stdin.as_fd()) else {
        return false; // not a terminal, or not ours
    };
    if fg != rustix::process::getpgrp() {
        return false; // started in the background (`&`): the terminal is not ours to give
    }
    let Some(group) = pid(pgid) else {
        return false;
    };
    if without_sigttou(|| rustix::termios::tcsetpgrp(stdin.as_fd(), group)).is_err() {
        return false;
    }
    let _ = kill_group(pgid, Signal::CONT);
    true
}

/// Makes kafka-lock's own process group the terminal's foreground group again, after
/// [`give_terminal`]. kafka-lock is then a background process, which may change the foreground
/// group only with SIGTTOU blocked (otherwise the terminal would stop it).
pub fn take_terminal() {
    let stdin = io::stdin();
    let _ =
        without_sigttou(|| rustix::termios::tcsetpgrp(stdin.as_fd(), rustix::process::getpgrp()));
}

/// Sets whether this process ignores SIGTTOU. `kafka-lock run` ignores it while its command has
/// the terminal: kafka-lock is then a background process of that terminal, and with `stty
/// tostop` its next line of output (an event, a warning) would stop it, so it would renew
/// nothing and the lock would be lost under a command doing fine. With SIGTTOU ignored the
/// write goes through. Ignored signals stay ignored across execve, so this is set only after
/// the supervisor is started and put back when the terminal is taken back.
#[allow(unsafe_code)]
pub fn ignore_sigttou(ignore: bool) {
    let action = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: SIG_IGN and SIG_DFL install no handler, so no code of ours runs in signal context;
    // only this process's disposition of SIGTTOU changes.
    unsafe {
        libc::signal(libc::SIGTTOU, action);
    }
}

/// Runs `f` with SIGTTOU blocked on this thread only (so nothing another thread starts inherits
/// the mask), then restores the mask.
#[allow(unsafe_code)]
fn without_sigttou<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: plain calls on sigset_t values that live on this stack and are initialised by
    // sigemptyset before use; pthread_sigmask only changes this thread's mask, restored below.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        let out = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_reading_of_an_instant_matches_the_clock() {
        let now = Instant::now();
        let a = mono_ns();
        let b = mono_ns_of(now);
        let c = mono_ns();
        assert!(b <= c && a.abs_diff(b) < 1_000_000_000, "{a} {b} {c}");
        let later = mono_ns_of(now + Duration::from_secs(5));
        assert!(later.abs_diff(b + 5_000_000_000) < 1_000_000, "{b} {later}");
    }

    #[test]
    fn a_monotonic_reading_moves_to_boottime_by_the_suspend_so_far() {
        // An hour of suspend so far: boottime is an hour ahead.
        let hour = 3_600_000_000_000;
        let (now_mono, now_boot) = (10 * hour, 11 * hour);
        assert_eq!(mono_to_boot(now_mono + 5, now_mono, now_boot), now_boot + 5);
        assert_eq!(mono_to_boot(now_mono - 5, now_mono, now_boot), now_boot - 5);
        assert_eq!(mono_to_boot(0, now_mono, now_boot), hour);
        assert_eq!(mono_to_boot(u64::MAX, now_mono, now_boot), u64::MAX);
        // The clocks themselves: boottime is never behind monotonic.
        let (m, b) = (mono_ns(), boot_ns());
        assert!(b + 1_000_000 >= m, "{m} {b}");
    }

    #[test]
    fn group_zero_one_and_out_of_range_are_refused() {
        for bad in [0, 1, u32::MAX] {
            assert!(kill_group(bad, Signal::CONT).is_err(), "{bad}");
        }
    }
}
