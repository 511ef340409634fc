use super::*;
use proptest::prelude::*;

fn header(key: &'static str, value: Option<&'static [u8]>) -> Header {
    Header {
        key: StrBytes::from_static_str(key),
        value: value.map(Bytes::from_static),
    }
}

fn sample() -> Vec<NewRecord> {
    vec![
        NewRecord {
            timestamp: 1_764_547_200_000,
            key: Some(Bytes::from_static(b"nightly-report")),
            value: Some(Bytes::from_static(b"ACQUIRED generation=7")),
            headers: vec![header("kind", Some(b"acquired")), header("kind", None)],
        },
        // Null key and value, no headers, an earlier timestamp (negative delta).
        NewRecord {
            timestamp: 1_764_547_199_000,
            ..NewRecord::default()
        },
        // Empty (not null) key and value; a value long enough for a multi-byte length.
        NewRecord {
            timestamp: 1_764_547_300_000,
            key: Some(Bytes::new()),
            value: Some(Bytes::from(vec![0xab; 300])),
            headers: vec![header("", Some(b""))],
        },
    ]
}

fn encode(records: &[NewRecord]) -> BytesMut {
    let mut out = BytesMut::new();
    encode_batch(records, &mut out).unwrap();
    out
}

/// What the broker does to a batch it appends: sets the base offset (outside the CRC).
fn at_offset(mut batch: BytesMut, base_offset: i64) -> BytesMut {
    batch[..8].copy_from_slice(&base_offset.to_be_bytes());
    batch
}

/// Rewrites the CRC after a test changed covered bytes, so the change reaches the checks after
/// the CRC's.
fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

fn expected(records: &[NewRecord], base_offset: i64) -> Vec<Record> {
    records
        .iter()
        .zip(base_offset..)
        .map(|(r, offset)| Record {
            offset,
            timestamp: r.timestamp,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r.headers.clone(),
        })
        .collect()
}

fn all(data: impl Into<Bytes>) -> (Vec<Result<RecordBatch, BatchError>>, RecordBatches) {
    let mut it = RecordBatches::new(data.into());
    let items = it.by_ref().collect();
    (items, it)
}

#[test]
fn our_batches_round_trip() {
    let records = sample();
    let batch = at_offset(encode(&records), 41);
    // The header a plain producer writes.
    assert_eq!(batch[16], 2, "magic");
    assert_eq!(&batch[21..23], &[0, 0], "attributes");
    assert_eq!(&batch[23..27], &2i32.to_be_bytes(), "last offset delta");
    assert_eq!(&batch[43..51], &(-1i64).to_be_bytes(), "producer id");
    assert_eq!(&batch[51..53], &(-1i16).to_be_bytes(), "producer epoch");
    assert_eq!(&batch[53..57], &(-1i32).to_be_bytes(), "base sequence");
    let len = i32::from_be_bytes(batch[8..12].try_into().unwrap()) as usize;
    assert_eq!(len + 12, batch.len());

    let (items, it) = all(batch.freeze());
    let [Ok(b)] = &items[..] else {
        panic!("{items:?}")
    };
    assert_eq!(b.records, expected(&records, 41));
    assert_eq!((b.base_offset, b.last_offset), (41, 43));
    assert_eq!((b.producer_id, b.transactional), (-1, false));
    assert_eq!(it.next_offset(), Some(44));
    assert_eq!(it.truncated(), None);
}

#[test]
fn keys_and_values_share_the_input() {
    let data = encode(&sample()).freeze();
    let (items, _) = all(data.clone());
    let batch = items[0].as_ref().unwrap();
    let key = batch.records[0].key.as_ref().unwrap();
    let within = data.as_ptr_range();
    assert!(
        within.contains(&key.as_ptr()),
        "the key is a slice of the input"
    );
    let value = batch.records[2].value.as_ref().unwrap();
    assert!(within.contains(&value.as_ptr()));
}

#[test]
fn several_batches_and_the_next_offset() {
    let mut data = at_offset(encode(&sample()[..1]), 0);
    data.extend_from_slice(&at_offset(encode(&sample()), 1));
    data.extend_from_slice(&at_offset(encode(&sample()[1..]), 4));
    let (items, it) = all(data.freeze());
    let offsets: Vec<Vec<i64>> = items
        .iter()
        .map(|b| {
            b.as_ref()
                .unwrap()
                .records
                .iter()
                .map(|r| r.offset)
                .collect()
        })
        .collect();
    assert_eq!(offsets, [vec![0], vec![1, 2, 3], vec![4, 5]]);
    assert_eq!(it.next_offset(), Some(6));
}

#[test]
fn empty_input_is_no_batch() {
    let (items, it) = all(Bytes::new());
    assert!(items.is_empty());
    assert_eq!((it.next_offset(), it.truncated()), (None, None));
}

#[test]
fn every_cut_stops_at_the_last_complete_batch() {
    let first = at_offset(encode(&sample()[..1]), 10);
    let mut data = first.clone();
    data.extend_from_slice(&at_offset(encode(&sample()), 11));
    let data = data.freeze();
    for cut in 0..data.len() {
        let (items, it) = all(data.slice(..cut));
        assert!(items.iter().all(|b| b.is_ok()), "cut {cut}: {items:?}");
        let complete = usize::from(cut >= first.len());
        assert_eq!(items.len(), complete, "cut {cut}");
        assert_eq!(it.next_offset(), (complete == 1).then_some(11), "cut {cut}");
        if cut == 0 || cut == first.len() {
            assert_eq!(it.truncated(), None, "cut {cut}");
            continue;
        }
        let t = it.truncated().unwrap_or_else(|| panic!("cut {cut}"));
        let at = if complete == 1 { first.len() } else { 0 };
        assert_eq!(t.at, at);
        assert_eq!(t.available, cut - at);
        let whole = if complete == 1 {
            data.len() - first.len()
        } else {
            first.len()
        };
        assert_eq!(t.needed, (t.available >= 12).then_some(whole), "cut {cut}");
    }
}

#[test]
fn a_crc_mismatch_is_typed_and_the_next_batch_is_still_read() {
    let mut bad = at_offset(encode(&sample()), 5);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let mut data = bad.clone();
    data.extend_from_slice(&at_offset(encode(&sample()[..1]), 8));
    let (items, it) = all(data.freeze());
    let stored = u32::from_be_bytes(bad[17..21].try_into().unwrap());
    match &items[0] {
        Err(BatchError::CrcMismatch {
            base_offset: 5,
            stored: s,
            computed,
        }) => {
            assert_eq!(*s, stored);
            assert_ne!(*computed, stored);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(items[1].as_ref().unwrap().base_offset, 8);
    assert_eq!(items.len(), 2);
    assert_eq!(it.next_offset(), Some(9));
    // The CRC covers the attributes too: a flipped compression bit is caught as corruption.
    let mut bad = encode(&sample());
    bad[22] |= 1;
    assert!(matches!(
        all(bad.freeze()).0[..],
        [Err(BatchError::CrcMismatch { .. })]
    ));
}

#[test]
fn a_rejected_batch_is_passed_by_resume_offset_only() {
    // Offsets 5..=7 corrupt, then 8 readable: a reader skipping the bad batch resumes at 9 even
    // if the readable one were absent, and never at the high watermark.
    let mut bad = at_offset(encode(&sample()), 5);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let (_, it) = all(bad.clone().freeze());
    assert_eq!(
        (it.next_offset(), it.resume_offset()),
        (None, Some(5 + sample().len() as i64))
    );
    let mut data = bad;
    data.extend_from_slice(&at_offset(encode(&sample()[..1]), 8));
    let (_, it) = all(data.freeze());
    assert_eq!(it.resume_offset(), Some(9));
}

#[test]
fn a_cut_off_batch_tells_its_end_from_its_header() {
    let batch = at_offset(encode(&sample()), 40).freeze();
    let end = 40 + sample().len() as i64;
    for cut in 1..batch.len() {
        let (items, it) = all(batch.slice(..cut));
        assert!(items.is_empty());
        assert_eq!(it.truncated_end(), (cut >= 27).then_some(end), "cut {cut}");
    }
    let (_, it) = all(batch.clone());
    assert_eq!(it.truncated_end(), None);
}

#[test]
fn compressed_batches_are_a_typed_error_with_the_offsets_to_skip() {
    for codec in 1..=7u8 {
        let mut batch = at_offset(encode(&sample()), 100);
        // The records stay uncompressed: the decoder must not look at them.
        batch[22] |= codec;
        fix_crc(&mut batch);
        let mut data = batch;
        data.extend_from_slice(&at_offset(encode(&sample()[..1]), 103));
        let (items, it) = all(data.freeze());
        assert_eq!(
            items[0],
            Err(BatchError::Compressed {
                base_offset: 100,
                last_offset: 102,
                codec
            })
        );
        let msg = items[0].as_ref().unwrap_err().to_string();
        assert!(msg.contains("compression.type"), "{msg}");
        assert_eq!(items[1].as_ref().unwrap().base_offset, 103);
        assert_eq!(it.next_offset(), Some(104));
    }
}

#[test]
fn control_batches_are_skipped_but_counted() {
    let mut control = at_offset(encode(&sample()[1..2]), 7);
    control[22] |= 0x30; // control, transactional
    fix_crc(&mut control);
    let (items, it) = all(control.clone().freeze());
    assert!(items.is_empty(), "{items:?}");
    assert_eq!(it.next_offset(), Some(8));
    assert_eq!(it.control_batches(), 1);

    let mut data = at_offset(encode(&sample()[..1]), 6);
    data.extend_from_slice(&control);
    let (items, it) = all(data.freeze());
    assert_eq!(items.len(), 1);
    assert_eq!(it.next_offset(), Some(8));
}

#[test]
fn transactional_batches_say_so() {
    let mut batch = encode(&sample());
    batch[22] |= 0x10;
    batch[43..51].copy_from_slice(&9i64.to_be_bytes());
    fix_crc(&mut batch);
    let b = all(batch.freeze()).0.remove(0).unwrap();
    assert_eq!((b.transactional, b.producer_id), (true, 9));
}

#[test]
fn log_append_time_gives_every_record_the_batch_time() {
    let mut batch = encode(&sample());
    batch[22] |= 0x08;
    batch[35..43].copy_from_slice(&1_800_000_000_000i64.to_be_bytes());
    fix_crc(&mut batch);
    let b = all(batch.freeze()).0.remove(0).unwrap();
    assert!(b.records.iter().all(|r| r.timestamp == 1_800_000_000_000));
}

#[test]
fn other_magics_are_a_typed_error() {
    for magic in [0u8, 1, 3, 0xff] {
        let mut batch = encode(&sample());
        batch[16] = magic;
        let mut data = batch;
        data.extend_from_slice(&at_offset(encode(&sample()[..1]), 3));
        let (items, _) = all(data.freeze());
        assert_eq!(
            items[0],
            Err(BatchError::UnsupportedMagic {
                base_offset: 0,
                magic: magic as i8
            })
        );
        assert!(items[1].is_ok());
    }
}

#[test]
fn a_length_that_cannot_reach_the_magic_ends_the_iteration() {
    for length in [i32::MIN, -1, 0, 4] {
        let mut data = BytesMut::new();
        data.put_i64(0);
        data.put_i32(length);
        data.extend_from_slice(&encode(&sample()));
        let (items, it) = all(data.freeze());
        assert_eq!(items, [Err(BatchError::BadLength { at: 0, length })]);
        assert_eq!(it.next_offset(), None);
    }
    // Long enough for the magic but not for a header: this batch only.
    let mut data = BytesMut::new();
    data.put_i64(0);
    data.put_i32(20);
    data.put_i32(-1);
    data.put_i8(2);
    data.extend_from_slice(&[0; 15]);
    data.extend_from_slice(&encode(&sample()));
    let (items, _) = all(data.freeze());
    assert!(matches!(
        items[0],
        Err(BatchError::Malformed {
            reason: RecordMalformation::ShortHeader,
            ..
        })
    ));
    assert!(items[1].is_ok());
}

/// A batch header (CRC fixed up) followed by `body` as its records section.
fn handmade(count: i32, body: &[u8]) -> BytesMut {
    let mut batch = encode(&sample()[1..2]);
    batch.truncate(BATCH_HEADER_SIZE);
    batch[57..61].copy_from_slice(&count.to_be_bytes());
    batch.extend_from_slice(body);
    let len = (batch.len() - LOG_OVERHEAD) as i32;
    batch[8..12].copy_from_slice(&len.to_be_bytes());
    fix_crc(&mut batch);
    batch
}

fn malformation(batch: BytesMut) -> (usize, RecordMalformation) {
    match all(batch.freeze()).0.remove(0) {
        Err(BatchError::Malformed { at, reason, .. }) => (at, reason),
        other => panic!("{other:?}"),
    }
}

/// The log cleaner can leave a batch whose records were all compacted away (it keeps the batch for
/// its producer's state): a count of 0 is an empty batch, not a malformation.
#[test]
fn a_batch_with_no_records_is_data() {
    let (items, it) = all(handmade(0, &[]).freeze());
    match &items[..] {
        [Ok(b)] => assert!(b.records.is_empty(), "{b:?}"),
        other => panic!("{other:?}"),
    }
    assert!(it.truncated().is_none());
}

/// Huge claimed counts and lengths: refused before anything is reserved. Reserving for any of
/// them would take tens to hundreds of gigabytes, an allocation that fails (and aborts this test
/// process) on any machine with less memory than that.
#[test]
fn huge_claimed_counts_are_refused_before_allocating() {
    let (at, reason) = malformation(handmade(i32::MAX, &[]));
    assert_eq!(at, 57);
    assert_eq!(
        reason,
        RecordMalformation::TooManyRecords {
            count: i32::MAX.into(),
            available: 0
        }
    );
    // 14 bytes of records hold two at most.
    assert!(matches!(
        malformation(handmade(3, &[0; 14])).1,
        RecordMalformation::TooManyRecords { count: 3, .. }
    ));
    // One record claiming i32::MAX headers: length 10, attributes, deltas, null key and value,
    // then a header count of i32::MAX (zigzag 0xfffffffe, five bytes).
    let record = [20, 0, 0, 0, 1, 1, 0xfe, 0xff, 0xff, 0xff, 0x0f];
    assert!(matches!(
        malformation(handmade(1, &record)),
        (
            _,
            RecordMalformation::TooManyHeaders {
                count: 2147483647,
                available: 0
            }
        )
    ));
    // A key and a record claiming 2^31 - 1 bytes.
    let record = [20, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0x0f, 1, 0];
    assert!(matches!(
        malformation(handmade(1, &record)).1,
        RecordMalformation::Truncated {
            needed: 2147483647,
            ..
        }
    ));
    let record = [0xfe, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 1, 1, 0];
    assert!(matches!(
        malformation(handmade(1, &record)).1,
        RecordMalformation::Truncated {
            needed: 2147483647,
            ..
        }
    ));
    // A batch length of 2 GiB is only ever a cut batch: nothing is read or reserved for it.
    let mut data = BytesMut::new();
    data.put_i64(0);
    data.put_i32(i32::MAX);
    data.extend_from_slice(&[2; 64]);
    let (items, it) = all(data.freeze());
    assert!(items.is_empty());
    assert_eq!(it.truncated().unwrap().needed, Some(i32::MAX as usize + 12));
}

#[test]
fn malformed_records_are_typed_with_their_position() {
    let start = BATCH_HEADER_SIZE;
    // Declared length 7 but the fields take 6 (then one stray byte inside the record).
    let r = [14, 0, 0, 0, 1, 1, 0, 0];
    assert_eq!(
        malformation(handmade(1, &r)),
        (
            start,
            RecordMalformation::RecordLength {
                declared: 7,
                actual: 6
            }
        )
    );
    // A byte after the last record.
    let r = [12, 0, 0, 0, 1, 1, 0, 9];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start + 7, RecordMalformation::TrailingBytes { left: 1 })
    );
    let r = [12, 0, 0, 0, 1, 1, 0, 9, 9, 9];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start + 7, RecordMalformation::TrailingBytes { left: 3 })
    );
    // A six-byte varint as the timestamp delta is fine (varlong), as the offset delta it is not.
    let r = [22, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0, 1, 1, 0];
    assert!(all(handmade(1, &r).freeze()).0[0].is_ok());
    let r = [20, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 1, 0];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start + 3, RecordMalformation::BadVarint)
    );
    // A fifth varint byte with bits beyond 32.
    let r = [20, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 1, 1, 0];
    assert_eq!(
        malformation(handmade(1, &r)).1,
        RecordMalformation::BadVarint
    );
    // A negative offset delta, a key length below -1, a null header key, a header key that is
    // not UTF-8.
    let r = [12, 0, 0, 1, 1, 1, 0];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start + 3, RecordMalformation::Negative { value: -1 })
    );
    let r = [12, 0, 0, 0, 3, 1, 0];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start + 4, RecordMalformation::Negative { value: -2 })
    );
    let r = [16, 0, 0, 0, 1, 1, 2, 1, 1];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start + 7, RecordMalformation::Negative { value: -1 })
    );
    let r = [18, 0, 0, 0, 1, 1, 2, 2, 0xff, 1];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start + 7, RecordMalformation::HeaderKeyNotUtf8)
    );
    // A null record length.
    let r = [1, 0, 0, 0, 1, 1, 0];
    assert_eq!(
        malformation(handmade(1, &r)),
        (start, RecordMalformation::Negative { value: -1 })
    );
}

#[test]
fn offsets_past_i64_max_are_refused() {
    let batch = at_offset(encode(&sample()), i64::MAX - 1);
    assert!(matches!(
        all(batch.freeze()).0[..],
        [Err(BatchError::Malformed {
            reason: RecordMalformation::OffsetOverflow,
            ..
        })]
    ));
}

#[test]
fn encode_errors_leave_the_buffer_untouched() {
    let mut out = BytesMut::from(&b"keep"[..]);
    assert_eq!(encode_batch(&[], &mut out), Err(EncodeBatchError::Empty));
    assert_eq!(&out[..], b"keep");
}

#[test]
fn varint_sizes_match_the_encoding() {
    for v in [
        0i64,
        1,
        -1,
        63,
        -64,
        64,
        -65,
        8191,
        8192,
        i32::MAX.into(),
        i32::MIN.into(),
    ] {
        let mut out = BytesMut::new();
        put_varlong(&mut out, v);
        assert_eq!(out.len(), varlong_size(v), "{v}");
    }
    for v in [i64::MAX, i64::MIN] {
        let mut out = BytesMut::new();
        put_varlong(&mut out, v);
        assert_eq!(out.len(), 10);
        assert_eq!(varlong_size(v), 10);
    }
}

/// The heap a decoded batch holds, counting every vector's capacity and
/// [`guard::ALLOCATION_OVERHEAD`](crate::wire::guard::ALLOCATION_OVERHEAD) per allocation.
fn heap(b: &RecordBatch) -> usize {
    use crate::wire::guard::ALLOCATION_OVERHEAD;
    use std::mem::size_of;
    let mut heap = b.records.capacity() * size_of::<Record>() + ALLOCATION_OVERHEAD;
    for r in &b.records {
        if r.headers.capacity() > 0 {
            heap += r.headers.capacity() * size_of::<Header>() + ALLOCATION_OVERHEAD;
        }
    }
    heap
}

/// The amplification bound, at its worst cases: the smallest records, and records made of the
/// smallest headers.
#[test]
fn decoded_batches_stay_within_the_amplification_bound() {
    let empty = NewRecord::default();
    let one_header = NewRecord {
        headers: vec![header("", None)],
        ..NewRecord::default()
    };
    let many_headers = NewRecord {
        headers: vec![header("", None); 500],
        ..NewRecord::default()
    };
    for records in [
        vec![empty.clone(); 1],
        vec![empty; 5000],
        vec![one_header; 5000],
        vec![many_headers; 20],
    ] {
        let batch = encode(&records);
        let len = batch.len();
        let b = all(batch.freeze()).0.remove(0).unwrap();
        let ratio = heap(&b) as f64 / len as f64;
        eprintln!(
            "{} records: {len} bytes, {ratio:.1} heap bytes per byte",
            records.len()
        );
        assert!(heap(&b) <= MAX_AMPLIFICATION * len, "ratio {ratio}");
    }
}

fn arb_bytes() -> impl Strategy<Value = Option<Bytes>> {
    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200).prop_map(Bytes::from))
}

fn arb_record() -> impl Strategy<Value = NewRecord> {
    (
        any::<i64>(),
        arb_bytes(),
        arb_bytes(),
        proptest::collection::vec(("[a-z\u{e9}]{0,6}", arb_bytes()), 0..4),
    )
        .prop_map(|(timestamp, key, value, headers)| NewRecord {
            timestamp,
            key,
            value,
            headers: headers
                .into_iter()
                .map(|(k, value)| Header {
                    key: StrBytes::from_string(k),
                    value,
                })
                .collect(),
        })
}

proptest! {
    #[test]
    fn any_records_round_trip(
        records in proptest::collection::vec(arb_record(), 1..8),
        base in 0i64..i64::MAX / 2,
    ) {
        let batch = at_offset(encode(&records), base);
        let (items, it) = all(batch.freeze());
        prop_assert_eq!(items.len(), 1);
        let b = items.into_iter().next().unwrap().unwrap();
        prop_assert_eq!(b.records, expected(&records, base));
        prop_assert_eq!(it.next_offset(), Some(base + records.len() as i64));
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let len = data.len();
        for b in RecordBatches::new(Bytes::from(data)).flatten() {
            prop_assert!(b.records.len() <= len / MIN_RECORD_SIZE);
        }
    }

    #[test]
    fn mutated_batches_never_panic_and_stay_bounded(
        records in proptest::collection::vec(arb_record(), 1..4),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        crc in any::<bool>(),
    ) {
        let mut batch = encode(&records);
        for (at, byte) in flips {
            let i = at.index(batch.len());
            batch[i] = byte;
        }
        if crc && batch.len() >= BATCH_HEADER_SIZE {
            fix_crc(&mut batch);
        }
        let len = batch.len();
        for b in RecordBatches::new(batch.freeze()).flatten() {
            prop_assert!(heap(&b) <= MAX_AMPLIFICATION * len);
        }
    }
}
