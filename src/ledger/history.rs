//! A lock's history, folded from its ledger records: one [`Hold`] per ACQUIRED record, with how
//! it ended. Pure: records in, history out; [`crate::driver`] reads the records.

use std::collections::BTreeMap;

use super::record::{LedgerRecord, RecordError, RecordKind};

/// How a hold ended, as far as the ledger knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldEnd {
    /// The holder released the lock.
    Released {
        /// When it wrote the RELEASED record (its wall clock, ms since the Unix epoch).
        unix_ms: i64,
        /// How long the hold lasted, on the holder's monotonic clock.
        held_ms: u64,
    },
    /// The hold ended without a release, and the holder could still say so.
    Lost {
        /// When it wrote the LOST record.
        unix_ms: i64,
        /// How long the hold lasted, up to the lease end.
        held_ms: u64,
        /// `lease_expired`, `fenced`, `reassigned`, `revoked`, `fatal` or `ledger`.
        reason: String,
        /// The holder's explanation.
        detail: String,
    },
    /// No end record, and a later hold of the same permit slot began: this one ended before then
    /// without a word (its holder was killed, or cut off from the cluster for good).
    Silent {
        /// The token of the next hold.
        next_token: i64,
        /// When the next hold began, if its ACQUIRED record is readable.
        before_unix_ms: Option<i64>,
    },
    /// An ACQUIRED record whose append was retried: the same member and generation appended
    /// again at `by`, and only that one can have been acknowledged as the hold.
    Retried {
        /// The token of the retried append.
        by: i64,
    },
    /// No end record and no later hold of its slot: the hold is still running, or its holder
    /// died and nobody has taken its permit since.
    #[default]
    Open,
}

impl HoldEnd {
    /// `released`, `lost`, `silent`, `retried` or `open`.
    pub fn name(&self) -> &'static str {
        match self {
            HoldEnd::Released { .. } => "released",
            HoldEnd::Lost { .. } => "lost",
            HoldEnd::Silent { .. } => "silent",
            HoldEnd::Retried { .. } => "retried",
            HoldEnd::Open => "open",
        }
    }

    /// When the end was recorded, if it was.
    pub fn unix_ms(&self) -> Option<i64> {
        match self {
            HoldEnd::Released { unix_ms, .. } | HoldEnd::Lost { unix_ms, .. } => Some(*unix_ms),
            _ => None,
        }
    }

    /// The hold's length as its holder measured it, if it recorded an end.
    pub fn held_ms(&self) -> Option<u64> {
        match self {
            HoldEnd::Released { held_ms, .. } | HoldEnd::Lost { held_ms, .. } => Some(*held_ms),
            _ => None,
        }
    }
}

/// One hold of the lock: an ACQUIRED record and what followed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hold {
    /// The fencing token: the offset of the ACQUIRED record.
    pub token: i64,
    /// The permit slot held (always 0 for a mutex); tokens increase within each slot.
    pub slot: u16,
    /// The group generation when the hold began (or of the first later record, if the ACQUIRED
    /// record is gone).
    pub generation: i32,
    /// The holder's member id.
    pub member_id: String,
    /// Its label.
    pub label: Option<String>,
    /// Its host name.
    pub host: Option<String>,
    /// Its process id.
    pub pid: Option<u32>,
    /// When the hold began (the holder's wall clock); `None` when the ACQUIRED record is no
    /// longer in the ledger (retention) and only later records of the hold are.
    pub acquired_unix_ms: Option<i64>,
    /// The lease length the holder used, from the ACQUIRED record.
    pub lease_ms: Option<u32>,
    /// How it ended.
    pub end: HoldEnd,
    /// The last checkpoint stored during this hold, and when.
    pub checkpoint: Option<(String, i64)>,
}

/// A record of the lock that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unreadable {
    /// Its offset (or the first offset of a batch that could not be read).
    pub offset: i64,
    /// Why.
    pub error: String,
}

/// A lock's holds, oldest first, as read from the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct History {
    /// The holds, by token.
    pub holds: Vec<Hold>,
    /// Records of this lock (or batches of the topic) that could not be read.
    pub unreadable: Vec<Unreadable>,
    /// The first offset read (the partition's log start when the history was read).
    pub first_offset: i64,
    /// The offset after the last one read (the partition's end when the history was read).
    pub end_offset: i64,
}

impl History {
    /// The holds that were running at or after `unix_ms`: those that began then or later, those
    /// whose recorded end is then or later, and those with no recorded end unless a later hold
    /// began before then.
    pub fn since(&self, unix_ms: i64) -> Vec<&Hold> {
        self.holds
            .iter()
            .filter(|h| {
                if h.acquired_unix_ms.is_some_and(|t| t >= unix_ms) {
                    return true;
                }
                match &h.end {
                    HoldEnd::Released { unix_ms: t, .. } | HoldEnd::Lost { unix_ms: t, .. } => {
                        *t >= unix_ms
                    }
                    HoldEnd::Silent { before_unix_ms, .. } => {
                        before_unix_ms.is_none_or(|t| t >= unix_ms)
                    }
                    HoldEnd::Retried { .. } => false,
                    HoldEnd::Open => true,
                }
            })
            .collect()
    }

    /// The most recent hold that is a hold (not a retried append).
    pub fn last_hold(&self) -> Option<&Hold> {
        self.holds
            .iter()
            .rev()
            .find(|h| !matches!(h.end, HoldEnd::Retried { .. }))
    }

    /// The last checkpoint any hold stored: its value, the hold's token and when.
    pub fn last_checkpoint(&self) -> Option<(&str, i64, i64)> {
        self.holds.iter().rev().find_map(|h| {
            h.checkpoint
                .as_ref()
                .map(|(v, t)| (v.as_str(), h.token, *t))
        })
    }
}

/// Builds the history from one lock's records in offset order: `(offset, value)` per record,
/// already filtered by key. Values that do not decode are listed, not fatal; end records of a
/// hold whose ACQUIRED record is not among them (retention) start a hold of their own.
pub fn fold<'a>(
    records: impl IntoIterator<Item = (i64, Option<&'a [u8]>)>,
    first_offset: i64,
    end_offset: i64,
) -> History {
    let mut holds: BTreeMap<i64, Hold> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for (offset, value) in records {
        let record = match value.map(LedgerRecord::decode) {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                unreadable.push(Unreadable {
                    offset,
                    error: e.to_string(),
                });
                continue;
            }
            None => {
                unreadable.push(Unreadable {
                    offset,
                    error: RecordError::Truncated { what: "the value" }.to_string(),
                });
                continue;
            }
        };
        let token = match record.kind {
            RecordKind::Acquired { .. } => offset,
            _ => record.hold,
        };
        if matches!(record.kind, RecordKind::Acquired { .. }) && holds.contains_key(&token) {
            // Offsets are unique in a partition; a second ACQUIRED at one offset can only come
            // from a reader fed the same record twice.
            continue;
        }
        let hold = holds.entry(token).or_insert_with(|| Hold {
            token,
            slot: record.slot,
            generation: record.generation,
            member_id: record.member_id.clone(),
            label: record.label.clone(),
            host: record.host.clone(),
            pid: record.pid,
            acquired_unix_ms: None,
            lease_ms: None,
            end: HoldEnd::Open,
            checkpoint: None,
        });
        match record.kind {
            RecordKind::Acquired { lease_ms } => {
                hold.acquired_unix_ms = Some(record.unix_ms);
                hold.lease_ms = Some(lease_ms);
            }
            RecordKind::Released { held_ms } if hold.end == HoldEnd::Open => {
                hold.end = HoldEnd::Released {
                    unix_ms: record.unix_ms,
                    held_ms,
                };
            }
            RecordKind::Lost {
                held_ms,
                reason,
                detail,
            } if hold.end == HoldEnd::Open => {
                hold.end = HoldEnd::Lost {
                    unix_ms: record.unix_ms,
                    held_ms,
                    reason,
                    detail,
                };
            }
            RecordKind::Checkpoint { value } => hold.checkpoint = Some((value, record.unix_ms)),
            // A second end record for one hold: the first one stands.
            _ => {}
        }
    }
    let mut holds: Vec<Hold> = holds.into_values().collect();
    // Holds of different slots overlap by design: a hold without an end record ended silently
    // only if a later hold of its own slot began.
    let mut next_of_slot: BTreeMap<u16, usize> = BTreeMap::new();
    let mut next_index = vec![None; holds.len()];
    for i in (0..holds.len()).rev() {
        next_index[i] = next_of_slot.insert(holds[i].slot, i);
    }
    for i in 0..holds.len() {
        if holds[i].end != HoldEnd::Open {
            continue;
        }
        let Some(next) = next_index[i].map(|n| &holds[n]) else {
            continue;
        };
        let end = if next.member_id == holds[i].member_id && next.generation == holds[i].generation
        {
            HoldEnd::Retried { by: next.token }
        } else {
            HoldEnd::Silent {
                next_token: next.token,
                before_unix_ms: next.acquired_unix_ms,
            }
        };
        holds[i].end = end;
    }
    History {
        holds,
        unreadable,
        first_offset,
        end_offset,
    }
}

/// A lock's last checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Checkpoint {
    /// The value the holder stored.
    pub value: String,
    /// The token of the hold that stored it.
    pub token: i64,
    /// Where it was read: the lock's group (its committed offset metadata, the fenced original),
    /// or the ledger's copy, when the group no longer has it (deleted, or its offsets expired).
    pub source: CheckpointSource,
}

impl Checkpoint {
    /// A checkpoint with these parts (the lock's own come from [`LockGuard::last_checkpoint`](crate::LockGuard::last_checkpoint)
    /// and [`LockOptions::last_checkpoint`](crate::LockOptions::last_checkpoint)).
    pub fn new(value: impl Into<String>, token: i64, source: CheckpointSource) -> Self {
        Checkpoint {
            value: value.into(),
            token,
            source,
        }
    }
}

/// Where a [`Checkpoint`] was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointSource {
    /// The lock's group: what the broker accepted from the current holder of that hold.
    Group,
    /// The ledger's CHECKPOINT record (the group no longer has one).
    Ledger,
}
