//! `lab pipeline` with the real tokenizer, SmolLM2-135M-Instruct's (scripts/test.sh installs it
//! and exports LAB_SMOLLM2_GGUF). Without that variable these tests FAIL: set it to the .gguf's
//! path (see README, "Quantization").

use lab::model::llama::config::RopeScaling;
use lab::model::llama::Config;
use lab::model::tokenizer::Tokenizer;
use lab::record::{read_records, Verdict};
use lab::train::export::to_gguf;
use lab::train::Model;
use lab::weights::gguf::{GgmlType, Gguf, GgufFile};
use std::process::Command;

fn smollm2() -> String {
    std::env::var("LAB_SMOLLM2_GGUF").expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh installs it; see README)")
}

#[test]
fn the_tokenizer_travels_with_a_trained_model() {
    let file = GgufFile::open(smollm2()).unwrap();
    let src = file.parse().unwrap();
    let vocab = Config::from_gguf(&src).unwrap().vocab;
    let c = Config {
        layers: 1,
        dim: 32,
        heads: 2,
        kv_heads: 1,
        head_dim: 16,
        ffn: 64,
        vocab,
        context: 64,
        eps: 1e-5,
        rope_base: 100000.0,
        rope_dims: 16,
        rope_scaling: RopeScaling::None,
        rope_factors: None,
        tied_embeddings: true,
    };
    let m = Model::init(&c, 0.02, 1).unwrap();
    let small = Model::init(&Config { vocab: 37, ..c.clone() }, 0.02, 1).unwrap();
    let err = to_gguf(&small, GgmlType::F32, Some(&src), "t").unwrap_err().to_string();
    assert!(err.contains(&format!("the tokenizer has {vocab} tokens but the model's vocabulary is 37")), "{err}");
    let bytes = to_gguf(&m, GgmlType::Q8_0, Some(&src), "t").unwrap().to_bytes().unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(Config::from_gguf(&g).unwrap(), c);
    let (a, b) = (Tokenizer::from_gguf(&g).unwrap(), Tokenizer::from_gguf(&src).unwrap());
    let text = "def f(x):\n    return x ** 2  # 12345 <|im_start|>";
    assert_eq!(a.encode(text, true).unwrap(), b.encode(text, true).unwrap());
}

#[test]
fn the_quick_pipeline_trains_writes_and_records_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let (out, records) = (dir.path().join("out"), dir.path().join("records"));
    let text = dir.path().join("text.txt");
    // A small text keeps the test short; `lab pipeline` defaults to Python's topics.py.
    let license = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0").unwrap();
    std::fs::write(&text, license.repeat(2)).unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_lab"))
            .args(["pipeline", "--quick", "--steps", "6", "--seed", "5", "--format", "q8_0", "--tokenizer", &smollm2()])
            .arg("--text")
            .arg(&text)
            .arg("--out")
            .arg(&out)
            .arg("--records")
            .arg(&records)
            .output()
            .unwrap()
    };
    let first = run();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let (recs, damage) = read_records(&records).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    assert!(recs.iter().all(|r| r.experiment == "pipeline" && r.verdict == Verdict::Pass), "{recs:?}");
    let steps: Vec<f64> = recs.iter().filter(|r| r.variant == "train_step").map(|r| r.extra["loss"].as_f64().unwrap()).collect();
    assert_eq!(steps.len(), 6);
    // Six steps from a uniform start at ln(49152) = 10.8: the loss moves down.
    assert!(steps[0] > 10.0 && steps[5] < steps[0], "{steps:?}");
    // The run's record times a step (the median of the steps'), so its work is one step's.
    let (train, step) = (recs.iter().find(|r| r.variant == "train").unwrap(), recs.iter().find(|r| r.variant == "train_step").unwrap());
    assert_eq!(train.work.flops, step.work.flops);
    let held = recs.iter().find(|r| r.variant == "held_out").unwrap().extra["loss"].as_f64().unwrap();
    assert!(held.is_finite() && held < 11.0, "held-out loss {held}");
    let gguf = recs.iter().find(|r| r.variant == "gguf").unwrap();
    let written = std::fs::read(out.join("model.gguf")).unwrap();
    assert_eq!(gguf.extra["gguf_bytes"].as_u64(), Some(written.len() as u64));
    assert!(gguf.error.as_ref().is_some_and(|e| e.passed()));
    for f in ["tokens.safetensors", "held_out.safetensors", "checkpoint.safetensors"] {
        assert!(out.join(f).is_file(), "{f} is missing");
    }
    // The written file and its copies, each scored on the held-out text by the engine.
    let scores: Vec<_> = recs.iter().filter(|r| r.variant == "cpu_reference").collect();
    let formats: Vec<&str> = scores.iter().map(|r| r.params["format"].as_str().unwrap()).collect();
    assert_eq!(formats, ["q8_0", "f32", "f16", "q4_1", "q4_0"]);
    let figure = |format: &str, key: &str| scores.iter().find(|r| r.params["format"] == format).unwrap().extra[key].as_f64().unwrap();
    for (r, format) in scores.iter().zip(&formats) {
        let file = if *format == "q8_0" { out.join("model.gguf") } else { out.join(format!("model.{format}.gguf")) };
        assert_eq!(r.extra["file_bytes"].as_u64(), Some(std::fs::metadata(&file).unwrap().len()), "{format}");
        // Two evaluators of one model: the engine's perplexity and the trainer's held-out loss.
        let ppl = figure(format, "ppl");
        assert!((ppl.ln() - held).abs() < 0.5, "{format}: perplexity {ppl} against held-out loss {held}");
        let kl = figure(format, "mean_kl");
        assert!(kl.is_finite() && kl >= -1e-12, "{format}: KL {kl}");
    }
    // Matrices and the tied embedding in q8_0 (8.5 bits), norms in f32; the f32 copy holds the
    // same values, so it scores the same; 4 bits cost something.
    assert!((8.5..8.6).contains(&figure("q8_0", "bits_per_weight")), "{}", figure("q8_0", "bits_per_weight"));
    assert_eq!(figure("f32", "bits_per_weight"), 32.0);
    assert!((16.0..16.1).contains(&figure("f16", "bits_per_weight")), "{}", figure("f16", "bits_per_weight"));
    assert!(figure("f32", "mean_kl").abs() < 1e-12 && figure("f32", "top1_same") == 1.0);
    assert!(figure("q4_0", "mean_kl") > 1e-6, "{}", figure("q4_0", "mean_kl"));
    let again = run();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(std::fs::read(out.join("model.gguf")).unwrap(), written, "the second run touched the first one's model");
}

#[test]
fn an_unknown_plan_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = Command::new(env!("CARGO_BIN_EXE_lab")).args(["pipeline", "--plan", "huge", "--tokenizer", &smollm2(), "--text", "/usr/share/common-licenses/GPL-3", "--out"]).arg(&out).arg("--records").arg(dir.path().join("records")).output().unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("no plan `huge` (plans: quick, cpu, full)"), "{err}");
    assert!(!out.exists(), "a refused run created its output folder");
}
