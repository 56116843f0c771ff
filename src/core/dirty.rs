//! Tracking of byte ranges that must be flushed (or invalidated) on non-coherent mapped memory.
//!
//! On memory without `HOST_COHERENT`, CPU writes become visible to the device only after
//! `vkFlushMappedMemoryRanges`, and device writes become visible to the CPU only after
//! `vkInvalidateMappedMemoryRanges`. Both take ranges whose offset is a multiple of
//! `nonCoherentAtomSize` and whose size is a multiple of it or reaches the end of the allocation.
//!
//! [`DirtyRanges`] records the byte ranges touched inside one allocation (a "chunk") and keeps
//! them already rounded to atoms, sorted, disjoint and non-adjacent, so the caller can issue one
//! batched flush per chunk with the minimal number of valid ranges. It performs no FFI and no
//! heap allocation in steady state.
//!
//! ```
//! use vkgdr::dirty::DirtyRanges;
//!
//! # fn main() -> Result<(), vkgdr::dirty::DirtyError> {
//! // 1000-byte allocation, nonCoherentAtomSize = 64.
//! let mut dirty = DirtyRanges::new(1000, 64)?;
//! dirty.mark(10, 4)?; // rounds to [0, 64)
//! dirty.mark(64, 1)?; // adjacent after rounding: merges into [0, 128)
//! dirty.mark(990, 5)?; // last atom is partial: clamped to [960, 1000)
//! assert_eq!(dirty.ranges().collect::<Vec<_>>(), [(0, 128), (960, 40)]);
//!
//! let mut batch = Vec::with_capacity(8);
//! dirty.take_into(&mut batch); // build VkMappedMemoryRange values from `batch`, flush once
//! assert!(dirty.is_empty());
//! assert_eq!(batch, [(0, 128), (960, 40)]);
//! # Ok(()) }
//! ```

use std::fmt;

/// Default cap on the number of disjoint ranges kept by [`DirtyRanges::new`].
///
/// 64 ranges keep one flush call short (the driver walks the array) while merging only when
/// writes are scattered over more than 64 separate places in the chunk.
pub const DEFAULT_MAX_RANGES: usize = 64;

/// Capacity reserved up front; a larger cap still works, the vector then grows on demand.
const PREALLOCATED_RANGES: usize = DEFAULT_MAX_RANGES;

/// Errors from [`DirtyRanges`]. On error the tracker is left unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DirtyError {
    /// The allocation size given to [`DirtyRanges::new`] was zero.
    #[error("allocation size is zero")]
    ZeroSize,
    /// The atom size (`nonCoherentAtomSize`) is zero or not a power of two.
    #[error("atom size {atom} is not a non-zero power of two")]
    AtomNotPowerOfTwo {
        /// The rejected atom size.
        atom: u64,
    },
    /// The cap on the number of ranges was zero.
    #[error("max_ranges must be at least 1")]
    ZeroMaxRanges,
    /// The range does not lie inside the allocation.
    #[error("range at offset {offset} with length {len} is outside the {size}-byte allocation")]
    OutOfBounds {
        /// Start of the rejected range.
        offset: u64,
        /// Length of the rejected range.
        len: u64,
        /// Size of the allocation.
        size: u64,
    },
    /// `offset + len` does not fit in a `u64`.
    #[error("range at offset {offset} with length {len} overflows u64")]
    Overflow {
        /// Start of the rejected range.
        offset: u64,
        /// Length of the rejected range.
        len: u64,
    },
}

/// Pending atom-rounded byte ranges of one mapped allocation.
///
/// Invariants, which every method keeps:
/// - ranges are sorted, disjoint and non-adjacent (a gap of at least one atom separates two);
/// - every range starts on a multiple of the atom and ends on a multiple of the atom or at
///   `size`, and lies inside `0..size`;
/// - there are at most `max_ranges` ranges.
///
/// Without the cap the ranges are exactly the atoms (the last one clamped to `size`) that hold
/// at least one marked byte, coalesced. When a mark or remove would leave `max_ranges + 1`
/// ranges, the two neighbours with the smallest gap between them (the leftmost such pair on a
/// tie) are merged, so the gap is flushed too. Flushing bytes that were not written is always
/// correct, just slower; a cap keeps each flush call short whatever the write pattern, and the
/// smallest-gap choice adds the fewest extra bytes for that one merge.
#[derive(Clone, PartialEq, Eq)]
pub struct DirtyRanges {
    size: u64,
    atom: u64,
    max_ranges: usize,
    /// Half-open `[start, end)` pairs with the invariants above.
    ranges: Vec<(u64, u64)>,
}

impl fmt::Debug for DirtyRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirtyRanges")
            .field("size", &self.size)
            .field("atom", &self.atom)
            .field("max_ranges", &self.max_ranges)
            .field("ranges", &RangeList(&self.ranges))
            .finish()
    }
}

/// Prints ranges as `[start..end)` to keep `Debug` output readable.
struct RangeList<'a>(&'a [(u64, u64)]);

impl fmt::Debug for RangeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|&(s, e)| s..e))
            .finish()
    }
}

impl DirtyRanges {
    /// Creates an empty tracker for an allocation of `size` bytes with the given
    /// `nonCoherentAtomSize`, capped at [`DEFAULT_MAX_RANGES`] ranges.
    ///
    /// `size` need not be a multiple of `atom`: the last range is then clamped to `size`. An
    /// `atom` larger than `size` is allowed (every mark then covers the whole allocation).
    ///
    /// # Errors
    /// [`DirtyError::ZeroSize`] if `size` is 0, [`DirtyError::AtomNotPowerOfTwo`] if `atom` is 0
    /// or not a power of two.
    pub fn new(size: u64, atom: u64) -> Result<Self, DirtyError> {
        Self::with_max_ranges(size, atom, DEFAULT_MAX_RANGES)
    }

    /// Like [`new`](Self::new) with an explicit cap on the number of ranges kept; pass
    /// `usize::MAX` for no cap.
    ///
    /// # Errors
    /// As [`new`](Self::new), plus [`DirtyError::ZeroMaxRanges`] if `max_ranges` is 0.
    pub fn with_max_ranges(size: u64, atom: u64, max_ranges: usize) -> Result<Self, DirtyError> {
        if size == 0 {
            return Err(DirtyError::ZeroSize);
        }
        if !atom.is_power_of_two() {
            return Err(DirtyError::AtomNotPowerOfTwo { atom });
        }
        if max_ranges == 0 {
            return Err(DirtyError::ZeroMaxRanges);
        }
        // +1: an insertion briefly holds max_ranges + 1 ranges before the merge.
        let capacity = max_ranges.min(PREALLOCATED_RANGES) + 1;
        Ok(Self {
            size,
            atom,
            max_ranges,
            ranges: Vec::with_capacity(capacity),
        })
    }

    /// Size of the tracked allocation in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The atom (`nonCoherentAtomSize`) ranges are rounded to.
    pub fn atom(&self) -> u64 {
        self.atom
    }

    /// The cap on the number of pending ranges.
    pub fn max_ranges(&self) -> usize {
        self.max_ranges
    }

    /// Records that bytes `offset..offset + len` were written (or must be invalidated).
    ///
    /// The range is widened to whole atoms (clamped to the allocation's end) and merged with
    /// every pending range it overlaps or touches. `len == 0` is a no-op. Costs
    /// O(log n + merged ranges), or O(n) when the cap forces a merge; no heap allocation once
    /// the vector holds `max_ranges + 1` slots (reserved up front for caps up to 64).
    ///
    /// # Errors
    /// [`DirtyError::Overflow`] if `offset + len` overflows, [`DirtyError::OutOfBounds`] if the
    /// range does not fit in the allocation (an `offset` past the end is an error even when
    /// `len == 0`, as with slice indexing). The tracker is unchanged on error.
    pub fn mark(&mut self, offset: u64, len: u64) -> Result<(), DirtyError> {
        let end = self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let start = offset & !(self.atom - 1);
        // Overflow of the round-up means the rounded end lies past `size`, so clamp to it.
        let end = end
            .checked_next_multiple_of(self.atom)
            .map_or(self.size, |e| e.min(self.size));
        self.insert(start, end);
        Ok(())
    }

    /// Marks the whole allocation as one range.
    pub fn mark_all(&mut self) {
        self.ranges.clear();
        self.ranges.push((0, self.size));
    }

    /// Forgets the atoms lying entirely inside `offset..offset + len`, e.g. after flushing or
    /// invalidating that part of the allocation.
    ///
    /// The range is narrowed to whole atoms (an atom ending at `size` counts as whole): atoms
    /// only partly covered stay pending, because other bytes in them may still be dirty.
    /// Keeping extra bytes pending is always correct. A remove that splits one range in two
    /// may hit the cap, which then merges the closest pair as [`mark`](Self::mark) does
    /// (possibly restoring the removed gap).
    ///
    /// # Errors
    /// As [`mark`](Self::mark); the tracker is unchanged on error.
    pub fn remove(&mut self, offset: u64, len: u64) -> Result<(), DirtyError> {
        let end = self.check(offset, len)?;
        // No multiple of the atom at or after `offset` fits in u64: no whole atom to remove.
        let Some(start) = offset.checked_next_multiple_of(self.atom) else {
            return Ok(());
        };
        let end = if end == self.size {
            end
        } else {
            end & !(self.atom - 1)
        };
        if start >= end {
            return Ok(());
        }
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        let j = self.ranges.partition_point(|&(s, _)| s < end);
        if i >= j {
            return Ok(());
        }
        let (first_start, _) = self.ranges[i];
        let (_, last_end) = self.ranges[j - 1];
        let left = (first_start < start).then_some((first_start, start));
        let right = (last_end > end).then_some((end, last_end));
        match (left, right) {
            (None, None) => {
                self.ranges.drain(i..j);
            }
            (Some(piece), None) | (None, Some(piece)) => {
                self.ranges[i] = piece;
                self.ranges.drain(i + 1..j);
            }
            (Some(l), Some(r)) => {
                self.ranges[i] = l;
                if j - i >= 2 {
                    self.ranges[i + 1] = r;
                    self.ranges.drain(i + 2..j);
                } else {
                    self.ranges.insert(i + 1, r);
                    self.enforce_cap();
                }
            }
        }
        Ok(())
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of disjoint pending ranges (the `memoryRangeCount` of the next flush).
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Total bytes covered by the pending (rounded) ranges.
    pub fn pending_bytes(&self) -> u64 {
        self.ranges.iter().map(|&(s, e)| e - s).sum()
    }

    /// The pending ranges as `(offset, len)`: sorted, disjoint, non-adjacent, offsets
    /// atom-aligned, each ending on an atom boundary or at the allocation's end.
    pub fn ranges(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + DoubleEndedIterator + '_ {
        self.ranges.iter().map(|&(s, e)| (s, e - s))
    }

    /// True if any pending (rounded) range shares a byte with `offset..offset + len`.
    ///
    /// Total: `len == 0` gives false, and a range reaching past the allocation (or past
    /// `u64::MAX`) is simply cut there.
    pub fn intersects(&self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let end = offset.saturating_add(len);
        let i = self.ranges.partition_point(|&(_, e)| e <= offset);
        self.ranges.get(i).is_some_and(|&(s, _)| s < end)
    }

    /// Forgets all pending ranges (after a successful flush); keeps the vector's capacity.
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// Appends the pending ranges to `out` as `(offset, len)` and clears the tracker. Does not
    /// allocate when `out` has room for [`len`](Self::len) more elements.
    pub fn take_into(&mut self, out: &mut Vec<(u64, u64)>) {
        out.extend(self.ranges());
        self.ranges.clear();
    }

    /// Validates `offset..offset + len` against the allocation and returns its end.
    fn check(&self, offset: u64, len: u64) -> Result<u64, DirtyError> {
        let end = offset
            .checked_add(len)
            .ok_or(DirtyError::Overflow { offset, len })?;
        if end > self.size {
            return Err(DirtyError::OutOfBounds {
                offset,
                len,
                size: self.size,
            });
        }
        Ok(end)
    }

    /// Inserts the rounded range `[start, end)`, merging with every range it overlaps or touches.
    fn insert(&mut self, start: u64, end: u64) {
        // Ring-buffer pattern: the new range starts at or after the last range's start.
        if let Some(last) = self.ranges.last_mut() {
            if start >= last.0 {
                if start <= last.1 {
                    last.1 = last.1.max(end);
                } else {
                    self.ranges.push((start, end));
                    self.enforce_cap();
                }
                return;
            }
        }
        // First range that ends at or after `start` (touching counts), and first range
        // that starts after `end`; everything in between merges.
        let i = self.ranges.partition_point(|&(_, e)| e < start);
        let j = self.ranges.partition_point(|&(s, _)| s <= end);
        if i == j {
            self.ranges.insert(i, (start, end));
            self.enforce_cap();
        } else {
            let merged_start = start.min(self.ranges[i].0);
            let merged_end = end.max(self.ranges[j - 1].1);
            self.ranges[i] = (merged_start, merged_end);
            self.ranges.drain(i + 1..j);
        }
    }

    /// Brings the count back to `max_ranges` by merging the closest pair of neighbours.
    /// Callers add at most one range at a time, so one merge suffices.
    fn enforce_cap(&mut self) {
        if self.ranges.len() <= self.max_ranges {
            return;
        }
        let mut best = 0;
        let mut best_gap = u64::MAX;
        for (k, pair) in self.ranges.windows(2).enumerate() {
            let gap = pair[1].0 - pair[0].1;
            if gap < best_gap {
                best_gap = gap;
                best = k;
            }
        }
        self.ranges[best].1 = self.ranges[best + 1].1;
        self.ranges.remove(best + 1);
        debug_assert!(self.ranges.len() <= self.max_ranges);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(d: &DirtyRanges) -> Vec<(u64, u64)> {
        d.ranges().collect()
    }

    #[test]
    fn constructor_errors() {
        assert_eq!(DirtyRanges::new(0, 64), Err(DirtyError::ZeroSize));
        assert_eq!(
            DirtyRanges::new(100, 0),
            Err(DirtyError::AtomNotPowerOfTwo { atom: 0 })
        );
        assert_eq!(
            DirtyRanges::new(100, 48),
            Err(DirtyError::AtomNotPowerOfTwo { atom: 48 })
        );
        assert_eq!(
            DirtyRanges::with_max_ranges(100, 64, 0),
            Err(DirtyError::ZeroMaxRanges)
        );
        let d = DirtyRanges::with_max_ranges(100, 1, 3).unwrap();
        assert_eq!((d.size(), d.atom(), d.max_ranges()), (100, 1, 3));
        assert!(d.is_empty());
    }

    #[test]
    fn rounds_start_down_and_end_up() {
        let mut d = DirtyRanges::new(4096, 64).unwrap();
        d.mark(65, 1).unwrap();
        assert_eq!(list(&d), [(64, 64)]);
        d.mark(200, 100).unwrap(); // 192..320
        assert_eq!(list(&d), [(64, 64), (192, 128)]);
        assert_eq!(d.len(), 2);
        assert_eq!(d.pending_bytes(), 192);
    }

    #[test]
    fn aligned_range_is_kept_exactly() {
        let mut d = DirtyRanges::new(4096, 256).unwrap();
        d.mark(512, 256).unwrap();
        assert_eq!(list(&d), [(512, 256)]);
    }

    #[test]
    fn clamps_at_unaligned_end() {
        let mut d = DirtyRanges::new(1000, 64).unwrap();
        d.mark(999, 1).unwrap();
        assert_eq!(list(&d), [(960, 40)]);
        d.mark(0, 1000).unwrap();
        assert_eq!(list(&d), [(0, 1000)]);
        // Atom larger than the allocation: any byte dirties everything.
        let mut small = DirtyRanges::new(10, 256).unwrap();
        small.mark(3, 1).unwrap();
        assert_eq!(list(&small), [(0, 10)]);
    }

    #[test]
    fn merges_ranges_adjacent_after_rounding() {
        let mut d = DirtyRanges::new(4096, 64).unwrap();
        d.mark(0, 10).unwrap(); // 0..64
        d.mark(130, 2).unwrap(); // 128..192
        assert_eq!(d.len(), 2);
        d.mark(100, 1).unwrap(); // 64..128 touches both
        assert_eq!(list(&d), [(0, 192)]);
        // Touching from the left merges too.
        d.mark(300, 1).unwrap(); // 256..320
        d.mark(200, 1).unwrap(); // 192..256: bridges 0..192 and 256..320
        assert_eq!(list(&d), [(0, 320)]);
    }

    #[test]
    fn merge_spanning_many_ranges_and_insert_in_middle() {
        let mut d = DirtyRanges::new(1 << 20, 16).unwrap();
        for k in 0..10u64 {
            d.mark(k * 64, 1).unwrap();
        }
        assert_eq!(d.len(), 10);
        d.mark(40, 1).unwrap(); // 32..48, between 0..16 and 64..80, touches neither
        assert_eq!(d.len(), 11);
        d.mark(70, 200).unwrap(); // 64..272 swallows 64,128,192,256 ranges
        assert_eq!(
            list(&d)[..4],
            [(0, 16), (32, 16), (64, 208), (320, 16)],
            "{d:?}"
        );
        assert_eq!(d.len(), 8);
        d.mark(0, 1 << 20).unwrap();
        assert_eq!(list(&d), [(0, 1 << 20)]);
    }

    #[test]
    fn covered_mark_is_noop() {
        let mut d = DirtyRanges::new(4096, 64).unwrap();
        d.mark(0, 1024).unwrap();
        let before = d.clone();
        d.mark(100, 200).unwrap();
        assert_eq!(d, before);
    }

    #[test]
    fn zero_len_and_errors_leave_state_unchanged() {
        let mut d = DirtyRanges::new(1000, 64).unwrap();
        d.mark(100, 10).unwrap();
        let before = d.clone();
        d.mark(500, 0).unwrap();
        d.mark(1000, 0).unwrap();
        assert_eq!(
            d.mark(1001, 0),
            Err(DirtyError::OutOfBounds {
                offset: 1001,
                len: 0,
                size: 1000
            })
        );
        assert_eq!(
            d.mark(990, 11),
            Err(DirtyError::OutOfBounds {
                offset: 990,
                len: 11,
                size: 1000
            })
        );
        assert_eq!(
            d.mark(u64::MAX, 1),
            Err(DirtyError::Overflow {
                offset: u64::MAX,
                len: 1
            })
        );
        assert_eq!(
            d.mark(1, u64::MAX),
            Err(DirtyError::Overflow {
                offset: 1,
                len: u64::MAX
            })
        );
        assert!(d.remove(999, 2).is_err());
        assert!(d.remove(u64::MAX, u64::MAX).is_err());
        assert_eq!(d, before);
    }

    #[test]
    fn allocation_near_u64_max() {
        // The rounded end would overflow u64: must clamp to size instead.
        let size = u64::MAX;
        let mut d = DirtyRanges::new(size, 4096).unwrap();
        d.mark(u64::MAX - 1, 1).unwrap();
        let last_atom = !4095u64;
        assert_eq!(list(&d), [(last_atom, size - last_atom)]);
        d.mark(0, u64::MAX).unwrap();
        assert_eq!(list(&d), [(0, u64::MAX)]);
        assert_eq!(d.pending_bytes(), u64::MAX);
        assert!(d.intersects(u64::MAX - 1, u64::MAX));
        d.remove(0, u64::MAX).unwrap();
        assert!(d.is_empty());
        // Aligned size at the top of the range.
        let size = !63u64;
        let mut d = DirtyRanges::new(size, 64).unwrap();
        d.mark(size - 1, 1).unwrap();
        assert_eq!(list(&d), [(size - 64, 64)]);
        assert!(d.mark(size, 1).is_err());
    }

    #[test]
    fn mark_all_clear_and_take() {
        let mut d = DirtyRanges::new(1000, 64).unwrap();
        d.mark(5, 5).unwrap();
        d.mark(500, 5).unwrap();
        d.mark_all();
        assert_eq!(list(&d), [(0, 1000)]);
        d.clear();
        assert!(d.is_empty());
        assert_eq!(d.pending_bytes(), 0);

        d.mark(5, 5).unwrap();
        d.mark(500, 5).unwrap();
        let mut out = vec![(7, 7)];
        d.take_into(&mut out);
        assert_eq!(out, [(7, 7), (0, 64), (448, 64)]);
        assert!(d.is_empty());
    }

    #[test]
    fn take_into_does_not_reallocate_with_capacity() {
        let mut d = DirtyRanges::new(1 << 20, 64).unwrap();
        let mut out = Vec::with_capacity(DEFAULT_MAX_RANGES);
        let ptr = out.as_ptr();
        for round in 0..4u64 {
            for k in 0..200u64 {
                d.mark((k * 4099 + round * 13) % (1 << 20), 8).unwrap();
            }
            out.clear();
            d.take_into(&mut out);
            assert!(out.len() <= DEFAULT_MAX_RANGES);
            assert_eq!(out.as_ptr(), ptr);
        }
    }

    #[test]
    fn intersects_uses_rounded_ranges() {
        let mut d = DirtyRanges::new(1000, 64).unwrap();
        assert!(!d.intersects(0, 1000));
        d.mark(70, 1).unwrap(); // 64..128
        assert!(d.intersects(64, 1));
        assert!(d.intersects(127, 1));
        assert!(d.intersects(0, 65));
        assert!(!d.intersects(0, 64));
        assert!(!d.intersects(128, 500));
        assert!(!d.intersects(100, 0));
        assert!(d.intersects(100, u64::MAX)); // saturates instead of failing
        assert!(!d.intersects(5000, 10));
    }

    #[test]
    fn remove_narrows_to_whole_atoms() {
        let mut d = DirtyRanges::new(1000, 64).unwrap();
        d.mark(0, 1000).unwrap();
        d.remove(10, 100).unwrap(); // 10..110 holds no whole atom
        assert_eq!(list(&d), [(0, 1000)]);
        d.remove(10, 120).unwrap(); // only atom 64..128 is whole inside 10..130
        assert_eq!(list(&d), [(0, 64), (128, 872)]);
        d.remove(130, 60).unwrap(); // 130..190 holds no whole atom
        assert_eq!(list(&d), [(0, 64), (128, 872)]);
        d.remove(960, 40).unwrap(); // partial last atom counts as whole
        assert_eq!(list(&d), [(0, 64), (128, 832)]);
        d.remove(0, 1000).unwrap();
        assert!(d.is_empty());
    }

    #[test]
    fn remove_spanning_several_ranges() {
        let mut d = DirtyRanges::new(4096, 64).unwrap();
        for k in 0..6u64 {
            d.mark(k * 256, 128).unwrap();
        }
        d.remove(64, 256 * 3).unwrap(); // 64..832
        assert_eq!(
            list(&d),
            [(0, 64), (832, 64), (1024, 128), (1280, 128)],
            "{d:?}"
        );
        d.remove(1024, 128).unwrap();
        assert_eq!(list(&d), [(0, 64), (832, 64), (1280, 128)]);
    }

    #[test]
    fn cap_merges_smallest_gap() {
        let mut d = DirtyRanges::with_max_ranges(1 << 16, 64, 3).unwrap();
        d.mark(0, 1).unwrap(); // 0..64
        d.mark(1024, 1).unwrap(); // 1024..1088
        d.mark(1280, 1).unwrap(); // 1280..1344 (gap 192 to previous)
        assert_eq!(d.len(), 3);
        d.mark(4096, 1).unwrap(); // 4th range: smallest gap is 1088..1280
        assert_eq!(list(&d), [(0, 64), (1024, 320), (4096, 64)]);
        // Inserting in the middle can merge a pair that does not include the new range.
        d.mark(8192, 1).unwrap(); // gaps: 960, 2752, 4032 -> merge first pair
        assert_eq!(list(&d), [(0, 1344), (4096, 64), (8192, 64)]);
        assert_eq!(d.len(), 3);
    }

    #[test]
    fn cap_tie_merges_leftmost_pair() {
        let mut d = DirtyRanges::with_max_ranges(1 << 16, 64, 2).unwrap();
        d.mark(0, 1).unwrap();
        d.mark(128, 1).unwrap();
        d.mark(256, 1).unwrap(); // gaps 64 and 64 -> leftmost
        assert_eq!(list(&d), [(0, 192), (256, 64)]);
    }

    #[test]
    fn cap_of_one_keeps_covering_range() {
        let mut d = DirtyRanges::with_max_ranges(1 << 16, 64, 1).unwrap();
        d.mark(5000, 10).unwrap();
        d.mark(100, 10).unwrap();
        d.mark(20000, 10).unwrap();
        assert_eq!(list(&d), [(64, 20032 - 64)]);
        // A splitting remove re-merges under a cap of one.
        d.remove(1024, 1024).unwrap();
        assert_eq!(list(&d), [(64, 20032 - 64)]);
        d.remove(0, 1024).unwrap(); // trimming an end is fine
        assert_eq!(list(&d), [(1024, 20032 - 1024)]);
    }

    #[test]
    fn no_allocation_in_steady_state() {
        let mut d = DirtyRanges::new(1 << 24, 256).unwrap();
        let cap = d.ranges.capacity();
        let mut x = 12345u64;
        // Miri checks the same steady state in fewer steps (it interprets every one).
        for _ in 0..if cfg!(miri) { 1_000 } else { 10_000 } {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) % ((1 << 24) - 64);
            d.mark(off, 1 + (x & 63)).unwrap();
            if x.is_multiple_of(7) {
                d.remove(off / 2, 4096).unwrap();
            }
        }
        assert_eq!(d.len(), DEFAULT_MAX_RANGES);
        assert_eq!(d.ranges.capacity(), cap);
    }

    #[test]
    fn debug_is_readable() {
        let mut d = DirtyRanges::new(1000, 64).unwrap();
        d.mark(0, 1).unwrap();
        let s = format!("{d:?}");
        assert!(s.contains("[0..64]"), "{s}");
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<DirtyRanges>();
        check::<DirtyError>();
    }
}
