//! The few operating-system calls std does not offer: the raw CLOCK_MONOTONIC reading, signals to
//! a process group, the host name, and tying the child's life to ours.
//!
//! This is the only module of the binary allowed to use `unsafe`; every block is a plain libc
//! call on values we own.
#![allow(unsafe_code)]

use std::io;
use std::time::{Duration, Instant};

/// CLOCK_MONOTONIC in nanoseconds: the clock `Instant` uses on Linux, and one that every process
/// on the host shares, so event timestamps of two kafka-lock processes can be compared.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The CLOCK_MONOTONIC reading of `at`, an `Instant` in the past or the future.
pub fn mono_ns_of(at: Instant) -> u64 {
    let (now_ns, now) = (mono_ns(), Instant::now());
    match now.checked_duration_since(at) {
        Some(ago) => now_ns.saturating_sub(ago.as_nanos() as u64),
        None => now_ns.saturating_add(at.duration_since(now).as_nanos() as u64),
    }
}

/// Sends `signal` to every process in the process group `pgid`. A group that no longer exists is
/// not an error: the processes we meant to stop are gone.
pub fn kill_group(pgid: u32, signal: i32) -> io::Result<()> {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    if pgid <= 1 {
        // kill(-1) would signal every process we may signal, and -0 our own group.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill has no memory-safety preconditions.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// The host name, or "localhost" if the system will not say.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match String::from_utf8_lossy(&buf[..end]).trim() {
        "" => "localhost".to_owned(),
        name => name.to_owned(),
    }
}

/// Makes the kernel SIGKILL the child when kafka-lock dies, however it dies (even SIGKILL, or the
/// OOM killer): a command whose lock holder is gone must not keep running, because nobody renews
/// the lease for it any more.
///
/// Linux's PR_SET_PDEATHSIG fires when the thread that forked the child exits; kafka-lock forks from
/// its main thread (a current-thread runtime), which lives as long as the process.
#[cfg(target_os = "linux")]
pub fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions
    // (prctl, getppid, _exit); it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then no signal will ever come.
            if libc::getppid() != parent {
                libc::_exit(128 + libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Elsewhere the child outlives a killed kafka-lock; the lease and fencing token still hold.
#[cfg(not(target_os = "linux"))]
pub fn die_with_parent(_cmd: &mut tokio::process::Command) {}

/// The width of the terminal on stderr, if it is one and says.
pub fn terminal_width() -> Option<usize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which outlives the call.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// The signal's conventional name, for messages.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// Formats a duration for people: "5s", "1m 30s", "250ms".
pub fn human(d: Duration) -> String {
    // Whole milliseconds: humantime would otherwise print nanoseconds of timer noise.
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}
