//! `lab pipeline --peers torch`: the same training in PyTorch (`lab/peers/torch_train.py`, plain
//! torch ops, `torch.optim.AdamW`, a `LambdaLR` of the lab's schedule, `clip_grad_norm_`) from
//! the trainer's checkpoint at step 0 and the very batches the trainer takes, and the bar the
//! trainer is held to: its loss within 1% of torch's at every one of the first 200 steps.
//!
//! torch trains twice: in f32, the lab's precision and the bar's reference, and in f64, the
//! trajectory exact arithmetic takes: where the f32 curves part, it says which of them drifted.
//!
//! Records (experiment `pipeline`): torch's `train_step` per step and dtype beside the lab's;
//! `loss_curve` of the lab against torch f32 and torch f64 and of torch f32 against torch f64
//! (verdicts against 1%); `lr_schedule` (the learning rates, which both compute from the same
//! formula: they must agree to f32 rounding).

use super::trainer::{StepStats, Trainer};
use crate::experiment::{Measurement, Session};
use crate::ops::compare::compare;
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance, Verdict};
use crate::{LabError, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const SCRIPT: &str = include_str!("../../peers/torch_train.py");

/// Whether a record compares two training runs (the lab's curve against torch's): it judges a
/// trajectory, not a kernel's output, and the report's verification of kernels leaves it out.
pub fn compares_runs(r: &crate::record::Record) -> bool {
    r.experiment == "pipeline" && matches!(r.variant.as_str(), "loss_curve" | "lr_schedule")
}

/// Steps compared (and trained by torch): the first 200, or all of a shorter run.
pub const COMPARED_STEPS: usize = 200;
/// The lab's loss against torch's: f32 sums in another order drift apart as training goes on,
/// within 1% of the loss.
pub const LOSS: Tolerance = Tolerance { atol: 0.0, rtol: 0.01 };
/// The learning rate: one formula on both sides, f32 rounding apart.
pub const LR: Tolerance = Tolerance { atol: 0.0, rtol: 1e-6 };

/// The precisions torch trains in (name, torch dtype, attention rounded to bf16): f32 as the lab
/// does, f64, the trajectory exact arithmetic takes, which tells how far each f32 run has drifted
/// once they part, and, when the lab's attention ran in bf16, f32 with torch's rounded alike.
const RUNS: [(&str, &str, bool); 3] = [("f32", "float32", false), ("f64", "float64", false), ("f32_attention_bf16", "float32", true)];

/// What a run reported for one step.
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
pub struct Step {
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub ms: f64,
}

/// The lab's losses against each torch run (name of [`RUNS`], comparison).
#[derive(Clone, Debug)]
pub struct Outcome {
    pub runs: Vec<(&'static str, ErrorStats)>,
}

/// The torch run's inputs under the pipeline's output folder, and the request naming them.
pub struct TorchPeer {
    init: PathBuf,
    batches: PathBuf,
    request: Value,
    steps: usize,
    /// The lab trained with its attention in bf16 (on the GPU): torch then also trains with its
    /// attention's inputs and output rounded to bf16, and that run is the bar's reference.
    pub attention_bf16: bool,
}

fn fail(why: String) -> LabError {
    LabError::Peer { peer: "torch".into(), why }
}

impl TorchPeer {
    /// Before any work: the Python the peers use (`LAB_PYTHON`, else `python3`) imports torch and
    /// safetensors, and the files the peer writes under `out` are new.
    pub fn check(out: &Path) -> Result<Self> {
        let (init, batches) = (out.join("init.safetensors"), out.join("torch_batches.safetensors"));
        if let Some(f) = [&init, &batches].into_iter().find(|f| f.exists()) {
            return Err(LabError::Invalid(format!("{} exists: the pipeline writes only new files (choose another --out or remove it)", f.display())));
        }
        let python = crate::experiment::peers::python();
        let done = std::process::Command::new(&python).args(["-c", "import torch, safetensors"]).output().map_err(|e| fail(format!("cannot start `{python}`: {e}")))?;
        if !done.status.success() {
            let err = String::from_utf8_lossy(&done.stderr);
            let last = err.lines().last().unwrap_or_default();
            return Err(fail(format!("`{python}` cannot import torch and safetensors ({last}): install them (`pip install torch safetensors`) or point LAB_PYTHON at a Python that has them")));
        }
        Ok(TorchPeer { init, batches, request: Value::Null, steps: 0, attention_bf16: false })
    }

    /// Writes the trainer's checkpoint at step 0 and the batches of its first steps (its stream
    /// replayed from where it stands), before it trains.
    pub fn write_inputs(&mut self, t: &Trainer) -> Result<()> {
        self.steps = t.opt.steps.min(COMPARED_STEPS);
        let mut stream = t.stream.clone();
        let mut ids = Vec::with_capacity(self.steps * t.rows * (t.seq + 1));
        for _ in 0..self.steps {
            ids.extend(stream.next_batch(t.rows, t.seq)?.tokens);
        }
        // I32: every id of a vocabulary under 2^31, and a dtype every torch loads.
        let bytes: Vec<u8> = ids.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![self.steps, t.rows, t.seq + 1], &bytes).map_err(|e| fail(format!("batches: {e}")))?;
        let file = safetensors::serialize([("tokens", view)], None).map_err(|e| fail(format!("batches: {e}")))?;
        crate::weights::write_new(&self.batches, &file)?;
        t.save(&self.init)?;
        self.request = json!({"init": self.init, "batches": self.batches, "config": t.model.layout.config, "optimizer": t.opt});
        Ok(())
    }

    /// Runs the torch training in f32 and in f64, records their steps and the comparisons in
    /// `s`, and returns the lab's; an error (after the records are written) when the lab's curve
    /// differs from either beyond [`LOSS`] or its schedule beyond [`LR`].
    pub fn compare(&self, s: &mut Session, lab: &[StepStats], params: &dyn Fn(Value) -> Value, flops: u64) -> Result<Outcome> {
        self.compare_with(&crate::experiment::peers::python(), SCRIPT, s, lab, params, flops)
    }

    fn compare_with(&self, python: &str, script_text: &str, s: &mut Session, lab: &[StepStats], params: &dyn Fn(Value) -> Value, flops: u64) -> Result<Outcome> {
        if self.request.is_null() {
            return Err(fail("the torch run was asked for before its inputs were written".into()));
        }
        let dir = tempfile::tempdir().map_err(|e| fail(format!("no temp dir: {e}")))?;
        let script = dir.path().join("torch_train.py");
        std::fs::write(&script, script_text).map_err(|e| fail(e.to_string()))?;
        let n = self.steps.min(lab.len());
        let mut runs = Vec::new();
        for (dtype, torch_dtype, attention_bf16) in RUNS {
            if attention_bf16 && !self.attention_bf16 {
                continue;
            }
            let mut request = self.request.clone();
            request["dtype"] = torch_dtype.into();
            if attention_bf16 {
                request["attention"] = "bfloat16".into();
            }
            let reply = crate::experiment::peers::call_python("torch", python, &script, &request)?;
            let steps: Vec<Step> = serde_json::from_value(reply["steps"].clone()).map_err(|e| fail(format!("reply's `steps`: {e}")))?;
            let peer = json!({"peer_torch": reply["torch"], "peer_device": reply["device"]}).as_object().expect("an object").clone();
            for (i, st) in steps.iter().enumerate() {
                let mut m = Measurement::new("train_step", "torch", &params(json!({"step": i, "dtype": dtype})), Work { bytes: 0, flops });
                m.time = Some(super::pipeline::host_timing(vec![st.ms]));
                m.extra = json!({"loss": st.loss, "lr": st.lr, "grad_norm": st.grad_norm}).as_object().expect("an object").clone();
                m.extra.extend(peer.clone());
                s.emit(m)?;
            }
            if steps.len() < n {
                return Err(fail(format!("torch in {dtype} returned {} steps of {n} (a loss of {:?} at its last)", steps.len(), steps.last().map(|s| s.loss))));
            }
            runs.push((dtype, steps, peer));
        }
        let lab: Vec<Step> = lab[..n].iter().map(|s| Step { loss: s.loss, lr: s.lr as f64, grad_norm: s.grad_norm, ms: 0.0 }).collect();
        let run = |name: &str| runs.iter().find(|r| r.0 == name).map(|r| &r.1[..n]);
        let (t32, t64) = (run("f32").expect("always run"), run("f64").expect("always run"));
        // The bar's reference: torch in the lab's own precision.
        let bar = if self.attention_bf16 { "f32_attention_bf16" } else { "f32" };
        let mut rows = vec![("loss_curve", "lab", "f32", &lab[..], t32, LOSS), ("lr_schedule", "lab", "f32", &lab[..], t32, LR), ("loss_curve", "lab", "f64", &lab[..], t64, LOSS)];
        // torch's own f32 run against exact arithmetic: how far an f32 trajectory drifts.
        rows.push(("loss_curve", "torch", "f64", t32, t64, LOSS));
        if let Some(tb) = run("f32_attention_bf16") {
            rows.push(("loss_curve", "lab", "f32_attention_bf16", &lab[..], tb, LOSS));
            // How far rounding the attention to bf16 alone moves torch's own run.
            rows.push(("loss_curve", "torch_attention_bf16", "f32", tb, t32, LOSS));
        }
        let (mut failed, mut outcome) = (None, Vec::new());
        for (name, provider, against, a, b, tol) in rows {
            let (loss, lr, grad) = judge(a, b);
            let e = if name == "lr_schedule" { lr } else { loss };
            let mut m = Measurement::new(name, provider, &params(json!({"compared_steps": n, "against": format!("torch {against}")})), Work::default());
            m.tolerance = Some(tol);
            m.error = Some(e.clone());
            m.extra = json!({"worst_step": e.worst_index, "grad_norm_max_rel": grad.max_rel, "grad_norm_worst_step": grad.worst_index, "bar": provider == "lab" && against == bar})
                .as_object()
                .expect("an object")
                .clone();
            m.extra.extend(runs[0].2.clone());
            // The bar: the lab against torch in its own precision, and on the CPU also f64 (the
            // trajectory exact arithmetic takes).
            let judged = provider == "lab" && (against == bar || (!self.attention_bf16 && against == "f64") || name == "lr_schedule");
            if s.emit(m)?.verdict != Verdict::Pass && judged && failed.is_none() {
                failed = Some((name, against, tol, e.clone()));
            }
            if provider == "lab" && name == "loss_curve" {
                outcome.push((against, e));
            }
        }
        if let Some((name, against, tol, e)) = failed {
            return Err(LabError::Invalid(format!(
                "{name}: the lab's training is {:.3}% from torch {against}'s at step {} (lab {:?}, torch {:?}; tolerance {}%)",
                100.0 * e.max_rel,
                e.worst_index.unwrap_or(0),
                e.worst_got,
                e.worst_expected,
                100.0 * tol.rtol
            )));
        }
        Ok(Outcome { runs: outcome })
    }
}

/// Loss, learning rate and gradient norm of run `a` against run `b`, step by step (the gradient
/// norms against the loss's tolerance, for the record only).
pub fn judge(a: &[Step], b: &[Step]) -> (ErrorStats, ErrorStats, ErrorStats) {
    let on = |f: fn(&Step) -> f64, tol| compare(&a.iter().map(f).collect::<Vec<_>>(), &b.iter().map(f).collect::<Vec<_>>(), tol, "torch");
    (on(|s| s.loss, LOSS), on(|s| s.lr, LR), on(|s| s.grad_norm, LOSS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::{Backend, RunOptions};
    use crate::train::optim::AdamW;

    fn opt() -> AdamW {
        AdamW { lr: 3e-3, min_lr: 3e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip: 1.0, warmup: 5, steps: 60 }
    }

    /// A falling curve of 60 steps as the lab reports it, and torch's the same to 0.1%.
    fn curves() -> (Vec<StepStats>, Vec<Step>) {
        let o = opt();
        let lab: Vec<StepStats> = (0..60).map(|i| StepStats { loss: 10.8 - 0.1 * i as f64, grad_norm: 2.0, lr: o.lr_at(i), tokens: 256 }).collect();
        let torch = lab.iter().map(|s| Step { loss: s.loss * 1.001, lr: s.lr as f64, grad_norm: s.grad_norm, ms: 1.0 }).collect();
        (lab, torch)
    }

    fn steps(lab: &[StepStats]) -> Vec<Step> {
        lab.iter().map(|s| Step { loss: s.loss, lr: s.lr as f64, grad_norm: s.grad_norm, ms: 0.0 }).collect()
    }

    #[test]
    fn curves_within_one_percent_pass_and_a_planted_fault_fails() {
        let (lab, torch) = curves();
        let lab = steps(&lab);
        let (loss, lr, _) = judge(&lab, &torch);
        assert!(loss.passed() && lr.passed(), "{loss:?} {lr:?}");
        assert!((loss.max_rel - 1e-3 / 1.001).abs() < 1e-9, "{loss:?}");
        // One step's loss 1.5% off is caught, and named.
        let mut off = torch.clone();
        off[37].loss *= 1.015;
        let (loss, _, _) = judge(&lab, &off);
        assert!(!loss.passed() && loss.worst_index == Some(37), "{loss:?}");
        // torch's scheduler stepped before its optimizer: every lr one step early.
        let o = opt();
        let early: Vec<Step> = torch.iter().enumerate().map(|(i, t)| Step { lr: o.lr_at(i + 1) as f64, ..*t }).collect();
        let (_, lr, _) = judge(&lab, &early);
        assert!(!lr.passed() && lr.worst_index == Some(0), "an lr one step early passed: {lr:?}");
    }

    /// Speaks torch_train.py's protocol without torch: replies with the steps the request carries,
    /// one of them scaled by the factor it names in the dtype it names.
    const STUB: &str = r#"
import json, sys
req = json.load(sys.stdin)
steps = req["steps"]
if req["dtype"] + req.get("attention", "") == req["off_in"]:
    steps[req["at"]]["loss"] *= req["factor"]
print("stub: training", file=sys.stderr)
print(json.dumps({"torch": "0.0-stub", "device": "cpu", "steps": steps}))
"#;

    fn run_stub(factor: f64, off_in: &str) -> (Result<Outcome>, Vec<crate::record::Record>) {
        run_stub_with(factor, off_in, false)
    }

    fn run_stub_with(factor: f64, off_in: &str, attention_bf16: bool) -> (Result<Outcome>, Vec<crate::record::Record>) {
        let (lab, torch) = curves();
        let dir = tempfile::tempdir().unwrap();
        let steps: Vec<Value> = torch.iter().map(|t| json!({"loss": t.loss, "lr": t.lr, "grad_norm": t.grad_norm, "ms": t.ms})).collect();
        let request = json!({"steps": steps, "at": 12, "factor": factor, "off_in": off_in});
        let peer = TorchPeer { init: dir.path().join("i"), batches: dir.path().join("b"), request, steps: 60, attention_bf16 };
        let mut s = Session::new(Backend::Cpu, RunOptions::new(dir.path(), 1)).unwrap();
        s.experiment = "pipeline";
        let got = peer.compare_with(&crate::experiment::peers::python(), STUB, &mut s, &lab, &|v| v, 1);
        (got, s.records.clone())
    }

    fn verdicts(records: &[crate::record::Record]) -> Vec<(String, String, Verdict)> {
        records.iter().filter(|r| r.variant != "train_step").map(|r| (r.variant.clone(), format!("{} vs {}", r.provider, r.params["against"].as_str().unwrap_or("?")), r.verdict)).collect()
    }

    #[test]
    fn both_torch_runs_are_recorded_beside_the_lab_and_a_far_curve_is_an_error() {
        let (got, records) = run_stub(1.0, "float32");
        let out = got.unwrap_or_else(|e| panic!("{e}"));
        assert!(out.runs.len() == 2 && out.runs.iter().all(|(_, e)| e.passed()), "{out:?}");
        for dtype in ["f32", "f64"] {
            let n = records.iter().filter(|r| r.variant == "train_step" && r.provider == "torch" && r.params["dtype"] == dtype).count();
            assert_eq!(n, 60, "{dtype}");
        }
        let pass = Verdict::Pass;
        let want = |v: [Verdict; 4]| {
            let names = [("loss_curve", "lab vs torch f32"), ("lr_schedule", "lab vs torch f32"), ("loss_curve", "lab vs torch f64"), ("loss_curve", "torch vs torch f64")];
            names.iter().zip(v).map(|((a, b), v)| (a.to_string(), b.to_string(), v)).collect::<Vec<_>>()
        };
        assert_eq!(verdicts(&records), want([pass; 4]));

        // The f32 run 2% off at step 12: the lab fails against it, not against f64, and says where.
        let (got, records) = run_stub(1.02, "float32");
        let e = got.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("loss_curve") && e.contains("torch f32's at step 12") && e.contains("tolerance 1%"), "{e}");
        assert_eq!(verdicts(&records), want([Verdict::Fail, pass, pass, Verdict::Fail]));
        // The f64 run off: the lab fails against it.
        let (got, records) = run_stub(1.02, "float64");
        assert!(got.err().map(|e| e.to_string()).unwrap_or_default().contains("torch f64's at step 12"));
        assert_eq!(verdicts(&records), want([pass, pass, Verdict::Fail, Verdict::Fail]));
    }

    /// With the lab's attention in bf16, torch trains a third time rounding its attention alike;
    /// that run is the bar: the lab apart from plain f32 and f64 is recorded but is no error, the
    /// lab apart from the bf16-attention run is.
    #[test]
    fn with_bf16_attention_the_bar_is_torch_rounded_alike() {
        let (got, records) = run_stub_with(1.02, "float32", true);
        let out = got.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.runs.len(), 3);
        let fail = Verdict::Fail;
        let want: Vec<(String, String, Verdict)> = [
            ("loss_curve", "lab vs torch f32", fail),
            ("lr_schedule", "lab vs torch f32", Verdict::Pass),
            ("loss_curve", "lab vs torch f64", Verdict::Pass),
            ("loss_curve", "torch vs torch f64", fail),
            ("loss_curve", "lab vs torch f32_attention_bf16", Verdict::Pass),
            ("loss_curve", "torch_attention_bf16 vs torch f32", fail),
        ]
        .iter()
        .map(|(a, b, v)| (a.to_string(), b.to_string(), *v))
        .collect();
        assert_eq!(verdicts(&records), want);
        let (got, _) = run_stub_with(1.02, "float32bfloat16", true);
        let e = got.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("torch f32_attention_bf16's at step 12"), "{e}");
    }
}
