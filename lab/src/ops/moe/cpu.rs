//! The CPU backend's paths, in f32 as the kernels compute (the f64 reference is `reference`).

use super::{Epilogue, Router, Scoring};
use crate::ops::gemm::{cpu_blocked, Dims};
use crate::ops::Elem;
use rayon::prelude::*;

/// softplus(x) = ln(1 + e^x), as the kernel writes it (x itself above 20, where e^-x < 2^-28).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// SwiGLU's activation: silu(g) u.
pub fn swiglu(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// The experts a token keeps: the k largest of `h`, ties to the lower index.
pub fn top_k(h: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..h.len()).collect();
    idx.sort_by(|&a, &b| h[b].total_cmp(&h[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// One token's kept experts, their weights, its normalised scores and its logits' lse.
type TokenRoute = (Vec<usize>, Vec<f32>, Vec<f32>, f32);

pub struct RouteOut {
    pub experts: Vec<i32>,
    pub weights: Vec<f32>,
    pub load: Vec<i32>,
    pub aux_loss: f32,
    pub z_loss: f32,
}

/// Token i's logits l, selection logits h (noisy gating: l + eps softplus(n)) and scores
/// (softmax over h, or sigmoid), in f32: what [`route`] and [`route_backward`] start from.
fn token_scores<T: Elem>(logits: &[T], noise: Option<(&[T], &[f32])>, i: usize, e: usize, scoring: Scoring) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let l: Vec<f32> = logits[i * e..][..e].iter().map(|x| x.to_f32()).collect();
    let h: Vec<f32> = match noise {
        Some((n, eps)) => (0..e).map(|j| l[j] + eps[i * e + j] * softplus(n[i * e + j].to_f32())).collect(),
        None => l.clone(),
    };
    let scores: Vec<f32> = match scoring {
        Scoring::Softmax => {
            let m = h.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let ex: Vec<f32> = h.iter().map(|v| (v - m).exp()).collect();
            let s: f32 = ex.iter().sum();
            ex.iter().map(|v| v / s).collect()
        }
        Scoring::Sigmoid => h.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
    };
    (l, h, scores)
}

/// Routing in f32 from the logits [T, E] (and the noise logits and eps).
pub fn route<T: Elem>(logits: &[T], noise: Option<(&[T], &[f32])>, t: usize, e: usize, r: &Router) -> RouteOut {
    let per: Vec<TokenRoute> = (0..t)
        .into_par_iter()
        .map(|i| {
            let (l, h, scores) = token_scores(logits, noise, i, e, r.scoring);
            let kept = top_k(&h, r.k);
            let mut w: Vec<f32> = kept.iter().map(|&j| scores[j]).collect();
            if r.renormalize {
                let s: f32 = w.iter().sum();
                w.iter_mut().for_each(|v| *v /= s);
            }
            let total: f32 = scores.iter().sum();
            let p: Vec<f32> = scores.iter().map(|s| s / total).collect();
            let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let lse = m + l.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
            (kept, w, p, lse)
        })
        .collect();
    let mut out = RouteOut { experts: Vec::with_capacity(t * r.k), weights: Vec::with_capacity(t * r.k), load: vec![0; e], aux_loss: 0.0, z_loss: 0.0 };
    let mut p_sum = vec![0f32; e];
    for (kept, w, p, lse) in per {
        for &j in &kept {
            out.load[j] += 1;
        }
        out.experts.extend(kept.iter().map(|&j| j as i32));
        out.weights.extend(w);
        p_sum.iter_mut().zip(&p).for_each(|(s, v)| *s += v);
        out.z_loss += lse * lse;
    }
    let assignments = (t * r.k) as f32;
    let dot: f32 = out.load.iter().zip(&p_sum).map(|(&f, &p)| f as f32 / assignments * (p / t as f32)).sum();
    out.aux_loss = r.aux_alpha as f32 * e as f32 * dot;
    out.z_loss /= t as f32;
    out
}

pub struct PermuteOut {
    pub slot: Vec<i32>,
    pub rows: Vec<i32>,
    pub offsets: Vec<i32>,
}

/// Slot-major ranks (every first choice before any second), `cap` kept per expert, segments
/// laid out by expert.
pub fn permute(experts: &[i32], t: usize, k: usize, e: usize, cap: usize) -> PermuteOut {
    let mut pos = vec![-1i64; t * k];
    let mut count = vec![0usize; e];
    for j in 0..k {
        for i in 0..t {
            let x = experts[i * k + j] as usize;
            if count[x] < cap {
                pos[i * k + j] = count[x] as i64;
            }
            count[x] += 1;
        }
    }
    let mut offsets = vec![0i32; e + 1];
    for x in 0..e {
        offsets[x + 1] = offsets[x] + count[x].min(cap) as i32;
    }
    let mut slot = vec![-1i32; t * k];
    let mut rows = vec![-1i32; t * k];
    for (a, &p) in pos.iter().enumerate() {
        if p >= 0 {
            let s = offsets[experts[a] as usize] + p as i32;
            slot[a] = s;
            rows[s as usize] = (a / k) as i32;
        }
    }
    PermuteOut { slot, rows, offsets }
}

/// The permuted rows: row s is x[rows[s]]; dead rows (-1) are zero.
pub fn gather<T: Elem>(x: &[T], rows: &[i32], h: usize) -> Vec<T> {
    let mut out = vec![T::from_f32(0.0); rows.len() * h];
    out.par_chunks_mut(h).zip(rows).filter(|(_, &r)| r >= 0).for_each(|(o, &r)| o.copy_from_slice(&x[r as usize * h..][..h]));
    out
}

/// out[t] = sum_j w[t, j] y[slot[t, j]] in f32, j in order.
pub fn combine<T: Elem>(y: &[T], slot: &[i32], w: &[f32], k: usize, n: usize, out: &mut [T]) {
    out.par_chunks_mut(n).enumerate().for_each(|(t, o)| {
        let mut acc = vec![0f32; n];
        for j in 0..k {
            if let Ok(s) = usize::try_from(slot[t * k + j]) {
                acc.iter_mut().zip(&y[s * n..][..n]).for_each(|(a, v)| *a += w[t * k + j] * v.to_f32());
            }
        }
        o.iter_mut().zip(&acc).for_each(|(o, &a)| *o = T::from_f32(a));
    });
}

/// Each expert's segment of A times its B in f32 (gemm's cpu_blocked), then the epilogue.
pub fn grouped<T: Elem>(a: &[T], b: &[T], offsets: &[i32], (e, rows, k, n, nc): (usize, usize, usize, usize, usize), ep: Epilogue, c: &mut [T]) {
    let clamp = |v: i32| (v.max(0) as usize).min(rows);
    for x in 0..e {
        let (r0, r1) = (clamp(offsets[x]), clamp(offsets[x + 1]));
        if r1 <= r0 {
            continue;
        }
        let m = r1 - r0;
        let af: Vec<f32> = a[r0 * k..r1 * k].iter().map(|v| v.to_f32()).collect();
        let bf: Vec<f32> = b[x * k * n..][..k * n].iter().map(|v| v.to_f32()).collect();
        let mut acc = vec![0f32; m * n];
        cpu_blocked(&af, &bf, &mut acc, Dims::dense(m, n, k), (1.0, 0.0));
        let seg = &mut c[r0 * nc..r1 * nc];
        match ep {
            Epilogue::Store => seg.iter_mut().zip(&acc).for_each(|(o, &v)| *o = T::from_f32(v)),
            Epilogue::SwiGlu => seg.iter_mut().zip(acc.chunks(2)).for_each(|(o, p)| *o = T::from_f32(swiglu(p[0], p[1]))),
        }
    }
}

/// (dJ/dw [T, k], dy [T k, H]): dy[slot] = w dout_t, dJ/dw = dout_t . y[slot] (0 when dropped).
pub fn combine_backward<T: Elem>(dout: &[T], y: &[T], slot: &[i32], w: &[f32], k: usize, h: usize) -> (Vec<f32>, Vec<T>) {
    let mut dy = vec![T::from_f32(0.0); slot.len() * h];
    let mut dw = vec![0f32; slot.len()];
    for (a, &s) in slot.iter().enumerate() {
        let Ok(s) = usize::try_from(s) else { continue };
        let d = &dout[a / k * h..][..h];
        dw[a] = d.iter().zip(&y[s * h..][..h]).map(|(d, y)| d.to_f32() * y.to_f32()).sum();
        dy[s * h..][..h].iter_mut().zip(d).for_each(|(o, d)| *o = T::from_f32(w[a] * d.to_f32()));
    }
    (dw, dy)
}

/// d(gate, up) interleaved [rows, 2I] for the first `live` rows; act = silu(g) u.
pub fn swiglu_backward<T: Elem>(pre: &[T], dact: &[T], live: usize, i: usize) -> Vec<T> {
    let mut dpre = vec![T::from_f32(0.0); pre.len()];
    dpre.par_chunks_mut(2 * i).zip(pre.par_chunks(2 * i)).zip(dact.par_chunks(i)).take(live).for_each(|((o, p), d)| {
        for c in 0..i {
            let (g, u, d) = (p[2 * c].to_f32(), p[2 * c + 1].to_f32(), d[c].to_f32());
            let s = 1.0 / (1.0 + (-g).exp());
            o[2 * c] = T::from_f32(d * u * s * (1.0 + g * (1.0 - s)));
            o[2 * c + 1] = T::from_f32(d * g * s);
        }
    });
    dpre
}

/// W[e] (K x N) = A[segment e]^T B[segment e] in f32, A [rows, K], B [rows, N].
pub fn grouped_wgrad<T: Elem>(a: &[T], b: &[T], offsets: &[i32], (e, rows, k, n): (usize, usize, usize, usize)) -> Vec<T> {
    let clamp = |v: i32| (v.max(0) as usize).min(rows);
    let mut w = vec![T::from_f32(0.0); e * k * n];
    w.par_chunks_mut(k * n).enumerate().for_each(|(x, we)| {
        let (r0, r1) = (clamp(offsets[x]), clamp(offsets[x + 1]));
        if r1 <= r0 {
            return;
        }
        let at: Vec<f32> = crate::ops::linear::transpose(&a[r0 * k..r1 * k], r1 - r0, k).iter().map(|v| v.to_f32()).collect();
        let bf: Vec<f32> = b[r0 * n..r1 * n].iter().map(|v| v.to_f32()).collect();
        let mut acc = vec![0f32; k * n];
        cpu_blocked(&at, &bf, &mut acc, Dims::dense(k, n, r1 - r0), (1.0, 0.0));
        we.iter_mut().zip(&acc).for_each(|(o, &v)| *o = T::from_f32(v));
    });
    w
}

/// The router's backward token by token, in f32 as route_backward computes it: (d logits, d noise
/// logits) [T, E] from the logits (and noise logits and eps), the routing (experts, dJ/dw, load)
/// and the losses' factors (d_aux alpha E / T, 2 d_z / T).
pub fn route_backward<T: Elem>(
    logits: &[T],
    noise: Option<(&[T], &[f32])>,
    (experts, dw, load): (&[i32], &[f32], &[i32]),
    (t, e): (usize, usize),
    r: &Router,
    (aux_c, z_c): (f32, f32),
) -> (Vec<T>, Option<Vec<T>>) {
    let k = r.k;
    let f: Vec<f32> = load.iter().map(|&n| n as f32 / (t * k) as f32).collect();
    let per: Vec<(Vec<T>, Vec<T>)> = (0..t)
        .into_par_iter()
        .map(|tok| {
            let (l, _, s) = token_scores(logits, noise, tok, e, r.scoring);
            let total: f32 = if r.scoring == Scoring::Sigmoid { s.iter().sum() } else { 1.0 };
            let mut ds = vec![0f32; e];
            let (chosen, dwt) = (&experts[tok * k..][..k], &dw[tok * k..][..k]);
            let sum: f32 = chosen.iter().map(|&j| s[j as usize]).sum();
            let dot: f32 = chosen.iter().zip(dwt).map(|(&j, d)| d * s[j as usize]).sum();
            for (&j, &d) in chosen.iter().zip(dwt) {
                ds[j as usize] += if r.renormalize { d / sum - dot / (sum * sum) } else { d };
            }
            let fs: f32 = f.iter().zip(&s).map(|(a, b)| a * b).sum();
            ds.iter_mut().zip(&f).for_each(|(d, fj)| *d += aux_c * (fj / total - fs / (total * total)));
            let sd: f32 = s.iter().zip(&ds).map(|(a, b)| a * b).sum();
            let dh: Vec<f32> = match r.scoring {
                Scoring::Softmax => (0..e).map(|j| s[j] * (ds[j] - sd)).collect(),
                Scoring::Sigmoid => (0..e).map(|j| ds[j] * s[j] * (1.0 - s[j])).collect(),
            };
            let ml = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let zs: f32 = l.iter().map(|v| (v - ml).exp()).sum();
            let lse = ml + zs.ln();
            let dl = (0..e).map(|j| T::from_f32(dh[j] + z_c * lse * (l[j] - ml).exp() / zs)).collect();
            let dn = match noise {
                Some((n, eps)) => (0..e).map(|j| T::from_f32(dh[j] * eps[tok * e + j] / (1.0 + (-n[tok * e + j].to_f32()).exp()))).collect(),
                None => vec![],
            };
            (dl, dn)
        })
        .collect();
    let dnoise = noise.map(|_| per.iter().flat_map(|p| p.1.iter().copied()).collect());
    (per.into_iter().flat_map(|p| p.0).collect(), dnoise)
}
