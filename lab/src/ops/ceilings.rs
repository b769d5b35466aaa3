//! `ceilings`: what this device can do, measured in the same run as everything else.
//! GPU: memory bandwidth (the fastest of a device-to-device copy, by the driver and by a float4
//! kernel, and a float4 read stream: `copy_gb_s`, the memory roof), the FP32 FMA rate
//! (kernels/ceilings.cu), the fp16/bf16 tensor-core rate (the best of cuBLAS GEMM and, on
//! compute capability 9.0, a wgmma loop on operands that stay in shared memory), and the
//! mma.sync rate from registers (the roof of the mma.sync GEMM rungs).
//! Host <-> device: copy bandwidth each way from pinned and from pageable host memory (the
//! roofs of `lab::data`'s loader).
//! Latency: what one grid-wide dependency costs, three ways (`sync`, in ceilings/sync.rs).
//! CPU: memory bandwidth (parallel copy) and the multiply-add rate of the host.
//! (Over 600 lines: one short function per roof, with the host transfer roofs; kept in one file
//! beside the one variant table they share.)

mod sync;

use super::compare::{compare, compare_bits};
use super::variant::{self, Requires, Variant, VariantInfo};
use super::Elem;
use crate::error::Doing;
use crate::experiment::{param_str, param_usize, Backend, Ceiling, Experiment, Measurement, Session};
use crate::gpu::{timing::time_gpu, Gpu};
use crate::kernels::{symbol, DType};
use crate::profile::{cpu_time, TimeSummary, Work};
use crate::record::Tolerance;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use rand::Rng;
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Ceilings;

const FAMILY: &str = "ceilings";
const GIB: usize = 1 << 30;
/// FMA constants with a fixed point at 1: values stay bounded however long the chain.
const MUL: f32 = 0.9999;
const ADD: f32 = 1e-4;

impl Experiment for Ceilings {
    fn name(&self) -> &'static str {
        "ceilings"
    }
    fn description(&self) -> &'static str {
        "measured roofs: copy bandwidth, FP32 FMA rate, fp16/bf16 tensor rate (cuBLAS, wgmma loop), mma.sync rate, host<->device copies"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["what=copy bytes=2147483648", "what=fma iters=16384", "what=tensor iters=2048", "what=mma_sync iters=8192"]
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        match (backend, quick) {
            // Two GEMM sizes: at 8192^3 an H100 SXM hits its power cap and drops its SM clock
            // (1980 to ~1400 MHz, measured), so a smaller product can run faster; the roof is
            // the best of the two.
            (Backend::Cuda(_), false) => vec![
                json!({"what": "copy", "bytes": 2 * GIB}),
                json!({"what": "fma", "iters": 16384}),
                json!({"what": "tensor", "dtype": "f16", "n": 4096}),
                json!({"what": "tensor", "dtype": "f16", "n": 8192}),
                json!({"what": "tensor", "dtype": "bf16", "n": 4096}),
                json!({"what": "tensor", "dtype": "bf16", "n": 8192}),
                // The tensor cores without cuBLAS's loads: a GEMM of another shape (long K) can
                // beat both squares, never this. 256 rounds ~0.14 ms, 2048 as 8192^3 (sm_90a only).
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "f16", "iters": 256}),
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "f16", "iters": 2048}),
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "bf16", "iters": 256}),
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "bf16", "iters": 2048}),
                // 1024 rounds: ~0.15 ms, as a 4096^3 GEMM; 8192: ~1.1e12 flop, as 8192^3, long
                // enough for the power cap to set the clock.
                // w2: the warp64 GEMM rungs' occupancy, at the same flop per launch.
                json!({"what": "mma_sync", "dtype": "f16", "iters": 1024}),
                json!({"what": "mma_sync", "dtype": "f16", "iters": 8192}),
                json!({"what": "mma_sync", "dtype": "bf16", "iters": 1024}),
                json!({"what": "mma_sync", "dtype": "bf16", "iters": 8192}),
                json!({"what": "mma_sync", "kernel": "w2", "dtype": "f16", "iters": 8192}),
                json!({"what": "mma_sync", "kernel": "w2", "dtype": "bf16", "iters": 8192}),
            ]
            .into_iter()
            .chain(transfer_cases(GIB))
            .chain(sync_cases(1000))
            .collect(),
            (Backend::Cuda(_), true) => vec![
                json!({"what": "copy", "bytes": GIB / 4}),
                json!({"what": "fma", "iters": 2048}),
                json!({"what": "tensor", "dtype": "f16", "n": 4096}),
                json!({"what": "tensor", "dtype": "bf16", "n": 4096}),
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "f16", "iters": 64}),
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "bf16", "iters": 64}),
                json!({"what": "mma_sync", "dtype": "f16", "iters": 256}),
                json!({"what": "mma_sync", "dtype": "bf16", "iters": 256}),
            ]
            .into_iter()
            .chain(transfer_cases(GIB / 4))
            .chain(sync_cases(200))
            .collect(),
            (Backend::Cpu, false) => vec![json!({"what": "copy", "bytes": GIB}), json!({"what": "fma", "iters": 1 << 16})],
            (Backend::Cpu, true) => vec![json!({"what": "copy", "bytes": 32 << 20}), json!({"what": "fma", "iters": 1 << 12})],
        }
    }
    /// Every ceiling kernel at a sliver of its work: the same code per launch, a short launch.
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        match backend {
            Backend::Cpu => self.cases(backend, true),
            Backend::Cuda(_) => vec![
                json!({"what": "copy", "bytes": 1 << 20}),
                json!({"what": "fma", "iters": 16}),
                json!({"what": "tensor", "dtype": "f16", "n": 256}),
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "f16", "iters": 4}),
                json!({"what": "tensor", "kernel": "wgmma", "dtype": "bf16", "iters": 4}),
                json!({"what": "mma_sync", "dtype": "f16", "iters": 8}),
                json!({"what": "mma_sync", "dtype": "bf16", "iters": 8}),
                json!({"what": "mma_sync", "kernel": "w2", "dtype": "f16", "iters": 8}),
            ]
            .into_iter()
            .chain(transfer_cases((1 << 20) + 4 * 999))
            .chain(sync_cases(4))
            .collect(),
        }
    }
    /// The L2 scrub of every timed repetition (`--l2 clean`, the default) runs before the copy.
    fn sanitize_covers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[("copy_float4", "ceilings", "read_scrub")]
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let backend = s.backend.clone();
        match (param_str(case, "what")?, &backend) {
            ("copy", Backend::Cuda(gpu)) => gpu_copy(s, gpu, case),
            ("fma", Backend::Cuda(gpu)) => gpu_fma(s, gpu, case),
            ("tensor", Backend::Cuda(gpu)) => match (DType::parse(param_str(case, "dtype")?)?, case.get("kernel").and_then(Value::as_str)) {
                (DType::F32, _) => Err(LabError::Invalid("tensor ceiling is for f16/bf16".into())),
                (DType::F16, None) => gpu_tensor::<half::f16>(s, gpu, case),
                (DType::Bf16, None) => gpu_tensor::<half::bf16>(s, gpu, case),
                (DType::F16, Some("wgmma")) => gpu_wgmma::<half::f16>(s, gpu, case),
                (DType::Bf16, Some("wgmma")) => gpu_wgmma::<half::bf16>(s, gpu, case),
                (_, Some(other)) => Err(LabError::Invalid(format!("no tensor kernel `{other}` (wgmma)"))),
            },
            ("mma_sync", Backend::Cuda(gpu)) => match DType::parse(param_str(case, "dtype")?)? {
                DType::F16 => gpu_mma_sync::<half::f16>(s, gpu, case),
                DType::Bf16 => gpu_mma_sync::<half::bf16>(s, gpu, case),
                DType::F32 => Err(LabError::Invalid("mma_sync ceiling is for f16/bf16".into())),
            },
            ("h2d" | "d2h", Backend::Cuda(gpu)) => gpu_transfer(s, gpu, case),
            ("sync", Backend::Cuda(gpu)) => sync::gpu_sync(s, gpu, case),
            ("copy", Backend::Cpu) => cpu_copy(s, case),
            ("fma", Backend::Cpu) => cpu_fma(s, case),
            (what, b) => Err(LabError::Invalid(format!("no `{what}` ceiling on the {} backend", b.name()))),
        }
    }
}

/// The ceiling a case measures: `copy_gb_s`, `fma_tflop_s`, `tensor_{dtype}_tflop_s` or
/// `mma_sync_{dtype}_tflop_s`; what each case's record names and what [`raise`] keeps.
fn ceiling_of(case: &Value) -> Result<&'static str> {
    Ok(match (case["what"].as_str(), case["dtype"].as_str()) {
        (Some("copy"), _) => "copy_gb_s",
        (Some("fma"), _) => "fma_tflop_s",
        (Some("tensor"), Some("f16")) => "tensor_f16_tflop_s",
        (Some("tensor"), Some("bf16")) => "tensor_bf16_tflop_s",
        (Some("mma_sync"), Some("f16")) => "mma_sync_f16_tflop_s",
        (Some("mma_sync"), Some("bf16")) => "mma_sync_bf16_tflop_s",
        _ => return transfer_ceiling(case),
    })
}

/// `{h2d,d2h}_{pinned,pageable}_gb_s`: the host-device roofs.
fn transfer_ceiling(case: &Value) -> Result<&'static str> {
    Ok(match (case["what"].as_str(), case["memory"].as_str()) {
        (Some("h2d"), Some("pinned")) => "h2d_pinned_gb_s",
        (Some("h2d"), Some("pageable")) => "h2d_pageable_gb_s",
        (Some("d2h"), Some("pinned")) => "d2h_pinned_gb_s",
        (Some("d2h"), Some("pageable")) => "d2h_pageable_gb_s",
        _ => return Err(LabError::Invalid(format!("no ceiling for the case {case}"))),
    })
}

/// Host <-> device copies of `bytes` each way, from page-locked and from pageable memory.
fn transfer_cases(bytes: usize) -> Vec<Value> {
    ["h2d", "d2h"].iter().flat_map(|w| ["pinned", "pageable"].map(|m| json!({"what": w, "memory": m, "bytes": bytes}))).collect()
}

/// Chains of `steps` grid-wide dependencies, each way of launching them (ceilings/sync.rs).
fn sync_cases(steps: usize) -> Vec<Value> {
    let graphs = ["graph", "graph_pdl"].map(|l| json!({"what": "sync", "launch": l, "steps": steps}));
    let barriers = ["counter", "flags"].map(|b| json!({"what": "sync", "launch": "cooperative", "barrier": b, "steps": steps}));
    // 2 us before the wait and 2 after: ~2.8 us a step if the next kernel's pre work runs beside
    // this one's post work, ~4.9 if not. Clusters or not; blocks sharing an SM with the kernel
    // before or kept off it by shared memory (120 KB: two do not fit); all SMs or the 36 blocks of
    // the engine's attention_o_q4_1 (160 KB as its 172 KB).
    let overlap = [(1, 0, 0), (3, 0, 0), (1, 120 << 10, 0), (3, 120 << 10, 0), (1, 160 << 10, 36), (3, 160 << 10, 36), (3, 0, 36)].map(|(c, smem, blocks)| {
        let mut v = json!({"what": "sync", "launch": "graph_pdl", "steps": steps, "pre_ns": 2000, "post_ns": 2000, "cluster": c, "smem": smem});
        if blocks > 0 {
            v["blocks"] = json!(blocks);
        }
        v
    });
    let full = json!({"what": "sync", "launch": "graph", "steps": steps, "pre_ns": 2000, "post_ns": 2000});
    graphs.into_iter().chain(barriers).chain(overlap).chain([full]).collect()
}

/// Measures one ceiling for a run that has not measured it yet (called by [`Session::ceiling`]).
pub fn measure(s: &mut Session, name: &str) -> Result<()> {
    s.experiment = Ceilings.name();
    let cases: Vec<Value> = Ceilings.cases(&s.backend, s.opts.quick).into_iter().filter(|c| ceiling_of(c).is_ok_and(|n| n == name)).collect();
    if cases.is_empty() {
        return Err(LabError::Invalid(format!("no ceiling named `{name}`")));
    }
    // Every case of this roof: `raise` keeps the best.
    cases.iter().try_for_each(|c| Ceilings.run_case(s, c))
}

/// Keeps the best figure seen for a ceiling, with its own spread (p20 rate over median rate).
fn raise(s: &mut Session, name: &'static str, work: &Work, t: &TimeSummary) {
    let rate = |ms: f64| {
        let tp = work.throughput(ms);
        if name.ends_with("gb_s") { tp.gb_s } else { tp.tflop_s }
    };
    let c = Ceiling { value: rate(t.median), spread: rate(t.p20) / rate(t.median) - 1.0 };
    if s.ceilings.get(name).is_none_or(|old| old.value < c.value) {
        s.ceilings.insert(name, c);
    }
}

fn emit_ceiling(s: &mut Session, case: &Value, mut m: Measurement) -> Result<()> {
    let name = ceiling_of(case)?;
    m.extra.insert("ceiling_name".into(), json!(name));
    let (t, _) = m.time.as_ref().expect("ceilings are timed");
    if m.error.as_ref().is_none_or(|e| e.passed()) {
        let (work, t) = (m.work, t.clone());
        raise(s, name, &work, &t);
    }
    s.emit(m).map(|_| ())
}

/// A non-zero pattern that is cheap to make for gigabytes.
fn pattern(n: usize) -> Vec<u32> {
    (0..n).into_par_iter().map(|i| (i as u32).wrapping_mul(2_654_435_761) | 1).collect()
}

fn gpu_copy(s: &mut Session, gpu: &Gpu, case: &Value) -> Result<()> {
    let n = param_usize(case, "bytes")? / 4;
    let host = pattern(n);
    let src = gpu.upload(&host)?;
    let mut dst = gpu.stream.alloc_zeros::<u32>(n).doing("allocating the copy target")?;
    let work = Work { bytes: 2 * 4 * n as u64, flops: 0 };
    let f = gpu.function(FAMILY, &symbol(FAMILY, "copy_float4", DType::F32))?;
    let cfg = LaunchConfig { grid_dim: (gpu.info.sm_count as u32 * 8, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    for variant in ["memcpy_dtod", "copy_float4"] {
        let provider = if variant == "memcpy_dtod" { "cuda-driver" } else { "lab" };
        if !s.wants(variant, provider) {
            continue;
        }
        let launch = |dst: &mut CudaSlice<u32>| -> Result<()> {
            if variant == "memcpy_dtod" {
                gpu.stream.memcpy_dtod(&src, dst).doing("device-to-device copy")
            } else {
                let n = n as i64;
                // SAFETY: src and dst hold n u32 (= f32-sized) elements; the kernel bounds by n.
                unsafe { gpu.stream.launch_builder(&f).arg(&src).arg(dst).arg(&n).launch(cfg) }
                    .map(|_| ())
                    .doing("launching copy_float4")
            }
        };
        gpu.poison(&mut dst)?;
        launch(&mut dst)?;
        gpu.sync()?;
        let error = compare_bits(&gpu.download(&dst)?, &host, "source");
        let time = time_gpu(gpu, &s.budget, || launch(&mut dst))?;
        let mut m = Measurement::new(variant, provider, case, work);
        (m.time, m.error) = (Some(time), Some(error));
        emit_ceiling(s, case, m)?;
    }
    if s.wants("read_float4", "lab") {
        gpu_read(s, gpu, case, &src, &host, cfg)?;
    }
    Ok(())
}

/// The read stream: every thread's wrapping sum of the words at its grid-stride 16-byte
/// positions, checked exactly against the same sums on the host.
fn gpu_read(s: &mut Session, gpu: &Gpu, case: &Value, src: &CudaSlice<u32>, host: &[u32], cfg: LaunchConfig) -> Result<()> {
    let threads = (cfg.grid_dim.0 * cfg.block_dim.0) as usize;
    if !host.len().is_multiple_of(4) {
        return Err(LabError::Invalid(format!("read_float4 reads 16-byte words: {} bytes is not a multiple of 16", host.len() * 4)));
    }
    let n4 = host.len() / 4;
    let mut sums = gpu.stream.alloc_zeros::<u32>(threads).doing("allocating the per-thread sums")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "read_float4", DType::F32))?;
    let n4_arg = n4 as i64;
    let launch = |sums: &mut CudaSlice<u32>| -> Result<()> {
        // SAFETY: src holds 4 n4 words; sums holds one word per launched thread.
        unsafe { gpu.stream.launch_builder(&f).arg(src).arg(&n4_arg).arg(sums).launch(cfg) }.map(|_| ()).doing("launching read_float4")
    };
    let mut expected = vec![0u32; threads];
    for (i, w) in host.chunks_exact(4).enumerate() {
        let e = &mut expected[i % threads];
        *e = w.iter().fold(*e, |a, &x| a.wrapping_add(x));
    }
    gpu.poison(&mut sums)?;
    launch(&mut sums)?;
    gpu.sync()?;
    let error = compare_bits(&gpu.download(&sums)?, &expected, "host sums");
    let time = time_gpu(gpu, &s.budget, || launch(&mut sums))?;
    let work = Work { bytes: 4 * host.len() as u64 + 4 * threads as u64, flops: 0 };
    let mut m = Measurement::new("read_float4", "lab", case, work);
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

/// One host <-> device copy of `bytes` (driver memcpy on the stream, events around it), from
/// page-locked memory (`cuMemHostAlloc`, not write-combined) or from a plain Vec, which the
/// driver stages through its own pinned buffers. Checked by moving the data back the other way.
fn gpu_transfer(s: &mut Session, gpu: &Gpu, case: &Value) -> Result<()> {
    use cudarc::driver::PinnedHostSlice;
    let (to_device, memory) = (param_str(case, "what")? == "h2d", param_str(case, "memory")?);
    let variant = format!("memcpy_{}_{memory}", if to_device { "htod" } else { "dtoh" });
    if !s.wants(&variant, "cuda-driver") {
        return Ok(());
    }
    let n = param_usize(case, "bytes")? / 4;
    let expected = pattern(n);
    enum Host {
        Pinned(PinnedHostSlice<u32>),
        Pageable(Vec<u32>),
    }
    let mut host = match memory {
        "pinned" => {
            // SAFETY: filled below before any copy reads it.
            let mut p = unsafe { gpu.ctx.alloc_pinned_with_flags::<u32>(n, 0) }.doing("allocating pinned host memory")?;
            p.as_mut_slice().doing("mapping pinned host memory")?.copy_from_slice(&expected);
            Host::Pinned(p)
        }
        "pageable" => Host::Pageable(expected.clone()),
        other => return Err(LabError::Invalid(format!("no host memory `{other}` (pinned | pageable)"))),
    };
    let mut dev = gpu.stream.alloc_zeros::<u32>(n).doing("allocating the transfer buffer")?;
    if !to_device {
        gpu.stream.memcpy_htod(&expected, &mut dev).doing("filling the device side")?;
    }
    let copy = |host: &mut Host, dev: &mut CudaSlice<u32>| -> Result<()> {
        let what = if to_device { "copying host to device" } else { "copying device to host" };
        match (host, to_device) {
            (Host::Pinned(h), true) => gpu.stream.memcpy_htod(&*h, dev).doing(what),
            (Host::Pageable(h), true) => gpu.stream.memcpy_htod(&*h, dev).doing(what),
            (Host::Pinned(h), false) => gpu.stream.memcpy_dtoh(&*dev, h).doing(what),
            (Host::Pageable(h), false) => gpu.stream.memcpy_dtoh(&*dev, h).doing(what),
        }
    };
    // The destination poisoned, one copy, then its bytes against the pattern.
    match (&mut host, to_device) {
        (_, true) => gpu.poison(&mut dev)?,
        (Host::Pinned(h), false) => h.as_mut_slice().doing("mapping pinned host memory")?.fill(u32::MAX),
        (Host::Pageable(h), false) => h.fill(u32::MAX),
    }
    copy(&mut host, &mut dev)?;
    gpu.sync()?;
    let got = match (&host, to_device) {
        (_, true) => gpu.download(&dev)?,
        (Host::Pinned(h), false) => h.as_slice().doing("reading pinned host memory")?.to_vec(),
        (Host::Pageable(h), false) => h.clone(),
    };
    let error = compare_bits(&got, &expected, "source");
    let time = time_gpu(gpu, &s.budget, || copy(&mut host, &mut dev))?;
    let mut m = Measurement::new(variant, "cuda-driver", case, Work { bytes: 4 * n as u64, flops: 0 });
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

/// One FMA chain as the kernel runs it, in f32 with fused multiply-add.
fn fma_chain(seed: f32, iters: usize) -> f32 {
    let mut r: [f32; 8] = std::array::from_fn(|j| seed + j as f32);
    for _ in 0..iters * 4 {
        for x in r.iter_mut() {
            *x = x.mul_add(MUL, ADD);
        }
    }
    r.iter().sum()
}

fn gpu_fma(s: &mut Session, gpu: &Gpu, case: &Value) -> Result<()> {
    if !s.wants("fma", "lab") {
        return Ok(());
    }
    let iters = param_usize(case, "iters")?;
    let threads = gpu.info.sm_count as usize * 2048;
    let seeds: Vec<f32> = (0..threads).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let mut out = gpu.upload(&seeds)?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "fma", DType::F32))?;
    let cfg = LaunchConfig { grid_dim: (threads as u32 / 256, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let it = iters as i32;
    let launch = |out: &mut CudaSlice<f32>| -> Result<()> {
        // SAFETY: out holds one float per launched thread.
        unsafe { gpu.stream.launch_builder(&f).arg(out).arg(&it).arg(&MUL).arg(&ADD).launch(cfg) }
            .map(|_| ())
            .doing("launching fma")
    };
    launch(&mut out)?;
    gpu.sync()?;
    let got = gpu.download(&out)?;
    // Check a sample of threads against the same chain on the host (f32 FMA is exact IEEE).
    let sample: Vec<usize> = (0..threads).step_by(threads / 256).collect();
    let expected: Vec<f64> = sample.par_iter().map(|&i| fma_chain(seeds[i], iters) as f64).collect();
    let got: Vec<f64> = sample.iter().map(|&i| got[i] as f64).collect();
    let error = compare(&got, &expected, Tolerance { atol: 1e-5, rtol: 1e-5 }, "cpu-f32-fma");
    let time = time_gpu(gpu, &s.budget, || launch(&mut out))?;
    let work = Work { bytes: 8 * threads as u64, flops: (threads * iters * 32 * 2) as u64 };
    let mut m = Measurement::new("fma", "lab", case, work);
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

fn gpu_tensor<T: Elem>(s: &mut Session, gpu: &Gpu, case: &Value) -> Result<()>
where
    cudarc::cublas::CudaBlas: cudarc::cublas::Gemm<T>,
{
    use cudarc::cublas::{sys::cublasOperation_t::CUBLAS_OP_N, CudaBlas, Gemm, GemmConfig};
    if !s.wants("gemm", "cublas") {
        return Ok(());
    }
    let n = param_usize(case, "n")?;
    let mut rng = crate::experiment::rng_for(s.opts.seed, case);
    let a: Vec<T> = (0..n * n).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect();
    let b: Vec<T> = (0..n * n).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect();
    let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let mut dc = gpu.stream.alloc_zeros::<T>(n * n).doing("allocating C")?;
    let blas = CudaBlas::new(gpu.stream.clone()).doing("creating the cuBLAS handle")?;
    let ni = n as i32;
    // Row-major C = A B is column-major C^T = B^T A^T: pass B first.
    let cfg = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: ni,
        n: ni,
        k: ni,
        alpha: T::from_f32(1.0),
        lda: ni,
        ldb: ni,
        beta: T::from_f32(0.0),
        ldc: ni,
    };
    let launch = |dc: &mut CudaSlice<T>| -> Result<()> {
        // SAFETY: all three buffers hold n*n elements, matching cfg.
        unsafe { blas.gemm(cfg, &db, &da, dc) }.doing("cuBLAS GEMM")
    };
    gpu.poison(&mut dc)?;
    launch(&mut dc)?;
    gpu.sync()?;
    let c = gpu.download(&dc)?;
    let picks: Vec<(usize, usize)> = (0..64).map(|_| (rng.random_range(0..n), rng.random_range(0..n))).collect();
    let expected: Vec<f64> = picks
        .iter()
        .map(|&(i, j)| (0..n).map(|k| a[i * n + k].to_f64() * b[k * n + j].to_f64()).sum())
        .collect();
    let got: Vec<f64> = picks.iter().map(|&(i, j)| c[i * n + j].to_f64()).collect();
    let error = compare(&got, &expected, Tolerance { atol: 5e-2, rtol: 1e-2 }, "cpu-f64-sampled");
    let time = time_gpu(gpu, &s.budget, || launch(&mut dc))?;
    let work = Work { bytes: 3 * (n * n * T::DTYPE.size()) as u64, flops: 2 * (n as u64).pow(3) };
    let mut m = Measurement::new("gemm", "cublas", case, work);
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

/// The wgmma roof (sm_90a): one block of two warpgroups per SM, each running `iters` rounds of
/// the four m64n256k16 of a 64-deep slab on a 128 x 64 A and a 64 x 256 B tile of random values
/// that stay in shared memory (kernels/ceilings.cu). Every thread's accumulator sum is checked,
/// and block 0's accumulators one by one, against `iters` times the f64 tile product.
fn gpu_wgmma<T: Elem>(s: &mut Session, gpu: &Gpu, case: &Value) -> Result<()> {
    // wgmma exists on compute capability 9.0 alone (as gemm's sm_90a rungs): elsewhere the
    // tensor roof is cuBLAS's.
    if gpu.arch != 90 || !s.wants("wgmma", "lab") {
        return Ok(());
    }
    let iters = param_usize(case, "iters")?;
    let mut rng = crate::experiment::rng_for(s.opts.seed, case);
    let a: Vec<T> = (0..128 * 64).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect();
    let b: Vec<T> = (0..64 * 256).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect();
    let product: Vec<f64> = (0..128 * 256).map(|e| (0..64).map(|k| a[(e / 256) * 64 + k].to_f64() * b[k * 256 + e % 256].to_f64()).sum()).collect();
    // Accumulator i of thread t (warpgroup t / 128, warp (t / 32) % 4, lane t % 32) is output
    // (row, col) of the m64nNk16 layout (kernels/gemm/wgmma.cu, wgmma_tma's store).
    let at = |t: usize, i: usize| {
        let (w, l, j, h) = (t / 32, t % 32, i / 4, i % 4);
        let row = 16 * w + l / 4 + 8 * (h / 2);
        product[row * 256 + 8 * j + 2 * (l % 4) + h % 2]
    };
    let blocks = gpu.info.sm_count as usize;
    let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let mut sums = gpu.stream.alloc_zeros::<f32>(blocks * 256).doing("allocating the accumulator sums")?;
    let mut tile0 = gpu.stream.alloc_zeros::<f32>(256 * 128).doing("allocating block 0's accumulators")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "wgmma", T::DTYPE))?;
    let smem = crate::ops::gemm::wg::WIDE.stage_bytes() + 1024;  // one wgmma_tma stage, 1024-aligned
    crate::ops::gemm::raise_dynamic_smem(&f, smem)?;
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: smem as u32 };
    let it = iters as i32;
    let launch = |sums: &mut CudaSlice<f32>, tile0: &mut CudaSlice<f32>| -> Result<()> {
        // SAFETY: a and b hold the 128 x 64 and 64 x 256 tiles (read as 16-byte chunks); sums one
        // float per launched thread, tile0 128 per thread of block 0; smem is what the kernel checks.
        unsafe { gpu.stream.launch_builder(&f).arg(&da).arg(&db).arg(sums).arg(tile0).arg(&it).launch(cfg) }
            .map(|_| ())
            .doing("launching the wgmma roof")
    };
    gpu.poison(&mut sums)?;
    gpu.poison(&mut tile0)?;
    launch(&mut sums, &mut tile0)?;
    gpu.sync()?;
    // Per round, as the mma.sync roof is compared: values O(1) whatever `iters`.
    let per_round = |v: &f32| *v as f64 / iters as f64;
    let mut got: Vec<f64> = gpu.download(&tile0)?.iter().map(per_round).collect();
    let mut expected: Vec<f64> = (0..256 * 128).map(|e| at(e % 256, e / 256)).collect();
    got.extend(gpu.download(&sums)?.iter().map(per_round));
    expected.extend((0..blocks * 256).map(|t| (0..128).map(|i| at(t % 256, i)).sum::<f64>()));
    let error = compare(&got, &expected, Tolerance { atol: 1e-2, rtol: 1e-2 }, "cpu-f64-per-round");
    let time = time_gpu(gpu, &s.budget, || launch(&mut sums, &mut tile0))?;
    let work = Work { bytes: (4 * (blocks * 256 + 256 * 128)) as u64, flops: (blocks * 2 * iters * 4 * 2 * 64 * 256 * 16) as u64 };
    let mut m = Measurement::new("wgmma", "lab", case, work);
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

/// The mma.sync roof: every thread runs `iters` rounds of one HMMA per accumulator on the same
/// random A0, A1 (16 x 16) and B0, B1 (16 x 8) fragments (kernels/ceilings.cu): `mma_sync`, 8
/// accumulators at 4 blocks of 256 per SM; `mma_sync_w2` (case `"kernel": "w2"`), 32 at one.
/// Every C fragment is checked: the accumulators hold each product A_s B_r equally often.
fn gpu_mma_sync<T: Elem>(s: &mut Session, gpu: &Gpu, case: &Value) -> Result<()> {
    let (variant, chains, blocks_per_sm) = match case.get("kernel").and_then(Value::as_str) {
        None => ("mma_sync", 8, 4),
        Some("w2") => ("mma_sync_w2", 32, 1),
        Some(other) => return Err(LabError::Invalid(format!("no mma_sync kernel `{other}` (w2)"))),
    };
    if !s.wants(variant, "lab") {
        return Ok(());
    }
    let iters = param_usize(case, "iters")?;
    let mut rng = crate::experiment::rng_for(s.opts.seed, case);
    let mut random = |n: usize| -> Vec<T> { (0..n).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect() };
    let (a, b): ([Vec<T>; 2], [Vec<T>; 2]) = ([random(256), random(256)], [random(128), random(128)]);
    // Fragment registers (m16n8k16 layouts, kernels/gemm/mma_sync.cu), g = lane / 4, t = lane % 4.
    let pair = |x: T, y: T| u32::from_le_bytes(T::bytes(&[x, y]).try_into().expect("two 16-bit values"));
    let mut frags = vec![0u32; 12 * 32];
    for lane in 0..32 {
        let (g, t) = (lane / 4, 2 * (lane % 4));
        for m in 0..2 {
            let at = |r: usize, c: usize| pair(a[m][16 * r + c], a[m][16 * r + c + 1]);
            let bt = |k: usize| pair(b[m][8 * k + g], b[m][8 * (k + 1) + g]);
            for (i, w) in [at(g, t), at(g + 8, t), at(g, t + 8), at(g + 8, t + 8)].into_iter().enumerate() {
                frags[(4 * m + i) * 32 + lane] = w;
            }
            frags[(8 + 2 * m) * 32 + lane] = bt(t);
            frags[(9 + 2 * m) * 32 + lane] = bt(t + 8);
        }
    }
    // Each (A_s, B_r) pair feeds chains / 4 accumulators once per round: the summed C tile is
    // `products` times (A0 + A1)(B0 + B1).
    let products = (iters * chains / 4) as f64;
    let per_product: Vec<f64> = (0..128)
        .map(|e| {
            let (r, n) = (e / 8, e % 8);
            let a_sum = |k: usize| a[0][16 * r + k].to_f64() + a[1][16 * r + k].to_f64();
            let b_sum = |k: usize| b[0][8 * k + n].to_f64() + b[1][8 * k + n].to_f64();
            (0..16).map(|k| a_sum(k) * b_sum(k)).sum::<f64>()
        })
        .collect();
    let threads = blocks_per_sm * 256 * gpu.info.sm_count as usize;
    let dfrags = gpu.upload(&frags)?;
    let mut out = gpu.stream.alloc_zeros::<f32>(4 * threads).doing("allocating the C fragments")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, variant, T::DTYPE))?;
    let cfg = LaunchConfig { grid_dim: (threads as u32 / 256, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let it = iters as i32;
    let launch = |out: &mut CudaSlice<f32>| -> Result<()> {
        // SAFETY: frags holds 12 x 32 words; out 4 floats per launched thread.
        unsafe { gpu.stream.launch_builder(&f).arg(&dfrags).arg(out).arg(&it).launch(cfg) }.map(|_| ()).doing("launching mma_sync")
    };
    gpu.poison(&mut out)?;
    launch(&mut out)?;
    gpu.sync()?;
    // Compared per product, where values are O(1): fp32 accumulation of n equal terms drifts by
    // ~n/2 x 2^-24 of one term per accumulator.
    let got: Vec<f64> = gpu.download(&out)?.iter().map(|&v| v as f64 / products).collect();
    let expected: Vec<f64> = (0..4 * threads)
        .map(|j| {
            let (lane, i) = ((j / 4) % 32, j % 4);
            per_product[8 * (lane / 4 + 8 * (i / 2)) + 2 * (lane % 4) + i % 2]
        })
        .collect();
    let error = compare(&got, &expected, Tolerance { atol: 1e-2, rtol: 1e-2 }, "cpu-f64-per-product");
    let time = time_gpu(gpu, &s.budget, || launch(&mut out))?;
    let work = Work { bytes: (4 * frags.len() + 16 * threads) as u64, flops: (threads * iters * chains * 4096 / 32) as u64 };
    let mut m = Measurement::new(variant, "lab", case, work);
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

fn cpu_copy(s: &mut Session, case: &Value) -> Result<()> {
    if !s.wants("parallel_copy", "lab") {
        return Ok(());
    }
    let n = param_usize(case, "bytes")? / 4;
    let src = pattern(n);
    let mut dst = vec![0u32; n];
    let chunk = (n / rayon::current_num_threads()).max(1 << 16);
    let time = cpu_time(&s.budget, || {
        dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
    });
    let error = compare_bits(&dst, &src, "source");
    let mut m = Measurement::new("parallel_copy", "lab", case, Work { bytes: 8 * n as u64, flops: 0 });
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

fn cpu_fma(s: &mut Session, case: &Value) -> Result<()> {
    if !s.wants("fma", "lab") {
        return Ok(());
    }
    let iters = param_usize(case, "iters")?;
    let tasks = rayon::current_num_threads() * 4;
    // 8 lanes x 4 independent chains per task: wide enough to vectorise and hide latency.
    let body = |t: usize| -> f32 {
        let mut r = [[t as f32 * 1e-3; 8]; 4];
        for _ in 0..iters {
            for chain in r.iter_mut() {
                for x in chain.iter_mut() {
                    *x = *x * MUL + ADD;
                }
            }
        }
        r.iter().flatten().sum()
    };
    let mut sums = vec![0f32; tasks];
    let time = cpu_time(&s.budget, || {
        sums.par_iter_mut().enumerate().for_each(|(t, out)| *out = std::hint::black_box(body(t)));
    });
    // The same recurrence in f64: the f32 result must stay within rounding of it.
    let expected: Vec<f64> = (0..tasks)
        .map(|t| {
            let mut x = t as f64 * 1e-3_f32 as f64;
            for _ in 0..iters {
                x = x * MUL as f64 + ADD as f64;
            }
            32.0 * x
        })
        .collect();
    let got: Vec<f64> = sums.iter().map(|&x| x as f64).collect();
    let error = compare(&got, &expected, Tolerance { atol: 1e-3, rtol: 1e-3 }, "cpu-f64");
    let work = Work { bytes: 0, flops: (tasks * iters * 32 * 2) as u64 };
    let mut m = Measurement::new("fma", "lab", case, work);
    (m.time, m.error) = (Some(time), Some(error));
    emit_ceiling(s, case, m)
}

/// The kernels and host loops that measure the device: a table for listings, not ops (the
/// ceilings are what the ops are fractions of). Peers beside them: memcpy_dtod (the driver) and
/// cuBLAS's GEMM.
pub const VARIANTS: &[Variant<()>] = &[
    Variant { name: "copy_float4", dtypes: &[DType::F32], requires: Requires::Gpu, what: "a grid-stride 16 B copy: the bandwidth roof (with read_float4)", config: () },
    Variant { name: "read_float4", dtypes: &[DType::F32], requires: Requires::Gpu, what: "a grid-stride 16 B read stream: the bandwidth roof for read-heavy kernels", config: () },
    Variant { name: "fma", dtypes: &[DType::F32], requires: Requires::Gpu, what: "8 independent FMA chains per thread: the FP32 roof (on the CPU backend: every core)", config: () },
    Variant { name: "mma_sync", dtypes: &[DType::F16, DType::Bf16], requires: Requires::Gpu, what: "mma.sync m16n8k16 from registers, eight accumulators per warp: the roof of the mma.sync GEMM rungs", config: () },
    Variant { name: "mma_sync_w2", dtypes: &[DType::F16, DType::Bf16], requires: Requires::Gpu, what: "mma_sync at the mma_warp64 rungs' occupancy (8 warps per SM, 32 accumulators per warp)", config: () },
    Variant { name: "wgmma", dtypes: &[DType::F16, DType::Bf16], requires: Requires::Sm90a, what: "two warpgroups per SM issuing m64n256k16 from shared memory: the tensor roof without a GEMM's copies", config: () },
    Variant { name: "sync_step", dtypes: &[DType::F32], requires: Requires::Gpu, what: "one step of a chain of grid-wide dependencies per kernel, in a captured graph (edges full, or programmatic on sm_90): the latency a kernel boundary costs", config: () },
    Variant { name: "sync_step_cluster", dtypes: &[DType::F32], requires: Requires::Sm90, what: "sync_step in clusters of three blocks: whether a cluster kernel launches while the kernel before it runs", config: () },
    Variant { name: "sync_persistent", dtypes: &[DType::F32], requires: Requires::Gpu, what: "the same chain in one cooperative kernel, a grid barrier between steps: what a persistent kernel pays per dependency instead", config: () },
    Variant { name: "read_scrub", dtypes: &[DType::F32], requires: Requires::Gpu, what: "not a ceiling: reads a buffer twice the L2 size before a timed repetition (`--l2 clean`)", config: () },
    Variant { name: "parallel_copy", dtypes: &[DType::F32], requires: Requires::Cpu, what: "a memcpy split over every core: the host's bandwidth roof", config: () },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_case_names_a_ceiling_the_lab_reads() {
        let names: std::collections::BTreeSet<&str> = Ceilings.cases(&Backend::Cpu, false).iter().map(|c| ceiling_of(c).unwrap()).collect();
        assert_eq!(names, ["copy_gb_s", "fma_tflop_s"].into());
        let gpu = [json!({"what": "copy", "bytes": 1}), json!({"what": "fma", "iters": 1}), json!({"what": "tensor", "dtype": "f16"}), json!({"what": "mma_sync", "dtype": "bf16"})];
        let names: Vec<&str> = gpu.iter().map(|c| ceiling_of(c).unwrap()).collect();
        assert_eq!(names, ["copy_gb_s", "fma_tflop_s", "tensor_f16_tflop_s", "mma_sync_bf16_tflop_s"]);
        assert!(ceiling_of(&json!({"what": "tensor", "dtype": "f32"})).is_err());
        // The wgmma loop raises the same tensor roof as cuBLAS, for its dtype.
        assert_eq!(ceiling_of(&json!({"what": "tensor", "kernel": "wgmma", "dtype": "bf16"})).unwrap(), "tensor_bf16_tflop_s");
        let transfers: Vec<&str> = transfer_cases(4).iter().map(|c| ceiling_of(c).unwrap()).collect();
        assert_eq!(transfers, ["h2d_pinned_gb_s", "h2d_pageable_gb_s", "d2h_pinned_gb_s", "d2h_pageable_gb_s"]);
        assert!(ceiling_of(&json!({"what": "h2d", "memory": "managed"})).is_err());
    }
}
