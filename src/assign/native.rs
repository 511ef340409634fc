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

/// Minor version written by this build. Readers accept any minor of their major; fields a newer
/// minor appends are skipped (see `docs/protocol.md`, "Versioning").
pub const NATIVE_MINOR_VERSION: u8 = 0;

/// Longest label, in UTF-8 bytes. Longer labels are cut at a character boundary when encoding.
pub const MAX_LABEL_LEN: usize = 256;

/// Longest member id, in UTF-8 bytes: Kafka strings cannot be longer, so no broker-issued id is
/// ever cut.
pub const MAX_MEMBER_ID_LEN: usize = i16::MAX as usize;

const METADATA_MAGIC: [u8; 2] = *b"km";
const ASSIGNMENT_MAGIC: [u8; 2] = *b"ka";
/// Label length meaning "no label" (not a valid length: it is above [`MAX_LABEL_LEN`]).
const NO_LABEL: u16 = 0xFFFF;

const METADATA_FLAG_HOLDS: u8 = 0x01;
const METADATA_KNOWN_FLAGS: u8 = METADATA_FLAG_HOLDS;
const ASSIGNMENT_FLAG_HOLDER: u8 = 0x01;
const ASSIGNMENT_KNOWN_FLAGS: u8 = ASSIGNMENT_FLAG_HOLDER;

/// What a member puts in JoinGroup's `protocols[].metadata` for [`NATIVE_PROTOCOL`].
///
/// It must only change when the member's lock state changes: Apache Kafka rebalances a stable
/// group when a member rejoins with different metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMetadata {
    /// The member holds the lock right now (its lease has not ended).
    pub holds: bool,
    /// Generation of the member's first completed join (its place in the queue); -1 if it has
    /// never completed one, which puts it at the back.
    pub first_joined_generation: i32,
    /// Generation whose SyncGroup granted the member its current, uninterrupted hold; -1 when it
    /// does not hold. The leader uses it to choose between conflicting claims.
    pub holder_generation: i32,
    /// Free text shown to waiters (host, pid, job); at most [`MAX_LABEL_LEN`] bytes.
    pub label: Option<String>,
}

/// The lock holder as named in every member's assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's member id.
    pub member_id: String,
    /// The label from the holder's own metadata.
    pub label: Option<String>,
    /// The generation of this assignment: with `member_id`, the holder's fencing token.
    pub generation: i32,
}

/// What the leader hands each member in SyncGroup for [`NATIVE_PROTOCOL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeAssignment {
    /// Who holds the lock in this generation, if anyone.
    pub holder: Option<Holder>,
    /// Members ahead of the recipient, holder included: 0 for the holder, 1 for the next in
    /// line, and so on; -1 if unknown (the recipient's metadata was rejected).
    pub position: i32,
    /// Members in the generation, including any whose metadata was rejected.
    pub members: i32,
}

/// The leader's plan for one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativePlan {
    /// Member id of the holder, if any member could hold.
    pub holder: Option<String>,
    /// One encoded [`NativeAssignment`] per member, in the order the members were given.
    pub assignments: Vec<(String, Bytes)>,
    /// Members whose metadata could not be decoded, for the leader to log. They still get an
    /// assignment (so they can report who holds) but can never be chosen as holder.
    pub rejected: Vec<(String, PeerDataError)>,
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
// With NATIVE_MINOR_VERSION = 0 the comparison reduces to `minor == 0`; written as `<=` so it stays
// right when the minor is bumped.
#[allow(clippy::absurd_extreme_comparisons)]
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
    /// Encodes at [`NATIVE_MAJOR_VERSION`].[`NATIVE_MINOR_VERSION`]. A label longer than
    /// [`MAX_LABEL_LEN`] bytes is cut at a character boundary.
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(15 + label_len(self.label.as_deref()));
        buf.put_slice(&METADATA_MAGIC);
        buf.put_u8(NATIVE_MAJOR_VERSION);
        buf.put_u8(NATIVE_MINOR_VERSION);
        buf.put_u8(if self.holds { METADATA_FLAG_HOLDS } else { 0 });
        buf.put_i32(self.first_joined_generation);
        buf.put_i32(self.holder_generation);
        put_label(&mut buf, self.label.as_deref());
        buf.freeze()
    }

    /// Decodes metadata sent by another member.
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
        check_end(&r, minor, WHAT)?;
        Ok(Self {
            holds: flags & METADATA_FLAG_HOLDS != 0,
            first_joined_generation,
            holder_generation,
            label,
        })
    }
}

impl NativeAssignment {
    /// Encodes at [`NATIVE_MAJOR_VERSION`].[`NATIVE_MINOR_VERSION`]. Over-long member ids and
    /// labels are cut at a character boundary (see [`MAX_MEMBER_ID_LEN`], [`MAX_LABEL_LEN`]).
    pub fn encode(&self) -> Bytes {
        let holder_len = self.holder.as_ref().map_or(0, |h| {
            8 + truncate_utf8(&h.member_id, MAX_MEMBER_ID_LEN).len() + label_len(h.label.as_deref())
        });
        let mut buf = BytesMut::with_capacity(13 + holder_len);
        buf.put_slice(&ASSIGNMENT_MAGIC);
        buf.put_u8(NATIVE_MAJOR_VERSION);
        buf.put_u8(NATIVE_MINOR_VERSION);
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
        buf.freeze()
    }

    /// Decodes the assignment the leader sent this member. Empty input (a leader that left this
    /// member out) is [`PeerDataError::Empty`].
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
        let holder = if flags & ASSIGNMENT_FLAG_HOLDER != 0 {
            let generation = r.i32("holder generation")?;
            let id_len = r.u16("holder member id")?;
            let member_id = r.utf8(usize::from(id_len), MAX_MEMBER_ID_LEN, "holder member id")?;
            let label = read_label(&mut r, "holder label")?;
            Some(Holder {
                member_id,
                label,
                generation,
            })
        } else {
            None
        };
        check_end(&r, minor, WHAT)?;
        Ok(Self {
            holder,
            position,
            members,
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
/// and becomes the holder's token.
///
/// Rules (rationale in `docs/protocol.md`):
/// 1. **Sticky.** A member whose metadata says it holds the lock keeps it. If several claim it,
///    the one with the highest `holder_generation` wins, then the earliest in FIFO order.
/// 2. **FIFO.** With no claimant, the earliest `first_joined_generation` (≥ 0) wins; members that
///    never completed a join (-1) come last; ties by member id, bytewise.
/// 3. Members whose metadata does not decode are listed in [`NativePlan::rejected`], can never
///    hold, and get position -1.
///
/// Every member's assignment names the same holder and carries the member's own position.
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

    // `eligible` is in FIFO order, so the first claimant with the highest holder generation is
    // also the FIFO-earliest among equals.
    let holder_pos = eligible
        .iter()
        .enumerate()
        .filter(|(_, (_, _, md))| md.holds)
        .min_by_key(|(pos, (_, _, md))| (Reverse(md.holder_generation), *pos))
        .map(|(pos, _)| pos)
        .or(if eligible.is_empty() { None } else { Some(0) });

    let mut positions = vec![-1i32; members.len()];
    let holder = holder_pos.map(|hp| {
        let (index, id, md) = &eligible[hp];
        positions[*index] = 0;
        Holder {
            member_id: (*id).to_owned(),
            label: md.label.clone(),
            generation,
        }
    });
    let waiters = eligible
        .iter()
        .enumerate()
        .filter(|(pos, _)| Some(*pos) != holder_pos);
    for (rank, (_, (index, _, _))) in waiters.enumerate() {
        positions[*index] = i32::try_from(rank + 1).unwrap_or(i32::MAX);
    }

    let member_count = i32::try_from(members.len()).unwrap_or(i32::MAX);
    let assignments = members
        .iter()
        .zip(&positions)
        .map(|((id, _, _), &position)| {
            let a = NativeAssignment {
                holder: holder.clone(),
                position,
                members: member_count,
            };
            (id.clone(), a.encode())
        })
        .collect();

    NativePlan {
        holder: holder.map(|h| h.member_id),
        assignments,
        rejected,
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
            }),
            position: 2,
            members: 3,
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
        let mut newer = md(true, 1, 2, Some("l")).encode().to_vec();
        newer[3] = NATIVE_MINOR_VERSION + 1;
        newer[4] |= 0x40;
        newer.extend_from_slice(b"future field");
        assert_eq!(
            MemberMetadata::decode(&newer),
            Ok(md(true, 1, 2, Some("l")))
        );

        let mut a = NativeAssignment {
            holder: None,
            position: 0,
            members: 1,
        }
        .encode()
        .to_vec();
        a[3] = 9;
        a.extend_from_slice(&[1, 2, 3]);
        assert!(NativeAssignment::decode(&a).is_ok());
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
            }),
            position: 0,
            members: 1,
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
            }),
            position: 1,
            members: 4,
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
        )
            .prop_map(|(holds, first, holder_gen, label)| MemberMetadata {
                holds,
                first_joined_generation: first,
                holder_generation: holder_gen,
                label,
            })
    }

    fn arb_assignment() -> impl Strategy<Value = NativeAssignment> {
        let holder = proptest::option::of(
            (
                "\\PC{0,80}",
                proptest::option::of("\\PC{0,64}"),
                any::<i32>(),
            )
                .prop_map(|(member_id, label, generation)| Holder {
                    member_id,
                    label,
                    generation,
                }),
        );
        (holder, 0i32..=i32::MAX)
            .prop_flat_map(|(holder, members)| (Just(holder), -1i32..members, Just(members)))
            .prop_map(|(holder, position, members)| NativeAssignment {
                holder,
                position,
                members,
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
            metas in proptest::collection::vec(proptest::option::of(arb_metadata()), 0..12),
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
}
