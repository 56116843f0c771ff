//! The ring's wire format, shared by the CPU producer ([`crate::ring::core`]) and the GPU consumer
//! (`kernels/ring.cu`, whose `#define`s mirror every constant here).
//!
//! The data region is `capacity` bytes (a power of two, at least [`MIN_CAPACITY`]). Positions are
//! `u64` byte counters that only grow; a position's byte lives at `pos & (capacity - 1)`. Every
//! record starts at a [`RECORD_ALIGN`]-aligned position with a [`RecordHeader`] followed by `len`
//! payload bytes, the whole record padded to [`RECORD_ALIGN`]. In the default
//! [`WrapMode::Padded`] records never straddle the end of the region: a record that would is
//! preceded by a wrap PAD record (seq [`WRAP_PAD_SEQ`]) that runs exactly to the end, and starts
//! at offset 0. In [`WrapMode::Mirrored`] a record runs past the end and continues at offset 0,
//! for consumers that see the region mapped twice back to back. A PAD record whose seq is not
//! [`WRAP_PAD_SEQ`] is an abandoned reservation: it keeps its sequence number so DATA and
//! abandoned records together number 0, 1, 2, ... without gaps.
//!
//! The test payload format ([`seal_test_payload`], [`test_checksum`]) and the result words
//! (`RESULT_*`) are what the test kernels verify and report; [`verify_records`] is their CPU
//! reference and must give the same numbers.
#![forbid(unsafe_code)]

/// Smallest data region, in bytes.
pub const MIN_CAPACITY: u64 = 4096;
/// Alignment of every record start and of every record's size.
pub const RECORD_ALIGN: u64 = 16;
/// Size of a [`RecordHeader`] in the ring.
pub const HEADER_LEN: u64 = 16;
/// Byte offset of `len` (u32, little-endian) inside the header.
pub const HEADER_LEN_OFFSET: usize = 0;
/// Byte offset of `kind` (u32, little-endian) inside the header.
pub const HEADER_KIND_OFFSET: usize = 4;
/// Byte offset of `seq` (u64, little-endian) inside the header.
pub const HEADER_SEQ_OFFSET: usize = 8;
/// `kind` of a record that carries payload for the consumer.
pub const KIND_DATA: u32 = 1;
/// `kind` of a record the consumer skips (wrap padding or an abandoned reservation).
pub const KIND_PAD: u32 = 2;
/// `seq` of a wrap PAD record, which consumes no sequence number.
pub const WRAP_PAD_SEQ: u64 = u64::MAX;
/// Largest payload of any record, whatever the capacity (so a record's size fits in 2^32 bytes).
pub const MAX_PAYLOAD: u32 = !(RECORD_ALIGN as u32 - 1);

/// Bytes at the start of a test payload: the record's seq, then the checksum of the rest.
pub const TEST_PREFIX_LEN: usize = 16;

/// Result word: number of DATA records seen.
pub const RESULT_RECORDS: usize = 0;
/// Result word: wrapping sum of the checksums computed over the DATA payloads.
pub const RESULT_CHECKSUM_SUM: usize = 1;
/// Result word: number of errors (bad seq, bad checksum, short payload, broken chain, ...).
pub const RESULT_ERRORS: usize = 2;
/// Result word: next expected seq (last seq seen + 1).
pub const RESULT_NEXT_SEQ: usize = 3;
/// Result word: position the walk reached (the batch kernel's `to` when the chain is intact).
pub const RESULT_POS: usize = 4;
/// Number of `u64` words to allocate for a result block (the kernels use the first five).
pub const RESULT_WORDS: usize = 8;
/// `expected_seq_start` value telling `ring_consume_batch` to continue from `result[3]`.
pub const SEQ_FROM_RESULT: u64 = u64::MAX;
/// Threads per block of the checking kernels of `kernels/ring.cu` (`ring_check_lanes`,
/// `ring_consume_persistent`, `ring_consume_batch`): 16 warps, four per scheduler partition, so
/// each thread may use 128 registers (17 warps leave 96, and the persistent kernels spilled); a
/// 16 KiB window. A block of another size counts one error and checks nothing.
pub const CHECK_THREADS: u32 = 512;

/// How records meet the end of the data region. `#[repr(u32)]`: it is a field of the
/// [`RingDeviceView`](crate::ring::RingDeviceView) kernels take (`VKGDR_RING_PADDED` = 0,
/// `VKGDR_RING_MIRRORED` = 1 in `include/vkgdr/ring.cuh`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrapMode {
    /// A record never crosses the end of the region: the bytes left before the end become a wrap
    /// PAD record and the record starts at offset 0 of the next lap. Works on any memory, but a
    /// large record can waste up to its own size at each wrap.
    #[default]
    Padded = 0,
    /// A record may run past the end of the region and continues at offset 0, with no padding. A
    /// GPU consumer must see the region mapped a second time right after itself (a mirrored
    /// [`Arena`](crate::Arena), as
    /// [`DeviceRing::new_mirrored`](crate::ring::DeviceRing::new_mirrored) builds) so it reads
    /// every record contiguously; CPU consumers use [`read_wrapped`].
    Mirrored = 1,
}

/// Copies `out.len()` bytes (at most the capacity) starting at region offset `offset` (taken
/// modulo the capacity), continuing at offset 0 if the span runs past the end: how a CPU consumer
/// reads a record of a [`WrapMode::Mirrored`] ring.
///
/// ```
/// use vkgdr::ring::layout::read_wrapped;
/// let mut region = vec![0u8; 4096];
/// region[4094..].copy_from_slice(&[1, 2]);
/// region[..2].copy_from_slice(&[3, 4]);
/// let mut out = [0u8; 4];
/// read_wrapped(&region[..], 4094, &mut out);
/// assert_eq!(out, [1, 2, 3, 4]);
/// ```
///
/// # Panics
/// If `out` is longer than the capacity, or the capacity is not a power of two.
pub fn read_wrapped<S: RingSource + ?Sized>(src: &S, offset: u64, out: &mut [u8]) {
    let capacity = src.capacity();
    assert!(capacity.is_power_of_two() && out.len() as u64 <= capacity);
    let offset = offset & (capacity - 1);
    let first = (capacity - offset).min(out.len() as u64) as usize;
    let (head, rest) = out.split_at_mut(first);
    src.read(offset, head);
    if !rest.is_empty() {
        src.read(0, rest);
    }
}

/// Size in the ring of a record with a `len`-byte payload: header plus payload, rounded up to
/// [`RECORD_ALIGN`].
///
/// ```
/// use vkgdr::ring::layout::record_size;
/// assert_eq!(record_size(0), 16);
/// assert_eq!(record_size(1), 32);
/// assert_eq!(record_size(16), 32);
/// assert_eq!(record_size(17), 48);
/// ```
pub const fn record_size(len: u32) -> u64 {
    (HEADER_LEN + len as u64 + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1)
}

/// The 16-byte header at the start of every record (little-endian in the ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordHeader {
    /// Payload bytes after the header (not counting the padding to 16).
    pub len: u32,
    /// [`KIND_DATA`] or [`KIND_PAD`].
    pub kind: u32,
    /// Sequence number, or [`WRAP_PAD_SEQ`] for a wrap PAD record.
    pub seq: u64,
}

impl RecordHeader {
    /// The header of a DATA record.
    pub const fn data(len: u32, seq: u64) -> Self {
        Self {
            len,
            kind: KIND_DATA,
            seq,
        }
    }

    /// The header of a wrap PAD record that fills `bytes` (header included) up to the region's
    /// end; `bytes` is a multiple of 16 and at least 16.
    pub const fn wrap_pad(bytes: u64) -> Self {
        Self {
            len: (bytes - HEADER_LEN) as u32,
            kind: KIND_PAD,
            seq: WRAP_PAD_SEQ,
        }
    }

    /// The bytes as stored in the ring.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[HEADER_LEN_OFFSET..HEADER_LEN_OFFSET + 4].copy_from_slice(&self.len.to_le_bytes());
        b[HEADER_KIND_OFFSET..HEADER_KIND_OFFSET + 4].copy_from_slice(&self.kind.to_le_bytes());
        b[HEADER_SEQ_OFFSET..HEADER_SEQ_OFFSET + 8].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes the bytes stored in the ring.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[HEADER_SEQ_OFFSET..HEADER_SEQ_OFFSET + 8]);
        Self {
            len: u32_at(HEADER_LEN_OFFSET),
            kind: u32_at(HEADER_KIND_OFFSET),
            seq: u64::from_le_bytes(seq),
        }
    }

    /// Size of the whole record in the ring.
    pub const fn record_size(&self) -> u64 {
        record_size(self.len)
    }
}

/// One term of [`test_checksum`]: a multiply-xorshift of a 32-bit word and its index.
const fn checksum_term(index: u64, word: u32) -> u64 {
    let x = ((index << 32) | word as u64)
        .wrapping_add(1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

/// Checksum of a test payload's body (the bytes after [`TEST_PREFIX_LEN`]).
///
/// `sum over i of mix((i << 32) | w[i])` (wrapping) over the body's little-endian 32-bit words
/// `w[i]` (the last one zero-filled), with `mix(x) = y ^ (y >> 29)`,
/// `y = (x + 1) * 0x9E3779B97F4A7C15`. A sum of independent terms rather than FNV-1a so a thread
/// block can compute it in parallel; the index in each term catches moved or swapped words, the
/// word catches any changed byte. A term per word, not per byte: a GPU checker pays a 64-bit
/// multiply-xorshift per term, and per byte that work, not the reading, set its speed.
///
/// ```
/// use vkgdr::ring::layout::test_checksum;
/// assert_eq!(test_checksum(&[]), 0);
/// assert_ne!(test_checksum(&[1, 2]), test_checksum(&[2, 1]));
/// assert_ne!(test_checksum(&[1, 2, 3, 4, 5]), test_checksum(&[5, 2, 3, 4, 1]));
/// ```
pub fn test_checksum(body: &[u8]) -> u64 {
    body.chunks(4).enumerate().fold(0u64, |acc, (i, bytes)| {
        let mut w = [0u8; 4];
        w[..bytes.len()].copy_from_slice(bytes);
        acc.wrapping_add(checksum_term(i as u64, u32::from_le_bytes(w)))
    })
}

/// Turns `payload` into a test payload for the record numbered `seq`: writes `seq` into bytes
/// 0..8 and [`test_checksum`] of bytes 16.. into bytes 8..16 (both little-endian). Fill the body
/// first. Returns the checksum, or `None` (payload untouched) when the payload is shorter than
/// [`TEST_PREFIX_LEN`].
pub fn seal_test_payload(payload: &mut [u8], seq: u64) -> Option<u64> {
    if payload.len() < TEST_PREFIX_LEN {
        return None;
    }
    let sum = test_checksum(&payload[TEST_PREFIX_LEN..]);
    payload[0..8].copy_from_slice(&seq.to_le_bytes());
    payload[8..16].copy_from_slice(&sum.to_le_bytes());
    Some(sum)
}

/// Whether `payload` is an intact test payload of the record numbered `seq`.
pub fn check_test_payload(payload: &[u8], seq: u64) -> bool {
    if payload.len() < TEST_PREFIX_LEN {
        return false;
    }
    let word = |o: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&payload[o..o + 8]);
        u64::from_le_bytes(w)
    };
    word(0) == seq && word(8) == test_checksum(&payload[TEST_PREFIX_LEN..])
}

/// Read access to a ring's data region, for CPU-side consumers and checks.
pub trait RingSource {
    /// Size of the data region in bytes.
    fn capacity(&self) -> u64;
    /// Copies `out.len()` bytes from `offset`. Callers in this module only ask for ranges with
    /// `offset + out.len() <= capacity()` and only after checking that the capacity is valid.
    fn read(&self, offset: u64, out: &mut [u8]);
}

impl RingSource for [u8] {
    fn capacity(&self) -> u64 {
        self.len() as u64
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        let start = offset as usize;
        out.copy_from_slice(&self[start..start + out.len()]);
    }
}

/// Why a record chain cannot be walked further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The source's capacity is not a power of two of at least [`MIN_CAPACITY`].
    #[error("capacity {0} is not a power of two >= {MIN_CAPACITY}")]
    BadCapacity(u64),
    /// A record position is not 16-byte aligned.
    #[error("record position {0} is not 16-byte aligned")]
    Misaligned(u64),
    /// The header's kind is neither DATA nor PAD.
    #[error("record at {pos} has unknown kind {kind}")]
    BadKind {
        /// Record position.
        pos: u64,
        /// The kind found.
        kind: u32,
    },
    /// The record runs past the end of the data region.
    #[error("record at {pos} of {size} bytes crosses the end of the region")]
    CrossesEnd {
        /// Record position.
        pos: u64,
        /// Record size.
        size: u64,
    },
    /// The record runs past the end of the walked range (the tail).
    #[error("record at {pos} of {size} bytes runs past the tail {to}")]
    PastTail {
        /// Record position.
        pos: u64,
        /// Record size.
        size: u64,
        /// End of the walked range.
        to: u64,
    },
}

/// Reads and checks the header of the record at `pos` (which must be below `to`); returns it with
/// the position of the next record. The same checks, in effect, as the kernels' walker.
pub fn next_record<S: RingSource + ?Sized>(
    src: &S,
    pos: u64,
    to: u64,
) -> Result<(RecordHeader, u64), FormatError> {
    next_record_in(src, pos, to, WrapMode::Padded)
}

/// [`next_record`] for a ring in `mode`: in [`WrapMode::Mirrored`] a record may cross the end of
/// the region.
pub fn next_record_in<S: RingSource + ?Sized>(
    src: &S,
    pos: u64,
    to: u64,
    mode: WrapMode,
) -> Result<(RecordHeader, u64), FormatError> {
    let capacity = src.capacity();
    if !capacity.is_power_of_two() || capacity < MIN_CAPACITY {
        return Err(FormatError::BadCapacity(capacity));
    }
    if !pos.is_multiple_of(RECORD_ALIGN) {
        return Err(FormatError::Misaligned(pos));
    }
    let offset = pos & (capacity - 1);
    let mut raw = [0u8; 16];
    src.read(offset, &mut raw);
    let header = RecordHeader::from_bytes(&raw);
    if header.kind != KIND_DATA && header.kind != KIND_PAD {
        return Err(FormatError::BadKind {
            pos,
            kind: header.kind,
        });
    }
    let size = header.record_size();
    if mode == WrapMode::Padded && offset + size > capacity {
        return Err(FormatError::CrossesEnd { pos, size });
    }
    if to < pos || size > to - pos {
        return Err(FormatError::PastTail { pos, size, to });
    }
    Ok((header, pos + size))
}

/// What [`verify_records`] (and the kernels, in their result words) report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// DATA records seen ([`RESULT_RECORDS`]).
    pub records: u64,
    /// Wrapping sum of the computed payload checksums ([`RESULT_CHECKSUM_SUM`]).
    pub checksum_sum: u64,
    /// Errors ([`RESULT_ERRORS`]).
    pub errors: u64,
    /// Next expected seq ([`RESULT_NEXT_SEQ`]).
    pub next_seq: u64,
    /// Where the walk stopped ([`RESULT_POS`]).
    pub pos: u64,
}

/// Walks the records in `[from, to)` and checks them the way `ring_consume_batch` does: DATA and
/// abandoned-PAD seqs must continue from `expected_seq` without gaps (after a mismatch counting
/// resumes from the seq found), wrap PADs must end exactly at the region's end, DATA payloads
/// must be intact test payloads ([`check_test_payload`]). A broken chain (see [`FormatError`]), an
/// invalid capacity, or a range that is reversed or longer than the capacity counts one error and
/// stops the walk.
pub fn verify_records<S: RingSource + ?Sized>(
    src: &S,
    from: u64,
    to: u64,
    expected_seq: u64,
) -> VerifyReport {
    verify_records_in(src, from, to, expected_seq, WrapMode::Padded)
}

/// [`verify_records`] for a ring in `mode`, as the `_mirrored` kernels check a
/// [`WrapMode::Mirrored`] ring: records may cross the end of the region (wrap PADs, which such a
/// ring never writes, are still accepted when they end exactly at the region's end).
pub fn verify_records_in<S: RingSource + ?Sized>(
    src: &S,
    from: u64,
    to: u64,
    expected_seq: u64,
    mode: WrapMode,
) -> VerifyReport {
    let mut rep = VerifyReport {
        next_seq: expected_seq,
        pos: from,
        ..VerifyReport::default()
    };
    let capacity = src.capacity();
    let capacity_ok = capacity.is_power_of_two() && capacity >= MIN_CAPACITY;
    if !capacity_ok || to < from || to - from > capacity {
        rep.errors = 1;
        return rep;
    }
    let mut payload = Vec::new();
    while rep.pos < to {
        let Ok((h, next)) = next_record_in(src, rep.pos, to, mode) else {
            rep.errors += 1;
            break;
        };
        let offset = rep.pos & (capacity - 1);
        if h.kind == KIND_PAD && h.seq == WRAP_PAD_SEQ {
            if offset + h.record_size() != capacity {
                rep.errors += 1;
            }
        } else {
            if h.seq != rep.next_seq {
                rep.errors += 1;
            }
            rep.next_seq = h.seq.wrapping_add(1);
            if h.kind == KIND_DATA {
                rep.records += 1;
                if (h.len as usize) < TEST_PREFIX_LEN {
                    rep.errors += 1;
                } else {
                    payload.resize(h.len as usize, 0);
                    read_wrapped(src, offset + HEADER_LEN, &mut payload);
                    let sum = test_checksum(&payload[TEST_PREFIX_LEN..]);
                    rep.checksum_sum = rep.checksum_sum.wrapping_add(sum);
                    if !check_test_payload(&payload, h.seq) {
                        rep.errors += 1;
                    }
                }
            }
        }
        rep.pos = next;
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(buf: &mut [u8], offset: u64, bytes: &[u8]) {
        buf[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
    }

    #[test]
    fn header_round_trips_little_endian() {
        let h = RecordHeader::data(0x0102_0304, 0x1122_3344_5566_7788);
        let b = h.to_bytes();
        assert_eq!(&b[0..4], &[4, 3, 2, 1]);
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(b[8], 0x88);
        assert_eq!(RecordHeader::from_bytes(&b), h);
        let pad = RecordHeader::wrap_pad(48);
        assert_eq!((pad.len, pad.kind, pad.seq), (32, KIND_PAD, WRAP_PAD_SEQ));
        assert_eq!(pad.record_size(), 48);
    }

    #[test]
    fn record_size_limits() {
        assert_eq!(record_size(MAX_PAYLOAD), 1 << 32);
        assert_eq!(record_size(u32::MAX), (1 << 32) + 16);
    }

    #[test]
    fn checksum_matches_definition() {
        let body = [7u8, 0, 255, 1, 9, 0x80];
        let words = [0x01ff_0007u64, 0x8009];
        let mut want = 0u64;
        for (i, &w) in words.iter().enumerate() {
            let y = (((i as u64) << 32) | w)
                .wrapping_add(1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            want = want.wrapping_add(y ^ (y >> 29));
        }
        assert_eq!(test_checksum(&body), want);
    }

    /// Pinned values: `kernels/ring.cu` computes the same function and was checked against
    /// these results on a GPU; a change here breaks that parity.
    #[test]
    fn checksum_is_pinned() {
        assert_eq!(test_checksum(b"vkgdr"), 13_635_658_653_587_013_718);
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(test_checksum(&all), 11_364_518_746_816_104_725);
    }

    #[test]
    fn seal_and_check() {
        let mut p = vec![0u8; 40];
        p[16..]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        assert_eq!(seal_test_payload(&mut p, 9), Some(test_checksum(&p[16..])));
        assert!(check_test_payload(&p, 9));
        assert!(!check_test_payload(&p, 8));
        p[30] ^= 1;
        assert!(!check_test_payload(&p, 9));
        let mut short = [0u8; 15];
        assert_eq!(seal_test_payload(&mut short, 1), None);
        assert_eq!(short, [0u8; 15]);
        assert!(!check_test_payload(&short, 0));
    }

    /// A hand-built ring image: DATA(seq 0), abandoned PAD(seq 1), DATA(seq 2), wrap PAD, DATA(3)
    /// at offset 0 of the next lap.
    fn image() -> (Vec<u8>, u64, u64) {
        let cap = MIN_CAPACITY;
        let mut buf = vec![0u8; cap as usize];
        let data = |buf: &mut Vec<u8>, pos: u64, len: u32, seq: u64| {
            let mut p = vec![0xA5u8; len as usize];
            seal_test_payload(&mut p, seq).unwrap();
            put(buf, pos % cap, &RecordHeader::data(len, seq).to_bytes());
            put(buf, pos % cap + 16, &p);
            pos + record_size(len)
        };
        let start = cap - 256;
        let mut pos = data(&mut buf, start, 20, 0);
        let pad = RecordHeader {
            len: 30,
            kind: KIND_PAD,
            seq: 1,
        };
        put(&mut buf, pos % cap, &pad.to_bytes());
        pos += pad.record_size();
        pos = data(&mut buf, pos, 100, 2);
        let rest = cap - pos % cap;
        put(
            &mut buf,
            pos % cap,
            &RecordHeader::wrap_pad(rest).to_bytes(),
        );
        pos += rest;
        pos = data(&mut buf, pos, 16, 3);
        (buf, start, pos)
    }

    #[test]
    fn verify_walks_a_wrapped_chain() {
        let (buf, from, to) = image();
        let rep = verify_records(buf.as_slice(), from, to, 0);
        assert_eq!(rep.errors, 0, "{rep:?}");
        assert_eq!((rep.records, rep.next_seq, rep.pos), (3, 4, to));
        // A second walk starting at a later record needs the later seq.
        let (_, second) = next_record(buf.as_slice(), from, to).unwrap();
        let rep = verify_records(buf.as_slice(), second, to, 0);
        assert_eq!(rep.errors, 1);
        assert_eq!(rep.next_seq, 4);
    }

    #[test]
    fn verify_counts_each_fault() {
        let (buf, from, to) = image();
        let cap = buf.len() as u64;
        // Corrupt a payload byte of the first record: one checksum error, chain intact.
        let mut b = buf.clone();
        b[(from % cap + 34) as usize] ^= 0xFF;
        let rep = verify_records(b.as_slice(), from, to, 0);
        assert_eq!((rep.errors, rep.records, rep.pos), (1, 3, to));
        // Unknown kind: chain broken, walk stops at that record.
        let mut b = buf.clone();
        b[(from % cap + 4) as usize] = 9;
        let rep = verify_records(b.as_slice(), from, to, 0);
        assert_eq!((rep.errors, rep.records, rep.pos), (1, 0, from));
        // Range ending inside a record.
        let rep = verify_records(buf.as_slice(), from, from + 16, 0);
        assert_eq!((rep.errors, rep.pos), (1, from));
        // Reversed, oversized and misaligned ranges.
        assert_eq!(verify_records(buf.as_slice(), to, from, 0).errors, 1);
        assert_eq!(verify_records(buf.as_slice(), 0, cap + 16, 0).errors, 1);
        assert_eq!(verify_records(buf.as_slice(), from + 8, to, 0).errors, 1);
        // Bad capacity.
        assert_eq!(
            next_record(&buf[..100], 0, 16),
            Err(FormatError::BadCapacity(100))
        );
    }
}
