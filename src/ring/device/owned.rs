//! [`OwnedProducer`]: a lane's exclusive producer that keeps its ring alive, for handles that
//! cannot carry a borrow (the C and Python faces, a producer moved into a thread of its own).
#![allow(unsafe_code)] // one lifetime extension, paid for by the `Arc` held beside it

use std::sync::Arc;
use std::time::Duration;

use crate::core::ring::{FlushPolicy, Producer, ProducerRecord, RingError};
use crate::error::Result;

use super::persistent::DeviceRing;
use super::sink::BarSink;

/// A lane's exclusive [`Producer`] that owns a share of its [`DeviceRing`], from
/// [`DeviceRing::owned_producer`]. It offers the producer's calls; the producer itself is never
/// handed out, so it cannot be separated from the ring it writes.
///
/// ```no_run
/// use std::sync::Arc;
/// use vkgdr::ring::DeviceRing;
/// # fn main() -> vkgdr::Result<()> {
/// let gpu = vkgdr::Gpu::open(0)?;
/// let ring = Arc::new(DeviceRing::with_lanes(&gpu, 1 << 20, 2, Default::default())?);
/// let mut producer = ring.owned_producer()?;
/// std::thread::spawn(move || producer.push(&[1u8; 64], None)).join().unwrap()?;
/// # Ok(()) }
/// ```
pub struct OwnedProducer {
    // Declared before `ring`: fields drop in order, so the producer (which publishes what is
    // left and hands the lane back) goes while the ring is still alive.
    producer: Producer<'static, BarSink>,
    ring: Arc<DeviceRing>,
}
// `Send` by its fields, as the compiler checks here: it may move to another thread.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<OwnedProducer>()
};

impl std::fmt::Debug for OwnedProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedProducer")
            .field("producer", &self.producer)
            .finish_non_exhaustive()
    }
}

impl DeviceRing {
    /// [`producer`](Self::producer) for a ring shared through an `Arc`: the producer holds a
    /// share of the ring, so it may live anywhere (a C handle, a Python object, another thread).
    pub fn owned_producer(self: &Arc<Self>) -> Result<OwnedProducer> {
        let producer = self.producer()?;
        // SAFETY: the producer borrows `**self`, which lives at a fixed address inside the `Arc`
        // allocation for as long as a share of it exists. The `OwnedProducer` keeps one share and
        // drops the producer before it (field order), and never lets the `'static` producer out
        // (only calls that borrow it), so no use of the borrow outlives the ring.
        let producer = unsafe {
            std::mem::transmute::<Producer<'_, BarSink>, Producer<'static, BarSink>>(producer)
        };
        Ok(OwnedProducer {
            producer,
            ring: Arc::clone(self),
        })
    }
}

impl OwnedProducer {
    /// The ring this producer writes.
    pub fn ring(&self) -> &Arc<DeviceRing> {
        &self.ring
    }

    /// The lane this producer owns.
    pub fn lane(&self) -> usize {
        (0..self.ring.lanes())
            .find(|&i| {
                self.ring
                    .lane(i)
                    .is_some_and(|c| std::ptr::eq(c, self.producer.core()))
            })
            .unwrap_or(0)
    }

    /// See [`Producer::push`].
    pub fn push(
        &mut self,
        payload: &[u8],
        timeout: Option<Duration>,
    ) -> std::result::Result<u64, RingError> {
        self.producer.push(payload, timeout)
    }

    /// See [`Producer::push_batch`].
    pub fn push_batch<'p>(
        &mut self,
        payloads: impl IntoIterator<Item = &'p [u8]>,
        timeout: Option<Duration>,
    ) -> std::result::Result<u64, RingError> {
        self.producer.push_batch(payloads, timeout)
    }

    /// See [`Producer::write`].
    pub fn write(
        &mut self,
        payload: &[u8],
        timeout: Option<Duration>,
    ) -> std::result::Result<u64, RingError> {
        self.producer.write(payload, timeout)
    }

    /// See [`Producer::reserve`].
    pub fn reserve(
        &mut self,
        len: u32,
        timeout: Option<Duration>,
    ) -> std::result::Result<ProducerRecord<'_, 'static, BarSink>, RingError> {
        self.producer.reserve(len, timeout)
    }

    /// See [`Producer::flush`].
    pub fn flush(&mut self) {
        self.producer.flush();
    }

    /// See [`Producer::next_seq`].
    pub fn next_seq(&self) -> u64 {
        self.producer.next_seq()
    }

    /// See [`Producer::pending`].
    pub fn pending(&self) -> u64 {
        self.producer.pending()
    }

    /// See [`Producer::policy`].
    pub fn policy(&self) -> FlushPolicy {
        self.producer.policy()
    }

    /// See [`Producer::set_policy`].
    pub fn set_policy(&mut self, policy: FlushPolicy) {
        self.producer.set_policy(policy);
    }

    /// See [`Producer::stage_after`].
    pub fn stage_after(&self) -> u64 {
        self.producer.stage_after()
    }

    /// See [`Producer::set_stage_after`].
    pub fn set_stage_after(&mut self, bytes: u64) {
        self.producer.set_stage_after(bytes);
    }

    /// End of the last record written on the lane (published or not).
    pub fn reserved(&self) -> u64 {
        self.producer.core().reserved()
    }
}
