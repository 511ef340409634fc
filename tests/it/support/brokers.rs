//! One test, two brokers: the lock tests that run on Apache Kafka (the reference) and on tansu
//! (an independent implementation whose coordinator differs where a lock cares) are written once
//! and called with each. docs/testing.md says which tests run on which broker, and why.

use std::time::Duration;

use super::kafka::{kafka, probe};

/// A shared test broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// `support::kafka::kafka()`: single-node Apache Kafka 4.1, initial rebalance delay 0.
    Apache,
    /// `support::broker()`: tansu, in memory.
    Tansu,
}

impl Broker {
    /// `host:port` for a client's bootstrap list; starts the broker on first use.
    pub fn bootstrap(self) -> String {
        match self {
            Broker::Apache => kafka().bootstrap(),
            Broker::Tansu => super::broker().bootstrap(),
        }
    }

    /// Creates a topic, independently of the lock under test, and returns once a client's
    /// Metadata request finds it.
    pub fn create_topic(self, name: &str, partitions: i32) {
        match self {
            Broker::Apache => probe::create_topic(&self.bootstrap(), name, partitions),
            Broker::Tansu => super::create_topic(&self.bootstrap(), name, partitions),
        }
    }

    /// Member ids of `group` as its coordinator describes them (DescribeGroups).
    pub async fn members(self, group: &str) -> Vec<String> {
        match probe::describe_group(&self.bootstrap(), group).await {
            Ok(g) => g.members.iter().map(|m| m.member_id.to_string()).collect(),
            Err(e) => panic!("describing {group} on {self:?}: {e}"),
        }
    }

    /// How long one rebalance may take on this broker, for the test settings of `lock.rs`
    /// (heartbeat `heartbeat`, session and rebalance timeouts 6 s).
    ///
    /// Apache Kafka (initial delay 0) completes a join phase as soon as every member has
    /// rejoined, and members hear of a rebalance at their next heartbeat: one interval, then a
    /// JoinGroup, a SyncGroup and a Heartbeat round trip. tansu parks every JoinGroup for about
    /// half the session timeout and followers' SyncGroups for up to 0.8 × session, retrying each
    /// second, and a generation can take several such rounds.
    pub fn rebalance_bound(self, heartbeat: Duration) -> Duration {
        match self {
            Broker::Apache => heartbeat + SLACK,
            Broker::Tansu => Duration::from_secs(40),
        }
    }
}

/// What a loaded two-core machine (compilers, several JVMs) may add to a handful of loopback
/// round trips and a task wake-up. Generous on purpose: bounds catch hangs and protocol-level
/// waits (a missed rebalance costs a 6 s rebalance timeout, a missed heartbeat a session), not
/// milliseconds.
pub const SLACK: Duration = Duration::from_secs(5);

/// Defines one test per named broker for `async fn $test(broker: Broker)`, in a module named
/// after the function: `on_brokers!(release_hands_over: apache, tansu)` gives the tests
/// `release_hands_over::apache` and `release_hands_over::tansu`.
macro_rules! on_brokers {
    ($test:ident: $($broker:ident),+) => {
        mod $test {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $broker() {
                    super::$test(crate::support::brokers::Broker::named(stringify!($broker))).await
                }
            )+
        }
    };
}
pub(crate) use on_brokers;

impl Broker {
    /// `apache` or `tansu`, as [`on_brokers!`] names them.
    pub fn named(name: &str) -> Broker {
        match name {
            "apache" => Broker::Apache,
            "tansu" => Broker::Tansu,
            other => panic!("no broker named {other}"),
        }
    }
}
