//! A Llama model's hyper-parameters, read from a GGUF file's `llama.*` metadata (names as
//! llama.cpp's `llm_kv` table writes them).

use crate::quant::ggml;
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
    /// Llama 3.1's per-pair frequency factors (`rope_freqs.weight`, one per rotated pair): pair
    /// `i` turns `factor[i]` times slower. Its converter writes them in place of a scaling type.
    #[serde(default)]
    pub rope_factors: Option<Vec<f32>>,
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
        for key in ["attention.key_length", "attention.value_length"] {
            if num(key).is_some_and(|n| n != head_dim as f64) {
                return Err(LabError::Invalid(format!("metadata llama.{key} is {}: heads other than width / heads ({head_dim}) are not supported", num(key).unwrap_or(0.0))));
            }
        }
        if num("expert_count").is_some_and(|n| n > 0.0) {
            return Err(LabError::Invalid("metadata llama.expert_count is set: mixture-of-experts Llama files are not supported".into()));
        }
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
        let rope_factors = match g.tensor("rope_freqs.weight") {
            None => None,
            Some(t) if t.dims.iter().map(|&d| d as usize).eq([rope_dims / 2]) => {
                let f = ggml::to_f32(t.ty, g.data(t)).map_err(|e| LabError::Invalid(format!("tensor `rope_freqs.weight`: {e}")))?;
                if let Some((i, x)) = f.iter().enumerate().find(|(_, x)| !(x.is_finite() && **x > 0.0)) {
                    return Err(LabError::Invalid(format!("tensor `rope_freqs.weight` holds {x} at {i}: frequency factors are positive")));
                }
                Some(f)
            }
            Some(t) => return Err(LabError::Invalid(format!("tensor `rope_freqs.weight` has ggml dims {:?}, RoPE's {rope_dims} dims need [{}]", t.dims, rope_dims / 2))),
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
            rope_factors,
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
        let factor = self.rope_factors.as_ref().map_or(1.0, |f| f[i] as f64);
        p * (self.rope_base as f64).powf(-2.0 * i as f64 / self.rope_dims as f64) / factor
    }
}

fn missing(key: &str, what: &str) -> LabError {
    LabError::Invalid(format!("metadata `{key}` is missing ({what} is needed)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::gguf::GgmlType;
    use crate::weights::gguf_writer::{encode, GgufWriter};

    /// A 2-layer model's metadata (width 8, two heads of 4) and whatever else `edit` adds.
    fn config(edit: impl FnOnce(&mut GgufWriter)) -> Result<Config> {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("llama".into()));
        for (k, v) in [("block_count", 2), ("embedding_length", 8), ("attention.head_count", 2), ("feed_forward_length", 16), ("context_length", 64), ("vocab_size", 10)] {
            w.set(&format!("llama.{k}"), Value::U32(v));
        }
        w.set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
        edit(&mut w);
        Config::from_gguf(&Gguf::parse(&w.to_bytes()?)?)
    }

    fn factors(f: &[f32]) -> impl FnOnce(&mut GgufWriter) + '_ {
        move |w| w.add_tensor("rope_freqs.weight", &[f.len() as u64], GgmlType::F32, encode(GgmlType::F32, f).unwrap()).unwrap()
    }

    #[test]
    fn frequency_factors_of_two_turn_as_linear_scaling_by_two() {
        let by_factors = config(factors(&[2.0, 2.0])).unwrap();
        let linear = config(|w| {
            w.set("llama.rope.scaling.type", Value::String("linear".into()));
            w.set("llama.rope.scaling.factor", Value::F32(2.0));
        })
        .unwrap();
        let plain = config(|_| {}).unwrap();
        for (pos, i) in [(0, 0), (1, 0), (7, 1), (63, 1)] {
            assert_eq!(by_factors.rope_angle(pos, i), linear.rope_angle(pos, i));
            assert_eq!(plain.rope_angle(pos, i), 2.0 * linear.rope_angle(pos, i));
        }
        // Per pair: only the second pair slows down.
        let mixed = config(factors(&[1.0, 4.0])).unwrap();
        assert_eq!((mixed.rope_angle(5, 0), mixed.rope_angle(5, 1)), (plain.rope_angle(5, 0), plain.rope_angle(5, 1) / 4.0));
    }

    #[test]
    fn what_the_engine_cannot_run_is_a_named_error() {
        let e = |edit: Box<dyn FnOnce(&mut GgufWriter)>| config(edit).unwrap_err().to_string();
        let short = e(Box::new(factors(&[1.0])));
        assert!(short.contains("`rope_freqs.weight` has ggml dims [1]") && short.contains("need [2]"), "{short}");
        let zero = e(Box::new(factors(&[1.0, 0.0])));
        assert!(zero.contains("holds 0 at 1"), "{zero}");
        let keys = e(Box::new(|w: &mut GgufWriter| w.set("llama.attention.key_length", Value::U32(8))));
        assert!(keys.contains("llama.attention.key_length is 8"), "{keys}");
        let moe = e(Box::new(|w: &mut GgufWriter| w.set("llama.expert_count", Value::U32(8))));
        assert!(moe.contains("mixture-of-experts"), "{moe}");
        assert!(config(|w| w.set("llama.attention.key_length", Value::U32(4))).is_ok(), "the head size itself is fine");
    }
}
