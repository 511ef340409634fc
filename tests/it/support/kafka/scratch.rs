//! A broker's directory (configuration, data, logs) that disappears with it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::lifeline::{Output, Supervised};
use crate::support::unique_group;

/// A directory under `target/tmp/kafka/`, removed when the value is dropped, and also when the
/// test process dies first: a janitor process (an idle `cat` under the lifeline, with this
/// directory as its wrapper's cleanup) removes it then. A shared broker's handle is never
/// dropped, so the janitor is what removes its files when the test binary exits.
pub struct ScratchDir {
    path: PathBuf,
    janitor: Option<Supervised>,
}

impl ScratchDir {
    /// Creates `target/tmp/kafka/<prefix>-<unique>`.
    ///
    /// # Panics
    /// When the directory or its janitor cannot be created.
    pub fn new(prefix: &str) -> ScratchDir {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("kafka")
            .join(unique_group(prefix));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        let (janitor, _) = Supervised::spawn(
            &Command::new("cat"),
            Output::Log(Path::new("/dev/null")),
            Some(&path),
        )
        .unwrap_or_else(|e| panic!("cannot start the janitor of {}: {e}", path.display()));
        ScratchDir {
            path,
            janitor: Some(janitor),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Dropping the janitor returns once its wrapper has removed the directory (and never
        // panics, which matters while a failing test unwinds).
        drop(self.janitor.take());
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
