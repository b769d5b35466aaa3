//! What the attention backward is checked against, and its experiment cases
//! (`{"pass": "backward", ...}` in the attention experiment).
//!
//! The reference is the gradient of the forward's definition in f64: P_ij = exp(s_ij - lse_i),
//! D_i = sum_j P_ij dP_ij, with lse and D computed from Q, K, V and dO alone ([`RowStats::exact`]),
//! or, where that costs a full forward in f64 per case, from the saved lse and O that the kernels
//! read ([`RowStats::saved`]). The bound follows the forward's (FlashAttention's own test rule):
//! within 2x the error of the same computation done naively in the storage precision (fp32
//! dot products, P, dP and dS stored in T, fp32 sums, the saved lse and O), plus one rounding of
//! the output, each of dQ, dK and dV against its own naive error.

use super::backward::{backward_with, CpuIn, Grads, Saved};
use super::{case_dims, case_json, check_rows, forward, input, Dims, Elem, Mask, VARIANTS};
use crate::experiment::{param_timed, rng_for, Backend, Measurement, Peer, Session};
use crate::kernels::DType;
use crate::ops::compare::{compare_bits, compare_elems, first_failure, merge_parts};
use crate::ops::{measure_torch, Check};
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance};
use crate::tensor::Tensor;
use crate::{LabError, Result};
use rayon::prelude::*;
use serde_json::{json, Value};

/// lse_i and D_i in f64, indexed [batch, hq, sq] as lse is.
pub struct RowStats {
    pub lse: Vec<f64>,
    pub delta: Vec<f64>,
}

impl RowStats {
    /// From the forward's definition alone: lse_i = log sum_j exp(s_ij) over kept keys and
    /// D_i = sum_j P_ij dP_ij (equal to dO_i . O_i for the exact O).
    pub fn exact<T: Elem>(d: Dims, m: Mask, x: &CpuIn<T>) -> Self {
        let scale = 1.0 / (d.d as f64).sqrt();
        let (lse, delta) = (0..d.batch * d.hq * d.sq)
            .into_par_iter()
            .map(|r| {
                let (b, h, i) = (r / (d.hq * d.sq), r / d.sq % d.hq, r % d.sq);
                let q = &x.q[((b * d.sq + i) * d.hq + h) * d.d..][..d.d];
                let g = &x.dout[((b * d.sq + i) * d.hq + h) * d.d..][..d.d];
                let kv = |j: usize| ((b * d.sk + j) * d.hkv + h / (d.hq / d.hkv)) * d.d;
                let keys: Vec<usize> = (0..d.sk).filter(|&j| d.keep(m, i, j)).collect();
                let s: Vec<f64> = keys.iter().map(|&j| scale * dot(q, &x.k[kv(j)..][..d.d])).collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if keys.is_empty() {
                    return (f64::NEG_INFINITY, 0.0);
                }
                let sum: f64 = s.iter().map(|s| (s - mx).exp()).sum();
                let delta = keys.iter().zip(&s).map(|(&j, s)| (s - mx).exp() / sum * dot(g, &x.v[kv(j)..][..d.d])).sum();
                (mx + sum.ln(), delta)
            })
            .unzip();
        RowStats { lse, delta }
    }
    /// From what the forward saved: its lse, and D_i = dO_i . O_i with its O.
    pub fn saved<T: Elem>(d: Dims, x: &CpuIn<T>) -> Self {
        let delta = (0..d.batch * d.hq * d.sq)
            .into_par_iter()
            .map(|r| {
                let (b, h, i) = (r / (d.hq * d.sq), r / d.sq % d.hq, r % d.sq);
                let at = ((b * d.sq + i) * d.hq + h) * d.d;
                dot(&x.o[at..][..d.d], &x.dout[at..][..d.d])
            })
            .collect();
        RowStats { lse: x.lse.iter().map(|&l| l as f64).collect(), delta }
    }
}

/// A checked row: (batch, head, row) of dQ, or (batch, KV head, key) of dK and dV.
pub type Row = (usize, usize, usize);

type C = super::CaseShape;

fn dot<T: Elem>(a: &[T], b: &[T]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x.to_f64() * y.to_f64()).sum()
}
fn dot32<T: Elem>(a: &[T], b: &[T]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
}

/// The gradients at the checked rows: (b, h, i) query rows of dQ, (b, hk, j) key rows of dK and
/// dV, each row in f64 and as the naive storage-precision computation gives it.
pub struct ExpectedGrads {
    pub qrows: Vec<Row>,
    pub krows: Vec<Row>,
    /// dQ, dK, dV at the checked rows, f64.
    pub parts: [Vec<f64>; 3],
    pub tol: [Tolerance; 3],
    pub reference: &'static str,
}

impl ExpectedGrads {
    pub fn new<T: Elem>(d: Dims, m: Mask, x: &CpuIn<T>, stats: &RowStats, qrows: Vec<Row>, krows: Vec<Row>, reference: &'static str) -> Self {
        let scale = 1.0 / (d.d as f64).sqrt();
        let group = d.hq / d.hkv;
        let round = |a: f32| T::from_f32(a).to_f32();
        let qat = |b: usize, i: usize, h: usize| ((b * d.sq + i) * d.hq + h) * d.d;
        let kat = |b: usize, j: usize, hk: usize| ((b * d.sk + j) * d.hkv + hk) * d.d;
        // One kept pair's (P, dS) in f64 from the stats, and (P, dS) as the naive kernels store them.
        let pair = |b: usize, h: usize, i: usize, j: usize| -> ((f64, f64), (f32, f32)) {
            let (qi, gi) = (&x.q[qat(b, i, h)..][..d.d], &x.dout[qat(b, i, h)..][..d.d]);
            let (kj, vj) = (&x.k[kat(b, j, h / group)..][..d.d], &x.v[kat(b, j, h / group)..][..d.d]);
            let r = (b * d.hq + h) * d.sq + i;
            let p = (scale * dot(qi, kj) - stats.lse[r]).exp();
            let exact = (p, p * (dot(gi, vj) - stats.delta[r]));
            let delta32 = dot32(&x.o[qat(b, i, h)..][..d.d], gi);
            let p32 = (scale as f32 * dot32(qi, kj) - x.lse[r]).exp();
            (exact, (round(p32), round(p32 * (round(dot32(gi, vj)) - delta32))))
        };
        let rows_q: Vec<(Vec<f64>, Vec<f64>)> = qrows
            .par_iter()
            .map(|&(b, h, i)| {
                let (mut e, mut n) = (vec![0f64; d.d], vec![0f32; d.d]);
                for j in (0..d.sk).filter(|&j| d.keep(m, i, j)) {
                    let ((_, ds), (_, ds32)) = pair(b, h, i, j);
                    let kj = &x.k[kat(b, j, h / group)..][..d.d];
                    for c in 0..d.d {
                        e[c] += scale * ds * kj[c].to_f64();
                        n[c] += ds32 * kj[c].to_f32();
                    }
                }
                (e, n.iter().map(|&a| T::from_f32(a * scale as f32).to_f64()).collect())
            })
            .collect();
        let rows_kv: Vec<[Vec<f64>; 4]> = krows
            .par_iter()
            .map(|&(b, hk, j)| {
                let (mut ek, mut ev, mut nk, mut nv) = (vec![0f64; d.d], vec![0f64; d.d], vec![0f32; d.d], vec![0f32; d.d]);
                for h in hk * group..(hk + 1) * group {
                    for i in (0..d.sq).filter(|&i| d.keep(m, i, j)) {
                        let ((p, ds), (p32, ds32)) = pair(b, h, i, j);
                        let (qi, gi) = (&x.q[qat(b, i, h)..][..d.d], &x.dout[qat(b, i, h)..][..d.d]);
                        for c in 0..d.d {
                            ek[c] += scale * ds * qi[c].to_f64();
                            ev[c] += p * gi[c].to_f64();
                            nk[c] += ds32 * qi[c].to_f32();
                            nv[c] += p32 * gi[c].to_f32();
                        }
                    }
                }
                let nk = nk.iter().map(|&a| T::from_f32(a * scale as f32).to_f64()).collect();
                [ek, ev, nk, nv.iter().map(|&a| T::from_f32(a).to_f64()).collect()]
            })
            .collect();
        let ulp = if T::DTYPE == DType::Bf16 { 2f64.powi(-8) } else { 2f64.powi(-11) };
        let tol = |pairs: &mut dyn Iterator<Item = (&Vec<f64>, &Vec<f64>)>| {
            let err = pairs.flat_map(|(e, n)| e.iter().zip(n).map(|(a, b)| (a - b).abs())).fold(0f64, f64::max);
            Tolerance { atol: 2.0 * err + 1e-6, rtol: ulp }
        };
        let tq = tol(&mut rows_q.iter().map(|(e, n)| (e, n)));
        let tk = tol(&mut rows_kv.iter().map(|r| (&r[0], &r[2])));
        let tv = tol(&mut rows_kv.iter().map(|r| (&r[1], &r[3])));
        let dq = rows_q.into_iter().flat_map(|(e, _)| e).collect();
        let dk = rows_kv.iter().flat_map(|r| r[0].clone()).collect();
        let dv = rows_kv.into_iter().flat_map(|[_, v, _, _]| v).collect();
        ExpectedGrads { qrows, krows, parts: [dq, dk, dv], tol: [tq, tk, tv], reference }
    }

    /// dQ, dK and dV (laid end to end, as `gather` lays them) against the reference, each part
    /// against its own bound.
    pub fn compare<T: Elem>(&self, got: &[T]) -> ErrorStats {
        let mut offset = 0;
        let parts = self.parts.iter().zip(&self.tol).map(|(part, &tol)| {
            let mut e = compare_elems(&got[offset..offset + part.len()], part, tol, self.reference);
            e.bound = Some("2x the naive storage-precision error of its part (dQ, dK or dV) + ulp |ref|".into());
            offset += part.len();
            (e, offset - part.len())
        });
        merge_parts(parts.collect())
    }

    /// The checked rows of dq ([B, Sq, Hq, D]), dk and dv ([B, Sk, Hkv, D]), end to end.
    pub fn gather<T: Elem>(&self, d: Dims, dq: &[T], dk: &[T], dv: &[T]) -> Vec<T> {
        let q = self.qrows.iter().flat_map(|&(b, h, i)| dq[((b * d.sq + i) * d.hq + h) * d.d..][..d.d].to_vec());
        let k = |g: &[T]| self.krows.iter().flat_map(|&(b, hk, j)| g[((b * d.sk + j) * d.hkv + hk) * d.d..][..d.d].to_vec()).collect::<Vec<T>>();
        q.chain(k(dk)).chain(k(dv)).collect()
    }

    /// The loosest of the three bounds, for the record (the error says which part it was).
    pub fn record_tol(&self) -> Tolerance {
        Tolerance { atol: self.tol.iter().map(|t| t.atol).fold(0.0, f64::max), rtol: self.tol[0].rtol }
    }
}

/// The rows a check compares: every query and key row of a small problem, else a sample
/// ([`check_rows`]).
pub fn rows(d: Dims, rng: &mut impl rand::Rng) -> (Vec<Row>, Vec<Row>) {
    let keys = Dims { sq: d.sk, sk: d.sq * d.hq / d.hkv, hq: d.hkv, ..d };
    (check_rows(d, rng), check_rows(keys, rng))
}

/// Beyond this many multiply-adds (B Hq Sq Sk D) the reference takes lse and D from the saved
/// tensors instead of recomputing the forward in f64.
pub const EXACT_MAX: usize = 1 << 31;

/// FlashAttention 2's count for the backward: 2.5x the forward's flops (five matmuls against
/// two); bytes: Q, K, V, O and dO read, dQ, dK and dV written, lse read.
pub fn work(d: Dims, m: Mask, elem: usize) -> Work {
    let (q, kv) = ((d.batch * d.sq * d.hq * d.d) as u64, (d.batch * d.sk * d.hkv * d.d) as u64);
    Work { bytes: (4 * q + 4 * kv) * elem as u64 + 4 * (d.batch * d.hq * d.sq) as u64, flops: d.work(m, elem).flops * 5 / 2 }
}

/// The backward cases of the attention sweep.
pub fn cases(backend: &Backend, quick: bool) -> Vec<Value> {
    let checks: &[C] = match backend {
        Backend::Cpu => &[(1, 1, 1, 2, 1, 64, true, 0, "normal"), (2, 17, 5, 3, 1, 64, true, 0, "normal"), (1, 33, 33, 4, 2, 128, false, 7, "large")],
        Backend::Cuda(_) => &[
            (1, 1, 1, 2, 1, 64, true, 0, "normal"),
            (2, 17, 5, 3, 1, 64, true, 0, "normal"),
            (1, 17, 17, 2, 2, 128, false, 0, "large"),
            (2, 17, 1000, 8, 8, 128, true, 0, "normal"),
            (1, 1000, 1000, 4, 2, 64, true, 128, "normal"),
            (3, 129, 257, 6, 2, 128, false, 0, "normal"),
            (1, 4097, 4097, 1, 1, 64, true, 0, "normal"),
        ],
    };
    let timed: Vec<C> = match (backend, quick) {
        (Backend::Cuda(_), false) => [1024, 2048, 4096, 8192, 16384].iter().flat_map(|&s| [false, true].map(|c| (4, s, s, 16, 16, 128, c, 0, "normal"))).collect(),
        (Backend::Cuda(_), true) => vec![(2, 1024, 1024, 16, 16, 128, true, 0, "normal")],
        (Backend::Cpu, false) => vec![(1, 256, 256, 9, 3, 64, true, 0, "normal")],
        (Backend::Cpu, true) => vec![(1, 64, 64, 2, 1, 64, true, 0, "normal")],
    };
    let mut out: Vec<Value> = ["bf16", "f16"].iter().flat_map(|dt| checks.iter().map(move |c| case(c, dt, false))).collect();
    out.extend(timed.iter().map(|c| case(c, "bf16", true)));
    out
}

/// Small odd backward cases for `lab sanitize`: every edge (one key, rows keeping no key, Sq
/// != Sk, a window, GQA, a partial last tile of both sizes) at a few tiles each.
pub fn sanitize_cases() -> Vec<Value> {
    let c: [C; 4] = [
        (1, 1, 1, 2, 1, 64, true, 0, "normal"),
        (2, 17, 5, 3, 1, 64, true, 0, "normal"),
        (1, 77, 130, 4, 2, 128, false, 40, "normal"),
        (1, 131, 131, 2, 1, 128, true, 0, "large"),
    ];
    let mut out: Vec<Value> = c.iter().map(|c| case(c, "bf16", false)).collect();
    out.push(case(&c[3], "f16", false));
    out
}

fn case(c: &C, dtype: &str, timed: bool) -> Value {
    let mut v = case_json(c, dtype, timed);
    v["pass"] = json!("backward");
    v
}

/// One backward case: the lab forward makes O and lse, then every backward variant and the torch
/// peers compute dQ, dK, dV from the same dO.
pub fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let (d, mask) = case_dims(case)?;
    let timed = param_timed(case);
    let qscale = match case.get("fill").and_then(Value::as_str).unwrap_or("normal") {
        "normal" => 1.0,
        "large" => 100.0,
        other => return Err(LabError::Invalid(format!("unknown attention fill `{other}` (normal, large)"))),
    };
    let mut rng = rng_for(s.opts.seed, case);
    let (qn, kn) = (d.batch * d.sq * d.hq * d.d, d.batch * d.sk * d.hkv * d.d);
    let (q, k, v, dout): (Vec<T>, Vec<T>, Vec<T>, Vec<T>) = (input(qn, qscale, &mut rng), input(kn, 1.0, &mut rng), input(kn, 1.0, &mut rng), input(qn, 1.0, &mut rng));
    let dev = s.backend.clone();
    let (qs, ks) = ([d.batch, d.sq, d.hq, d.d], [d.batch, d.sk, d.hkv, d.d]);
    let (qt, kt, vt, dot_) = (Tensor::from_slice(&dev, &qs, &q)?, Tensor::from_slice(&dev, &ks, &k)?, Tensor::from_slice(&dev, &ks, &v)?, Tensor::from_slice(&dev, &qs, &dout)?);
    // O and lse as a training step has them: from the lab's forward (checked in its own cases).
    let mut ot = Tensor::<T>::zeros(&dev, &qs)?;
    let mut lt = Tensor::<f32>::zeros(&dev, &[d.batch, d.hq, d.sq])?;
    forward(&dev, &qt, &kt, &vt, mask, &mut ot, &mut lt)?;
    let (o, lse) = (ot.to_vec()?, lt.to_vec()?);
    let x = CpuIn { q: &q, k: &k, v: &v, o: &o, dout: &dout, lse: &lse };
    let exact = d.batch * d.hq * d.sq * d.sk * d.d <= EXACT_MAX;
    let (stats, reference) = if exact { (RowStats::exact(d, mask, &x), "cpu-f64") } else { (RowStats::saved(d, &x), "cpu-f64 (sampled rows, saved lse and O)") };
    let (qrows, krows) = rows(d, &mut rng);
    let expected = ExpectedGrads::new(d, mask, &x, &stats, qrows, krows, reference);
    let work = work(d, mask, T::DTYPE.size());
    let compare = |g: &[T]| expected.compare(g);
    let ceiling = crate::ops::product_ceiling(&dev, T::DTYPE);
    let check = Check { tol: expected.record_tol(), compare: &compare, ceiling };
    let saved = Saved { q: &qt, k: &kt, v: &vt, o: &ot, lse: &lt, dout: &dot_ };
    let mut grads = Grads::zeros(&dev, d)?;
    let judge = |dq: &[T], dk: &[T], dv: &[T]| expected.compare(&expected.gather(d, dq, dk, dv));
    for var in VARIANTS.iter().filter(|v| v.config.is_backward()) {
        if !var.requires.met_by(&dev) || super::backward::refusal(var, d).is_some() || !s.wants(var.name, "lab") {
            continue;
        }
        measure_grads(s, case, var.name, work, &check, timed, &mut grads, &judge, |g| backward_with(&dev, var.name, &saved, mask, g))?;
    }
    // torch SDPA's backward (autograd of its forward from the same dO): top-left causal and no
    // window, so only where those agree.
    if let Backend::Cuda(gpu) = &dev {
        if timed && d.sq == d.sk && mask.window == 0 {
            let bytes = [T::bytes(&q), T::bytes(&k), T::bytes(&v), T::bytes(&dout)];
            let inputs: [(&[u8], &[usize]); 4] = [(&bytes[0], &qs), (&bytes[1], &ks), (&bytes[2], &ks), (&bytes[3], &qs)];
            let gathered = |g: &[T]| {
                let (dq, rest) = g.split_at(qn);
                let (dk, dv) = rest.split_at(kn);
                expected.compare(&expected.gather(d, dq, dk, dv))
            };
            let peer_check = Check { tol: check.tol, compare: &gathered, ceiling };
            for backend in ["flash", "cudnn"] {
                if !s.wants_peer(Peer::Torch, &format!("torch sdpa ({backend}) backward"), "torch") {
                    continue;
                }
                let args = json!({"backend": backend, "causal": mask.causal});
                if let Err(e) = measure_torch(s, gpu, case, "sdpa_backward", args, &inputs, work, &peer_check) {
                    eprintln!("attention: torch sdpa ({backend}) backward did not run on {case}: {e}");
                }
            }
        }
    }
    Ok(())
}

/// Judges dQ, dK and dV (host copies) against the reference.
pub(super) type JudgeGrads<'a, T> = dyn Fn(&[T], &[T], &[T]) -> ErrorStats + 'a;

/// One backward variant, the house way for three outputs: poison them, run once and judge, time
/// it (or run it again, poisoned), judge again and compare the bits with the first run's, record
/// against the check's ceiling.
#[allow(clippy::too_many_arguments)]
pub(super) fn measure_grads<T: Elem>(
    s: &mut Session,
    case: &Value,
    variant: &str,
    work: Work,
    check: &Check<T>,
    timed: bool,
    g: &mut Grads<T>,
    judge: &JudgeGrads<'_, T>,
    op: impl Fn(&mut Grads<T>) -> Result<()>,
) -> Result<()> {
    let backend = s.backend.clone();
    poison(&backend, variant, g)?;
    op(g)?;
    if let Backend::Cuda(gpu) = &backend {
        gpu.sync()?;
    }
    // Each judgement downloads dQ, dK and dV once, for the check and for the bits.
    let host = |g: &Grads<T>| -> Result<[Vec<T>; 3]> { Ok([g.dq.to_vec()?, g.dk.to_vec()?, g.dv.to_vec()?]) };
    let first = host(g)?;
    let before = judge(&first[0], &first[1], &first[2]);
    let time = match (&backend, timed) {
        (_, false) => {
            poison(&backend, variant, g)?;
            op(g)?;
            None
        }
        (Backend::Cuda(gpu), true) => Some(crate::gpu::timing::time_gpu(gpu, &s.budget, || op(g))?),
        (Backend::Cpu, true) => Some(crate::profile::host_time(&s.budget, || Ok(()), || op(g))?),
    };
    let last = host(g)?;
    let after = judge(&last[0], &last[1], &last[2]);
    // The last run against the first, bit for bit: a gate for the variants that promise it.
    let repeat = compare_bits(&grad_bits(&last), &grad_bits(&first), "the variant's first run");
    let mut m = Measurement::new(variant, "lab", case, work);
    m.extra.insert("repeat_bit_identical".into(), json!(repeat.passed()));
    m.extra.insert("repeat_differing_elements".into(), json!(repeat.mismatches));
    let deterministic = super::VARIANTS.iter().any(|v| v.name == variant && v.config.deterministic());
    m.error = Some(match first_failure(before, after) {
        e if e.passed() && deterministic && !repeat.passed() => repeat,
        e => e,
    });
    (m.time, m.tolerance, m.ceiling) = (time, Some(check.tol), Some(check.ceiling));
    s.emit(m).map(|_| ())
}

fn poison<T: Elem>(backend: &Backend, variant: &str, g: &mut Grads<T>) -> Result<()> {
    for t in [&mut g.dq, &mut g.dk, &mut g.dv] {
        match (backend, t.buffer_mut()) {
            (Backend::Cuda(gpu), crate::tensor::Buffer::Cuda(b)) => gpu.poison(b)?,
            (_, crate::tensor::Buffer::Host(h)) => h.fill(T::from_f32(f32::NAN)),
            (Backend::Cpu, crate::tensor::Buffer::Cuda(_)) => return Err(LabError::Invalid(format!("{variant}: the gradients are on a GPU, the backend is the CPU"))),
        }
    }
    Ok(())
}

/// dQ, dK and dV end to end, each element's bits.
pub fn grad_bits<T: Elem>(grads: &[Vec<T>; 3]) -> Vec<u32> {
    grads.iter().flat_map(|g| T::bytes(g).chunks(T::DTYPE.size()).map(|c| c.iter().rev().fold(0u32, |a, &b| a << 8 | b as u32)).collect::<Vec<_>>()).collect()
}
