//! The ring on the GPU: a [`RingSink`] over BAR-mapped memory, the control words, and the two
//! consumption modes ([`DeviceRing`] for a persistent kernel, [`LaunchRing`] for one launch per
//! batch).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::core::{Reservation, RingCore, RingError, RingSink};
use super::layout::WrapMode;
use crate::arena::Arena;
use crate::cuda_objects::{Event, PinnedBuffer, Stream};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::memory::RawMemory;

/// Offset of `tail` (u64) in the control allocation.
const TAIL_OFFSET: usize = 0;
/// Offset of `stop` (u32) in the control allocation: its own 128-byte line, away from `tail`.
const STOP_OFFSET: usize = 128;

/// The data region: one raw allocation, or a one-chunk arena whose chunk is mapped a second time
/// right after itself, so the GPU reads a record that runs past the end contiguously.
enum RingData {
    Raw(RawMemory),
    Mirrored(Arena),
}

impl RingData {
    /// Host address of offset 0. The mirror exists only for the GPU: on the host the region is
    /// one mapping of `size()` bytes (the core splits writes at its end).
    fn host_ptr(&self) -> *mut u8 {
        match self {
            RingData::Raw(m) => m.host_ptr(),
            RingData::Mirrored(a) => a.host_ptr(0).expect("the ring's arena holds its chunk"),
        }
    }

    fn device_ptr(&self) -> u64 {
        match self {
            RingData::Raw(m) => m.device_ptr(),
            RingData::Mirrored(a) => a.device_ptr(),
        }
    }

    fn size(&self) -> u64 {
        match self {
            RingData::Raw(m) => m.size(),
            RingData::Mirrored(a) => a.len(),
        }
    }

    /// Flushes `[offset, offset + len)` of the region (within it, not wrapping).
    fn flush(&self, offset: u64, len: u64) -> Result<()> {
        match self {
            RingData::Raw(m) => m.flush(offset, len),
            RingData::Mirrored(a) => a.flush(offset, len),
        }
    }
}

/// Writes records into BAR-mapped GPU memory and publishes `tail` there.
pub struct BarSink {
    data: RingData,
    /// Whether the data region is host-coherent (publishing then needs no flush).
    coherent: bool,
    control: RawMemory,
    /// End of the last publication, for the non-coherent flush of `[published, tail)` (unused on
    /// coherent memory, where publishing needs no flush).
    published: AtomicU64,
}

impl BarSink {
    fn flush_ring_range(&self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        let cap = self.data.size();
        let (a, len) = (from & (cap - 1), (to - from).min(cap));
        // Flush errors cannot be returned through `publish`; on the coherent memory NVIDIA offers
        // no call is made, on non-coherent memory an error would mean a lost device, which the
        // consumer's checks then report. A range that wraps is flushed in two pieces.
        let _ = self.data.flush(a, len.min(cap - a));
        if a + len > cap {
            let _ = self.data.flush(0, a + len - cap);
        }
    }
}

impl RingSink for BarSink {
    fn write(&self, offset: u64, bytes: &[u8]) {
        // SAFETY: the core only writes in-range, non-wrapping spans of the data region, and
        // concurrent callers write disjoint spans; the mapping lives as long as the sink.
        // No fence per piece: `publish`, run by this same thread for its record, fences first.
        unsafe {
            crate::copy::copy_to_mapping_unfenced(self.data.host_ptr().add(offset as usize), bytes)
        };
    }

    fn writes_done(&self) {
        // Drain this thread's record stores now, outside the in-order section.
        store_fence();
    }

    fn publish(&self, tail: u64) {
        // Drain this thread's write-combined stores before the tail can be seen (already done in
        // `writes_done` for records; this also covers a wrap PAD published on its own). On
        // non-coherent memory push everything since the last publication first.
        store_fence();
        if !self.coherent {
            let from = self.published.swap(tail, Ordering::AcqRel);
            self.flush_ring_range(from, tail);
        }
        let word = self
            .control
            .host_ptr()
            .wrapping_add(TAIL_OFFSET)
            .cast::<u64>();
        // SAFETY: an aligned 8-byte word inside the control allocation; one aligned store, so the
        // GPU never sees a torn value. Publications are serialised by the core.
        unsafe { word.write_volatile(tail) };
        let _ = self.control.flush(TAIL_OFFSET as u64, 8);
        store_fence();
    }
}

fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// What a kernel needs to consume the ring: pass these to `ring_consume_persistent` or your own
/// consumer built on `kernels/ring.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingDeviceView {
    /// Device address of the data region. For a [`WrapMode::Mirrored`] ring the region is mapped
    /// twice back to back from here, so `data + offset` can be read for a whole record.
    pub data: u64,
    /// Capacity of the data region in bytes (a power of two).
    pub capacity: u64,
    /// Device address of the `tail` word (u64, GPU memory, written by the CPU).
    pub tail: u64,
    /// Device address of the `stop` word (u32, GPU memory, written by the CPU).
    pub stop: u64,
    /// Device address of the `head` word (u64, pinned host memory, written by the GPU).
    pub head: u64,
    /// Device address of the 8 result words (pinned host memory), see `layout::RESULT_*`.
    pub result: u64,
    /// How records meet the end of the region: a [`WrapMode::Mirrored`] ring needs the
    /// `_mirrored` consumers of `kernels/ring.cu` (or a consumer that accepts records crossing the
    /// end).
    pub wrap: WrapMode,
}

/// A ring whose consumer is a kernel that stays resident and polls `tail` (persistent mode).
///
/// Producers on any thread [`reserve`](DeviceRing::reserve) a span, write it, and commit; the
/// commit publishes `tail` in order. The kernel publishes how far it has consumed into pinned host
/// memory (`head`); producers reclaim from it when the ring is full — the CPU never reads BAR
/// memory. See the [module docs](super) for the memory-ordering story.
pub struct DeviceRing {
    core: RingCore<BarSink>,
    /// `head` at byte 0, result words from byte 64.
    host_words: PinnedBuffer,
    gpu: Gpu,
}

/// Offset of the result words in the pinned buffer.
const RESULT_OFFSET: usize = 64;

impl DeviceRing {
    /// A ring of `capacity` bytes (a power of two, at least 4 KiB) in BAR-mapped GPU memory.
    pub fn new(gpu: &Gpu, capacity: u64) -> Result<DeviceRing> {
        if !capacity.is_power_of_two() || capacity < super::layout::MIN_CAPACITY {
            return Err(RingError::InvalidCapacity(capacity).into());
        }
        let data = gpu.alloc(capacity)?;
        Self::with_data(gpu, RingData::Raw(data), WrapMode::Padded)
    }

    /// A ring in [`WrapMode::Mirrored`]: its data region is a one-chunk CUDA VMM
    /// [`Arena`] whose chunk is mapped a second time right after itself, so a record that runs
    /// past the end of the region is still contiguous for the GPU and no wrap PAD is ever written
    /// (a record may be as large as the whole region from any position). `capacity` must be a
    /// power of two and a multiple of the VMM granularity (2 MiB on the H100).
    ///
    /// Consumers read each record at `data + (pos & (capacity - 1))` for its whole length: use
    /// the `_mirrored` kernels of `kernels/ring.cu`. Fails with [`Error::Unsupported`] where the
    /// device or driver lacks VMM (fall back to [`DeviceRing::new`]).
    ///
    /// [`Error::Unsupported`]: crate::Error::Unsupported
    pub fn new_mirrored(gpu: &Gpu, capacity: u64) -> Result<DeviceRing> {
        if !capacity.is_power_of_two() || capacity < super::layout::MIN_CAPACITY {
            return Err(RingError::InvalidCapacity(capacity).into());
        }
        // One chunk plus one chunk of address space for the mirror.
        let mut arena = Arena::new(gpu, 2 * capacity, capacity)?;
        arena.grow()?;
        arena.map_mirror()?;
        Self::with_data(gpu, RingData::Mirrored(arena), WrapMode::Mirrored)
    }

    fn with_data(gpu: &Gpu, data: RingData, wrap: WrapMode) -> Result<DeviceRing> {
        let capacity = data.size();
        // Both kinds of region come from `gpu`'s Vulkan context, whose mode decides coherence.
        let coherent = !gpu.is_non_coherent();
        let mut control = gpu.alloc(4096)?;
        crate::Mapping::fill(&mut control, 0, 4096, 0)?;
        let host_words = PinnedBuffer::new(gpu, 4096)?;
        let sink = BarSink {
            data,
            coherent,
            control,
            published: AtomicU64::new(0),
        };
        Ok(DeviceRing {
            core: RingCore::with_wrap_mode(capacity, sink, wrap)?,
            host_words,
            gpu: gpu.clone(),
        })
    }

    /// The pure producer core (positions, counters).
    pub fn core(&self) -> &RingCore<BarSink> {
        &self.core
    }

    /// The addresses a consumer kernel needs.
    pub fn device_view(&self) -> RingDeviceView {
        let sink = self.core.sink();
        RingDeviceView {
            data: sink.data.device_ptr(),
            capacity: self.core.capacity(),
            tail: sink.control.device_ptr() + TAIL_OFFSET as u64,
            stop: sink.control.device_ptr() + STOP_OFFSET as u64,
            head: self.host_words.device_ptr(),
            result: self.host_words.device_ptr() + RESULT_OFFSET as u64,
            wrap: self.core.wrap_mode(),
        }
    }

    /// The consumer's published head (acquire load from pinned host memory: cheap).
    pub fn head(&self) -> u64 {
        // SAFETY: an aligned u64 inside the pinned buffer, written by the GPU with 8-byte stores.
        let word = unsafe { &*self.host_words.as_ptr().cast::<AtomicU64>() };
        word.load(Ordering::Acquire)
    }

    /// The consumer's result words (`layout::RESULT_*`), read from pinned host memory.
    pub fn results(&self) -> [u64; super::layout::RESULT_WORDS] {
        let mut out = [0u64; super::layout::RESULT_WORDS];
        for (i, v) in out.iter_mut().enumerate() {
            // SAFETY: aligned u64s inside the pinned buffer.
            let w = unsafe {
                &*self
                    .host_words
                    .as_ptr()
                    .add(RESULT_OFFSET + 8 * i)
                    .cast::<AtomicU64>()
            };
            *v = w.load(Ordering::Acquire);
        }
        out
    }

    /// Reserves a record of `len` payload bytes, waiting up to `timeout` (`None`: forever) for the
    /// kernel to free space. Fails at once with `RecordTooLarge` if it can never fit.
    pub fn reserve(&self, len: u32, timeout: Option<Duration>) -> Result<Reservation<'_, BarSink>> {
        Ok(self.core.reserve(len, timeout, &|| self.head())?)
    }

    /// Reserves without waiting: `RingError::Full` if there is no room now.
    pub fn try_reserve(&self, len: u32) -> Result<Reservation<'_, BarSink>> {
        self.core.reclaim_to(self.head())?;
        Ok(self.core.try_reserve(len)?)
    }

    /// Reserves, writes and commits `payload`; returns its sequence number.
    pub fn push(&self, payload: &[u8], timeout: Option<Duration>) -> Result<u64> {
        Ok(self.core.push(payload, timeout, &|| self.head())?)
    }

    /// Asks a persistent consumer to exit once it has consumed everything published.
    pub fn stop(&self) {
        let sink = self.core.sink();
        let word = sink
            .control
            .host_ptr()
            .wrapping_add(STOP_OFFSET)
            .cast::<u32>();
        store_fence();
        // SAFETY: an aligned 4-byte word inside the control allocation.
        unsafe { word.write_volatile(1) };
        let _ = sink.control.flush(STOP_OFFSET as u64, 4);
        store_fence();
    }

    /// The GPU this ring lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

/// A ring consumed by one kernel launch per batch (launch mode).
///
/// [`LaunchRing::launch_pending`] hands everything committed since the last launch to a
/// caller-supplied launch on the ring's stream and records a CUDA event after it; space is
/// reclaimed when that event completes. An event (rather than a value written by the kernel) keeps
/// user kernels free of ring bookkeeping, costs nothing on the GPU, and `cuEventQuery` is a cheap
/// host call.
pub struct LaunchRing {
    ring: DeviceRing,
    stream: Stream,
    in_flight: Mutex<VecDeque<(u64, Event)>>,
    launched: Mutex<u64>,
}

impl LaunchRing {
    /// A launch-mode ring of `capacity` bytes with its own stream.
    pub fn new(gpu: &Gpu, capacity: u64) -> Result<LaunchRing> {
        Self::on(gpu, DeviceRing::new(gpu, capacity)?)
    }

    /// A launch-mode ring in [`WrapMode::Mirrored`] (see [`DeviceRing::new_mirrored`]): a batch
    /// `[from, to)` is one contiguous device range starting at `data + (from & (capacity - 1))`,
    /// with no padding anywhere.
    pub fn new_mirrored(gpu: &Gpu, capacity: u64) -> Result<LaunchRing> {
        Self::on(gpu, DeviceRing::new_mirrored(gpu, capacity)?)
    }

    fn on(gpu: &Gpu, ring: DeviceRing) -> Result<LaunchRing> {
        Ok(LaunchRing {
            ring,
            stream: Stream::new(gpu)?,
            in_flight: Mutex::new(VecDeque::new()),
            launched: Mutex::new(0),
        })
    }

    /// The underlying ring (device view, counters).
    pub fn ring(&self) -> &DeviceRing {
        &self.ring
    }

    /// The stream batches are launched on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Releases the space of every batch whose kernel has finished; returns the reclaimed position.
    pub fn reclaim(&self) -> Result<u64> {
        let mut q = self.in_flight.lock();
        while let Some((end, ev)) = q.front() {
            if !ev.is_complete()? {
                break;
            }
            self.ring.core.reclaim_to(*end)?;
            q.pop_front();
        }
        Ok(self.ring.core.reclaimed())
    }

    /// Reserves a record, reclaiming finished batches while the ring is full.
    pub fn reserve(&self, len: u32, timeout: Option<Duration>) -> Result<Reservation<'_, BarSink>> {
        Ok(self.ring.core.reserve(len, timeout, &|| {
            self.reclaim()
                .unwrap_or_else(|_| self.ring.core.reclaimed())
        })?)
    }

    /// If records were committed since the last launch, calls `launch(from, to, stream)` for the
    /// byte range `[from, to)` (positions; offsets are `pos & (capacity - 1)`), then records an
    /// event after it. Returns the range launched, if any.
    pub fn launch_pending(
        &self,
        launch: impl FnOnce(u64, u64, &Stream) -> Result<()>,
    ) -> Result<Option<(u64, u64)>> {
        let mut launched = self.launched.lock();
        // Only what is fully published: its writer's fence (and flush) has completed.
        let to = self.ring.core.published();
        let from = *launched;
        if to == from {
            return Ok(None);
        }
        launch(from, to, &self.stream)?;
        let ev = Event::new(self.ring.gpu())?;
        ev.record(&self.stream)?;
        self.in_flight.lock().push_back((to, ev));
        *launched = to;
        Ok(Some((from, to)))
    }

    /// Waits for every launched batch and reclaims all space.
    pub fn drain(&self) -> Result<()> {
        self.stream.synchronize()?;
        self.reclaim()?;
        Ok(())
    }
}
