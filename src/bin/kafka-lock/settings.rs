//! Connection settings in Kafka's vocabulary for `run`, `status` and `history`: a
//! client.properties file (`--config-file`), `KAFKA_LOCK_X_<KEY>` variables and `-X key=value`,
//! merged with the dedicated flags (`--bootstrap`, `--session-timeout`, ...).
//!
//! Precedence, lowest first: the file; the environment; the command line. Within the
//! environment and within the command line, a dedicated flag (or its variable) wins over the
//! same setting given as a key (`-X`, `KAFKA_LOCK_X_*`); several `-X` of one key, the last wins.
//! So `--bootstrap` beats `-X bootstrap.servers`, which beats `KAFKA_LOCK_BOOTSTRAP`, which beats
//! `KAFKA_LOCK_X_BOOTSTRAP_SERVERS`, which beats `bootstrap.servers` in the file.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use kafka_lock::internals::config;
use kafka_lock::{ClientConfig, ConfigError, Security};

use crate::environ::FromEnv;
use crate::exit::{self, Failure};

/// What `KAFKA_LOCK_X_<KEY>` variables start with.
pub const X_PREFIX: &str = "KAFKA_LOCK_X_";

/// The variable of the key `key`: `sasl.password` ↔ `KAFKA_LOCK_X_SASL_PASSWORD`.
pub fn var_for_key(key: &str) -> String {
    format!(
        "{X_PREFIX}{}",
        key.to_ascii_uppercase().replace(['.', '-'], "_")
    )
}

/// Whether the variable `name` is a `KAFKA_LOCK_X_<KEY>` whose key holds a secret (a password,
/// a JAAS configuration, a token, a private key): such a variable is not passed on to the
/// supervisor and the command (docs/cli.md, "What the command can see").
pub fn is_secret_variable(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .and_then(|n| n.strip_prefix(X_PREFIX))
        .is_some_and(|suffix| config::is_secret(&suffix.to_ascii_lowercase().replace('_', ".")))
}

/// The settings given as flags, before the keys are merged in.
#[derive(Debug, Default, Clone)]
pub struct Flags<'a> {
    pub bootstrap: Option<&'a str>,
    pub client_id: Option<&'a str>,
    pub request_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub session_timeout: Option<Duration>,
    pub heartbeat_interval: Option<Duration>,
    pub rebalance_timeout: Option<Duration>,
    pub config_file: Option<&'a Path>,
    pub x: &'a [String],
}

/// The connection settings after every source is merged.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub bootstrap: String,
    pub client_id: String,
    pub request_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub session_timeout: Option<Duration>,
    pub heartbeat_interval: Option<Duration>,
    pub rebalance_timeout: Option<Duration>,
    /// Initial and largest, when either key was given.
    pub retry_backoff: Option<(Duration, Duration)>,
    pub security: Security,
    /// Keys ignored, host name checks turned off: one line each for the person running it.
    pub warnings: Vec<String>,
}

fn config_failure(e: ConfigError) -> Failure {
    let advice = match &e {
        ConfigError::Io { .. } => "; check --config-file (or $KAFKA_LOCK_CONFIG_FILE)",
        ConfigError::UnknownKey { .. } => " (the keys kafka-lock takes: docs/cli.md)",
        _ => "; fix the setting (the keys kafka-lock takes: docs/cli.md)",
    };
    Failure::new(exit::CONFIG, format!("{e}{advice}"))
}

/// The key a `-X` argument or variable sets, under its canonical name.
fn canonical(key: &str) -> &str {
    match key {
        "metadata.broker.list" => "bootstrap.servers",
        "sasl.mechanisms" => "sasl.mechanism",
        k => k,
    }
}

/// The `KAFKA_LOCK_X_*` variables, as (variable, key, value), sorted by variable. A variable
/// that names no known key, or whose value is not UTF-8, is an error; an empty one is unset.
fn x_variables(
    vars: impl Iterator<Item = (OsString, OsString)>,
) -> Result<Vec<(String, String, String)>, Failure> {
    let mut found = Vec::new();
    for (name, value) in vars {
        let Some(name) = name.to_str() else { continue };
        let Some(suffix) = name.strip_prefix(X_PREFIX) else {
            continue;
        };
        if value.is_empty() {
            continue;
        }
        let key = config::known_keys().find(|k| var_for_key(k) == name);
        let Some(key) = key else {
            let guess = config::suggest(&suffix.to_ascii_lowercase().replace('_', "."))
                .map(|k| format!("; did you mean {}?", var_for_key(k)))
                .unwrap_or_default();
            return Err(Failure::new(
                exit::CONFIG,
                format!(
                    "{name} names no setting kafka-lock knows{guess} (KAFKA_LOCK_X_ followed by the \
                     key in upper case with '_' for '.', e.g. KAFKA_LOCK_X_SASL_PASSWORD; docs/cli.md)"
                ),
            ));
        };
        let Some(value) = value.to_str() else {
            return Err(Failure::new(
                exit::CONFIG,
                format!("{name} is not valid UTF-8"),
            ));
        };
        found.push((name.to_owned(), key.to_owned(), value.to_owned()));
    }
    found.sort();
    Ok(found)
}

/// A `-X` argument split at its first `=`. Its text is shown in an error only when it cannot
/// hold a secret.
fn split_x(arg: &str) -> Result<(&str, &str), Failure> {
    match arg.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim(), v)),
        _ => {
            let shown = if config::is_secret(arg) || arg.len() > 80 {
                String::new()
            } else {
                format!(" {arg:?}")
            };
            Err(Failure::new(
                exit::USAGE,
                format!("-X{shown} is not KEY=VALUE; write -X key=value, e.g. -X security.protocol=SASL_SSL"),
            ))
        }
    }
}

/// Merges the file, the variables, `-X` and the flags (precedence: the module documentation).
pub fn resolve(flags: &Flags, from_env: &FromEnv) -> Result<Resolved, Failure> {
    resolve_with(flags, from_env, std::env::vars_os())
}

fn resolve_with(
    flags: &Flags,
    from_env: &FromEnv,
    vars: impl Iterator<Item = (OsString, OsString)>,
) -> Result<Resolved, Failure> {
    let mut cfg = ClientConfig::new();
    if let Some(path) = flags.config_file {
        cfg.load_file(path).map_err(config_failure)?;
    }
    for (var, key, value) in x_variables(vars)? {
        cfg.set_from(&key, &value, &var).map_err(config_failure)?;
    }
    let mut on_command_line = BTreeSet::new();
    for arg in flags.x {
        let (key, value) = split_x(arg)?;
        cfg.set_from(key, value, "-X").map_err(config_failure)?;
        on_command_line.insert(canonical(key).to_owned());
    }
    // A flag's variable loses to -X of the same setting; a flag typed on the command line wins.
    let flag_wins = |long: &str, key: &str| {
        let via_env = from_env.0.iter().any(|(l, _)| l == long);
        !(via_env && on_command_line.contains(key))
    };
    let pick_d =
        |flag: Option<Duration>, long: &str, key: &str, from_cfg: Option<Duration>| match flag {
            Some(d) if flag_wins(long, key) => Some(d),
            _ => from_cfg.or(flag),
        };
    let t = cfg.timeouts();
    let bootstrap = match flags.bootstrap {
        Some(b) if flag_wins("bootstrap", "bootstrap.servers") => Some(b.to_owned()),
        b => cfg
            .bootstrap_servers()
            .map(str::to_owned)
            .or(b.map(str::to_owned)),
    };
    let Some(bootstrap) = bootstrap else {
        return Err(Failure::new(
            exit::USAGE,
            "no brokers given: pass --bootstrap HOST:PORT[,...] (or $KAFKA_LOCK_BOOTSTRAP), or set \
             bootstrap.servers in --config-file or with -X",
        ));
    };
    let client_id = match flags.client_id {
        Some(id) if flag_wins("client-id", "client.id") => id.to_owned(),
        id => cfg.client_id().or(id).unwrap_or("kafka-lock").to_owned(),
    };
    let retry_backoff = match (t.retry_backoff, t.retry_backoff_max) {
        (None, None) => None,
        (initial, max) => {
            let initial = initial.unwrap_or(kafka_lock::DEFAULT_RETRY_BACKOFF);
            // As Kafka's clients: a retry.backoff.ms above the default largest raises it.
            let max = max.unwrap_or(kafka_lock::DEFAULT_RETRY_BACKOFF_MAX.max(initial));
            Some((initial, max))
        }
    };
    let security = cfg.security().map_err(config_failure)?;
    Ok(Resolved {
        bootstrap,
        client_id,
        request_timeout: pick_d(
            flags.request_timeout,
            "request-timeout",
            "request.timeout.ms",
            t.request,
        ),
        connect_timeout: pick_d(
            flags.connect_timeout,
            "connect-timeout",
            "socket.connection.setup.timeout.ms",
            t.connect,
        ),
        session_timeout: pick_d(
            flags.session_timeout,
            "session-timeout",
            "session.timeout.ms",
            t.session,
        ),
        heartbeat_interval: pick_d(
            flags.heartbeat_interval,
            "heartbeat-interval",
            "heartbeat.interval.ms",
            t.heartbeat,
        ),
        rebalance_timeout: pick_d(
            flags.rebalance_timeout,
            "rebalance-timeout",
            "max.poll.interval.ms",
            t.rebalance,
        ),
        retry_backoff,
        security,
        warnings: cfg.warnings(),
    })
}

/// Prints the warnings as lines of kafka-lock's own.
pub fn print_warnings(warnings: &[String]) {
    for w in warnings {
        exit::print_line(&format!("warning: {w}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_variables_are_told_from_the_others() {
        for secret in [
            "KAFKA_LOCK_X_SASL_PASSWORD",
            "KAFKA_LOCK_X_SASL_JAAS_CONFIG",
            "KAFKA_LOCK_X_SSL_KEY_PEM",
            "KAFKA_LOCK_X_SSL_KEY_PASSWORD",
            "KAFKA_LOCK_X_SASL_OAUTHBEARER_CLIENT_SECRET",
        ] {
            assert!(is_secret_variable(secret.as_ref()), "{secret}");
        }
        for plain in [
            "KAFKA_LOCK_X_SASL_USERNAME",
            "KAFKA_LOCK_X_SSL_KEY_LOCATION",
            "KAFKA_LOCK_X_SECURITY_PROTOCOL",
            "KAFKA_LOCK_SASL_PASSWORD",
            "KAFKA_LOCK_TOKEN",
        ] {
            assert!(!is_secret_variable(plain.as_ref()), "{plain}");
        }
    }
    use kafka_lock::{Sasl, Secret, SecurityProtocol};

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn variable_names_of_keys() {
        assert_eq!(var_for_key("sasl.password"), "KAFKA_LOCK_X_SASL_PASSWORD");
        assert_eq!(
            var_for_key("ssl.endpoint.identification.algorithm"),
            "KAFKA_LOCK_X_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM"
        );
        // Every known key has a variable of its own.
        let mut seen = BTreeSet::new();
        for k in config::known_keys() {
            assert!(seen.insert(var_for_key(k)), "{k}");
        }
    }

    #[test]
    fn precedence_file_then_environment_then_command_line() {
        let dir = std::env::temp_dir().join(format!("kafka-lock-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("client.properties");
        std::fs::write(
            &file,
            "bootstrap.servers=file:1\nclient.id=file\nrequest.timeout.ms=1000\nsession.timeout.ms=1000\n\
             security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=from-file\n",
        )
        .unwrap();
        let x = vec![
            "request.timeout.ms=3000".to_owned(),
            "bootstrap.servers=x:3".to_owned(),
        ];
        let flags = Flags {
            bootstrap: Some("env:2"),
            session_timeout: Some(Duration::from_secs(9)),
            config_file: Some(&file),
            x: &x,
            ..Flags::default()
        };
        // --bootstrap came from KAFKA_LOCK_BOOTSTRAP, so -X bootstrap.servers wins over it;
        // --session-timeout was typed, so it wins over the file.
        let from_env = FromEnv(vec![("bootstrap".into(), "KAFKA_LOCK_BOOTSTRAP".into())]);
        let r = resolve_with(
            &flags,
            &from_env,
            vars(&[
                ("KAFKA_LOCK_X_SASL_PASSWORD", "from-env"),
                ("KAFKA_LOCK_X_CLIENT_ID", "env"),
                ("KAFKA_LOCK_X_REQUEST_TIMEOUT_MS", "2000"),
                ("KAFKA_LOCK_X_ACKS", ""),
                ("OTHER", "x"),
            ])
            .into_iter(),
        )
        .unwrap();
        assert_eq!(r.bootstrap, "x:3");
        assert_eq!(r.client_id, "env");
        assert_eq!(r.request_timeout, Some(Duration::from_secs(3)));
        assert_eq!(r.session_timeout, Some(Duration::from_secs(9)));
        assert_eq!(r.security.protocol, SecurityProtocol::SaslPlaintext);
        assert_eq!(
            r.security.sasl,
            Some(Sasl::plain("u", Secret::new("from-env")))
        );

        // A typed --bootstrap wins over -X.
        let typed = resolve_with(&flags, &FromEnv::default(), std::iter::empty()).unwrap();
        assert_eq!(typed.bootstrap, "env:2");
        assert_eq!(
            typed.security.sasl,
            Some(Sasl::plain("u", Secret::new("from-file")))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_sources_fail_with_the_right_status() {
        let none = Flags {
            bootstrap: Some("a:1"),
            ..Flags::default()
        };
        let fail = |v: &[(&str, &str)]| {
            resolve_with(&none, &FromEnv::default(), vars(v).into_iter()).unwrap_err()
        };
        let f = fail(&[("KAFKA_LOCK_X_SASL_PASWORD", "hunter2")]);
        assert_eq!(f.status, exit::CONFIG);
        assert!(
            f.line.contains("did you mean KAFKA_LOCK_X_SASL_PASSWORD"),
            "{}",
            f.line
        );
        assert!(!f.line.contains("hunter2"));
        let f = fail(&[("KAFKA_LOCK_X_GROUP_ID", "g")]);
        assert_eq!(f.status, exit::CONFIG);
        assert!(
            f.line.contains("KAFKA_LOCK_X_GROUP_ID") && f.line.contains("--lock"),
            "{}",
            f.line
        );

        let x = vec!["sasl.password:hunter2".to_owned()];
        let f = resolve_with(
            &Flags {
                x: &x,
                ..none.clone()
            },
            &FromEnv::default(),
            std::iter::empty(),
        )
        .unwrap_err();
        assert_eq!(f.status, exit::USAGE);
        assert!(!f.line.contains("hunter2"), "{}", f.line);

        let f =
            resolve_with(&Flags::default(), &FromEnv::default(), std::iter::empty()).unwrap_err();
        assert_eq!(f.status, exit::USAGE);
        assert!(f.line.contains("bootstrap.servers"), "{}", f.line);

        let missing = Path::new("/nonexistent/client.properties");
        let f = resolve_with(
            &Flags {
                config_file: Some(missing),
                ..none.clone()
            },
            &FromEnv::default(),
            std::iter::empty(),
        )
        .unwrap_err();
        assert_eq!(f.status, exit::CONFIG);
        assert!(
            f.line.contains("/nonexistent/client.properties"),
            "{}",
            f.line
        );
    }
}
