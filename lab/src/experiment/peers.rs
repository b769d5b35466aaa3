//! Peers run as separate programs on the same inputs: PyTorch through `lab/peers/torch_peers.py`
//! (embedded in the binary, so the GPU host needs only `python3` with torch).

use crate::profile::{Budget, TimeSummary, TimingMode};
use crate::{LabError, Result};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

const TORCH_PEERS: &str = include_str!("../../peers/torch_peers.py");

/// What a peer returned: its variant name, timing, output bytes and version facts.
pub struct PeerRun {
    pub variant: String,
    pub time: (TimeSummary, TimingMode),
    pub output: Vec<u8>,
    pub extra: serde_json::Map<String, Value>,
}

/// `python3` unless `LAB_PYTHON` names another interpreter.
pub fn python() -> String {
    std::env::var("LAB_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs `op` in torch on `inputs` (raw little-endian bytes of `dtype`, each with its shape);
/// `args` are the op's own arguments (eps, approximation, compile).
pub fn torch(op: &str, dtype: &str, args: Value, inputs: &[(&[u8], &[usize])], budget: &Budget, l2_bytes: i64) -> Result<PeerRun> {
    torch_with(&python(), TORCH_PEERS, op, dtype, args, inputs, budget, l2_bytes)
}

/// [`torch`] through `interpreter` running `script_text`: the byte protocol on its own, which
/// the tests drive with stub scripts.
#[allow(clippy::too_many_arguments)]
fn torch_with(interpreter: &str, script_text: &str, op: &str, dtype: &str, args: Value, inputs: &[(&[u8], &[usize])], budget: &Budget, l2_bytes: i64) -> Result<PeerRun> {
    let fail = |why: String| LabError::Peer { peer: "torch".into(), why };
    let dir = tempfile::tempdir().map_err(|e| fail(format!("no temp dir: {e}")))?;
    let script = dir.path().join("torch_peers.py");
    std::fs::write(&script, script_text).map_err(|e| fail(e.to_string()))?;
    let mut paths = Vec::new();
    for (i, (bytes, shape)) in inputs.iter().enumerate() {
        let p = dir.path().join(format!("in{i}.bin"));
        std::fs::write(&p, bytes).map_err(|e| fail(format!("writing input: {e}")))?;
        paths.push(json!({"path": p.display().to_string(), "shape": shape}));
    }
    let out = dir.path().join("out.bin");
    let request = json!({
        "op": op, "dtype": dtype, "args": args, "inputs": paths, "output": out.display().to_string(),
        "warmup": budget.warmup, "min_reps": budget.min, "max_reps": budget.max,
        "budget_ms": budget.budget_ms, "l2_scrub_bytes": 2 * l2_bytes,
        "l2": budget.l2.name(), "launch": budget.launch.name(),
        "settled": crate::profile::SETTLED, "max_warmup_rounds": crate::profile::MAX_WARMUP_ROUNDS,
    });
    let reply = call_python("torch", interpreter, &script, &request)?;
    let line = reply.to_string();
    let samples = |key: &str| -> Vec<f64> { reply[key].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default() };
    let raw = Some(samples("raw_ms")).filter(|v| !v.is_empty()).ok_or_else(|| fail(format!("reply has no samples: {line}")))?;
    let output = std::fs::read(&out).map_err(|e| fail(format!("no output file: {e}")))?;
    let warmup_ms = samples("warmup_ms");
    let mode = TimingMode {
        l2: budget.l2.name().into(),
        launch: reply["launch"].as_str().unwrap_or("eager").into(),
        warmup: warmup_ms.len(),
        raw_ms: raw.clone(),
        warmup_ms,
        clocks: None,
    };
    let mut extra = serde_json::Map::new();
    for key in ["torch", "device"] {
        extra.insert(format!("peer_{key}"), reply[key].clone());
    }
    Ok(PeerRun {
        variant: reply["variant"].as_str().unwrap_or(op).to_string(),
        time: (TimeSummary::of(&raw), mode),
        output,
        extra,
    })
}

/// Runs `script` under `interpreter` with `request` as JSON on stdin; its last line of stdout is
/// the JSON reply.
pub(crate) fn call_python(peer: &str, interpreter: &str, script: &std::path::Path, request: &Value) -> Result<Value> {
    let fail = |why: String| LabError::Peer { peer: peer.into(), why };
    let mut child = Command::new(interpreter)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start `{interpreter}`: {e}")))?;
    // A peer that dies before reading its request breaks the pipe: its exit status and stderr
    // say why, so they are reported before the failed write.
    let sent = child.stdin.take().expect("piped stdin").write_all(request.to_string().as_bytes());
    let done = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if !done.status.success() {
        let err = String::from_utf8_lossy(&done.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(fail(format!("{interpreter} exited with {}: {}", done.status, tail.into_iter().rev().collect::<Vec<_>>().join(" | "))));
    }
    sent.map_err(|e| fail(format!("the request could not be sent: {e}")))?;
    let stdout = String::from_utf8_lossy(&done.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| fail(format!("unreadable reply `{line}`: {e}")))
}

const TRANSFORMERS_LLAMA: &str = include_str!("../../peers/transformers_llama.py");

/// What transformers makes of a GGUF model (`lab/peers/transformers_llama.py`): the encodings
/// of `texts`, and per prompt the logits after it, a greedy continuation of `new_tokens` with the
/// top-2 logit gaps, and the eager decode rate.
pub struct TransformersRun {
    pub reply: Value,
    /// Per prompt, the logits after its last token.
    pub logits: Vec<Vec<f32>>,
}

pub fn transformers_llama(gguf: &std::path::Path, texts: &[&str], prompts: &[Vec<u32>], new_tokens: usize) -> Result<TransformersRun> {
    let fail = |why: String| LabError::Peer { peer: "transformers".into(), why };
    let dir = tempfile::tempdir().map_err(|e| fail(format!("no temp dir: {e}")))?;
    let script = dir.path().join("transformers_llama.py");
    std::fs::write(&script, TRANSFORMERS_LLAMA).map_err(|e| fail(e.to_string()))?;
    let request = json!({"gguf": gguf.display().to_string(), "texts": texts, "prompts": prompts, "new_tokens": new_tokens, "out_dir": dir.path().display().to_string()});
    let reply = call_python("transformers", &python(), &script, &request)?;
    let logits = (0..prompts.len())
        .map(|i| {
            let bytes = std::fs::read(dir.path().join(format!("logits{i}.bin"))).map_err(|e| fail(format!("no logits for prompt {i}: {e}")))?;
            Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        })
        .collect::<Result<_>>()?;
    Ok(TransformersRun { reply, logits })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Speaks the protocol as torch_peers.py does, without torch: reads the request, writes the
    /// first input's bytes reversed as the output, logs a line, then prints the reply last.
    const STUB: &str = r#"
import json, sys
req = json.load(sys.stdin)
data = open(req["inputs"][0]["path"], "rb").read()
open(req["output"], "wb").write(data[::-1])
print("stub: warming up")
reps = max(req["min_reps"], 3)
print(json.dumps({"variant": "stub " + req["op"], "raw_ms": [0.5 + 0.1 * i for i in range(reps)], "warmup_ms": [0.9],
                  "launch": req["launch"], "torch": "0.0-stub", "device": "stub-gpu"}))
"#;

    fn run(script: &str) -> Result<PeerRun> {
        let input: Vec<u8> = (0u8..12).collect();
        torch_with(&python(), script, "softmax", "f32", json!({}), &[(&input, &[3])], &Budget::new(true), 1 << 20)
    }

    fn error_of(script: &str) -> String {
        match run(script) {
            Ok(r) => panic!("the reply of {script:?} was accepted as {} with {} samples", r.variant, r.time.1.raw_ms.len()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_peer_speaking_the_protocol_is_read_back() {
        let r = run(STUB).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.variant, "stub softmax");
        assert_eq!(r.output, (0u8..12).rev().collect::<Vec<_>>(), "the output file, byte for byte");
        assert_eq!(r.time.1.raw_ms.len(), Budget::new(true).min);
        assert!((r.time.0.median - 0.7).abs() < 1e-12, "{:?}", r.time.0);
        assert_eq!((r.time.1.warmup, r.time.1.launch.as_str(), r.time.1.l2.as_str()), (1, "eager", Budget::new(true).l2.name()));
        assert_eq!((r.extra["peer_torch"].as_str(), r.extra["peer_device"].as_str()), (Some("0.0-stub"), Some("stub-gpu")));
    }

    #[test]
    fn a_peer_that_replies_garbage_or_dies_is_a_named_error() {
        let garbage = "import sys\nsys.stdin.read()\nprint('Traceback? no: just words')";
        let e = error_of(garbage);
        assert!(e.contains("peer `torch` failed") && e.contains("unreadable reply `Traceback? no: just words`"), "{e}");
        let no_samples = STUB.replace("\"raw_ms\": [0.5 + 0.1 * i for i in range(reps)]", "\"raw_ms\": []");
        assert!(error_of(&no_samples).contains("reply has no samples"), "{}", error_of(&no_samples));
        let no_output = STUB.replace("open(req[\"output\"], \"wb\").write(data[::-1])", "pass");
        assert!(error_of(&no_output).contains("no output file"), "{}", error_of(&no_output));
        // It dies before reading the request, as a peer failing at import does.
        let dies = "import sys\nprint('CUDA error: out of memory', file=sys.stderr)\nsys.exit(3)";
        let e = error_of(dies);
        assert!(e.contains("peer `torch` failed") && e.contains("exited with exit status: 3") && e.contains("CUDA error: out of memory"), "{e}");
        let e = torch_with("/nonexistent/python3", STUB, "softmax", "f32", json!({}), &[], &Budget::new(true), 0).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("cannot start `/nonexistent/python3`"), "{e}");
    }
}
