//! Everything kafka-lock writes to stderr (events, logs, the status line, its own failure line)
//! goes through one bounded queue to a dedicated writer thread. The runtime thread only ever
//! appends to the queue: a stderr that nobody reads (a stalled pipe, a stopped terminal) blocks
//! that thread, never the lock session. When the queue is full the line is dropped and counted;
//! events carry the count (`dropped`) and the last line reports it. Events sent elsewhere
//! (`--events-file`, `--events-fd`) get a second queue and writer thread of the same kind.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How much may wait for the writer: far more than kafka-lock writes in any burst, far less than
/// a problem.
const MAX_QUEUED_BYTES: usize = 256 * 1024;
const MAX_QUEUED_LINES: usize = 1024;

/// The lines waiting for the writer, bounded in count and bytes.
struct Queue {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    max_lines: usize,
    max_bytes: usize,
    /// The writer is inside a write(2) (which may never return).
    writing: bool,
    /// The writer thread is running.
    started: bool,
}

impl Queue {
    fn new(max_lines: usize, max_bytes: usize) -> Queue {
        Queue {
            lines: VecDeque::new(),
            bytes: 0,
            max_lines,
            max_bytes,
            writing: false,
            started: false,
        }
    }

    /// Appends a line unless that would exceed a bound.
    fn push(&mut self, bytes: &[u8]) -> bool {
        if self.lines.len() >= self.max_lines
            || self.bytes.saturating_add(bytes.len()) > self.max_bytes
        {
            return false;
        }
        self.bytes += bytes.len();
        self.lines.push_back(bytes.to_vec());
        true
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        let line = self.lines.pop_front()?;
        self.bytes -= line.len();
        Some(line)
    }
}

/// Where a channel's writer thread writes.
pub enum Target {
    Stderr,
    /// A file or descriptor kafka-lock opened or was given (`--events-file`, `--events-fd`).
    File(std::fs::File),
    /// A FIFO nobody reads yet: opening it for writing waits for a reader, so the writer thread
    /// opens it, and lines queue (within the bounds) until then.
    Fifo(PathBuf),
}

/// One bounded queue and the thread that drains it into its target.
struct Channel {
    queue: Mutex<Queue>,
    /// Signalled when a line is queued.
    ready: Condvar,
    /// Signalled when the queue becomes empty and the writer idle.
    drained: Condvar,
    dropped: AtomicU64,
    /// Taken by the writer thread when the first line starts it.
    target: Mutex<Option<Target>>,
    thread: &'static str,
}

impl Channel {
    fn new(target: Target, thread: &'static str) -> Channel {
        Channel {
            queue: Mutex::new(Queue::new(MAX_QUEUED_LINES, MAX_QUEUED_BYTES)),
            ready: Condvar::new(),
            drained: Condvar::new(),
            dropped: AtomicU64::new(0),
            target: Mutex::new(Some(target)),
            thread,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing panics while holding the lock; a poisoned queue is still a valid queue.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&'static self, bytes: &[u8]) -> bool {
        let mut q = self.lock();
        if !q.started {
            q.started = true;
            let spawned = std::thread::Builder::new()
                .name(self.thread.into())
                .spawn(move || self.writer());
            if spawned.is_err() {
                q.started = false;
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        if !q.push(bytes) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.ready.notify_one();
        true
    }

    fn writer(&self) {
        let target = self.target.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut out: Option<Box<dyn Write>> = match target {
            Some(Target::Stderr) => Some(Box::new(std::io::stderr())),
            Some(Target::File(f)) => Some(Box::new(Blocking(f))),
            // Blocks until a reader opens the FIFO; only this thread waits for it.
            Some(Target::Fifo(path)) => std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .ok()
                .map(|f| Box::new(Blocking(f)) as Box<dyn Write>),
            None => None,
        };
        loop {
            let line = {
                let mut q = self.lock();
                loop {
                    if let Some(line) = q.pop() {
                        q.writing = true;
                        break line;
                    }
                    q.writing = false;
                    self.drained.notify_all();
                    q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            // A target that is closed or whose reader is gone (EPIPE: SIGPIPE is ignored in Rust
            // programs) takes nothing more; kafka-lock goes on and keeps its exit status.
            if let Some(w) = &mut out {
                if w.write_all(&line).and_then(|()| w.flush()).is_err() {
                    out = None;
                }
            }
        }
    }

    fn flush(&self, deadline: Instant) {
        let mut q = self.lock();
        while q.started && (!q.lines.is_empty() || q.writing) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            q = self
                .drained
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A file written with blocking writes, even if it was handed over in non-blocking mode (a
/// descriptor's status flags belong to whoever else shares it, so they are not changed): the
/// writer thread waits for room instead of giving up on EAGAIN.
struct Blocking(std::fs::File);

impl Write for Blocking {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            match self.0.write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut fds = [rustix::event::PollFd::new(
                        &self.0,
                        rustix::event::PollFlags::OUT,
                    )];
                    match rustix::event::poll(&mut fds, None) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                other => return other,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn stderr_channel() -> &'static Channel {
    static STDERR: OnceLock<Channel> = OnceLock::new();
    STDERR.get_or_init(|| Channel::new(Target::Stderr, "stderr"))
}

static EVENTS: OnceLock<Channel> = OnceLock::new();

/// Queues `bytes` for stderr without waiting. Returns false (and counts the line) when the queue
/// is full or the writer thread cannot be started.
pub fn write(bytes: &[u8]) -> bool {
    stderr_channel().write(bytes)
}

/// Lines dropped so far.
pub fn dropped() -> u64 {
    stderr_channel().dropped.load(Ordering::Relaxed)
}

/// Sends events to `target` through a queue and writer thread of their own, instead of stderr.
/// Called once, before the first event.
pub fn set_events(target: Target) {
    let _ = EVENTS.set(Channel::new(target, "events"));
}

/// Whether events have a target of their own (not stderr).
pub fn events_apart() -> bool {
    EVENTS.get().is_some()
}

/// Queues one event line for the events target (stderr unless [`set_events`] chose another).
pub fn event(bytes: &[u8]) -> bool {
    match EVENTS.get() {
        Some(ch) => ch.write(bytes),
        None => write(bytes),
    }
}

/// Event lines dropped so far, on whichever queue events go through.
pub fn events_dropped() -> u64 {
    match EVENTS.get() {
        Some(ch) => ch.dropped.load(Ordering::Relaxed),
        None => dropped(),
    }
}

/// Waits up to `bound` for everything queued (events and stderr) to be written. kafka-lock calls
/// this just before it exits: a stalled stderr or events reader delays the exit by `bound` at most.
pub fn flush(bound: Duration) {
    let deadline = Instant::now() + bound;
    if let Some(ch) = EVENTS.get() {
        ch.flush(deadline);
    }
    stderr_channel().flush(deadline);
}

/// A `tracing` writer into the queue: one log event is one write of a whole formatted line.
#[derive(Clone, Copy)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

/// Text from a peer (a label, a member id, a client host, a ledger field) as it may be shown on
/// a terminal: control characters (C0, DEL, C1: escape sequences, carriage returns, new lines)
/// and the bidirectional overrides that reorder what is shown become `\u{..}` escapes, and a
/// backslash is doubled so that an escape cannot be faked. Other text is shown as it is.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    let risky = |c: char| {
        c.is_control()
            || c == '\\'
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.contains(risky) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if risky(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_text_cannot_reach_a_terminal_as_control_characters() {
        assert_eq!(shown("job a (host-1)"), "job a (host-1)");
        assert_eq!(shown("Grüße"), "Grüße");
        let evil = "job \x1b]0;owned\x07\x1b[2J\x1b[31mRED\r\nfake line\u{9b}\u{202e}";
        let s = shown(evil);
        assert!(!s.chars().any(|c| c.is_control() || c == '\u{202e}'), "{s}");
        assert_eq!(
            s,
            "job \\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{1b}[31mRED\\u{d}\\u{a}fake line\\u{9b}\\u{202e}"
        );
        // A backslash is doubled, so a label cannot pass for an escape.
        assert_eq!(shown("a\\u{1b}"), "a\\\\u{1b}");
    }

    #[test]
    fn a_full_queue_refuses_lines_until_the_writer_takes_some() {
        let mut q = Queue::new(3, 10);
        assert!(q.push(b"abcd"));
        assert!(q.push(b"efgh"));
        assert!(!q.push(b"ijk"), "11 bytes is over the byte bound");
        assert!(q.push(b"ij"));
        assert!(!q.push(b""), "a fourth line is over the line bound");
        assert_eq!(q.pop().as_deref(), Some(&b"abcd"[..]));
        assert!(q.push(b"kl"));
        let rest: Vec<Vec<u8>> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(rest, [b"efgh".to_vec(), b"ij".to_vec(), b"kl".to_vec()]);
        assert_eq!(q.bytes, 0);
    }

    #[test]
    fn a_line_larger_than_the_whole_queue_is_dropped_not_split() {
        let mut q = Queue::new(8, 4);
        assert!(!q.push(b"12345"));
        assert!(q.lines.is_empty());
    }
}
