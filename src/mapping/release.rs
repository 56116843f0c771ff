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
//! the queue before they give up with out-of-memory ([`ReleaseQueue::poll_until`]). Whoever polls
//! takes one release at a time, so a drop that takes long holds back only its own; an owner that
//! waits for its own releases (an arena's slot) polls with its [`ReleaseKey`] and takes those
//! first. [`ReleaseTimes`] says what waited, and for how long.

use std::collections::{HashMap, VecDeque};
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
    /// The owner's account of its releases.
    account: ReleaseAccount,
    /// Whose it is, for a caller that waits for its own ([`ReleaseQueue::poll_until`]).
    key: ReleaseKey,
    /// When it was queued, and the type of `value` (for [`ReleaseTimes`]).
    since: Instant,
    what: &'static str,
}

impl Pending {
    /// Drops the value (its fence has passed: seen at `passed`), timing the wait, the turn and
    /// the drop on the owner's account.
    fn finish(self, passed: Instant) {
        let Pending {
            fence,
            value,
            account,
            since,
            what,
            ..
        } = self;
        drop(fence);
        let waited = passed.saturating_duration_since(since);
        let id = account.started(waited, passed.elapsed(), what);
        let start = Instant::now();
        drop(value);
        account.finished(id, start.elapsed(), what);
    }
}

/// How many releases of one owner (a [`Gpu`](crate::Gpu)) wait in the queue, and how long they
/// took.
#[derive(Clone, Default)]
pub(crate) struct ReleaseAccount(Arc<AccountState>);

#[derive(Default)]
struct AccountState {
    waiting: AtomicUsize,
    times: Mutex<Times>,
}

/// The slowest releases of one owner so far, and the drops under way.
#[derive(Default)]
struct Times {
    longest_wait: Option<SlowRelease>,
    longest_turn: Option<SlowRelease>,
    longest_drop: Option<SlowRelease>,
    /// Drops under way: an id, when it began, what it drops.
    dropping: Vec<(u64, Instant, &'static str)>,
    next_id: u64,
}

impl ReleaseAccount {
    /// Releases waiting now.
    pub(crate) fn get(&self) -> usize {
        self.0.waiting.load(Ordering::Acquire)
    }

    /// Notes a drop beginning after its fence took `waited` and its turn `turn`; returns its
    /// id for [`finished`](Self::finished).
    fn started(&self, waited: Duration, turn: Duration, what: &'static str) -> u64 {
        let mut t = self.0.times.lock();
        SlowRelease::keep_longest(&mut t.longest_wait, waited, what);
        SlowRelease::keep_longest(&mut t.longest_turn, turn, what);
        let id = t.next_id;
        t.next_id += 1;
        t.dropping.push((id, Instant::now(), what));
        id
    }

    /// Notes the end of drop `id`, which took `took`; the release no longer waits.
    fn finished(&self, id: u64, took: Duration, what: &'static str) {
        {
            let mut t = self.0.times.lock();
            SlowRelease::keep_longest(&mut t.longest_drop, took, what);
            t.dropping.retain(|(i, ..)| *i != id);
        }
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    fn same(&self, other: &ReleaseAccount) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// One release and how long it took (or has taken so far): see [`ReleaseTimes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowRelease {
    /// How long.
    pub time: Duration,
    /// The Rust type of what was released (`std::any::type_name`; [`SlowRelease::what`] gives it
    /// without module paths).
    pub type_name: &'static str,
}

impl SlowRelease {
    /// The released type's name without module paths (`Arc<RingMemory>`, `ReleasedChunk`).
    pub fn what(&self) -> String {
        short_type_name(self.type_name)
    }

    fn keep_longest(slot: &mut Option<SlowRelease>, time: Duration, type_name: &'static str) {
        if slot.is_none_or(|s| time > s.time) {
            *slot = Some(SlowRelease { time, type_name });
        }
    }
}

impl std::fmt::Display for SlowRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.3} ms ({})",
            self.time.as_secs_f64() * 1e3,
            self.what()
        )
    }
}

/// How the releases of one [`Gpu`](crate::Gpu)'s memory went: those waiting now, and the
/// slowest so far, of those that waited in the release queue (a release whose GPU work was
/// done at once drops its value on the caller's thread and is not counted). A release waits
/// for the GPU work queued before it on the legacy and blocking streams; one that waits for
/// seconds names work that does not end (a kernel there that runs on). Then it waits for its
/// turn: the queue hands out one release at a time to whichever thread polls (its own thread,
/// an allocation that ran out of memory), so a drop that takes long (unmapping a large
/// allocation) holds back the releases behind it until another thread polls.
///
/// ```no_run
/// let gpu = vkgdr::Gpu::open(0)?;
/// let times = gpu.release_times();
/// if let Some(oldest) = times.oldest_waiting {
///     eprintln!("{} releases waiting, the oldest for {oldest}", times.waiting);
/// }
/// # Ok::<(), vkgdr::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseTimes {
    /// Releases waiting now, for their fence or in a drop
    /// ([`Gpu::pending_releases`](crate::Gpu::pending_releases)).
    pub waiting: usize,
    /// The release that has waited longest of those queued now (for its fence, or for its turn
    /// to be dropped).
    pub oldest_waiting: Option<SlowRelease>,
    /// The drop under way now that began first, and how long it has taken so far.
    pub longest_dropping: Option<SlowRelease>,
    /// The longest any release waited for the GPU work queued before it (as often as the
    /// queue looked: at least every millisecond, and between two drops).
    pub longest_wait: Option<SlowRelease>,
    /// The longest a release whose GPU work was done waited for its turn to be dropped: behind
    /// other drops on the queue's thread, until a thread that polls took it.
    pub longest_turn: Option<SlowRelease>,
    /// The longest the drop of a released value took.
    pub longest_drop: Option<SlowRelease>,
}

/// `std::any::type_name` without module paths: `alloc::sync::Arc<vkgdr::ring::RingMemory>` is
/// `Arc<RingMemory>`.
fn short_type_name(full: &str) -> String {
    let mut out = String::with_capacity(full.len());
    let mut word = String::new();
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            out.push_str(word.rsplit("::").next().unwrap_or(""));
            word.clear();
            out.push(c);
        }
    }
    out.push_str(word.rsplit("::").next().unwrap_or(""));
    out
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
    lists: Mutex<Lists>,
    /// Releases in `lists` (both lists), readable without the lock.
    waiting: AtomicUsize,
    wake: Condvar,
    thread: OnceLock<bool>,
}

/// The releases of a [`ReleaseQueue`].
struct Lists {
    /// Waiting for their fences.
    pending: Vec<Pending>,
    /// Fence passed (when it was seen), value not dropped yet. Pollers take them one at a time,
    /// so a drop that takes long holds back only its own release: another thread's poll takes
    /// the next.
    ready: VecDeque<(Pending, Instant)>,
    /// When `pending` was last looked through.
    looked: Option<Instant>,
}

impl Lists {
    const fn new() -> Lists {
        Lists {
            pending: Vec::new(),
            ready: VecDeque::new(),
            looked: None,
        }
    }

    fn len(&self) -> usize {
        self.pending.len() + self.ready.len()
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.ready.is_empty()
    }

    /// Moves the releases whose fences have passed to `ready`, when `ready` holds none that
    /// `key` takes or `pending` was last looked through [`LOOK_EVERY`] ago: each look is a load
    /// per ticket and a driver call per event fence, so not one per drop.
    fn look(&mut self, key: ReleaseKey) {
        let now = Instant::now();
        let stale = self.looked.is_none_or(|at| now - at >= LOOK_EVERY);
        if !stale && self.ready.iter().any(|(p, _)| key.takes(p)) {
            return;
        }
        let passed: Vec<Pending> = self.pending.extract_if(.., |p| p.fence.passed()).collect();
        self.ready.extend(passed.into_iter().map(|p| (p, now)));
        self.looked = Some(now);
    }
}

/// How often a poller looks through the releases waiting for their fences while it takes
/// passed ones.
const LOOK_EVERY: Duration = Duration::from_millis(1);

static QUEUE: ReleaseQueue = ReleaseQueue::new();

/// Whose a release is: [`ReleaseKey::ANY`] for most; an owner that later waits for its own
/// releases (an [`Arena`](crate::Arena) growing into a slot it released) gives its own, and its
/// [`ReleaseQueue::poll_until`] takes those first, ahead of slower drops of others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReleaseKey(usize);

impl ReleaseKey {
    /// Nobody's in particular; as a poller's key: takes every release.
    pub(crate) const ANY: ReleaseKey = ReleaseKey(0);

    /// The key of what `owner` points to (unique while it lives).
    pub(crate) fn of<T>(owner: &Arc<T>) -> ReleaseKey {
        ReleaseKey(Arc::as_ptr(owner) as usize)
    }

    /// Whether a poller with this key takes `p`.
    fn takes(self, p: &Pending) -> bool {
        self == ReleaseKey::ANY || p.key == self
    }
}

/// How long an allocation that ran out of memory (or an arena slot still being released) keeps
/// releasing what is due before it gives up: GPU work that was about to finish gets the chance
/// to, a running kernel does not hold the caller up.
pub(crate) const DUE_SOON: Duration = Duration::from_millis(5);

impl ReleaseQueue {
    const fn new() -> ReleaseQueue {
        ReleaseQueue {
            lists: Mutex::new(Lists::new()),
            waiting: AtomicUsize::new(0),
            wake: Condvar::new(),
            thread: OnceLock::new(),
        }
    }

    /// The process's queue.
    pub(crate) fn global() -> &'static ReleaseQueue {
        &QUEUE
    }

    /// Drops `value` once `fence` has passed: on this thread if it passes within [`SPIN`],
    /// otherwise on the queue's thread (or a thread that polls with `key`). Never waits longer.
    pub(crate) fn release<V: Send + 'static>(
        &'static self,
        fence: Box<dyn Fence>,
        value: V,
        account: &ReleaseAccount,
        key: ReleaseKey,
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
        account.0.waiting.fetch_add(1, Ordering::AcqRel);
        let mut lists = self.lists.lock();
        lists.pending.push(Pending {
            fence,
            value: Box::new(value),
            account: account.clone(),
            key,
            since: start,
            what: std::any::type_name::<V>(),
        });
        self.waiting.store(lists.len(), Ordering::Release);
        drop(lists);
        self.start_thread();
        self.wake.notify_one();
    }

    /// Drops one release whose fence has passed and that `key` takes, on the calling thread;
    /// whether there was one.
    fn poll_one(&self, key: ReleaseKey) -> bool {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return false;
        }
        let (next, passed) = {
            let mut lists = self.lists.lock();
            lists.look(key);
            let Some(at) = lists.ready.iter().position(|(p, _)| key.takes(p)) else {
                return false;
            };
            let next = lists.ready.remove(at).expect("found above");
            self.waiting.store(lists.len(), Ordering::Release);
            next
        };
        // Outside the lock: dropping a value may queue another release.
        next.finish(passed);
        true
    }

    /// Drops every waiting value whose fence has passed, on the calling thread, one at a time;
    /// returns how many.
    pub(crate) fn poll(&self) -> usize {
        let mut n = 0;
        while self.poll_one(ReleaseKey::ANY) {
            n += 1;
        }
        n
    }

    /// The releases of `account`'s owner: those waiting now and the slowest so far.
    pub(crate) fn times(&self, account: &ReleaseAccount) -> ReleaseTimes {
        let now = Instant::now();
        let oldest_waiting = {
            let lists = self.lists.lock();
            let queued = lists
                .pending
                .iter()
                .chain(lists.ready.iter().map(|(p, _)| p));
            let mine = queued.filter(|p| p.account.same(account));
            mine.min_by_key(|p| p.since).map(|p| SlowRelease {
                time: now.saturating_duration_since(p.since),
                type_name: p.what,
            })
        };
        let t = account.0.times.lock();
        ReleaseTimes {
            waiting: account.get(),
            oldest_waiting,
            longest_dropping: t.dropping.iter().min_by_key(|(_, at, _)| *at).map(
                |&(_, at, type_name)| SlowRelease {
                    time: now.saturating_duration_since(at),
                    type_name,
                },
            ),
            longest_wait: t.longest_wait,
            longest_turn: t.longest_turn,
            longest_drop: t.longest_drop,
        }
    }

    /// Releases what is due, one at a time (those of `key` only, unless it is
    /// [`ReleaseKey::ANY`]), until `done()` holds or `within` has passed, checked between two
    /// drops (then `done()` is returned as it stands). With [`ReleaseKey::ANY`] it returns at
    /// once when nothing waits in the queue.
    pub(crate) fn poll_until(
        &self,
        within: Duration,
        key: ReleaseKey,
        done: impl Fn() -> bool,
    ) -> bool {
        let start = Instant::now();
        loop {
            if done() {
                return true;
            }
            let dropped = self.poll_one(key);
            let idle = key == ReleaseKey::ANY && self.waiting.load(Ordering::Acquire) == 0;
            if start.elapsed() >= within || (!dropped && idle) {
                return done();
            }
            if !dropped {
                std::thread::sleep(Duration::from_micros(20));
            }
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
                let mut lists = self.lists.lock();
                while lists.is_empty() {
                    self.wake.wait(&mut lists);
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
        let (dropped, count) = (Arc::new(AtomicUsize::new(0)), ReleaseAccount::default());
        QUEUE.release(
            Box::new(Passed),
            Counted(dropped.clone()),
            &count,
            ReleaseKey::ANY,
        );
        assert_eq!((dropped.load(Ordering::Acquire), count.get()), (1, 0));
    }

    #[test]
    fn a_closed_fence_waits_in_the_queue_until_it_opens() {
        let (dropped, count) = (Arc::new(AtomicUsize::new(0)), ReleaseAccount::default());
        let open = Arc::new(AtomicBool::new(false));
        for _ in 0..3 {
            QUEUE.release(
                Box::new(Flag(open.clone())),
                Counted(dropped.clone()),
                &count,
                ReleaseKey::ANY,
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
        struct Chain(Option<(Arc<AtomicBool>, Arc<AtomicUsize>, ReleaseAccount)>);
        impl Drop for Chain {
            fn drop(&mut self) {
                if let Some((open, dropped, count)) = self.0.take() {
                    QUEUE.release(
                        Box::new(Flag(open)),
                        Counted(dropped),
                        &count,
                        ReleaseKey::ANY,
                    );
                }
            }
        }
        let (dropped, count) = (Arc::new(AtomicUsize::new(0)), ReleaseAccount::default());
        let open = Arc::new(AtomicBool::new(true));
        let inner = Arc::new(AtomicBool::new(false));
        QUEUE.release(
            Box::new(Flag(open)),
            Chain(Some((inner.clone(), dropped.clone(), count.clone()))),
            &count,
            ReleaseKey::ANY,
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

    /// Drops only once `go` is set (or after 3 s, so a failing test ends), saying when it began.
    struct Blocking {
        started: Arc<AtomicBool>,
        go: Arc<AtomicBool>,
    }

    impl Blocking {
        fn new() -> (Blocking, Arc<AtomicBool>, Arc<AtomicBool>) {
            let (started, go) = (
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicBool::new(false)),
            );
            (
                Blocking {
                    started: started.clone(),
                    go: go.clone(),
                },
                started,
                go,
            )
        }
    }

    impl Drop for Blocking {
        fn drop(&mut self) {
            self.started.store(true, Ordering::Release);
            let t = Instant::now();
            while !self.go.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Takes 30 ms to drop.
    struct Slow;

    impl Drop for Slow {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    /// A queue of its own without a thread: only the test's pollers drop its releases.
    fn private_queue() -> &'static ReleaseQueue {
        let q: &'static ReleaseQueue = Box::leak(Box::new(ReleaseQueue::new()));
        q.thread.set(false).expect("a new queue has no thread");
        q
    }

    /// Polls `q` until `done()` or 10 s; returns `done()`.
    fn poll_for(q: &ReleaseQueue, done: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while !done() && t.elapsed() < Duration::from_secs(10) {
            q.poll();
            std::thread::sleep(Duration::from_micros(100));
        }
        done()
    }

    /// Waits up to 10 s for `flag`.
    fn until_set(flag: &AtomicBool) -> bool {
        let t = Instant::now();
        while !flag.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_micros(100));
        }
        flag.load(Ordering::Acquire)
    }

    #[test]
    fn a_drop_that_takes_long_holds_back_only_its_own_release() {
        let (q, count) = (private_queue(), ReleaseAccount::default());
        let open = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (blocking, started, go) = Blocking::new();
        q.release(
            Box::new(Flag(open.clone())),
            blocking,
            &count,
            ReleaseKey::ANY,
        );
        q.release(
            Box::new(Flag(open.clone())),
            Counted(dropped.clone()),
            &count,
            ReleaseKey::ANY,
        );
        open.store(true, Ordering::Release);
        // A helper takes the blocking drop (the first in line); then this thread polls.
        let helper = std::thread::spawn(move || q.poll());
        assert!(until_set(&started), "the blocking drop began");
        let during = q.times(&count);
        let freed = poll_for(q, || dropped.load(Ordering::Acquire) == 1);
        let left = count.get();
        go.store(true, Ordering::Release);
        assert_eq!(
            helper.join().unwrap(),
            1,
            "the helper dropped the blocking value only"
        );
        assert!(
            freed,
            "the second release waited behind the first one's drop"
        );
        assert_eq!(left, 1, "only the blocking release was left");
        assert_eq!(
            during.longest_dropping.expect("a drop under way").what(),
            "Blocking"
        );
        assert_eq!(count.get(), 0);
        let after = q.times(&count);
        assert_eq!(after.longest_dropping, None);
        assert_eq!(after.longest_drop.expect("timed").what(), "Blocking");
    }

    #[test]
    fn a_poller_with_a_key_takes_its_own_release_ahead_of_the_others() {
        let (q, count) = (private_queue(), ReleaseAccount::default());
        let open = Arc::new(AtomicBool::new(false));
        let mine = ReleaseKey::of(&open);
        let dropped = Arc::new(AtomicUsize::new(0));
        let (first, started, go_first) = Blocking::new();
        let (second, second_started, go_second) = Blocking::new();
        for value in [first, second] {
            q.release(Box::new(Flag(open.clone())), value, &count, ReleaseKey::ANY);
        }
        q.release(
            Box::new(Flag(open.clone())),
            Counted(dropped.clone()),
            &count,
            mine,
        );
        open.store(true, Ordering::Release);
        let helper = std::thread::spawn(move || q.poll_one(ReleaseKey::ANY));
        assert!(until_set(&started));
        // In line behind the second blocking drop; taken at once with the key.
        let t = Instant::now();
        let done = q.poll_until(Duration::from_secs(5), mine, || {
            dropped.load(Ordering::Acquire) == 1
        });
        let took = t.elapsed();
        let second_taken = second_started.load(Ordering::Acquire);
        go_first.store(true, Ordering::Release);
        go_second.store(true, Ordering::Release);
        assert!(helper.join().unwrap());
        assert!(
            done && !second_taken,
            "the keyed poll took another's drop first"
        );
        assert!(took < Duration::from_secs(1), "{took:?}");
        // A keyed poll takes nothing else, and waits out its time when its own are gone.
        assert!(!q.poll_until(Duration::from_millis(5), mine, || false));
        assert_eq!(count.get(), 1, "the second blocking release is still there");
        assert_eq!(q.poll(), 1);
    }

    #[test]
    fn poll_until_stops_between_drops_once_its_time_is_up() {
        let (q, count) = (private_queue(), ReleaseAccount::default());
        let open = Arc::new(AtomicBool::new(false));
        for _ in 0..3 {
            q.release(Box::new(Flag(open.clone())), Slow, &count, ReleaseKey::ANY);
        }
        open.store(true, Ordering::Release);
        assert!(!q.poll_until(Duration::from_millis(5), ReleaseKey::ANY, || false));
        assert_eq!(count.get(), 2, "one drop, then the time was up");
        // The two left: the second's turn came after the first drop, the third's after two.
        assert_eq!(q.poll(), 2);
        let times = q.times(&count);
        let turn = times.longest_turn.expect("timed");
        let wait = times.longest_wait.expect("timed");
        assert!(turn.time >= Duration::from_millis(60), "{turn}");
        assert!(wait.time < turn.time, "{wait} against {turn}");
        assert!(times.longest_drop.expect("timed").time >= Duration::from_millis(30));
    }

    #[test]
    fn release_times_name_the_oldest_and_the_slowest_release() {
        let (q, count) = (private_queue(), ReleaseAccount::default());
        let open = Arc::new(AtomicBool::new(false));
        let t = Instant::now();
        q.release(Box::new(Flag(open.clone())), Slow, &count, ReleaseKey::ANY);
        std::thread::sleep(Duration::from_millis(30));
        let before = q.times(&count);
        assert_eq!(before.waiting, 1);
        let oldest = before.oldest_waiting.expect("one release waits");
        assert_eq!(oldest.what(), "Slow");
        assert!(oldest.time >= Duration::from_millis(30), "{oldest}");
        assert_eq!((before.longest_wait, before.longest_drop), (None, None));
        open.store(true, Ordering::Release);
        assert!(poll_for(q, || count.get() == 0));
        let waited = t.elapsed();
        let after = q.times(&count);
        assert_eq!((after.waiting, after.oldest_waiting), (0, None));
        let wait = after.longest_wait.expect("timed");
        let drop_time = after.longest_drop.expect("timed");
        assert!(
            wait.time >= Duration::from_millis(30) && wait.time <= waited,
            "{wait}"
        );
        assert!(drop_time.time >= Duration::from_millis(30), "{drop_time}");
        assert_eq!(
            (wait.what(), drop_time.what()),
            ("Slow".into(), "Slow".into())
        );
    }

    #[test]
    fn type_names_lose_their_module_paths() {
        assert_eq!(
            short_type_name("alloc::sync::Arc<vkgdr::ring::RingMemory>"),
            "Arc<RingMemory>"
        );
        assert_eq!(
            short_type_name("(u8, core::option::Option<a::b::C<'_>>)"),
            "(u8, Option<C<'_>>)"
        );
        assert_eq!(short_type_name("Plain"), "Plain");
    }
}
