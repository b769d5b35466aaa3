//! AdamW over fp32 master weights (PyTorch's `torch.optim.AdamW` update: decay first, then the
//! bias-corrected Adam step), gradient clipping by global norm, and a linear warmup followed by a
//! cosine decay of the learning rate.

use serde::{Deserialize, Serialize};

/// The optimizer's and schedule's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamW {
    pub lr: f32,
    /// The floor the cosine decays to.
    pub min_lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Largest global gradient norm; larger gradients are scaled down to it.
    pub clip: f32,
    pub warmup: usize,
    /// Steps the schedule spans (the cosine reaches `min_lr` here).
    pub steps: usize,
}

/// The moments, one per parameter, and the steps taken.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    pub step: usize,
}

impl State {
    pub fn new(len: usize) -> Self {
        State { m: vec![0.0; len], v: vec![0.0; len], step: 0 }
    }
}

/// Scales `g` down to global norm `max` when it is larger; returns the norm before clipping.
/// The sum runs in f64 and in order, so the result does not depend on the thread count.
pub fn clip_grad_norm(g: &mut [f32], max: f32) -> f64 {
    let norm = g.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
    if norm > max as f64 {
        let s = clip_factor(norm, max);
        g.iter_mut().for_each(|v| *v *= s);
    }
    norm
}

impl AdamW {
    /// The learning rate of step `step` (0-based): linear warmup to `lr` over `warmup` steps,
    /// then cosine from `lr` to `min_lr` at `steps`, and `min_lr` past it.
    pub fn lr_at(&self, step: usize) -> f32 {
        if step < self.warmup {
            return self.lr * (step + 1) as f32 / self.warmup as f32;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        (self.min_lr as f64 + (self.lr - self.min_lr) as f64 * cos) as f32
    }

    /// The settings of the next step, advancing the step count: what the host loop below and
    /// the device kernel (`train::steps::adamw`) both apply. `clip` is the factor the gradients
    /// are scaled by first (1 when not clipped).
    pub fn next(&self, st: &mut State, clip: f32) -> AdamStep {
        let lr = self.lr_at(st.step);
        st.step += 1;
        let t = st.step as i32;
        let (bc1, bc2) = (1.0 - (self.beta1 as f64).powi(t), 1.0 - (self.beta2 as f64).powi(t));
        AdamStep { lr, weight_decay: self.weight_decay, beta1: self.beta1, beta2: self.beta2, eps: self.eps, step_size: (lr as f64 / bc1) as f32, bc2_sqrt: bc2.sqrt() as f32, clip }
    }

    /// One step on `params` from `grads` (already clipped). `decay[i]` says whether parameter i
    /// takes weight decay (matrices do, norm weights do not). Returns the learning rate used.
    pub fn step(&self, params: &mut [f32], grads: &[f32], decay: &[bool], st: &mut State) -> f32 {
        let a = self.next(st, 1.0);
        let (b1, b2) = (a.beta1, a.beta2);
        for i in 0..params.len() {
            let g = grads[i];
            if decay[i] {
                params[i] *= 1.0 - a.lr * a.weight_decay;
            }
            st.m[i] = b1 * st.m[i] + (1.0 - b1) * g;
            st.v[i] = b2 * st.v[i] + (1.0 - b2) * g * g;
            params[i] -= a.step_size * st.m[i] / (st.v[i].sqrt() / a.bc2_sqrt + a.eps);
        }
        a.lr
    }
}

/// The settings of one AdamW step, derived on the host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    pub lr: f32,
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// lr / (1 - beta1^t).
    pub step_size: f32,
    /// sqrt(1 - beta2^t).
    pub bc2_sqrt: f32,
    /// The factor the gradients are scaled by first (1 when not clipped).
    pub clip: f32,
}

/// The factor clipping scales gradients of global norm `norm` by (1 when not larger than `max`).
pub fn clip_factor(norm: f64, max: f32) -> f32 {
    if norm > max as f64 {
        (max as f64 / norm) as f32
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt() -> AdamW {
        AdamW { lr: 0.1, min_lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1, clip: 1.0, warmup: 2, steps: 10 }
    }

    /// Two steps by hand. Step 1 (lr 0.05, warmup 1/2): m = 0.1 g, v = 0.001 g^2, so m^ = g and
    /// v^ = g^2 and the step is lr sign(g); decay multiplies by 1 - 0.05 x 0.1 = 0.995 first:
    /// p = 0.995 p - 0.05 sign(g) -> [0.945, -1.94, 0.45] (the third takes no decay: 0.5 - 0.05).
    /// Step 2 (lr 0.1) with g2 = [0.1, 0.2, 0]: m = 0.9 m1 + 0.1 g2, v = 0.999 v1 + 0.001 g2^2,
    /// m^ = m / 0.19, v^ = v / 0.001999.
    #[test]
    fn two_steps_match_the_hand_derived_update() {
        let (o, decay) = (opt(), [true, true, false]);
        let mut p = [1.0f32, -2.0, 0.5];
        let mut st = State::new(3);
        let g1 = [0.1f32, -0.2, 0.3];
        assert_eq!(o.step(&mut p, &g1, &decay, &mut st), 0.05);
        let want1 = [0.945f64, -1.94, 0.45];
        for i in 0..3 {
            assert!((p[i] as f64 - want1[i]).abs() < 1e-6, "step 1, element {i}: {} vs {}", p[i], want1[i]);
        }
        let g2 = [0.1f32, 0.2, 0.0];
        assert_eq!(o.step(&mut p, &g2, &decay, &mut st), 0.1);
        for i in 0..3 {
            let (g1, g2) = (g1[i] as f64, g2[i] as f64);
            let m = 0.9 * 0.1 * g1 + 0.1 * g2;
            let v = 0.999 * 0.001 * g1 * g1 + 0.001 * g2 * g2;
            let (mh, vh) = (m / (1.0 - 0.81), v / (1.0 - 0.999f64 * 0.999));
            let d = if decay[i] { 1.0 - 0.1 * 0.1 } else { 1.0 };
            let want = want1[i] * d - 0.1 * mh / (vh.sqrt() + 1e-8);
            assert!((p[i] as f64 - want).abs() < 1e-6, "step 2, element {i}: {} vs {want}", p[i]);
        }
    }

    #[test]
    fn clipping_scales_to_the_global_norm_and_leaves_small_gradients() {
        let mut g = [3.0f32, 4.0, 0.0];
        assert_eq!(clip_grad_norm(&mut g, 1.0), 5.0);
        assert!(g.iter().zip([0.6, 0.8, 0.0]).all(|(a, b)| (a - b).abs() < 1e-7), "{g:?}");
        let mut small = [0.3f32, 0.4];
        assert!((clip_grad_norm(&mut small, 1.0) - 0.5).abs() < 1e-7);
        assert_eq!(small, [0.3, 0.4]);
    }

    #[test]
    fn the_schedule_warms_up_then_follows_the_cosine_to_its_floor() {
        let o = opt();
        let lrs: Vec<f32> = (0..12).map(|s| o.lr_at(s)).collect();
        // Warmup 0.05, 0.1; the cosine starts at lr, is at the midpoint of lr and min_lr halfway
        // through its 8 steps, and stays at min_lr from step 10 on.
        let want = [(0, 0.05), (1, 0.1), (2, 0.1), (6, 0.055), (10, 0.01), (11, 0.01)];
        for (s, w) in want {
            assert!((lrs[s] - w).abs() < 1e-7, "step {s}: {} vs {w}", lrs[s]);
        }
        assert!(lrs[2..=10].windows(2).all(|w| w[1] < w[0]), "{lrs:?}");
    }
}
