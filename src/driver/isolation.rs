//! Process isolation of mappings and exported fds: a forked child must not reach the parent's
//! GPU memory, an `exec`'d program must not inherit its fds.
//!
//! Measured on the H100: after `fork()` a child storing through an inherited host pointer changed
//! the parent's GPU memory (the BAR mapping is shared, not copied). Every mapping is therefore
//! marked `MADV_DONTFORK` as soon as it exists (as gdrcopy's mappings are): the child has no
//! mapping at that address and faults. Exported opaque fds are made close-on-exec at once.

use std::os::fd::{AsRawFd, BorrowedFd};

use crate::error::{Error, Result};

/// The name and text of the calling thread's last `errno`, e.g. `EINVAL (Invalid argument)`.
fn last_errno() -> String {
    errno_text(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// The name and text of `errno` value `code`, e.g. `EINVAL (Invalid argument)`: how every
/// [`Error::System`] names what the kernel answered.
pub(crate) fn errno_text(code: i32) -> String {
    let e = std::io::Error::from_raw_os_error(code);
    let name = match code {
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::EAGAIN => "EAGAIN",
        libc::EBADF => "EBADF",
        libc::EFAULT => "EFAULT",
        libc::ENOENT => "ENOENT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EPIPE => "EPIPE",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::EMFILE => "EMFILE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ESRCH => "ESRCH",
        _ => return format!("errno {code} ({e})"),
    };
    let text = e.to_string();
    // `io::Error` prints "Invalid argument (os error 22)": keep the words.
    let words = text.split(" (os error").next().unwrap_or(&text);
    format!("{name} ({words})")
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The whole pages inside `[ptr, ptr + len)`: a mapping from `mmap` (what the NVIDIA driver and
/// lavapipe return for a whole allocation) is page-aligned, so that is all of it; for anything
/// else, advice never reaches memory outside the range.
fn inner_pages(ptr: *mut u8, len: usize) -> Option<(*mut libc::c_void, usize)> {
    let page = page_size();
    let start = (ptr as usize).checked_next_multiple_of(page)?;
    let end = (ptr as usize).checked_add(len)? & !(page - 1);
    (end > start).then(|| (ptr.wrapping_add(start - ptr as usize).cast(), end - start))
}

/// Marks the mapping `[ptr, ptr + len)` `MADV_DONTFORK`: a child forked from now on has no
/// mapping there, so a store through an inherited pointer faults instead of writing the
/// parent's memory.
pub(crate) fn exclude_from_fork(ptr: *mut u8, len: usize) -> Result<()> {
    crate::driver::failpoint::inject("madvise", || Error::System {
        call: "madvise",
        errno: "EINVAL (injected failure)".into(),
    })?;
    let Some((start, bytes)) = inner_pages(ptr, len) else {
        return Ok(());
    };
    // SAFETY: advice on whole pages of a live mapping the caller owns; MADV_DONTFORK changes
    // only what fork() copies, never the memory's contents or this process's access.
    if unsafe { libc::madvise(start, bytes, libc::MADV_DONTFORK) } != 0 {
        return Err(Error::System {
            call: "madvise",
            errno: last_errno(),
        });
    }
    Ok(())
}

/// Undoes [`exclude_from_fork`] before the mapping goes away, for drivers whose mapping is not
/// an `mmap` of its own (the advice would otherwise outlive it on memory reused for other
/// things). Errors are ignored: a device mapping (`VM_IO`) refuses `MADV_DOFORK`, and it is
/// unmapped next anyway.
pub(crate) fn restore_fork(ptr: *mut u8, len: usize) {
    if let Some((start, bytes)) = inner_pages(ptr, len) {
        // SAFETY: as in `exclude_from_fork`.
        let _ = unsafe { libc::madvise(start, bytes, libc::MADV_DOFORK) };
    }
}

/// Sets `FD_CLOEXEC` on `fd`, so programs this process `exec`s do not inherit it.
pub(crate) fn set_cloexec(fd: BorrowedFd<'_>) -> Result<()> {
    let fail = || Error::System {
        call: "fcntl",
        errno: last_errno(),
    };
    crate::driver::failpoint::inject("fcntl", || Error::System {
        call: "fcntl",
        errno: "EBADF (injected failure)".into(),
    })?;
    // SAFETY: F_GETFD/F_SETFD on an fd we borrow; no memory is passed.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
    if flags < 0 {
        return Err(fail());
    }
    if flags & libc::FD_CLOEXEC == 0 {
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
            return Err(fail());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_pages_never_leave_the_range() {
        let page = page_size();
        let p = |a: usize| a as *mut u8;
        assert_eq!(
            inner_pages(p(page), 2 * page),
            Some((p(page).cast(), 2 * page))
        );
        // Unaligned ends shrink inwards.
        assert_eq!(
            inner_pages(p(page + 1), 3 * page),
            Some((p(2 * page).cast(), 2 * page))
        );
        assert_eq!(inner_pages(p(page + 1), page), None);
        assert_eq!(inner_pages(p(usize::MAX - 10), 100), None);
    }

    #[test]
    fn errno_names() {
        // SAFETY: an invalid fd: fcntl only sets errno.
        assert_eq!(unsafe { libc::fcntl(-1, libc::F_GETFD) }, -1);
        assert_eq!(last_errno(), "EBADF (Bad file descriptor)");
    }
}
