//! DescribeGroups from outside the group: [`crate::LockOptions::describe`], the observers'
//! polls and a lock's look before joining. The analysis of the answer is sans-I/O
//! ([`crate::group_view::analyse`]).

use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::{ApiKey, GroupId};
use kafka_protocol::protocol::StrBytes;
use tracing::debug;

use super::ledger::{coordinator, Reach};
use crate::error::{Error, KafkaCode, Result};
use crate::group_view::{analyse, LockDescription};
use crate::membership::Broker;
use crate::wire::Response;

/// How often one description starts over after the coordinator moved or was loading.
const ATTEMPTS: u32 = 5;

/// Describes one group, remembering its coordinator between calls so that a poll costs exactly
/// one DescribeGroups request, on the coordinator's quick connection (the client's, shared
/// with its locks, when the lock was made from one).
pub(crate) struct GroupWatch {
    reach: Reach,
    lock: String,
    coordinator: Option<Broker>,
}

impl GroupWatch {
    pub(crate) fn new(reach: Reach, lock: &str) -> Self {
        GroupWatch {
            reach,
            lock: lock.to_owned(),
            coordinator: None,
        }
    }

    /// Forgets the coordinator, and closes the connections if they are the watch's own.
    pub(crate) fn close(&mut self) {
        self.coordinator = None;
        self.reach.close();
    }

    /// One description, looking the coordinator up again when it moved.
    pub(crate) async fn describe(&mut self) -> Result<LockDescription> {
        let mut backoff = self.reach.backoff();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.describe_once().await {
                Ok(d) => return Ok(d),
                Err(e) => {
                    // Looked up again: the coordinator may have moved. A connection that
                    // failed is replaced by the pool; a client's stays open for its locks.
                    self.coordinator = None;
                    if !e.is_retriable() || attempt >= ATTEMPTS {
                        return Err(e);
                    }
                    debug!(lock = %self.lock, error = %e, "describing the group failed; starting over");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    pub(crate) async fn describe_once(&mut self) -> Result<LockDescription> {
        let at = match &self.coordinator {
            Some(b) => b.clone(),
            None => {
                let b = coordinator(&self.lock, &self.reach).await?;
                self.coordinator = Some(b.clone());
                b
            }
        };
        let conn = self.reach.quick(&at, &self.lock).await?;
        let mut req = DescribeGroupsRequest::default();
        req.groups = vec![GroupId(StrBytes::from_string(self.lock.clone()))];
        let v = conn
            .versions()
            .get(ApiKey::DescribeGroups)
            .ok_or(Error::UnsupportedApi {
                api: crate::api::Api::of(ApiKey::DescribeGroups),
            })?;
        let resp = match self
            .reach
            .ask(&at, &self.lock, &conn, req.into(), v)
            .await?
        {
            Response::DescribeGroups(r) => r,
            other => {
                return Err(Error::Protocol(format!(
                    "expected DescribeGroups, got {:?}",
                    other.api_key()
                )))
            }
        };
        let Some(mut group) = resp
            .groups
            .into_iter()
            .find(|g| g.group_id.0.as_str() == self.lock)
        else {
            return Err(Error::Protocol(format!(
                "DescribeGroups did not describe group {:?}",
                self.lock
            )));
        };
        // Apache Kafka answers DescribeGroups v6+ for a group that does not exist (never used,
        // or deleted while empty) with GROUP_ID_NOT_FOUND: a lock nobody holds or waits for,
        // like the "Dead" state older versions report.
        if group.error_code == KafkaCode::GROUP_ID_NOT_FOUND.0 {
            group.error_code = 0;
            group.group_state = StrBytes::from_static_str("Dead");
            group.members.clear();
        }
        if group.error_code != 0 {
            return Err(Error::broker(
                ApiKey::DescribeGroups,
                KafkaCode(group.error_code),
                group.error_message.as_ref().map(|m| m.as_str()),
            ));
        }
        Ok(analyse(&self.lock, conn.peer(), &group))
    }
}
