//! [`DeviceToHostRing`]: the device → host rings of [`core::d2h`](crate::ring::core::d2h) on a
//! GPU. Kernels publish with `include/vkgdr/ring_d2h.cuh` into the view
//! ([`DeviceToHostRing::device_view`]); a CPU thread per lane takes the records
//! ([`DeviceToHostRing::consumer`], a [`LaneConsumer`]).
//!
//! # Where the words live
//!
//! | what | where | lane `i` at |
//! |------|-------|-------------|
//! | slots | host memory, pinned and mapped for the device ([`PinnedBuffer`]) | `slots + i * slots_per_lane * stride` |
//! | `head`, `closed` (u64 each) | GPU memory the CPU stores to through the BAR ([`RawMemory`]) | `control + i * 128` |
//! | `reserve`, `head_cache`, `gave_up` | the same GPU memory, after the control blocks | `device + i * 128` |
//!
//! **The slots in host memory.** The CPU reads every byte of every record, and the GPU only
//! writes them. The GPU's writes to host memory are posted PCIe writes (the link's bandwidth,
//! nothing waits for them) and land in the CPU's coherent memory, so the consumer's loads are
//! ordinary cached loads of its own RAM. Slots in GPU memory would turn each of those loads into a
//! non-posted read through the BAR (about a microsecond each, uncached): the CPU never reads the
//! BAR on a hot path (see the [ring module](crate::ring)). The slots come from a
//! [`PinnedBuffer`] (Vulkan host memory mapped through CUDA VMM) rather than `cuMemHostAlloc`, so
//! dropping the ring never waits for a running kernel; that buffer's one caveat, a GPU that keeps
//! serving bytes it read before the CPU rewrote them, does not touch slots the GPU never reads.
//!
//! **The control words in GPU memory.** A producer reads `head` and `closed` only when its lane
//! looks full, but then again and again until the consumer moves: in GPU memory each look is a
//! read of the GPU's own memory instead of a PCIe round trip, and the consumer's stores to them
//! are cheap write-combined BAR stores (an `sfence` after each, in
//! [`LaneMemory::control_stored`]). They must not be in VMM-mapped host memory either: the GPU may
//! keep serving a word there that the CPU has rewritten, and a producer would never see the head
//! move. The host → device rings keep their `tail` the same way.
//!
//! # Consumers and the end of a stream
//!
//! One [`LaneConsumer`] per lane at a time ([`DeviceToHostRing::consumer`]; the lane is free
//! again when it drops). It takes records in order at once ([`LaneConsumer::try_next`],
//! [`LaneConsumer::poll`], [`LaneConsumer::drain`]), waiting ([`LaneConsumer::next_timeout`]) or
//! as a blocking iterator ([`LaneConsumer::records`]). It learns that no more will come from the
//! ring: [`DeviceToHostRing::finish_after`] records an event after the producing kernels on their
//! stream, and once the event completes (every record committed is then visible) a lane that has
//! been emptied reports [`Poll::Ended`](crate::ring::core::d2h::Poll::Ended).
//!
//! **Back-pressure and closing.** A kernel that publishes into a full lane waits for its
//! consumer; after the view's `spin_limit` looks at a head that did not move it gives up with
//! `VKGDR_D2H_STALLED`. [`LaneConsumer::close`] (and dropping the consumer, and
//! [`DeviceToHostRing::close`] for every lane) tells the lane's producers that nothing will be
//! taken any more: a waiting kernel gives up with `VKGDR_D2H_CLOSED` at its next look, so a
//! consumer that stops never leaves a kernel hanging. Dropping the ring closes every lane too;
//! its memory is freed once the GPU work queued before the drop has completed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::core::handle::assert_send_sync;
use crate::core::ring::d2h::{
    D2hDeviceView, D2hError, LaneConsumer, LaneMemory, LaneShape, CONTROL_CLOSED_OFFSET,
    CONTROL_HEAD_OFFSET, CONTROL_STRIDE, DEVICE_STRIDE,
};
use crate::core::sync::lock::Mutex;
use crate::core::sync::store_fence;
use crate::error::{InvalidArgument, Result};
use crate::mapping::cuda_objects::{Event, PinnedBuffer, Stream};
use crate::mapping::gpu::Gpu;
use crate::mapping::memory::RawMemory;
use crate::mapping::Mapping;

/// Most lanes of one ring.
pub const MAX_D2H_LANES: u32 = 1024;

/// Byte offsets of the device state's words (`reserve`, `head_cache`, `gave_up`) in a lane's
/// `DEVICE_STRIDE` bytes (`D2hLaneState` in `ring_d2h.cuh`).
const DEVICE_RESERVE_OFFSET: u64 = 0;
const DEVICE_GAVE_UP_OFFSET: u64 = 16;

/// What the lanes share: the memory, which lanes have a consumer, whether the producers finished.
struct D2hMemory {
    gpu: Gpu,
    shape: LaneShape,
    lanes: u32,
    /// Every lane's slots.
    slots: PinnedBuffer,
    /// The control blocks, then the device states.
    control: RawMemory,
    coherent: bool,
    /// Lanes whose consumer is alive.
    taken: Box<[AtomicBool]>,
    /// Set (release) once the producers are known to have finished.
    finished: AtomicBool,
    /// An event after the producers that is not known to have completed yet.
    finish_event: Mutex<Option<Event>>,
    /// Whether `finish_event` holds one (read without the lock).
    finish_pending: AtomicBool,
    /// When the finish event was last queried, in microseconds since `epoch`: the lanes ask
    /// the driver at most once per [`QUERY_INTERVAL_US`] between them.
    last_query_us: AtomicU64,
    epoch: Instant,
}

/// The shortest time between two queries of the finish event (a driver call each), in µs: a
/// lane that ran empty learns that the producers finished this much later at most.
const QUERY_INTERVAL_US: u64 = 20;

impl D2hMemory {
    /// The u64 at `at` bytes into the control allocation.
    fn word(&self, at: u64) -> &AtomicU64 {
        assert!(at + 8 <= self.control.size() && at.is_multiple_of(8));
        // SAFETY: an aligned u64 inside the control allocation (checked above; the allocation is
        // 4 KiB aligned), alive as long as `self`; the host touches it only through atomics, the
        // GPU through its own atomics and loads.
        unsafe { AtomicU64::from_ptr(self.control.host_ptr().add(at as usize).cast()) }
    }

    /// Lane `lane`'s control word at `offset`.
    fn control_word(&self, lane: u32, offset: u64) -> &AtomicU64 {
        self.word(u64::from(lane) * CONTROL_STRIDE + offset)
    }

    /// Byte offset of the device states in the control allocation.
    fn device_base(&self) -> u64 {
        u64::from(self.lanes) * CONTROL_STRIDE
    }

    /// Pushes a store to lane `lane`'s control block out of the write-combining buffers (and
    /// flushes it where the memory is not coherent).
    fn control_stored(&self, lane: u32) {
        store_fence();
        if !self.coherent {
            // A failed flush leaves the word to the next one: the device then waits longer.
            let _ = self
                .control
                .flush(u64::from(lane) * CONTROL_STRIDE, CONTROL_STRIDE);
        }
    }

    /// Stores `closed` = 1 in lane `lane`.
    fn close(&self, lane: u32) {
        self.control_word(lane, CONTROL_CLOSED_OFFSET)
            .store(1, Ordering::Release);
        self.control_stored(lane);
    }

    /// Whether the producers are known to have finished; queries the finish event if one is set.
    fn producers_done(&self) -> bool {
        if self.finished.load(Ordering::Acquire) {
            return true;
        }
        if !self.finish_pending.load(Ordering::Acquire) {
            return false;
        }
        // One query per interval, by whichever lane claims it; the others say "not yet".
        let now = self.epoch.elapsed().as_micros() as u64;
        let last = self.last_query_us.load(Ordering::Relaxed);
        if now < last + QUERY_INTERVAL_US
            || self
                .last_query_us
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let mut event = self.finish_event.lock();
        let done = match event.as_ref() {
            // A failed query is a context that faulted: its kernels publish nothing more.
            Some(e) => e.is_complete().unwrap_or(true),
            None => return self.finished.load(Ordering::Acquire),
        };
        if done {
            *event = None;
            self.finish_pending.store(false, Ordering::Release);
            self.finished.store(true, Ordering::Release);
        }
        done
    }
}

impl Drop for D2hMemory {
    /// Closes every lane, so a kernel still waiting for room gives up before the memory goes
    /// (it is freed once the GPU work queued before now has completed).
    fn drop(&mut self) {
        for lane in 0..self.lanes {
            self.close(lane);
        }
    }
}

/// A ring whose records go from kernels to CPU threads: `lanes` lanes of `shape`, each with its
/// own order and its own consumer. The [module docs](crate::ring::d2h) say where its words live and why.
///
/// ```no_run
/// use std::time::Duration;
/// use vkgdr::cuda_objects::Stream;
/// use vkgdr::ring::core::d2h::{LaneShape, Poll};
/// use vkgdr::ring::DeviceToHostRing;
///
/// let gpu = vkgdr::Gpu::open(0)?;
/// // 4 lanes of 4096 slots of 64 bytes (48-byte payloads); a full lane's producers give up
/// // after a million looks at a head that does not move. (`.with_format(SlotFormat::Tagged)`
/// // on the shape: 24-byte payloads that reach the CPU sooner.)
/// let ring = DeviceToHostRing::new(&gpu, 4, LaneShape::new(4096, 64)?, 1_000_000)?;
/// let view = ring.device_view(); // the kernel's argument (vkgdr_d2h_view)
/// let stream = Stream::new(&gpu)?;
/// // ... launch on `stream` a kernel that publishes with ring_d2h.cuh into `view` ...
/// ring.finish_after(&stream)?; // the lanes end once that kernel has completed
///
/// let mut lane0 = ring.consumer(0)?;
/// // Blocking, in order, until the producers finished and everything was taken:
/// for rec in lane0.records() {
///     let rec = rec?;
///     println!("record {} of kind {}: {} bytes", rec.seq, rec.kind, rec.payload.len());
/// }
/// // Or one at a time, without copying the payload out:
/// match lane0.next_timeout(Duration::from_millis(10))? {
///     Poll::Record(rec) => println!("{} bytes", rec.payload.len()),
///     Poll::Pending => println!("nothing within 10 ms"),
///     Poll::Ended => println!("the producers finished"),
/// }
/// lane0.close(); // a kernel waiting for room in lane 0 gives up (VKGDR_D2H_CLOSED)
/// # let _ = view;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DeviceToHostRing {
    memory: Arc<D2hMemory>,
    spin_limit: u32,
}

const _: () = assert_send_sync::<DeviceToHostRing>();
const _: () = assert_send_sync::<LaneConsumer<D2hLane>>();

impl std::fmt::Debug for DeviceToHostRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceToHostRing")
            .field("shape", &self.memory.shape)
            .field("lanes", &self.memory.lanes)
            .field("spin_limit", &self.spin_limit)
            .finish()
    }
}

/// A lane's counters, read from device memory ([`DeviceToHostRing::lane_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct D2hLaneStats {
    /// Records the producers reserved (every one is committed, with no wait in between).
    pub reserved: u64,
    /// Records the consumers took (the lane's `head`).
    pub taken: u64,
    /// Publications that gave up (`VKGDR_D2H_CLOSED` or `VKGDR_D2H_STALLED`).
    pub gave_up: u64,
}

impl DeviceToHostRing {
    /// A ring of `lanes` lanes (1..=[`MAX_D2H_LANES`]) of `shape` on `gpu`; a full lane's
    /// producers give up after `spin_limit` looks at a head that does not move (each look is a
    /// read of GPU memory and a nap of up to about 4 µs).
    pub fn new(gpu: &Gpu, lanes: u32, shape: LaneShape, spin_limit: u32) -> Result<Self> {
        if lanes == 0 || lanes > MAX_D2H_LANES {
            return Err(InvalidArgument::RingLanes {
                lanes,
                max: MAX_D2H_LANES,
            }
            .into());
        }
        let n = u64::from(lanes);
        let slot_bytes = shape
            .bytes()
            .checked_mul(n)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(InvalidArgument::RingSizeOverflow {
                capacity: shape.bytes(),
                lanes,
            })?;
        // Zeroed at allocation: no slot holds a commit word yet.
        let slots = PinnedBuffer::new(gpu, slot_bytes)?;
        let control_size = (n * (CONTROL_STRIDE + DEVICE_STRIDE)).next_multiple_of(4096);
        let mut control = gpu.alloc(control_size)?;
        control.set_label("vkgdr device-to-host ring control");
        control.fill(0, control_size, 0)?;
        control.flush(0, control_size)?;
        store_fence();
        Ok(DeviceToHostRing {
            memory: Arc::new(D2hMemory {
                gpu: gpu.clone(),
                shape,
                lanes,
                slots,
                control,
                coherent: !gpu.is_non_coherent(),
                taken: (0..lanes).map(|_| AtomicBool::new(false)).collect(),
                finished: AtomicBool::new(false),
                finish_event: Mutex::new(None),
                finish_pending: AtomicBool::new(false),
                last_query_us: AtomicU64::new(0),
                epoch: Instant::now(),
            }),
            spin_limit,
        })
    }

    /// The lanes' shape.
    pub fn shape(&self) -> LaneShape {
        self.memory.shape
    }

    /// Number of lanes.
    pub fn lanes(&self) -> u32 {
        self.memory.lanes
    }

    /// Looks at an unmoving head a full lane's producers make before they give up.
    pub fn spin_limit(&self) -> u32 {
        self.spin_limit
    }

    /// What a kernel takes to publish (`vkgdr_d2h_view`, passed by value).
    pub fn device_view(&self) -> D2hDeviceView {
        let m = &self.memory;
        D2hDeviceView {
            slots_addr: m.slots.device_ptr(),
            control_addr: m.control.device_ptr(),
            device_addr: m.control.device_ptr() + m.device_base(),
            slots: m.shape.slots(),
            stride: m.shape.stride(),
            lanes: m.lanes,
            spin_limit: self.spin_limit,
            format: m.shape.format().code(),
            reserved: 0,
        }
    }

    /// The consumer of lane `lane`, resuming where the last one stopped and opening the lane
    /// (`closed` = 0); one at a time per lane ([`D2hError::LaneTaken`]; dropping it closes the
    /// lane and frees it for the next). [`D2hError::NoSuchLane`] past the ring's lanes.
    pub fn consumer(&self, lane: u32) -> Result<LaneConsumer<D2hLane>> {
        if lane >= self.memory.lanes {
            return Err(D2hError::NoSuchLane {
                lane,
                lanes: self.memory.lanes,
            }
            .into());
        }
        if self.memory.taken[lane as usize].swap(true, Ordering::Acquire) {
            return Err(D2hError::LaneTaken { lane }.into());
        }
        let mem = D2hLane {
            memory: Arc::clone(&self.memory),
            lane,
        };
        Ok(LaneConsumer::new(mem, self.memory.shape)?)
    }

    /// One consumer per lane, lane 0 first (for a thread each).
    pub fn consumers(&self) -> Result<Vec<LaneConsumer<D2hLane>>> {
        (0..self.memory.lanes).map(|l| self.consumer(l)).collect()
    }

    /// Records an event on `stream` after the work queued there (the producing kernels): once it
    /// completes, every lane whose records were all taken reports
    /// [`Poll::Ended`](crate::ring::core::d2h::Poll::Ended) and its blocking iterator ends.
    /// Replaces an earlier event; [`restart`](Self::restart) clears it for a new launch.
    pub fn finish_after(&self, stream: &Stream) -> Result<()> {
        let event = Event::new(&self.memory.gpu)?;
        event.record(stream)?;
        let mut slot = self.memory.finish_event.lock();
        *slot = Some(event);
        self.memory.finished.store(false, Ordering::Release);
        self.memory.finish_pending.store(true, Ordering::Release);
        Ok(())
    }

    /// Declares the producers finished now: the caller knows their kernels completed (it
    /// synchronised their stream or context), so everything they committed is visible.
    pub fn finish(&self) {
        *self.memory.finish_event.lock() = None;
        self.memory.finish_pending.store(false, Ordering::Release);
        self.memory.finished.store(true, Ordering::Release);
    }

    /// Clears a finish ([`finish`](Self::finish), [`finish_after`](Self::finish_after)) before
    /// a new launch publishes into the ring: its lanes wait for records again.
    pub fn restart(&self) {
        *self.memory.finish_event.lock() = None;
        self.memory.finish_pending.store(false, Ordering::Release);
        self.memory.finished.store(false, Ordering::Release);
    }

    /// Whether the producers are known to have finished (queries the event of
    /// [`finish_after`](Self::finish_after)).
    pub fn is_finished(&self) -> bool {
        self.memory.producers_done()
    }

    /// Closes every lane: producers waiting for room, and later publications, give up with
    /// `VKGDR_D2H_CLOSED`. Records committed before are still there to take; a lane's next
    /// consumer opens it again.
    pub fn close(&self) {
        for lane in 0..self.memory.lanes {
            self.memory.close(lane);
        }
    }

    /// Lane `lane`'s counters, read through the BAR (a few microseconds: not for a hot loop).
    pub fn lane_stats(&self, lane: u32) -> Result<D2hLaneStats> {
        let m = &self.memory;
        if lane >= m.lanes {
            return Err(D2hError::NoSuchLane {
                lane,
                lanes: m.lanes,
            }
            .into());
        }
        let device = m.device_base() + u64::from(lane) * DEVICE_STRIDE;
        if !m.coherent {
            m.control.invalidate(0, m.control.size())?;
        }
        Ok(D2hLaneStats {
            reserved: m
                .word(device + DEVICE_RESERVE_OFFSET)
                .load(Ordering::Acquire),
            taken: m
                .control_word(lane, CONTROL_HEAD_OFFSET)
                .load(Ordering::Acquire),
            gave_up: m
                .word(device + DEVICE_GAVE_UP_OFFSET)
                .load(Ordering::Acquire),
        })
    }
}

/// One lane's memory as its [`LaneConsumer`] sees it (from [`DeviceToHostRing::consumer`]).
pub struct D2hLane {
    memory: Arc<D2hMemory>,
    lane: u32,
}

impl std::fmt::Debug for D2hLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("D2hLane").field("lane", &self.lane).finish()
    }
}

impl D2hLane {
    /// The lane's index in its ring.
    pub fn lane(&self) -> u32 {
        self.lane
    }
}

impl LaneMemory for D2hLane {
    fn slot_words(&self) -> &[AtomicU64] {
        let shape = self.memory.shape;
        let start = self.lane as usize * shape.bytes() as usize;
        // SAFETY: the lane's slots lie inside the pinned buffer (lanes * bytes of them, from a
        // page-aligned base, so 8-byte aligned), alive as long as `self.memory`; the GPU writes
        // them with aligned 8-byte (or wider, 8-byte aligned) stores and the host only loads them
        // through atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.memory.slots.as_ptr().add(start).cast::<AtomicU64>(),
                shape.words(),
            )
        }
    }

    fn head_word(&self) -> &AtomicU64 {
        self.memory.control_word(self.lane, CONTROL_HEAD_OFFSET)
    }

    fn closed_word(&self) -> &AtomicU64 {
        self.memory.control_word(self.lane, CONTROL_CLOSED_OFFSET)
    }

    fn control_stored(&self) {
        self.memory.control_stored(self.lane);
    }

    fn producers_done(&self) -> bool {
        self.memory.producers_done()
    }
}

impl Drop for D2hLane {
    fn drop(&mut self) {
        self.memory.taken[self.lane as usize].store(false, Ordering::Release);
    }
}
