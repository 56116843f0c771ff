//! `Peer` and what it attaches (`AttachedMemory`, `AttachedPool` and its `SharedBlock`s,
//! `AttachedLane`): the side of sharing that connects to an owner's `ShareServer` and writes its
//! memory with CPU stores through a Vulkan device of its own ([`vkgdr::share::Peer`]). Nothing
//! here loads CUDA.
//!
//! Every attachment's Python object holds a [`Slot`]: the library's object while it is usable,
//! and after `detach()` (or `release()`, or the `Peer`'s `close()`) either nothing, or, while an
//! export of its memory is alive, the library's object kept until the last export ends. The
//! exports are counted exactly, as `Block.free()` counts its own ([`crate::exports`]): a NumPy
//! array made through `__array_interface__` (`np.asarray(m)`, `m.view(...)`, a `memoryview` of
//! either) holds an export in the interface's `data` array, never the attachment's object. So no
//! view ever writes through an unmapped page, the owner takes nothing back while one may still
//! write, and an attachment with no view alive ends at once, whatever else refers to its object.
//! The slot holds the connection too (a [`vkgdr::share::Peer`]), so that it closes once the
//! `Peer` is closed and no attachment holds it any more.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use vkgdr::ring::core::RingError;
use vkgdr::Mapping;

use crate::errors::{share_error_in, to_py, vkgdr_error};
use crate::exports::{self, ExportRef, Exported, Exports};
use crate::fork::{Home, HomeBound};
use crate::interface::{self, maybe_detached};
use crate::share::{deadline, passed, slice};

/// How an attachment's use ended.
#[derive(Debug, Clone, Copy)]
enum End {
    /// `detach()` (or the end of its `with` block).
    Detached,
    /// A shared block's `release()`.
    Released,
    /// The `Peer` it came through was closed.
    PeerClosed,
}

/// Why a call on an attachment failed. Turned into an exception only once the slot's lock is
/// released and the GIL held again: making one takes the GIL, and a thread holding the GIL may
/// be waiting for the lock.
enum Failure {
    Ended(End),
    Library(vkgdr::Error),
}

impl From<vkgdr::Error> for Failure {
    fn from(e: vkgdr::Error) -> Failure {
        Failure::Library(e)
    }
}

/// What an attachment's Python object holds (see the module docs); what its exports hold too.
struct Slot<T> {
    state: Mutex<State<T>>,
    /// The live exports of its memory and whether its use ended ([`crate::exports`]): marked
    /// ended under the state's lock, when the state leaves `Live`.
    exports: Exports,
    home: Home,
    /// The class, for the errors.
    what: &'static str,
}

enum State<T> {
    Live(T),
    /// Ended while an export of its memory is alive: dropped when the last one ends.
    Kept(T, End),
    Ended(End),
}

impl<T> Slot<T> {
    fn new(value: T, what: &'static str) -> Arc<Slot<T>> {
        Arc::new(Slot {
            state: Mutex::new(State::Live(value)),
            exports: Exports::new(),
            home: Home::here(),
            what,
        })
    }

    /// The exception for a `Failure` of this slot's object.
    fn error(&self, f: Failure) -> PyErr {
        match f {
            Failure::Ended(End::Detached) => vkgdr_error(format!("the {} is detached", self.what)),
            Failure::Ended(End::Released) => vkgdr_error(format!(
                "the {} was released (given back to the owner)",
                self.what
            )),
            Failure::Ended(End::PeerClosed) => vkgdr_error(format!(
                "the {} is detached: the Peer it was attached through was closed",
                self.what
            )),
            Failure::Library(e) => to_py(e),
        }
    }

    /// Runs `f` on the live object under the slot's lock; needs no GIL. Check [`Slot::here`]
    /// first.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> vkgdr::Result<R>) -> Result<R, Failure> {
        match &mut *self.state.lock() {
            State::Live(t) => Ok(f(t)?),
            State::Kept(_, end) | State::Ended(end) => Err(Failure::Ended(*end)),
        }
    }

    /// `Ok` in the process that attached it.
    fn here(&self) -> PyResult<()> {
        self.home.check(self.what)
    }

    /// [`with`](Self::with), as a Python result (holding the GIL).
    fn call<R>(&self, f: impl FnOnce(&mut T) -> vkgdr::Result<R>) -> PyResult<R> {
        self.here()?;
        self.with(f).map_err(|e| self.error(e))
    }

    /// Ends the use of the slot as `how`. Hands back the live object when no export of its
    /// memory is alive (the caller drops it, without the GIL); keeps it for the last export to
    /// drop otherwise. None as well once the use had ended: a second end changes nothing.
    fn end(&self, how: End) -> Option<T> {
        let mut state = self.state.lock();
        let t = match std::mem::replace(&mut *state, State::Ended(how)) {
            State::Live(t) => t,
            other => {
                *state = other;
                return None;
            }
        };
        // Under the lock: an export ending meanwhile waits for it in `release_last`, and then
        // finds the object kept.
        if self.exports.free() {
            Some(t)
        } else {
            *state = State::Kept(t, how);
            None
        }
    }

    fn is_ended(&self) -> bool {
        !matches!(*self.state.lock(), State::Live(_))
    }
}

impl<T: Send + 'static> Slot<T> {
    /// A new export of the slot's memory, for an array interface; the slot's error once its
    /// use ended.
    fn export(self: &Arc<Self>) -> PyResult<ExportRef> {
        self.here()?;
        let state = self.state.lock();
        if let State::Kept(_, end) | State::Ended(end) = &*state {
            let end = *end;
            drop(state);
            return Err(self.error(Failure::Ended(end)));
        }
        // Live, under the lock that `end` marks the exports freed under: this cannot fail.
        let slot: Arc<dyn Exported> = self.clone();
        let export = ExportRef::new(slot);
        drop(state);
        export.ok_or_else(|| vkgdr_error(format!("the {} has ended", self.what)))
    }

    /// `__array_interface__` of the slot's `len` bytes at `host_ptr`, through an export.
    fn array_interface<'py>(
        self: &Arc<Self>,
        py: Python<'py>,
        host_ptr: usize,
        len: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let export = self.export()?;
        exports::host_interface(py, export, host_ptr, len, "|u1")
    }
}

impl<T: Send + 'static> Exported for Slot<T> {
    fn exports(&self) -> &Exports {
        &self.exports
    }

    fn release_last(&self) {
        if !self.home.is_here() {
            return; // a forked child: the parent's object is leaked with the slot
        }
        let kept = {
            let mut state = self.state.lock();
            match std::mem::replace(&mut *state, State::Ended(End::Detached)) {
                State::Kept(t, how) => {
                    *state = State::Ended(how);
                    Some(t)
                }
                other => {
                    *state = other;
                    None
                }
            }
        };
        drop(kept);
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        if !self.home.is_here() {
            // A forked child: the object's drop would detach the parent's attachment (the
            // connection is shared) and free the parent's mapping.
            let state = std::mem::replace(self.state.get_mut(), State::Ended(End::Detached));
            std::mem::forget(state);
        }
    }
}

/// What `Peer.close()` does to each attachment made through it.
trait Close: Send + Sync {
    fn close_by_peer(&self);
}

impl<T: Send> Close for Slot<T> {
    fn close_by_peer(&self) {
        drop(self.end(End::PeerClosed));
    }
}

/// The attachments made through a `Peer` (and its pools), for its `close()`.
#[derive(Default)]
struct Registry {
    closed: bool,
    attachments: Vec<Weak<dyn Close>>,
}

type Attachments = Arc<Mutex<Registry>>;

/// Adds `slot` to `registry`; an error (the new attachment dropped by the caller) if the Peer
/// was closed meanwhile.
fn register(registry: &Attachments, slot: Arc<dyn Close>) -> PyResult<()> {
    let mut r = registry.lock();
    if r.closed {
        return Err(vkgdr_error("the Peer is closed"));
    }
    r.attachments.retain(|w| w.strong_count() > 0);
    r.attachments.push(Arc::downgrade(&slot));
    Ok(())
}

/// Ends an attachment's use (a `detach()` or `release()` called from Python): the library's
/// object goes at once unless an export of its memory is alive, else with the last export
/// ([`Slot::end`]). Calling it again changes nothing.
fn end_for<T: Send>(py: Python<'_>, slot: &Slot<T>, how: End) -> PyResult<()> {
    slot.here()?;
    let ended = slot.end(how);
    // Detaching sends a message to the owner: no GIL needed.
    py.detach(|| drop(ended));
    Ok(())
}

/// Reads what the owner sent meanwhile (revocations); a hang-up is not an error here.
fn poll_quietly(peer: &vkgdr::share::Peer) {
    let _ = peer.poll();
}

/// The connection an attachment holds.
type Conn = vkgdr::share::Peer;

/// A connection to an owner's ``ShareServer`` at ``path``, made with no CUDA: the regions
/// attached through it are mapped through a Vulkan device of this process, opened by the GPU's
/// UUID when the first region arrives. ``vkgdr.attach(path)`` is the same.
///
/// ``Peer(path, *, timeout=10.0)``: ``timeout`` bounds each wait for the owner's answer (an
/// attach, a block request). ``attach_memory(name)``, ``attach_pool(name)`` and
/// ``attach_lane(name)`` attach what the owner shares under ``name``; refusals raise
/// ``ShareError`` (``reason``: ``"no_such_region"``, ``"busy"``, ``"not_allowed"``, ...).
/// ``close()`` (or the end of a ``with`` block) detaches everything attached through it (memory
/// that NumPy views may still use stays mapped until they are gone) and closes the connection.
///
/// In a child of another process made with ``fork()`` (``multiprocessing``'s fork start
/// method) a ``Peer`` of the parent cannot be used: make one in the child.
#[pyclass(module = "vkgdr", name = "Peer", frozen)]
pub struct Peer {
    peer: Mutex<Option<HomeBound<vkgdr::share::Peer>>>,
    attachments: Attachments,
    path: PathBuf,
    timeout: f64,
    home: Home,
}

impl Peer {
    /// The connection, or why it cannot be used.
    fn peer(&self) -> PyResult<vkgdr::share::Peer> {
        self.home.check("Peer")?;
        self.peer
            .lock()
            .as_ref()
            .map(|p| vkgdr::share::Peer::clone(p))
            .ok_or_else(|| vkgdr_error("the Peer is closed"))
    }

    /// An attach call's error, naming the region.
    fn attach_error(e: vkgdr::Error, name: &str) -> PyErr {
        let context = format!("attaching {name:?}");
        match e {
            vkgdr::Error::Share(_) => crate::errors::to_py_in(e, &context),
            // A device that cannot be opened or memory that cannot be imported: the sharing
            // failed, whatever the driver said.
            e => share_error_in(e, &context),
        }
    }
}

#[pymethods]
impl Peer {
    #[new]
    #[pyo3(signature = (path, *, timeout = 10.0))]
    fn new(py: Python<'_>, path: PathBuf, timeout: f64) -> PyResult<Self> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(crate::errors::invalid_argument(format!(
                "timeout {timeout} is not > 0"
            )));
        }
        let wait = Duration::from_secs_f64(timeout.min(1e9));
        let peer = py
            .detach(|| vkgdr::share::Peer::connect_with(&path, None, wait))
            .map_err(|e| {
                share_error_in(
                    e,
                    &format!(
                        "cannot connect to a vkgdr.ShareServer at {}",
                        path.display()
                    ),
                )
            })?;
        Ok(Peer {
            peer: Mutex::new(Some(HomeBound::new(peer))),
            attachments: Attachments::default(),
            path,
            timeout,
            home: Home::here(),
        })
    }

    /// The socket path it connected to.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// How long each wait for the owner's answer may last, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.timeout
    }

    /// The owner's ``(pid, uid, gid)``, by the kernel's word (``SO_PEERCRED``).
    #[getter]
    fn owner(&self) -> PyResult<(i32, u32, u32)> {
        let c = self.peer()?.owner();
        Ok((c.pid, c.uid, c.gid))
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.peer.lock().is_none()
    }

    /// Attaches the raw memory the owner shares as ``name`` (an ``AttachedMemory``: all of it,
    /// mapped into this process).
    fn attach_memory(&self, py: Python<'_>, name: &str) -> PyResult<AttachedMemory> {
        let peer = self.peer()?;
        let memory = py
            .detach(|| peer.attach_memory(name))
            .map_err(|e| Self::attach_error(e, name))?;
        let made = AttachedMemory {
            mapped: MappedBytes {
                size: memory.len(),
                host_ptr: memory.host_ptr() as usize,
                non_coherent: memory.memory().is_non_coherent(),
                slot: Slot::new((memory, peer), "AttachedMemory"),
            },
            name: name.to_owned(),
        };
        register(&self.attachments, made.mapped.slot.clone())?;
        Ok(made)
    }

    /// Attaches the pool the owner shares as ``name`` (an ``AttachedPool``: blocks come from
    /// its ``request`` and ``next_block``).
    fn attach_pool(&self, py: Python<'_>, name: &str) -> PyResult<AttachedPool> {
        let peer = self.peer()?;
        let pool = py
            .detach(|| peer.attach_pool(name))
            .map_err(|e| Self::attach_error(e, name))?;
        let made = AttachedPool {
            quota: pool.quota(),
            name: name.to_owned(),
            slot: Slot::new((Arc::new(pool), peer), "AttachedPool"),
            attachments: Arc::clone(&self.attachments),
        };
        register(&self.attachments, made.slot.clone())?;
        Ok(made)
    }

    /// Attaches a lane of the ring the owner shares as ``name`` (an ``AttachedLane``: this
    /// process becomes its producer, starting where the lane's last producer stopped).
    /// ``ShareError`` with reason ``"busy"`` when every lane is taken.
    fn attach_lane(&self, py: Python<'_>, name: &str) -> PyResult<AttachedLane> {
        let peer = self.peer()?;
        let lane = py
            .detach(|| peer.attach_lane(name))
            .map_err(|e| Self::attach_error(e, name))?;
        let made = AttachedLane {
            number: lane.lane(),
            capacity: lane.capacity(),
            max_record: lane.core().max_record(),
            start: lane.start(),
            name: name.to_owned(),
            slot: Slot::new((Arc::new(lane), peer), "AttachedLane"),
        };
        register(&self.attachments, made.slot.clone())?;
        Ok(made)
    }

    /// Reads what the owner sent meanwhile (revocations, blocks sent unasked) without waiting.
    /// Raises ``ShareError`` (reason ``"disconnected"``) once the owner has hung up.
    fn poll(&self, py: Python<'_>) -> PyResult<()> {
        let peer = self.peer()?;
        py.detach(|| peer.poll()).map_err(to_py)
    }

    /// Detaches everything attached through this peer (memory that NumPy views may still use
    /// stays mapped until they are gone) and closes the connection once nothing uses it.
    /// Closing twice does nothing; the attachments' methods raise ``VkgdrError`` after.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.home.check("Peer")?;
        let peer = self.peer.lock().take();
        let attachments = {
            let mut r = self.attachments.lock();
            r.closed = true;
            std::mem::take(&mut r.attachments)
        };
        py.detach(|| {
            for a in attachments.iter().filter_map(Weak::upgrade) {
                a.close_by_peer();
            }
            drop(peer);
        });
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.Peer of {}{}>",
            self.path.display(),
            if self.closed() { ", closed" } else { "" }
        )
    }
}

/// What differs between the two attachments of mapped bytes (`AttachedMemory`, `SharedBlock`):
/// the library's object in their slot. [`MappedBytes`] holds the buffer API they share.
trait Mapped: Send + 'static {
    /// The library's mapping.
    type Memory: Mapping;

    /// The mapping, for a write, read, flush or invalidate.
    fn mapping(&mut self) -> &mut Self::Memory;

    /// Whether the owner revoked it, after reading what the owner sent meanwhile.
    fn poll_revoked(&self) -> bool;
}

/// What an `AttachedMemory`'s slot holds: the memory, and the connection.
type MemoryParts = (vkgdr::share::AttachedMemory, Conn);

/// What a `SharedBlock`'s slot holds: the block, its pool's attachment (which lasts while any of
/// its blocks is held), and the connection (which keeps the chunks mapped while the block is kept
/// for an export).
type BlockParts = (
    vkgdr::share::SharedBlock,
    Arc<vkgdr::share::AttachedPool>,
    Conn,
);

impl Mapped for MemoryParts {
    type Memory = vkgdr::share::AttachedMemory;

    fn mapping(&mut self) -> &mut Self::Memory {
        &mut self.0
    }

    fn poll_revoked(&self) -> bool {
        poll_quietly(&self.1);
        self.0.is_revoked()
    }
}

impl Mapped for BlockParts {
    type Memory = vkgdr::share::SharedBlock;

    fn mapping(&mut self) -> &mut Self::Memory {
        &mut self.0
    }

    fn poll_revoked(&self) -> bool {
        poll_quietly(&self.2);
        self.0.is_revoked()
    }
}

/// The buffer API that `AttachedMemory` and `SharedBlock` share, written once: the slot with
/// the library's mapping, and what is known of the mapping without the slot's lock.
struct MappedBytes<T> {
    slot: Arc<Slot<T>>,
    size: u64,
    host_ptr: usize,
    non_coherent: bool,
}

impl<T: Mapped> MappedBytes<T> {
    /// The host address of the first byte, while the attachment is usable.
    fn host_ptr(&self) -> PyResult<usize> {
        self.slot.call(|_| Ok(()))?;
        Ok(self.host_ptr)
    }

    /// Whether the owner revoked it (what the owner sent is read first).
    fn is_revoked(&self) -> PyResult<bool> {
        self.slot.call(|t| Ok(t.poll_revoked()))
    }

    /// `__array_interface__` of all its bytes, through an export.
    fn array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.slot.array_interface(py, self.host_ptr, self.size)
    }

    /// A typed NumPy view of `obj` (the Python object holding `self`); `what` names it in errors.
    fn view<'py>(
        &self,
        obj: &Bound<'py, PyAny>,
        what: &str,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.slot.call(|_| Ok(()))?;
        interface::typed_view(obj, self.size, what, dtype, shape)
    }

    /// Copies a bytes-like object to `offset` (the library's bounds check, flush and refusal
    /// once revoked), without the GIL when long.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        self.slot.here()?;
        let slot = &self.slot;
        interface::with_bytes(data, |bytes| {
            maybe_detached(py, bytes.len(), || {
                slot.with(|t| t.mapping().write(offset, bytes))
            })
        })?
        .map_err(|e| self.slot.error(e))
    }

    /// Reads `size` bytes from `offset` (default: to the end), invalidated first on
    /// non-coherent memory.
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        size: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.slot.here()?;
        let (offset, size) = interface::range(offset, size, self.size)?;
        let slot = &self.slot;
        PyBytes::new_with(py, size as usize, |out| {
            // No other code can see the new bytes object yet: filling it without the GIL is safe.
            maybe_detached(py, out.len(), || {
                slot.with(|t| t.mapping().read(offset, out))
            })
            .map_err(|e| self.slot.error(e))
        })
    }

    /// Makes host writes in `[offset, offset + size)` visible to the owner: a store fence, and
    /// on non-coherent memory a flush.
    fn flush(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        self.slot.here()?;
        let (offset, size) = interface::range(offset, size, self.size)?;
        interface::drain_host_writes();
        if !self.non_coherent || size == 0 {
            return self.slot.call(|_| Ok(()));
        }
        py.detach(|| self.slot.with(|t| t.mapping().after_write(offset, size)))
            .map_err(|e| self.slot.error(e))
    }

    /// Makes the owner's writes in `[offset, offset + size)` visible to host reads through
    /// views: an invalidate on non-coherent memory, nothing on coherent memory.
    fn invalidate(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        self.slot.here()?;
        let (offset, size) = interface::range(offset, size, self.size)?;
        if !self.non_coherent || size == 0 {
            return self.slot.call(|_| Ok(()));
        }
        py.detach(|| self.slot.with(|t| t.mapping().before_read(offset, size)))
            .map_err(|e| self.slot.error(e))
    }
}

/// Raw memory of an owner, mapped into this process (``Peer.attach_memory``): ``len()`` bytes,
/// ``np.asarray(mem)`` (``uint8``, through ``__array_interface__``), ``view(dtype, shape)``,
/// ``write(data, offset=0)``, ``read(offset=0, size=None)``, ``flush`` and ``invalidate``
/// (needed on non-coherent memory: ``is_coherent``). Writes land in the owner's memory; on
/// NVIDIA's BAR memory, a kernel of the owner launched after them sees them.
///
/// ``is_revoked`` says whether the owner revoked it (it reads what the owner sent first); then
/// ``write`` raises ``ShareError`` (reason ``"revoked"``). Stores through NumPy views are the
/// program's to stop. ``detach()`` (or the end of a ``with`` block, or collection) detaches it:
/// at once when no NumPy array made from it is alive, whatever else refers to the object, else
/// when the last is gone (arrays hold the mapping, not the object: ``Block.free``'s exact rule).
#[pyclass(module = "vkgdr", name = "AttachedMemory", frozen)]
pub struct AttachedMemory {
    mapped: MappedBytes<MemoryParts>,
    name: String,
}

#[pymethods]
impl AttachedMemory {
    fn __len__(&self) -> usize {
        self.mapped.size as usize
    }

    /// The size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.mapped.size
    }

    /// The name the owner shares it under.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The host address of the first byte (this process's mapping).
    #[getter]
    fn host_ptr(&self) -> PyResult<usize> {
        self.mapped.host_ptr()
    }

    /// Whether host writes need no ``flush`` (nor the owner's writes an ``invalidate``).
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.mapped.non_coherent
    }

    /// Whether the owner revoked it (what the owner sent is read first).
    #[getter]
    fn is_revoked(&self) -> PyResult<bool> {
        self.mapped.is_revoked()
    }

    /// Whether ``detach()`` was called (or the Peer closed).
    #[getter]
    fn is_detached(&self) -> bool {
        self.mapped.slot.is_ended()
    }

    /// NumPy's array interface: ``size`` writable bytes (``uint8``) of the mapping. Its
    /// ``data`` is a NumPy array that holds the mapping (an export, counted): arrays made from it
    /// keep the mapping, not this object (see the class docs).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.mapped.array_interface(py)
    }

    /// A typed NumPy view: ``dtype`` (default ``uint8``) and ``shape`` (default: as many
    /// elements as fit). The view keeps the mapping.
    #[pyo3(signature = (dtype = None, shape = None))]
    fn view<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().mapped.view(slf.as_any(), "memory", dtype, shape)
    }

    /// Copies a bytes-like object to ``offset`` (bounds-checked, flushed on non-coherent
    /// memory); ``ShareError`` once the owner revoked it.
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        self.mapped.write(py, data, offset)
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
        self.mapped.read(py, offset, size)
    }

    /// Makes host writes in ``[offset, offset + size)`` (default: all of it) visible to the
    /// owner, however they were made (NumPy views included). On coherent memory only a store
    /// fence.
    #[pyo3(signature = (offset = 0, size = None))]
    fn flush(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        self.mapped.flush(py, offset, size)
    }

    /// Makes the owner's writes in ``[offset, offset + size)`` (default: all of it) visible to
    /// host reads through views. A no-op on coherent memory.
    #[pyo3(signature = (offset = 0, size = None))]
    fn invalidate(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        self.mapped.invalidate(py, offset, size)
    }

    /// Detaches it: at once, or, when a NumPy array made from it is alive, once the last is gone
    /// (see the class docs). Detaching twice does nothing; other methods raise ``VkgdrError`` after.
    fn detach(&self, py: Python<'_>) -> PyResult<()> {
        end_for(py, &self.mapped.slot, End::Detached)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        end_for(py, &self.mapped.slot, End::Detached)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.AttachedMemory {:?}, {} bytes{}>",
            self.name,
            self.mapped.size,
            if self.mapped.slot.is_ended() {
                ", detached"
            } else {
                ""
            }
        )
    }
}

/// A pool of an owner (``Peer.attach_pool``): where shared blocks come from. ``request(size,
/// align=64)`` asks the owner for one (``ShareError`` with reason ``"quota"`` past the
/// ``quota`` of bytes this process may hold at once, ``"out_of_memory"``, ...);
/// ``next_block(timeout=None)`` takes the next block the owner sent unasked (None if none came
/// in time). ``detach()`` stops taking blocks; the attachment lasts until every block taken is
/// released.
#[pyclass(module = "vkgdr", name = "AttachedPool", frozen)]
pub struct AttachedPool {
    slot: Arc<Slot<(Arc<vkgdr::share::AttachedPool>, Conn)>>,
    attachments: Attachments,
    name: String,
    quota: u64,
}

impl AttachedPool {
    fn pool(&self) -> PyResult<(Arc<vkgdr::share::AttachedPool>, Conn)> {
        self.slot
            .call(|(p, peer)| Ok((Arc::clone(p), peer.clone())))
    }

    fn block(
        &self,
        block: vkgdr::share::SharedBlock,
        (pool, peer): (Arc<vkgdr::share::AttachedPool>, Conn),
    ) -> PyResult<SharedBlock> {
        let non_coherent = peer.device().is_some_and(|d| d.is_non_coherent());
        let made = SharedBlock {
            token: block.token(),
            mapped: MappedBytes {
                size: block.len(),
                host_ptr: block.host_ptr() as usize,
                non_coherent,
                slot: Slot::new((block, pool, peer), "SharedBlock"),
            },
        };
        register(&self.attachments, made.mapped.slot.clone())?;
        Ok(made)
    }
}

#[pymethods]
impl AttachedPool {
    /// The most bytes of blocks this process may hold at once.
    #[getter]
    fn quota(&self) -> u64 {
        self.quota
    }

    /// The name the owner shares it under.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Whether the owner revoked it (what the owner sent is read first): requests are refused
    /// then, and writes through its blocks.
    #[getter]
    fn is_revoked(&self) -> PyResult<bool> {
        self.slot.call(|(p, peer)| {
            poll_quietly(peer);
            Ok(p.is_revoked())
        })
    }

    /// Whether ``detach()`` was called (or the Peer closed).
    #[getter]
    fn is_detached(&self) -> bool {
        self.slot.is_ended()
    }

    /// Asks the owner for a block of ``size`` bytes aligned to ``align`` (a ``SharedBlock``),
    /// waiting up to the Peer's ``timeout`` for the answer without holding the GIL.
    #[pyo3(signature = (size, align = 64))]
    fn request(&self, py: Python<'_>, size: u64, align: u64) -> PyResult<SharedBlock> {
        let pool = self.pool()?;
        let block = py
            .detach(|| pool.0.request(size, align))
            .map_err(|e| crate::errors::to_py_in(e, &format!("request from {:?}", self.name)))?;
        self.block(block, pool)
    }

    /// The next block the owner sent unasked (``ShareServer.send_block``), waiting up to
    /// ``timeout`` seconds (None: without limit) without holding the GIL; None if none came.
    /// Ctrl-C interrupts the wait.
    #[pyo3(signature = (timeout = None))]
    fn next_block(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<SharedBlock>> {
        let pool = self.pool()?;
        let deadline = deadline(timeout)?;
        loop {
            let wait = slice(deadline);
            match py.detach(|| pool.0.next_block(wait)) {
                Ok(block) => return self.block(block, pool).map(Some),
                Err(vkgdr::Error::Share(vkgdr::share::ShareError::Timeout { .. })) => {}
                Err(e) => return Err(to_py(e)),
            }
            if passed(deadline) {
                return Ok(None);
            }
            py.check_signals()?;
        }
    }

    /// Stops taking blocks. The attachment lasts until every block taken from it is released
    /// (the owner frees none of them before). Detaching twice does nothing.
    fn detach(&self, py: Python<'_>) -> PyResult<()> {
        self.slot.here()?;
        let pool = self.slot.end(End::Detached);
        py.detach(|| drop(pool));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.detach(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.AttachedPool {:?}, quota {} bytes{}>",
            self.name,
            self.quota,
            if self.slot.is_ended() {
                ", detached"
            } else {
                ""
            }
        )
    }
}

/// A block of an owner's pool lent to this process (``AttachedPool.request`` or
/// ``next_block``): the same buffer API as ``AttachedMemory`` (``len()``, ``np.asarray``,
/// ``view``, ``write``, ``read``, ``flush``, ``invalidate``), its ``token`` (the owner's name
/// for it), ``is_revoked``. ``release()`` (or the end of a ``with`` block, or collection) gives
/// it back to the owner: at once when no NumPy array made from it is alive, whatever else refers
/// to the object, else when the last is gone. Releasing twice does nothing; other methods raise
/// ``VkgdrError`` after.
#[pyclass(module = "vkgdr", name = "SharedBlock", frozen)]
pub struct SharedBlock {
    mapped: MappedBytes<BlockParts>,
    token: u64,
}

#[pymethods]
impl SharedBlock {
    fn __len__(&self) -> usize {
        self.mapped.size as usize
    }

    /// The size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.mapped.size
    }

    /// The owner's name for the block (``ShareServer.take_returned(token)``).
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// The host address of the first byte (this process's mapping).
    #[getter]
    fn host_ptr(&self) -> PyResult<usize> {
        self.mapped.host_ptr()
    }

    /// Whether host writes need no ``flush``.
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.mapped.non_coherent
    }

    /// Whether the owner took the block (or its pool) back (what the owner sent is read
    /// first): ``write`` raises ``ShareError`` then.
    #[getter]
    fn is_revoked(&self) -> PyResult<bool> {
        self.mapped.is_revoked()
    }

    /// Whether ``release()`` was called (or the Peer closed).
    #[getter]
    fn is_released(&self) -> bool {
        self.mapped.slot.is_ended()
    }

    /// NumPy's array interface: ``size`` writable bytes (``uint8``). Arrays made from it keep
    /// the block, not this object (see the class docs).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.mapped.array_interface(py)
    }

    /// A typed NumPy view: ``dtype`` (default ``uint8``) and ``shape`` (default: as many
    /// elements as fit). The view keeps the block.
    #[pyo3(signature = (dtype = None, shape = None))]
    fn view<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().mapped.view(slf.as_any(), "block", dtype, shape)
    }

    /// Copies a bytes-like object to ``offset`` (bounds-checked, flushed on non-coherent
    /// memory); ``ShareError`` once the owner revoked the block.
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
        self.mapped.write(py, data, offset)
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
        self.mapped.read(py, offset, size)
    }

    /// Makes host writes in ``[offset, offset + size)`` (default: the whole block) visible to
    /// the owner, however they were made (NumPy views included).
    #[pyo3(signature = (offset = 0, size = None))]
    fn flush(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        self.mapped.flush(py, offset, size)
    }

    /// Makes the owner's writes in ``[offset, offset + size)`` (default: the whole block)
    /// visible to host reads through views. A no-op on coherent memory.
    #[pyo3(signature = (offset = 0, size = None))]
    fn invalidate(&self, py: Python<'_>, offset: u64, size: Option<u64>) -> PyResult<()> {
        self.mapped.invalidate(py, offset, size)
    }

    /// Gives the block back to the owner: at once, or, when a NumPy array made from it is
    /// alive, once the last is gone (see the class docs). Releasing twice does nothing.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        end_for(py, &self.mapped.slot, End::Released)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        end_for(py, &self.mapped.slot, End::Released)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.SharedBlock token {}, {} bytes{}>",
            self.token,
            self.mapped.size,
            if self.mapped.slot.is_ended() {
                ", released"
            } else {
                ""
            }
        )
    }
}

/// A lane of an owner's ring, produced into by this process (``Peer.attach_lane``): its
/// records go straight into the owner's memory through this process's mapping, its tail to the
/// owner, who checks it and passes it on to the ring's consumer.
///
/// ``push(data, timeout=None)`` appends one record from any thread and returns its sequence
/// number (the lane's: numbered on from ``start[1]``); ``push_batch(records, timeout=None)``
/// appends a list with one fence and one tail. Both wait for the consumer to free space up to
/// ``timeout`` seconds (None: without limit; 0: not at all) without holding the GIL, raising
/// ``RingFullError`` when the time is up, and ``ShareError`` when the lane is stopped (revoked,
/// the consumer gone, a tail refused: ``stop_reason``) or the owner hung up. ``accepted`` is
/// ``(tail, seq)`` as far as the owner has passed records on; ``published`` where this
/// producer's records end. ``detach()`` (or the end of a ``with`` block) gives the lane back at
/// its last accepted record.
#[pyclass(module = "vkgdr", name = "AttachedLane", frozen)]
pub struct AttachedLane {
    slot: Arc<Slot<(Arc<vkgdr::share::AttachedLane>, Conn)>>,
    name: String,
    number: u32,
    capacity: u64,
    max_record: u32,
    start: vkgdr::share::lane::LanePosition,
}

/// Whether a push that failed with `e` may succeed later (space may free).
fn waits(e: &RingError) -> bool {
    matches!(e, RingError::Full | RingError::Timeout | RingError::Claimed)
}

impl AttachedLane {
    fn live_lane(&self) -> PyResult<(Arc<vkgdr::share::AttachedLane>, Conn)> {
        self.slot
            .call(|(l, peer)| Ok((Arc::clone(l), peer.clone())))
    }

    /// The exception for a push's failure `e`: why the lane stopped, when it did.
    fn push_error(lane: &vkgdr::share::AttachedLane, e: RingError) -> PyErr {
        match (e, lane.stop_reason()) {
            (RingError::Stopped, Some(why)) => to_py(vkgdr::Error::Share(why)),
            (e, _) => to_py(e.into()),
        }
    }

    /// Between two waits: Ctrl-C, and a hang-up of the owner, end them.
    fn between_waits(py: Python<'_>, peer: &Conn) -> PyResult<()> {
        py.check_signals()?;
        match peer.poll() {
            Err(e @ vkgdr::Error::Share(vkgdr::share::ShareError::Disconnected)) => {
                Err(crate::errors::to_py_in(e, "the lane's owner is gone"))
            }
            _ => Ok(()),
        }
    }
}

#[pymethods]
impl AttachedLane {
    /// The lane's number in the owner's ring.
    #[getter]
    fn lane(&self) -> u32 {
        self.number
    }

    /// The name the owner shares the ring under.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The lane's region size in bytes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The largest record payload the lane takes.
    #[getter]
    fn max_record(&self) -> u32 {
        self.max_record
    }

    /// ``(tail, seq)`` where this producer started: the end of the lane's records so far and
    /// the sequence number of its first record.
    #[getter]
    fn start(&self) -> (u64, u64) {
        (self.start.tail, self.start.seq)
    }

    /// The sequence number the next record gets (``VkgdrError`` while another thread's push is
    /// in the middle of a record).
    #[getter]
    fn next_seq(&self) -> PyResult<u64> {
        let (lane, _) = self.live_lane()?;
        let seq = lane.producer().map(|p| p.next_seq());
        seq.map_err(|e| match e {
            vkgdr::Error::Ring(RingError::Claimed) => vkgdr_error(
                "the lane is in the middle of another thread's push: read next_seq after it",
            ),
            e => to_py(e),
        })
    }

    /// ``(tail, seq)``: how far the owner has checked this producer's records and passed them
    /// on to the consumer.
    #[getter]
    fn accepted(&self) -> PyResult<(u64, u64)> {
        let a = self.live_lane()?.0.accepted();
        Ok((a.tail, a.seq))
    }

    /// Where this producer's published records end.
    #[getter]
    fn published(&self) -> PyResult<u64> {
        Ok(self.live_lane()?.0.core().published())
    }

    /// The consumer's head, as the owner last mirrored it.
    #[getter]
    fn head(&self) -> PyResult<u64> {
        Ok(self.live_lane()?.0.head())
    }

    /// Whether the owner stopped serving the lane (revoked it, refused a tail, or its consumer
    /// is gone): records pushed from then on reach no consumer.
    #[getter]
    fn is_stopped(&self) -> PyResult<bool> {
        let (lane, peer) = self.live_lane()?;
        poll_quietly(&peer);
        Ok(lane.is_stopped())
    }

    /// Why the lane stopped, in words (None while it is served).
    #[getter]
    fn stop_reason(&self) -> PyResult<Option<String>> {
        let (lane, peer) = self.live_lane()?;
        poll_quietly(&peer);
        Ok(lane.stop_reason().map(|e| e.to_string()))
    }

    /// Whether ``detach()`` was called (or the Peer closed).
    #[getter]
    fn is_detached(&self) -> bool {
        self.slot.is_ended()
    }

    /// Appends one record holding the bytes of ``data`` (bytes-like, not empty) and publishes
    /// it; returns its sequence number. Waits as the class docs say.
    #[pyo3(signature = (data, timeout = None))]
    fn push(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<u64> {
        let (lane, peer) = self.live_lane()?;
        let deadline = deadline(timeout)?;
        interface::with_bytes(data, |payload| -> PyResult<u64> {
            // The common case first: one library call with the GIL held.
            match lane.push(payload, Some(Duration::ZERO)) {
                Ok(seq) => return Ok(seq),
                Err(vkgdr::Error::Ring(e)) if waits(&e) => {}
                Err(vkgdr::Error::Ring(e)) => return Err(Self::push_error(&lane, e)),
                Err(e) => return Err(to_py(e)),
            }
            loop {
                let wait = slice(deadline);
                match py.detach(|| lane.push(payload, Some(wait))) {
                    Ok(seq) => return Ok(seq),
                    Err(vkgdr::Error::Ring(e)) if waits(&e) => {}
                    Err(vkgdr::Error::Ring(e)) => return Err(Self::push_error(&lane, e)),
                    Err(e) => return Err(to_py(e)),
                }
                if passed(deadline) {
                    return Err(to_py(RingError::Full.into()));
                }
                Self::between_waits(py, &peer)?;
            }
        })?
    }

    /// Appends every record of ``records`` (an iterable of bytes-like objects, none empty) and
    /// publishes them with one fence and one tail (in pieces, while waiting, when they do not
    /// fit at once). Returns how many were written, numbered on from ``next_seq``. Waits as
    /// ``push`` does; on an error the records before the failing one are published.
    #[pyo3(signature = (records, timeout = None))]
    fn push_batch(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let (lane, peer) = self.live_lane()?;
        let deadline = deadline(timeout)?;
        // `bytes` objects are taken as they are; other bytes-like objects are copied once.
        let objects = records
            .try_iter()?
            .map(|r| interface::to_bytes(&r?))
            .collect::<PyResult<Vec<_>>>()?;
        let payloads: Vec<&[u8]> = objects.iter().map(|b| b.as_bytes()).collect();
        let mut done = 0usize;
        loop {
            let rest = &payloads[done..];
            let wait = slice(deadline);
            let (result, n) = py.detach(|| match lane.producer() {
                Ok(mut p) => {
                    let first = p.next_seq();
                    let result = p.push_batch(rest.iter().copied(), Some(wait));
                    (
                        result.map(drop).map_err(vkgdr::Error::from),
                        p.next_seq() - first,
                    )
                }
                Err(e) => (Err(e), 0),
            });
            // Each record takes one sequence number: how far the batch got.
            done += n as usize;
            match result {
                Ok(()) => return Ok(done as u64),
                Err(vkgdr::Error::Ring(e)) if waits(&e) => {}
                Err(vkgdr::Error::Ring(e)) => return Err(Self::push_error(&lane, e)),
                Err(e) => return Err(to_py(e)),
            }
            if passed(deadline) {
                return Err(to_py(RingError::Full.into()));
            }
            Self::between_waits(py, &peer)?;
        }
    }

    /// Gives the lane back: the owner takes it back at its last accepted record (a push in
    /// progress on another thread finishes first). Detaching twice does nothing.
    fn detach(&self, py: Python<'_>) -> PyResult<()> {
        self.slot.here()?;
        let lane = self.slot.end(End::Detached);
        py.detach(|| drop(lane));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.detach(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.AttachedLane {:?} lane {}, {} bytes{}>",
            self.name,
            self.number,
            self.capacity,
            if self.slot.is_ended() {
                ", detached"
            } else {
                ""
            }
        )
    }
}
