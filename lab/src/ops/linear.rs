//! `linear`: Y = act(X W^T + b) forward and its backward (grad_input, grad_weight, grad_bias),
//! f32 and bf16 (kernels/linear.cu). The matrix products run in cuBLAS; the lab's kernels do the
//! epilogue (bias + ReLU / GeLU, keeping the pre-activation Z for backward), the activation's
//! backward, and the bias gradient as a two-stage column reduction without atomics.
//! X is [M, K], W is [N, K] (PyTorch's layout), b is [N].
//!
//! One file past 600 lines: the ops, the f32 CPU variants, the f64 reference and the experiment are
//! each short and read together (the CPU variants reuse gemm's `cpu_blocked`).

use super::compare::{compare, compare_elems};
use super::gemm::{cpu_blocked, Dims};
use super::variant::{self, Requires, Variant, VariantInfo};
use super::{measure_op, measure_torch, widen, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Peer, Session};
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance};
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Linear;

const FAMILY: &str = "linear";
/// Rows of dZ each block of the bias-gradient reduction sums (stage 1).
const ROWS_PER_SLAB: usize = 256;

/// Which pass a variant computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward,
    Backward,
}

const F32_BF16: &[DType] = &[DType::F32, DType::Bf16];

/// The variants: the only place a linear variant is named.
pub const VARIANTS: &[Variant<Pass>] = &[
    Variant {
        name: "forward_cublas_epilogue",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "Z = X W^T in cuBLAS, then one kernel for Y = act(Z + b)",
        config: Pass::Forward,
    },
    Variant {
        name: "backward_cublas_bias_reduce",
        dtypes: F32_BF16,
        requires: Requires::Gpu,
        what: "dZ by one kernel, dX and dW in cuBLAS, db as a two-stage column sum without atomics",
        config: Pass::Backward,
    },
    Variant { name: "cpu_forward", dtypes: F32_BF16, requires: Requires::Cpu, what: "Z = X W^T by gemm's cpu_blocked, bias and activation in f32", config: Pass::Forward },
    Variant {
        name: "cpu_backward",
        dtypes: F32_BF16,
        requires: Requires::Cpu,
        what: "dZ in f32, dX and dW by gemm's cpu_blocked, db as f32 column sums",
        config: Pass::Backward,
    },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// Y = act(X W^T + b), keeping the pre-activation Z for backward. X is [M, K], W [N, K], b [N],
/// Z and Y [M, N]. On the GPU: cuBLAS and the lab's epilogue; on the CPU: [`cpu_forward`].
pub fn forward<T: Elem>(dev: &Backend, x: &Tensor<T>, w: &Tensor<T>, b: &Tensor<T>, z: &mut Tensor<T>, y: &mut Tensor<T>, act: Act) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let name = if matches!(dev, Backend::Cpu) { "cpu_forward" } else { "forward_cublas_epilogue" };
    let v = variant::find(FAMILY, VARIANTS, name)?;
    variant::check_runs(FAMILY, v, dev, T::DTYPE)?;
    check_placement(FAMILY, dev, &[("x", x.placement()), ("w", w.placement()), ("b", b.placement()), ("z", z.placement()), ("y", y.placement())])?;
    let (m, k, n) = (x.rows(), x.cols(), w.rows());
    if w.cols() != k {
        return Err(LabError::shape(FAMILY, format!("x is {:?} and w is {:?}: their last dimensions (K) differ", x.shape(), w.shape())));
    }
    validate(m, n, k, x.len(), w.len(), b.len(), None)?;
    for (name, t) in [("z", &*z), ("y", &*y)] {
        if t.rows() != m || t.cols() != n {
            return Err(LabError::shape(FAMILY, format!("{name} is {:?}; it must be [{m}, {n}]", t.shape())));
        }
    }
    let gpu = match dev {
        Backend::Cpu => {
            let (xh, wh, bh) = (x.host().expect("placement checked"), w.host().expect("placement checked"), b.host().expect("placement checked"));
            cpu_forward(xh, wh, bh, (m, n, k), act, z.host_mut().expect("placement checked"), y.host_mut().expect("placement checked"));
            return Ok(());
        }
        Backend::Cuda(gpu) => gpu,
    };
    let epilogue = gpu.function(FAMILY, &symbol(FAMILY, &format!("bias_act_{}", act.name()), T::DTYPE))?;
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let dz = z.cuda_mut().expect("placement checked");
    // Z^T (N x M, column-major) = W (op T of the K x N column-major view) . X^T.
    let cfg = gemm(CUBLAS_OP_T, CUBLAS_OP_N, (ni, mi, ki), (ki, ki, ni));
    // SAFETY: W is N x K, X is M x K, Z is M x N, as cfg says.
    unsafe { gpu.blas()?.gemm(cfg, w.cuda().expect("placement checked"), x.cuda().expect("placement checked"), &mut *dz) }.doing("cuBLAS forward GEMM")?;
    let rows = m as i64;
    let cfg = elementwise(gpu, m * n);
    // SAFETY: z and y hold m*n elements, b holds n; the kernel bounds by them.
    unsafe {
        gpu.stream.launch_builder(&epilogue).arg(&mut *dz).arg(b.cuda().expect("placement checked")).arg(y.cuda_mut().expect("placement checked")).arg(&rows).arg(&ni).launch(cfg)
    }
    .map(|_| ())
    .doing("launching the linear epilogue")
}

/// What [`backward`] keeps between calls: dZ (M x N) and the bias gradient's partial sums.
pub struct BackwardScratch<T: Elem> {
    dz: Tensor<T>,
    partial: Tensor<f32>,
}

impl<T: Elem> BackwardScratch<T> {
    pub fn new(dev: &Backend, m: usize, n: usize) -> Result<Self> {
        Ok(BackwardScratch { dz: Tensor::zeros(dev, &[m, n])?, partial: Tensor::zeros(dev, &[m.div_ceil(ROWS_PER_SLAB), n])? })
    }
}

/// The gradients of Y = act(X W^T + b) from dY and the forward's Z, packed into `grads` as
/// [dX (M x K) | dW (N x K) | db (N)]: one buffer, as an optimizer holds them. On the GPU: one
/// kernel for dZ, cuBLAS for dX and dW, a two-stage column sum for db; on the CPU:
/// [`cpu_backward`].
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem>(
    dev: &Backend,
    x: &Tensor<T>,
    w: &Tensor<T>,
    z: &Tensor<T>,
    dy: &Tensor<T>,
    act: Act,
    grads: &mut Tensor<T>,
    scratch: &mut BackwardScratch<T>,
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let name = if matches!(dev, Backend::Cpu) { "cpu_backward" } else { "backward_cublas_bias_reduce" };
    let v = variant::find(FAMILY, VARIANTS, name)?;
    variant::check_runs(FAMILY, v, dev, T::DTYPE)?;
    let placed = [("x", x.placement()), ("w", w.placement()), ("z", z.placement()), ("dy", dy.placement()), ("grads", grads.placement())];
    check_placement(FAMILY, dev, &placed)?;
    check_placement(FAMILY, dev, &[("scratch", scratch.dz.placement())])?;
    let (m, k, n) = (x.rows(), x.cols(), w.rows());
    if w.cols() != k {
        return Err(LabError::shape(FAMILY, format!("x is {:?} and w is {:?}: their last dimensions (K) differ", x.shape(), w.shape())));
    }
    for (name, t) in [("z", z), ("dy", dy)] {
        if t.rows() != m || t.cols() != n {
            return Err(LabError::shape(FAMILY, format!("{name} is {:?}; it must be [{m}, {n}]", t.shape())));
        }
    }
    if grads.len() != m * k + n * k + n || scratch.dz.len() != m * n {
        let why = format!("grads holds {} elements and the scratch is {:?}; M={m} N={n} K={k} needs {} and [{m}, {n}]", grads.len(), scratch.dz.shape(), m * k + n * k + n);
        return Err(LabError::shape(FAMILY, why));
    }
    let gpu = match dev {
        Backend::Cpu => {
            fn h<T: Elem>(t: &Tensor<T>) -> &[T] {
                t.host().expect("placement checked")
            }
            cpu_backward(h(x), h(w), h(z), h(dy), (m, n, k), act, grads.host_mut().expect("placement checked"));
            return Ok(());
        }
        Backend::Cuda(gpu) => gpu,
    };
    let dt = T::DTYPE;
    let act_bwd = gpu.function(FAMILY, &symbol(FAMILY, &format!("act_backward_{}", act.name()), dt))?;
    let part = gpu.function(FAMILY, &symbol(FAMILY, "bias_grad_partial", dt))?;
    let fin = gpu.function(FAMILY, &symbol(FAMILY, "bias_grad_final", dt))?;
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let (dz, partial) = (scratch.dz.cuda_mut().expect("placement checked"), scratch.partial.cuda_mut().expect("placement checked"));
    let (xd, wd) = (x.cuda().expect("placement checked"), w.cuda().expect("placement checked"));
    let nn = (m * n) as i64;
    // SAFETY: dY, Z and dZ hold m*n elements.
    unsafe { gpu.stream.launch_builder(&act_bwd).arg(dy.cuda().expect("placement checked")).arg(z.cuda().expect("placement checked")).arg(&mut *dz).arg(&nn).launch(elementwise(gpu, m * n)) }
        .doing("launching the activation backward")?;
    let (mut gx, mut rest) = grads.cuda_mut().expect("placement checked").split_at_mut(m * k);
    let (mut gw, mut gb) = rest.split_at_mut(n * k);
    let blas = gpu.blas()?;
    // dX^T (K x M) = W^T (K x N) . dZ^T (N x M), all column-major views.
    let cfg = gemm(CUBLAS_OP_N, CUBLAS_OP_N, (ki, mi, ni), (ki, ni, ki));
    // SAFETY: W is N x K, dZ is M x N, dX is M x K.
    unsafe { blas.gemm(cfg, wd, &*dz, &mut gx) }.doing("cuBLAS grad_input GEMM")?;
    // dW^T (K x N) = X^T (K x M) . dZ (op T of the N x M view).
    let cfg = gemm(CUBLAS_OP_N, CUBLAS_OP_T, (ki, ni, mi), (ki, ni, ki));
    // SAFETY: X is M x K, dZ is M x N, dW is N x K.
    unsafe { blas.gemm(cfg, xd, &*dz, &mut gw) }.doing("cuBLAS grad_weight GEMM")?;
    let slabs = m.div_ceil(ROWS_PER_SLAB);
    let (slab_rows, slabs_i) = (ROWS_PER_SLAB as i32, slabs as i32);
    let cfg1 = LaunchConfig { grid_dim: (n.div_ceil(32) as u32, slabs as u32, 1), block_dim: (32, 8, 1), shared_mem_bytes: 0 };
    // SAFETY: dZ holds m*n elements and partial slabs*n floats.
    unsafe { gpu.stream.launch_builder(&part).arg(&*dz).arg(&mut *partial).arg(&mi).arg(&ni).arg(&slab_rows).launch(cfg1) }
        .doing("launching bias_grad_partial")?;
    let cfg2 = LaunchConfig { grid_dim: (n.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: partial holds slabs*n floats, db n elements.
    unsafe { gpu.stream.launch_builder(&fin).arg(&*partial).arg(&mut gb).arg(&slabs_i).arg(&ni).launch(cfg2) }
        .map(|_| ())
        .doing("launching bias_grad_final")
}

/// A grid of 256-thread blocks for an elementwise pass over `len` elements: 8 blocks per SM at most.
pub(crate) fn elementwise(gpu: &crate::gpu::Gpu, len: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((gpu.info.sm_count as usize * 8).min(len.div_ceil(256)).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    None,
    Relu,
    /// GeLU, tanh form.
    Gelu,
}

impl Act {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Act::None),
            "relu" => Ok(Act::Relu),
            "gelu" => Ok(Act::Gelu),
            _ => Err(LabError::Invalid(format!("unknown activation `{s}` (none, relu, gelu)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Act::None => "none",
            Act::Relu => "relu",
            Act::Gelu => "gelu",
        }
    }
    pub fn apply(self, v: f64) -> f64 {
        match self {
            Act::None => v,
            Act::Relu => v.max(0.0),
            Act::Gelu => super::bias_gelu::gelu(v, super::bias_gelu::Approx::Tanh),
        }
    }
    /// [`Act::apply`] in f32, as the epilogue kernel computes it.
    pub fn apply_f32(self, v: f32) -> f32 {
        match self {
            Act::None => v,
            Act::Relu => v.max(0.0),
            Act::Gelu => super::bias_gelu::gelu_f32(v, super::bias_gelu::Approx::Tanh),
        }
    }
    /// [`Act::grad`] in f32, as kernels/common.cuh's `gelu_tanh_grad` writes it.
    pub fn grad_f32(self, v: f32) -> f32 {
        use super::bias_gelu::{GELU_A, GELU_C};
        match self {
            Act::None => 1.0,
            Act::Relu => f32::from(v > 0.0),
            Act::Gelu => {
                let t = libm::tanhf(v * (v * v * (GELU_C * GELU_A) + GELU_C));
                0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_C * (3.0 * GELU_A * v * v + 1.0)
            }
        }
    }
    pub fn grad(self, v: f64) -> f64 {
        match self {
            Act::None => 1.0,
            Act::Relu => f64::from(v > 0.0),
            Act::Gelu => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let t = (c * (v + 0.044715 * v * v * v)).tanh();
                0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v * v)
            }
        }
    }
}

/// Checks what a caller gives: X is m x k, W is n x k, b has n entries, dY (if any) is m x n.
pub fn validate(m: usize, n: usize, k: usize, x: usize, w: usize, b: usize, dy: Option<usize>) -> Result<()> {
    if m == 0 || n == 0 || k == 0 {
        return Err(LabError::shape("linear", format!("M={m} N={n} K={k}: every dimension must be at least 1")));
    }
    for (name, got, want) in [("X", x, m * k), ("W", w, n * k), ("b", b, n)] {
        if got != want {
            return Err(LabError::shape("linear", format!("{name} has {got} elements, expected {want} for M={m} N={n} K={k}")));
        }
    }
    if let Some(dy) = dy.filter(|&d| d != m * n) {
        return Err(LabError::shape("linear", format!("dY has {dy} elements, expected {}", m * n)));
    }
    Ok(())
}

/// A[rows_a, inner] . B[rows_b, inner]^T: every output a contiguous dot product.
pub fn matmul_nt<T: Copy + Send + Sync + Into<f64>>(a: &[T], b: &[T], rows_a: usize, rows_b: usize, inner: usize) -> Vec<f64> {
    let mut c = vec![0.0; rows_a * rows_b];
    c.par_chunks_mut(rows_b).enumerate().for_each(|(i, row)| {
        let ai = &a[i * inner..(i + 1) * inner];
        for (j, out) in row.iter_mut().enumerate() {
            let bj = &b[j * inner..(j + 1) * inner];
            *out = ai.iter().zip(bj).map(|(&x, &y)| x.into() * y.into()).sum();
        }
    });
    c
}

pub fn transpose<T: Copy + Default>(a: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::default(); a.len()];
    for (i, row) in a.chunks(cols).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            t[j * rows + i] = v;
        }
    }
    t
}

/// The f64 reference, forward: (Z, Y).
pub fn forward_f64(x: &[f64], w: &[f64], b: &[f64], (m, n, k): (usize, usize, usize), act: Act) -> (Vec<f64>, Vec<f64>) {
    let mut z = matmul_nt(x, w, m, n, k);
    z.iter_mut().enumerate().for_each(|(i, v)| *v += b[i % n]);
    let y = z.iter().map(|&v| act.apply(v)).collect();
    (z, y)
}

/// The f64 reference, backward from dY: (dX, dW, db).
pub fn backward_f64(x: &[f64], w: &[f64], z: &[f64], dy: &[f64], (m, n, k): (usize, usize, usize), act: Act) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let dz: Vec<f64> = dy.iter().zip(z).map(|(&g, &v)| g * act.grad(v)).collect();
    let dx = matmul_nt(&dz, &transpose(w, n, k), m, k, n);
    let dw = matmul_nt(&transpose(&dz, m, n), &transpose(x, m, k), n, k, m);
    let db = (0..n).map(|j| (0..m).map(|i| dz[i * n + j]).sum()).collect();
    (dx, dw, db)
}

/// The stored values as f32, the CPU variants' arithmetic type.
fn f32s<T: Elem>(v: &[T]) -> Vec<f32> {
    v.par_iter().map(|e| e.to_f32()).collect()
}

/// The CPU backend's forward, a different computation from the f64 reference it is checked
/// against: X W^T by gemm's `cpu_blocked` (f32 accumulation, cache-blocked), then bias and
/// activation in f32; Z and Y rounded to T once.
pub fn cpu_forward<T: Elem>(x: &[T], w: &[T], b: &[T], (m, n, k): (usize, usize, usize), act: Act, z: &mut [T], y: &mut [T]) {
    let mut zf = vec![0f32; m * n];
    cpu_blocked(&f32s(x), &transpose(&f32s(w), n, k), &mut zf, Dims::dense(m, n, k), (1.0, 0.0));
    let bf = f32s(b);
    z.par_chunks_mut(n).zip(y.par_chunks_mut(n)).zip(zf.par_chunks(n)).for_each(|((zr, yr), acc)| {
        for (((zo, yo), &a), &bias) in zr.iter_mut().zip(yr.iter_mut()).zip(acc).zip(&bf) {
            let v = a + bias;
            (*zo, *yo) = (T::from_f32(v), T::from_f32(act.apply_f32(v)));
        }
    });
}

/// The CPU backend's backward into [dX | dW | db]: dZ = dY act'(Z) in f32 from the stored Z,
/// dX = dZ W and dW = dZ^T X by gemm's `cpu_blocked`, db as f32 column sums; each rounded to T
/// once.
pub fn cpu_backward<T: Elem>(x: &[T], w: &[T], z: &[T], dy: &[T], (m, n, k): (usize, usize, usize), act: Act, grads: &mut [T]) {
    let dz: Vec<f32> = dy.par_iter().zip(z).map(|(&g, &v)| g.to_f32() * act.grad_f32(v.to_f32())).collect();
    let (mut dx, mut dw) = (vec![0f32; m * k], vec![0f32; n * k]);
    cpu_blocked(&dz, &f32s(w), &mut dx, Dims::dense(m, k, n), (1.0, 0.0));
    cpu_blocked(&transpose(&dz, m, n), &f32s(x), &mut dw, Dims::dense(n, k, m), (1.0, 0.0));
    let mut db = vec![0f32; n];
    for row in dz.chunks(n) {
        db.iter_mut().zip(row).for_each(|(s, &v)| *s += v);
    }
    grads.par_iter_mut().zip(dx.par_iter().chain(dw.par_iter()).chain(db.par_iter())).for_each(|(o, &v)| *o = T::from_f32(v));
}

/// Tolerance scaled to the output's own size (an elementwise reading of a relative Frobenius
/// error): `rel` of its RMS, plus `rel` of each element.
fn scaled(expected: &[f64], rel: f64) -> Tolerance {
    let rms = (expected.iter().map(|v| v * v).sum::<f64>() / expected.len().max(1) as f64).sqrt();
    Tolerance { atol: rel * rms.max(f64::MIN_POSITIVE), rtol: rel }
}

fn rel(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// Compares [dX | dW | db] part by part, each element against its part's scale, as one result.
fn compare_parts(got: &[f64], parts: &[&[f64]], dtype: DType) -> ErrorStats {
    let mut offset = 0;
    let mut all = Vec::new();
    for part in parts {
        // Each element against `rel` of its part's RMS (an element of dW sums only M products and
        // may cancel to near zero) plus `rel` of itself: a wrong row or column fails here, where
        // one relative Frobenius error per part would average it away.
        let mut e = compare(&got[offset..offset + part.len()], part, scaled(part, rel(dtype)), "cpu-f64");
        e.bound = Some("rel (rms of its part: dX, dW or db) + rel |ref|".into());
        all.push((e, offset));
        offset += part.len();
    }
    super::compare::merge_parts(all)
}

impl Experiment for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }
    fn description(&self) -> &'static str {
        "Y = act(X W^T + b) forward and backward, f32/bf16: cuBLAS GEMMs with lab epilogue, activation backward and atomic-free bias gradient"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["m=4096 n=4096 k=4096 act=gelu"]
    }
    fn sweep_axis(&self) -> &'static str {
        "m"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let shapes: &[(usize, usize, usize, bool)] = match (backend, quick) {
            (Backend::Cuda(_), false) => &[(1000, 1000, 1000, false), (16, 4096, 4096, true), (4096, 4096, 4096, true)],
            (Backend::Cuda(_), true) => &[(1000, 1000, 1000, false), (2048, 2048, 2048, true)],
            (Backend::Cpu, false) => &[(1, 1, 1, false), (97, 131, 65, false), (256, 256, 256, true)],
            (Backend::Cpu, true) => &[(1, 1, 1, false), (33, 47, 65, false), (64, 64, 64, true)],
        };
        let mut out = Vec::new();
        for dtype in ["f32", "bf16"] {
            for act in ["relu", "gelu"] {
                for &(m, n, k, timed) in shapes {
                    out.push(json!({"m": m, "n": n, "k": k, "dtype": dtype, "act": act, "timed": timed}));
                }
            }
        }
        out
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::F32 => run::<f32>(s, case),
            DType::Bf16 => run::<half::bf16>(s, case),
            DType::F16 => Err(LabError::Invalid("linear runs in f32 and bf16".into())),
        }
    }
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let dims = (param_usize(case, "m")?, param_usize(case, "n")?, param_usize(case, "k")?);
    let (m, n, k) = dims;
    let act = Act::parse(param_str(case, "act")?)?;
    let timed = param_timed(case);
    // Inputs come from the case without its pass, so both passes (and a rerun of either) see the
    // same tensors; each record's params name its pass, so each meets only its own peers.
    let mut base = case.clone();
    base.as_object_mut().map(|o| o.remove("pass"));
    let mut rng = rng_for(s.opts.seed, &base);
    let pass = |p: &str| {
        let mut c = base.clone();
        c["pass"] = json!(p);
        c
    };
    let (fwd_case, bwd_case) = (pass("forward"), pass("backward"));
    let mut normal = |scale: f32| -> T {
        let z: f32 = StandardNormal.sample(&mut rng);
        T::from_f32(scale * z)
    };
    // W ~ N(0, 1/K) keeps Z ~ N(0, 1) whatever K is.
    let x: Vec<T> = (0..m * k).map(|_| normal(1.0)).collect();
    let w: Vec<T> = (0..n * k).map(|_| normal(1.0 / (k as f32).sqrt())).collect();
    let b: Vec<T> = (0..n).map(|_| normal(0.1)).collect();
    let dy: Vec<T> = (0..m * n).map(|_| normal(1.0)).collect();
    validate(m, n, k, x.len(), w.len(), b.len(), Some(dy.len()))?;
    let (xf, wf) = (widen(&x), widen(&w));
    let (z, y) = forward_f64(&xf, &wf, &widen(&b), dims, act);
    // Backward starts from the forward's Z as stored (rounded to T), and so does its reference:
    // both passes are checked for the inputs they are given.
    let zt: Vec<T> = z.iter().map(|&v| T::from_f32(v as f32)).collect();
    let (dx, dw, db) = backward_f64(&xf, &wf, &widen(&zt), &widen(&dy), dims, act);
    let dt = T::DTYPE;
    let size = dt.size() as u64;
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    // GEMM reads X and W and writes Z; the epilogue reads Z and b, writes Z and Y.
    let fwd_work = Work { bytes: size * (m64 * k64 + n64 * k64 + 4 * m64 * n64 + n64), flops: 2 * m64 * n64 * k64 };
    // dZ pass (read dY, Z; write dZ), two GEMMs (each reads dZ and X or W, writes dX or dW), bias.
    let bwd_work = Work { bytes: size * (6 * m64 * n64 + 2 * m64 * k64 + 2 * n64 * k64 + n64), flops: 4 * m64 * n64 * k64 };
    let ceiling = match (&s.backend, dt) {
        (Backend::Cuda(_), DType::Bf16) => "tensor_bf16_tflop_s",
        _ => "fma_tflop_s",
    };
    let compare_y = |got: &[T]| compare_elems(got, &y, scaled(&y, rel(dt)), "cpu-f64");
    let fwd_check = Check { tol: scaled(&y, rel(dt)), compare: &compare_y, ceiling };
    let compare_g = |got: &[T]| compare_parts(&widen(got), &[&dx, &dw, &db], dt);
    let bwd_check = Check { tol: Tolerance { atol: 0.0, rtol: rel(dt) }, compare: &compare_g, ceiling };
    let dev = s.backend.clone();
    // Both passes through the callable ops, on either backend.
    let (tx, tw) = (Tensor::from_slice(&dev, &[m, k], &x)?, Tensor::from_slice(&dev, &[n, k], &w)?);
    let fwd_name = if matches!(dev, Backend::Cpu) { "cpu_forward" } else { "forward_cublas_epilogue" };
    if s.wants(fwd_name, "lab") {
        let tb = Tensor::from_slice(&dev, &[n], &b)?;
        let z_out = std::cell::RefCell::new(Tensor::<T>::zeros(&dev, &[m, n])?);
        let mut y_out = Tensor::<T>::zeros(&dev, &[m, n])?;
        measure_op(s, &fwd_case, fwd_name, fwd_work, &fwd_check, timed, &mut y_out, |y| forward(&dev, &tx, &tw, &tb, &mut z_out.borrow_mut(), y, act))?;
    }
    let bwd_name = if matches!(dev, Backend::Cpu) { "cpu_backward" } else { "backward_cublas_bias_reduce" };
    if s.wants(bwd_name, "lab") {
        let (tz, tdy) = (Tensor::from_slice(&dev, &[m, n], &zt)?, Tensor::from_slice(&dev, &[m, n], &dy)?);
        let scratch = std::cell::RefCell::new(BackwardScratch::new(&dev, m, n)?);
        let mut grads = Tensor::<T>::zeros(&dev, &[m * k + n * k + n])?;
        measure_op(s, &bwd_case, bwd_name, bwd_work, &bwd_check, timed, &mut grads, |g| backward(&dev, &tx, &tw, &tz, &tdy, act, g, &mut scratch.borrow_mut()))?;
    }
    if let Backend::Cuda(gpu) = &dev {
        let (xb, wb, bb, dyb) = (T::bytes(&x), T::bytes(&w), T::bytes(&b), T::bytes(&dy));
        let (xs, ws, bs, ys) = ([m, k], [n, k], [n], [m, n]);
        let args = json!({"act": act.name()});
        if timed && s.wants_peer(Peer::Torch, &format!("torch {}(linear)", act.name()), "torch") {
            let inputs: [(&[u8], &[usize]); 3] = [(&xb, &xs), (&wb, &ws), (&bb, &bs)];
            measure_torch(s, gpu, &fwd_case, "linear", args.clone(), &inputs, fwd_work, &fwd_check)?;
        }
        // torch.autograd.grad of the same forward from dY: dX, dW, db, flattened in our order.
        if timed && s.wants_peer(Peer::Torch, &format!("torch {}(linear) backward", act.name()), "torch") {
            let inputs: [(&[u8], &[usize]); 4] = [(&xb, &xs), (&wb, &ws), (&bb, &bs), (&dyb, &ys)];
            measure_torch(s, gpu, &bwd_case, "linear_backward", args, &inputs, bwd_work, &bwd_check)?;
        }
    }
    Ok(())
}

/// A column-major GEMM configuration: C (m x n) = op(A) op(B), with alpha 1 and beta 0.
fn gemm<T: Elem>(transa: cudarc::cublas::sys::cublasOperation_t, transb: cudarc::cublas::sys::cublasOperation_t, (m, n, k): (i32, i32, i32), (lda, ldb, ldc): (i32, i32, i32)) -> GemmConfig<T> {
    GemmConfig { transa, transb, m, n, k, alpha: T::from_f32(1.0), lda, ldb, beta: T::from_f32(0.0), ldc }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::type_complexity)]
    fn small() -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, (usize, usize, usize)) {
        let (m, n, k) = (3, 4, 5);
        let f = |i: usize, s: f64| (i as f64 * 0.37 + s).sin() * 1.3;
        ((0..m * k).map(|i| f(i, 0.1)).collect(), (0..n * k).map(|i| f(i, 1.7)).collect(), (0..n).map(|i| f(i, 2.9)).collect(), (0..m * n).map(|i| f(i, 4.2)).collect(), (m, n, k))
    }

    /// Gradients of L = sum(Y * dY) by central differences against the analytic backward.
    #[test]
    fn backward_matches_finite_differences() {
        let (x, w, b, dy, dims) = small();
        for act in [Act::None, Act::Relu, Act::Gelu] {
            let loss = |x: &[f64], w: &[f64], b: &[f64]| -> f64 { forward_f64(x, w, b, dims, act).1.iter().zip(&dy).map(|(y, g)| y * g).sum() };
            let (z, _) = forward_f64(&x, &w, &b, dims, act);
            let (dx, dw, db) = backward_f64(&x, &w, &z, &dy, dims, act);
            let h = 1e-6;
            let numeric = |which: usize, i: usize| {
                let (mut xp, mut wp, mut bp) = (x.clone(), w.clone(), b.clone());
                let (mut xm, mut wm, mut bm) = (x.clone(), w.clone(), b.clone());
                match which {
                    0 => (xp[i] += h, xm[i] -= h),
                    1 => (wp[i] += h, wm[i] -= h),
                    _ => (bp[i] += h, bm[i] -= h),
                };
                (loss(&xp, &wp, &bp) - loss(&xm, &wm, &bm)) / (2.0 * h)
            };
            for (which, analytic) in [(0, &dx), (1, &dw), (2, &db)] {
                for (i, &a) in analytic.iter().enumerate() {
                    let n = numeric(which, i);
                    assert!((a - n).abs() < 1e-6 * (1.0 + n.abs()), "{act:?} part {which} index {i}: analytic {a}, numeric {n}");
                }
            }
        }
    }

    #[test]
    fn the_ops_match_the_reference_on_the_cpu_and_a_wrong_gradient_is_caught() {
        let (x, w, b, dy, (m, n, k)) = small();
        let t = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let (xs, ws, bs, dys) = (t(&x), t(&w), t(&b), t(&dy));
        let dev = Backend::Cpu;
        let (tx, tw, tb) = (Tensor::from_vec(&[m, k], xs.clone()).unwrap(), Tensor::from_vec(&[n, k], ws.clone()).unwrap(), Tensor::from_vec(&[n], bs.clone()).unwrap());
        let tdy = Tensor::from_vec(&[m, n], dys.clone()).unwrap();
        for act in [Act::Relu, Act::Gelu] {
            let (xf, wf) = (widen(&xs), widen(&ws));
            let (_, y) = forward_f64(&xf, &wf, &widen(&bs), (m, n, k), act);
            let (mut tz, mut ty) = (Tensor::<f32>::zeros(&dev, &[m, n]).unwrap(), Tensor::<f32>::zeros(&dev, &[m, n]).unwrap());
            forward(&dev, &tx, &tw, &tb, &mut tz, &mut ty, act).unwrap();
            assert!(compare_elems(&ty.to_vec().unwrap(), &y, scaled(&y, 1e-5), "t").passed());
            let (dx, dw, db) = backward_f64(&xf, &wf, &widen(&tz.to_vec().unwrap()), &widen(&dys), (m, n, k), act);
            let mut grads = Tensor::<f32>::zeros(&dev, &[m * k + n * k + n]).unwrap();
            let mut scratch = BackwardScratch::new(&dev, m, n).unwrap();
            backward(&dev, &tx, &tw, &tz, &tdy, act, &mut grads, &mut scratch).unwrap();
            let mut g = grads.to_vec().unwrap();
            let e = compare_parts(&widen(&g), &[&dx, &dw, &db], DType::F32);
            assert!(e.passed(), "{act:?}: {e:?}");
            // A wrong gradient is caught, with its index.
            g[dx.len() + 2] += 1.0;
            let e = compare_parts(&widen(&g), &[&dx, &dw, &db], DType::F32);
            assert_eq!((e.passed(), e.worst_index), (false, Some(dx.len() as u64 + 2)));
        }
        let mut short = Tensor::<f32>::zeros(&dev, &[m * k]).unwrap();
        let err = backward(&dev, &tx, &tw, &tdy, &tdy, Act::Relu, &mut short, &mut BackwardScratch::new(&dev, m, n).unwrap()).unwrap_err().to_string();
        assert!(err.contains("grads holds 15 elements"), "{err}");
    }

    /// The planted fault a norm-wise check misses: one row of dX 5% off is 0.6% of dX's norm
    /// (under a 1e-2 relative Frobenius tolerance) and fails element by element.
    #[test]
    fn one_wrong_row_of_a_gradient_is_caught() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (dx, dw, db): (Vec<f64>, Vec<f64>, Vec<f64>) = ((0..64 * 40).map(|_| rng.random_range(-1.0..1.0)).collect(), (0..30 * 40).map(|_| rng.random_range(-1.0..1.0)).collect(), vec![0.5; 30]);
        let mut got: Vec<f64> = [&dx[..], &dw[..], &db[..]].concat();
        assert!(compare_parts(&got, &[&dx, &dw, &db], DType::Bf16).passed());
        got[17 * 40..18 * 40].iter_mut().for_each(|g| *g *= 1.05);
        assert!(crate::ops::compare::frobenius_rel(&got[..dx.len()], &dx) < 1e-2);
        let e = compare_parts(&got, &[&dx, &dw, &db], DType::Bf16);
        assert!(!e.passed() && e.worst_index.is_some_and(|i| (17 * 40..18 * 40).contains(&(i as usize))), "{e:?}");
    }

    /// The CPU variants are f32 computations, not the reference rounded: checked against it as the
    /// experiment checks any variant, in both dtypes, on a shape crossing cpu_blocked's 512-column
    /// and 256-deep panels.
    #[test]
    fn the_cpu_variants_pass_the_experiments_checks_in_both_dtypes() {
        fn one<T: Elem>() {
            let (m, n, k) = (37, 600, 300);
            let f = |len: usize, s: f32, scale: f32| -> Vec<T> { (0..len).map(|i| T::from_f32(scale * ((i as f32 * 0.73 + s).sin() + (i % 13) as f32 / 13.0 - 0.5))).collect() };
            let (x, w, b, dy) = (f(m * k, 0.1, 1.0), f(n * k, 1.7, 1.0 / (k as f32).sqrt()), f(n, 2.9, 0.1), f(m * n, 4.2, 1.0));
            for act in [Act::None, Act::Relu, Act::Gelu] {
                let (mut z, mut y) = (vec![T::from_f32(0.0); m * n], vec![T::from_f32(0.0); m * n]);
                cpu_forward(&x, &w, &b, (m, n, k), act, &mut z, &mut y);
                let (_, want) = forward_f64(&widen(&x), &widen(&w), &widen(&b), (m, n, k), act);
                let e = compare_elems(&y, &want, scaled(&want, rel(T::DTYPE)), "t");
                assert!(e.passed() && (T::DTYPE != DType::F32 || e.max_abs > 0.0), "{:?} {act:?} forward: {e:?}", T::DTYPE);
                let mut grads = vec![T::from_f32(0.0); m * k + n * k + n];
                cpu_backward(&x, &w, &z, &dy, (m, n, k), act, &mut grads);
                let (dx, dw, db) = backward_f64(&widen(&x), &widen(&w), &widen(&z), &widen(&dy), (m, n, k), act);
                let e = compare_parts(&widen(&grads), &[&dx, &dw, &db], T::DTYPE);
                assert!(e.passed() && (T::DTYPE != DType::F32 || e.max_abs > 0.0), "{:?} {act:?} backward: {e:?}", T::DTYPE);
            }
        }
        one::<f32>();
        one::<half::bf16>();
    }

    #[test]
    fn bad_shapes_are_named() {
        assert!(validate(2, 3, 4, 8, 12, 3, Some(6)).is_ok());
        assert!(validate(2, 3, 4, 8, 12, 2, None).unwrap_err().to_string().contains("b has 2 elements, expected 3"));
        assert!(validate(2, 3, 4, 8, 11, 3, None).unwrap_err().to_string().contains("W has 11 elements"));
        assert!(validate(2, 3, 4, 8, 12, 3, Some(5)).unwrap_err().to_string().contains("dY has 5 elements"));
        assert!(validate(0, 3, 4, 0, 12, 3, None).unwrap_err().to_string().contains("at least 1"));
    }
}
