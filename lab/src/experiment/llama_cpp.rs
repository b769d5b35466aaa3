//! llama.cpp, the inference peer, built from its own sources by scripts/llama-cpp.sh
//! (`LAB_LLAMA_CPP` names the folder of its built tools, `build/bin`; the CUDA build on a GPU
//! host, the CPU build anywhere): `llama-bench` for speed, `llama-perplexity` for perplexity and
//! KL divergence, and libllama through lab/peers/llama_cpp_logits.c for the logits after a prompt.

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

const LOGITS_C: &str = include_str!("../../peers/llama_cpp_logits.c");

/// The logits harness, compiled once per process against the llama.cpp that `LAB_LLAMA_CPP`
/// names (headers from the source tree that scripts/llama-cpp.sh unpacked beside the build).
fn logits_harness() -> Result<&'static Path> {
    static BUILT: OnceLock<std::result::Result<(tempfile::TempDir, PathBuf), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let bin = tools().map_err(|e| e.to_string())?;
        let src = bin.join("../../llama.cpp");
        let dir = tempfile::tempdir().map_err(|e| format!("no temp dir: {e}"))?;
        let (c, exe) = (dir.path().join("llama_cpp_logits.c"), dir.path().join("llama_cpp_logits"));
        std::fs::write(&c, LOGITS_C).map_err(|e| e.to_string())?;
        let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O2", "-std=c11", "-o"])
            .arg(&exe)
            .arg(&c)
            .arg(format!("-I{}", src.join("include").display()))
            .arg(format!("-I{}", src.join("ggml/include").display()))
            .arg(format!("-L{}", bin.display()))
            .arg(format!("-Wl,-rpath,{}", bin.display()))
            .arg("-lllama")
            .output()
            .map_err(|e| format!("cannot start the C compiler: {e}"))?;
        if !out.status.success() {
            return Err(format!("the logits harness does not build against {}: {}", src.display(), String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("")));
        }
        Ok((dir, exe))
    });
    built.as_ref().map(|(_, exe)| exe.as_path()).map_err(|e| fail(e.clone()))
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
