//! Every flag also from the environment: `--flag-name` ↔ `KAFKA_LOCK_FLAG_NAME`, derived from
//! the clap definition at run time so that no flag can be added without its variable. A flag on
//! the command line wins over its variable; an empty variable counts as unset.
//!
//! The variables kafka-lock sets for the command ([`OUTPUTS`]) are never read as settings, but
//! one of them tells a `kafka-lock run` started by a command that already holds the same lock,
//! which would wait for itself forever: that is refused.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use clap::builder::BoolishValueParser;
use clap::error::{ContextKind, ContextValue};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command, Parser};

use crate::exit::{self, Failure};

/// What every variable's name starts with.
pub const PREFIX: &str = "KAFKA_LOCK_";

/// The variables `run` sets in the command's environment: outputs, never settings.
pub const OUTPUTS: [&str; 8] = [
    "KAFKA_LOCK_NAME",
    "KAFKA_LOCK_TOKEN",
    "KAFKA_LOCK_GENERATION",
    "KAFKA_LOCK_MEMBER_ID",
    "KAFKA_LOCK_PERMIT",
    "KAFKA_LOCK_CHECKPOINT",
    "KAFKA_LOCK_CHECKPOINT_FILE",
    "KAFKA_LOCK_LAST_CHECKPOINT_FILE",
];

/// The variable of the flag `--long`.
pub fn var_for(long: &str) -> String {
    format!("{PREFIX}{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// `cmd` with the variable of every flag attached, in every subcommand. For `docs` (completions,
/// man pages) the variables' current values are not shown.
pub fn with_env(cmd: Command, docs: bool) -> Command {
    cmd.mut_args(|arg| {
        let Some(long) = arg.get_long() else {
            return arg;
        };
        let flag = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        if !(flag || arg.get_action().takes_values()) {
            // --help and --version.
            return arg;
        }
        let var = var_for(long);
        if !docs && std::env::var_os(&var).is_some_and(|v| v.is_empty()) {
            return arg;
        }
        let arg = arg.env(var).hide_env_values(docs);
        if flag {
            // KAFKA_LOCK_JSON=1 as well as =true; clap's flags take only true and false.
            arg.value_parser(BoolishValueParser::new())
        } else {
            arg
        }
    })
    .mut_subcommands(|sub| with_env(sub, docs))
}

/// The flags whose value came from their variable: (long name, variable).
#[derive(Debug, Default, Clone)]
pub struct FromEnv(pub Vec<(String, String)>);

/// Parses `argv` with every flag's variable, and tells which flags took their value from one.
pub fn parse<P: Parser>(argv: &[OsString]) -> Result<(P, FromEnv), clap::Error> {
    let mut cmd = with_env(P::command(), false);
    let mut matches = cmd.try_get_matches_from_mut(argv)?;
    let from_env = sources(&cmd, &matches);
    let parsed = P::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))?;
    Ok((parsed, from_env))
}

fn sources(cmd: &Command, m: &ArgMatches) -> FromEnv {
    let mut found = Vec::new();
    let mut level = (cmd, m);
    loop {
        let (cmd, m) = level;
        for arg in cmd.get_arguments() {
            if let (Some(long), Some(ValueSource::EnvVariable)) =
                (arg.get_long(), m.value_source(arg.get_id().as_str()))
            {
                found.push((long.to_owned(), var_for(long)));
            }
        }
        match m.subcommand() {
            Some((name, sub_m)) => match cmd.find_subcommand(name) {
                Some(sub) => level = (sub, sub_m),
                None => break,
            },
            None => break,
        }
    }
    FromEnv(found)
}

/// Whether `line` names the flag `--long` (not a longer flag that starts with it).
fn names_flag(line: &str, long: &str) -> bool {
    let flag = format!("--{long}");
    line.match_indices(&flag).any(|(i, _)| {
        !line[i + flag.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// Says which of the flags a failure names were set through their variable: a person who never
/// typed `--kill-grace` learns where it came from.
pub fn annotate(mut f: Failure, from_env: &FromEnv) -> Failure {
    for (long, var) in &from_env.0 {
        if names_flag(&f.line, long) {
            f.line.push_str(&format!(" (--{long} was set by {var})"));
        }
    }
    f
}

/// For a command-line error about a flag that was not on the command line: the variable that
/// gave it its value.
pub fn usage_note(e: &clap::Error, argv: &[OsString]) -> Option<String> {
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = arg.strip_prefix("--")?.split([' ', '=']).next()?;
    let flag = format!("--{long}");
    let typed = argv.iter().any(|a| {
        let a = a.as_bytes();
        a == flag.as_bytes()
            || a.strip_prefix(flag.as_bytes())
                .is_some_and(|rest| rest.first() == Some(&b'='))
    });
    let var = var_for(long);
    (!typed && std::env::var_os(&var).is_some_and(|v| !v.is_empty()))
        .then(|| format!("the value came from {var}"))
}

/// Refuses `kafka-lock run` for a lock the calling command already holds (its environment has
/// that lock's KAFKA_LOCK_NAME and a KAFKA_LOCK_TOKEN): the outer kafka-lock keeps the lock until
/// the command ends, so the inner one would wait for it forever.
pub fn refuse_nested(lock: &str) -> Result<(), Failure> {
    let holding = std::env::var_os(OUTPUTS[0]).is_some_and(|n| n.as_bytes() == lock.as_bytes())
        && std::env::var_os(OUTPUTS[1]).is_some_and(|t| !t.is_empty());
    if holding {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "refusing to wait for lock {lock:?}: the command this runs in already holds it \
                 ({} and {} are set), so this would wait for itself forever; run the inner \
                 command directly, or use another lock",
                OUTPUTS[0], OUTPUTS[1]
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_names_follow_the_flag_names() {
        assert_eq!(var_for("lock"), "KAFKA_LOCK_LOCK");
        assert_eq!(var_for("session-timeout"), "KAFKA_LOCK_SESSION_TIMEOUT");
        assert_eq!(var_for("events-fd"), "KAFKA_LOCK_EVENTS_FD");
    }

    #[test]
    fn a_flag_is_named_only_as_a_whole() {
        assert!(names_flag("--wait must be positive", "wait"));
        assert!(names_flag("raise --lease-margin, or", "lease-margin"));
        assert!(!names_flag("--waiting is not a flag", "wait"));
        assert!(!names_flag("--lease-margin-x", "lease-margin"));
        let f = annotate(
            Failure::new(
                exit::CONFIG,
                "--kill-grace 6s must be shorter than --session-timeout 6s",
            ),
            &FromEnv(vec![(
                "session-timeout".into(),
                "KAFKA_LOCK_SESSION_TIMEOUT".into(),
            )]),
        );
        assert!(f
            .line
            .ends_with("(--session-timeout was set by KAFKA_LOCK_SESSION_TIMEOUT)"));
        assert!(!f.line.contains("KILL_GRACE"));
    }
}
