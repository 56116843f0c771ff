//! `Pool` and `Block`: many small blocks carved out of a few BAR-mapped chunks ([`vkgdr::Pool`]).

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::{Mapping, PoolConfig};

use crate::compat::Vkgdr;
use crate::dlpack;
use crate::errors::{invalid_argument, to_py};
use crate::interface;

/// The pool's configuration from keyword arguments (`Pool(owner, **config)`,
/// `Pool.vulkan_only(..., **config)`); a missing or `None` value keeps [`PoolConfig`]'s default.
fn config(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<PoolConfig> {
    let mut c = PoolConfig::default();
    let Some(kwargs) = kwargs else {
        return Ok(c);
    };
    let mut max_chunk_size = None;
    for (key, value) in kwargs.iter() {
        if value.is_none() {
            continue;
        }
        match key.extract::<String>()?.as_str() {
            "chunk_size" => c.chunk_size = value.extract()?,
            "max_chunk_size" => max_chunk_size = Some(value.extract()?),
            "dedicated_threshold" => c.dedicated_threshold = value.extract()?,
            "max_bytes" => c.max_bytes = value.extract()?,
            "shards" => c.shards = value.extract()?,
            "keep_empty_chunks" => c.keep_empty_chunks = value.extract()?,
            "thread_cache" => c.thread_cache = value.extract()?,
            "thread_cache_bytes" => c.thread_cache_bytes = value.extract()?,
            "max_align" => c.heap.max_align = value.extract()?,
            other => {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "unexpected pool option '{other}' (known: chunk_size, max_chunk_size, \
                     dedicated_threshold, max_bytes, shards, keep_empty_chunks, thread_cache, \
                     thread_cache_bytes, max_align)"
                )))
            }
        }
    }
    // A first chunk larger than the default cap raises the cap, unless one was given.
    c.max_chunk_size = max_chunk_size.unwrap_or(c.max_chunk_size.max(c.chunk_size));
    Ok(c)
}

/// A pool of small aligned blocks over BAR-mapped chunks: allocation in nanoseconds instead of
/// the ~200 µs of a raw allocation.
///
/// ``Pool(owner, *, chunk_size=16 MiB, max_chunk_size=256 MiB, dedicated_threshold=8 MiB,
/// max_bytes=None, shards=min(cores, 8), keep_empty_chunks=1, thread_cache=32,
/// thread_cache_bytes=256 KiB, max_align=64 KiB)``; an option left out (or None) keeps its
/// default. Each thread keeps up to ``thread_cache`` freed blocks of up to 4 KiB per size class
/// (and ``thread_cache_bytes`` in all) for reuse without locks; ``trim()`` and dropping the pool
/// take them back from every thread; ``thread_cache=0`` turns the caches off. Chunks live in
/// ``owner``'s CUDA context (the device's primary context, which CuPy and PyTorch use, for
/// ``Vkgdr(device)``). Thread-safe; blocks keep their memory alive, so a block outlives the pool
/// object.
#[pyclass(module = "vkgdr", name = "Pool", frozen)]
pub struct Pool {
    pool: vkgdr::Pool,
    /// The CUDA device ordinal of the chunks; `None` for a Vulkan-only pool.
    device: Option<i32>,
}

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(signature = (owner, **config))]
    fn new(owner: PyRef<'_, Vkgdr>, config: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let cfg = self::config(config)?;
        let gpu = owner.gpu.clone();
        let device = gpu.cu_device();
        let pool = vkgdr::Pool::new(gpu, cfg).map_err(to_py)?;
        Ok(Pool {
            pool,
            device: Some(device),
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
        let pool = vkgdr::Pool::new(context, cfg).map_err(to_py)?;
        Ok(Pool { pool, device: None })
    }

    /// Allocates ``size`` bytes aligned to ``align`` (a power of two, at most ``max_align``).
    #[pyo3(signature = (size, align = 64))]
    fn alloc(&self, py: Python<'_>, size: u64, align: u64) -> PyResult<Block> {
        // Usually nanoseconds, but a new chunk costs a driver round trip: let other threads run.
        let block = py.detach(|| self.pool.alloc(size, align)).map_err(to_py)?;
        Ok(Block::new(block, self.device, self.pool.is_non_coherent()))
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

    /// A usage snapshot: ``bytes_reserved``, ``bytes_in_use``, ``bytes_cached`` and
    /// ``blocks_cached`` (freed blocks kept by thread caches), ``bytes_allocated``, ``chunks``, ``dedicated_chunks``,
    /// ``largest_free_block``, ``shards``.
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
        self.device.is_some()
    }

    fn __repr__(&self) -> String {
        let s = self.pool.stats();
        format!(
            "<vkgdr.Pool {} bytes in use, {} reserved in {} chunks{}>",
            s.bytes_in_use,
            s.bytes_reserved,
            s.chunks + s.dedicated_chunks,
            if self.device.is_none() {
                ", Vulkan only"
            } else {
                ""
            }
        )
    }
}

/// A block's Rust state, shared with DLPack exports so a tensor keeps the memory alive without
/// the GIL.
struct BlockState {
    /// Locked only by writes and flushes, which record dirty ranges (`&mut` in the library).
    block: Mutex<vkgdr::Block>,
    size: u64,
    host_ptr: usize,
    device_ptr: Option<u64>,
    device: Option<i32>,
    non_coherent: bool,
}

/// A block of pool memory: ``len(block)`` bytes with a host mapping (``np.asarray(block)``,
/// ``block.view(dtype, shape)``) and, for GPU pools, a device pointer (``device_ptr``,
/// ``__cuda_array_interface__``, ``__dlpack__``: ``cupy.asarray(block)`` and
/// ``torch.from_dlpack(block)`` use the device memory with no copy). Freed when the block and
/// every view of it are gone.
///
/// Host writes reach kernels launched afterwards; on non-coherent memory call ``flush()`` first
/// (and ``invalidate()`` before host reads of device writes).
#[pyclass(module = "vkgdr", name = "Block", frozen)]
pub struct Block {
    state: Arc<BlockState>,
}

impl Block {
    fn new(block: vkgdr::Block, device: Option<i32>, non_coherent: bool) -> Block {
        let device_ptr = block.device_ptr();
        Block {
            state: Arc::new(BlockState {
                size: block.size(),
                host_ptr: block.host_ptr() as usize,
                device_ptr,
                device: device.filter(|_| device_ptr.is_some()),
                non_coherent,
                block: Mutex::new(block),
            }),
        }
    }

    /// The DLPack device of the block's natural export.
    fn dlpack_device(&self) -> (i32, i32) {
        match self.state.device {
            Some(ordinal) => (dlpack::DEVICE_CUDA, ordinal),
            None => (dlpack::DEVICE_CPU, 0),
        }
    }
}

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    NUMPY
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
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
    fn host_ptr(&self) -> usize {
        self.state.host_ptr
    }

    /// The CUDA device pointer of the first byte (None for ``Pool.vulkan_only`` blocks).
    #[getter]
    fn device_ptr(&self) -> Option<u64> {
        self.state.device_ptr
    }

    /// Whether the block has a chunk of its own (requests of ``dedicated_threshold`` or more).
    #[getter]
    fn is_dedicated(&self) -> bool {
        self.state.block.lock().is_dedicated()
    }

    /// Whether host writes need no ``flush``.
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.state.non_coherent
    }

    /// NumPy's array interface: ``size`` writable bytes (``uint8``) of the host mapping.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        interface::array_interface(py, self.state.host_ptr, self.state.size, "|u1")
    }

    /// The CUDA array interface (v3): ``size`` bytes of ``uint8`` at ``device_ptr``. Missing
    /// (AttributeError) on ``Pool.vulkan_only`` blocks.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.state.device_ptr {
            Some(p) => interface::cuda_array_interface(py, p, self.state.size),
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
        let py = slf.py();
        let np = numpy(py)?;
        let dtype = np.call_method1(
            "dtype",
            (dtype.map_or("u1".into_pyobject(py)?.into_any(), |d| d.clone()),),
        )?;
        let itemsize: u64 = dtype.getattr("itemsize")?.extract()?;
        let size = slf.get().state.size;
        if itemsize == 0 {
            return Err(invalid_argument("dtype has no size"));
        }
        let bytes = np.call_method1("asarray", (slf,))?;
        let shape: Bound<'py, PyTuple> = match shape {
            None => {
                if !size.is_multiple_of(itemsize) {
                    return Err(invalid_argument(format!(
                        "a {size}-byte block is not a whole number of {itemsize}-byte items; \
                         give a shape"
                    )));
                }
                PyTuple::new(py, [size / itemsize])?
            }
            Some(s) => match s.extract::<u64>() {
                Ok(n) => PyTuple::new(py, [n])?,
                Err(_) => PyTuple::new(py, s.try_iter()?.collect::<PyResult<Vec<_>>>()?)?,
            },
        };
        let mut count: u64 = 1;
        for d in shape.iter() {
            let d: u64 = d.extract()?;
            count = count
                .checked_mul(d)
                .ok_or_else(|| invalid_argument("shape too large"))?;
        }
        let needed = count
            .checked_mul(itemsize)
            .ok_or_else(|| invalid_argument("shape too large"))?;
        if needed > size {
            return Err(invalid_argument(format!(
                "shape {} of {itemsize}-byte items needs {needed} bytes; the block has {size}",
                shape.str()?
            )));
        }
        let prefix = bytes.get_item(pyo3::types::PySlice::new(py, 0, needed as isize, 1))?;
        prefix
            .call_method1("view", (dtype,))?
            .call_method1("reshape", (shape,))
    }

    /// Copies a bytes-like object to ``offset`` (bounds-checked; recorded for ``Pool.flush`` on
    /// non-coherent memory).
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        interface::with_bytes(data, |bytes| {
            if bytes.len() >= LARGE_COPY {
                py.detach(|| self.state.block.lock().write(offset, bytes))
            } else {
                self.state.block.lock().write(offset, bytes)
            }
        })?
        .map_err(to_py)
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
        let (offset, size) = interface::range(offset, size, self.state.size)?;
        let mut out = vec![0u8; size as usize];
        let block = &self.state.block;
        if out.len() >= LARGE_COPY {
            py.detach(|| block.lock().read(offset, &mut out))
        } else {
            block.lock().read(offset, &mut out)
        }
        .map_err(to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Makes host writes in ``[offset, offset + size)`` (default: the whole block) visible to the
    /// device, however they were made (NumPy views included). On coherent memory only a store
    /// fence.
    #[pyo3(signature = (offset = 0, size = None))]
    fn flush(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        let (offset, size) = interface::range(offset, size, self.state.size)?;
        interface::drain_host_writes();
        if !self.state.non_coherent || size == 0 {
            return Ok(());
        }
        py.detach(|| {
            let mut block = self.state.block.lock();
            block.after_write(offset, size)?;
            block.flush()
        })
        .map_err(to_py)
    }

    /// Makes device writes in ``[offset, offset + size)`` (default: the whole block) visible to
    /// host reads. A no-op on coherent memory.
    #[pyo3(signature = (offset = 0, size = None))]
    fn invalidate(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        let (offset, size) = interface::range(offset, size, self.state.size)?;
        if !self.state.non_coherent || size == 0 {
            return Ok(());
        }
        py.detach(|| self.state.block.lock().before_read(offset, size))
            .map_err(to_py)
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
            self.state.clone(),
            dlpack::wants_versioned(max_version)?,
        )
    }

    fn __repr__(&self) -> String {
        match self.state.device_ptr {
            Some(p) => format!("<vkgdr.Block {} bytes at device {p:#x}>", self.state.size),
            None => format!(
                "<vkgdr.Block {} bytes at host {:#x}>",
                self.state.size, self.state.host_ptr
            ),
        }
    }
}

/// Copies of at least this many bytes release the GIL (they take microseconds or more).
const LARGE_COPY: usize = 64 << 10;
