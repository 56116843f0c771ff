//! Structs that start with their own size (`struct_size`), so they can grow in later versions:
//! a program built against an older header passes a smaller struct, a newer one a larger one.

use std::mem::size_of;

use crate::error::{CResult, Failure};

/// A `#[repr(C)]` struct of plain integers whose first field is `struct_size: usize`.
///
/// # Safety
/// - Every bit pattern is a valid value of the type (integers only), and its first field is a
///   `usize` holding the struct's size.
pub unsafe trait Versioned: Sized {
    /// The C type name, for error messages.
    const NAME: &'static str;
}

fn size_field<T: Versioned>(p: *const T) -> CResult<usize> {
    if p.is_null() {
        return Err(Failure::Api(format!("the {} pointer is NULL", T::NAME)));
    }
    // SAFETY: non-null, and the caller of the public functions promises a readable struct, which
    // starts with its size.
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    if size < size_of::<usize>() {
        return Err(Failure::Api(format!(
            "{}.struct_size is {size}: set it to sizeof(struct {0})",
            T::NAME
        )));
    }
    Ok(size)
}

/// Checks a caller's struct without reading or writing more than its size: NULL and an unset
/// `struct_size` are errors, as [`read`] and [`write`] find them.
///
/// # Safety
/// - `p` is NULL or points to a readable `struct_size`.
pub unsafe fn check<T: Versioned>(p: *const T) -> CResult<()> {
    size_field(p).map(|_| ())
}

/// Reads a caller's struct over `defaults`: fields beyond a smaller caller's struct keep their
/// defaults; a larger caller's extra bytes (fields this version does not know) must be zero.
///
/// # Safety
/// - `p` is NULL or points to `p->struct_size` readable bytes.
pub unsafe fn read<T: Versioned>(p: *const T, mut defaults: T) -> CResult<T> {
    let size = size_field(p)?;
    let known = size_of::<T>();
    if size > known {
        // SAFETY: the caller promises `size` readable bytes.
        let extra = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(known), size - known) };
        if extra.iter().any(|&b| b != 0) {
            return Err(Failure::Api(format!(
                "{} has fields this library version does not know set (struct_size {size}, \
                 known {known}): leave them zero or update the library",
                T::NAME
            )));
        }
    }
    let n = size.min(known);
    // SAFETY: `n` bytes are readable at `p` and writable in `defaults`; any bytes are a valid T.
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&mut defaults as *mut T).cast::<u8>(), n)
    };
    Ok(defaults)
}

/// Writes `value` into the caller's struct, as much of it as the caller's `struct_size` holds
/// (which is left as the caller set it).
///
/// # Safety
/// - `p` is NULL or points to `p->struct_size` writable bytes.
pub unsafe fn write<T: Versioned>(p: *mut T, value: &T) -> CResult<()> {
    let size = size_field(p)?;
    let n = size.min(size_of::<T>());
    let skip = size_of::<usize>();
    // SAFETY: bytes `skip..n` are writable at `p` (caller) and readable in `value`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (value as *const T).cast::<u8>().add(skip),
            p.cast::<u8>().add(skip),
            n - skip,
        )
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct V2 {
        struct_size: usize,
        a: u64,
        b: u64,
    }
    // SAFETY: integers only, size first.
    unsafe impl Versioned for V2 {
        const NAME: &'static str = "v2";
    }

    #[repr(C)]
    struct V1 {
        struct_size: usize,
        a: u64,
    }

    #[repr(C)]
    struct V3 {
        struct_size: usize,
        a: u64,
        b: u64,
        c: u64,
    }

    const DEFAULTS: V2 = V2 {
        struct_size: 24,
        a: 1,
        b: 2,
    };

    #[test]
    fn older_callers_get_defaults_for_newer_fields() {
        let old = V1 {
            struct_size: size_of::<V1>(),
            a: 10,
        };
        // SAFETY: `old` is readable for its struct_size.
        let v = unsafe { read((&old as *const V1).cast::<V2>(), DEFAULTS) }.unwrap();
        assert_eq!((v.a, v.b), (10, 2));
        let mut out = V1 {
            struct_size: size_of::<V1>(),
            a: 0,
        };
        // SAFETY: `out` is writable for its struct_size; only `a` is written.
        unsafe { write((&mut out as *mut V1).cast::<V2>(), &DEFAULTS) }.unwrap();
        assert_eq!((out.struct_size, out.a), (size_of::<V1>(), 1));
    }

    #[test]
    fn newer_callers_must_leave_unknown_fields_zero() {
        let mut new = V3 {
            struct_size: size_of::<V3>(),
            a: 5,
            b: 6,
            c: 0,
        };
        // SAFETY: `new` is readable for its struct_size.
        let v = unsafe { read((&new as *const V3).cast::<V2>(), DEFAULTS) }.unwrap();
        assert_eq!((v.a, v.b), (5, 6));
        new.c = 1;
        // SAFETY: as above.
        assert!(unsafe { read((&new as *const V3).cast::<V2>(), DEFAULTS) }.is_err());
    }

    #[test]
    fn null_and_unset_sizes_are_refused() {
        // SAFETY: NULL is checked first.
        assert!(unsafe { read(std::ptr::null::<V2>(), DEFAULTS) }.is_err());
        let zero = V2 {
            struct_size: 0,
            a: 0,
            b: 0,
        };
        // SAFETY: readable.
        assert!(unsafe { read(&zero, DEFAULTS) }.is_err());
    }
}
