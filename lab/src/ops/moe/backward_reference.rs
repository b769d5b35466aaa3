//! The layer's backward in f64: the reference a backward kernel is checked against. The
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

use super::reference::{kept, route, token_scores};
use super::{Router, Scoring};

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

/// a [rows, inner] times b [inner, cols].
fn matmul(a: &[f64], b: &[f64], rows: usize, inner: usize, cols: usize) -> Vec<f64> {
    let mut c = vec![0f64; rows * cols];
    for r in 0..rows {
        for k in 0..inner {
            let av = a[r * inner + k];
            for (cv, bv) in c[r * cols..][..cols].iter_mut().zip(&b[k * cols..][..cols]) {
                *cv += av * bv;
            }
        }
    }
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
    let rt = route(&logits, noise_logits.as_deref().zip(l.noise.map(|n| n.1)), t, e, r);
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
    let (t, h, e, i) = l.dims;
    let k = r.k;
    let rt = routed(l, r);
    let mut g = Grads {
        x: vec![0f64; t * h],
        router: vec![0f64; h * e],
        noise: l.noise.map(|_| vec![0f64; h * e]),
        gate_up: vec![0f64; e * h * 2 * i],
        down: vec![0f64; e * i * h],
        logits: vec![0f64; t * e],
    };
    // The experts' own backward, and dJ/dw of each assignment (0 where it was dropped).
    let mut dw = vec![0f64; t * k];
    for a in (0..t * k).filter(|&a| rt.keep[a]) {
        let (tok, ex, w) = (a / k, rt.experts[a], rt.weights[a]);
        let (gv, uv, act, y) = expert(l, tok, ex);
        let dout_t = &dout[tok * h..][..h];
        dw[a] = dout_t.iter().zip(&y).map(|(d, y)| d * y).sum();
        let dy: Vec<f64> = dout_t.iter().map(|d| w * d).collect();
        let dn = &l.down[ex * i * h..][..i * h];
        let d_act: Vec<f64> = (0..i).map(|c| dn[c * h..][..h].iter().zip(&dy).map(|(a, b)| a * b).sum()).collect();
        let dd = &mut g.down[ex * i * h..][..i * h];
        for (c, a) in act.iter().enumerate() {
            for (dv, y) in dd[c * h..][..h].iter_mut().zip(&dy) {
                *dv += a * y;
            }
        }
        let (mut dg, mut du) = (vec![0f64; i], vec![0f64; i]);
        for c in 0..i {
            let s = sigmoid(gv[c]);
            dg[c] = d_act[c] * uv[c] * s * (1.0 + gv[c] * (1.0 - s));
            du[c] = d_act[c] * gv[c] * s;
        }
        let gu = &l.gate_up[ex * h * 2 * i..][..h * 2 * i];
        for kk in 0..h {
            let xv = l.x[tok * h + kk];
            for c in 0..i {
                g.gate_up[ex * h * 2 * i + kk * 2 * i + 2 * c] += xv * dg[c];
                g.gate_up[ex * h * 2 * i + kk * 2 * i + 2 * c + 1] += xv * du[c];
                g.x[tok * h + kk] += gu[kk * 2 * i + 2 * c] * dg[c] + gu[kk * 2 * i + 2 * c + 1] * du[c];
            }
        }
    }
    // Through the router, token by token: scores, then (noisy) logits.
    let f: Vec<f64> = rt.load.iter().map(|&n| n as f64 / (t * k) as f64).collect();
    let mut d_noise = vec![0f64; t * e];
    let noise = rt.noise_logits.as_deref().zip(l.noise.map(|n| n.1));
    for tok in 0..t {
        let lg = &rt.logits[tok * e..][..e];
        let s = token_scores(&rt.logits, noise, tok, e, r).1;
        let mut ds = vec![0f64; e];
        let chosen = &rt.experts[tok * k..][..k];
        let dwt = &dw[tok * k..][..k];
        if r.renormalize {
            let sum: f64 = chosen.iter().map(|&j| s[j]).sum();
            let dot: f64 = chosen.iter().zip(dwt).map(|(&j, d)| d * s[j]).sum();
            for (&j, d) in chosen.iter().zip(dwt) {
                ds[j] += d / sum - dot / (sum * sum);
            }
        } else {
            for (&j, d) in chosen.iter().zip(dwt) {
                ds[j] += d;
            }
        }
        let total: f64 = s.iter().sum();
        let fs: f64 = f.iter().zip(&s).map(|(a, b)| a * b).sum();
        let c = d_aux * r.aux_alpha * e as f64 / t as f64;
        for j in 0..e {
            ds[j] += c * (f[j] / total - fs / (total * total));
        }
        let dh: Vec<f64> = match r.scoring {
            Scoring::Softmax => {
                let sd: f64 = s.iter().zip(&ds).map(|(a, b)| a * b).sum();
                (0..e).map(|j| s[j] * (ds[j] - sd)).collect()
            }
            Scoring::Sigmoid => (0..e).map(|j| ds[j] * s[j] * (1.0 - s[j])).collect(),
        };
        let ml = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let zs: f64 = lg.iter().map(|v| (v - ml).exp()).sum();
        let lse = ml + zs.ln();
        for j in 0..e {
            g.logits[tok * e + j] = dh[j] + d_z * 2.0 * lse / t as f64 * (lg[j] - ml).exp() / zs;
        }
        if let (Some(n), Some((_, eps))) = (&rt.noise_logits, l.noise) {
            for j in 0..e {
                d_noise[tok * e + j] = dh[j] * eps[tok * e + j] * sigmoid(n[tok * e + j]);
            }
        }
    }
    // The projections: d W = x^T d logits, dx += d logits W^T.
    let project = |d: &[f64], w: &[f64], dw: &mut [f64], dx: &mut [f64]| {
        for tok in 0..t {
            for kk in 0..h {
                let xv = l.x[tok * h + kk];
                for j in 0..e {
                    dw[kk * e + j] += xv * d[tok * e + j];
                    dx[tok * h + kk] += d[tok * e + j] * w[kk * e + j];
                }
            }
        }
    };
    project(&g.logits, l.router, &mut g.router, &mut g.x);
    if let (Some((w, _)), Some(dn)) = (l.noise, g.noise.as_mut()) {
        project(&d_noise, w, dn, &mut g.x);
    }
    g
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
            Layer { x, router, noise: eps.map(|eps| (&nw[..], eps)), gate_up, down, dims }
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
            let l = Layer { x: &x, router: &router, noise: None, gate_up: &gate_up, down: &down, dims: (t, h, e, i) };
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
