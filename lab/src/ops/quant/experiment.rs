//! The `quant` experiment: every row of the table measured through the callable ops of
//! [`super::launch`], on the GPU or the CPU backend, with the references of [`super::reference`].
//!
//! Cases, by `op`:
//! - `int4`: pack / unpack `n` codes (bytes moved: `n` codes + `n/2` packed).
//! - `format`: quantize and dequantize a `rows x cols` matrix in one [`Format`]; on the GPU the
//!   dequantize kernels (bytes: the quantized form read + f16 written), checked to the bit.
//! - `w4a16`: Y = X W^T with 4-bit W (group-wise, f16 scales), f16 X and Y, batches 1..16, every
//!   W4A16 design of the table beside cuBLAS fp16 GEMM on the dequantized weights, and the read
//!   floor (`stream_read*`) once per shape (GPU); `cpu_w4a16` on the CPU. Each output element
//!   within [`w4a16_bound`] of the f64 product. Bytes: everything the kernel must read and write
//!   (codes, scales, X, Y); flops `2 B N K`. Records carry the design as the variant, the scheme
//!   and batch as params. On the GPU's untimed shapes each design also runs on integer data,
//!   where its CPU model ([`super::models`]) must give the same bits: the record's `model`.
//! - `q8_0`: SmolLM2's LM head and token embedding in Q8_0 (or an odd shape, checked only): the
//!   W8A16 product per batch (f16 X, f32 Y; bytes: blocks, X and Y), checked element by element
//!   within the f32 sum bound of [`check_w8a16`] (and, untimed on the GPU, against its CPU model
//!   on integer data); the gather of `ids` random rows and the whole
//!   dequantize (f16 on the GPU, f32 on the CPU), checked to the bit.
//! - `smollm2`: the per-tensor requantization table of SmolLM2-135M (`LAB_SMOLLM2_GGUF`): each
//!   Q4_1 tensor dequantized, requantized in every format by `cpu_quantize`, and measured (untimed).

use super::launch::{self, QuantTensor};
use super::models::{integer_problem, integer_q8, w4a16_model, w8a16_blocks};
use super::q8::{self, check_w8a16, reference_w8a16, Q8Tensor};
use super::reference::{
    bits, check_w4a16, f16_bits, f16_bytes, parse_format, reference_dequantize, reference_dequantize_blocks, reference_magnitudes, reference_w4a16, step_check,
    validate_w4a16, w4a16_bound, xor_words, Grid, Quantized, STEP_REFERENCE,
};
use super::variants::{stream_reads, w4_designs, w8a16_shape, Layout, BATCHES};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Measurement, Session};
use crate::gpu::timing::time_gpu;
use crate::ops::compare::{compare_bits, first_failure};
use crate::profile::{cpu_time, Work};
use crate::quant::ggml::{self, Block};
use crate::quant::group::{self, check_finite, footprint, Format, Scheme};
use crate::quant::int4;
use crate::record::ErrorStats;
use crate::tensor::{Scalar, Tensor};
use crate::{LabError, Result};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::CudaSlice;
use half::f16;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Quant;

/// The environment variable naming SmolLM2-135M-Instruct.Q4_1.gguf.
pub const SMOLLM2_ENV: &str = "LAB_SMOLLM2_GGUF";

/// The record's footprint fields for `n` weights in `format`.
fn footprint_extra(m: &mut Measurement, format: Format, n: u64) {
    m.extra.insert("footprint".into(), json!(footprint(format, n)));
}

impl Experiment for Quant {
    fn name(&self) -> &'static str {
        "quant"
    }
    fn description(&self) -> &'static str {
        "4-bit weights: INT4 pack/unpack, group-wise sym/asym and GGUF Q4_0/Q4_1 (de)quantization, W4A16 GEMV/GEMM vs cuBLAS fp16, Q8_0 W8A16 and row gather, SmolLM2 requantization table"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["op=w4a16 batch=1 k=4096 n=4096 group=128 scheme=sym", "op=w4a16 batch=16 k=4096 n=4096 group=128 scheme=sym", "op=w4a16 batch=1 k=576 n=1536 group=64 scheme=sym"]
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let mut out = Vec::new();
        let gpu = matches!(backend, Backend::Cuda(_));
        // int4: an odd count (checked, untimed), then the timed sizes.
        out.push(json!({"op": "int4", "n": 1_000_003, "timed": false}));
        let int4_n: &[usize] = match (gpu, quick) {
            (true, false) => &[1 << 24, 1 << 28],
            (true, true) => &[1 << 24],
            (false, false) => &[1 << 24, 1 << 26],
            (false, true) => &[1 << 16],
        };
        out.extend(int4_n.iter().map(|&n| json!({"op": "int4", "n": n})));
        let (rows, cols) = match (gpu, quick) {
            (true, false) => (8192, 8192),
            (true, true) => (4096, 4096),
            (false, false) => (4096, 4096),
            (false, true) => (64, 1024),
        };
        let formats: Vec<String> = if gpu { ["sym_g128", "asym_g128", "q4_0", "q4_1"].map(String::from).to_vec() } else { Format::all().iter().map(|f| f.name()).collect() };
        out.extend(formats.iter().map(|f| json!({"op": "format", "format": f, "rows": rows, "cols": cols})));
        if !gpu {
            // cpu_w4a16: an odd shape at odd batches (checked), then a timed one.
            out.push(json!({"op": "w4a16", "n": 37, "k": 992, "scheme": "asym", "group": 32, "batches": [1, 3, 16], "timed": false}));
            let (n, k) = if quick { (512, 1024) } else { (4096, 4096) };
            out.push(json!({"op": "w4a16", "n": n, "k": k, "scheme": "sym", "group": 128, "batches": [1, 16]}));
        }
        if gpu {
            let shapes: &[(usize, usize)] = if quick {
                &[(4096, 4096), (1536, 576)]
            } else {
                &[(4096, 4096), (4096, 11008), (11008, 4096), (8192, 8192), (576, 576), (1536, 576), (576, 1536)]
            };
            let batches: &[usize] = if quick { &[1, 16] } else { BATCHES };
            for &(n, k) in shapes {
                // K = 576 (SmolLM2's hidden size) is not a multiple of 128: groups of 64 there.
                let group = if k % 128 == 0 { 128 } else { 64 };
                out.push(json!({"op": "w4a16", "n": n, "k": k, "scheme": "sym", "group": group, "batches": batches}));
            }
            // Asymmetric (scale + min) and Q4_0-like groups of 32 at batch 1 on the big shape.
            let (n, k) = if quick { (4096, 4096) } else { (8192, 8192) };
            out.push(json!({"op": "w4a16", "n": n, "k": k, "scheme": "asym", "group": 128, "batches": [1]}));
            out.push(json!({"op": "w4a16", "n": n, "k": k, "scheme": "sym", "group": 32, "batches": [1]}));
            // Odd row count and a K of one chunk short of a full warp step: checked, untimed.
            out.push(json!({"op": "w4a16", "n": 37, "k": 992, "scheme": "asym", "group": 32, "batches": BATCHES, "timed": false}));
            // The same odd rows with K split over 2 (3 at batch 16) blocks per tile, a partial last step.
            out.push(json!({"op": "w4a16", "n": 37, "k": 4064, "scheme": "sym", "group": 32, "batches": BATCHES, "timed": false}));
            // Odd rows with post-scaled steps (sym, group 128), 23 steps over 8 warps.
            out.push(json!({"op": "w4a16", "n": 37, "k": 2944, "scheme": "sym", "group": 128, "batches": BATCHES, "timed": false}));
        }
        // Q8_0: odd rows, a K of three blocks and batches across the 16-row launches (checked),
        // then SmolLM2's LM head (GPU).
        out.push(json!({"op": "q8_0", "n": 37, "k": 96, "ids": 5, "batches": [1, 3, 16, 17], "timed": false}));
        if gpu {
            let batches: &[usize] = if quick { &[1, 16] } else { &[1, 2, 4, 8, 16, 64] };
            out.push(json!({"op": "q8_0", "n": 49152, "k": 576, "ids": 64, "batches": batches}));
        }
        if std::env::var_os(SMOLLM2_ENV).is_some() {
            out.push(json!({"op": "smollm2", "layers": if quick { 1 } else { 30 }, "timed": false}));
        }
        out
    }
    /// The gates, and each format's kernels on an odd row count whose packed Q4_0/Q4_1 blocks
    /// end inside a 16 B vector (37 x 1152: 23,976 and 26,640 bytes).
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        let mut out = crate::experiment::quick_gates(self, backend);
        if matches!(backend, Backend::Cuda(_)) {
            out.extend(["sym_g128", "asym_g128", "q4_0", "q4_1"].map(|f| json!({"op": "format", "format": f, "rows": 37, "cols": 1152, "timed": false})));
        }
        out
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match param_str(case, "op")? {
            "int4" => run_int4(s, case),
            "format" => run_format(s, case),
            "w4a16" => run_w4a16(s, case),
            "q8_0" => run_q8(s, case),
            "smollm2" => run_smollm2(s, case),
            op => Err(LabError::Invalid(format!("quant: unknown op `{op}` (int4, format, w4a16, q8_0, smollm2)"))),
        }
    }
}

/// One lab (or peer) figure from an op that writes `out`, the house way on either backend: on
/// the GPU poison, run, check, time with events, check again; on the CPU run, check, time on the
/// host, check again. Returned for the caller to add its fields to.
#[allow(clippy::too_many_arguments)]
fn measure<T: Scalar>(
    s: &Session,
    case: &Value,
    (variant, provider): (&str, &str),
    work: Work,
    timed: bool,
    out: &mut Tensor<T>,
    op: impl Fn(&mut Tensor<T>) -> Result<()>,
    check: impl Fn(&[T]) -> ErrorStats,
) -> Result<Measurement> {
    let (before, time, after) = match &s.backend {
        Backend::Cuda(gpu) => {
            gpu.poison(out.cuda_mut().ok_or_else(|| LabError::Invalid(format!("{variant}: the output is on the host, the backend is a GPU")))?)?;
            op(out)?;
            gpu.sync()?;
            let before = check(&out.to_vec()?);
            let time = if timed { Some(time_gpu(gpu, &s.budget, || op(out))?) } else { None };
            (before, time, check(&out.to_vec()?))
        }
        Backend::Cpu => {
            op(out)?;
            let before = check(out.host().ok_or_else(|| LabError::Invalid(format!("{variant}: the output is on a GPU, the backend is the CPU")))?);
            let mut failed = None;
            let time = timed.then(|| cpu_time(&s.budget, || if let Err(e) = op(out) { failed.get_or_insert(e); }));
            if let Some(e) = failed {
                return Err(e);
            }
            (before, time, check(out.host().expect("checked above")))
        }
    };
    let mut m = Measurement::new(variant, provider, case, work);
    (m.time, m.error, m.ceiling) = (time, Some(first_failure(before, after)), Some("copy_gb_s"));
    Ok(m)
}

fn run_int4(s: &mut Session, case: &Value) -> Result<()> {
    let n = param_usize(case, "n")?;
    let timed = param_timed(case);
    let mut rng = rng_for(s.opts.seed, case);
    let codes: Vec<u8> = (0..n).map(|_| rand::Rng::random_range(&mut rng, 0..16u8)).collect();
    // The reference, one element at a time from the documented order.
    let mut expect_packed = vec![0u8; int4::packed_len(n)];
    for (i, &c) in codes.iter().enumerate() {
        expect_packed[i / 2] |= c << (4 * (i % 2));
    }
    let work = Work { bytes: (n + int4::packed_len(n)) as u64, flops: 0 };
    let dev = s.backend.clone();
    let (pack, unpack) = if matches!(dev, Backend::Cpu) { ("cpu_pack", "cpu_unpack") } else { ("pack_int4", "unpack_int4") };
    let dcodes = Tensor::from_slice(&dev, &[n], &codes)?;
    let dpacked = Tensor::from_slice(&dev, &[expect_packed.len()], &expect_packed)?;
    let mut ms = Vec::new();
    if s.wants(pack, "lab") {
        let mut out = Tensor::<u8>::zeros(&dev, &[int4::packed_len(n)])?;
        let op = |o: &mut Tensor<u8>| launch::pack_int4_with(&dev, pack, &dcodes, o);
        ms.push(measure(s, case, (pack, "lab"), work, timed, &mut out, op, |o| bits(o, &expect_packed, "scalar-pack"))?);
    }
    if s.wants(unpack, "lab") {
        let mut out = Tensor::<u8>::zeros(&dev, &[n])?;
        let op = |o: &mut Tensor<u8>| launch::unpack_int4_with(&dev, unpack, &dpacked, o);
        ms.push(measure(s, case, (unpack, "lab"), work, timed, &mut out, op, |o| bits(o, &codes, "codes"))?);
    }
    for mut m in ms {
        // Packed INT4 against the same values as fp32 and fp16 (codes alone, no scales).
        m.extra.insert("footprint".into(), json!({"bytes": int4::packed_len(n), "smaller_than_f32": 4.0 * n as f64 / int4::packed_len(n) as f64, "smaller_than_f16": 2.0 * n as f64 / int4::packed_len(n) as f64}));
        s.emit(m)?;
    }
    Ok(())
}

/// Weights ~ N(0, 1/cols), as a trained layer's scale.
fn weights(s: &Session, case: &Value, rows: usize, cols: usize) -> Vec<f32> {
    let mut rng = rng_for(s.opts.seed, case);
    let sd = 1.0 / (cols as f32).sqrt();
    (0..rows * cols).map(|_| { let z: f32 = StandardNormal.sample(&mut rng); sd * z }).collect()
}

fn run_format(s: &mut Session, case: &Value) -> Result<()> {
    let format = parse_format(param_str(case, "format")?)?;
    let (rows, cols) = (param_usize(case, "rows")?, param_usize(case, "cols")?);
    let timed = param_timed(case);
    let x = Tensor::from_vec(&[rows, cols], weights(s, &json!({"rows": rows, "cols": cols}), rows, cols))?;
    let xs = x.host().expect("a host tensor");
    let n = (rows * cols) as u64;
    let q = Quantized::new(format, xs, rows, cols)?;
    let deq = q.dequantize();
    let qbytes = q.bytes();
    let dev = s.backend.clone();
    let mut ms = Vec::new();
    match &dev {
        Backend::Cpu => {
            if s.wants("cpu_quantize", "lab") {
                let work = Work { bytes: 4 * n + qbytes, flops: 0 };
                let mut out = Tensor::<f32>::zeros(&dev, &[rows, cols])?;
                // Checked: the reconstruction of what it made, within half the step its input
                // needs per group; timed: quantization alone.
                let quantize = |o: &mut Tensor<f32>| launch::dequantize_with(&dev, "cpu_dequantize", &QuantTensor::quantize(&dev, &x, format)?, o);
                let mut m = measure(s, case, ("cpu_quantize", "lab"), work, false, &mut out, quantize, |o| step_check(xs, o, Grid::of(format), format.group()))?;
                if timed {
                    m.time = Some(cpu_time(&s.budget, || {
                        std::hint::black_box(QuantTensor::quantize(&dev, &x, format).expect("validated above"));
                    }));
                }
                ms.push(m);
            }
            if s.wants("cpu_dequantize", "lab") {
                let work = Work { bytes: qbytes + 4 * n, flops: 0 };
                let reference: Vec<u32> = reference_dequantize(&q).iter().map(|v| v.to_bits()).collect();
                let w = QuantTensor::from_quantized(&dev, q.clone(), (rows, cols), Layout::Rows)?;
                let mut out = Tensor::<f32>::zeros(&dev, &[rows, cols])?;
                let op = |o: &mut Tensor<f32>| launch::dequantize_with(&dev, "cpu_dequantize", &w, o);
                let check = |o: &[f32]| compare_bits(&o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &reference, "scalar-dequantize");
                ms.push(measure(s, case, ("cpu_dequantize", "lab"), work, timed, &mut out, op, check)?);
            }
        }
        Backend::Cuda(_) => {
            let wanted: Vec<&str> = ["dequant", "dequant_cp_async"]
                .into_iter()
                .filter(|v| super::variants::dequant_kernel(v, format).is_some() && s.wants(v, "lab"))
                .collect();
            if !wanted.is_empty() {
                let expected: Vec<u16> = f16_bits(&deq.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>());
                let w = QuantTensor::from_quantized(&dev, q.clone(), (rows, cols), Layout::Rows)?;
                for v in wanted {
                    let mut out = Tensor::<f16>::zeros(&dev, &[rows, cols])?;
                    let work = Work { bytes: qbytes + 2 * n, flops: 0 };
                    let op = |o: &mut Tensor<f16>| launch::dequantize_with(&dev, v, &w, o);
                    ms.push(measure(s, case, (v, "lab"), work, timed, &mut out, op, |o| bits(&f16_bits(o), &expected, "cpu-dequantize"))?);
                }
            }
        }
    }
    let e = group::error_metrics(xs, &deq)?;
    for mut m in ms {
        footprint_extra(&mut m, format, n);
        m.extra.insert("quant_error".into(), json!(e));
        s.emit(m)?;
    }
    Ok(())
}

/// A batch of X for a W4A16 shape and its reference: (params, X, the f64 product of the
/// dequantized weights, the f64 product of |X| and the weights' term magnitudes).
fn w4a16_batch(s: &Session, shape_case: &Value, b: usize, (n, k): (usize, usize), wd: &[f32], mags: &[f32]) -> (Value, Vec<f16>, Vec<f64>, Vec<f64>) {
    let mut params = shape_case.clone();
    params["batch"] = json!(b);
    let mut rng = rng_for(s.opts.seed, &params);
    let x: Vec<f16> = (0..b * k).map(|_| f16::from_f32(StandardNormal.sample(&mut rng))).collect();
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let expected = reference_w4a16(&xf, wd, b, n, k);
    let scale = reference_w4a16(&xf.iter().map(|v| v.abs()).collect::<Vec<_>>(), mags, b, n, k);
    (params, x, expected, scale)
}

fn run_w4a16(s: &mut Session, case: &Value) -> Result<()> {
    let dev = s.backend.clone();
    let (n, k, group) = (param_usize(case, "n")?, param_usize(case, "k")?, param_usize(case, "group")?);
    let scheme = match param_str(case, "scheme")? {
        "sym" => Scheme::Sym,
        "asym" => Scheme::Asym,
        other => return Err(LabError::Invalid(format!("unknown scheme `{other}` (sym, asym)"))),
    };
    let (batches, shape_case) = batches(case)?;
    let timed = param_timed(case);
    let wf = weights(s, &shape_case, n, k);
    let q = group::quantize(&wf, n, k, scheme, group)?;
    let wd = q.dequantize();
    let qbytes = q.bytes();
    let quantized = Quantized::Group(q);
    let mags = reference_magnitudes(&quantized);
    let (format, bound) = (Format::Group { scheme, group }, w4a16_bound(k));
    let flops = |b: usize| 2 * (b * n * k) as u64;
    let io = |b: usize| 2 * (b * k + b * n) as u64;
    let Backend::Cuda(gpu) = &dev else {
        if !s.wants("cpu_w4a16", "lab") {
            return Ok(());
        }
        let w = QuantTensor::from_quantized(&dev, quantized, (n, k), Layout::Rows)?;
        for b in batches {
            let (params, x, expected, scale) = w4a16_batch(s, &shape_case, b, (n, k), &wd, &mags);
            let dx = Tensor::from_slice(&dev, &[b, k], &x)?;
            let mut dy = Tensor::<f16>::zeros(&dev, &[b, n])?;
            let op = |y: &mut Tensor<f16>| launch::w4a16_matvec_with(&dev, "cpu_w4a16", &w, &dx, y);
            let work = Work { bytes: qbytes + io(b), flops: flops(b) };
            let mut m = measure(s, &params, ("cpu_w4a16", "lab"), work, timed, &mut dy, op, |y| check_w4a16(y, &expected, &scale, bound))?;
            m.tolerance = Some(bound.tolerance());
            footprint_extra(&mut m, format, (n * k) as u64);
            s.emit(m)?;
        }
        return Ok(());
    };
    for &b in &batches {
        validate_w4a16(n, k, group, b)?;
    }
    let wd16: Vec<f16> = wd.par_iter().map(|&v| f16::from_f32(v)).collect();
    // The weights in each layout the designs read, rearranged once like the dequantized weights
    // cuBLAS reads (untimed).
    let layouts = in_layouts(&dev, &quantized, (n, k))?;
    let in_layout = |l: Layout| &layouts.iter().find(|(m, _)| *m == l).expect("every layout built").1;
    stream_read(s, &shape_case, &quantized, in_layout(Layout::Rows))?;
    let dw16 = gpu.upload(&wd16)?;
    let blas = CudaBlas::new(gpu.stream.clone()).doing("creating the cuBLAS handle")?;
    for b in batches {
        let (params, x, expected, scale) = w4a16_batch(s, &shape_case, b, (n, k), &wd, &mags);
        let dx = Tensor::from_slice(&dev, &[b, k], &x)?;
        let mut dy = Tensor::<f16>::zeros(&dev, &[b, n])?;
        // The untimed shapes' models, on integer data: weights in every layout, X and Y.
        let integer = if timed {
            None
        } else {
            let (iq, ix) = integer_problem(n, k, scheme, group, b, s.opts.seed);
            let dix = Tensor::from_slice(&dev, &[b, k], &ix)?;
            Some((in_layouts(&dev, &Quantized::Group(iq.clone()), (n, k))?, iq, ix, dix))
        };
        for (name, design) in w4_designs() {
            if !s.wants(name, "lab") {
                continue;
            }
            let w = in_layout(design.layout);
            let op = |y: &mut Tensor<f16>| launch::w4a16_matvec_with(&dev, name, w, &dx, y);
            let work = Work { bytes: qbytes + io(b), flops: flops(b) };
            let mut m = measure(s, &params, (name, "lab"), work, timed, &mut dy, op, |y| check_w4a16(y, &expected, &scale, bound))?;
            m.tolerance = Some(bound.tolerance());
            footprint_extra(&mut m, format, (n * k) as u64);
            if let Some((ilayouts, iq, ix, dix)) = &integer {
                let w = &ilayouts.iter().find(|(m, _)| *m == design.layout).expect("every layout built").1;
                launch::w4a16_matvec_with(&dev, name, w, dix, &mut dy)?;
                let got = dy.to_vec()?;
                let model = w4a16_model(&design, iq, ix, b, gpu.info.sm_count as usize);
                let what = format!("{:?} on {} warps, {} layout", design.model, design.warps, design.layout.name());
                check_model(&mut m, &what, &f16_bits(&got), &f16_bits(&model));
            }
            s.emit(m)?;
        }
        if s.wants("cublas_f16_dequantized", "cublas") {
            let (ni, ki, bi) = (n as i32, k as i32, b as i32);
            // Y^T (N x B, column-major) = W (op T of the K x N column-major view) . X^T.
            let cfg = GemmConfig { transa: CUBLAS_OP_T, transb: CUBLAS_OP_N, m: ni, n: bi, k: ki, alpha: f16::ONE, lda: ki, ldb: ki, beta: f16::ZERO, ldc: ni };
            let xd = dx.cuda().expect("on the GPU");
            let op = |y: &mut Tensor<f16>| -> Result<()> {
                let y: &mut CudaSlice<f16> = y.cuda_mut().expect("on the GPU");
                // SAFETY: W is n x k, X is b x k, Y is b x n halves, as cfg says.
                unsafe { blas.gemm(cfg, &dw16, xd, y) }.doing("cuBLAS fp16 GEMM")
            };
            // cuBLAS may reduce split-K partials in f16.
            let peer = bound.with_output_type_reduction();
            let work = Work { bytes: 2 * (n * k) as u64 + io(b), flops: flops(b) };
            let mut m = measure(s, &params, ("cublas_f16_dequantized", "cublas"), work, timed, &mut dy, op, |y| check_w4a16(y, &expected, &scale, peer))?;
            m.tolerance = Some(peer.tolerance());
            s.emit(m)?;
        }
    }
    Ok(())
}

/// Group-wise weights placed on `dev` in every layout a design reads.
fn in_layouts(dev: &Backend, q: &Quantized, shape: (usize, usize)) -> Result<Vec<(Layout, QuantTensor)>> {
    [Layout::Rows, Layout::Tiles, Layout::StepMajor].into_iter().map(|l| QuantTensor::from_quantized(dev, q.clone(), shape, l).map(|w| (l, w))).collect()
}

/// Records a kernel's output on integer data against its CPU model's, bit for bit, as the
/// record's `model` field; any output that differs fails the record (its error counts them), so
/// a decode or an index the model and the kernel disagree on unverifies the family.
fn check_model<T: PartialEq>(m: &mut Measurement, what: &str, got: &[T], model: &[T]) {
    let differ = got.len().abs_diff(model.len()) + got.iter().zip(model).filter(|(g, m)| g != m).count();
    let first = got.iter().zip(model).position(|(g, m)| g != m);
    m.extra.insert("model".into(), json!({"model": what, "data": "integer", "outputs": got.len(), "mismatches": differ, "first": first}));
    if differ > 0 {
        let e = m.error.get_or_insert_with(|| ErrorStats::empty("its CPU model"));
        e.mismatches += differ as u64;
        e.reference = format!("{}; {differ} outputs differ from its CPU model ({what}) on integer data", e.reference);
    }
}

/// A case's batches, one record each, and the case without them (the shape's params): a rerun of
/// one record carries `batch` instead of `batches`.
fn batches(case: &Value) -> Result<(Vec<usize>, Value)> {
    let batches: Vec<usize> = match case.get("batch") {
        Some(_) => vec![param_usize(case, "batch")?],
        None => case.get("batches").and_then(Value::as_array).map(|a| a.iter().filter_map(|v| v.as_u64().map(|b| b as usize)).collect()).unwrap_or_default(),
    };
    let mut shape_case = case.clone();
    if let Some(o) = shape_case.as_object_mut() {
        o.remove("batches");
        o.remove("batch");
    }
    Ok((batches, shape_case))
}

fn run_q8(s: &mut Session, case: &Value) -> Result<()> {
    let (n, k, n_ids) = (param_usize(case, "n")?, param_usize(case, "k")?, param_usize(case, "ids")?);
    let timed = param_timed(case);
    let (batches, shape_case) = batches(case)?;
    let blocks = ggml::quantize(Block::Q8_0, &weights(s, &shape_case, n, k))?;
    let dev = s.backend.clone();
    let w = Q8Tensor::from_blocks(&dev, &blocks, n, k)?;
    let wd = reference_dequantize_blocks(Block::Q8_0, &blocks);
    let cpu = matches!(dev, Backend::Cpu);
    let (product, gather, dequant) = if cpu { ("cpu_w8a16", "cpu_embed", "cpu_dequantize") } else { ("w8a16", "embed", "dequant") };
    let batches = if s.wants(product, "lab") { batches } else { Vec::new() };
    for b in batches {
        let mut params = shape_case.clone();
        params["batch"] = json!(b);
        let mut rng = rng_for(s.opts.seed, &params);
        let x: Vec<f16> = (0..b * k).map(|_| f16::from_f32(StandardNormal.sample(&mut rng))).collect();
        let (expected, abs) = reference_w8a16(&x.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &wd, b, n, k);
        let dx = Tensor::from_slice(&dev, &[b, k], &x)?;
        let mut dy = Tensor::<f32>::zeros(&dev, &[b, n])?;
        let work = Work { bytes: w.bytes() + 2 * (b * k) as u64 + 4 * (b * n) as u64, flops: 2 * (b * n * k) as u64 };
        let op = |y: &mut Tensor<f32>| q8::w8a16_matvec_with(&dev, product, &w, &dx, y);
        let mut m = measure(s, &params, (product, "lab"), work, timed, &mut dy, op, |y| check_w8a16(y, &expected, &abs, k))?;
        if let (false, Backend::Cuda(gpu)) = (timed, &dev) {
            // The kernel on integer data against its CPU model at the launch's rows per warp.
            let (iblocks, ix) = integer_q8(n, k, b, s.opts.seed);
            let (iw, dix) = (Q8Tensor::from_blocks(&dev, &iblocks, n, k)?, Tensor::from_slice(&dev, &[b, k], &ix)?);
            q8::w8a16_matvec_with(&dev, product, &iw, &dix, &mut dy)?;
            let rows_per_warp = w8a16_shape(n, gpu.info.sm_count as usize).1;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let model = w8a16_blocks(&iblocks, (n, k), &ix, b, rows_per_warp);
            check_model(&mut m, &format!("w8a16 at {rows_per_warp} rows per warp"), &bits(&dy.to_vec()?), &bits(&model));
        }
        s.emit(m)?;
    }
    if s.wants(gather, "lab") {
        let mut rng = rng_for(s.opts.seed, &shape_case);
        let ids: Vec<u32> = (0..n_ids).map(|_| rand::Rng::random_range(&mut rng, 0..n as u32)).collect();
        let want: Vec<u32> = ids.iter().flat_map(|&id| wd[id as usize * k..(id as usize + 1) * k].iter().map(|v| v.to_bits())).collect();
        let dids = Tensor::from_slice(&dev, &[n_ids], &ids)?;
        let mut out = Tensor::<f32>::zeros(&dev, &[n_ids, k])?;
        let work = Work { bytes: (n_ids * Block::Q8_0.size_of(k) + 4 * n_ids + 4 * n_ids * k) as u64, flops: 0 };
        let op = |o: &mut Tensor<f32>| q8::embed_q8_0_with(&dev, gather, &w, &dids, o);
        let check = |o: &[f32]| compare_bits(&o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &want, "scalar-dequantize");
        let m = measure(s, &shape_case, (gather, "lab"), work, timed, &mut out, op, check)?;
        s.emit(m)?;
    }
    if s.wants(dequant, "lab") {
        let params = &shape_case;
        let m = if cpu {
            let mut out = Tensor::<f32>::zeros(&dev, &[n, k])?;
            let want: Vec<u32> = wd.iter().map(|v| v.to_bits()).collect();
            let op = |o: &mut Tensor<f32>| q8::dequantize_q8_0_with(&dev, dequant, &w, o);
            let check = |o: &[f32]| compare_bits(&o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &want, "scalar-dequantize");
            measure(s, params, (dequant, "lab"), Work { bytes: w.bytes() + 4 * (n * k) as u64, flops: 0 }, timed, &mut out, op, check)?
        } else {
            let mut out = Tensor::<f16>::zeros(&dev, &[n, k])?;
            let want = f16_bits(&wd.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>());
            let op = |o: &mut Tensor<f16>| q8::dequantize_q8_0_with(&dev, dequant, &w, o);
            measure(s, params, (dequant, "lab"), Work { bytes: w.bytes() + 2 * (n * k) as u64, flops: 0 }, timed, &mut out, op, |o| bits(&f16_bits(o), &want, "scalar-dequantize"))?
        };
        s.emit(m)?;
    }
    Ok(())
}

/// The read floor under every W4A16 design of a shape, in the same run: one record per shape
/// and stream read of the table. The host checks the XOR of every word read.
fn stream_read(s: &mut Session, case: &Value, q: &Quantized, w: &QuantTensor) -> Result<()> {
    let (Quantized::Group(g), Backend::Cuda(gpu)) = (q, s.backend.clone()) else { unreachable!("w4a16 cases are group-wise, on the GPU") };
    let want = xor_words(&g.packed) ^ xor_words(&f16_bytes(&g.scales)) ^ xor_words(&f16_bytes(&g.mins));
    let dev = s.backend.clone();
    for (variant, _, _) in stream_reads() {
        if !s.wants(variant, "lab") {
            continue;
        }
        let mut out = Tensor::<u32>::zeros(&dev, &[launch::stream_read_blocks(&gpu, variant, w)?])?;
        let op = |out: &mut Tensor<u32>| launch::stream_read_with(&dev, variant, w, out);
        let check = |got: &[u32]| bits(&[got.iter().fold(0, |a, &w| a ^ w)], &[want], "cpu-xor");
        let work = Work { bytes: g.bytes(), flops: 0 };
        let m = measure(s, case, (variant, "lab"), work, param_timed(case), &mut out, op, check)?;
        s.emit(m)?;
    }
    Ok(())
}

fn run_smollm2(s: &mut Session, case: &Value) -> Result<()> {
    let path = std::env::var(SMOLLM2_ENV).map_err(|_| LabError::Invalid(format!("{SMOLLM2_ENV} is not set (scripts/test.sh installs the model; see README)")))?;
    let layers = param_usize(case, "layers")?;
    // A rerun of one table row names its tensor and format.
    let only_tensor = case.get("tensor").and_then(Value::as_str).filter(|t| *t != "all");
    let only_format = case.get("format").and_then(Value::as_str);
    let file = crate::weights::gguf::GgufFile::open(&path)?;
    let g = file.parse()?;
    let tensors: Vec<_> = g
        .tensors
        .iter()
        .filter(|t| t.ty == crate::weights::gguf::GgmlType::Q4_1 && t.dims.len() == 2)
        .filter(|t| only_tensor.is_none_or(|name| t.name == name))
        .filter(|t| t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|l| l.parse::<usize>().ok()).is_some_and(|l| l < layers))
        .collect();
    if tensors.is_empty() {
        return Err(LabError::Invalid(format!("{path}: no 2-D Q4_1 tensors in the first {layers} layers")));
    }
    // Totals per format over every tensor: (signal, noise, max abs, bytes, weights).
    let mut totals: Vec<(f64, f64, f64, u64, u64, u64)> = vec![(0.0, 0.0, 0.0, 0, 0, 0); Format::all().len()];
    let mut skipped = vec![0usize; Format::all().len()];
    for t in tensors {
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let xt = Tensor::from_vec(&[rows, cols], ggml::dequantize(Block::Q4_1, g.data(t))?)?;
        let x = xt.host().expect("a host tensor");
        check_finite(x, &t.name)?;
        let signal: f64 = x.par_iter().map(|&v| (v as f64).powi(2)).sum();
        for (fi, format) in Format::all().into_iter().enumerate() {
            let variant = format.name();
            if !s.wants("cpu_quantize", "lab") || only_format.is_some_and(|f| f != variant) {
                continue;
            }
            // SmolLM2's hidden size, 576, is 4.5 groups of 128: such a tensor is counted as skipped
            // in that format's total rather than quantized with a ragged last group.
            if cols % format.group() != 0 {
                skipped[fi] += 1;
                continue;
            }
            let w = QuantTensor::quantize(&Backend::Cpu, &xt, format)?;
            let q = w.host().expect("quantized on the host");
            let y = q.dequantize();
            let e = group::error_metrics(x, &y)?;
            let params = json!({"op": "smollm2", "layers": layers, "tensor": t.name, "rows": rows, "cols": cols, "format": variant, "timed": false});
            let mut m = Measurement::new("cpu_quantize", "lab", &params, Work { bytes: q.bytes(), flops: 0 });
            m.error = Some(step_check(x, &y, Grid::of(format), format.group()));
            footprint_extra(&mut m, format, (rows * cols) as u64);
            m.extra.insert("quant_error".into(), json!(e));
            let noise = signal * e.rel_rmse.powi(2);
            let tot = &mut totals[fi];
            *tot = (tot.0 + signal, tot.1 + noise, tot.2.max(e.max_abs), tot.3 + q.bytes(), tot.4 + (rows * cols) as u64, tot.5 + m.error.as_ref().map_or(0, |e| e.mismatches));
            s.emit(m)?;
        }
    }
    for ((format, (signal, noise, max_abs, bytes, n, mismatches)), skipped) in Format::all().into_iter().zip(totals).zip(skipped) {
        if n == 0 || only_tensor.is_some() {
            continue;
        }
        let params = json!({"op": "smollm2", "tensor": "all", "layers": layers, "format": format.name(), "timed": false});
        let mut m = Measurement::new("cpu_quantize", "lab", &params, Work { bytes, flops: 0 });
        let rel = (noise / signal).sqrt();
        m.error = Some(ErrorStats { max_abs, max_rel: rel, mismatches, ..ErrorStats::empty(STEP_REFERENCE) });
        footprint_extra(&mut m, format, n);
        m.extra.insert("quant_error".into(), json!({"rel_rmse": rel, "max_abs": max_abs, "sqnr_db": 10.0 * (signal / noise).log10()}));
        m.extra.insert("tensors_skipped".into(), json!(skipped));
        s.emit(m)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel one output away from its model fails its record, whatever its tolerance check
    /// said; an exact one keeps the check's verdict.
    #[test]
    fn a_kernel_that_differs_from_its_model_fails() {
        let passing = || {
            let mut m = Measurement::new("w8a16", "lab", &json!({"n": 4}), Work::default());
            m.error = Some(ErrorStats::empty("f64 reference"));
            m
        };
        let mut exact = passing();
        check_model(&mut exact, "w8a16 at 2 rows per warp", &[1u32, 2, 3, 4], &[1, 2, 3, 4]);
        assert!(exact.error.as_ref().unwrap().passed());
        assert_eq!(exact.extra["model"]["mismatches"], 0);
        let mut planted = passing();
        check_model(&mut planted, "w8a16 at 2 rows per warp", &[1u32, 2, 7, 4], &[1, 2, 3, 4]);
        let e = planted.error.as_ref().unwrap();
        assert!(!e.passed());
        assert_eq!((e.mismatches, &planted.extra["model"]["first"]), (1, &json!(2)));
        assert!(e.reference.contains("1 outputs differ from its CPU model"), "{}", e.reference);
        // A short output is a disagreement too.
        let mut short = passing();
        check_model(&mut short, "w8a16", &[1u32, 2], &[1, 2, 3]);
        assert_eq!(short.error.unwrap().mismatches, 1);
    }
}
