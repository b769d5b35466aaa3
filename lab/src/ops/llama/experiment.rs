//! The `llama` experiment: the engine of [`crate::model::llama`] on a real model, the GGUF named
//! by `LAB_SMOLLM2_GGUF` (SmolLM2-135M-Instruct in Q4_1; any Llama GGUF the engine takes).
//! Over 600 lines: its five ops share the model's loading, the variants' step modes, the prompts
//! and the tolerances; split by op, each file would import all of them.
//!
//! Cases, by `op`:
//! - `check` (untimed): after a prompt and at each of 8 greedy steps (`steps`), the engine's logits against
//!   the CPU reference's on the same tokens (the reference is fed the engine's choices, so the
//!   positions stay aligned); cosine and top-1 agreement in `extra`; `engine_pdl`'s logits also
//!   bit for bit against `engine`'s. On the CPU backend, the CPU engine's greedy tokens against
//!   the reference's own continuation (the plumbing).
//! - `decode`: `batch` copies of a `context`-token prompt, the cache filled to `context`, then
//!   one step per repetition (positions advance by one per repetition), for each engine
//!   variant ([`super::ENGINES`]). Bytes: every weight once and the K and V rows read, the
//!   bound a step cannot beat; `tokens_s` = batch / step time.
//!   The logits of the last step are checked against the CPU reference (contexts up to 128) or
//!   against the batch's first sequence (every row holds the same prompt). At batch 1 on sm_90
//!   the record also keeps the step's timeline over 64 more steps (`timeline`, [`crate::gpu::trace`];
//!   `"timeline": false` leaves it out).
//! - `sample` (GPU): the `sample` kernel's draws on `rows` rows of random logits (SmolLM2's
//!   vocabulary, ties and a row of scores near 1e4 among them) under five settings of
//!   temperature, top-k and top-p, each against the CPU mirror's draw at the same seed, sequence
//!   and position (`model::llama::sample`), and timed beside `argmax` on the same rows (its
//!   choices against the CPU's argmax: the rows hold tied maxima).
//! - `peers` (with `--peers transformers` / `llama-cpp`): transformers on the same GGUF (logits
//!   after each of three prompts against the engine's, greedy continuations of 64 tokens, eager
//!   decode rate) and llama.cpp's `llama-bench` (pp512 and tg128, flash attention off and on).

use crate::experiment::{param_str, param_usize, Backend, Experiment, Measurement, Peer, Session};
use crate::gpu::timing::time_gpu;
use crate::model::llama::generate::argmax;
use crate::model::llama::gpu::{ATTENTION, ATTENTION_O, LAYER};
use crate::model::llama::{CpuModel, GpuModel};
use crate::model::tokenizer::Tokenizer;
use crate::ops::compare::compare_elems;
use crate::ops::quant::experiment::SMOLLM2_ENV;
use crate::profile::{cpu_time, Work};
use crate::record::{ErrorStats, Tolerance};
use crate::weights::gguf::GgufFile;
use crate::{LabError, Result};
use serde_json::{json, Value};

pub struct Llama;

/// Prompts of the checks and peers: prose, code, digits.
pub const PROMPTS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "In 1969, Apollo 11 landed on the Moon. The crew of three astronauts",
];

/// transformers on the same file, run on a GPU host (peers case): per prompt its greedy tokens
/// and its 16 best logits after the prompt.
const TRANSFORMERS: &str = include_str!("smollm2_transformers.json");

/// The CPU reference (f32 weights, f64 sums) against transformers in f32: both keep f32
/// activations, so they agree to rounding.
const REFERENCE_TOL: Tolerance = Tolerance { atol: 2e-3, rtol: 1e-4 };

/// Logits are judged against a reference accumulating in f64 while the engine rounds every
/// activation to f16: a few hundredths on logits of magnitude ~20 (measured, see the note).
const LOGIT_TOL: Tolerance = Tolerance { atol: 0.25, rtol: 0.02 };

pub(crate) fn model_path() -> Result<std::path::PathBuf> {
    std::env::var(SMOLLM2_ENV)
        .map(Into::into)
        .map_err(|_| LabError::Invalid(format!("{SMOLLM2_ENV} must name a Llama GGUF (SmolLM2-135M-Instruct.Q4_1.gguf; scripts/test.sh fetches it)")))
}

fn open() -> Result<GgufFile> {
    let path = model_path()?;
    GgufFile::open(&path).map_err(|e| LabError::Invalid(e.to_string()))
}

/// A figure whose only check is that its values are numbers.
pub(crate) fn finite(v: &[f32], reference: &str) -> ErrorStats {
    let bad = v.iter().position(|x| !x.is_finite());
    ErrorStats {
        worst_index: bad.map(|i| i as u64),
        worst_got: bad.map(|i| v[i] as f64),
        mismatches: v.iter().filter(|x| !x.is_finite()).count() as u64,
        ..ErrorStats::empty(reference)
    }
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

impl Experiment for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }
    fn description(&self) -> &'static str {
        "a Llama GGUF end to end (SmolLM2-135M): GPU engine against the CPU reference, decode tokens/s against batch and context, beside llama.cpp and transformers"
    }
    fn sweep_axis(&self) -> &'static str {
        "batch"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["op=decode batch=1 context=128"]
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let mut out = vec![json!({"op": "check", "timed": false})];
        if matches!(backend, Backend::Cuda(_)) {
            out.extend([1, 64].map(|rows| json!({"op": "sample", "rows": rows})));
        }
        match (backend, quick) {
            (Backend::Cpu, _) => out.push(json!({"op": "decode", "batch": 1, "context": 4})),
            (Backend::Cuda(_), true) => out.extend([json!({"op": "decode", "batch": 1, "context": 128}), json!({"op": "prefill", "tokens": 128})]),
            (Backend::Cuda(_), false) => {
                out.extend([128, 512, 2048].map(|tokens| json!({"op": "prefill", "tokens": tokens})));
                for context in [128, 2048] {
                    out.extend([1, 4, 16, 64].map(|batch| json!({"op": "decode", "batch": batch, "context": context})));
                }
                out.push(json!({"op": "peers", "timed": false}));
            }
        }
        out
    }
    /// The check cut to its prompt and one greedy step, a decode step at an odd batch (the dense
    /// GEMM path; the fused products at a batch they were not tuned for) and context, a prefill
    /// of an odd length (a partial tile of every kernel it runs), and three rows drawn by
    /// `sample`: every kernel of the engine, each launched as few times as that takes. Every
    /// engine step is some 240 launches, each slow under a tool: the 33-token prefill and the
    /// 8-step check took minutes, and synccheck of the three in one process did not finish in
    /// 280 s on an H100.
    fn sanitize_cases(&self, _: &Backend) -> Vec<Value> {
        vec![
            json!({"op": "check", "steps": 1}),
            json!({"op": "decode", "batch": 3, "context": 9}),
            json!({"op": "prefill", "tokens": 17}),
            json!({"op": "sample", "rows": 3}),
        ]
    }
    // attention_o_q4_1's second pass of keys was checked by `--case '{"op": "decode", "batch": 1,
    // "context": 515}'` under memcheck, initcheck and synccheck; racecheck ran out of the host's
    // 128 GB on that case (note h200-decode-attention-o), so it is not among the defaults.
    fn sanitize_case_per_process(&self) -> bool {
        true
    }
    /// Synccheck leaves cuBLAS's prefill GEMMs (`nvjet_*`) uninstrumented: with them, the 17-token
    /// prefill did not finish in 330 s on an H100; without them it took 3 s, every lab kernel of
    /// the prefill still checked. The other tools check cuBLAS too (racecheck's reports there are
    /// the library's, recorded as such).
    fn sanitize_uninstrumented(&self, tool: crate::profile::sanitize::Tool) -> Option<&'static str> {
        (tool == crate::profile::sanitize::Tool::Synccheck).then_some(crate::profile::sanitize::CUBLAS_KERNELS)
    }
    fn sanitize_covers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[
            ("engine", "llama", "embed_q8_0"),
            ("engine", "llama", "add_rmsnorm"),
            ("engine", "llama", "rope_cache"),
            ("engine", "llama", "swiglu"),
            ("engine", "llama", "argmax"),
            ("engine", "attention", "decode_mma"),
            ("engine_merged", "attention", "decode_merge"),
            ("engine_fused", "llama", "qkv_rope_q4_1"),
            ("engine_fused", "llama", "gate_up_swiglu_q4_1"),
            ("engine_fused", "llama", "residual_q4_1"),
            ("engine_attention_o", "llama", "attention_o_q4_1"),
            ("engine_ffn", "llama", "ffn_q4_1"),
            ("engine_layer", "llama", "layer_q4_1"),
            ("engine_head", "llama", "head_q8_0"),
            ("sample", "llama", "sample"),
        ]
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match param_str(case, "op")? {
            "check" => check(s, case),
            "decode" => decode(s, case),
            "prefill" => prefill(s, case),
            "peers" => peers(s),
            "sample" => sample(s, case),
            op => Err(LabError::Invalid(format!("llama has no op `{op}` (check, decode, prefill, peers, sample)"))),
        }
    }
}

/// The engine's variants a run asks for: on the CPU backend `engine` alone.
fn engines(s: &Session) -> Vec<&'static str> {
    let gpu = matches!(s.backend, Backend::Cuda(_));
    super::ENGINES.iter().map(|e| e.0).filter(|&v| (gpu || v == "engine") && s.wants(v, "lab")).collect()
}

/// How a variant's batch steps: (programmatic edges, fused products, decode attention variant).
/// All but engine_merged, engine_attention_o, engine_ffn, engine_head and engine_layer keep the engine's own attention ([`ATTENTION`]).
/// engine_merged fuses
/// where `fuses` says, as `lab generate` does: at batch 1 (the fused products are slower than the
/// unfused at 4 and 16 sequences, note h100-decode-fused).
fn step_mode(variant: &str, fuses: bool) -> (bool, bool, &'static str) {
    match variant {
        "engine" => (false, false, ATTENTION),
        "engine_pdl" => (true, false, ATTENTION),
        "engine_fused" => (true, true, ATTENTION),
        "engine_attention_o" | "engine_ffn" | "engine_head" => (true, true, ATTENTION_O),
        "engine_layer" => (true, true, LAYER),
        _ => (true, fuses, "decode_merge"),
    }
}

/// Whether `variant` runs a batch of `seqs` sequences of `capacity` positions on `m` (every
/// variant on the CPU, where only `engine` runs).
fn takes(m: Option<&GpuModel>, variant: &str, seqs: usize, capacity: usize) -> bool {
    m.is_none_or(|m| match variant {
        "engine_fused" => m.fuses(seqs),
        "engine_attention_o" => m.fuses_attention(seqs),
        "engine_ffn" => m.fuses_attention(seqs) && m.fuses_ffn(seqs),
        "engine_layer" => m.fuses_layer(seqs, capacity),
        "engine_head" => m.fuses_attention(seqs) && m.fuses_head(seqs),
        _ => true,
    })
}

/// Sets `batch` up to step as `variant` does.
fn set_mode(batch: &mut crate::model::llama::Batch, variant: &str, fuses: bool) -> Result<()> {
    let (programmatic, fused, attention) = step_mode(variant, fuses);
    batch.set_programmatic(programmatic);
    batch.set_fused(fused)?;
    batch.set_attention(attention)?;
    batch.set_ffn(variant == "engine_ffn")?;
    batch.set_head(variant == "engine_head")
}

/// What a check's steps gave: the engine's logits, the reference's at the same positions, the
/// cosine per step, the top-1 agreements, and the captured graph's (edges, programmatic edges).
type Checked = (Vec<f32>, Vec<f64>, Vec<f64>, usize, Option<(usize, usize)>);

/// The GPU engine's logits over `steps` greedy steps after `prompt`, and the reference's at the
/// same positions (fed the engine's choices).
fn gpu_steps(m: &GpuModel, cpu: &CpuModel, prompt: &[u32], steps: usize, variant: &str) -> Result<Checked> {
    let mut cache = cpu.cache();
    let mut expected = cpu.forward(&mut cache, prompt)?;
    let (mut got_all, mut want_all, mut cosines, mut agree) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let mut batch = m.batch(1, prompt.len() + steps + 1)?;
    set_mode(&mut batch, variant, m.fuses(1))?;
    batch.start(&[prompt.to_vec()])?;
    for _ in 1..prompt.len() {
        batch.step()?;
    }
    for _ in 0..steps {
        batch.step()?;
        let got = batch.logits()?;
        let want: Vec<f64> = expected.iter().map(|&v| v as f64).collect();
        let chosen = *batch.tokens()?[0].last().expect("a step writes a token");
        cosines.push(cosine(&got, &want));
        agree += usize::from(chosen == argmax(&expected)?);
        got_all.extend(&got);
        want_all.extend(want);
        expected = cpu.step(&mut cache, chosen, true)?.expect("logits were asked for");
    }
    Ok((got_all, want_all, cosines, agree, batch.graph_edges()))
}

/// The engine's logits against the reference's at the same positions; `engine_pdl`'s also
/// against `engine`'s, bit for bit (the same kernels in the same order: any difference is a
/// kernel reading before its input was written).
fn check(s: &mut Session, case: &Value) -> Result<()> {
    let variants = engines(s);
    if variants.is_empty() {
        return Ok(());
    }
    let file = open()?;
    let g = file.parse().map_err(|e| LabError::Invalid(e.to_string()))?;
    let tok = Tokenizer::from_gguf(&g)?;
    let prompt = tok.encode(PROMPTS[0], true)?;
    let cpu = CpuModel::load(&g)?;
    let (steps, reference, tol) = match s.backend {
        Backend::Cuda(_) => (8, "cpu-f64 reference forward", LOGIT_TOL),
        Backend::Cpu => (4, "transformers f32 (a GPU run's fixture)", REFERENCE_TOL),
    };
    let steps = match case.get("steps") {
        None => steps,
        Some(v) => v.as_u64().filter(|&n| n >= 1).ok_or_else(|| LabError::Invalid(format!("case {case}: `steps` is the number of greedy steps checked, at least 1")))? as usize,
    };
    let gpu_model = match &s.backend {
        Backend::Cuda(gpu) => Some(GpuModel::load(gpu, &g)?),
        Backend::Cpu => None,
    };
    let mut plain: Option<Vec<f32>> = None;
    for variant in variants {
        if !takes(gpu_model.as_ref(), variant, 1, prompt.len() + steps + 1) {
            continue;
        }
        let (got_all, want_all, cosines, agree, edges) = match &gpu_model {
            // The plain engine's logits are what engine_pdl must reproduce.
            Some(m) => gpu_steps(m, &cpu, &prompt, steps, variant)?,
            None => {
                // The reference against transformers' own run of the same file (a fixture from a
                // GPU run): its 16 best logits after the prompt, then its greedy tokens.
                let mut cache = cpu.cache();
                let mut expected = cpu.forward(&mut cache, &prompt)?;
                let fixture: Value = serde_json::from_str(TRANSFORMERS).map_err(|e| LabError::Invalid(format!("the transformers fixture: {e}")))?;
                let theirs = &fixture["prompts"][0];
                let (mut got_all, mut want_all, mut agree) = (Vec::new(), Vec::new(), 0);
                for pair in theirs["top"].as_array().into_iter().flatten() {
                    let id = pair[0].as_u64().unwrap_or(u64::MAX) as usize;
                    got_all.push(*expected.get(id).ok_or_else(|| LabError::Invalid(format!("the fixture's token {id} is outside the vocabulary")))?);
                    want_all.push(pair[1].as_f64().unwrap_or(f64::NAN));
                }
                let greedy: Vec<u32> = theirs["greedy"].as_array().into_iter().flatten().filter_map(|v| v.as_u64().map(|t| t as u32)).collect();
                for &want in greedy.iter().take(steps) {
                    let t = argmax(&expected)?;
                    agree += usize::from(t == want);
                    expected = cpu.step(&mut cache, t, true)?.expect("logits were asked for");
                }
                (got_all, want_all, Vec::new(), agree, None)
            }
        };
        let mut m = Measurement::new(variant, "lab", case, Work { bytes: 0, flops: 0 });
        m.error = Some(compare_elems(&got_all, &want_all, tol, reference));
        m.tolerance = Some(tol);
        let min_cos = cosines.iter().copied().fold(1.0, f64::min);
        m.extra.insert("prompt_tokens".into(), json!(prompt.len()));
        m.extra.insert("steps".into(), json!(steps));
        m.extra.insert("min_cosine".into(), json!(min_cos));
        m.extra.insert("top1_agree".into(), json!(agree));
        let mut why = Vec::new();
        if min_cos < 0.999 || agree < steps {
            why.push(format!("cosine {min_cos:.5}, top-1 agreed at {agree} of {steps} steps"));
        }
        if let Some((all, programmatic)) = edges {
            m.extra.insert("graph_edges".into(), json!(all));
            m.extra.insert("programmatic_edges".into(), json!(programmatic));
        }
        match (variant, &plain) {
            ("engine_pdl", Some(p)) => {
                let differ = p.iter().zip(&got_all).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                m.extra.insert("logits_differing_from_engine".into(), json!(differ));
                if differ > 0 {
                    why.push(format!("{differ} logits differ from the plain engine's"));
                }
            }
            ("engine_pdl", None) => why.push("the plain engine did not run beside it (run both variants)".into()),
            ("engine", _) => plain = Some(got_all.clone()),
            // Other products, other sums: judged against the reference alone; how far from the
            // plain engine is recorded.
            (_, Some(p)) => {
                let diff = p.iter().zip(&got_all).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                m.extra.insert("max_diff_from_engine".into(), json!(diff));
            }
            _ => {}
        }
        if !why.is_empty() {
            m.extra.insert("why".into(), json!(why.join("; ")));
            if let Some(e) = m.error.as_mut() {
                e.mismatches = e.mismatches.max(1);
            }
        }
        s.emit(m)?;
    }
    Ok(())
}

/// Decode steps of `batch` sequences at `context`, for each engine variant asked for.
fn decode(s: &mut Session, case: &Value) -> Result<()> {
    let variants = engines(s);
    if variants.is_empty() {
        return Ok(());
    }
    let (b, ctx) = (param_usize(case, "batch")?, param_usize(case, "context")?);
    let file = open()?;
    let g = file.parse().map_err(|e| LabError::Invalid(e.to_string()))?;
    let prompt = prompt_of(&Tokenizer::from_gguf(&g)?, ctx)?;
    match s.backend.clone() {
        Backend::Cuda(gpu) => {
            let m = GpuModel::load(&gpu, &g)?;
            let c = &m.config;
            let (want, reference) = first_steps(&g, &m, &prompt, ctx)?;
            for variant in variants {
                // Room for the warm-up and the repetitions the budget may take.
                let cap = ctx + 2 * (s.budget.max + crate::profile::MAX_WARMUP_ROUNDS * s.budget.warmup) + 2 + TIMELINE_STEPS;
                if !takes(Some(&m), variant, b, cap) {
                    continue;
                }
                let mut batch = m.batch(b, cap)?;
                set_mode(&mut batch, variant, b == 1 && m.fuses(1))?;
                batch.start(&vec![prompt.clone(); b])?;
                batch.prefill()?;
                // Every sequence's logits after the prompt, after the first step (eager) and after
                // the second (the first replay of the captured graph).
                let mut got = batch.logits()?;
                for _ in 0..2 {
                    batch.step()?;
                    got.extend(batch.logits()?);
                }
                let all: Vec<f64> = want.chunks(c.vocab).flat_map(|w| w.iter().copied().cycle().take(b * c.vocab)).collect();
                let error = compare_elems(&got, &all, LOGIT_TOL, reference);
                let time = time_gpu(&gpu, &s.budget, || batch.step())?;
                let kv = (b * ctx * c.layers * 2 * c.kv_dim() * 2) as u64;
                let mut rec = Measurement::new(variant, "lab", case, Work { bytes: m.weight_bytes(b) + kv, flops: 2 * params(c) * b as u64 });
                // Batch 1 on sm_90 records its timeline unless the case says `"timeline": false`.
                if case.get("timeline").and_then(Value::as_bool).unwrap_or(b == 1) && gpu.arch >= 90 {
                    let first = cap - 1 - batch.room();
                    // A timeline that cannot be read is said in the record, beside the step's figure.
                    let kernels = batch.graph_kernels()?;
                    let stamped = |k: &str| k.starts_with(&format!("{}_", super::FAMILY));
                    match crate::gpu::trace::record(&gpu, TIMELINE_STEPS, || batch.step(), &kernels, stamped) {
                        Ok(t) => rec.extra.insert("timeline".into(), json!(t)),
                        Err(e) => rec.extra.insert("timeline_error".into(), json!(e.to_string())),
                    };
                    rec.extra.insert("timeline_positions".into(), json!([first, first + TIMELINE_STEPS - 1]));
                }
                // Batch 1 also as llama-bench's tg128 counts: TG_STEPS steps back to back from
                // position 0 (the prompt fed again a position a step), timed as one.
                if b == 1 && ctx >= TG_STEPS {
                    // Then as graphs of TG_CHUNK steps (Batch::steps): what an engine that looks at
                    // its tokens every TG_CHUNK steps pays.
                    for (chunk, key) in [(1, "tg"), (TG_CHUNK, "tg_chunk")] {
                        let tg = time_gpu(&gpu, &s.budget, || {
                            batch.rewind()?;
                            (0..TG_STEPS / chunk).try_for_each(|_| batch.steps(chunk))
                        });
                        match tg {
                            Ok(t) => rec.extra.insert(format!("{key}_tokens_s"), json!(TG_STEPS as f64 / (t.0.median / 1e3))),
                            Err(e) => rec.extra.insert(format!("{key}_error"), json!(e.to_string())),
                        };
                    }
                    rec.extra.insert("tg_chunk".into(), json!(TG_CHUNK));
                }
                rec.extra.insert("tokens_s".into(), json!(b as f64 / (time.0.median / 1e3)));
                rec.extra.insert("weight_bytes".into(), json!(m.weight_bytes(b)));
                if let Some((all, programmatic)) = batch.graph_edges() {
                    rec.extra.insert("graph_edges".into(), json!(all));
                    rec.extra.insert("programmatic_edges".into(), json!(programmatic));
                }
                (rec.time, rec.error, rec.tolerance, rec.ceiling) = (Some(time), Some(error), Some(LOGIT_TOL), Some("copy_gb_s"));
                s.emit(rec)?;
            }
            Ok(())
        }
        Backend::Cpu => {
            let cpu = CpuModel::load(&g)?;
            let mut cache = cpu.cache();
            let mut last = cpu.forward(&mut cache, &prompt)?;
            let t = argmax(&last)?;
            let time = cpu_time(&s.budget, || {
                if cache.len + 1 < cpu.config.context {
                    last = cpu.step(&mut cache, t, true).expect("a CPU step").expect("logits were asked for");
                }
            });
            let mut rec = Measurement::new("engine", "lab", case, Work { bytes: 0, flops: 0 });
            rec.extra.insert("tokens_s".into(), json!(b as f64 / (time.0.median / 1e3)));
            rec.error = Some(finite(&last, "finite logits"));
            rec.time = Some(time);
            s.emit(rec).map(|_| ())
        }
    }
}

/// Steps a decode case's timeline replays with the kernels stamping ([`crate::gpu::trace`]),
/// after its timed steps.
const TIMELINE_STEPS: usize = 64;

/// Steps of a batch-1 decode case timed back to back as one (`tg_tokens_s`): llama-bench's tg128
/// generates 128 tokens after an empty prompt, so its steps see contexts 1 to 128.
const TG_STEPS: usize = 128;

/// Steps a graph of the chunked tg128 holds (`tg_chunk_tokens_s`).
const TG_CHUNK: usize = 16;

/// What the decode case's sequences must give after `prompt`, after one greedy step and after a
/// second (each vocab logits): the f64 reference forward up to 128 tokens, else the plain engine
/// (unfused, decode_mma, no programmatic edges) on one sequence; and that reference's name.
fn first_steps(g: &crate::weights::gguf::Gguf, m: &GpuModel, prompt: &[u32], ctx: usize) -> Result<(Vec<f64>, &'static str)> {
    let mut out = Vec::new();
    if ctx <= 128 {
        let cpu = CpuModel::load(g)?;
        let mut cache = cpu.cache();
        let mut logits = cpu.forward(&mut cache, prompt)?;
        for _ in 0..2 {
            out.extend(logits.iter().map(|&v| v as f64));
            logits = cpu.step(&mut cache, argmax(&logits)?, true)?.expect("logits were asked for");
        }
        out.extend(logits.iter().map(|&v| v as f64));
        return Ok((out, "cpu-f64 reference forward"));
    }
    let mut plain = m.batch(1, prompt.len() + 3)?;
    plain.start(&[prompt.to_vec()])?;
    plain.prefill()?;
    out.extend(plain.logits()?.iter().map(|&v| v as f64));
    for _ in 0..2 {
        plain.step()?;
        out.extend(plain.logits()?.iter().map(|&v| v as f64));
    }
    Ok((out, "the plain engine on one sequence"))
}

/// The prompt tokens: the three prompts end to end, repeated to `n` tokens.
fn prompt_of(tok: &Tokenizer, n: usize) -> Result<Vec<u32>> {
    let text: Vec<u32> = PROMPTS.iter().map(|p| tok.encode(p, false)).collect::<Result<Vec<_>>>()?.concat();
    Ok(text.iter().copied().cycle().take(n).collect())
}

/// Parameters of the model, the multiply-adds of a token apart from attention.
fn params(c: &crate::model::llama::Config) -> u64 {
    (c.layers * (c.dim * (c.dim + 2 * c.kv_dim()) + c.dim * c.dim + 3 * c.dim * c.ffn) + c.vocab * c.dim) as u64
}

/// One sequence's prompt through [`crate::model::llama::Batch::prefill`], its last logits checked
/// against the step-by-step path (W4A16 products and decode attention: another road to them).
fn prefill(s: &mut Session, case: &Value) -> Result<()> {
    let Backend::Cuda(gpu) = s.backend.clone() else { return Ok(()) };
    if !s.wants("engine", "lab") {
        return Ok(());
    }
    let n = param_usize(case, "tokens")?;
    let file = open()?;
    let g = file.parse().map_err(|e| LabError::Invalid(e.to_string()))?;
    let prompt = prompt_of(&Tokenizer::from_gguf(&g)?, n)?;
    let m = GpuModel::load(&gpu, &g)?;
    let c = &m.config;
    let mut steps = m.batch(1, n + 2)?;
    steps.start(std::slice::from_ref(&prompt))?;
    for _ in 0..n {
        steps.step()?;
    }
    let want: Vec<f64> = steps.logits()?.iter().map(|&v| v as f64).collect();
    let mut batch = m.batch(1, n + 2)?;
    batch.start(&[prompt])?;
    batch.prefill()?;
    let error = compare_elems(&batch.logits()?, &want, LOGIT_TOL, "the step-by-step engine");
    let time = time_gpu(&gpu, &s.budget, || {
        batch.rewind()?;
        batch.prefill()
    })?;
    let attn = 2 * (c.layers * c.heads * c.head_dim * n * (n + 1)) as u64;
    let mut rec = Measurement::new("engine", "lab", case, Work { bytes: 2 * params(c), flops: 2 * params(c) * n as u64 + attn });
    rec.extra.insert("tokens_s".into(), json!(n as f64 / (time.0.median / 1e3)));
    (rec.time, rec.error, rec.tolerance, rec.ceiling) = (Some(time), Some(error), Some(LOGIT_TOL), Some("tensor_f16_tflop_s"));
    s.emit(rec).map(|_| ())
}

/// transformers and llama.cpp on the same file, and the engine's logits beside transformers'.
fn peers(s: &mut Session) -> Result<()> {
    let Backend::Cuda(gpu) = s.backend.clone() else { return Ok(()) };
    let path = model_path()?;
    let file = open()?;
    let g = file.parse().map_err(|e| LabError::Invalid(e.to_string()))?;
    let tok = Tokenizer::from_gguf(&g)?;
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tok.encode(p, true)).collect::<Result<_>>()?;
    if s.wants_peer(Peer::Transformers, "transformers", "transformers") {
        let new = 64;
        let run = crate::experiment::peers::transformers_llama(&path, PROMPTS, &prompts, new)?;
        let m = GpuModel::load(&gpu, &g)?;
        for (i, (prompt, want)) in prompts.iter().zip(&run.logits).enumerate() {
            let mut batch = m.batch(1, prompt.len() + new + 1)?;
            batch.start(std::slice::from_ref(prompt))?;
            for _ in 0..prompt.len() {
                batch.step()?;
            }
            let got = batch.logits()?;
            let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            for _ in 1..new {
                batch.step()?;
            }
            let ours = batch.tokens()?[0][prompt.len()..].to_vec();
            let p = &run.reply["prompts"][i];
            let theirs: Vec<u32> = p["greedy"].as_array().map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as u32)).collect()).unwrap_or_default();
            let diverge = ours.iter().zip(&theirs).position(|(a, b)| a != b);
            let gap_at = diverge.and_then(|d| p["gaps"][d].as_f64());
            let mut rec = Measurement::new("engine vs transformers", "lab", &json!({"op": "peers", "prompt": i, "timed": false}), Work { bytes: 0, flops: 0 });
            let mut error = compare_elems(&got, &want64, LOGIT_TOL, "transformers f32 (GGUF dequantized)");
            let cos = cosine(&got, &want64);
            // A divergence counts only after a near tie (top-2 gap under 1e-3 in transformers).
            if cos < 0.999 || argmax(&got)? != argmax(want)? || gap_at.is_some_and(|g| g >= 1e-3) || (diverge.is_some() && gap_at.is_none()) {
                error.mismatches = error.mismatches.max(1);
            }
            rec.error = Some(error);
            rec.tolerance = Some(LOGIT_TOL);
            rec.extra.insert("cosine".into(), json!(cos));
            rec.extra.insert("greedy_lab".into(), json!(ours));
            rec.extra.insert("greedy_transformers".into(), json!(theirs));
            rec.extra.insert("first_divergence".into(), json!(diverge));
            rec.extra.insert("gap_at_divergence".into(), json!(gap_at));
            rec.extra.insert("transformers_top".into(), p["top"].clone());
            s.emit(rec)?;
            let mut rate = Measurement::new("transformers eager", "transformers", &json!({"op": "peers", "prompt": i, "timed": false}), Work { bytes: 0, flops: 0 });
            rate.extra.insert("tokens_s".into(), p["decode_tokens_s"].clone());
            rate.extra.insert("versions".into(), run.reply["versions"].clone());
            rate.error = Some(finite(&run.logits[i], "finite logits"));
            s.emit(rate)?;
        }
    }
    if s.wants_peer(Peer::LlamaCpp, "llama-bench", "llama.cpp") {
        for test in crate::experiment::llama_cpp::llama_bench(&path, 512, 128, 5)? {
            let (n_prompt, n_gen) = (test["n_prompt"].as_u64().unwrap_or(0), test["n_gen"].as_u64().unwrap_or(0));
            let name = if n_gen > 0 { format!("tg{n_gen}") } else { format!("pp{n_prompt}") };
            let params = json!({"op": "llama.cpp", "test": name, "flash_attn": test["flash_attn"], "timed": false});
            let mut rec = Measurement::new(format!("llama-bench {name}"), "llama.cpp", &params, Work { bytes: 0, flops: 0 });
            rec.extra.insert("tokens_s".into(), test["avg_ts"].clone());
            rec.extra.insert("tokens_s_stddev".into(), test["stddev_ts"].clone());
            rec.extra.insert("build_commit".into(), test["build_commit"].clone());
            rec.error = Some(finite(&[test["avg_ts"].as_f64().unwrap_or(f64::NAN) as f32], "a finite rate"));
            s.emit(rec)?;
        }
    }
    Ok(())
}

/// Settings of the `sample` case: (temperature, top-k, top-p).
const SAMPLINGS: [(f32, usize, f32); 5] = [(1.0, 0, 1.0), (0.7, 40, 1.0), (0.8, 0, 0.9), (1.2, 50, 0.95), (0.5, 1, 1.0)];

/// The GPU's draws against the CPU mirror's, and their time beside argmax's.
fn sample(s: &mut Session, case: &Value) -> Result<()> {
    use crate::model::llama::sample::Draw;
    use crate::model::llama::Sampling;
    use rand::{Rng, SeedableRng};
    let Backend::Cuda(gpu) = s.backend.clone() else { return Ok(()) };
    let (rows, vocab, cap) = (param_usize(case, "rows")?, 49152usize, 64usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(s.opts.seed ^ rows as u64);
    let mut logits: Vec<f32> = (0..rows * vocab).map(|_| rng.random_range(-6.0f32..6.0)).collect();
    for r in 0..rows {
        let row = &mut logits[r * vocab..(r + 1) * vocab];
        // A few strong candidates, some of them tied, and on the last row scores near 1e4.
        for j in 0..8 {
            row[(j * 7919 + r * 104_729) % vocab] = 9.0 + (j / 2) as f32;
        }
        if r + 1 == rows && rows > 1 {
            row.iter_mut().for_each(|v| *v = 1e4 + *v * 10.0);
        }
    }
    let positions: Vec<i32> = (0..rows).map(|r| ((r * 13) % (cap - 2)) as i32).collect();
    let d_logits = gpu.upload(&logits)?;
    let d_prompt = gpu.upload(&vec![0i32; rows])?;
    for (t, k, p) in SAMPLINGS {
        let sampling = Sampling { temperature: t, top_k: k, top_p: p, seed: s.opts.seed };
        let params = json!({"op": "sample", "rows": rows, "temperature": t, "top_k": k, "top_p": p});
        let mut tokens = gpu.upload(&vec![u32::MAX; rows * cap])?;
        let mut pos = gpu.upload(&positions)?;
        super::sample(&gpu, &d_logits, &mut tokens, &mut pos, &d_prompt, rows, vocab, cap, &sampling)?;
        let got = gpu.download(&tokens)?;
        let (mut off, mut exact) = (Vec::new(), 0);
        for r in 0..rows {
            let pr = positions[r] as usize;
            let token = got[r * cap + pr + 1];
            let draw = Draw::new(&logits[r * vocab..(r + 1) * vocab], &sampling, r, pr)?;
            exact += usize::from(token == draw.token());
            // The kernel's exp may differ from the CPU's in its last bit: a token whose interval
            // lies within 1e-6 of the total of the target is still the draw.
            if !draw.allows(token, 1e-6) {
                off.push(format!("row {r}: token {token}, the CPU drew {}", draw.token()));
            }
        }
        // argmax's choices against the CPU's (the rows hold tied maxima: the lowest id wins).
        let mut greedy_off = Vec::new();
        if s.wants("argmax", "lab") {
            let (mut tokens, mut pos) = (gpu.upload(&vec![u32::MAX; rows * cap])?, gpu.upload(&positions)?);
            super::argmax(&gpu, &d_logits, &mut tokens, &mut pos, &d_prompt, rows, vocab, cap)?;
            let got = gpu.download(&tokens)?;
            for r in 0..rows {
                let (token, want) = (got[r * cap + positions[r] as usize + 1], argmax(&logits[r * vocab..(r + 1) * vocab])?);
                if token != want {
                    greedy_off.push(format!("row {r}: token {token}, the CPU's argmax {want}"));
                }
            }
        }
        for (variant, greedy) in [("sample", false), ("argmax", true)] {
            if !s.wants(variant, "lab") {
                continue;
            }
            let mut pos = gpu.upload(&positions)?;
            let time = time_gpu(&gpu, &s.budget, || {
                if greedy {
                    super::argmax(&gpu, &d_logits, &mut tokens, &mut pos, &d_prompt, rows, vocab, cap)
                } else {
                    super::sample(&gpu, &d_logits, &mut tokens, &mut pos, &d_prompt, rows, vocab, cap, &sampling)
                }
            })?;
            let mut m = Measurement::new(variant, "lab", &params, Work { bytes: (rows * vocab * 4) as u64, flops: 0 });
            m.time = Some(time);
            let (off, reference) = if greedy { (&greedy_off, "generate::argmax on the CPU") } else { (&off, "model::llama::sample, the CPU mirror at the same seed and position") };
            m.error = Some(ErrorStats { mismatches: off.len() as u64, ..ErrorStats::empty(reference) });
            if !greedy {
                m.extra.insert("rows_equal_to_cpu".into(), json!(exact));
            }
            if !off.is_empty() {
                m.extra.insert("why".into(), json!(off.iter().take(4).cloned().collect::<Vec<_>>().join("; ")));
            }
            s.emit(m)?;
        }
    }
    Ok(())
}
