//! Byte-range arithmetic shared by every mapping: bounds checks, the 4 KiB rounding of
//! allocation sizes and the atom rounding of flush and invalidate ranges.
//!
//! Pure integer code with no driver in sight, so the pool, the mappings and the Vulkan layer use
//! the same checks and Miri and the property tests cover them on any machine.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};

/// Checks that `[offset, offset + len)` lies inside a `size`-byte object (without overflow).
pub(crate) fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::invalid(format!(
            "range {offset}+{len} is outside the {size}-byte allocation"
        ))),
    }
}

/// Rounds an allocation request up to 4 KiB (mmap granularity), rejecting zero and overflow.
pub(crate) fn round_alloc_size(size: u64) -> Result<u64> {
    if size == 0 {
        return Err(Error::invalid("allocation size is zero"));
    }
    size.checked_add(4095)
        .map(|s| s & !4095)
        .ok_or_else(|| Error::invalid(format!("allocation size {size} overflows")))
}

/// The atom-rounded range Vulkan needs for flushing `[offset, offset + len)` of a `size`-byte
/// allocation: the start rounded down to `atom`, the end rounded up to `atom` or clamped to `size`.
/// `Ok(None)` for an empty range. A range outside the allocation and an atom that is not a power
/// of two are [`Error::InvalidArgument`]s: nothing out of range can reach the driver.
pub(crate) fn atom_range(
    offset: u64,
    len: u64,
    atom: u64,
    size: u64,
) -> Result<Option<(u64, u64)>> {
    check_range(offset, len, size)?;
    if !atom.is_power_of_two() {
        return Err(Error::invalid(format!(
            "atom size {atom} is not a power of two"
        )));
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
        // Regression: these used to panic in debug builds (`end - start`) and reach the driver
        // as ~2^64-byte ranges in release builds.
        for (offset, len, atom, size) in [
            (4096, 1, 64, 4096),
            (0, 4097, 64, 4096),
            (u64::MAX, 2, 64, 4096),
            (5000, 0, 64, 4096),
            (0, 64, 0, 4096),
            (0, 64, 48, 4096),
        ] {
            assert!(
                matches!(
                    atom_range(offset, len, atom, size),
                    Err(Error::InvalidArgument(_))
                ),
                "{offset}+{len} atom {atom} size {size}"
            );
        }
    }

    #[test]
    fn alloc_size_rounding() {
        assert!(round_alloc_size(0).is_err());
        assert_eq!(round_alloc_size(1).unwrap(), 4096);
        assert_eq!(round_alloc_size(4096).unwrap(), 4096);
        assert_eq!(round_alloc_size(4097).unwrap(), 8192);
        assert!(round_alloc_size(u64::MAX - 10).is_err());
    }

    #[test]
    fn range_check() {
        assert!(check_range(0, 10, 10).is_ok());
        assert!(check_range(1, 10, 10).is_err());
        assert!(check_range(u64::MAX, 2, 10).is_err());
    }
}
