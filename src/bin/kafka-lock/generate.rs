//! Shell completions and man pages, generated from the same clap definition that parses the
//! command line (hidden subcommands `completions` and `manpage`), so they cannot drift from it.

use std::io::Write;

use clap::{Command, ValueEnum};

use crate::exit::{self, Failure};

/// The man pages: kafka-lock(1) and one per subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Page {
    Run,
    Status,
    Elect,
    Observe,
}

/// The completion script for `shell`, for the command `kafka-lock`.
pub fn completions(shell: clap_complete::Shell, mut cmd: Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "kafka-lock", &mut out);
    out
}

/// kafka-lock(1), or kafka-lock-run(1) / kafka-lock-status(1), in roff.
pub fn manpage(page: Option<Page>, mut cmd: Command) -> Result<Vec<u8>, Failure> {
    // Building gives subcommands their display names ("kafka-lock-run") and usage lines.
    cmd.build();
    let cmd = match page {
        None => cmd,
        Some(p) => {
            let name = match p {
                Page::Run => "run",
                Page::Status => "status",
                Page::Elect => "elect",
                Page::Observe => "observe",
            };
            cmd.find_subcommand(name)
                .cloned()
                .ok_or_else(|| Failure::new(exit::USAGE, format!("no subcommand {name}")))?
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut out)
        .map_err(|e| Failure::new(exit::OSERR, format!("cannot render the man page: {e}")))?;
    Ok(out)
}

/// Writes generated text to stdout; unlike an answer of `status`, a file that could not be
/// written completely is an error (a packager's redirect to a full disk must not pass).
pub fn print(text: &[u8]) -> Result<u8, Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(exit::OSERR, format!("cannot write to stdout: {e}")))?;
    Ok(0)
}
