//! `softmax`: row-wise softmax in f32 and bf16 (kernels/softmax.cu), a ladder from a naive
//! three-pass kernel to single-read variants that keep the row on chip.
//!
//! Semantics shared by the reference and every variant: entries of -inf contribute 0; a row of
//! all -inf (fully masked) gives all zeros; a NaN or +inf anywhere in a row makes the row NaN;
//! large magnitudes (1e4) do not overflow because the row max is subtracted first.

use super::compare::compare_elems;
use super::variant::{self, Requires, Variant, VariantInfo};
use super::{measure_op, measure_torch, widen, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Measurement, Peer, Session};
use crate::kernels::{symbol, DType};
use crate::profile::{cpu_time, Work};
use crate::record::Tolerance;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Softmax;

const FAMILY: &str = "softmax";

/// How a variant runs: a CUDA kernel with its launch shape and the rows it takes, or the CPU path.
#[derive(Clone, Copy, Debug)]
pub enum Kernel {
    /// (grid, block) for (rows, cols), as the kernel's line in kernels/softmax.cu states; rows
    /// from `min_cols` to `max_cols` wide.
    Gpu { grid_block: fn(usize, usize) -> (usize, usize), min_cols: usize, max_cols: usize },
    /// [`cpu_online_rows`].
    CpuOnlineRows,
}

const F32_BF16: &[DType] = &[DType::F32, DType::Bf16];

/// The ladder, in order: the only place a softmax variant is named.
pub const VARIANTS: &[Variant<Kernel>] = &[
    Variant {
        name: "naive_thread_per_row",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "one thread per row, three uncoalesced passes: the baseline",
        config: Kernel::Gpu { grid_block: |rows, _| (rows.div_ceil(256), 256), min_cols: 1, max_cols: NAIVE_MAX_COLS },
    },
    Variant {
        name: "block_three_pass",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "a block per row, coalesced loads and block reductions; still three passes",
        config: Kernel::Gpu { grid_block: |rows, _| (rows, 256), min_cols: 1, max_cols: usize::MAX },
    },
    Variant {
        name: "online_warp_per_row",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "a warp per row, online (max, sum) fuses two passes; shuffles only",
        config: Kernel::Gpu { grid_block: |rows, _| (rows.div_ceil(8), 256), min_cols: 1, max_cols: usize::MAX },
    },
    Variant {
        name: "online_block_per_row",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "512 threads per row with 16 B loads, so long rows keep enough loads in flight",
        config: Kernel::Gpu { grid_block: |rows, _| (rows, 512), min_cols: 1, max_cols: usize::MAX },
    },
    Variant {
        name: "onchip_block_per_row",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "the row held in registers: one read and one write, the traffic floor",
        config: Kernel::Gpu {
            grid_block: |rows, cols| (rows, (cols.div_ceil(16).div_ceil(32) * 32).clamp(32, 1024)),
            min_cols: 1,
            max_cols: ONCHIP_MAX_COLS,
        },
    },
    Variant {
        name: "cluster_per_row",
        dtypes: F32_BF16,
        requires: Requires::Sm90,
        // Below ONCHIP_MAX_COLS a cluster per row costs more in launch and barriers than it saves.
        what: "a cluster of 8 blocks splits a long row, exchanging (max, sum) through DSMEM",
        config: Kernel::Gpu { grid_block: |rows, _| (rows * 8, 1024), min_cols: ONCHIP_MAX_COLS + 1, max_cols: CLUSTER_MAX_COLS },
    },
    Variant {
        name: "cpu_online_rows",
        dtypes: F32_BF16,
        requires: Requires::Cpu,
        what: "online (max, sum) in one pass per row, f32 arithmetic, rows in parallel",
        config: Kernel::CpuOnlineRows,
    },
];
/// Longest row `onchip_block_per_row` holds: 1024 threads x 16 registers.
pub const ONCHIP_MAX_COLS: usize = 16384;
/// Longest row `cluster_per_row` holds: 8 blocks x 1024 threads x 32 registers.
pub const CLUSTER_MAX_COLS: usize = 262144;
/// Beyond this the one-thread-per-row baseline takes seconds per call and teaches nothing new.
pub const NAIVE_MAX_COLS: usize = 8192;

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// The variant [`forward`] runs on `dev` for rows `cols` wide: the fastest that takes the shape,
/// as measured on an H100 (2026-11-25T18-25-39Z-h100-840af7d): the row on chip up to its
/// capacity; beyond it a cluster per row only for the longest f32 rows (0.81 against 1.10 ms at
/// 262144 wide; it loses below ~131072 and in bf16), else 512 threads per row.
pub fn best(dev: &Backend, dtype: DType, cols: usize) -> &'static Variant<Kernel> {
    let name = match dev {
        Backend::Cpu => "cpu_online_rows",
        Backend::Cuda(_) if cols <= ONCHIP_MAX_COLS => "onchip_block_per_row",
        Backend::Cuda(g) if g.arch >= 90 && dtype == DType::F32 && (CLUSTER_MIN_WIN_COLS..=CLUSTER_MAX_COLS).contains(&cols) => "cluster_per_row",
        Backend::Cuda(_) => "online_block_per_row",
    };
    variant::find(FAMILY, VARIANTS, name).expect("the best softmax variant is in the table")
}

/// Where `cluster_per_row` starts to beat `online_block_per_row` in f32 (kernels/softmax.cu).
const CLUSTER_MIN_WIN_COLS: usize = 131072;

/// Does `v` take rows `cols` wide?
pub fn takes(v: &Variant<Kernel>, cols: usize) -> bool {
    match v.config {
        Kernel::Gpu { min_cols, max_cols, .. } => (min_cols..=max_cols).contains(&cols),
        Kernel::CpuOnlineRows => true,
    }
}

/// y = softmax(x) over the last dimension, with the best variant for the backend and shape.
pub fn forward<T: Elem>(dev: &Backend, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    forward_with(dev, best(dev, T::DTYPE, x.cols()).name, x, y)
}

/// y = softmax(x) over the last dimension with the named variant (any row of [`VARIANTS`]).
pub fn forward_with<T: Elem>(dev: &Backend, variant: &str, x: &Tensor<T>, y: &mut Tensor<T>) -> Result<()> {
    let v = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, v, dev, T::DTYPE)?;
    check_placement("softmax", dev, &[("x", x.placement()), ("y", y.placement())])?;
    let (rows, cols) = (x.rows(), x.cols());
    if x.shape() != y.shape() {
        return Err(LabError::shape("softmax", format!("x is {:?} but y is {:?}", x.shape(), y.shape())));
    }
    if cols == 0 {
        return Err(LabError::shape("softmax", format!("x is {:?}: rows must be at least 1 wide", x.shape())));
    }
    if !takes(v, cols) {
        let Kernel::Gpu { min_cols, max_cols, .. } = v.config else { unreachable!("the CPU path takes every width") };
        return Err(LabError::shape("softmax", format!("`{variant}` takes rows {min_cols} to {max_cols} wide, not {cols}")));
    }
    match (v.config, dev) {
        (Kernel::CpuOnlineRows, _) => {
            let x = x.host().expect("placement checked");
            cpu_online_rows(x, y.host_mut().expect("placement checked"), cols);
            Ok(())
        }
        (Kernel::Gpu { grid_block, .. }, Backend::Cuda(gpu)) => {
            let f = gpu.function(FAMILY, &symbol(FAMILY, v.name, T::DTYPE))?;
            let (grid, block) = grid_block(rows, cols);
            let cfg = LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (block as u32, 1, 1), shared_mem_bytes: 0 };
            let (r, c) = (rows as i32, cols as i32);
            let (dx, dy) = (x.cuda().expect("placement checked"), y.cuda_mut().expect("placement checked"));
            // SAFETY: x and y hold rows*cols elements; every variant bounds by rows and cols,
            // and `takes` kept the width within the variant's on-chip capacity.
            unsafe { gpu.stream.launch_builder(&f).arg(dx).arg(dy).arg(&r).arg(&c).launch(cfg) }
                .map(|_| ())
                .doing(&format!("launching softmax {variant}"))
        }
        (Kernel::Gpu { .. }, Backend::Cpu) => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

pub fn tolerance(dtype: DType, cols: usize) -> Tolerance {
    match dtype {
        // f32 exp and a sum over `cols` terms. A sequential sum (the naive variant) errs like
        // sqrt(n) * u with a tail (Higham, "Accuracy and Stability", 2nd ed., 4.2); measured on an
        // H100 host: 1.8e-5 at 4096 wide over 16384 rows, above a flat 1e-5.
        DType::F32 => Tolerance { atol: 1e-9, rtol: 1e-5f64.max(8.0 * (cols as f64).sqrt() * f32::EPSILON as f64 / 2.0) },
        // bf16 output rounding alone is 2^-9 relative; allow two ulp.
        _ => Tolerance { atol: 1e-6, rtol: 2f64.powi(-7) },
    }
}

/// The f64 reference.
pub fn reference(x: &[f64], cols: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    y.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(y, x)| {
        let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| if v > m || v.is_nan() { v } else { m });
        if max == f64::NEG_INFINITY {
            return; // fully masked row: zeros by definition
        }
        let sum: f64 = x.iter().map(|&v| (v - max).exp()).sum();
        for (y, &v) in y.iter_mut().zip(x) {
            *y = (v - max).exp() / sum;
        }
    });
    y
}

/// The CPU backend's variant: online (max, sum) in one pass per row, f32 arithmetic, rows in
/// parallel.
pub fn cpu_online_rows<T: Elem>(x: &[T], y: &mut [T], cols: usize) {
    y.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(y, x)| {
        let (mut m, mut d) = (f32::NEG_INFINITY, 0f32);
        for v in x.iter().map(|v| v.to_f32()) {
            let m_new = if v > m || v.is_nan() { v } else { m };
            if m_new != f32::NEG_INFINITY {
                d = d * (m - m_new).exp() + (v - m_new).exp();
                // exp(-inf - -inf) would be NaN: before the first finite value d is 0 anyway.
                if m == f32::NEG_INFINITY {
                    d = (v - m_new).exp();
                }
            }
            m = m_new;
        }
        for (y, v) in y.iter_mut().zip(x) {
            *y = T::from_f32(if m == f32::NEG_INFINITY { 0.0 } else { (v.to_f32() - m).exp() / d });
        }
    });
}

/// Inputs for one case: N(0, 3^2), or "hostile" rows that cycle through the edge cases.
pub fn input<T: Elem>(rows: usize, cols: usize, fill: &str, rng: &mut impl Rng) -> Result<Vec<T>> {
    let normal = |rng: &mut dyn rand::RngCore| -> f32 {
        let v: f32 = StandardNormal.sample(rng);
        3.0 * v
    };
    let mut x = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let v = match fill {
                "normal" => normal(rng),
                "hostile" => match r % 5 {
                    0 => f32::NEG_INFINITY,                                            // fully masked
                    1 if c % 3 == 0 => f32::NEG_INFINITY,                              // partly masked
                    2 => rng.random_range(-1e4..1e4),                                  // huge spread
                    3 if c == cols / 2 => 1e4,                                         // one spike
                    _ => normal(rng),
                },
                other => return Err(LabError::Invalid(format!("unknown softmax fill `{other}` (normal, hostile)"))),
            };
            x.push(T::from_f32(v));
        }
    }
    Ok(x)
}

impl Experiment for Softmax {
    fn name(&self) -> &'static str {
        "softmax"
    }
    fn description(&self) -> &'static str {
        "row-wise softmax, f32 and bf16, rows 1..262144 wide: naive three-pass to single-read on-chip and cluster-per-row"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["rows=16384 cols=4096"]
    }
    fn sweep_axis(&self) -> &'static str {
        "cols"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        // Odd shapes and hostile values first: correctness gates, checked but not timed.
        let checks: &[(usize, usize, &str)] =
            &[(1, 1, "normal"), (1823, 781, "normal"), (7, 65537, "normal"), (1823, 781, "hostile"), (10, 40000, "hostile")];
        let timed: &[(usize, usize, &str)] = match (backend, quick) {
            (Backend::Cuda(_), false) => &[
                (65536, 1024, "normal"),
                (16384, 4096, "normal"),
                (8192, 8192, "normal"),
                (4096, 16384, "normal"),
                (2048, 32768, "normal"),
                (1024, 262144, "normal"),
            ],
            (Backend::Cuda(_), true) => &[(16384, 4096, "normal"), (512, 32768, "normal")],
            (Backend::Cpu, false) => &[(4096, 1024, "normal"), (256, 32768, "normal")],
            (Backend::Cpu, true) => &[(64, 1000, "normal")],
        };
        let checks: &[(usize, usize, &str)] = match (backend, quick) {
            (Backend::Cpu, true) => &[(1, 1, "normal"), (17, 781, "normal"), (3, 4099, "normal"), (11, 300, "hostile")],
            _ => checks,
        };
        let case = |rows: usize, cols: usize, dtype: &str, fill: &str, timed: bool| {
            json!({"rows": rows, "cols": cols, "dtype": dtype, "fill": fill, "timed": timed})
        };
        ["f32", "bf16"]
            .iter()
            .flat_map(|dtype| {
                let checks = checks.iter().map(move |&(r, c, f)| case(r, c, dtype, f, false));
                checks.chain(timed.iter().map(move |&(r, c, f)| case(r, c, dtype, f, true)))
            })
            .collect()
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::F32 => run::<f32>(s, case),
            DType::Bf16 => run::<half::bf16>(s, case),
            DType::F16 => Err(LabError::Invalid("softmax runs in f32 and bf16".into())),
        }
    }
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let (rows, cols) = (param_usize(case, "rows")?, param_usize(case, "cols")?);
    if rows == 0 || cols == 0 {
        return Err(LabError::shape("softmax", format!("{rows} x {cols}: rows and cols must be at least 1")));
    }
    let fill = param_str(case, "fill")?;
    let timed = param_timed(case);
    let x: Vec<T> = input(rows, cols, fill, &mut rng_for(s.opts.seed, case))?;
    let expected = reference(&widen(&x), cols);
    let n = (rows * cols) as u64;
    // One read and one write per element; ~5 flops (max, subtract, exp, add, divide).
    let work = Work { bytes: 2 * n * T::DTYPE.size() as u64, flops: 5 * n };
    let tol = tolerance(T::DTYPE, cols);
    let compare_y = |y: &[T]| compare_elems(y, &expected, tol, "cpu-f64");
    let check = Check::memory_bound(tol, &compare_y);
    let dev = s.backend.clone();
    let dx = Tensor::from_slice(&dev, &[rows, cols], &x)?;
    let mut dy = Tensor::<T>::zeros(&dev, &[rows, cols])?;
    for v in VARIANTS {
        if !v.requires.met_by(&dev) || !takes(v, cols) || !s.wants(v.name, "lab") {
            continue;
        }
        measure_op(s, case, v.name, work, &check, timed, &mut dy, |dy| forward_with(&dev, v.name, &dx, dy))?;
    }
    match &dev {
        Backend::Cpu if timed && s.wants("reference_f64", "cpu-ref") => {
            let xf = widen(&x);
            let time = cpu_time(&s.budget, || drop(std::hint::black_box(reference(&xf, cols))));
            let mut m = Measurement::new("reference_f64", "cpu-ref", case, work);
            m.time = Some(time);
            s.emit(m)?;
        }
        Backend::Cuda(gpu) if timed && s.wants_peer(Peer::Torch, "torch.softmax", "torch") => {
            let shape = [rows, cols];
            measure_torch(s, gpu, case, "softmax", json!({}), &[(&T::bytes(&x), &shape)], work, &check)?;
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn check_cpu<T: Elem>(rows: usize, cols: usize, fill: &str) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rows as u64 * 31 + cols as u64);
        let x: Vec<T> = input(rows, cols, fill, &mut rng).unwrap();
        let expected = reference(&widen(&x), cols);
        let mut y = vec![T::from_f32(f32::NAN); x.len()];
        cpu_online_rows(&x, &mut y, cols);
        let e = compare_elems(&y, &expected, tolerance(T::DTYPE, cols), "cpu-f64");
        assert!(e.passed(), "{:?} {rows}x{cols} {fill}: {e:?}", T::DTYPE);
    }

    #[test]
    fn cpu_variant_matches_reference_on_odd_shapes_and_hostile_values() {
        for (rows, cols, fill) in [(1, 1, "normal"), (1823, 7, "normal"), (7, 6553, "normal"), (23, 781, "hostile")] {
            check_cpu::<f32>(rows, cols, fill);
            check_cpu::<half::bf16>(rows, cols, fill);
        }
    }

    #[test]
    fn reference_defines_the_edge_cases() {
        let inf = f64::INFINITY;
        // fully masked row -> zeros; partly masked -> masked entries 0, rest normalised
        assert_eq!(reference(&[-inf, -inf], 2), vec![0.0, 0.0]);
        assert_eq!(reference(&[-inf, 3.0], 2), vec![0.0, 1.0]);
        // huge magnitudes do not overflow
        let y = reference(&[1e4, 1e4 - 1.0, -1e4], 3);
        assert!((y[0] - 1.0 / (1.0 + (-1f64).exp())).abs() < 1e-15 && y[2] == 0.0);
        // NaN and +inf poison their row only
        let y = reference(&[f64::NAN, 1.0, 0.0, 0.0], 2);
        assert!(y[0].is_nan() && y[1].is_nan() && y[2] == 0.5 && y[3] == 0.5);
        assert!(reference(&[inf, 1.0], 2).iter().all(|v| v.is_nan()));
    }

    #[test]
    fn every_row_sums_to_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let x: Vec<f32> = input(9, 1001, "normal", &mut rng).unwrap();
        for row in reference(&widen(&x), 1001).chunks(1001) {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
    }

    #[test]
    fn launch_shapes_cover_every_row() {
        for (rows, cols) in [(1, 1), (1823, 781), (7, 65537), (16384, 4096)] {
            for v in VARIANTS {
                let Kernel::Gpu { grid_block, .. } = v.config else { continue };
                if !takes(v, cols) {
                    continue;
                }
                let (grid, block) = grid_block(rows, cols);
                let rows_covered = match v.name {
                    "naive_thread_per_row" => grid * block,
                    "online_warp_per_row" => grid * block / 32,
                    "cluster_per_row" => grid / 8,
                    _ => grid,
                };
                assert!(rows_covered >= rows, "{} {rows}x{cols}", v.name);
                if v.name == "onchip_block_per_row" {
                    assert!(block * 16 >= cols);
                }
            }
        }
    }

    #[test]
    fn the_callable_op_runs_on_the_cpu_and_names_bad_input() {
        let dev = Backend::Cpu;
        let x = Tensor::from_vec(&[2, 3], vec![1f32, 2.0, 3.0, 0.0, 0.0, f32::NEG_INFINITY]).unwrap();
        let mut y = Tensor::<f32>::zeros(&dev, &[2, 3]).unwrap();
        forward(&dev, &x, &mut y).unwrap();
        let expected = reference(&widen(&x.to_vec().unwrap()), 3);
        let e = compare_elems(&y.to_vec().unwrap(), &expected, tolerance(DType::F32, 3), "cpu-f64");
        assert!(e.passed(), "{e:?}");
        let mut wrong = Tensor::<f32>::zeros(&dev, &[3, 2]).unwrap();
        let err = forward(&dev, &x, &mut wrong).unwrap_err().to_string();
        assert!(err.contains("x is [2, 3] but y is [3, 2]"), "{err}");
        let err = forward_with(&dev, "onchip_block_per_row", &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("`onchip_block_per_row` needs gpu, not the CPU backend"), "{err}");
        let err = forward_with(&dev, "fastest", &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("not a softmax variant (one of: naive_thread_per_row,"), "{err}");
        let h = Tensor::from_vec(&[1, 2], vec![half::f16::ONE; 2]).unwrap();
        let mut hy = Tensor::<half::f16>::zeros(&dev, &[1, 2]).unwrap();
        assert!(forward(&dev, &h, &mut hy).unwrap_err().to_string().contains("takes f32, bf16, not f16"));
    }
}
