//! Record batches, message format v2 ("magic 2"): encoding our own records, and bounded decoding
//! of the batches a Fetch response carries.
//!
//! # Layout
//!
//! A batch is a 61-byte header and its records. Offsets are byte positions in the batch:
//!
//! ```text
//!  0 base offset      i64    21 attributes        i16   43 producer id      i64
//!  8 batch length     i32    23 last offset delta i32   51 producer epoch   i16
//! 12 leader epoch     i32    27 base timestamp    i64   53 base sequence    i32
//! 16 magic (2)        i8     35 max timestamp     i64   57 record count     i32
//! 17 CRC-32C          u32
//! ```
//!
//! The batch length counts the bytes after itself; the CRC-32C (Castagnoli) covers everything from
//! the attributes to the end of the batch. Attribute bits 0–2 are the compression codec, bit 3 the
//! timestamp type (set: the broker's log-append time), bit 4 transactional, bit 5 control. Each
//! record is a zigzag varint length, then attributes (i8, unused), timestamp delta (varlong),
//! offset delta, key length, key, value length, value, header count and headers (each a key length,
//! UTF-8 key, value length and value; every length and the count a zigzag varint, -1 for null).
//!
//! # Encoding
//!
//! [`encode_batch`] writes one uncompressed batch of [`NewRecord`]s with the header a
//! non-idempotent producer writes: no producer id, epoch or sequence (-1), leader epoch -1, offset
//! deltas 0, 1, 2, …; the broker assigns the offsets. It is our own encoder rather than
//! kafka-protocol's `RecordBatchEncoder`: that one takes kafka-protocol's `Record`, which repeats
//! the batch's producer and transaction fields in every record and keeps headers in a map (Kafka
//! allows a header key twice), and its decoder cannot be used on untrusted bytes anyway (below).
//!
//! # Decoding
//!
//! [`RecordBatches`] walks the bytes of a Fetch response's `records` field batch by batch. kafka-
//! protocol's own record decoder reserves vectors from wire counts before reading them, so it is
//! never called; this one checks every count and length against the bytes that remain before
//! anything is reserved, and allocates nothing but the records' vectors: keys, values and header
//! keys and values are [`Bytes`] slices of the input, no copies. What it does with each batch:
//!
//! - **Complete v2 batch, valid CRC, uncompressed:** yielded as a [`RecordBatch`] with its records.
//! - **Control batch** (transaction markers, attribute bit 5): *skipped deliberately*. It holds no
//!   application records, only the commit or abort of a transaction; it is not yielded, but
//!   [`RecordBatches::next_offset`] moves past it and [`RecordBatches::control_batches`] counts it.
//! - **Compressed batch:** [`BatchError::Compressed`]. kafka-lock writes its records uncompressed
//!   and links no decompressor; the error carries the batch's last offset so a caller may skip it.
//!   (A topic whose `compression.type` is not `producer` or `uncompressed` makes the broker
//!   recompress every batch: such a topic cannot be read here.)
//! - **Magic other than 2:** [`BatchError::UnsupportedMagic`] (message formats v0 and v1 are gone
//!   from Apache Kafka 4).
//! - **CRC mismatch:** [`BatchError::CrcMismatch`].
//! - **Anything malformed inside a batch:** [`BatchError::Malformed`], with the byte position.
//! - **A batch cut off at the end:** the end of the iteration, not an error. A broker fills a
//!   Fetch response up to the requested size and may cut the last batch there; the rest comes
//!   with the next Fetch, from [`RecordBatches::next_offset`]. [`RecordBatches::truncated`] says
//!   how much was missing, so a caller whose *first* batch is cut knows to ask for more bytes.
//!
//! An error about one batch does not end the iteration: the batch's extent was checked against
//! the input before anything else, so the next batch starts where it ends. Only a batch length too
//! small to hold a magic byte ([`BatchError::BadLength`]) ends it, since then no later boundary
//! can be trusted.
//!
//! # Bounds
//!
//! Time is linear in the input: every record and header consumes at least one byte and the CRC
//! is computed once per batch. Memory: a record occupies at least [`MIN_RECORD_SIZE`] bytes and a
//! header at least [`MIN_HEADER_SIZE`], so a count that claims more than the remaining bytes can
//! hold is refused before its vector is reserved. The decoded records then use at most
//! [`MAX_AMPLIFICATION`] bytes of heap per input byte, on top of the input itself, which the
//! records share: on 64-bit targets a record slot is 104 bytes for at least 7 input bytes, a
//! header 64 bytes for at least 2, so records made of many empty headers approach 32 (a test
//! measures 31.8).
//!
//! # References
//! - Record batch format: <https://kafka.apache.org/documentation/#recordbatch>
//! - KIP-98 (message format v2): <https://cwiki.apache.org/confluence/display/KAFKA/KIP-98+-+Exactly+Once+Delivery+and+Transactional+Messaging>

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::StrBytes;

/// The record batch format this module reads and writes.
pub const MAGIC: i8 = 2;
/// Bytes of a batch header, base offset and length included.
pub const BATCH_HEADER_SIZE: usize = 61;
/// Bytes before the batch length's count starts: base offset and batch length.
const LOG_OVERHEAD: usize = 12;
/// Smallest batch length that reaches the magic byte.
const MIN_LENGTH_FOR_MAGIC: i32 = 5;
/// Smallest encoding of a record: its length, attributes, timestamp delta, offset delta, a null
/// key, a null value and no headers, one byte each.
pub const MIN_RECORD_SIZE: usize = 7;
/// Smallest encoding of a header: an empty key and a null value, one varint byte each.
pub const MIN_HEADER_SIZE: usize = 2;
/// Largest heap use of decoded records per input byte (see the module docs).
pub const MAX_AMPLIFICATION: usize = 32;

const CRC_START: usize = 21;
const CODEC_MASK: i16 = 0x07;
const LOG_APPEND_TIME: i16 = 0x08;
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;

/// One record header: Kafka allows the same key more than once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The key, UTF-8.
    pub key: StrBytes,
    /// The value; `None` is a null value, distinct from an empty one.
    pub value: Option<Bytes>,
}

/// A record read from a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its offset in the partition.
    pub offset: i64,
    /// Milliseconds since the epoch: the producer's, or the broker's append time when the topic
    /// uses `LogAppendTime` (then every record of a batch has the batch's time).
    pub timestamp: i64,
    /// The key; `None` is null.
    pub key: Option<Bytes>,
    /// The value; `None` is null (a tombstone).
    pub value: Option<Bytes>,
    /// The headers, in order.
    pub headers: Vec<Header>,
}

/// A record to append; the broker assigns its offset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewRecord {
    /// Milliseconds since the epoch (the broker replaces it if the topic uses `LogAppendTime`).
    pub timestamp: i64,
    /// The key; `None` is null.
    pub key: Option<Bytes>,
    /// The value; `None` is null.
    pub value: Option<Bytes>,
    /// The headers, in order.
    pub headers: Vec<Header>,
}

/// Why [`encode_batch`] wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeBatchError {
    /// A batch needs at least one record.
    #[error("a record batch needs at least one record")]
    Empty,
    /// A length or count does not fit the format's 32-bit fields.
    #[error("the record batch is too large for the format: {what} exceeds i32::MAX")]
    TooLarge {
        /// Which length or count.
        what: &'static str,
    },
}

/// Appends one uncompressed v2 batch holding `records` to `out` (see the module docs for the
/// header it writes). On error `out` is left as it was.
pub fn encode_batch(records: &[NewRecord], out: &mut BytesMut) -> Result<(), EncodeBatchError> {
    let start = out.len();
    let encoded = write_batch(records, out);
    if encoded.is_err() {
        out.truncate(start);
    }
    encoded
}

fn write_batch(records: &[NewRecord], out: &mut BytesMut) -> Result<(), EncodeBatchError> {
    let first = records.first().ok_or(EncodeBatchError::Empty)?;
    let count = fit(records.len(), "the record count")?;
    let base_timestamp = first.timestamp;
    let max_timestamp = records
        .iter()
        .map(|r| r.timestamp)
        .max()
        .unwrap_or(base_timestamp);

    let start = out.len();
    out.put_i64(0);
    out.put_i32(0); // batch length, filled in below
    out.put_i32(-1); // partition leader epoch: the broker sets it
    out.put_i8(MAGIC);
    out.put_u32(0); // CRC, filled in below
    out.put_i16(0); // attributes: no compression, create time, not transactional
    out.put_i32(count - 1);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(-1); // producer id: not idempotent
    out.put_i16(-1);
    out.put_i32(-1);
    out.put_i32(count);
    for (delta, record) in records.iter().enumerate() {
        write_record(record, delta as i32, base_timestamp, out)?;
    }

    let length = fit(out.len() - start - LOG_OVERHEAD, "the batch length")?;
    out[start + 8..start + 12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + CRC_START..]);
    out[start + 17..start + CRC_START].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

fn write_record(
    r: &NewRecord,
    offset_delta: i32,
    base_timestamp: i64,
    out: &mut BytesMut,
) -> Result<(), EncodeBatchError> {
    // Java's producer computes the delta in wrapping arithmetic; so do we, and so does the decoder.
    let timestamp_delta = r.timestamp.wrapping_sub(base_timestamp);
    let mut size = 1 + varlong_size(timestamp_delta) + varint_size(offset_delta);
    size += nullable_size(r.key.as_deref(), "a key")?;
    size += nullable_size(r.value.as_deref(), "a value")?;
    size += varint_size(fit(r.headers.len(), "a header count")?);
    for h in &r.headers {
        size += nullable_size(Some(h.key.as_bytes()), "a header key")?;
        size += nullable_size(h.value.as_deref(), "a header value")?;
    }
    put_varint(out, fit(size, "a record")?);
    out.put_i8(0);
    put_varlong(out, timestamp_delta);
    put_varint(out, offset_delta);
    put_nullable(out, r.key.as_deref());
    put_nullable(out, r.value.as_deref());
    put_varint(out, r.headers.len() as i32);
    for h in &r.headers {
        put_nullable(out, Some(h.key.as_bytes()));
        put_nullable(out, h.value.as_deref());
    }
    Ok(())
}

fn fit(n: usize, what: &'static str) -> Result<i32, EncodeBatchError> {
    i32::try_from(n).map_err(|_| EncodeBatchError::TooLarge { what })
}

fn nullable_size(b: Option<&[u8]>, what: &'static str) -> Result<usize, EncodeBatchError> {
    Ok(match b {
        None => 1,
        Some(b) => varint_size(fit(b.len(), what)?) + b.len(),
    })
}

fn put_nullable(out: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.put_slice(b);
        }
    }
}

fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn put_varlong(out: &mut BytesMut, v: i64) {
    let mut z = zigzag64(v);
    while z >= 0x80 {
        out.put_u8(z as u8 | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn put_varint(out: &mut BytesMut, v: i32) {
    put_varlong(out, i64::from(v));
}

fn varlong_size(v: i64) -> usize {
    let bits = 64 - zigzag64(v).leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

fn varint_size(v: i32) -> usize {
    varlong_size(i64::from(v))
}

// ---------------------------------------------------------------------------------------------
// Decoding.

/// A batch of records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordBatch {
    /// Offset of its first record.
    pub base_offset: i64,
    /// Offset of its last record (after compaction, possibly of a record no longer in it).
    pub last_offset: i64,
    /// The leader epoch of the partition when the batch was appended.
    pub partition_leader_epoch: i32,
    /// The producer id, -1 for a producer that is neither idempotent nor transactional.
    pub producer_id: i64,
    /// Whether a transactional producer wrote it. Records of aborted transactions are returned
    /// like any other: a Fetch response lists the aborted transactions separately.
    pub transactional: bool,
    /// Its records, in offset order.
    pub records: Vec<Record>,
}

/// Where a batch cut off at the end of the input begins, and how much of it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// Byte position of the cut batch in the input.
    pub at: usize,
    /// Bytes the whole batch occupies, when its length was readable.
    pub needed: Option<usize>,
    /// Bytes of it that arrived.
    pub available: usize,
}

/// What is wrong inside a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordMalformation {
    /// The batch length is too small for a v2 header.
    #[error("the batch is shorter than a v2 batch header")]
    ShortHeader,
    /// A field runs past the end of the batch or of its record.
    #[error("truncated: {needed} more bytes needed, {available} left")]
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the batch or record.
        available: usize,
    },
    /// A varint longer than its type allows.
    #[error("malformed varint")]
    BadVarint,
    /// A length below -1, a negative count, or a negative header key length or offset delta.
    #[error("invalid length or count {value}")]
    Negative {
        /// The value as read.
        value: i64,
    },
    /// More records than the bytes of the batch could hold.
    #[error(
        "{count} records claimed, but {available} bytes hold at most {} records",
        available / MIN_RECORD_SIZE
    )]
    TooManyRecords {
        /// The count as read.
        count: i64,
        /// Bytes left for the records.
        available: usize,
    },
    /// More headers than the bytes of the record could hold.
    #[error(
        "{count} headers claimed, but {available} bytes hold at most {} headers",
        available / MIN_HEADER_SIZE
    )]
    TooManyHeaders {
        /// The count as read.
        count: i64,
        /// Bytes left in the record.
        available: usize,
    },
    /// A record whose fields do not fill exactly its declared length.
    #[error("a record declares {declared} bytes but its fields occupy {actual}")]
    RecordLength {
        /// The record's length as declared.
        declared: usize,
        /// What its fields occupied.
        actual: usize,
    },
    /// Bytes after the last record of the batch.
    #[error("{left} bytes after the batch's last record")]
    TrailingBytes {
        /// How many.
        left: usize,
    },
    /// A header key that is not UTF-8.
    #[error("a header key is not UTF-8")]
    HeaderKeyNotUtf8,
    /// An offset beyond `i64::MAX`.
    #[error("an offset overflows i64")]
    OffsetOverflow,
}

/// Why a batch could not be read. See the module docs for which end the iteration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// A batch length too small to reach the magic byte; nothing after it can be read.
    #[error("record batch at byte {at} has an invalid length {length}; the rest of the records cannot be read")]
    BadLength {
        /// Byte position of the batch in the input.
        at: usize,
        /// The length as read.
        length: i32,
    },
    /// A batch in a format other than v2.
    #[error("record batch at offset {base_offset} has magic {magic}; kafka-lock reads only v2 batches (Kafka 0.11 and later)")]
    UnsupportedMagic {
        /// Its base offset.
        base_offset: i64,
        /// Its magic byte.
        magic: i8,
    },
    /// The CRC-32C stored in the batch is not that of its bytes.
    #[error("record batch at offset {base_offset} fails its CRC: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// Its base offset.
        base_offset: i64,
        /// The CRC in the header.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// A compressed batch: kafka-lock has no decompressor.
    #[error("record batch at offsets {base_offset}..={last_offset} is compressed ({}); kafka-lock reads only uncompressed batches: check the topic's compression.type", codec_name(*.codec))]
    Compressed {
        /// Its base offset.
        base_offset: i64,
        /// Its last offset: a caller that chooses to skip it fetches from the next one.
        last_offset: i64,
        /// The codec number (1 gzip, 2 snappy, 3 lz4, 4 zstd).
        codec: u8,
    },
    /// Something inside the batch is malformed.
    #[error("malformed record batch at offset {base_offset}, byte {at}: {reason}")]
    Malformed {
        /// Its base offset.
        base_offset: i64,
        /// Byte position in the input where the malformed field begins.
        at: usize,
        /// What is wrong.
        reason: RecordMalformation,
    },
}

fn codec_name(codec: u8) -> &'static str {
    match codec {
        1 => "gzip",
        2 => "snappy",
        3 => "lz4",
        4 => "zstd",
        _ => "unknown codec",
    }
}

/// The batches of a Fetch response's `records`, in order; see the module docs.
///
/// Iterating yields each complete batch or the error that concerns it, and ends at the end of
/// the input, at a batch cut off there ([`truncated`](Self::truncated)), or after
/// [`BatchError::BadLength`].
#[derive(Debug, Clone)]
pub struct RecordBatches {
    data: Bytes,
    pos: usize,
    done: bool,
    next_offset: Option<i64>,
    resume_offset: Option<i64>,
    truncated: Option<Truncated>,
    control_batches: usize,
}

impl RecordBatches {
    /// Reads batches from `data` (a Fetch response's `records`, which may be empty).
    pub fn new(data: Bytes) -> Self {
        RecordBatches {
            data,
            pos: 0,
            done: false,
            next_offset: None,
            resume_offset: None,
            truncated: None,
            control_batches: 0,
        }
    }

    /// One past the last offset of the last batch read so far (control batches included): where
    /// the next Fetch starts. `None` until a batch was read. Batches reported as errors do not
    /// move it.
    pub fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    /// Like [`next_offset`](Self::next_offset), but past batches reported as errors too, as far
    /// as their header tells where they end: where a reader that skips what it cannot read goes
    /// on. A batch whose length is unusable ([`BatchError::BadLength`]) ends the iteration
    /// without moving it.
    pub fn resume_offset(&self) -> Option<i64> {
        self.resume_offset
    }

    /// One past the last offset of the batch cut off at the end of the input, read from its
    /// header (its CRC cannot be checked): where a reader that cannot get the batch whole goes
    /// on. `None` without a cut-off batch or when too little of its header arrived.
    pub fn truncated_end(&self) -> Option<i64> {
        let t = self.truncated?;
        end_from_header(self.data.get(t.at..)?)
    }

    /// The batch cut off at the end of the input, once the iteration reached it.
    pub fn truncated(&self) -> Option<Truncated> {
        self.truncated
    }

    /// How many control batches were skipped so far.
    pub fn control_batches(&self) -> usize {
        self.control_batches
    }

    fn stop_truncated(&mut self, needed: Option<usize>) {
        self.truncated = Some(Truncated {
            at: self.pos,
            needed,
            available: self.data.len() - self.pos,
        });
        self.done = true;
    }
}

impl Iterator for RecordBatches {
    type Item = Result<RecordBatch, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let at = self.pos;
            let rest = &self.data[at..];
            if rest.is_empty() {
                self.done = true;
                return None;
            }
            let Some(prefix) = rest.get(..LOG_OVERHEAD) else {
                self.stop_truncated(None);
                return None;
            };
            let base_offset = i64::from_be_bytes(array(&prefix[..8]));
            let length = i32::from_be_bytes(array(&prefix[8..12]));
            if length < MIN_LENGTH_FOR_MAGIC {
                self.done = true;
                return Some(Err(BatchError::BadLength { at, length }));
            }
            let total = LOG_OVERHEAD + length as usize;
            if total > rest.len() {
                self.stop_truncated(Some(total));
                return None;
            }
            // From here on the batch's extent is known: whatever is wrong with it, the next batch
            // starts after it.
            self.pos += total;
            let batch = self.data.slice(at..at + total);
            match read_batch(&batch, at, base_offset) {
                Ok(Read::Control { last_offset }) => {
                    self.control_batches += 1;
                    self.next_offset = Some(last_offset.saturating_add(1));
                    self.resume_offset = self.next_offset;
                }
                Ok(Read::Data(b)) => {
                    self.next_offset = Some(b.last_offset.saturating_add(1));
                    self.resume_offset = self.next_offset;
                    return Some(Ok(b));
                }
                Err(e) => {
                    // Past it, as far as its header tells; an older format's offset field is
                    // its last offset, so one past that.
                    let past = end_from_header(&batch).unwrap_or(base_offset.saturating_add(1));
                    self.resume_offset = Some(self.resume_offset.map_or(past, |r| r.max(past)));
                    return Some(Err(e));
                }
            }
        }
        None
    }
}

impl std::iter::FusedIterator for RecordBatches {}

enum Read {
    Data(RecordBatch),
    Control { last_offset: i64 },
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[..N]);
    out
}

/// One past a v2 batch's last offset, from its first 27 bytes (base offset, length, leader
/// epoch, magic, CRC, attributes, last offset delta); `None` when they are not all there, or
/// not a v2 batch, or the numbers are impossible.
fn end_from_header(bytes: &[u8]) -> Option<i64> {
    let header = bytes.get(..27)?;
    if header[16] as i8 != MAGIC {
        return None;
    }
    let base_offset = i64::from_be_bytes(array(&header[..8]));
    let delta = i32::from_be_bytes(array(&header[23..27]));
    if delta < 0 || base_offset < 0 {
        return None;
    }
    base_offset
        .checked_add(i64::from(delta))
        .and_then(|last| last.checked_add(1))
}

/// Reads one complete batch (`batch` is exactly its bytes; `at` its position in the input).
fn read_batch(batch: &Bytes, at: usize, base_offset: i64) -> Result<Read, BatchError> {
    let magic = batch[16] as i8;
    if magic != MAGIC {
        return Err(BatchError::UnsupportedMagic { base_offset, magic });
    }
    let malformed = |offset: usize, reason| BatchError::Malformed {
        base_offset,
        at: at + offset,
        reason,
    };
    if batch.len() < BATCH_HEADER_SIZE {
        return Err(malformed(0, RecordMalformation::ShortHeader));
    }
    let stored = u32::from_be_bytes(array(&batch[17..21]));
    let computed = crc32c::crc32c(&batch[CRC_START..]);
    if stored != computed {
        return Err(BatchError::CrcMismatch {
            base_offset,
            stored,
            computed,
        });
    }
    let attributes = i16::from_be_bytes(array(&batch[21..23]));
    let last_offset_delta = i32::from_be_bytes(array(&batch[23..27]));
    if last_offset_delta < 0 {
        let value = i64::from(last_offset_delta);
        return Err(malformed(23, RecordMalformation::Negative { value }));
    }
    let last_offset = base_offset
        .checked_add(i64::from(last_offset_delta))
        .filter(|o| *o < i64::MAX)
        .ok_or_else(|| malformed(23, RecordMalformation::OffsetOverflow))?;
    let codec = (attributes & CODEC_MASK) as u8;
    if codec != 0 {
        return Err(BatchError::Compressed {
            base_offset,
            last_offset,
            codec,
        });
    }
    if attributes & CONTROL != 0 {
        return Ok(Read::Control { last_offset });
    }
    let base_timestamp = i64::from_be_bytes(array(&batch[27..35]));
    let max_timestamp = i64::from_be_bytes(array(&batch[35..43]));
    let log_append_time = (attributes & LOG_APPEND_TIME != 0).then_some(max_timestamp);
    let count = i32::from_be_bytes(array(&batch[57..61]));
    let available = batch.len() - BATCH_HEADER_SIZE;
    if count < 0 {
        let value = i64::from(count);
        return Err(malformed(57, RecordMalformation::Negative { value }));
    }
    if count as usize > available / MIN_RECORD_SIZE {
        let count = i64::from(count);
        return Err(malformed(
            57,
            RecordMalformation::TooManyRecords { count, available },
        ));
    }

    let mut r = Reader {
        buf: batch,
        pos: BATCH_HEADER_SIZE,
        end: batch.len(),
    };
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let record = r
            .record(base_offset, base_timestamp, log_append_time)
            .map_err(|(offset, reason)| malformed(offset, reason))?;
        records.push(record);
    }
    if r.pos != batch.len() {
        let left = batch.len() - r.pos;
        return Err(malformed(r.pos, RecordMalformation::TrailingBytes { left }));
    }
    Ok(Read::Data(RecordBatch {
        base_offset,
        last_offset,
        partition_leader_epoch: i32::from_be_bytes(array(&batch[12..16])),
        producer_id: i64::from_be_bytes(array(&batch[43..51])),
        transactional: attributes & TRANSACTIONAL != 0,
        records,
    }))
}

/// A failed read: the byte position in the batch and what was wrong.
type Fail = (usize, RecordMalformation);

/// Reads records within `buf[..end]`; `end` narrows to the record being read.
struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    end: usize,
}

impl Reader<'_> {
    fn fail<T>(&self, reason: RecordMalformation) -> Result<T, Fail> {
        Err((self.pos, reason))
    }

    fn take(&mut self, n: usize) -> Result<Bytes, Fail> {
        let available = self.end - self.pos;
        if n > available {
            return self.fail(RecordMalformation::Truncated {
                needed: n,
                available,
            });
        }
        let b = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b)
    }

    /// A zigzag varlong of at most `max_bytes` bytes whose bits fit in `bits`.
    fn zigzag(&mut self, max_bytes: usize, bits: u32) -> Result<i64, Fail> {
        let start = self.pos;
        let mut z: u64 = 0;
        for i in 0..max_bytes {
            let Some(&b) = self.buf[..self.end].get(self.pos) else {
                self.pos = start;
                return self.fail(RecordMalformation::Truncated {
                    needed: i + 1,
                    available: i,
                });
            };
            self.pos += 1;
            let shift = 7 * i as u32;
            let chunk = u64::from(b & 0x7f);
            // The last byte may only hold the bits that are left.
            if shift + 7 > bits && chunk >> (bits - shift) != 0 {
                break;
            }
            z |= chunk << shift;
            if b < 0x80 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        self.pos = start;
        self.fail(RecordMalformation::BadVarint)
    }

    fn varint(&mut self) -> Result<i32, Fail> {
        // The zigzag value fits 32 bits, so its decoding fits i32.
        self.zigzag(5, 32).map(|v| v as i32)
    }

    fn varlong(&mut self) -> Result<i64, Fail> {
        self.zigzag(10, 64)
    }

    /// A varint length: -1 is null (`None`), below that an error.
    fn length(&mut self) -> Result<Option<usize>, Fail> {
        let start = self.pos;
        match self.varint()? {
            -1 => Ok(None),
            n if n >= 0 => Ok(Some(n as usize)),
            n => Err((
                start,
                RecordMalformation::Negative {
                    value: i64::from(n),
                },
            )),
        }
    }

    fn nullable(&mut self) -> Result<Option<Bytes>, Fail> {
        match self.length()? {
            None => Ok(None),
            Some(n) => self.take(n).map(Some),
        }
    }

    fn record(
        &mut self,
        base_offset: i64,
        base_timestamp: i64,
        log_append_time: Option<i64>,
    ) -> Result<Record, Fail> {
        let start = self.pos;
        let declared = match self.length()? {
            Some(n) => n,
            None => return Err((start, RecordMalformation::Negative { value: -1 })),
        };
        let available = self.end - self.pos;
        if declared > available {
            return self.fail(RecordMalformation::Truncated {
                needed: declared,
                available,
            });
        }
        let (outer_end, body) = (self.end, self.pos);
        self.end = self.pos + declared;
        let record = self.record_body(base_offset, base_timestamp, log_append_time)?;
        if self.pos != self.end {
            let actual = self.pos - body;
            return Err((start, RecordMalformation::RecordLength { declared, actual }));
        }
        self.end = outer_end;
        Ok(record)
    }

    fn record_body(
        &mut self,
        base_offset: i64,
        base_timestamp: i64,
        log_append_time: Option<i64>,
    ) -> Result<Record, Fail> {
        self.take(1)?; // attributes: unused by every version of Kafka so far
        let timestamp_delta = self.varlong()?;
        let delta_at = self.pos;
        let offset_delta = self.varint()?;
        if offset_delta < 0 {
            let value = i64::from(offset_delta);
            return Err((delta_at, RecordMalformation::Negative { value }));
        }
        let offset = base_offset
            .checked_add(i64::from(offset_delta))
            .ok_or((delta_at, RecordMalformation::OffsetOverflow))?;
        let key = self.nullable()?;
        let value = self.nullable()?;
        let count_at = self.pos;
        let count = self.varint()?;
        let available = self.end - self.pos;
        if count < 0 {
            let value = i64::from(count);
            return Err((count_at, RecordMalformation::Negative { value }));
        }
        if count as usize > available / MIN_HEADER_SIZE {
            let count = i64::from(count);
            return Err((
                count_at,
                RecordMalformation::TooManyHeaders { count, available },
            ));
        }
        let mut headers = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let key_at = self.pos;
            let Some(key) = self.nullable()? else {
                return Err((key_at, RecordMalformation::Negative { value: -1 }));
            };
            let key = StrBytes::from_utf8(key)
                .map_err(|_| (key_at, RecordMalformation::HeaderKeyNotUtf8))?;
            let value = self.nullable()?;
            headers.push(Header { key, value });
        }
        Ok(Record {
            offset,
            timestamp: log_append_time.unwrap_or(base_timestamp.wrapping_add(timestamp_delta)),
            key,
            value,
            headers,
        })
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
