//! A Llama model's hyper-parameters, read from a GGUF file's `llama.*` metadata (names as
//! llama.cpp's `llm_kv` table writes them).

use crate::weights::gguf::{Gguf, Value};
use crate::{LabError, Result};

/// RoPE frequency scaling: none, or linear (positions divided by `factor`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RopeScaling {
    None,
    Linear { factor: f32 },
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    pub layers: usize,
    /// Width of the residual stream.
    pub dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Hidden width of the SwiGLU feed-forward.
    pub ffn: usize,
    pub vocab: usize,
    pub context: usize,
    pub eps: f32,
    pub rope_base: f32,
    /// Leading dimensions of each head that RoPE rotates (pairs of neighbours, llama.cpp's
    /// "normal" RoPE: its converter permutes Q and K so that this equals the model's own).
    pub rope_dims: usize,
    pub rope_scaling: RopeScaling,
    /// The LM head is the token embedding (no `output.weight` in the file).
    pub tied_embeddings: bool,
}

fn number(v: &Value) -> Option<f64> {
    match *v {
        Value::F32(x) => Some(x as f64),
        Value::F64(x) => Some(x),
        _ => v.as_u64().map(|x| x as f64),
    }
}

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.get("general.architecture").and_then(Value::as_str).ok_or_else(|| missing("general.architecture", "a string"))?;
        if arch != "llama" {
            return Err(LabError::Invalid(format!("general.architecture is `{arch}`: only `llama` models are supported")));
        }
        let num = |key: &str| g.get(&format!("llama.{key}")).and_then(number);
        let int = |key: &str| -> Result<usize> {
            match num(key) {
                Some(x) if x >= 1.0 && x.fract() == 0.0 => Ok(x as usize),
                Some(x) => Err(LabError::Invalid(format!("metadata llama.{key} is {x}: a positive integer is needed"))),
                None => Err(missing(&format!("llama.{key}"), "a positive integer")),
            }
        };
        let (dim, heads) = (int("embedding_length")?, int("attention.head_count")?);
        let kv_heads = if num("attention.head_count_kv").is_some() { int("attention.head_count_kv")? } else { heads };
        if dim % heads != 0 || heads % kv_heads != 0 {
            return Err(LabError::Invalid(format!(
                "{heads} heads of a {dim}-wide model with {kv_heads} KV heads: the width must split into heads and the heads into KV groups"
            )));
        }
        let head_dim = dim / heads;
        let rope_dims = if num("rope.dimension_count").is_some() { int("rope.dimension_count")? } else { head_dim };
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(LabError::Invalid(format!("llama.rope.dimension_count is {rope_dims}: an even count up to the head size {head_dim}")));
        }
        let rope_scaling = match g.get("llama.rope.scaling.type").and_then(Value::as_str) {
            None | Some("none") => RopeScaling::None,
            Some("linear") => match num("rope.scaling.factor") {
                Some(f) if f > 0.0 => RopeScaling::Linear { factor: f as f32 },
                _ => return Err(missing("llama.rope.scaling.factor", "a positive number for linear RoPE scaling")),
            },
            Some(other) => return Err(LabError::Invalid(format!("llama.rope.scaling.type `{other}` is not supported (none, linear)"))),
        };
        let vocab = match num("vocab_size") {
            Some(_) => int("vocab_size")?,
            None => g.get("tokenizer.ggml.tokens").and_then(Value::as_array).map(<[Value]>::len).ok_or_else(|| missing("llama.vocab_size", "the vocabulary size"))?,
        };
        let positive = |key: &str, default: Option<f64>| -> Result<f32> {
            match num(key).or(default) {
                Some(x) if x > 0.0 && x.is_finite() => Ok(x as f32),
                Some(x) => Err(LabError::Invalid(format!("metadata llama.{key} is {x}: a positive number is needed"))),
                None => Err(missing(&format!("llama.{key}"), "a positive number")),
            }
        };
        Ok(Config {
            layers: int("block_count")?,
            dim,
            heads,
            kv_heads,
            head_dim,
            ffn: int("feed_forward_length")?,
            vocab,
            context: int("context_length")?,
            eps: positive("attention.layer_norm_rms_epsilon", None)?,
            rope_base: positive("rope.freq_base", Some(10000.0))?,
            rope_dims,
            rope_scaling,
            tied_embeddings: g.tensor("output.weight").is_none(),
        })
    }

    /// Width of the K (and V) projection: KV heads x head size.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The angle RoPE turns pair `i` (of `rope_dims / 2`) by at position `pos`, in f64.
    pub fn rope_angle(&self, pos: usize, i: usize) -> f64 {
        let p = match self.rope_scaling {
            RopeScaling::None => pos as f64,
            RopeScaling::Linear { factor } => pos as f64 / factor as f64,
        };
        p * (self.rope_base as f64).powf(-2.0 * i as f64 / self.rope_dims as f64)
    }
}

fn missing(key: &str, what: &str) -> LabError {
    LabError::Invalid(format!("metadata `{key}` is missing ({what} is needed)"))
}
