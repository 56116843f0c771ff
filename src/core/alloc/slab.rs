//! Size classes for small allocations: slab pages carved from the TLSF, cut into equal objects.
//!
//! Each page has a free bitmap (at most 4096 objects, so 64 words) plus one summary word whose bit
//! `w` says word `w` still has a free object, which makes taking an object two `trailing_zeros`.
//! Pages with at least one free object sit on their class's doubly linked partial list; a page that
//! was full and gets a free slot goes to the head (nearly full pages are filled first, emptier ones
//! get a chance to drain and go back to the TLSF). One fully free page per class is kept, at the
//! tail, so alloc/free ping-pong on an otherwise empty class does not hit the TLSF every time.

use std::sync::Arc;

use super::NIL;

/// Most objects in one page (64 bitmap words under one summary word).
const MAX_OBJECTS: u64 = 4096;

/// One size class.
#[derive(Clone, Debug)]
pub(crate) struct SlabClass {
    /// Object size in bytes.
    pub(crate) size: u64,
    /// Natural alignment of the objects: the largest power of two dividing `size`.
    pub(crate) align: u64,
    /// Objects per page.
    capacity: u32,
    /// Partial list (pages with a free object).
    head: u32,
    tail: u32,
    /// The cached fully free page (at the list's tail), or `NIL`.
    empty: u32,
    /// Pages owned by the class.
    pub(crate) pages: u32,
    /// Objects handed out.
    pub(crate) in_use: u64,
}

/// One slab page.
#[derive(Clone, Debug)]
struct Page {
    offset: u64,
    /// The TLSF node holding the page.
    block: u32,
    chunk: u32,
    class: u32,
    free: u32,
    /// Bumped on every reuse of the slot, so a handle from an earlier page cannot match.
    generation: u32,
    live: bool,
    prev: u32,
    /// Partial-list link; the vacant-slot link when `!live`.
    next: u32,
    summary: u64,
}

/// An object handed out by [`Slabs`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlabObject {
    pub(crate) page: u32,
    pub(crate) generation: u32,
    pub(crate) slot: u32,
    pub(crate) chunk: u32,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// What freeing an object did to its page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlabFree {
    /// The page stays (still used, or cached as the class's empty page).
    Kept,
    /// The page became empty and is dropped: the caller frees this TLSF block.
    Release(u32),
}

/// A page as seen by the consistency check.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageInfo {
    pub(crate) block: u32,
    pub(crate) chunk: u32,
    pub(crate) offset: u64,
    pub(crate) used: u64,
}

/// All classes and their pages.
pub(crate) struct Slabs {
    classes: Vec<SlabClass>,
    /// `lookup[ceil(size / quantum)]` = first class at least `size`; never changes after
    /// [`new`](Self::new), so the heaps of one pool share it ([`empty_like`](Self::empty_like)).
    lookup: Arc<[u16]>,
    quantum_log2: u32,
    page_size: u64,
    /// Bitmap words per page.
    words: usize,
    pages: Vec<Page>,
    bitmaps: Vec<u64>,
    vacant: u32,
    cached: u32,
}

impl Slabs {
    /// Classes from the smallest quantum up to `max_size`, `per_octave` per power of two.
    ///
    /// The caller validated: `page_size` and `min_align` are powers of two, `min_align <=
    /// page_size`, `max_size <= page_size / 8`, `per_octave` is a power of two in 1..=16.
    pub(crate) fn new(page_size: u64, max_size: u64, min_align: u64, per_octave: u64) -> Self {
        // Smallest object: the granule, or larger when the page would hold over MAX_OBJECTS.
        let quantum = min_align.max(page_size / MAX_OBJECTS).max(1);
        let mut classes = Vec::new();
        let mut c = quantum;
        while c <= max_size {
            classes.push(SlabClass {
                size: c,
                align: 1 << c.trailing_zeros(),
                capacity: (page_size / c) as u32,
                head: NIL,
                tail: NIL,
                empty: NIL,
                pages: 0,
                in_use: 0,
            });
            let octave = 1u64 << (63 - c.leading_zeros());
            c += quantum.max(octave / per_octave);
        }
        let max_size = classes.last().map_or(0, |c| c.size);
        let quantum_log2 = quantum.trailing_zeros();
        let mut lookup = Vec::new();
        if !classes.is_empty() {
            let mut class = 0usize;
            for i in 0..=(max_size >> quantum_log2) {
                while classes[class].size < i << quantum_log2 {
                    class += 1;
                }
                lookup.push(class as u16);
            }
        }
        let words = (page_size / quantum).div_ceil(64) as usize;
        Slabs {
            classes,
            lookup: lookup.into(),
            quantum_log2,
            page_size,
            words,
            pages: Vec::new(),
            bitmaps: Vec::new(),
            vacant: NIL,
            cached: 0,
        }
    }

    /// Classes of the same sizes with no page, sharing this one's lookup table: what
    /// [`new`](Self::new) with the same arguments builds, without building the table again.
    pub(crate) fn empty_like(&self) -> Self {
        Slabs {
            classes: self
                .classes
                .iter()
                .map(|c| SlabClass {
                    head: NIL,
                    tail: NIL,
                    empty: NIL,
                    pages: 0,
                    in_use: 0,
                    ..c.clone()
                })
                .collect(),
            lookup: Arc::clone(&self.lookup),
            quantum_log2: self.quantum_log2,
            page_size: self.page_size,
            words: self.words,
            pages: Vec::new(),
            bitmaps: Vec::new(),
            vacant: NIL,
            cached: 0,
        }
    }

    /// The classes.
    pub(crate) fn classes(&self) -> &[SlabClass] {
        &self.classes
    }

    /// Number of pages owned, over all classes.
    pub(crate) fn page_count(&self) -> u64 {
        self.classes.iter().map(|c| u64::from(c.pages)).sum()
    }

    /// Number of cached empty pages.
    pub(crate) fn cached_pages(&self) -> u32 {
        self.cached
    }

    /// The smallest class holding `size` bytes whose natural alignment is at least `align`.
    /// `size` is at most [`MAX_CHUNK_SIZE`](super::MAX_CHUNK_SIZE), as every request the heap
    /// checked.
    #[inline]
    pub(crate) fn class_for(&self, size: u64, align: u64) -> Option<u32> {
        debug_assert!(size <= super::MAX_CHUNK_SIZE);
        let quantum = 1u64 << self.quantum_log2;
        // `lookup` has an entry for every multiple of the quantum up to `max_size` (itself one):
        // a larger size finds none, as every size does when there are no classes. One bounds
        // check in place of a comparison with `max_size` and the table's own.
        let start = *self
            .lookup
            .get(((size + quantum - 1) >> self.quantum_log2) as usize)?;
        // Every class is a multiple of the quantum, so aligned to it: the usual request, aligned
        // to the granule, needs no search.
        if align <= quantum {
            return Some(u32::from(start));
        }
        // At most one octave of steps: the power-of-two class of the octave is aligned enough.
        (usize::from(start)..self.classes.len())
            .find(|&c| self.classes[c].align >= align)
            .map(|c| c as u32)
    }

    /// Takes an object from the class's first partial page, or `None` when it has none.
    #[inline(always)]
    pub(crate) fn alloc(&mut self, class: u32) -> Option<SlabObject> {
        let page = self.classes[class as usize].head;
        if page == NIL {
            return None;
        }
        Some(self.take(class, page))
    }

    /// Takes the first free object of `page` (which has one).
    #[inline(always)]
    fn take(&mut self, class: u32, page: u32) -> SlabObject {
        let cls = &mut self.classes[class as usize];
        if cls.empty == page {
            cls.empty = NIL;
            self.cached -= 1;
        }
        cls.in_use += 1;
        let (size, class_head) = (cls.size, cls.head);
        let p = &mut self.pages[page as usize];
        let w = p.summary.trailing_zeros() as usize;
        let word = &mut self.bitmaps[page as usize * self.words + w];
        let bit = word.trailing_zeros();
        *word &= *word - 1;
        if *word == 0 {
            p.summary &= !(1u64 << w);
        }
        p.free -= 1;
        let slot = (w as u32) * 64 + bit;
        let object = SlabObject {
            page,
            generation: p.generation,
            slot,
            chunk: p.chunk,
            offset: p.offset + u64::from(slot) * size,
            size,
        };
        if p.free == 0 {
            debug_assert_eq!(class_head, page);
            self.unlink(class, page);
        }
        object
    }

    /// Files a fresh page (TLSF node `block` at `chunk`/`offset`) for `class` and takes its first
    /// object; `None` (nothing changed) when the page table is exhausted.
    pub(crate) fn add_page(
        &mut self,
        class: u32,
        block: u32,
        chunk: u32,
        offset: u64,
    ) -> Option<SlabObject> {
        let capacity = self.classes[class as usize].capacity;
        let page = if self.vacant != NIL {
            let page = self.vacant;
            self.vacant = self.pages[page as usize].next;
            page
        } else {
            if self.pages.len() + 1 >= NIL as usize {
                return None;
            }
            self.pages.push(Page {
                offset: 0,
                block: NIL,
                chunk: NIL,
                class: 0,
                free: 0,
                generation: 0,
                live: false,
                prev: NIL,
                next: NIL,
                summary: 0,
            });
            self.bitmaps.resize(self.bitmaps.len() + self.words, 0);
            (self.pages.len() - 1) as u32
        };
        let full_words = (capacity / 64) as usize;
        let rest = capacity % 64;
        let bits = &mut self.bitmaps[page as usize * self.words..][..self.words];
        bits.fill(0);
        bits[..full_words].fill(!0);
        if rest != 0 {
            bits[full_words] = (1u64 << rest) - 1;
        }
        let used_words = capacity.div_ceil(64);
        let p = &mut self.pages[page as usize];
        *p = Page {
            offset,
            block,
            chunk,
            class,
            free: capacity,
            generation: p.generation.wrapping_add(1),
            live: true,
            prev: NIL,
            next: NIL,
            summary: if used_words == 64 {
                !0
            } else {
                (1u64 << used_words) - 1
            },
        };
        self.classes[class as usize].pages += 1;
        self.push_head(class, page);
        Some(self.take(class, page))
    }

    /// Returns an object. `Err(())` (nothing changed) when the handle does not name a live object.
    #[inline(always)]
    pub(crate) fn free(
        &mut self,
        page: u32,
        generation: u32,
        slot: u32,
        chunk: u32,
        offset: u64,
    ) -> Result<SlabFree, ()> {
        let p = self.pages.get(page as usize).ok_or(())?;
        if !p.live || p.generation != generation || p.chunk != chunk {
            return Err(());
        }
        let class = p.class;
        let cls = &self.classes[class as usize];
        if slot >= cls.capacity || offset != p.offset + u64::from(slot) * cls.size {
            return Err(());
        }
        let w = (slot / 64) as usize;
        let mask = 1u64 << (slot % 64);
        let word = &mut self.bitmaps[page as usize * self.words + w];
        if *word & mask != 0 {
            return Err(());
        }
        *word |= mask;
        let capacity = cls.capacity;
        let p = &mut self.pages[page as usize];
        p.summary |= 1u64 << w;
        p.free += 1;
        let free = p.free;
        self.classes[class as usize].in_use -= 1;
        if free == 1 {
            self.push_head(class, page);
        }
        if free < capacity {
            return Ok(SlabFree::Kept);
        }
        if self.classes[class as usize].empty == NIL {
            self.unlink(class, page);
            self.push_tail(class, page);
            self.classes[class as usize].empty = page;
            self.cached += 1;
            return Ok(SlabFree::Kept);
        }
        Ok(SlabFree::Release(self.drop_page(class, page)))
    }

    /// Drops every cached empty page for which `keep(chunk)` is false, handing each TLSF block to
    /// `release`.
    pub(crate) fn release_cached(
        &mut self,
        mut keep: impl FnMut(u32) -> bool,
        mut release: impl FnMut(u32),
    ) {
        if self.cached == 0 {
            return;
        }
        for class in 0..self.classes.len() as u32 {
            let page = self.classes[class as usize].empty;
            if page != NIL && !keep(self.pages[page as usize].chunk) {
                self.classes[class as usize].empty = NIL;
                self.cached -= 1;
                release(self.drop_page(class, page));
            }
        }
    }

    /// Unlinks and vacates a page; returns its TLSF block.
    fn drop_page(&mut self, class: u32, page: u32) -> u32 {
        self.unlink(class, page);
        self.classes[class as usize].pages -= 1;
        let vacant = self.vacant;
        let p = &mut self.pages[page as usize];
        p.live = false;
        p.next = vacant;
        self.vacant = page;
        p.block
    }

    fn push_head(&mut self, class: u32, page: u32) {
        let head = self.classes[class as usize].head;
        let p = &mut self.pages[page as usize];
        p.prev = NIL;
        p.next = head;
        if head != NIL {
            self.pages[head as usize].prev = page;
        } else {
            self.classes[class as usize].tail = page;
        }
        self.classes[class as usize].head = page;
    }

    fn push_tail(&mut self, class: u32, page: u32) {
        let tail = self.classes[class as usize].tail;
        let p = &mut self.pages[page as usize];
        p.prev = tail;
        p.next = NIL;
        if tail != NIL {
            self.pages[tail as usize].next = page;
        } else {
            self.classes[class as usize].head = page;
        }
        self.classes[class as usize].tail = page;
    }

    fn unlink(&mut self, class: u32, page: u32) {
        let (prev, next) = {
            let p = &self.pages[page as usize];
            (p.prev, p.next)
        };
        let cls = &mut self.classes[class as usize];
        if prev != NIL {
            self.pages[prev as usize].next = next;
        } else {
            cls.head = next;
        }
        if next != NIL {
            self.pages[next as usize].prev = prev;
        } else {
            cls.tail = prev;
        }
        let p = &mut self.pages[page as usize];
        p.prev = NIL;
        p.next = NIL;
    }

    /// Checks bitmaps, counters and lists; returns every live page.
    pub(crate) fn check(&self) -> Result<Vec<PageInfo>, String> {
        let mut out = Vec::new();
        let mut pages_per_class = vec![0u32; self.classes.len()];
        let mut used_per_class = vec![0u64; self.classes.len()];
        for (index, p) in self.pages.iter().enumerate() {
            if !p.live {
                continue;
            }
            let cls = self
                .classes
                .get(p.class as usize)
                .ok_or_else(|| format!("page {index}: bad class"))?;
            let bits = &self.bitmaps[index * self.words..][..self.words];
            let mut free = 0;
            for (w, &word) in bits.iter().enumerate() {
                let valid = (u64::from(cls.capacity))
                    .saturating_sub(w as u64 * 64)
                    .min(64);
                let mask = if valid == 64 { !0 } else { (1u64 << valid) - 1 };
                if word & !mask != 0 {
                    return Err(format!("page {index}: free bit beyond capacity"));
                }
                if (word != 0) != (p.summary & (1 << w) != 0) {
                    return Err(format!("page {index}: summary bit {w} wrong"));
                }
                free += word.count_ones();
            }
            if free != p.free || free > cls.capacity {
                return Err(format!("page {index}: free {} vs bitmap {free}", p.free));
            }
            if p.offset % self.page_size != 0 {
                return Err(format!("page {index}: misaligned offset {}", p.offset));
            }
            pages_per_class[p.class as usize] += 1;
            used_per_class[p.class as usize] += u64::from(cls.capacity - free);
            out.push(PageInfo {
                block: p.block,
                chunk: p.chunk,
                offset: p.offset,
                used: u64::from(cls.capacity - free),
            });
        }
        let mut cached = 0;
        for (c, cls) in self.classes.iter().enumerate() {
            if cls.pages != pages_per_class[c] || cls.in_use != used_per_class[c] {
                return Err(format!("class {c}: counters disagree with pages"));
            }
            let mut prev = NIL;
            let mut page = cls.head;
            let mut listed = 0;
            let mut empty_pages = 0;
            while page != NIL {
                let p = &self.pages[page as usize];
                if !p.live || p.class as usize != c || p.prev != prev || p.free == 0 {
                    return Err(format!("class {c}: page {page} mislinked"));
                }
                if p.free == cls.capacity {
                    empty_pages += 1;
                    if page != cls.empty || p.next != NIL {
                        return Err(format!("class {c}: stray empty page {page}"));
                    }
                }
                listed += 1;
                if listed > cls.pages {
                    return Err(format!("class {c}: partial list cycle"));
                }
                prev = page;
                page = p.next;
            }
            if prev != cls.tail {
                return Err(format!("class {c}: tail mislinked"));
            }
            let partial = self
                .pages
                .iter()
                .filter(|p| p.live && p.class as usize == c && p.free > 0)
                .count() as u32;
            if listed != partial || (cls.empty != NIL) != (empty_pages == 1) {
                return Err(format!("class {c}: partial list incomplete"));
            }
            cached += empty_pages;
        }
        if cached != self.cached {
            return Err("cached page count wrong".into());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_slabs() -> Slabs {
        Slabs::new(64 << 10, 4096, 16, 4)
    }

    #[test]
    fn classes_follow_quarter_octaves() {
        let s = default_slabs();
        let sizes: Vec<u64> = s.classes().iter().map(|c| c.size).collect();
        assert_eq!(
            &sizes[..16],
            &[16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]
        );
        assert_eq!(*sizes.last().unwrap(), 4096);
        for c in s.classes() {
            assert_eq!(c.size % c.align, 0);
            assert!(c.align.is_power_of_two());
        }
    }

    #[test]
    fn class_for_picks_smallest_fitting_aligned_class() {
        let s = default_slabs();
        let size_of = |size, align| {
            s.class_for(size, align)
                .map(|c| s.classes()[c as usize].size)
        };
        assert_eq!(size_of(1, 1), Some(16));
        assert_eq!(size_of(16, 16), Some(16));
        assert_eq!(size_of(17, 16), Some(32));
        assert_eq!(size_of(257, 16), Some(320));
        assert_eq!(size_of(257, 128), Some(384));
        assert_eq!(size_of(257, 512), Some(512));
        assert_eq!(size_of(4096, 4096), Some(4096));
        assert_eq!(size_of(16, 8192), None);
        assert_eq!(size_of(4097, 16), None);
    }

    #[test]
    fn large_pages_raise_the_quantum() {
        // 1 MiB pages: at most 4096 objects, so the smallest class is 256 bytes.
        let s = Slabs::new(1 << 20, 64 << 10, 16, 4);
        assert_eq!(s.classes()[0].size, 256);
        assert_eq!(s.words, 64);
    }

    #[test]
    fn fill_drain_and_cache() {
        let mut s = default_slabs();
        let class = s.class_for(4096, 16).unwrap();
        let first = s.add_page(class, 7, 0, 0).unwrap();
        let mut objects = vec![first];
        while let Some(o) = s.alloc(class) {
            objects.push(o);
        }
        assert_eq!(objects.len(), 16);
        let mut offsets: Vec<u64> = objects.iter().map(|o| o.offset).collect();
        offsets.sort_unstable();
        assert_eq!(offsets, (0..16).map(|i| i * 4096).collect::<Vec<_>>());
        s.check().unwrap();
        for o in &objects {
            let r = s
                .free(o.page, o.generation, o.slot, o.chunk, o.offset)
                .unwrap();
            assert_eq!(r, SlabFree::Kept);
        }
        // The empty page is cached, not released.
        assert_eq!(s.cached_pages(), 1);
        s.check().unwrap();
        // Freeing again is refused.
        let o = objects[0];
        assert!(s
            .free(o.page, o.generation, o.slot, o.chunk, o.offset)
            .is_err());
        let mut released = Vec::new();
        s.release_cached(|_| false, |b| released.push(b));
        assert_eq!(released, vec![7]);
        assert_eq!(s.page_count(), 0);
        // A handle into the dropped page is refused.
        assert!(s
            .free(o.page, o.generation, o.slot, o.chunk, o.offset)
            .is_err());
        s.check().unwrap();
    }

    #[test]
    fn second_empty_page_is_released() {
        let mut s = default_slabs();
        let class = s.class_for(4096, 16).unwrap();
        let a = s.add_page(class, 1, 0, 0).unwrap();
        let mut rest = Vec::new();
        while let Some(o) = s.alloc(class) {
            rest.push(o);
        }
        let b = s.add_page(class, 2, 0, 64 << 10).unwrap();
        assert_eq!(
            s.free(b.page, b.generation, b.slot, b.chunk, b.offset),
            Ok(SlabFree::Kept)
        );
        let results: Vec<SlabFree> = std::iter::once(a)
            .chain(rest)
            .map(|o| {
                s.free(o.page, o.generation, o.slot, o.chunk, o.offset)
                    .unwrap()
            })
            .collect();
        // Page `b` is already the cached empty page, so page `a` goes back on its last free.
        assert_eq!(results.last(), Some(&SlabFree::Release(1)));
        assert!(results[..15].iter().all(|r| *r == SlabFree::Kept));
        assert_eq!(s.page_count(), 1);
        assert_eq!(s.cached_pages(), 1);
        s.check().unwrap();
    }
}
