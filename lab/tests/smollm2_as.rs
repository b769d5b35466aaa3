//! What Llama 3 and SentencePiece (Llama 2, TinyLlama, Mistral) GGUF files hold and SmolLM2's
//! does not, checked against llama.cpp on SmolLM2 rewritten that way (tests/common/smollm2_as.rs):
//! the `llama-bpe` split, Llama 3.1's RoPE frequency factors, and SentencePiece tokenization.
//! llama.cpp's answers are the fixtures lab/tests/fixtures/smollm2_as_{llama3,spm}.json
//! (lab/examples/smollm2_as.rs). Needs LAB_SMOLLM2_GGUF (scripts/test.sh installs the file);
//! without it these tests FAIL.

mod common {
    pub mod smollm2_as;
}

use common::smollm2_as;
use lab::model::llama::CpuModel;
use lab::model::tokenizer::Tokenizer;
use lab::weights::gguf::{Gguf, GgufFile, Value};
use serde_json::Value as Json;
use std::sync::OnceLock;

fn source() -> &'static GgufFile {
    static FILE: OnceLock<GgufFile> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::var("LAB_SMOLLM2_GGUF")
            .expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh installs it; see README)");
        GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// The Llama 3 file's bytes, made once.
fn llama3() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| smollm2_as::llama3(&source().parse().unwrap()).to_bytes().unwrap())
}

fn fixture(kind: &str) -> Json {
    let text = match kind {
        "llama3" => include_str!("fixtures/smollm2_as_llama3.json"),
        _ => include_str!("fixtures/smollm2_as_spm.json"),
    };
    let doc: Json = serde_json::from_str(text).unwrap();
    let texts: Vec<&str> = doc["tokens"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, smollm2_as::TEXTS, "the texts changed: run lab/examples/smollm2_as.rs again");
    doc
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Texts and prompts whose ids from `t` differ from llama.cpp's in `doc`; panics on the first
/// when `strict`.
fn differing(t: &Tokenizer, doc: &Json, strict: bool) -> usize {
    let cases = doc["tokens"].as_array().unwrap().iter().chain(doc["prompts"].as_array().unwrap());
    let mut n = 0;
    for case in cases {
        let (text, want) = (case["text"].as_str().unwrap(), ids(&case["ids"]));
        let got = t.encode(text, true).unwrap();
        if strict {
            assert_eq!(got, want, "{text:?}");
        }
        n += usize::from(got != want);
    }
    n
}

#[test]
fn llama_bpe_ids_equal_llama_cpp_and_smollm_s_split_does_not() {
    let mut g = Gguf::parse(llama3()).unwrap();
    let doc = fixture("llama3");
    differing(&Tokenizer::from_gguf(&g).unwrap(), &doc, true);
    let at = g.metadata.iter().position(|(k, _)| k == "tokenizer.ggml.pre").unwrap();
    g.metadata[at].1 = Value::String("smollm".into());
    // SmolLM2's split gives other ids on 3 of the 13: the two code texts and the newline runs,
    // where Llama 3 keeps newlines with the punctuation before them.
    let n = differing(&Tokenizer::from_gguf(&g).unwrap(), &doc, false);
    assert!(n >= 3, "the fixture tells the two splits apart on only {n} texts");
}

#[test]
fn sentencepiece_ids_equal_llama_cpp_and_decode_back() {
    let bytes = smollm2_as::spm(&source().parse().unwrap()).to_bytes().unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let t = Tokenizer::from_gguf(&g).unwrap();
    let doc = fixture("spm");
    differing(&t, &doc, true);
    for text in smollm2_as::TEXTS.iter().filter(|s| !s.contains("<|")) {
        assert_eq!(t.decode(&t.encode(text, false).unwrap()).unwrap(), *text);
    }
    // Planted fault: the scores reversed, so that the latest merges win (8 of the 13 change).
    let mut g = g;
    let at = g.metadata.iter().position(|(k, _)| k == "tokenizer.ggml.scores").unwrap();
    if let Value::Array(s) = &mut g.metadata[at].1 {
        s.iter_mut().for_each(|v| if let Value::F32(x) = v { *x = -*x });
    }
    let n = differing(&Tokenizer::from_gguf(&g).unwrap(), &doc, false);
    assert!(n >= 5, "reversed scores changed only {n} of the texts");
}

/// Worst |lab - llama.cpp| over llama.cpp's 16 largest logits after each prompt, and how many
/// prompts' most likely token the two share.
fn against_llama_cpp(model: &CpuModel, doc: &Json) -> (f64, usize) {
    let (mut worst, mut same) = (0.0f64, 0);
    for p in doc["prompts"].as_array().unwrap() {
        let logits = model.forward(&mut model.cache(), &ids(&p["ids"])).unwrap();
        let top = p["top"].as_array().unwrap();
        for t in top {
            worst = worst.max((logits[t[0].as_u64().unwrap() as usize] as f64 - t[1].as_f64().unwrap()).abs());
        }
        same += usize::from(lab::model::llama::generate::argmax(&logits).unwrap() as u64 == top[0][0].as_u64().unwrap());
    }
    (worst, same)
}

/// The lab's logits follow llama.cpp's with the frequency factors applied; read without them
/// (as a loader that ignored the tensor would), they do not.
#[test]
fn rope_frequency_factors_turn_as_llama_cpp_turns_them() {
    let mut model = CpuModel::load(&Gguf::parse(llama3()).unwrap()).unwrap();
    let doc = fixture("llama3");
    let prompts = doc["prompts"].as_array().unwrap().len();
    let (worst, same) = against_llama_cpp(&model, &doc);
    assert!(worst < TOLERANCE && same == prompts, "worst logit error {worst}, top-1 shared on {same} of {prompts} prompts");
    model.config.rope_factors = None;
    let (worst, _) = against_llama_cpp(&model, &doc);
    assert!(worst > 4.0 * TOLERANCE, "ignoring the factors went unseen: worst logit error {worst}");
}

/// llama.cpp's CPU path rounds the activations to f16 before each f16 product; the lab sums in
/// f64. Measured: 0.012 with the factors (0.005 from an AVX-512 build of llama.cpp), ~4 without.
const TOLERANCE: f64 = 0.03;
