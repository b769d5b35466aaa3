//! The gemm sweep: cases (odd-shaped gates, then timed shapes), every lab variant measured through
//! [`super::gemm`] on the same tensors, cuBLAS beside them.

use super::variants::{applies, gpu_ladder, not_applicable, Config, VARIANTS};
use super::{bound, gemm, validate, Dims, Expected, Split, FULL_REFERENCE_MACS};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Session};
use crate::gpu::Gpu;
use crate::kernels::DType;
use crate::ops::variant::Variant;
use crate::ops::{measure_op, measure_op_with, Check, Elem};
use crate::tensor::Tensor;
use crate::{LabError, Result};
use cudarc::cublas::{CudaBlas, Gemm as BlasGemm};
use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use rand_distr::{Distribution, StandardNormal};
use serde_json::{json, Value};

pub struct Gemm;

/// (m, n, k, alpha, beta, timed): untimed odd shapes are correctness gates.
type Shape = (usize, usize, usize, f32, f32, bool);

/// The GPU's gates, in every dtype.
///
/// (300, 520, 96): K % 32 == 0, so interior blocks of mma_warp64(_wide) take the bare
/// cp.async path while the edge blocks of the same launch take the checked one;
/// (300, 520, 320) does the same for mma_warp64_k64 (K % 64 == 0), with more slabs
/// than slots in every ring (the copies wrap around while the edge blocks run).
/// The TMA rungs take only K and N multiples of 8 (TMA row strides): of these,
/// 1000^3, 300x520x96, 300x520x320 and the last three, which put their M, N and K edges
/// (a partial last k-tile, 8 columns past a 256- or 128-wide tile, M = 1) and
/// beta != 0 under the check. 130x264x1024 also gives mma_splitk 4 slices with beta != 0 (its epilogue
/// applies beta), and 1x4097x777 3 slices with an odd N. 130x320x104 is the one whose N is a
/// multiple of 64, so mma_warp64_tma takes B as 3D boxes there, with edges in M, K (104 = 64 + 40)
/// and N (one 64-column block in, three zero-filled) and beta != 0.
/// [`TAIL_GATE`]: 2100x2040x4072 is 136 of mma_warp64_tail_split's tiles: on 132 SMs a whole wave, then
/// 4 tiles in 5 K slices (the last slab partial), with M and N edges and beta != 0.
const GPU_GATES: &[Shape] = &[
    (1, 4097, 777, 1.0, 0.0, false),
    (1000, 1000, 1000, 1.0, 0.0, false),
    (4097, 513, 777, 0.5, -1.25, false),
    (130, 260, 72, 1.0, 0.0, false),
    (300, 520, 96, 1.0, 0.0, false),
    (300, 520, 320, 1.0, 0.0, false),
    (130, 264, 72, 0.5, -1.25, false),
    (1, 1032, 776, 1.0, 0.0, false),
    (130, 264, 1024, 0.5, -1.25, false),
    (130, 320, 104, 0.5, -1.25, false),
    TAIL_GATE,
];
const TAIL_GATE: Shape = (2100, 2040, 4072, 0.5, -1.25, false);

/// The tail-split gate under the sanitizer: 2 x 3 of mma_warp64_tail_split's 128 x 256 tiles with
/// M and N edges (130 = 128 + 2, 520 = 2 x 256 + 8), fewer than any H100's SMs, so every tile is
/// split, into 4 K slices of 10, 10, 10 and 9 slabs of 64 (the last slab 8 deep). The
/// 2100 x 2040 x 4072 gate's whole wave beside its split tail needs more tiles than SMs and K
/// deep enough for a split to pay (23 slabs or more): 6 G multiply-adds or more, minutes per
/// variant under racecheck; this one is 0.17 G. Its split and edges are pinned by a unit test.
pub const SANITIZE_TAIL_GATE: Shape = (130, 520, 2440, 0.5, -1.25, false);

/// Under racecheck, gemm's cases above this many multiply-adds run one process per variant.
const RACECHECK_SPLIT_MACS: u64 = 1 << 27;

/// The gate whose sanitizer case is checked against the GPU's f64 reference (`reference: "gpu"`):
/// edges in M, N and K against its 16 x 16 tiles, and C0 read.
const GPU_REFERENCE_GATE: (usize, usize, usize) = (130, 264, 72);

fn case(dtype: &str, (m, n, k, alpha, beta, timed): Shape) -> Value {
    json!({"m": m, "n": n, "k": k, "dtype": dtype, "alpha": alpha, "beta": beta, "timed": timed})
}

/// The cases `lab sanitize` runs on the GPU (see [`Gemm::sanitize_cases`]).
fn sanitize_gates() -> Vec<Value> {
    let mut out = Vec::new();
    for dtype in ["f32", "f16", "bf16"] {
        for &g in GPU_GATES.iter().filter(|&&g| g != TAIL_GATE) {
            let mut c = case(dtype, g);
            if (g.0, g.1, g.2) == GPU_REFERENCE_GATE && g.4 != 0.0 {
                c["reference"] = "gpu".into();
            }
            out.push(c);
        }
        if dtype != "f32" {
            out.push(case(dtype, SANITIZE_TAIL_GATE));
        }
    }
    out
}

/// The compiled kernel's resources as the driver reports them, and the variant's tile and split,
/// for the record's `extra`.
fn resources(gpu: &Gpu, v: &Variant<Config>, dtype: DType) -> Result<serde_json::Map<String, Value>> {
    let f = super::kernel(gpu, v, dtype)?;
    let get = |a| f.get_attribute(a).doing("reading a kernel attribute");
    let mut extra = serde_json::Map::new();
    extra.insert("registers".into(), json!(get(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?));
    extra.insert("static_smem_bytes".into(), json!(get(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?));
    extra.insert("dynamic_smem_bytes".into(), json!(v.config.smem));
    extra.insert("local_bytes_per_thread".into(), json!(get(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?));
    // Resident blocks per SM as the driver computes them (registers, shared memory, threads).
    let threads = v.config.block.0 * v.config.block.1;
    let blocks = f.occupancy_max_active_blocks_per_multiprocessor(threads, v.config.smem, None).doing("querying occupancy")?;
    extra.insert("blocks_per_sm".into(), json!(blocks));
    extra.insert("tile".into(), json!(v.config.shape));
    Ok(extra)
}

impl Experiment for Gemm {
    fn name(&self) -> &'static str {
        "gemm"
    }
    fn description(&self) -> &'static str {
        "C = alpha A B + beta C, row-major: fp32 SIMT ladder (naive to warp tiling), fp16/bf16 mma.sync ladder (ldmatrix, cp.async + swizzle) and wgmma + TMA on sm_90a, beside cuBLAS"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["m=4096 n=4096 k=4096 dtype=bf16", "m=8192 n=8192 k=8192 dtype=bf16", "m=4096 n=4096 k=4096 dtype=f32"]
    }
    fn sweep_axis(&self) -> &'static str {
        "m"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let gates: &[Shape] = match (backend, quick) {
            (Backend::Cpu, true) => &[(1, 1, 1, 1.0, 0.0, false), (1, 37, 29, 1.0, 0.0, false), (33, 47, 65, 0.5, -1.25, false), (97, 131, 77, 1.0, 0.0, false)],
            (Backend::Cpu, false) => &[(1, 1, 1, 1.0, 0.0, false), (1, 1000, 777, 1.0, 0.0, false), (1000, 1000, 1000, 1.0, 0.0, false), (4097, 513, 777, 0.5, -1.25, false)],
            (Backend::Cuda(_), _) => GPU_GATES,
        };
        let square = |n: usize| (n, n, n, 1.0, 0.0, true);
        let mut out = Vec::new();
        let mut push = |dtype: &str, shapes: &[Shape]| {
            for &shape in shapes {
                out.push(case(dtype, shape));
            }
        };
        match (backend, quick) {
            (Backend::Cpu, true) => {
                for dtype in ["f32", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(128)]);
            }
            (Backend::Cpu, false) => {
                for dtype in ["f32", "f16", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(512), square(1024)]);
            }
            (Backend::Cuda(_), true) => {
                for dtype in ["f32", "f16", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(1024), square(2048)]);
                push("f16", &[square(2048), square(4096)]);
            }
            (Backend::Cuda(_), false) => {
                for dtype in ["f32", "f16", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(1024), square(2048), square(4096), (16, 4096, 4096, 1.0, 0.0, true), (4096, 11008, 4096, 1.0, 0.0, true)]);
                let squares = [square(1024), square(2048), square(4096), square(8192)];
                push("f16", &squares);
                push("bf16", &squares);
                // Llama-style projections: decode (M = 1, 16) to prefill (M = 4096).
                let mut llama: Vec<Shape> = [1, 16, 128, 512, 4096].iter().map(|&m| (m, 4096, 4096, 1.0, 0.0, true)).collect();
                for m in [16, 4096] {
                    llama.extend([(m, 11008, 4096, 1.0, 0.0, true), (m, 4096, 11008, 1.0, 0.0, true), (m, 14336, 4096, 1.0, 0.0, true)]);
                }
                push("f16", &llama);
                push("bf16", &[(4096, 11008, 4096, 1.0, 0.0, true)]);
            }
        }
        out
    }
    /// The GPU gates without the 2100 x 2040 x 4072 one, plus [`SANITIZE_TAIL_GATE`] in f16 and
    /// bf16 (see there); the 130 x 264 x 72 gate with beta != 0 checked against the GPU's f64
    /// reference in every dtype, so `reference_gemm` runs under every tool on a shape that takes
    /// it seconds.
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        match backend {
            Backend::Cuda(_) => sanitize_gates(),
            Backend::Cpu => crate::experiment::quick_gates(self, backend),
        }
    }
    /// Cases above [`RACECHECK_SPLIT_MACS`]: the 1000^3 and 4097 x 513 x 777 gates and the tail
    /// gate (each variant ~20-160 s alone under racecheck on an H100, minutes together); the
    /// others, 50 M multiply-adds or fewer, take 10-100 s with the whole ladder in one process.
    fn sanitize_racecheck_per_variant(&self, case: &Value) -> bool {
        let dim = |k| param_usize(case, k).unwrap_or(0) as u64;
        dim("m") * dim("n") * dim("k") > RACECHECK_SPLIT_MACS
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::F32 => run::<f32>(s, case),
            DType::F16 => run::<half::f16>(s, case),
            DType::Bf16 => run::<half::bf16>(s, case),
        }
    }
}

fn param_f32(case: &Value, key: &str, default: f32) -> f32 {
    case.get(key).and_then(Value::as_f64).map_or(default, |v| v as f32)
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()>
where
    CudaBlas: BlasGemm<T>,
{
    let d = Dims::dense(param_usize(case, "m")?, param_usize(case, "n")?, param_usize(case, "k")?);
    let ab = (param_f32(case, "alpha", 1.0), param_f32(case, "beta", 0.0));
    let timed = param_timed(case);
    let gpu_reference = match case.get("reference").map(|r| (r.as_str(), &s.backend)) {
        None | Some((Some("cpu"), _)) => false,
        Some((Some("gpu"), Backend::Cuda(_))) => true,
        Some((Some("gpu"), Backend::Cpu)) => return Err(LabError::Invalid(format!("case {case}: `reference: \"gpu\"` needs the cuda backend"))),
        Some(_) => return Err(LabError::Invalid(format!("case {case}: `reference` is \"cpu\" or \"gpu\""))),
    };
    // A --variant filter that admits nothing of this dtype skips the case before building inputs
    // and references (`--variant mma_warp64 --variant cublas_gemm_ex` runs no f32 case).
    if matches!(s.backend, Backend::Cuda(_))
        && !gpu_ladder(T::DTYPE).any(|v| s.wants(v.name, "lab"))
        && !super::cublas::peers(T::DTYPE).iter().any(|p| s.wants(p.0, "cublas"))
    {
        return Ok(());
    }
    let mut rng = rng_for(s.opts.seed, case);
    validate(d, d.m * d.k, d.k * d.n, d.m * d.n)?;
    let fill = |len: usize, rng: &mut rand::rngs::StdRng| -> Vec<T> {
        (0..len)
            .map(|_| {
                let z: f32 = StandardNormal.sample(rng);
                T::from_f32(z)
            })
            .collect()
    };
    let a = fill(d.m * d.k, &mut rng);
    let b = fill(d.k * d.n, &mut rng);
    let c0 = (ab.1 != 0.0).then(|| fill(d.m * d.n, &mut rng));
    let bound = bound(T::DTYPE, d.k);
    let work = d.work(T::DTYPE.size(), ab.1);
    let backend = s.backend.clone();
    let ceiling = crate::ops::product_ceiling(&backend, T::DTYPE);
    let (alpha, beta) = ab;
    let da = Tensor::from_slice(&backend, &[d.m, d.k], &a)?;
    let db = Tensor::from_slice(&backend, &[d.k, d.n], &b)?;
    let dc0 = c0.as_deref().map(|c| Tensor::from_slice(&backend, &[d.m, d.n], c)).transpose()?;
    // Products too large for the CPU's f64 reference are checked in full by the GPU's, and so
    // is any case that asks for it.
    let expected = match &backend {
        Backend::Cuda(gpu) if d.macs() > FULL_REFERENCE_MACS || gpu_reference => {
            let on_device = (da.cuda().expect("on the GPU"), db.cuda().expect("on the GPU"), dc0.as_ref().map(|c| c.cuda().expect("on the GPU")));
            Expected::on_gpu(gpu, (&a, &b, c0.as_deref()), on_device, d, ab, &mut rng)?
        }
        _ => Expected::new(&a, &b, c0.as_deref(), d, ab, &mut rng),
    };
    let compare_c = |c: &[T]| expected.check(c, d, bound);
    let check = Check { tol: bound.tolerance(), compare: &compare_c, ceiling };
    let reduced = bound.with_output_type_reduction();
    let compare_reduced = |c: &[T]| expected.check(c, d, reduced);
    let check_reduced = Check { tol: reduced.tolerance(), compare: &compare_reduced, ceiling };
    let mut dc = Tensor::<T>::zeros(&backend, &[d.m, d.n])?;
    // beta != 0 reads C: every call starts from the same C0 (such cases are untimed).
    let run_as = |variant: &'static str| {
        let (backend, da, db, dc0) = (&backend, &da, &db, &dc0);
        move |c: &mut Tensor<T>| -> Result<()> {
            if let Some(c0) = dc0 {
                c.copy_from(c0)?;
            }
            gemm(backend, variant, alpha, da, db, beta, c)
        }
    };
    match &backend {
        Backend::Cpu => {
            for v in VARIANTS.iter().filter(|v| v.requires.met_by(&backend) && v.dtypes.contains(&T::DTYPE)) {
                if s.wants(v.name, "lab") {
                    measure_op(s, case, v.name, work, &check, timed, &mut dc, run_as(v.name))?;
                }
            }
        }
        Backend::Cuda(gpu) => {
            let mut skipped = serde_json::Map::new();
            for v in gpu_ladder(T::DTYPE) {
                if !applies(v, d, gpu.info.max_smem_per_block_optin as usize, gpu.arch) || !s.wants(v.name, "lab") {
                    continue;
                }
                if let Some(why) = not_applicable(v, d) {
                    eprintln!("note: gemm {} not applicable to M={} N={} K={}: {why}", v.name, d.m, d.n, d.k);
                    skipped.insert(v.name.into(), json!(format!("not applicable: {why}")));
                    continue;
                }
                let mut extra = resources(gpu, v, T::DTYPE)?;
                if !skipped.is_empty() {
                    extra.insert("not_applicable".into(), Value::Object(skipped.clone()));
                }
                if let Some(split) = Split::plan(v.config.kind, d, gpu.info.sm_count as usize) {
                    let (key, value) = split.describe();
                    extra.insert(key.into(), value);
                }
                measure_op_with(s, case, v.name, work, &check, timed, &mut dc, extra, run_as(v.name))?;
            }
            super::cublas::measure(s, gpu, case, d, ab, (&da, &db, dc0.as_ref()), &mut dc, work, (&check, &check_reduced), timed, skipped)?;
        }
    }
    Ok(())
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gemm::{tail_plan, wg};

    /// The sanitizer's tail gate takes mma_warp64_tail_split's split path on an H100 (SXM 132
    /// SMs, PCIe 114), with uneven slices, a partial last slab and edges in M and N, at a
    /// fraction of the work of the quick sweep's gate. The K = 584 stand-in it replaces took no
    /// split at all once the cost model was fitted: a split there loses to one more slab loop.
    #[test]
    fn the_sanitizer_tail_gate_takes_the_tail_split() {
        let (m, n, k, _, beta, timed) = SANITIZE_TAIL_GATE;
        let d = Dims::dense(m, n, k);
        for sms in [132, 114] {
            let p = tail_plan(d, sms);
            let nk = k.div_ceil(wg::BK);
            assert!(p.slices > 1 && p.split_tiles() == p.tiles, "{sms} SMs: {p:?}");
            assert!(!nk.is_multiple_of(p.slices) && !k.is_multiple_of(wg::BK), "{sms} SMs: {p:?}: slices even or last slab whole");
            assert!(Split::plan(super::super::Kind::TailSplit, d, sms) == Some(Split::Tail(p)));
        }
        assert!(!m.is_multiple_of(wg::BM) && !n.is_multiple_of(wg::WIDE.bn) && n.is_multiple_of(8) && k.is_multiple_of(8), "edges, and TMA's strides");
        assert!(beta != 0.0 && !timed);
        assert!(d.macs() * 30 < Dims::dense(TAIL_GATE.0, TAIL_GATE.1, 584).macs() * 2);
        assert_eq!(tail_plan(Dims::dense(TAIL_GATE.0, TAIL_GATE.1, 584), 132).slices, 1, "the old stand-in");
        assert!(tail_plan(Dims::dense(TAIL_GATE.0, TAIL_GATE.1, TAIL_GATE.2), 132).slices > 1, "the quick sweep's gate");
    }

    /// Every sanitizer case fits the CPU's f64 reference except where it asks for the GPU's,
    /// which one gate per dtype does (with C0), and the tail gate is there in f16 and bf16.
    #[test]
    fn sanitizer_cases_run_the_gpu_reference_once_per_dtype_on_a_small_gate() {
        let cases = sanitize_gates();
        for dtype in ["f32", "f16", "bf16"] {
            let mine: Vec<&Value> = cases.iter().filter(|c| c["dtype"] == dtype).collect();
            let gpu_ref: Vec<&&Value> = mine.iter().filter(|c| c["reference"] == "gpu").collect();
            assert_eq!(gpu_ref.len(), 1, "{dtype}");
            assert!(gpu_ref[0]["beta"].as_f64() != Some(0.0));
            let tail = mine.iter().any(|c| c["m"] == SANITIZE_TAIL_GATE.0 && c["k"] == SANITIZE_TAIL_GATE.2);
            assert_eq!(tail, dtype != "f32", "{dtype}");
        }
        let mut split = Vec::new();
        for c in &cases {
            let d = Dims::dense(param_usize(c, "m").unwrap(), param_usize(c, "n").unwrap(), param_usize(c, "k").unwrap());
            assert!(d.macs() <= FULL_REFERENCE_MACS && c["timed"] == false, "{c}");
            if Gemm.sanitize_racecheck_per_variant(c) {
                split.push((d.m, d.n, d.k));
            }
        }
        split.sort();
        split.dedup();
        let tail = (SANITIZE_TAIL_GATE.0, SANITIZE_TAIL_GATE.1, SANITIZE_TAIL_GATE.2);
        assert_eq!(split, [tail, (1000, 1000, 1000), (4097, 513, 777)], "racecheck's process per variant");
    }
}
