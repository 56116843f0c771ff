//! [`RingError`]: what the ring core refuses. Every error leaves the ring unchanged.

use super::layout::MIN_CAPACITY;

/// Errors of the ring core. Every error leaves the ring unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The capacity is not a power of two of at least [`MIN_CAPACITY`] bytes.
    #[error("ring capacity {0} is not a power of two >= {MIN_CAPACITY}")]
    InvalidCapacity(u64),
    /// The ring's capacity differs from the capacity of the sink it writes through.
    #[error("ring capacity {ring} differs from the sink's capacity {sink}")]
    CapacityMismatch {
        /// The capacity asked for.
        ring: u64,
        /// The sink's region size.
        sink: u64,
    },
    /// A record with an empty payload was requested.
    #[error("zero-length record")]
    ZeroLength,
    /// The payload is larger than [`RingCore::max_record`](super::RingCore::max_record).
    #[error("record payload of {len} bytes exceeds the maximum of {max}")]
    RecordTooLarge {
        /// Requested payload bytes.
        len: u32,
        /// Largest payload this ring takes.
        max: u32,
    },
    /// Not enough unconsumed space right now (or every commit slot holds an unpublished record).
    #[error("ring is full")]
    Full,
    /// A wait for space ran out of its timeout.
    #[error("timed out waiting for ring space")]
    Timeout,
    /// The consumer has stopped (or was asked to stop): no more space will be freed.
    #[error("the ring's consumer has stopped")]
    Stopped,
    /// The ring is owned by a [`Producer`](super::Producer) right now; shared reservations wait for
    /// it.
    #[error("the ring is claimed by a producer")]
    Claimed,
    /// A claim was refused: shared reservations are still in flight.
    #[error("the ring has shared reservations in flight")]
    Busy,
    /// The calling thread would wait for something only it can finish: it holds an open reservation
    /// (or the [`Producer`](super::Producer)) that the space or slot it waits for depends on.
    #[error("the calling thread holds the reservation this wait depends on")]
    WouldDeadlock,
    /// A write would go outside the reservation's payload.
    #[error("write of {len} bytes at {at} exceeds the {record_len}-byte payload")]
    OutOfRange {
        /// Payload offset of the write.
        at: u64,
        /// Bytes written.
        len: u64,
        /// The reservation's payload length.
        record_len: u32,
    },
    /// The host memory of a [`HostSink`](super::HostSink) of this many bytes could not be
    /// allocated.
    #[error("cannot allocate {0} bytes of host memory for a ring")]
    HostMemory(u64),
    /// The consumer reported a head beyond anything committed.
    #[error("consumer head {head} is beyond the committed position {committed}")]
    HeadBeyondCommitted {
        /// The reported head.
        head: u64,
        /// The committed position when it was checked.
        committed: u64,
    },
    /// A loan call on a ring that is not lent ([`RingCore::lend`](super::RingCore::lend)).
    #[error("the ring is not lent")]
    NotLent,
    /// A lent producer's published end that breaks the ring's rules (backwards, misaligned,
    /// beyond the capacity, a sequence number going back).
    #[error("lent producer's tail {pos} refused (published {published})")]
    BadLentTail {
        /// The position reported.
        pos: u64,
        /// The ring's published end.
        published: u64,
    },
    /// The consumer reported a head that is not a record boundary.
    #[error("consumer head {0} is not 16-byte aligned")]
    MisalignedHead(u64),
}
