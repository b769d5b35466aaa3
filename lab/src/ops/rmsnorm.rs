//! `rmsnorm`: y = x / sqrt(mean(x^2) + eps) * gamma per row, fp32 statistics, f32 and bf16
//! (kernels/rmsnorm.cu). One statistic instead of two: the same memory floor as LayerNorm.
//! Inputs, cases and the GPU flow are LayerNorm's (`layernorm::RowCase`).

use super::compare::compare_elems;
use super::layernorm::{affine, norm_op, tolerance, NormKernel, RowCase, BLOCK_PER_ROW, EPS, F32_BF16, ONCHIP_BLOCK};
use super::variant::{self, Requires, Variant, VariantInfo};
use super::{measure_torch, widen, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_str, rng_for, Backend, Experiment, Peer, Session};
use crate::kernels::DType;
use crate::tensor::Tensor;
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct RmsNorm;

const FAMILY: &str = "rmsnorm";

/// The ladder, in order: the only place an rmsnorm variant is named.
pub const VARIANTS: &[Variant<NormKernel>] = &[
    Variant {
        name: "block",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "a block per row: sum of squares, then a write pass re-reading the row",
        config: BLOCK_PER_ROW,
    },
    Variant {
        name: "onchip_block",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "the row held in registers: one read and one write, the floor",
        config: ONCHIP_BLOCK,
    },
    Variant {
        name: "cpu_rows",
        dtypes: F32_BF16,
        requires: Requires::Cpu,
        what: "f64 sum of squares per row, f32 scaling, rows in parallel",
        config: NormKernel::Cpu,
    },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// y = x / sqrt(mean(x^2) + eps) * gamma over the last dimension, with the best variant.
pub fn forward<T: Elem>(dev: &Backend, x: &Tensor<T>, gamma: &Tensor<T>, y: &mut Tensor<T>, eps: f32) -> Result<()> {
    forward_with(dev, super::layernorm::best(VARIANTS, dev, x.cols()).name, x, gamma, y, eps)
}

/// [`forward`] with the named variant (any row of [`VARIANTS`]).
pub fn forward_with<T: Elem>(dev: &Backend, variant: &str, x: &Tensor<T>, gamma: &Tensor<T>, y: &mut Tensor<T>, eps: f32) -> Result<()> {
    let cpu = |x: &[T], p: &[&[T]], y: &mut [T]| cpu_rows(x, p[0], y, eps);
    norm_op(FAMILY, VARIANTS, dev, variant, x, &[("gamma", gamma)], y, eps, cpu)
}

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

/// The backward's kernels (f32 only): dX and each row's share of dGamma, then their column sum.
pub const BACKWARD_KERNELS: [&str; 2] = ["backward", "column_sum"];

/// dX and dGamma of y = x r gamma (r = 1 / sqrt(mean(x^2) + eps)) from dY, over the last
/// dimension; `dgamma` is overwritten with the sum over rows. f32 only. On the GPU: a block per
/// row for dX and each row's share of dGamma, then a column sum in a fixed order
/// (`rmsnorm_backward_f32`, `rmsnorm_column_sum_f32`); on the CPU: [`cpu_backward`].
pub fn backward(dev: &Backend, x: &Tensor<f32>, gamma: &Tensor<f32>, dy: &Tensor<f32>, dx: &mut Tensor<f32>, dgamma: &mut Tensor<f32>, eps: f32) -> Result<()> {
    backward_with(dev, x, gamma, dy, dx, dgamma, eps, false)
}

/// [`backward`], or with `drop_mean_term` the fault a gradient check must catch (the
/// mean-square's share of dX left out).
#[allow(clippy::too_many_arguments)]
pub fn backward_with(dev: &Backend, x: &Tensor<f32>, gamma: &Tensor<f32>, dy: &Tensor<f32>, dx: &mut Tensor<f32>, dgamma: &mut Tensor<f32>, eps: f32, drop_mean_term: bool) -> Result<()> {
    let bad = |why: String| LabError::shape("rmsnorm backward", why);
    let cols = x.cols();
    if gamma.len() != cols || dgamma.len() != cols {
        return Err(bad(format!("x rows are {cols} wide but gamma has {} and dgamma {} elements", gamma.len(), dgamma.len())));
    }
    for (name, t) in [("dy", dy.shape()), ("dx", dx.shape())] {
        if t != x.shape() {
            return Err(bad(format!("x is {:?} but {name} is {t:?}", x.shape())));
        }
    }
    let placed = [("x", x.placement()), ("gamma", gamma.placement()), ("dy", dy.placement()), ("dx", dx.placement()), ("dgamma", dgamma.placement())];
    crate::tensor::check_placement("rmsnorm backward", dev, &placed)?;
    let gpu = match dev {
        Backend::Cpu => {
            let h = |t: &Tensor<f32>| t.host().expect("placement checked").to_vec();
            let (xh, gh, dyh) = (h(x), h(gamma), h(dy));
            cpu_backward(&xh, &gh, &dyh, dx.host_mut().expect("placement checked"), dgamma.host_mut().expect("placement checked"), eps, drop_mean_term);
            return Ok(());
        }
        Backend::Cuda(gpu) => gpu,
    };
    let rows = x.rows();
    let mut part = Tensor::<f32>::zeros(dev, &[rows.max(1), cols])?;
    let (ci, ri, drop) = (cols as i32, rows as i32, drop_mean_term as i32);
    if rows > 0 {
        let f = gpu.function(FAMILY, &crate::kernels::symbol(FAMILY, BACKWARD_KERNELS[0], DType::F32))?;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: x, dy, dx and part are rows x cols; gamma holds cols.
        unsafe {
            gpu.stream
                .launch_builder(&f)
                .arg(x.cuda().expect("placement checked"))
                .arg(gamma.cuda().expect("placement checked"))
                .arg(dy.cuda().expect("placement checked"))
                .arg(dx.cuda_mut().expect("placement checked"))
                .arg(part.cuda_mut().expect("placement checked"))
                .arg(&ci)
                .arg(&eps)
                .arg(&drop)
                .launch(cfg)
        }
        .doing("launching rmsnorm_backward")?;
    }
    let f = gpu.function(FAMILY, &crate::kernels::symbol(FAMILY, BACKWARD_KERNELS[1], DType::F32))?;
    let cfg = LaunchConfig { grid_dim: (cols.div_ceil(32) as u32, 1, 1), block_dim: (32, 32, 1), shared_mem_bytes: 0 };
    // SAFETY: part is rows x cols (rows may be 0: nothing is read), dgamma holds cols.
    unsafe { gpu.stream.launch_builder(&f).arg(part.cuda().expect("on the device")).arg(dgamma.cuda_mut().expect("placement checked")).arg(&ri).arg(&ci).launch(cfg) }
        .doing("launching rmsnorm_column_sum")
        .map(|_| ())
}

/// The CPU backward: per row, with g = gamma dy, dx = r g - x r^3 (x.g) / n (the second term is
/// the mean-square's share, which `drop_mean_term` leaves out: the fault the trainer's gradient
/// check must catch); dgamma = sum over rows of dy x r. Row sums in f64, rows in parallel, and
/// dgamma summed over rows in order, so the result does not depend on the thread count.
pub fn cpu_backward(x: &[f32], gamma: &[f32], dy: &[f32], dx: &mut [f32], dgamma: &mut [f32], eps: f32, drop_mean_term: bool) {
    let cols = gamma.len();
    let rows: Vec<Vec<f64>> = dx
        .par_chunks_mut(cols)
        .zip(x.par_chunks(cols).zip(dy.par_chunks(cols)))
        .map(|(dx, (x, dy))| {
            let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
            let r = 1.0 / (ms + eps as f64).sqrt();
            let dot: f64 = (0..cols).map(|j| gamma[j] as f64 * dy[j] as f64 * x[j] as f64).sum();
            let mean = if drop_mean_term { 0.0 } else { r * r * r * dot / cols as f64 };
            for j in 0..cols {
                dx[j] = (r * gamma[j] as f64 * dy[j] as f64 - x[j] as f64 * mean) as f32;
            }
            (0..cols).map(|j| dy[j] as f64 * x[j] as f64 * r).collect()
        })
        .collect();
    let mut sum = vec![0f64; cols];
    for row in rows {
        sum.iter_mut().zip(row).for_each(|(s, v)| *s += v);
    }
    dgamma.iter_mut().zip(sum).for_each(|(g, s)| *g = s as f32);
}

impl Experiment for RmsNorm {
    fn name(&self) -> &'static str {
        "rmsnorm"
    }
    fn description(&self) -> &'static str {
        "RMSNorm forward, f32 and bf16 with fp32 statistics, rows 256..65536 wide: two passes vs row on chip"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["rows=16384 cols=4096"]
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
    let expected = reference(&widen(&rc.x), &widen(&gamma), EPS as f64);
    let tol = tolerance(T::DTYPE);
    let compare_y = |y: &[T]| compare_elems(y, &expected, tol, "cpu-f64");
    let check = Check::memory_bound(tol, &compare_y);
    let dev = s.backend.clone();
    let g = Tensor::from_slice(&dev, &[rc.cols], &gamma)?;
    rc.measure(s, case, VARIANTS, &check, |v, x, y| forward_with(&dev, v, x, &g, y, EPS))?;
    if let Backend::Cuda(gpu) = &dev {
        if rc.timed && s.wants_peer(Peer::Torch, "torch.rms_norm", "torch") {
            let (xb, gb) = (T::bytes(&rc.x), T::bytes(&gamma));
            let (xs, vs) = ([rc.rows, rc.cols], [rc.cols]);
            let inputs: [(&[u8], &[usize]); 2] = [(&xb, &xs), (&gb, &vs)];
            measure_torch(s, gpu, case, "rms_norm", json!({"eps": EPS}), &inputs, rc.work, &check)?;
        }
    }
    Ok(())
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
    fn the_callable_op_runs_on_tensors_and_names_bad_input() {
        let dev = Backend::Cpu;
        let x = Tensor::from_vec(&[2, 4], vec![1f32, -1.0, 1.0, -1.0, 3.0, 0.0, 0.0, 0.0]).unwrap();
        let g = Tensor::from_vec(&[4], vec![2f32; 4]).unwrap();
        let mut y = Tensor::<f32>::zeros(&dev, &[2, 4]).unwrap();
        forward(&dev, &x, &g, &mut y, 0.0).unwrap();
        assert_eq!(y.row(0).unwrap(), vec![2.0, -2.0, 2.0, -2.0]);
        assert_eq!(y.row(1).unwrap(), vec![4.0, 0.0, 0.0, 0.0]);
        let mut wide = Tensor::<f32>::zeros(&dev, &[2, 5]).unwrap();
        let err = forward(&dev, &x, &g, &mut wide, EPS).unwrap_err().to_string();
        assert!(err.contains("rmsnorm: x is [2, 4] but y is [2, 5]"), "{err}");
    }

    #[test]
    fn unit_rms_rows_are_scaled_by_gamma() {
        let y = reference(&[1.0, -1.0, 1.0, -1.0], &[2.0; 4], 0.0);
        assert_eq!(y, vec![2.0, -2.0, 2.0, -2.0]);
    }
}
