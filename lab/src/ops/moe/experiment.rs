//! The `moe` sweep: odd shapes and skewed loads as untimed gates, then Mixtral 8x7B's and
//! Qwen3-30B-A3B's layers over token counts, beside torch's per-expert loop, torch._grouped_mm
//! and a dense GEMM of the same flops, in the same run on the same inputs.

use super::reference::{self, LayerRef};
use super::{backward_reference, forward_with, router_logits, Capacity, Router, Scoring, Upstream, Weights, VARIANTS};
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Measurement, Peer, Session};
use crate::kernels::DType;
use crate::ops::compare::{compare_product, compare_within, ProductBound};
use crate::ops::{measure_op_with, measure_torch, widen, Check, Elem};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::tensor::Tensor;
use crate::{LabError, Result};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Moe;

/// (tokens, hidden, inter, experts, k, load, scoring, renorm, capacity, noisy)
type C = (usize, usize, usize, usize, usize, &'static str, &'static str, bool, &'static str, bool);

/// Layers checked in full up to this many multiply-adds of the reference; else sampled tokens.
const FULL_CHECK_MACS: usize = 1 << 27;
/// Tokens checked beyond that (plus the first and the last).
const SAMPLED_TOKENS: usize = 24;
/// Rows of the dense peer's product that come back and are checked.
const DENSE_ROWS: usize = 8;

const MIXTRAL: (usize, usize, usize, usize) = (4096, 14336, 8, 2);
const QWEN3: (usize, usize, usize, usize) = (2048, 768, 128, 8);
/// DeepSeek-V3's expert shape (hidden 7168, expert 2048, sigmoid scores) on 64 of its 256
/// experts with top-2 of them: each expert sees T k / E = T / 32 rows, as in the full layer
/// (top-8 of 256), on a quarter of its weights (5.6 GB in bf16).
const DEEPSEEK_SLICE: (usize, usize, usize, usize) = (7168, 2048, 64, 2);

fn case(c: &C, dtype: &str, timed: bool) -> Value {
    let (tokens, hidden, inter, experts, k, load, scoring, renorm, capacity, noisy) = *c;
    json!({"tokens": tokens, "hidden": hidden, "inter": inter, "experts": experts, "k": k, "load": load,
           "scoring": scoring, "renorm": renorm, "capacity": capacity, "noisy": noisy, "dtype": dtype, "timed": timed})
}

impl Experiment for Moe {
    fn name(&self) -> &'static str {
        "moe"
    }
    fn description(&self) -> &'static str {
        "Mixture-of-Experts SwiGLU layer (router, capacity, permutation, grouped GEMM, combine): one cuBLAS GEMM per expert against one grouped mma.sync launch, beside torch's loop, torch._grouped_mm and a dense GEMM of the same flops"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["experts=8 k=2 hidden=4096 tokens=4096 load=uniform", "experts=128 k=8 hidden=2048 tokens=4096 load=uniform"]
    }
    fn sweep_axis(&self) -> &'static str {
        "tokens"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let gates: &[C] = &[
            (1, 64, 32, 4, 2, "uniform", "softmax", true, "dropless", false),
            (3, 72, 40, 8, 2, "one", "softmax", true, "dropless", false),
            (1000, 64, 48, 16, 4, "zipf", "sigmoid", false, "1.0", false),
            (77, 40, 24, 8, 1, "uniform", "softmax", false, "1.25", true),
            (129, 136, 200, 128, 8, "uniform", "softmax", true, "dropless", false),
            (33, 64, 64, 256, 8, "zipf", "softmax", true, "dropless", false),
        ];
        let timed: Vec<C> = match (backend, quick) {
            (Backend::Cpu, true) => vec![(64, 128, 64, 8, 2, "uniform", "softmax", true, "dropless", false)],
            (Backend::Cpu, false) => vec![(256, 512, 256, 8, 2, "uniform", "softmax", true, "dropless", false)],
            (Backend::Cuda(_), true) => vec![
                (256, 1024, 1024, 8, 2, "uniform", "softmax", true, "dropless", false),
                (512, 512, 256, 32, 4, "zipf", "softmax", true, "dropless", false),
            ],
            (Backend::Cuda(_), false) => {
                let mut t = Vec::new();
                for (h, i, e, k) in [MIXTRAL, QWEN3] {
                    for tokens in [1, 16, 128, 512, 2048, 4096, 8192, 32768] {
                        t.push((tokens, h, i, e, k, "uniform", "softmax", true, "dropless", false));
                    }
                    for load in ["zipf", "one"] {
                        t.push((4096, h, i, e, k, load, "softmax", true, "dropless", false));
                    }
                }
                let (h, i, e, k) = DEEPSEEK_SLICE;
                for tokens in [1, 16, 512, 4096, 8192] {
                    t.push((tokens, h, i, e, k, "uniform", "sigmoid", true, "dropless", false));
                }
                t
            }
        };
        let dtypes: &[&str] = if quick { &["bf16"] } else { &["bf16", "f16"] };
        let mut out: Vec<Value> = dtypes.iter().flat_map(|dt| gates.iter().map(move |c| case(c, dt, false))).collect();
        out.extend(timed.iter().map(|c| case(c, "bf16", true)));
        out
    }
    /// The quick gates (bf16) and one in f16, so that every kernel symbol launches under the
    /// sanitizer: at most 1000 tokens and 256 columns, each case a fraction of a second.
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        let mut cases = crate::experiment::quick_gates(self, backend);
        let mut f16 = cases[1].clone();
        f16["dtype"] = json!("f16");
        cases.push(f16);
        cases
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::Bf16 => run::<half::bf16>(s, case),
            DType::F16 => run::<half::f16>(s, case),
            DType::F32 => Err(LabError::Invalid("moe runs in bf16 and f16".into())),
        }
    }
}

/// The router a case describes.
pub fn case_router(case: &Value, seed: u64) -> Result<Router> {
    let scoring = match param_str(case, "scoring")? {
        "softmax" => Scoring::Softmax,
        "sigmoid" => Scoring::Sigmoid,
        other => return Err(LabError::Invalid(format!("moe: unknown scoring `{other}` (softmax, sigmoid)"))),
    };
    let capacity = match param_str(case, "capacity")? {
        "dropless" => Capacity::Dropless,
        f => Capacity::Factor(f.parse().map_err(|_| LabError::Invalid(format!("moe: capacity `{f}` is neither `dropless` nor a factor")))?),
    };
    let flag = |k: &str| case.get(k).and_then(Value::as_bool).unwrap_or(false);
    let noise_seed = flag("noisy").then_some(seed ^ 0x6e6f697379);
    Ok(Router { k: param_usize(case, "k")?, scoring, renormalize: flag("renorm"), capacity, aux_alpha: 0.01, noise_seed })
}

/// N(0, scale^2) values, generated in parallel from one seed (the expert weights run to GBs).
fn normal<T: Elem>(len: usize, scale: f32, seed: u64) -> Vec<T> {
    const PART: usize = 1 << 20;
    let mut v = vec![T::from_f32(0.0); len];
    v.par_chunks_mut(PART).enumerate().for_each(|(i, part)| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(i as u64));
        part.iter_mut().for_each(|x| {
            let z: f32 = StandardNormal.sample(&mut rng);
            *x = T::from_f32(scale * z);
        });
    });
    v
}

/// The inputs of a case: x [T, H] with a constant 1 in column 0, and the weights; the router's
/// row 0 is then a per-expert bias that makes the load: none (uniform), -1.2 ln(rank) over a
/// seeded ranking (Zipf with exponent 1.2), or +30 on one seeded expert (every first choice).
pub struct Inputs<T: Elem> {
    pub x: Vec<T>,
    pub router: Vec<T>,
    pub noise: Option<Vec<T>>,
    pub gate_up: Vec<T>,
    pub down: Vec<T>,
}

pub fn inputs<T: Elem>(case: &Value, seed: u64) -> Result<Inputs<T>> {
    let [t, h, i, e] = ["tokens", "hidden", "inter", "experts"].map(|k| param_usize(case, k));
    let (t, h, i, e) = (t?, h?, i?, e?);
    let mut rng = rng_for(seed, case);
    let mut x: Vec<T> = normal(t * h, 1.0, rng.random());
    x.iter_mut().step_by(h).for_each(|v| *v = T::from_f32(1.0));
    let wscale = 1.0 / (h as f32).sqrt();
    let mut router: Vec<T> = normal(h * e, wscale, rng.random());
    let bias: Vec<f32> = match param_str(case, "load")? {
        "uniform" => vec![0.0; e],
        "zipf" => {
            let mut rank: Vec<usize> = (1..=e).collect();
            rand::seq::SliceRandom::shuffle(rank.as_mut_slice(), &mut rng);
            rank.iter().map(|&r| -1.2 * (r as f32).ln()).collect()
        }
        "one" => {
            let hot = rng.random_range(0..e);
            (0..e).map(|j| if j == hot { 30.0 } else { 0.0 }).collect()
        }
        other => return Err(LabError::Invalid(format!("moe: unknown load `{other}` (uniform, zipf, one)"))),
    };
    router[..e].iter_mut().zip(&bias).for_each(|(w, b)| *w = T::from_f32(*b));
    let noise = case.get("noisy").and_then(Value::as_bool).unwrap_or(false).then(|| normal(h * e, wscale, rng.random()));
    Ok(Inputs { x, router, noise, gate_up: normal(e * h * 2 * i, wscale, rng.random()), down: normal(e * i * h, 1.0 / (i as f32).sqrt(), rng.random()), })
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let [t, h, i, e] = ["tokens", "hidden", "inter", "experts"].map(|k| param_usize(case, k));
    let (t, h, i, e) = (t?, h?, i?, e?);
    let timed = param_timed(case);
    let r = case_router(case, s.opts.seed)?;
    let inp = inputs::<T>(case, s.opts.seed)?;
    let dev = s.backend.clone();
    let w = Weights {
        router: Tensor::from_slice(&dev, &[h, e], &inp.router)?,
        noise: inp.noise.as_ref().map(|n| Tensor::from_slice(&dev, &[h, e], n)).transpose()?,
        gate_up: Tensor::from_slice(&dev, &[e, h, 2 * i], &inp.gate_up)?,
        down: Tensor::from_slice(&dev, &[e, i, h], &inp.down)?,
    };
    let x = Tensor::from_slice(&dev, &[t, h], &inp.x)?;
    // The reference routes from the logits the backend stored (gemm's op, checked by its family).
    let (logits, noisy) = router_logits(&dev, &x, &w, &r)?;
    let noise64 = noisy.as_ref().map(|(n, eps)| Ok::<_, LabError>((widen(&n.to_vec()?), eps.to_vec()?.iter().map(|&v| v as f64).collect::<Vec<_>>()))).transpose()?;
    let rref = reference::route(&widen(&logits.to_vec()?), noise64.as_ref().map(|(n, eps)| (n.as_slice(), eps.as_slice())), t, e, &r);
    let keep = reference::kept(&rref.experts, t, r.k, e, r.capacity.slots(t, e));
    let mut rng = rng_for(s.opts.seed ^ 1, case);
    let tokens: Vec<usize> = if t * r.k * 3 * h * i <= FULL_CHECK_MACS {
        (0..t).collect()
    } else {
        let mut v: Vec<usize> = (0..SAMPLED_TOKENS).map(|_| rng.random_range(0..t)).chain([0, t - 1]).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let LayerRef { out: want, allow } = reference::layer(&inp.x, &inp.gate_up, &inp.down, (h, e, i), r.k, &rref.experts, &rref.weights, &keep, &tokens);
    let reference_name = if tokens.len() == t { "cpu-f64".to_string() } else { format!("cpu-f64-sampled-{}-tokens", tokens.len()) };
    let gather = |out: &[T]| -> Vec<f64> { tokens.iter().flat_map(|&tk| out[tk * h..][..h].iter().map(|v| v.to_f64())).collect() };
    let bound = "per element: f32 accumulation of both products, T roundings of g, u, h, y and out, f32 router weights (moe::reference::layer)";
    let compare = |out: &[T]| compare_within(&gather(out), &want, &allow, bound, &reference_name);
    let ceiling = crate::ops::product_ceiling(&dev, T::DTYPE);
    let check = Check { tol: Tolerance { atol: 0.0, rtol: reference::unit(T::DTYPE) }, compare: &compare, ceiling };
    let active = rref.load.iter().filter(|&&c| c > 0).count();
    let elem = T::DTYPE.size() as u64;
    let work = Work { flops: (2 * t * r.k * 3 * h * i) as u64, bytes: elem * (2 * t * h + active * 3 * h * i) as u64 };
    let dropped = keep.iter().filter(|k| !**k).count();
    let mut extra = serde_json::Map::new();
    extra.insert("load".into(), json!(rref.load));
    extra.insert("dropped".into(), json!(dropped));
    extra.insert("aux_loss".into(), json!(rref.aux_loss));
    extra.insert("z_loss".into(), json!(rref.z_loss));
    let mut out = Tensor::<T>::zeros(&dev, &[t, h])?;
    let mut routing_checked = false;
    let mut ran = Vec::new();
    for var in VARIANTS {
        if !var.requires.met_by(&dev) || !s.wants(var.name, "lab") {
            continue;
        }
        if !routing_checked {
            check_routing(s, case, var.name, &super::route(&dev, &x, &w, &r)?, &rref, e)?;
            routing_checked = true;
        }
        measure_op_with(s, case, var.name, work, &check, timed, &mut out, extra.clone(), |o| forward_with(&dev, var.name, &x, &w, &r, o).map(|_| ()))?;
        // The fused combine is the forward's alone: its backward would be grouped_wgmma's again.
        if !matches!(var.config, super::Kernel::GroupedWgmma { fused_combine: true, .. }) {
            ran.push(var.name);
        }
    }
    if !ran.is_empty() {
        backward_case(s, case, &ran, (&x, &w, &r), &tokens, timed)?;
    }
    if let Backend::Cuda(gpu) = &dev {
        if timed && s.opts.peers.contains(&Peer::Torch) && dropped == 0 {
            let ex: Vec<i32> = rref.experts.iter().map(|&v| v as i32).collect();
            let wt: Vec<f32> = rref.weights.iter().map(|&v| v as f32).collect();
            let (xb, gub, db) = (T::bytes(&inp.x), T::bytes(&inp.gate_up), T::bytes(&inp.down));
            let (eb, wb): (Vec<u8>, Vec<u8>) = (ex.iter().flat_map(|v| v.to_le_bytes()).collect(), wt.iter().flat_map(|v| v.to_le_bytes()).collect());
            let shapes = ([t, h], [e, h, 2 * i], [e, i, h], [t, r.k]);
            let ins: [(&[u8], &[usize]); 5] = [(&xb, &shapes.0), (&gub, &shapes.1), (&db, &shapes.2), (&eb, &shapes.3), (&wb, &shapes.3)];
            let args = json!({"input_dtypes": [null, null, null, "i32", "f32"]});
            for op in ["moe_loop", "moe_grouped_mm"] {
                if s.wants_peer(Peer::Torch, op, "torch") {
                    if let Err(err) = measure_torch(s, gpu, case, op, args.clone(), &ins, work, &check) {
                        eprintln!("moe: torch {op} did not run on {case}: {err}");
                    }
                }
            }
            if s.wants_peer(Peer::Torch, "dense", "torch") {
                dense_peer(s, gpu, case, &inp, (t, h, i, r.k), work)?;
            }
        }
    }
    Ok(())
}

/// The routing against the f64 router: experts exactly, weights within f32's error, the load
/// histogram exactly, the losses within an f32 sum over the tokens; an untimed record of its own.
fn check_routing(s: &mut Session, case: &Value, variant: &str, rt: &super::Routing, rref: &reference::RouteRef, e: usize) -> Result<()> {
    let t = rt.experts.rows() as f64;
    let wtol = (2.0 * e as f64 + 16.0) * 2f64.powi(-24);
    let ltol = (t + e as f64 + 16.0) * 2f64.powi(-24);
    let mut got: Vec<f64> = rt.experts.to_vec()?.iter().map(|&v| v as f64).collect();
    let mut want: Vec<f64> = rref.experts.iter().map(|&v| v as f64).collect();
    let mut allow = vec![0.0; got.len()];
    let weights = rt.weights.to_vec()?;
    allow.extend(rref.weights.iter().map(|w| wtol * w.abs() + 1e-30));
    got.extend(weights.iter().map(|&v| v as f64));
    want.extend(&rref.weights);
    got.extend(rt.load.to_vec()?.iter().map(|&v| v as f64));
    want.extend(rref.load.iter().map(|&v| v as f64));
    allow.extend(std::iter::repeat_n(0.0, e));
    let losses = rt.losses.to_vec()?;
    got.extend(losses.iter().map(|&v| v as f64));
    want.extend([rref.aux_loss, rref.z_loss]);
    allow.extend([ltol * rref.aux_loss.abs() + 1e-12, ltol * rref.z_loss.abs() + 1e-12]);
    let mut c = case.clone();
    (c["output"], c["timed"]) = (json!("routing"), json!(false));
    let mut m = Measurement::new(variant, "lab", &c, Work { bytes: 0, flops: 0 });
    m.error = Some(compare_within(&got, &want, &allow, "experts and load exact; weights (2E + 16) u32 relative; losses (T + E + 16) u32 relative", "cpu-f64 (routing: [T k experts, T k weights, E load, aux, z])"));
    m.tolerance = Some(Tolerance { atol: 0.0, rtol: wtol });
    m.extra.insert("load".into(), json!(rref.load));
    m.extra.insert("losses".into(), json!(losses));
    s.emit(m).map(|_| ())
}

/// The layer's backward on each rung of `variants` against the f64 gradients with the
/// backend's selection held fixed, from a seeded dout and weights 40 and 0.5 on the two losses
/// (large enough that a missing loss term fails): every gradient where the case is checked in
/// full, else dx of the sampled `tokens`. Timed cases are timed too, beside torch autograd of
/// the same layer and objective on the same selection. Its flops: the four products of the
/// backward, 2 x the forward's (the forward the op runs again is not counted).
fn backward_case<T: Elem>(s: &mut Session, case: &Value, variants: &[&str], (x, w, r): (&Tensor<T>, &Weights<T>, &Router), tokens: &[usize], timed: bool) -> Result<()> {
    let dev = s.backend.clone();
    let (t, h, e, i) = super::layer_dims(x, w)?;
    let dout_h: Vec<T> = normal(t * h, 1.0, rng_for(s.opts.seed ^ 2, case).random());
    let dout = Tensor::from_slice(&dev, &[t, h], &dout_h)?;
    let up = Upstream { dout: &dout, d_aux: 40.0, d_z: 0.5 };
    let (rt, g) = super::backward_with(&dev, variants[0], x, w, r, &up)?;
    let select: Vec<usize> = rt.experts.to_vec()?.iter().map(|&v| v as usize).collect();
    let full = tokens.len() == t;
    let mask: Vec<bool> = {
        let mut m = vec![false; t];
        tokens.iter().for_each(|&tk| m[tk] = true);
        m
    };
    let expected = backward_reference::expected(x, w, r, &up, &select, (!full).then_some(&mask))?;
    // The gradients laid end to end as the op's and torch's outputs are: x, router, (noise,) gate_up, down.
    let sizes = [Some(t * h), Some(h * e), w.noise.as_ref().map(|_| h * e), Some(e * h * 2 * i), Some(e * i * h)];
    let rows = |v: &[f64]| -> Vec<f64> { tokens.iter().flat_map(|&tk| v[tk * h..][..h].iter().copied()).collect() };
    // Sampled: the expected dx rows alone (the reference leaves the weights' gradients empty).
    let only_x = |g: &backward_reference::Grads| backward_reference::Grads { x: rows(&g.x), router: vec![], noise: None, gate_up: vec![], down: vec![], logits: vec![] };
    let sampled = (!full).then(|| (only_x(&expected.0), only_x(&expected.1)));
    let total: usize = sizes.iter().flatten().sum();
    let judge = |flat: &[T]| {
        if flat.len() != total {
            let mut e = crate::record::ErrorStats::empty("cpu-f64 backward");
            (e.mismatches, e.worst_fraction_of_tolerance) = (flat.len().abs_diff(total) as u64 + 1, f64::INFINITY);
            e.bound = Some(format!("the gradients hold {} elements, not {total}", flat.len()));
            return e;
        }
        match &sampled {
            // dx of the sampled tokens: the first t h elements.
            Some(expected) => backward_reference::compare([Some(&rows(&crate::ops::widen(&flat[..t * h]))), None, None, None, None], expected, T::DTYPE),
            None => {
                let mut at = 0;
                let parts = sizes.map(|n| {
                    n.map(|n| {
                        at += n;
                        crate::ops::widen(&flat[at - n..at])
                    })
                });
                backward_reference::compare(parts.each_ref().map(|p| p.as_deref()), &expected, T::DTYPE)
            }
        }
    };
    let flat = |g: &super::Grads<T>| -> Result<Vec<T>> {
        let mut v = g.x.to_vec()?;
        for p in [Some(&g.router), g.noise.as_ref(), Some(&g.gate_up), Some(&g.down)].into_iter().flatten() {
            v.extend(p.to_vec()?);
        }
        Ok(v)
    };
    let mut first = Some(g);
    let mut c = case.clone();
    c["output"] = json!("backward");
    if !full {
        c["checked_tokens"] = json!(tokens.len());
    }
    let elem = T::DTYPE.size() as u64;
    let active = rt.load.to_vec()?.iter().filter(|&&n| n > 0).count();
    let work = Work { flops: (4 * t * r.k * 3 * h * i) as u64, bytes: elem * (3 * t * h + 2 * active * 3 * h * i) as u64 };
    let ceiling = crate::ops::product_ceiling(&dev, T::DTYPE);
    let check = Check { tol: Tolerance { atol: 0.0, rtol: backward_reference::ALLOW_UNITS * reference::unit(T::DTYPE) }, compare: &judge, ceiling };
    for &variant in variants {
        let grads = || super::backward_with(&dev, variant, x, w, r, &up).map(|(_, g)| g);
        let before = judge(&flat(&match first.take() {
            Some(g) => g,
            None => grads()?,
        })?);
        let once = || grads().map(|_| ());
        let (time, after) = match (&dev, timed) {
            (_, false) => (None, before.clone()),
            (Backend::Cuda(gpu), true) => (Some(crate::gpu::timing::time_gpu(gpu, &s.budget, once)?), judge(&flat(&grads()?)?)),
            (Backend::Cpu, true) => (Some(crate::profile::host_time(&s.budget, || Ok(()), once)?), judge(&flat(&grads()?)?)),
        };
        crate::ops::emit_checked(s, &c, (variant, "lab"), work, &check, (before, after), time, serde_json::Map::new())?;
    }
    // torch autograd of the same layer on the lab's selection: dropless and without noise, where
    // its per-expert loop is the layer.
    if let Backend::Cuda(gpu) = &dev {
        if timed && r.noise_seed.is_none() && r.capacity == Capacity::Dropless && s.wants_peer(Peer::Torch, "torch autograd (per-expert loop)", "torch") {
            let idx: Vec<u8> = select.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
            let bytes = [x.to_vec()?, w.router.to_vec()?, w.gate_up.to_vec()?, w.down.to_vec()?, dout_h].map(|v| T::bytes(&v).to_vec());
            let shapes: [&[usize]; 6] = [&[t, h], &[h, e], &[e, h, 2 * i], &[e, i, h], &[t, h], &[t, r.k]];
            let ins: Vec<(&[u8], &[usize])> = bytes.iter().map(|b| b.as_slice()).chain([idx.as_slice()]).zip(shapes).collect();
            let scoring = if r.scoring == Scoring::Sigmoid { "sigmoid" } else { "softmax" };
            let args = json!({"input_dtypes": [null, null, null, null, null, "i32"], "k": r.k, "scoring": scoring, "renorm": r.renormalize,
                              "alpha": r.aux_alpha, "d_aux": up.d_aux, "d_z": up.d_z});
            if let Err(err) = measure_torch(s, gpu, &c, "moe_backward", args, &ins, work, &check) {
                eprintln!("moe: torch autograd did not run on {c}: {err}");
            }
        }
    }
    Ok(())
}

/// torch's dense GEMM of the same flops: x repeated k times [T k, H] times [H, 3I] (expert 0's
/// gate, up and down^T side by side); its first rows come back, checked against f64.
fn dense_peer<T: Elem>(s: &mut Session, gpu: &crate::gpu::Gpu, case: &Value, inp: &Inputs<T>, (t, h, i, k): (usize, usize, usize, usize), work: Work) -> Result<()> {
    let rows = DENSE_ROWS.min(t * k);
    let col = |c: usize, kk: usize| if c < 2 * i { inp.gate_up[kk * 2 * i + c].to_f64() } else { inp.down[(c - 2 * i) * h + kk].to_f64() };
    let (mut want, mut scale) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let xr = &inp.x[(r / k) * h..][..h];
        for c in 0..3 * i {
            let (v, a) = (0..h).fold((0.0, 0.0), |(v, a), kk| {
                let p = xr[kk].to_f64() * col(c, kk);
                (v + p, a + p.abs())
            });
            want.push(v);
            scale.push(a);
        }
    }
    let bound = ProductBound::fp32_accumulation(h, T::DTYPE);
    let compare = |got: &[T]| compare_product(&widen(&got[..want.len().min(got.len())]), &want, &scale, bound, "cpu-f64 (first rows)");
    let check = Check { tol: bound.tolerance(), compare: &compare, ceiling: crate::ops::product_ceiling(&s.backend, T::DTYPE) };
    let (xb, gub, db) = (T::bytes(&inp.x), T::bytes(&inp.gate_up), T::bytes(&inp.down));
    let e = inp.gate_up.len() / (h * 2 * i);
    let ins: [(&[u8], &[usize]); 3] = [(&xb, &[t, h]), (&gub, &[e, h, 2 * i]), (&db, &[e, i, h])];
    if let Err(err) = measure_torch(s, gpu, case, "moe_dense", json!({"k": k, "rows": rows}), &ins, work, &check) {
        eprintln!("moe: torch dense GEMM did not run on {case}: {err}");
    }
    Ok(())
}
