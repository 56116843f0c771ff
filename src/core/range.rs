//! Byte-range arithmetic shared by every mapping: bounds checks, the 4 KiB rounding of
//! allocation sizes and the atom rounding of flush and invalidate ranges. The C and Python faces
//! resolve the ranges their callers name through [`range_to_end`].
//!
//! Pure integer code with no driver in sight, so the pool, the mappings and the Vulkan layer use
//! the same checks and Miri and the property tests cover them on any machine.
#![forbid(unsafe_code)]

/// A byte range, size or atom that no mapping can take: the caller's error (the crate's
/// [`Error`](crate::Error) reports it as an invalid argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RangeError {
    /// `[offset, offset + len)` does not lie inside the `size`-byte object.
    #[error("range {offset}+{len} is outside the {size}-byte allocation")]
    OutOfBounds {
        /// Start of the range.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The object's size in bytes.
        size: u64,
    },
    /// A range "from `offset` to the end" whose start lies beyond the `size`-byte object.
    #[error("offset {offset} is past the end of the {size}-byte allocation")]
    OffsetPastEnd {
        /// Start of the range.
        offset: u64,
        /// The object's size in bytes.
        size: u64,
    },
    /// An allocation of zero bytes.
    #[error("allocation size is zero")]
    ZeroSize,
    /// An allocation size that overflows when rounded up to 4 KiB.
    #[error("allocation size {size} overflows")]
    SizeOverflow {
        /// The size asked for.
        size: u64,
    },
    /// A flush or invalidate atom that is not a power of two.
    #[error("atom size {atom} is not a power of two")]
    AtomNotPowerOfTwo {
        /// The atom size given.
        atom: u64,
    },
}

type Result<T> = std::result::Result<T, RangeError>;

/// Checks that `[offset, offset + len)` lies inside a `size`-byte object (without overflow).
pub(crate) fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(RangeError::OutOfBounds { offset, len, size }),
    }
}

/// The range a caller names with `offset` and `len` in a `size`-byte object, `len` `None`
/// meaning "to the end" (the C library's `SIZE_MAX`, Python's `size=None`), checked against
/// `size` as every mapping checks a range: what the faces' flushes, invalidates and reads take.
/// A range outside is [`RangeError::OutOfBounds`], a start beyond the end
/// [`RangeError::OffsetPastEnd`].
pub fn range_to_end(offset: u64, len: Option<u64>, size: u64) -> Result<(u64, u64)> {
    let len = match len {
        Some(len) => len,
        None => size
            .checked_sub(offset)
            .ok_or(RangeError::OffsetPastEnd { offset, size })?,
    };
    check_range(offset, len, size)?;
    Ok((offset, len))
}

/// Rounds an allocation request up to 4 KiB (mmap granularity), rejecting zero and overflow.
pub(crate) fn round_alloc_size(size: u64) -> Result<u64> {
    if size == 0 {
        return Err(RangeError::ZeroSize);
    }
    size.checked_add(4095)
        .map(|s| s & !4095)
        .ok_or(RangeError::SizeOverflow { size })
}

/// The atom-rounded range Vulkan needs for flushing `[offset, offset + len)` of a `size`-byte
/// allocation: the start rounded down to `atom`, the end rounded up to `atom` or clamped to `size`.
/// `Ok(None)` for an empty range. A range outside the allocation and an atom that is not a power
/// of two are [`RangeError`]s: nothing out of range can reach the driver.
pub(crate) fn atom_range(
    offset: u64,
    len: u64,
    atom: u64,
    size: u64,
) -> Result<Option<(u64, u64)>> {
    check_range(offset, len, size)?;
    if !atom.is_power_of_two() {
        return Err(RangeError::AtomNotPowerOfTwo { atom });
    }
    if len == 0 {
        return Ok(None);
    }
    let start = offset & !(atom - 1);
    // `offset + len <= size` (checked); rounding up may pass u64::MAX only above `size`.
    let end = (offset + len)
        .checked_next_multiple_of(atom)
        .map_or(size, |e| e.min(size));
    Ok(Some((start, end - start)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atom_range_rounds_and_clamps() {
        let r = |o, l, a, s| atom_range(o, l, a, s).unwrap();
        assert_eq!(r(0, 0, 64, 4096), None);
        assert_eq!(r(1, 1, 64, 4096), Some((0, 64)));
        assert_eq!(r(63, 2, 64, 4096), Some((0, 128)));
        assert_eq!(r(4000, 96, 64, 4096), Some((3968, 128)));
        assert_eq!(r(4090, 6, 256, 4096), Some((3840, 256)));
        // A size that is not an atom multiple: the end clamps to the allocation.
        assert_eq!(r(4000, 10, 256, 4010), Some((3840, 170)));
        // At the top of the address space the rounded end would overflow: clamped, not wrapped.
        assert_eq!(
            r(u64::MAX - 10, 10, 64, u64::MAX),
            Some((u64::MAX - 63, 63))
        );
    }

    #[test]
    fn atom_range_refuses_what_the_driver_must_not_see() {
        // Unchecked arithmetic would panic on these in debug builds (`end - start`) and hand
        // the driver ~2^64-byte ranges in release builds.
        for (offset, len, atom, size) in [
            (4096, 1, 64, 4096),
            (0, 4097, 64, 4096),
            (u64::MAX, 2, 64, 4096),
            (5000, 0, 64, 4096),
        ] {
            assert_eq!(
                atom_range(offset, len, atom, size),
                Err(RangeError::OutOfBounds { offset, len, size })
            );
        }
        for atom in [0, 48] {
            assert_eq!(
                atom_range(0, 64, atom, 4096),
                Err(RangeError::AtomNotPowerOfTwo { atom })
            );
        }
    }

    #[test]
    fn alloc_size_rounding() {
        assert_eq!(round_alloc_size(0), Err(RangeError::ZeroSize));
        assert_eq!(round_alloc_size(1).unwrap(), 4096);
        assert_eq!(round_alloc_size(4096).unwrap(), 4096);
        assert_eq!(round_alloc_size(4097).unwrap(), 8192);
        assert_eq!(
            round_alloc_size(u64::MAX - 10),
            Err(RangeError::SizeOverflow {
                size: u64::MAX - 10
            })
        );
    }

    #[test]
    fn a_missing_length_runs_to_the_end() {
        assert_eq!(range_to_end(0, None, 8192), Ok((0, 8192)));
        assert_eq!(range_to_end(100, None, 8192), Ok((100, 8092)));
        assert_eq!(range_to_end(8192, None, 8192), Ok((8192, 0)));
        assert_eq!(
            range_to_end(8193, None, 8192),
            Err(RangeError::OffsetPastEnd {
                offset: 8193,
                size: 8192
            })
        );
        assert_eq!(range_to_end(10, Some(20), 8192), Ok((10, 20)));
        assert!(range_to_end(8000, Some(193), 8192).is_err());
        assert!(range_to_end(1, Some(u64::MAX - 1), 8192).is_err());
        assert_eq!(
            RangeError::OffsetPastEnd {
                offset: 4097,
                size: 4096
            }
            .to_string(),
            "offset 4097 is past the end of the 4096-byte allocation"
        );
    }

    #[test]
    fn range_check() {
        assert!(check_range(0, 10, 10).is_ok());
        assert!(check_range(1, 10, 10).is_err());
        assert!(check_range(u64::MAX, 2, 10).is_err());
    }
}
