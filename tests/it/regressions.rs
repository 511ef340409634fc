//! Regression tests for what the fault suite (tests/it/fault, RELIABILITY.md) found in the
//! library, each reproduced here without faults or timing luck.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_lock::{Error, LockOptions};
use kafka_protocol::messages::metadata_response::{
    MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiKey, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::fake_broker;

/// A broker that goes away while a consumer-mode acquire checks the lock topic on it (in the
/// fault suite, a controlled shutdown of one broker of three; RELIABILITY.md) must not fail
/// the acquire: the check is made again on a fresh connection and the acquire goes on waiting.
/// Before the fix the acquire returned the connection error at once.
#[tokio::test]
async fn a_connection_lost_during_the_topic_check_does_not_fail_the_acquire() {
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let fake = fake_broker::start(Arc::new(
        move |api: ApiKey, version: i16, _body: &mut BytesMut| match api {
            ApiKey::Metadata => {
                // The first check dies with its connection; later ones find a lock topic.
                if count.fetch_add(1, Ordering::SeqCst) == 0 {
                    return None;
                }
                let mut topic = MetadataResponseTopic::default();
                topic.name = Some(TopicName(StrBytes::from_static_str("lock-topic")));
                topic.partitions = vec![MetadataResponsePartition::default()];
                let mut r = MetadataResponse::default();
                r.topics = vec![topic];
                Some(fake_broker::encode(&r, version))
            }
            // Joining is not what this is about: the acquire waits until its deadline.
            _ => None,
        },
    ))
    .await;
    let err = LockOptions::new(fake.addr.to_string(), "lock")
        .consumer_topic("lock-topic")
        .acquire(Some(Duration::from_secs(2)))
        .await
        .expect_err("the fake never lets anyone join");
    assert!(
        matches!(err, Error::NotAcquired { .. }),
        "the acquire failed instead of waiting: {err}"
    );
    assert!(
        asked.load(Ordering::SeqCst) >= 2,
        "the topic check was not made again"
    );
}
