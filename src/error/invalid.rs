//! [`InvalidArgument`]: what a caller got wrong, as fields a program can match on.
//!
//! Each variant names one check and carries the values it refused; its `Display` is the sentence
//! the C and Python faces show (`vkgdr_last_error`, the exception's message), which programs
//! may match on, so it stays as it is. The pure core reports its own errors ([`RangeError`],
//! [`AllocError`]); they arrive here as the [`Range`](InvalidArgument::Range) and
//! [`Alloc`](InvalidArgument::Alloc) variants, with their own texts.

use crate::core::alloc::AllocError;
use crate::core::range::RangeError;

/// A caller error: the argument, option or state that a call refused, and why
/// ([`Error::InvalidArgument`](crate::Error::InvalidArgument)).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidArgument {
    // --- Core -----------------------------------------------------------------------------------
    /// A byte range outside its object, a zero or overflowing allocation size, a bad atom.
    #[error(transparent)]
    Range(#[from] RangeError),
    /// A request or configuration the allocator core refuses (zero size, bad alignment, ...).
    #[error(transparent)]
    Alloc(AllocError),

    // --- Mapping layer --------------------------------------------------------------------------
    /// An allocation size that overflows when rounded up to the VMM granularity.
    #[error("allocation of {size} bytes overflows")]
    GranularityOverflow {
        /// The size asked for.
        size: u64,
        /// The granularity it was rounded to.
        granularity: u64,
    },
    /// A host chunk size no `Layout` can describe (zero, or beyond the address space).
    #[error("host chunk of {size} bytes")]
    HostChunkSize {
        /// The size asked for.
        size: u64,
    },
    /// An import of memory from an fd whose size is zero or not a multiple of 4 KiB (exported
    /// memory always is).
    #[error("an imported allocation of {size} bytes (not a non-zero multiple of 4096)")]
    ImportSize {
        /// The size given.
        size: u64,
    },
    /// An offset not aligned for the plain-old-data type read or written there.
    #[error("offset {offset} is not aligned for {type_name} (align {align})")]
    MisalignedOffset {
        /// The offset into the mapping.
        offset: u64,
        /// The element type.
        type_name: &'static str,
        /// Its alignment.
        align: u64,
    },
    /// A GPU UUID text that is not one.
    #[error("{text:?} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    NotAUuid {
        /// The text given.
        text: String,
    },
    /// `Gpu::open_current_context` with a current context that is not the device's primary one.
    #[error(
        "the current CUDA context is not the device's primary context; \
         use Gpu::open_current_context_unchecked"
    )]
    CurrentContextNotPrimary,
    /// An allocation for the current context, which belongs to another device than the handle.
    #[error(
        "the current CUDA context belongs to device {context_device}, this handle to device \
         {handle_device}"
    )]
    ContextOfAnotherDevice {
        /// The `CUdevice` of the current context.
        context_device: i32,
        /// The handle's `CUdevice`.
        handle_device: i32,
    },
    /// A release after the null stream (a plain drop already waits for the legacy stream).
    #[error("the null stream: release after the legacy stream is what a plain drop does")]
    NullStream,
    /// A BAR budget fraction outside `(0, 1]`.
    #[error("a BAR budget fraction must be in (0, 1], not {fraction}")]
    BudgetFraction {
        /// The fraction given.
        fraction: f64,
    },
    /// Text handed to the driver with a NUL byte inside (`what`: "PTX text", "kernel name").
    #[error("{what} contains a NUL byte")]
    NulByte {
        /// What the text was.
        what: &'static str,
    },
    /// A kernel launch or event record of one CUDA context on a stream of another (`what`: "a
    /// kernel", "an event").
    #[error("{what} of one CUDA context used with a stream of another")]
    ForeignStream {
        /// What was used with the stream.
        what: &'static str,
    },
    /// A buffer of zero bytes (`what`: "pinned buffer", "device buffer").
    #[error("{what} of zero bytes")]
    EmptyBuffer {
        /// Which kind of buffer.
        what: &'static str,
    },
    /// A word offset into a pinned buffer that is not 8-byte aligned.
    #[error("offset {offset} of a pinned buffer is not 8-byte aligned")]
    MisalignedWord {
        /// The offset given.
        offset: usize,
    },
    /// An arena chunk size of zero.
    #[error("arena chunk size is zero")]
    ArenaChunkSizeZero,
    /// An arena chunk size that is not a multiple of the VMM granularity.
    #[error(
        "arena chunk size {chunk_size} is not a multiple of the VMM granularity {granularity}"
    )]
    ArenaChunkSize {
        /// The chunk size given.
        chunk_size: u64,
        /// The device's VMM granularity.
        granularity: u64,
    },
    /// An arena reservation that is zero or not a multiple of the chunk size.
    #[error("arena reservation {reserve} is not a multiple of the chunk size {chunk_size}")]
    ArenaReservation {
        /// The reservation given.
        reserve: u64,
        /// The arena's chunk size.
        chunk_size: u64,
    },
    /// A mirror of an arena with no chunk.
    #[error("mirroring an empty arena")]
    MirrorOfEmptyArena,
    /// A mirror with no reservation left after the last chunk.
    #[error("no reservation left after the last chunk for the mirror")]
    NoRoomForMirror,
    /// Growing or shrinking an arena while its mirror is mapped (`operation`: "growing",
    /// "shrinking").
    #[error("{operation} a mirrored arena (unmap the mirror first)")]
    ArenaIsMirrored {
        /// What was asked.
        operation: &'static str,
    },
    /// A chunk of another size than an arena's chunks, asked of the arena as a chunk source.
    #[error("{size}-byte chunk requested from an arena of {chunk_size}-byte chunks")]
    ArenaChunkRequest {
        /// The size asked for.
        size: u64,
        /// The arena's chunk size.
        chunk_size: u64,
    },

    // --- Pool -----------------------------------------------------------------------------------
    /// A chunk source whose atom size is not a power of two.
    #[error("the chunk source's atom size {atom} is not a power of two")]
    SourceAtom {
        /// The atom size the source reported.
        atom: u64,
    },
    /// A pool configuration with no shard.
    #[error("a pool needs at least one shard")]
    NoShards,
    /// A pool configuration with more shards than allowed.
    #[error("{shards} shards exceed the maximum of {max}")]
    TooManyShards {
        /// The shard count given.
        shards: usize,
        /// The most allowed.
        max: usize,
    },
    /// A pool chunk size (`field`: "chunk_size", "max_chunk_size") that is zero, not a multiple
    /// of the heap's maximum alignment, or too large.
    #[error(
        "{field} {size} must be a non-zero multiple of the maximum alignment {max_align} \
         (at most {max})"
    )]
    ChunkSize {
        /// Which setting.
        field: &'static str,
        /// Its value.
        size: u64,
        /// The heap's maximum alignment.
        max_align: u64,
        /// The largest chunk the heap takes.
        max: u64,
    },
    /// A pool's `max_chunk_size` below its `chunk_size`.
    #[error("max_chunk_size is smaller than chunk_size")]
    MaxChunkBelowChunk {
        /// The first chunk's size.
        chunk_size: u64,
        /// The largest chunk's size.
        max_chunk_size: u64,
    },
    /// Non-coherent memory whose atom the pool's heap cannot align to.
    #[error(
        "the memory's nonCoherentAtomSize {atom} must be a power of two no larger than \
         heap.max_align {max_align}"
    )]
    AtomAboveAlign {
        /// The memory's `nonCoherentAtomSize`.
        atom: u64,
        /// The heap's maximum alignment.
        max_align: u64,
    },
    /// A pool's `dedicated_threshold` of zero.
    #[error("dedicated_threshold is zero")]
    ZeroDedicatedThreshold,
    /// A thread cache deeper than allowed.
    #[error("thread_cache {depth} exceeds {max} blocks per size bucket")]
    ThreadCacheDepth {
        /// The depth given.
        depth: usize,
        /// The most allowed.
        max: usize,
    },

    // --- Rings ----------------------------------------------------------------------------------
    /// A ring lane count outside 1 to `max`.
    #[error("a ring has 1 to {max} lanes, not {lanes}")]
    RingLanes {
        /// The lane count given.
        lanes: u32,
        /// The most allowed.
        max: u32,
    },
    /// A ring whose lanes together overflow the address space.
    #[error("ring size overflows")]
    RingSizeOverflow {
        /// Bytes per lane.
        capacity: u64,
        /// Lanes.
        lanes: u32,
    },
    /// A mirrored ring lane whose arena has no chunk mapped.
    #[error("the ring's arena has no chunk mapped")]
    RingArenaEmpty,

    // --- cudarc interop -------------------------------------------------------------------------
    /// A `CUdevice` without an ordinal among the driver's devices (cudarc needs one).
    #[error("this handle's CUdevice has no ordinal")]
    NoOrdinal,
    /// A cudarc context asked of a handle that works in a context other than the primary one.
    #[error(
        "this handle works in a context that is not its device's primary context; \
         open it with Gpu::from_cudarc to share a cudarc context"
    )]
    HandleContextNotPrimary,
    /// Memory without a device pointer where one is needed (a pool over Vulkan-only or host
    /// chunks).
    #[error("this memory has no device pointer (a pool over Vulkan-only or host chunks)")]
    NoDevicePointer,
    /// A device view of a zero-sized element type.
    #[error("a device view of a zero-sized type")]
    ZeroSizedElement {
        /// The element type.
        type_name: &'static str,
    },
    /// A device address not aligned for the element type of a view.
    #[error("device address {address:#x} is not aligned for {type_name} (align {align})")]
    MisalignedDeviceAddress {
        /// The device address.
        address: u64,
        /// The element type.
        type_name: &'static str,
        /// Its alignment.
        align: u64,
    },
    /// A device view with more elements than `usize` counts.
    #[error("the memory holds more elements than usize counts")]
    TooManyElements {
        /// The memory's size in bytes.
        bytes: u64,
        /// The element size in bytes.
        element: u64,
    },

    // --- Faces ----------------------------------------------------------------------------------
    /// A check made by a face built on this library (the Python package's argument checks), in
    /// its own words. The library itself never returns it.
    #[error("{0}")]
    Other(String),
}

/// The caller errors of the allocator core.
impl From<AllocError> for InvalidArgument {
    fn from(e: AllocError) -> Self {
        InvalidArgument::Alloc(e)
    }
}

/// A face's own check, in its own words ([`InvalidArgument::Other`]).
impl From<String> for InvalidArgument {
    fn from(message: String) -> Self {
        InvalidArgument::Other(message)
    }
}

/// A face's own check, in its own words ([`InvalidArgument::Other`]).
impl From<&str> for InvalidArgument {
    fn from(message: &str) -> Self {
        InvalidArgument::Other(message.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// Every check's text, as the C and Python faces show it: the sentences these errors were
    /// before they had fields, byte for byte.
    #[test]
    fn the_texts_users_see_are_unchanged() {
        use InvalidArgument as I;
        let cases: Vec<(InvalidArgument, &str)> =
            vec![
            (
                RangeError::OutOfBounds { offset: 4, len: 97, size: 100 }.into(),
                "range 4+97 is outside the 100-byte allocation",
            ),
            (RangeError::ZeroSize.into(), "allocation size is zero"),
            (AllocError::ZeroSize.into(), "allocation size is zero"),
            (
                I::GranularityOverflow { size: 7, granularity: 2 << 20 },
                "allocation of 7 bytes overflows",
            ),
            (I::HostChunkSize { size: 0 }, "host chunk of 0 bytes"),
            (
                I::ImportSize { size: 100 },
                "an imported allocation of 100 bytes (not a non-zero multiple of 4096)",
            ),
            (
                I::MisalignedOffset { offset: 1, type_name: "u32", align: 4 },
                "offset 1 is not aligned for u32 (align 4)",
            ),
            (
                I::NotAUuid { text: "GPU-1".into() },
                "\"GPU-1\" is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
            ),
            (
                I::CurrentContextNotPrimary,
                "the current CUDA context is not the device's primary context; use \
                 Gpu::open_current_context_unchecked",
            ),
            (
                I::ContextOfAnotherDevice { context_device: 1, handle_device: 0 },
                "the current CUDA context belongs to device 1, this handle to device 0",
            ),
            (
                I::NullStream,
                "the null stream: release after the legacy stream is what a plain drop does",
            ),
            (
                I::BudgetFraction { fraction: 1.5 },
                "a BAR budget fraction must be in (0, 1], not 1.5",
            ),
            (I::NulByte { what: "PTX text" }, "PTX text contains a NUL byte"),
            (
                I::ForeignStream { what: "an event" },
                "an event of one CUDA context used with a stream of another",
            ),
            (I::EmptyBuffer { what: "pinned buffer" }, "pinned buffer of zero bytes"),
            (
                I::MisalignedWord { offset: 12 },
                "offset 12 of a pinned buffer is not 8-byte aligned",
            ),
            (I::ArenaChunkSizeZero, "arena chunk size is zero"),
            (
                I::ArenaChunkSize { chunk_size: 4096, granularity: 2 << 20 },
                "arena chunk size 4096 is not a multiple of the VMM granularity 2097152",
            ),
            (
                I::ArenaReservation { reserve: 3, chunk_size: 2 },
                "arena reservation 3 is not a multiple of the chunk size 2",
            ),
            (I::MirrorOfEmptyArena, "mirroring an empty arena"),
            (I::NoRoomForMirror, "no reservation left after the last chunk for the mirror"),
            (
                I::ArenaIsMirrored { operation: "growing" },
                "growing a mirrored arena (unmap the mirror first)",
            ),
            (
                I::ArenaChunkRequest { size: 8, chunk_size: 4 },
                "8-byte chunk requested from an arena of 4-byte chunks",
            ),
            (I::SourceAtom { atom: 48 }, "the chunk source's atom size 48 is not a power of two"),
            (I::NoShards, "a pool needs at least one shard"),
            (
                I::TooManyShards { shards: 2000, max: 1024 },
                "2000 shards exceed the maximum of 1024",
            ),
            (
                I::ChunkSize { field: "chunk_size", size: 3, max_align: 64, max: 1 << 62 },
                "chunk_size 3 must be a non-zero multiple of the maximum alignment 64 (at most \
                 4611686018427387904)",
            ),
            (
                I::MaxChunkBelowChunk { chunk_size: 2, max_chunk_size: 1 },
                "max_chunk_size is smaller than chunk_size",
            ),
            (
                I::AtomAboveAlign { atom: 64, max_align: 16 },
                "the memory's nonCoherentAtomSize 64 must be a power of two no larger than \
                 heap.max_align 16",
            ),
            (I::ZeroDedicatedThreshold, "dedicated_threshold is zero"),
            (
                I::ThreadCacheDepth { depth: 2000, max: 1024 },
                "thread_cache 2000 exceeds 1024 blocks per size bucket",
            ),
            (I::RingLanes { lanes: 0, max: 64 }, "a ring has 1 to 64 lanes, not 0"),
            (I::RingSizeOverflow { capacity: 1 << 63, lanes: 2 }, "ring size overflows"),
            (I::RingArenaEmpty, "the ring's arena has no chunk mapped"),
            (I::NoOrdinal, "this handle's CUdevice has no ordinal"),
            (
                I::HandleContextNotPrimary,
                "this handle works in a context that is not its device's primary context; open \
                 it with Gpu::from_cudarc to share a cudarc context",
            ),
            (
                I::NoDevicePointer,
                "this memory has no device pointer (a pool over Vulkan-only or host chunks)",
            ),
            (I::ZeroSizedElement { type_name: "()" }, "a device view of a zero-sized type"),
            (
                I::MisalignedDeviceAddress { address: 0x1001, type_name: "u32", align: 4 },
                "device address 0x1001 is not aligned for u32 (align 4)",
            ),
            (
                I::TooManyElements { bytes: u64::MAX, element: 1 },
                "the memory holds more elements than usize counts",
            ),
            ("a stream that is not one".into(), "a stream that is not one"),
        ];
        for (what, text) in cases {
            assert_eq!(what.to_string(), text);
            assert_eq!(
                Error::from(what).to_string(),
                format!("invalid argument: {text}")
            );
        }
    }
}
