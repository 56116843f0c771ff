//! [`SharedPage`]: a page of plain host memory two processes map (a sealed memfd), holding the
//! words of a lent ring lane; and the checks a received fd passes before anything maps it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use rustix::fs::{FileType, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use super::sys::sys;
use crate::core::share::ShareError;
use crate::error::Result;

/// Bytes of a shared page.
pub(crate) const PAGE_LEN: usize = 4096;

/// The seals every page carries before it is sent: neither side can shrink it under the other's
/// mapping (a load past the end of a file raises `SIGBUS`) or grow it, and no seal can be added
/// or removed afterwards.
fn base_seals() -> SealFlags {
    SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

/// A 4 KiB memfd mapped shared; touched only through [`AtomicU64`] words, so what the other
/// process writes there is never undefined behaviour here, only a value to check.
pub(crate) struct SharedPage {
    fd: OwnedFd,
    ptr: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory touched only through atomics; the fd and the
// pointer are process-wide.
unsafe impl Send for SharedPage {}
// SAFETY: as above: `&self` hands out `&AtomicU64`s only.
unsafe impl Sync for SharedPage {}

impl std::fmt::Debug for SharedPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPage")
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

impl SharedPage {
    /// A zeroed page mapped read-write here. With `peer_writable` false it is sealed against
    /// new writable mappings (`F_SEAL_FUTURE_WRITE`) once this one exists: the other process
    /// can only read it.
    pub(crate) fn create(name: &str, peer_writable: bool) -> Result<SharedPage> {
        let fd = rustix::fs::memfd_create(
            name,
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .map_err(sys("memfd_create"))?;
        rustix::fs::ftruncate(&fd, PAGE_LEN as u64).map_err(sys("ftruncate"))?;
        let page = Self::map(fd, true)?;
        let mut seals = base_seals();
        if !peer_writable {
            seals |= SealFlags::FUTURE_WRITE;
        }
        rustix::fs::fcntl_add_seals(&page.fd, seals).map_err(sys("F_ADD_SEALS"))?;
        Ok(page)
    }

    /// Maps a page the other process sent: it must be a memfd of [`PAGE_LEN`] bytes sealed
    /// against shrinking (and, for a page this side may only read, against writes), or it is
    /// refused by name and closed. `writable`: whether this side writes it.
    pub(crate) fn map_received(
        fd: OwnedFd,
        writable: bool,
        which: &'static str,
    ) -> Result<SharedPage> {
        let st = rustix::fs::fstat(&fd).map_err(sys("fstat"))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || !is_memfd(fd.as_fd()) {
            return Err(ShareError::WrongFdKind {
                which,
                what: describe(fd.as_fd()),
            }
            .into());
        }
        if st.st_size as u64 != PAGE_LEN as u64 {
            return Err(ShareError::SizeMismatch {
                which,
                declared: PAGE_LEN as u64,
                actual: st.st_size as u64,
            }
            .into());
        }
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(sys("F_GET_SEALS"))?;
        let mut need = base_seals();
        if !writable {
            need |= SealFlags::FUTURE_WRITE;
        }
        if !seals.contains(need) {
            return Err(ShareError::WrongFdKind {
                which,
                what: format!("a memfd without the seals {need:?} (it has {seals:?})"),
            }
            .into());
        }
        Self::map(fd, writable)
    }

    fn map(fd: OwnedFd, writable: bool) -> Result<SharedPage> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a new shared mapping of the whole (checked or just sized) memfd, at an address
        // the kernel picks; it aliases no Rust object.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_LEN,
                prot,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(sys("mmap"))?;
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or(ShareError::Protocol("mmap returned null".into()))?;
        Ok(SharedPage { fd, ptr })
    }

    /// Word `i` of the page (`i < 512`).
    ///
    /// # Panics
    /// If `i` is out of the page.
    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < PAGE_LEN / 8, "word {i} is outside the page");
        // SAFETY: an 8-byte aligned word inside the live mapping (page-aligned base); the page
        // is touched only through atomics here, and another process's plain stores to shared
        // memory are, for this process, stores by an outside agent to an atomic.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().cast::<u64>().add(i)) }
    }

    /// The memfd, to send.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, used by nothing once the page is dropped (words
        // borrow the page).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), PAGE_LEN) };
    }
}

/// Whether `fd` is a memfd (`/proc/self/fd/N` names `/memfd:…`).
fn is_memfd(fd: BorrowedFd<'_>) -> bool {
    link(fd).is_some_and(|l| l.starts_with("/memfd:"))
}

fn link(fd: BorrowedFd<'_>) -> Option<String> {
    rustix::fs::readlink(format!("/proc/self/fd/{}", fd.as_raw_fd()), Vec::new())
        .ok()
        .map(|c| c.to_string_lossy().into_owned())
}

/// What an fd is, in words (for errors).
fn describe(fd: BorrowedFd<'_>) -> String {
    let kind = match rustix::fs::fstat(fd) {
        Ok(st) => format!("{:?}", FileType::from_raw_mode(st.st_mode)),
        Err(e) => return format!("an fd fstat refuses ({e})"),
    };
    match link(fd) {
        Some(l) => format!("a {kind} ({l})"),
        None => format!("a {kind}"),
    }
}

/// Checks an fd declared to be exported device memory of `declared` bytes before the driver
/// imports it: a regular file that is not a memfd (lavapipe's exports are memfds), a memfd
/// shorter than declared (a mapping past its end would raise `SIGBUS`), a directory, pipe or
/// socket are refused by name. Device files and driver objects (the NVIDIA driver's exports)
/// pass to the driver, which refuses what it does not know (`VK_ERROR_INVALID_EXTERNAL_HANDLE`).
pub(crate) fn check_memory_fd(
    fd: BorrowedFd<'_>,
    declared: u64,
    which: &'static str,
) -> Result<()> {
    let st = rustix::fs::fstat(fd).map_err(sys("fstat"))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            if !is_memfd(fd) {
                return Err(ShareError::WrongFdKind {
                    which,
                    what: describe(fd),
                }
                .into());
            }
            if (st.st_size as u64) < declared {
                return Err(ShareError::SizeMismatch {
                    which,
                    declared,
                    actual: st.st_size as u64,
                }
                .into());
            }
            Ok(())
        }
        FileType::Directory
        | FileType::Fifo
        | FileType::Socket
        | FileType::Symlink
        | FileType::BlockDevice => Err(ShareError::WrongFdKind {
            which,
            what: describe(fd),
        }
        .into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_read_only_page_cannot_be_mapped_writable_or_shrunk() {
        let page = SharedPage::create("test", false).unwrap();
        page.word(3).store(77, Ordering::Release);
        let fd = page.fd().try_clone_to_owned().unwrap();
        // Writable: the kernel refuses the mapping, whether asked through `map_received` or raw.
        let copy = fd.try_clone().unwrap();
        assert!(SharedPage::map_received(copy, true, "page").is_err());
        // SAFETY: a probe mapping of the page, unmapped at once if it succeeds.
        let raw = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_LEN,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        };
        assert!(raw.is_err(), "a writable mapping of a FUTURE_WRITE page");
        assert!(
            rustix::fs::ftruncate(&fd, 0).is_err(),
            "shrinking a sealed page"
        );
        let read = SharedPage::map_received(fd, false, "page").unwrap();
        assert_eq!(read.word(3).load(Ordering::Acquire), 77);
    }

    #[test]
    fn received_pages_and_memory_fds_of_the_wrong_kind_are_refused() {
        // A memfd without seals.
        let bare = rustix::fs::memfd_create("bare", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&bare, PAGE_LEN as u64).unwrap();
        let e = SharedPage::map_received(bare, true, "producer page").unwrap_err();
        assert!(e.to_string().contains("seals"), "{e}");
        // A memfd of the wrong size.
        let small = rustix::fs::memfd_create("small", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&small, 100).unwrap();
        let e = SharedPage::map_received(small, true, "producer page").unwrap_err();
        assert!(
            matches!(
                e,
                crate::Error::Share(ShareError::SizeMismatch { actual: 100, .. })
            ),
            "{e}"
        );
        // A regular file, as a page and as device memory.
        let file = tempfile_fd();
        let e = check_memory_fd(file.as_fd(), 4096, "memory").unwrap_err();
        assert!(
            matches!(e, crate::Error::Share(ShareError::WrongFdKind { .. })),
            "{e}"
        );
        let e = SharedPage::map_received(file, true, "page").unwrap_err();
        assert!(
            matches!(e, crate::Error::Share(ShareError::WrongFdKind { .. })),
            "{e}"
        );
        // A memfd shorter than the memory it claims to be.
        let short = rustix::fs::memfd_create("short", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&short, 4096).unwrap();
        let e = check_memory_fd(short.as_fd(), 8192, "memory").unwrap_err();
        assert!(
            matches!(
                e,
                crate::Error::Share(ShareError::SizeMismatch {
                    declared: 8192,
                    actual: 4096,
                    ..
                })
            ),
            "{e}"
        );
        // A pipe.
        let (r, _w) = std::io::pipe().unwrap();
        let e = check_memory_fd(r.as_fd(), 4096, "memory").unwrap_err();
        assert!(
            matches!(e, crate::Error::Share(ShareError::WrongFdKind { .. })),
            "{e}"
        );
    }

    fn tempfile_fd() -> OwnedFd {
        let dir = std::env::temp_dir().join(format!("vkgdr-page-test-{}", std::process::id()));
        std::fs::write(&dir, [0u8; 8192]).unwrap();
        let f = std::fs::File::open(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        f.into()
    }
}
