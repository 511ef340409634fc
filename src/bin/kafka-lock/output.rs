//! Everything kafka-lock writes to stderr (events, logs, the status line, its own failure line)
//! goes through one bounded queue to a dedicated writer thread. The runtime thread only ever
//! appends to the queue: a stderr that nobody reads (a stalled pipe, a stopped terminal) blocks
//! that thread, never the lock session. When the queue is full the line is dropped and counted;
//! events carry the count (`dropped`) and the last line reports it.

use std::collections::VecDeque;
use std::io::Write;
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

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a line is queued.
    ready: Condvar,
    /// Signalled when the queue becomes empty and the writer idle.
    drained: Condvar,
    dropped: AtomicU64,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        queue: Mutex::new(Queue::new(MAX_QUEUED_LINES, MAX_QUEUED_BYTES)),
        ready: Condvar::new(),
        drained: Condvar::new(),
        dropped: AtomicU64::new(0),
    })
}

fn lock(s: &Shared) -> MutexGuard<'_, Queue> {
    // Nothing panics while holding the lock; a poisoned queue is still a valid queue.
    s.queue.lock().unwrap_or_else(|p| p.into_inner())
}

/// Queues `bytes` for stderr without waiting. Returns false (and counts the line) when the queue
/// is full or the writer thread cannot be started.
pub fn write(bytes: &[u8]) -> bool {
    let s = shared();
    let mut q = lock(s);
    if !q.started {
        q.started = true;
        let spawned = std::thread::Builder::new()
            .name("stderr".into())
            .spawn(writer);
        if spawned.is_err() {
            q.started = false;
            s.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
    }
    if !q.push(bytes) {
        s.dropped.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    s.ready.notify_one();
    true
}

/// Lines dropped so far.
pub fn dropped() -> u64 {
    shared().dropped.load(Ordering::Relaxed)
}

fn writer() {
    let s = shared();
    let mut broken = false;
    loop {
        let line = {
            let mut q = lock(s);
            loop {
                if let Some(line) = q.pop() {
                    q.writing = true;
                    break line;
                }
                q.writing = false;
                s.drained.notify_all();
                q = s.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        // A stderr that is closed or whose reader is gone (EPIPE: SIGPIPE is ignored in Rust
        // programs) takes nothing more; kafka-lock goes on and keeps its exit status.
        if !broken && std::io::stderr().lock().write_all(&line).is_err() {
            broken = true;
        }
    }
}

/// Waits up to `bound` for everything queued to be written. kafka-lock calls this just before it
/// exits: a stalled stderr delays the exit by `bound` at most.
pub fn flush(bound: Duration) {
    let s = shared();
    let deadline = Instant::now() + bound;
    let mut q = lock(s);
    while q.started && (!q.lines.is_empty() || q.writing) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        q = s
            .drained
            .wait_timeout(q, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
