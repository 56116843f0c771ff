//! The pure core: bookkeeping with no driver and no FFI in sight, so proptest, loom, Miri and the
//! fuzzers check it on any machine.
//!
//! [`alloc`] decides offsets inside chunks, [`dirty`] tracks the byte ranges to flush, [`range`]
//! is the bounds and atom arithmetic every mapping shares, [`ring`] is the ring buffers' producer
//! protocol and wire format, [`share`] the messages and rules of sharing with other processes,
//! `sync` holds the synchronisation primitives (loom's under the `loom`
//! feature) and `handle` the `Send + Sync` raw-pointer wrapper. Nothing here imports any other
//! layer of the crate: each module reports its own error type, which the crate's
//! [`Error`](crate::Error) converts.

pub mod alloc;
pub mod dirty;
pub(crate) mod handle;
pub mod range;
pub mod ring;
pub mod share;
pub(crate) mod sync;
