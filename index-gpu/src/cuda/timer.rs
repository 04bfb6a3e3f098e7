//! [`DeviceTimer`]: `auto`'s calibration ([`crate::calibrate`]) timing the real kernels of each
//! path on a synthetic problem on the device (CUDA events around the chunk's kernels).

use super::fused::{launch_init, Chunk};
use super::run::Scratch;
use super::{CudaKnn, Gpu, KernelPath};
use crate::calibrate::{CalibrationShape, PathTimer};
use crate::runtime::{elapsed_ms, record};
use crate::Result;
use cudarc::driver::CudaSlice;
use half::f16;

/// Times paths on one device; the synthetic queries and keys are uploaded on first use.
pub(super) struct DeviceTimer<'a> {
    knn: &'a CudaKnn,
    gpu: &'a Gpu,
    data: Option<(CalibrationShape, CudaSlice<u16>, CudaSlice<u16>)>,
    scratch: Scratch,
}

impl<'a> DeviceTimer<'a> {
    pub(super) fn new(knn: &'a CudaKnn, gpu: &'a Gpu) -> Self {
        DeviceTimer {
            knn,
            gpu,
            data: None,
            scratch: Scratch::default(),
        }
    }
}

/// `rows × dp` f16 bits of a fixed pseudo-random sequence in [−1, 1) (an LCG: the same problem on
/// every device, no allocation of a random generator).
fn synthetic(rows: usize, dp: usize, seed: u64) -> Vec<u16> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..rows * dp)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32;
            f16::from_f32(2.0 * unit - 1.0).to_bits()
        })
        .collect()
}

impl PathTimer for DeviceTimer<'_> {
    fn time_ms(&mut self, path: KernelPath, shape: &CalibrationShape) -> Result<f64> {
        if self.data.as_ref().is_none_or(|(s, _, _)| s != shape) {
            let (q, _, _) = self
                .gpu
                .upload(&synthetic(shape.queries, shape.dp, 1), "uploading")?;
            let (keys, _, e1) = self
                .gpu
                .upload(&synthetic(shape.keys, shape.dp, 2), "uploading")?;
            self.gpu
                .compute
                .wait(&e1)
                .map_err(|e| crate::GpuError::cuda("ordering streams", e))?;
            self.data = Some((*shape, q, keys));
        }
        let Some((_, q, keys)) = self.data.as_ref() else {
            unreachable!("uploaded above")
        };
        let rows = shape.queries;
        let mut best_s = self.gpu.zeros::<f32>(rows * shape.k, "allocating lists")?;
        let mut best_i = self.gpu.zeros::<u32>(rows * shape.k, "allocating lists")?;
        let job = Chunk {
            q,
            keys,
            rows,
            n: shape.keys,
            dp: shape.dp,
            row0: 0,
            causal: false,
            k: shape.k,
        };
        let e0 = record(&self.gpu.compute)?;
        launch_init(self.gpu, &mut best_s, &mut best_i)?;
        self.knn.compute_chunk(
            self.gpu,
            path,
            &job,
            rows,
            &mut self.scratch,
            (&mut best_s, &mut best_i),
        )?;
        let e1 = record(&self.gpu.compute)?;
        elapsed_ms(&e0, &e1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_rows_are_deterministic_and_in_range() {
        let a = synthetic(4, 16, 1);
        assert_eq!(a, synthetic(4, 16, 1));
        assert_ne!(a, synthetic(4, 16, 2));
        assert!(a.iter().all(|&b| {
            let v = f16::from_bits(b).to_f32();
            (-1.0..1.0).contains(&v)
        }));
    }
}
