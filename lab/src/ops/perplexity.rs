//! The `perplexity` experiment: a Llama GGUF (`LAB_SMOLLM2_GGUF`) and the lab's requantized
//! copies of it (`weights::gguf_writer::requantize`, as `lab quantize` writes them), each scored
//! on a held-out text by the lab's CPU reference (`model::eval`, llama-perplexity's protocol) and,
//! with `--peers llama-cpp`, by llama.cpp itself on the same files: perplexity, KL divergence
//! and top-1 agreement against the source file, and the logits after three prompts, lab against
//! llama.cpp. That llama.cpp loads every file the lab writes is part of the check.
//! `score_files` is the scoring alone, for any source file: `lab pipeline` calls it on the model
//! it trained.
//!
//! A case: `text` (a file; default the GPL-3 licence text Debian ships), `ctx` and `chunks` (the
//! scored window), `formats` (`source` is the file as it is), and optionally `model` (a Llama
//! GGUF in place of `LAB_SMOLLM2_GGUF`; its records then name it).

use crate::experiment::llama_cpp::{self, Kl};
use crate::experiment::{param_str, param_usize, Backend, Experiment, Measurement, Peer, Session};
use crate::model::eval::{chunks, cosine, divergence, perplexity, score_chunk};
use crate::model::llama::generate::argmax;
use crate::model::llama::CpuModel;
use crate::model::tokenizer::Tokenizer;
use crate::ops::llama::experiment::{finite, model_path, PROMPTS};
use crate::profile::Work;
use crate::record::{ErrorStats, Record, Tolerance};
use crate::weights::gguf::{Gguf, GgufFile};
use crate::weights::gguf_writer::{parse_format, requantize};
use crate::{LabError, Result};
use serde_json::{json, Value};
use sha2::Digest;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub struct PerplexityExp;

const TEXT: &str = "/usr/share/common-licenses/GPL-3";

/// The lab's perplexity and llama.cpp's on the same file and tokens: both sum f32 logits' log
/// probabilities over the same positions, so they differ only by the two forwards' rounding.
const PPL_RTOL: f64 = 0.01;

/// Logits after a prompt, lab's CPU reference (f64 sums) against llama.cpp (f32 on the CPU,
/// f16/f32 on a GPU): the agreement bar of the pipeline.
const MIN_COSINE: f64 = 0.999;

impl Experiment for PerplexityExp {
    fn name(&self) -> &'static str {
        "perplexity"
    }
    fn description(&self) -> &'static str {
        "a Llama GGUF and the lab's requantized copies scored on held-out text (llama-perplexity's protocol): perplexity, KL and top-1 against the source, lab beside llama.cpp"
    }
    fn sweep_axis(&self) -> &'static str {
        "format"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        match (backend, quick) {
            (Backend::Cpu, true) => vec![json!({"text": TEXT, "ctx": 16, "chunks": 2, "formats": ["source", "q4_0"], "timed": false})],
            _ => vec![json!({"text": TEXT, "ctx": 512, "chunks": 2, "formats": ["source", "f16", "q8_0", "q6_k", "q4_1", "q4_0"], "timed": false})],
        }
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        run(s, case)
    }
}

/// One file scored: the figures its records share.
struct Scored {
    path: PathBuf,
    bytes: u64,
    weights: Weights,
    ppl: (f64, f64),
    scored: usize,
    seconds: f64,
}

/// How a file's weights are stored: bits per weight over every tensor, and weights per type.
#[derive(Clone, Debug, PartialEq)]
pub struct Weights {
    pub bits_per_weight: f64,
    pub by_type: BTreeMap<String, u64>,
}

pub fn weights(g: &Gguf) -> Weights {
    let (mut bytes, mut n, mut by_type) = (0u64, 0u64, BTreeMap::new());
    for t in &g.tensors {
        bytes += t.size;
        n += t.elements();
        *by_type.entry(t.ty.name().to_lowercase()).or_insert(0) += t.elements();
    }
    Weights { bits_per_weight: bytes as f64 * 8.0 / n as f64, by_type }
}

/// The model, its figures, and the log-probabilities at every scored position (for KL).
fn score(path: &Path, windows: &[Vec<u32>]) -> Result<(CpuModel, Scored, Vec<Vec<f64>>)> {
    let file = GgufFile::open(path)?;
    let start = std::time::Instant::now();
    let g = file.parse()?;
    let model = CpuModel::load(&g)?;
    let (mut nll, mut logprobs) = (Vec::new(), Vec::new());
    for w in windows {
        let c = score_chunk(&model, w, true)?;
        nll.extend(c.nll);
        logprobs.extend(c.logprobs);
    }
    let bytes = std::fs::metadata(path).map_err(|e| LabError::io(path, e))?.len();
    Ok((model, Scored { path: path.to_path_buf(), bytes, weights: weights(&g), ppl: perplexity(&nll)?, scored: nll.len(), seconds: start.elapsed().as_secs_f64() }, logprobs))
}

fn run(s: &mut Session, case: &Value) -> Result<()> {
    let text = PathBuf::from(param_str(case, "text")?);
    let (ctx, chunks) = (param_usize(case, "ctx")?, param_usize(case, "chunks")?);
    let formats: Vec<String> = case["formats"]
        .as_array()
        .filter(|f| !f.is_empty())
        .ok_or_else(|| LabError::Invalid("a perplexity case names its `formats` (source, f32, f16, bf16, q8_0, q6_k, q4_0, q4_1)".into()))?
        .iter()
        .map(|f| f.as_str().map(String::from).ok_or_else(|| LabError::Invalid(format!("format {f} is not a name"))))
        .collect::<Result<_>>()?;
    if formats[0] != "source" {
        return Err(LabError::Invalid("the first format is `source`: KL is taken against it".into()));
    }
    let dir = tempfile::tempdir().map_err(|e| LabError::Invalid(format!("no temp dir for the requantized files: {e}")))?;
    let copy_path = |format: &str| dir.path().join(format!("{format}.gguf"));
    let (source, params) = match case.get("model").and_then(Value::as_str) {
        Some(m) => (PathBuf::from(m), json!({"model": m})),
        None => (model_path()?, json!({})),
    };
    score_files(s, &Scoring { source: &source, formats: &formats, copy_path: &copy_path, text: &text, ctx, chunks, params })?;
    Ok(())
}

/// A GGUF and the lab's requantized copies of it, to be scored on one text.
pub struct Scoring<'a> {
    /// The file the copies are made from; KL and top-1 agreement are taken against it.
    pub source: &'a Path,
    /// `formats[0]` is the name the source's records carry; the others (f32, f16, bf16, q8_0,
    /// q6_k, q4_0, q4_1) are written from it by `requantize`.
    pub formats: &'a [String],
    /// Where the copy in a format goes (a new file).
    pub copy_path: &'a dyn Fn(&str) -> PathBuf,
    pub text: &'a Path,
    /// Tokens per chunk and the most chunks scored (llama-perplexity's `-c` and `--chunks`).
    pub ctx: usize,
    pub chunks: usize,
    /// Params every record carries besides the text, window and format (an object).
    pub params: Value,
}

/// Scores every file by the lab's CPU reference (a `cpu_reference` record each: perplexity, KL
/// and top-1 against the source, bytes, bits per weight) and, when the session runs llama.cpp,
/// by llama.cpp beside it (a `llama-perplexity` record each; the lab's record then carries
/// llama.cpp's perplexity and the logits after `PROMPTS`, and fails short of the agreement bar).
/// Returns the lab's records.
pub fn score_files(s: &mut Session, sc: &Scoring) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(sc.text).map_err(|e| LabError::io(sc.text, e))?;
    let file = GgufFile::open(sc.source)?;
    let g = file.parse()?;
    let tok = Tokenizer::from_gguf(&g)?;
    let tokens = tok.encode(&text, true)?;
    let windows = chunks(&tokens, sc.ctx, Some(sc.chunks), tok.adds_bos().then(|| tok.bos()))?;
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, true)).collect::<Result<_>>()?;
    let llama_cpp = s.wants_peer(Peer::LlamaCpp, "llama-perplexity", "llama.cpp");
    let gpu_layers = if matches!(s.backend, Backend::Cuda(_)) { 99 } else { 0 };
    let dir = tempfile::tempdir().map_err(|e| LabError::Invalid(format!("no temp dir for llama.cpp's base logits: {e}")))?;
    let base_logits = dir.path().join("base.kld");
    let about = json!({
        "text_sha256": format!("{:x}", sha2::Sha256::digest(text.as_bytes())),
        "text_tokens": tokens.len(),
        "source": sc.source.file_name().map(|n| n.to_string_lossy().into_owned()),
    });
    let mut base: Option<Vec<Vec<f64>>> = None;
    let mut records = Vec::new();
    for (i, format) in sc.formats.iter().enumerate() {
        let path = if i == 0 {
            sc.source.to_path_buf()
        } else {
            let out = (sc.copy_path)(format);
            requantize(&g, parse_format(format)?)?.write(&out)?;
            out
        };
        let mut params = sc.params.clone();
        let fields = json!({"text": sc.text, "ctx": sc.ctx, "chunks": windows.len(), "format": format, "timed": false});
        params.as_object_mut().ok_or_else(|| LabError::Invalid("the scoring's params are not an object".into()))?.extend(fields.as_object().cloned().unwrap_or_default());
        let (model, scored, logprobs) = score(&path, &windows)?;
        let div = base.as_deref().map(|b| divergence(b, &logprobs)).transpose()?;
        let mut rec = Measurement::new("cpu_reference", "lab", &params, Work { bytes: 0, flops: 0 });
        insert_figures(&mut rec, &scored, div.as_ref().map(|d| (d.mean_kl, d.top1_same)));
        rec.extra.insert("max_kl".into(), json!(div.as_ref().map(|d| d.max_kl)));
        rec.extra.insert("about".into(), about.clone());
        rec.error = Some(finite(&[scored.ppl.0 as f32], "a finite perplexity; llama.cpp not run"));
        if llama_cpp {
            let kl = if i == 0 { Kl::SaveBase(&base_logits) } else { Kl::Against(&base_logits) };
            let theirs = llama_cpp::perplexity(&path, sc.text, sc.ctx, windows.len(), gpu_layers, kl)?;
            let (mut cosines, mut same) = (Vec::new(), 0);
            for p in &prompts {
                let ours = model.forward(&mut model.cache(), p)?;
                let them = llama_cpp::logits(&path, p, gpu_layers)?;
                cosines.push(cosine(&ours, &them));
                same += usize::from(argmax(&ours)? == argmax(&them)?);
            }
            rec.error = Some(agreement(scored.ppl.0, theirs.ppl, &cosines, same, prompts.len()));
            rec.tolerance = Some(Tolerance { atol: 0.0, rtol: PPL_RTOL });
            rec.extra.insert("llama_cpp_ppl".into(), json!(theirs.ppl));
            rec.extra.insert("logits_cosines".into(), json!(cosines));
            rec.extra.insert("logits_top1_same".into(), json!(format!("{same}/{}", prompts.len())));
            // Teacher-forced: llama.cpp runs the same chunks against the lab's log-probabilities.
            let lab_base = dir.path().join("lab.kld");
            llama_cpp::write_kl_base(&lab_base, &windows, &logprobs)?;
            let from_lab = llama_cpp::perplexity(&path, sc.text, sc.ctx, windows.len(), gpu_layers, Kl::Against(&lab_base))?;
            rec.extra.insert("llama_cpp_top1_same_as_lab".into(), json!(from_lab.top1_same));
            rec.extra.insert("llama_cpp_kl_from_lab".into(), json!(from_lab.mean_kl));
            let mut peer = Measurement::new("llama-perplexity", "llama.cpp", &params, Work { bytes: 0, flops: 0 });
            let peer_scored = Scored { ppl: (theirs.ppl, theirs.ppl_err), seconds: f64::NAN, ..scored };
            insert_figures(&mut peer, &peer_scored, if i == 0 { Some((0.0, 1.0)) } else { theirs.mean_kl.zip(theirs.top1_same) });
            peer.error = Some(finite(&[theirs.ppl as f32], "a finite perplexity"));
            records.push(s.emit(rec)?);
            s.emit(peer)?;
        } else {
            records.push(s.emit(rec)?);
        }
        base.get_or_insert(logprobs);
    }
    Ok(records)
}

fn insert_figures(m: &mut Measurement, s: &Scored, kl: Option<(f64, f64)>) {
    let (kl, same) = kl.unwrap_or((0.0, 1.0));
    for (k, v) in [
        ("ppl", json!(s.ppl.0)),
        ("ppl_err", json!(s.ppl.1)),
        ("scored_tokens", json!(s.scored)),
        ("mean_kl", json!(kl)),
        ("top1_same", json!(same)),
        ("file_bytes", json!(s.bytes)),
        ("bits_per_weight", json!(s.weights.bits_per_weight)),
        ("weights_by_type", json!(s.weights.by_type)),
        ("file", json!(s.path.file_name().map(|n| n.to_string_lossy().into_owned()))),
        ("seconds", json!(s.seconds)),
    ] {
        m.extra.insert(k.into(), v);
    }
}

/// The lab's figures against llama.cpp's on the same file: perplexity within `PPL_RTOL`, and
/// after every prompt cosine >= `MIN_COSINE` and the same most likely token.
fn agreement(ours: f64, theirs: f64, cosines: &[f64], same: usize, prompts: usize) -> ErrorStats {
    let rel = (ours - theirs).abs() / theirs;
    let mut e = ErrorStats::empty("llama.cpp on the same file and tokens");
    e.max_abs = (ours - theirs).abs();
    e.max_rel = rel;
    e.worst_fraction_of_tolerance = rel / PPL_RTOL;
    e.worst_got = Some(ours);
    e.worst_expected = Some(theirs);
    e.mismatches = u64::from(rel.is_nan() || rel > PPL_RTOL) + cosines.iter().filter(|&&c| c.is_nan() || c < MIN_COSINE).count() as u64 + (prompts - same) as u64;
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::gguf::GgmlType;

    #[test]
    fn bits_per_weight_count_every_tensor_by_its_blocks() {
        let mut w = crate::weights::gguf_writer::GgufWriter::new();
        w.add_tensor("norm", &[64], GgmlType::F32, vec![0; 64 * 4]).unwrap();
        w.add_tensor("m", &[64, 2], GgmlType::Q8_0, vec![0; 4 * 34]).unwrap();
        let bytes = w.to_bytes().unwrap();
        let got = weights(&Gguf::parse(&bytes).unwrap());
        // (256 + 136) bytes over 192 weights.
        assert!((got.bits_per_weight - 392.0 * 8.0 / 192.0).abs() < 1e-12, "{got:?}");
        assert_eq!(got.by_type, BTreeMap::from([("f32".to_string(), 64), ("q8_0".to_string(), 128)]));
    }

    #[test]
    fn agreement_fails_on_each_kind_of_disagreement() {
        assert_eq!(agreement(10.0, 10.05, &[0.9999, 0.99995], 2, 2).mismatches, 0);
        assert_eq!(agreement(10.0, 10.2, &[0.9999, 0.99995], 2, 2).mismatches, 1, "perplexity 2% off");
        assert_eq!(agreement(10.0, 10.0, &[0.998, 0.9999], 2, 2).mismatches, 1, "a cosine under 0.999");
        assert_eq!(agreement(10.0, 10.0, &[0.9999, 0.9999], 1, 2).mismatches, 1, "another top-1");
        assert_eq!(agreement(f64::NAN, 10.0, &[f64::NAN], 2, 2).mismatches, 2, "NaN is no agreement");
    }
}
