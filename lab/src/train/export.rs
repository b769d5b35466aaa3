//! The trained model as a GGUF file: `llama.*` metadata as llama.cpp's converter writes it, the
//! tokenizer metadata copied from the GGUF whose tokenizer the text was tokenized with, norm
//! weights in F32 and matrices in the chosen format. Nothing needs permuting: the trainer applies
//! RoPE to neighbouring pairs, the convention llama.cpp and the lab's engine read a llama GGUF in.

use super::model::Model;
use crate::model::llama::config::RopeScaling;
use crate::weights::gguf::{GgmlType, Gguf, Value};
use crate::weights::gguf_writer::{encode, GgufWriter};
use crate::{LabError, Result};

/// ggml's `general.file_type` for the formats a trained model is written in.
fn file_type(ty: GgmlType) -> Result<u32> {
    Ok(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        _ => return Err(LabError::Invalid(format!("a trained model is written in f32, f16, q8_0, q4_0 or q4_1, not {}", ty.name()))),
    })
}

/// `model` as a GGUF writer; `tokenizer` (a GGUF with the same vocabulary) gives the
/// `tokenizer.*` metadata llama.cpp needs to load the file.
pub fn to_gguf(model: &Model, matrices: GgmlType, tokenizer: Option<&Gguf>, name: &str) -> Result<GgufWriter> {
    let c = &model.layout.config;
    let u = |x: usize| Value::U32(x as u32);
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("general.name", Value::String(name.into()));
    for (k, v) in [
        ("llama.block_count", u(c.layers)),
        ("llama.context_length", u(c.context)),
        ("llama.embedding_length", u(c.dim)),
        ("llama.feed_forward_length", u(c.ffn)),
        ("llama.attention.head_count", u(c.heads)),
        ("llama.attention.head_count_kv", u(c.kv_heads)),
        ("llama.rope.freq_base", Value::F32(c.rope_base)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(c.eps)),
        ("llama.rope.dimension_count", u(c.rope_dims)),
        ("llama.vocab_size", u(c.vocab)),
        ("general.file_type", Value::U32(file_type(matrices)?)),
    ] {
        w.set(k, v);
    }
    if let RopeScaling::Linear { factor } = c.rope_scaling {
        w.set("llama.rope.scaling.type", Value::String("linear".into()));
        w.set("llama.rope.scaling.factor", Value::F32(factor));
    }
    if let Some(f) = &c.rope_factors {
        w.add_tensor("rope_freqs.weight", &[f.len() as u64], GgmlType::F32, encode(GgmlType::F32, f)?)?;
    }
    if let Some(g) = tokenizer {
        let n = g.get("tokenizer.ggml.tokens").and_then(Value::as_array).map_or(0, <[Value]>::len);
        if n != c.vocab {
            return Err(LabError::Invalid(format!("the tokenizer has {n} tokens but the model's vocabulary is {}", c.vocab)));
        }
        g.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")).for_each(|(k, v)| w.set(k, v.clone()));
    }
    for s in model.layout.spans() {
        let dims: Vec<u64> = s.shape.iter().rev().map(|&d| d as u64).collect();
        let ty = if s.shape.len() == 1 { GgmlType::F32 } else { matrices };
        w.add_tensor(&s.name, &dims, ty, encode(ty, model.get(s))?)?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::Backend;
    use crate::model::llama::CpuModel;
    use crate::ops::compare::compare;
    use crate::record::Tolerance;
    use crate::train::tests::{random_model, tiny};

    /// The engine's CPU reference reads the file back; its last-position logits equal the
    /// trainer's on the same tokens to 1e-5 absolute + 1e-5 relative (f32 sums in different order).
    fn readback(model: &Model, ty: GgmlType, tokens: &[u32]) -> crate::record::ErrorStats {
        let bytes = to_gguf(model, ty, None, "test").unwrap().to_bytes().unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        let cpu = CpuModel::load(&g).unwrap();
        assert_eq!(cpu.config, model.layout.config);
        let got = cpu.forward(&mut cpu.cache(), tokens).unwrap();
        let all = model.logits(&Backend::Cpu, tokens).unwrap();
        let want: Vec<f64> = all[all.len() - model.layout.config.vocab..].iter().map(|&v| v as f64).collect();
        compare(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, Tolerance { atol: 1e-5, rtol: 1e-5 }, "trainer forward")
    }

    #[test]
    fn the_engine_reads_the_written_model_back_to_the_trainers_logits() {
        let tokens = [3u32, 36, 0, 17, 17, 5, 29, 11, 2];
        for tied in [false, true] {
            // The tied model also carries RoPE frequency factors, which travel as `rope_freqs.weight`.
            let c = crate::model::llama::Config { rope_factors: tied.then(|| vec![1.0, 2.5, 8.0]), ..tiny(tied) };
            let mut m = random_model(&c, 5);
            let e = readback(&m, GgmlType::F32, &tokens);
            assert!(e.passed(), "f32, tied={tied}: {e:?}");
            // F16 matrices: the trainer on the same rounded weights gives the same logits.
            let spans: Vec<_> = m.layout.spans().into_iter().filter(|s| s.shape.len() > 1).cloned().collect();
            for s in spans {
                m.params[s.at].iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
            }
            let e = readback(&m, GgmlType::F16, &tokens);
            assert!(e.passed(), "f16, tied={tied}: {e:?}");
        }
    }

    #[test]
    fn a_changed_weight_fails_the_readback() {
        let mut m = random_model(&tiny(false), 5);
        let bytes = to_gguf(&m, GgmlType::F32, None, "test").unwrap().to_bytes().unwrap();
        let at = m.layout.layers[1].down.at.start + 3;
        m.params[at] += 0.05;
        let cpu = CpuModel::load(&Gguf::parse(&bytes).unwrap()).unwrap();
        let tokens = [1u32, 2, 3];
        let got = cpu.forward(&mut cpu.cache(), &tokens).unwrap();
        let all = m.logits(&Backend::Cpu, &tokens).unwrap();
        let want: Vec<f64> = all[all.len() - 37..].iter().map(|&v| v as f64).collect();
        let e = compare(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, Tolerance { atol: 1e-5, rtol: 1e-5 }, "trainer forward");
        assert!(!e.passed(), "one weight moved by 0.05 went unnoticed: {e:?}");
    }
}
