//! `rmsnorm`: y = x / sqrt(mean(x^2) + eps) * gamma per row, fp32 statistics, f32 and bf16
//! (kernels/rmsnorm.cu). One statistic instead of two: the same memory floor as LayerNorm.
//! Inputs, cases and the GPU flow are LayerNorm's (`layernorm::RowCase`).

use super::compare::compare_elems;
use super::layernorm::{affine, tolerance, validate, RowCase, EPS};
use super::{measure_torch, widen, Check, Elem};
use crate::experiment::{param_str, rng_for, Backend, Experiment, Peer, Session};
use crate::kernels::DType;
use crate::{LabError, Result};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct RmsNorm;

const FAMILY: &str = "rmsnorm";
pub const GPU_VARIANTS: &[&str] = &["block", "onchip_block"];

/// The f64 reference.
pub fn reference(x: &[f64], gamma: &[f64], eps: f64) -> Vec<f64> {
    let cols = gamma.len();
    let mut y = vec![0.0; x.len()];
    y.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(y, x)| {
        let rms = (x.iter().map(|v| v * v).sum::<f64>() / cols as f64 + eps).sqrt();
        for (j, (y, v)) in y.iter_mut().zip(x).enumerate() {
            *y = v / rms * gamma[j];
        }
    });
    y
}

/// The CPU backend's variant: f64 sum of squares per row, f32 scaling, rows in parallel.
pub fn cpu_rows<T: Elem>(x: &[T], gamma: &[T], y: &mut [T], eps: f32) {
    let cols = gamma.len();
    y.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(y, x)| {
        let ss: f64 = x.iter().map(|v| v.to_f64() * v.to_f64()).sum();
        let inv = 1.0 / ((ss / cols as f64) as f32 + eps).sqrt();
        for j in 0..cols {
            y[j] = T::from_f32(x[j].to_f32() * inv * gamma[j].to_f32());
        }
    });
}

impl Experiment for RmsNorm {
    fn name(&self) -> &'static str {
        "rmsnorm"
    }
    fn description(&self) -> &'static str {
        "RMSNorm forward, f32 and bf16 with fp32 statistics, rows 256..65536 wide: two passes vs row on chip"
    }
    fn sweep_axis(&self) -> &'static str {
        "cols"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        super::layernorm::cases(backend, quick)
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::F32 => run::<f32>(s, case),
            DType::Bf16 => run::<half::bf16>(s, case),
            DType::F16 => Err(LabError::Invalid("rmsnorm runs in f32 and bf16".into())),
        }
    }
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let mut rng = rng_for(s.opts.seed, case);
    let rc = RowCase::<T>::new(s, case, 1, &mut rng)?;
    let gamma: Vec<T> = affine(rc.cols, 1.0, &mut rng);
    validate("rmsnorm", rc.x.len(), rc.rows, rc.cols, &[("gamma", gamma.len())])?;
    let expected = reference(&widen(&rc.x), &widen(&gamma), EPS as f64);
    let tol = tolerance(T::DTYPE);
    let compare_y = |y: &[T]| compare_elems(y, &expected, tol, "cpu-f64");
    let check = Check::memory_bound(tol, &compare_y);
    let backend = s.backend.clone();
    match &backend {
        Backend::Cpu => rc.cpu(s, case, "cpu_rows", &check, |y| cpu_rows(&rc.x, &gamma, y, EPS)),
        Backend::Cuda(gpu) => {
            let dg = gpu.upload(&gamma)?;
            rc.gpu(s, gpu, case, FAMILY, GPU_VARIANTS, &[&dg], &check)?;
            if rc.timed && s.wants_peer(Peer::Torch, "torch.rms_norm", "torch") {
                let (xb, gb) = (T::bytes(&rc.x), T::bytes(&gamma));
                let (xs, vs) = ([rc.rows, rc.cols], [rc.cols]);
                let inputs: [(&[u8], &[usize]); 2] = [(&xb, &xs), (&gb, &vs)];
                measure_torch(s, gpu, case, "rms_norm", json!({"eps": EPS}), &inputs, rc.work, &check)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::layernorm::input;
    use rand::SeedableRng;

    #[test]
    fn cpu_variant_matches_reference_including_hostile_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for (rows, cols, fill) in [(1, 1, "normal"), (9, 781, "normal"), (12, 300, "hostile")] {
            let x: Vec<f32> = input(rows, cols, fill, &mut rng).unwrap();
            let g: Vec<f32> = affine(cols, 1.0, &mut rng);
            let mut y = vec![f32::NAN; x.len()];
            cpu_rows(&x, &g, &mut y, EPS);
            let e = compare_elems(&y, &reference(&widen(&x), &widen(&g), EPS as f64), tolerance(DType::F32), "t");
            assert!(e.passed(), "{rows}x{cols} {fill}: {e:?}");
        }
    }

    #[test]
    fn unit_rms_rows_are_scaled_by_gamma() {
        let y = reference(&[1.0, -1.0, 1.0, -1.0], &[2.0; 4], 0.0);
        assert_eq!(y, vec![2.0, -2.0, 2.0, -2.0]);
    }
}

/// TEMPORARY until the table lands.
pub fn variants() -> Vec<crate::ops::variant::VariantInfo> {
    Vec::new()
}
