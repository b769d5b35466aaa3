//! Which GGUF tensors make a Llama model, with their shapes checked against the [`Config`]
//! before anything is read. Tensor names and ggml dimension order (input dimension first) as
//! llama.cpp's `LLM_TENSOR_NAMES` for `llama`.

use super::config::Config;
use crate::weights::gguf::{Gguf, TensorInfo};
use crate::{LabError, Result};

/// One transformer block's tensors, whatever form they take (GGUF infos, f32 on the host,
/// quantized on the GPU).
#[derive(Clone, Debug)]
pub struct Layer<T> {
    pub attn_norm: T,
    pub q: T,
    pub k: T,
    pub v: T,
    pub o: T,
    pub ffn_norm: T,
    pub gate: T,
    pub up: T,
    pub down: T,
}

impl<T> Layer<T> {
    pub fn try_map<U>(&self, mut f: impl FnMut(&str, &T) -> Result<U>) -> Result<Layer<U>> {
        Ok(Layer {
            attn_norm: f("attn_norm", &self.attn_norm)?,
            q: f("attn_q", &self.q)?,
            k: f("attn_k", &self.k)?,
            v: f("attn_v", &self.v)?,
            o: f("attn_output", &self.o)?,
            ffn_norm: f("ffn_norm", &self.ffn_norm)?,
            gate: f("ffn_gate", &self.gate)?,
            up: f("ffn_up", &self.up)?,
            down: f("ffn_down", &self.down)?,
        })
    }
}

/// Every tensor of the model, found and shape-checked.
#[derive(Debug)]
pub struct Tensors<'g> {
    /// `vocab x dim` rows (ggml dims [dim, vocab]).
    pub embed: &'g TensorInfo,
    pub layers: Vec<Layer<&'g TensorInfo>>,
    pub out_norm: &'g TensorInfo,
    /// The LM head when it is not tied to the embedding.
    pub output: Option<&'g TensorInfo>,
}

impl<'g> Tensors<'g> {
    pub fn find(g: &'g Gguf, c: &Config) -> Result<Self> {
        let t = |name: &str, dims: &[usize]| -> Result<&'g TensorInfo> {
            let info = g.tensor(name).ok_or_else(|| LabError::Invalid(format!("tensor `{name}` is missing from the model file")))?;
            if info.dims.iter().map(|&d| d as usize).ne(dims.iter().copied()) {
                return Err(LabError::Invalid(format!("tensor `{name}` has ggml dims {:?}, the config needs {dims:?}", info.dims)));
            }
            Ok(info)
        };
        let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn);
        let layers = (0..c.layers)
            .map(|i| {
                let b = |n: &str, dims: &[usize]| t(&format!("blk.{i}.{n}.weight"), dims);
                Ok(Layer {
                    attn_norm: b("attn_norm", &[d])?,
                    q: b("attn_q", &[d, d])?,
                    k: b("attn_k", &[d, kv])?,
                    v: b("attn_v", &[d, kv])?,
                    o: b("attn_output", &[d, d])?,
                    ffn_norm: b("ffn_norm", &[d])?,
                    gate: b("ffn_gate", &[d, f])?,
                    up: b("ffn_up", &[d, f])?,
                    down: b("ffn_down", &[f, d])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensors {
            embed: t("token_embd.weight", &[d, c.vocab])?,
            layers,
            out_norm: t("output_norm.weight", &[d])?,
            output: if c.tied_embeddings { None } else { Some(t("output.weight", &[d, c.vocab])?) },
        })
    }

    /// The LM head: `output.weight`, or the embedding when they are tied.
    pub fn head(&self) -> &'g TensorInfo {
        self.output.unwrap_or(self.embed)
    }
}
