//! The barrier pair of an asymmetric handshake: a cheap one for the thread that passes often (an
//! owner) and an expensive one for the thread that passes rarely (a visitor), which together
//! order each side's store before its load of the other side's flag.
//!
//! With Linux's `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` the visitor's barrier runs a full
//! memory barrier on every CPU currently running a thread of this process (threads not running
//! passed one when they were switched out), so the owner's side is only a compiler fence: as if
//! every owner had executed a full barrier at that point of its program. Without it (other
//! systems, a kernel without it, Miri, loom) both sides are `fence(SeqCst)`, the textbook
//! Dekker. The choice is made once per process. Used by [`OwnerCell`](super::OwnerCell) and
//! [`BiasedLock`](super::BiasedLock).

use crate::core::sync::atomic::{fence, Ordering};

/// Whether this process pairs a compiler fence (owner) with `membarrier` (visitor); decided once,
/// before any owner relies on it.
pub(crate) fn asymmetric() -> bool {
    #[cfg(all(target_os = "linux", not(miri), not(feature = "loom")))]
    return membarrier::available();
    #[cfg(not(all(target_os = "linux", not(miri), not(feature = "loom"))))]
    false
}

/// The owner's side: a compiler fence that the visitor's `membarrier` turns into a full barrier,
/// or a full barrier of its own.
#[inline(always)]
pub(crate) fn light(asymmetric: bool) {
    if asymmetric {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The visitor's side; `false` if `membarrier` failed (which the kernel promises never to do once
/// the process registered for it, fork included).
pub(crate) fn heavy(asymmetric: bool) -> bool {
    fence(Ordering::SeqCst);
    #[cfg(all(target_os = "linux", not(miri), not(feature = "loom")))]
    if asymmetric {
        return membarrier::private_expedited();
    }
    let _ = asymmetric;
    true
}

/// Linux's `membarrier(2)`, private expedited flavour (Linux 4.14+).
#[cfg(all(target_os = "linux", not(miri), not(feature = "loom")))]
mod membarrier {
    use std::sync::OnceLock;

    const CMD_QUERY: libc::c_int = 0;
    const CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    fn call(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: membarrier takes (int cmd, unsigned flags, int cpu_id) by value and touches no
        // memory of ours; an unknown command or kernel gives an error code, nothing else.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        }
    }

    /// Whether the kernel offers the private expedited command and registered this process for
    /// it (once per process; registration is required before the first use, and a forked child
    /// keeps it).
    pub(super) fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            let supported = call(CMD_QUERY);
            supported >= 0
                && supported & libc::c_long::from(CMD_PRIVATE_EXPEDITED) != 0
                && call(CMD_REGISTER_PRIVATE_EXPEDITED) == 0
        })
    }

    /// A full memory barrier on every running thread of this process.
    pub(super) fn private_expedited() -> bool {
        call(CMD_PRIVATE_EXPEDITED) == 0
    }
}
