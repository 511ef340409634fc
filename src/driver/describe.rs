//! DescribeGroups from outside the group: [`crate::LockOptions::describe`] and the observers'
//! polls. The analysis of the answer is sans-I/O ([`crate::describe::analyse`]).

use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::{ApiKey, GroupId};
use kafka_protocol::protocol::StrBytes;
use tracing::debug;

use super::conn::Connection;
use super::ledger::{coordinator, Reach};
use crate::describe::{analyse, LockDescription};
use crate::error::{Error, KafkaCode, Result};
use crate::wire::Response;

/// How often one description starts over after the coordinator moved or was loading.
const ATTEMPTS: u32 = 5;

/// Describes one group, keeping its connection to the coordinator between calls so that a poll
/// costs exactly one DescribeGroups request.
pub(crate) struct GroupWatch {
    reach: Reach,
    lock: String,
    coordinator: Option<Connection>,
}

impl GroupWatch {
    pub(crate) fn new(reach: Reach, lock: &str) -> Self {
        GroupWatch {
            reach,
            lock: lock.to_owned(),
            coordinator: None,
        }
    }

    /// Closes the connection to the coordinator, if one is open.
    pub(crate) fn close(&mut self) {
        if let Some(c) = self.coordinator.take() {
            c.close();
        }
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
                    self.close();
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
        if self.coordinator.is_none() {
            let first = self.reach.connect_any().await?;
            let addr = match coordinator(&first, &self.lock, &self.reach).await {
                Ok(a) => a,
                Err(e) => {
                    first.close();
                    return Err(e);
                }
            };
            let conn = if addr == first.peer() {
                first
            } else {
                first.close();
                Connection::connect(&addr, &self.reach.conn).await?
            };
            self.coordinator = Some(conn);
        }
        let Some(conn) = &self.coordinator else {
            return Err(Error::Closed);
        };
        let mut req = DescribeGroupsRequest::default();
        req.groups = vec![GroupId(StrBytes::from_string(self.lock.clone()))];
        let resp = match conn.request(req).await? {
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
