//! Warming the write path before the first write: the instruction-set detection, one run of the
//! small-write and small-read routines over stack buffers, and the page tables of the code that
//! holds them.
//!
//! Why: a process's first write into a fresh mapping costs many times a later write, and more
//! than a raw store into a fresh page of the mapping (figures: BENCHMARKS.md, 'First write').
//! What the first write pays beyond that is first-use work: `cpuid` (a trap to the hypervisor
//! in a VM) and a page fault for each page of code it runs for the first time. Contexts are made
//! once and take a tenth of a second; a few microseconds there cost nothing.
#![allow(unsafe_code)] // the copy routines over stack buffers, and `madvise` on our own code

use std::sync::Once;

/// At most this much of the mapping holding this library's code is faulted in: the whole
/// library, or the part of a large executable it is linked into that follows it.
const CODE_WINDOW: usize = 8 << 20;

/// Runs the write path's first-use work once per process (later calls return at once).
pub(crate) fn warm_up() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = super::simd_level();
        run_small_copies();
        prefault_code();
    });
}

/// One small write and one small read through the default routines, over stack memory.
fn run_small_copies() {
    let src = [0x5Au8; 64];
    let mut dst = [0u8; 64];
    // SAFETY: both are live, distinct stack buffers of 64 bytes; the routines are sound on
    // ordinary host memory (see the module docs of `copy`).
    unsafe { super::write_default(dst.as_mut_ptr(), &src) };
    let mut back = [0u8; 64];
    // SAFETY: as above.
    unsafe { super::read_default(&mut back, dst.as_ptr()) };
    std::hint::black_box(&back);
}

/// Asks the kernel to fill the page tables of [`code_window`], so the first write does not fault
/// its code in page by page. Best effort: an old kernel without `MADV_POPULATE_READ`, or a
/// mapping that cannot be found, leaves things as they were.
#[cfg(target_os = "linux")]
fn prefault_code() {
    let Some((from, to)) = code_window() else {
        return;
    };
    // Linux 5.14; older kernels answer EINVAL, which changes nothing.
    const MADV_POPULATE_READ: libc::c_int = 22;
    // SAFETY: `[from, to)` lies inside one live, readable mapping of this process (our own
    // code); populating its page tables changes no memory contents.
    unsafe {
        libc::madvise(from as *mut libc::c_void, to - from, MADV_POPULATE_READ);
    }
}

#[cfg(not(target_os = "linux"))]
fn prefault_code() {}

/// The page-aligned range of the executable mapping that holds this library's code: at most
/// [`CODE_WINDOW`] bytes around this function (the whole library, or the part of a large
/// executable it is linked into that surrounds it).
#[cfg(target_os = "linux")]
fn code_window() -> Option<(usize, usize)> {
    let here = code_window as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let (start, end) = maps.lines().find_map(|line| {
        let (range, rest) = line.split_once(' ')?;
        let (a, b) = range.split_once('-')?;
        let (a, b) = (
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        );
        (rest.starts_with("r-x") && (a..b).contains(&here)).then_some((a, b))
    })?;
    let from = (here.saturating_sub(CODE_WINDOW / 2) & !4095).max(start);
    Some((from, (from + CODE_WINDOW).min(end)))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn the_code_window_holds_the_copy_routines() {
        let (from, to) = super::code_window().expect("our own code mapping");
        assert_eq!(from % 4096, 0);
        assert!(to - from <= super::CODE_WINDOW);
        let write = crate::copy::write_default as *const () as usize;
        assert!(
            (from..to).contains(&write),
            "{from:#x}..{to:#x} lacks {write:#x}"
        );
        super::warm_up();
    }
}
