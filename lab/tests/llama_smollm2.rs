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

/// The last logits of prompt 0 from `g`'s CPU reference.
fn last_logits(g: &Gguf) -> Vec<f32> {
    let prompt = Tokenizer::from_gguf(g).unwrap().encode(lab::ops::llama::experiment::PROMPTS[0], true).unwrap();
    let model = CpuModel::load(g).unwrap();
    model.forward(&mut model.cache(), &prompt).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Requantized by `lab quantize`'s path to Q8_0 (finer than the shipped Q4_1) the model reads
/// back with every matrix in Q8_0, and its logits follow the original's; Q4_0 (as coarse,
/// symmetric, its head kept in Q8_0) strays further. A file whose two layers' down projections were swapped is caught.
#[test]
fn a_requantized_model_reads_back_and_follows_the_original() {
    use lab::weights::gguf::GgmlType;
    use lab::weights::gguf_writer::requantize;
    let b = bytes();
    let g = Gguf::parse(&b).unwrap();
    let original = last_logits(&g);
    let mut seen = Vec::new();
    // Measured: Q8_0 0.9990; Q4_0 0.83 (a second 4-bit rounding of weights already on
    // Q4_1's grid: llama.cpp warns against requantizing for this reason).
    for (to, floor) in [(GgmlType::Q8_0, 0.998), (GgmlType::Q4_0, 0.75)] {
        let written = requantize(&g, to).unwrap().to_bytes().unwrap();
        let back = Gguf::parse(&written).unwrap();
        assert_eq!(back.get("general.file_type").and_then(|v| v.as_u64()), Some(if to == GgmlType::Q8_0 { 7 } else { 2 }));
        assert!(back.tensors.iter().filter(|t| t.dims.len() == 1).all(|t| t.ty == GgmlType::F32), "{}: vectors stay f32", to.name());
        // The tied head (Q8_0) stays finer than Q4_0; every other matrix takes the format.
        let head = if to == GgmlType::Q4_0 { GgmlType::Q8_0 } else { to };
        assert!(back.tensors.iter().filter(|t| t.dims.len() > 1).all(|t| t.ty == if t.name == "token_embd.weight" { head } else { to }), "{}", to.name());
        let logits = last_logits(&back);
        let c = cosine(&logits, &original);
        assert!(c >= floor, "{}: cosine {c} to the original's logits", to.name());
        if to == GgmlType::Q8_0 {
            assert_eq!(argmax(&logits).unwrap(), argmax(&original).unwrap(), "{}: top-1", to.name());
        }
        eprintln!("{}: cosine {c:.4} to the original's last logits", to.name());
        seen.push(c);
    }
    assert!(seen[0] > seen[1], "Q8_0 ({}) should follow the original more closely than Q4_0 ({})", seen[0], seen[1]);

    // Planted fault: layers 0 and 1 of the Q8_0 file with their down projections swapped.
    let mut w = lab::weights::gguf_writer::GgufWriter::with_metadata_of(&g);
    let q8 = requantize(&g, GgmlType::Q8_0).unwrap().to_bytes().unwrap();
    let back = Gguf::parse(&q8).unwrap();
    let swap = |name: &str| -> String {
        match name {
            "blk.0.ffn_down.weight" => "blk.1.ffn_down.weight".into(),
            "blk.1.ffn_down.weight" => "blk.0.ffn_down.weight".into(),
            other => other.into(),
        }
    };
    for t in &back.tensors {
        let from = back.tensor(&swap(&t.name)).unwrap();
        w.add_tensor(&t.name, &t.dims, t.ty, back.data(from).to_vec()).unwrap();
    }
    let swapped = w.to_bytes().unwrap();
    let c = cosine(&last_logits(&Gguf::parse(&swapped).unwrap()), &original);
    eprintln!("Q8_0 with two layers' down projections swapped: cosine {c:.4}");
    assert!(c < 0.998, "swapped layers went unseen: cosine {c}");
}

/// llama-perplexity's protocol on the real model: licence prose scores low, and the same
/// log-probabilities read one position off (the planted misalignment a scorer can make) do not.
#[test]
fn perplexity_of_prose_is_low_and_one_position_off_is_not() {
    use lab::model::eval::{chunks, perplexity, score_chunk};
    let b = bytes();
    let g = Gguf::parse(&b).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").expect("the GPL-3 text Debian ships in base-files");
    let tokens = tok.encode(&text, true).unwrap();
    let window = &chunks(&tokens, 32, Some(1), tok.adds_bos().then(|| tok.bos())).unwrap()[0];
    let model = CpuModel::load(&g).unwrap();
    let scored = score_chunk(&model, window, true).unwrap();
    assert_eq!(scored.nll.len(), 15, "positions 16..30 predict 17..31");
    let (ppl, err) = perplexity(&scored.nll).unwrap();
    let shifted: Vec<f64> = scored.logprobs[..14].iter().enumerate().map(|(i, lp)| -lp[window[16 + i + 2] as usize]).collect();
    let (off, _) = perplexity(&shifted).unwrap();
    assert!(ppl < 30.0 && err > 0.0, "perplexity {ppl} +/- {err} on licence prose");
    assert!(off > 10.0 * ppl, "one position off: {off} against {ppl}");
}
