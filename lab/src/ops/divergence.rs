//! `divergence`: what a warp pays when its lanes take different paths (kernels/divergence.cu).
//! Every element runs `iters` dependent FMAs whose constants depend on a path; the work per
//! element is the same on every path, so time per element against the number of distinct paths
//! per warp (k) shows the serialization directly. On the CPU the same data-dependent branch on
//! sorted against shuffled input shows branch misprediction instead.

use super::compare::compare_elems;
use super::variant::{self, Requires, Variant, VariantInfo};
use super::{measure_cpu, measure_gpu_as, Check};
use crate::error::Doing;
use crate::experiment::{param_str, param_usize, rng_for, Backend, Experiment, Session};
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use rand::seq::SliceRandom;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Divergence;

const FAMILY: &str = "divergence";

/// What a variant's element chooses its path by, where it runs, and whether it branches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// GPU: k distinct paths per warp, chosen by lane (cases of kind "paths").
    Paths,
    /// GPU: two paths chosen by the sign of the element (cases of kind "data").
    Data,
    /// CPU: the data-dependent choice, sorted against shuffled input.
    Cpu,
}

/// The variants: the only place a divergence variant is named.
pub const VARIANTS: &[Variant<Kind>] = &[
    Variant { name: "paths_branch", dtypes: F32, requires: Requires::Gpu, what: "k paths per warp by lane, as a branch: the warp runs them one after another", config: Kind::Paths },
    Variant { name: "paths_select", dtypes: F32, requires: Requires::Gpu, what: "the same k paths with constants selected, not branched: no divergence", config: Kind::Paths },
    Variant { name: "data_branch", dtypes: F32, requires: Requires::Gpu, what: "two paths by the element's sign, as a branch", config: Kind::Data },
    Variant { name: "data_select", dtypes: F32, requires: Requires::Gpu, what: "two paths by the element's sign, selected", config: Kind::Data },
    Variant { name: "cpu_branch", dtypes: F32, requires: Requires::Cpu, what: "the sign test as a branch: mispredicted on shuffled input", config: Kind::Cpu },
    Variant { name: "cpu_select", dtypes: F32, requires: Requires::Cpu, what: "the sign test as a select: no branch to mispredict", config: Kind::Cpu },
];
const F32: &[DType] = &[DType::F32];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// The rows of one kind.
fn of(kind: Kind) -> impl Iterator<Item = &'static Variant<Kind>> {
    VARIANTS.iter().filter(move |v| v.config == kind)
}
pub const PATHS: &[usize] = &[1, 2, 4, 8, 16, 32];
/// Branch and select compute the same fmaf chain: the result must match the reference exactly.
const EXACT: Tolerance = Tolerance { atol: 0.0, rtol: 0.0 };
/// The ncu metrics recorded with `--ncu`: average active threads per executed instruction (32
/// when no lane is masked off), and branch targets, all and divergent.
pub const NCU_METRICS: &[&str] = &[
    "smsp__thread_inst_executed_per_inst_executed.ratio",
    "smsp__sass_branch_targets.sum",
    "smsp__sass_branch_targets_threads_divergent.sum",
];

/// Path p's constants, as the kernels spell them (PATH_A, PATH_B).
fn constants(p: usize) -> (f32, f32) {
    (0.5 + 0.015625 * p as f32, 0.0009765625 * (p + 1) as f32)
}

/// The path an element takes: by lane (`paths_*`: lane = index mod 32 with blocks a multiple of
/// 32 threads) or by sign (`data_*`, `cpu_*`).
fn path(variant: &str, i: usize, x: f32, k: usize) -> usize {
    if variant.starts_with("paths") { (i % 32) % k } else { usize::from(x > 0.0) }
}

fn chain(mut x: f32, (a, b): (f32, f32), iters: usize) -> f32 {
    for _ in 0..iters {
        x = x.mul_add(a, b);
    }
    x
}

/// The GPU variants' reference: the same fused multiply-adds in the same order, so exact (the
/// CPU variants, which run this very chain, are checked against [`closed_form`] instead).
pub fn reference(variant: &str, x: &[f32], k: usize, iters: usize) -> Vec<f64> {
    x.par_iter().enumerate().map(|(i, &v)| chain(v, constants(path(variant, i, v, k)), iters) as f64).collect()
}

/// The CPU variants' reference: the chain's closed form in f64, x a^n + b (1 - a^n) / (1 - a)
/// with the constants of the element's sign, nothing rounded between steps: a different
/// computation from the f32 FMA chain it checks.
pub fn closed_form(x: &[f32], iters: usize) -> Vec<f64> {
    x.par_iter()
        .enumerate()
        .map(|(i, &v)| {
            let (a, b) = constants(path("data", i, v, 2));
            let (a, b) = (a as f64, b as f64);
            let an = a.powi(iters as i32);
            v as f64 * an + b * (1.0 - an) / (1.0 - a)
        })
        .collect()
}

/// How far an f32 chain may be from [`closed_form`]: each FMA rounds once, by at most 2^-24 of its
/// result, and |x_i| <= |x| + b / (1 - a) (a < 1 shrinks what came before), so after n steps the
/// chain is within n 2^-24 (max |x| + b / (1 - a)) of it.
pub fn closed_form_tolerance(x: &[f32], iters: usize) -> Tolerance {
    let amax = x.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let fixed = (0..2).map(constants).map(|(a, b)| b as f64 / (1.0 - a as f64)).fold(0.0, f64::max);
    Tolerance { atol: iters as f64 * 2f64.powi(-24) * (amax + fixed), rtol: 0.0 }
}

/// Normal values, sorted (warps agree on the sign but one) or shuffled (every warp split).
fn input(n: usize, fill: &str, rng: &mut rand::rngs::StdRng) -> Result<Vec<f32>> {
    let mut x: Vec<f32> = (0..n).map(|_| StandardNormal.sample(&mut *rng)).collect();
    match fill {
        "sorted" => x.sort_by(f32::total_cmp),
        "shuffled" => x.shuffle(rng),
        other => return Err(LabError::Invalid(format!("divergence: unknown fill `{other}` (sorted, shuffled)"))),
    }
    Ok(x)
}

/// The CPU analogue: a branch per element on its sign. `black_box` in each arm keeps the branch
/// a branch (the compiler cannot turn arms with opaque side effects into a conditional move).
pub fn cpu_run(variant: &str, x: &[f32], y: &mut [f32], iters: usize) {
    let body = |(y, &v): (&mut f32, &f32)| {
        *y = match variant {
            "cpu_branch" => {
                if v > 0.0 {
                    chain(std::hint::black_box(v), constants(1), iters)
                } else {
                    chain(std::hint::black_box(v), constants(0), iters)
                }
            }
            _ => chain(v, constants(usize::from(v > 0.0)), iters),
        }
    };
    y.iter_mut().zip(x).for_each(body);
}

impl Experiment for Divergence {
    fn name(&self) -> &'static str {
        "divergence"
    }
    fn description(&self) -> &'static str {
        "warp divergence: k = 1..32 distinct paths per warp, sign branches on sorted vs shuffled input, and divergence-free rewrites; on the CPU, branch misprediction"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["kind=paths n=4194304 k=1", "kind=paths n=4194304 k=32", "kind=data n=4194304"]
    }
    fn sweep_axis(&self) -> &'static str {
        "k"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let mut out = Vec::new();
        match backend {
            Backend::Cuda(_) => {
                let (n, iters) = if quick { (1 << 20, 64) } else { (1 << 22, 256) };
                // An odd size first, untimed: the bounds check of every kernel.
                for &k in PATHS {
                    out.push(json!({"kind": "paths", "k": k, "n": 1003, "iters": 7, "fill": "shuffled", "timed": false}));
                    out.push(json!({"kind": "paths", "k": k, "n": n, "iters": iters, "fill": "shuffled"}));
                }
                for fill in ["sorted", "shuffled"] {
                    out.push(json!({"kind": "data", "k": 2, "n": n, "iters": iters, "fill": fill}));
                }
            }
            Backend::Cpu => {
                // Short chains, so a mispredicted branch (~15-20 cycles) is a visible share.
                let n = if quick { 1 << 16 } else { 1 << 22 };
                for fill in ["sorted", "shuffled"] {
                    out.push(json!({"kind": "data", "k": 2, "n": n, "iters": 2, "fill": fill}));
                }
            }
        }
        out
    }
    /// The odd-size gates, and the data-dependent kernels on the same odd size.
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        let mut out = crate::experiment::quick_gates(self, backend);
        if matches!(backend, Backend::Cuda(_)) {
            out.extend(["sorted", "shuffled"].map(|fill| json!({"kind": "data", "k": 2, "n": 1003, "iters": 7, "fill": fill, "timed": false})));
        }
        out
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let (n, k, iters) = (param_usize(case, "n")?, param_usize(case, "k")?, param_usize(case, "iters")?);
        if n == 0 || !(1..=32).contains(&k) {
            return Err(LabError::shape("divergence", "n must be at least 1 and k in 1..=32"));
        }
        let x = input(n, param_str(case, "fill")?, &mut rng_for(s.opts.seed, case))?;
        // One read and one write per element; 2 flops per FMA (the useful work, whatever k is).
        let work = Work { bytes: 8 * n as u64, flops: 2 * (iters * n) as u64 };
        let timed = crate::experiment::param_timed(case);
        let backend = s.backend.clone();
        match &backend {
            Backend::Cuda(gpu) => {
                let kind = if param_str(case, "kind")? == "paths" { Kind::Paths } else { Kind::Data };
                let dx = gpu.upload(&x)?;
                let mut dy = gpu.stream.alloc_zeros::<f32>(n).doing("allocating y")?;
                for variant in of(kind).map(|v| v.name) {
                    if !s.wants(variant, "lab") {
                        continue;
                    }
                    let expected = reference(variant, &x, k, iters);
                    let compare = |y: &[f32]| compare_elems(y, &expected, EXACT, "cpu-exact-fma");
                    let check = Check { tol: EXACT, compare: &compare, ceiling: "fma_tflop_s" };
                    let mut extra = serde_json::Map::new();
                    if s.opts.ncu {
                        let kernel = symbol(FAMILY, variant, DType::F32);
                        extra.insert("ncu".into(), json!(crate::profile::ncu::measure(&kernel, FAMILY, case, variant, s.opts.seed, NCU_METRICS)?));
                    }
                    let launch = |dy: &mut CudaSlice<f32>| launch(gpu, variant, &dx, dy, k, iters);
                    measure_gpu_as(s, gpu, case, (variant, "lab"), work, &check, timed, &mut dy, extra, launch)?;
                }
                Ok(())
            }
            Backend::Cpu => {
                let (expected, tol) = (closed_form(&x, iters), closed_form_tolerance(&x, iters));
                for variant in of(Kind::Cpu).map(|v| v.name) {
                    let compare = |y: &[f32]| compare_elems(y, &expected, tol, "cpu-f64-closed-form");
                    let check = Check { tol, compare: &compare, ceiling: "fma_tflop_s" };
                    measure_cpu(s, case, variant, work, &check, timed, n, |y| cpu_run(variant, &x, y, iters))?;
                }
                Ok(())
            }
        }
    }
    fn launch_once(&self, gpu: &Gpu, case: &Value, variant: &str, seed: u64) -> Result<()> {
        let (n, k, iters) = (param_usize(case, "n")?, param_usize(case, "k")?, param_usize(case, "iters")?);
        let x = input(n, param_str(case, "fill")?, &mut rng_for(seed, case))?;
        let dx = gpu.upload(&x)?;
        let mut dy = gpu.stream.alloc_zeros::<f32>(n).doing("allocating y")?;
        launch(gpu, variant, &dx, &mut dy, k, iters)?;
        gpu.sync()
    }
}

fn launch(gpu: &Gpu, variant: &str, dx: &CudaSlice<f32>, dy: &mut CudaSlice<f32>, k: usize, iters: usize) -> Result<()> {
    let f = gpu.function(FAMILY, &symbol(FAMILY, variant, DType::F32))?;
    let n = dx.len();
    // 256 threads: a multiple of 32, so lane = index mod 32 as the reference assumes.
    let cfg = LaunchConfig { grid_dim: (n.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (nn, kk, it) = (n as i64, k as i32, iters as i32);
    // SAFETY: x and y hold n floats and every kernel bounds its index by n.
    unsafe { gpu.stream.launch_builder(&f).arg(dx).arg(dy).arg(&nn).arg(&kk).arg(&it).launch(cfg) }
        .map(|_| ())
        .doing(&format!("launching divergence {variant}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The CPU variants, and the FMA chain the GPU's are checked against exactly, lie within the
    /// rounding bound of the closed form, without being it; a swapped path or a step short fails.
    #[test]
    fn cpu_variants_meet_the_closed_form_on_both_fills() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (fill, iters) in [("sorted", 5), ("shuffled", 5), ("shuffled", 300)] {
            let x = input(1003, fill, &mut rng).unwrap();
            let (expected, tol) = (closed_form(&x, iters), closed_form_tolerance(&x, iters));
            let chain: Vec<f32> = reference("data", &x, 2, iters).iter().map(|&v| v as f32).collect();
            assert!(compare_elems(&chain, &expected, tol, "t").passed(), "the exact chain, {fill}");
            for v in of(Kind::Cpu).map(|v| v.name) {
                let mut y = vec![f32::NAN; x.len()];
                cpu_run(v, &x, &mut y, iters);
                let e = compare_elems(&y, &expected, tol, "t");
                assert!(e.passed() && e.max_abs > 0.0, "{v} {fill} {iters}: {e:?}");
                let mut swapped = y.clone();
                let i = x.iter().position(|v| v.abs() > 0.5).unwrap();
                swapped[i] = chain_of(x[i], 1 - usize::from(x[i] > 0.0), iters);
                assert!(!compare_elems(&swapped, &expected, tol, "t").passed(), "{v} {fill}: a swapped path passed");
                // (A long chain has settled on b / (1 - a): a step more or less is invisible.)
                if iters < 10 {
                    cpu_run(v, &x, &mut y, iters - 1);
                    assert!(!compare_elems(&y, &expected, tol, "t").passed(), "{v} {fill}: a chain a step short passed");
                }
            }
        }
    }

    fn chain_of(x: f32, p: usize, iters: usize) -> f32 {
        chain(x, constants(p), iters)
    }

    #[test]
    fn lanes_of_a_warp_take_k_distinct_paths() {
        for &k in PATHS {
            let taken: std::collections::BTreeSet<usize> = (64..96).map(|i| path("paths_branch", i, 0.0, k)).collect();
            assert_eq!(taken.len(), k);
        }
        // Sorted input leaves at most one warp with both signs.
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let x = input(4096, "sorted", &mut rng).unwrap();
        let split = x.chunks(32).filter(|w| w.iter().any(|&v| v > 0.0) && w.iter().any(|&v| v <= 0.0)).count();
        assert!(split <= 1);
    }

    #[test]
    fn the_constants_are_the_kernels() {
        // PATH_A(p) and PATH_B(p) as NVRTC evaluates them in kernels/divergence.cu, bit for bit.
        let paths = [0, 1, 17, 31];
        let exprs: Vec<String> = paths.iter().flat_map(|p| [format!("__float_as_uint(PATH_A({p}))"), format!("__float_as_uint(PATH_B({p}))")]).collect();
        let exprs: Vec<&str> = exprs.iter().map(String::as_str).collect();
        let cache = tempfile::tempdir().unwrap();
        let got = crate::gpu::compile::probe_u32(Some(cache.path()), FAMILY, &exprs).unwrap_or_else(|e| panic!("{e}"));
        for (i, &p) in paths.iter().enumerate() {
            let (a, b) = constants(p);
            assert_eq!((got[2 * i], got[2 * i + 1]), (a.to_bits(), b.to_bits()), "path {p}");
        }
    }
}
