//! Lending a ring to a producer the core does not run: one in another process, whose records
//! reach the region through its own mapping and whose tail the owner passes on
//! ([`RingCore::lend`]).

use super::error::RingError;
use super::layout::RECORD_ALIGN;
use super::shared::RingCore;
use super::sink::RingSink;
use crate::core::sync::atomic::Ordering;

/// `claimed` while the ring is lent (no thread of this process owns it).
pub(super) const LENT: u64 = u64::MAX;

impl<S: RingSink> RingCore<S> {
    /// A ring whose next record starts at `pos` with sequence number `next_seq`, the consumer
    /// having released everything below `head`: the borrower's side of a lent lane (see
    /// [`lend`](Self::lend)), which continues where the lender's records end.
    ///
    /// ```
    /// use vkgdr::ring::core::{HostSink, RingCore};
    /// use vkgdr::ring::layout::WrapMode;
    /// let ring = RingCore::starting_at(4096, HostSink::new(4096)?, WrapMode::Padded, 4096 + 64, 9, 4096)?;
    /// assert_eq!(ring.try_reserve(8)?.seq(), 9);
    /// # Ok::<(), vkgdr::ring::core::RingError>(())
    /// ```
    pub fn starting_at(
        capacity: u64,
        sink: S,
        wrap: crate::core::ring::layout::WrapMode,
        pos: u64,
        next_seq: u64,
        head: u64,
    ) -> Result<Self, RingError> {
        if !head.is_multiple_of(RECORD_ALIGN) {
            return Err(RingError::MisalignedHead(head));
        }
        if head > pos {
            return Err(RingError::HeadBeyondCommitted {
                head,
                committed: pos,
            });
        }
        if !pos.is_multiple_of(RECORD_ALIGN) || pos - head > capacity {
            return Err(RingError::BadLentTail {
                pos,
                published: head,
            });
        }
        let ring = Self::with_wrap_mode(capacity, sink, wrap)?;
        *ring.next_seq.lock() = next_seq;
        for word in [&ring.reserved, &ring.committed, &ring.published] {
            word.store(pos, Ordering::Release);
        }
        ring.published_seq.store(next_seq, Ordering::Release);
        ring.reclaimed.store(head, Ordering::Release);
        Ok(ring)
    }

    /// Lends the ring to a producer outside the core, as [`claim`](Self::claim) takes it for a
    /// [`Producer`](super::Producer): no shared reservation may be in flight
    /// ([`RingError::Busy`]) and no producer may own it ([`RingError::Claimed`]); until
    /// [`end_lend`](Self::end_lend), shared reservations and claims are refused with `Claimed`.
    /// Returns where the lent producer starts: the published end and the next sequence number.
    ///
    /// The core then publishes only what [`lent_published`](Self::lent_published) reports, so
    /// its counters stay true and a later producer continues where the lent one stopped.
    ///
    /// ```
    /// use vkgdr::ring::core::{HostSink, RingCore, RingError};
    /// let ring = RingCore::new(4096, HostSink::new(4096)?)?;
    /// assert_eq!(ring.lend()?, (0, 0));
    /// assert_eq!(ring.try_reserve(8).err(), Some(RingError::Claimed));
    /// ring.lent_published(96, 3)?; // the remote producer wrote three 32-byte records
    /// assert_eq!(ring.sink().tail(), 96);
    /// ring.end_lend()?;
    /// assert_eq!(ring.try_reserve(8)?.seq(), 3);
    /// # Ok::<(), RingError>(())
    /// ```
    pub fn lend(&self) -> Result<(u64, u64), RingError> {
        let next_seq = self.next_seq.lock();
        if self.claimed.load(Ordering::Acquire) != 0 {
            return Err(RingError::Claimed);
        }
        let reserved = self.reserved.load(Ordering::Relaxed);
        if self.published.load(Ordering::Acquire) != reserved
            || self
                .publishing
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return Err(RingError::Busy);
        }
        if self.published.load(Ordering::Acquire) != reserved {
            self.publishing.store(0, Ordering::Release);
            return Err(RingError::Busy);
        }
        self.claimed.store(LENT, Ordering::Release);
        Ok((reserved, *next_seq))
    }

    /// Whether the ring is lent ([`lend`](Self::lend)).
    pub fn is_lent(&self) -> bool {
        self.claimed.load(Ordering::Acquire) == LENT
    }

    /// Publishes the lent producer's records up to `pos`, `next_seq` being the number of the
    /// first record after them, through the sink, as a local producer's publication would
    /// (fence, tail store). The caller checked the pair (`share::lane::check_advance`):
    /// `pos` only grows, by whole records, and stays within a capacity of the consumer's head.
    /// A pair that breaks those rules is refused here too and nothing is published.
    pub fn lent_published(&self, pos: u64, next_seq: u64) -> Result<(), RingError> {
        if !self.is_lent() {
            return Err(RingError::NotLent);
        }
        let published = self.published.load(Ordering::Acquire);
        let reclaimed = self.reclaimed();
        if pos < published
            || !pos.is_multiple_of(RECORD_ALIGN)
            || pos - reclaimed > self.capacity
            || next_seq < self.published_seq.load(Ordering::Acquire)
        {
            return Err(RingError::BadLentTail { pos, published });
        }
        if pos == published {
            return Ok(());
        }
        self.reserved.store(pos, Ordering::Release);
        self.committed.store(pos, Ordering::Release);
        // The lender holds the publisher role for the loan; the records below `pos` were
        // written and fenced by the remote producer before it published the pair.
        self.publish_owned(pos, next_seq);
        self.published.store(pos, Ordering::Release);
        self.published_seq.store(next_seq, Ordering::Release);
        Ok(())
    }

    /// Ends the loan: the ring's next records (shared or a producer's) start where the lent
    /// producer's last published records end, with the next sequence number.
    pub fn end_lend(&self) -> Result<(), RingError> {
        let mut next_seq = self.next_seq.lock();
        if self.claimed.load(Ordering::Acquire) != LENT {
            return Err(RingError::NotLent);
        }
        *next_seq = self.published_seq.load(Ordering::Acquire);
        self.claimed.store(0, Ordering::Release);
        self.publishing.store(0, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ring::layout::{seal_test_payload, verify_records, RecordHeader};
    use crate::core::ring::HostSink;

    #[test]
    fn a_lent_ring_refuses_local_producers_and_resumes_after_the_loan() {
        let ring = RingCore::new(4096, HostSink::new(4096).unwrap()).unwrap();
        // Two local records first.
        ring.push(&[1u8; 40], None, &|| Ok(0)).unwrap();
        ring.push(&[2u8; 40], None, &|| Ok(0)).unwrap();
        let (pos, seq) = ring.lend().unwrap();
        assert_eq!((pos, seq), (128, 2));
        assert_eq!(ring.lend(), Err(RingError::Claimed));
        assert!(ring.claim(|| Ok(0)).is_err());
        assert_eq!(ring.try_reserve(8).err(), Some(RingError::Claimed));
        // The "remote" producer writes two records straight into the region.
        let mut at = pos;
        for s in seq..seq + 2 {
            let mut payload = vec![0u8; 48];
            seal_test_payload(&mut payload, s);
            let header = RecordHeader::data(48, s).to_bytes();
            // SAFETY: the ring is lent: nothing else writes the region, and the span is free.
            #[allow(unsafe_code)]
            unsafe {
                ring.sink().write(at, &header);
                ring.sink().write(at + 16, &payload);
            }
            at += 64;
        }
        // Refused: backwards, misaligned, beyond the capacity.
        assert!(ring.lent_published(64, 2).is_err());
        assert!(ring.lent_published(at + 8, 4).is_err());
        assert!(ring.lent_published(8192, 4).is_err());
        ring.lent_published(at, 4).unwrap();
        assert_eq!(ring.sink().tail(), at);
        ring.end_lend().unwrap();
        assert_eq!(ring.end_lend(), Err(RingError::NotLent));
        // A local producer continues the numbering.
        let mut payload = vec![0u8; 40];
        let mut r = ring.try_reserve(40).unwrap();
        assert_eq!((r.pos(), r.seq()), (at, 4));
        seal_test_payload(&mut payload, 4);
        r.write(0, &payload).unwrap();
        let tail = r.commit();
        let report = verify_records(ring.sink(), pos, tail, seq);
        assert_eq!((report.records, report.errors, report.next_seq), (3, 0, 5));
    }
}
