//! Choosing the next token: greedy, or drawn from softmax(logits / T) cut to the top k tokens and
//! to the top p of the remaining mass. This is the CPU mirror of kernels/llama.cu's
//! `llama_sample_f32` (same keys, same fixed-point weights, same uniform number), used by the CPU
//! engine and to check the kernel's draws.

use crate::{LabError, Result};

/// How the next token is chosen. `temperature` 0 is greedy (the lowest id of the largest logit);
/// `top_k` 0 keeps every token, `top_p` 1 all the mass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl Sampling {
    pub const GREEDY: Sampling = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };

    /// An error naming the setting that is out of range.
    pub fn check(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(LabError::Invalid(format!("temperature {}: a finite number >= 0 (0 is greedy)", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(LabError::Invalid(format!("top-p {}: in (0, 1]", self.top_p)));
        }
        Ok(())
    }

    pub fn greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The draw's uniform number for sequence `seq` at position `pos`: 24 bits, as an integer u
/// standing for u / 2^24.
pub fn uniform24(seed: u64, seq: usize, pos: usize) -> u64 {
    splitmix64(seed ^ splitmix64(((seq as u64) << 32) | (pos as u32 as u64))) >> 40
}

fn key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

fn weight(z: f32, zmax: f32) -> u64 {
    ((z - zmax).exp() * 2_147_483_648.0) as u64
}

/// The tokens a draw may choose and their fixed-point weights, in id order, and u's target in
/// their summed weight: what the kernel computes.
pub struct Draw {
    pub kept: Vec<(u32, u64)>,
    pub total: u64,
    pub target: u64,
}

impl Draw {
    pub fn new(logits: &[f32], s: &Sampling, seq: usize, pos: usize) -> Result<Draw> {
        s.check()?;
        if s.greedy() {
            return Err(LabError::Invalid("a greedy choice has no draw".into()));
        }
        if let Some(i) = logits.iter().position(|v| v.is_nan()) {
            return Err(LabError::Invalid(format!("logit {i} is NaN")));
        }
        let inv_t = 1.0 / s.temperature;
        let z: Vec<f32> = logits.iter().map(|&l| l * inv_t).collect();
        let zmax = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // The smallest key whose keys at or above it hold `need` of the weight: the kernel's
        // radix select, done by sorting.
        let threshold = |floor: u32, w: &dyn Fn(f32) -> u64, need: u64| -> u32 {
            let mut ks: Vec<(u32, u64)> = z.iter().map(|&v| (key(v), v)).filter(|(k, _)| *k >= floor).map(|(k, v)| (k, w(v))).collect();
            ks.sort_unstable_by_key(|k| std::cmp::Reverse(k.0));
            let mut acc = 0u64;
            let mut i = 0;
            while i < ks.len() {
                // Every token with this key counts at once (ties are kept together).
                let k = ks[i].0;
                while i < ks.len() && ks[i].0 == k {
                    acc += ks[i].1;
                    i += 1;
                }
                if acc >= need {
                    return k;
                }
            }
            ks.last().map_or(0, |l| l.0)
        };
        let mut floor = 0;
        if s.top_k > 0 && s.top_k < logits.len() {
            floor = threshold(0, &|_| 1, s.top_k as u64);
        }
        let mass = |floor: u32| z.iter().filter(|&&v| key(v) >= floor).map(|&v| weight(v, zmax)).sum::<u64>();
        let mut total = mass(floor);
        if s.top_p < 1.0 {
            let need = (s.top_p as f64 * total as f64).ceil() as u64;
            if need >= 1 {
                floor = threshold(floor, &|v| weight(v, zmax), need);
            }
            total = mass(floor);
        }
        let kept: Vec<(u32, u64)> = z.iter().enumerate().filter(|(_, &v)| key(v) >= floor).map(|(i, &v)| (i as u32, weight(v, zmax))).collect();
        let target = ((total as u128 * ((uniform24(s.seed, seq, pos) << 40) as u128)) >> 64) as u64;
        Ok(Draw { kept, total, target })
    }

    /// The token the target falls on.
    pub fn token(&self) -> u32 {
        let mut acc = 0;
        for &(t, w) in &self.kept {
            acc += w;
            if self.target < acc {
                return t;
            }
        }
        self.kept.last().map_or(0, |k| k.0)
    }

    /// Whether `token` is a choice this draw could make with its target moved by at most
    /// `slack` of the total (the kernel's exp may differ from this one's in the last bit).
    pub fn allows(&self, token: u32, slack: f64) -> bool {
        let d = (slack * self.total as f64) as u64;
        let mut acc = 0;
        for &(t, w) in &self.kept {
            let (lo, hi) = (acc, acc + w);
            acc = hi;
            if t == token {
                return self.target + d >= lo && self.target < hi + d;
            }
        }
        false
    }
}

/// The next token of sequence `seq` at position `pos` (the position whose logits these are).
pub fn choose(logits: &[f32], s: &Sampling, seq: usize, pos: usize) -> Result<u32> {
    s.check()?;
    if s.greedy() {
        super::generate::argmax(logits)
    } else {
        Ok(Draw::new(logits, s, seq, pos)?.token())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        (0..n).map(|i| ((splitmix64(seed ^ i as u64) >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0).collect()
    }

    #[test]
    fn top_k_of_one_and_a_tiny_top_p_are_greedy() {
        let l = logits(1000, 3);
        let best = super::super::generate::argmax(&l).unwrap();
        for pos in 0..20 {
            let k1 = Sampling { temperature: 1.0, top_k: 1, top_p: 1.0, seed: 9 };
            let p0 = Sampling { temperature: 1.0, top_k: 0, top_p: 1e-6, seed: 9 };
            assert_eq!(choose(&l, &k1, 0, pos).unwrap(), best);
            assert_eq!(choose(&l, &p0, 0, pos).unwrap(), best);
        }
    }

    #[test]
    fn top_k_keeps_k_tokens_and_top_p_the_smallest_set_reaching_p() {
        let l = logits(500, 5);
        let s = Sampling { temperature: 0.7, top_k: 40, top_p: 1.0, seed: 1 };
        let d = Draw::new(&l, &s, 0, 0).unwrap();
        assert_eq!(d.kept.len(), 40);
        let mut sorted = l.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        assert!(d.kept.iter().all(|&(t, _)| l[t as usize] >= sorted[39]));
        let s = Sampling { top_k: 0, top_p: 0.5, ..s };
        let d = Draw::new(&l, &s, 0, 0).unwrap();
        let all = Draw::new(&l, &Sampling { top_p: 1.0, ..s }, 0, 0).unwrap();
        let mut w: Vec<u64> = all.kept.iter().map(|k| k.1).collect();
        w.sort_unstable_by(|a, b| b.cmp(a));
        let need = (0.5 * all.total as f64).ceil() as u64;
        let n = w.iter().scan(0u64, |acc, &x| {
            let before = *acc;
            *acc += x;
            Some(before)
        });
        let smallest = n.take_while(|&before| before < need).count();
        assert_eq!(d.kept.len(), smallest, "top-p 0.5 keeps the fewest tokens whose mass reaches half");
    }

    /// Over many positions the draws follow the kept distribution: each of five tokens' share
    /// within 0.02 of its probability over 20,000 draws (the standard error is under 0.004).
    #[test]
    fn draws_follow_the_softmax() {
        let l = [1.0f32, 0.5, 0.0, -0.5, -3.0];
        let s = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 42 };
        let mut counts = [0usize; 5];
        for pos in 0..20_000 {
            counts[choose(&l, &s, 0, pos).unwrap() as usize] += 1;
        }
        let z: f64 = l.iter().map(|&v| (v as f64).exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let p = (l[i] as f64).exp() / z;
            assert!((c as f64 / 20_000.0 - p).abs() < 0.02, "token {i}: {c} draws against p {p:.3}");
        }
    }

    /// The check the GPU's draws must pass refuses a token off the target's interval or outside
    /// the kept set: the draw's own token passes, its neighbours in the kept order do not.
    #[test]
    fn the_draw_check_refuses_other_tokens() {
        let l = logits(2000, 8);
        let s = Sampling { temperature: 1.0, top_k: 100, top_p: 0.9, seed: 5 };
        for pos in 0..50 {
            let d = Draw::new(&l, &s, 1, pos).unwrap();
            let t = d.token();
            assert!(d.allows(t, 1e-6));
            let at = d.kept.iter().position(|k| k.0 == t).unwrap();
            for other in [at.checked_sub(1), Some(at + 1)].into_iter().flatten().filter_map(|i| d.kept.get(i)) {
                assert!(!d.allows(other.0, 1e-6), "position {pos}: token {} passed for {t}", other.0);
            }
            let outside = (0..2000u32).find(|i| !d.kept.iter().any(|k| k.0 == *i)).unwrap();
            assert!(!d.allows(outside, 1e-6));
        }
    }

    #[test]
    fn bad_settings_are_named() {
        let l = logits(10, 1);
        for (s, word) in [
            (Sampling { temperature: -1.0, ..Sampling::GREEDY }, "temperature"),
            (Sampling { temperature: 1.0, top_p: 0.0, ..Sampling::GREEDY }, "top-p"),
            (Sampling { temperature: 1.0, top_p: 1.5, ..Sampling::GREEDY }, "top-p"),
        ] {
            let e = choose(&l, &s, 0, 0).unwrap_err().to_string();
            assert!(e.contains(word), "{e}");
        }
        let mut nan = l.clone();
        nan[3] = f32::NAN;
        let s = Sampling { temperature: 1.0, ..Sampling::GREEDY };
        assert!(choose(&nan, &s, 0, 0).unwrap_err().to_string().contains("logit 3 is NaN"));
    }
}
