//! The interpreter: runs a compiled [`Program`] over a body, checking every bound of the module
//! docs without allocating.

use super::program::{Label, Op, Program};
use super::{DecodeError, Location, Malformation, ALLOCATION_OVERHEAD, UNKNOWN_TAG_COST};
use kafka_protocol::messages::ApiKey;

/// Signals that the scan stopped; the reason is in [`Scanner::error`]. A zero-sized error keeps
/// the hot path's results in registers.
pub(super) struct Stop;

pub(super) struct Scanner<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
    /// Exclusive end of the region being read: the body, or a known tagged field's value.
    pub(super) end: usize,
    pub(super) heap: usize,
    pub(super) allocations: usize,
    pub(super) error: Option<Malformation>,
    /// The innermost operation that failed, and the offset it started at.
    pub(super) at: Option<(Label, usize)>,
}

impl<'a> Scanner<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Scanner {
            buf,
            pos: 0,
            end: buf.len(),
            heap: 0,
            allocations: 0,
            error: None,
            at: None,
        }
    }

    pub(super) fn into_parts(self) -> (Location, Malformation) {
        let ((structure, field), offset) = self.at.unwrap_or((("", ""), self.pos));
        let reason = self.error.unwrap_or(Malformation::Truncated {
            needed: 0,
            available: 0,
        });
        (
            Location {
                offset,
                structure,
                field,
            },
            reason,
        )
    }

    pub(super) fn into_error(self, api: ApiKey, version: i16) -> DecodeError {
        let (at, reason) = self.into_parts();
        DecodeError::Malformed {
            api: crate::api::Api::of(api),
            version,
            at,
            reason,
        }
    }

    #[cold]
    fn fail(&mut self, reason: Malformation) -> Stop {
        self.error = Some(reason);
        Stop
    }

    #[inline(always)]
    fn available(&self) -> usize {
        self.end - self.pos
    }

    #[inline(always)]
    fn skip(&mut self, n: usize) -> Result<(), Stop> {
        if n > self.available() {
            let available = self.available();
            return Err(self.fail(Malformation::Truncated {
                needed: n,
                available,
            }));
        }
        self.pos += n;
        Ok(())
    }

    #[inline(always)]
    pub(super) fn take_array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let start = self.pos;
        self.skip(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[start..start + N]);
        Ok(out)
    }

    /// Same value as kafka-protocol's `UnsignedVarInt` for every canonical encoding; rejects what
    /// it would silently truncate.
    #[inline(always)]
    fn uvarint(&mut self) -> Result<u32, Stop> {
        // Nearly every varint on these paths (lengths, counts, tag sections) is one byte.
        if self.pos < self.end {
            if let Some(&b) = self.buf.get(self.pos) {
                if b < 0x80 {
                    self.pos += 1;
                    return Ok(u32::from(b));
                }
            }
        }
        self.uvarint_slow()
    }

    fn uvarint_slow(&mut self) -> Result<u32, Stop> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let [b] = self.take_array::<1>()?;
            if i == 4 && b > 0x0f {
                return Err(self.fail(Malformation::BadVarint));
            }
            value |= u32::from(b & 0x7f) << (i * 7);
            if b < 0x80 {
                return Ok(value);
            }
        }
        Err(self.fail(Malformation::BadVarint))
    }

    /// A classic length or count: -1 is null (`None`), below that is an error.
    #[inline(always)]
    fn classic(&mut self, n: i32) -> Result<Option<usize>, Stop> {
        match n {
            -1 => Ok(None),
            n if n >= 0 => Ok(Some(n as usize)),
            length => Err(self.fail(Malformation::NegativeLength {
                length: i64::from(length),
            })),
        }
    }

    /// A compact length or count: stored plus one, 0 is null.
    #[inline(always)]
    fn compact(&mut self) -> Result<Option<usize>, Stop> {
        Ok(match self.uvarint()? {
            0 => None,
            n => Some(n as usize - 1),
        })
    }

    #[inline(always)]
    fn count(&mut self, compact: bool) -> Result<Option<usize>, Stop> {
        if compact {
            self.compact()
        } else {
            let n = i32::from_be_bytes(self.take_array::<4>()?);
            self.classic(n)
        }
    }

    #[inline(always)]
    fn data(&mut self, len: Option<usize>) -> Result<(), Stop> {
        if let Some(len) = len {
            self.skip(len)?;
            if len > 0 {
                self.allocations += 1;
                self.charge(len.saturating_add(ALLOCATION_OVERHEAD));
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn charge(&mut self, bytes: usize) {
        self.heap = self.heap.saturating_add(bytes);
    }

    /// Checks an array count against the bytes left.
    #[inline(always)]
    fn fits(&mut self, count: usize, min: usize) -> Result<(), Stop> {
        let available = self.available();
        if count > available / min {
            return Err(self.fail(Malformation::ArrayTooLong {
                count: count as u64,
                min_size: min,
                available,
            }));
        }
        Ok(())
    }

    pub(super) fn run(
        &mut self,
        p: &'static Program,
        ops: &'static [Op],
        labels: &'static [Label],
    ) -> Result<(), Stop> {
        let mut i = 0;
        while let Some(&op) = ops.get(i) {
            let (at, start) = (i, self.pos);
            let step = match op {
                Op::Skip(n) => self.skip(n as usize),
                Op::Classic { n, wide } => self.classic_run(n, wide),
                Op::Compacts(n) => self.compact_run(n),
                Op::Int32s { compact } => self.count(compact).and_then(|count| match count {
                    Some(count) => {
                        self.fits(count, 4)?;
                        self.charge(count * 4);
                        self.skip(count * 4)
                    }
                    None => Ok(()),
                }),
                Op::Array {
                    compact,
                    min,
                    mem,
                    len,
                } => {
                    let body = i + 1..i + 1 + len as usize;
                    i += len as usize;
                    self.array(
                        p,
                        compact,
                        min as usize,
                        mem as usize,
                        &ops[body.clone()],
                        &labels[body],
                    )
                }
                // Almost every tagged section is empty: one zero byte, checked inline.
                Op::Tags { .. } if self.pos < self.end && self.buf.get(self.pos) == Some(&0) => {
                    self.pos += 1;
                    Ok(())
                }
                Op::Tags { known } => self.tags(p, known),
            };
            if step.is_err() {
                if self.at.is_none() {
                    self.at = labels.get(at).map(|&l| (l, start));
                }
                return step;
            }
            i += 1;
        }
        Ok(())
    }

    #[inline(always)]
    fn compact_run(&mut self, n: u32) -> Result<(), Stop> {
        for _ in 0..n {
            let len = self.compact()?;
            self.data(len)?;
        }
        Ok(())
    }

    #[inline(always)]
    fn classic_run(&mut self, n: u8, wide: u8) -> Result<(), Stop> {
        for j in 0..n {
            let len = if wide & (1 << j) != 0 {
                i32::from_be_bytes(self.take_array::<4>()?)
            } else {
                i32::from(i16::from_be_bytes(self.take_array::<2>()?))
            };
            let len = self.classic(len)?;
            self.data(len)?;
        }
        Ok(())
    }

    fn array(
        &mut self,
        p: &'static Program,
        compact: bool,
        min: usize,
        mem: usize,
        ops: &'static [Op],
        labels: &'static [Label],
    ) -> Result<(), Stop> {
        let Some(count) = self.count(compact)? else {
            return Ok(());
        };
        self.fits(count, min)?;
        self.charge(count.saturating_mul(mem));
        for _ in 0..count {
            self.run(p, ops, labels)?;
        }
        Ok(())
    }

    pub(super) fn tags(&mut self, p: &'static Program, known: u32) -> Result<(), Stop> {
        let count = self.uvarint()? as usize;
        // Each tagged field needs at least a tag byte and a size byte.
        if count > self.available() / 2 {
            let available = self.available();
            return Err(self.fail(Malformation::TooManyTaggedFields {
                count: count as u64,
                available,
            }));
        }
        let set = p.tag_sets.get(known as usize).map_or(&[][..], |s| &s[..]);
        for _ in 0..count {
            let tag = self.uvarint()?;
            let size = self.uvarint()? as usize;
            if size > self.available() {
                let available = self.available();
                return Err(self.fail(Malformation::Truncated {
                    needed: size,
                    available,
                }));
            }
            match set.iter().find(|k| k.tag == tag) {
                None => {
                    self.pos += size;
                    self.charge(UNKNOWN_TAG_COST);
                }
                Some(k) => {
                    let (start, outer_end) = (self.pos, self.end);
                    self.end = start + size;
                    let scanned = self.run(p, &k.ops, &k.labels);
                    self.end = outer_end;
                    if scanned.is_err() {
                        if let Some(((s, f), _)) = &mut self.at {
                            if s.is_empty() {
                                *s = "tagged field";
                                *f = k.name;
                            }
                        }
                        return scanned;
                    }
                    if self.pos - start != size {
                        let actual = self.pos - start;
                        return Err(self.fail(Malformation::TaggedFieldSize {
                            tag,
                            declared: size,
                            actual,
                        }));
                    }
                }
            }
        }
        Ok(())
    }
}
