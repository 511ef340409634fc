//! The ledger's record format: the key is the lock's name, the value one of the four kinds below.
//! `docs/protocol.md` ("The ledger") has the byte layout; this is its only implementation.
//!
//! Every record carries the same header (who wrote it and when) so that each one can be read
//! alone; end and checkpoint records name the hold they belong to by the offset of its ACQUIRED
//! record, which is the hold's fencing token.
//!
//! Records are written by other processes and read back by everyone: the decoder is strict about
//! versions 1 and 2 (no unknown kinds, no bytes after the last field), checks every length against the
//! bytes that are left before allocating, and returns a [`RecordError`] for anything else.

use bytes::{BufMut, Bytes, BytesMut};

/// The highest value format this build writes and reads. Version 1 is a record of slot 0 (a
/// mutex, and every record of builds before semaphores had ledgers); version 2 appends the permit
/// slot and is written only for slots above 0, so a mutex's records keep version 1's bytes.
pub const RECORD_VERSION: u8 = 2;
/// Highest permit slot a record can name (`MAX_PERMITS - 1`).
pub const MAX_SLOT: u16 = crate::assign::MAX_PERMITS - 1;
/// Longest member id kept in a record (Kafka strings never exceed it).
pub const MAX_MEMBER_ID: usize = i16::MAX as usize;
/// Longest label kept in a record, as in member metadata.
pub const MAX_LABEL: usize = crate::assign::MAX_LABEL_LEN;
/// Longest host name kept in a record (DNS names are at most 253 bytes).
pub const MAX_HOST: usize = 255;
/// Longest loss explanation kept in a record.
pub const MAX_REASON: usize = 1024;
/// Longest checkpoint a record can carry: Kafka's offset metadata is a string of at most i16::MAX
/// bytes on the wire, whatever `offset.metadata.max.bytes` says.
pub const MAX_CHECKPOINT: usize = i16::MAX as usize;

/// What a record says happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKind {
    /// A hold began: written by the new holder before it uses the lock; its offset is the token.
    Acquired {
        /// The lease a renewal bought, `min(session, rebalance) − margin`, in milliseconds.
        lease_ms: u32,
    },
    /// The holder released the lock (written after its LeaveGroup was answered).
    Released {
        /// How long the hold lasted, on the holder's monotonic clock.
        held_ms: u64,
    },
    /// The hold ended without a release (written where the holder could still write).
    Lost {
        /// How long the hold lasted, on the holder's monotonic clock, up to its lease end.
        held_ms: u64,
        /// Why, as [`LossReason::as_str`](crate::membership::LossReason::as_str) names it.
        reason: String,
        /// The holder's explanation.
        detail: String,
    },
    /// The holder stored a checkpoint in the lock's group (a fenced OffsetCommit that the broker
    /// accepted); this copy outlives the group.
    Checkpoint {
        /// The value.
        value: String,
    },
}

impl RecordKind {
    fn code(&self) -> u8 {
        match self {
            RecordKind::Acquired { .. } => 1,
            RecordKind::Released { .. } => 2,
            RecordKind::Lost { .. } => 3,
            RecordKind::Checkpoint { .. } => 4,
        }
    }

    /// `acquired`, `released`, `lost` or `checkpoint`.
    pub fn name(&self) -> &'static str {
        match self {
            RecordKind::Acquired { .. } => "acquired",
            RecordKind::Released { .. } => "released",
            RecordKind::Lost { .. } => "lost",
            RecordKind::Checkpoint { .. } => "checkpoint",
        }
    }
}

/// One ledger record's value, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRecord {
    /// The writer's wall clock when it wrote the record, in milliseconds since the Unix epoch.
    pub unix_ms: i64,
    /// The offset of the hold's ACQUIRED record; -1 in an ACQUIRED record itself.
    pub hold: i64,
    /// The group generation of the hold when the record was written.
    pub generation: i32,
    /// The holder's member id.
    pub member_id: String,
    /// The holder's label, if it gave one.
    pub label: Option<String>,
    /// The holder's host name, if known.
    pub host: Option<String>,
    /// The holder's process id, if known.
    pub pid: Option<u32>,
    /// The hold's permit slot (always 0 for a mutex): tokens increase within each slot.
    pub slot: u16,
    /// What happened.
    pub kind: RecordKind,
}

/// Why a record's value could not be read. `what` names the field of the layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The value ended inside a field (or was empty or null).
    #[error("ledger record truncated while reading {what}")]
    Truncated {
        /// The field.
        what: &'static str,
    },
    /// A format version this build does not read (written by a newer kafka-lock).
    #[error("ledger record format version {0}; this build reads versions 1 to {RECORD_VERSION}")]
    UnsupportedVersion(u8),
    /// A kind byte that the format does not define.
    #[error("ledger record of unknown kind {0}")]
    UnknownKind(u8),
    /// A length above the field's bound.
    #[error("{what} is {len} bytes long, more than the allowed {max}")]
    TooLong {
        /// The field.
        what: &'static str,
        /// The length found.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A text field that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field.
        what: &'static str,
    },
    /// A number outside the range the field allows.
    #[error("{what} has invalid value {value}")]
    OutOfRange {
        /// The field.
        what: &'static str,
        /// The value found.
        value: i64,
    },
    /// Bytes after the last field.
    #[error("{len} unexpected bytes after the end of the ledger record")]
    TrailingBytes {
        /// How many.
        len: usize,
    },
}

const NONE_LEN: u16 = u16::MAX;

impl LedgerRecord {
    /// The value bytes. Over-long text is cut at a character boundary to its bound: every field
    /// comes from local settings or from the broker, and a ledger record must always be writable.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64 + self.member_id.len());
        let version = if self.slot == 0 { 1 } else { 2 };
        b.put_u8(version);
        b.put_u8(self.kind.code());
        b.put_i64(self.unix_ms);
        b.put_i64(self.hold);
        b.put_i32(self.generation);
        put_str(&mut b, Some(&self.member_id), MAX_MEMBER_ID);
        put_str(&mut b, self.label.as_deref(), MAX_LABEL);
        put_str(&mut b, self.host.as_deref(), MAX_HOST);
        b.put_i32(self.pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(-1));
        match &self.kind {
            RecordKind::Acquired { lease_ms } => b.put_u32(*lease_ms),
            RecordKind::Released { held_ms } => b.put_u64(*held_ms),
            RecordKind::Lost {
                held_ms,
                reason,
                detail,
            } => {
                b.put_u64(*held_ms);
                put_str(&mut b, Some(reason), MAX_REASON);
                put_str(&mut b, Some(detail), MAX_REASON);
            }
            RecordKind::Checkpoint { value } => {
                put_str(&mut b, Some(value), MAX_CHECKPOINT);
            }
        }
        if version >= 2 {
            b.put_u16(self.slot);
        }
        b.freeze()
    }

    /// Reads a record's value.
    pub fn decode(value: &[u8]) -> Result<LedgerRecord, RecordError> {
        let mut r = Reader(value);
        let version = r.u8("the format version")?;
        if !(1..=RECORD_VERSION).contains(&version) {
            return Err(RecordError::UnsupportedVersion(version));
        }
        let code = r.u8("the kind")?;
        if !(1..=4).contains(&code) {
            return Err(RecordError::UnknownKind(code));
        }
        let unix_ms = r.i64("the time")?;
        let hold = r.i64("the hold's offset")?;
        // An ACQUIRED record is the hold; every other record names one.
        let hold_ok = if code == 1 { hold == -1 } else { hold >= 0 };
        if !hold_ok {
            return Err(RecordError::OutOfRange {
                what: "the hold's offset",
                value: hold,
            });
        }
        let generation = r.i32("the generation")?;
        if generation < -1 {
            return Err(RecordError::OutOfRange {
                what: "the generation",
                value: i64::from(generation),
            });
        }
        let member_id = r
            .str(MAX_MEMBER_ID, "the member id")?
            .ok_or(RecordError::OutOfRange {
                what: "the member id",
                value: -1,
            })?;
        let label = r.str(MAX_LABEL, "the label")?;
        let host = r.str(MAX_HOST, "the host")?;
        let pid = match r.i32("the pid")? {
            -1 => None,
            p if p > 0 => Some(p as u32),
            p => {
                return Err(RecordError::OutOfRange {
                    what: "the pid",
                    value: i64::from(p),
                })
            }
        };
        let kind = match code {
            1 => RecordKind::Acquired {
                lease_ms: r.u32("the lease")?,
            },
            2 => RecordKind::Released {
                held_ms: r.u64("the hold's length")?,
            },
            3 => RecordKind::Lost {
                held_ms: r.u64("the hold's length")?,
                reason: r.required_str(MAX_REASON, "the loss reason")?,
                detail: r.required_str(MAX_REASON, "the loss detail")?,
            },
            _ => RecordKind::Checkpoint {
                value: r.required_str(MAX_CHECKPOINT, "the checkpoint")?,
            },
        };
        let slot = if version >= 2 {
            let slot = r.u16("the permit slot")?;
            if slot > MAX_SLOT {
                return Err(RecordError::OutOfRange {
                    what: "the permit slot",
                    value: i64::from(slot),
                });
            }
            slot
        } else {
            0
        };
        if !r.0.is_empty() {
            return Err(RecordError::TrailingBytes { len: r.0.len() });
        }
        Ok(LedgerRecord {
            unix_ms,
            hold,
            generation,
            member_id,
            label,
            host,
            pid,
            slot,
            kind,
        })
    }
}

fn put_str(b: &mut BytesMut, s: Option<&str>, max: usize) {
    match s {
        None => b.put_u16(NONE_LEN),
        Some(s) => {
            let s = cut(s, max);
            // Every bound is below u16::MAX, so the length fits and never reads as "none".
            b.put_u16(s.len() as u16);
            b.put_slice(s.as_bytes());
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], RecordError> {
        if n > self.0.len() {
            return Err(RecordError::Truncated { what });
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], RecordError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, RecordError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, RecordError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, RecordError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, RecordError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    /// A u16 length (0xFFFF: none) and UTF-8; the bound is checked before the bytes are read.
    fn str(&mut self, max: usize, what: &'static str) -> Result<Option<String>, RecordError> {
        let len = u16::from_be_bytes(self.array(what)?);
        if len == NONE_LEN {
            return Ok(None);
        }
        let len = usize::from(len);
        if len > max {
            return Err(RecordError::TooLong { what, len, max });
        }
        let raw = self.take(len, what)?;
        std::str::from_utf8(raw)
            .map(|s| Some(s.to_owned()))
            .map_err(|_| RecordError::InvalidUtf8 { what })
    }

    fn required_str(&mut self, max: usize, what: &'static str) -> Result<String, RecordError> {
        self.str(max, what)?
            .ok_or(RecordError::OutOfRange { what, value: -1 })
    }
}
