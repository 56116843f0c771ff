//! The ring on the GPU: a [`RingSink`](crate::ring::core::RingSink) over BAR-mapped memory, the
//! control words, lanes, the copy-engine path for large records, and the two consumption modes ([`DeviceRing`] for a persistent kernel,
//! [`LaunchRing`] for one launch per batch).
//!
//! Memory layout (mirrored by `include/vkgdr/ring.cuh`):
//!
//! | what | where | lane `i` |
//! |------|-------|----------|
//! | data regions | GPU memory (BAR) | `lane_data[i]` (padded rings: `data + i * capacity`; shareable rings: an allocation per lane) |
//! | `tail` words (u64) | control allocation, GPU memory | `tail + i * 128` |
//! | `stop` word (u32) | control allocation, after the tails | one for all lanes |
//! | `lane_data` table (u64 each) | control allocation, after `stop` | `lane_data + 8 * i` |
//! | `head` words (u64) | pinned host memory | `head + i * 256` |
//! | result words (8 × u64) | pinned host memory | `result + i * 256` |
//! | stream check word (u64) | pinned host memory | `head + i * 256 + 192` (the copy stream's first store) |
//! | staging copy | pinned host memory, one per lane | made when a producer first claims the lane |

mod copy_engine;
mod launch;
mod lend;
mod owned;
mod persistent;
mod sink;

pub use copy_engine::{
    CopyEngine, CopyEngineStats, AUTO_COPY_ENGINE_RECORD, AUTO_MAX_STAGING_BYTES,
    DEFAULT_COPY_ENGINE_RECORD, SPLIT_BAR_LANE_RECORD, STAGE_AFTER_PENDING, STREAM_CHECK_OFFSET,
};
pub use launch::LaunchRing;
pub use lend::LentLane;
pub use owned::OwnedProducer;
pub use persistent::{
    DeviceRing, RingDeviceView, RingOptions, HOST_STRIDE, MAX_LANES, RESULT_OFFSET, TAIL_STRIDE,
};
pub use sink::BarSink;
