//! Two-level segregated fit (TLSF) over byte ranges of several chunks.
//!
//! One free-list structure serves every chunk; chunk boundaries hold because physical-neighbour
//! links never cross a chunk (a chunk's first block has no predecessor, its last no successor), so
//! coalescing stays inside the chunk. Block metadata lives in a host-side node table with a free
//! list of vacant nodes; nothing is ever written into the memory being managed.
//!
//! All sizes and offsets are multiples of the granule (`1 << gran_log2`). Free blocks are filed in
//! 64 first-level classes (powers of two) × 16 second-level subdivisions; two bitmaps make finding a
//! non-empty class O(1).

use super::NIL;

/// log2 of the number of second-level subdivisions per power of two.
const SL_LOG2: u32 = 4;
/// Second-level subdivisions per first-level class.
const SL_COUNT: usize = 1 << SL_LOG2;
/// First-level classes (one per bit of a `u64` size in granules).
const FL_COUNT: usize = 64;
/// How many free blocks the slow path inspects once the good-fit search fails. Bounded so that a
/// nearly full heap cannot make an allocation linear in the number of free blocks.
const FALLBACK_WALK: usize = 64;

/// What a block node currently describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockState {
    /// A free range, filed in a segregated list.
    Free,
    /// Handed to a caller as a block allocation.
    User,
    /// Holds a slab page.
    SlabPage,
    /// Node not describing any range; linked in the vacant-node list.
    Vacant,
}

/// One range of a chunk (or a vacant node).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) chunk: u32,
    /// Bumped each time the node is handed out, so a stale handle cannot match a reused node.
    pub(crate) generation: u32,
    pub(crate) state: BlockState,
    prev_phys: u32,
    next_phys: u32,
    /// Segregated-list links while `Free`; `next_free` doubles as the vacant-list link.
    prev_free: u32,
    next_free: u32,
}

/// The TLSF index.
pub(crate) struct Tlsf {
    blocks: Vec<Block>,
    vacant_head: u32,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    heads: Box<[[u32; SL_COUNT]; FL_COUNT]>,
    gran_log2: u32,
    free_bytes: u64,
    free_count: u64,
}

/// Rounds `x` up to a multiple of the power of two `align` (no overflow for our bounded inputs).
#[inline]
pub(crate) fn align_up(x: u64, align: u64) -> u64 {
    (x + align - 1) & !(align - 1)
}

/// The class holding a free block of `units` granules (`units > 0`).
#[inline]
fn mapping(units: u64) -> (usize, usize) {
    if units < SL_COUNT as u64 {
        (0, units as usize)
    } else {
        let f = 63 - units.leading_zeros();
        let sl = ((units >> (f - SL_LOG2)) as usize) ^ SL_COUNT;
        ((f - SL_LOG2 + 1) as usize, sl)
    }
}

/// The first class whose every block holds at least `units` granules.
#[inline]
fn mapping_search(units: u64) -> (usize, usize) {
    if units < SL_COUNT as u64 {
        (0, units as usize)
    } else {
        let f = 63 - units.leading_zeros();
        mapping(units + (1u64 << (f - SL_LOG2)) - 1)
    }
}

impl Tlsf {
    /// An empty index for granule `1 << gran_log2`.
    pub(crate) fn new(gran_log2: u32) -> Self {
        Tlsf {
            blocks: Vec::new(),
            vacant_head: NIL,
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: Box::new([[NIL; SL_COUNT]; FL_COUNT]),
            gran_log2,
            free_bytes: 0,
            free_count: 0,
        }
    }

    /// The node at `index`, if it exists.
    #[inline]
    pub(crate) fn block(&self, index: u32) -> Option<&Block> {
        self.blocks.get(index as usize)
    }

    /// Bytes in free blocks.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of free blocks.
    pub(crate) fn free_count(&self) -> u64 {
        self.free_count
    }

    /// Whether `n` more nodes can be created without exhausting the `u32` index space
    /// (conservative: ignores vacant nodes, a limit of ~4 billion blocks is never near in practice).
    fn can_make_nodes(&self, n: usize) -> bool {
        self.blocks.len() + n < NIL as usize
    }

    fn new_node(&mut self, mut block: Block) -> u32 {
        if self.vacant_head != NIL {
            let index = self.vacant_head;
            let slot = &mut self.blocks[index as usize];
            self.vacant_head = slot.next_free;
            block.generation = slot.generation;
            *slot = block;
            index
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as u32
        }
    }

    fn vacate(&mut self, index: u32) {
        let head = self.vacant_head;
        let b = &mut self.blocks[index as usize];
        b.state = BlockState::Vacant;
        b.prev_phys = NIL;
        b.next_phys = NIL;
        b.prev_free = NIL;
        b.next_free = head;
        self.vacant_head = index;
    }

    fn insert_free(&mut self, index: u32) {
        let size = self.blocks[index as usize].size;
        let (fl, sl) = mapping(size >> self.gran_log2);
        let head = self.heads[fl][sl];
        {
            let b = &mut self.blocks[index as usize];
            b.state = BlockState::Free;
            b.prev_free = NIL;
            b.next_free = head;
        }
        if head != NIL {
            self.blocks[head as usize].prev_free = index;
        }
        self.heads[fl][sl] = index;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
        self.free_bytes += size;
        self.free_count += 1;
    }

    fn remove_free(&mut self, index: u32) {
        let Block {
            size,
            prev_free,
            next_free,
            ..
        } = self.blocks[index as usize];
        let (fl, sl) = mapping(size >> self.gran_log2);
        if prev_free != NIL {
            self.blocks[prev_free as usize].next_free = next_free;
        } else {
            self.heads[fl][sl] = next_free;
            if next_free == NIL {
                self.sl_bitmap[fl] &= !(1 << sl);
                if self.sl_bitmap[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if next_free != NIL {
            self.blocks[next_free as usize].prev_free = prev_free;
        }
        self.free_bytes -= size;
        self.free_count -= 1;
    }

    /// Files a whole chunk of `size` bytes as one free block; returns its node, or `None` when the
    /// node table is exhausted.
    pub(crate) fn add_region(&mut self, chunk: u32, size: u64) -> Option<u32> {
        if !self.can_make_nodes(1) {
            return None;
        }
        let index = self.new_node(Block {
            offset: 0,
            size,
            chunk,
            generation: 0,
            state: BlockState::Free,
            prev_phys: NIL,
            next_phys: NIL,
            prev_free: NIL,
            next_free: NIL,
        });
        // Inserted at the head of its class, so the slow path sees it first.
        self.insert_free(index);
        Some(index)
    }

    /// Whether `index` is a free block spanning a whole chunk of `size` bytes.
    pub(crate) fn is_whole_free_region(&self, index: u32, size: u64) -> bool {
        self.block(index).is_some_and(|b| {
            b.state == BlockState::Free
                && b.offset == 0
                && b.size == size
                && b.prev_phys == NIL
                && b.next_phys == NIL
        })
    }

    /// Drops a whole free chunk (checked by [`Tlsf::is_whole_free_region`]) from the index.
    pub(crate) fn remove_region(&mut self, index: u32) {
        self.remove_free(index);
        self.vacate(index);
    }

    /// The first non-empty class at or above `(fl, sl)`.
    #[inline]
    fn next_class(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        if fl >= FL_COUNT {
            return None;
        }
        let sl_map = self.sl_bitmap[fl] & (!0u32 << sl);
        if sl_map != 0 {
            return Some((fl, sl_map.trailing_zeros() as usize));
        }
        let fl_map = if fl + 1 < FL_COUNT {
            self.fl_bitmap & (!0u64 << (fl + 1))
        } else {
            0
        };
        if fl_map == 0 {
            return None;
        }
        let fl = fl_map.trailing_zeros() as usize;
        Some((fl, self.sl_bitmap[fl].trailing_zeros() as usize))
    }

    /// Slow path, once the good-fit search found nothing: the classes below the rounded-up search
    /// class may still hold a fitting block (one exactly the requested size, e.g. a fresh chunk, or
    /// one whose offset needs less padding than the worst case). Scans them upward from the class
    /// of `size`, inspecting at most `FALLBACK_WALK` blocks.
    fn find_slow(&self, size: u64, align: u64) -> u32 {
        let (mut fl, mut sl) = mapping(size >> self.gran_log2);
        let mut budget = FALLBACK_WALK;
        while budget > 0 {
            let Some((f, s)) = self.next_class(fl, sl) else {
                return NIL;
            };
            let mut index = self.heads[f][s];
            while index != NIL && budget > 0 {
                let b = &self.blocks[index as usize];
                let pad = align_up(b.offset, align) - b.offset;
                if b.size >= size && b.size - size >= pad {
                    return index;
                }
                index = b.next_free;
                budget -= 1;
            }
            (fl, sl) = if s + 1 < SL_COUNT {
                (f, s + 1)
            } else {
                (f + 1, 0)
            };
        }
        NIL
    }

    /// Allocates `size` bytes aligned to `align` and marks the block `state`.
    ///
    /// `size` is a non-zero multiple of the granule, `align` a power of two at least the granule,
    /// both at most 2^62. Returns the node, or `None` when no free block was found.
    pub(crate) fn alloc(&mut self, size: u64, align: u64, state: BlockState) -> Option<u32> {
        let gran = 1u64 << self.gran_log2;
        // Offsets are granule multiples, so the leading padding is at most `align - gran`.
        let search = if align > gran {
            size + align - gran
        } else {
            size
        };
        let (fl, sl) = mapping_search(search >> self.gran_log2);
        let mut found = match self.next_class(fl, sl) {
            Some((fl, sl)) => self.heads[fl][sl],
            None => NIL,
        };
        if found == NIL {
            found = self.find_slow(size, align);
            if found == NIL {
                return None;
            }
        }
        // Up to two new nodes: the leading padding and the trailing remainder.
        if !self.can_make_nodes(2) {
            return None;
        }
        self.remove_free(found);
        let Block {
            offset,
            size: block_size,
            chunk,
            next_phys,
            ..
        } = self.blocks[found as usize];
        let aligned = align_up(offset, align);
        let mut cur = found;
        if aligned > offset {
            // The found node keeps the padding, so a chunk's first node never changes.
            let pad = aligned - offset;
            let rest = self.new_node(Block {
                offset: aligned,
                size: block_size - pad,
                chunk,
                generation: 0,
                state: BlockState::Free,
                prev_phys: found,
                next_phys,
                prev_free: NIL,
                next_free: NIL,
            });
            if next_phys != NIL {
                self.blocks[next_phys as usize].prev_phys = rest;
            }
            let b = &mut self.blocks[found as usize];
            b.size = pad;
            b.next_phys = rest;
            self.insert_free(found);
            cur = rest;
        }
        let cur_size = self.blocks[cur as usize].size;
        if cur_size > size {
            let cur_next = self.blocks[cur as usize].next_phys;
            let tail = self.new_node(Block {
                offset: aligned + size,
                size: cur_size - size,
                chunk,
                generation: 0,
                state: BlockState::Free,
                prev_phys: cur,
                next_phys: cur_next,
                prev_free: NIL,
                next_free: NIL,
            });
            if cur_next != NIL {
                self.blocks[cur_next as usize].prev_phys = tail;
            }
            let b = &mut self.blocks[cur as usize];
            b.size = size;
            b.next_phys = tail;
            self.insert_free(tail);
        }
        let b = &mut self.blocks[cur as usize];
        b.state = state;
        b.generation = b.generation.wrapping_add(1);
        Some(cur)
    }

    /// Frees an allocated block (caller checked it is `User` or `SlabPage`), merging it with free
    /// physical neighbours.
    pub(crate) fn free(&mut self, index: u32) {
        let mut index = index;
        let Block {
            prev_phys,
            next_phys,
            ..
        } = self.blocks[index as usize];
        if prev_phys != NIL && self.blocks[prev_phys as usize].state == BlockState::Free {
            self.remove_free(prev_phys);
            let size = self.blocks[index as usize].size;
            let p = &mut self.blocks[prev_phys as usize];
            p.size += size;
            p.next_phys = next_phys;
            if next_phys != NIL {
                self.blocks[next_phys as usize].prev_phys = prev_phys;
            }
            self.vacate(index);
            index = prev_phys;
        }
        if next_phys != NIL && self.blocks[next_phys as usize].state == BlockState::Free {
            self.remove_free(next_phys);
            let Block {
                size: next_size,
                next_phys: after,
                ..
            } = self.blocks[next_phys as usize];
            let b = &mut self.blocks[index as usize];
            b.size += next_size;
            b.next_phys = after;
            if after != NIL {
                self.blocks[after as usize].prev_phys = index;
            }
            self.vacate(next_phys);
        }
        self.insert_free(index);
    }

    /// Size of the largest free block (walks one class list).
    pub(crate) fn largest_free(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let mut index = self.heads[fl][sl];
        let mut largest = 0;
        while index != NIL {
            let b = &self.blocks[index as usize];
            largest = largest.max(b.size);
            index = b.next_free;
        }
        largest
    }

    /// Checks every structural invariant of the chunk starting at node `first` of `size` bytes;
    /// calls `visit` for each allocated block. O(blocks in the chunk).
    pub(crate) fn check_region(
        &self,
        chunk: u32,
        first: u32,
        size: u64,
        mut visit: impl FnMut(u32, &Block),
    ) -> Result<(), String> {
        let mut index = first;
        let mut prev = NIL;
        let mut expected_offset = 0;
        let mut prev_free = false;
        let mut steps = 0usize;
        while index != NIL {
            let b = self
                .block(index)
                .ok_or_else(|| format!("chunk {chunk}: node {index} out of range"))?;
            steps += 1;
            if steps > self.blocks.len() {
                return Err(format!("chunk {chunk}: physical list has a cycle"));
            }
            if b.chunk != chunk || b.prev_phys != prev || b.offset != expected_offset {
                return Err(format!("chunk {chunk}: node {index} mislinked: {b:?}"));
            }
            let gran = 1u64 << self.gran_log2;
            if b.size == 0 || b.size % gran != 0 {
                return Err(format!("chunk {chunk}: node {index} bad size {}", b.size));
            }
            match b.state {
                BlockState::Free => {
                    if prev_free {
                        return Err(format!("chunk {chunk}: adjacent free blocks at {index}"));
                    }
                    prev_free = true;
                }
                BlockState::User | BlockState::SlabPage => {
                    prev_free = false;
                    visit(index, b);
                }
                BlockState::Vacant => return Err(format!("chunk {chunk}: vacant node {index}")),
            }
            expected_offset += b.size;
            prev = index;
            index = b.next_phys;
        }
        if expected_offset != size {
            return Err(format!(
                "chunk {chunk}: blocks cover {expected_offset} of {size} bytes"
            ));
        }
        Ok(())
    }

    /// Checks the segregated lists and bitmaps against the node table.
    pub(crate) fn check_lists(&self) -> Result<(), String> {
        let mut bytes = 0u64;
        let mut count = 0u64;
        for fl in 0..FL_COUNT {
            for sl in 0..SL_COUNT {
                let head = self.heads[fl][sl];
                let bit = self.sl_bitmap[fl] & (1 << sl) != 0;
                if bit != (head != NIL) {
                    return Err(format!("class ({fl},{sl}): bitmap disagrees with list"));
                }
                let mut prev = NIL;
                let mut index = head;
                while index != NIL {
                    let b = self
                        .block(index)
                        .ok_or_else(|| format!("free list node {index} out of range"))?;
                    if b.state != BlockState::Free || b.prev_free != prev {
                        return Err(format!("free list node {index} mislinked: {b:?}"));
                    }
                    if mapping(b.size >> self.gran_log2) != (fl, sl) {
                        return Err(format!("node {index} filed in wrong class ({fl},{sl})"));
                    }
                    bytes += b.size;
                    count += 1;
                    if count > self.blocks.len() as u64 {
                        return Err("free list has a cycle".into());
                    }
                    prev = index;
                    index = b.next_free;
                }
            }
            if (self.fl_bitmap & (1 << fl) != 0) != (self.sl_bitmap[fl] != 0) {
                return Err(format!("first-level bit {fl} disagrees with second level"));
            }
        }
        let free_nodes = self
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Free)
            .count() as u64;
        if bytes != self.free_bytes || count != self.free_count || count != free_nodes {
            return Err(format!(
                "free accounting: lists {bytes} B/{count}, counters {} B/{}, nodes {free_nodes}",
                self.free_bytes, self.free_count
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u32 = 4; // 16-byte granule

    #[test]
    fn mapping_search_never_undershoots() {
        for units in 1..5000u64 {
            let (fl, sl) = mapping_search(units);
            // Smallest size filed in (fl, sl) must be >= units.
            let lower = if fl == 0 {
                sl as u64
            } else {
                let f = fl as u32 + SL_LOG2 - 1;
                (1u64 << f) + ((sl as u64) << (f - SL_LOG2))
            };
            assert!(lower >= units, "units {units} -> ({fl},{sl}) lower {lower}");
            assert_eq!(mapping(lower), (fl, sl));
        }
        assert!(mapping(1 << 60).0 < FL_COUNT);
    }

    #[test]
    fn split_and_coalesce_restore_one_block() {
        let mut t = Tlsf::new(G);
        let first = t.add_region(0, 1 << 20).unwrap();
        let a = t.alloc(64, 16, BlockState::User).unwrap();
        let b = t.alloc(4096, 4096, BlockState::User).unwrap();
        let c = t.alloc(32, 16, BlockState::User).unwrap();
        assert_eq!(t.block(a).unwrap().offset, 0);
        assert_eq!(t.block(b).unwrap().offset % 4096, 0);
        t.check_lists().unwrap();
        t.check_region(0, first, 1 << 20, |_, _| {}).unwrap();
        for x in [b, a, c] {
            t.free(x);
            t.check_lists().unwrap();
            t.check_region(0, first, 1 << 20, |_, _| {}).unwrap();
        }
        assert!(t.is_whole_free_region(first, 1 << 20));
        assert_eq!(t.free_count(), 1);
    }

    #[test]
    fn exact_size_block_is_found_by_slow_path() {
        // 17 * 16 bytes falls mid-class, so the rounded search alone would miss it.
        let mut t = Tlsf::new(G);
        t.add_region(0, 17 * 16).unwrap();
        assert!(t.alloc(17 * 16, 16, BlockState::User).is_some());
        assert_eq!(t.free_bytes(), 0);
    }

    #[test]
    fn aligned_fit_below_the_search_class_is_found() {
        // 64 KiB aligned to 64 KiB searches for ~128 KiB; the 100 KiB chunk still fits it at 0.
        let mut t = Tlsf::new(G);
        t.add_region(0, 100 << 10).unwrap();
        let a = t.alloc(64 << 10, 64 << 10, BlockState::User).unwrap();
        assert_eq!(t.block(a).unwrap().offset, 0);
        // A second one cannot fit: 36 KiB remain.
        assert!(t.alloc(64 << 10, 64 << 10, BlockState::User).is_none());
        t.check_lists().unwrap();
    }

    #[test]
    fn regions_never_merge() {
        let mut t = Tlsf::new(G);
        let r0 = t.add_region(0, 256).unwrap();
        let r1 = t.add_region(1, 256).unwrap();
        let a = t.alloc(256, 16, BlockState::User).unwrap();
        let b = t.alloc(256, 16, BlockState::User).unwrap();
        assert!(t.alloc(16, 16, BlockState::User).is_none());
        t.free(a);
        t.free(b);
        assert!(t.is_whole_free_region(r0, 256));
        assert!(t.is_whole_free_region(r1, 256));
        assert_eq!(t.largest_free(), 256);
    }

    #[test]
    fn nodes_are_recycled() {
        let mut t = Tlsf::new(G);
        t.add_region(0, 1 << 16).unwrap();
        for _ in 0..100 {
            let a = t.alloc(48, 16, BlockState::User).unwrap();
            let b = t.alloc(1024, 256, BlockState::User).unwrap();
            t.free(a);
            t.free(b);
        }
        assert!(t.blocks.len() <= 4, "node table grew to {}", t.blocks.len());
    }
}
