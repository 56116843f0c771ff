//! The shared-memory queue `vkgdr bench xproc` measures the ring lanes against: what a user
//! would build without vkgdr. The owner creates a memfd of `lanes` queues, registers its mapping
//! with `cuMemHostRegister` (or, where the driver refuses, copies through pinned staging) and
//! drains it into device memory with `cuMemcpyHtoDAsync`; each producer process (`xproc-shm`,
//! no CUDA) inherits the fd and writes fixed-size records into its lane.
//!
//! Layout ([`ShmQueue`]): per lane a 4 KiB control page (`tail` at byte 0, written by the
//! producer; `head` at byte 128, written by the owner once the records below it are in device
//! memory), then per lane `capacity` bytes of records. Positions only grow; a record lies at
//! `pos % capacity`, and the capacity is a multiple of the record size, so no record crosses the
//! end.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::protocol::{say, Line};
use super::{spin_until, Commands, Outcome, Rtt};
use crate::bench::ring::batch_records;

/// Bytes of each lane's control page.
pub const CONTROL: u64 = 4096;
/// Byte offset of `head` in a control page (its own cache lines, away from `tail`).
const HEAD_OFFSET: u64 = 128;
/// How long a producer waits for space, or a lone record for its acknowledgement.
const WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A mapping of the queue (see the module docs). Unmapped on drop.
#[derive(Debug)]
pub struct ShmQueue {
    base: NonNull<u8>,
    len: usize,
    lanes: u32,
    capacity: u64,
}

// SAFETY: the mapping is plain shared memory; the words shared between threads and processes
// are only touched through atomics, the records through raw copies into ranges the protocol
// gives one writer at a time.
unsafe impl Send for ShmQueue {}
// SAFETY: as above.
unsafe impl Sync for ShmQueue {}

impl ShmQueue {
    /// Bytes of a queue of `lanes` lanes of `capacity` bytes.
    pub fn size(lanes: u32, capacity: u64) -> u64 {
        u64::from(lanes) * (CONTROL + capacity)
    }

    /// A new queue in a memfd (close-on-exec: only the children it is handed to get it), zeroed,
    /// and this process's mapping of it.
    pub fn create(lanes: u32, capacity: u64) -> Outcome<(ShmQueue, OwnedFd)> {
        if lanes == 0 || capacity == 0 || !capacity.is_multiple_of(CONTROL) {
            return Err(format!("a queue of {lanes} lanes of {capacity} bytes"));
        }
        // SAFETY: a NUL-terminated name and flags; the fd returned is new and ours.
        let fd = unsafe { libc::memfd_create(c"vkgdr-xproc-queue".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a new fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = Self::size(lanes, capacity);
        // SAFETY: a valid fd and a length.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(format!(
                "ftruncate of the queue to {size} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        let queue = Self::map(fd.as_raw_fd(), lanes, capacity)?;
        Ok((queue, fd))
    }

    /// Maps the queue in `fd` (which must hold [`size`](Self::size) bytes).
    pub fn map(fd: RawFd, lanes: u32, capacity: u64) -> Outcome<ShmQueue> {
        let size = Self::size(lanes, capacity);
        // SAFETY: an all-zero `stat` is a valid value for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer; a bad fd is an error, not undefined behaviour.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(format!(
                "fstat of fd {fd}: {}",
                std::io::Error::last_os_error()
            ));
        }
        if (st.st_size as u64) < size {
            return Err(format!(
                "fd {fd} holds {} bytes, a queue of {lanes} lanes of {capacity} bytes {size}",
                st.st_size
            ));
        }
        // SAFETY: a new shared mapping of `size` bytes of the file, which holds at least that
        // many; nothing else is at the address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mmap of the queue ({size} bytes): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(ShmQueue {
            base: NonNull::new(p.cast()).ok_or("mmap returned null")?,
            len: size as usize,
            lanes,
            capacity,
        })
    }

    /// Lanes.
    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    /// Bytes of records per lane.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The first byte of the mapping and its length (what the owner registers).
    pub fn mapping(&self) -> (*mut u8, usize) {
        (self.base.as_ptr(), self.len)
    }

    fn word(&self, lane: u32, offset: u64) -> &AtomicU64 {
        assert!(lane < self.lanes);
        let at = u64::from(lane) * CONTROL + offset;
        // SAFETY: an 8-aligned word inside the control page of `lane` (page-aligned mapping),
        // alive as long as `self`; every process touches it only through atomics.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(at as usize).cast()) }
    }

    /// The producer's published end of `lane`.
    pub fn tail(&self, lane: u32) -> &AtomicU64 {
        self.word(lane, 0)
    }

    /// Where the owner has copied `lane` up to.
    pub fn head(&self, lane: u32) -> &AtomicU64 {
        self.word(lane, HEAD_OFFSET)
    }

    /// Byte offset of `lane`'s records in the mapping.
    pub fn data_offset(&self, lane: u32) -> u64 {
        assert!(lane < self.lanes);
        u64::from(self.lanes) * CONTROL + u64::from(lane) * self.capacity
    }

    /// The address of byte `pos % capacity` of `lane`'s records.
    pub fn at(&self, lane: u32, pos: u64) -> *mut u8 {
        let off = self.data_offset(lane) + pos % self.capacity;
        // In range: `off < len` by the layout.
        self.base.as_ptr().wrapping_add(off as usize)
    }
}

impl Drop for ShmQueue {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once; nothing borrows it past `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The ranges `[from, to)` of a lane covers in its region, as `(offset, len)`: one, or two where
/// it wraps (positions are `capacity`-periodic).
pub fn spans(from: u64, to: u64, capacity: u64) -> Vec<(u64, u64)> {
    debug_assert!(from <= to && to - from <= capacity);
    if from == to {
        return Vec::new();
    }
    let a = from % capacity;
    let len = to - from;
    if a + len <= capacity {
        vec![(a, len)]
    } else {
        vec![(a, capacity - a), (0, len - (capacity - a))]
    }
}

/// `xproc-shm`'s options.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ShmArgs {
    /// The queue's memfd, inherited from the owner
    #[arg(long, value_name = "FD")]
    pub fd: RawFd,
    /// Lanes of the queue
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub lanes: u32,
    /// This producer's lane
    #[arg(long, value_name = "I")]
    pub lane: u32,
    /// Bytes of records per lane
    #[arg(long, value_name = "BYTES")]
    pub capacity: u64,
    /// Bytes per record
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(16..=65536))]
    pub size: u64,
    /// Records per `go` (with --lone: round trips)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,
    /// How many `go`s to answer
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub reps: u64,
    /// One record at a time, each waited for until the owner's head passes it
    #[arg(long)]
    pub lone: bool,
}

/// Spins until `word` reaches `at_least`.
fn wait_for(word: &AtomicU64, at_least: u64, what: &str) -> Outcome {
    let head = || word.load(Ordering::Acquire);
    spin_until(
        || head() >= at_least,
        WAIT_TIMEOUT,
        || Ok(()),
        || {
            format!(
                "{what}: the owner's head stayed at {} below {at_least} for {} s",
                head(),
                WAIT_TIMEOUT.as_secs()
            )
        },
    )
}

/// The producer: per `go`, `--records` records in batches as the ring producers make them
/// (each waits for room, copies its records in, publishes its tail; `done`), or with `--lone`
/// round trips of one record each (`lat`). Each record carries its number in the lane in its
/// first 8 bytes.
pub fn producer(a: &ShmArgs) -> Outcome {
    let commands = Commands::start()?;
    if a.lane >= a.lanes || !a.capacity.is_multiple_of(a.size) || a.capacity < 4 * a.size {
        return Err(format!(
            "lane {} of {}, records of {} B in {} bytes",
            a.lane, a.lanes, a.size, a.capacity
        ));
    }
    let queue = ShmQueue::map(a.fd, a.lanes, a.capacity)?;
    let (lane, size) = (a.lane, a.size);
    let tail = queue.tail(lane);
    let head = queue.head(lane);
    let mut record = vec![0x5au8; size as usize];
    // Only this process writes the tail: it is where the lane stands.
    let mut pos = tail.load(Ordering::Acquire);
    say(&Line::new("ready").with("lane", lane).with("tail", pos));
    let write = |pos: u64, record: &mut [u8]| {
        record[..8].copy_from_slice(&(pos / size).to_le_bytes());
        // SAFETY: `size` bytes at `pos % capacity` of this lane (the capacity is a multiple of
        // the size, so they do not cross the end), which the owner does not read until the tail
        // passes them; `record` is a distinct buffer of `size` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(record.as_ptr(), queue.at(lane, pos), size as usize)
        };
    };
    if a.lone {
        commands.wait_go()?;
        let mut samples = Vec::with_capacity(a.records as usize);
        for _ in 0..a.records {
            let t = Instant::now();
            wait_for(
                head,
                (pos + size).saturating_sub(a.capacity),
                "waiting for room",
            )?;
            write(pos, &mut record);
            pos += size;
            tail.store(pos, Ordering::Release);
            wait_for(head, pos, "a lone record")?;
            samples.push(t.elapsed().as_nanos() as f64);
        }
        let rtt = Rtt::of_samples(samples).ok_or("no round trips")?;
        say(&Line::of("lat", &rtt));
    } else {
        let batch = batch_records(size).min(a.capacity / size / 4).max(1);
        for rep in 0..a.reps {
            commands.wait_go()?;
            let t = Instant::now();
            let mut left = a.records;
            while left > 0 {
                let k = left.min(batch);
                let end = pos + k * size;
                wait_for(head, end.saturating_sub(a.capacity), "waiting for room")?;
                while pos < end {
                    write(pos, &mut record);
                    pos += size;
                }
                tail.store(pos, Ordering::Release);
                left -= k;
            }
            let push_ns = t.elapsed().as_nanos();
            say(&Line::new("done")
                .with("rep", rep)
                .with("records", a.records)
                .with("push_ns", push_ns)
                .with("tail", pos));
        }
    }
    commands.wait_quit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_split_where_a_range_wraps() {
        assert_eq!(spans(0, 0, 4096), vec![]);
        assert_eq!(spans(0, 4096, 4096), vec![(0, 4096)]);
        assert_eq!(spans(4096, 4096 + 64, 4096), vec![(0, 64)]);
        assert_eq!(spans(4032, 4160, 4096), vec![(4032, 64), (0, 64)]);
        assert_eq!(spans(100, 4196, 4096), vec![(100, 3996), (0, 100)]);
    }

    #[test]
    fn a_queue_maps_twice_onto_the_same_words() {
        let (q, fd) = ShmQueue::create(2, 8192).unwrap();
        assert_eq!(ShmQueue::size(2, 8192), 2 * (4096 + 8192));
        assert_eq!(q.data_offset(1), 8192 + 8192);
        let other = ShmQueue::map(fd.as_raw_fd(), 2, 8192).unwrap();
        q.tail(1).store(640, Ordering::Release);
        other.head(1).store(128, Ordering::Release);
        assert_eq!(other.tail(1).load(Ordering::Acquire), 640);
        assert_eq!(q.head(1).load(Ordering::Acquire), 128);
        assert_eq!(q.tail(0).load(Ordering::Acquire), 0);
        // SAFETY: 8 bytes inside lane 1's records in both mappings of one file.
        unsafe {
            q.at(1, 8192 + 8).cast::<u64>().write_unaligned(77);
            assert_eq!(other.at(1, 8).cast::<u64>().read_unaligned(), 77);
        }
        // A file too small for the layout is refused.
        assert!(ShmQueue::map(fd.as_raw_fd(), 4, 8192)
            .unwrap_err()
            .contains("holds"));
        assert!(ShmQueue::create(1, 100).is_err());
    }
}
