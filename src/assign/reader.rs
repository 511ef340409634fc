//! A bounds-checked cursor over untrusted peer bytes.
//!
//! Every length or count read from the input is checked against the bytes that are really left
//! before anything is allocated, so a few hostile bytes can never ask for gigabytes.

use super::PeerDataError;

/// Cursor over a byte slice that only ever hands out sub-slices of its input.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], PeerDataError> {
        if n > self.buf.len() {
            return Err(PeerDataError::Truncated { what });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], PeerDataError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, PeerDataError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, PeerDataError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i16(&mut self, what: &'static str) -> Result<i16, PeerDataError> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, PeerDataError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    /// Reads `len` bytes as UTF-8, refusing lengths above `max` before looking at the data.
    pub(crate) fn utf8(
        &mut self,
        len: usize,
        max: usize,
        what: &'static str,
    ) -> Result<String, PeerDataError> {
        if len > max {
            return Err(PeerDataError::TooLong { what, len, max });
        }
        let raw = self.take(len, what)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| PeerDataError::InvalidUtf8 { what })
    }

    /// Kafka's classic non-nullable STRING: i16 length, then UTF-8.
    pub(crate) fn kafka_string(&mut self, what: &'static str) -> Result<String, PeerDataError> {
        match self.kafka_nullable_string(what)? {
            Some(s) => Ok(s),
            None => Err(PeerDataError::OutOfRange { what, value: -1 }),
        }
    }

    /// Kafka's classic NULLABLE_STRING: i16 length (-1 = null), then UTF-8.
    pub(crate) fn kafka_nullable_string(
        &mut self,
        what: &'static str,
    ) -> Result<Option<String>, PeerDataError> {
        let len = self.i16(what)?;
        match len {
            -1 => Ok(None),
            n if n < 0 => Err(PeerDataError::OutOfRange {
                what,
                value: i64::from(n),
            }),
            // i16 lengths can never exceed i16::MAX, so the wire format is the only bound needed.
            n => self.utf8(n as usize, i16::MAX as usize, what).map(Some),
        }
    }

    /// Skips Kafka's classic NULLABLE_BYTES (i32 length, -1 = null) without copying it.
    pub(crate) fn skip_kafka_nullable_bytes(
        &mut self,
        what: &'static str,
    ) -> Result<(), PeerDataError> {
        let len = self.i32(what)?;
        match len {
            -1 => Ok(()),
            n if n < 0 => Err(PeerDataError::OutOfRange {
                what,
                value: i64::from(n),
            }),
            n => self.take(n as usize, what).map(drop),
        }
    }

    /// Reads a classic ARRAY count (i32) for a non-nullable array whose elements take at least
    /// `min_elem` bytes each, and rejects counts the remaining input cannot possibly hold.
    ///
    /// This is the check kafka-protocol's own decoders lack: they reserve capacity for the claimed
    /// count before reading a single element.
    pub(crate) fn array_len(
        &mut self,
        min_elem: usize,
        what: &'static str,
    ) -> Result<usize, PeerDataError> {
        let count = self.i32(what)?;
        if count < 0 {
            return Err(PeerDataError::OutOfRange {
                what,
                value: i64::from(count),
            });
        }
        let count = count as usize;
        if count.saturating_mul(min_elem) > self.remaining() {
            return Err(PeerDataError::Truncated { what });
        }
        Ok(count)
    }
}
