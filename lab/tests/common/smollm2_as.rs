//! SmolLM2-135M-Instruct rewritten as the Llama files it is not, to check the lab against
//! llama.cpp on what those files hold without having them at hand:
//! - [`llama3`]: the `llama-bpe` pre-tokenizer and Llama 3.1's RoPE frequency factors
//!   (`rope_freqs.weight`), matrices in f16 so that llama.cpp's CPU arithmetic stays close to
//!   the lab's f64 reference;
//! - [`spm`]: its vocabulary as a SentencePiece one (`tokenizer.ggml.model = llama`, as Llama 2,
//!   TinyLlama and Mistral files have), without tensors.
//!
//! lab/examples/smollm2_as.rs writes both and asks llama.cpp for the fixtures
//! (lab/tests/fixtures/smollm2_as_*.json); lab/tests/smollm2_as.rs checks the lab against them.

use lab::model::tokenizer::Tokenizer;
use lab::weights::gguf::{GgmlType, Gguf, Value};
use lab::weights::gguf_writer::{encode, requantize, GgufWriter};
use std::collections::HashSet;

/// Texts for the tokenizers: what Llama 3's split treats apart from GPT-2's (runs of digits,
/// upper-case contractions, punctuation before newlines, whitespace runs), what SentencePiece's
/// leading space and byte fallback meet (text after a control token, leading spaces, characters
/// without a token), and the usual hostile ones (accents, emoji, CJK, code).
pub const TEXTS: &[&str] = &[
    "The capital of France is",
    "Hello world! 1234567 naïve café 🦀🚀",
    "fn main() {\n    println!(\"hi\");\n}",
    "a    b\n\n\tc   ",
    "<|im_start|>user\nhi<|im_end|>",
    "日本語のテキスト and ẞ ß Ωmega",
    "I'M SURE THEY'LL COME, DON'T YOU? we've 3.14159 x=42",
    "12345678901 +1-555-0100 2026-11-29",
    "end.\n\n\nNext!!\r\n  \t indented\n",
    " leading, trailing  ",
];

pub const LLAMA3_PRE: &str = "llama-bpe";

/// Llama 3.1's frequency factors (Meta's `apply_scaling`; llama.cpp's converter stores them as
/// `rope_freqs.weight`): pairs whose wavelength exceeds `context / low` turn `factor` times
/// slower, those under `context / high` keep their speed, and those between blend the two. The
/// original context is scaled down to 64 positions so that the few positions of a test prompt
/// see most pairs change (Llama 3.1 itself: factor 8, low 1, high 4, context 8192).
pub fn factors(rope_dims: usize, base: f64) -> Vec<f32> {
    let (factor, low, high, context) = (8.0, 1.0, 4.0, 64.0);
    (0..rope_dims / 2)
        .map(|i| {
            let wavelength = 2.0 * std::f64::consts::PI * base.powf(2.0 * i as f64 / rope_dims as f64);
            if wavelength < context / high {
                1.0
            } else if wavelength > context / low {
                factor as f32
            } else {
                let smooth = (context / wavelength - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// `g`'s matrices in f16, its pre-tokenizer `LLAMA3_PRE`, and `factors` for its RoPE.
pub fn llama3(g: &Gguf) -> GgufWriter {
    let c = lab::model::llama::Config::from_gguf(g).expect("a Llama file");
    let mut w = requantize(g, GgmlType::F16).expect("an f16 copy");
    w.set("tokenizer.ggml.pre", Value::String(LLAMA3_PRE.into()));
    let f = factors(c.rope_dims, c.rope_base as f64);
    w.add_tensor("rope_freqs.weight", &[f.len() as u64], GgmlType::F32, encode(GgmlType::F32, &f).expect("f32")).expect("a tensor");
    w
}

/// `g`'s metadata with its vocabulary made SentencePiece's: each token's text with spaces as `▁`
/// (control tokens as they are), scored minus its id (SmolLM2's ids follow its merges, so the
/// earlier merge wins), a token that is no whole UTF-8 text (or whose text another token already
/// has) replaced by an unused placeholder, and the 256 byte tokens `<0xXX>` appended. SmolLM2's
/// flags go, so that SentencePiece's defaults hold (BOS, and a space before the text). No merges,
/// no pre-tokenizer, no tensors: what llama-tokenize reads.
pub fn spm(g: &Gguf) -> GgufWriter {
    let bpe = Tokenizer::from_gguf(g).expect("SmolLM2's tokenizer");
    let types: Vec<u64> = g.get("tokenizer.ggml.token_type").and_then(Value::as_array).expect("token types").iter().map(|v| v.as_u64().unwrap()).collect();
    let (normal, control, unused, byte) = (1, 3, 5, 6);
    let mut seen = HashSet::new();
    let (mut tokens, mut kinds, mut scores) = (Vec::new(), Vec::new(), Vec::new());
    for (id, &ty) in types.iter().enumerate() {
        let raw = bpe.token(id as u32).expect("a token").to_owned();
        let text = if ty == control { raw } else { bpe.decode(&[id as u32]).expect("a token's text").replace(' ', "▁") };
        let whole = !text.contains('\u{FFFD}') && !text.starts_with("<0x") && seen.insert(text.clone());
        let (text, ty) = if whole { (text, ty) } else { (format!("<unused{id}>"), unused) };
        tokens.push(Value::String(text));
        kinds.push(Value::I32(ty as i32));
        scores.push(Value::F32(if ty == normal { -(id as f32) } else { 0.0 }));
    }
    for b in 0..=255u8 {
        tokens.push(Value::String(format!("<0x{b:02X}>")));
        kinds.push(Value::I32(byte));
        scores.push(Value::F32(0.0));
    }
    let mut w = GgufWriter::with_metadata_of(g);
    w.set("tokenizer.ggml.model", Value::String("llama".into()));
    w.remove("tokenizer.ggml.merges");
    w.remove("tokenizer.ggml.pre");
    w.remove("tokenizer.ggml.add_bos_token");
    w.remove("tokenizer.ggml.add_space_prefix");
    w.set("tokenizer.ggml.tokens", Value::Array(tokens));
    w.set("tokenizer.ggml.token_type", Value::Array(kinds));
    w.set("tokenizer.ggml.scores", Value::Array(scores));
    w
}
