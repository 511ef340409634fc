//! Secured connections on real Apache Kafka (support::kafka::secure): TLS, mTLS, SASL PLAIN and
//! SCRAM, re-authentication, and the error each misconfiguration gives.

use crate::support::kafka::secure::secure_kafka;

/// The secured node starts, and each listener accepts TCP connections.
#[test]
fn secure_node_starts() {
    let k = secure_kafka();
    for name in ["SASL_SSL", "SSL", "SASL_PLAINTEXT", "REAUTH", "PLAINTEXT"] {
        let addr = k.addr(name);
        std::net::TcpStream::connect(&addr)
            .unwrap_or_else(|e| panic!("{name} at {addr}: {e}\n{}", k.log_tail()));
    }
}
