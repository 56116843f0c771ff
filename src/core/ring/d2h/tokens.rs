//! [`ReleaseTokens`]: what a device-side release hands the kernel, and the table that checks it
//! when it comes back.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU16, Ordering};

/// Bits of a token's generation.
pub const GENERATION_BITS: u32 = 28;
/// Bits of a token's entry index.
pub const ENTRY_BITS: u32 = 20;
/// Bits of a token's table tag.
pub const TAG_BITS: u32 = 16;
/// The largest generation; an entry that reaches it is retired, never issued again.
pub const MAX_GENERATION: u32 = (1 << GENERATION_BITS) - 1;
/// Most entries a table has (so at most this many tokens outstanding).
pub const MAX_ENTRIES: u32 = 1 << ENTRY_BITS;

const _: () = assert!(GENERATION_BITS + ENTRY_BITS + TAG_BITS == 64);

/// A release token: 64 bits a kernel passes back to give a value (a pool block) back to its
/// table.
///
/// | bits   | field      | |
/// |:-------|:-----------|:--|
/// | 63..48 | tag        | the issuing table's, never 0: a token of another table is forged |
/// | 47..28 | entry      | the table entry holding the value |
/// | 27..0  | generation | the entry's issue count, from 1: an older one is stale |
///
/// Token 0 is never issued. A forged token has a one in 2^44 chance (for a random 64-bit value
/// with the right tag, fewer when few entries are in use) of naming an issued entry; the table
/// still never gives a value out twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReleaseToken(u64);

impl ReleaseToken {
    /// The token of `tag`, `entry` and `generation` (each cut to its width).
    pub const fn new(tag: u16, entry: u32, generation: u32) -> Self {
        ReleaseToken(
            (tag as u64) << (ENTRY_BITS + GENERATION_BITS)
                | ((entry & (MAX_ENTRIES - 1)) as u64) << GENERATION_BITS
                | (generation & MAX_GENERATION) as u64,
        )
    }

    /// The token a kernel handed back, as it is.
    pub const fn from_bits(bits: u64) -> Self {
        ReleaseToken(bits)
    }

    /// The 64 bits to pass to the kernel.
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    /// The issuing table's tag.
    pub const fn tag(self) -> u16 {
        (self.0 >> (ENTRY_BITS + GENERATION_BITS)) as u16
    }

    /// The entry.
    pub const fn entry(self) -> u32 {
        ((self.0 >> GENERATION_BITS) & (MAX_ENTRIES as u64 - 1)) as u32
    }

    /// The entry's generation when the token was issued.
    pub const fn generation(self) -> u32 {
        (self.0 & MAX_GENERATION as u64) as u32
    }
}

/// Why a token gave nothing back. Every case is counted ([`TokenStats`]); none changes the
/// table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Never issued by this table: another tag, an entry that does not exist, a generation
    /// the entry has not reached (or 0).
    #[error("release token {0:#018x} was never issued by this table")]
    Forged(u64),
    /// Issued once, but its entry has moved on (issued again since) or the host took the value
    /// back ([`ReleaseTokens::revoke`]).
    #[error("release token {0:#018x} is stale")]
    Stale(u64),
    /// Redeemed already, and its entry not issued again since.
    #[error("release token {0:#018x} was redeemed already")]
    Repeated(u64),
}

/// Counts of a table's tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenStats {
    /// Tokens issued.
    pub issued: u64,
    /// Tokens redeemed (values given back).
    pub redeemed: u64,
    /// Values the host took back before their token came.
    pub revoked: u64,
    /// Forged tokens refused.
    pub forged: u64,
    /// Stale tokens refused.
    pub stale: u64,
    /// Repeated tokens refused.
    pub repeated: u64,
    /// Entries retired at [`MAX_GENERATION`].
    pub retired: u64,
}

impl TokenStats {
    /// Tokens issued and neither redeemed nor revoked.
    pub const fn outstanding(&self) -> u64 {
        self.issued - self.redeemed - self.revoked
    }

    /// Tokens refused, of every kind.
    pub const fn refused(&self) -> u64 {
        self.forged + self.stale + self.repeated
    }
}

/// [`ReleaseTokens::issue`] found every entry in use; the value comes back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("release token table full: {max} tokens outstanding")]
pub struct TableFull<T> {
    /// The value that was not issued a token.
    pub value: T,
    /// The table's entries.
    pub max: u32,
}

/// What an entry holds.
#[derive(Debug)]
enum State<T> {
    /// The value, until its token comes (or the host revokes it).
    Issued(T),
    /// Free: its last token was redeemed (a repeat of it is `Repeated`).
    Redeemed,
    /// Free: never issued, or the value was revoked (its token is `Stale`).
    Idle,
}

#[derive(Debug)]
struct Entry<T> {
    generation: u32,
    state: State<T>,
}

/// Values (pool blocks) lent to kernels, each behind a generation-checked, single-use token.
///
/// [`issue`](Self::issue) stores a value and returns its token; [`redeem`](Self::redeem) gives
/// the value back exactly once, for the token of its issue only. A forged, stale or repeated
/// token is refused and counted, and changes nothing: a value is never given out twice, nor for
/// another value's token. Free entries are reused oldest first, so an entry's generation grows
/// slowly and a stale token finds its entry moved on.
///
/// Not thread-safe by itself (`&mut self`): the ring layer keeps it under a lock; a redeem is a
/// few loads and stores.
///
/// ```
/// use vkgdr::ring::core::d2h::{ReleaseTokens, TokenError};
///
/// let mut table = ReleaseTokens::new();
/// let token = table.issue("block A").unwrap();
/// let bits = token.to_bits(); // passed to the kernel, which sends it back when done
/// assert_eq!(table.redeem(bits), Ok("block A"));
/// assert_eq!(table.redeem(bits), Err(TokenError::Repeated(bits)));
/// assert_eq!(table.redeem(0x1234), Err(TokenError::Forged(0x1234)));
/// assert_eq!(table.stats().refused(), 2);
/// ```
#[derive(Debug)]
pub struct ReleaseTokens<T> {
    tag: u16,
    max_entries: u32,
    entries: Vec<Entry<T>>,
    /// Free entries, oldest first.
    free: VecDeque<u32>,
    stats: TokenStats,
}

impl<T> Default for ReleaseTokens<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ReleaseTokens<T> {
    /// An empty table with a tag of its own (a process-wide counter that skips 0; tags repeat
    /// after 65 535 tables).
    pub fn new() -> Self {
        static NEXT_TAG: AtomicU16 = AtomicU16::new(1);
        let mut tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        if tag == 0 {
            tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        }
        Self::with_tag(tag, MAX_ENTRIES)
    }

    /// An empty table with the given tag (0 is taken as 1) and at most `max_entries` entries
    /// (clamped to 1..=[`MAX_ENTRIES`]).
    pub fn with_tag(tag: u16, max_entries: u32) -> Self {
        ReleaseTokens {
            tag: tag.max(1),
            max_entries: max_entries.clamp(1, MAX_ENTRIES),
            entries: Vec::new(),
            free: VecDeque::new(),
            stats: TokenStats::default(),
        }
    }

    /// The tag of this table's tokens.
    pub fn tag(&self) -> u16 {
        self.tag
    }

    /// The counts so far.
    pub fn stats(&self) -> TokenStats {
        self.stats
    }

    /// Keeps `value` and returns the token that gives it back, or the value if every entry
    /// holds one.
    #[inline(always)] // the pool's lend is this and a lock: a call costs it a tenth
    pub fn issue(&mut self, value: T) -> Result<ReleaseToken, TableFull<T>> {
        let slot = match self.free.pop_front() {
            Some(slot) => slot,
            None if (self.entries.len() as u32) < self.max_entries => {
                self.entries.push(Entry {
                    generation: 0,
                    state: State::Idle,
                });
                self.entries.len() as u32 - 1
            }
            None => {
                return Err(TableFull {
                    value,
                    max: self.max_entries,
                })
            }
        };
        let entry = &mut self.entries[slot as usize];
        entry.generation += 1; // below MAX_GENERATION: a retired entry is never free
        entry.state = State::Issued(value);
        self.stats.issued += 1;
        Ok(ReleaseToken::new(self.tag, slot, entry.generation))
    }

    /// The value `token` (a kernel's 64 bits) was issued for, once; every other token is
    /// refused and counted.
    pub fn redeem(&mut self, token: u64) -> Result<T, TokenError> {
        let entry = self.check(token)?;
        let value = self.empty(entry, State::Redeemed);
        self.stats.redeemed += 1;
        Ok(value)
    }

    /// Takes back the value of an outstanding `token` without its kernel's release (the host
    /// knows the kernel is done, or will never release it); its token is stale from now on.
    /// `None` (and nothing counted) if the token is not outstanding.
    pub fn revoke(&mut self, token: u64) -> Option<T> {
        let t = ReleaseToken::from_bits(token);
        let entry = self.entries.get(t.entry() as usize)?;
        let outstanding = t.tag() == self.tag
            && t.generation() == entry.generation
            && matches!(entry.state, State::Issued(_));
        outstanding.then(|| {
            self.stats.revoked += 1;
            self.empty(t.entry() as usize, State::Idle)
        })
    }

    /// Takes back every outstanding value (their tokens turn stale), in entry order.
    pub fn revoke_all(&mut self) -> Vec<T> {
        let issued: Vec<usize> = (0..self.entries.len())
            .filter(|&slot| matches!(self.entries[slot].state, State::Issued(_)))
            .collect();
        self.stats.revoked += issued.len() as u64;
        issued
            .into_iter()
            .map(|slot| self.empty(slot, State::Idle))
            .collect()
    }

    /// Which entry an outstanding `token` names, or why it names none (counted).
    fn check(&mut self, token: u64) -> Result<usize, TokenError> {
        let t = ReleaseToken::from_bits(token);
        let slot = t.entry() as usize;
        let verdict = match self.entries.get(slot) {
            _ if t.tag() != self.tag || t.generation() == 0 => Err(TokenError::Forged(token)),
            None => Err(TokenError::Forged(token)),
            Some(e) if t.generation() > e.generation => Err(TokenError::Forged(token)),
            Some(e) if t.generation() < e.generation => Err(TokenError::Stale(token)),
            Some(e) => match e.state {
                State::Issued(_) => Ok(slot),
                State::Redeemed => Err(TokenError::Repeated(token)),
                State::Idle => Err(TokenError::Stale(token)),
            },
        };
        match verdict {
            Err(TokenError::Forged(_)) => self.stats.forged += 1,
            Err(TokenError::Stale(_)) => self.stats.stale += 1,
            Err(TokenError::Repeated(_)) => self.stats.repeated += 1,
            Ok(_) => {}
        }
        verdict
    }

    /// Takes the value out of an issued entry, leaving `state`, and frees the entry (or retires
    /// it at the last generation).
    fn empty(&mut self, slot: usize, state: State<T>) -> T {
        let entry = &mut self.entries[slot];
        let State::Issued(value) = std::mem::replace(&mut entry.state, state) else {
            unreachable!("only issued entries are emptied")
        };
        if entry.generation >= MAX_GENERATION {
            self.stats.retired += 1;
        } else {
            self.free.push_back(slot as u32);
        }
        value
    }
}

/// The tokens of a [`KIND_RELEASE`](super::KIND_RELEASE) record's payload (little-endian
/// `u64`s), or `None` if its length is not a multiple of 8.
///
/// ```
/// use vkgdr::ring::core::d2h::tokens_in;
/// let payload = [1u64.to_le_bytes(), 2u64.to_le_bytes()].concat();
/// assert_eq!(tokens_in(&payload).unwrap().collect::<Vec<_>>(), [1, 2]);
/// assert!(tokens_in(&payload[..5]).is_none());
/// ```
pub fn tokens_in(payload: &[u8]) -> Option<impl Iterator<Item = u64> + '_> {
    payload.len().is_multiple_of(8).then(|| {
        payload
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
    })
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn an_entry_at_the_last_generation_retires() {
        let mut t = ReleaseTokens::with_tag(1, 1);
        t.entries.push(Entry {
            generation: MAX_GENERATION - 1,
            state: State::Idle,
        });
        t.free.push_back(0);
        let tok = t.issue(1).unwrap();
        assert_eq!(tok.generation(), MAX_GENERATION);
        assert_eq!(t.redeem(tok.to_bits()), Ok(1));
        assert_eq!(t.stats().retired, 1);
        assert_eq!(
            t.issue(2).unwrap_err().value,
            2,
            "the only entry is retired"
        );
        let bits = tok.to_bits();
        assert_eq!(t.redeem(bits), Err(TokenError::Repeated(bits)));
    }
}
