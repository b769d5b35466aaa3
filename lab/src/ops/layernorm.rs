//! `layernorm`: y = (x - mean) / sqrt(var + eps) * gamma + beta per row, fp32 statistics, f32
//! and bf16 storage (kernels/layernorm.cu). Rows 256..65536 wide. Memory-bound: the floor is one
//! read of x and one write of y; the ladder goes from three passes to the row kept on chip.
//! The row inputs, cases and GPU flow here are shared with `rmsnorm`.

use super::compare::compare_elems;
use super::variant::{self, Requires, Variant, VariantInfo};
use super::{measure_op, measure_torch, widen, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Peer, Session};
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct LayerNorm;

const FAMILY: &str = "layernorm";
pub const EPS: f32 = 1e-5;
/// Longest row the on-chip variants hold: 1024 threads x 16 registers.
pub const ONCHIP_MAX_COLS: usize = 16384;

/// How a row-norm variant (layernorm's or rmsnorm's) runs.
#[derive(Clone, Copy, Debug)]
pub enum NormKernel {
    /// (grid, block) for (rows, cols), as the kernel's line in its .cu file states; rows up to
    /// `max_cols` wide.
    Gpu { grid_block: fn(usize, usize) -> (usize, usize), max_cols: usize },
    /// The family's CPU function.
    Cpu,
}

pub const F32_BF16: &[DType] = &[DType::F32, DType::Bf16];

/// The launch shapes the row norms share.
pub const BLOCK_PER_ROW: NormKernel = NormKernel::Gpu { grid_block: |rows, _| (rows, 512), max_cols: usize::MAX };
pub const ONCHIP_BLOCK: NormKernel = NormKernel::Gpu {
    grid_block: |rows, cols| (rows, (cols.div_ceil(16).div_ceil(32) * 32).clamp(32, 1024)),
    max_cols: ONCHIP_MAX_COLS,
};

/// The ladder, in order: the only place a layernorm variant is named.
pub const VARIANTS: &[Variant<NormKernel>] = &[
    Variant {
        name: "two_pass_block",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "a block per row: mean, variance and write in three passes over the row",
        config: BLOCK_PER_ROW,
    },
    Variant {
        name: "welford_warp",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "a warp per row folding chunks with Chan's merge: two reads of the row",
        config: NormKernel::Gpu { grid_block: |rows, _| (rows.div_ceil(8), 256), max_cols: usize::MAX },
    },
    Variant {
        name: "onchip_block",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "the row held in registers: one read and one write, the floor",
        config: ONCHIP_BLOCK,
    },
    Variant {
        name: "cpu_two_pass_rows",
        dtypes: F32_BF16,
        requires: Requires::Cpu,
        what: "two passes per row with f64 sums, rows in parallel",
        config: NormKernel::Cpu,
    },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// Does a norm variant take rows `cols` wide?
pub fn takes(v: &Variant<NormKernel>, cols: usize) -> bool {
    match v.config {
        NormKernel::Gpu { max_cols, .. } => cols <= max_cols,
        NormKernel::Cpu => true,
    }
}

/// The fastest norm variant of `table` for the backend and width, as measured on an H100
/// (reports/notes, kernels/*norm.cu): the row on chip where it fits, else a block per row.
pub fn best<'a>(table: &'a [Variant<NormKernel>], dev: &Backend, cols: usize) -> &'a Variant<NormKernel> {
    let on_chip = |v: &&Variant<NormKernel>| matches!(v.config, NormKernel::Gpu { max_cols: ONCHIP_MAX_COLS, .. });
    let found = match dev {
        Backend::Cpu => table.iter().find(|v| matches!(v.config, NormKernel::Cpu)),
        Backend::Cuda(_) if cols <= ONCHIP_MAX_COLS => table.iter().find(on_chip),
        // The first GPU rung is the block-per-row one in both tables.
        Backend::Cuda(_) => table.iter().find(|v| v.requires == Requires::Gpu),
    };
    found.expect("every norm table has a CPU, an on-chip and a block-per-row variant")
}

/// y = layernorm(x) * gamma + beta over the last dimension, with the best variant.
pub fn forward<T: Elem>(dev: &Backend, x: &Tensor<T>, gamma: &Tensor<T>, beta: &Tensor<T>, y: &mut Tensor<T>, eps: f32) -> Result<()> {
    forward_with(dev, best(VARIANTS, dev, x.cols()).name, x, gamma, beta, y, eps)
}

/// [`forward`] with the named variant (any row of [`VARIANTS`]).
pub fn forward_with<T: Elem>(
    dev: &Backend,
    variant: &str,
    x: &Tensor<T>,
    gamma: &Tensor<T>,
    beta: &Tensor<T>,
    y: &mut Tensor<T>,
    eps: f32,
) -> Result<()> {
    let cpu = |x: &[T], p: &[&[T]], y: &mut [T]| cpu_two_pass_rows(x, p[0], p[1], y, eps);
    norm_op(FAMILY, VARIANTS, dev, variant, x, &[("gamma", gamma), ("beta", beta)], y, eps, cpu)
}

/// The row norms' shared call: checks the variant, the placement and the shapes (x and y alike,
/// every per-column vector as wide as a row), then runs the kernel (x, the vectors, y, rows,
/// cols, eps) or `cpu`.
#[allow(clippy::too_many_arguments)]
pub fn norm_op<T: Elem>(
    family: &str,
    table: &[Variant<NormKernel>],
    dev: &Backend,
    variant: &str,
    x: &Tensor<T>,
    per_col: &[(&str, &Tensor<T>)],
    y: &mut Tensor<T>,
    eps: f32,
    cpu: impl FnOnce(&[T], &[&[T]], &mut [T]),
) -> Result<()> {
    let v = variant::find(family, table, variant)?;
    variant::check_runs(family, v, dev, T::DTYPE)?;
    let mut placed = vec![("x", x.placement()), ("y", y.placement())];
    placed.extend(per_col.iter().map(|(n, t)| (*n, t.placement())));
    check_placement(family, dev, &placed)?;
    let (rows, cols) = (x.rows(), x.cols());
    if x.shape() != y.shape() {
        return Err(LabError::shape(family, format!("x is {:?} but y is {:?}", x.shape(), y.shape())));
    }
    let lens: Vec<(&str, usize)> = per_col.iter().map(|(n, t)| (*n, t.len())).collect();
    validate(family, x.len(), rows, cols, &lens)?;
    if !takes(v, cols) {
        return Err(LabError::shape(family, format!("`{variant}` holds rows up to {ONCHIP_MAX_COLS} wide, not {cols}")));
    }
    match (v.config, dev) {
        (NormKernel::Cpu, _) => {
            let params: Vec<&[T]> = per_col.iter().map(|(_, t)| t.host().expect("placement checked")).collect();
            cpu(x.host().expect("placement checked"), &params, y.host_mut().expect("placement checked"));
            Ok(())
        }
        (NormKernel::Gpu { grid_block, .. }, Backend::Cuda(gpu)) => {
            let f = gpu.function(family, &symbol(family, v.name, T::DTYPE))?;
            let (grid, block) = grid_block(rows, cols);
            let cfg = LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (block as u32, 1, 1), shared_mem_bytes: 0 };
            let (r, c) = (rows as i32, cols as i32);
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(x.cuda().expect("placement checked"));
            for (_, p) in per_col {
                b.arg(p.cuda().expect("placement checked"));
            }
            // SAFETY: x and y hold rows*cols elements and every parameter vector cols; the
            // kernels bound by rows and cols; `takes` kept the row within on-chip capacity.
            unsafe { b.arg(y.cuda_mut().expect("placement checked")).arg(&r).arg(&c).arg(&eps).launch(cfg) }
                .map(|_| ())
                .doing(&format!("launching {family} {variant}"))
        }
        (NormKernel::Gpu { .. }, Backend::Cpu) => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
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
    fn headlines(&self) -> &'static [&'static str] {
        &["rows=16384 cols=4096"]
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

    /// Measures every variant of `table` that runs here and takes the width, each through
    /// `op(variant, x, y)`: the family's callable op.
    pub fn measure(
        &self,
        s: &mut Session,
        case: &Value,
        table: &[Variant<NormKernel>],
        check: &Check<T>,
        op: impl Fn(&str, &Tensor<T>, &mut Tensor<T>) -> Result<()>,
    ) -> Result<()> {
        let dev = s.backend.clone();
        let x = Tensor::from_slice(&dev, &[self.rows, self.cols], &self.x)?;
        let mut y = Tensor::<T>::zeros(&dev, &[self.rows, self.cols])?;
        for v in table {
            if v.requires.met_by(&dev) && takes(v, self.cols) && s.wants(v.name, "lab") {
                measure_op(s, case, v.name, self.work, check, self.timed, &mut y, |y| op(v.name, &x, y))?;
            }
        }
        Ok(())
    }
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let mut rng = rng_for(s.opts.seed, case);
    let rc = RowCase::<T>::new(s, case, 2, &mut rng)?;
    let gamma: Vec<T> = affine(rc.cols, 1.0, &mut rng);
    let beta: Vec<T> = affine(rc.cols, 0.0, &mut rng);
    let expected = reference(&widen(&rc.x), &widen(&gamma), &widen(&beta), EPS as f64);
    let tol = tolerance(T::DTYPE);
    let compare_y = |y: &[T]| compare_elems(y, &expected, tol, "cpu-f64");
    let check = Check::memory_bound(tol, &compare_y);
    let dev = s.backend.clone();
    let (g, b) = (Tensor::from_slice(&dev, &[rc.cols], &gamma)?, Tensor::from_slice(&dev, &[rc.cols], &beta)?);
    rc.measure(s, case, VARIANTS, &check, |v, x, y| forward_with(&dev, v, x, &g, &b, y, EPS))?;
    if let Backend::Cuda(gpu) = &dev {
        if rc.timed && s.wants_peer(Peer::Torch, "torch.layer_norm", "torch") {
            let (xb, gb, bb) = (T::bytes(&rc.x), T::bytes(&gamma), T::bytes(&beta));
            let (xs, vs) = ([rc.rows, rc.cols], [rc.cols]);
            let inputs: [(&[u8], &[usize]); 3] = [(&xb, &xs), (&gb, &vs), (&bb, &vs)];
            measure_torch(s, gpu, case, "layer_norm", json!({"eps": EPS}), &inputs, rc.work, &check)?;
        }
    }
    Ok(())
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
        let NormKernel::Gpu { grid_block, .. } = ONCHIP_BLOCK else { unreachable!() };
        for cols in [1, 256, 781, 4096, 16384] {
            let (_, block) = grid_block(3, cols);
            assert!(block * 16 >= cols && block % 32 == 0);
        }
        let onchip = variant::find(FAMILY, VARIANTS, "onchip_block").unwrap();
        assert!(!takes(onchip, 16385) && takes(&VARIANTS[1], 65536));
    }

    #[test]
    fn the_callable_op_matches_the_reference_and_names_bad_input() {
        let dev = Backend::Cpu;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (rows, cols) = (5, 37);
        let xv: Vec<f32> = input(rows, cols, "normal", &mut rng).unwrap();
        let (gv, bv): (Vec<f32>, Vec<f32>) = (affine(cols, 1.0, &mut rng), affine(cols, 0.0, &mut rng));
        let x = Tensor::from_vec(&[rows, cols], xv.clone()).unwrap();
        let (g, b) = (Tensor::from_vec(&[cols], gv.clone()).unwrap(), Tensor::from_vec(&[cols], bv.clone()).unwrap());
        let mut y = Tensor::<f32>::zeros(&dev, &[rows, cols]).unwrap();
        forward(&dev, &x, &g, &b, &mut y, EPS).unwrap();
        let e = compare_elems(&y.to_vec().unwrap(), &reference(&widen(&xv), &widen(&gv), &widen(&bv), EPS as f64), tolerance(DType::F32), "t");
        assert!(e.passed(), "{e:?}");
        let short = Tensor::from_vec(&[cols - 1], vec![1f32; cols - 1]).unwrap();
        let err = forward(&dev, &x, &short, &b, &mut y, EPS).unwrap_err().to_string();
        assert!(err.contains("gamma has 36 elements; rows are 37 wide"), "{err}");
        let err = forward_with(&dev, "welford_warp", &x, &g, &b, &mut y, EPS).unwrap_err().to_string();
        assert!(err.contains("needs gpu, not the CPU backend"), "{err}");
    }
}
