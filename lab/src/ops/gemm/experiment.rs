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
use crate::Result;
use cudarc::cublas::{CudaBlas, Gemm as BlasGemm};
use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use rand_distr::{Distribution, StandardNormal};
use serde_json::{json, Value};

pub struct Gemm;

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
        // (m, n, k, alpha, beta, timed): untimed odd shapes are correctness gates.
        type Shape = (usize, usize, usize, f32, f32, bool);
        let gates: &[Shape] = match (backend, quick) {
            (Backend::Cpu, true) => &[(1, 1, 1, 1.0, 0.0, false), (1, 37, 29, 1.0, 0.0, false), (33, 47, 65, 0.5, -1.25, false), (97, 131, 77, 1.0, 0.0, false)],
            (Backend::Cpu, false) => &[(1, 1, 1, 1.0, 0.0, false), (1, 1000, 777, 1.0, 0.0, false), (1000, 1000, 1000, 1.0, 0.0, false), (4097, 513, 777, 0.5, -1.25, false)],
            // (300, 520, 96): K % 32 == 0, so interior blocks of mma_warp64(_wide) take the bare
            // cp.async path while the edge blocks of the same launch take the checked one;
            // (300, 520, 320) does the same for mma_warp64_k64 (K % 64 == 0), with more slabs
            // than slots in every ring (the copies wrap around while the edge blocks run).
            // The TMA rungs take only K and N multiples of 8 (TMA row strides): of these,
            // 1000^3, 300x520x96, 300x520x320 and the last three, which put their M, N and K edges
            // (a partial last k-tile, 8 columns past a 256- or 128-wide tile, M = 1) and
            // beta != 0 under the check. 130x264x1024 also gives mma_splitk 4 slices with beta != 0 (its epilogue
            // applies beta), and 1x4097x777 3 slices with an odd N. 130x320x104 is the one whose N is a
            // multiple of 64, so mma_warp64_tma takes B as 3D boxes there, with edges in M, K (104 = 64 + 40)
            // and N (one 64-column block in, three zero-filled) and beta != 0.
            // 2100x2040x4072 is 136 of mma_warp64_tail_split's tiles: on 132 SMs a whole wave, then
            // 4 tiles in 5 K slices (the last slab partial), with M and N edges and beta != 0.
            (Backend::Cuda(_), _) => &[
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
                (2100, 2040, 4072, 0.5, -1.25, false),
            ],
        };
        let square = |n: usize| (n, n, n, 1.0, 0.0, true);
        let mut out = Vec::new();
        let mut push = |dtype: &str, shapes: &[Shape]| {
            for &(m, n, k, alpha, beta, timed) in shapes {
                out.push(json!({"m": m, "n": n, "k": k, "dtype": dtype, "alpha": alpha, "beta": beta, "timed": timed}));
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
    /// The gates, with the tail-split gate's K cut from 4072 to 584 (9 k-tiles, the last partial):
    /// the same 136 tiles and split tail, an eighth of the work under racecheck.
    /// The quick gates, with the tail-split gate (2100 x 2040 x 4072) at K = 584: the same 136
    /// tiles and edges, and still above the CPU reference's limit, so the GPU's f64 reference runs
    /// under the tools too. In f16 and bf16 only: the f32 rungs take no tail split, their edges are
    /// in the other gates, and racecheck of the f32 ladder on it runs past 8 minutes.
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        let mut out = crate::experiment::quick_gates(self, backend);
        out.retain(|c| !(c["m"] == 2100 && c["dtype"] == "f32"));
        for c in &mut out {
            if c["m"] == 2100 && c["k"] == 4072 {
                c["k"] = 584.into();
            }
        }
        out
    }
    fn sanitize_racecheck_per_variant(&self) -> bool {
        true
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
    // A --variant filter that admits nothing of this dtype skips the case before building inputs
    // and references (`--variant mma_warp64 --variant cublas_gemm_ex` runs no f32 case).
    if matches!(s.backend, Backend::Cuda(_)) {
        if !gpu_ladder(T::DTYPE).any(|v| s.wants(v.name, "lab")) && !super::cublas::peers(T::DTYPE).iter().any(|p| s.wants(p.0, "cublas")) {
            return Ok(());
        }
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
    let ceiling = match (&backend, T::DTYPE) {
        (Backend::Cuda(_), DType::F16) => "tensor_f16_tflop_s",
        (Backend::Cuda(_), DType::Bf16) => "tensor_bf16_tflop_s",
        _ => "fma_tflop_s",
    };
    let (alpha, beta) = ab;
    let da = Tensor::from_slice(&backend, &[d.m, d.k], &a)?;
    let db = Tensor::from_slice(&backend, &[d.k, d.n], &b)?;
    let dc0 = c0.as_deref().map(|c| Tensor::from_slice(&backend, &[d.m, d.n], c)).transpose()?;
    // Products too large for the CPU's f64 reference are checked in full by the GPU's.
    let expected = match &backend {
        Backend::Cuda(gpu) if d.macs() > FULL_REFERENCE_MACS => {
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

