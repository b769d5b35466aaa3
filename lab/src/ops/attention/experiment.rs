//! The attention experiment: the forward's cases (odd-shape gates, FlashAttention 3's sweep,
//! model shapes) beside torch SDPA, the backward's and decode's cases from their own modules,
//! and single launches for `--ncu`.

use super::backward_check;
use super::decode_check;
use super::varlen;
use super::{check_rows, forward_with, input, launch_tiled, refusal, Attention, Dims, Elem, Expected, Kernel, Mask, FAMILY, VARIANTS};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Measurement, Peer, Session};
use crate::kernels::{symbol, DType};
use crate::ops::compare::compare_elems;
use crate::ops::variant::{self, Variant};
use crate::ops::{measure_op_with, measure_torch, Check};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::tensor::Tensor;
use crate::{LabError, Result};
use rand::Rng;
use serde_json::{json, Value};

impl Experiment for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }
    fn description(&self) -> &'static str {
        "attention forward and backward, f16/bf16, causal or not, MHA/GQA/MQA, head dims 64 and 128: naive (scores in memory), FlashAttention 2 on mma.sync and wgmma rungs on Hopper, beside torch SDPA's backends; decode over a paged cache against the copy ceiling"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["batch=4 seq=4096 hq=16 d=128 causal=false", "batch=4 seq=4096 hq=16 d=128 causal=true"]
    }
    fn sweep_axis(&self) -> &'static str {
        "seq"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let checks: &[CaseShape] = match (backend, quick) {
            (Backend::Cpu, true) => &[(1, 1, 1, 2, 1, 64, true, 0, "normal"), (2, 17, 5, 3, 1, 64, true, 0, "normal"), (1, 33, 33, 4, 2, 128, false, 7, "large")],
            _ => &[
                (1, 1, 1, 4, 4, 64, true, 0, "normal"),
                (2, 17, 5, 9, 3, 64, true, 0, "normal"),
                (1, 1000, 1000, 9, 3, 64, true, 0, "normal"),
                (1, 4097, 4097, 4, 1, 128, false, 0, "normal"),
                (2, 17, 1000, 8, 8, 128, true, 0, "normal"),
                (1, 1000, 1000, 4, 2, 64, true, 128, "normal"),
                (1, 333, 333, 2, 2, 128, false, 0, "large"),
                (3, 129, 257, 6, 2, 128, false, 0, "normal"),
            ],
        };
        let timed: Vec<CaseShape> = match (backend, quick) {
            (Backend::Cuda(_), false) => {
                let mut t = vec![(4, 4096, 4096, 16, 16, 128, false, 0, "normal"), (4, 4096, 4096, 16, 16, 128, true, 0, "normal")];
                // FlashAttention 3's sweep: 16k tokens, hidden 2048 (D 128 with 16 heads, D 64 with 32).
                for s in [512, 1024, 2048, 4096, 8192, 16384] {
                    for causal in [false, true] {
                        t.push((16384 / s, s, s, 16, 16, 128, causal, 0, "normal"));
                        t.push((16384 / s, s, s, 32, 32, 64, causal, 0, "normal"));
                    }
                }
                t.push((1, 2048, 2048, 9, 3, 64, true, 0, "normal")); // SmolLM2-135M prefill
                t.push((1, 4096, 4096, 32, 8, 128, true, 0, "normal")); // Llama-3-8B prefill
                t
            }
            (Backend::Cuda(_), true) => vec![(2, 1024, 1024, 16, 16, 128, true, 0, "normal"), (1, 2048, 2048, 9, 3, 64, true, 0, "normal")],
            (Backend::Cpu, false) => vec![(1, 256, 256, 9, 3, 64, true, 0, "normal")],
            (Backend::Cpu, true) => vec![(1, 64, 64, 2, 1, 64, true, 0, "normal")],
        };
        let mut out: Vec<Value> = ["bf16", "f16"].iter().flat_map(|dt| checks.iter().map(move |c| case_json(c, dt, false))).collect();
        out.extend(timed.iter().map(|c| case_json(c, "bf16", true)));
        if let (Backend::Cuda(_), false) = (backend, quick) {
            out.push(case_json(&timed[0], "f16", true));
        }
        out.extend(backward_check::cases(backend, quick));
        out.extend(decode_check::cases(backend, quick));
        out.extend(varlen::cases(backend, quick));
        out
    }
    /// The forward's quick gates, and small odd backward, decode and packed shapes (the backward's
    /// quick gates reach 4097 tokens, too long for racecheck).
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        let mut out = crate::experiment::quick_gates(self, backend);
        out.retain(|c| c.get("pass").is_none());
        out.extend(backward_check::sanitize_cases());
        out.extend(decode_check::sanitize_cases());
        out.extend(varlen::cases(&Backend::Cpu, true));
        out
    }
    /// Forward cases of the tiled rungs only (what `--ncu` profiles).
    fn launch_once(&self, gpu: &crate::gpu::Gpu, case: &Value, variant: &str, seed: u64) -> Result<()> {
        let var = variant::find(FAMILY, VARIANTS, variant)?;
        if case.get("pass").is_some_and(|p| p != "forward") || !matches!(var.config, Kernel::Fa2 { .. } | Kernel::Wgmma { .. }) {
            return Err(LabError::Invalid(format!("attention launches once only forward cases of the tiled rungs, not `{variant}` on {case}")));
        }
        match DType::parse(param_str(case, "dtype")?)? {
            DType::Bf16 => launch_once_as::<half::bf16>(gpu, case, var, seed),
            DType::F16 => launch_once_as::<half::f16>(gpu, case, var, seed),
            DType::F32 => Err(LabError::Invalid("attention runs in f16 and bf16".into())),
        }
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let backward = match case.get("pass").and_then(Value::as_str) {
            None | Some("forward") => false,
            Some("backward") => true,
            Some("decode") => {
                return match DType::parse(param_str(case, "dtype")?)? {
                    DType::Bf16 => decode_check::run::<half::bf16>(s, case),
                    DType::F16 => decode_check::run::<half::f16>(s, case),
                    DType::F32 => Err(LabError::Invalid("attention runs in f16 and bf16".into())),
                }
            }
            Some(pass @ ("varlen" | "varlen_backward")) => {
                return match (DType::parse(param_str(case, "dtype")?)?, pass == "varlen") {
                    (DType::Bf16, true) => varlen::run::<half::bf16>(s, case),
                    (DType::F16, true) => varlen::run::<half::f16>(s, case),
                    (DType::Bf16, false) => varlen::run_backward::<half::bf16>(s, case),
                    (DType::F16, false) => varlen::run_backward::<half::f16>(s, case),
                    (DType::F32, _) => Err(LabError::Invalid("attention runs in f16 and bf16".into())),
                }
            }
            Some(other) => return Err(LabError::Invalid(format!("unknown attention pass `{other}` (forward, backward, decode, varlen, varlen_backward)"))),
        };
        match (DType::parse(param_str(case, "dtype")?)?, backward) {
            (DType::Bf16, false) => run::<half::bf16>(s, case),
            (DType::F16, false) => run::<half::f16>(s, case),
            (DType::Bf16, true) => backward_check::run::<half::bf16>(s, case),
            (DType::F16, true) => backward_check::run::<half::f16>(s, case),
            (DType::F32, _) => Err(LabError::Invalid("attention runs in f16 and bf16".into())),
        }
    }
}

pub(super) fn case_dims(case: &Value) -> Result<(Dims, Mask)> {
    let seq = |k: &str| case.get(k).map_or_else(|| param_usize(case, "seq"), |_| param_usize(case, k));
    let d = Dims { batch: param_usize(case, "batch")?, sq: seq("sq")?, sk: seq("sk")?, hq: param_usize(case, "hq")?, hkv: param_usize(case, "hkv")?, d: param_usize(case, "d")? };
    let causal = case.get("causal").and_then(Value::as_bool).unwrap_or(false);
    let window = case.get("window").map_or(Ok(0), |_| param_usize(case, "window"))?;
    Ok((d, Mask { causal, window }))
}

/// A forward case's Q, K and V, drawn from the case's seed (the rng goes on to pick the checked rows).
fn case_inputs<T: Elem>(d: Dims, case: &Value, rng: &mut impl Rng) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let qscale = match case.get("fill").and_then(Value::as_str).unwrap_or("normal") {
        "normal" => 1.0,
        "large" => 100.0,
        other => return Err(LabError::Invalid(format!("unknown attention fill `{other}` (normal, large)"))),
    };
    let (qn, kn) = (d.batch * d.sq * d.hq * d.d, d.batch * d.sk * d.hkv * d.d);
    Ok((input(qn, qscale, rng), input(kn, 1.0, rng), input(kn, 1.0, rng)))
}

/// Nsight Compute's view of a tiled rung's kernel: time, tensor-pipe and SM throughput, warps
/// resident, instructions.
const NCU_METRICS: &[&str] = &[
    "gpu__time_duration.sum",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
];

/// One forward launch of a tiled rung on a case's inputs, for `lab launch-once` under a profiler.
fn launch_once_as<T: Elem>(gpu: &crate::gpu::Gpu, case: &Value, var: &'static Variant<Kernel>, seed: u64) -> Result<()> {
    let (d, mask) = case_dims(case)?;
    let (q, k, v) = case_inputs::<T>(d, case, &mut rng_for(seed, case))?;
    let (dq, dk, dv) = (gpu.upload(&q)?, gpu.upload(&k)?, gpu.upload(&v)?);
    let mut o = gpu.stream.alloc_zeros::<T>(q.len()).doing("allocating the attention output")?;
    let mut lse = gpu.stream.alloc_zeros::<f32>(d.batch * d.hq * d.sq).doing("allocating the attention lse")?;
    launch_tiled(gpu, var, d, mask, (&dq.as_view(), &dk.as_view(), &dv.as_view()), &mut o.as_view_mut(), &mut lse.as_view_mut(), None)?;
    gpu.sync()
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let (d, mask) = case_dims(case)?;
    let timed = param_timed(case);
    let mut rng = rng_for(s.opts.seed, case);
    let (q, k, v) = case_inputs::<T>(d, case, &mut rng)?;
    let expected = Expected::new(d, mask, &q, &k, &v, check_rows(d, &mut rng));
    let work = d.work(mask, T::DTYPE.size());
    let compare_o = |o: &[T]| compare_elems(&expected.gather(d, o), &expected.o, expected.tol, "cpu-f64 (sampled rows)");
    let ceiling = crate::ops::product_ceiling(&s.backend, T::DTYPE);
    let check = Check { tol: expected.tol, compare: &compare_o, ceiling };
    let dev = s.backend.clone();
    let qt = Tensor::from_slice(&dev, &[d.batch, d.sq, d.hq, d.d], &q)?;
    let kt = Tensor::from_slice(&dev, &[d.batch, d.sk, d.hkv, d.d], &k)?;
    let vt = Tensor::from_slice(&dev, &[d.batch, d.sk, d.hkv, d.d], &v)?;
    let mut o = Tensor::<T>::zeros(&dev, &[d.batch, d.sq, d.hq, d.d])?;
    let lse = std::cell::RefCell::new(Tensor::<f32>::zeros(&dev, &[d.batch, d.hq, d.sq])?);
    for var in VARIANTS {
        if !var.requires.met_by(&dev) || refusal(var, d).is_some() || !s.wants(var.name, "lab") {
            continue;
        }
        // Under --ncu, each timed tiled rung's kernel profiled once; an ncu that fails is said in
        // the record rather than ending the run.
        let mut extra = serde_json::Map::new();
        if s.opts.ncu && timed && matches!((&dev, var.config), (Backend::Cuda(_), Kernel::Fa2 { .. } | Kernel::Wgmma { .. })) {
            let kernel = symbol(FAMILY, &format!("{}_d{}", var.name, d.d), T::DTYPE);
            match crate::profile::ncu::measure(&kernel, FAMILY, case, var.name, s.opts.seed, NCU_METRICS) {
                Ok(m) => extra.insert("ncu".into(), json!(m)),
                Err(e) => extra.insert("ncu_error".into(), json!(e.to_string())),
            };
        }
        measure_op_with(s, case, var.name, work, &check, timed, &mut o, extra, |o| forward_with(&dev, var.name, &qt, &kt, &vt, mask, o, &mut lse.borrow_mut()))?;
        // The log-sum-exp the backward will read, checked once per variant (untimed).
        let got = expected.gather_lse(d, &lse.borrow().to_vec()?);
        let mut m = Measurement::new(var.name, "lab", &lse_case(case), Work { bytes: 0, flops: 0 });
        let tol = Tolerance { atol: 1e-3, rtol: 1e-4 };
        m.error = Some(compare_elems(&got, &expected.lse, tol, "cpu-f64 (sampled rows)"));
        m.tolerance = Some(tol);
        s.emit(m)?;
    }
    // torch SDPA aligns a causal mask top-left and has no window: peers only where that agrees.
    if let Backend::Cuda(gpu) = &dev {
        if timed && d.sq == d.sk && mask.window == 0 {
            let (qb, kb, vb) = (T::bytes(&q), T::bytes(&k), T::bytes(&v));
            let (qs, ks) = ([d.batch, d.sq, d.hq, d.d], [d.batch, d.sk, d.hkv, d.d]);
            // Every backend at the headline shape; elsewhere the two fastest (each peer call is a
            // Python process of a few seconds).
            let headline = (d.batch, d.sq, d.hq, d.d) == (4, 4096, 16, 128);
            let backends: &[&str] = if headline { &["flash", "cudnn", "efficient", "math"] } else { &["flash", "cudnn"] };
            for backend in backends {
                let name = format!("torch sdpa ({backend})");
                if !s.wants_peer(Peer::Torch, &name, "torch") {
                    continue;
                }
                let args = json!({"backend": backend, "causal": mask.causal});
                // A backend that does not take the shape is said, not fatal: the others still run.
                if let Err(e) = measure_torch(s, gpu, case, "sdpa", args, &[(&qb, &qs), (&kb, &ks), (&vb, &ks)], work, &check) {
                    eprintln!("attention: {name} did not run on {case}: {e}");
                }
            }
        }
    }
    Ok(())
}

/// The parameters of a case's lse check: the case's, naming the output, untimed.
/// A case's shape: (batch, sq, sk, hq, hkv, d, causal, window, fill).
pub(super) type CaseShape = (usize, usize, usize, usize, usize, usize, bool, usize, &'static str);

/// A case as records hold it: `seq` when sq = sk, a window and a fill only where they apply.
pub(super) fn case_json(c: &CaseShape, dtype: &str, timed: bool) -> Value {
    let &(b, sq, sk, hq, hkv, d, causal, window, fill) = c;
    let mut v = json!({"batch": b, "hq": hq, "hkv": hkv, "d": d, "causal": causal, "dtype": dtype, "timed": timed});
    if sq == sk {
        v["seq"] = json!(sq);
    } else {
        (v["sq"], v["sk"]) = (json!(sq), json!(sk));
    }
    if window > 0 {
        v["window"] = json!(window);
    }
    if fill != "normal" {
        v["fill"] = json!(fill);
    }
    v
}

pub(super) fn lse_case(case: &Value) -> Value {
    let mut c = case.clone();
    (c["output"], c["timed"]) = (json!("lse"), json!(false));
    c
}
