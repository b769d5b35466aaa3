//! The layer's backward in f64: the reference `backward` (the op) is checked against. The
//! objective is J = sum(dout * out) + d_aux * aux_loss + d_z * z_loss, so the upstream gradient
//! is dout [T, H] and the objective's weights on the two router losses; selection (top-k) and
//! capacity are held fixed, as every MoE backward holds them.
//!
//! Through the routing: a kept assignment's combine weight w = s_j (or s_j / S, S the sum of
//! the k chosen scores, when renormalised) gets dJ/dw = dout_t . y; the load-balancing loss
//! alpha E sum_i f_i P_i adds alpha E / T (f_m / Z_t - sum_i f_i s_ti / Z_t^2) to dJ/ds_tm (f is a
//! count, Z_t the token's score total); scores go back to the (noisy) logits h through the
//! softmax or sigmoid Jacobian; the z-loss adds 2 lse_t / T softmax(l_t) to the clean logits;
//! h = l + eps softplus(n) passes dh to l and dh eps sigmoid(n) to the noise logits n.

use super::reference::{kept, route_selected, token_scores};
use super::{Router, Scoring};
use crate::tensor::Tensor;

/// The layer's inputs in f64: x [T, H], router [H, E], the noise projection [H, E] and its eps
/// [T, E] for noisy gating, gate_up [E, H, 2I] (interleaved), down [E, I, H].
pub struct Layer<'a> {
    pub x: &'a [f64],
    pub router: &'a [f64],
    pub noise: Option<(&'a [f64], &'a [f64])>,
    pub gate_up: &'a [f64],
    pub down: &'a [f64],
    /// (T, H, E, I).
    pub dims: (usize, usize, usize, usize),
    /// The experts [T, k] to hold fixed, when a backend's choice is to be followed (its logits
    /// were rounded, so a near tie may go the other way); None: the f64 router's own choice.
    pub select: Option<&'a [usize]>,
}

/// dJ with respect to each input of [`Layer`], same shapes; `logits` is dJ/d(x router) [T, E].
#[derive(Debug, Clone)]
pub struct Grads {
    pub x: Vec<f64>,
    pub router: Vec<f64>,
    pub noise: Option<Vec<f64>>,
    pub gate_up: Vec<f64>,
    pub down: Vec<f64>,
    pub logits: Vec<f64>,
}

/// a [rows, inner] times b [inner, cols], rows in parallel.
fn matmul(a: &[f64], b: &[f64], rows: usize, inner: usize, cols: usize) -> Vec<f64> {
    use rayon::prelude::*;
    let mut c = vec![0f64; rows * cols];
    c.par_chunks_mut(cols).enumerate().for_each(|(r, crow)| {
        for k in 0..inner {
            let av = a[r * inner + k];
            for (cv, bv) in crow.iter_mut().zip(&b[k * cols..][..cols]) {
                *cv += av * bv;
            }
        }
    });
    c
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// One expert on one token: (g, u, silu(g) u, y).
fn expert(l: &Layer, tok: usize, ex: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (_, h, _, i) = l.dims;
    let gu = &l.gate_up[ex * h * 2 * i..][..h * 2 * i];
    let (mut g, mut u) = (vec![0f64; i], vec![0f64; i]);
    for (kk, &xv) in l.x[tok * h..][..h].iter().enumerate() {
        for c in 0..i {
            g[c] += xv * gu[kk * 2 * i + 2 * c];
            u[c] += xv * gu[kk * 2 * i + 2 * c + 1];
        }
    }
    let act: Vec<f64> = (0..i).map(|c| g[c] * sigmoid(g[c]) * u[c]).collect();
    let y = matmul(&act, &l.down[ex * i * h..][..i * h], 1, i, h);
    (g, u, act, y)
}

/// The magnitudes of the terms of g and u (sum over k of |x_k w_k|): a backend's g and u carry
/// fp32 accumulation errors and a storage rounding relative to these, not to |g| and |u|, which
/// cancellation can make arbitrarily small (a u near zero can even change sign).
fn pre_scales(l: &Layer, tok: usize, ex: usize) -> (Vec<f64>, Vec<f64>) {
    let (_, h, _, i) = l.dims;
    let gu = &l.gate_up[ex * h * 2 * i..][..h * 2 * i];
    let (mut gs, mut us) = (vec![0f64; i], vec![0f64; i]);
    for (kk, &xv) in l.x[tok * h..][..h].iter().enumerate() {
        for c in 0..i {
            gs[c] += (xv * gu[kk * 2 * i + 2 * c]).abs();
            us[c] += (xv * gu[kk * 2 * i + 2 * c + 1]).abs();
        }
    }
    (gs, us)
}

/// What the router decided, with the logits it decided on.
struct Routed {
    logits: Vec<f64>,
    noise_logits: Option<Vec<f64>>,
    experts: Vec<usize>,
    weights: Vec<f64>,
    load: Vec<usize>,
    keep: Vec<bool>,
    aux: f64,
    z: f64,
}

fn routed(l: &Layer, r: &Router) -> Routed {
    let (t, h, e, _) = l.dims;
    let logits = matmul(l.x, l.router, t, h, e);
    let noise_logits = l.noise.map(|(w, _)| matmul(l.x, w, t, h, e));
    let rt = route_selected(&logits, noise_logits.as_deref().zip(l.noise.map(|n| n.1)), t, e, r, l.select);
    let keep = kept(&rt.experts, t, r.k, e, r.capacity.slots(t, e));
    Routed { logits, noise_logits, experts: rt.experts, weights: rt.weights, load: rt.load, keep, aux: rt.aux_loss, z: rt.z_loss }
}

/// The layer's output [T, H] and its two router losses, in f64.
pub fn forward(l: &Layer, r: &Router) -> (Vec<f64>, f64, f64) {
    let (t, h, _, _) = l.dims;
    let rt = routed(l, r);
    let mut out = vec![0f64; t * h];
    for a in (0..t * r.k).filter(|&a| rt.keep[a]) {
        let y = expert(l, a / r.k, rt.experts[a]).3;
        for (o, yv) in out[a / r.k * h..][..h].iter_mut().zip(&y) {
            *o += rt.weights[a] * yv;
        }
    }
    (out, rt.aux, rt.z)
}

/// dJ for J = sum(dout * out) + d_aux aux_loss + d_z z_loss.
pub fn backward(l: &Layer, r: &Router, dout: &[f64], d_aux: f64, d_z: f64) -> Grads {
    backward_with_scale(l, r, dout, d_aux, d_z, None).0
}

impl Grads {
    /// Zero gradients; the weights' left empty unless `weights`.
    fn zeros(l: &Layer, weights: bool) -> Self {
        let (t, h, e, i) = l.dims;
        let w = |n: usize| vec![0f64; if weights { n } else { 0 }];
        Grads { x: vec![0f64; t * h], router: w(h * e), noise: l.noise.map(|_| w(h * e)), gate_up: w(e * h * 2 * i), down: w(e * i * h), logits: vec![0f64; t * e] }
    }
}

/// [`backward`] and, in the same shapes, each gradient's scale: the same sums taken over the
/// absolute values of their terms, every intermediate replaced by its own scale. A backend
/// that rounds each intermediate to its storage type (relative u of the terms it summed) is off
/// by a few u of this scale, however much the terms cancel: a heavily loaded expert's weight
/// gradient sums hundreds of rows whose total may be far smaller than its terms.
///
/// With `only` (a mask over tokens), only those tokens' rows of dx are computed, at a cost in
/// proportion to them (a large layer's check), and the weight gradients are left empty.
pub fn backward_with_scale(l: &Layer, r: &Router, dout: &[f64], d_aux: f64, d_z: f64, only: Option<&[bool]>) -> (Grads, Grads) {
    let (t, h, e, i) = l.dims;
    let k = r.k;
    let rt = routed(l, r);
    let wanted = |tok: usize| only.is_none_or(|m| m[tok]);
    let weights = only.is_none();
    let (mut g, mut sc) = (Grads::zeros(l, weights), Grads::zeros(l, weights));
    // A backend routes from logits rounded to its storage type: each off by u |l| (and noisy
    // gating's eps softplus(n) by u |eps n|), which moves a score, and so a combine weight, by
    // up to u 2 max |l| relative. Every scale that a score feeds is multiplied by 1 + that.
    let spread: Vec<f64> = (0..t)
        .map(|tok| {
            let noise = |j: usize| match (&rt.noise_logits, l.noise) {
                (Some(n), Some((_, eps))) => (eps[tok * e + j] * n[tok * e + j]).abs(),
                _ => 0.0,
            };
            1.0 + 2.0 * (0..e).map(|j| rt.logits[tok * e + j].abs() + noise(j)).fold(0.0, f64::max)
        })
        .collect();
    // The experts' own backward, and dJ/dw of each assignment (0 where it was dropped).
    let (mut dw, mut dw_sc) = (vec![0f64; t * k], vec![0f64; t * k]);
    for a in (0..t * k).filter(|&a| rt.keep[a] && wanted(a / k)) {
        let (tok, ex, w) = (a / k, rt.experts[a], rt.weights[a]);
        let (gv, uv, act, y) = expert(l, tok, ex);
        let (g_sc, u_sc) = pre_scales(l, tok, ex);
        // sigmoid(g), silu(g) = g sigmoid(g) and silu'(g), per column.
        let sg: Vec<f64> = gv.iter().map(|&g| sigmoid(g)).collect();
        let silu: Vec<f64> = gv.iter().zip(&sg).map(|(g, s)| g * s).collect();
        let silu1: Vec<f64> = gv.iter().zip(&sg).map(|(g, s)| s * (1.0 + g * (1.0 - s))).collect();
        // act = silu(g) u moves by |silu'(g) u| dg + |silu(g)| du.
        let act_sc: Vec<f64> = (0..i).map(|c| (silu1[c] * uv[c]).abs() * g_sc[c] + silu[c].abs() * u_sc[c]).collect();
        let dout_t = &dout[tok * h..][..h];
        let dn = &l.down[ex * i * h..][..i * h];
        let y_sc: Vec<f64> = (0..h).map(|c| (0..i).map(|q| act_sc[q] * dn[q * h + c].abs()).sum()).collect();
        dw[a] = dout_t.iter().zip(&y).map(|(d, y)| d * y).sum();
        dw_sc[a] = dout_t.iter().zip(&y_sc).map(|(d, y)| d.abs() * y).sum();
        let dy: Vec<f64> = dout_t.iter().map(|d| w * d).collect();
        let dy_sc: Vec<f64> = dy.iter().map(|d| d.abs() * spread[tok]).collect();
        let d_act: Vec<f64> = (0..i).map(|c| dn[c * h..][..h].iter().zip(&dy).map(|(a, b)| a * b).sum()).collect();
        let d_act_sc: Vec<f64> = (0..i).map(|c| dn[c * h..][..h].iter().zip(&dy_sc).map(|(a, b)| a.abs() * b).sum()).collect();
        if weights {
            let (dd, dd_sc) = (&mut g.down[ex * i * h..][..i * h], &mut sc.down[ex * i * h..][..i * h]);
            for (c, a) in act.iter().enumerate() {
                for hh in 0..h {
                    dd[c * h + hh] += a * dy[hh];
                    dd_sc[c * h + hh] += act_sc[c] * dy_sc[hh];
                }
            }
        }
        let (mut dg, mut du, mut dg_sc, mut du_sc) = (vec![0f64; i], vec![0f64; i], vec![0f64; i], vec![0f64; i]);
        for c in 0..i {
            let (s, sp) = (sg[c], silu1[c]);
            let (pg, pu) = (uv[c] * sp, silu[c]);
            (dg[c], du[c]) = (d_act[c] * pg, d_act[c] * pu);
            // silu'(g) is 0 near g = -1.28, where g's error (u of g's terms) still moves it by
            // silu''(g) u g_sc; u's error moves pg by silu'(g) u_sc, g's moves pu by silu'(g) g_sc.
            let silu2 = s * (1.0 - s) * (2.0 + gv[c] * (1.0 - 2.0 * s));
            (dg_sc[c], du_sc[c]) = (
                d_act_sc[c] * (pg.abs() + (sp * u_sc[c]).abs() + (uv[c] * silu2).abs() * g_sc[c]),
                d_act_sc[c] * (pu.abs() + sp.abs() * g_sc[c]),
            );
        }
        let gu = &l.gate_up[ex * h * 2 * i..][..h * 2 * i];
        for kk in 0..h {
            let xv = l.x[tok * h + kk];
            let at = ex * h * 2 * i + kk * 2 * i;
            for c in 0..i {
                let (wg, wu) = (gu[kk * 2 * i + 2 * c], gu[kk * 2 * i + 2 * c + 1]);
                g.x[tok * h + kk] += wg * dg[c] + wu * du[c];
                sc.x[tok * h + kk] += wg.abs() * dg_sc[c] + wu.abs() * du_sc[c];
                if weights {
                    g.gate_up[at + 2 * c] += xv * dg[c];
                    g.gate_up[at + 2 * c + 1] += xv * du[c];
                    sc.gate_up[at + 2 * c] += xv.abs() * dg_sc[c];
                    sc.gate_up[at + 2 * c + 1] += xv.abs() * du_sc[c];
                }
            }
        }
    }
    // Through the router, token by token: scores, then (noisy) logits.
    let f: Vec<f64> = rt.load.iter().map(|&n| n as f64 / (t * k) as f64).collect();
    let (mut d_noise, mut d_noise_sc) = (vec![0f64; t * e], vec![0f64; t * e]);
    let noise = rt.noise_logits.as_deref().zip(l.noise.map(|n| n.1));
    for tok in (0..t).filter(|&tok| wanted(tok)) {
        let lg = &rt.logits[tok * e..][..e];
        let s = token_scores(&rt.logits, noise, tok, e, r).1;
        let (mut ds, mut ds_sc) = (vec![0f64; e], vec![0f64; e]);
        let chosen = &rt.experts[tok * k..][..k];
        let (dwt, dwt_sc) = (&dw[tok * k..][..k], &dw_sc[tok * k..][..k]);
        if r.renormalize {
            let sum: f64 = chosen.iter().map(|&j| s[j]).sum();
            let dot: f64 = chosen.iter().zip(dwt).map(|(&j, d)| d * s[j]).sum();
            let dot_sc: f64 = chosen.iter().zip(dwt_sc).map(|(&j, d)| d * s[j]).sum();
            for ((&j, d), d_sc) in chosen.iter().zip(dwt).zip(dwt_sc) {
                ds[j] += d / sum - dot / (sum * sum);
                ds_sc[j] += d_sc / sum + dot_sc / (sum * sum);
            }
        } else {
            for ((&j, d), d_sc) in chosen.iter().zip(dwt).zip(dwt_sc) {
                ds[j] += d;
                ds_sc[j] += d_sc;
            }
        }
        let total: f64 = s.iter().sum();
        let fs: f64 = f.iter().zip(&s).map(|(a, b)| a * b).sum();
        let c = d_aux * r.aux_alpha * e as f64 / t as f64;
        for j in 0..e {
            let aux = c * (f[j] / total - fs / (total * total));
            ds[j] += aux;
            ds_sc[j] += aux.abs();
        }
        let (dh, dh_sc): (Vec<f64>, Vec<f64>) = match r.scoring {
            Scoring::Softmax => {
                let sd: f64 = s.iter().zip(&ds).map(|(a, b)| a * b).sum();
                let sd_sc: f64 = s.iter().zip(&ds_sc).map(|(a, b)| a * b).sum();
                ((0..e).map(|j| s[j] * (ds[j] - sd)).collect(), (0..e).map(|j| s[j] * (ds_sc[j] + sd_sc)).collect())
            }
            Scoring::Sigmoid => ((0..e).map(|j| ds[j] * s[j] * (1.0 - s[j])).collect(), (0..e).map(|j| ds_sc[j] * s[j] * (1.0 - s[j])).collect()),
        };
        let ml = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let zs: f64 = lg.iter().map(|v| (v - ml).exp()).sum();
        let lse = ml + zs.ln();
        for j in 0..e {
            let z = d_z * 2.0 * lse / t as f64 * (lg[j] - ml).exp() / zs;
            g.logits[tok * e + j] = dh[j] + z;
            sc.logits[tok * e + j] = (dh_sc[j] + z.abs()) * spread[tok];
        }
        if let (Some(n), Some((_, eps))) = (&rt.noise_logits, l.noise) {
            for j in 0..e {
                let p = eps[tok * e + j] * sigmoid(n[tok * e + j]);
                d_noise[tok * e + j] = dh[j] * p;
                d_noise_sc[tok * e + j] = dh_sc[j] * p.abs() * spread[tok];
            }
        }
    }
    // The projections: d W = x^T d logits, dx += d logits W^T; their scales from |x| and |W|.
    let project = |x: &[f64], d: &[f64], w: &[f64], dw: &mut [f64], dx: &mut [f64]| {
        for tok in (0..t).filter(|&tok| wanted(tok)) {
            for kk in 0..h {
                let xv = x[tok * h + kk];
                for j in 0..e {
                    if weights {
                        dw[kk * e + j] += xv * d[tok * e + j];
                    }
                    dx[tok * h + kk] += d[tok * e + j] * w[kk * e + j];
                }
            }
        }
    };
    let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<f64>>();
    let x_abs = abs(l.x);
    project(l.x, &g.logits, l.router, &mut g.router, &mut g.x);
    project(&x_abs, &sc.logits, &abs(l.router), &mut sc.router, &mut sc.x);
    if let (Some((w, _)), Some(dn), Some(dn_sc)) = (l.noise, g.noise.as_mut(), sc.noise.as_mut()) {
        project(l.x, &d_noise, w, dn, &mut g.x);
        project(&x_abs, &d_noise_sc, &abs(w), dn_sc, &mut sc.x);
    }
    (g, sc)
}

/// How many unit roundoffs of the storage type, times an element's scale
/// ([`backward_with_scale`]), it may be off, and how many of its smallest subnormals besides:
/// the path to a gradient rounds to the storage type at most 8 times (pre-activations,
/// activations, y, dy, d act, d pre or d logits, the gradient), each off by u of a value no
/// larger than its scale, or by half a subnormal where it underflows (f16 flushes a weight of
/// 1e-13 to 0); sums are f32 (2^-24, far below u).
pub const ALLOW_UNITS: f64 = 8.0;

/// The bound per element above is a worst case, loose where a score's rounding is multiplied
/// by large logits; each gradient must also be within this many u in relative Frobenius norm
/// (the lab's CPU path is at 0.4 to 2.4 u in bf16 and f16 on the sweep's gates): a gradient
/// missing the z-loss's term is off by 0.9 in norm while every element stays inside its bound.
pub const FROB_UNITS: f64 = 4.0;

/// The same for the router's (and noise projection's) gradients, x^T d logits: with few tokens
/// d logits are a handful of sums of H products that cancel, each keeping the error of its terms
/// rather than of its value. At Mixtral's layer with one token torch autograd's router gradient
/// is 9.6 u off in norm and the lab's 12 u (run 2026-11-29T10-03-32Z, every element inside its
/// bound); the missing z-loss term is ~230 u off.
pub const ROUTER_FROB_UNITS: f64 = 24.0;

/// The names of the gradients [`compare`] lays end to end, in its order.
pub const PARTS: [&str; 5] = ["x", "router", "noise", "gate_up", "down"];

/// Each gradient against the f64 one (`want`, with its `scale`), element by element within
/// ALLOW_UNITS u of the scale and in norm within FROB_UNITS (ROUTER_FROB_UNITS) u (a gradient over it counts one
/// mismatch more), laid end to end in [`PARTS`] order (noise only under noisy gating).
pub fn compare(got: [Option<&[f64]>; 5], (want, scale): &(Grads, Grads), dtype: crate::kernels::DType) -> crate::record::ErrorStats {
    use crate::ops::compare::{compare_within, frobenius_rel, merge_parts};
    let unit = super::reference::unit(dtype);
    let subnormal = 2.0 * crate::ops::compare::ProductBound::fp32_accumulation(1, dtype).atol;
    fn parts_of(g: &Grads) -> [Option<&[f64]>; 5] {
        [Some(&g.x), Some(&g.router), g.noise.as_deref(), Some(&g.gate_up), Some(&g.down)]
    }
    let mut parts = Vec::new();
    let mut offset = 0;
    let mut frob = Vec::new();
    for (((name, g), w), sc) in PARTS.iter().zip(got).zip(parts_of(want)).zip(parts_of(scale)) {
        let (Some(g), Some(w), Some(sc)) = (g, w, sc) else { continue };
        let allow: Vec<f64> = sc.iter().map(|v| ALLOW_UNITS * (unit * v + subnormal)).collect();
        let mut part = compare_within(g, w, &allow, "", "");
        let f = frobenius_rel(g, w);
        let over = f > if matches!(*name, "router" | "noise") { ROUTER_FROB_UNITS } else { FROB_UNITS } * unit;
        if over {
            part.mismatches += 1;
        }
        parts.push((part, offset));
        frob.push(format!("{name} {f:.2e}{}", if over { " (over)" } else { "" }));
        offset += w.len();
    }
    let mut stats = merge_parts(parts);
    stats.bound = Some(format!("per element {ALLOW_UNITS} (u of the sum of its terms' magnitudes + the smallest subnormal) (moe::backward_reference::backward_with_scale), and {FROB_UNITS} u in relative Frobenius norm per gradient ({ROUTER_FROB_UNITS} u for the router's and the noise projection's): {}", frob.join(", ")));
    stats.reference = "cpu-f64 backward (moe::backward_reference), the backend's selection held fixed".into();
    stats
}

/// The f64 gradients and their scales for the op's inputs (widened), its selection `select`
/// [T, k] held fixed; with `only`, dx of those tokens alone ([`backward_with_scale`]).
pub fn expected<T: crate::ops::Elem>(x: &Tensor<T>, w: &super::Weights<T>, r: &Router, up: &super::Upstream<T>, select: &[usize], only: Option<&[bool]>) -> crate::Result<(Grads, Grads)> {
    use crate::ops::widen;
    let (t, h, e, i) = super::layer_dims(x, w)?;
    let eps: Option<Vec<f64>> = r.noise_seed.map(|seed| super::noise_eps(seed, t, e).iter().map(|&v| v as f64).collect());
    let noise_w = w.noise.as_ref().map(|n| n.to_vec().map(|v| widen(&v))).transpose()?;
    let (xv, router, gate_up, down) = (widen(&x.to_vec()?), widen(&w.router.to_vec()?), widen(&w.gate_up.to_vec()?), widen(&w.down.to_vec()?));
    let noise = noise_w.as_deref().zip(eps.as_deref());
    let l = Layer { x: &xv, router: &router, noise, gate_up: &gate_up, down: &down, dims: (t, h, e, i), select: Some(select) };
    Ok(backward_with_scale(&l, r, &widen(&up.dout.to_vec()?), up.d_aux as f64, up.d_z as f64, only))
}

/// The op's gradients widened, in [`PARTS`] order.
pub fn widened<T: crate::ops::Elem>(g: &super::Grads<T>) -> crate::Result<[Option<Vec<f64>>; 5]> {
    let w = |t: &Tensor<T>| t.to_vec().map(|v| crate::ops::widen(&v));
    Ok([Some(w(&g.x)?), Some(w(&g.router)?), g.noise.as_ref().map(w).transpose()?, Some(w(&g.gate_up)?), Some(w(&g.down)?)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::moe::Capacity;
    use rand::{Rng, SeedableRng};

    /// J at the inputs, for central differences.
    fn objective(l: &Layer, r: &Router, dout: &[f64], d_aux: f64, d_z: f64) -> f64 {
        let (out, aux, z) = forward(l, r);
        out.iter().zip(dout).map(|(a, b)| a * b).sum::<f64>() + d_aux * aux + d_z * z
    }

    /// Central differences at 24 random coordinates of every input against [`backward`].
    fn check(r: Router, noisy: bool, seed: u64) {
        let (t, h, e, i) = (7, 6, 5, 3);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut v = |n: usize, s: f64| -> Vec<f64> { (0..n).map(|_| rng.random_range(-1.0..1.0) * s).collect() };
        // x, router, noise projection, gate_up, down: the inputs J is differentiated against.
        let (x, router, noise_w, eps) = (v(t * h, 1.0), v(h * e, 1.0), v(h * e, 0.5), v(t * e, 1.0));
        let (gate_up, down, dout) = (v(e * h * 2 * i, 0.7), v(e * i * h, 0.7), v(t * h, 1.0));
        let mut inputs = [x, router, noise_w, gate_up, down];
        let (d_aux, d_z) = (0.8, 0.3);
        fn layer<'a>([x, router, nw, gate_up, down]: &'a [Vec<f64>; 5], eps: Option<&'a [f64]>, dims: (usize, usize, usize, usize)) -> Layer<'a> {
            Layer { x, router, noise: eps.map(|eps| (&nw[..], eps)), gate_up, down, dims, select: None }
        }
        let (eps, dims) = (noisy.then_some(&eps[..]), (t, h, e, i));
        let g = backward(&layer(&inputs, eps, dims), &r, &dout, d_aux, d_z);
        let grads = [&g.x, &g.router, g.noise.as_ref().unwrap_or(&g.x), &g.gate_up, &g.down];
        let step = 1e-6;
        let mut pick = rand::rngs::StdRng::seed_from_u64(seed + 1);
        for which in (0..5).filter(|&w| noisy || w != 2) {
            for _ in 0..24 {
                let at = pick.random_range(0..inputs[which].len());
                let keep = inputs[which][at];
                let mut at_value = |value: f64| {
                    inputs[which][at] = value;
                    objective(&layer(&inputs, eps, dims), &r, &dout, d_aux, d_z)
                };
                let (plus, minus) = (at_value(keep + step), at_value(keep - step));
                inputs[which][at] = keep;
                let fd = (plus - minus) / (2.0 * step);
                let grad = grads[which][at];
                assert!((fd - grad).abs() <= 1e-6 * (1.0 + fd.abs()), "{r:?} noisy {noisy}: input {which} at {at}: finite difference {fd}, backward {grad}");
            }
        }
    }

    #[test]
    fn the_backward_is_the_objectives_gradient() {
        let base = Router::top_k(2);
        check(base, false, 1);
        check(Router { renormalize: false, ..base }, false, 2);
        check(Router { scoring: Scoring::Sigmoid, ..base }, false, 3);
        check(Router { capacity: Capacity::Factor(1.0), k: 3, ..base }, false, 4);
        check(Router { noise_seed: Some(9), ..base }, true, 5);
    }

    #[test]
    fn a_planted_fault_in_the_backward_is_caught() {
        // The test above must be able to fail: drop the z-loss's term and the check trips.
        let r = Router::top_k(2);
        let result = std::panic::catch_unwind(|| {
            let (t, h, e, i) = (3, 4, 4, 2);
            let x: Vec<f64> = (0..t * h).map(|v| (v as f64 * 0.37).sin()).collect();
            let router: Vec<f64> = (0..h * e).map(|v| (v as f64 * 0.61).cos()).collect();
            let gate_up: Vec<f64> = (0..e * h * 2 * i).map(|v| (v as f64 * 0.13).sin()).collect();
            let down: Vec<f64> = (0..e * i * h).map(|v| (v as f64 * 0.29).cos()).collect();
            let dout = vec![0.0; t * h];
            let l = Layer { x: &x, router: &router, noise: None, gate_up: &gate_up, down: &down, dims: (t, h, e, i), select: None };
            // With d_z = 0 in the backward but 1 in the objective, the gradient misses the z-loss.
            let g = backward(&l, &r, &dout, 0.0, 0.0);
            let mut xr = router.clone();
            xr[0] += 1e-6;
            let plus = objective(&Layer { router: &xr, ..l }, &r, &dout, 0.0, 1.0);
            xr[0] -= 2e-6;
            let minus = objective(&Layer { router: &xr, ..l }, &r, &dout, 0.0, 1.0);
            let fd = (plus - minus) / 2e-6;
            assert!((fd - g.router[0]).abs() <= 1e-6 * (1.0 + fd.abs()), "fd {fd} against {}", g.router[0]);
        });
        assert!(result.is_err(), "a gradient missing the z-loss passed the finite-difference check");
    }
}
