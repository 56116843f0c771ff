//! `VulkanDevice`: an owner of Vulkan memory with no CUDA, for CPU-only owners of shared
//! memory (and the sharing tests on Mesa's lavapipe, which has no GPU): `VulkanMemory` to share
//! raw, pools to share blocks of, and `CheckingRing`, a ring whose lanes remote producers fill
//! and a CPU thread of this process consumes, checking every record as the GPU's checking
//! consumers do.

use std::sync::Arc;

use parking_lot::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use vkgdr::share::{CheckingLanes, LaneSource};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::Mapping;

use crate::errors::{invalid_argument, to_py};
use crate::fork::Home;
use crate::interface::{self, maybe_detached};
use crate::pool::{config, Pool};

/// A Vulkan device opened with no CUDA: an owner of shared memory for processes without a GPU
/// context (``ShareServer(vulkan_device, path)``), and what the sharing tests run on where
/// there is no GPU (Mesa's lavapipe is a real Vulkan device with exportable memory).
///
/// ``VulkanDevice(*, device_index=None, require_coherent=False, force_non_coherent=False)``
/// picks the n-th Vulkan device (default: the first suitable one). Its memory has a host
/// mapping and no device pointer: kernels cannot use it through this process (a process with
/// the GPU's CUDA context owns memory with ``vkgdr.Vkgdr`` instead).
#[pyclass(module = "vkgdr", name = "VulkanDevice", frozen)]
pub struct VulkanDevice {
    /// `ManuallyDrop` so that a child forked from the owner leaks it instead of destroying the
    /// parent's device.
    context: std::mem::ManuallyDrop<Arc<VulkanContext>>,
    home: Home,
}

impl VulkanDevice {
    /// The device, in the process that opened it.
    pub(crate) fn context(&self) -> PyResult<&Arc<VulkanContext>> {
        self.home.check("VulkanDevice")?;
        Ok(&self.context)
    }
}

impl Drop for VulkanDevice {
    fn drop(&mut self) {
        if self.home.is_here() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.context) };
        }
    }
}

#[pymethods]
impl VulkanDevice {
    #[new]
    #[pyo3(signature = (*, device_index = None, require_coherent = false, force_non_coherent = false))]
    fn new(
        py: Python<'_>,
        device_index: Option<usize>,
        require_coherent: bool,
        force_non_coherent: bool,
    ) -> PyResult<Self> {
        let selector = device_index.map_or(DeviceSelector::FirstSuitable, DeviceSelector::Index);
        let options = MemoryOptions {
            require_coherent,
            force_non_coherent,
        };
        let context = py
            .detach(|| VulkanContext::new(selector, options))
            .map_err(to_py)?;
        Ok(VulkanDevice {
            context: std::mem::ManuallyDrop::new(context),
            home: Home::here(),
        })
    }

    /// Allocates ``size`` bytes of exportable, host-mapped memory (``ShareServer.share_memory``
    /// shares it). It is freed when the object and every view of it are gone.
    fn alloc(&self, py: Python<'_>, size: u64) -> PyResult<VulkanMemory> {
        let context = self.context()?;
        let memory = py.detach(|| context.allocate(size)).map_err(to_py)?;
        Ok(VulkanMemory {
            size: memory.size(),
            host_ptr: memory.as_ptr() as usize,
            non_coherent: memory.is_non_coherent(),
            memory: std::mem::ManuallyDrop::new(Mutex::new(memory)),
            home: Home::here(),
        })
    }

    /// A pool over this device (``Pool.vulkan_only`` on this device's memory type), which a
    /// ``ShareServer`` of this device shares; keyword arguments as for ``Pool``.
    #[pyo3(signature = (**config))]
    fn pool(&self, config: Option<&Bound<'_, PyDict>>) -> PyResult<Pool> {
        let context = self.context()?;
        let cfg = self::config(config)?;
        Pool::on_vulkan(Arc::clone(context), cfg)
    }

    /// For tests and CPU-only owners: a ring of ``lanes`` lanes of ``capacity`` bytes each (a
    /// power of two of at least 4096) that ``ShareServer.share_ring`` lends to producers in
    /// other processes, consumed by a thread of this process that checks every record as the
    /// GPU's checking consumers do (sealed test payloads: sequence number, checksum, body).
    #[pyo3(signature = (capacity, lanes = 1))]
    fn checking_ring(&self, py: Python<'_>, capacity: u64, lanes: u32) -> PyResult<CheckingRing> {
        CheckingRing::new(py, self.context()?, capacity, lanes)
    }

    /// The device's name, as Vulkan reports it.
    #[getter]
    fn name(&self) -> &str {
        &self.context.device_info().name
    }

    /// The 16-byte device UUID (CUDA's for the same GPU).
    #[getter]
    fn uuid<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.context.device_info().uuid)
    }

    /// Whether memory of this device needs no flush or invalidate.
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.context.is_non_coherent()
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.VulkanDevice {} ({})>",
            self.context.device_info().name,
            if self.context.is_non_coherent() {
                "non-coherent"
            } else {
                "coherent"
            }
        )
    }
}

/// Host-mapped memory of a ``VulkanDevice`` (no device pointer): ``len()`` bytes,
/// ``np.asarray(mem)`` (``uint8``), ``view(dtype, shape)``, ``write(data, offset=0)``,
/// ``read(offset=0, size=None)``, ``flush`` and ``invalidate``. Freed when the object and every
/// view of it are gone (views hold the object); a ``ShareServer`` that shares it keeps the
/// memory allocated for its peers even then.
#[pyclass(module = "vkgdr", name = "VulkanMemory", frozen)]
pub struct VulkanMemory {
    /// Locked by writes (`&mut` in the library) and reads. `ManuallyDrop` so that a child
    /// forked from the owner leaks it instead of freeing the parent's memory.
    memory: std::mem::ManuallyDrop<Mutex<vkgdr::vulkan::VulkanMemory>>,
    size: u64,
    host_ptr: usize,
    non_coherent: bool,
    home: Home,
}

impl VulkanMemory {
    /// The memory, in the process that allocated it (a forked child has no mapping of it).
    pub(crate) fn memory(&self) -> PyResult<&Mutex<vkgdr::vulkan::VulkanMemory>> {
        self.home.check("VulkanMemory")?;
        Ok(&self.memory)
    }
}

impl Drop for VulkanMemory {
    fn drop(&mut self) {
        if self.home.is_here() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.memory) };
        }
    }
}

#[pymethods]
impl VulkanMemory {
    fn __len__(&self) -> usize {
        self.size as usize
    }

    /// The size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The host address of the first byte.
    #[getter]
    fn host_ptr(&self) -> usize {
        self.host_ptr
    }

    /// Whether host writes need no ``flush`` (nor another process's writes an ``invalidate``).
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.non_coherent
    }

    /// NumPy's array interface: ``size`` writable bytes (``uint8``) of the host mapping.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.memory()?;
        interface::array_interface(py, self.host_ptr, self.size, "|u1")
    }

    /// A typed NumPy view: ``dtype`` (default ``uint8``) and ``shape`` (default: as many
    /// elements as fit). The view keeps the memory alive.
    #[pyo3(signature = (dtype = None, shape = None))]
    fn view<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().memory()?;
        interface::typed_view(slf.as_any(), slf.get().size, "memory", dtype, shape)
    }

    /// Copies a bytes-like object to ``offset`` (bounds-checked, flushed on non-coherent
    /// memory).
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        let memory = self.memory()?;
        interface::with_bytes(data, |bytes| {
            maybe_detached(py, bytes.len(), || memory.lock().write(offset, bytes))
        })?
        .map_err(to_py)
    }

    /// Reads ``size`` bytes from ``offset`` (default: to the end), invalidated first on
    /// non-coherent memory.
    #[pyo3(signature = (offset = 0, size = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        size: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let memory = self.memory()?;
        let (offset, size) = interface::range(offset, size, self.size)?;
        PyBytes::new_with(py, size as usize, |out| {
            // No other code can see the new bytes object yet: filling it without the GIL is safe.
            maybe_detached(py, out.len(), || memory.lock().read(offset, out)).map_err(to_py)
        })
    }

    /// Makes host writes in ``[offset, offset + size)`` (default: all of it) visible to other
    /// processes' mappings, however they were made (NumPy views included).
    #[pyo3(signature = (offset = 0, size = None))]
    fn flush(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        let memory = self.memory()?;
        let (offset, size) = interface::range(offset, size, self.size)?;
        interface::drain_host_writes();
        if !self.non_coherent || size == 0 {
            return Ok(());
        }
        py.detach(|| memory.lock().flush(offset, size))
            .map_err(to_py)
    }

    /// Makes other processes' writes in ``[offset, offset + size)`` (default: all of it)
    /// visible to host reads through views. A no-op on coherent memory.
    #[pyo3(signature = (offset = 0, size = None))]
    fn invalidate(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        let memory = self.memory()?;
        let (offset, size) = interface::range(offset, size, self.size)?;
        if !self.non_coherent || size == 0 {
            return Ok(());
        }
        py.detach(|| memory.lock().invalidate(offset, size))
            .map_err(to_py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.VulkanMemory {} bytes at host {:#x}>",
            self.size, self.host_ptr
        )
    }
}

// --- CheckingRing -------------------------------------------------------------------------------

/// For tests and CPU-only owners (``VulkanDevice.checking_ring(capacity, lanes=1)``): a ring
/// whose lanes ``ShareServer.share_ring`` lends to producers in other processes (a lane each),
/// and whose consumer is a thread of this process that checks every record as
/// ``ring_check_lanes`` of ``kernels/ring.cu`` does (the library's ``CheckingLanes``): records
/// carry sealed test payloads (an 8-byte sequence number, the 8-byte checksum of the body, the
/// body), numbered from 0 in each lane. ``results_of(lane)`` are its result words
/// (``DeviceRing.results_of``'s numbering: records, checksum sum, errors, next sequence number,
/// position). ``stop()`` lets the consumer finish what was published and exit; producers then
/// see their lane stopped.
#[pyclass(module = "vkgdr", name = "CheckingRing", frozen)]
pub struct CheckingRing {
    /// `ManuallyDrop` so that a child forked from the owner leaks it instead of stopping (and
    /// joining) the parent's consumer thread, which does not exist there.
    lanes: std::mem::ManuallyDrop<Arc<CheckingLanes>>,
    capacity: u64,
    home: Home,
}

impl CheckingRing {
    fn new(
        py: Python<'_>,
        context: &Arc<VulkanContext>,
        capacity: u64,
        lanes: u32,
    ) -> PyResult<CheckingRing> {
        let lanes = py
            .detach(|| CheckingLanes::new(context, capacity, lanes))
            .map_err(to_py)?;
        Ok(CheckingRing {
            lanes: std::mem::ManuallyDrop::new(lanes),
            capacity,
            home: Home::here(),
        })
    }

    /// What `ShareServer.share_ring` lends lanes from.
    pub(crate) fn source(&self) -> PyResult<Arc<dyn LaneSource>> {
        self.home.check("CheckingRing")?;
        Ok(Arc::clone(&*self.lanes) as Arc<dyn LaneSource>)
    }

    /// `lane`, if the ring has it.
    fn lane(&self, lane: usize) -> PyResult<usize> {
        let n = self.lanes.lanes();
        if lane < n {
            Ok(lane)
        } else {
            Err(invalid_argument(format!(
                "lane {lane} does not exist (the ring has {n})"
            )))
        }
    }
}

impl Drop for CheckingRing {
    fn drop(&mut self) {
        if self.home.is_here() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.lanes) };
        }
        // A forked child: the consumer thread is the parent's, not this process's, and so are
        // the lanes' mappings: leaked.
    }
}

#[pymethods]
impl CheckingRing {
    /// Number of lanes.
    #[getter]
    fn lanes(&self) -> usize {
        self.lanes.lanes()
    }

    /// Capacity of each lane in bytes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How far the consumer has consumed lane ``lane``.
    fn head_of(&self, lane: usize) -> PyResult<u64> {
        Ok(self.lanes.head(self.lane(lane)?).unwrap_or(0))
    }

    /// Where the records published in lane ``lane`` end (what the owner accepted from its
    /// producers).
    fn published_of(&self, lane: usize) -> PyResult<u64> {
        Ok(self
            .lanes
            .published(self.lane(lane)?)
            .map(|p| p.tail)
            .unwrap_or(0))
    }

    /// Whether lane ``lane`` is lent to a producer now.
    fn is_lent(&self, lane: usize) -> PyResult<bool> {
        Ok(self.lanes.is_lent(self.lane(lane)?))
    }

    /// Lane ``lane``'s 8 result words: records, checksum sum, errors, next sequence number,
    /// position, then zeros.
    fn results_of(&self, lane: usize) -> PyResult<Vec<u64>> {
        Ok(self
            .lanes
            .results_of(self.lane(lane)?)
            .map(|r| r.to_vec())
            .unwrap_or_default())
    }

    /// Lets the consumer consume what was published and exit, and waits for it (without the
    /// GIL). Producers see their lanes stopped from then on. Stopping twice does nothing.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.home.check("CheckingRing")?;
        py.detach(|| self.lanes.stop());
        Ok(())
    }

    /// Whether ``stop()`` was called.
    #[getter]
    fn is_stopped(&self) -> bool {
        self.lanes.is_stopped()
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.CheckingRing {} bytes x {} lanes{}>",
            self.capacity,
            self.lanes.lanes(),
            if self.lanes.is_stopped() {
                ", stopped"
            } else {
                ""
            }
        )
    }
}
