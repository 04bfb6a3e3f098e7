//! `auto`'s choice of kernel path by measurement: on first use for a (device, padded dimension,
//! k class), every path that can run is timed once on a small synthetic problem
//! ([`CalibrationShape`]) and the fastest is kept in a process-wide cache ([`CalibrationCache`]),
//! so later calls on that device pay nothing. Issue 47 asks for this instead of a fixed
//! `dim ≤ 128` rule, which chose the fused path at 28.9× the GEMM floor where the GEMM path ran
//! at 9.1×.
//!
//! The logic (candidates, medians, failures, caching) is here and tested on the CPU with a fake
//! timer; the device timer that runs the real kernels is [`crate::cuda`]'s.

use crate::{GpuError, KernelPath, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Queries of the calibration problem: a few chunks' worth of blocks on any GPU, small enough
/// that timing every path takes milliseconds.
pub const CALIBRATION_QUERIES: usize = 4096;
/// Keys of the calibration problem: enough that the running lists settle (few merges), as in
/// real builds.
pub const CALIBRATION_KEYS: usize = 32_768;
/// Timed runs per path (after one warm-up); the median counts.
pub const CALIBRATION_REPS: usize = 3;

/// The synthetic problem each path is timed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct CalibrationShape {
    pub queries: usize,
    pub keys: usize,
    /// Padded dimension (a multiple of 16), as the kernels see it.
    pub dp: usize,
    /// k of the problem: the class of the caller's k ([`k_class`]).
    pub k: usize,
}

impl CalibrationShape {
    /// The calibration problem for padded dimension `dp` and a caller's `k`.
    pub fn for_call(dp: usize, k: usize) -> Self {
        CalibrationShape {
            queries: CALIBRATION_QUERIES,
            keys: CALIBRATION_KEYS,
            dp,
            k: k_class(k),
        }
    }
}

/// The class of `k` calibrations are shared by: k rounded up to a power of two, at least 16 and
/// at most the calibration's key count (selection cost grows with k, slowly).
pub fn k_class(k: usize) -> usize {
    k.max(16).next_power_of_two().min(CALIBRATION_KEYS)
}

/// What `auto` measured and chose.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Calibration {
    pub shape: CalibrationShape,
    /// Median kernel time (ms) of each path that ran, in candidate order.
    pub times_ms: Vec<(KernelPath, f64)>,
    /// Paths that could not run at this shape, and why.
    pub failed: Vec<(KernelPath, String)>,
    /// The fastest path (the first listed among equal times).
    pub choice: KernelPath,
}

impl Calibration {
    /// One line for logs: the choice and every measured time.
    pub fn summary(&self) -> String {
        let times: Vec<String> = self
            .times_ms
            .iter()
            .map(|(p, t)| format!("{} {t:.3} ms", path_name(*p)))
            .collect();
        let mut s = format!(
            "auto chose {} (measured once on {} queries × {} keys, d {}, k {}: {})",
            path_name(self.choice),
            self.shape.queries,
            self.shape.keys,
            self.shape.dp,
            self.shape.k,
            times.join(", ")
        );
        for (p, why) in &self.failed {
            s += &format!("; {} failed: {why}", path_name(*p));
        }
        s
    }
}

/// Lower-case name of a path, as in [`crate::Timings::path`].
pub fn path_name(p: KernelPath) -> &'static str {
    match p {
        KernelPath::Auto => "auto",
        KernelPath::Fused => "fused",
        KernelPath::Gemm => "gemm",
        KernelPath::Radix => "radix",
    }
}

/// Times one path on the calibration problem (kernel time, ms). The device implementation runs
/// the real kernels; tests use a fake.
pub trait PathTimer {
    fn time_ms(&mut self, path: KernelPath, shape: &CalibrationShape) -> Result<f64>;
}

/// Times every candidate (one warm-up, then the median of `reps`), and chooses the fastest. A
/// candidate whose run fails is listed in [`Calibration::failed`]; if all fail, the first
/// failure is returned.
pub fn calibrate(
    candidates: &[KernelPath],
    shape: CalibrationShape,
    timer: &mut dyn PathTimer,
    reps: usize,
) -> Result<Calibration> {
    let mut times_ms = Vec::new();
    let mut failed = Vec::new();
    let mut first_error = None;
    for &path in candidates {
        let mut runs = Vec::with_capacity(reps);
        let mut outcome = Ok(());
        for rep in 0..=reps.max(1) {
            match timer.time_ms(path, &shape) {
                Ok(t) if !t.is_finite() || t < 0.0 => {
                    outcome = Err(GpuError::Cuda {
                        what: "timing a path",
                        reason: format!("not a duration: {t} ms"),
                    });
                    break;
                }
                Ok(t) if rep > 0 => runs.push(t),
                Ok(_) => {} // warm-up
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        match outcome {
            Ok(()) => {
                runs.sort_by(f64::total_cmp);
                times_ms.push((path, runs[runs.len() / 2]));
            }
            Err(e) => {
                failed.push((path, e.to_string()));
                first_error.get_or_insert(e);
            }
        }
    }
    let choice = times_ms
        .iter()
        .fold(None::<(KernelPath, f64)>, |best, &(p, t)| match best {
            Some((_, bt)) if bt <= t => best,
            _ => Some((p, t)),
        });
    match (choice, first_error) {
        (Some((choice, _)), _) => Ok(Calibration {
            shape,
            times_ms,
            failed,
            choice,
        }),
        (None, Some(e)) => Err(e),
        (None, None) => Err(GpuError::Input(
            "no kernel path can run this problem".to_string(),
        )),
    }
}

/// Calibrations by (device, padded dimension, k class), measured once each.
#[derive(Debug, Default)]
pub struct CalibrationCache {
    entries: Mutex<HashMap<(String, usize, usize), Arc<Calibration>>>,
}

impl CalibrationCache {
    /// The process-wide cache the GPU backends share.
    pub fn global() -> &'static CalibrationCache {
        static CACHE: OnceLock<CalibrationCache> = OnceLock::new();
        CACHE.get_or_init(CalibrationCache::default)
    }

    /// The cached calibration of `device` (a stable name: ordinal and model) for `shape`, or
    /// `measure`'s result, cached if it succeeds. The lock is held while measuring, so two
    /// threads do not calibrate the same device at once.
    pub fn get_or_measure(
        &self,
        device: &str,
        shape: CalibrationShape,
        measure: impl FnOnce() -> Result<Calibration>,
    ) -> Result<Arc<Calibration>> {
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| GpuError::Unavailable("a previous calibration panicked".to_string()))?;
        let key = (device.to_string(), shape.dp, shape.k);
        if let Some(c) = entries.get(&key) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(measure()?);
        entries.insert(key, Arc::clone(&c));
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed times per path (ms), with a counter of calls; `None` fails.
    struct FakeTimer {
        times: Vec<(KernelPath, Option<f64>)>,
        calls: usize,
        jitter: bool,
    }

    impl PathTimer for FakeTimer {
        fn time_ms(&mut self, path: KernelPath, _: &CalibrationShape) -> Result<f64> {
            self.calls += 1;
            let t = self
                .times
                .iter()
                .find(|(p, _)| *p == path)
                .and_then(|(_, t)| *t)
                .ok_or_else(|| GpuError::Input(format!("{path:?} cannot run")))?;
            // With jitter: the warm-up is slow and one timed run an outlier; the median ignores both.
            Ok(match (self.jitter, self.calls % 4) {
                (true, 1) => t * 50.0,
                (true, 2) => t * 3.0,
                _ => t,
            })
        }
    }

    fn timer(times: &[(KernelPath, Option<f64>)]) -> FakeTimer {
        FakeTimer {
            times: times.to_vec(),
            calls: 0,
            jitter: false,
        }
    }

    const ALL: [KernelPath; 3] = [KernelPath::Fused, KernelPath::Gemm, KernelPath::Radix];

    #[test]
    fn the_fastest_path_wins_by_its_median() {
        let shape = CalibrationShape::for_call(128, 100);
        let mut t = timer(&[
            (KernelPath::Fused, Some(17.0)),
            (KernelPath::Gemm, Some(5.5)),
            (KernelPath::Radix, Some(9.0)),
        ]);
        t.jitter = true;
        let c = calibrate(&ALL, shape, &mut t, 3).expect("calibration");
        assert_eq!(c.choice, KernelPath::Gemm, "{c:?}");
        assert_eq!(t.calls, 3 * 4, "one warm-up and three timed runs per path");
        assert_eq!(c.times_ms[1], (KernelPath::Gemm, 5.5));
        assert!(
            c.summary().starts_with("auto chose gemm"),
            "{}",
            c.summary()
        );
        // The same times otherwise: the fused path when it is the fastest.
        let mut t = timer(&[
            (KernelPath::Fused, Some(2.0)),
            (KernelPath::Gemm, Some(5.5)),
            (KernelPath::Radix, Some(9.0)),
        ]);
        assert_eq!(
            calibrate(&ALL, shape, &mut t, 3)
                .expect("calibration")
                .choice,
            KernelPath::Fused
        );
    }

    #[test]
    fn equal_times_keep_the_first_candidate() {
        let shape = CalibrationShape::for_call(64, 10);
        let mut t = timer(&[
            (KernelPath::Fused, Some(4.0)),
            (KernelPath::Gemm, Some(4.0)),
        ]);
        let c = calibrate(&ALL[..2], shape, &mut t, 1).expect("calibration");
        assert_eq!(c.choice, KernelPath::Fused);
    }

    #[test]
    fn a_failing_path_is_listed_and_skipped_and_all_failing_is_an_error() {
        let shape = CalibrationShape::for_call(128, 100);
        let mut t = timer(&[
            (KernelPath::Fused, None),
            (KernelPath::Gemm, Some(8.0)),
            (KernelPath::Radix, Some(f64::NAN)),
        ]);
        let c = calibrate(&ALL, shape, &mut t, 3).expect("calibration");
        assert_eq!(c.choice, KernelPath::Gemm);
        assert_eq!(c.failed.len(), 2, "{c:?}");
        assert!(c.summary().contains("fused failed"), "{}", c.summary());
        let mut t = timer(&[(KernelPath::Fused, None)]);
        assert!(calibrate(&ALL[..1], shape, &mut t, 3).is_err());
        assert!(calibrate(&[], shape, &mut t, 3).is_err());
    }

    #[test]
    fn the_cache_measures_once_per_device_dimension_and_k_class() {
        let cache = CalibrationCache::default();
        let mut measured = 0;
        let mut get = |device: &str, dp: usize, k: usize, fused_ms: f64| {
            let shape = CalibrationShape::for_call(dp, k);
            cache
                .get_or_measure(device, shape, || {
                    measured += 1;
                    let mut t = timer(&[
                        (KernelPath::Fused, Some(fused_ms)),
                        (KernelPath::Gemm, Some(3.0)),
                    ]);
                    calibrate(&ALL[..2], shape, &mut t, 1)
                })
                .expect("calibration")
                .choice
        };
        assert_eq!(get("cuda:0 H200", 128, 100, 9.0), KernelPath::Gemm);
        // Same device, dimension and k class (100 and 120 → 128): cached, even if it would now
        // measure otherwise.
        assert_eq!(get("cuda:0 H200", 128, 120, 1.0), KernelPath::Gemm);
        // Another k class, another dimension, another device: measured.
        assert_eq!(get("cuda:0 H200", 128, 1000, 1.0), KernelPath::Fused);
        assert_eq!(get("cuda:0 H200", 64, 100, 1.0), KernelPath::Fused);
        assert_eq!(get("cuda:1 A100", 128, 100, 1.0), KernelPath::Fused);
        assert_eq!(measured, 4);
        // A failed measurement is not cached.
        let shape = CalibrationShape::for_call(32, 8);
        assert!(cache
            .get_or_measure("cuda:0 H200", shape, || Err(GpuError::Input("x".into())))
            .is_err());
        let mut t = timer(&[(KernelPath::Gemm, Some(1.0))]);
        let c = cache
            .get_or_measure("cuda:0 H200", shape, || {
                calibrate(&[KernelPath::Gemm], shape, &mut t, 1)
            })
            .expect("calibration");
        assert_eq!(c.choice, KernelPath::Gemm);
    }

    #[test]
    fn k_classes_round_up_within_the_calibration_keys() {
        assert_eq!(k_class(1), 16);
        assert_eq!(k_class(100), 128);
        assert_eq!(k_class(1024), 1024);
        assert_eq!(k_class(16_000), 16_384);
        assert_eq!(k_class(1 << 20), CALIBRATION_KEYS);
    }
}
