//! Ring buffers that stream variable-length records from CPU threads to a running GPU kernel.
//!
//! The data region lives in GPU memory mapped through the BAR: CPU stores to it are cheap
//! (~0.1 µs, write-combined), CPU loads from it are not (~1 µs each). [`layout`] fixes the wire
//! format and the control words, [`core`] is the pure producer logic (positions, sequence numbers,
//! space, in-order publication) over a [`core::RingSink`], [`device`] puts it on the GPU, and
//! `include/vkgdr/ring.cuh` is the device side: the view a kernel takes, the head/tail protocol
//! and block-cooperative readers that hand a thread block the records in order. `kernels/ring.cu`
//! holds consumers built on it (`nvcc -ptx -arch=compute_75`; CUDA 13 no longer accepts
//! compute_70). Control words, one set per lane:
//!
//! | word   | type | lives in           | written by | read by |
//! |--------|------|--------------------|------------|---------|
//! | `tail` | u64  | GPU memory (BAR)   | CPU        | GPU: end of the published records |
//! | `head` | u64  | pinned host memory | GPU        | CPU: end of the consumed records  |
//! | `stop` | u32  | GPU memory (BAR)   | CPU        | GPU: persistent kernel may exit (one per ring) |
//!
//! # Lanes and batches: where the throughput comes from
//!
//! A [`DeviceRing`] has one or more lanes, each an independent sub-ring with its own tail and
//! head. [`DeviceRing::producer`] gives a thread a lane of its own ([`core::Producer`]): it
//! appends records with plain arithmetic (no lock, no atomic read-modify-write, no fence) and
//! publishes with one `sfence` and one tail store per batch ([`core::Producer::push_batch`],
//! [`core::Producer::flush`], or a [`core::FlushPolicy`] of bytes and delay);
//! [`core::Producer::push`] publishes a lone record at once. The shared path
//! ([`DeviceRing::reserve`] through `&self`) pays, per record, a short mutex, a commit slot, the
//! publisher role and a fence; it keeps one global order per lane and lets a thread commit its
//! reservations in any order. Records of different lanes are not ordered with each other.
//!
//! # Memory ordering
//!
//! **Exclusive producer.** It writes records with write-combining stores and, to publish, runs
//! [`core::RingSink::publish`] itself (the steps below): every record below the new tail is its
//! own, so its own `sfence` covers them.
//!
//! **Shared producers (CPU).** A producer writes its record's payload and header with ordinary
//! (write-combining) stores into the BAR mapping (no fence per piece). [`core::Reservation::commit`]
//! calls [`core::RingSink::writes_done`] (the BAR sink's `sfence`: each producer drains its own
//! stores, in parallel, before its record can be published), then marks the record committed
//! (a SeqCst store into a per-seq slot). Commit combining: the committer that takes the
//! publisher role (one atomic flag; the others return at once) walks the committed slots from
//! the current tail and publishes the whole run with one [`core::RingSink::publish`], which must:
//! 1. `sfence` — drains *this core's* write-combining buffers, so the record's bytes are posted
//!    to PCIe before anything after it. (On memory that is not `HOST_COHERENT`,
//!    `vkFlushMappedMemoryRanges` the range first; NVIDIA's BAR memory types are coherent.)
//!    Records of other threads below the new tail were fenced by their own writers before they
//!    marked them committed, which the publisher observed with an acquire load.
//! 2. store `tail` — one aligned 8-byte volatile (or `Release` atomic) store, so the GPU never
//!    sees a torn value. PCIe keeps posted writes from one requester in order, so the record
//!    reaches GPU memory before the tail does.
//! 3. `sfence` — pushes the tail out of the WC buffer now instead of whenever it fills (latency).
//!
//! Publications are serialised (one publisher at a time) and cover records in position order, so
//! `tail` only grows; under contention one tail store covers many records. A batch-mode launch is
//! ordered the same way: `sfence` after the records, then the launch.
//!
//! **Consumer (GPU, `vkgdr::WindowReader` or `vkgdr::BlockReader` in `ring.cuh`).** Warp 0 polls
//! `tail` with acquire loads at system scope (`ld.acquire.sys`, not cached in L1; its lanes load
//! the one word together), and only once everything below the last tail seen is consumed: the
//! acquire keeps later loads (the other threads' too, behind the block's barrier) from being
//! satisfied before the tail load, without a fence on the way from the tail to the records. Records
//! are read with `ld.global.cg` (L2, bypassing L1) so no line cached on an earlier lap of the ring
//! is reused. `WindowReader` (the checking kernels' reader) loads a window of the lane (16 KiB for
//! the checking kernels' 512 threads) into shared memory with coalesced loads, decodes every
//! 16-byte chunk as if it were a header, resolves the chain from the window's first record (each
//! warp finds where the chain from each of its 32 chunks leaves them, by pointer jumping over
//! shuffles; one thread then hops from segment to segment) and hands out the records that lie
//! wholly in the window with their payloads in shared memory; a record longer than the window is a
//! group of its own, read from global memory. A window of at most 512 bytes (a lone record, the end
//! of a burst) is read by warp 0 alone (the warp that polls), with two block barriers instead of
//! five and only as many rounds of pointer jumping as its chunks need, so a record that arrives at
//! an idle reader is handed out sooner. The next window, below the tail already seen, is loaded
//! while the block works on the current one: those loads lie at or above the head it publishes.
//! `BlockReader` is the simpler one: `16 × threads` bytes, one thread follows the chain, thread `i`
//! gets record `i`. After the block's barrier (its reads are done) one thread stores `head = pos`
//! into pinned host memory with a relaxed store at system scope (`st.relaxed.sys`: every value the
//! block read from the records is in its registers or shared memory by the barrier, and a load
//! whose value is in hand cannot see a later write; a release store would also wait for the
//! thread's earlier stores over PCIe, much of a lone record's round trip: BENCHMARKS.md, "The
//! device API's reader"), with no fence after it (the store leaves on its own, and the thread goes
//! back to polling at once) — when it has caught up with the tail, or every quarter of the ring.
//! The reader reads `stop` beside each poll of `tail` and looks at it only when `tail` has not
//! moved; when set it fences (`__threadfence_system()`), re-reads `tail`, and exits only if nothing
//! is left. The CPU therefore publishes the final tail, `sfence`, then sets `stop`.
//!
//! **Reclaim (CPU).** Producers load `head` from pinned host memory with an `Acquire` load (an
//! ordinary cached load: the GPU's PCIe writes to host memory are cache-coherent) and pass it to
//! [`core::RingCore::reclaim_to`]; bytes below it may then be overwritten.
//!
//! **Why the CPU never reads BAR memory.** A load from the uncached/WC mapping is a non-posted
//! PCIe read: the core stalls ~1 µs for the round trip, nothing is cached or prefetched, and the
//! reads compete with the producers' stores on the link. Everything the CPU must read (`head`,
//! results) is therefore written by the GPU into host memory; the CPU's view of the ring's state
//! comes from its own counters in [`core::RingCore`].
//!
//! # Wrap modes
//!
//! [`layout::WrapMode::Padded`] (the default, [`DeviceRing::new`]) keeps every record inside the
//! region: a record that would cross the end is preceded by a wrap PAD record that fills the
//! rest. [`layout::WrapMode::Mirrored`] ([`DeviceRing::new_mirrored`]) places the region in a
//! one-chunk CUDA VMM [`Arena`](crate::Arena) whose chunk is mapped a second time right after
//! itself: records run over the end with no padding, the producers' host writes are split at the
//! end by the core (the host has one mapping), and the GPU reads each record contiguously. A
//! padded consumer rejects such records; use the `_mirrored` kernels.
//!
//! Positions are `u64` byte counters that are never reduced; they would wrap after 2^64 bytes
//! (over five years at 100 GB/s), which the ring does not handle.
//!
//! # The other way: device → host
//!
//! [`DeviceToHostRing`] carries fixed-size records from kernels (`include/vkgdr/ring_d2h.cuh`)
//! to CPU threads, one [`core::d2h::LaneConsumer`] per lane; its protocol is
//! [`core::d2h`]'s, and its own docs say where its words live.

#[cfg(not(feature = "loom"))]
pub mod d2h;
pub mod device;

/// The pure ring core (positions, sequence numbers, space, publication), from the crate's pure
/// layer: the producer protocol runs the same over host memory.
pub use crate::core::ring as core;
/// The ring's wire format, from the pure core.
pub use crate::core::ring::layout;

#[cfg(not(feature = "loom"))]
pub use d2h::{D2hLane, D2hLaneStats, DeviceToHostRing, MAX_D2H_LANES};
pub use device::{
    BarSink, CopyEngine, CopyEngineStats, DeviceRing, LaunchRing, LentLane, OwnedProducer,
    RingDeviceView, RingOptions,
};

/// The device API's header (`include/vkgdr/ring.cuh`), for build scripts that compile consumers
/// without the repository at hand (write it next to your `.cu` file, or pass it to NVRTC).
pub const RING_CUH: &str = include_str!("../../include/vkgdr/ring.cuh");

/// The device → host rings' device header (`include/vkgdr/ring_d2h.cuh`: publishing records and
/// `vkgdr_release_token`), for build scripts as [`RING_CUH`]; its wire format is
/// [`core::d2h`]'s.
pub const RING_D2H_CUH: &str = include_str!("../../include/vkgdr/ring_d2h.cuh");
