//! Opening the events' own target (`--events-file PATH`, `--events-fd N`) before anything runs,
//! so that a target that cannot be written is a setting error (78) at once, and so that nothing
//! here can block: a FIFO without a reader is left to the events writer thread to open.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::OFlags;
use rustix::io::FdFlags;

use crate::exit::{self, Failure};
use crate::output::Target;

/// Opens `path` for appending (created if missing, like `>>`), without waiting for the reader of
/// a FIFO: the writer thread opens such a FIFO itself, so events wait in their queue until the
/// reader comes and kafka-lock goes on meanwhile.
pub fn open_file(path: &Path) -> Result<Target, Failure> {
    let bad = |e: io::Error| {
        Failure::new(
            exit::CONFIG,
            format!(
                "cannot open --events-file {}: {e}; give a file kafka-lock may create or append to, or a FIFO",
                path.display()
            ),
        )
    };
    let opened = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o666)
        .custom_flags(OFlags::NONBLOCK.bits() as i32)
        .open(path);
    match opened {
        Ok(f) => {
            // Non-blocking only for the open: this description is ours alone, and the writer
            // thread writes with blocking writes.
            let flags = rustix::fs::fcntl_getfl(&f).map_err(|e| bad(e.into()))?;
            rustix::fs::fcntl_setfl(&f, flags - OFlags::NONBLOCK).map_err(|e| bad(e.into()))?;
            Ok(Target::File(f))
        }
        // ENXIO: a FIFO that nobody has open for reading yet.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
            match std::fs::metadata(path) {
                Ok(m) if m.file_type().is_fifo() => Ok(Target::Fifo(path.to_owned())),
                _ => Err(bad(e)),
            }
        }
        Err(e) => Err(bad(e)),
    }
}

/// Takes descriptor `n` for the events: writes go to a close-on-exec duplicate of it, and `n`
/// itself is made close-on-exec (unless it is stdin, stdout or stderr), so neither the
/// supervisor nor the command inherits kafka-lock's events channel.
///
/// Called before any thread or file of kafka-lock's own exists, so `n` is the descriptor the
/// caller passed, and stays open while it is used here.
pub fn take_fd(n: RawFd) -> Result<Target, Failure> {
    let bad = |what: String| {
        Failure::new(
            exit::CONFIG,
            format!("--events-fd {n}: {what}; open it for writing before starting kafka-lock (e.g. `3>events.jsonl` or `3>&1`)"),
        )
    };
    // Whether `n` is open, asked without touching it: only an open descriptor has this entry.
    if std::fs::symlink_metadata(format!("/proc/self/fd/{n}")).is_err() {
        return Err(bad("the descriptor is not open".to_owned()));
    }
    let fd = borrow(n);
    let access = rustix::fs::fcntl_getfl(fd)
        .map_err(|e| bad(format!("cannot read its flags: {e}")))?
        & (OFlags::WRONLY | OFlags::RDWR);
    if access.is_empty() {
        return Err(bad("the descriptor is open for reading only".to_owned()));
    }
    let ours = rustix::io::fcntl_dupfd_cloexec(fd, 3)
        .map_err(|e| bad(format!("cannot duplicate it: {e}")))?;
    if n > 2 {
        rustix::io::fcntl_setfd(fd, FdFlags::CLOEXEC)
            .map_err(|e| bad(format!("cannot mark it close-on-exec: {e}")))?;
    }
    Ok(Target::File(std::fs::File::from(ours)))
}

#[allow(unsafe_code)]
fn borrow(n: RawFd) -> BorrowedFd<'static> {
    // SAFETY: `n` was just seen open in /proc/self/fd, and it stays open for as long as this
    // borrow is used (the calls in `take_fd`): kafka-lock has no other thread yet and never
    // closes a descriptor it did not open. The borrow is not kept; writes use a duplicate.
    unsafe { BorrowedFd::borrow_raw(n) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_that_is_not_open_is_a_setting_error() {
        // Far above anything a test process has open.
        let f = take_fd(1_000_000).err().expect("not open");
        assert_eq!(f.status, exit::CONFIG);
        assert!(f.line.contains("not open"), "{}", f.line);
    }

    #[test]
    fn a_file_in_a_missing_directory_is_a_setting_error() {
        let f = open_file(Path::new("/nonexistent-kafka-lock-dir/events"))
            .err()
            .expect("cannot be created");
        assert_eq!(f.status, exit::CONFIG);
        assert!(f.line.contains("--events-file"), "{}", f.line);
    }

    #[test]
    fn borrowed_descriptors_are_not_closed() {
        // stderr stays usable after it was taken for events.
        let Target::File(_) = take_fd(2).expect("stderr is open for writing") else {
            panic!("a descriptor gives a file");
        };
        assert!(rustix::fs::fcntl_getfl(std::io::stderr().as_fd()).is_ok());
    }
}
