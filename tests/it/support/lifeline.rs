//! Processes that cannot outlive the test process: every broker, JVM and helper a test starts
//! runs under [`Supervised`].
//!
//! Rust never drops statics, and `PR_SET_PDEATHSIG` fires when the spawning *thread* exits
//! (libtest runs each test on its own thread), so neither can stop a shared broker. Instead the
//! program runs under a small `sh` wrapper whose stdin (the *lifeline*) is a pipe held by this
//! process: the kernel closes the pipe however this process ends (normal exit, panic, abort,
//! SIGKILL), the wrapper reads EOF and SIGKILLs the program. Lines written to the lifeline are
//! passed on to the program's stdin, so one pipe carries both the commands and the end of life.
//!
//! The wrapper waits for the program and exits with its status, so a program that dies on its
//! own is visible to [`Supervised::exited`]. It can also remove a directory once the program is
//! gone: that is how a broker's scratch directory goes with the test process even when the
//! broker's handle, a static, is never dropped (see `kafka::scratch`).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `$0` is a label; `$1` the file for the program's stdout and stderr ("" leaves stdout to the
/// caller); `$2` a directory to remove once the program is gone (""); the rest is the program
/// and its arguments.
///
/// - The program is exec'd by an inner `sh` that first prints its own pid, which the program
///   keeps: that line is the first on the wrapper's stdout, before anything the program prints.
/// - Its stdin is a FIFO (a background job's stdin would otherwise be /dev/null); the watcher
///   copies lifeline lines into it and, at EOF, kills the program. The FIFO's name is removed
///   as soon as both ends are open.
/// - The program does not inherit the lifeline (fd 3): it must not keep the pipe's read end.
/// - SIGPIPE is ignored in the watcher only, so a program that closed its stdin cannot kill the
///   watcher, while the program itself keeps the default disposition.
const WRAPPER: &str = r#"exec 3<&0
log=$1
cleanup=$2
shift 2
fifo_dir=$(mktemp -d) || exit 70
mkfifo "$fifo_dir/stdin" || exit 70
sh -c 'echo "lifeline-pid=$$"; [ -z "$0" ] || exec >>"$0" 2>&1; exec "$@"' "$log" "$@" <"$fifo_dir/stdin" 3<&- &
pid=$!
exec 4>"$fifo_dir/stdin"
rm -rf "$fifo_dir"
{
    trap '' PIPE
    while IFS= read -r line <&3; do printf '%s\n' "$line" >&4; done
    kill -KILL "$pid" 2>/dev/null
} &
watcher=$!
exec 3<&- 4>&-
wait "$pid"
status=$?
kill "$watcher" 2>/dev/null
if [ -n "$cleanup" ]; then
    # When the test process dies, programs writing into this directory are killed at the same
    # moment as this one; a second pass removes what they wrote while the first one ran.
    rm -rf "$cleanup" 2>/dev/null || { sleep 1; rm -rf "$cleanup"; }
fi
exit "$status""#;

/// Where a supervised program's output goes.
#[derive(Debug, Clone, Copy)]
pub enum Output<'a> {
    /// stdout and stderr appended to this file (the wrapper's own complaints too).
    Log(&'a Path),
    /// stdout piped to the caller ([`Supervised::spawn`] returns it); stderr appended to this
    /// file.
    Piped { stderr: &'a Path },
}

/// A program running under the lifeline wrapper. Dropping it kills the program (SIGKILL) and
/// reaps it.
pub struct Supervised {
    /// The `sh` wrapper; its exit status is the program's.
    wrapper: Child,
    /// Write end of the wrapper's stdin: lines go to the program, closing it kills the program.
    lifeline: Option<ChildStdin>,
    /// The program's own pid (the wrapper's child), for signals.
    pid: u32,
    /// Set once the wrapper has been reaped.
    status: Option<ExitStatus>,
    /// The program's name, for messages.
    name: String,
}

impl Supervised {
    /// Starts the program that `cmd` describes (program, arguments, environment, working
    /// directory; its stdio settings are ignored) under the wrapper, and returns once its pid is
    /// known. With [`Output::Piped`] the program's stdout is returned too.
    ///
    /// `cleanup`, if given, is removed recursively by the wrapper once the program is gone,
    /// whenever and however that happens.
    pub fn spawn(
        cmd: &Command,
        output: Output<'_>,
        cleanup: Option<&Path>,
    ) -> Result<(Supervised, Option<ChildStdout>), String> {
        let name = Path::new(cmd.get_program())
            .file_name()
            .unwrap_or(cmd.get_program())
            .to_string_lossy()
            .into_owned();
        let (log, stderr_file) = match output {
            Output::Log(path) => (path, path),
            Output::Piped { stderr } => (Path::new(""), stderr),
        };
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(stderr_file)
            .map_err(|e| format!("cannot open {}: {e}", stderr_file.display()))?;
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(WRAPPER)
            .arg(format!("lifeline:{name}"))
            .arg(log)
            .arg(cleanup.unwrap_or(Path::new("")))
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(v) => sh.env(key, v),
                None => sh.env_remove(key),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            sh.current_dir(dir);
        }
        sh.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut wrapper = sh
            .spawn()
            .map_err(|e| format!("cannot run sh to start {name}: {e}"))?;
        let lifeline = wrapper.stdin.take().expect("stdin was piped");
        let mut stdout = wrapper.stdout.take().expect("stdout was piped");
        let pid = match read_pid_line(&mut stdout) {
            Ok(pid) => pid,
            Err(e) => {
                drop(lifeline);
                let status = wrapper.wait();
                return Err(format!(
                    "the wrapper starting {name} did not report a pid ({e}; it exited with \
                     {status:?}); see {}",
                    stderr_file.display()
                ));
            }
        };
        let supervised = Supervised {
            wrapper,
            lifeline: Some(lifeline),
            pid,
            status: None,
            name,
        };
        let stdout = matches!(output, Output::Piped { .. }).then_some(stdout);
        Ok((supervised, stdout))
    }

    /// The program's pid. It stays valid until the program has been reaped, i.e. while
    /// [`Supervised::exited`] is `None`.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Writes one line to the program's stdin.
    pub fn send_line(&mut self, line: &str) -> std::io::Result<()> {
        let lifeline = self
            .lifeline
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the program was stopped"))?;
        lifeline.write_all(format!("{line}\n").as_bytes())?;
        lifeline.flush()
    }

    /// The program's exit status once it has ended (on its own or killed), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.wrapper.try_wait().ok().flatten();
        }
        self.status
    }

    /// Sends `signal` (a `libc::SIG*` constant) to the program, unless it has been reaped.
    pub fn signal(&mut self, signal: i32) {
        // Once reaped, the pid may come to belong to another process. The wrapper reaps the
        // program a moment before it exits itself; a signal sent in between finds no process
        // (ESRCH, ignored): pids are handed out in sequence, not reused within microseconds.
        if self.exited().is_some() {
            return;
        }
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.pid as libc::pid_t, signal);
        }
    }

    /// Waits up to `bound` for the program to end by itself; `None` if it still runs.
    pub fn wait_exit(&mut self, bound: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            // Polling: std offers no wait with a timeout, and the wrapper is our child, so
            // try_wait is the only way to learn of its exit without blocking forever.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the program (SIGKILL, through the lifeline) and waits until it and its wrapper are
    /// gone and the cleanup directory is removed. Idempotent.
    ///
    /// # Panics
    /// When they are not gone within `bound`.
    pub fn stop(&mut self, bound: Duration) -> ExitStatus {
        drop(self.lifeline.take());
        if let Some(status) = self.wait_exit(bound) {
            return status;
        }
        // The watcher should have killed the program at once; do it ourselves and report.
        self.signal(libc::SIGKILL);
        let _ = self.wrapper.kill();
        let status = self.wrapper.wait();
        panic!(
            "{} (pid {}) was not gone {bound:?} after its lifeline closed ({status:?})",
            self.name, self.pid
        );
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        drop(self.lifeline.take());
        // No panic here: while a test unwinds, a second panic would abort the process and hide
        // its message. The watcher kills the program on EOF; reaping the wrapper then takes
        // milliseconds.
        if self.wait_exit(Duration::from_secs(10)).is_none() {
            self.signal(libc::SIGKILL);
            let _ = self.wrapper.kill();
            let _ = self.wrapper.wait();
        }
    }
}

/// Reads the wrapper's first line, `lifeline-pid=N`, byte by byte: a buffered reader could
/// swallow the program's own output that follows it on a piped stdout.
fn read_pid_line(stdout: &mut ChildStdout) -> Result<u32, String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stdout.read(&mut byte) {
            Ok(0) => return Err("EOF before the pid line".into()),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() < 64 => line.push(byte[0]),
            Ok(_) => return Err("overlong first line".into()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let line = String::from_utf8_lossy(&line);
    line.strip_prefix("lifeline-pid=")
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| format!("unexpected first line {line:?}"))
}

/// Runs a short-lived program under the lifeline to its end, with stdout and stderr in `log`,
/// and returns its exit status and output. Killed (and reported) if it runs longer than `bound`.
pub fn run_to_end(
    cmd: &Command,
    log: &Path,
    bound: Duration,
) -> Result<(ExitStatus, String), String> {
    let (mut proc, _) = Supervised::spawn(cmd, Output::Log(log), None)?;
    let status = proc.wait_exit(bound);
    let output = fs::read_to_string(log).unwrap_or_else(|e| format!("(no output: {e})"));
    match status {
        Some(status) => Ok((status, output)),
        None => {
            proc.stop(Duration::from_secs(10));
            Err(format!(
                "{} did not finish within {bound:?}; its output:\n{output}",
                proc.name
            ))
        }
    }
}
