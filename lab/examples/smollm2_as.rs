//! Writes SmolLM2-135M-Instruct rewritten as a Llama 3 file and as a SentencePiece vocabulary
//! (tests/common/smollm2_as.rs) and asks llama.cpp what it makes of them: `llama-tokenize`'s ids
//! for the test texts and the prompts, and on the Llama 3 file its 16 largest logits after each
//! prompt (CPU, from an empty cache). The answers become the fixtures lab/tests/smollm2_as.rs
//! checks the lab against, so that CI needs no llama.cpp.
//!
//! `LAB_LLAMA_CPP=DIR/build/bin cargo run --release --example smollm2_as -- OUT_DIR FIXTURE_DIR`
//! with LAB_SMOLLM2_GGUF set (scripts/llama-cpp.sh build TAR DIR cpu builds the tools); it writes
//! OUT_DIR/smollm2-as-{llama3,spm}.gguf and FIXTURE_DIR/smollm2_as_{llama3,spm}.json.

#[path = "../tests/common/smollm2_as.rs"]
mod smollm2_as;

use lab::experiment::llama_cpp;
use lab::ops::llama::experiment::PROMPTS;
use lab::weights::gguf::GgufFile;
use lab::weights::gguf_writer::GgufWriter;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Writes `file` as OUT_DIR/smollm2-as-`kind`.gguf, and llama.cpp's ids for every text and
/// prompt (with `logits`, its 16 largest after each prompt too) as FIXTURE_DIR/smollm2_as_`kind`.json.
fn fixture(kind: &str, file: GgufWriter, out: &Path, fixtures: &Path, source: &str, logits: bool) -> lab::Result<()> {
    let gguf = out.join(format!("smollm2-as-{kind}.gguf"));
    file.write(&gguf)?;
    let tokens = smollm2_as::TEXTS.iter().map(|t| Ok(json!({"text": t, "ids": llama_cpp::tokenize(&gguf, t)?}))).collect::<lab::Result<Vec<_>>>()?;
    let mut prompts = Vec::new();
    for p in PROMPTS {
        let ids = llama_cpp::tokenize(&gguf, p)?;
        let mut prompt = json!({"text": p, "ids": ids});
        if logits {
            let mut top: Vec<(usize, f32)> = llama_cpp::logits(&gguf, &ids, 0)?.into_iter().enumerate().collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            top.truncate(16);
            prompt["top"] = json!(top);
        }
        prompts.push(prompt);
    }
    let what = if logits { "llama-tokenize --ids, and libllama's logits after each prompt (lab/peers/llama_cpp_logits.c, no GPU layers)" } else { "llama-tokenize --ids" };
    let doc: Value = json!({
        "source": format!("llama.cpp as vendored by llama-cpp-python 0.3.36 (CPU build): {what}"),
        "file": format!("lab/tests/common/smollm2_as.rs ({kind}) from {source}"),
        "tokens": tokens,
        "prompts": prompts,
    });
    let path = fixtures.join(format!("smollm2_as_{kind}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&doc).expect("JSON") + "\n").map_err(|e| lab::LabError::io(&path, e))?;
    println!("wrote {} and {}", gguf.display(), path.display());
    Ok(())
}

fn main() -> lab::Result<()> {
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let [out, fixtures] = args.as_slice() else {
        eprintln!("usage: smollm2_as OUT_DIR FIXTURE_DIR (LAB_SMOLLM2_GGUF and LAB_LLAMA_CPP set)");
        std::process::exit(2);
    };
    let path = std::env::var("LAB_SMOLLM2_GGUF").map_err(|_| lab::LabError::Invalid("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf".into()))?;
    let source = Path::new(&path).file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let file = GgufFile::open(&path)?;
    let g = file.parse()?;
    fixture("llama3", smollm2_as::llama3(&g), out, fixtures, &source, true)?;
    fixture("spm", smollm2_as::spm(&g), out, fixtures, &source, false)
}
