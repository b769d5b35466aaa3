//! Writes SmolLM2-135M-Instruct as a Llama-3-style file (tests/common/llama3_style.rs) and asks
//! llama.cpp what it makes of it: `llama-tokenize`'s ids for the test texts and the prompts, and
//! its 16 largest logits after each prompt (CPU, from an empty cache). The answers become the
//! fixture lab/tests/llama3_style.rs checks the lab against, so that CI needs no llama.cpp.
//!
//! `LAB_LLAMA_CPP=DIR/build/bin cargo run --release --example llama3_style -- OUT.gguf FIXTURE.json`
//! with LAB_SMOLLM2_GGUF set (scripts/llama-cpp.sh build TAR DIR cpu builds the tools).

#[path = "../tests/common/llama3_style.rs"]
mod llama3_style;

use lab::experiment::llama_cpp;
use lab::ops::llama::experiment::PROMPTS;
use lab::weights::gguf::GgufFile;
use serde_json::json;
use std::path::Path;

fn main() -> lab::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, fixture] = args.as_slice() else {
        eprintln!("usage: llama3_style OUT.gguf FIXTURE.json (LAB_SMOLLM2_GGUF and LAB_LLAMA_CPP set)");
        std::process::exit(2);
    };
    let source = std::env::var("LAB_SMOLLM2_GGUF").map_err(|_| lab::LabError::Invalid("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf".into()))?;
    let file = GgufFile::open(&source)?;
    llama3_style::file(&file.parse()?).write(Path::new(out))?;
    let tokens = llama3_style::TEXTS.iter().map(|t| Ok(json!({"text": t, "ids": llama_cpp::tokenize(Path::new(out), t)?}))).collect::<lab::Result<Vec<_>>>()?;
    let mut prompts = Vec::new();
    for p in PROMPTS {
        let ids = llama_cpp::tokenize(Path::new(out), p)?;
        let logits = llama_cpp::logits(Path::new(out), &ids, 0)?;
        let mut top: Vec<(usize, f32)> = logits.iter().copied().enumerate().collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        top.truncate(16);
        prompts.push(json!({"text": p, "ids": ids, "top": top}));
    }
    let doc = json!({
        "source": "llama.cpp as vendored by llama-cpp-python 0.3.36 (CPU build): llama-tokenize --ids, and libllama's logits after each prompt (lab/peers/llama_cpp_logits.c, no GPU layers)",
        "file": format!("lab/examples/llama3_style.rs from {}", Path::new(&source).file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned())),
        "pre": llama3_style::PRE,
        "tokens": tokens,
        "prompts": prompts,
    });
    let text = serde_json::to_string_pretty(&doc).expect("JSON") + "\n";
    std::fs::write(fixture, text).map_err(|e| lab::LabError::io(Path::new(fixture), e))?;
    println!("wrote {out} and {fixture}");
    Ok(())
}
