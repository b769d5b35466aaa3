//! What Llama 3 GGUF files hold and SmolLM2's does not, checked against llama.cpp on SmolLM2
//! rewritten that way (tests/common/llama3_style.rs: the `llama-bpe` pre-tokenizer, Llama 3.1's
//! RoPE frequency factors, f16 matrices). llama.cpp's answers are the fixture
//! lab/tests/fixtures/smollm2_llama3_style.json (lab/examples/llama3_style.rs). Needs
//! LAB_SMOLLM2_GGUF (scripts/test.sh installs the file); without it these tests FAIL.

mod common {
    pub mod llama3_style;
}

use common::llama3_style;
use lab::model::llama::CpuModel;
use lab::model::tokenizer::Tokenizer;
use lab::weights::gguf::{Gguf, GgufFile, Value};
use serde_json::Value as Json;
use std::sync::OnceLock;

fn fixture() -> &'static Json {
    static DOC: OnceLock<Json> = OnceLock::new();
    DOC.get_or_init(|| serde_json::from_str(include_str!("fixtures/smollm2_llama3_style.json")).unwrap())
}

/// The Llama-3-style file's bytes, made once.
fn file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = std::env::var("LAB_SMOLLM2_GGUF")
            .expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh installs it; see README)");
        let source = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        llama3_style::file(&source.parse().unwrap()).to_bytes().unwrap()
    })
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn llama_bpe_ids_equal_llama_cpp_and_smollm_s_split_does_not() {
    let mut g = Gguf::parse(file()).unwrap();
    let llama3 = Tokenizer::from_gguf(&g).unwrap();
    let doc = fixture();
    assert_eq!(doc["pre"], llama3_style::PRE);
    let texts: Vec<&str> = doc["tokens"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, llama3_style::TEXTS, "the texts changed: run lab/examples/llama3_style.rs again");
    let cases = doc["tokens"].as_array().unwrap().iter().chain(doc["prompts"].as_array().unwrap());
    let mut smollm_differs = 0;
    let at = g.metadata.iter().position(|(k, _)| k == "tokenizer.ggml.pre").unwrap();
    g.metadata[at].1 = Value::String("smollm".into());
    let smollm = Tokenizer::from_gguf(&g).unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(llama3.encode(text, true).unwrap(), want, "{text:?}");
        smollm_differs += usize::from(smollm.encode(text, true).unwrap() != want);
    }
    // SmolLM2's split gives other ids on 3 of the 13: the two code texts and the newline runs,
    // where Llama 3 keeps newlines with the punctuation before them.
    assert!(smollm_differs >= 3, "the fixture tells the two splits apart on only {smollm_differs} texts");
}

/// Worst |lab - llama.cpp| over llama.cpp's 16 largest logits after each prompt, and how many
/// prompts' most likely token the two share.
fn against_llama_cpp(model: &CpuModel) -> (f64, usize) {
    let (mut worst, mut same) = (0.0f64, 0);
    for p in fixture()["prompts"].as_array().unwrap() {
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
    let mut model = CpuModel::load(&Gguf::parse(file()).unwrap()).unwrap();
    let prompts = fixture()["prompts"].as_array().unwrap().len();
    let (worst, same) = against_llama_cpp(&model);
    assert!(worst < TOLERANCE && same == prompts, "worst logit error {worst}, top-1 shared on {same} of {prompts} prompts");
    model.config.rope_factors = None;
    let (worst, _) = against_llama_cpp(&model);
    assert!(worst > 4.0 * TOLERANCE, "ignoring the factors went unseen: worst logit error {worst}");
}

/// llama.cpp's CPU path rounds the activations to f16 before each f16 product; the lab sums in
/// f64. Measured: 0.0048 with the factors, 3.95 without.
const TOLERANCE: f64 = 0.02;
