//! llama.cpp, the inference peer, built from its own sources by scripts/llama-cpp.sh
//! (`LAB_LLAMA_CPP` names the folder of its built tools, `build/bin`; the CUDA build on a GPU
//! host, the CPU build anywhere): `llama-bench` for speed, `llama-perplexity` for perplexity and
//! KL divergence, `llama-tokenize` for token ids, and libllama through
//! lab/peers/llama_cpp_logits.c for the logits after a prompt.

use crate::{LabError, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn fail(why: String) -> LabError {
    LabError::Peer { peer: "llama.cpp".into(), why }
}

/// The folder of llama.cpp's built tools.
pub fn tools() -> Result<PathBuf> {
    let dir = std::env::var("LAB_LLAMA_CPP").map(PathBuf::from).map_err(|_| fail("LAB_LLAMA_CPP must name the folder of llama.cpp's built tools (scripts/llama-cpp.sh build)".into()))?;
    if !dir.is_dir() {
        return Err(fail(format!("LAB_LLAMA_CPP={} is not a folder (scripts/llama-cpp.sh build writes DIR/build/bin)", dir.display())));
    }
    Ok(dir)
}

/// Runs one of llama.cpp's tools; its standard output and error on success.
fn run(tool: &str, args: &[&std::ffi::OsStr]) -> Result<(String, String)> {
    let bin = tools()?.join(tool);
    let out = Command::new(&bin).args(args).output().map_err(|e| fail(format!("cannot start {}: {e}", bin.display())))?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let last: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(fail(format!("{} exited with {}: {}", bin.display(), out.status, last.into_iter().rev().collect::<Vec<_>>().join(" / "))));
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), err))
}

/// `llama-bench` on `gguf`: one JSON object per test (pp512, tg128) and flash-attention setting,
/// as llama-bench writes them.
pub fn llama_bench(gguf: &Path, prompt: usize, gen: usize, reps: usize) -> Result<Vec<Value>> {
    let (p, n, r) = (prompt.to_string(), gen.to_string(), reps.to_string());
    let os = std::ffi::OsStr::new;
    let mut args = vec![os("-m"), gguf.as_os_str()];
    args.extend(["-p", p.as_str(), "-n", n.as_str(), "-r", r.as_str(), "-fa", "0,1", "-ngl", "99", "-o", "json"].map(os));
    let (out, _) = run("llama-bench", &args)?;
    serde_json::from_str(&out).map_err(|e| fail(format!("unreadable llama-bench output: {e}")))
}

/// `llama-tokenize --ids` on `text` (read verbatim from a file, special tokens parsed, BOS as
/// the file's `tokenizer.ggml.add_bos_token` says): llama.cpp's token ids.
pub fn tokenize(gguf: &Path, text: &str) -> Result<Vec<u32>> {
    let dir = tempfile::tempdir().map_err(|e| fail(format!("no temp dir: {e}")))?;
    let file = dir.path().join("text");
    std::fs::write(&file, text).map_err(|e| fail(format!("{}: {e}", file.display())))?;
    let os = std::ffi::OsStr::new;
    let (out, _) = run("llama-tokenize", &[os("-m"), gguf.as_os_str(), os("-f"), file.as_os_str(), os("--ids"), os("--no-escape"), os("--log-disable")])?;
    let ids = out.lines().rev().find(|l| l.starts_with('[')).ok_or_else(|| fail(format!("no ids in llama-tokenize's output: `{}`", out.trim())))?;
    serde_json::from_str(ids).map_err(|e| fail(format!("unreadable ids `{ids}`: {e}")))
}

/// What `llama-perplexity` reported.
#[derive(Debug, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    pub ppl_err: f64,
    /// Against a saved base (`Kl::Against`): mean KL divergence and the share of positions whose
    /// most likely token is the base's.
    pub mean_kl: Option<f64>,
    pub top1_same: Option<f64>,
}

/// What `llama-perplexity` does with the base model's logits.
pub enum Kl<'a> {
    None,
    /// Save every scored position's logits to this file (the base model's run).
    SaveBase(&'a Path),
    /// Compare with the logits saved in this file.
    Against(&'a Path),
}

/// `llama-perplexity -c ctx --chunks chunks` on `text` (the protocol `model::eval` follows).
pub fn perplexity(gguf: &Path, text: &Path, ctx: usize, chunks: usize, gpu_layers: usize, kl: Kl) -> Result<Perplexity> {
    let (c, n, g, t) = (ctx.to_string(), chunks.to_string(), gpu_layers.to_string(), std::thread::available_parallelism().map_or(1, |n| n.get()).to_string());
    let os = std::ffi::OsStr::new;
    let mut args = vec![os("-m"), gguf.as_os_str(), os("-f"), text.as_os_str(), os("-c"), os(&c), os("-b"), os(&c), os("--chunks"), os(&n), os("-ngl"), os(&g), os("-t"), os(&t)];
    match kl {
        Kl::None => {}
        Kl::SaveBase(p) => args.extend([os("--kl-divergence-base"), p.as_os_str()]),
        Kl::Against(p) => args.extend([os("--kl-divergence-base"), p.as_os_str(), os("--kl-divergence")]),
    }
    let (out, err) = run("llama-perplexity", &args)?;
    parse_perplexity(&format!("{out}\n{err}"))
}

/// The figures of llama-perplexity's log: "Final estimate: PPL = x +/- e" for a plain run;
/// against a base, the last row of its per-chunk table (running figures: PPL(Q) ± e,
/// ln(PPL(Q)/PPL(base)) ± e, KL ± e, Δp RMS ± e %, same top p ± e %), which it prints even when
/// too few positions were scored for its closing statistics.
pub fn parse_perplexity(log: &str) -> Result<Perplexity> {
    let num = r"(-?[0-9.]+(?:[eE][-+]?[0-9]+)?|-?nan|-?inf)";
    let pm = format!(r"{num}\s*±\s*{num}");
    let plain = regex::Regex::new(&format!(r"Final estimate: PPL = {num} \+/- {num}")).expect("a valid pattern");
    let row = regex::Regex::new(&format!(r"(?m)^\s*\d+\s+{pm}\s+{pm}\s+{pm}\s+{pm}\s*%\s+{pm}\s*%\s*$")).expect("a valid pattern");
    let f = |c: &regex::Captures, i: usize| c[i].parse::<f64>().unwrap_or(f64::NAN);
    if let Some(c) = plain.captures_iter(log).last() {
        return Ok(Perplexity { ppl: f(&c, 1), ppl_err: f(&c, 2), mean_kl: None, top1_same: None });
    }
    if let Some(c) = row.captures_iter(log).last() {
        return Ok(Perplexity { ppl: f(&c, 1), ppl_err: f(&c, 2), mean_kl: Some(f(&c, 5)), top1_same: Some(f(&c, 9) / 100.0) });
    }
    Err(fail(format!("no perplexity in llama-perplexity's output: `{}`", log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(""))))
}

/// Writes log-probabilities scored by another engine as the base file of `llama-perplexity
/// --kl-divergence` (its `--kl-divergence-base` layout, read by tools/perplexity/perplexity.cpp):
/// "_logits_", n_ctx (u32), n_vocab (i32), n_chunk (i32), the chunks' tokens (i32), then for each
/// scored position (ctx/2 .. ctx-2 of each chunk) the scale and the smallest kept log-probability
/// (two f32) and every token's log-probability quantized to u16 above that floor (16 nats below
/// the top, as llama.cpp keeps them), padded to an even count. llama.cpp then evaluates the same
/// tokens and reports KL from this base and how often its most likely token is the base's.
pub fn write_kl_base(path: &Path, chunks: &[Vec<u32>], logprobs: &[Vec<f64>]) -> Result<()> {
    use std::io::Write;
    let ctx = chunks.first().map_or(0, Vec::len);
    let vocab = logprobs.first().map_or(0, Vec::len);
    let per_chunk = ctx.saturating_sub(1 + ctx / 2);
    if chunks.iter().any(|c| c.len() != ctx) || logprobs.len() != per_chunk * chunks.len() || logprobs.iter().any(|l| l.len() != vocab) {
        return Err(LabError::Invalid(format!(
            "a KL base needs {per_chunk} rows of {vocab} log-probabilities per chunk of {ctx} tokens: {} rows for {} chunks",
            logprobs.len(),
            chunks.len()
        )));
    }
    let io = |e| LabError::io(path, e);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    out.write_all(b"_logits_").map_err(io)?;
    out.write_all(&(ctx as u32).to_le_bytes()).map_err(io)?;
    out.write_all(&(vocab as i32).to_le_bytes()).map_err(io)?;
    out.write_all(&(chunks.len() as i32).to_le_bytes()).map_err(io)?;
    for t in chunks.iter().flatten() {
        out.write_all(&(*t as i32).to_le_bytes()).map_err(io)?;
    }
    for row in logprobs {
        let (scale, floor, q) = quantize_logprobs(row);
        out.write_all(&scale.to_le_bytes()).map_err(io)?;
        out.write_all(&floor.to_le_bytes()).map_err(io)?;
        for v in q.iter().chain(std::iter::repeat_n(&0, vocab % 2)) {
            out.write_all(&v.to_le_bytes()).map_err(io)?;
        }
    }
    out.flush().map_err(io)
}

/// One row of log-probabilities as llama.cpp stores a base: (scale, floor, codes) with
/// log p ~= scale * code + floor, the floor no lower than 16 below the largest.
fn quantize_logprobs(row: &[f64]) -> (f32, f32, Vec<u16>) {
    let top = row.iter().copied().fold(f64::NEG_INFINITY, f64::max) as f32;
    let floor = (row.iter().copied().fold(f64::INFINITY, f64::min) as f32).max(top - 16.0);
    let scale = (top - floor) / 65535.0;
    let q = row.iter().map(|&v| if scale > 0.0 && v as f32 > floor { ((v as f32 - floor) / scale).round() as u16 } else { 0 }).collect();
    (scale, floor, q)
}

/// A C peer of lab/peers/ (`name`.c), compiled against the llama.cpp that `LAB_LLAMA_CPP` names
/// (headers from the source tree that scripts/llama-cpp.sh unpacked beside the build) and
/// linked to its library `lib`.
fn harness(name: &str, source: &str, lib: &str) -> std::result::Result<(tempfile::TempDir, PathBuf), String> {
    let bin = tools().map_err(|e| e.to_string())?;
    let src = bin.join("../../llama.cpp");
    let dir = tempfile::tempdir().map_err(|e| format!("no temp dir: {e}"))?;
    let (c, exe) = (dir.path().join(format!("{name}.c")), dir.path().join(name));
    std::fs::write(&c, source).map_err(|e| e.to_string())?;
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-std=c11", "-o"])
        .arg(&exe)
        .arg(&c)
        .arg(format!("-I{}", src.join("include").display()))
        .arg(format!("-I{}", src.join("ggml/include").display()))
        .arg(format!("-L{}", bin.display()))
        .arg(format!("-Wl,-rpath,{}", bin.display()))
        .arg(format!("-l{lib}"))
        .output()
        .map_err(|e| format!("cannot start the C compiler: {e}"))?;
    if !out.status.success() {
        return Err(format!("{name} does not build against {}: {}", src.display(), String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("")));
    }
    Ok((dir, exe))
}

type Built = OnceLock<std::result::Result<(tempfile::TempDir, PathBuf), String>>;

/// The logits harness (lab/peers/llama_cpp_logits.c), compiled once per process.
fn logits_harness() -> Result<&'static Path> {
    static BUILT: Built = OnceLock::new();
    let built = BUILT.get_or_init(|| harness("llama_cpp_logits", include_str!("../../peers/llama_cpp_logits.c"), "llama"));
    built.as_ref().map(|(_, exe)| exe.as_path()).map_err(|e| fail(e.clone()))
}

/// ggml's own blocks of type `ty` for `x` (rows of `row` values, `ggml_quantize_chunk` without
/// an importance matrix) and ggml's reading of them (`to_float`), through
/// lab/peers/ggml_blocks.c.
pub fn ggml_blocks(ty: crate::weights::gguf::GgmlType, row: usize, x: &[f32]) -> Result<(Vec<u8>, Vec<f32>)> {
    static BUILT: Built = OnceLock::new();
    let built = BUILT.get_or_init(|| harness("ggml_blocks", include_str!("../../peers/ggml_blocks.c"), "ggml-base"));
    let exe = built.as_ref().map(|(_, exe)| exe.as_path()).map_err(|e| fail(e.clone()))?;
    let dir = tempfile::tempdir().map_err(|e| fail(format!("no temp dir: {e}")))?;
    let [input, blocks, values] = ["input.f32", "blocks", "values"].map(|n| dir.path().join(n));
    std::fs::write(&input, x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).map_err(|e| fail(format!("{}: {e}", input.display())))?;
    let out = Command::new(exe).arg(ty.0.to_string()).arg(row.to_string()).arg(&input).arg(&blocks).arg(&values).output().map_err(|e| fail(format!("cannot start ggml_blocks: {e}")))?;
    if !out.status.success() {
        return Err(fail(format!("ggml_blocks on {}: {}", ty.name(), String::from_utf8_lossy(&out.stderr).trim())));
    }
    let read = |p: &Path| std::fs::read(p).map_err(|e| fail(format!("{}: {e}", p.display())));
    let y = read(&values)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok((read(&blocks)?, y))
}

/// llama.cpp's logits after `ids` (one batch from an empty cache), read through libllama.
pub fn logits(gguf: &Path, ids: &[u32], gpu_layers: usize) -> Result<Vec<f32>> {
    let exe = logits_harness()?;
    let dir = tempfile::tempdir().map_err(|e| fail(format!("no temp dir: {e}")))?;
    let out = dir.path().join("logits.f32");
    let status = Command::new(exe)
        .arg(gguf)
        .arg(&out)
        .arg(gpu_layers.to_string())
        .args(ids.iter().map(u32::to_string))
        .output()
        .map_err(|e| fail(format!("cannot start the logits harness: {e}")))?;
    if !status.status.success() {
        return Err(fail(format!("llama.cpp on {}: {}", gguf.display(), String::from_utf8_lossy(&status.stderr).trim())));
    }
    let bytes = std::fs::read(&out).map_err(|e| fail(format!("no logits: {e}")))?;
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kl_base_holds_llama_cpps_layout_and_its_rows_decode_back() {
        // Two chunks of 6 tokens score positions 3 and 4 of each: 4 rows of 5 log-probabilities.
        let chunks = vec![vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9, 10, 11, 12]];
        let rows: Vec<Vec<f64>> = (0..4).map(|i| crate::model::eval::log_softmax(&[0.5 * i as f32, -1.0, 3.0, -40.0, 2.9])).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.kld");
        write_kl_base(&path, &chunks, &rows).unwrap();
        let b = std::fs::read(&path).unwrap();
        let (u32_at, f32_at, u16_at) = (
            |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap()),
            |i: usize| f32::from_le_bytes(b[i..i + 4].try_into().unwrap()),
            |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().unwrap()),
        );
        assert_eq!(&b[..8], b"_logits_");
        assert_eq!((u32_at(8), u32_at(12), u32_at(16)), (6, 5, 2), "n_ctx, n_vocab, n_chunk");
        assert_eq!((u32_at(20), u32_at(20 + 11 * 4)), (1, 12), "the tokens, chunk by chunk");
        // Rows of 2 * ((5 + 1) / 2) + 4 = 10 u16 each: scale, floor, 5 codes and a pad.
        let rows_at = 20 + 12 * 4;
        assert_eq!(b.len(), rows_at + 4 * 10 * 2);
        for (r, row) in rows.iter().enumerate() {
            let at = rows_at + r * 20;
            let (scale, floor) = (f32_at(at), f32_at(at + 4));
            let top = row.iter().copied().fold(f64::MIN, f64::max);
            for (i, &lp) in row.iter().enumerate() {
                let back = (scale * u16_at(at + 8 + 2 * i) as f32 + floor) as f64;
                // Within half a step, except below the floor (16 nats under the top), kept at it.
                let want = lp.max(top - 16.0);
                assert!((back - want).abs() <= scale as f64 * 0.5 + 1e-5, "row {r} token {i}: {back} against {want}");
            }
            assert_eq!(u16_at(at + 18), 0, "the pad");
        }
        let e = write_kl_base(&path, &chunks, &rows[..3]).unwrap_err().to_string();
        assert!(e.contains("2 rows of 5") && e.contains("3 rows for 2 chunks"), "{e}");
    }

    #[test]
    fn reads_the_figures_of_both_kinds_of_perplexity_run() {
        let plain = "perplexity: calculating perplexity over 2 chunks, n_ctx=512\n[1]14.2133,[2]15.0219,\nFinal estimate: PPL = 15.0219 +/- 0.87112\n";
        assert_eq!(parse_perplexity(plain).unwrap(), Perplexity { ppl: 15.0219, ppl_err: 0.87112, mean_kl: None, top1_same: None });
        let kl = "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p\n\
                  \x20  1      10.7731 ±    0.0000      -0.00002 ±    0.00000      -0.00001 ±    0.00000     0.000 ±  0.000 %    100.000 ±  0.000 %\n\
                  \x20  2       8.9690 ±    5.8767       0.04001 ±    0.00015       0.07123 ±    0.00432     1.500 ±  0.100 %     91.373 ±  1.245 %\n\n\
                  ====== Perplexity statistics ======\nMean PPL(Q)                   :  8.969000 ±   5.876700\n";
        let p = parse_perplexity(kl).unwrap();
        assert_eq!((p.ppl, p.ppl_err, p.mean_kl), (8.969, 5.8767, Some(0.07123)));
        assert!((p.top1_same.unwrap() - 0.91373).abs() < 1e-12);
        let e = parse_perplexity("main: error: you need at least 1024 tokens\n").unwrap_err().to_string();
        assert!(e.contains("no perplexity") && e.contains("you need at least 1024 tokens"), "{e}");
    }
}
