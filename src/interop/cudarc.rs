//! Interop with [cudarc](https://docs.rs/cudarc) (cargo feature `cudarc`): vkgdr memory in cudarc
//! kernel launches and copies, one CUDA context shared by both.
//!
//! - **One context.** [`Gpu::from_cudarc`] opens a `Gpu` in a cudarc `CudaContext` (primary or
//!   not) and keeps that `Arc` alive; [`Gpu::to_cudarc`] gives the `CudaContext` of a `Gpu`
//!   opened on a device's primary context. Neither creates a second context.
//! - **Views.** [`CudarcMemory::cuda_view`] / [`CudarcMemory::cuda_view_mut`] turn a [`Block`]
//!   or a [`RawMemory`] into a typed device view bound to a cudarc stream: [`BarView`] /
//!   [`BarViewMut`] implement cudarc's `DevicePtr` / `DevicePtrMut` (so `memcpy_dtoh`,
//!   `memcpy_htod`, `memset_zeros` accept them) and are kernel arguments
//!   (`launch_builder(..).arg(&view)`). A [`RingDeviceView`] is a kernel argument too: it pushes
//!   the six parameters of `kernels/ring.cu`'s persistent consumers.
//! - **Ordering with flushes.** Making a view flushes the memory's pending CPU writes (a no-op on
//!   coherent memory), so every kernel launched or copy queued while the view lives sees the
//!   CPU's bytes. Dropping a view waits for its stream, so the CPU never writes, reads or frees
//!   memory that work queued through the view may still use; reads through [`Mapping`] then
//!   invalidate as always. Keep the view alive across the launches that use it, and launch them
//!   on the view's stream (a copy on another stream synchronises that stream instead).
//!
//! ```no_run
//! use cudarc::driver::CudaContext;
//! use vkgdr::cudarc::CudarcMemory;
//! use vkgdr::{Gpu, Mapping, OpenOptions, Pool, PoolConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = CudaContext::new(0)?;
//! let stream = ctx.default_stream();
//! let gpu = Gpu::from_cudarc(&ctx, OpenOptions::default())?;
//! let pool = Pool::new(gpu, PoolConfig::default())?;
//! let mut block = pool.alloc(4096, 256)?;
//! block.write_pod(0, &[1u32, 2, 3])?; // the CPU writes through the BAR
//! let view = block.cuda_view::<u32>(&stream)?; // flushed: GPU work from here on sees it
//! let back = stream.clone_dtoh(&view)?; // a cudarc copy reads it on the GPU
//! assert_eq!(&back[..3], &[1, 2, 3]);
//! # Ok(()) }
//! ```

use std::marker::PhantomData;
use std::sync::Arc;

use ::cudarc::driver::{
    sys, CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, DriverError,
    LaunchArgs, PushKernelArg, SyncOnDrop,
};

use crate::core::handle::assert_send_sync;
use crate::error::{Error, InvalidArgument, Result};
use crate::mapping::gpu::{Gpu, OpenOptions};
use crate::mapping::memory::RawMemory;
use crate::mapping::Mapping;
use crate::pool::Block;
use crate::ring::RingDeviceView;

/// Turns a cudarc error into [`Error::Cuda`] with the driver's name for it.
pub fn driver_error(call: &'static str, e: DriverError) -> Error {
    let name = e
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    Error::Cuda {
        call,
        code: e.0 as i32,
        name,
    }
}

impl Gpu {
    /// Opens the device of a cudarc context *in* that context: vkgdr imports its memory there, so
    /// cudarc kernels and copies on any stream of `ctx` use it directly. The handle keeps the
    /// `Arc<CudaContext>` alive until it and every allocation made through it are gone; it
    /// creates and retains no context of its own.
    pub fn from_cudarc(ctx: &Arc<CudaContext>, options: OpenOptions) -> Result<Gpu> {
        ctx.check_err()
            .map_err(|e| driver_error("CudaContext::check_err", e))?;
        let owner: Arc<dyn std::any::Any + Send + Sync> = ctx.clone();
        // SAFETY: `ctx` owns a live context of device `ctx.cu_device()` (cudarc destroys or
        // releases it only when the last `Arc` drops), and `owner` is a clone of that `Arc`.
        unsafe { Gpu::open_owned_context(ctx.cu_ctx().cast(), ctx.cu_device(), options, owner) }
    }

    /// The cudarc context of this handle's context, for a handle on its device's primary context
    /// ([`Gpu::open`], [`Gpu::open_uuid`], [`Gpu::open_cu_device`]): cudarc's `CudaContext::new`
    /// retains the same primary context, so both work in one context. Handles in another context
    /// get [`Error::InvalidArgument`] (open them with [`Gpu::from_cudarc`] instead).
    ///
    /// cudarc finds `libcuda.so.1` by its own search (it ignores `VKGDR_CUDA_LIBRARY`); if it
    /// cannot, this is an error rather than cudarc's panic.
    pub fn to_cudarc(&self) -> Result<Arc<CudaContext>> {
        let driver = self.driver();
        let ordinal = (0..driver.device_count()?)
            .find(|&i| driver.device(i).ok() == Some(self.cu_device()))
            .ok_or(InvalidArgument::NoOrdinal)?;
        let context = self.cu_context()?;
        let made = std::panic::catch_unwind(|| CudaContext::new(ordinal as usize))
            .map_err(|_| Error::LibraryNotFound {
                name: "libcuda.so.1",
                reason: "cudarc could not load the CUDA driver".into(),
            })?
            .map_err(|e| driver_error("CudaContext::new", e))?;
        if made.cu_ctx().cast() != context {
            return Err(InvalidArgument::HandleContextNotPrimary.into());
        }
        Ok(made)
    }
}

/// A typed, read-only device view of vkgdr memory (a [`Block`] or [`RawMemory`]) bound to a
/// cudarc stream: a cudarc `DevicePtr` and kernel argument. It borrows the memory, so the CPU
/// cannot write it meanwhile; dropping it waits for the stream (see the [module docs](self)).
pub struct BarView<'m, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    /// The borrow of the memory.
    _memory: PhantomData<&'m ()>,
    /// `T` as a type only: no `T` value lives on the host side of a view, so the view is
    /// `Send + Sync` by its fields (a device address, a length, an `Arc<CudaStream>`).
    _element: PhantomData<fn() -> T>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<BarView<'static, u32>>();

/// A typed, writable device view of vkgdr memory bound to a cudarc stream: a cudarc
/// `DevicePtrMut` and kernel argument. It borrows the memory exclusively; dropping it waits for
/// the stream, after which [`Mapping`] reads (which invalidate) see what the GPU wrote.
pub struct BarViewMut<'m, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    /// The exclusive borrow of the memory.
    _memory: PhantomData<&'m mut ()>,
    /// As for [`BarView`], invariant in `T`.
    _element: PhantomData<fn(T) -> T>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<BarViewMut<'static, u32>>();

impl<T> std::fmt::Debug for BarView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BarView")
            .field("device_ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl<T> std::fmt::Debug for BarViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BarViewMut")
            .field("device_ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

/// Waits for `stream` when a view drops; a failure is recorded in the context (cudarc's own
/// convention: the next checked call on it returns the error).
fn wait_on_drop(stream: &CudaStream) {
    stream.context().record_err(stream.synchronize());
}

impl<T> Drop for BarView<'_, T> {
    fn drop(&mut self) {
        wait_on_drop(&self.stream);
    }
}

impl<T> Drop for BarViewMut<'_, T> {
    fn drop(&mut self) {
        wait_on_drop(&self.stream);
    }
}

/// What a copy or launch through a view on `stream` must do once queued: nothing on the view's
/// own stream (the view waits for it when it drops); wait for any other stream at once.
fn sync_for<'a>(own: &CudaStream, stream: &'a CudaStream) -> SyncOnDrop<'a> {
    if stream == own {
        SyncOnDrop::Record(None)
    } else {
        SyncOnDrop::Sync(Some(stream))
    }
}

macro_rules! view_common {
    ($view:ident) => {
        impl<T> $view<'_, T> {
            /// The device address.
            pub fn device_ptr_raw(&self) -> u64 {
                self.ptr
            }

            /// Number of `T` elements (the whole elements that fit in the memory).
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view holds no whole element.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The stream the view is bound to.
            pub fn stream(&self) -> &Arc<CudaStream> {
                &self.stream
            }

            /// Waits for the stream and reports its error (dropping the view waits too, but can
            /// only record a failure in the context).
            pub fn finish(self) -> Result<()> {
                self.stream
                    .synchronize()
                    .map_err(|e| driver_error("cuStreamSynchronize", e))
            }
        }

        impl<T> DeviceSlice<T> for $view<'_, T> {
            fn len(&self) -> usize {
                self.len
            }
            fn stream(&self) -> &Arc<CudaStream> {
                &self.stream
            }
        }

        impl<T> DevicePtr<T> for $view<'_, T> {
            fn device_ptr<'a>(
                &'a self,
                stream: &'a CudaStream,
            ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
                (self.ptr, sync_for(&self.stream, stream))
            }
        }

        // SAFETY: pushes a pointer to the view's `CUdeviceptr`, which lives as long as the borrow
        // `'b` of the view, itself outliving the launch arguments `'a`; a device pointer is what
        // a `T*` kernel parameter takes.
        unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b $view<'c, T>> for LaunchArgs<'a> {
            #[inline(always)]
            fn arg(&mut self, arg: &'b $view<'c, T>) -> &mut Self {
                <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
            }
        }
    };
}

view_common!(BarView);
view_common!(BarViewMut);

impl<T> DevicePtrMut<T> for BarViewMut<'_, T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, sync_for(&self.stream, stream))
    }
}

// SAFETY: as for `&BarViewMut` (see `view_common!`).
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut BarViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut BarViewMut<'c, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}

// SAFETY: pushes pointers to six `u64` fields of the view, which live as long as the borrow `'b`
// (outliving the launch arguments `'a`); they match, in order and size, the parameters
// `(data, capacity, tail, stop, head_out, result)` of `ring_consume_persistent` and
// `ring_consume_persistent_mirrored` in kernels/ring.cu (pointers and `unsigned long long`).
unsafe impl<'a, 'b: 'a> PushKernelArg<&'b RingDeviceView> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, view: &'b RingDeviceView) -> &mut Self {
        for word in [
            &view.data,
            &view.capacity,
            &view.tail,
            &view.stop,
            &view.head,
            &view.result,
        ] {
            <Self as PushKernelArg<&'b u64>>::arg(self, word);
        }
        self
    }
}

/// The checks every view makes: a device address, `T`'s alignment; the element count.
fn view_parts<T>(ptr: Option<u64>, bytes: u64) -> Result<(u64, usize)> {
    let ptr = ptr.ok_or(InvalidArgument::NoDevicePointer)?;
    let size = std::mem::size_of::<T>() as u64;
    if size == 0 {
        return Err(InvalidArgument::ZeroSizedElement {
            type_name: std::any::type_name::<T>(),
        }
        .into());
    }
    let align = std::mem::align_of::<T>() as u64;
    if !ptr.is_multiple_of(align) {
        return Err(InvalidArgument::MisalignedDeviceAddress {
            address: ptr,
            type_name: std::any::type_name::<T>(),
            align,
        }
        .into());
    }
    let len = usize::try_from(bytes / size).map_err(|_| InvalidArgument::TooManyElements {
        bytes,
        element: size,
    })?;
    Ok((ptr, len))
}

/// vkgdr memory that cudarc can use: [`Block`] and [`RawMemory`].
pub trait CudarcMemory: Mapping {
    /// The device address, if the memory has one.
    fn cuda_device_ptr(&self) -> Option<u64>;

    /// Pushes pending CPU writes to the device (a no-op on coherent memory).
    fn flush_for_gpu(&self) -> Result<()>;

    /// A read-only view of the memory as `T` elements (the whole ones that fit) for work on
    /// `stream`, which must belong to the context the memory was imported into. Flushes pending
    /// CPU writes first, so work queued while the view lives sees them.
    ///
    /// Fails with [`Error::InvalidArgument`] for memory without a device pointer, a device
    /// address not aligned for `T`, or a zero-sized `T`.
    fn cuda_view<T: DeviceRepr>(&self, stream: &Arc<CudaStream>) -> Result<BarView<'_, T>> {
        let (ptr, len) = view_parts::<T>(self.cuda_device_ptr(), self.len())?;
        self.flush_for_gpu()?;
        Ok(BarView {
            ptr,
            len,
            stream: stream.clone(),
            _memory: PhantomData,
            _element: PhantomData,
        })
    }

    /// A writable view (see [`CudarcMemory::cuda_view`]); the memory is borrowed exclusively
    /// until the view drops, which waits for `stream`.
    fn cuda_view_mut<T: DeviceRepr>(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<BarViewMut<'_, T>> {
        let (ptr, len) = view_parts::<T>(self.cuda_device_ptr(), self.len())?;
        self.flush_for_gpu()?;
        Ok(BarViewMut {
            ptr,
            len,
            stream: stream.clone(),
            _memory: PhantomData,
            _element: PhantomData,
        })
    }
}

impl CudarcMemory for Block {
    fn cuda_device_ptr(&self) -> Option<u64> {
        self.device_ptr()
    }
    fn flush_for_gpu(&self) -> Result<()> {
        self.flush()
    }
}

impl CudarcMemory for RawMemory {
    fn cuda_device_ptr(&self) -> Option<u64> {
        Some(self.device_ptr())
    }
    /// Flushes the whole allocation: writes through [`RawMemory::host_ptr`] are not tracked.
    fn flush_for_gpu(&self) -> Result<()> {
        self.flush(0, self.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_check_pointer_alignment_and_count_whole_elements() {
        assert_eq!(
            view_parts::<u32>(Some(0x1000), 4097).unwrap(),
            (0x1000, 1024)
        );
        assert_eq!(view_parts::<u8>(Some(0x1001), 3).unwrap(), (0x1001, 3));
        assert_eq!(view_parts::<u64>(Some(0x1000), 7).unwrap(), (0x1000, 0));
        let e = view_parts::<u64>(Some(0x1004), 64).unwrap_err();
        assert!(e.to_string().contains("not aligned for u64"), "{e}");
        let e = view_parts::<u32>(None, 64).unwrap_err();
        assert!(e.to_string().contains("no device pointer"), "{e}");
        let e = view_parts::<()>(Some(0x1000), 64).unwrap_err();
        assert!(e.to_string().contains("zero-sized"), "{e}");
    }
}
