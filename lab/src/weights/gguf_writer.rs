//! A GGUF writer (version 3): the format [`super::gguf`] reads and llama.cpp loads, laid out as
//! llama.cpp's own writer lays it out (metadata in the order given, tensor infos, zero padding
//! to the alignment, each tensor's data at the next aligned offset), so a file read and written
//! back is the same bytes (tested on SmolLM2). [`requantize`] writes a model's matrices in another
//! ggml format with the lab's quantizers.

use super::gguf::{GgmlType, Gguf, Value, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::quant::ggml::{self, Block};
use crate::{LabError, Result};
use std::path::Path;

/// A GGUF file to be written: metadata, then tensors, each with its data.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

fn invalid(what: String) -> LabError {
    LabError::Invalid(format!("GGUF writer: {what}"))
}

/// The GGUF value type of `v` (the reader's numbering).
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, key: &str, v: &Value) -> Result<()> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(items) => {
            // One element type per array; an empty one is written as an array of u32.
            let ety = items.first().map_or(4, type_id);
            if let Some(bad) = items.iter().find(|i| type_id(i) != ety) {
                return Err(invalid(format!("`{key}` mixes element types {ety} and {} in one array", type_id(bad))));
            }
            out.extend_from_slice(&ety.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, key, i)?;
            }
        }
    }
    Ok(())
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer holding `g`'s metadata (its alignment included) and none of its tensors.
    pub fn with_metadata_of(g: &Gguf) -> Self {
        GgufWriter { metadata: g.metadata.clone(), tensors: Vec::new() }
    }

    /// Sets `key`, in place where it exists, else at the end.
    pub fn set(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    /// Removes `key` where it is set.
    pub fn remove(&mut self, key: &str) {
        self.metadata.retain(|(k, _)| k != key);
    }

    /// Adds a tensor: `dims` in ggml order (the contiguous dimension first), `data` exactly the
    /// bytes its type and shape take.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Result<()> {
        if self.tensors.iter().any(|t| t.0 == name) {
            return Err(invalid(format!("tensor `{name}` is added twice")));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS as usize || dims.contains(&0) {
            return Err(invalid(format!("tensor `{name}` has dims {dims:?}: 1 to {MAX_DIMS} dimensions, none of them 0")));
        }
        let (per_block, block_bytes) = ty.block().ok_or_else(|| invalid(format!("tensor `{name}` has an unknown ggml type {}", ty.0)))?;
        if !dims[0].is_multiple_of(per_block) {
            return Err(invalid(format!("tensor `{name}`: rows of {} are not whole {}-weight blocks of {}", dims[0], per_block, ty.name())));
        }
        let need = dims.iter().product::<u64>() / per_block * block_bytes;
        if data.len() as u64 != need {
            return Err(invalid(format!("tensor `{name}` ({} {dims:?}) needs {need} bytes, got {}", ty.name(), data.len())));
        }
        self.tensors.push((name.to_string(), dims.to_vec(), ty, data));
        Ok(())
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => Ok(a),
                _ => Err(invalid(format!("general.alignment is {v:?}: a power of two is needed"))),
            },
        }
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let align = self.alignment()?;
        let pad = |n: u64| n.div_ceil(align) * align;
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut out, k, v)?;
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            put_string(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&ty.0.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = pad(offset + data.len() as u64);
        }
        out.resize(pad(out.len() as u64) as usize, 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(out.len() + (pad(data.len() as u64) - data.len() as u64) as usize, 0);
        }
        Ok(out)
    }

    /// Writes the file at `path` through a temporary file beside it, so a failed write leaves
    /// nothing half-written; an existing file is never replaced.
    pub fn write(&self, path: &Path) -> Result<()> {
        super::write_new(path, &self.to_bytes()?)
    }
}

/// ggml's `general.file_type` of a model whose matrices are all of type `ty` (llama.cpp's
/// LLAMA_FTYPE_ALL_F32, MOSTLY_F16, MOSTLY_Q4_0, MOSTLY_Q4_1, MOSTLY_Q8_0, MOSTLY_BF16).
fn file_type(ty: GgmlType) -> Option<u32> {
    Some(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q6_K => 18,
        GgmlType::BF16 => 32,
        _ => return None,
    })
}

/// The formats [`requantize`] writes, by name.
pub fn parse_format(name: &str) -> Result<GgmlType> {
    Ok(match name {
        "f32" => GgmlType::F32,
        "f16" => GgmlType::F16,
        "bf16" => GgmlType::BF16,
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        "q4_1" => GgmlType::Q4_1,
        "q6_k" => GgmlType::Q6_K,
        _ => return Err(LabError::Invalid(format!("unknown format `{name}` (f32, f16, bf16, q8_0, q6_k, q4_0, q4_1)"))),
    })
}

/// `f32` values as tensor data of type `to` (the lab's quantizers for the block formats).
pub fn encode(to: GgmlType, x: &[f32]) -> Result<Vec<u8>> {
    Ok(match to {
        GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => x.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        GgmlType::BF16 => x.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        GgmlType::Q8_0 => ggml::quantize(Block::Q8_0, x)?,
        GgmlType::Q4_0 => ggml::quantize(Block::Q4_0, x)?,
        GgmlType::Q4_1 => ggml::quantize(Block::Q4_1, x)?,
        GgmlType::Q6_K => crate::quant::q6_k::quantize(x)?,
        other => return Err(LabError::Invalid(format!("cannot write GGUF type {}", other.name()))),
    })
}

/// Bits per weight of a ggml type.
fn bits(ty: GgmlType) -> f64 {
    ty.block().map_or(f64::INFINITY, |(n, bytes)| bytes as f64 * 8.0 / n as f64)
}

/// `g` with every matrix (two or more dimensions, rows a whole number of 32-weight blocks) in
/// format `to` (Q8_0 where a row is no whole number of `to`'s blocks: Q6_K's are 256 weights),
/// decoded to f32 first; vectors (norms) stay as they are. The output head
/// (`output.weight`, or `token_embd.weight` where it is tied as the head) stays finer, as
/// llama-quantize keeps it (every logit is read through it): in a format coarser than Q8_0 it is
/// written in Q6_K where its width is a multiple of 256 and in Q8_0 where not, or kept where it is
/// already that coarse or coarser. `general.file_type` says the new format; metadata, tokenizer and
/// tensor order are kept.
pub fn requantize(g: &Gguf, to: GgmlType) -> Result<GgufWriter> {
    let ftype = file_type(to).ok_or_else(|| LabError::Invalid(format!("cannot write a model in {}", to.name())))?;
    let head = if g.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
    let mut w = GgufWriter::with_metadata_of(g);
    w.set("general.file_type", Value::U32(ftype));
    let per_block = to.block().map_or(1, |(n, _)| n);
    for t in &g.tensors {
        let data = g.data(t);
        let matrix = t.dims.len() >= 2 && t.dims[0] % ggml::QK as u64 == 0;
        let ty = match matrix {
            false => t.ty,
            true if t.name == head && bits(to) < bits(GgmlType::Q8_0) => {
                let finer = if t.dims[0] % crate::quant::q6_k::QK_K as u64 == 0 { GgmlType::Q6_K } else { GgmlType::Q8_0 };
                if bits(t.ty) <= bits(finer) { t.ty } else { finer }
            }
            // Rows that are no whole number of the format's blocks (Q6_K's 256 weights) go to Q8_0.
            true if t.dims[0] % per_block != 0 => GgmlType::Q8_0,
            true => to,
        };
        let bytes = if ty != t.ty { encode(ty, &ggml::to_f32(t.ty, data)?)? } else { data.to_vec() };
        w.add_tensor(&t.name, &t.dims, ty, bytes)?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        for (k, v) in [
            ("general.architecture", Value::String("llama".into())),
            ("u8", Value::U8(7)),
            ("i8", Value::I8(-7)),
            ("u16", Value::U16(65535)),
            ("i16", Value::I16(-300)),
            ("i32", Value::I32(-70000)),
            ("f32", Value::F32(0.5)),
            ("bool", Value::Bool(true)),
            ("u64", Value::U64(1 << 40)),
            ("i64", Value::I64(-(1 << 40))),
            ("f64", Value::F64(-2.25)),
            ("tokens", Value::Array(vec![Value::String("<s>".into()), Value::String("é".into())])),
            ("nested", Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)]), Value::Array(vec![])])),
        ] {
            w.set(k, v);
        }
        w.add_tensor("norm", &[5], GgmlType::F32, vec![1; 20]).unwrap();
        w.add_tensor("m", &[64, 3], GgmlType::Q8_0, vec![2; 2 * 3 * 34]).unwrap();
        w.add_tensor("h", &[3, 2, 1], GgmlType::F16, vec![3; 12]).unwrap();
        w
    }

    #[test]
    fn requantize_keeps_the_head_at_q6_k_or_q8_0_or_finer() {
        let types = |head: GgmlType, to: GgmlType| {
            let mut w = GgufWriter::new();
            let values = |n: usize| (0..n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<f32>>();
            w.add_tensor("token_embd.weight", &[64, 4], head, encode(head, &values(256)).unwrap()).unwrap();
            w.add_tensor("blk.0.ffn_up.weight", &[64, 2], GgmlType::F32, encode(GgmlType::F32, &values(128)).unwrap()).unwrap();
            w.add_tensor("blk.0.attn_norm.weight", &[64], GgmlType::F32, encode(GgmlType::F32, &values(64)).unwrap()).unwrap();
            let bytes = w.to_bytes().unwrap();
            let g = Gguf::parse(&bytes).unwrap();
            let out = requantize(&g, to).unwrap().to_bytes().unwrap();
            Gguf::parse(&out).unwrap().tensors.iter().map(|t| t.ty).collect::<Vec<_>>()
        };
        use GgmlType as T;
        assert_eq!(types(T::F32, T::Q4_0), [T::Q8_0, T::Q4_0, T::F32], "an f32 head goes to q8_0, not q4_0, nor stays f32");
        assert_eq!(types(T::F32, T::Q8_0), [T::Q8_0, T::Q8_0, T::F32]);
        assert_eq!(types(T::F32, T::F16), [T::F16, T::F16, T::F32]);
        assert_eq!(types(T::Q8_0, T::Q4_1), [T::Q8_0, T::Q4_1, T::F32], "SmolLM2's q8_0 head is kept");
        assert_eq!(types(T::Q4_0, T::Q4_1), [T::Q4_0, T::Q4_1, T::F32], "a head already coarser than q8_0 is kept");
        assert_eq!(types(T::Q8_0, T::F32), [T::F32, T::F32, T::F32]);
        // A head 256 wide goes to Q6_K, as llama-quantize writes it.
        let mut w = GgufWriter::new();
        let values = (0..1024).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<f32>>();
        w.add_tensor("output.weight", &[256, 4], T::F32, encode(T::F32, &values).unwrap()).unwrap();
        let bytes = w.to_bytes().unwrap();
        for (to, head) in [(T::Q4_0, T::Q6_K), (T::Q4_1, T::Q6_K), (T::Q6_K, T::Q6_K), (T::Q8_0, T::Q8_0)] {
            let out = requantize(&Gguf::parse(&bytes).unwrap(), to).unwrap().to_bytes().unwrap();
            assert_eq!(Gguf::parse(&out).unwrap().tensors[0].ty, head, "a 256-wide head written for {}", to.name());
        }
    }

    /// Q6_K takes rows of 256: a 256-wide matrix goes to Q6_K, a 64-wide one to Q8_0, and the
    /// file reads back to within Q6_K's steps.
    #[test]
    fn requantize_to_q6_k_falls_back_to_q8_0_where_a_row_is_short() {
        let values = |n: usize| (0..n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<f32>>();
        let mut w = GgufWriter::new();
        w.add_tensor("blk.0.ffn_down.weight", &[256, 2], GgmlType::F32, encode(GgmlType::F32, &values(512)).unwrap()).unwrap();
        w.add_tensor("blk.0.ffn_up.weight", &[64, 2], GgmlType::F32, encode(GgmlType::F32, &values(128)).unwrap()).unwrap();
        let bytes = w.to_bytes().unwrap();
        let out = requantize(&Gguf::parse(&bytes).unwrap(), parse_format("q6_k").unwrap()).unwrap().to_bytes().unwrap();
        let g = Gguf::parse(&out).unwrap();
        assert_eq!(g.tensors.iter().map(|t| t.ty).collect::<Vec<_>>(), [GgmlType::Q6_K, GgmlType::Q8_0]);
        assert_eq!(g.get("general.file_type"), Some(&Value::U32(18)));
        let down = ggml::to_f32(GgmlType::Q6_K, g.data(&g.tensors[0])).unwrap();
        assert!(down.iter().zip(values(512)).all(|(a, b)| (a - b).abs() < 0.04), "Q6_K of sines in [-1, 1] is within 2 steps of 1/32");
    }

    #[test]
    fn what_is_written_reads_back_whole_at_any_alignment() {
        for align in [None, Some(64u32), Some(1)] {
            let mut w = sample();
            if let Some(a) = align {
                w.set("general.alignment", Value::U32(a));
            }
            let bytes = w.to_bytes().unwrap();
            let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{align:?}: {e}"));
            assert_eq!(g.metadata, w.metadata);
            assert_eq!(g.alignment, align.map_or(DEFAULT_ALIGNMENT, u64::from));
            for (name, dims, ty, data) in &w.tensors {
                let t = g.tensor(name).unwrap();
                assert_eq!((&t.dims, t.ty, g.data(t)), (dims, *ty, &data[..]), "{name}");
                assert_eq!(t.offset % g.alignment, 0);
            }
        }
    }

    #[test]
    fn bad_tensors_and_metadata_are_named_and_an_existing_file_is_kept() {
        let mut w = GgufWriter::new();
        let err = |r: Result<()>| r.unwrap_err().to_string();
        assert!(err(w.add_tensor("q", &[33, 2], GgmlType::Q4_0, vec![0; 36])).contains("rows of 33 are not whole 32-weight blocks of Q4_0"));
        assert!(err(w.add_tensor("q", &[32, 2], GgmlType::Q4_0, vec![0; 35])).contains("needs 36 bytes, got 35"));
        assert!(err(w.add_tensor("q", &[32, 0], GgmlType::F32, vec![])).contains("none of them 0"));
        w.add_tensor("q", &[32], GgmlType::F32, vec![0; 128]).unwrap();
        assert!(err(w.add_tensor("q", &[32], GgmlType::F32, vec![0; 128])).contains("`q` is added twice"));
        w.set("mixed", Value::Array(vec![Value::U8(1), Value::I8(1)]));
        assert!(w.to_bytes().unwrap_err().to_string().contains("`mixed` mixes element types 0 and 1"));
        w.set("mixed", Value::U8(1));
        w.set("general.alignment", Value::U32(48));
        assert!(w.to_bytes().unwrap_err().to_string().contains("a power of two is needed"));
        w.set("general.alignment", Value::U32(32));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kept.gguf");
        std::fs::write(&path, b"already here").unwrap();
        assert!(w.write(&path).unwrap_err().to_string().contains("exists"));
        assert_eq!(std::fs::read(&path).unwrap(), b"already here");
        let fresh = dir.path().join("new.gguf");
        w.write(&fresh).unwrap();
        assert_eq!(std::fs::read(&fresh).unwrap(), w.to_bytes().unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "no temporary file left behind");
        assert!(parse_format("q5_k").unwrap_err().to_string().contains("unknown format `q5_k`"));
    }
}
