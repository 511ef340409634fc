//! Step stamps for taking a handover apart: with `KAFKA_LOCK_TRACE_FILE` set, `kafka-lock run`
//! and its supervisor append one line per step to that file,
//! `<CLOCK_MONOTONIC ns> <CLOCK_REALTIME ns> <pid> <parent pid> <role> <step>`. Off unless the variable is set.
//! The realtime reading lines the stamps up with the protocol log (`KAFKA_LOCK_LOG=trace`, which
//! prints realtime) and with the commands' own readings; `scripts/bench_cli.py --trace` merges
//! them. The file is opened for appending: a regular file's append neither blocks for long nor
//! interleaves lines of several processes, so the supervisor may write it at any time.

use std::fs::File;
use std::io::Write;
use std::sync::OnceLock;

use crate::sys;

/// The variable naming the file.
pub const VAR: &str = "KAFKA_LOCK_TRACE_FILE";

static FILE: OnceLock<Option<File>> = OnceLock::new();

/// Appends one stamp for `step` of `role` ("run" or "supervisor"), if asked to.
pub fn stamp(role: &str, step: &str) {
    let file = FILE.get_or_init(|| {
        let path = std::env::var_os(VAR)?;
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .ok()
    });
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
