//! `Pool` and `Block`: many small blocks carved out of a few BAR-mapped chunks ([`vkgdr::Pool`]).

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::{Mapping, PoolConfig};

use crate::device::gpu_of;
use crate::dlpack;
use crate::errors::{invalid_argument, to_py};
use crate::exports::{self, ExportRef, Exported, Exports};
use crate::identity::Identity;
use crate::interface::{self, LARGE_COPY};
use crate::stream::{optional_stream_arg, StreamArg};

/// Sets the [`PoolConfig`] setting called `key` to `value`; `false` for a name that is none.
/// Made from the library's list of the settings faces expose, so every one of them is a keyword
/// here.
macro_rules! set_pool_option {
    ($($name:ident: $type:ty => $($field:ident).+,)*) => {
        fn set_option(c: &mut PoolConfig, key: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
            match key {
                $(stringify!($name) => c.$($field).+ = value.extract::<$type>()?,)*
                _ => return Ok(false),
            }
            Ok(true)
        }

        /// The keywords, for the error that names them.
        const POOL_OPTIONS: &[&str] = &[$(stringify!($name)),*];
    };
}
vkgdr::pool_options!(set_pool_option);

/// The pool's configuration from keyword arguments (`Pool(owner, **config)`,
/// `Pool.vulkan_only(..., **config)`, `VulkanDevice.pool(**config)`); a missing or `None` value
/// keeps [`PoolConfig`]'s default.
pub(crate) fn config(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<PoolConfig> {
    let mut c = PoolConfig::default();
    let Some(kwargs) = kwargs else {
        return Ok(c);
    };
    let default_cap = c.max_chunk_size;
    let mut cap_given = false;
    for (key, value) in kwargs.iter() {
        if value.is_none() {
            continue;
        }
        let key = key.extract::<String>()?;
        if !set_option(&mut c, &key, &value)? {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "unexpected pool option '{key}' (known: {})",
                POOL_OPTIONS.join(", ")
            )));
        }
        cap_given |= key == "max_chunk_size";
    }
    // A first chunk larger than the default cap raises the cap, unless one was given.
    if !cap_given {
        c.max_chunk_size = default_cap.max(c.chunk_size);
    }
    Ok(c)
}

/// A pool of small aligned blocks over BAR-mapped chunks: allocation in nanoseconds instead of
/// the ~200 µs of a raw allocation.
///
/// ``Pool(owner, *, chunk_size=16 MiB, max_chunk_size=256 MiB, dedicated_threshold=8 MiB,
/// max_bytes=None, shards=min(cores, 64), keep_empty_chunks=1, thread_cache=32,
/// thread_cache_bytes=256 KiB, max_align=64 KiB)``; an option left out (or None) keeps its
/// default. Each thread keeps up to ``thread_cache`` freed blocks of up to 4 KiB per size class
/// (and ``thread_cache_bytes`` in all) for reuse without locks; ``trim()`` and dropping the pool
/// take them back from every thread, and a thread's go back when it ends, before a ``join()``
/// of it returns; ``thread_cache=0`` turns the caches off. Chunks live in
/// ``owner``'s CUDA context (the device's primary context, which CuPy and PyTorch use, for
/// ``Vkgdr(device)``). Thread-safe; blocks keep their memory alive, so a block outlives the pool
/// object.
#[pyclass(module = "vkgdr", name = "Pool", frozen)]
pub struct Pool {
    pub(crate) pool: vkgdr::Pool,
    /// The device handle of the chunks, for stream-ordered releases of blocks and their DLPack
    /// device; `None` for a Vulkan-only pool.
    gpu: Option<vkgdr::Gpu>,
    /// The device the chunks are allocated on (what a `ShareServer` checks the pool and its
    /// blocks against).
    pub(crate) identity: Identity,
}

impl Pool {
    /// A Vulkan-only pool over `context` (no CUDA import), configured by `config`'s keywords.
    pub(crate) fn on_vulkan(context: Arc<VulkanContext>, cfg: PoolConfig) -> PyResult<Pool> {
        let identity = Identity::of(&context);
        let pool = vkgdr::Pool::new(context, cfg).map_err(to_py)?;
        Ok(Pool {
            pool,
            gpu: None,
            identity,
        })
    }
}

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(signature = (owner, **config))]
    fn new(owner: &Bound<'_, PyAny>, config: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let gpu = gpu_of(owner)?;
        let cfg = self::config(config)?;
        let pool = vkgdr::Pool::new(gpu.clone(), cfg).map_err(to_py)?;
        Ok(Pool {
            pool,
            identity: Identity::of(gpu.vulkan()),
            gpu: Some(gpu),
        })
    }

    /// A pool over Vulkan memory with no CUDA import: blocks have a host mapping but no device
    /// pointer (``device_ptr`` is None, ``__dlpack__`` exports the host mapping). Runs on any
    /// Vulkan device with exportable host-visible memory, such as Mesa's lavapipe without a GPU.
    /// ``device_index`` picks the n-th Vulkan device (default: the first suitable one); the other
    /// keyword arguments configure the pool as for ``Pool``.
    #[staticmethod]
    #[pyo3(signature = (
        *, device_index = None, require_coherent = false, force_non_coherent = false, **config
    ))]
    fn vulkan_only(
        py: Python<'_>,
        device_index: Option<usize>,
        require_coherent: bool,
        force_non_coherent: bool,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let cfg = self::config(config)?;
        let selector = device_index.map_or(DeviceSelector::FirstSuitable, DeviceSelector::Index);
        let options = MemoryOptions {
            require_coherent,
            force_non_coherent,
        };
        let context = py
            .detach(|| VulkanContext::new(selector, options))
            .map_err(to_py)?;
        Pool::on_vulkan(context, cfg)
    }

    /// Allocates ``size`` bytes aligned to ``align`` (a power of two, at most ``max_align``).
    #[pyo3(signature = (size, align = 64))]
    fn alloc(&self, py: Python<'_>, size: u64, align: u64) -> PyResult<Block> {
        crate::thread_exit::return_cache_at_exit(py);
        // Usually nanoseconds, but a new chunk costs a driver round trip: let other threads run.
        let block = py.detach(|| self.pool.alloc(size, align)).map_err(to_py)?;
        Ok(Block::new(block, self.identity, self.gpu.clone()))
    }

    /// Flushes every write recorded through ``Block.write`` (one driver call per chunk); a no-op
    /// on coherent memory. Writes through NumPy views are flushed with ``Block.flush``.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        interface::drain_host_writes();
        py.detach(|| self.pool.flush()).map_err(to_py)
    }

    /// Returns every empty chunk to the driver; returns how many were released.
    fn trim(&self, py: Python<'_>) -> usize {
        py.detach(|| self.pool.trim())
    }

    /// Gives the lanes of ``ring`` (a ``DeviceToHostRing``) to the pool as its release feed:
    /// the records of ``vkgdr_release_token`` that kernels publish into them bring blocks lent
    /// with ``Block.release_on_device()`` back. Once per pool; the pool drains the lanes itself
    /// from then on (``ring.consumer(lane)`` refuses them). Raises ``VkgdrError`` when a lane
    /// of the ring has a consumer, or the pool has a feed already.
    fn set_release_feed(&self, ring: &Bound<'_, PyAny>) -> PyResult<()> {
        let ring = ring.cast::<crate::d2h::DeviceToHostRing>().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "set_release_feed takes a vkgdr.DeviceToHostRing, not {}",
                interface::type_name(ring)
            ))
        })?;
        let lanes = ring.get().library().consumers().map_err(to_py)?;
        self.pool
            .set_release_feed(lanes)
            .map_err(|_| crate::errors::vkgdr_error("the pool has a release feed already"))
    }

    /// ``Block.release_on_device()`` for many blocks at once, the pool's token table locked
    /// once: returns their tokens, in order. Every block is checked first (a ``vkgdr.Block``,
    /// else ``TypeError``; given once, else ``InvalidArgumentError``; live and its memory never
    /// exported, else as ``release_on_device`` raises), and nothing is lent when one fails. Refused part-way by the pool (no
    /// release feed, the most blocks lent it can hold, a block of another pool), raises
    /// ``VkgdrError`` whose ``tokens`` attribute holds the tokens of the blocks lent before the
    /// refusal, in order; the blocks from index ``len(e.tokens)`` on are not lent and unchanged.
    fn release_many_on_device(
        &self,
        py: Python<'_>,
        blocks: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<u64>> {
        let mut objects: Vec<PyRef<'_, Block>> = Vec::with_capacity(blocks.len());
        let mut seen = std::collections::HashSet::with_capacity(blocks.len());
        for (i, b) in blocks.iter().enumerate() {
            if !seen.insert(b.as_ptr() as usize) {
                return Err(invalid_argument(format!(
                    "release_many_on_device: blocks[{i}] is given twice"
                )));
            }
            let b = b.cast::<Block>().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "release_many_on_device takes vkgdr.Block objects; blocks[{i}] is {}",
                    interface::type_name(b)
                ))
            })?;
            objects.push(b.borrow());
        }
        let mut taken = Vec::with_capacity(objects.len());
        for b in &objects {
            match b.take_for_lending() {
                Ok(block) => taken.push(block),
                Err(e) => {
                    // Nothing lent yet: every block taken goes back as it was.
                    for (b, block) in objects.iter().zip(taken) {
                        b.give_back_unlent(block);
                    }
                    return Err(e);
                }
            }
        }
        let mut tokens = Vec::with_capacity(taken.len());
        let verdict = self.pool.release_many_on_device(&mut taken, &mut tokens);
        let bits: Vec<u64> = tokens.iter().map(|t| t.to_bits()).collect();
        for (b, block) in objects[bits.len()..].iter().zip(taken) {
            b.give_back_unlent(block);
        }
        match verdict {
            Ok(()) => Ok(bits),
            Err(why) => {
                let err = crate::errors::vkgdr_error(format!(
                    "{} of {} blocks lent; the rest not: {why}",
                    bits.len(),
                    objects.len()
                ));
                err.value(py).setattr("tokens", bits)?;
                Err(err)
            }
        }
    }

    /// Takes every device release that has arrived and frees the blocks given back (the pool's
    /// own thread and its allocations do it too); returns how many this call freed. On return
    /// every block whose token arrived before the call is back in the pool.
    fn drain_device_releases(&self, py: Python<'_>) -> usize {
        py.detach(|| self.pool.drain_device_releases())
    }

    /// Blocks lent to kernels now (released on the device and not back in the pool yet: their
    /// tokens not arrived, or a drain freeing them at this moment).
    #[getter]
    fn lent_blocks(&self) -> u64 {
        self.pool.lent_blocks()
    }

    /// Frees every lent block without waiting for its token (later tokens of them free
    /// nothing); returns how many. Only for a program that knows its kernels are done with
    /// them (they exited and their stream was synchronised) or will never release them: the
    /// blocks are handed out again at once, and a kernel still using one would corrupt another
    /// block's data.
    fn reclaim_device_releases(&self, py: Python<'_>) -> usize {
        // SAFETY: the program's promise, documented above (as RawStream's handle is).
        py.detach(|| unsafe { self.pool.reclaim_device_releases() })
    }

    /// A usage snapshot: ``bytes_reserved``, ``bytes_in_use``, ``bytes_cached`` and
    /// ``blocks_cached`` (freed blocks kept by thread caches), ``bytes_allocated``, ``chunks``, ``dedicated_chunks``,
    /// ``largest_free_block``, ``shards``, and ``thread_cache_handshake``: how other threads reach
    /// the thread caches, ``"membarrier"`` (no barrier on the owner's path) or ``"fence"`` (a full
    /// barrier per cached allocation and free), ``None`` when the pool has no thread cache; and
    /// ``device_releases``, a dict of the blocks lent to kernels (``lent``), the tokens
    /// ``issued``, ``redeemed``, ``revoked`` (``reclaim_device_releases``) and refused
    /// (``forged``, ``stale``, ``repeated``), ``ignored_records`` on the release lanes and
    /// ``lane_error`` (why a release lane broke, or None).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.pool.stats());
        let d = PyDict::new(py);
        d.set_item("bytes_reserved", s.bytes_reserved)?;
        d.set_item("bytes_in_use", s.bytes_in_use)?;
        d.set_item("bytes_cached", s.bytes_cached)?;
        d.set_item("blocks_cached", s.blocks_cached)?;
        d.set_item("bytes_allocated", s.bytes_allocated)?;
        d.set_item("chunks", s.chunks)?;
        d.set_item("dedicated_chunks", s.dedicated_chunks)?;
        d.set_item("largest_free_block", s.largest_free_block)?;
        d.set_item("shards", s.shards.len())?;
        d.set_item(
            "thread_cache_handshake",
            self.pool.thread_cache().map(|t| t.handshake.name()),
        )?;
        let r = &s.device_releases;
        let releases = PyDict::new(py);
        releases.set_item("lent", r.outstanding)?;
        releases.set_item("issued", r.tokens.issued)?;
        releases.set_item("redeemed", r.tokens.redeemed)?;
        releases.set_item("revoked", r.tokens.revoked)?;
        releases.set_item("forged", r.tokens.forged)?;
        releases.set_item("stale", r.tokens.stale)?;
        releases.set_item("repeated", r.tokens.repeated)?;
        releases.set_item("ignored_records", r.foreign_records + r.malformed_records)?;
        releases.set_item("lane_error", r.lane_error.as_ref().map(ToString::to_string))?;
        d.set_item("device_releases", releases)?;
        Ok(d)
    }

    /// Whether blocks need ``flush``/``invalidate`` (non-coherent or forced-non-coherent memory).
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.pool.is_non_coherent()
    }

    /// Whether blocks have device pointers (False for ``Pool.vulkan_only``).
    #[getter]
    fn has_device_memory(&self) -> bool {
        self.gpu.is_some()
    }

    fn __repr__(&self) -> String {
        let s = self.pool.stats();
        format!(
            "<vkgdr.Pool {} bytes in use, {} reserved in {} chunks{}>",
            s.bytes_in_use,
            s.bytes_reserved,
            s.chunks + s.dedicated_chunks,
            if self.gpu.is_none() {
                ", Vulkan only"
            } else {
                ""
            }
        )
    }
}

/// A block's Rust state, shared with DLPack exports so a tensor keeps the memory alive without
/// the GIL. The block goes back to its pool when the state drops: when the `Block` object and
/// every export are gone, after the stream named by `Block.free(after=...)`, if any.
struct BlockState {
    /// Locked only by writes and flushes, which record dirty ranges (`&mut` in the library).
    /// `None` once handed back by `Block.free()`.
    block: Mutex<Option<vkgdr::Block>>,
    /// The stream `free(after=...)` named, if any.
    after: Mutex<Option<StreamArg>>,
    /// The device handle the stream-ordered release needs (and the DLPack device); `None` for
    /// Vulkan-only pools.
    gpu: Option<vkgdr::Gpu>,
    size: u64,
    host_ptr: usize,
    device_ptr: Option<u64>,
    non_coherent: bool,
    /// The device of the block's pool.
    identity: Identity,
    /// The block's live exports (NumPy arrays, DLPack tensors, the pin of the CUDA array
    /// interface) and whether it was freed: the exact rule of `free()` ([`crate::exports`]).
    exports: Exports,
}

impl Exported for BlockState {
    fn exports(&self) -> &Exports {
        &self.exports
    }

    fn release_last(&self) {
        // No one to report an error to (perhaps a DLPack deleter in C code); on an error the
        // block went back as a plain drop gives it back.
        let _ = self.release();
    }
}

/// The error of every use of a freed block.
fn freed() -> PyErr {
    crate::errors::vkgdr_error("the block has been freed")
}

/// The error of every use of a block sent to another process.
fn sent() -> PyErr {
    crate::errors::vkgdr_error(
        "the block was sent to another process (ShareServer.send_block): this object is spent; \
         ShareServer.take_returned(token) gives the block back once the peer has",
    )
}

/// The error of every use of a block released on the device.
fn lent() -> PyErr {
    crate::errors::vkgdr_error(
        "the block was released on the device (Block.release_on_device): this object is spent; \
         the block goes back to its pool when the kernel's token arrives",
    )
}

/// Why an operation on a block failed. Turned into an exception only once the block's lock is
/// released and the GIL held again: making one takes the GIL, and a thread holding the GIL may
/// be waiting for the lock.
enum Failure {
    /// The block was handed back meanwhile.
    Freed,
    Library(vkgdr::Error),
}

impl From<vkgdr::Error> for Failure {
    fn from(e: vkgdr::Error) -> Failure {
        Failure::Library(e)
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Freed => freed(),
            Failure::Library(e) => to_py(e),
        }
    }
}

impl BlockState {
    /// Runs `f` on the block under its lock; `Failure::Freed` once it has been handed back.
    /// Needs no GIL.
    fn with<R>(&self, f: impl FnOnce(&mut vkgdr::Block) -> vkgdr::Result<R>) -> Result<R, Failure> {
        let mut guard = self.block.lock();
        let block = guard.as_mut().ok_or(Failure::Freed)?;
        Ok(f(block)?)
    }

    /// Hands the block back now: after the named stream if there is one, else at once.
    fn release(&self) -> vkgdr::Result<()> {
        let block = self.block.lock().take();
        let after = self.after.lock().take();
        release_parts(block, after, self.gpu.as_ref())
    }
}

/// Hands `block` (if still held) back: after `after` where a stream was named (GPU pools only),
/// else at once.
fn release_parts(
    block: Option<vkgdr::Block>,
    after: Option<StreamArg>,
    gpu: Option<&vkgdr::Gpu>,
) -> vkgdr::Result<()> {
    match (block, after, gpu) {
        (Some(block), Some(stream), Some(gpu)) => {
            // SAFETY: `release_after_stream` wants a live stream of the block's device, whose
            // context, where the driver lacks stream memory operations (an event then fences
            // the release), stays alive until the release. A stream object is alive while
            // `stream` holds it (it drops after the call); a `RawStream`'s stream, and the
            // context of either, are the program's promise, documented on `Block.free`.
            let done = unsafe { block.release_after_stream(gpu, stream.raw()) };
            drop(stream);
            done
        }
        (block, _, _) => {
            drop(block);
            Ok(())
        }
    }
}

impl Drop for BlockState {
    fn drop(&mut self) {
        // The last reference: nothing else can lock either mutex. A destructor (perhaps a DLPack
        // deleter in C code) has no one to report an error to; on an error the block went back
        // as a plain drop gives it back.
        let _ = release_parts(
            self.block.get_mut().take(),
            self.after.get_mut().take(),
            self.gpu.as_ref(),
        );
    }
}

/// A block of pool memory: ``len(block)`` bytes with a host mapping (``np.asarray(block)``,
/// ``block.view(dtype, shape)``) and, for GPU pools, a device pointer (``device_ptr``,
/// ``__cuda_array_interface__``, ``__dlpack__``: ``cupy.asarray(block)`` and
/// ``torch.from_dlpack(block)`` use the device memory with no copy).
///
/// The block goes back to its pool when the block object and every view and DLPack export of
/// it are gone, and is handed out again at once: the pool cannot know which kernels still read
/// it. ``free(*, after=None)`` says so explicitly: the object is marked freed (its attributes
/// raise ``VkgdrError``), and the block goes back at once if no export of it is alive (a NumPy
/// array or view, a DLPack tensor or capsule), else when the last one is gone. Reading
/// ``__cuda_array_interface__`` (``cupy.asarray(block)``, ``torch.as_tensor(block)``) makes an
/// export the object itself holds, as its consumers hold the object: the block then goes back
/// when the object is collected. ``after=stream``
/// (a CuPy, PyTorch, PyCUDA or Numba stream object, kept alive until then, or a raw handle as
/// ``vkgdr.RawStream(handle)``; a bare int raises ``TypeError``) holds it back further, never
/// waiting: it goes back once the work queued on that stream has completed (the stream's state
/// when the block is given back, views' kernels included). Free blocks that a kernel on a
/// non-blocking stream may still use that way.
///
/// Host writes reach kernels launched afterwards; on non-coherent memory call ``flush()`` first
/// (and ``invalidate()`` before host reads of device writes).
#[pyclass(module = "vkgdr", name = "Block", frozen)]
pub struct Block {
    state: Arc<BlockState>,
    /// Set by `free()`, and by `ShareServer.send_block` (with `sent`).
    freed: AtomicBool,
    /// Set when `ShareServer.send_block` took the block for another process.
    sent: AtomicBool,
    /// Set when `release_on_device` lent the block to a kernel.
    lent: AtomicBool,
    /// Whether an interface was read or a DLPack capsule made (views may have existed: the
    /// block is not sent then).
    exported: AtomicBool,
    /// The export the block itself holds once its CUDA array interface was read: its consumers
    /// hold this object, so the memory waits for the object (see [`crate::exports`]).
    pin: Mutex<Option<ExportRef>>,
}

impl Block {
    pub(crate) fn new(block: vkgdr::Block, identity: Identity, gpu: Option<vkgdr::Gpu>) -> Block {
        Block {
            state: Arc::new(BlockState {
                size: block.size(),
                host_ptr: block.host_ptr() as usize,
                device_ptr: block.device_ptr(),
                non_coherent: identity.non_coherent(),
                identity,
                block: Mutex::new(Some(block)),
                after: Mutex::new(None),
                gpu,
                exports: Exports::new(),
            }),
            freed: AtomicBool::new(false),
            sent: AtomicBool::new(false),
            lent: AtomicBool::new(false),
            exported: AtomicBool::new(false),
            pin: Mutex::new(None),
        }
    }

    /// The state of a block that has not been freed (nor sent to another process).
    /// Marks the block lent (no view or export can be made from here on) and takes it out,
    /// for `release_on_device` and `Pool.release_many_on_device`; or why it cannot be lent,
    /// the block unchanged.
    fn take_for_lending(&self) -> PyResult<vkgdr::Block> {
        self.live()?;
        if self.exported.load(Ordering::Acquire) {
            return Err(invalid_argument(
                "the block cannot be released on the device: its memory was exported \
                 (np.asarray, view(), an array interface or DLPack), and a view could go on \
                 using memory the pool hands out again once the kernel's token arrives. Give \
                 the kernel block.device_ptr and fill the block with block.write(data)",
            ));
        }
        // Marked first: no view or export can be made from here on.
        if self.freed.swap(true, Ordering::AcqRel) {
            return Err(self.live().err().unwrap_or_else(freed));
        }
        self.lent.store(true, Ordering::Release);
        let taken = self.state.block.lock().take();
        let Some(block) = taken else {
            self.lent.store(false, Ordering::Release);
            return Err(freed());
        };
        Ok(block)
    }

    /// Puts back a block [`take_for_lending`](Self::take_for_lending) took and the pool did not
    /// lend: the object is as it was.
    fn give_back_unlent(&self, block: vkgdr::Block) {
        *self.state.block.lock() = Some(block);
        self.lent.store(false, Ordering::Release);
        self.freed.store(false, Ordering::Release);
    }

    fn live(&self) -> PyResult<&BlockState> {
        if self.freed.load(Ordering::Acquire) {
            return Err(if self.sent.load(Ordering::Acquire) {
                sent()
            } else if self.lent.load(Ordering::Acquire) {
                lent()
            } else {
                freed()
            });
        }
        Ok(&self.state)
    }

    /// The device of the block's pool.
    pub(crate) fn identity(&self) -> Identity {
        self.state.identity
    }

    /// Takes the library's block out of this object for `ShareServer.send_block`, which hands
    /// it to another process: the object is spent from then on (its methods raise, `free()`
    /// does nothing).
    ///
    /// Refused (the object unchanged) once an interface was read or a DLPack capsule made: a
    /// view may still use the block's memory, which the other process then owns and the pool
    /// may later hand out again (or give back to the driver, and a store through the view would
    /// fault).
    pub(crate) fn take_for_send(&self) -> PyResult<vkgdr::Block> {
        self.check_sendable()?;
        // Marked first: no view or export can be made from here on.
        if self.freed.swap(true, Ordering::AcqRel) {
            return Err(freed());
        }
        self.sent.store(true, Ordering::Release);
        let block = self.state.block.lock().take();
        block.ok_or_else(freed)
    }

    /// Why [`take_for_send`](Self::take_for_send) would refuse the block, if it would.
    pub(crate) fn check_sendable(&self) -> PyResult<()> {
        self.live()?;
        if self.exported.load(Ordering::Acquire) {
            return Err(crate::errors::invalid_argument(
                "the block cannot be sent: its memory was exported (np.asarray, view(), an \
                 array interface or DLPack), and a view could go on writing memory that is then \
                 another process's. Fill blocks to send with block.write(data) (any bytes-like \
                 object, a NumPy array too), and free this one",
            ));
        }
        Ok(())
    }

    /// A new export of the block's memory ([`crate::exports`]), noting that a view may be
    /// made; the block's error once it is freed (or sent).
    fn export(&self) -> PyResult<ExportRef> {
        self.live()?;
        self.exported.store(true, Ordering::Release);
        let state: Arc<dyn Exported> = self.state.clone();
        ExportRef::new(state).ok_or_else(|| self.live().err().unwrap_or_else(freed))
    }

    /// The DLPack device of the block's natural export.
    fn dlpack_device(&self) -> (i32, i32) {
        match (&self.state.gpu, self.state.device_ptr) {
            (Some(gpu), Some(_)) => (dlpack::DEVICE_CUDA, gpu.cu_device()),
            _ => (dlpack::DEVICE_CPU, 0),
        }
    }
}

#[pymethods]
impl Block {
    fn __len__(&self) -> usize {
        self.state.size as usize
    }

    /// The block's size in bytes (as requested).
    #[getter]
    fn size(&self) -> u64 {
        self.state.size
    }

    /// The host address of the first byte.
    #[getter]
    fn host_ptr(&self) -> PyResult<usize> {
        Ok(self.live()?.host_ptr)
    }

    /// The CUDA device pointer of the first byte (None for ``Pool.vulkan_only`` blocks).
    #[getter]
    fn device_ptr(&self) -> PyResult<Option<u64>> {
        Ok(self.live()?.device_ptr)
    }

    /// Whether the block has a chunk of its own (requests of ``dedicated_threshold`` or more).
    #[getter]
    fn is_dedicated(&self) -> PyResult<bool> {
        Ok(self.live()?.with(|b| Ok(b.is_dedicated()))?)
    }

    /// Whether ``free()`` was called (or the block was sent to another process).
    #[getter]
    fn is_freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }

    /// Whether ``ShareServer.send_block`` handed the block to another process (the object is
    /// spent; ``ShareServer.take_returned`` gives a new one once the peer gives it back).
    #[getter]
    fn is_sent(&self) -> bool {
        self.sent.load(Ordering::Acquire)
    }

    /// Lends the block to a kernel and returns the token (an int) the kernel passes to
    /// ``vkgdr_release_token`` (``include/vkgdr/ring_d2h.cuh``) when it is done with the block.
    /// The block goes back to its pool only when that token has come back through the pool's
    /// release feed (``Pool.set_release_feed``), so it is never handed out again while the
    /// kernel may still use it; this object is spent from now on (read ``device_ptr`` first).
    ///
    /// Raises, the block unchanged: ``VkgdrError`` when the pool has no release feed (or is
    /// closed, or has the most blocks lent it can hold); ``InvalidArgumentError`` once the
    /// block's memory was exported (a NumPy, DLPack or CUDA array view could go on using memory
    /// the pool hands out again). A freed block raises ``VkgdrError``.
    fn release_on_device(&self) -> PyResult<u64> {
        let block = self.take_for_lending()?;
        match block.release_on_device() {
            Ok(token) => Ok(token.to_bits()),
            Err(refused) => {
                let message = refused.to_string();
                self.give_back_unlent(refused.block);
                Err(crate::errors::vkgdr_error(message))
            }
        }
    }

    /// Whether ``release_on_device`` lent the block to a kernel (the object is spent).
    #[getter]
    fn is_released_on_device(&self) -> bool {
        self.lent.load(Ordering::Acquire)
    }

    /// Frees the block without waiting for the GPU: it goes back to its pool at once if no
    /// export of it is alive, otherwise when the last one is gone; with
    /// ``after=stream``, only once the work queued on that stream has completed as well (see
    /// the class docs). The object is marked freed either way. Safe to call twice; a second call
    /// changes nothing. A ``vkgdr.RawStream`` ``after`` must name a live stream of the block's
    /// device; where the driver lacks stream memory operations (an event then fences the
    /// release), the stream's context must stay alive until the block has gone back, as in C.
    /// A bare int raises ``TypeError``: wrap a handle in ``vkgdr.RawStream``.
    #[pyo3(signature = (*, after = None))]
    fn free(slf: &Bound<'_, Self>, after: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        // The arguments first: reading a stream object may run Python code.
        let after = optional_stream_arg(after, "free(after=...)")?;
        if after.is_some() && this.state.gpu.is_none() {
            return Err(invalid_argument(
                "a Vulkan-only block has no CUDA stream to wait for (after= needs a GPU pool)",
            ));
        }
        // Freed from here on: no view or export can be made any more.
        if this.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        *this.state.after.lock() = after;
        // Released now if no export is alive, else by the last one to end.
        if !this.state.exports.free() {
            return Ok(());
        }
        py.detach(|| this.state.release()).map_err(to_py)
    }

    /// Whether host writes need no ``flush``.
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.state.non_coherent
    }

    /// NumPy's array interface: ``size`` writable bytes (``uint8``) of the host mapping.
    #[getter]
    /// Arrays made from it keep the memory, not the block object ([`crate::exports`]).
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let export = self.export()?;
        exports::host_interface(py, export, self.state.host_ptr, self.state.size, "|u1")
    }

    /// The CUDA array interface (v3): ``size`` bytes of ``uint8`` at ``device_ptr``. Missing
    /// (AttributeError) on ``Pool.vulkan_only`` blocks.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.state.device_ptr {
            Some(p) => {
                // Its consumers hold this object: it keeps the memory until it is collected.
                let export = self.export()?;
                let mut pin = self.pin.lock();
                if pin.is_none() {
                    *pin = Some(export);
                }
                interface::cuda_array_interface(py, p, self.state.size)
            }
            None => Err(pyo3::exceptions::PyAttributeError::new_err(
                "a Vulkan-only block has no device pointer",
            )),
        }
    }

    /// A typed NumPy view of the host mapping: ``dtype`` (default ``uint8``) and ``shape``
    /// (default: as many elements as fit). The view keeps the block alive.
    #[pyo3(signature = (dtype = None, shape = None))]
    fn view<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let size = slf.get().live()?.size;
        interface::typed_view(slf.as_any(), size, "block", dtype, shape)
    }

    /// Copies a bytes-like object to ``offset`` (bounds-checked; recorded for ``Pool.flush`` on
    /// non-coherent memory).
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        let state = self.live()?;
        let write = |bytes: &[u8]| state.with(|b| b.write(offset, bytes));
        Ok(interface::with_bytes(data, |bytes| {
            if bytes.len() >= LARGE_COPY {
                py.detach(|| write(bytes))
            } else {
                write(bytes)
            }
        })??)
    }

    /// Reads ``size`` bytes from ``offset`` (default: to the end), after an invalidate on
    /// non-coherent memory. Large reads use the GPU's copy engine.
    #[pyo3(signature = (offset = 0, size = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        size: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let state = self.live()?;
        // The range first, to know the size (and refuse a bad one) before allocating.
        let (offset, size) = interface::range(offset, size, state.size)?;
        PyBytes::new_with(py, size as usize, |out| {
            // No other code can see the new bytes object yet: filling it without the GIL is safe.
            let read = |out: &mut [u8]| state.with(|b| b.read(offset, out));
            Ok(if out.len() >= LARGE_COPY {
                py.detach(|| read(out))
            } else {
                read(out)
            }?)
        })
    }

    /// Makes host writes in ``[offset, offset + size)`` (default: the whole block) visible to the
    /// device, however they were made (NumPy views included). On coherent memory only a store
    /// fence.
    #[pyo3(signature = (offset = 0, size = None))]
    fn flush(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        let state = self.live()?;
        let (offset, size) = interface::range(offset, size, state.size)?;
        interface::drain_host_writes();
        // Coherent memory needs nothing more: not even the GIL released or a lock taken.
        if !state.non_coherent || size == 0 {
            return Ok(());
        }
        Ok(py.detach(|| state.with(|b| b.flush_range(offset, size)))?)
    }

    /// Makes device writes in ``[offset, offset + size)`` (default: the whole block) visible to
    /// host reads. A no-op on coherent memory.
    #[pyo3(signature = (offset = 0, size = None))]
    fn invalidate(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        let state = self.live()?;
        let (offset, size) = interface::range(offset, size, state.size)?;
        if !state.non_coherent || size == 0 {
            return Ok(());
        }
        Ok(py.detach(|| state.with(|b| b.before_read(offset, size)))?)
    }

    /// ``(device_type, device_id)``: ``(kDLCUDA, ordinal)`` for GPU pools, ``(kDLCPU, 0)`` for
    /// ``Pool.vulkan_only``.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.dlpack_device()
    }

    /// A DLPack capsule of the block's bytes (``uint8``, one dimension) with no copy: the device
    /// memory for GPU pools, or the host mapping when ``dl_device=(kDLCPU, 0)`` is asked for (and
    /// for ``Pool.vulkan_only``). The block has no pending GPU work, so ``stream`` needs no
    /// synchronisation. ``copy=True`` is refused (BufferError): this is zero-copy memory.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let export = self.export()?;
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "vkgdr blocks are exported without copying (copy=True is not supported)",
            ));
        }
        let natural = self.dlpack_device();
        let target = match dl_device {
            None => natural,
            Some(d) if d == natural || d == (dlpack::DEVICE_CPU, 0) => d,
            Some(d) => {
                return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                    "cannot export to DLPack device {d:?}: the block is on {natural:?} \
                     (or the host, (1, 0))"
                )))
            }
        };
        let address = if target.0 == dlpack::DEVICE_CUDA {
            self.state.device_ptr.unwrap_or_default()
        } else {
            self.state.host_ptr as u64
        };
        dlpack::export(
            py,
            dlpack::Target {
                address,
                device_type: target.0,
                device_id: target.1,
                len: self.state.size,
            },
            export,
            dlpack::wants_versioned(max_version)?,
        )
    }

    fn __repr__(&self) -> String {
        if self.sent.load(Ordering::Acquire) {
            return format!("<vkgdr.Block {} bytes, sent>", self.state.size);
        }
        if self.freed.load(Ordering::Acquire) {
            return format!("<vkgdr.Block {} bytes, freed>", self.state.size);
        }
        match self.state.device_ptr {
            Some(p) => format!("<vkgdr.Block {} bytes at device {p:#x}>", self.state.size),
            None => format!(
                "<vkgdr.Block {} bytes at host {:#x}>",
                self.state.size, self.state.host_ptr
            ),
        }
    }
}
