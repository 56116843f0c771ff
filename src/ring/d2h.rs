//! [`DeviceToHostRing`]: the device → host rings of [`core::d2h`](crate::ring::core::d2h) on a
//! GPU. Kernels publish with `include/vkgdr/ring_d2h.cuh` into the view
//! ([`DeviceToHostRing::device_view`]); a CPU thread per lane takes the records
//! ([`DeviceToHostRing::consumer`]).
//!
//! Memory layout (mirrored by `ring_d2h.cuh`):
//!
//! | what | where | lane `i` |
//! |------|-------|----------|
//! | slots | pinned host memory, mapped for the device ([`PinnedBuffer`]) | `slots + i * slots_per_lane * stride` |
//! | `head`, `closed` (u64 each) | GPU memory (BAR), written by the CPU | `control + i * 128` |
//! | `reserve`, `head_cache`, `gave_up` | GPU memory, after the control blocks | `device + i * 128` |
//!
//! The GPU writes the slots over PCIe and the CPU reads them from its own RAM; the CPU's control
//! stores go through the BAR (write-combined: an `sfence` after each), so a producer's look at
//! `head` is a read of its own GPU memory, with no PCIe round trip. Not yet run on a GPU.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::ring::d2h::{
    D2hDeviceView, D2hError, LaneConsumer, LaneMemory, LaneShape, CONTROL_CLOSED_OFFSET,
    CONTROL_HEAD_OFFSET, CONTROL_STRIDE, DEVICE_STRIDE,
};
use crate::core::sync::store_fence;
use crate::error::{InvalidArgument, Result};
use crate::mapping::cuda_objects::PinnedBuffer;
use crate::mapping::gpu::Gpu;
use crate::mapping::memory::RawMemory;
use crate::mapping::Mapping;

/// Most lanes of one ring.
pub const MAX_D2H_LANES: u32 = 1024;

/// What the lanes share: the memory and which lanes have a consumer.
struct D2hMemory {
    shape: LaneShape,
    lanes: u32,
    /// Every lane's slots.
    slots: PinnedBuffer,
    /// The control blocks, then the device states.
    control: RawMemory,
    coherent: bool,
    /// Lanes whose consumer is alive.
    taken: Box<[AtomicBool]>,
}

/// A ring whose records go from kernels to CPU threads: `lanes` lanes of `shape`.
///
/// ```no_run
/// use vkgdr::ring::core::d2h::LaneShape;
/// use vkgdr::ring::DeviceToHostRing;
///
/// let gpu = vkgdr::Gpu::open(0)?;
/// let ring = DeviceToHostRing::new(&gpu, 4, LaneShape::new(4096, 64)?, 1_000_000)?;
/// let view = ring.device_view(); // the kernel's argument (vkgdr_d2h_view)
/// // ... launch a kernel that publishes with ring_d2h.cuh ...
/// let mut lane0 = ring.consumer(0)?;
/// while let Some(rec) = lane0.try_next()? {
///     println!("record {} of kind {}: {} bytes", rec.seq, rec.kind, rec.payload.len());
/// }
/// # let _ = view;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DeviceToHostRing {
    memory: Arc<D2hMemory>,
    spin_limit: u32,
}

impl std::fmt::Debug for DeviceToHostRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceToHostRing")
            .field("shape", &self.memory.shape)
            .field("lanes", &self.memory.lanes)
            .field("spin_limit", &self.spin_limit)
            .finish()
    }
}

impl DeviceToHostRing {
    /// A ring of `lanes` lanes (1..=[`MAX_D2H_LANES`]) of `shape` on `gpu`; a full lane's
    /// producers give up after `spin_limit` looks at a head that does not move.
    pub fn new(gpu: &Gpu, lanes: u32, shape: LaneShape, spin_limit: u32) -> Result<Self> {
        if lanes == 0 || lanes > MAX_D2H_LANES {
            return Err(InvalidArgument::RingLanes {
                lanes,
                max: MAX_D2H_LANES,
            }
            .into());
        }
        let n = u64::from(lanes);
        let slot_bytes =
            usize::try_from(shape.bytes() * n).map_err(|_| InvalidArgument::RingSizeOverflow {
                capacity: shape.bytes(),
                lanes,
            })?;
        let mut slots = PinnedBuffer::new(gpu, slot_bytes)?;
        slots.fill(0);
        let control_size = (n * (CONTROL_STRIDE + DEVICE_STRIDE)).next_multiple_of(4096);
        let mut control = gpu.alloc(control_size)?;
        control.set_label("vkgdr device-to-host ring control");
        control.fill(0, control_size, 0)?;
        control.flush(0, control_size)?;
        Ok(DeviceToHostRing {
            memory: Arc::new(D2hMemory {
                shape,
                lanes,
                slots,
                control,
                coherent: !gpu.is_non_coherent(),
                taken: (0..lanes).map(|_| AtomicBool::new(false)).collect(),
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

    /// What a kernel takes to publish (`vkgdr_d2h_view`).
    pub fn device_view(&self) -> D2hDeviceView {
        let m = &self.memory;
        D2hDeviceView {
            slots_addr: m.slots.device_ptr(),
            control_addr: m.control.device_ptr(),
            device_addr: m.control.device_ptr() + u64::from(m.lanes) * CONTROL_STRIDE,
            slots: m.shape.slots(),
            stride: m.shape.stride(),
            lanes: m.lanes,
            spin_limit: self.spin_limit,
            reserved: 0,
        }
    }

    /// The consumer of lane `lane`, resuming where the last one stopped; one at a time per lane
    /// (dropping it closes the lane and frees it for the next).
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
    /// The control word at `offset` of this lane's control block.
    fn control_word(&self, offset: u64) -> &AtomicU64 {
        let at = u64::from(self.lane) * CONTROL_STRIDE + offset;
        debug_assert!(at + 8 <= self.memory.control.size());
        // SAFETY: an aligned u64 inside the control allocation (lane < lanes, offset < 16; the
        // allocation is 4 KiB aligned and holds lanes * CONTROL_STRIDE bytes and more), alive as
        // long as `self.memory`; the host touches it only through atomics, the GPU only reads it.
        unsafe { AtomicU64::from_ptr(self.memory.control.host_ptr().add(at as usize).cast()) }
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
        self.control_word(CONTROL_HEAD_OFFSET)
    }

    fn closed_word(&self) -> &AtomicU64 {
        self.control_word(CONTROL_CLOSED_OFFSET)
    }

    fn control_stored(&self) {
        store_fence();
        if !self.memory.coherent {
            let at = u64::from(self.lane) * CONTROL_STRIDE;
            // A failed flush leaves the word to the next one: the device then waits longer.
            let _ = self.memory.control.flush(at, 16);
        }
    }
}

impl Drop for D2hLane {
    fn drop(&mut self) {
        self.memory.taken[self.lane as usize].store(false, Ordering::Release);
    }
}
