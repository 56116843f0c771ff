//! The library's own calls probed ([`library_scenarios`]): raw memory (carved, released after
//! a stream, read), pools, arenas, rings, pinned buffers, modules, streams and GPU handles.

use vkgdr::cuda_objects::{Module, PinnedBuffer, Stream};
use vkgdr::ring::DeviceRing;
use vkgdr::{Arena, Gpu, Mapping, Pool, PoolConfig};

use super::probe::{Probe, SIZE};
use super::spinner::PTX;
use crate::bench::error::BenchResult;

/// The rows the registry names.
pub mod rows {
    /// `Gpu::alloc` of a whole chunk.
    pub const GPU_ALLOC: &str = "Gpu::alloc";
    /// Its drop.
    pub const RAW_DROP: &str = "RawMemory drop";
    /// A pool's first allocation, which makes its chunk.
    pub const POOL_FIRST_CHUNK: &str = "Pool::alloc 256 B (first chunk)";
    /// A pool allocation with a chunk of its own.
    pub const POOL_OWN_CHUNK: &str = "Pool::alloc 16 MiB (own chunk)";
    /// Its drop.
    pub const BLOCK_DROP_OWN: &str = "Block drop (own chunk)";
    /// `Pool::trim`.
    pub const POOL_TRIM: &str = "Pool::trim";
    /// `Arena::grow`.
    pub const ARENA_GROW: &str = "Arena::grow";
    /// `Arena::shrink`.
    pub const ARENA_SHRINK: &str = "Arena::shrink";
    /// `DeviceRing::new`.
    pub const RING_NEW: &str = "DeviceRing::new 1 MiB";
    /// Its drop.
    pub const RING_DROP: &str = "DeviceRing drop";
    /// `PinnedBuffer::new`.
    pub const PINNED_NEW: &str = "PinnedBuffer::new 2 MiB";
    /// Its drop.
    pub const PINNED_DROP: &str = "PinnedBuffer drop";
    /// `Module::load_ptx`.
    pub const MODULE_LOAD: &str = "Module::load_ptx";
    /// Its drop.
    pub const MODULE_DROP: &str = "Module drop";
    /// `Stream::new`.
    pub const STREAM_NEW: &str = "Stream::new";
    /// Its drop.
    pub const STREAM_DROP: &str = "Stream drop";
    /// `Gpu::memcpy_htod` of 64 KiB.
    pub const MEMCPY_HTOD: &str = "Gpu::memcpy_htod 64 KiB";
}

/// Every library call, made and dropped in turn.
pub(super) fn library_scenarios(p: &mut Probe<'_>, gpu: &Gpu) -> BenchResult<()> {
    let small = p.call("Gpu::alloc 64 KiB (carved)", || gpu.alloc(64 << 10))?;
    p.call("RawMemory drop 64 KiB (carved)", || {
        drop(small);
        Ok(())
    })?;
    let stream = p.spinner.stream.raw() as usize;
    let after = p.call(rows::GPU_ALLOC, || gpu.alloc(SIZE))?;
    p.call("RawMemory::release_after (the kernel's stream)", || {
        // SAFETY: the spinner's live stream, of this GPU.
        unsafe { after.release_after_stream(stream as vkgdr::cuda::CuStream) }
    })?;
    let mem = p.call(rows::GPU_ALLOC, || gpu.alloc(SIZE))?;
    let mut buf = vec![0u8; 1 << 20];
    p.call("RawMemory::read 1 MiB (copy engine)", || {
        mem.read(0, &mut buf)
    })?;
    p.call(rows::RAW_DROP, || {
        drop(mem);
        Ok(())
    })?;

    let pool = p.call("Pool::new", || {
        Pool::new(gpu.clone(), PoolConfig::default())
    })?;
    let small = p.call(rows::POOL_FIRST_CHUNK, || pool.alloc(256, 64))?;
    let big = p.call(rows::POOL_OWN_CHUNK, || pool.alloc(16 << 20, 256))?;
    p.call(rows::BLOCK_DROP_OWN, || {
        drop(big);
        Ok(())
    })?;
    p.call("Block drop (256 B)", || {
        drop(small);
        Ok(())
    })?;
    p.call(rows::POOL_TRIM, || {
        pool.trim();
        Ok(())
    })?;
    p.call("Pool drop", || {
        drop(pool);
        Ok(())
    })?;

    let mut arena = p.call("Arena::new (64 MiB reserved)", || {
        Arena::new(gpu, 64 << 20, SIZE)
    })?;
    p.call(rows::ARENA_GROW, || arena.grow())?;
    p.call(rows::ARENA_SHRINK, || arena.shrink(1))?;
    p.call("Arena drop", || {
        drop(arena);
        Ok(())
    })?;

    let ring = p.call(rows::RING_NEW, || DeviceRing::new(gpu, 1 << 20))?;
    p.call(rows::RING_DROP, || {
        drop(ring);
        Ok(())
    })?;
    let pinned = p.call(rows::PINNED_NEW, || PinnedBuffer::new(gpu, SIZE as usize))?;
    p.call(rows::PINNED_DROP, || {
        drop(pinned);
        Ok(())
    })?;
    let module = p.call(rows::MODULE_LOAD, || Module::load_ptx(gpu, PTX))?;
    p.call(rows::MODULE_DROP, || {
        drop(module);
        Ok(())
    })?;
    let stream = p.call(rows::STREAM_NEW, || Stream::new(gpu))?;
    p.call(rows::STREAM_DROP, || {
        drop(stream);
        Ok(())
    })?;
    let ordinal = crate::bench::measure::device_ordinal()?;
    let other = p.call("Gpu::open (another handle)", || Gpu::open(ordinal))?;
    p.call("Gpu drop (another handle)", || {
        drop(other);
        Ok(())
    })?;
    let scratch = vec![7u8; 64 << 10];
    let target = gpu.alloc(SIZE)?;
    p.call(rows::MEMCPY_HTOD, || {
        // SAFETY: the target is a live allocation of SIZE bytes.
        unsafe { gpu.memcpy_htod(target.device_ptr(), &scratch) }
    })?;
    Ok(())
}
