//! The Llama engine's CPU reference on the real model (SmolLM2-135M-Instruct Q4_1; scripts/test.sh
//! exports LAB_SMOLLM2_GGUF, without which these tests FAIL) against transformers' run of the same
//! file (lab/src/ops/llama/smollm2_transformers.json, from a GPU host): the check passes on the
//! file as it is and fails on a copy with one weight block damaged. Bad files are named errors.

use lab::model::llama::generate::argmax;
use lab::model::llama::{Config, CpuModel};
use lab::model::tokenizer::Tokenizer;
use lab::weights::gguf::Gguf;

fn bytes() -> Vec<u8> {
    let path = std::env::var("LAB_SMOLLM2_GGUF")
        .expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh installs it; see README)");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Worst |ours - transformers'| over its 16 best logits after prompt 0, and how many of its
/// first 4 greedy tokens the reference chose too.
fn against_transformers(g: &Gguf) -> (f64, usize) {
    let fixture: serde_json::Value = serde_json::from_str(include_str!("../src/ops/llama/smollm2_transformers.json")).unwrap();
    let theirs = &fixture["prompts"][0];
    let prompt = Tokenizer::from_gguf(g).unwrap().encode(lab::ops::llama::experiment::PROMPTS[0], true).unwrap();
    let model = CpuModel::load(g).unwrap();
    let mut cache = model.cache();
    let mut logits = model.forward(&mut cache, &prompt).unwrap();
    let worst = theirs["top"].as_array().unwrap().iter().map(|p| (logits[p[0].as_u64().unwrap() as usize] as f64 - p[1].as_f64().unwrap()).abs()).fold(0.0, f64::max);
    let mut agree = 0;
    for want in theirs["greedy"].as_array().unwrap().iter().take(4) {
        let t = argmax(&logits).unwrap();
        agree += usize::from(u64::from(t) == want.as_u64().unwrap());
        logits = model.step(&mut cache, t, true).unwrap().unwrap();
    }
    (worst, agree)
}

#[test]
fn the_reference_matches_transformers_and_a_damaged_weight_does_not() {
    let mut b = bytes();
    let (worst, agree) = against_transformers(&Gguf::parse(&b).unwrap());
    assert!(worst < 1e-3 && agree == 4, "worst logit error {worst}, {agree} of 4 greedy tokens");
    // Planted fault: the f16 scale of one 32-weight block of layer 0's query projection doubled.
    let info = Gguf::parse(&b).unwrap().tensor("blk.0.attn_q.weight").unwrap().clone();
    let at = (Gguf::parse(&b).unwrap().data_offset + info.offset) as usize + 20 * 100;
    let d = half::f16::from_le_bytes([b[at], b[at + 1]]);
    b[at..at + 2].copy_from_slice(&half::f16::from_f32(d.to_f32() * 2.0 + 0.5).to_le_bytes());
    let (worst, _) = against_transformers(&Gguf::parse(&b).unwrap());
    assert!(worst > 1e-3, "a damaged block went unseen: worst logit error {worst}");
}

#[test]
fn a_file_of_another_architecture_or_missing_a_tensor_is_a_named_error() {
    let b = bytes();
    let find = |b: &[u8], s: &[u8]| b.windows(s.len()).position(|w| w == s).unwrap();
    let mut other = b.clone();
    let at = find(&other, b"general.architecture") + b"general.architecture".len() + 4 + 8;
    other[at..at + 5].copy_from_slice(b"qwen2");
    let err = Config::from_gguf(&Gguf::parse(&other).unwrap()).unwrap_err().to_string();
    assert!(err.contains("general.architecture is `qwen2`: only `llama` models are supported"), "{err}");
    let mut missing = b.clone();
    let at = find(&missing, b"blk.3.attn_q.weight");
    missing[at..at + 19].copy_from_slice(b"blk.3.attn_x.weight");
    let err = CpuModel::load(&Gguf::parse(&missing).unwrap()).err().expect("a missing tensor is an error").to_string();
    assert!(err.contains("tensor `blk.3.attn_q.weight` is missing from the model file"), "{err}");
}
