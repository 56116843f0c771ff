//! Handle tables: what a C handle is, and how a freed, foreign or made-up one is caught.
//!
//! A handle the C side holds is not the address of the object. It is a 64-bit token
//! `generation << 32 | tag << 28 | slot` into a [`HandleTable`], dressed as an opaque pointer:
//!
//! | bits   | field      | purpose |
//! |--------|------------|---------|
//! | 0..28  | slot       | index into the table (up to 2^28 live handles of one type) |
//! | 28..32 | tag        | the handle's type (never 0, so no handle is NULL) |
//! | 32..64 | generation | the slot's generation when the handle was made: odd while live |
//!
//! Every call validates the token: the tag must be the table's, the slot must exist and its
//! generation must equal the token's. Freeing a handle bumps the slot's generation (a
//! compare-and-swap, so of two racing frees exactly one wins), so a freed handle, a double free
//! or a handle of another type is an error, never a read of freed memory. The one blind spot: a
//! slot reused 2^31 times comes back to the same generation, so a handle that stale would be
//! taken for the new one. The objects themselves never move and are never read after the
//! generation says they are gone.
//!
//! Cost per call: one lazily-initialised static, one page-pointer load and one generation load
//! (acquire), about 2 ns. Making and freeing a handle adds a thread-local free-slot cache pop or
//! push; the table's shared free list (a mutex) is touched once per `BATCH` (64) handles, so the
//! pool's block hot path takes no global lock.
//!
//! Not detectable: freeing a handle *while another thread is using it* (a race the C caller must
//! not create, as with `free`), and calls through a token the caller forged from a live handle's
//! bits.

use std::cell::{RefCell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

// std's Mutex, not parking_lot's: this module runs under Miri on CI, and parking_lot_core's futex
// call is refused by Miri's argument type checks when a thread parks (see vkgdr's sync::lock).
// Poisoning is ignored: the lists stay consistent at every step.
use std::sync::{Mutex, PoisonError};

/// Bits of the slot index.
const SLOT_BITS: u32 = 28;
/// Most slots a table has.
pub(crate) const MAX_SLOTS: u32 = 1 << SLOT_BITS;
/// Slots of the first page; page `k` has `FIRST_PAGE << k` slots.
const FIRST_PAGE_BITS: u32 = 8;
/// Pages needed to cover [`MAX_SLOTS`]: `2^8 * (2^21 - 1) >= 2^28`.
const PAGES: usize = (SLOT_BITS - FIRST_PAGE_BITS + 1) as usize;
/// Free slots moved between a thread's cache and the table's shared list at a time.
pub(crate) const BATCH: usize = 64;

const _: () = assert!(
    usize::BITS == 64,
    "handles are 64-bit tokens dressed as pointers"
);

/// The handle types, one tag each (4 bits, never 0; 15 is the tests': none is left free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Tag {
    /// `vkgdr_t`.
    Device = 1,
    /// `vkgdr_memory_t`.
    Memory = 2,
    /// `vkgdr_pool_t`.
    Pool = 3,
    /// `vkgdr_block_t`.
    Block = 4,
    /// `vkgdr_ring_t`.
    Ring = 5,
    /// `vkgdr_ring_reservation_t`.
    Reservation = 6,
    /// `vkgdr_ring_producer_t`.
    Producer = 7,
    /// `vkgdr_share_server_t`.
    ShareServer = 8,
    /// `vkgdr_peer_t`.
    Peer = 9,
    /// `vkgdr_attached_memory_t`.
    AttachedMemory = 10,
    /// `vkgdr_attached_pool_t`.
    AttachedPool = 11,
    /// `vkgdr_shared_block_t`.
    SharedBlock = 12,
    /// `vkgdr_attached_lane_t`.
    AttachedLane = 13,
    /// `vkgdr_d2h_ring_t`.
    D2hRing = 14,
    /// Tables made by tests.
    #[cfg(test)]
    Test = 15,
}

impl Tag {
    /// The C type name, for error messages.
    pub fn type_name(self) -> &'static str {
        match self {
            Tag::Device => "vkgdr_t",
            Tag::Memory => "vkgdr_memory_t",
            Tag::Pool => "vkgdr_pool_t",
            Tag::Block => "vkgdr_block_t",
            Tag::Ring => "vkgdr_ring_t",
            Tag::Reservation => "vkgdr_ring_reservation_t",
            Tag::Producer => "vkgdr_ring_producer_t",
            Tag::ShareServer => "vkgdr_share_server_t",
            Tag::Peer => "vkgdr_peer_t",
            Tag::AttachedMemory => "vkgdr_attached_memory_t",
            Tag::AttachedPool => "vkgdr_attached_pool_t",
            Tag::SharedBlock => "vkgdr_shared_block_t",
            Tag::AttachedLane => "vkgdr_attached_lane_t",
            Tag::D2hRing => "vkgdr_d2h_ring_t",
            #[cfg(test)]
            Tag::Test => "test handle",
        }
    }
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadHandle {
    /// The token is 0.
    Null,
    /// The token is not a live handle of this table's type: freed already, of another type, or
    /// not a handle at all.
    Invalid,
}

/// `(slot, tag, generation)` of a token.
fn decode(token: u64) -> (u32, u8, u32) {
    (
        (token & u64::from(MAX_SLOTS - 1)) as u32,
        ((token >> SLOT_BITS) & 0xf) as u8,
        (token >> 32) as u32,
    )
}

fn encode(slot: u32, tag: Tag, generation: u32) -> u64 {
    (u64::from(generation) << 32) | (u64::from(tag as u8) << SLOT_BITS) | u64::from(slot)
}

/// `(page, index in page, page length)` of a slot.
fn locate(slot: u32) -> (usize, usize, usize) {
    let j = u64::from(slot) + (1 << FIRST_PAGE_BITS);
    let k = 63 - j.leading_zeros() - FIRST_PAGE_BITS;
    let len = 1usize << (k + FIRST_PAGE_BITS);
    (k as usize, (j as usize) - len, len)
}

struct Slot<T> {
    /// Odd while the slot holds a value.
    generation: AtomicU32,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// A table's free slots shared by all threads.
#[derive(Default)]
struct Depot {
    free: Mutex<Vec<u32>>,
    /// `free.len()`, readable without the lock (a hint: exact only under it).
    len: AtomicUsize,
}

impl Depot {
    fn put(&self, slots: impl IntoIterator<Item = u32>) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        free.extend(slots);
        self.len.store(free.len(), Ordering::Relaxed);
    }

    /// Moves up to `n` slots into `out`.
    fn take(&self, n: usize, out: &mut Vec<u32>) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let from = free.len() - free.len().min(n);
        out.extend(free.drain(from..));
        self.len.store(free.len(), Ordering::Relaxed);
    }
}

/// Free slots of one table cached by one thread; returned to the table's depot when the thread
/// exits.
struct ThreadSlots {
    depot: Arc<Depot>,
    free: Vec<u32>,
}

impl Drop for ThreadSlots {
    fn drop(&mut self) {
        self.depot.put(self.free.drain(..));
    }
}

thread_local! {
    /// Indexed by table id.
    static THREAD_SLOTS: RefCell<Vec<Option<ThreadSlots>>> = const { RefCell::new(Vec::new()) };
}

/// Table identities, indexes into every thread's caches.
static NEXT_TABLE_ID: AtomicUsize = AtomicUsize::new(0);

/// A table of live objects of one handle type. See the [module docs](self).
pub struct HandleTable<T> {
    id: usize,
    tag: Tag,
    /// Page `k` holds `FIRST_PAGE << k` slots; allocated on first use, freed with the table.
    pages: [AtomicPtr<Slot<T>>; PAGES],
    /// Slots below this have been handed out at least once.
    fresh: AtomicU32,
    /// Free slots shared by all threads.
    depot: Arc<Depot>,
}

// SAFETY: values are moved in and out by whichever thread inserts or removes them (T: Send) and
// shared between threads through `get` (T: Sync); the slot bookkeeping is atomic or locked.
unsafe impl<T: Send + Sync> Sync for HandleTable<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Send for HandleTable<T> {}

impl<T> HandleTable<T> {
    /// An empty table for handles of type `tag`.
    pub fn new(tag: Tag) -> Self {
        HandleTable {
            id: NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed),
            tag,
            pages: [const { AtomicPtr::new(ptr::null_mut()) }; PAGES],
            fresh: AtomicU32::new(0),
            depot: Arc::default(),
        }
    }

    /// The handle type.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    #[inline]
    fn slot(&self, slot: u32) -> Option<&Slot<T>> {
        let (page, index, _) = locate(slot);
        let base = self.pages[page].load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null page pointer is a live page of `len > index` slots, freed only when
        // the table drops.
        Some(unsafe { &*base.add(index) })
    }

    fn slot_or_new_page(&self, slot: u32) -> &Slot<T> {
        if let Some(s) = self.slot(slot) {
            return s;
        }
        let (page, index, len) = locate(slot);
        let fresh: Box<[Slot<T>]> = (0..len)
            .map(|_| Slot {
                generation: AtomicU32::new(0),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect();
        let new = Box::into_raw(fresh).cast::<Slot<T>>();
        let base = match self.pages[page].compare_exchange(
            ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => new,
            Err(existing) => {
                // SAFETY: `new` came from `Box::into_raw` of `len` slots just above and lost the
                // race, so nothing else refers to it.
                drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(new, len)) });
                existing
            }
        };
        // SAFETY: `base` is a live page of `len > index` slots.
        unsafe { &*base.add(index) }
    }

    /// A free slot index: from this thread's cache, else a batch from the depot, else a batch
    /// of never-used slots. `None` when all `MAX_SLOTS` are live.
    fn take_slot(&self) -> Option<u32> {
        let cached = THREAD_SLOTS.try_with(|cell| {
            let mut all = cell.borrow_mut();
            if all.len() <= self.id {
                all.resize_with(self.id + 1, || None);
            }
            let mine = all[self.id].get_or_insert_with(|| ThreadSlots {
                depot: self.depot.clone(),
                free: Vec::new(),
            });
            if mine.free.is_empty() {
                self.depot.take(BATCH, &mut mine.free);
            }
            if mine.free.is_empty() {
                if let Some(first) = self.fresh_slots(BATCH as u32) {
                    // Popped from the end: hand them out in ascending order.
                    mine.free.extend((first..first + BATCH as u32).rev());
                }
            }
            mine.free.pop()
        });
        match cached {
            Ok(slot) => slot,
            // This thread's caches are being torn down (thread exit): no caching.
            Err(_) => {
                let mut one = Vec::new();
                self.depot.take(1, &mut one);
                one.pop().or_else(|| self.fresh_slots(1))
            }
        }
    }

    /// The first of `n` never-used slots, if that many are left (all-or-nothing keeps the last
    /// partial batch simple; only tables within `n` of [`MAX_SLOTS`] notice).
    fn fresh_slots(&self, n: u32) -> Option<u32> {
        self.fresh
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                (f <= MAX_SLOTS - n).then_some(f + n)
            })
            .ok()
            .or_else(|| (n > 1).then(|| self.fresh_slots(1)).flatten())
    }

    fn give_slot(&self, slot: u32) {
        let kept = THREAD_SLOTS.try_with(|cell| {
            let mut all = cell.borrow_mut();
            match all.get_mut(self.id).and_then(Option::as_mut) {
                Some(mine) => {
                    mine.free.push(slot);
                    if mine.free.len() >= 2 * BATCH {
                        let from = mine.free.len() - BATCH;
                        self.depot.put(mine.free.drain(from..));
                    }
                    true
                }
                None => false,
            }
        });
        if kept != Ok(true) {
            self.depot.put([slot]);
        }
    }

    /// Stores `value` and returns its token, or gives the value back when the table holds
    /// `MAX_SLOTS` (2^28) live handles.
    #[inline]
    pub fn insert(&self, value: T) -> Result<u64, T> {
        let Some(index) = self.take_slot() else {
            return Err(value);
        };
        let slot = self.slot_or_new_page(index);
        // The slot is free (even generation) and ours alone: it came off a free list.
        let generation = slot.generation.load(Ordering::Relaxed).wrapping_add(1);
        // SAFETY: nobody reads the value of a slot whose generation is even, and no other thread
        // holds this free slot.
        unsafe { (*slot.value.get()).write(value) };
        slot.generation.store(generation, Ordering::Release);
        Ok(encode(index, self.tag, generation))
    }

    /// The slot of a live token of this table.
    #[inline]
    fn live_slot(&self, token: u64) -> Result<(&Slot<T>, u32), BadHandle> {
        if token == 0 {
            return Err(BadHandle::Null);
        }
        let (index, tag, generation) = decode(token);
        if tag != self.tag as u8 || generation & 1 == 0 {
            return Err(BadHandle::Invalid);
        }
        let slot = self.slot(index).ok_or(BadHandle::Invalid)?;
        if slot.generation.load(Ordering::Acquire) != generation {
            return Err(BadHandle::Invalid);
        }
        Ok((slot, generation))
    }

    /// The object behind a live token.
    ///
    /// # Safety
    /// - No thread removes `token` while the returned reference is in use.
    #[inline]
    pub unsafe fn get(&self, token: u64) -> Result<&T, BadHandle> {
        let (slot, _) = self.live_slot(token)?;
        // SAFETY: the generation matched (acquire, pairing with `insert`'s release), so the value
        // is initialised; it stays so until a removal, which the caller rules out.
        Ok(unsafe { (*slot.value.get()).assume_init_ref() })
    }

    /// Frees the token, claiming its slot for this caller: of two racing removals of one token
    /// exactly one wins. Later calls with the token fail with [`BadHandle::Invalid`].
    #[inline]
    fn claim(&self, token: u64) -> Result<&Slot<T>, BadHandle> {
        let (slot, generation) = self.live_slot(token)?;
        slot.generation
            .compare_exchange(
                generation,
                generation.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .map_err(|_| BadHandle::Invalid)?;
        Ok(slot)
    }

    /// Takes the object out and frees the token: later calls with it fail with
    /// [`BadHandle::Invalid`]. Of two racing removals of one token, exactly one gets the object.
    #[inline]
    pub fn remove(&self, token: u64) -> Result<T, BadHandle> {
        let slot = self.claim(token)?;
        // SAFETY: `claim` made us the only remover of an initialised value; the generation is
        // even now, so no new `get` reads it, and the slot is reused only after `give_slot`.
        let value = unsafe { (*slot.value.get()).assume_init_read() };
        self.give_slot(decode(token).0);
        Ok(value)
    }

    /// Drops the object where it lies and frees the token: [`HandleTable::remove`] without
    /// moving the object out first.
    #[inline]
    pub fn free(&self, token: u64) -> Result<(), BadHandle> {
        let slot = self.claim(token)?;
        // SAFETY: as in `remove`; the value is dropped once, here, before the slot is reused.
        unsafe { (*slot.value.get()).assume_init_drop() };
        self.give_slot(decode(token).0);
        Ok(())
    }
}

impl<T> Drop for HandleTable<T> {
    fn drop(&mut self) {
        for (k, page) in self.pages.iter_mut().enumerate() {
            let base = *page.get_mut();
            if base.is_null() {
                continue;
            }
            let len = 1usize << (k as u32 + FIRST_PAGE_BITS);
            // SAFETY: the page came from `Box::into_raw` of `len` slots; `&mut self` means no
            // other reference to it exists.
            let mut slots = unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, len)) };
            for s in slots.iter_mut() {
                if *s.generation.get_mut() & 1 == 1 {
                    // SAFETY: an odd generation means the value is initialised and not removed.
                    unsafe { s.value.get_mut().assume_init_drop() };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn slots_map_onto_geometric_pages() {
        assert_eq!(locate(0), (0, 0, 256));
        assert_eq!(locate(255), (0, 255, 256));
        assert_eq!(locate(256), (1, 0, 512));
        assert_eq!(locate(767), (1, 511, 512));
        assert_eq!(locate(768), (2, 0, 1024));
        let (page, index, len) = locate(MAX_SLOTS - 1);
        assert!(page < PAGES && index < len);
    }

    #[test]
    fn tokens_are_never_null_and_round_trip() {
        for (slot, generation) in [(0, 1), (MAX_SLOTS - 1, u32::MAX), (12345, 7)] {
            let t = encode(slot, Tag::Block, generation);
            assert_ne!(t, 0);
            assert_eq!(decode(t), (slot, Tag::Block as u8, generation));
        }
    }

    #[test]
    fn freed_foreign_and_made_up_tokens_are_refused() {
        let table = HandleTable::new(Tag::Test);
        let other: HandleTable<String> = HandleTable::new(Tag::Device);
        let a = table.insert(String::from("a")).unwrap();
        // SAFETY: single-threaded; no removal while the references are used.
        unsafe {
            assert_eq!(table.get(a).map(String::as_str), Ok("a"));
            assert_eq!(other.get(a).err(), Some(BadHandle::Invalid));
            assert_eq!(table.get(0).err(), Some(BadHandle::Null));
            assert_eq!(table.get(a ^ (1 << 40)).err(), Some(BadHandle::Invalid));
            assert_eq!(table.get(a + 1).err(), Some(BadHandle::Invalid));
        }
        assert_eq!(table.remove(a).as_deref(), Ok("a"));
        assert_eq!(
            table.remove(a).err(),
            Some(BadHandle::Invalid),
            "double free"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { table.get(a) }.err(), Some(BadHandle::Invalid));
        // The slot is reused with a new generation: the old token stays dead.
        let b = table.insert(String::from("b")).unwrap();
        assert_eq!(decode(a).0, decode(b).0);
        assert_ne!(a, b);
        // SAFETY: as above.
        unsafe {
            assert_eq!(table.get(a).err(), Some(BadHandle::Invalid));
            assert_eq!(table.get(b).map(String::as_str), Ok("b"));
        }
    }

    #[test]
    fn many_threads_insert_and_remove_without_mixing_up_values() {
        let table = Arc::new(HandleTable::new(Tag::Test));
        // Enough to reuse slots across threads many times; Miri takes a quarter.
        let per_thread = if cfg!(miri) { 150u64 } else { 600 };
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let table = table.clone();
                std::thread::spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..per_thread {
                        live.push((table.insert(t * 1_000_000 + i).unwrap(), t * 1_000_000 + i));
                        if i % 3 == 0 {
                            let (tok, v) = live.swap_remove((i as usize * 7) % live.len());
                            assert_eq!(table.remove(tok), Ok(v));
                            assert_eq!(table.remove(tok), Err(BadHandle::Invalid));
                        }
                    }
                    live
                })
            })
            .collect();
        let live: Vec<(u64, u64)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let slots: HashSet<u32> = live.iter().map(|&(tok, _)| decode(tok).0).collect();
        assert_eq!(slots.len(), live.len(), "a slot handed out twice");
        for &(tok, v) in &live {
            // SAFETY: the threads are joined; nothing removes concurrently.
            assert_eq!(unsafe { table.get(tok) }.copied(), Ok(v));
        }
        // Slots freed by a thread that then exits are reused before fresh ones.
        let fresh_before = table.fresh.load(Ordering::Relaxed);
        let (gone, kept) = live.split_at(100);
        let freed: HashSet<u32> = gone.iter().map(|&(tok, _)| decode(tok).0).collect();
        let gone = gone.to_vec();
        let t = table.clone();
        std::thread::spawn(move || {
            for (tok, v) in gone {
                assert_eq!(t.remove(tok), Ok(v));
            }
        })
        .join()
        .unwrap();
        let again: Vec<u64> = (0..100).map(|i| table.insert(i).unwrap()).collect();
        assert_eq!(table.fresh.load(Ordering::Relaxed), fresh_before);
        let reused: HashSet<u32> = again.iter().map(|&tok| decode(tok).0).collect();
        assert_eq!(reused, freed);
        for t in again {
            assert!(table.remove(t).is_ok());
        }
        // Each thread keeps two of every three inserts; 100 of them went above.
        assert_eq!(kept.len() as u64, 4 * per_thread * 2 / 3 - 100);
    }

    #[test]
    fn dropping_the_table_drops_live_values() {
        let marker = Arc::new(());
        let table = HandleTable::new(Tag::Test);
        for _ in 0..300 {
            table.insert(marker.clone()).unwrap();
        }
        assert_eq!(Arc::strong_count(&marker), 301);
        let one = table.insert(marker.clone()).unwrap();
        assert_eq!(table.free(one), Ok(()));
        assert_eq!(Arc::strong_count(&marker), 301, "free drops in place");
        drop(table);
        assert_eq!(Arc::strong_count(&marker), 1);
    }
}
