//! A value one Python thread uses at a time and that closes once: the producer of a ring lane,
//! the consumer of a device → host lane.

use parking_lot::Mutex;
use pyo3::PyResult;

use crate::errors::vkgdr_error;

/// What a call finds in a [`ThreadSlot`] without waiting for it.
pub(crate) enum Peek<R> {
    /// The value is open; what the caller read of it.
    Open(R),
    /// `close()` was called.
    Closed,
    /// Another thread is using it now.
    InUse,
}

/// One thread at a time, never waited for: a thread blocked on the lock while holding the GIL
/// would stop the holder, whose waits need the GIL back between slices. `None` once closed.
pub(crate) struct ThreadSlot<T> {
    /// The Python class's name, for the errors ("the LaneConsumer is closed").
    class: &'static str,
    value: Mutex<Option<T>>,
}

impl<T> ThreadSlot<T> {
    pub(crate) fn new(class: &'static str, value: T) -> Self {
        ThreadSlot {
            class,
            value: Mutex::new(Some(value)),
        }
    }

    /// Runs `f` on the open value, or raises why it cannot: closed, or in use by another
    /// thread (`busy` says what to do about that).
    pub(crate) fn with<R>(&self, busy: &str, f: impl FnOnce(&mut T) -> PyResult<R>) -> PyResult<R> {
        let mut guard = self.value.try_lock().ok_or_else(|| {
            vkgdr_error(format!(
                "the {} is in use by another thread: {busy}",
                self.class
            ))
        })?;
        let value = guard
            .as_mut()
            .ok_or_else(|| vkgdr_error(format!("the {} is closed", self.class)))?;
        f(value)
    }

    /// Reads the value without waiting, for `__repr__` and the like.
    pub(crate) fn peek<R>(&self, f: impl FnOnce(&T) -> R) -> Peek<R> {
        match self.value.try_lock() {
            Some(g) => match g.as_ref() {
                Some(v) => Peek::Open(f(v)),
                None => Peek::Closed,
            },
            None => Peek::InUse,
        }
    }

    /// Whether `close()` was called (a slot in use is open).
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.peek(|_| ()), Peek::Closed)
    }

    /// Drops the value. Closing twice does nothing; closing while another thread uses it raises.
    pub(crate) fn close(&self) -> PyResult<()> {
        let mut guard = self.value.try_lock().ok_or_else(|| {
            vkgdr_error(format!(
                "the {} is in use by another thread: close it there",
                self.class
            ))
        })?;
        drop(guard.take());
        Ok(())
    }
}
