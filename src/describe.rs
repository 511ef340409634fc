//! What a lock looks like from outside: who holds it, who waits, in which generation, at which
//! coordinator ([`LockOptions::describe`]).
//!
//! A recipe on top of the lock, as elections are: it reads the group with FindCoordinator and
//! DescribeGroups (through the lock's client when it has one) and never joins it, so describing
//! never causes a rebalance. Reading the answer is sans-I/O, in [`crate::group_view`], where the
//! lock's own look before joining finds it too.

pub use crate::group_view::{
    LedgerSummary, LockDescription, LockHolder, LockMember, LockProtocol, LockState,
};

use crate::driver::describe::GroupWatch;
use crate::error::Result;
use crate::ledger::{Checkpoint, CheckpointSource};
use crate::lock::LockOptions;

impl LockOptions {
    /// Who holds the lock, who waits (in queue order), the generation, the coordinator and the
    /// protocol, read with FindCoordinator and DescribeGroups from outside the group, so looking
    /// never causes a rebalance. With a ledger topic, the ledger's last hold is added (and the
    /// holder's ledger token); that reads the whole retained ledger, as [`LockOptions::history`]
    /// does. Members whose bytes cannot be read are listed as undecodable, never trusted.
    ///
    /// Options made by [`Client::lock`](crate::Client::lock) use the client's connections.
    pub async fn describe(&self) -> Result<LockDescription> {
        self.validate()?;
        let mut watch = GroupWatch::new(self.reach(), self.name());
        let d = watch.describe().await;
        watch.close();
        let d = d?;
        Ok(match self.ledger() {
            Some(topic) => {
                let history = self.history().await?;
                let checkpoint = match self.committed_checkpoint().await? {
                    Some(c) => Some(c),
                    None => history
                        .last_checkpoint()
                        .map(|(value, token, _)| Checkpoint {
                            value: value.to_owned(),
                            token,
                            source: CheckpointSource::Ledger,
                        }),
                };
                d.with_ledger(topic, history.last_hold().cloned(), checkpoint)
            }
            None => d,
        })
    }
}
