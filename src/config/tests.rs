use super::*;
use proptest::prelude::*;

/// The pairs of properties text, without their line numbers.
fn parse_properties(text: &str, origin: &str) -> Result<Vec<(String, String)>, ConfigError> {
    Ok(numbered_properties(text, origin)?
        .into_iter()
        .map(|(_, k, v)| (k, v))
        .collect())
}

fn props(text: &str) -> Vec<(String, String)> {
    parse_properties(text, "t").expect("parses")
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_three_separators_and_their_blanks() {
    assert_eq!(
        props("a=1\nb: 2\nc 3\nd\t=\t4\ne = = 5\nf\ng:\n  h  =  trailing  "),
        pairs(&[
            ("a", "1"),
            ("b", "2"),
            ("c", "3"),
            ("d", "4"),
            ("e", "= 5"),
            ("f", ""),
            ("g", ""),
            ("h", "trailing  "),
        ])
    );
}

#[test]
fn comments_and_blank_lines() {
    assert_eq!(
        props("# a comment\n! another\n   # indented\n\n \t \na=1\nb=2 # not a comment"),
        pairs(&[("a", "1"), ("b", "2 # not a comment")])
    );
}

#[test]
fn a_comment_is_not_continued() {
    assert_eq!(props("# comment \\\na=1"), pairs(&[("a", "1")]));
}

#[test]
fn continuations_drop_the_next_lines_leading_blanks() {
    assert_eq!(
        props("a=one \\\n    two \\\r\n\tthree\nb=4"),
        pairs(&[("a", "one two three"), ("b", "4")])
    );
    // An even number of backslashes is an escaped backslash, not a continuation.
    assert_eq!(props("a=x\\\\\nb=y"), pairs(&[("a", "x\\"), ("b", "y")]));
    // A continuation at the end of the text.
    assert_eq!(props("a=x\\"), pairs(&[("a", "x")]));
    // Old Mac line ends.
    assert_eq!(props("a=1\rb=2"), pairs(&[("a", "1"), ("b", "2")]));
}

#[test]
fn escapes() {
    assert_eq!(
        props("k\\=ey\\ x=v\\tw\\n\\u0041\\u00e9\\:\\b\\\\"),
        pairs(&[("k=ey x", "v\tw\nAé:b\\")])
    );
    // A character outside the BMP as a surrogate pair.
    assert_eq!(props("a=\\uD83D\\uDE00"), pairs(&[("a", "😀")]));
    // UTF-8 text is read as such.
    assert_eq!(props("pässwörd=ü"), pairs(&[("pässwörd", "ü")]));
}

#[test]
fn a_malformed_unicode_escape_is_an_error_with_its_line() {
    let e = parse_properties("a=1\nb=\\u00G1", "client.properties").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("client.properties line 2"), "{text}");
    assert!(text.contains("\\uXXXX"), "{text}");
    assert!(parse_properties("a=\\u12", "t").is_err());
}

#[test]
fn latin1_files_are_read_as_java_reads_them() {
    assert_eq!(decode_properties(b"a=\xe9"), "a=é");
    assert_eq!(decode_properties("a=é".as_bytes()), "a=é");
}

#[test]
fn jaas_in_any_order_with_quotes_escapes_and_comments() {
    let j = parse_jaas(
        "org.apache.kafka.common.security.scram.ScramLoginModule REQUIRED /* c */ password='p\\\"w;d' // x\n username=\"alice\";",
    )
    .unwrap();
    assert_eq!(
        j.module,
        "org.apache.kafka.common.security.scram.ScramLoginModule"
    );
    assert_eq!(
        j.options,
        vec![
            ("password".to_string(), "p\"w;d".to_string()),
            ("username".to_string(), "alice".to_string())
        ]
    );
    let j = parse_jaas("M required user=bare;").unwrap();
    assert_eq!(j.options, vec![("user".to_string(), "bare".to_string())]);
    assert_eq!(
        parse_jaas("M required a=\"\\101\\t\";").unwrap().options[0].1,
        "A\t"
    );
}

#[test]
fn jaas_errors() {
    for (text, says) in [
        ("", "no login module"),
        ("M", "no control flag"),
        ("M always;", "control flag"),
        ("M required username=\"a\"", "not terminated"),
        ("M required username;", "no '='"),
        ("M required username=;", "no value"),
        ("M required password=\"secret", "not closed"),
        ("M required; N required;", "2 login modules"),
        ("M required /* x", "not closed"),
    ] {
        let e = parse_jaas(text).unwrap_err();
        assert!(e.contains(says), "{text:?}: {e}");
        assert!(!e.contains("secret"), "{e}");
    }
}

const SCRAM: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";
const PLAIN: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";

#[test]
fn a_sasl_ssl_client_properties() {
    let text = format!(
        "bootstrap.servers=127.0.0.1:9093\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config={SCRAM} required \\\n  username=\"alice\" \\\n  password=\"s3cr=t\";\n\
         ssl.ca.location=/tmp/ca.pem\nsession.timeout.ms=6000\nmax.poll.interval.ms=7000\nclient.id=me\n"
    );
    let c = ClientConfig::from_properties(&text, "client.properties").unwrap();
    assert_eq!(c.bootstrap_servers(), Some("127.0.0.1:9093"));
    assert_eq!(c.client_id(), Some("me"));
    let s = c.security().unwrap();
    assert_eq!(s.protocol, SecurityProtocol::SaslSsl);
    assert_eq!(
        s.sasl,
        Some(Sasl::scram_sha512("alice", Secret::new("s3cr=t")))
    );
    assert_eq!(s.tls, Some(Tls::new().ca_file("/tmp/ca.pem")));
    let t = c.timeouts();
    assert_eq!(t.session, Some(Duration::from_secs(6)));
    assert_eq!(t.rebalance, Some(Duration::from_secs(7)));
    assert!(c.warnings().is_empty());
    let opts = c.lock_options("l").unwrap();
    assert_eq!(opts.name(), "l");
    assert!(!format!("{c:?}{opts:?}").contains("s3cr=t"));
}

#[test]
fn librdkafka_names_and_a_later_setting_wins() {
    let mut c = ClientConfig::new();
    c.set("metadata.broker.list", "a:1").unwrap();
    c.set("security.protocol", "sasl_plaintext").unwrap();
    c.set("sasl.mechanisms", "PLAIN").unwrap();
    c.set("sasl.username", "u").unwrap();
    c.set("sasl.password", "first").unwrap();
    c.set("sasl.password", "second").unwrap();
    c.set("bootstrap.servers", "b:2").unwrap();
    assert_eq!(c.bootstrap_servers(), Some("b:2"));
    let s = c.security().unwrap();
    assert_eq!(s.protocol, SecurityProtocol::SaslPlaintext);
    assert_eq!(s.sasl, Some(Sasl::plain("u", Secret::new("second"))));
    assert!(s.tls.is_none());
}

#[test]
fn plaintext_is_the_default_and_needs_nothing() {
    let s = ClientConfig::new().security().unwrap();
    assert_eq!(s.protocol, SecurityProtocol::Plaintext);
    assert!(s.sasl.is_none() && s.tls.is_none());
    // The default value of the host name check is not a TLS setting.
    let mut c = ClientConfig::new();
    c.set("ssl.endpoint.identification.algorithm", "https")
        .unwrap();
    c.security().unwrap();
}

#[test]
fn unknown_keys_are_named_with_the_nearest_known_one() {
    let mut c = ClientConfig::new();
    let e = c.set("sasl.pasword", "x").unwrap_err();
    assert_eq!(
        e,
        ConfigError::UnknownKey {
            key: "sasl.pasword".into(),
            origin: "set".into(),
            suggestion: Some("sasl.password".into())
        }
    );
    assert!(
        e.to_string().contains("did you mean \"sasl.password\""),
        "{e}"
    );
    let e = c.set("bootstrap_servers", "x").unwrap_err();
    assert!(e.to_string().contains("bootstrap.servers"), "{e}");
    let e = c.set("completely.different.thing", "x").unwrap_err();
    assert!(!e.to_string().contains("did you mean"), "{e}");
}

#[test]
fn ignored_keys_warn_and_refused_keys_say_why() {
    let mut c =
        ClientConfig::from_properties("acks=all\nauto.offset.reset=earliest\n", "f").unwrap();
    let w = c.warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("\"acks\" (f line 1)"), "{w:?}");
    let e = c.set("group.id", "x").unwrap_err();
    assert!(matches!(e, ConfigError::Refused { .. }));
    assert!(e.to_string().contains("--lock"), "{e}");
    assert!(c.set("group.protocol", "classic").is_ok());
    assert!(c.set("group.protocol", "consumer").is_err());
    assert!(c
        .set("enable.ssl.certificate.verification", "false")
        .is_err());
    let e = c.set("ssl.key.password", "hunter2").unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[test]
fn bad_values_name_key_and_value_unless_secret() {
    let mut c = ClientConfig::new();
    let e = c.set("security.protocol", "TLS").unwrap_err();
    assert!(
        e.to_string().contains("\"TLS\"") && e.to_string().contains("security.protocol"),
        "{e}"
    );
    let e = c.set("sasl.mechanism", "scram-sha-512").unwrap_err();
    assert!(e.to_string().contains("upper case: SCRAM-SHA-512"), "{e}");
    assert!(c
        .set("sasl.mechanism", "GSSAPI")
        .unwrap_err()
        .to_string()
        .contains("Kerberos"));
    let e = c.set("session.timeout.ms", "10s").unwrap_err();
    assert!(e.to_string().contains("\"10s\""), "{e}");
    assert!(c.set("session.timeout.ms", "0").is_err());
    assert!(c.set("session.timeout.ms", "2147483648").is_err());
    assert!(c.set("session.timeout.ms", "2147483647").is_ok());
    let e = c
        .set(
            "sasl.jaas.config",
            &format!("{PLAIN} required password=\"hunter2"),
        )
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("sasl.jaas.config") && text.contains("not closed"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    assert!(c
        .set("ssl.endpoint.identification.algorithm", "dns")
        .is_err());
    assert!(c.set("ssl.ca.location", " ").is_err());
}

fn conflict(settings: &[(&str, &str)]) -> String {
    let mut c = ClientConfig::new();
    for (k, v) in settings {
        c.set(k, v).unwrap();
    }
    match c.security() {
        Err(ConfigError::Conflict(m)) => m,
        other => panic!("{settings:?}: {other:?}"),
    }
}

#[test]
fn conflicting_settings() {
    let jaas = format!("{SCRAM} required username=\"u\" password=\"hunter2\";");
    let m = conflict(&[("sasl.mechanism", "PLAIN")]);
    assert!(
        m.contains("security.protocol is PLAINTEXT (the default)") && m.contains("SASL_SSL"),
        "{m}"
    );
    let m = conflict(&[
        ("ssl.ca.location", "/ca.pem"),
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanism", "PLAIN"),
    ]);
    assert!(
        m.contains("does not use TLS") && m.contains("set security.protocol=SASL_SSL"),
        "{m}"
    );
    let m = conflict(&[("security.protocol", "SSL"), ("sasl.username", "u")]);
    assert!(m.contains("does not authenticate with SASL"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.jaas.config", &jaas),
    ]);
    assert!(
        m.contains("ScramLoginModule but sasl.mechanism is PLAIN"),
        "{m}"
    );
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-256"),
        ("sasl.jaas.config", &jaas),
        ("sasl.username", "u"),
    ]);
    assert!(m.contains("both sasl.jaas.config"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.jaas.config", &jaas),
    ]);
    assert!(m.contains("sasl.mechanism is not set"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.username", "u"),
    ]);
    assert!(m.contains("KAFKA_LOCK_X_SASL_PASSWORD"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
    ]);
    assert!(m.contains("no credentials"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SSL"),
        ("ssl.certificate.location", "/c.pem"),
    ]);
    assert!(m.contains("needs its private key"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SSL"),
        ("ssl.truststore.location", "/t.jks"),
    ]);
    assert!(m.contains("JKS store"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-256"),
        (
            "sasl.jaas.config",
            &format!("{SCRAM} required username=u password=hunter2 tokenauth=true;"),
        ),
    ]);
    assert!(m.contains("delegation-token"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.jaas.config", &format!("{PLAIN} required username=u;")),
    ]);
    assert!(m.contains("no password option"), "{m}");
}

#[test]
fn pem_stores_by_their_java_names_and_mtls() {
    let mut c = ClientConfig::new();
    for (k, v) in [
        ("security.protocol", "SSL"),
        ("ssl.truststore.location", "/ca.pem"),
        ("ssl.truststore.type", "pem"),
        ("ssl.keystore.location", "/me.pem"),
        ("ssl.keystore.type", "PEM"),
        ("ssl.endpoint.identification.algorithm", ""),
    ] {
        c.set(k, v).unwrap();
    }
    let tls = c.security().unwrap().tls.unwrap();
    assert_eq!(tls.ca, Some(Pem::File("/ca.pem".into())));
    assert_eq!(
        tls.client_cert,
        Some((Pem::File("/me.pem".into()), Pem::File("/me.pem".into())))
    );
    assert!(!tls.verify_hostname);
    assert!(c
        .warnings()
        .iter()
        .any(|w| w.contains("not checked against its host name")));

    let mut c = ClientConfig::new();
    for (k, v) in [
        ("security.protocol", "SSL"),
        ("ssl.certificate.location", "/c.pem"),
        ("ssl.key.location", "/k.pem"),
        ("ssl.ca.location", "probe"),
    ] {
        c.set(k, v).unwrap();
    }
    let tls = c.security().unwrap().tls.unwrap();
    assert_eq!(tls.ca, None);
    assert_eq!(
        tls.client_cert,
        Some((Pem::File("/c.pem".into()), Pem::File("/k.pem".into())))
    );
}

#[test]
fn a_plain_password_without_tls_is_warned_about() {
    let c = ClientConfig::from_properties(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n",
        "f",
    )
    .unwrap();
    c.security().unwrap();
    let w = c.warnings();
    assert!(w.iter().any(|l| l.contains("unencrypted")), "{w:?}");
    let c = ClientConfig::from_properties(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n",
        "f",
    )
    .unwrap();
    assert!(c.warnings().is_empty());
}

#[test]
fn inline_pem_gets_its_lines_back() {
    let body = "QUJD".repeat(20);
    let flat = format!("-----BEGIN CERTIFICATE----- {body} -----END CERTIFICATE-----");
    let fixed = pem(&flat).unwrap();
    let lines: Vec<&str> = fixed.lines().collect();
    assert_eq!(lines[0], "-----BEGIN CERTIFICATE-----");
    assert_eq!(lines[1].len(), 64);
    assert_eq!(lines.last(), Some(&"-----END CERTIFICATE-----"));
    assert_eq!(lines[1..lines.len() - 1].concat(), body);
    // Two certificates, continued over properties lines.
    let text = format!("security.protocol=SSL\nssl.truststore.certificates={flat} \\\n  {flat}\n");
    let c = ClientConfig::from_properties(&text, "f").unwrap();
    match c.security().unwrap().tls.unwrap().ca {
        Some(Pem::Inline(p)) => assert_eq!(p.expose().matches("BEGIN CERTIFICATE").count(), 2),
        other => panic!("{other:?}"),
    }
    assert!(pem("not pem").is_none());
    assert!(pem("-----BEGIN X----- Proc-Type: 4,ENCRYPTED abc -----END X-----").is_none());
    assert!(pem("-----BEGIN X----- abc").is_none());
}

#[test]
fn secrets_stay_out_of_debug_and_errors() {
    let secret = "Zq9-very-secret";
    let text = format!(
        "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.jaas.config={PLAIN} required username=u password=\"{secret}\";\n"
    );
    let c = ClientConfig::from_properties(&text, "f").unwrap();
    let s = c.security().unwrap();
    assert_eq!(s.sasl, Some(Sasl::plain("u", Secret::new(secret))));
    for shown in [
        format!("{c:?}"),
        format!("{s:?}"),
        format!("{:?}", c.warnings()),
    ] {
        assert!(!shown.contains(secret), "{shown}");
    }
    let mut c = ClientConfig::new();
    c.set("sasl.password", secret).unwrap();
    assert!(!format!("{c:?}").contains(secret));
    assert!(
        is_secret("sasl.password")
            && is_secret("sasl.jaas.config")
            && is_secret("ssl.key.password")
    );
    assert!(!is_secret("ssl.key.location") && !is_secret("sasl.username"));
}

/// Malformed secrets, each with pieces (at least 5 characters, none a word of the messages)
/// that no error may show: the error names the key, the kind and a position instead.
#[test]
fn errors_about_a_secret_never_quote_it() {
    let cases: &[(&str, &[&str])] = &[
        (
            "sasl.jaas.config=M required password=Tr0ub4dor sEcReT-TaIl;",
            &["Tr0ub4dor", "sEcReT-TaIl"],
        ),
        ("sasl.password=ab\\user-secret", &["user-secret", "\\user"]),
        ("sasl.password=ab\\u12Zqx9", &["u12Zqx9", "12Zqx9"]),
        ("sasl.jaas.config=Kq7zPw9 Vr8xLm2;", &["Kq7zPw9", "Vr8xLm2"]),
        ("sasl.jaas.config=M required Hx4Jw9q;", &["Hx4Jw9q"]),
        (
            "sasl.jaas.config=M required a=Gz3Nk8p =Yt6Wq2r;",
            &["Gz3Nk8p", "Yt6Wq2r"],
        ),
        (
            "sasl.jaas.config=M required password=\"Bf5Tq1z",
            &["Bf5Tq1z"],
        ),
        ("sasl.jaas.config=M required password=Mp2Qr7x", &["Mp2Qr7x"]),
        (
            "sasl.jaas.config=M required a=b; Dk9Lz4w required;",
            &["Dk9Lz4w"],
        ),
        ("sasl.jaas.config=/* Wc8Rf3n", &["Wc8Rf3n"]),
        (
            "sasl.jaas.config=M required password='Ns6Hy2v\\\\",
            &["Ns6Hy2v"],
        ),
        // The end of a password continued without a backslash: a line of its own.
        (
            "sasl.jaas.config=M required username=u password=\"Lq4Vb\nXs7Pe9k\";",
            &["Lq4Vb", "Xs7Pe9k"],
        ),
        ("Jr5Tz8m-secret", &["Jr5Tz8m"]),
        ("\\u00Gq5Rw2y=x", &["Gq5Rw2y", "u00G"]),
    ];
    for (text, pieces) in cases {
        let e = ClientConfig::from_properties(text, "client.properties")
            .and_then(|c| c.security().map(|_| c))
            .expect_err(text);
        let shown = e.to_string();
        for piece in *pieces {
            assert!(!shown.contains(piece), "{text:?}: {shown}");
        }
        assert!(shown.contains("client.properties line"), "{shown}");
    }
    // A key name that looks like one is still quoted, to be fixed.
    let e = ClientConfig::from_properties("sasl.pasword=x", "f").unwrap_err();
    assert!(e.to_string().contains("\"sasl.pasword\""), "{e}");
    // The position is where the fault is.
    let e = ClientConfig::from_properties("sasl.jaas.config=M required user;", "f").unwrap_err();
    assert!(e.to_string().contains("character 12"), "{e}");
}

#[test]
fn every_listed_key_has_one_kind() {
    let mut seen = std::collections::BTreeSet::new();
    for k in known_keys() {
        assert!(seen.insert(k), "{k} listed twice");
        assert_ne!(key_kind(k), KeyKind::Unknown, "{k}");
        assert!(
            k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_'),
            "{k}"
        );
    }
    // Every accepted key is handled by set (none falls through to "unknown").
    for k in ACCEPTED_KEYS {
        let mut c = ClientConfig::new();
        if let Err(ConfigError::UnknownKey { .. }) = c.set(k, "x") {
            panic!("{k} is listed as accepted but not handled");
        }
    }
}

#[test]
fn apply_writes_bootstrap_and_timings() {
    let c = ClientConfig::from_properties(
        "bootstrap.servers=127.0.0.1:1,127.0.0.1:2\nretry.backoff.ms=50\nrequest.timeout.ms=3000\n",
        "f",
    )
    .unwrap();
    let opts = c.apply(LockOptions::new("x:1", "lock")).unwrap();
    opts.validate().unwrap();
    assert_eq!(opts.retry_backoff_bounds().0, Duration::from_millis(50));
    let e = ClientConfig::new().lock_options("l").unwrap_err();
    assert!(e.to_string().contains("bootstrap.servers is not set"));
}

proptest! {
    #[test]
    fn properties_never_panic(text in "\\PC{0,200}") {
        let _ = parse_properties(&text, "p");
        let _ = ClientConfig::from_properties(&text, "p").map(|c| c.security());
    }

    #[test]
    fn properties_of_awkward_characters_never_panic(text in "[a-z=:\\\\ \t\r\n#!u0-9\"';/*]{0,120}") {
        let _ = ClientConfig::from_properties(&text, "p").map(|c| c.security());
    }

    #[test]
    fn jaas_never_panics(text in "[A-Za-z=;\"'\\\\/* \n0-9]{0,120}") {
        let _ = parse_jaas(&text);
    }

    #[test]
    fn key_value_lines_round_trip(key in "[a-z][a-z.]{0,20}", value in "[ -~]{0,30}") {
        let escaped: String = value.chars().flat_map(|c| match c {
            '\\' => vec!['\\', '\\'],
            c => vec![c],
        }).collect();
        let leading = escaped.starts_with(' ');
        let line = if leading { format!("{key}=\\{escaped}") } else { format!("{key}={escaped}") };
        let parsed = parse_properties(&line, "p").unwrap();
        prop_assert_eq!(parsed, vec![(key, value)]);
    }
}

#[cfg(feature = "oauth")]
const OAUTH_MODULE: &str = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";

/// Kafka's OAUTHBEARER client settings (KIP-768, with the login handler class Kafka 4 names)
/// give an OAUTHBEARER Sasl whose Debug holds no secret.
#[cfg(feature = "oauth")]
#[test]
fn oauthbearer_from_kafka_client_settings() {
    let text = format!(
        "security.protocol=SASL_SSL\n\
         sasl.mechanism=OAUTHBEARER\n\
         sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler\n\
         sasl.oauthbearer.token.endpoint.url=https://idp.example/token\n\
         sasl.oauthbearer.sub.claim.name=client_id\n\
         sasl.login.refresh.window.factor=0.8\n\
         sasl.jaas.config={OAUTH_MODULE} required clientId=\"locker\" clientSecret=\"hunter2\" \
         scope=\"kafka\" extension_logicalCluster=\"lkc-1\";\n"
    );
    let c = ClientConfig::from_properties(&text, "f").unwrap();
    let s = c.security().unwrap();
    let sasl = s.sasl.as_ref().unwrap();
    assert_eq!(sasl.mechanism_name(), "OAUTHBEARER");
    let dbg = format!("{s:?}");
    assert!(
        dbg.contains("idp.example") && !dbg.contains("hunter2"),
        "{dbg}"
    );
    assert!(c
        .warnings()
        .iter()
        .any(|w| w.contains("sasl.login.refresh.window.factor")));

    // Kafka 4.1's keys (and librdkafka's) instead of the JAAS options.
    let mut c = ClientConfig::new();
    for (k, v) in [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "oidc"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            "https://idp.example/token",
        ),
        ("sasl.oauthbearer.client.id", "locker"),
        (
            "sasl.oauthbearer.client.credentials.client.secret",
            "hunter2",
        ),
    ] {
        c.set(k, v).unwrap();
    }
    assert!(c.security().is_ok());
}

#[cfg(feature = "oauth")]
#[test]
fn oauthbearer_conflicts() {
    let base = [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
    ];
    let with = |more: &[(&str, &str)]| {
        let mut v = base.to_vec();
        v.extend_from_slice(more);
        conflict(&v)
    };
    assert!(with(&[]).contains("sasl.oauthbearer.token.endpoint.url"));
    let m = with(&[("sasl.oauthbearer.token.endpoint.url", "https://idp/t")]);
    assert!(m.contains("clientId") && m.contains("clientSecret"), "{m}");
    let m = with(&[
        ("sasl.oauthbearer.token.endpoint.url", "http://idp/t"),
        ("sasl.oauthbearer.client.id", "a"),
        ("sasl.oauthbearer.client.secret", "hunter2"),
    ]);
    assert!(m.contains("https://") && !m.contains("hunter2"), "{m}");
    let jaas = format!("{OAUTH_MODULE} required clientId=\"a\" clientSecret=\"hunter2\";");
    let m = with(&[
        ("sasl.oauthbearer.token.endpoint.url", "https://idp/t"),
        ("sasl.jaas.config", &jaas),
        ("sasl.oauthbearer.client.id", "b"),
    ]);
    assert!(m.contains("give clientId; use one"), "{m}");
    let jaas = format!("{OAUTH_MODULE} required unsecuredLoginStringClaim_sub=\"x\";");
    let m = with(&[
        ("sasl.oauthbearer.token.endpoint.url", "https://idp/t"),
        ("sasl.jaas.config", &jaas),
    ]);
    assert!(m.contains("unsecured"), "{m}");
    let m = conflict(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.username", "u"),
        ("sasl.password", "p"),
        ("sasl.oauthbearer.token.endpoint.url", "https://idp/t"),
    ]);
    assert!(m.contains("not OAUTHBEARER"), "{m}");
    let mut c = ClientConfig::new();
    assert!(matches!(
        c.set(
            "sasl.login.callback.handler.class",
            "software.amazon.msk.auth.iam.IAMClientCallbackHandler"
        ),
        Err(ConfigError::Refused { .. })
    ));
}

/// `ssl.crypto.provider` picks the TLS provider of a build that has both; a name this build
/// lacks is refused when the settings are checked.
#[test]
fn tls_provider_setting() {
    let mut c = ClientConfig::new();
    assert!(c.set("ssl.crypto.provider", "openssl").is_err());
    c.set("security.protocol", "SSL").unwrap();
    c.set("ssl.crypto.provider", "ring").unwrap();
    let s = c.security().unwrap();
    assert_eq!(s.tls.as_ref().unwrap().provider, Some(TlsProvider::Ring));
    assert_eq!(
        s.validate().is_ok(),
        TlsProvider::compiled().contains(&TlsProvider::Ring)
    );
    c.set("ssl.crypto.provider", "Graviola").unwrap();
    let s = c.security().unwrap();
    assert_eq!(
        s.tls.as_ref().unwrap().provider,
        Some(TlsProvider::Graviola)
    );
}

#[test]
fn every_accepted_key_has_its_setter_in_the_same_order() {
    let table: Vec<&str> = PROPERTIES.iter().map(|(k, _)| *k).collect();
    assert_eq!(table, ACCEPTED_KEYS);
}
