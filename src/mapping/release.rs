//! Releases that never wait for a running kernel.
//!
//! Memory handed back while GPU work may still use it must outlive that work. `cuMemFree` gets
//! there by waiting for every kernel of the device, a persistent one too, which is forever; any
//! thread that frees then hangs. Here a release is a value to drop (a device mapping, a piece of
//! a shared chunk, a ring's memory) and a [`Fence`]: the GPU work that must be done first. When
//! the fence has passed already (the usual case: nothing queued), the value drops at once, on the
//! caller's thread; otherwise it waits in the process's release queue, whose thread drops it when
//! the fence passes. The caller never waits either way.
//!
//! The fences:
//! - [`TicketFence`]: the work queued in a context before the release. The release writes a
//!   ticket into a completion word with `cuStreamWriteValue32` on the context's legacy default
//!   stream, which runs it only after everything queued before it there and on every blocking
//!   stream (the default streams of CUDA C, CuPy, PyTorch, PyCUDA, per-thread or not). Checking
//!   it is one load from pinned host memory: no driver call, no context, so it stays safe even
//!   when the context is destroyed later (destruction first finishes its work). Work on streams
//!   created non-blocking is not ordered with the legacy stream and is not waited for: a
//!   persistent kernel belongs there (it would hold every release back otherwise), and memory it
//!   uses is released with [`EventFence`] on its stream, or after it stopped.
//! - [`EventFence`]: an event recorded on a stream (`release_after(stream)`, a ring's consumer),
//!   or on the legacy stream where the driver lacks stream memory operations.
//!
//! Memory waiting here still counts as in use (BAR exhaustion stays exact); allocation paths poll
//! the queue before they give up with out-of-memory ([`ReleaseQueue::poll`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::core::handle::SendSyncPtr;
use crate::core::sync::lock::{Condvar, Mutex};
use crate::driver::cuda::{ContextGuard, CuContext, CuStream, Driver, CU_EVENT_DISABLE_TIMING};
use crate::error::{Error, Result};
use crate::mapping::vmm::{MappedMemory, VmmDevice};

/// What must be done on the GPU before a release may drop its value.
pub(crate) trait Fence: Send {
    /// Whether the GPU work the fence stands for has completed. Cheap, never blocks; an error
    /// reading it (a dead context: no kernel of it runs any more) counts as passed.
    fn passed(&self) -> bool;
}

/// How long a release checks its fence on the caller's thread before it queues: the GPU's
/// answer to a ticket on an idle stream arrives in about 2 µs.
const SPIN: Duration = Duration::from_micros(20);
/// The release thread's polling interval while releases wait: from this...
const POLL_MIN: Duration = Duration::from_micros(50);
/// ... doubling up to this while none passes.
const POLL_MAX: Duration = Duration::from_millis(2);

/// One release waiting for its fence.
struct Pending {
    fence: Box<dyn Fence>,
    value: Box<dyn Send>,
    /// The owner's count of waiting releases ([`PendingCount`]).
    count: PendingCount,
}

/// How many releases of one owner (a [`Gpu`](crate::Gpu)) wait in the queue.
#[derive(Clone, Default)]
pub(crate) struct PendingCount(Arc<AtomicUsize>);

impl PendingCount {
    /// Releases waiting now.
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// How many [`EventFence`]s of one owner (a [`Gpu`](crate::Gpu)) exist, and how many it has
/// made: each one is a `cuEventCreate`, the path taken where no completion word can be had.
#[derive(Clone, Default)]
pub(crate) struct EventFenceCount(Arc<EventFenceCounters>);

#[derive(Default)]
struct EventFenceCounters {
    alive: AtomicUsize,
    made: AtomicU64,
    /// The most alive at once.
    peak: AtomicUsize,
}

impl EventFenceCount {
    /// Event fences alive now.
    pub(crate) fn alive(&self) -> usize {
        self.0.alive.load(Ordering::Acquire)
    }

    /// Event fences made so far.
    pub(crate) fn made(&self) -> u64 {
        self.0.made.load(Ordering::Relaxed)
    }

    /// The most event fences alive at once so far.
    pub(crate) fn peak(&self) -> usize {
        self.0.peak.load(Ordering::Relaxed)
    }
}

/// The process's queue of releases waiting for their fences, and its thread.
pub(crate) struct ReleaseQueue {
    pending: Mutex<Vec<Pending>>,
    /// `pending.len()`, readable without the lock.
    waiting: AtomicUsize,
    wake: Condvar,
    thread: OnceLock<bool>,
}

static QUEUE: ReleaseQueue = ReleaseQueue {
    pending: Mutex::new(Vec::new()),
    waiting: AtomicUsize::new(0),
    wake: Condvar::new(),
    thread: OnceLock::new(),
};

/// How long an allocation that ran out of memory (or an arena slot still being released) keeps
/// releasing what is due before it gives up: GPU work that was about to finish gets the chance
/// to, a running kernel does not hold the caller up.
pub(crate) const DUE_SOON: Duration = Duration::from_millis(5);

impl ReleaseQueue {
    /// The process's queue.
    pub(crate) fn global() -> &'static ReleaseQueue {
        &QUEUE
    }

    /// Drops `value` once `fence` has passed: on this thread if it passes within [`SPIN`],
    /// otherwise on the queue's thread. Never waits longer.
    pub(crate) fn release(
        &'static self,
        fence: Box<dyn Fence>,
        value: Box<dyn Send>,
        count: &PendingCount,
    ) {
        let start = Instant::now();
        loop {
            if fence.passed() {
                drop(value);
                return;
            }
            if start.elapsed() >= SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        count.0.fetch_add(1, Ordering::AcqRel);
        let mut pending = self.pending.lock();
        pending.push(Pending {
            fence,
            value,
            count: count.clone(),
        });
        self.waiting.store(pending.len(), Ordering::Release);
        drop(pending);
        self.start_thread();
        self.wake.notify_one();
    }

    /// Drops every waiting value whose fence has passed, on the calling thread; returns how many.
    pub(crate) fn poll(&self) -> usize {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let ready: Vec<Pending> = {
            let mut pending = self.pending.lock();
            let ready: Vec<Pending> = pending.extract_if(.., |p| p.fence.passed()).collect();
            self.waiting.store(pending.len(), Ordering::Release);
            ready
        };
        let n = ready.len();
        // Values drop outside the lock: dropping one may queue another release.
        for p in ready {
            drop(p.value);
            p.count.0.fetch_sub(1, Ordering::AcqRel);
        }
        n
    }

    /// Releases what is due until `done()` holds or `within` has passed (then `done()` is
    /// returned as it stands); returns at once when nothing waits in the queue.
    pub(crate) fn poll_until(&self, within: Duration, done: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        loop {
            self.poll();
            if done() {
                return true;
            }
            if self.waiting.load(Ordering::Acquire) == 0 || start.elapsed() >= within {
                return done();
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Whether any release waits in the queue.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0
    }

    /// Starts the queue's thread once. If the system refuses a thread, releases still happen
    /// whenever an allocation path or [`Gpu::wait_for_releases`](crate::Gpu::wait_for_releases)
    /// polls.
    fn start_thread(&'static self) {
        self.thread.get_or_init(|| {
            std::thread::Builder::new()
                .name("vkgdr-release".into())
                .spawn(move || self.run())
                .is_ok()
        });
    }

    fn run(&'static self) {
        let mut interval = POLL_MIN;
        loop {
            {
                let mut pending = self.pending.lock();
                while pending.is_empty() {
                    self.wake.wait(&mut pending);
                    interval = POLL_MIN;
                }
            }
            if self.poll() > 0 {
                interval = POLL_MIN;
            } else {
                std::thread::sleep(interval);
                interval = (interval * 2).min(POLL_MAX);
            }
        }
    }
}

/// Completion words for [`TicketFence`]s: one word per stream (the legacy stream of each context,
/// and every stream a release was ordered after), in pinned host memory mapped for the device,
/// so the GPU writes it and the CPU reads it with a plain load.
pub(crate) struct FenceWords {
    /// A granularity's worth of words, [`WORD_STRIDE`] bytes apart.
    memory: MappedMemory,
    /// Per stream (context and stream handle; a null stream is the context's legacy stream):
    /// its word's index and the last ticket issued there. The lock also orders issuing with
    /// enqueuing, so each word only ever grows (in wrapping order), even when a stream handle
    /// is reused.
    slots: Mutex<HashMap<(usize, usize), Slot>>,
}

struct Slot {
    index: usize,
    last: u32,
}

/// Bytes between two contexts' words (a cache line each).
const WORD_STRIDE: u64 = 64;

impl FenceWords {
    /// Allocates the words: one granule of pinned host memory through Vulkan and VMM, zeroed.
    pub(crate) fn new(
        device: &VmmDevice,
        vulkan: &Arc<crate::driver::vulkan::VulkanContext>,
    ) -> Result<Arc<FenceWords>> {
        let memory = MappedMemory::host(device, vulkan, device.granularity())?;
        // SAFETY: the whole allocation is ours and no GPU work refers to it yet.
        unsafe { std::ptr::write_bytes(memory.host_ptr(), 0, memory.size() as usize) };
        Ok(Arc::new(FenceWords {
            memory,
            slots: Mutex::new(HashMap::new()),
        }))
    }

    /// Bytes of pinned host memory the words take.
    pub(crate) fn size(&self) -> u64 {
        self.memory.size()
    }

    fn word(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: `slot` < size / WORD_STRIDE (checked where slots are made), so the aligned u32
        // lies inside the live mapping; the CPU touches it only through this atomic, the GPU
        // with stream memory operations.
        unsafe {
            AtomicU32::from_ptr(
                self.memory
                    .host_ptr()
                    .add(slot * WORD_STRIDE as usize)
                    .cast(),
            )
        }
    }

    /// A ticket for the work queued so far on `stream` of `context` (null: the context's legacy
    /// stream), which must be current on this thread: the stream writes it into its word once
    /// everything queued before it is done.
    pub(crate) fn ticket(
        self: &Arc<Self>,
        driver: &Driver,
        context: CuContext,
        stream: CuStream,
    ) -> Result<TicketFence> {
        let mut slots = self.slots.lock();
        let words = (self.memory.size() / WORD_STRIDE) as usize;
        let next = slots.len();
        let slot = match slots.entry((context as usize, stream as usize)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(_) if next >= words => {
                return Err(Error::Unsupported(
                    "more streams than completion words".into(),
                ))
            }
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Slot {
                index: next,
                last: 0,
            }),
        };
        // Zero is the word's first value: skip it when the count wraps.
        let ticket = match slot.last.wrapping_add(1) {
            0 => 1,
            t => t,
        };
        let address = self.memory.device_ptr() + slot.index as u64 * WORD_STRIDE;
        // SAFETY: a stream of the current context (the caller's contract) or its legacy stream;
        // an aligned word inside our mapping, which outlives every fence holding this `Arc`.
        unsafe { driver.cu_stream_write_value32(stream, address, ticket, 0) }?;
        slot.last = ticket;
        Ok(TicketFence {
            words: self.clone(),
            slot: slot.index,
            ticket,
        })
    }
}

/// Passes once a context's completion word has reached a ticket.
pub(crate) struct TicketFence {
    words: Arc<FenceWords>,
    slot: usize,
    ticket: u32,
}

impl Fence for TicketFence {
    fn passed(&self) -> bool {
        let now = self.words.word(self.slot).load(Ordering::Acquire);
        // Tickets only grow (in wrapping order); "at or past" is a non-negative distance.
        now.wrapping_sub(self.ticket) as i32 >= 0
    }
}

/// Passes once an event recorded on a stream has completed.
pub(crate) struct EventFence {
    driver: Arc<Driver>,
    /// The event's context, pushed for every call on it. A handle the driver lets any thread
    /// use.
    context: SendSyncPtr<c_void>,
    event: SendSyncPtr<c_void>,
    /// Whatever keeps `context` alive (a `Gpu`), dropped after the event.
    _owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// The owner's count of event fences, one less once this one is gone.
    count: EventFenceCount,
}

impl EventFence {
    /// Records a new event on `stream` (the null stream: the legacy stream) of `context`, which
    /// must be current on this thread and stay alive until the fence is dropped: `owner`, kept
    /// until then, may see to that. `count` counts it while it lives.
    pub(crate) fn record(
        driver: &Arc<Driver>,
        context: CuContext,
        stream: CuStream,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
        count: &EventFenceCount,
    ) -> Result<EventFence> {
        let event = driver.cu_event_create(CU_EVENT_DISABLE_TIMING)?;
        count.0.made.fetch_add(1, Ordering::Relaxed);
        let alive = count.0.alive.fetch_add(1, Ordering::AcqRel) + 1;
        count.0.peak.fetch_max(alive, Ordering::Relaxed);
        let fence = EventFence {
            driver: driver.clone(),
            context: SendSyncPtr::new(context),
            event: SendSyncPtr::new(event),
            _owner: owner,
            count: count.clone(),
        };
        // SAFETY: a live event of the current context, and a stream of it (or the null stream).
        unsafe { driver.cu_event_record(event, stream) }?;
        Ok(fence)
    }
}

impl Fence for EventFence {
    fn passed(&self) -> bool {
        // SAFETY: the context outlives the fence (`record`'s contract).
        let Ok(_ctx) = (unsafe { ContextGuard::push(&self.driver, self.context.get()) }) else {
            return true;
        };
        // SAFETY: our live event.
        unsafe { self.driver.cu_event_query(self.event.get()) }.unwrap_or(true)
    }
}

impl Drop for EventFence {
    fn drop(&mut self) {
        // SAFETY: as in `passed`; the event is ours and destroyed once.
        if let Ok(_ctx) = unsafe { ContextGuard::push(&self.driver, self.context.get()) } {
            // SAFETY: our event; destroying a recorded event is allowed at any time.
            let _ = unsafe { self.driver.cu_event_destroy(self.event.get()) };
        }
        self.count.0.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A fence the test opens by hand.
    struct Flag(Arc<AtomicBool>);

    impl Fence for Flag {
        fn passed(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
    }

    /// A fence that has always passed.
    struct Passed;

    impl Fence for Passed {
        fn passed(&self) -> bool {
            true
        }
    }

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::AcqRel);
        }
    }

    #[test]
    fn a_passed_fence_releases_on_the_callers_thread() {
        let (dropped, count) = (Arc::new(AtomicUsize::new(0)), PendingCount::default());
        QUEUE.release(Box::new(Passed), Box::new(Counted(dropped.clone())), &count);
        assert_eq!((dropped.load(Ordering::Acquire), count.get()), (1, 0));
    }

    #[test]
    fn a_closed_fence_waits_in_the_queue_until_it_opens() {
        let (dropped, count) = (Arc::new(AtomicUsize::new(0)), PendingCount::default());
        let open = Arc::new(AtomicBool::new(false));
        for _ in 0..3 {
            QUEUE.release(
                Box::new(Flag(open.clone())),
                Box::new(Counted(dropped.clone())),
                &count,
            );
        }
        assert_eq!((dropped.load(Ordering::Acquire), count.get()), (0, 3));
        QUEUE.poll();
        assert_eq!(dropped.load(Ordering::Acquire), 0, "nothing passes early");
        open.store(true, Ordering::Release);
        // The queue's thread or this poll releases them, never twice.
        let t = Instant::now();
        while count.get() > 0 && t.elapsed() < Duration::from_secs(10) {
            QUEUE.poll();
            std::thread::yield_now();
        }
        assert_eq!((dropped.load(Ordering::Acquire), count.get()), (3, 0));
    }

    #[test]
    fn releasing_one_value_may_queue_another() {
        struct Chain(Option<(Arc<AtomicBool>, Arc<AtomicUsize>, PendingCount)>);
        impl Drop for Chain {
            fn drop(&mut self) {
                if let Some((open, dropped, count)) = self.0.take() {
                    QUEUE.release(Box::new(Flag(open)), Box::new(Counted(dropped)), &count);
                }
            }
        }
        let (dropped, count) = (Arc::new(AtomicUsize::new(0)), PendingCount::default());
        let open = Arc::new(AtomicBool::new(true));
        let inner = Arc::new(AtomicBool::new(false));
        QUEUE.release(
            Box::new(Flag(open)),
            Box::new(Chain(Some((inner.clone(), dropped.clone(), count.clone())))),
            &count,
        );
        assert_eq!(count.get(), 1, "the inner release waits");
        inner.store(true, Ordering::Release);
        let t = Instant::now();
        while count.get() > 0 && t.elapsed() < Duration::from_secs(10) {
            QUEUE.poll();
            std::thread::yield_now();
        }
        assert_eq!(dropped.load(Ordering::Acquire), 1);
    }
}
