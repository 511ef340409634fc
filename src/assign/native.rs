//! The native lock protocol: member metadata, assignment, and the sticky-then-FIFO assignor.
//!
//! Byte layouts are in `docs/protocol.md`; keep the two in step.

use std::cmp::Reverse;

use bytes::{BufMut, Bytes, BytesMut};

use super::reader::Reader;
use super::{put_u16_str, truncate_utf8, PeerDataError};

/// JoinGroup `protocol_type` of the native lock. Deliberately not `"consumer"`: the broker then
/// never treats the group as a consumer group (no topic, no offsets semantics, no KIP-848
/// upgrade), and consumers cannot join it by mistake (INCONSISTENT_GROUP_PROTOCOL).
pub const PROTOCOL_TYPE: &str = "kafka-lock";

/// JoinGroup protocol name of the native assignor. It carries the format's major version, so a
/// future incompatible format can be offered alongside it and the broker picks the one every
/// member supports during a rolling upgrade.
pub const NATIVE_PROTOCOL: &str = "sticky-fifo-v1";

/// Major version of the native formats written and read by this build. Another major version is
/// rejected with [`PeerDataError::UnsupportedVersion`].
pub const NATIVE_MAJOR_VERSION: u8 = 1;

/// Highest minor version written by this build. A lock with one permit and no ledger writes
/// minor 0, byte for byte as builds before permits did; minor 1 appends the permit fields, minor 2
/// the ledger topic after them. Readers accept any minor of their major; fields a newer minor
/// appends are skipped (see `docs/protocol.md`, "Versioning").
pub const NATIVE_MINOR_VERSION: u8 = 2;

/// Longest ledger topic name, in bytes: Kafka's limit on topic names.
pub const MAX_LEDGER_TOPIC_LEN: usize = 249;

/// Longest label, in UTF-8 bytes. Longer labels are cut at a character boundary when encoding.
pub const MAX_LABEL_LEN: usize = 256;

/// Longest member id, in UTF-8 bytes: Kafka strings cannot be longer, so no broker-issued id is
/// ever cut.
pub const MAX_MEMBER_ID_LEN: usize = i16::MAX as usize;

/// Most permits a lock may have. Every member's assignment lists every holder, so the leader's
/// SyncGroup grows with members × permits; this bound keeps it far below a broker's default
/// 1 MiB request limit for groups of a few dozen members with short labels.
pub const MAX_PERMITS: u16 = 1024;

const METADATA_MAGIC: [u8; 2] = *b"km";
const ASSIGNMENT_MAGIC: [u8; 2] = *b"ka";
/// Label length meaning "no label" (not a valid length: it is above [`MAX_LABEL_LEN`]).
const NO_LABEL: u16 = 0xFFFF;

const METADATA_FLAG_HOLDS: u8 = 0x01;
const METADATA_KNOWN_FLAGS: u8 = METADATA_FLAG_HOLDS;
const ASSIGNMENT_FLAG_HOLDER: u8 = 0x01;
const ASSIGNMENT_KNOWN_FLAGS: u8 = ASSIGNMENT_FLAG_HOLDER;
/// Smallest encoding of a holder after the first in a minor-1 assignment: slot, empty member id,
/// no label.
const MIN_OTHER_HOLDER_LEN: usize = 6;

/// What a member puts in JoinGroup's `protocols[].metadata` for [`NATIVE_PROTOCOL`].
///
/// It must only change when the member's lock state changes: Apache Kafka rebalances a stable
/// group when a member rejoins with different metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMetadata {
    /// The member holds a permit right now (its lease has not ended).
    pub holds: bool,
    /// Generation of the member's first completed join (its place in the queue); -1 if it has
    /// never completed one, which puts it at the back.
    pub first_joined_generation: i32,
    /// Generation whose SyncGroup granted the member its current, uninterrupted hold; -1 when it
    /// does not hold. The leader uses it to choose between conflicting claims.
    pub holder_generation: i32,
    /// Free text shown to waiters (host, pid, job); at most `MAX_LABEL_LEN` bytes.
    pub label: Option<String>,
    /// How many permits the member expects the lock to have (1 = a mutex); every member of a
    /// group must agree. 1 to `MAX_PERMITS`.
    pub permits: u16,
    /// The permit slot the member holds (`0..permits`); 0 when it does not hold.
    pub slot: u16,
    /// The ledger topic the member takes its tokens from; `None` for generation tokens. Every
    /// member of a group must agree (a member of a build before ledgers counts as `None`).
    pub ledger: Option<String>,
}

/// A permit holder as named in every member's assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's member id.
    pub member_id: String,
    /// The label from the holder's own metadata.
    pub label: Option<String>,
    /// The generation of this assignment: with `member_id`, the holder's fencing token.
    pub generation: i32,
    /// The permit slot it holds, `0..permits`; always 0 for a mutex.
    pub slot: u16,
}

/// What the leader hands each member in SyncGroup for [`NATIVE_PROTOCOL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeAssignment {
    /// The holder of the lowest occupied slot, if anyone holds; for a mutex, the holder.
    pub holder: Option<Holder>,
    /// Members ahead of the recipient: 0 for every holder, 1 for the next in line, and so on;
    /// -1 if unknown (the recipient's metadata was rejected, or it disagrees on the permits).
    pub position: i32,
    /// Members in the generation, including any whose metadata was rejected.
    pub members: i32,
    /// The group's number of permits as the leader decided it (1 when the leader predates
    /// permits). A member that expects another number must not take part.
    pub permits: u16,
    /// The other holders, by ascending slot (each slot at most once, none below
    /// `holder`'s). They share `holder`'s generation; empty without a holder.
    pub other_holders: Vec<Holder>,
    /// The group's ledger topic as the leader decided it (`None` when the leader predates
    /// ledgers). A member configured otherwise must not take part.
    pub ledger: Option<String>,
}

impl NativeAssignment {
    /// Every holder of this generation, by ascending slot.
    pub fn holders(&self) -> impl Iterator<Item = &Holder> {
        self.holder.iter().chain(&self.other_holders)
    }
}

/// The leader's plan for one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativePlan {
    /// Member id of the holder of the lowest occupied slot, if any member could hold.
    pub holder: Option<String>,
    /// Every holder as `(slot, member id)`, by ascending slot.
    pub holders: Vec<(u16, String)>,
    /// The group's permits: those of the most recent claimant, else of the first member in FIFO
    /// order, else 1.
    pub permits: u16,
    /// One encoded [`NativeAssignment`] per member, in the order the members were given.
    pub assignments: Vec<(String, Bytes)>,
    /// Members whose metadata could not be decoded, for the leader to log. They still get an
    /// assignment (so they can report who holds) but can never be chosen as holder.
    pub rejected: Vec<(String, PeerDataError)>,
    /// Members that expect another number of permits than the group's, with that number. They
    /// get an assignment (naming the group's permits, so they can report the mismatch) but can
    /// never hold.
    pub mismatched: Vec<(String, u16)>,
    /// The group's ledger topic: that of the most recent claimant, else of the first member in
    /// FIFO order, else none.
    pub ledger: Option<String>,
    /// Members that use another ledger setting than the group's, with theirs. They can never
    /// hold, and while any is in the generation nobody new is named holder (see
    /// [`assign_native`]).
    pub ledger_mismatched: Vec<(String, Option<String>)>,
}

/// Reads magic and version and returns the minor version.
fn read_header(
    r: &mut Reader<'_>,
    magic: [u8; 2],
    what: &'static str,
    magic_what: &'static str,
    version_what: &'static str,
) -> Result<u8, PeerDataError> {
    if r.remaining() == 0 {
        return Err(PeerDataError::Empty { what });
    }
    let found = r.take(2, magic_what)?;
    if found != magic {
        return Err(PeerDataError::BadMagic {
            what,
            found: u16::from_be_bytes([found[0], found[1]]),
        });
    }
    let major = r.u8(version_what)?;
    if major != NATIVE_MAJOR_VERSION {
        return Err(PeerDataError::UnsupportedVersion(major));
    }
    r.u8(version_what)
}

/// Whether this build knows every field and flag bit of `minor`.
fn knows_minor(minor: u8) -> bool {
    minor <= NATIVE_MINOR_VERSION
}

/// Flags and trailing bytes are strict for minors this build knows and lenient for newer ones.
fn check_flags(flags: u8, known: u8, minor: u8, what: &'static str) -> Result<(), PeerDataError> {
    if knows_minor(minor) && flags & !known != 0 {
        return Err(PeerDataError::UnknownFlags { what, flags });
    }
    Ok(())
}

fn check_end(r: &Reader<'_>, minor: u8, what: &'static str) -> Result<(), PeerDataError> {
    if knows_minor(minor) && r.remaining() != 0 {
        return Err(PeerDataError::TrailingBytes {
            what,
            len: r.remaining(),
        });
    }
    Ok(())
}

fn read_generation(r: &mut Reader<'_>, what: &'static str) -> Result<i32, PeerDataError> {
    let g = r.i32(what)?;
    if g < -1 {
        return Err(PeerDataError::OutOfRange {
            what,
            value: i64::from(g),
        });
    }
    Ok(g)
}

fn read_label(r: &mut Reader<'_>, what: &'static str) -> Result<Option<String>, PeerDataError> {
    match r.u16(what)? {
        NO_LABEL => Ok(None),
        len => r.utf8(usize::from(len), MAX_LABEL_LEN, what).map(Some),
    }
}

fn read_permits(r: &mut Reader<'_>, what: &'static str) -> Result<u16, PeerDataError> {
    let n = r.u16(what)?;
    if n == 0 || n > MAX_PERMITS {
        return Err(PeerDataError::OutOfRange {
            what,
            value: i64::from(n),
        });
    }
    Ok(n)
}

fn read_slot(r: &mut Reader<'_>, permits: u16, what: &'static str) -> Result<u16, PeerDataError> {
    let s = r.u16(what)?;
    if s >= permits {
        return Err(PeerDataError::OutOfRange {
            what,
            value: i64::from(s),
        });
    }
    Ok(s)
}

fn read_ledger(r: &mut Reader<'_>, what: &'static str) -> Result<Option<String>, PeerDataError> {
    match r.u16(what)? {
        NO_LABEL => Ok(None),
        0 => Err(PeerDataError::OutOfRange { what, value: 0 }),
        len => r
            .utf8(usize::from(len), MAX_LEDGER_TOPIC_LEN, what)
            .map(Some),
    }
}

fn put_ledger(buf: &mut BytesMut, ledger: Option<&str>) {
    match ledger {
        Some(t) => put_u16_str(buf, t, MAX_LEDGER_TOPIC_LEN),
        None => buf.put_u16(NO_LABEL),
    }
}

fn put_label(buf: &mut BytesMut, label: Option<&str>) {
    match label {
        Some(l) => put_u16_str(buf, l, MAX_LABEL_LEN),
        None => buf.put_u16(NO_LABEL),
    }
}

fn label_len(label: Option<&str>) -> usize {
    label.map_or(0, |l| truncate_utf8(l, MAX_LABEL_LEN).len())
}

impl MemberMetadata {
    /// Encodes at `NATIVE_MAJOR_VERSION`: minor 0 for a mutex (one permit, slot 0) without a
    /// ledger, exactly as builds before permits; minor 2 with a ledger; minor 1 otherwise. A
    /// label longer than `MAX_LABEL_LEN` bytes is cut at a character boundary.
    pub fn encode(&self) -> Bytes {
        let minor = if self.ledger.is_some() {
            2
        } else {
            u8::from(self.permits != 1 || self.slot != 0)
        };
        let ledger_len = self.ledger.as_ref().map_or(0, |t| 2 + t.len());
        let mut buf = BytesMut::with_capacity(19 + label_len(self.label.as_deref()) + ledger_len);
        buf.put_slice(&METADATA_MAGIC);
        buf.put_u8(NATIVE_MAJOR_VERSION);
        buf.put_u8(minor);
        buf.put_u8(if self.holds { METADATA_FLAG_HOLDS } else { 0 });
        buf.put_i32(self.first_joined_generation);
        buf.put_i32(self.holder_generation);
        put_label(&mut buf, self.label.as_deref());
        if minor >= 1 {
            buf.put_u16(self.permits);
            buf.put_u16(self.slot);
        }
        if minor >= 2 {
            put_ledger(&mut buf, self.ledger.as_deref());
        }
        buf.freeze()
    }

    /// Decodes metadata sent by another member. Minor 0 (builds before permits) means one
    /// permit, slot 0; below minor 2 (builds before ledgers), no ledger.
    pub fn decode(data: &[u8]) -> Result<Self, PeerDataError> {
        const WHAT: &str = "member metadata";
        let mut r = Reader::new(data);
        let minor = read_header(
            &mut r,
            METADATA_MAGIC,
            WHAT,
            "member metadata magic",
            "member metadata version",
        )?;
        let flags = r.u8("member metadata flags")?;
        check_flags(flags, METADATA_KNOWN_FLAGS, minor, WHAT)?;
        let first_joined_generation = read_generation(&mut r, "first_joined_generation")?;
        let holder_generation = read_generation(&mut r, "holder_generation")?;
        let label = read_label(&mut r, "member label")?;
        let (permits, slot) = if minor >= 1 {
            let permits = read_permits(&mut r, "member permits")?;
            (permits, read_slot(&mut r, permits, "member permit slot")?)
        } else {
            (1, 0)
        };
        let ledger = if minor >= 2 {
            read_ledger(&mut r, "member ledger topic")?
        } else {
            None
        };
        check_end(&r, minor, WHAT)?;
        Ok(Self {
            holds: flags & METADATA_FLAG_HOLDS != 0,
            first_joined_generation,
            holder_generation,
            label,
            permits,
            slot,
            ledger,
        })
    }
}

impl NativeAssignment {
    /// Encodes at `NATIVE_MAJOR_VERSION`: minor 0 for one permit with at most a holder in slot
    /// 0 and no ledger, exactly as builds before permits; minor 2 with a ledger; minor 1
    /// otherwise. Over-long member ids and labels
    /// are cut at a character boundary (see `MAX_MEMBER_ID_LEN`, `MAX_LABEL_LEN`); without a
    /// holder, `other_holders` is not written, and their generations are not written at all
    /// (they are the holder's).
    pub fn encode(&self) -> Bytes {
        let minor = if self.ledger.is_some() {
            2
        } else {
            u8::from(
                self.permits != 1
                    || !self.other_holders.is_empty()
                    || self.holder.as_ref().is_some_and(|h| h.slot != 0),
            )
        };
        let id_and_label = |h: &Holder| {
            truncate_utf8(&h.member_id, MAX_MEMBER_ID_LEN).len() + label_len(h.label.as_deref())
        };
        let holder_len = self.holder.as_ref().map_or(0, |h| 8 + id_and_label(h));
        let others_len: usize = self
            .other_holders
            .iter()
            .map(|h| MIN_OTHER_HOLDER_LEN + id_and_label(h))
            .sum();
        let ledger_len = self.ledger.as_ref().map_or(0, |t| 2 + t.len());
        let mut buf = BytesMut::with_capacity(13 + holder_len + 6 + others_len + ledger_len);
        buf.put_slice(&ASSIGNMENT_MAGIC);
        buf.put_u8(NATIVE_MAJOR_VERSION);
        buf.put_u8(minor);
        buf.put_u8(if self.holder.is_some() {
            ASSIGNMENT_FLAG_HOLDER
        } else {
            0
        });
        buf.put_i32(self.position);
        buf.put_i32(self.members);
        if let Some(h) = &self.holder {
            buf.put_i32(h.generation);
            put_u16_str(&mut buf, &h.member_id, MAX_MEMBER_ID_LEN);
            put_label(&mut buf, h.label.as_deref());
        }
        if minor >= 1 {
            buf.put_u16(self.permits);
            match &self.holder {
                Some(h) => {
                    buf.put_u16(h.slot);
                    // At most MAX_PERMITS holders can be valid; the count is a u16 either way.
                    let n = self.other_holders.len().min(usize::from(u16::MAX));
                    buf.put_u16(n as u16);
                    for o in &self.other_holders[..n] {
                        buf.put_u16(o.slot);
                        put_u16_str(&mut buf, &o.member_id, MAX_MEMBER_ID_LEN);
                        put_label(&mut buf, o.label.as_deref());
                    }
                }
                None => buf.put_u16(0),
            }
        }
        if minor >= 2 {
            put_ledger(&mut buf, self.ledger.as_deref());
        }
        buf.freeze()
    }

    /// Decodes the assignment the leader sent this member. Empty input (a leader that left this
    /// member out) is `PeerDataError::Empty`. Minor 0 (a leader before permits) means one
    /// permit, the holder in slot 0; below minor 2 (a leader before ledgers), no ledger.
    pub fn decode(data: &[u8]) -> Result<Self, PeerDataError> {
        const WHAT: &str = "assignment";
        let mut r = Reader::new(data);
        let minor = read_header(
            &mut r,
            ASSIGNMENT_MAGIC,
            WHAT,
            "assignment magic",
            "assignment version",
        )?;
        let flags = r.u8("assignment flags")?;
        check_flags(flags, ASSIGNMENT_KNOWN_FLAGS, minor, WHAT)?;
        let position = r.i32("assignment position")?;
        let members = r.i32("assignment member count")?;
        if members < 0 {
            return Err(PeerDataError::OutOfRange {
                what: "assignment member count",
                value: i64::from(members),
            });
        }
        if position < -1 || position >= members {
            return Err(PeerDataError::OutOfRange {
                what: "assignment position",
                value: i64::from(position),
            });
        }
        let mut holder = if flags & ASSIGNMENT_FLAG_HOLDER != 0 {
            let generation = r.i32("holder generation")?;
            let id_len = r.u16("holder member id")?;
            let member_id = r.utf8(usize::from(id_len), MAX_MEMBER_ID_LEN, "holder member id")?;
            let label = read_label(&mut r, "holder label")?;
            Some(Holder {
                member_id,
                label,
                generation,
                slot: 0,
            })
        } else {
            None
        };
        let mut permits = 1;
        let mut other_holders = Vec::new();
        if minor >= 1 {
            permits = read_permits(&mut r, "assignment permits")?;
            if let Some(h) = &mut holder {
                h.slot = read_slot(&mut r, permits, "holder permit slot")?;
            }
            let count = r.u16("other holder count")?;
            let allowed = match &holder {
                Some(h) => permits - 1 - h.slot,
                None => 0,
            };
            if count > allowed {
                return Err(PeerDataError::OutOfRange {
                    what: "other holder count",
                    value: i64::from(count),
                });
            }
            if usize::from(count) * MIN_OTHER_HOLDER_LEN > r.remaining() {
                return Err(PeerDataError::Truncated {
                    what: "other holders",
                });
            }
            if let Some(first) = &holder {
                let mut last = first.slot;
                for _ in 0..count {
                    let slot = read_slot(&mut r, permits, "other holder permit slot")?;
                    if slot <= last {
                        return Err(PeerDataError::OutOfRange {
                            what: "other holder permit slot (slots must ascend)",
                            value: i64::from(slot),
                        });
                    }
                    last = slot;
                    let id_len = r.u16("other holder member id")?;
                    let member_id = r.utf8(
                        usize::from(id_len),
                        MAX_MEMBER_ID_LEN,
                        "other holder member id",
                    )?;
                    let label = read_label(&mut r, "other holder label")?;
                    other_holders.push(Holder {
                        member_id,
                        label,
                        generation: first.generation,
                        slot,
                    });
                }
            }
        }
        let ledger = if minor >= 2 {
            read_ledger(&mut r, "assignment ledger topic")?
        } else {
            None
        };
        check_end(&r, minor, WHAT)?;
        Ok(Self {
            holder,
            position,
            members,
            permits,
            other_holders,
            ledger,
        })
    }
}

/// FIFO order: members that completed a join by the generation they first did so, then those
/// that never did; ties by member id bytes. The input index makes the order total even for
/// duplicate ids, so the plan is deterministic.
fn fifo_key<'a>(
    index: usize,
    member_id: &'a str,
    md: &MemberMetadata,
) -> (bool, i32, &'a [u8], usize) {
    (
        md.first_joined_generation < 0,
        md.first_joined_generation,
        member_id.as_bytes(),
        index,
    )
}

/// The native assignor, run by the group leader between JoinGroup and SyncGroup.
///
/// `members` is the leader's JoinGroup response as `(member_id, group_instance_id, metadata)`;
/// the instance id does not affect the native order. `generation` is that response's generation
/// and becomes every holder's token.
///
/// Rules (rationale in `docs/protocol.md`):
/// 1. Members whose metadata does not decode are listed in `NativePlan::rejected`, can never
///    hold, and get position -1.
/// 2. **Permits.** The group's number of permits is that of the most recent claimant (highest
///    `holder_generation`, then FIFO order), else that of the first member in FIFO order.
///    Members that expect another number are listed in `NativePlan::mismatched`, can never
///    hold, and get position -1.
/// 3. **Ledger.** The group's ledger topic (or none) is chosen the same way, among the members
///    that agree on the permits. Members with another setting are listed in
///    `NativePlan::ledger_mismatched`, can never hold, and get position -1; while any is in
///    the generation, claimants keep their slots but no free slot is handed out, so nobody new
///    holds until every member agrees (the mismatched ones fail and leave when they read their
///    assignment).
/// 4. **Sticky.** Claimants in order of `holder_generation` descending, then FIFO, each keep
///    the slot they claim unless an earlier one in that order took it; a claimant that lost its
///    slot gets none in this generation.
/// 5. **FIFO.** Free slots, lowest first, go to the other members in FIFO order: the earliest
///    `first_joined_generation` (≥ 0) first; members that never completed a join (-1) come last;
///    ties by member id, bytewise.
///
/// Every member's assignment names the same holders and carries the member's own position.
pub fn assign_native(generation: i32, members: &[(String, Option<String>, Bytes)]) -> NativePlan {
    let mut rejected = Vec::new();
    let mut eligible: Vec<(usize, &str, MemberMetadata)> = Vec::with_capacity(members.len());
    for (i, (id, _, bytes)) in members.iter().enumerate() {
        match MemberMetadata::decode(bytes) {
            Ok(md) => eligible.push((i, id.as_str(), md)),
            Err(e) => rejected.push((id.clone(), e)),
        }
    }
    eligible.sort_by(|a, b| fifo_key(a.0, a.1, &a.2).cmp(&fifo_key(b.0, b.1, &b.2)));

    // Claimants, most recent grant first; `eligible` is in FIFO order, so a stable sort keeps
    // FIFO order among equals.
    let mut claimants: Vec<usize> = (0..eligible.len())
        .filter(|&p| eligible[p].2.holds)
        .collect();
    claimants.sort_by_key(|&p| Reverse(eligible[p].2.holder_generation));
    let permits = claimants
        .first()
        .or(if eligible.is_empty() { None } else { Some(&0) })
        .map_or(1, |&p| eligible[p].2.permits);

    let mut mismatched = Vec::new();
    let mut agrees = vec![true; eligible.len()];
    for (p, (_, id, md)) in eligible.iter().enumerate() {
        if md.permits != permits {
            agrees[p] = false;
            mismatched.push(((*id).to_owned(), md.permits));
        }
    }

    // Tokens from a ledger and from generations (or from two ledgers) are unrelated numbers, so
    // holders must never be named under two settings. The most recent claimant's setting wins,
    // as it is the one the resource has been seeing tokens of.
    let ledger = claimants
        .iter()
        .copied()
        .chain(0..eligible.len())
        .find(|&p| agrees[p])
        .and_then(|p| eligible[p].2.ledger.clone());
    let mut ledger_mismatched = Vec::new();
    for (p, (_, id, md)) in eligible.iter().enumerate() {
        if agrees[p] && md.ledger != ledger {
            agrees[p] = false;
            ledger_mismatched.push(((*id).to_owned(), md.ledger.clone()));
        }
    }

    // slot -> position in `eligible`
    let mut slots: Vec<Option<usize>> = vec![None; usize::from(permits)];
    let mut lost_claim = vec![false; eligible.len()];
    for &p in &claimants {
        if !agrees[p] {
            continue;
        }
        let s = usize::from(eligible[p].2.slot);
        if slots[s].is_none() {
            slots[s] = Some(p);
        } else {
            lost_claim[p] = true;
        }
    }
    let holding = |slots: &[Option<usize>], p: usize| slots.contains(&Some(p));
    // While members disagree about the ledger, no new hold begins under either setting.
    let mut free = (0..slots.len())
        .filter(|&s| slots[s].is_none() && ledger_mismatched.is_empty())
        .collect::<Vec<_>>();
    free.reverse();
    for p in 0..eligible.len() {
        if free.is_empty() {
            break;
        }
        if agrees[p] && !lost_claim[p] && !holding(&slots, p) {
            let s = free.pop().expect("not empty");
            slots[s] = Some(p);
        }
    }

    let mut positions = vec![-1i32; members.len()];
    let holders: Vec<Holder> = slots
        .iter()
        .enumerate()
        .filter_map(|(s, p)| {
            let (index, id, md) = &eligible[(*p)?];
            positions[*index] = 0;
            Some(Holder {
                member_id: (*id).to_owned(),
                label: md.label.clone(),
                generation,
                slot: s as u16,
            })
        })
        .collect();
    let waiters = (0..eligible.len()).filter(|&p| agrees[p] && !holding(&slots, p));
    for (rank, p) in waiters.enumerate() {
        positions[eligible[p].0] = i32::try_from(rank + 1).unwrap_or(i32::MAX);
    }

    let member_count = i32::try_from(members.len()).unwrap_or(i32::MAX);
    let mut holders_iter = holders.iter().cloned();
    let holder = holders_iter.next();
    let other_holders: Vec<Holder> = holders_iter.collect();
    let assignments = members
        .iter()
        .zip(&positions)
        .map(|((id, _, _), &position)| {
            let a = NativeAssignment {
                holder: holder.clone(),
                position,
                members: member_count,
                permits,
                other_holders: other_holders.clone(),
                ledger: ledger.clone(),
            };
            (id.clone(), a.encode())
        })
        .collect();

    NativePlan {
        holder: holder.map(|h| h.member_id),
        holders: holders.into_iter().map(|h| (h.slot, h.member_id)).collect(),
        permits,
        assignments,
        rejected,
        mismatched,
        ledger,
        ledger_mismatched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn md(holds: bool, first: i32, holder_gen: i32, label: Option<&str>) -> MemberMetadata {
        MemberMetadata {
            holds,
            first_joined_generation: first,
            holder_generation: holder_gen,
            label: label.map(str::to_owned),
            permits: 1,
            slot: 0,
            ledger: None,
        }
    }

    fn member(id: &str, m: &MemberMetadata) -> (String, Option<String>, Bytes) {
        (id.to_owned(), None, m.encode())
    }

    fn decoded(plan: &NativePlan) -> Vec<(String, NativeAssignment)> {
        plan.assignments
            .iter()
            .map(|(id, b)| {
                (
                    id.clone(),
                    NativeAssignment::decode(b).expect("own encoding"),
                )
            })
            .collect()
    }

    fn position_of(plan: &NativePlan, id: &str) -> i32 {
        decoded(plan)
            .into_iter()
            .find(|(m, _)| m == id)
            .map(|(_, a)| a.position)
            .expect("member present")
    }

    #[test]
    fn metadata_layout_matches_the_documented_table() {
        let bytes = md(true, 7, 9, Some("h:1")).encode();
        assert_eq!(
            &bytes[..],
            &[
                b'k', b'm', 1, 0,    // magic, major, minor
                0x01, // flags: holds
                0, 0, 0, 7, // first_joined_generation
                0, 0, 0, 9, // holder_generation
                0, 3, b'h', b':', b'1', // label
            ][..]
        );
        let no_label = md(false, -1, -1, None).encode();
        assert_eq!(
            &no_label[..],
            &[b'k', b'm', 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..]
        );
    }

    #[test]
    fn assignment_layout_matches_the_documented_table() {
        let a = NativeAssignment {
            holder: Some(Holder {
                member_id: "m-1".into(),
                label: None,
                generation: 4,
                slot: 0,
            }),
            position: 2,
            members: 3,
            permits: 1,
            other_holders: Vec::new(),
            ledger: None,
        };
        assert_eq!(
            &a.encode()[..],
            &[
                b'k', b'a', 1, 0,    // magic, major, minor
                0x01, // flags: holder present
                0, 0, 0, 2, // position
                0, 0, 0, 3, // members
                0, 0, 0, 4, // holder generation
                0, 3, b'm', b'-', b'1', // member id
                0xff, 0xff, // no label
            ][..]
        );
        let none = NativeAssignment {
            holder: None,
            position: -1,
            members: 1,
            permits: 1,
            other_holders: Vec::new(),
            ledger: None,
        };
        assert_eq!(
            &none.encode()[..],
            &[b'k', b'a', 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1][..]
        );
    }

    #[test]
    fn empty_label_is_distinct_from_no_label() {
        let m = md(false, 1, -1, Some(""));
        assert_eq!(MemberMetadata::decode(&m.encode()), Ok(m));
    }

    #[test]
    fn overlong_label_is_cut_at_a_char_boundary() {
        let long = "é".repeat(200); // 400 bytes
        let m = md(false, 1, -1, Some(&long));
        let back = MemberMetadata::decode(&m.encode()).expect("decodes");
        let label = back.label.expect("label kept");
        assert_eq!(label.len(), MAX_LABEL_LEN);
        assert!(long.starts_with(&label));
    }

    #[test]
    fn typed_errors_for_bad_headers() {
        assert_eq!(
            MemberMetadata::decode(b""),
            Err(PeerDataError::Empty {
                what: "member metadata"
            })
        );
        assert!(matches!(
            MemberMetadata::decode(b"xx\x01\x00"),
            Err(PeerDataError::BadMagic { found: 0x7878, .. })
        ));
        // Metadata bytes are not an assignment and vice versa.
        assert!(matches!(
            NativeAssignment::decode(&md(false, 1, -1, None).encode()),
            Err(PeerDataError::BadMagic { .. })
        ));
        let mut v2 = md(false, 1, -1, None).encode().to_vec();
        v2[2] = 2;
        assert_eq!(
            MemberMetadata::decode(&v2),
            Err(PeerDataError::UnsupportedVersion(2))
        );
    }

    #[test]
    fn known_minor_is_strict_about_flags_and_trailing_bytes() {
        let good = md(true, 1, 2, Some("l")).encode().to_vec();
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            MemberMetadata::decode(&trailing),
            Err(PeerDataError::TrailingBytes {
                what: "member metadata",
                len: 1
            })
        );
        let mut flags = good.clone();
        flags[4] |= 0x80;
        assert!(matches!(
            MemberMetadata::decode(&flags),
            Err(PeerDataError::UnknownFlags { flags: 0x81, .. })
        ));
    }

    #[test]
    fn newer_minor_may_append_fields_and_flags() {
        let mut m3 = md(true, 1, 2, Some("l"));
        m3.permits = 3;
        m3.slot = 2;
        m3.ledger = Some("lg".into());
        let mut newer = m3.encode().to_vec();
        newer[3] = NATIVE_MINOR_VERSION + 1;
        newer[4] |= 0x40;
        newer.extend_from_slice(b"future field");
        assert_eq!(MemberMetadata::decode(&newer), Ok(m3));

        let mut a = NativeAssignment {
            holder: None,
            position: 0,
            members: 1,
            permits: 2,
            other_holders: Vec::new(),
            ledger: Some("lg".into()),
        }
        .encode()
        .to_vec();
        a[3] = 9;
        a.extend_from_slice(&[1, 2, 3]);
        assert!(NativeAssignment::decode(&a).is_ok());
    }

    #[test]
    fn a_minor_0_reader_sees_the_permit_fields_as_a_newer_minor() {
        // What a build before permits does with minor 1 bytes: it reads the minor 0 prefix and
        // skips the rest, so it sees the lowest-slot holder and its own position.
        let a = NativeAssignment {
            holder: Some(Holder {
                member_id: "m-1".into(),
                label: None,
                generation: 4,
                slot: 0,
            }),
            position: 2,
            members: 3,
            permits: 2,
            other_holders: vec![Holder {
                member_id: "m-2".into(),
                label: Some("x".into()),
                generation: 4,
                slot: 1,
            }],
            ledger: None,
        }
        .encode();
        assert_eq!(a[3], 1);
        let mut as_minor_0 = NativeAssignment::decode(&a).unwrap();
        as_minor_0.permits = 1;
        as_minor_0.other_holders.clear();
        let prefix = as_minor_0.encode();
        assert_eq!(prefix[3], 0);
        assert_eq!(&a[4..prefix.len()], &prefix[4..]);
    }

    #[test]
    fn out_of_range_numbers_are_rejected() {
        assert!(matches!(
            MemberMetadata::decode(&md(false, -2, -1, None).encode()),
            Err(PeerDataError::OutOfRange {
                what: "first_joined_generation",
                value: -2
            })
        ));
        // `what` names the field found wrong: a negative count is the count's fault, whatever
        // the position.
        for (position, members, what) in [
            (-2, 3, "assignment position"),
            (3, 3, "assignment position"),
            (0, -1, "assignment member count"),
            (-1, -1, "assignment member count"),
            (0, 0, "assignment position"),
        ] {
            let a = NativeAssignment {
                holder: None,
                position,
                members,
                permits: 1,
                other_holders: Vec::new(),
                ledger: None,
            };
            assert!(
                matches!(
                    NativeAssignment::decode(&a.encode()),
                    Err(PeerDataError::OutOfRange { what: w, .. }) if w == what
                ),
                "position {position} of {members}"
            );
        }
    }

    #[test]
    fn overlong_lengths_are_rejected_before_reading() {
        // Label length 257 with only a few bytes behind it: TooLong, not Truncated.
        let mut bytes = md(false, 1, -1, None).encode().to_vec();
        let n = bytes.len();
        bytes[n - 2..].copy_from_slice(&257u16.to_be_bytes());
        assert_eq!(
            MemberMetadata::decode(&bytes),
            Err(PeerDataError::TooLong {
                what: "member label",
                len: 257,
                max: MAX_LABEL_LEN
            })
        );
        // Member id length 0x8000 > i16::MAX.
        let mut a = NativeAssignment {
            holder: Some(Holder {
                member_id: "x".into(),
                label: None,
                generation: 1,
                slot: 0,
            }),
            position: 0,
            members: 1,
            permits: 1,
            other_holders: Vec::new(),
            ledger: None,
        }
        .encode()
        .to_vec();
        a[17..19].copy_from_slice(&0x8000u16.to_be_bytes());
        assert!(matches!(
            NativeAssignment::decode(&a),
            Err(PeerDataError::TooLong {
                what: "holder member id",
                ..
            })
        ));
    }

    #[test]
    fn invalid_utf8_label_is_rejected() {
        let mut bytes = md(false, 1, -1, Some("ab")).encode().to_vec();
        let n = bytes.len();
        bytes[n - 1] = 0xff;
        assert_eq!(
            MemberMetadata::decode(&bytes),
            Err(PeerDataError::InvalidUtf8 {
                what: "member label"
            })
        );
    }

    #[test]
    fn every_prefix_of_valid_bytes_is_a_typed_error() {
        let m = md(true, 3, 5, Some("host-a pid 42")).encode();
        for cut in 0..m.len() {
            assert!(MemberMetadata::decode(&m[..cut]).is_err(), "prefix {cut}");
        }
        let a = NativeAssignment {
            holder: Some(Holder {
                member_id: "consumer-1-abc".into(),
                label: Some("host-a".into()),
                generation: 12,
                slot: 0,
            }),
            position: 1,
            members: 4,
            permits: 1,
            other_holders: Vec::new(),
            ledger: None,
        }
        .encode();
        for cut in 0..a.len() {
            assert!(NativeAssignment::decode(&a[..cut]).is_err(), "prefix {cut}");
        }
    }

    #[test]
    fn sticky_holder_survives_a_newcomer_with_a_smaller_id() {
        let members = [
            member("m-zzz", &md(true, 4, 4, Some("holder"))),
            member("m-aaa", &md(false, -1, -1, None)),
        ];
        let plan = assign_native(5, &members);
        assert_eq!(plan.holder.as_deref(), Some("m-zzz"));
        assert!(plan.rejected.is_empty());
        let got = decoded(&plan);
        assert_eq!(got[0].0, "m-zzz");
        assert_eq!(got[0].1.position, 0);
        assert_eq!(got[1].1.position, 1);
        for (_, a) in &got {
            assert_eq!(
                a.holder,
                Some(Holder {
                    member_id: "m-zzz".into(),
                    label: Some("holder".into()),
                    generation: 5,
                    slot: 0,
                })
            );
            assert_eq!(a.members, 2);
        }
    }

    #[test]
    fn sticky_holder_beats_earlier_joiners() {
        let members = [
            member("a", &md(false, 1, -1, None)),
            member("b", &md(true, 3, 3, None)),
        ];
        assert_eq!(assign_native(4, &members).holder.as_deref(), Some("b"));
    }

    #[test]
    fn fifo_without_a_holder() {
        let members = [
            member("e-never", &md(false, -1, -1, None)),
            member("d", &md(false, 7, -1, None)),
            member("c", &md(false, 2, -1, None)),
            member("b", &md(false, 2, -1, None)),
            member("a-never", &md(false, -1, -1, None)),
            member("z", &md(false, 0, -1, None)),
        ];
        let plan = assign_native(8, &members);
        assert_eq!(plan.holder.as_deref(), Some("z"));
        let order: Vec<(&str, i32)> = ["z", "b", "c", "d", "a-never", "e-never"]
            .iter()
            .map(|id| (*id, position_of(&plan, id)))
            .collect();
        assert_eq!(
            order,
            vec![
                ("z", 0),
                ("b", 1),
                ("c", 2),
                ("d", 3),
                ("a-never", 4),
                ("e-never", 5)
            ]
        );
        // Assignments keep the input order.
        let ids: Vec<&str> = plan.assignments.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["e-never", "d", "c", "b", "a-never", "z"]);
    }

    #[test]
    fn member_id_ties_are_bytewise() {
        // 'B' (0x42) sorts before 'a' (0x61) bytewise, unlike a case-insensitive order.
        let members = [
            member("a", &md(false, 1, -1, None)),
            member("B", &md(false, 1, -1, None)),
        ];
        assert_eq!(assign_native(2, &members).holder.as_deref(), Some("B"));
    }

    #[test]
    fn several_claimants_highest_holder_generation_wins() {
        let members = [
            member("stale", &md(true, 1, 3, None)),
            member("fresh", &md(true, 2, 6, Some("fresh"))),
            member("waiter", &md(false, 0, -1, None)),
        ];
        let plan = assign_native(7, &members);
        assert_eq!(plan.holder.as_deref(), Some("fresh"));
        assert_eq!(position_of(&plan, "fresh"), 0);
        // The losing claimant queues in plain FIFO order.
        assert_eq!(position_of(&plan, "waiter"), 1);
        assert_eq!(position_of(&plan, "stale"), 2);
    }

    #[test]
    fn several_claimants_tie_breaks() {
        // Same holder generation: smaller first_joined_generation wins.
        let members = [
            member("a", &md(true, 5, 6, None)),
            member("b", &md(true, 4, 6, None)),
        ];
        assert_eq!(assign_native(7, &members).holder.as_deref(), Some("b"));
        // ... with -1 counting as last, not smallest.
        let members = [
            member("a", &md(true, -1, 6, None)),
            member("b", &md(true, 4, 6, None)),
        ];
        assert_eq!(assign_native(7, &members).holder.as_deref(), Some("b"));
        // All equal: smallest member id.
        let members = [
            member("b", &md(true, 4, 6, None)),
            member("a", &md(true, 4, 6, None)),
        ];
        assert_eq!(assign_native(7, &members).holder.as_deref(), Some("a"));
    }

    #[test]
    fn rejected_metadata_never_holds() {
        let members = [
            (
                "garbage".to_owned(),
                None,
                Bytes::from_static(b"\x00\x00\x00"),
            ),
            ("empty".to_owned(), None, Bytes::new()),
            member("late", &md(false, 9, -1, Some("late"))),
        ];
        let plan = assign_native(10, &members);
        assert_eq!(plan.holder.as_deref(), Some("late"));
        let rejected: Vec<&str> = plan.rejected.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(rejected, ["garbage", "empty"]);
        assert!(matches!(plan.rejected[1].1, PeerDataError::Empty { .. }));
        let got = decoded(&plan);
        assert_eq!(got.len(), 3);
        for (id, a) in &got {
            assert_eq!(
                a.holder.as_ref().map(|h| h.member_id.as_str()),
                Some("late")
            );
            assert_eq!(a.members, 3);
            let want = if id == "late" { 0 } else { -1 };
            assert_eq!(a.position, want, "{id}");
        }
    }

    #[test]
    fn nobody_eligible_means_no_holder() {
        let members = [("x".to_owned(), None, Bytes::from_static(b"junk"))];
        let plan = assign_native(1, &members);
        assert_eq!(plan.holder, None);
        let got = decoded(&plan);
        assert_eq!(got[0].1.holder, None);
        assert_eq!(got[0].1.position, -1);
        let empty = assign_native(1, &[]);
        assert_eq!(empty.holder, None);
        assert!(empty.assignments.is_empty());
    }

    #[test]
    fn plan_is_independent_of_member_order() {
        let a = member("a", &md(false, 3, -1, None));
        let b = member("b", &md(false, 1, -1, None));
        let c = member("c", &md(false, -1, -1, None));
        let p1 = assign_native(4, &[a.clone(), b.clone(), c.clone()]);
        let p2 = assign_native(4, &[c, a, b]);
        assert_eq!(p1.holder, p2.holder);
        let mut s1 = p1.assignments.clone();
        let mut s2 = p2.assignments.clone();
        s1.sort();
        s2.sort();
        assert_eq!(s1, s2);
    }

    fn arb_metadata() -> impl Strategy<Value = MemberMetadata> {
        (
            any::<bool>(),
            -1i32..=i32::MAX,
            -1i32..=i32::MAX,
            // At most 64 chars of at most 4 bytes: always within MAX_LABEL_LEN.
            proptest::option::of("\\PC{0,64}"),
            prop_oneof![Just(1u16), 1u16..=MAX_PERMITS],
        )
            .prop_flat_map(|(holds, first, holder_gen, label, permits)| {
                (0..permits).prop_map(move |slot| MemberMetadata {
                    holds,
                    first_joined_generation: first,
                    holder_generation: holder_gen,
                    label: label.clone(),
                    permits,
                    slot,
                    ledger: None,
                })
            })
    }

    fn arb_holder() -> impl Strategy<Value = (String, Option<String>)> {
        ("\\PC{0,80}", proptest::option::of("\\PC{0,64}"))
    }

    fn arb_assignment() -> impl Strategy<Value = NativeAssignment> {
        (
            proptest::option::of(arb_holder()),
            any::<i32>(),
            0i32..=i32::MAX,
            prop_oneof![Just(1u16), 1u16..=16],
            proptest::collection::vec((arb_holder(), any::<bool>()), 0..16),
        )
            .prop_flat_map(|(holder, generation, members, permits, others)| {
                // Slots: the holder's is the lowest taken, the others ascend after it.
                let mut taken =
                    (0..permits).filter(|s| others.get(usize::from(*s)).is_none_or(|o| o.1));
                let holder = holder.and_then(|(member_id, label)| {
                    taken.next().map(|slot| Holder {
                        member_id,
                        label,
                        generation,
                        slot,
                    })
                });
                let other_holders: Vec<Holder> = match &holder {
                    Some(_) => taken
                        .zip(others.iter())
                        .map(|(slot, ((member_id, label), _))| Holder {
                            member_id: member_id.clone(),
                            label: label.clone(),
                            generation,
                            slot,
                        })
                        .collect(),
                    None => Vec::new(),
                };
                (-1i32..members).prop_map(move |position| NativeAssignment {
                    holder: holder.clone(),
                    position,
                    members,
                    permits,
                    other_holders: other_holders.clone(),
                    ledger: None,
                })
            })
    }

    proptest! {
        #[test]
        fn metadata_round_trips(m in arb_metadata()) {
            prop_assert_eq!(MemberMetadata::decode(&m.encode()), Ok(m));
        }

        #[test]
        fn assignment_round_trips(a in arb_assignment()) {
            prop_assert_eq!(NativeAssignment::decode(&a.encode()), Ok(a));
        }

        #[test]
        fn decoders_never_panic_on_garbage(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = MemberMetadata::decode(&data);
            let _ = NativeAssignment::decode(&data);
        }

        #[test]
        fn decoders_never_panic_on_mutated_valid_bytes(
            m in arb_metadata(),
            a in arb_assignment(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let mut mb = m.encode().to_vec();
            let mut ab = a.encode().to_vec();
            for (at, xor) in flips {
                let i = at % mb.len();
                mb[i] ^= xor;
                let j = at % ab.len();
                ab[j] ^= xor;
            }
            let _ = MemberMetadata::decode(&mb);
            let _ = NativeAssignment::decode(&ab);
        }

        #[test]
        fn assignor_invariants(
            metas in proptest::collection::vec(proptest::option::of(arb_metadata().prop_map(|m| {
                // The mutex: every member with one permit.
                MemberMetadata { permits: 1, slot: 0, ..m }
            })), 0..12),
            generation in 0i32..1000,
        ) {
            let members: Vec<(String, Option<String>, Bytes)> = metas
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let bytes = m.as_ref().map_or(Bytes::from_static(b"bad"), MemberMetadata::encode);
                    (format!("member-{i:02}"), None, bytes)
                })
                .collect();
            let plan = assign_native(generation, &members);
            prop_assert_eq!(plan.assignments.len(), members.len());
            prop_assert_eq!(plan.rejected.len(), metas.iter().filter(|m| m.is_none()).count());

            // The holder is an eligible member, and a claimant whenever one exists.
            let claimants: Vec<usize> = metas.iter().enumerate()
                .filter(|(_, m)| m.as_ref().is_some_and(|m| m.holds))
                .map(|(i, _)| i)
                .collect();
            let holder_index = plan.holder.as_ref().map(|h| {
                members.iter().position(|(id, _, _)| id == h).expect("holder is a member")
            });
            match holder_index {
                Some(i) => {
                    prop_assert!(metas[i].is_some());
                    if !claimants.is_empty() {
                        prop_assert!(claimants.contains(&i));
                    }
                }
                None => prop_assert!(metas.iter().all(Option::is_none)),
            }

            // Positions: 0 for the holder, 1..n for the other eligible members, -1 for rejected.
            let mut positions: Vec<i32> = Vec::new();
            for ((id, bytes), m) in plan.assignments.iter().zip(&metas) {
                let a = NativeAssignment::decode(bytes).expect("own encoding");
                prop_assert_eq!(a.holder.as_ref().map(|h| &h.member_id), plan.holder.as_ref());
                prop_assert_eq!(a.members as usize, members.len());
                if let Some(h) = &a.holder {
                    prop_assert_eq!(h.generation, generation);
                }
                if m.is_none() {
                    prop_assert_eq!(a.position, -1);
                } else {
                    positions.push(a.position);
                }
                if Some(id) == plan.holder.as_ref() {
                    prop_assert_eq!(a.position, 0);
                }
            }
            positions.sort_unstable();
            let expected: Vec<i32> = (0..positions.len() as i32).collect();
            prop_assert_eq!(positions, expected);
        }
    }

    // ---- permits (semaphore) -----------------------------------------------------------------

    fn mdn(holds: bool, first: i32, holder_gen: i32, permits: u16, slot: u16) -> MemberMetadata {
        MemberMetadata {
            permits,
            slot,
            ..md(holds, first, holder_gen, None)
        }
    }

    fn holders_of(plan: &NativePlan) -> Vec<(u16, &str)> {
        plan.holders
            .iter()
            .map(|(s, id)| (*s, id.as_str()))
            .collect()
    }

    #[test]
    fn minor_1_layouts_match_the_documented_tables() {
        let m = MemberMetadata {
            permits: 3,
            slot: 2,
            ..md(true, 7, 9, Some("h:1"))
        };
        assert_eq!(
            &m.encode()[..],
            &[
                b'k', b'm', 1, 1,    // magic, major, minor
                0x01, // flags: holds
                0, 0, 0, 7, // first_joined_generation
                0, 0, 0, 9, // holder_generation
                0, 3, b'h', b':', b'1', // label
                0, 3, // permits
                0, 2, // slot
            ][..]
        );
        let a = NativeAssignment {
            holder: Some(Holder {
                member_id: "m-1".into(),
                label: None,
                generation: 4,
                slot: 0,
            }),
            position: 0,
            members: 3,
            permits: 3,
            other_holders: vec![Holder {
                member_id: "m-2".into(),
                label: Some("b".into()),
                generation: 4,
                slot: 2,
            }],
            ledger: None,
        };
        assert_eq!(
            &a.encode()[..],
            &[
                b'k', b'a', 1, 1,    // magic, major, minor
                0x01, // flags: holder section
                0, 0, 0, 0, // position
                0, 0, 0, 3, // members
                0, 0, 0, 4, // generation
                0, 3, b'm', b'-', b'1', 0xff, 0xff, // first holder id, no label
                0, 3, // permits
                0, 0, // first holder's slot
                0, 1, // one more holder
                0, 2, 0, 3, b'm', b'-', b'2', 0, 1, b'b', // slot 2, id, label
            ][..]
        );
        assert_eq!(NativeAssignment::decode(&a.encode()), Ok(a));
    }

    #[test]
    fn one_permit_is_written_as_minor_0() {
        assert_eq!(md(true, 7, 9, None).encode()[3], 0);
        let plan = assign_native(3, &[member("a", &md(false, 1, -1, None))]);
        assert_eq!(plan.assignments[0].1[3], 0);
        assert_eq!(plan.permits, 1);
    }

    #[test]
    fn bad_permit_fields_are_typed_errors() {
        let mut b = mdn(true, 1, 2, 3, 1).encode().to_vec();
        let n = b.len();
        b[n - 4..n - 2].copy_from_slice(&0u16.to_be_bytes());
        assert!(matches!(
            MemberMetadata::decode(&b),
            Err(PeerDataError::OutOfRange {
                what: "member permits",
                value: 0
            })
        ));
        b[n - 4..n - 2].copy_from_slice(&(MAX_PERMITS + 1).to_be_bytes());
        assert!(MemberMetadata::decode(&b).is_err());
        // The bound itself is a number of permits.
        b[n - 4..n - 2].copy_from_slice(&MAX_PERMITS.to_be_bytes());
        assert_eq!(
            MemberMetadata::decode(&b).map(|m| m.permits),
            Ok(MAX_PERMITS)
        );
        b[n - 4..n - 2].copy_from_slice(&3u16.to_be_bytes());
        b[n - 2..].copy_from_slice(&3u16.to_be_bytes());
        assert!(matches!(
            MemberMetadata::decode(&b),
            Err(PeerDataError::OutOfRange {
                what: "member permit slot",
                value: 3
            })
        ));

        let holder = |slot| Holder {
            member_id: "x".into(),
            label: None,
            generation: 1,
            slot,
        };
        let a = NativeAssignment {
            holder: Some(holder(0)),
            position: 0,
            members: 2,
            permits: 2,
            other_holders: vec![holder(1)],
            ledger: None,
        }
        .encode()
        .to_vec();
        // Other holders' slots must ascend past the first's.
        let mut same = a.clone();
        let k = a.len() - 7;
        same[k..k + 2].copy_from_slice(&0u16.to_be_bytes());
        assert!(NativeAssignment::decode(&same).is_err());
        // More holders than permits.
        let mut many = a.clone();
        many[k - 2..k].copy_from_slice(&2u16.to_be_bytes());
        assert!(matches!(
            NativeAssignment::decode(&many),
            Err(PeerDataError::OutOfRange {
                what: "other holder count",
                ..
            })
        ));
        // A first holder in the last slot leaves no room for others.
        let last = NativeAssignment {
            holder: Some(holder(1)),
            other_holders: vec![holder(1)],
            ..NativeAssignment::decode(&a).expect("decodes")
        }
        .encode();
        assert!(matches!(
            NativeAssignment::decode(&last),
            Err(PeerDataError::OutOfRange {
                what: "other holder count",
                value: 1
            })
        ));
        // A count the bytes cannot hold is refused before anything is read.
        let mut short = a[..k].to_vec();
        short[k - 2..k].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(
            NativeAssignment::decode(&short),
            Err(PeerDataError::Truncated {
                what: "other holders"
            })
        );
        for cut in 0..a.len() {
            assert!(NativeAssignment::decode(&a[..cut]).is_err(), "prefix {cut}");
        }
    }

    #[test]
    fn three_permits_go_to_the_first_three_in_fifo_order() {
        let members: Vec<_> = ["f", "e", "d", "c", "b", "a"]
            .iter()
            .enumerate()
            .map(|(i, id)| member(id, &mdn(false, 10 - i as i32, -1, 3, 0)))
            .collect();
        let plan = assign_native(11, &members);
        assert_eq!(plan.permits, 3);
        assert_eq!(holders_of(&plan), [(0, "a"), (1, "b"), (2, "c")]);
        for (id, want) in [("a", 0), ("b", 0), ("c", 0), ("d", 1), ("e", 2), ("f", 3)] {
            assert_eq!(position_of(&plan, id), want, "{id}");
        }
        for (_, a) in decoded(&plan) {
            let hs: Vec<(u16, &str)> = a
                .holders()
                .map(|h| (h.slot, h.member_id.as_str()))
                .collect();
            assert_eq!(hs, [(0, "a"), (1, "b"), (2, "c")]);
            assert!(a.holders().all(|h| h.generation == 11));
            assert_eq!(a.permits, 3);
        }
    }

    #[test]
    fn holders_keep_their_slots_and_free_slots_go_in_fifo_order() {
        let members = [
            member("late-holder", &mdn(true, 9, 9, 3, 2)),
            member("waiter-2", &mdn(false, 5, -1, 3, 0)),
            member("waiter-1", &mdn(false, 4, -1, 3, 0)),
            member("newcomer", &mdn(false, -1, -1, 3, 0)),
        ];
        let plan = assign_native(10, &members);
        assert_eq!(
            holders_of(&plan),
            [(0, "waiter-1"), (1, "waiter-2"), (2, "late-holder")]
        );
        assert_eq!(position_of(&plan, "newcomer"), 1);
    }

    #[test]
    fn conflicting_slot_claims_most_recent_wins_and_the_loser_waits() {
        let members = [
            member("stale", &mdn(true, 1, 3, 2, 1)),
            member("fresh", &mdn(true, 2, 6, 2, 1)),
            member("waiter", &mdn(false, 0, -1, 2, 0)),
        ];
        let plan = assign_native(7, &members);
        // The stale claimant gets no slot in this generation, even with slot 0 free.
        assert_eq!(holders_of(&plan), [(0, "waiter"), (1, "fresh")]);
        assert_eq!(position_of(&plan, "stale"), 1);
    }

    #[test]
    fn permits_mismatch_the_group_keeps_its_number() {
        // Holders decide: a newcomer with another number is refused.
        let members = [
            member("holder", &mdn(true, 1, 2, 3, 0)),
            member("wrong", &mdn(false, 0, -1, 2, 0)),
            member("right", &mdn(false, 3, -1, 3, 0)),
        ];
        let plan = assign_native(4, &members);
        assert_eq!(plan.permits, 3);
        assert_eq!(plan.mismatched, [("wrong".to_owned(), 2)]);
        assert_eq!(holders_of(&plan), [(0, "holder"), (1, "right")]);
        let got = decoded(&plan);
        let wrong = &got.iter().find(|(id, _)| id == "wrong").unwrap().1;
        assert_eq!((wrong.position, wrong.permits), (-1, 3));

        // Without a holder, the first in FIFO order decides; a mutex member in a semaphore
        // group gets a minor 1 assignment naming the group's number.
        let members = [
            member("mutex", &md(false, 5, -1, None)),
            member("sem", &mdn(false, 2, -1, 2, 0)),
        ];
        let plan = assign_native(6, &members);
        assert_eq!(plan.permits, 2);
        assert_eq!(plan.mismatched, [("mutex".to_owned(), 1)]);
        assert_eq!(holders_of(&plan), [(0, "sem")]);

        // A semaphore member in a mutex group gets a minor 0 assignment: one permit.
        let members = [
            member("mutex", &md(false, 1, -1, None)),
            member("sem", &mdn(false, 2, -1, 2, 0)),
        ];
        let plan = assign_native(6, &members);
        assert_eq!(plan.permits, 1);
        let got = decoded(&plan);
        assert!(plan.assignments.iter().all(|(_, b)| b[3] == 0));
        assert_eq!(got[1].1.position, -1);
        assert_eq!(got[1].1.permits, 1);
    }

    /// One simulated member for the sequence property: what it would put in its metadata.
    #[derive(Debug, Clone)]
    struct Sim {
        id: String,
        first: i32,
        hold: Option<(u16, i32)>,
        permits: u16,
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// A new member joins (with the group's permits, or a wrong number).
        Join { wrong_permits: bool },
        /// Member `k` (modulo the count) leaves or is expired.
        Leave(usize),
        /// A rebalance where member `k`'s metadata is stale: built before it learned it holds.
        StaleRejoin(usize),
        /// A rebalance where everyone heartbeats and rejoins in time.
        Rebalance,
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => any::<bool>().prop_map(|w| Step::Join { wrong_permits: w }),
            2 => any::<usize>().prop_map(Step::Leave),
            1 => any::<usize>().prop_map(Step::StaleRejoin),
            2 => Just(Step::Rebalance),
        ]
    }

    proptest! {
        /// For any sequence of joins, leaves and rebalances: at most N holders, each slot at most
        /// once; every member still present that held keeps its slot (sticky); a free slot goes
        /// to the earliest waiter (FIFO); members with another number never hold.
        #[test]
        fn semaphore_sequences_keep_their_invariants(
            permits in 1u16..=4,
            steps in proptest::collection::vec(arb_step(), 1..40),
        ) {
            let mut sims: Vec<Sim> = Vec::new();
            let mut next_id = 0;
            let mut generation = 0;
            for step in steps {
                let mut stale: Option<usize> = None;
                match step {
                    Step::Join { wrong_permits } => {
                        sims.push(Sim {
                            id: format!("m{next_id:03}"),
                            first: -1,
                            hold: None,
                            permits: if wrong_permits { permits + 1 } else { permits },
                        });
                        next_id += 1;
                    }
                    Step::Leave(k) if !sims.is_empty() => {
                        let k = k % sims.len();
                        sims.remove(k);
                    }
                    Step::StaleRejoin(k) if !sims.is_empty() => stale = Some(k % sims.len()),
                    _ => {}
                }
                generation += 1;
                let before = sims.clone();
                let members: Vec<(String, Option<String>, Bytes)> = sims
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let hold = if stale == Some(i) { None } else { s.hold };
                        let m = MemberMetadata {
                            holds: hold.is_some(),
                            first_joined_generation: s.first,
                            holder_generation: hold.map_or(-1, |h| h.1),
                            label: None,
                            permits: s.permits,
                            slot: hold.map_or(0, |h| h.0),
                            ledger: None,
                        };
                        (s.id.clone(), None, m.encode())
                    })
                    .collect();
                let plan = assign_native(generation, &members);
                let group = plan.permits;
                prop_assert!(plan.holders.len() <= usize::from(group));
                let mut slots: Vec<u16> = plan.holders.iter().map(|h| h.0).collect();
                slots.dedup();
                prop_assert_eq!(slots.len(), plan.holders.len());
                prop_assert!(slots.iter().all(|&s| s < group));
                // Members apply their assignments.
                for (i, s) in sims.iter_mut().enumerate() {
                    if s.first < 0 {
                        s.first = generation;
                    }
                    let mine = plan.holders.iter().find(|h| h.1 == s.id).map(|h| h.0);
                    if s.permits != group {
                        prop_assert_eq!(mine, None);
                    }
                    // Sticky: a holder whose metadata said so keeps its slot.
                    if let (Some((slot, _)), true) = (before[i].hold, stale != Some(i)) {
                        if s.permits == group {
                            prop_assert_eq!(mine, Some(slot), "{} lost its slot", s.id);
                        }
                    }
                    s.hold = match (mine, s.hold) {
                        (Some(slot), Some((old, since))) if slot == old => Some((slot, since)),
                        (Some(slot), _) => Some((slot, generation)),
                        (None, _) => None,
                    };
                }
                // FIFO: nobody waits (agreeing, never a losing claimant) ahead of a member
                // that was given a free slot in this generation.
                let fifo = |s: &Sim| (s.first < 0, s.first, s.id.clone());
                let newly: Vec<&Sim> = sims.iter().zip(&before).enumerate()
                    .filter(|(_, (s, b))| s.hold.is_some() && b.hold.is_none())
                    .map(|(_, (s, _))| s).collect();
                for n in &newly {
                    for (i, w) in sims.iter().enumerate() {
                        if w.hold.is_none() && w.permits == group && before[i].hold.is_none() {
                            prop_assert!(fifo(n) < fifo(w) || stale == Some(i),
                                "{} got a permit ahead of {}", n.id, w.id);
                        }
                    }
                }
            }
        }
    }

    // ---- ledger setting ----------------------------------------------------------------------

    fn mdl(holds: bool, first: i32, holder_gen: i32, ledger: Option<&str>) -> MemberMetadata {
        MemberMetadata {
            ledger: ledger.map(str::to_owned),
            ..md(holds, first, holder_gen, None)
        }
    }

    #[test]
    fn minor_2_layouts_match_the_documented_tables() {
        let m = mdl(false, 7, -1, Some("lg"));
        assert_eq!(
            &m.encode()[..],
            &[
                b'k', b'm', 1, 2,    // magic, major, minor
                0x00, // flags
                0, 0, 0, 7, // first_joined_generation
                0xff, 0xff, 0xff, 0xff, // holder_generation
                0xff, 0xff, // no label
                0, 1, // permits
                0, 0, // slot
                0, 2, b'l', b'g', // ledger topic
            ][..]
        );
        assert_eq!(MemberMetadata::decode(&m.encode()), Ok(m));
        let a = NativeAssignment {
            holder: None,
            position: 0,
            members: 1,
            permits: 1,
            other_holders: Vec::new(),
            ledger: Some("lg".into()),
        };
        assert_eq!(
            &a.encode()[..],
            &[
                b'k', b'a', 1, 2,    // magic, major, minor
                0x00, // flags
                0, 0, 0, 0, // position
                0, 0, 0, 1, // members
                0, 1, // permits
                0, 0, // other holders
                0, 2, b'l', b'g', // ledger topic
            ][..]
        );
        assert_eq!(NativeAssignment::decode(&a.encode()), Ok(a));
    }

    #[test]
    fn no_ledger_keeps_the_minor_0_and_1_bytes() {
        // A mutex without a ledger is byte for byte what builds before ledgers wrote.
        assert_eq!(md(false, 1, -1, None).encode()[3], 0);
        assert_eq!(mdn(false, 1, -1, 2, 0).encode()[3], 1);
        // A build before ledgers (minor 1) reads as "no ledger"; one after (minor 3) is read
        // with its unknown tail skipped.
        let old = mdn(true, 1, 2, 2, 1);
        assert_eq!(MemberMetadata::decode(&old.encode()).unwrap().ledger, None);
        let mut newer = mdl(false, 1, -1, Some("lg")).encode().to_vec();
        newer[3] = 3;
        newer.extend_from_slice(&[9, 9]);
        assert_eq!(
            MemberMetadata::decode(&newer).unwrap().ledger.as_deref(),
            Some("lg")
        );
        // An empty topic name is not a setting.
        let mut empty = mdl(false, 1, -1, Some("lg")).encode().to_vec();
        let n = empty.len();
        empty.truncate(n - 2);
        empty[n - 4..n - 2].copy_from_slice(&0u16.to_be_bytes());
        assert!(matches!(
            MemberMetadata::decode(&empty),
            Err(PeerDataError::OutOfRange {
                what: "member ledger topic",
                value: 0
            })
        ));
    }

    #[test]
    fn members_that_disagree_about_the_ledger_hold_nothing_new() {
        // No holder: the earliest member's setting is the group's; nobody holds while the
        // other member is in the generation.
        let members = [
            member("a", &mdl(false, 3, -1, Some("lg"))),
            member("b", &mdl(false, 4, -1, None)),
        ];
        let plan = assign_native(5, &members);
        assert_eq!(plan.holder, None);
        assert_eq!(plan.ledger.as_deref(), Some("lg"));
        assert_eq!(plan.ledger_mismatched, [("b".to_owned(), None)]);
        let got = decoded(&plan);
        assert!(got.iter().all(|(_, a)| a.holder.is_none()));
        assert!(got.iter().all(|(_, a)| a.ledger.as_deref() == Some("lg")));
        assert_eq!(position_of(&plan, "b"), -1);
        assert_eq!(position_of(&plan, "a"), 1);

        // A holder keeps its lock and its setting is the group's, even against the earliest.
        let members = [
            member("a", &mdl(false, 3, -1, None)),
            member("b", &mdl(true, 4, 6, Some("lg"))),
            member("c", &mdl(false, 5, -1, Some("lg"))),
        ];
        let plan = assign_native(7, &members);
        assert_eq!(plan.holder.as_deref(), Some("b"));
        assert_eq!(plan.ledger.as_deref(), Some("lg"));
        assert_eq!(plan.ledger_mismatched, [("a".to_owned(), None)]);
        assert_eq!(position_of(&plan, "a"), -1);

        // Two ledger topics disagree as much as a ledger and none.
        let members = [
            member("a", &mdl(false, 3, -1, Some("one"))),
            member("b", &mdl(false, 4, -1, Some("two"))),
        ];
        let plan = assign_native(5, &members);
        assert_eq!(plan.holder, None);
        assert_eq!(
            plan.ledger_mismatched,
            [("b".to_owned(), Some("two".into()))]
        );

        // Once the other member has left, the lock is assigned again.
        let plan = assign_native(6, &members[..1]);
        assert_eq!(plan.holder.as_deref(), Some("a"));
        assert!(plan.ledger_mismatched.is_empty());
    }

    #[test]
    fn a_semaphore_fills_no_free_slot_while_a_member_disagrees_about_the_ledger() {
        let lm = |holds, first, gen, slot, ledger: Option<&str>| MemberMetadata {
            ledger: ledger.map(str::to_owned),
            ..mdn(holds, first, gen, 3, slot)
        };
        let members = [
            member("a", &lm(true, 1, 4, 1, Some("lg"))),
            member("b", &lm(false, 2, -1, 0, Some("lg"))),
            member("c", &lm(false, 3, -1, 0, None)),
        ];
        let plan = assign_native(5, &members);
        assert_eq!(holders_of(&plan), [(1, "a")]);
        assert_eq!(plan.ledger_mismatched, [("c".to_owned(), None)]);
        let plan = assign_native(6, &members[..2]);
        assert_eq!(holders_of(&plan), [(0, "b"), (1, "a")]);
    }
}
