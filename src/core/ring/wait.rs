//! [`Deadline`]: the end of a wait for ring space, read from the clock only once a wait begins.

use std::time::{Duration, Instant};

/// How long a producer may still wait for space. A reservation that finds space at once never
/// reads the clock: the clock starts at the first look at the deadline (after the first failed
/// attempt and one more look at the consumer's head), and a zero timeout never reads it at all.
#[derive(Debug)]
pub(super) struct Deadline {
    /// `None`: no limit (no timeout, or one too long to represent).
    timeout: Option<Duration>,
    /// When the wait ends, once the clock has started.
    at: Option<Instant>,
}

impl Deadline {
    /// A deadline `timeout` after the first call of [`passed`](Self::passed) (`None`: never).
    pub(super) fn new(timeout: Option<Duration>) -> Self {
        Deadline { timeout, at: None }
    }

    /// Whether the wait is over. The first call starts the clock and says no, unless the timeout
    /// is zero (then every call says yes, with no clock read).
    pub(super) fn passed(&mut self) -> bool {
        let Some(timeout) = self.timeout else {
            return false;
        };
        if timeout.is_zero() {
            return true;
        }
        match self.at {
            Some(at) => Instant::now() >= at,
            None => {
                self.at = Instant::now().checked_add(timeout);
                if self.at.is_none() {
                    // Too far away to represent: no limit.
                    self.timeout = None;
                }
                false
            }
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn deadlines() {
        let mut none = Deadline::new(None);
        assert!(!none.passed() && !none.passed());
        let mut zero = Deadline::new(Some(Duration::ZERO));
        assert!(zero.passed());
        assert!(zero.at.is_none(), "a zero timeout never reads the clock");
        let mut huge = Deadline::new(Some(Duration::MAX));
        assert!(!huge.passed() && !huge.passed());
        let mut short = Deadline::new(Some(Duration::from_millis(2)));
        assert!(!short.passed(), "the first look starts the clock");
        assert!(short.at.is_some());
        std::thread::sleep(Duration::from_millis(3));
        assert!(short.passed());
    }
}
