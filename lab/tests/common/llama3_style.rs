//! SmolLM2-135M-Instruct rewritten with what Llama 3 GGUF files hold and SmolLM2's does not:
//! the `llama-bpe` pre-tokenizer and Llama 3.1's RoPE frequency factors (`rope_freqs.weight`),
//! with its matrices in f16 so that llama.cpp's CPU arithmetic stays close to the lab's f64
//! reference. lab/examples/llama3_style.rs writes the file and asks llama.cpp for the fixture
//! (lab/tests/fixtures/smollm2_llama3_style.json); lab/tests/llama3_style.rs checks the lab
//! against it.

use lab::weights::gguf::{GgmlType, Gguf, Value};
use lab::weights::gguf_writer::{encode, requantize, GgufWriter};

pub const PRE: &str = "llama-bpe";

/// Texts for the tokenizer: what Llama 3's split treats apart from GPT-2's (runs of digits,
/// upper-case contractions, punctuation before newlines, whitespace runs) and the usual hostile
/// ones (accents, emoji, CJK, code, control tokens).
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

/// The file: `g`'s matrices in f16, its pre-tokenizer `PRE`, and `factors` for its RoPE.
pub fn file(g: &Gguf) -> GgufWriter {
    let c = lab::model::llama::Config::from_gguf(g).expect("a Llama file");
    let mut w = requantize(g, GgmlType::F16).expect("an f16 copy");
    w.set("tokenizer.ggml.pre", Value::String(PRE.into()));
    let f = factors(c.rope_dims, c.rope_base as f64);
    w.add_tensor("rope_freqs.weight", &[f.len() as u64], GgmlType::F32, encode(GgmlType::F32, &f).expect("f32")).expect("a tensor");
    w
}
