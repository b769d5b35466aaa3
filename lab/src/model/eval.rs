//! Perplexity and KL divergence of a Llama model on a text, by the protocol of llama.cpp's
//! `llama-perplexity` (tools/perplexity/perplexity.cpp), so that the lab's figures and llama.cpp's
//! can stand side by side: the text tokenized once (BOS first when the model adds one), cut into
//! `ctx`-token chunks, each chunk's first token replaced by BOS when the model adds one, each
//! chunk run from an empty cache, and only the second half scored: the logits at positions
//! `ctx/2 .. ctx-2` against the tokens that follow them. Perplexity is exp(mean NLL) with
//! llama.cpp's error estimate, sqrt(var(NLL) / (n - 1)) * PPL.

use super::llama::CpuModel;
use crate::{LabError, Result};
use statrs::statistics::Statistics;

/// The chunks to score: `ctx` tokens each, at most `max_chunks` of them (all when `None`).
pub fn chunks(tokens: &[u32], ctx: usize, max_chunks: Option<usize>, bos: Option<u32>) -> Result<Vec<Vec<u32>>> {
    if ctx < 4 {
        return Err(LabError::Invalid(format!("a perplexity context of {ctx} tokens scores nothing (at least 4)")));
    }
    if tokens.len() < 2 * ctx {
        return Err(LabError::Invalid(format!("the text is {} tokens; a context of {ctx} needs at least {}", tokens.len(), 2 * ctx)));
    }
    let n = (tokens.len() / ctx).min(max_chunks.unwrap_or(usize::MAX));
    Ok((0..n)
        .map(|i| {
            let mut c = tokens[i * ctx..(i + 1) * ctx].to_vec();
            if let Some(b) = bos {
                c[0] = b;
            }
            c
        })
        .collect())
}

/// The first scored position of a chunk of `ctx` tokens.
pub fn first_scored(ctx: usize) -> usize {
    ctx / 2
}

/// Natural-log probabilities of one row of logits (max subtracted, sums in f64).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + logits.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    logits.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(base || other) of two rows of log-probabilities.
pub fn kl(base: &[f64], other: &[f64]) -> f64 {
    base.iter().zip(other).map(|(&p, &q)| p.exp() * (p - q)).sum()
}

/// The index of the largest value (the first of equals).
pub fn top1(v: &[f64]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

/// Cosine similarity of two rows.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// One chunk scored: the log-probabilities at each scored position (kept for KL against another
/// model) and the NLL of the token that follows.
pub struct ScoredChunk {
    pub logprobs: Vec<Vec<f64>>,
    pub nll: Vec<f64>,
}

/// Runs `chunk` through the CPU reference from an empty cache and scores its second half.
pub fn score_chunk(model: &CpuModel, chunk: &[u32], keep_logprobs: bool) -> Result<ScoredChunk> {
    let first = first_scored(chunk.len());
    let mut cache = model.cache();
    let (mut logprobs, mut nll) = (Vec::new(), Vec::new());
    for (pos, &t) in chunk[..chunk.len() - 1].iter().enumerate() {
        let logits = model.step(&mut cache, t, pos >= first)?;
        if let Some(l) = logits {
            let lp = log_softmax(&l);
            nll.push(-lp[chunk[pos + 1] as usize]);
            if keep_logprobs {
                logprobs.push(lp);
            }
        }
    }
    Ok(ScoredChunk { logprobs, nll })
}

/// Perplexity and its error estimate from the scored NLLs, as llama-perplexity reports them.
pub fn perplexity(nll: &[f64]) -> Result<(f64, f64)> {
    if nll.len() < 2 {
        return Err(LabError::Invalid(format!("perplexity needs at least 2 scored tokens, not {}", nll.len())));
    }
    let mean = nll.mean();
    let ppl = mean.exp();
    // llama.cpp: sqrt((E[nll^2] - E[nll]^2) / (n - 1)) with the population variance.
    let n = nll.len() as f64;
    let var = nll.population_variance();
    Ok((ppl, (var / (n - 1.0)).sqrt() * ppl))
}

/// KL divergence and top-1 agreement of `other` against `base`, position by position.
pub struct Divergence {
    pub mean_kl: f64,
    pub max_kl: f64,
    pub top1_same: f64,
}

pub fn divergence(base: &[Vec<f64>], other: &[Vec<f64>]) -> Result<Divergence> {
    if base.len() != other.len() || base.is_empty() {
        return Err(LabError::Invalid(format!("KL needs the same scored positions: {} against {}", base.len(), other.len())));
    }
    let kls: Vec<f64> = base.iter().zip(other).map(|(b, o)| kl(b, o)).collect();
    let same = base.iter().zip(other).filter(|(b, o)| top1(b) == top1(o)).count();
    Ok(Divergence { mean_kl: kls.iter().mean(), max_kl: kls.iter().copied().fold(0.0, f64::max), top1_same: same as f64 / base.len() as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_llama_perplexity() {
        let tokens: Vec<u32> = (10..31).collect(); // 21 tokens
        let c = chunks(&tokens, 8, None, Some(1)).unwrap();
        assert_eq!(c, vec![vec![1, 11, 12, 13, 14, 15, 16, 17], vec![1, 19, 20, 21, 22, 23, 24, 25]]);
        assert_eq!(chunks(&tokens, 8, Some(1), None).unwrap(), vec![(10..18).collect::<Vec<u32>>()]);
        let e = chunks(&tokens, 11, None, None).unwrap_err().to_string();
        assert!(e.contains("21 tokens") && e.contains("at least 22"), "{e}");
        assert_eq!(first_scored(512), 256);
    }

    #[test]
    fn perplexity_of_a_uniform_guess_is_the_vocabulary() {
        let lp = log_softmax(&[0.0; 50]);
        let nll = vec![-lp[3]; 10];
        let (ppl, err) = perplexity(&nll).unwrap();
        assert!((ppl - 50.0).abs() < 1e-9, "{ppl}");
        assert_eq!(err, 0.0);
        // A spread of NLLs: llama.cpp's estimate, by hand for [1, 2, 3]: var 2/3, / 2, sqrt, x e^2.
        let (ppl, err) = perplexity(&[1.0, 2.0, 3.0]).unwrap();
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
        assert!((err - (1.0f64 / 3.0).sqrt() * 2f64.exp()).abs() < 1e-12, "{err}");
    }

    #[test]
    fn kl_is_zero_on_itself_and_positive_on_a_changed_row() {
        let a = log_softmax(&[1.0, 2.0, 3.0, -1.0]);
        let b = log_softmax(&[1.0, 2.0, 2.5, -1.0]);
        assert!(kl(&a, &a).abs() < 1e-15);
        let d = divergence(&[a.clone(), a.clone()], &[a.clone(), b.clone()]).unwrap();
        assert!(d.mean_kl > 0.0 && (d.max_kl - kl(&a, &b)).abs() < 1e-15);
        assert_eq!(d.top1_same, 1.0);
        let c = log_softmax(&[1.0, 4.0, 3.0, -1.0]);
        assert_eq!(divergence(std::slice::from_ref(&a), &[c]).unwrap().top1_same, 0.0);
        // By hand: p = (1/2, 1/2), q = (1/4, 3/4): (ln 2 + ln(2/3)) / 2.
        let (p, q) = ([0.5f64.ln(), 0.5f64.ln()], [0.25f64.ln(), 0.75f64.ln()]);
        assert!((kl(&p, &q) - (2f64.ln() + (2.0f64 / 3.0).ln()) / 2.0).abs() < 1e-15);
    }
}
