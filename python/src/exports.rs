//! The exact rule of `free()`: memory goes back once it was freed and no export of it is alive.
//!
//! Every way bytes leave an object as something a consumer keeps (a NumPy array, a DLPack
//! tensor, a CuPy or PyTorch array) holds an [`ExportRef`]: a counted reference on the
//! allocation's [`Exports`]. So "is a view alive?" is a number, not a guess:
//!
//! | export | what the consumer holds | counted by |
//! |:---|:---|:---|
//! | `np.asarray(obj)`, `obj.view(...)`, `memoryview(np.asarray(obj))` (`__array_interface__`) | the interface's `data`: a NumPy array whose base is an [`ExportOwner`], never `obj` (NumPy keeps the `data` object, not the object it read the interface of, when `data` is a buffer) | the owner's [`ExportRef`], dropped with the last array |
//! | `__dlpack__` (`np.from_dlpack`, `torch.from_dlpack`, `cupy.from_dlpack`) | the capsule, then the consumer's managed tensor | an [`ExportRef`] in the tensor, dropped by its deleter |
//! | `__cuda_array_interface__` (`cupy.asarray(obj)`, `torch.as_tensor(obj)`, Numba) | `obj` itself: the interface has no owner field, its data is an integer | `obj` pins the memory: one [`ExportRef`] that `obj` holds until it is collected |
//!
//! A consumer of the CUDA array interface holds the very object the program holds, and nothing
//! tells the two apart. So reading that interface pins the memory to the object: `free()` marks it
//! freed, and it goes back when the object is collected (when neither the program nor any such
//! view can reach it any more), or at once from a later `free()` of memory never so read.
//!
//! `Block` ([`crate::pool`]) counts all three. The sharing classes `AttachedMemory` and
//! `SharedBlock` ([`crate::peer`]) offer only the first, and count it the same way: their
//! `detach()` and `release()` are this rule's `free()`. vkgdr 0.1's `RawMemory` cannot use it
//! ([`crate::lifetime`] says why).
//!
//! The count and the freed mark share one atomic word, so `free()` and the last export's end
//! agree on who releases, from any thread (a DLPack deleter may run on a thread without the
//! GIL): exactly one of them sees "freed and no export left", and no export can begin once the
//! memory is freed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::interface;

/// The freed mark; the bits below it count the live exports.
const FREED: u64 = 1 << 63;

/// How many exports of one allocation are alive, and whether it was freed.
#[derive(Debug, Default)]
pub struct Exports(AtomicU64);

impl Exports {
    /// No export, not freed.
    pub const fn new() -> Exports {
        Exports(AtomicU64::new(0))
    }

    /// Counts one more export; false (nothing counted) once the memory is freed.
    fn begin(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & FREED == 0).then_some(w + 1)
            })
            .is_ok()
    }

    /// Ends one export; true when it was the last of freed memory: the caller releases it.
    fn end(&self) -> bool {
        self.0.fetch_sub(1, Ordering::AcqRel) == FREED | 1
    }

    /// Marks the memory freed; true when this call did and no export is alive: the caller
    /// releases it now. A second call returns false.
    pub fn free(&self) -> bool {
        self.0.fetch_or(FREED, Ordering::AcqRel) == 0
    }

    /// How many exports are alive now.
    #[cfg(test)]
    fn live(&self) -> u64 {
        self.0.load(Ordering::Acquire) & !FREED
    }
}

/// Memory whose exports are counted: what an [`ExportRef`] keeps alive and releases.
pub trait Exported: Send + Sync + 'static {
    /// The allocation's count.
    fn exports(&self) -> &Exports;

    /// Hands the memory back: it was freed and its last export has just ended. Called once, by
    /// whoever ended it, from any thread, with or without the GIL.
    fn release_last(&self);
}

/// One live export: a reference on the memory that counts in its [`Exports`]. When the last
/// of freed memory drops, the memory goes back.
pub struct ExportRef(Arc<dyn Exported>);

impl ExportRef {
    /// A new export of `memory`; `None` once it is freed.
    pub fn new(memory: Arc<dyn Exported>) -> Option<ExportRef> {
        memory.exports().begin().then(|| ExportRef(memory))
    }
}

impl Drop for ExportRef {
    fn drop(&mut self) {
        if self.0.exports().end() {
            self.0.release_last();
        }
    }
}

/// What a NumPy array made through `__array_interface__` keeps: one export of the memory, and
/// the interface of its bytes (``|u1``). Only the `data` array of an interface holds one.
#[pyclass(module = "vkgdr._vkgdr", name = "_ExportOwner", frozen)]
pub struct ExportOwner {
    _export: ExportRef,
    host_ptr: usize,
    len: u64,
}

#[pymethods]
impl ExportOwner {
    /// NumPy's array interface of the exported bytes.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        interface::array_interface(py, self.host_ptr, self.len, "|u1")
    }

    fn __len__(&self) -> usize {
        self.len as usize
    }
}

/// `__array_interface__` of `len` writable bytes at `host_ptr` whose `data` is a NumPy array
/// holding `export` (see the module docs): an array made from it keeps that array, not the object
/// whose interface was read. `typestr` as [`interface::array_interface`] takes it.
pub fn host_interface<'py>(
    py: Python<'py>,
    export: ExportRef,
    host_ptr: usize,
    len: u64,
    typestr: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let owner = Bound::new(
        py,
        ExportOwner {
            _export: export,
            host_ptr,
            len,
        },
    )?;
    let data = interface::numpy(py)?.call_method1("asarray", (owner,))?;
    let d = PyDict::new(py);
    d.set_item("shape", (len,))?;
    d.set_item("typestr", typestr)?;
    d.set_item("data", data)?; // a writable buffer over the same bytes
    d.set_item("version", 3)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Counted {
        exports: Exports,
        released: AtomicUsize,
    }

    impl Exported for Counted {
        fn exports(&self) -> &Exports {
            &self.exports
        }
        fn release_last(&self) {
            self.released.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counted() -> Arc<Counted> {
        Arc::new(Counted {
            exports: Exports::new(),
            released: AtomicUsize::new(0),
        })
    }

    #[test]
    fn free_without_exports_releases_at_once_and_once() {
        let m = counted();
        assert!(m.exports.free());
        assert!(!m.exports.free(), "a second free releases nothing");
        assert!(
            ExportRef::new(m.clone()).is_none(),
            "no export of freed memory"
        );
    }

    #[test]
    fn the_last_export_of_freed_memory_releases() {
        let m = counted();
        let a = ExportRef::new(m.clone()).unwrap();
        let b = ExportRef::new(m.clone()).unwrap();
        drop(a);
        assert_eq!(m.exports.live(), 1);
        assert!(!m.exports.free(), "an export is alive: kept");
        assert_eq!(m.released.load(Ordering::SeqCst), 0);
        drop(b);
        assert_eq!(m.released.load(Ordering::SeqCst), 1);
        let c = counted();
        drop(ExportRef::new(c.clone()).unwrap());
        assert_eq!(
            c.released.load(Ordering::SeqCst),
            0,
            "never freed: not released"
        );
        assert!(c.exports.free());
    }

    #[test]
    fn free_and_the_last_export_race_to_exactly_one_release() {
        for _ in 0..1000 {
            let m = counted();
            let e = ExportRef::new(m.clone()).unwrap();
            let m2 = m.clone();
            let t = std::thread::spawn(move || m2.exports.free());
            drop(e);
            let freed_released = t.join().unwrap();
            let total = m.released.load(Ordering::SeqCst) + usize::from(freed_released);
            assert_eq!(total, 1);
        }
    }
}
