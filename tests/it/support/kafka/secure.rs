//! A single Apache Kafka node with secured listeners, shared by the tests of the binary and
//! started on first use ([`secure_kafka`]), with a throwaway CA, its server and client
//! certificates, and the users below.
//!
//! | listener | protocol | what it checks |
//! |---|---|---|
//! | `SASL_SSL` | SASL_SSL | PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 |
//! | `SSL` | SSL, client certificate required | mTLS |
//! | `SASL_PLAINTEXT` | SASL_PLAINTEXT | SCRAM only (PLAIN is not enabled, for the "mechanism not enabled" error) |
//! | `REAUTH` | SASL_PLAINTEXT, `connections.max.reauth.ms` = [`REAUTH_MS`] | KIP-368 re-authentication |
//! | `PLAINTEXT` | PLAINTEXT (inter-broker, readiness probes) | listener mix-ups |
//!
//! The server certificate holds only the IP address 127.0.0.1 (an IP SAN), so dialling
//! `localhost` gives a hostname mismatch. The broker runs `StandardAuthorizer`; every user but
//! [`NOBODY`] is a super user, so [`NOBODY`] authenticates and is refused every group.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::scratch::ScratchDir;
use super::{KafkaCluster, KafkaOptions};

/// The PLAIN user (defined in the listener's JAAS configuration).
pub const PLAIN_USER: (&str, &str) = ("plain-user", "plain-secret-7fQ2");
/// The SCRAM-SHA-256 user.
pub const SCRAM256_USER: (&str, &str) = ("scram256-user", "scram256-secret-Kx9w");
/// The SCRAM-SHA-512 user.
pub const SCRAM512_USER: (&str, &str) = ("scram512-user", "scram512-secret-Zp4m");
/// A SCRAM-SHA-512 user with no ACLs at all.
pub const NOBODY: (&str, &str) = ("nobody", "nobody-secret-Qe3r");
/// The Common Name of the client certificate; its principal is `User:CN=<this>`.
pub const CLIENT_CN: &str = "kafka-lock-test-client";
/// `connections.max.reauth.ms` of the `REAUTH` listener.
pub const REAUTH_MS: u64 = 4000;

/// The secured node and the files a client needs.
pub struct SecureKafka {
    // Before `certs`: the JVM goes before the files it reads.
    cluster: KafkaCluster,
    certs: Certs,
}

/// PEM files of the throwaway PKI, in a directory that goes with them.
pub struct Certs {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// The client certificate (CN [`CLIENT_CN`]) and its PKCS#8 key.
    pub client_cert: PathBuf,
    /// See `client_cert`.
    pub client_key: PathBuf,
    /// A CA that signed nothing the broker uses, for the "unknown CA" error.
    pub other_ca: PathBuf,
    dir: ScratchDir,
}

impl Certs {
    fn generate() -> Certs {
        let dir = ScratchDir::new("pki");
        let path = |name: &str| dir.path().join(name);
        let write = |p: &Path, text: &str| {
            std::fs::write(p, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()))
        };
        let ca = make_ca("kafka-lock test CA");
        let other = make_ca("kafka-lock unrelated CA");

        let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
        server
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().expect("key");
        let server_cert = server.signed_by(&server_key, &ca).expect("sign server");

        let mut client = CertificateParams::new(Vec::<String>::new()).expect("params");
        client
            .distinguished_name
            .push(DnType::CommonName, CLIENT_CN);
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().expect("key");
        let client_cert = client.signed_by(&client_key, &ca).expect("sign client");

        write(&path("ca.pem"), &ca.pem());
        write(&path("other-ca.pem"), &other.pem());
        // Kafka's PEM key store: the PKCS#8 key and the chain in one file.
        write(
            &path("server.pem"),
            &format!(
                "{}{}{}",
                server_key.serialize_pem(),
                server_cert.pem(),
                ca.pem()
            ),
        );
        write(&path("client.pem"), &client_cert.pem());
        write(&path("client.key"), &client_key.serialize_pem());
        Certs {
            ca: path("ca.pem"),
            client_cert: path("client.pem"),
            client_key: path("client.key"),
            other_ca: path("other-ca.pem"),
            dir,
        }
    }

    fn server_keystore(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }
}

pub(super) fn make_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("self-sign CA")
}

/// The secured node shared by every test in this binary, started on first use.
///
/// # Panics
/// When Java or the jars are missing, or the broker does not become ready.
pub fn secure_kafka() -> &'static SecureKafka {
    static SHARED: OnceLock<SecureKafka> = OnceLock::new();
    SHARED.get_or_init(SecureKafka::start)
}

impl SecureKafka {
    fn start() -> SecureKafka {
        let certs = Certs::generate();
        let plain_jaas = format!(
            "org.apache.kafka.common.security.plain.PlainLoginModule required \
             user_{}=\"{}\";",
            PLAIN_USER.0, PLAIN_USER.1
        );
        let scram_jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
        let keystore = certs.server_keystore();
        let mut options = KafkaOptions::single_node()
            .listener("SASL_SSL", "SASL_SSL")
            .listener("SSL", "SSL")
            .listener("SASL_PLAINTEXT", "SASL_PLAINTEXT")
            .listener("REAUTH", "SASL_PLAINTEXT")
            .property("ssl.keystore.type", "PEM")
            .property("ssl.keystore.location", keystore.display())
            .property("ssl.truststore.type", "PEM")
            .property("ssl.truststore.location", certs.ca.display())
            .property("listener.name.ssl.ssl.client.auth", "required")
            .property(
                "authorizer.class.name",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            )
            // ANONYMOUS: the PLAINTEXT and CONTROLLER listeners (brokers, controllers and the
            // readiness probes).
            .property(
                "super.users",
                format!(
                    "User:ANONYMOUS;User:{};User:{};User:{};User:CN={CLIENT_CN}",
                    PLAIN_USER.0, SCRAM256_USER.0, SCRAM512_USER.0
                ),
            )
            .property(
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms",
                "SCRAM-SHA-256,SCRAM-SHA-512",
            )
            .property("listener.name.reauth.connections.max.reauth.ms", REAUTH_MS);
        for listener in ["sasl_ssl", "reauth"] {
            options = options
                .property(
                    &format!("listener.name.{listener}.sasl.enabled.mechanisms"),
                    "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                )
                .property(
                    &format!("listener.name.{listener}.plain.sasl.jaas.config"),
                    &plain_jaas,
                );
        }
        for listener in ["sasl_ssl", "reauth", "sasl_plaintext"] {
            for mech in ["scram-sha-256", "scram-sha-512"] {
                options = options.property(
                    &format!("listener.name.{listener}.{mech}.sasl.jaas.config"),
                    scram_jaas,
                );
            }
        }
        for (mech, (user, password)) in [
            ("SCRAM-SHA-256", SCRAM256_USER),
            ("SCRAM-SHA-512", SCRAM512_USER),
            ("SCRAM-SHA-512", NOBODY),
        ] {
            options = options.scram(&format!("{mech}=[name={user},password={password}]"));
        }
        let cluster = KafkaCluster::start(options);
        SecureKafka { cluster, certs }
    }

    /// The node.
    pub fn cluster(&self) -> &KafkaCluster {
        &self.cluster
    }

    /// `127.0.0.1:PORT` of listener `name` (`SASL_SSL`, `SSL`, `SASL_PLAINTEXT`, `REAUTH`), or
    /// of `PLAINTEXT`.
    pub fn addr(&self, name: &str) -> String {
        let node = &self.cluster.nodes()[0];
        if name == "PLAINTEXT" {
            node.addr()
        } else {
            node.listener_addr(name)
        }
    }

    /// The PKI's files.
    pub fn certs(&self) -> &Certs {
        &self.certs
    }

    /// The broker's log, for failure messages.
    pub fn log_tail(&self) -> String {
        self.cluster.nodes()[0].log_tail(60)
    }
}

/// How long a test waits for a secured acquire: the first one may include the broker's start.
pub const SECURE_WAIT: Duration = Duration::from_secs(60);
