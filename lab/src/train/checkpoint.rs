//! Checkpoints in safetensors: every parameter under its GGUF name, AdamW's moments under
//! `adam.m.<name>` and `adam.v.<name>` (all F32), and in the metadata the model config, the
//! optimizer's settings, the step, the data position, the batch shape and the seed: all a resume
//! needs to continue bit for bit as if it had never stopped.

use super::data::Stream;
use super::model::{Layout, Model};
use super::optim::{AdamW, State};
use super::trainer::Trainer;
use crate::model::llama::Config;
use crate::{LabError, Result};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

const FORMAT: &str = "lab-train-checkpoint-1";

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| LabError::Invalid(format!("checkpoint metadata: {e}")))
}

impl Trainer {
    /// Writes a new checkpoint at `path` (never over an existing file); returns its size in bytes.
    pub fn save(&self, path: &Path) -> Result<u64> {
        self.host_current()?;
        let lay = &self.model.layout;
        let mut data = Vec::new();
        for s in lay.spans() {
            for (prefix, buf) in [("", &self.model.params), ("adam.m.", &self.state.m), ("adam.v.", &self.state.v)] {
                data.push((format!("{prefix}{}", s.name), s.shape.clone(), f32_bytes(&buf[s.at.clone()])));
            }
        }
        let meta = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("config".to_string(), json(&lay.config)?),
            ("optimizer".to_string(), json(&self.opt)?),
            ("step".to_string(), self.state.step.to_string()),
            ("data_position".to_string(), self.stream.position.to_string()),
            ("data_tokens".to_string(), self.stream.tokens.len().to_string()),
            ("rows".to_string(), self.rows.to_string()),
            ("seq".to_string(), self.seq.to_string()),
            ("seed".to_string(), self.seed.to_string()),
        ]);
        let views = data.iter().map(|(n, shape, b)| TensorView::new(Dtype::F32, shape.clone(), b).map(|v| (n.clone(), v)));
        let views = views.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| LabError::Invalid(format!("checkpoint: {e}")))?;
        let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| LabError::Invalid(format!("checkpoint: {e}")))?;
        crate::weights::write_new(path, &bytes)?;
        Ok(bytes.len() as u64)
    }

    /// The trainer saved at `path`, reading its batches from `tokens` (the stream it was trained on).
    pub fn resume(path: &Path, tokens: Vec<u32>) -> Result<Trainer> {
        let bytes = std::fs::read(path).map_err(|e| LabError::io(path, e))?;
        let bad = |why: String| LabError::Invalid(format!("{}: {why}", path.display()));
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let get = |k: &str| meta.get(k).ok_or_else(|| bad(format!("metadata `{k}` is missing (not a checkpoint of the lab's trainer?)")));
        if get("format")? != FORMAT {
            return Err(bad(format!("format `{}`, expected `{FORMAT}`", get("format")?)));
        }
        let num = |k: &str| get(k)?.parse::<u64>().map_err(|e| bad(format!("metadata `{k}`: {e}")));
        let config: Config = serde_json::from_str(get("config")?).map_err(|e| bad(format!("metadata `config`: {e}")))?;
        let opt: AdamW = serde_json::from_str(get("optimizer")?).map_err(|e| bad(format!("metadata `optimizer`: {e}")))?;
        if num("data_tokens")? != tokens.len() as u64 {
            return Err(bad(format!("trained on a stream of {} tokens; this one has {}", num("data_tokens")?, tokens.len())));
        }
        let layout = Layout::new(&config)?;
        let mut buf = [vec![0f32; layout.len], vec![0f32; layout.len], vec![0f32; layout.len]];
        for s in layout.spans() {
            for (prefix, out) in ["", "adam.m.", "adam.v."].iter().zip(buf.iter_mut()) {
                let name = format!("{prefix}{}", s.name);
                let t = st.tensor(&name).map_err(|_| bad(format!("tensor `{name}` is missing")))?;
                if t.dtype() != Dtype::F32 || t.shape() != s.shape.as_slice() {
                    return Err(bad(format!("tensor `{name}` is {:?} {:?}; the config needs F32 {:?}", t.dtype(), t.shape(), s.shape)));
                }
                out[s.at.clone()].iter_mut().zip(t.data().chunks_exact(4)).for_each(|(o, b)| *o = f32::from_le_bytes(b.try_into().expect("4 bytes")));
            }
        }
        let [params, m, v] = buf;
        let (rows, seq) = (num("rows")? as usize, num("seq")? as usize);
        let mut stream = Stream::new(tokens, seq)?;
        stream.position = num("data_position")? as usize;
        let state = State { m, v, step: num("step")? as usize };
        Trainer::new(Model { layout, params }, opt, state, stream, (rows, seq), num("seed")?)
    }
}
