//! The library's own calls probed ([`library_scenarios`]): raw memory (carved, released after
//! a stream, read), pools, arenas, rings, pinned buffers, modules, streams and GPU handles.

use vkgdr::cuda_objects::{Module, PinnedBuffer, Stream};
use vkgdr::ring::DeviceRing;
use vkgdr::{Arena, Gpu, Mapping, Pool, PoolConfig};

use super::probe::{Probe, SIZE};
use super::spinner::PTX;
use crate::bench::error::BenchResult;

/// Every library call, made and dropped in turn.
pub(super) fn library_scenarios(p: &mut Probe<'_>, gpu: &Gpu) -> BenchResult<()> {
    let small = p.call("Gpu::alloc 64 KiB (carved)", || gpu.alloc(64 << 10))?;
    p.call("RawMemory drop 64 KiB (carved)", || {
        drop(small);
        Ok(())
    })?;
    let stream = p.spinner.stream.raw() as usize;
    let after = p.call("Gpu::alloc", || gpu.alloc(SIZE))?;
    p.call("RawMemory::release_after (the kernel's stream)", || {
        // SAFETY: the spinner's live stream, of this GPU.
        unsafe { after.release_after_stream(stream as vkgdr::cuda::CuStream) }
    })?;
    let mem = p.call("Gpu::alloc", || gpu.alloc(SIZE))?;
    let mut buf = vec![0u8; 1 << 20];
    p.call("RawMemory::read 1 MiB (copy engine)", || {
        mem.read(0, &mut buf)
    })?;
    p.call("RawMemory drop", || {
        drop(mem);
        Ok(())
    })?;

    let pool = p.call("Pool::new", || {
        Pool::new(gpu.clone(), PoolConfig::default())
    })?;
    let small = p.call("Pool::alloc 256 B (first chunk)", || pool.alloc(256, 64))?;
    let big = p.call("Pool::alloc 16 MiB (own chunk)", || {
        pool.alloc(16 << 20, 256)
    })?;
    p.call("Block drop (own chunk)", || {
        drop(big);
        Ok(())
    })?;
    p.call("Block drop (256 B)", || {
        drop(small);
        Ok(())
    })?;
    p.call("Pool::trim", || {
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
    p.call("Arena::grow", || arena.grow())?;
    p.call("Arena::shrink", || arena.shrink(1))?;
    p.call("Arena drop", || {
        drop(arena);
        Ok(())
    })?;

    let ring = p.call("DeviceRing::new 1 MiB", || DeviceRing::new(gpu, 1 << 20))?;
    p.call("DeviceRing drop", || {
        drop(ring);
        Ok(())
    })?;
    let pinned = p.call("PinnedBuffer::new 2 MiB", || {
        PinnedBuffer::new(gpu, SIZE as usize)
    })?;
    p.call("PinnedBuffer drop", || {
        drop(pinned);
        Ok(())
    })?;
    let module = p.call("Module::load_ptx", || Module::load_ptx(gpu, PTX))?;
    p.call("Module drop", || {
        drop(module);
        Ok(())
    })?;
    let stream = p.call("Stream::new", || Stream::new(gpu))?;
    p.call("Stream drop", || {
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
    p.call("Gpu::memcpy_htod 64 KiB", || {
        // SAFETY: the target is a live allocation of SIZE bytes.
        unsafe { gpu.memcpy_htod(target.device_ptr(), &scratch) }
    })?;
    Ok(())
}
