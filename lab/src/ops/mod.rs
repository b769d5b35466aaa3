//! One module per kernel family: its variant table, CPU reference, callable ops on
//! [`crate::tensor::Tensor`], the experiment and the tests. [`measure_op`] is the house way an
//! experiment measures a callable op. The collective experiments (`allreduce`, `bucketing`,
//! `nccl_allreduce`, `tp_linear`, `dp_step`) measure the libraries of [`crate::collective`].

pub mod allreduce;
pub mod attention;
pub mod bias_gelu;
pub mod bucketing;
pub mod ceilings;
pub mod compare;
pub mod divergence;
pub mod dp_step;
pub mod fpga;
pub mod gemm;
pub mod layernorm;
pub mod linear;
pub mod llama;
pub mod loader;
pub mod moe;
pub mod nccl_allreduce;
pub mod perplexity;
pub mod quant;
pub mod rmsnorm;
pub mod softmax;
pub mod tp_linear;
pub mod variant;
pub mod vector_add;

use crate::kernels::DType;

/// A storage type kernels are instantiated for; arithmetic is f32, references f64.
pub trait Elem: crate::tensor::Scalar {
    const DTYPE: DType;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    /// Rounds an f64 to the nearest value of this type (what a perfect kernel would store).
    fn from_f64(x: f64) -> Self;
    /// Position on the number line counted in units in the last place: adjacent values differ
    /// by 1, and +0 and -0 are both 0. The distance of two ordinals is the error in ULPs.
    fn ordinal(self) -> i64;
    /// Raw little-endian bytes, as peers read them.
    fn bytes(v: &[Self]) -> Vec<u8>;
    fn from_bytes(b: &[u8]) -> Vec<Self>;
}

/// Sign-magnitude bits to a monotone integer.
fn sign_magnitude(bits: u64, sign_bit: u32) -> i64 {
    let magnitude = (bits & ((1u64 << sign_bit) - 1)) as i64;
    if bits >> sign_bit & 1 == 1 { -magnitude } else { magnitude }
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn ordinal(self) -> i64 {
        sign_magnitude(self.to_bits() as u64, 31)
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn bytes(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Vec<Self> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}

impl Elem for half::bf16 {
    const DTYPE: DType = DType::Bf16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
    fn ordinal(self) -> i64 {
        sign_magnitude(self.to_bits() as u64, 15)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn bytes(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Vec<Self> {
        b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]])).collect()
    }
}

impl Elem for half::f16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
    fn ordinal(self) -> i64 {
        sign_magnitude(self.to_bits() as u64, 15)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn bytes(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Vec<Self> {
        b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])).collect()
    }
}

/// Widens to f64 for comparison (in parallel: references run over hundreds of MB).
pub fn widen<T: Elem>(v: &[T]) -> Vec<f64> {
    use rayon::prelude::*;
    v.par_iter().map(|x| x.to_f64()).collect()
}

use crate::experiment::{peers, Backend, Measurement, Session};
use crate::tensor::{Buffer, Tensor};
use crate::LabError;
use crate::gpu::{timing::time_gpu, Gpu};
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance};
use crate::Result;
use cudarc::driver::CudaSlice;
use serde_json::Value;

/// How one output is judged: its tolerance, the comparison against the reference, and the
/// ceiling its throughput is a fraction of.
pub struct Check<'a, T> {
    pub tol: Tolerance,
    pub compare: &'a dyn Fn(&[T]) -> ErrorStats,
    pub ceiling: &'static str,
}

impl<'a, T> Check<'a, T> {
    /// For kernels bound by memory: placed under the copy ceiling.
    pub fn memory_bound(tol: Tolerance, compare: &'a dyn Fn(&[T]) -> ErrorStats) -> Self {
        Check { tol, compare, ceiling: "copy_gb_s" }
    }
}

/// The ceiling a matrix product is placed under: on a GPU the tensor roof of its f16 or bf16
/// inputs, else (the CPU, or f32) the FMA roof.
pub fn product_ceiling(dev: &crate::experiment::Backend, dtype: DType) -> &'static str {
    use crate::experiment::Backend;
    match (dev, dtype) {
        (Backend::Cuda(_), DType::F16) => "tensor_f16_tflop_s",
        (Backend::Cuda(_), DType::Bf16) => "tensor_bf16_tflop_s",
        _ => "fma_tflop_s",
    }
}

/// One GPU figure on a device buffer, the house way (poison the output, launch once and check,
/// time it, check again, record), for any provider: a peer library run in-process (cuBLAS) or a
/// study kernel with no callable op, with `extra` fields for the record.
#[allow(clippy::too_many_arguments)]
pub fn measure_gpu_as<T: Elem>(
    s: &mut Session,
    gpu: &Gpu,
    case: &Value,
    (variant, provider): (&str, &str),
    work: Work,
    check: &Check<T>,
    timed: bool,
    out: &mut CudaSlice<T>,
    extra: serde_json::Map<String, Value>,
    launch: impl Fn(&mut CudaSlice<T>) -> Result<()>,
) -> Result<()> {
    gpu.poison(out)?;
    launch(out)?;
    gpu.sync()?;
    let before = (check.compare)(&gpu.download(out)?);
    let time = if timed { Some(time_gpu(gpu, &s.budget, || launch(out))?) } else { None };
    let after = (check.compare)(&gpu.download(out)?);
    emit_checked(s, case, (variant, provider), work, check, (before, after), time, extra)
}

/// The record of a checked figure: the worse of the checks before and after timing, the time,
/// the tolerance, the ceiling and any `extra` fields.
#[allow(clippy::too_many_arguments)]
pub fn emit_checked<T>(
    s: &mut Session,
    case: &Value,
    (variant, provider): (&str, &str),
    work: Work,
    check: &Check<T>,
    (before, after): (ErrorStats, ErrorStats),
    time: Option<(crate::profile::TimeSummary, crate::profile::TimingMode)>,
    extra: serde_json::Map<String, Value>,
) -> Result<()> {
    let mut m = Measurement::new(variant, provider, case, work);
    m.error = Some(compare::first_failure(before, after));
    (m.time, m.tolerance, m.ceiling, m.extra) = (time, Some(check.tol), Some(check.ceiling), extra);
    s.emit(m).map(|_| ())
}

/// One lab variant through its callable op, the house way on either backend: poison the output
/// (0xFF bytes on the GPU, NaN on the host), run once and check, time it (`timed`), check again,
/// and emit the record against the check's ceiling.
#[allow(clippy::too_many_arguments)]
pub fn measure_op<T: Elem>(
    s: &mut Session,
    case: &Value,
    variant: &str,
    work: Work,
    check: &Check<T>,
    timed: bool,
    out: &mut Tensor<T>,
    op: impl Fn(&mut Tensor<T>) -> Result<()>,
) -> Result<()> {
    measure_op_with(s, case, variant, work, check, timed, out, Default::default(), op)
}

/// [`measure_op`] with `extra` fields for the record (e.g. the kernel's registers and tile).
#[allow(clippy::too_many_arguments)]
pub fn measure_op_with<T: Elem>(
    s: &mut Session,
    case: &Value,
    variant: &str,
    work: Work,
    check: &Check<T>,
    timed: bool,
    out: &mut Tensor<T>,
    extra: serde_json::Map<String, Value>,
    op: impl Fn(&mut Tensor<T>) -> Result<()>,
) -> Result<()> {
    let backend = s.backend.clone();
    match (&backend, out.buffer_mut()) {
        (Backend::Cuda(gpu), Buffer::Cuda(d)) => gpu.poison(d)?,
        (_, Buffer::Host(h)) => h.fill(T::from_f32(f32::NAN)),
        (Backend::Cpu, Buffer::Cuda(_)) => return Err(LabError::Invalid(format!("{variant}: the output is on a GPU, the backend is the CPU"))),
    }
    op(out)?;
    if let Backend::Cuda(gpu) = &backend {
        gpu.sync()?;
    }
    let before = (check.compare)(&out.to_vec()?);
    let time = match (&backend, timed) {
        (_, false) => None,
        (Backend::Cuda(gpu), true) => Some(time_gpu(gpu, &s.budget, || op(out))?),
        (Backend::Cpu, true) => Some(crate::profile::host_time(&s.budget, || Ok(()), || op(out))?),
    };
    let after = (check.compare)(&out.to_vec()?);
    emit_checked(s, case, (variant, "lab"), work, check, (before, after), time, extra)
}

/// One lab CPU variant, the same way: fill a NaN-poisoned output, check, time it (`timed`), check
/// again, and emit the record against the check's ceiling.
#[allow(clippy::too_many_arguments)]
pub fn measure_cpu<T: Elem>(
    s: &mut Session,
    case: &Value,
    variant: &str,
    work: Work,
    check: &Check<T>,
    timed: bool,
    len: usize,
    f: impl Fn(&mut [T]),
) -> Result<()> {
    if !s.wants(variant, "lab") {
        return Ok(());
    }
    let mut y = vec![T::from_f32(f32::NAN); len];
    f(&mut y);
    let before = (check.compare)(&y);
    let mut m = Measurement::new(variant, "lab", case, work);
    if timed {
        m.time = Some(crate::profile::cpu_time(&s.budget, || f(&mut y)));
    }
    m.error = Some(compare::first_failure(before, (check.compare)(&y)));
    (m.tolerance, m.ceiling) = (Some(check.tol), Some(check.ceiling));
    s.emit(m).map(|_| ())
}

/// One torch op on the same inputs (raw bytes and shape of each), its output checked like ours.
#[allow(clippy::too_many_arguments)]
pub fn measure_torch<T: Elem>(
    s: &mut Session,
    gpu: &Gpu,
    case: &Value,
    op: &str,
    args: Value,
    inputs: &[(&[u8], &[usize])],
    work: Work,
    check: &Check<T>,
) -> Result<()> {
    let start = gpu.nvml.as_ref().and_then(|n| n.clocks_now());
    let mut run = peers::torch(op, T::DTYPE.name(), args, inputs, &s.budget, gpu.info.l2_bytes)?;
    // The peer is another process: its clocks are read around that process.
    run.time.1.clocks = gpu.nvml.as_ref().and_then(|n| crate::gpu::nvml::clocks_around(start, n));
    let mut m = Measurement::new(run.variant, "torch", case, work);
    m.error = Some((check.compare)(&T::from_bytes(&run.output)));
    (m.time, m.tolerance, m.ceiling, m.extra) = (Some(run.time), Some(check.tol), Some(check.ceiling), run.extra);
    s.emit(m).map(|_| ())
}
