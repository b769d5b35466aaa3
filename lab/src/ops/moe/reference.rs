//! The f64 reference: routing, capacity, losses, and the layer with each output element's
//! allowance (a forward error bound of what the kernels round, derived below), and a dense
//! masked layer (every expert on every token, gated by a [T, E] weight matrix) to check the
//! dropless path against.

use super::{Router, Scoring};
use crate::kernels::DType;
use crate::ops::Elem;
use rayon::prelude::*;

/// What the reference router decided.
#[derive(Clone, Debug)]
pub struct RouteRef {
    /// [T, k], best first, ties to the lower index.
    pub experts: Vec<usize>,
    pub weights: Vec<f64>,
    /// [E] assignments per expert before any drop.
    pub load: Vec<usize>,
    pub aux_loss: f64,
    pub z_loss: f64,
}

fn softplus(x: f64) -> f64 {
    if x > 30.0 { x } else { x.exp().ln_1p() }
}

/// Token i's selection logits h (logits + eps softplus(noise logits) under noisy gating) and its
/// scores (softmax or sigmoid of h): what [`route`] and the backward both start from.
pub fn token_scores(logits: &[f64], noise: Option<(&[f64], &[f64])>, i: usize, e: usize, r: &Router) -> (Vec<f64>, Vec<f64>) {
    let l = &logits[i * e..][..e];
    let h: Vec<f64> = match noise {
        Some((n, eps)) => (0..e).map(|j| l[j] + eps[i * e + j] * softplus(n[i * e + j])).collect(),
        None => l.to_vec(),
    };
    let m = h.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let scores: Vec<f64> = match r.scoring {
        Scoring::Softmax => {
            let z: f64 = h.iter().map(|v| (v - m).exp()).sum();
            h.iter().map(|v| (v - m).exp() / z).collect()
        }
        Scoring::Sigmoid => h.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
    };
    (h, scores)
}

/// The router in f64 from stored logits (and noise logits and eps), as the module documents it.
pub fn route(logits: &[f64], noise: Option<(&[f64], &[f64])>, t: usize, e: usize, r: &Router) -> RouteRef {
    route_selected(logits, noise, t, e, r, None)
}

/// [`route`], or, with `select` ([T, k] experts), weights, load and losses for that selection:
/// how a check holds fixed the choice a backend made at a near tie.
pub fn route_selected(logits: &[f64], noise: Option<(&[f64], &[f64])>, t: usize, e: usize, r: &Router, select: Option<&[usize]>) -> RouteRef {
    let mut out = RouteRef { experts: Vec::new(), weights: Vec::new(), load: vec![0; e], aux_loss: 0.0, z_loss: 0.0 };
    let mut p_sum = vec![0f64; e];
    for i in 0..t {
        let l = &logits[i * e..][..e];
        let (h, scores) = token_scores(logits, noise, i, e, r);
        // Selection by repeated maximum: the first index of the largest remaining value.
        let mut taken = vec![false; e];
        let mut kept = Vec::with_capacity(r.k);
        if let Some(sel) = select {
            kept.extend_from_slice(&sel[i * r.k..][..r.k]);
        }
        for _ in kept.len()..r.k {
            let best = (0..e).filter(|&j| !taken[j]).fold(None, |b: Option<usize>, j| match b {
                Some(b) if h[b] >= h[j] => Some(b),
                _ => Some(j),
            });
            let j = best.expect("k <= E");
            taken[j] = true;
            kept.push(j);
        }
        let sum_kept: f64 = kept.iter().map(|&j| scores[j]).sum();
        for &j in &kept {
            out.load[j] += 1;
            out.experts.push(j);
            out.weights.push(if r.renormalize { scores[j] / sum_kept } else { scores[j] });
        }
        let total: f64 = scores.iter().sum();
        p_sum.iter_mut().zip(&scores).for_each(|(p, s)| *p += s / total);
        let ml = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = ml + l.iter().map(|v| (v - ml).exp()).sum::<f64>().ln();
        out.z_loss += lse * lse / t as f64;
    }
    let f_p: f64 = out.load.iter().zip(&p_sum).map(|(&f, &p)| f as f64 / (t * r.k) as f64 * p / t as f64).sum();
    out.aux_loss = r.aux_alpha * e as f64 * f_p;
    out
}

/// Which assignments an expert keeps under `cap` slots: for each expert, its assignments in
/// slot-major order (choice j, then token), the first `cap` of them.
pub fn kept(experts: &[usize], t: usize, k: usize, e: usize, cap: usize) -> Vec<bool> {
    let mut keep = vec![false; t * k];
    for x in 0..e {
        let mut mine: Vec<(usize, usize)> = (0..t * k).filter(|&a| experts[a] == x).map(|a| (a % k, a / k)).collect();
        mine.sort_unstable();
        for &(j, i) in mine.iter().take(cap) {
            keep[i * k + j] = true;
        }
    }
    keep
}

/// Unit roundoff of a storage type.
pub fn unit(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::Bf16 => 2f64.powi(-8),
    }
}

const U32: f64 = 1.0 / (1u64 << 24) as f64;

/// The layer at `tokens` and each element's allowance.
pub struct LayerRef {
    /// [tokens.len(), H].
    pub out: Vec<f64>,
    pub allow: Vec<f64>,
}

/// The layer's output rows at `tokens`, given the routing (experts and weights [T, k], and
/// which assignments were kept), in f64 from the stored inputs, with the allowance of a
/// computation that accumulates in f32 and stores the SwiGLU activations, the expert outputs
/// and the result in T:
/// - g, u: |dg| <= gamma_H Sg with gamma_H = 2 (H + 2) u32 and Sg = sum_k |x_k| |Wg_k| (as gemm);
/// - g and u perhaps rounded to T: eg = gamma_H Sg + u_T |g|, eu likewise;
/// - h = silu(g) u, rounded to T: |dh| <= (u_T + 8 u32) |h| + |silu'(g)| |u| eg + |silu(g)| eu;
/// - y = h W2, rounded to T: |dy| <= sum_i |dh_i| |W2_i| + gamma_I sum_i |h_i| |W2_i| + u_T |y|;
/// - out = sum_j w_j y_j in f32, rounded to T: sum_j (|w_j| |dy_j| + dw |w_j| |y_j|) + (k + 1) u32
///   sum_j |w_j y_j| + u_T |out|, with dw = (2 E + 16) u32 for weights computed in f32;
///
/// all doubled against second-order terms, plus half T's smallest subnormal.
#[allow(clippy::too_many_arguments)]
pub fn layer<T: Elem>(x: &[T], gate_up: &[T], down: &[T], (h, e, i): (usize, usize, usize), k: usize, experts: &[usize], weights: &[f64], keep: &[bool], tokens: &[usize]) -> LayerRef {
    let ut = unit(T::DTYPE);
    let (gamma_h, gamma_i) = (2.0 * (h as f64 + 2.0) * U32, 2.0 * (i as f64 + 2.0) * U32);
    let dw = (2.0 * e as f64 + 16.0) * U32;
    let rows: Vec<(Vec<f64>, Vec<f64>)> = tokens
        .par_iter()
        .map(|&t| {
            let xt: Vec<f64> = x[t * h..][..h].iter().map(|v| v.to_f64()).collect();
            let (mut out, mut err, mut mag) = (vec![0f64; h], vec![0f64; h], vec![0f64; h]);
            for j in 0..k {
                let a = t * k + j;
                if !keep[a] {
                    continue;
                }
                let (ex, w) = (experts[a], weights[a]);
                let gu = &gate_up[ex * h * 2 * i..][..h * 2 * i];
                let (mut g, mut u, mut sg, mut su) = (vec![0f64; i], vec![0f64; i], vec![0f64; i], vec![0f64; i]);
                for (kk, &xv) in xt.iter().enumerate() {
                    let row = &gu[kk * 2 * i..][..2 * i];
                    for c in 0..i {
                        let (wg, wu) = (row[2 * c].to_f64(), row[2 * c + 1].to_f64());
                        g[c] += xv * wg;
                        u[c] += xv * wu;
                        sg[c] += (xv * wg).abs();
                        su[c] += (xv * wu).abs();
                    }
                }
                let mut hv = vec![0f64; i];
                let mut dh = vec![0f64; i];
                for c in 0..i {
                    let s = 1.0 / (1.0 + (-g[c]).exp());
                    let silu = g[c] * s;
                    let dsilu = s * (1.0 + g[c] * (1.0 - s));
                    hv[c] = silu * u[c];
                    // g and u may be stored in T before the activation (cublas_loop): one more rounding each.
                    let (eg, eu) = (gamma_h * sg[c] + ut * g[c].abs(), gamma_h * su[c] + ut * u[c].abs());
                    dh[c] = (ut + 8.0 * U32) * hv[c].abs() + dsilu.abs() * u[c].abs() * eg + silu.abs() * eu;
                }
                let dn = &down[ex * i * h..][..i * h];
                let (mut y, mut dy, mut sy) = (vec![0f64; h], vec![0f64; h], vec![0f64; h]);
                for c in 0..i {
                    let row = &dn[c * h..][..h];
                    for (o, wv) in row.iter().enumerate() {
                        let wv = wv.to_f64();
                        y[o] += hv[c] * wv;
                        dy[o] += dh[c] * wv.abs();
                        sy[o] += (hv[c] * wv).abs();
                    }
                }
                for o in 0..h {
                    let dyo = dy[o] + gamma_i * sy[o] + ut * y[o].abs();
                    out[o] += w * y[o];
                    err[o] += w.abs() * dyo + dw * (w * y[o]).abs();
                    mag[o] += (w * y[o]).abs();
                }
            }
            let subnormal = match T::DTYPE {
                DType::F32 => 2f64.powi(-150),
                DType::F16 => 2f64.powi(-25),
                DType::Bf16 => 2f64.powi(-134),
            };
            let allow = (0..h).map(|o| 2.0 * (err[o] + (k as f64 + 1.0) * U32 * mag[o] + ut * out[o].abs()) + subnormal).collect();
            (out, allow)
        })
        .collect();
    let (mut out, mut allow) = (Vec::new(), Vec::new());
    for (o, a) in rows {
        out.extend(o);
        allow.extend(a);
    }
    LayerRef { out, allow }
}

/// Every expert on every token, in f64, weighted by `gates` [T, E] (0 where a token does not
/// use an expert): what the dropless layer must equal.
pub fn dense_masked(x: &[f64], gate_up: &[f64], down: &[f64], (t, h, e, i): (usize, usize, usize, usize), gates: &[f64]) -> Vec<f64> {
    let mut out = vec![0f64; t * h];
    out.par_chunks_mut(h).enumerate().for_each(|(tok, o)| {
        for ex in 0..e {
            let gu = &gate_up[ex * h * 2 * i..];
            let act: Vec<f64> = (0..i)
                .map(|c| {
                    let g: f64 = (0..h).map(|kk| x[tok * h + kk] * gu[kk * 2 * i + 2 * c]).sum();
                    let u: f64 = (0..h).map(|kk| x[tok * h + kk] * gu[kk * 2 * i + 2 * c + 1]).sum();
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            for (col, ov) in o.iter_mut().enumerate() {
                let y: f64 = (0..i).map(|c| act[c] * down[ex * i * h + c * h + col]).sum();
                *ov += gates[tok * e + ex] * y;
            }
        }
    });
    out
}
