//! Bounded decoding: a pre-scan that every response body passes before kafka-protocol decodes it.
//!
//! # The problem
//!
//! kafka-protocol 0.18 decodes an array by reading its element count from the wire and calling
//! `Vec::with_capacity(count)` before it reads a single element (`src/protocol/types.rs`, the
//! `Array` and `CompactArray` decoders). A response of a dozen bytes can claim 2^31 elements of a
//! 100-byte struct; the allocation fails and the allocator *aborts the process*, which no
//! `catch_unwind` can stop. Byte and string decoders that copy into a `Vec<u8>` do the same with a
//! length prefix. A lock client that any broker (or anything answering on its port) can kill with one
//! packet is not acceptable.
//!
//! # The design
//!
//! Before kafka-protocol sees a body, [`scan_response`] walks it with a small interpreter driven by a
//! static description of every response we decode: for each API, the fields of each struct with
//! the versions they appear in, the version from which the message is "flexible" (compact lengths
//! and a tagged-field section at the end of every struct, KIP-482), and the known tagged fields
//! with their types. The tables were written from kafka-protocol's generated decoders
//! (`src/messages/*_response.rs`) and are checked against them by a test that generates random
//! valid bodies from the tables for every (API, version) we support, decodes them with
//! kafka-protocol, re-encodes them, and requires identical bytes and an exact scan.
//!
//! The guard is split where the data ends and the machinery begins: `tables.rs` states every
//! response once (one `schema!` block per message, fields as `name: Type [versions]`),
//! `program.rs` compiles a table into a flat program per (API, version), `scanner.rs` runs a
//! program over a body, and `tests.rs` holds the proof against kafka-protocol. This file is the
//! public surface: the bounds, the errors and the entry points.
//!
//! The scan allocates nothing and rejects, with a typed [`Malformation`]:
//! - any read past the end (truncation);
//! - a negative length other than -1 (null) for strings, bytes and arrays;
//! - any array whose count exceeds *remaining bytes / minimal encoded size of one element* (the
//!   minimal size is computed from the table for that version, at least 1 byte), so a count can
//!   never promise more elements than the bytes could hold;
//! - unsigned varints longer than 5 bytes or with bits beyond 32;
//! - more tagged fields than the remaining bytes could hold, and known tagged fields whose
//!   declared size differs from what their value occupies (kafka-protocol decodes known tags by type
//!   and ignores the size, so a lying size would desynchronise it);
//! - bytes left over after the body ([`DecodeError::TrailingBytes`]).
//!
//! Only bodies that pass are handed to kafka-protocol, whose decoders then follow exactly the path
//! the scan took.
//!
//! **Messages without arrays skip the scan** when decoded through
//! [`decode_response`](super::codec::decode_response) (Heartbeat, SyncGroup, LeaveGroup v0–2,
//! FindCoordinator v0–3: [`needs_scan`] says which). There kafka-protocol's own decoder is already
//! bounded: its only input-sized allocations are string and byte fields, which it takes with
//! `try_get_bytes` after checking that the bytes are present, and unknown tagged fields, at most
//! about 100 bytes of `BTreeMap` each for at least 2 input bytes. Skipping the scan keeps the
//! guard's cost near zero on the hottest responses (see BENCHMARKS.md). Malformed bodies of these
//! messages are then reported as [`DecodeError::Protocol`] rather than [`DecodeError::Malformed`];
//! [`scan_response`] itself always scans.
//!
//! # The bounds
//!
//! *Time:* every step of the scan consumes at least one byte, except array elements whose minimal
//! size is 0 (none of ours), which are bounded by the remaining bytes anyway, so the scan is linear
//! in the input. The table's nesting is at most three structs deep, so the scan's recursion depth
//! is fixed by the tables, never by the input. kafka-protocol's decode after a successful scan is
//! linear too (plus UTF-8 checks, also linear).
//!
//! *Memory:* the scan also adds up what the decode will allocate: `count × size_of::<Element>()`
//! for every array (the tables carry the real `size_of` of kafka-protocol's types), the length
//! plus [`ALLOCATION_OVERHEAD`] for every string or byte field (decoding from a `&[u8]` copies
//! each), and [`UNKNOWN_TAG_COST`] for every unknown tagged field (each lands in a `BTreeMap`).
//! A body whose total exceeds [`MAX_AMPLIFICATION`] × its length + [`AMPLIFICATION_SLACK`] is
//! rejected. A test proves the ratio for every struct at every version is at most
//! [`MAX_AMPLIFICATION`] / 2 (the worst is 32: an OffsetCommit or OffsetFetch v8–9, Produce
//! v9–12 or Fetch v12 topic with an empty name and no partitions, then 31 for a DescribeGroups
//! member whose strings are all empty), so only bodies padded with many unknown tagged fields can
//! ever hit the budget. Because a body never exceeds the frame limit, a decoded response never
//! occupies more than about 64 × the frame limit, and in practice far less.
//!
//! # What cannot be reached
//!
//! kafka-protocol's record decoder (`src/records.rs`, which also pre-allocates from wire counts)
//! and its decompressors are never called. Fetch responses carry record batches, but
//! kafka-protocol's `FetchResponse` decoder takes them as one opaque byte field (`records`, a
//! `BYTES` length and the bytes, counted and charged here like any byte field); the batches are
//! read by [`records`](super::records), which has its own bounds. The crate is built without any
//! compression feature. The response header (v0/v1) is parsed here, not by kafka-protocol.

mod program;
mod scanner;
mod tables;
#[cfg(test)]
pub(crate) mod tests;

use kafka_protocol::messages::ApiKey;

use program::{program, Program, NO_KNOWN_TAGS};
use scanner::{Scanner, Stop};
use tables::schema;
#[cfg(test)]
pub(crate) use tables::MESSAGES;

use super::codec::DecodeError;

/// Largest allowed ratio between the heap a decode may use and the body's length.
pub const MAX_AMPLIFICATION: usize = 64;
/// Fixed allowance on top of the proportional budget, so that small bodies with a few unknown
/// tagged fields are not rejected.
pub const AMPLIFICATION_SLACK: usize = 64 * 1024;
/// What one unknown tagged field is charged (a `BTreeMap` leaf node of `i32` keys and `Bytes`
/// values is about 400 bytes).
pub const UNKNOWN_TAG_COST: usize = 512;
/// What one separate heap allocation is charged on top of its size.
pub const ALLOCATION_OVERHEAD: usize = 32;

/// Why the scan rejected a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformation {
    /// The body ends in the middle of a field.
    #[error("truncated: {needed} more bytes needed, {available} left")]
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the body (or in the enclosing tagged field).
        available: usize,
    },
    /// A length prefix below -1.
    #[error("invalid length {length}")]
    NegativeLength {
        /// The length as read.
        length: i64,
    },
    /// An array count that the remaining bytes cannot hold.
    #[error(
        "array claims {count} elements of at least {min_size} bytes each, but only {available} bytes are left"
    )]
    ArrayTooLong {
        /// The count as read.
        count: u64,
        /// Smallest encoding of one element at this version.
        min_size: usize,
        /// Bytes left.
        available: usize,
    },
    /// An unsigned varint longer than 5 bytes or larger than `u32::MAX`.
    #[error("malformed varint")]
    BadVarint,
    /// More tagged fields than the remaining bytes can hold.
    #[error("{count} tagged fields cannot fit in the {available} bytes left")]
    TooManyTaggedFields {
        /// The count as read.
        count: u64,
        /// Bytes left.
        available: usize,
    },
    /// A known tagged field whose value does not fill exactly its declared size.
    #[error("tagged field {tag} declares {declared} bytes but its value occupies {actual}")]
    TaggedFieldSize {
        /// The tag.
        tag: u32,
        /// The size the field declared.
        declared: usize,
        /// The size its value occupied.
        actual: usize,
    },
    /// Decoding would allocate more than the amplification budget allows.
    #[error(
        "decoding would allocate about {estimate} bytes, more than the {budget} bytes allowed for a {input}-byte body"
    )]
    MemoryBudget {
        /// Estimated heap use of the decoded value.
        estimate: usize,
        /// The budget for this body.
        budget: usize,
        /// The body's length.
        input: usize,
    },
}

/// Where in the body the scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Location {
    /// Byte offset into the body.
    pub offset: usize,
    /// The struct being read, as kafka-protocol names it, e.g. `JoinGroupResponseMember`.
    pub structure: &'static str,
    /// The field being read, e.g. `metadata`, or `_tagged_fields`.
    pub field: &'static str,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{} at byte {}",
            self.structure, self.field, self.offset
        )
    }
}

/// What a successful scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Bytes the body occupies (always the whole input when returned by [`scan_response`]).
    pub consumed: usize,
    /// Estimated heap bytes the decoded value will use (see the module docs).
    pub heap_estimate: usize,
    /// Non-empty string and byte fields: the allocations a decode from a `&[u8]` makes for them
    /// (a decode from [`Bytes`](bytes::Bytes) shares the input instead).
    pub allocations: usize,
}

/// The response versions the guard has tables for, per API.
pub fn covered_versions(api: ApiKey) -> Option<(i16, i16)> {
    schema(api).map(|m| (m.min, m.max))
}

/// Whether a body of `api` at `version` contains an array, so that kafka-protocol's decoder
/// would pre-allocate from a wire count and the scan must run first; `None` when the guard has
/// no table for the pair.
#[inline]
pub fn needs_scan(api: ApiKey, version: i16) -> Option<bool> {
    program(api, version).map(|p| p.needs_scan)
}
/// bytes are left after the body.
pub fn scan_response(api: ApiKey, version: i16, body: &[u8]) -> Result<Scan, DecodeError> {
    let Some(program) = program(api, version) else {
        return Err(DecodeError::UnsupportedVersion {
            api: crate::api::Api::of(api),
            version,
        });
    };
    if let Some((n, tagged)) = program.fixed {
        let fits = if tagged {
            body.len() == n + 1 && body[n] == 0
        } else {
            body.len() == n
        };
        if fits {
            return Ok(Scan {
                consumed: body.len(),
                heap_estimate: body.len(),
                allocations: 0,
            });
        }
    }
    let mut s = Scanner::new(body);
    if s.run(program, &program.ops, &program.labels).is_err() {
        return Err(s.into_error(api, version));
    }
    if s.pos != body.len() {
        return Err(DecodeError::TrailingBytes {
            api: crate::api::Api::of(api),
            version,
            left: body.len() - s.pos,
        });
    }
    let heap_estimate = s.heap.saturating_add(body.len());
    let budget = body
        .len()
        .saturating_mul(MAX_AMPLIFICATION)
        .saturating_add(AMPLIFICATION_SLACK);
    if heap_estimate > budget {
        return Err(DecodeError::Malformed {
            api: crate::api::Api::of(api),
            version,
            at: Location {
                offset: s.pos,
                structure: program.labels.first().map_or("", |l| l.0),
                field: "",
            },
            reason: Malformation::MemoryBudget {
                estimate: heap_estimate,
                budget,
                input: body.len(),
            },
        });
    }
    Ok(Scan {
        consumed: s.pos,
        heap_estimate,
        allocations: s.allocations,
    })
}

/// Reads a response header (v0: correlation id; v1: correlation id and a tagged-field section)
/// and returns the correlation id and the header's length. Unknown header tags are skipped.
pub(crate) fn scan_response_header(
    frame: &[u8],
    header_version: i16,
) -> Result<(i32, usize), (Location, Malformation)> {
    static NONE: Program = Program {
        ops: Vec::new(),
        labels: Vec::new(),
        tag_sets: Vec::new(),
        needs_scan: false,
        fixed: None,
    };
    let mut s = Scanner::new(frame);
    let label = ("ResponseHeader", "correlation_id");
    let cid = match s.take_array::<4>() {
        Ok(b) => i32::from_be_bytes(b),
        Err(Stop) => {
            s.at.get_or_insert((label, s.pos));
            return Err(s.into_parts());
        }
    };
    if header_version >= 1 && s.tags(&NONE, NO_KNOWN_TAGS).is_err() {
        s.at.get_or_insert((("ResponseHeader", "_tagged_fields"), s.pos));
        return Err(s.into_parts());
    }
    Ok((cid, s.pos))
}
