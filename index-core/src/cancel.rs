//! Cooperative cancellation of long builds.
//!
//! A [`Cancel`] is a shared flag. Builders check it between units of work (a tile of the kNN,
//! a batch of nodes) and return [`Error::Cancelled`] once it is set, leaving nothing half-built
//! behind. Bindings set it from a signal handler or another thread (Ctrl-C in Python).

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A cancellation flag shared between the caller and a running build. Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every holder of this flag to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// True once [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `Err(Cancelled { what })` once the flag is set.
    pub fn check(&self, what: &'static str) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Cancelled { what })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let a = Cancel::new();
        let b = a.clone();
        assert!(a.check("build").is_ok());
        b.cancel();
        assert!(a.is_cancelled());
        assert!(matches!(
            a.check("build"),
            Err(Error::Cancelled { what: "build" })
        ));
    }
}
