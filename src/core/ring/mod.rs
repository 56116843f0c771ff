//! The pure multi-producer ring core: positions, sequence numbers, space accounting and in-order
//! publication. It touches memory only through a [`RingSink`], so it runs the same over GPU
//! memory mapped through the BAR and over plain host memory ([`HostSink`]).
//!
//! Two ways to produce:
//! * **Shared** ([`RingCore::reserve`], [`RingCore::push`]): any number of threads reserve
//!   records through `&self` and commit them in any order; commits combine (one publication for
//!   every record that is ready). Each record pays a short mutex, its commit slot and a fence.
//! * **Exclusive** ([`RingCore::claim`] → [`Producer`]): one producer owns the ring (a lane of a
//!   [`DeviceRing`](crate::ring::DeviceRing)) and appends records with plain arithmetic, no lock
//!   and no atomic read-modify-write; a whole batch is published with one fence and one tail store
//!   ([`Producer::push_batch`], [`Producer::flush`], or a [`FlushPolicy`]).
//!
//! ```
//! use vkgdr::ring::core::{HostSink, RingCore};
//! use vkgdr::ring::layout::{seal_test_payload, verify_records};
//!
//! let ring = RingCore::new(4096, HostSink::new(4096)?)?;
//! let mut payload = vec![7u8; 40];
//! let mut r = ring.try_reserve(payload.len() as u32)?;
//! seal_test_payload(&mut payload, r.seq());
//! r.write(0, &payload)?;
//! let tail = r.commit(); // written, fenced and published to the consumer
//! assert_eq!(ring.sink().tail(), tail);
//!
//! // The consumer walks [head, tail) and reports its new head.
//! let report = verify_records(ring.sink(), 0, tail, 0);
//! assert_eq!((report.records, report.errors), (1, 0));
//! ring.reclaim_to(report.pos)?;
//! assert_eq!(ring.free_space(), 4096);
//! # Ok::<(), vkgdr::ring::core::RingError>(())
//! ```
//!
//! The other direction, kernels publishing to CPU threads, is [`d2h`]: its own wire format,
//! consumer and producer model, and the release tokens of device-side block releases.
//!
//! The only `unsafe` here calls the sink's two unsafe methods; each call site says which rule of
//! the protocol (an in-range span nobody else writes, a tail covering only finished records)
//! makes it sound. (And the device → host consumer's prefetch hint, which touches no memory.)
#![deny(unsafe_code)]

pub mod d2h;
mod error;
pub mod layout;
mod lend;
mod producer;
mod shared;
mod sink;
mod staged;
mod wait;

pub use error::RingError;
pub use producer::{FlushPolicy, Producer, ProducerRecord};
pub use shared::{HeadFn, Reservation, RingCore, COMMIT_SLOTS};
pub use sink::{HostSink, RingSink};

#[cfg(all(test, not(feature = "loom")))]
mod tests;
