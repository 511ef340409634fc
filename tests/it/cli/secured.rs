//! `kafka-lock run` and `status` on the secured Apache Kafka node (support::kafka::secure):
//! settings from a client.properties file, from `-X` and from `KAFKA_LOCK_X_*` variables, each
//! misconfiguration's exit status and one-line message, and passwords that never show.

use std::path::{Path, PathBuf};

use super::{check_event, lock_name, run_to_end_env, scratch_dir, BIN, STEP};
use crate::support::kafka::secure::{secure_kafka, NOBODY, PLAIN_USER, SCRAM512_USER};

const SCRAM_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";

/// A client.properties for the SASL_SSL listener with SCRAM-SHA-512, in Java's syntax: the JAAS
/// value continued over lines, a comment, `:` as a separator.
fn client_properties(dir: &Path, password: &str) -> PathBuf {
    let k = secure_kafka();
    let path = dir.join("client.properties");
    let text = format!(
        "# the SASL_SSL listener\n\
         bootstrap.servers={}\n\
         security.protocol: SASL_SSL\n\
         sasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config={SCRAM_MODULE} required \\\n    username=\"{}\" \\\n    password=\"{password}\";\n\
         ssl.ca.location={}\n\
         session.timeout.ms=6000\n",
        k.addr("SASL_SSL"),
        SCRAM512_USER.0,
        k.certs().ca.display()
    );
    std::fs::write(&path, text).expect("write client.properties");
    path
}

/// Runs kafka-lock with these arguments and variables; (status, stderr lines, stdout). Every
/// event on stderr must follow docs/events.md.
fn kl(args: &[&str], env: &[(&str, &str)]) -> (i32, Vec<String>, String) {
    let (code, stderr, stdout) = run_to_end_env(args, env, STEP);
    for line in &stderr {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            if v.get("event").is_some() {
                check_event(&v);
            }
        }
    }
    (code, stderr, stdout)
}

#[test]
fn run_and_status_over_sasl_ssl_scram_sha512_from_a_client_properties_file() {
    let dir = scratch_dir("secured-file");
    let file = client_properties(&dir, SCRAM512_USER.1);
    let file = file.to_str().expect("utf-8 path");
    let lock = lock_name("secured-file");
    // The command asks `status` (same file) while the lock is held: 0, the holder shown.
    let script = format!(
        "echo token=$KAFKA_LOCK_TOKEN; '{BIN}' status --config-file '{file}' --lock '{lock}'; echo status=$?"
    );
    let (code, stderr, stdout) = kl(
        &[
            "run",
            "--config-file",
            file,
            "--lock",
            &lock,
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
    );
    assert_eq!(
        code,
        0,
        "{stderr:?} {stdout}\n{}",
        secure_kafka().log_tail()
    );
    assert!(stdout.contains("token="), "{stdout}");
    assert!(stdout.contains("status=0"), "{stdout} {stderr:?}");
    assert!(stdout.contains(&lock), "{stdout}");
    // Released: free (3).
    let (code, stderr, _) = kl(&["status", "--config-file", file, "--lock", &lock], &[]);
    assert_eq!(code, 3, "{stderr:?}");
}

#[test]
fn run_with_x_settings_and_the_password_from_the_environment() {
    let k = secure_kafka();
    let ca = k.certs().ca.display().to_string();
    let ca_setting = format!("ssl.ca.location={ca}");
    let user = format!("sasl.username={}", SCRAM512_USER.0);
    let lock = lock_name("secured-x");
    let (code, stderr, stdout) = kl(
        &[
            "run",
            "--bootstrap",
            &k.addr("SASL_SSL"),
            "--lock",
            &lock,
            "--session-timeout",
            "6s",
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            "sasl.mechanism=SCRAM-SHA-512",
            "-X",
            &user,
            "-X",
            &ca_setting,
            "--",
            "sh",
            "-c",
            "echo held $KAFKA_LOCK_TOKEN",
        ],
        &[("KAFKA_LOCK_X_SASL_PASSWORD", SCRAM512_USER.1)],
    );
    assert_eq!(code, 0, "{stderr:?}");
    assert!(stdout.starts_with("held "), "{stdout}");

    // Everything from the environment; a -X on the command line over a variable.
    let (code, stderr, _) = kl(
        &[
            "status",
            "--lock",
            &lock,
            "-X",
            "sasl.mechanism=SCRAM-SHA-512",
        ],
        &[
            ("KAFKA_LOCK_BOOTSTRAP", &k.addr("SASL_SSL")),
            ("KAFKA_LOCK_X_SECURITY_PROTOCOL", "SASL_SSL"),
            ("KAFKA_LOCK_X_SASL_MECHANISM", "PLAIN"),
            ("KAFKA_LOCK_X_SASL_USERNAME", SCRAM512_USER.0),
            ("KAFKA_LOCK_X_SASL_PASSWORD", SCRAM512_USER.1),
            ("KAFKA_LOCK_X_SSL_CA_LOCATION", &ca),
        ],
    );
    assert_eq!(code, 3, "{stderr:?}");
}

/// One misconfiguration or refusal.
struct Case {
    what: &'static str,
    bootstrap: String,
    extra: Vec<String>,
    /// KAFKA_LOCK_X_SASL_PASSWORD, if not empty.
    password: &'static str,
    /// Words its line must hold.
    words: Vec<&'static str>,
}

/// Each misconfiguration or refusal exits 77 with its own line, from `run` and `status`.
#[test]
fn each_security_failure_has_its_status_and_its_own_line() {
    let k = secure_kafka();
    let certs = k.certs();
    let ca = format!("ssl.ca.location={}", certs.ca.display());
    let other_ca = format!("ssl.ca.location={}", certs.other_ca.display());
    let sasl_ssl = k.addr("SASL_SSL");
    let localhost = sasl_ssl.replace("127.0.0.1", "localhost");
    let scram = |user: &str| {
        vec![
            "-X".to_owned(),
            "security.protocol=SASL_SSL".to_owned(),
            "-X".to_owned(),
            "sasl.mechanism=SCRAM-SHA-512".to_owned(),
            "-X".to_owned(),
            format!("sasl.username={user}"),
        ]
    };
    let mut with_ca = scram(SCRAM512_USER.0);
    with_ca.extend(["-X".to_owned(), ca.clone()]);
    let mut unknown_ca = scram(SCRAM512_USER.0);
    unknown_ca.extend(["-X".to_owned(), other_ca]);
    let mut nobody = scram(NOBODY.0);
    nobody.extend(["-X".to_owned(), ca.clone()]);
    let plain_on_scram_only = vec![
        "-X".to_owned(),
        "security.protocol=SASL_PLAINTEXT".to_owned(),
        "-X".to_owned(),
        "sasl.mechanism=PLAIN".to_owned(),
        "-X".to_owned(),
        format!("sasl.username={}", PLAIN_USER.0),
    ];
    let ssl_to_plaintext = vec![
        "-X".to_owned(),
        "security.protocol=SSL".to_owned(),
        "-X".to_owned(),
        ca.clone(),
    ];
    let cases = vec![
        Case {
            what: "plaintext client, TLS listener",
            bootstrap: sasl_ssl.clone(),
            extra: vec![],
            password: "",
            words: vec!["TLS listener", "security.protocol"],
        },
        Case {
            what: "TLS client, plaintext listener",
            bootstrap: k.addr("PLAINTEXT"),
            extra: ssl_to_plaintext,
            password: "",
            words: vec!["plaintext listener"],
        },
        Case {
            what: "unknown CA",
            bootstrap: sasl_ssl.clone(),
            extra: unknown_ca,
            password: SCRAM512_USER.1,
            words: vec!["trusted CA", "ssl.ca.location"],
        },
        Case {
            what: "host name mismatch",
            bootstrap: localhost,
            extra: with_ca.clone(),
            password: SCRAM512_USER.1,
            words: vec!["not valid for localhost"],
        },
        Case {
            what: "wrong password",
            bootstrap: sasl_ssl.clone(),
            extra: with_ca,
            password: "not-the-password-Jw8",
            words: vec!["authentication", "sasl.password"],
        },
        Case {
            what: "mechanism not enabled",
            bootstrap: k.addr("SASL_PLAINTEXT"),
            extra: plain_on_scram_only,
            password: PLAIN_USER.1,
            words: vec!["does not enable SASL mechanism PLAIN", "SCRAM-SHA-512"],
        },
        Case {
            what: "group not authorized",
            bootstrap: sasl_ssl.clone(),
            extra: nobody,
            password: NOBODY.1,
            words: vec!["not authorized for"],
        },
    ];
    for Case {
        what,
        bootstrap,
        extra,
        password,
        words,
    } in &cases
    {
        for sub in ["run", "status"] {
            let lock = lock_name("secured-fail");
            let mut args: Vec<&str> = vec![sub, "--bootstrap", bootstrap, "--lock", &lock];
            args.extend(["--connect-timeout", "5s", "--request-timeout", "5s"]);
            args.extend(extra.iter().map(String::as_str));
            if sub == "run" {
                args.extend(["--wait", "30s", "--events", "json", "--", "true"]);
            }
            let env: Vec<(&str, &str)> = if password.is_empty() {
                vec![]
            } else {
                vec![("KAFKA_LOCK_X_SASL_PASSWORD", password)]
            };
            let (code, stderr, stdout) = kl(&args, &env);
            assert_eq!(code, 77, "{what} ({sub}): {stderr:?} {stdout}");
            let line = stderr
                .iter()
                .find(|l| l.starts_with("kafka-lock: ") && !l.starts_with("kafka-lock: warning: "))
                .unwrap_or_else(|| {
                    panic!("{what} ({sub}): no line of kafka-lock's own: {stderr:?}")
                });
            // Shown with --nocapture: the line each cause gives.
            eprintln!("{what} ({sub}): {line}");
            for w in words {
                assert!(line.contains(w), "{what} ({sub}): {w:?} not in {line:?}");
            }
            if sub == "run" {
                let failed = stderr
                    .iter()
                    .find(|l| l.contains("\"event\":\"failed\""))
                    .unwrap_or_else(|| panic!("{what}: no failed event: {stderr:?}"));
                assert!(
                    failed.contains("\"status\":77") && failed.contains("\"kind\":\"denied\""),
                    "{failed}"
                );
            }
            if !password.is_empty() {
                assert!(
                    !stderr.concat().contains(password),
                    "{what}: password shown: {stderr:?}"
                );
            }
        }
    }
}

/// The password is not in kafka-lock's stderr, events or help, not even with a trace log, and
/// not when a setting naming it is wrong.
#[test]
fn the_password_never_shows() {
    let k = secure_kafka();
    let dir = scratch_dir("secured-secret");
    let file = client_properties(&dir, SCRAM512_USER.1);
    let file = file.to_str().expect("utf-8 path");
    let lock = lock_name("secured-secret");
    let secret = SCRAM512_USER.1;
    let mut shown = Vec::new();

    // A whole run, a trace log and events on stderr.
    let (code, stderr, stdout) = kl(
        &[
            "run",
            "--config-file",
            file,
            "--lock",
            &lock,
            "--events",
            "json",
            "--",
            "true",
        ],
        &[("KAFKA_LOCK_LOG", "trace")],
    );
    assert_eq!(code, 0, "{stderr:?}");
    assert!(stderr.len() > 10, "a trace log was expected: {stderr:?}");
    shown.push(("run with a trace log", stderr.concat() + &stdout));

    // A wrong password, traced: neither password shows.
    let (code, stderr, _) = kl(
        &[
            "status",
            "--bootstrap",
            &k.addr("SASL_SSL"),
            "--lock",
            &lock,
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            "sasl.mechanism=SCRAM-SHA-512",
            "-X",
            &format!("sasl.username={}", SCRAM512_USER.0),
            "-X",
            &format!("ssl.ca.location={}", k.certs().ca.display()),
        ],
        &[
            ("KAFKA_LOCK_LOG", "trace"),
            ("KAFKA_LOCK_X_SASL_PASSWORD", "wrong-Qp7-password"),
        ],
    );
    assert_eq!(code, 77, "{stderr:?}");
    assert!(
        !stderr.concat().contains("wrong-Qp7-password"),
        "{stderr:?}"
    );

    // Settings that are wrong around the secret.
    for args in [
        vec!["-X".to_owned(), format!("sasl.pasword={secret}")],
        vec!["-X".to_owned(), format!("sasl.password:{secret}")],
        vec![
            "-X".to_owned(),
            format!("sasl.jaas.config={SCRAM_MODULE} required password=\"{secret}"),
        ],
        vec!["-X".to_owned(), format!("ssl.key.password={secret}")],
        vec!["-X".to_owned(), format!("sasl.password={secret}")],
    ] {
        let mut all = vec!["status", "--bootstrap", "127.0.0.1:9", "--lock", &lock];
        all.extend(args.iter().map(String::as_str));
        let (code, stderr, _) = kl(&all, &[("KAFKA_LOCK_LOG", "trace")]);
        assert!(code == 78 || code == 64, "{args:?}: {code} {stderr:?}");
        shown.push(("a wrong setting", stderr.concat()));
    }

    // Help with the secret in the environment.
    for sub in ["run", "status", "history"] {
        let (code, stderr, stdout) =
            kl(&[sub, "--help"], &[("KAFKA_LOCK_X_SASL_PASSWORD", secret)]);
        assert_eq!(code, 0, "{stderr:?}");
        shown.push(("help", stdout + &stderr.concat()));
    }
    for (what, text) in shown {
        assert!(
            !text.contains(secret),
            "{what}: the password shows in {text}"
        );
        // A SCRAM client-final message (its channel binding, then the proof) as text.
        assert!(
            !text.contains("c=biws"),
            "{what}: a SCRAM message shows in {text}"
        );
    }
}

/// Malformed secrets given every way (a client.properties, -X, KAFKA_LOCK_X_*), each holding
/// pieces that must never show: the failure line, the `failed` event and a trace log on stderr
/// name the key, the kind of fault and a position, and hold no piece of the value. Fails if an
/// error quotes a token of a JAAS value, the text of a bad escape, or a stray line of a value as
/// an unknown key.
#[test]
fn errors_about_malformed_secrets_show_no_piece_of_them() {
    let dir = scratch_dir("secret-errors");
    let lock = lock_name("secret-errors");
    let cases: &[(&str, &[&str])] = &[
        (
            "sasl.jaas.config=M required password=Tr0ub4dor sEcReT-TaIl;",
            &["Tr0ub4dor", "sEcReT-TaIl"],
        ),
        ("sasl.password=ab\\user-secret", &["user-secret", "\\user"]),
        ("sasl.jaas.config=Kq7zPw9 Vr8xLm2;", &["Kq7zPw9", "Vr8xLm2"]),
        ("sasl.jaas.config=M required Hx4Jw9q;", &["Hx4Jw9q"]),
        (
            "sasl.jaas.config=M required password=\"Bf5Tq1z",
            &["Bf5Tq1z"],
        ),
        (
            "sasl.jaas.config=M required a=b; Dk9Lz4w required;",
            &["Dk9Lz4w"],
        ),
        (
            "sasl.jaas.config=M required username=u password=\"Lq4Vb\nXs7Pe9k\";",
            &["Lq4Vb", "Xs7Pe9k"],
        ),
    ];
    for (i, (text, pieces)) in cases.iter().enumerate() {
        let file = dir.join(format!("client{i}.properties"));
        std::fs::write(
            &file,
            format!("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n{text}\n"),
        )
        .expect("write client.properties");
        let file = file.to_str().expect("utf-8 path").to_owned();
        let base = [
            "run",
            "--bootstrap",
            "127.0.0.1:9",
            "--lock",
            &lock,
            "--events",
            "json",
        ];
        // (arguments, variables)
        type Way = (Vec<String>, Vec<(String, String)>);
        let mut ways: Vec<Way> = vec![(vec!["--config-file".into(), file], vec![])];
        // A JAAS value on one line also as -X and as a variable (other values are only
        // unescaped in a file).
        let jaas_line = text.starts_with("sasl.jaas.config=") && !text.contains('\n');
        if let Some((key, value)) = text.split_once('=').filter(|_| jaas_line) {
            let (key_value, value) = (text.to_string(), value.to_string());
            let common = [
                "-X",
                "security.protocol=SASL_SSL",
                "-X",
                "sasl.mechanism=PLAIN",
            ];
            let mut x: Vec<String> = common.iter().map(|a| a.to_string()).collect();
            x.extend(["-X".to_owned(), key_value]);
            ways.push((x, vec![]));
            let var = format!(
                "KAFKA_LOCK_X_{}",
                key.to_ascii_uppercase().replace('.', "_")
            );
            let common: Vec<String> = common.iter().map(|a| a.to_string()).collect();
            ways.push((common, vec![(var, value)]));
        }
        for (args, env) in ways {
            let mut all: Vec<&str> = base.to_vec();
            all.extend(args.iter().map(String::as_str));
            all.extend(["--", "true"]);
            let mut env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            env.push(("KAFKA_LOCK_LOG", "trace"));
            let (code, stderr, stdout) = kl(&all, &env);
            let shown = stderr.concat() + &stdout;
            assert!(
                code == 78 || code == 64,
                "{text:?} {args:?}: {code} {shown}"
            );
            assert!(shown.contains("\"failed\""), "{text:?} {args:?}: {shown}");
            for piece in *pieces {
                assert!(
                    !shown.contains(piece),
                    "{text:?} {args:?}: {piece:?} shows in {shown}"
                );
            }
        }
    }
}

/// The command, which runs as the same user as kafka-lock, reads every environment it can reach:
/// its own, its parent's (the supervisor) and its grandparent's (kafka-lock itself, found
/// through the supervisor's /proc stat). The password given as KAFKA_LOCK_X_SASL_PASSWORD is in
/// none of them: the variable is not passed on, and both kafka-lock processes are
/// non-dumpable, so their /proc environ is not readable by the command. The user name, not a
/// secret, is passed on. Fails if the variable is passed on (the command's own environ shows
/// it) or if kafka-lock is dumpable (its environ shows it).
///
/// Root may read any process's environ (CAP_SYS_PTRACE), so when the test runs as root,
/// kafka-lock and the command run as nobody (65534), as an unprivileged user would.
#[test]
fn the_command_cannot_read_the_password_from_any_environment() {
    let k = secure_kafka();
    let lock = lock_name("secured-environ");
    let secret = SCRAM512_USER.1;
    // A copy of the CA that nobody can read.
    let dir = scratch_dir("secured-environ");
    let ca = dir.join("ca.pem");
    std::fs::copy(&k.certs().ca, &ca).expect("copy the CA");
    for (path, mode) in [(&dir, 0o755), (&ca, 0o644)] {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }
    let ca_setting = format!("ssl.ca.location={}", ca.display());
    let script = "k=$(cut -d' ' -f4 /proc/$PPID/stat); \
         for p in $$ $PPID $k; do echo \"== $p\"; tr '\\0' '\\n' </proc/$p/environ 2>&1; done; \
         echo \"grandparent=$k\"; id -u";
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL"]);
    // /proc/self belongs to the effective user.
    let euid =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("/proc/self"));
    if euid == 0 {
        cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"]);
    }
    cmd.arg("--").arg(BIN);
    super::hermetic(&mut cmd);
    cmd.args([
        "run",
        "--bootstrap",
        &k.addr("SASL_SSL"),
        "--lock",
        &lock,
        "--session-timeout",
        "6s",
        "-X",
        "security.protocol=SASL_SSL",
        "-X",
        "sasl.mechanism=SCRAM-SHA-512",
        "-X",
        &ca_setting,
        "--",
        "sh",
        "-c",
        script,
    ])
    .env("KAFKA_LOCK_X_SASL_PASSWORD", secret)
    .env("KAFKA_LOCK_X_SASL_USERNAME", SCRAM512_USER.0)
    .current_dir(&dir)
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut run = super::Run::watch(cmd.spawn().expect("start setpriv"), None);
    let code = run.finish(STEP);
    let mut stdout = String::new();
    while let Ok(line) = run.stdout.recv_timeout(std::time::Duration::from_secs(5)) {
        stdout.push_str(&line);
        stdout.push('\n');
    }
    assert_eq!(code, 0, "{}\n{stdout}", run.transcript());
    // The command did read its own environment, and found the settings that are not secret.
    assert!(stdout.contains("KAFKA_LOCK_TOKEN="), "{stdout}");
    assert!(
        stdout.contains(&format!("KAFKA_LOCK_X_SASL_USERNAME={}", SCRAM512_USER.0)),
        "{stdout}"
    );
    assert!(!stdout.contains("grandparent=\n"), "{stdout}");
    assert!(
        !stdout.lines().any(|l| l == "0"),
        "the command ran as root, which may read any environ: {stdout}"
    );
    assert!(
        !stdout.contains(secret),
        "the command read the password:\n{stdout}"
    );
    assert!(!stdout.contains("KAFKA_LOCK_X_SASL_PASSWORD"), "{stdout}");
}

/// On the plain broker: a key that means nothing for a lock is a warning (a line and an event),
/// a `-X` on the command line beats a flag's variable, and a file's unknown key is status 78
/// with a `failed` event naming the key and its line.
#[test]
fn settings_on_the_plain_broker_warnings_precedence_and_errors() {
    let b = super::broker().bootstrap();
    let lock = lock_name("settings");
    let dead = format!("127.0.0.1:{}", super::dead_port());
    let bootstrap = format!("bootstrap.servers={b}");
    let (code, stderr, stdout) = kl(
        &[
            "run",
            "--lock",
            &lock,
            "--session-timeout",
            "6s",
            "--events",
            "json",
            "-X",
            &bootstrap,
            "-X",
            "acks=all",
            "--",
            "echo",
            "ran",
        ],
        &[
            ("KAFKA_LOCK_BOOTSTRAP", &dead),
            ("KAFKA_LOCK_X_ENABLE_AUTO_COMMIT", "false"),
        ],
    );
    assert_eq!(code, 0, "{stderr:?}");
    assert_eq!(stdout, "ran\n");
    for key in ["acks", "enable.auto.commit"] {
        assert!(
            stderr
                .iter()
                .any(|l| l.starts_with("kafka-lock: warning: setting")
                    && l.contains(&format!("{key:?}"))),
            "{key}: {stderr:?}"
        );
        assert!(
            stderr
                .iter()
                .any(|l| l.contains("\"event\":\"warning\"") && l.contains(key)),
            "{key}: {stderr:?}"
        );
    }

    let dir = scratch_dir("settings-bad");
    let file = dir.join("client.properties");
    std::fs::write(
        &file,
        format!("bootstrap.servers={b}\n# ok\nsasl.pasword=x\n"),
    )
    .expect("write");
    let file = file.to_str().expect("utf-8 path");
    let (code, stderr, _) = kl(
        &[
            "run",
            "--config-file",
            file,
            "--lock",
            &lock,
            "--events",
            "json",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(code, 78, "{stderr:?}");
    let line = stderr
        .iter()
        .find(|l| l.starts_with("kafka-lock: "))
        .expect("a line");
    assert!(
        line.contains("\"sasl.pasword\"") && line.contains("line 3"),
        "{line}"
    );
    assert!(line.contains("did you mean \"sasl.password\""), "{line}");
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("\"event\":\"failed\"") && l.contains("\"kind\":\"config\"")),
        "{stderr:?}"
    );
    let (code, stderr, _) = kl(&["status", "--config-file", file, "--lock", &lock], &[]);
    assert_eq!(code, 78, "{stderr:?}");

    // SASL settings with the default protocol: 78 before anything is sent.
    let (code, stderr, _) = kl(
        &[
            "status",
            "--bootstrap",
            &b,
            "--lock",
            &lock,
            "-X",
            "sasl.mechanism=PLAIN",
        ],
        &[],
    );
    assert_eq!(code, 78, "{stderr:?}");
    assert!(
        stderr[0].contains("security.protocol=SASL_SSL"),
        "{stderr:?}"
    );
}

/// The SSL listener requires a client certificate: given by librdkafka's names, and by Java's
/// (a PEM key store holding key and chain, a PEM trust store).
#[test]
fn mtls_with_librdkafka_and_java_names() {
    let k = secure_kafka();
    let c = k.certs();
    let dir = scratch_dir("secured-mtls");
    let keystore = dir.join("client-keystore.pem");
    let key = std::fs::read_to_string(&c.client_key).expect("client key");
    let cert = std::fs::read_to_string(&c.client_cert).expect("client cert");
    std::fs::write(&keystore, format!("{key}{cert}")).expect("write key store");
    let librdkafka = format!(
        "bootstrap.servers={}\nsecurity.protocol=SSL\nssl.ca.location={}\n\
         ssl.certificate.location={}\nssl.key.location={}\n",
        k.addr("SSL"),
        c.ca.display(),
        c.client_cert.display(),
        c.client_key.display()
    );
    let java = format!(
        "bootstrap.servers={}\nsecurity.protocol=SSL\nssl.truststore.type=PEM\n\
         ssl.truststore.location={}\nssl.keystore.type=PEM\nssl.keystore.location={}\n\
         ssl.endpoint.identification.algorithm=https\n",
        k.addr("SSL"),
        c.ca.display(),
        keystore.display()
    );
    for (name, text) in [("librdkafka", librdkafka), ("java", java)] {
        let file = dir.join(format!("{name}.properties"));
        std::fs::write(&file, text).expect("write properties");
        let file = file.to_str().expect("utf-8 path");
        let lock = lock_name("secured-mtls");
        let (code, stderr, stdout) = kl(
            &[
                "run",
                "--config-file",
                file,
                "--lock",
                &lock,
                "--session-timeout",
                "6s",
                "--",
                "echo",
                "held",
            ],
            &[],
        );
        assert_eq!(code, 0, "{name}: {stderr:?}\n{}", k.log_tail());
        assert_eq!(stdout, "held\n", "{name}");
    }
}

/// A ledger over SASL_SSL: `run` writes its records there and `history` reads them, both from
/// the same client.properties.
#[test]
fn ledger_run_and_history_over_sasl_ssl() {
    let k = secure_kafka();
    let topic = lock_name("secured-ledger");
    // The PLAINTEXT listener's ANONYMOUS principal may create topics.
    crate::support::kafka::probe::create_topic(&k.addr("PLAINTEXT"), &topic, 1);
    let dir = scratch_dir("secured-ledger");
    let file = client_properties(&dir, SCRAM512_USER.1);
    let file = file.to_str().expect("utf-8 path");
    let lock = lock_name("secured-ledger");
    let (code, stderr, stdout) = kl(
        &[
            "run",
            "--config-file",
            file,
            "--lock",
            &lock,
            "--ledger-topic",
            &topic,
            "--",
            "sh",
            "-c",
            "echo token=$KAFKA_LOCK_TOKEN",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr:?}\n{}", k.log_tail());
    assert!(stdout.starts_with("token="), "{stdout}");
    let (code, stderr, stdout) = kl(
        &[
            "history",
            "--config-file",
            file,
            "--lock",
            &lock,
            "--ledger-topic",
            &topic,
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr:?}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("history --json");
    let holds = v["holds"]
        .as_array()
        .unwrap_or_else(|| panic!("no holds: {v}"));
    assert_eq!(holds.len(), 1, "{v}");
}

/// The static binaries of scripts/build-static.sh (TLS with graviola, on both architectures)
/// over SASL_SSL on the secured node: `--version`, `status` (a free lock: 3), and where the
/// binary runs natively `run` with the token shown. An aarch64 binary runs under
/// qemu-aarch64-static. scripts/test.sh builds them first and runs this; without
/// qemu-user-static, KAFKA_LOCK_ALLOW_NO_QEMU=1 skips (and names) the binary that needs it.
#[tokio::test]
#[ignore = "needs scripts/build-static.sh x86_64 and aarch64 first; scripts/test.sh runs it"]
async fn static_binaries_over_sasl_ssl() {
    // BIN is <target dir>/debug/kafka-lock.
    let target_dir = Path::new(BIN).parent().and_then(Path::parent).unwrap();
    let host = std::env::consts::ARCH;
    for arch in ["x86_64", "aarch64"] {
        let bin = target_dir.join(format!("{arch}-unknown-linux-musl/release/kafka-lock"));
        assert!(
            bin.is_file(),
            "{} does not exist: run scripts/build-static.sh {arch}",
            bin.display()
        );
        let mut argv: Vec<String> = vec![];
        if arch != host {
            let qemu = format!("qemu-{arch}-static");
            let found = std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).any(|d| d.join(&qemu).is_file()))
                .unwrap_or(false);
            if !found {
                let why = format!(
                    "{qemu} not found: cannot run the {arch} binary here; install \
                     qemu-user-static (scripts/install-test-deps.sh does, with apt-get as root)"
                );
                if std::env::var_os("KAFKA_LOCK_ALLOW_NO_QEMU").is_some() {
                    eprintln!("SKIPPED: {why}");
                    continue;
                }
                panic!("{why}; or set KAFKA_LOCK_ALLOW_NO_QEMU=1 to skip it");
            }
            argv.push(qemu);
        }
        argv.push(bin.display().to_string());

        let (code, out, err) = static_run(&argv, &["--version"]).await;
        assert_eq!(code, Some(0), "{argv:?} --version: {err}");
        assert!(out.starts_with("kafka-lock "), "{out}");

        let k = secure_kafka();
        let lock = lock_name(&format!("static-{arch}"));
        let (user, ca) = (
            format!("sasl.username={}", SCRAM512_USER.0),
            format!("ssl.ca.location={}", k.certs().ca.display()),
        );
        let secured = [
            "--bootstrap",
            &k.addr("SASL_SSL"),
            "--lock",
            &lock,
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            "sasl.mechanism=SCRAM-SHA-512",
            "-X",
            &user,
            "-X",
            &ca,
        ];
        // `status`: TLS handshake, SASL, FindCoordinator, DescribeGroups; 3 = free.
        let (code, out, err) = static_run(&argv, &[&["status"], &secured[..]].concat()).await;
        assert_eq!(
            code,
            Some(3),
            "{arch} status: {out} {err}\n{}",
            k.log_tail()
        );
        // `run` needs PR_SET_CHILD_SUBREAPER, which qemu's user mode does not emulate (EINVAL):
        // only where the binary runs natively.
        if argv.len() == 1 {
            let run = [
                &["run", "--session-timeout", "6s"][..],
                &secured[..],
                &["--", "sh", "-c", "echo token=$KAFKA_LOCK_TOKEN"][..],
            ]
            .concat();
            let (code, out, err) = static_run(&argv, &run).await;
            assert_eq!(code, Some(0), "{arch}: {err}\n{}", k.log_tail());
            assert!(out.contains("token="), "{arch}: {out} {err}");
        }
        eprintln!("{arch}: {} over SASL_SSL: ok", argv.join(" "));
    }
}

/// Runs `argv` + `args` to the end within [`STEP`]: (status, stdout, stderr); killed past it.
async fn static_run(argv: &[String], args: &[&str]) -> (Option<i32>, String, String) {
    let child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .args(args)
        .env("KAFKA_LOCK_X_SASL_PASSWORD", SCRAM512_USER.1)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {argv:?}: {e}"));
    let out = tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{argv:?} {args:?} did not finish within {STEP:?}"))
        .expect("wait");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
