//! [`LaunchRing`]: a ring consumed by one kernel launch per batch (launch mode).

use std::sync::Arc;
use std::time::Duration;

use crate::core::ring::layout::WrapMode;
use crate::core::ring::{Producer, Reservation, RingError};
use crate::core::sync::lock::Mutex;
use crate::error::Result;
use crate::mapping::cuda_objects::{Event, Stream};
use crate::mapping::gpu::Gpu;

use super::copy_engine::CopyEngine;
use super::persistent::{DeviceRing, RingOptions};
use super::sink::BarSink;

/// One lane, every record through the BAR: a batch's launch goes on the ring's own stream,
/// which a copy engine's stream would not be ordered with.
fn launch_options(wrap: WrapMode) -> RingOptions {
    RingOptions {
        lanes: 1,
        wrap,
        copy_engine: CopyEngine::Off,
    }
}

/// A ring consumed by one kernel launch per batch (launch mode).
///
/// [`LaunchRing::launch_pending`] hands everything committed since the last launch to a
/// caller-supplied launch on the ring's stream and records a CUDA event after it; space is
/// reclaimed when that event completes. An event (rather than a value written by the kernel) keeps
/// user kernels free of ring bookkeeping, costs nothing on the GPU, and `cuEventQuery` is a cheap
/// host call. Dropping it waits for the launched batches first.
pub struct LaunchRing {
    ring: DeviceRing,
    stream: Stream,
    in_flight: Mutex<std::collections::VecDeque<(u64, Event)>>,
    launched: Mutex<u64>,
}

impl LaunchRing {
    /// A launch-mode ring of `capacity` bytes with its own stream.
    pub fn new(gpu: &Gpu, capacity: u64) -> Result<LaunchRing> {
        Self::on(
            gpu,
            DeviceRing::with_options(gpu, capacity, launch_options(WrapMode::Padded))?,
        )
    }

    /// A launch-mode ring in [`WrapMode::Mirrored`](crate::ring::layout::WrapMode::Mirrored) (see
    /// [`DeviceRing::new_mirrored`]): a batch `[from, to)` is one contiguous device range starting
    /// at `data + (from & (capacity - 1))`, with no padding anywhere.
    pub fn new_mirrored(gpu: &Gpu, capacity: u64) -> Result<LaunchRing> {
        Self::on(
            gpu,
            DeviceRing::with_options(gpu, capacity, launch_options(WrapMode::Mirrored))?,
        )
    }

    fn on(gpu: &Gpu, ring: DeviceRing) -> Result<LaunchRing> {
        Ok(LaunchRing {
            ring,
            stream: Stream::new(gpu)?,
            in_flight: Mutex::new(std::collections::VecDeque::new()),
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
            self.ring.core().reclaim_to(*end)?;
            q.pop_front();
        }
        Ok(self.ring.core().reclaimed())
    }

    /// What a waiting producer sees: the reclaimed position, or `Stopped` if the stream failed.
    fn reclaim_head(&self) -> std::result::Result<u64, RingError> {
        self.reclaim().map_err(|_| RingError::Stopped)
    }

    /// Reserves a record, reclaiming finished batches while the ring is full.
    pub fn reserve(&self, len: u32, timeout: Option<Duration>) -> Result<Reservation<'_, BarSink>> {
        Ok(self
            .ring
            .core()
            .reserve(len, timeout, &|| self.reclaim_head())?)
    }

    /// Claims the ring for one producer (see [`DeviceRing::producer`]); it reclaims finished
    /// batches while it waits for space. Launch what it publishes with
    /// [`launch_pending`](Self::launch_pending) from any thread.
    pub fn producer(&self) -> Result<Producer<'_, BarSink>> {
        Ok(self.ring.core().claim(move || self.reclaim_head())?)
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
        let to = self.ring.core().published();
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

impl Drop for LaunchRing {
    /// Never waits: the ring's memory is released once the batches launched on its stream have
    /// finished. If no event can be recorded there (a dead context, whose kernels are gone),
    /// there is nothing to wait for.
    fn drop(&mut self) {
        if let Ok(fence) = self.stream.fence() {
            self.ring
                .gpu
                .release_after(Arc::clone(&self.ring.memory), fence);
        }
    }
}
