//! The tokenizer and chat template of the real model, SmolLM2-135M-Instruct (Q4_1; scripts/test.sh
//! installs it and exports LAB_SMOLLM2_GGUF). Without that variable these tests FAIL: set it to
//! the .gguf's path (see README, "Quantization"). Expected ids are looked up in the file's raw
//! token list, never through the tokenizer under test.

use std::sync::OnceLock;

use lab::model::tokenizer::{ChatTemplate, Tokenizer};
use lab::weights::gguf::GgufFile;

struct Model {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// `tokenizer.ggml.tokens` as stored.
    raw: Vec<String>,
}

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = std::env::var("LAB_SMOLLM2_GGUF")
            .expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh installs it; see README)");
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let g = file.parse().unwrap_or_else(|e| panic!("{e}"));
        let raw = g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).expect("tokenizer.ggml.tokens");
        let raw = raw.iter().map(|v| v.as_str().expect("a token string").to_owned()).collect();
        let tokenizer = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{e}"));
        let template = ChatTemplate::from_gguf(&g).unwrap_or_else(|e| panic!("{e}"));
        Model { tokenizer, template, raw }
    })
}

/// The ids SmolLM2's tokenizer gives `text`, without BOS: what reference fixtures compare against.
fn encode(text: &str) -> Vec<u32> {
    model().tokenizer.encode(text, false).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// The raw vocabulary's ids for these token strings (byte-level: a space is `Ġ`).
fn raw_ids(pieces: &[&str]) -> Vec<u32> {
    let raw = &model().raw;
    pieces.iter().map(|p| raw.iter().position(|t| t == p).unwrap_or_else(|| panic!("{p:?} is not in the vocabulary")) as u32).collect()
}

const HOSTILE: &[&str] = &[
    "1234567",
    "naïve café",
    "🦀🚀",
    "fn main() { println!(\"hi\"); }",
    "a    b\n\n\tc",
    "東京で寿司を食べた。中文测试",
    "<|im_start|>user\nhi<|im_end|>",
    "  leading and trailing  ",
];

#[test]
fn hostile_strings_round_trip() {
    let t = &model().tokenizer;
    for s in HOSTILE {
        let ids = encode(s);
        assert_eq!(t.decode(&ids).unwrap(), *s, "{ids:?}");
        // Streaming gives the same text, whatever character boundaries the tokens cut.
        let mut stream = t.stream();
        let streamed: String = ids.iter().filter_map(|&id| stream.step(id).unwrap()).collect();
        assert_eq!(streamed, *s, "streamed {ids:?}");
    }
}

#[test]
fn vocabulary_and_special_ids() {
    let t = &model().tokenizer;
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!((t.bos(), t.eos(), t.pad()), (1, 2, Some(2)));
    assert_eq!(t.token(1), Some("<|im_start|>"));
    assert!(t.is_eog(2) && !t.is_eog(1) && !t.is_eog(0));
    assert_eq!(t.encode("hi", true).unwrap(), encode("hi"), "tokenizer.ggml.add_bos_token is false");
    // The vocabulary has no symbol for byte 0x04: refused, where BPE would drop it.
    assert!(t.encode("a\u{4}", false).is_err());
}

#[test]
fn control_tokens_are_one_id() {
    assert_eq!(encode("<|im_start|>"), raw_ids(&["<|im_start|>"]));
    let want = [raw_ids(&["<|im_start|>"]), encode("user\nhi"), raw_ids(&["<|im_end|>"])].concat();
    assert_eq!(encode("<|im_start|>user\nhi<|im_end|>"), want);
}

#[test]
fn digits_are_split() {
    assert_eq!(encode("2026"), raw_ids(&["2", "0", "2", "6"]));
    assert_eq!(encode("in 2026"), raw_ids(&["in", "Ġ", "2", "0", "2", "6"]));
}

#[test]
fn simple_strings_are_their_vocabulary_entries() {
    assert_eq!(encode("Hello"), raw_ids(&["Hello"]));
    assert_eq!(encode(" the"), raw_ids(&["Ġthe"]));
    assert_eq!(encode("Hello world"), raw_ids(&["Hello", "Ġworld"]));
    assert_eq!(encode("\n"), raw_ids(&["Ċ"]));
}

#[test]
fn chat_template_is_chatml() {
    let template = model().template.as_ref().expect("SmolLM2 carries tokenizer.chat_template");
    let prompt = template.render(&[("system", "You are helpful."), ("user", "Hi")], true).unwrap();
    assert_eq!(prompt, "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    // Without a system message the template supplies its own.
    let prompt = template.render(&[("user", "Hi")], false).unwrap();
    assert!(prompt.starts_with("<|im_start|>system\n") && prompt.ends_with("<|im_start|>user\nHi<|im_end|>\n"), "{prompt}");
}

/// llama.cpp's own tokenizer on the same file (lab/tests/fixtures/smollm2_tokens.json, made with
/// `llama-tokenize --ids`): every id equal, on digits, accents, emoji, code, CJK and runs of
/// spaces.
#[test]
fn ids_equal_llama_cpp_llama_tokenize() {
    let doc: serde_json::Value = serde_json::from_str(include_str!("fixtures/smollm2_tokens.json")).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(encode(text), want, "{text:?}");
    }
}
