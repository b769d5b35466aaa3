//! The trainer's oracle: the same model's loss computed a second, independent way, in f64 from
//! end to end (one token at a time, plain loops, the ops' f64 references where they exist), so
//! that central finite differences of it measure the true gradient to about 1e-9.

use super::model::{Batch, Layout};
use crate::ops::rmsnorm;

/// y = W x for a row-major `W` of `rows x x.len()`; sequential, as finite differences call this
/// model thousands of times from parallel threads.
fn matvec(w: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    w.chunks_exact(x.len()).take(rows).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

/// RoPE in f64 on one token's heads: pairs (2i, 2i+1) turned by the config's angle.
fn rope(c: &crate::model::llama::Config, pos: usize, x: &mut [f64]) {
    for head in x.chunks_exact_mut(c.head_dim) {
        for i in 0..c.rope_dims / 2 {
            let (sin, cos) = c.rope_angle(pos, i).sin_cos();
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            (head[2 * i], head[2 * i + 1]) = (a * cos - b * sin, a * sin + b * cos);
        }
    }
}

/// The mean next-token cross-entropy of `batch` under the parameters `w` (the layout's buffer, in f64).
pub fn loss_f64(layout: &Layout, w: &[f64], batch: &Batch) -> f64 {
    let c = &layout.config;
    let (d, kvd, hd, group) = (c.dim, c.kv_dim(), c.head_dim, c.heads / c.kv_heads);
    let p = |s: &super::model::Span| &w[s.at.clone()];
    let norm = |x: &[f64], g: &[f64]| rmsnorm::reference(x, g, c.eps as f64);
    let mut total = 0.0;
    for window in batch.tokens.chunks(batch.seq + 1) {
        let mut xs: Vec<Vec<f64>> = window[..batch.seq].iter().map(|&t| p(&layout.embed)[t as usize * d..][..d].to_vec()).collect();
        for l in &layout.layers {
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            for (pos, x) in xs.iter_mut().enumerate() {
                let h = norm(x, p(&l.attn_norm));
                let (mut q, mut k) = (matvec(p(&l.q), &h, d), matvec(p(&l.k), &h, kvd));
                rope(c, pos, &mut q);
                rope(c, pos, &mut k);
                ks.push(k);
                vs.push(matvec(p(&l.v), &h, kvd));
                // Causal: position `pos` sees keys 0..=pos, all pushed by now.
                let mut att = vec![0.0; d];
                for h in 0..c.heads {
                    let (qh, off) = (&q[h * hd..(h + 1) * hd], (h / group) * hd);
                    let s: Vec<f64> = ks.iter().map(|k| qh.iter().zip(&k[off..off + hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()).collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|s| (s - m).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for (e, v) in e.iter().zip(&vs) {
                        att[h * hd..(h + 1) * hd].iter_mut().zip(&v[off..off + hd]).for_each(|(a, v)| *a += e / sum * v);
                    }
                }
                x.iter_mut().zip(matvec(p(&l.o), &att, d)).for_each(|(x, o)| *x += o);
                let h = norm(x, p(&l.ffn_norm));
                let (g, u) = (matvec(p(&l.gate), &h, c.ffn), matvec(p(&l.up), &h, c.ffn));
                let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                x.iter_mut().zip(matvec(p(&l.down), &a, d)).for_each(|(x, y)| *x += y);
            }
        }
        for (x, &target) in xs.iter().zip(&window[1..]) {
            let logits = matvec(p(layout.head()), &norm(x, p(&layout.out_norm)), c.vocab);
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            total += m + logits.iter().map(|l| (l - m).exp()).sum::<f64>().ln() - logits[target as usize];
        }
    }
    total / (batch.rows * batch.seq) as f64
}
