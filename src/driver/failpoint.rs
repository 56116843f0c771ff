//! Failure injection for tests (cargo feature `failpoints`, off by default).
//!
//! Every driver and system call that can fail while memory is being set up passes a named
//! point first (the name is the call's: `vkMapMemory`, `cuImportExternalMemory`, ...). A test
//! arms a point on its own thread with [`fail_at`]: the `nth` next pass of that point on that
//! thread fails with the error the real call would give, before the real call is made. The
//! tests then check that nothing was left behind (fds, Vulkan and CUDA objects, pool
//! accounting) and that everything still works afterwards.
//!
//! Points are per thread, so tests running side by side do not disturb each other; work a
//! thread hands to another (none of the set-up paths does) would not be affected.
//!
//! Without the feature this module is private and the points are empty inline functions: the
//! set-up paths cost nothing.
//!
//! ```
//! # #[cfg(feature = "failpoints")] {
//! use vkgdr::failpoint;
//!
//! failpoint::fail_at("vkMapMemory", 2); // the second mapping from now on fails
//! // ... allocate, check the error and that nothing leaked ...
//! failpoint::reset();
//! # }
//! ```

use crate::error::Error;

#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
/// Every point: first those of a raw allocation ([`RAW_ALLOCATION`]), then those of the
/// external-memory import path, then the rest a ring meets, then the cache maintenance calls.
pub const POINTS: &[&str] = &[
    "vkAllocateMemory",
    "vkMapMemory",
    "madvise",
    "vkGetMemoryFdKHR",
    "fcntl",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemMap",
    "cuMemSetAccess",
    "cuImportExternalMemory",
    "cuExternalMemoryGetMappedBuffer",
    "cuMemHostAlloc",
    "cuStreamCreate",
    "vkFlushMappedMemoryRanges",
    "vkInvalidateMappedMemoryRanges",
];

#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
/// The points of one raw allocation mapped through CUDA VMM, in order: the Vulkan allocation,
/// its mapping and fd, then the VMM import, reservation, mapping and access. (An arena chunk
/// passes the same points but the reservation, which its arena made once.)
pub const RAW_ALLOCATION: &[&str] = POINTS.split_at(9).0;

#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
/// The points of one raw allocation imported with `cuImportExternalMemory` (a device without
/// VMM, or [`OpenOptions::external_memory_import`](crate::OpenOptions::external_memory_import)).
pub const EXTERNAL_MEMORY_IMPORT: &[&str] = &[
    "vkAllocateMemory",
    "vkMapMemory",
    "madvise",
    "vkGetMemoryFdKHR",
    "fcntl",
    "cuImportExternalMemory",
    "cuExternalMemoryGetMappedBuffer",
];

#[cfg(feature = "failpoints")]
mod armed {
    use std::cell::RefCell;

    /// One point armed on this thread.
    pub(super) struct Point {
        pub(super) name: &'static str,
        /// Passes left before the failing one (0: not armed).
        pub(super) countdown: u64,
        /// Passes so far.
        pub(super) hits: u64,
    }

    thread_local! {
        pub(super) static POINTS: RefCell<Vec<Point>> = const { RefCell::new(Vec::new()) };
        /// Failures injected on this thread since the last `reset`.
        pub(super) static FIRED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
}

/// Makes the `nth` (1-based) next pass of `point` on the calling thread fail; `0` disarms it.
/// Passes are counted from now on.
///
/// # Panics
/// If `point` is not one of [`POINTS`] (a typo would otherwise arm nothing).
#[cfg(feature = "failpoints")]
pub fn fail_at(point: &str, nth: u64) {
    let name = POINTS
        .iter()
        .copied()
        .find(|p| *p == point)
        .unwrap_or_else(|| panic!("no failure point named {point:?}; see failpoint::POINTS"));
    armed::POINTS.with(|points| {
        let mut points = points.borrow_mut();
        match points.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.countdown = nth;
                p.hits = 0;
            }
            None => points.push(armed::Point {
                name,
                countdown: nth,
                hits: 0,
            }),
        }
    });
}

/// Passes of `point` on the calling thread since it was last armed (or since [`reset`]), the
/// failing one included; counted only for points armed with [`fail_at`] (`0` counts without
/// failing).
#[cfg(feature = "failpoints")]
pub fn hits(point: &str) -> u64 {
    armed::POINTS.with(|points| {
        points
            .borrow()
            .iter()
            .find(|p| p.name == point)
            .map_or(0, |p| p.hits)
    })
}

/// Failures injected on the calling thread since the last [`reset`].
#[cfg(feature = "failpoints")]
pub fn fired() -> u64 {
    armed::FIRED.with(|f| f.get())
}

/// Disarms every point of the calling thread and zeroes its counts.
#[cfg(feature = "failpoints")]
pub fn reset() {
    armed::POINTS.with(|points| points.borrow_mut().clear());
    armed::FIRED.with(|f| f.set(0));
}

/// `Err(error())` when this pass of `point` is the one the calling thread armed to fail.
#[cfg(feature = "failpoints")]
pub(crate) fn inject(point: &'static str, error: impl FnOnce() -> Error) -> Result<(), Error> {
    let fail = armed::POINTS
        .try_with(|points| {
            let mut points = points.borrow_mut();
            let p = points.iter_mut().find(|p| p.name == point)?;
            p.hits += 1;
            match p.countdown {
                0 => None,
                1 => {
                    p.countdown = 0;
                    Some(())
                }
                _ => {
                    p.countdown -= 1;
                    None
                }
            }
        })
        .ok()
        .flatten();
    match fail {
        Some(()) => {
            let _ = armed::FIRED.try_with(|f| f.set(f.get() + 1));
            Err(error())
        }
        None => Ok(()),
    }
}

/// Without the `failpoints` feature no pass ever fails.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn inject(_point: &'static str, _error: impl FnOnce() -> Error) -> Result<(), Error> {
    Ok(())
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    #[test]
    fn the_nth_pass_fails_once_on_this_thread_only() {
        reset();
        fail_at("vkMapMemory", 3);
        let pass = || inject("vkMapMemory", || Error::internal("injected"));
        assert!(pass().is_ok() && pass().is_ok());
        std::thread::spawn(move || assert!(pass().is_ok(), "another thread is not armed"))
            .join()
            .unwrap();
        assert!(matches!(pass(), Err(Error::Internal(_))));
        assert!(pass().is_ok(), "fails once");
        assert_eq!((hits("vkMapMemory"), fired()), (4, 1));
        assert!(inject("madvise", || Error::internal("x")).is_ok());
        reset();
        assert_eq!((hits("vkMapMemory"), fired()), (0, 0));
    }

    #[test]
    #[should_panic(expected = "no failure point named")]
    fn unknown_points_are_refused() {
        fail_at("vkMapMemroy", 1);
    }
}
