//! [`CopyPool`]: persistent worker threads that split one large copy between them.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};

use crate::core::sync::lock::{Condvar, Mutex};

use super::error::{check_lengths, CopyError};
use super::kernels;
use super::simd::simd_level;
use crate::core::handle::SendSyncPtr;

/// Default [`CopyPool::parallel_threshold`]: copies shorter than 1 MiB run on the calling
/// thread, where waking workers would cost more than it saves.
pub const DEFAULT_PARALLEL_THRESHOLD: usize = 1 << 20;

/// Default [`CopyPool::part_size`]: a split copy is cut into parts of about 2 MiB (at least one
/// per thread, at most [`MAX_PARTS_PER_THREAD`] per thread) that the threads take in turn, so a
/// thread that is preempted or slower (another NUMA node, a busy vCPU) delays the copy by one
/// part, not by a whole `1/threads` of it.
pub const DEFAULT_PART_SIZE: usize = 2 << 20;

/// Most parts per thread one copy is cut into (bounds the queue work per copy).
pub const MAX_PARTS_PER_THREAD: usize = 16;

/// Most threads a pool may have: [`CopyPool::try_new`] refuses more (the pool's bookkeeping is
/// sized by the thread count, and no machine gains from more copy threads than this).
pub const MAX_THREADS: usize = 1024;

/// Environment variable that sets the thread count of [`CopyPool::global`] (1 to
/// [`MAX_THREADS`]; unset or invalid: `available_parallelism().min(8)`).
pub const THREADS_ENV: &str = "VKGDR_COPY_THREADS";

/// The process-wide pool, created by the first [`CopyPool::global`] call.
static GLOBAL: OnceLock<CopyPool> = OnceLock::new();

/// Slice boundaries fall on multiples of this many bytes of the mapping address, so no two
/// threads share a page (or a WC line) of the mapping.
pub(super) const SLICE_ALIGN: usize = 4096;

/// Work shared by the parts of one job: called once with each part index.
type Work<'a> = dyn Fn(usize) + Sync + 'a;

/// A persistent pool of threads for large copies into and out of a mapping.
///
/// `threads` counts every thread taking part, the caller included: a pool of `n` threads keeps
/// `n - 1` workers parked on a condition variable, and a copy of at least
/// [`parallel_threshold`](Self::parallel_threshold) bytes is cut into `n` slices on 4 KiB
/// boundaries of the mapping, the calling thread copying one itself. Shorter copies run on the
/// calling thread only. Several threads may use one pool at once; a caller whose slices are
/// still queued (workers busy with other callers) copies them itself instead of waiting.
///
/// Dropping the pool stops and joins its workers.
///
/// ```
/// use vkgdr::copy::CopyPool;
///
/// let pool = CopyPool::new(4).with_parallel_threshold(64 * 1024);
/// let src: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
/// let mut mapping = vec![0u8; src.len()]; // stands in for a device mapping
/// pool.write_slice(&mut mapping, &src).unwrap();
/// assert_eq!(mapping, src);
/// ```
pub struct CopyPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    threshold: AtomicUsize,
    part_size: AtomicUsize,
}

/// State shared between the pool handle and its workers.
pub(super) struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a task is queued or on shutdown.
    wake: Condvar,
}

struct Queue {
    tasks: VecDeque<Task>,
    shutdown: bool,
}

/// One part of one job.
struct Task {
    job: Arc<Job>,
    part: usize,
}

/// One call of [`CopyPool::run_parts`].
struct Job {
    /// The caller's closure with its lifetime erased. Dereferenced only while running a part;
    /// `run_parts` does not return before every part has finished, so it is alive then.
    work: *const Work<'static>,
    state: Mutex<JobState>,
    /// Signalled when `remaining` reaches zero.
    done: Condvar,
}

struct JobState {
    /// Parts not finished yet (queued, running, or not yet started by the caller).
    remaining: usize,
    /// The first panic of any part, re-raised on the calling thread.
    panic: Option<Box<dyn Any + Send>>,
}

// SAFETY: `Job` is shared with workers only to call `work`, which is `Sync` (callable from any
// thread through a shared reference) and outlives every such call (see `Job::work`); the rest
// of the fields are `Send + Sync` already.
unsafe impl Send for Job {}
// SAFETY: as for `Send`.
unsafe impl Sync for Job {}

impl Job {
    /// Runs one part, catching a panic, and records its completion.
    fn run(&self, part: usize) {
        // SAFETY: the closure outlives this call: the job's `remaining` count includes this
        // part until the decrement below, and `run_parts` waits for zero before returning
        // (and so before the closure's borrow ends).
        let work = unsafe { &*self.work };
        let result = panic::catch_unwind(AssertUnwindSafe(|| work(part)));
        let extra_payload = {
            let mut state = self.state.lock();
            let extra = match result {
                Err(payload) if state.panic.is_none() => {
                    state.panic = Some(payload);
                    None
                }
                Err(payload) => Some(payload),
                Ok(()) => None,
            };
            state.remaining -= 1;
            if state.remaining == 0 {
                self.done.notify_all();
            }
            extra
        };
        // A second panic payload is dropped outside the lock: its destructor is foreign code.
        drop(extra_payload);
    }
}

/// Byte range `[start, end)` (offsets from `addr`) of part `part` of `parts` when `len` bytes at
/// address `addr` are cut on [`SLICE_ALIGN`] boundaries of the address. Parts cover the range
/// in order without gaps or overlap; some may be empty.
pub(super) fn slice_bounds(addr: usize, len: usize, parts: usize, part: usize) -> (usize, usize) {
    let cut = |i: usize| -> usize {
        if i == 0 {
            return 0;
        }
        if i >= parts {
            return len;
        }
        // i < parts, so the quotient is below `len` and fits in usize.
        let nominal = (len as u128 * i as u128 / parts as u128) as usize;
        let aligned = (addr + nominal) & !(SLICE_ALIGN - 1);
        aligned.max(addr) - addr
    };
    (cut(part), cut(part + 1))
}

impl CopyPool {
    /// Creates a pool of `threads` threads in all, the caller included (so `threads - 1`
    /// workers are started; `0` is taken as `1`, a pool that never parallelises).
    ///
    /// # Panics
    ///
    /// If `threads` exceeds [`MAX_THREADS`] or the operating system cannot start a thread, like
    /// [`std::thread::spawn`]; use [`try_new`](Self::try_new) to get an error instead.
    pub fn new(threads: usize) -> Self {
        match Self::try_new(threads.max(1)) {
            Ok(pool) => pool,
            Err(e) => panic!("CopyPool::new: {e}"),
        }
    }

    /// Creates a pool of `threads` threads in all, the caller included.
    ///
    /// # Errors
    ///
    /// [`CopyError::ZeroThreads`] if `threads == 0`; [`CopyError::TooManyThreads`] above
    /// [`MAX_THREADS`] (nothing is started then); [`CopyError::Spawn`] if a worker cannot be
    /// started (the workers started so far are stopped and joined).
    pub fn try_new(threads: usize) -> Result<Self, CopyError> {
        if threads == 0 {
            return Err(CopyError::ZeroThreads);
        }
        if threads > MAX_THREADS {
            return Err(CopyError::TooManyThreads {
                requested: threads,
                max: MAX_THREADS,
            });
        }
        let mut pool = CopyPool {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    tasks: VecDeque::new(),
                    shutdown: false,
                }),
                wake: Condvar::new(),
            }),
            workers: Vec::with_capacity(threads - 1),
            threads,
            threshold: AtomicUsize::new(DEFAULT_PARALLEL_THRESHOLD),
            part_size: AtomicUsize::new(DEFAULT_PART_SIZE),
        };
        for i in 1..threads {
            let shared = Arc::clone(&pool.shared);
            let handle = thread::Builder::new()
                .name(format!("vkgdr-copy-{i}"))
                .spawn(move || worker(&shared))
                .map_err(CopyError::Spawn)?; // `pool`'s Drop joins the workers started so far
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// The process-wide pool, created on first use with `available_parallelism().min(8)`
    /// threads, or as many as the environment variable [`THREADS_ENV`] says.
    ///
    /// The crate's own copies ([`Mapping::write`](crate::Mapping::write) and the reads) create it
    /// only for a copy of at least [`DEFAULT_PARALLEL_THRESHOLD`] bytes: a process whose copies
    /// are all small never starts its threads.
    ///
    /// # Panics
    ///
    /// On first use, if the operating system cannot start a thread.
    pub fn global() -> &'static CopyPool {
        GLOBAL.get_or_init(|| CopyPool::new(global_threads(std::env::var(THREADS_ENV).ok())))
    }

    /// The process-wide pool if something has created it already; never starts it.
    pub fn global_if_started() -> Option<&'static CopyPool> {
        GLOBAL.get()
    }

    /// Sets [`parallel_threshold`](Self::parallel_threshold), builder style.
    pub fn with_parallel_threshold(self, bytes: usize) -> Self {
        self.set_parallel_threshold(bytes);
        self
    }

    /// Sets the length from which copies are split between threads (0: always split).
    pub fn set_parallel_threshold(&self, bytes: usize) {
        self.threshold.store(bytes, Ordering::Relaxed);
    }

    /// Copies of at least this many bytes are split between threads; shorter ones run on the
    /// calling thread. Defaults to [`DEFAULT_PARALLEL_THRESHOLD`].
    pub fn parallel_threshold(&self) -> usize {
        self.threshold.load(Ordering::Relaxed)
    }

    /// Sets [`part_size`](Self::part_size), builder style.
    pub fn with_part_size(self, bytes: usize) -> Self {
        self.set_part_size(bytes);
        self
    }

    /// Sets the size of the parts a split copy is cut into (0: exactly one part per thread).
    pub fn set_part_size(&self, bytes: usize) {
        self.part_size.store(bytes, Ordering::Relaxed);
    }

    /// A split copy is cut into parts of about this many bytes (at least one per thread, at
    /// most [`MAX_PARTS_PER_THREAD`] per thread), which the threads take in turn: a slow or
    /// preempted thread then holds the copy up by one part only. 0 means one part per thread.
    /// Defaults to [`DEFAULT_PART_SIZE`].
    pub fn part_size(&self) -> usize {
        self.part_size.load(Ordering::Relaxed)
    }

    /// A weak reference to the state the workers share, to observe their exit in tests.
    #[cfg(test)]
    pub(super) fn shared_weak(&self) -> std::sync::Weak<Shared> {
        Arc::downgrade(&self.shared)
    }

    /// Number of threads taking part in a split copy, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// How many parts a copy of `len` bytes is cut into.
    pub(super) fn parts_for(&self, len: usize) -> usize {
        if len < self.parallel_threshold() || len == 0 || self.threads == 1 {
            return 1;
        }
        let by_size = match self.part_size() {
            0 => 1,
            part => len.div_ceil(part),
        };
        by_size.clamp(self.threads, self.threads * MAX_PARTS_PER_THREAD)
    }

    /// Like [`copy_to_mapping`](super::copy_to_mapping), split between the pool's threads when
    /// `src` is at least [`parallel_threshold`](Self::parallel_threshold) long. Every thread
    /// fences its own stores (`sfence`) before reporting its slice done, and the caller fences
    /// again before returning, so a flag stored after this call cannot overtake the data.
    ///
    /// Returns once every slice is written: no worker uses `dst` or `src` afterwards.
    ///
    /// # Safety
    ///
    /// As [`copy_to_mapping`](super::copy_to_mapping):
    ///
    /// * `dst` is valid for writes of `src.len()` bytes;
    /// * `[dst, dst + src.len())` does not overlap `src`;
    /// * no other thread reads or writes that range during the call.
    pub unsafe fn write(&self, dst: *mut u8, src: &[u8]) {
        let len = src.len();
        let parts = self.parts_for(len);
        let level = simd_level();
        // The pointers cross into the workers' closures; they are used only for disjoint slices,
        // and only before this call returns.
        let (d, s) = (
            SendSyncPtr::new(dst),
            SendSyncPtr::new(src.as_ptr().cast_mut()),
        );
        self.run_parts(parts, &|part| {
            let (start, end) = slice_bounds(d.get() as usize, len, parts, part);
            // SAFETY: `[start, end)` lies inside `[0, len)` and the parts are disjoint, so each
            // thread writes its own sub-range of the caller's valid, non-overlapping `dst` from
            // the matching sub-range of `src` (only read). `run_parts` returns only after every
            // part is done, so `src`'s borrow and `dst`'s validity cover every use.
            unsafe {
                kernels::write(
                    level,
                    d.get().add(start),
                    s.get().add(start),
                    end - start,
                    true,
                );
            }
        });
        if parts > 1 {
            // The workers' stores are ordered by their own `sfence`; this one covers the slice
            // this thread wrote and documents the contract at the return point.
            kernels::store_fence();
        }
    }

    /// Like [`copy_from_mapping`](super::copy_from_mapping), split between the pool's threads
    /// when `dst` is at least [`parallel_threshold`](Self::parallel_threshold) long. Every thread
    /// starts its slice with `mfence`; a worker receives its slice through the pool's lock after
    /// the caller's earlier loads (its flag poll), so its loads are ordered after them too.
    ///
    /// Returns once every slice is read: no worker uses `dst` or `src` afterwards.
    ///
    /// # Safety
    ///
    /// As [`copy_from_mapping`](super::copy_from_mapping):
    ///
    /// * `src` is valid for reads of `dst.len()` bytes;
    /// * `[src, src + dst.len())` does not overlap `dst`;
    /// * no other thread writes that range during the call through Rust references.
    pub unsafe fn read(&self, dst: &mut [u8], src: *const u8) {
        let len = dst.len();
        let parts = self.parts_for(len);
        let level = simd_level();
        // As in `write`: used only for disjoint slices, and only before this call returns.
        let (d, s) = (
            SendSyncPtr::new(dst.as_mut_ptr()),
            SendSyncPtr::new(src.cast_mut()),
        );
        self.run_parts(parts, &|part| {
            let (start, end) = slice_bounds(s.get() as usize, len, parts, part);
            // SAFETY: as in `write`: disjoint sub-ranges of the exclusive `dst` borrow and of
            // the caller's valid `src`, all used before `run_parts` returns.
            unsafe {
                kernels::read(level, s.get().add(start), d.get().add(start), end - start);
            }
        });
    }

    /// Safe [`write`](Self::write) where the "mapping" is an ordinary slice.
    ///
    /// # Errors
    ///
    /// [`CopyError::LengthMismatch`] if the slices differ in length; nothing is copied then.
    pub fn write_slice(&self, dst: &mut [u8], src: &[u8]) -> Result<(), CopyError> {
        check_lengths(dst.len(), src.len())?;
        // SAFETY: `dst` is a live exclusive borrow of `src.len()` bytes: valid, disjoint from
        // `src`, and inaccessible to other threads.
        unsafe { self.write(dst.as_mut_ptr(), src) };
        Ok(())
    }

    /// Safe [`read`](Self::read) where the "mapping" is an ordinary slice.
    ///
    /// # Errors
    ///
    /// [`CopyError::LengthMismatch`] if the slices differ in length; nothing is copied then.
    pub fn read_slice(&self, dst: &mut [u8], src: &[u8]) -> Result<(), CopyError> {
        check_lengths(dst.len(), src.len())?;
        // SAFETY: `src` is a live shared borrow of `dst.len()` bytes: valid for reads, disjoint
        // from `dst`, and not writable by anyone meanwhile.
        unsafe { self.read(dst, src.as_ptr()) };
        Ok(())
    }

    /// Copies `src` into `dst`, both ordinary host memory (plain `memcpy` per part), split
    /// between the pool's threads when at least [`parallel_threshold`](Self::parallel_threshold)
    /// long: for moving data out of a pinned staging buffer into pageable memory.
    ///
    /// # Errors
    ///
    /// [`CopyError::LengthMismatch`] if the slices differ in length; nothing is copied then.
    pub fn copy(&self, dst: &mut [u8], src: &[u8]) -> Result<(), CopyError> {
        check_lengths(dst.len(), src.len())?;
        let len = dst.len();
        let parts = self.parts_for(len);
        let (d, s) = (
            SendSyncPtr::new(dst.as_mut_ptr()),
            SendSyncPtr::new(src.as_ptr().cast_mut()),
        );
        self.run_parts(parts, &|part| {
            let (start, end) = slice_bounds(d.get() as usize, len, parts, part);
            // SAFETY: disjoint sub-ranges of the exclusive `dst` borrow and of the shared `src`
            // borrow (distinct allocations: a `&mut` cannot alias a `&`), all used before
            // `run_parts` returns.
            unsafe {
                std::ptr::copy_nonoverlapping(s.get().add(start), d.get().add(start), end - start)
            };
        });
        Ok(())
    }

    /// Calls `work(p)` once for every `p` in `0..parts`, spread over the pool's threads (part 0
    /// on the calling thread), and returns when all calls have finished — a scoped parallel
    /// loop, so `work` may borrow from the caller's stack.
    ///
    /// If a part panics, the other parts still run to completion and the first panic is then
    /// resumed on the calling thread; the pool stays usable.
    pub(super) fn run_parts(&self, parts: usize, work: &Work<'_>) {
        if parts <= 1 || self.workers.is_empty() {
            (0..parts).for_each(work);
            return;
        }
        let erased: *const Work<'_> = work;
        // SAFETY: only the trait object's lifetime bound changes (same layout); `Job::work`
        // documents why the pointer is never used after `work`'s borrow ends.
        let erased: *const Work<'static> = unsafe { std::mem::transmute(erased) };
        let job = Arc::new(Job {
            work: erased,
            state: Mutex::new(JobState {
                remaining: parts,
                panic: None,
            }),
            done: Condvar::new(),
        });
        {
            let mut queue = self.shared.queue.lock();
            // Reserve first: once the first task is queued, nothing below may unwind before
            // `finish` has waited for it.
            queue.tasks.reserve(parts - 1);
            for part in 1..parts {
                queue.tasks.push_back(Task {
                    job: Arc::clone(&job),
                    part,
                });
            }
        }
        // One wake-up per worker that can help; the others find the queue empty anyway.
        for _ in 1..parts.min(self.threads) {
            self.shared.wake.notify_one();
        }
        // `Finish` waits for every part even if this thread unwinds (it cannot, since parts
        // catch panics, but the borrow of `work` must not end while a worker may call it).
        let finish = Finish {
            shared: &self.shared,
            job: &job,
        };
        job.run(0);
        drop(finish);
        let payload = job.state.lock().panic.take();
        if let Some(payload) = payload {
            panic::resume_unwind(payload);
        }
    }
}

/// Completes a job on drop: runs the job's parts still queued on this thread, then waits for
/// the parts that workers took.
struct Finish<'a> {
    shared: &'a Shared,
    job: &'a Arc<Job>,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        loop {
            let task = {
                let mut queue = self.shared.queue.lock();
                let own = queue
                    .tasks
                    .iter()
                    .position(|t| Arc::ptr_eq(&t.job, self.job));
                own.and_then(|i| queue.tasks.remove(i))
            };
            match task {
                Some(task) => task.job.run(task.part),
                None => break,
            }
        }
        let mut state = self.job.state.lock();
        while state.remaining > 0 {
            self.job.done.wait(&mut state);
        }
    }
}

/// A worker: runs queued tasks until shutdown.
fn worker(shared: &Shared) {
    loop {
        let task = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(task) = queue.tasks.pop_front() {
                    break task;
                }
                if queue.shutdown {
                    return;
                }
                shared.wake.wait(&mut queue);
            }
        };
        task.job.run(task.part);
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.wake.notify_all();
        for handle in self.workers.drain(..) {
            // Workers catch every panic of a part, so `join` cannot return an error worth
            // propagating from a destructor.
            let _ = handle.join();
        }
    }
}

impl std::fmt::Debug for CopyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyPool")
            .field("threads", &self.threads)
            .field("parallel_threshold", &self.parallel_threshold())
            .field("part_size", &self.part_size())
            .finish()
    }
}

/// Thread count of the global pool: [`THREADS_ENV`]'s value when it is a number in
/// `1..=MAX_THREADS`, else the available parallelism, at most 8 (eight threads saturate the
/// BAR's writes, and more compete with the application; figures: BENCHMARKS.md, 'CPU copies
/// through the BAR').
pub(super) fn global_threads(env: Option<String>) -> usize {
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=MAX_THREADS).contains(n))
        .unwrap_or_else(|| {
            thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(8)
        })
}
