//! `lab pipeline`: tokenize a text with SmolLM2's tokenizer, train a small model of SmolLM2's
//! design on it (on the GPU or the CPU), evaluate it on a held-out text, write the checkpoint and the GGUF file, read the
//! GGUF back with the engine's CPU reference, write requantized copies of it, score every file on
//! the held-out text (`ops::perplexity::score_files`, with llama.cpp beside the lab when asked),
//! and record it all (experiment `pipeline`).

use super::data::{eval_batches, next_window_batch, tokenize_file, window_loader, Stream};
use super::export::to_gguf;
use super::model::{Layout, Model};
use super::optim::{AdamW, State};
use super::torch_ref::TorchPeer;
use super::parallel::Parallel;
use super::trainer::Trainer;
use crate::collective::group::Group;
use crate::experiment::{Backend, Measurement, Peer, RunOptions, Session};
use crate::model::llama::{Config, CpuModel};
use crate::model::tokenizer::Tokenizer;
use crate::ops::compare::compare;
use crate::ops::perplexity::{score_files, Scoring};
use crate::profile::{TimeSummary, TimingMode, Work};
use crate::quant::ggml;
use crate::record::{Record, Tolerance};
use crate::weights::gguf::{GgmlType, GgufFile};
use crate::{LabError, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub struct Options {
    /// Folder for the token files, the checkpoint and the GGUF file.
    pub out: PathBuf,
    /// Folder for the run's records.
    pub records: PathBuf,
    /// A name from `PLANS`.
    pub plan: String,
    /// Steps instead of the plan's.
    pub steps: Option<usize>,
    pub text: PathBuf,
    pub held_out: PathBuf,
    /// The GGUF whose tokenizer (and RoPE base, norm epsilon) the model takes: SmolLM2's.
    pub tokenizer: PathBuf,
    /// The matrices' format in the GGUF file.
    pub format: GgmlType,
    pub seed: u64,
    /// Where training and the held-out evaluation run (the files are scored on the CPU).
    pub backend: Backend,
    /// Data-parallel ranks (GPUs from the backend's, or threads on the CPU backend).
    pub ranks: usize,
    pub progress: bool,
    /// Peers beside the lab: llama.cpp scores the same files, torch trains the same model from the
    /// same weights on the same batches.
    pub peers: Vec<Peer>,
}

/// Sizes and settings of a run, by name (`lab pipeline --plan`).
pub struct Plan {
    pub name: &'static str,
    /// layers, width, query heads, KV heads, FFN width, context.
    shape: [usize; 6],
    rows: usize,
    seq: usize,
    steps: usize,
    lr: f32,
    eval_windows: usize,
    /// Chunks of `seq` held-out tokens each GGUF file is scored on.
    ppl_chunks: usize,
}

/// SmolLM2-135M's design (tied head, 2 query heads per KV head, SwiGLU 3x wide) scaled down:
/// `quick` for tests, `cpu` for a run of about ten minutes on two cores, `full` for a GPU host.
/// `full` takes 200 steps: Python's topics text is 181k tokens, 44 of its steps an epoch, and its
/// held-out loss is lowest by step 100-200 (8.61 at 100, 13.97 after 2000 steps: memorised; run
/// 2026-11-28T01-52-56Z).
pub const PLANS: &[Plan] = &[
    Plan { name: "quick", shape: [2, 64, 4, 2, 192, 256], rows: 4, seq: 64, steps: 40, lr: 3e-3, eval_windows: 8, ppl_chunks: 2 },
    Plan { name: "cpu", shape: [2, 128, 4, 2, 384, 256], rows: 4, seq: 128, steps: 100, lr: 3e-3, eval_windows: 8, ppl_chunks: 4 },
    Plan { name: "full", shape: [6, 256, 4, 2, 768, 512], rows: 16, seq: 256, steps: 200, lr: 1e-3, eval_windows: 64, ppl_chunks: 4 },
];

fn plan(name: &str, steps: Option<usize>) -> Result<(&'static Plan, AdamW)> {
    let p = PLANS.iter().find(|p| p.name == name).ok_or_else(|| LabError::Invalid(format!("no plan `{name}` (plans: {})", PLANS.iter().map(|p| p.name).collect::<Vec<_>>().join(", "))))?;
    let steps = steps.unwrap_or(p.steps);
    let opt = AdamW { lr: p.lr, min_lr: p.lr / 10.0, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip: 1.0, warmup: (steps / 10).max(1), steps };
    Ok((p, opt))
}

/// The formats the trained model is copied into and scored in, beside the one it is written in.
const COPIES: [GgmlType; 5] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_0];

/// What a run produced.
#[derive(Debug)]
pub struct Summary {
    pub run_file: PathBuf,
    pub losses: Vec<f64>,
    pub held_out_loss: f64,
    pub tokens_per_s: f64,
    pub gguf: PathBuf,
    pub gguf_bytes: u64,
    pub checkpoint: PathBuf,
    /// The lab's record of each file scored (`ops::perplexity::score_files`), the written one first.
    pub scores: Vec<Record>,
    /// The lab's losses against torch's, with `--peers torch`.
    pub torch: Option<super::torch_ref::Outcome>,
}

/// Mean loss over the evaluation windows, weighted by their tokens.
fn evaluate(t: &Trainer, dev: &Backend, tokens: &[u32], rows: usize, seq: usize, windows: usize) -> Result<(f64, usize)> {
    let batches = eval_batches(tokens, rows, seq, windows)?;
    let (mut sum, mut n) = (0.0, 0);
    for b in &batches {
        sum += t.loss(dev, b)? * (b.rows * b.seq) as f64;
        n += b.rows * b.seq;
    }
    Ok((sum / n as f64, n))
}

/// Flops of one training step: 2 per weight per token for each matrix product forward, twice that
/// backward, and attention's 4 x head_dim per (query, key) pair, three times over.
pub(crate) fn step_flops(c: &Config, rows: usize, seq: usize) -> u64 {
    let matrices = c.layers * (2 * c.dim * c.dim + 2 * c.kv_dim() * c.dim + 3 * c.ffn * c.dim) + c.vocab * c.dim;
    let pairs = rows * seq * (seq + 1) / 2;
    (3 * (2 * matrices * rows * seq + 4 * c.head_dim * c.heads * pairs * c.layers)) as u64
}

pub(crate) fn host_timing(ms: Vec<f64>) -> (TimeSummary, TimingMode) {
    (TimeSummary::of(&ms), TimingMode { l2: "warm".into(), launch: "host".into(), warmup: 0, raw_ms: ms, warmup_ms: Vec::new(), clocks: None })
}

pub fn run(o: &Options) -> Result<Summary> {
    let dev = o.backend.clone();
    let (p, opt) = plan(&o.plan, o.steps)?;
    if o.peers.contains(&Peer::Transformers) {
        return Err(LabError::Invalid("the pipeline has no transformers peer".into()));
    }
    if o.peers.contains(&Peer::LlamaCpp) {
        crate::experiment::llama_cpp::tools()?;
    }
    let file = |name: &str| o.out.join(name);
    let (tokens_path, held_path, ckpt_path, gguf_path) = (file("tokens.safetensors"), file("held_out.safetensors"), file("checkpoint.safetensors"), file("model.gguf"));
    let formats: Vec<String> = std::iter::once(o.format).chain(COPIES.into_iter().filter(|&f| f != o.format)).map(|f| f.name().to_lowercase()).collect();
    let copy_path = |format: &str| file(&format!("model.{format}.gguf"));
    let copies: Vec<PathBuf> = formats[1..].iter().map(|f| copy_path(f)).collect();
    // Refuse before any work: every output is new.
    if let Some(f) = [&tokens_path, &held_path, &ckpt_path, &gguf_path].into_iter().chain(&copies).find(|f| f.exists()) {
        return Err(LabError::Invalid(format!("{} exists: the pipeline writes only new files (choose another --out or remove it)", f.display())));
    }
    let mut torch = o.peers.contains(&Peer::Torch).then(|| TorchPeer::check(&o.out)).transpose()?;
    std::fs::create_dir_all(&o.out).map_err(|e| LabError::io(&o.out, format!("cannot create the output folder: {e}")))?;
    let src_file = GgufFile::open(&o.tokenizer)?;
    let src = src_file.parse().map_err(|e| LabError::Invalid(format!("{}: {e}", o.tokenizer.display())))?;
    let tok = Tokenizer::from_gguf(&src)?;
    let tokens = tokenize_file(&tok, &o.text, &tokens_path)?;
    let held = tokenize_file(&tok, &o.held_out, &held_path)?;

    let [layers, dim, heads, kv_heads, ffn, context] = p.shape;
    let base = Config::from_gguf(&src)?;
    let config = Config { layers, dim, heads, kv_heads, head_dim: dim / heads, ffn, context, rope_dims: dim / heads, tied_embeddings: true, ..base };
    let model = Model::init(&config, 0.02, o.seed)?;
    let n_params = Layout::new(&config)?.len;
    let t = Trainer::new(model, opt.clone(), State::new(n_params), Stream::new(tokens.clone(), p.seq)?, (p.rows, p.seq), o.seed)?;
    if let Some(torch) = &mut torch {
        torch.attention_bf16 = matches!(dev, Backend::Cuda(_));
        torch.write_inputs(&t)?;
    }

    let mut par = Parallel::new(Group::on(&dev, o.ranks)?, t)?;
    let mut s = Session::new(dev.clone(), RunOptions { quick: p.name == "quick", peers: o.peers.clone(), ..RunOptions::new(&o.records, o.seed) })?;
    s.experiment = "pipeline";
    let params = |extra: Value| {
        let mut v = json!({"plan": p.name, "layers": layers, "dim": dim, "heads": heads, "kv_heads": kv_heads, "ffn": ffn, "vocab": config.vocab,
            "params": n_params, "batch": p.rows, "seq": p.seq, "ranks": o.ranks, "steps": opt.steps, "lr": opt.lr, "text_tokens": tokens.len()});
        v.as_object_mut().expect("an object").extend(extra.as_object().cloned().unwrap_or_default());
        v
    };
    let flops = step_flops(&config, p.rows, p.seq);

    let bar = if o.progress { indicatif::ProgressBar::new(opt.steps as u64) } else { indicatif::ProgressBar::hidden() };
    bar.set_style(indicatif::ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {elapsed} elapsed, ~{eta} left  {msg}").expect("valid template").progress_chars("=> "));
    bar.set_prefix("training");
    let (mut step_ms, mut stats) = (Vec::new(), Vec::new());
    // The steps' windows, in the stream's order, read from the token file by the data loader
    // ahead of the steps; the stream's position moves past them for the checkpoint.
    let mut windows = window_loader(&tokens_path, p.rows, p.seq)?;
    let order = par.ranks[0].stream.take_window_indices(opt.steps * p.rows, p.seq)?;
    let mut epoch = windows.epoch_in(order)?;
    for step in 0..opt.steps {
        let start = Instant::now();
        let st = par.step_on(&next_window_batch(&mut epoch, p.seq)?)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let tokens_per_s = st.tokens as f64 / (ms * 1e-3);
        let mut m = Measurement::new("train_step", "lab", &params(json!({"step": step})), Work { bytes: 0, flops });
        m.time = Some(host_timing(vec![ms]));
        m.extra = json!({"loss": st.loss, "lr": st.lr, "grad_norm": st.grad_norm, "tokens_per_s": tokens_per_s}).as_object().expect("an object").clone();
        s.emit(m)?;
        // The held-out loss twenty times a run: where the model stops generalising.
        if (step + 1) % (opt.steps / 20).max(1) == 0 {
            let (loss, tokens) = evaluate(&par.ranks[0], &par.group.devs[0], &held, p.rows, p.seq, p.eval_windows)?;
            let mut m = Measurement::new("held_out_step", "lab", &params(json!({"step": step})), Work::default());
            m.extra = json!({"loss": loss, "tokens": tokens}).as_object().expect("an object").clone();
            s.emit(m)?;
        }
        bar.set_message(format!("loss {:.3}, {tokens_per_s:.0} tokens/s", st.loss));
        bar.inc(1);
        stats.push(st);
        step_ms.push(ms);
    }
    bar.finish_and_clear();
    drop(epoch);
    let mut t = par.ranks.swap_remove(0);
    let dev = par.group.devs.swap_remove(0);
    t.to_host()?;
    let losses: Vec<f64> = stats.iter().map(|st| st.loss).collect();
    let total_s = step_ms.iter().sum::<f64>() * 1e-3;
    // From the median step: the first compiles the kernels it launches.
    let tokens_per_s = (p.rows * p.seq) as f64 / (TimeSummary::of(&step_ms).median * 1e-3).max(1e-12);
    // One step's work: the record's time is the median of the steps' times.
    let mut m = Measurement::new("train", "lab", &params(json!({})), Work { bytes: 0, flops });
    m.time = (!step_ms.is_empty()).then(|| host_timing(step_ms.clone()));
    m.extra = json!({"first_loss": losses.first(), "last_loss": losses.last(), "tokens_per_s": tokens_per_s, "seconds": total_s}).as_object().expect("an object").clone();
    s.emit(m)?;

    let (held_out_loss, held_tokens) = evaluate(&t, &dev, &held, p.rows, p.seq, p.eval_windows)?;
    let mut m = Measurement::new("held_out", "lab", &params(json!({"held_out": o.held_out.display().to_string()})), Work::default());
    m.extra = json!({"loss": held_out_loss, "tokens": held_tokens, "text_tokens": held.len()}).as_object().expect("an object").clone();
    s.emit(m)?;

    let ckpt_bytes = t.save(&ckpt_path)?;
    to_gguf(&t.model, o.format, Some(&src), "lab-pipeline")?.write(&gguf_path)?;
    let gguf_bytes = std::fs::metadata(&gguf_path).map_err(|e| LabError::io(&gguf_path, e))?.len();
    let error = readback(&t.model, &gguf_path, &held[..p.seq.min(held.len())])?;
    let mut m = Measurement::new("gguf", "lab", &params(json!({"format": o.format.name()})), Work { bytes: gguf_bytes, flops: 0 });
    m.tolerance = Some(READBACK);
    m.error = Some(error);
    m.extra = json!({"gguf_bytes": gguf_bytes, "checkpoint_bytes": ckpt_bytes}).as_object().expect("an object").clone();
    let rec = s.emit(m)?;
    if rec.verdict != crate::record::Verdict::Pass {
        return Err(LabError::Invalid(format!("{} does not read back to the trained model's logits: {:?}", gguf_path.display(), rec.error)));
    }
    let scores = score_files(&mut s, &Scoring { source: &gguf_path, formats: &formats, copy_path: &copy_path, text: &o.held_out, ctx: p.seq, chunks: p.ppl_chunks, params: params(json!({})) })?;
    let torch = torch.map(|torch| torch.compare(&mut s, &stats, &params, flops)).transpose()?;
    Ok(Summary { run_file: s.run_file().to_path_buf(), losses, held_out_loss, tokens_per_s, gguf: gguf_path, gguf_bytes, checkpoint: ckpt_path, scores, torch })
}

/// f32 sums in a different order over up to a few hundred terms.
const READBACK: Tolerance = Tolerance { atol: 1e-4, rtol: 1e-4 };

/// The engine's CPU reference on the written file against the trainer's forward on the file's
/// own weights (decoded, so a rounding format compares like with like): last-position logits.
fn readback(model: &Model, path: &Path, tokens: &[u32]) -> Result<crate::record::ErrorStats> {
    let file = GgufFile::open(path)?;
    let g = file.parse()?;
    let cpu = CpuModel::load(&g)?;
    let got = cpu.forward(&mut cpu.cache(), tokens)?;
    let mut decoded = model.clone();
    for s in model.layout.spans() {
        let info = g.tensor(&s.name).ok_or_else(|| LabError::Invalid(format!("{}: tensor `{}` is missing", path.display(), s.name)))?;
        decoded.params[s.at.clone()].copy_from_slice(&ggml::to_f32(info.ty, g.data(info))?);
    }
    let all = decoded.logits(&Backend::Cpu, tokens)?;
    let want: Vec<f64> = all[all.len() - model.layout.config.vocab..].iter().map(|&v| v as f64).collect();
    Ok(compare(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, READBACK, "trainer forward"))
}
