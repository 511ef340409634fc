//! Step stamps for taking a handover apart: with `KAFKA_LOCK_TRACE_FILE` set, `kafka-lock run`
//! and its supervisor append one line per step to that file,
//! `<CLOCK_MONOTONIC ns> <CLOCK_REALTIME ns> <pid> <parent pid> <role> <step>`. Off unless the variable is set.
//! The realtime reading lines the stamps up with the protocol log (`KAFKA_LOCK_LOG=trace`, which
//! prints realtime) and with the commands' own readings; `scripts/bench_cli.py --trace` merges
//! them. The file is opened for appending: a regular file's append neither blocks for long nor
//! interleaves lines of several processes. It is opened non-blocking as well, because the
//! supervisor must never wait on a write: a FIFO named by mistake (or a reader that stops
//! reading) would otherwise hold the supervisor in `open` or `write` past the lease end, with
//! the command running; a FIFO without a reader is not opened, and a full one loses stamps.

use std::fs::File;
use std::io::Write;
use std::sync::OnceLock;

use crate::sys;

/// The variable naming the file.
pub const VAR: &str = "KAFKA_LOCK_TRACE_FILE";

static FILE: OnceLock<Option<File>> = OnceLock::new();

/// The trace file, opened so that neither the open nor a write ever waits.
fn open(path: &std::path::Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .ok()
}

/// Appends one stamp for `step` of `role` ("run" or "supervisor"), if asked to.
pub fn stamp(role: &str, step: &str) {
    let file = FILE.get_or_init(|| open(std::path::Path::new(&std::env::var_os(VAR)?)));
    if let Some(mut f) = file.as_ref() {
        let mono = sys::mono_ns();
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
        let _ = f.write_all(
            format!(
                "{mono} {real} {} {parent} {role} {step}\n",
                std::process::id()
            )
            .as_bytes(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A FIFO nobody reads would block a plain open for writing forever (and a full one would
    /// block every write): the supervisor, stamping, would then miss the lease end.
    #[test]
    fn a_fifo_without_a_reader_is_not_waited_for() {
        let dir = std::env::temp_dir().join(format!("kafka-lock-trace-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RWXU).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(open(&path).is_some());
        });
        let opened = rx.recv_timeout(Duration::from_secs(10));
        if opened.is_err() {
            // Let the blocked open go, so the thread ends.
            let _ = std::fs::File::open(&fifo);
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            opened,
            Ok(false),
            "the open of a FIFO without a reader waited"
        );
    }
}
