//! Long work off the GIL, interruptible with Ctrl-C.
//!
//! A build runs on a worker thread with a [`Cancel`] flag while the calling thread waits
//! without the GIL, waking every [`POLL`] to take the GIL and run `PyErr_CheckSignals`. On a
//! pending `KeyboardInterrupt` (or any exception a signal handler raises) it sets the flag,
//! waits for the worker to stop at its next check (between kNN tiles and build phases), and
//! re-raises. Signals are only delivered to the main thread, so builds started from other
//! Python threads run to the end.

use crate::errors::to_py;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use qkindex::Cancel;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting call looks for signals.
pub const POLL: Duration = Duration::from_millis(50);

type Outcome<T> = std::thread::Result<qkindex::Result<T>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn finish<T>(outcome: Outcome<T>) -> PyResult<T> {
    match outcome {
        Ok(result) => result.map_err(to_py),
        Err(_) => Err(PyRuntimeError::new_err(
            "internal error: the qkindex worker thread panicked",
        )),
    }
}

/// Runs `work` on a worker thread without the GIL; Ctrl-C sets the [`Cancel`] it receives and
/// raises `KeyboardInterrupt` once the worker has stopped.
pub fn interruptible<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce(&Cancel) -> qkindex::Result<T> + Send,
{
    let cancel = Cancel::new();
    let (tx, rx) = channel::<Outcome<T>>();
    // `Receiver` is not `Sync`; the mutex lets the GIL-free closures borrow it.
    let rx: Mutex<Receiver<Outcome<T>>> = Mutex::new(rx);
    std::thread::scope(|scope| {
        let flag = cancel.clone();
        scope.spawn(move || {
            let outcome = catch_unwind(AssertUnwindSafe(|| work(&flag)));
            // The receiver outlives the scope, so the send cannot fail.
            let _ = tx.send(outcome);
        });
        loop {
            match py.detach(|| lock(&rx).recv_timeout(POLL)) {
                Ok(outcome) => return finish(outcome),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(interrupt) = py.check_signals() {
                        cancel.cancel();
                        // Wait for the worker to notice the flag; its result is dropped.
                        let _ = py.detach(|| lock(&rx).recv());
                        return Err(interrupt);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(PyRuntimeError::new_err(
                        "internal error: the qkindex worker thread ended without a result",
                    ))
                }
            }
        }
    })
}
