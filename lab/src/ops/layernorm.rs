//! `layernorm`: y = (x - mean) / sqrt(var + eps) * gamma + beta per row, fp32 statistics, f32
//! and bf16 storage (kernels/layernorm.cu). Rows 256..65536 wide. Memory-bound: the floor is one
//! read of x and one write of y; the ladder goes from three passes to the row kept on chip.
//! The row inputs, cases and GPU flow here are shared with `rmsnorm`.

use super::compare::compare_elems;
use super::{measure_cpu, measure_gpu, measure_torch, widen, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Peer, Session};
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct LayerNorm;

const FAMILY: &str = "layernorm";
pub const EPS: f32 = 1e-5;
pub const GPU_VARIANTS: &[&str] = &["two_pass_block", "welford_warp", "onchip_block"];
/// Longest row the on-chip variants hold: 1024 threads x 16 registers.
pub const ONCHIP_MAX_COLS: usize = 16384;

/// Does a norm variant run on rows `cols` wide?
pub fn applies(variant: &str, cols: usize) -> bool {
    variant != "onchip_block" || cols <= ONCHIP_MAX_COLS
}

/// Checks what a caller gives: x is rows x cols, every per-column vector has cols entries.
pub fn validate(family: &str, x_len: usize, rows: usize, cols: usize, per_col: &[(&str, usize)]) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(LabError::shape(family, format!("{rows} x {cols}: rows and cols must be at least 1")));
    }
    if x_len != rows * cols {
        return Err(LabError::shape(family, format!("x has {x_len} elements, not {rows} x {cols}")));
    }
    for (name, len) in per_col {
        if *len != cols {
            return Err(LabError::shape(family, format!("{name} has {len} elements; rows are {cols} wide")));
        }
    }
    Ok(())
}

pub fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance { atol: 1e-5, rtol: 1e-5 },
        _ => Tolerance { atol: 1e-3, rtol: 2f64.powi(-7) },
    }
}

/// Odd shapes and hostile rows (checked, untimed), then widths 256..65536 at 64 Mi elements.
pub fn cases(backend: &Backend, quick: bool) -> Vec<Value> {
    let checks: &[(usize, usize, &str)] = match (backend, quick) {
        (Backend::Cpu, true) => &[(1, 1, "normal"), (17, 781, "normal"), (9, 300, "hostile")],
        _ => &[(1, 1, "normal"), (1823, 781, "normal"), (7, 16385, "normal"), (1823, 781, "hostile")],
    };
    let timed: &[(usize, usize)] = match (backend, quick) {
        (Backend::Cuda(_), false) => &[(262144, 256), (65536, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (1024, 65536)],
        (Backend::Cuda(_), true) => &[(16384, 4096), (8192, 8192)],
        (Backend::Cpu, false) => &[(4096, 1024), (256, 16384)],
        (Backend::Cpu, true) => &[(64, 1024)],
    };
    let mut out = Vec::new();
    for dtype in ["f32", "bf16"] {
        for &(rows, cols, fill) in checks {
            out.push(json!({"rows": rows, "cols": cols, "dtype": dtype, "fill": fill, "timed": false}));
        }
        for &(rows, cols) in timed {
            out.push(json!({"rows": rows, "cols": cols, "dtype": dtype, "fill": "normal", "timed": true}));
        }
    }
    out
}

/// Row inputs: N(0, 1), or hostile rows cycling through a constant row (variance 0), a large
/// scale (1e3 N(0,1)), a tiny one (1e-3 N(0,1): eps dominates the variance), and an offset
/// (10 + N(0,1): a one-pass E[x^2] - E[x]^2 in fp32 loses ~1e-5 of the variance to cancellation,
/// two-pass and Welford do not). Offsets much larger than 10 make any fp32 statistic miss the f32
/// tolerance: the mean alone carries an ulp of the offset.
pub fn input<T: Elem>(rows: usize, cols: usize, fill: &str, rng: &mut impl Rng) -> Result<Vec<T>> {
    let mut x = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for _ in 0..cols {
            let z: f32 = StandardNormal.sample(rng);
            let v = match (fill, r % 4) {
                ("normal", _) => z,
                ("hostile", 0) => 2.5,
                ("hostile", 1) => 1e3 * z,
                ("hostile", 2) => 1e-3 * z,
                ("hostile", _) => 10.0 + z,
                (other, _) => return Err(LabError::Invalid(format!("unknown norm fill `{other}` (normal, hostile)"))),
            };
            x.push(T::from_f32(v));
        }
    }
    Ok(x)
}

/// gamma ~ 1 + N(0, 0.1^2) and beta ~ N(0, 0.1^2), like trained weights.
pub fn affine<T: Elem>(cols: usize, around: f32, rng: &mut impl Rng) -> Vec<T> {
    (0..cols)
        .map(|_| {
            let z: f32 = StandardNormal.sample(rng);
            T::from_f32(around + 0.1 * z)
        })
        .collect()
}

/// The f64 reference: two-pass mean and population variance.
pub fn reference(x: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let cols = gamma.len();
    let mut y = vec![0.0; x.len()];
    y.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(y, x)| {
        let mean = x.iter().sum::<f64>() / cols as f64;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, (y, v)) in y.iter_mut().zip(x).enumerate() {
            *y = (v - mean) * rstd * gamma[j] + beta[j];
        }
    });
    y
}

/// The CPU backend's variant: two passes per row with f64 sums (a serial fp32 sum over a long
/// row drifts past the f32 tolerance), f32 normalisation, rows in parallel.
pub fn cpu_two_pass_rows<T: Elem>(x: &[T], gamma: &[T], beta: &[T], y: &mut [T], eps: f32) {
    let cols = gamma.len();
    y.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(y, x)| {
        let mean = (x.iter().map(|v| v.to_f64()).sum::<f64>() / cols as f64) as f32;
        let var = x.iter().map(|v| ((v.to_f32() - mean) as f64).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var as f32 + eps).sqrt();
        for j in 0..cols {
            y[j] = T::from_f32((x[j].to_f32() - mean) * rstd * gamma[j].to_f32() + beta[j].to_f32());
        }
    });
}

impl Experiment for LayerNorm {
    fn name(&self) -> &'static str {
        "layernorm"
    }
    fn description(&self) -> &'static str {
        "LayerNorm forward, f32 and bf16 with fp32 statistics, rows 256..65536 wide: three passes, Welford warp, row on chip"
    }
    fn sweep_axis(&self) -> &'static str {
        "cols"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        cases(backend, quick)
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::F32 => run::<f32>(s, case),
            DType::Bf16 => run::<half::bf16>(s, case),
            DType::F16 => Err(LabError::Invalid("layernorm runs in f32 and bf16".into())),
        }
    }
}

/// A row-norm case as the experiments share it.
pub struct RowCase<T> {
    pub rows: usize,
    pub cols: usize,
    pub timed: bool,
    pub x: Vec<T>,
    /// One read of x, one write of y, and the per-column vectors once.
    pub work: Work,
}

impl<T: Elem> RowCase<T> {
    pub fn new(s: &Session, case: &Value, per_col_vectors: u64, rng: &mut impl Rng) -> Result<Self> {
        let (rows, cols) = (param_usize(case, "rows")?, param_usize(case, "cols")?);
        if rows == 0 || cols == 0 {
            return Err(LabError::shape(s.experiment, format!("{rows} x {cols}: rows and cols must be at least 1")));
        }
        let x: Vec<T> = input(rows, cols, param_str(case, "fill")?, rng)?;
        let (n, size) = ((rows * cols) as u64, T::DTYPE.size() as u64);
        // ~8 flops per element: the statistics, the normalisation and the affine map.
        let work = Work { bytes: (2 * n + per_col_vectors * cols as u64) * size, flops: 8 * n };
        let timed = param_timed(case);
        Ok(RowCase { rows, cols, timed, x, work })
    }

    /// Runs one CPU variant with the house checks.
    pub fn cpu(&self, s: &mut Session, case: &Value, variant: &str, check: &Check<T>, f: impl Fn(&mut [T])) -> Result<()> {
        measure_cpu(s, case, variant, self.work, check, self.timed, self.x.len(), f)
    }

    /// Runs every applicable GPU variant of `family`; `params` are the device buffers after x
    /// (gamma, then beta when there is one).
    #[allow(clippy::too_many_arguments)]
    pub fn gpu(
        &self,
        s: &mut Session,
        gpu: &Gpu,
        case: &Value,
        family: &str,
        variants: &[&str],
        params: &[&CudaSlice<T>],
        check: &Check<T>,
    ) -> Result<()> {
        let dx = gpu.upload(&self.x)?;
        let mut dy = gpu.stream.alloc_zeros::<T>(self.x.len()).doing("allocating y")?;
        let (r, c, eps) = (self.rows as i32, self.cols as i32, EPS);
        for &variant in variants.iter().filter(|v| applies(v, self.cols)) {
            if !s.wants(variant, "lab") {
                continue;
            }
            let f = gpu.function(family, &symbol(family, variant, T::DTYPE))?;
            let cfg = launch_config(variant, self.rows, self.cols);
            let launch = |dy: &mut CudaSlice<T>| -> Result<()> {
                let mut b = gpu.stream.launch_builder(&f);
                b.arg(&dx);
                for p in params {
                    b.arg(*p);
                }
                // SAFETY: x and y hold rows*cols elements and every parameter vector cols; the
                // kernels bound by rows and cols; `applies` kept the row within on-chip capacity.
                unsafe { b.arg(dy).arg(&r).arg(&c).arg(&eps).launch(cfg) }.map(|_| ()).doing(&format!("launching {family} {variant}"))
            };
            measure_gpu(s, gpu, case, variant, self.work, check, self.timed, &mut dy, launch)?;
        }
        Ok(())
    }
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let mut rng = rng_for(s.opts.seed, case);
    let rc = RowCase::<T>::new(s, case, 2, &mut rng)?;
    let gamma: Vec<T> = affine(rc.cols, 1.0, &mut rng);
    let beta: Vec<T> = affine(rc.cols, 0.0, &mut rng);
    validate("layernorm", rc.x.len(), rc.rows, rc.cols, &[("gamma", gamma.len()), ("beta", beta.len())])?;
    let expected = reference(&widen(&rc.x), &widen(&gamma), &widen(&beta), EPS as f64);
    let tol = tolerance(T::DTYPE);
    let compare_y = |y: &[T]| compare_elems(y, &expected, tol, "cpu-f64");
    let check = Check::memory_bound(tol, &compare_y);
    let backend = s.backend.clone();
    match &backend {
        Backend::Cpu => rc.cpu(s, case, "cpu_two_pass_rows", &check, |y| cpu_two_pass_rows(&rc.x, &gamma, &beta, y, EPS)),
        Backend::Cuda(gpu) => {
            let (dg, db) = (gpu.upload(&gamma)?, gpu.upload(&beta)?);
            rc.gpu(s, gpu, case, FAMILY, GPU_VARIANTS, &[&dg, &db], &check)?;
            if rc.timed && s.wants_peer(Peer::Torch, "torch.layer_norm", "torch") {
                let (xb, gb, bb) = (T::bytes(&rc.x), T::bytes(&gamma), T::bytes(&beta));
                let (xs, vs) = ([rc.rows, rc.cols], [rc.cols]);
                let inputs: [(&[u8], &[usize]); 3] = [(&xb, &xs), (&gb, &vs), (&bb, &vs)];
                measure_torch(s, gpu, case, "layer_norm", json!({"eps": EPS}), &inputs, rc.work, &check)?;
            }
            Ok(())
        }
    }
}

/// Grid and block per variant, as each kernel's line in its .cu file states.
pub fn launch_config(variant: &str, rows: usize, cols: usize) -> LaunchConfig {
    let (grid, block) = match variant {
        "two_pass_block" | "block" => (rows, 512),
        "welford_warp" => (rows.div_ceil(8), 256),
        "onchip_block" => (rows, (cols.div_ceil(16).div_ceil(32) * 32).clamp(32, 1024)),
        other => unreachable!("no launch shape for norm variant `{other}`"),
    };
    LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (block as u32, 1, 1), shared_mem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn cpu_variant_matches_reference_including_hostile_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for (rows, cols, fill) in [(1, 1, "normal"), (9, 781, "normal"), (12, 300, "hostile"), (2, 16385, "normal")] {
            let x: Vec<f32> = input(rows, cols, fill, &mut rng).unwrap();
            let (g, b): (Vec<f32>, Vec<f32>) = (affine(cols, 1.0, &mut rng), affine(cols, 0.0, &mut rng));
            let mut y = vec![f32::NAN; x.len()];
            cpu_two_pass_rows(&x, &g, &b, &mut y, EPS);
            let e = compare_elems(&y, &reference(&widen(&x), &widen(&g), &widen(&b), EPS as f64), tolerance(DType::F32), "t");
            assert!(e.passed(), "{rows}x{cols} {fill}: {e:?}");
        }
    }

    #[test]
    fn a_constant_row_normalises_to_beta() {
        let y = reference(&[3.0; 4], &[2.0; 4], &[0.5; 4], 1e-5);
        assert!(y.iter().all(|v| (v - 0.5).abs() < 1e-12));
    }

    #[test]
    fn bad_shapes_are_named() {
        assert!(validate("layernorm", 6, 2, 3, &[("gamma", 3), ("beta", 3)]).is_ok());
        let e = validate("layernorm", 6, 2, 3, &[("gamma", 3), ("beta", 4)]).unwrap_err().to_string();
        assert!(e.contains("beta has 4 elements; rows are 3 wide"), "{e}");
        assert!(validate("layernorm", 0, 0, 3, &[]).unwrap_err().to_string().contains("at least 1"));
    }

    #[test]
    fn onchip_launch_holds_the_row() {
        for cols in [1, 256, 781, 4096, 16384] {
            let cfg = launch_config("onchip_block", 3, cols);
            assert!(cfg.block_dim.0 as usize * 16 >= cols && cfg.block_dim.0 % 32 == 0);
        }
        assert!(!applies("onchip_block", 16385) && applies("welford_warp", 65536));
    }
}

/// TEMPORARY until the table lands.
pub fn variants() -> Vec<crate::ops::variant::VariantInfo> {
    Vec::new()
}
