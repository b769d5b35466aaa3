//! `lab pipeline --peers torch`: the same training in PyTorch (`lab/peers/torch_train.py`, plain
//! torch ops, `torch.optim.AdamW`, a `LambdaLR` of the lab's schedule, `clip_grad_norm_`) from
//! the trainer's checkpoint at step 0 and the very batches the trainer takes, and the bar the
//! trainer is held to: its loss within 1% of torch's at every one of the first 200 steps.
//!
//! Records (experiment `pipeline`): torch's `train_step` per step beside the lab's, `loss_curve`
//! (the lab's losses against torch's, verdict against 1%) and `lr_schedule` (the learning rates,
//! which both compute from the same formula: they must agree to f32 rounding).

use super::trainer::{StepStats, Trainer};
use crate::experiment::{Measurement, Session};
use crate::ops::compare::compare;
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance, Verdict};
use crate::{LabError, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const SCRIPT: &str = include_str!("../../peers/torch_train.py");

/// Steps compared (and trained by torch): the first 200, or all of a shorter run.
pub const COMPARED_STEPS: usize = 200;
/// The lab's loss against torch's: f32 sums in another order drift apart as training goes on,
/// within 1% of the loss.
pub const LOSS: Tolerance = Tolerance { atol: 0.0, rtol: 0.01 };
/// The learning rate: one formula on both sides, f32 rounding apart.
pub const LR: Tolerance = Tolerance { atol: 0.0, rtol: 1e-6 };

/// What torch reported for one step.
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
pub struct TorchStep {
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub ms: f64,
}

/// The torch run's inputs under the pipeline's output folder, and the request naming them.
pub struct TorchPeer {
    init: PathBuf,
    batches: PathBuf,
    request: Value,
    steps: usize,
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
        Ok(TorchPeer { init, batches, request: Value::Null, steps: 0 })
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

    /// Runs the torch training, records its steps and both comparisons in `s`, and returns the
    /// loss comparison; an error (after the records are written) when the curves differ beyond
    /// [`LOSS`] or the schedules beyond [`LR`].
    pub fn compare(&self, s: &mut Session, lab: &[StepStats], params: &dyn Fn(Value) -> Value, flops: u64) -> Result<ErrorStats> {
        self.compare_with(&crate::experiment::peers::python(), SCRIPT, s, lab, params, flops)
    }

    fn compare_with(&self, python: &str, script_text: &str, s: &mut Session, lab: &[StepStats], params: &dyn Fn(Value) -> Value, flops: u64) -> Result<ErrorStats> {
        if self.request.is_null() {
            return Err(fail("the torch run was asked for before its inputs were written".into()));
        }
        let dir = tempfile::tempdir().map_err(|e| fail(format!("no temp dir: {e}")))?;
        let script = dir.path().join("torch_train.py");
        std::fs::write(&script, script_text).map_err(|e| fail(e.to_string()))?;
        let reply = crate::experiment::peers::call_python("torch", python, &script, &self.request)?;
        let steps: Vec<TorchStep> = serde_json::from_value(reply["steps"].clone()).map_err(|e| fail(format!("reply's `steps`: {e}")))?;
        let peer_extra = json!({"peer_torch": reply["torch"], "peer_device": reply["device"]});
        for (i, st) in steps.iter().enumerate() {
            let mut m = Measurement::new("train_step", "torch", &params(json!({"step": i})), Work { bytes: 0, flops });
            m.time = Some(super::pipeline::host_timing(vec![st.ms]));
            m.extra = json!({"loss": st.loss, "lr": st.lr, "grad_norm": st.grad_norm}).as_object().expect("an object").clone();
            m.extra.extend(peer_extra.as_object().cloned().unwrap_or_default());
            s.emit(m)?;
        }
        let n = self.steps.min(lab.len());
        if steps.len() < n {
            return Err(fail(format!("torch returned {} steps of {n} (a loss of {:?} at its last)", steps.len(), steps.last().map(|s| s.loss))));
        }
        let (loss, lr) = judge(&lab[..n], &steps[..n]);
        let grad_norm = compare(&lab[..n].iter().map(|s| s.grad_norm).collect::<Vec<_>>(), &steps[..n].iter().map(|s| s.grad_norm).collect::<Vec<_>>(), LOSS, "torch");
        let mut verdicts = Vec::new();
        for (name, tol, e) in [("loss_curve", LOSS, &loss), ("lr_schedule", LR, &lr)] {
            let mut m = Measurement::new(name, "lab", &params(json!({"compared_steps": n})), Work::default());
            m.tolerance = Some(tol);
            m.error = Some(e.clone());
            let worst = e.worst_index.map(|i| i as usize);
            m.extra = json!({"worst_step": worst, "grad_norm_max_rel": grad_norm.max_rel, "grad_norm_worst_step": grad_norm.worst_index}).as_object().expect("an object").clone();
            m.extra.extend(peer_extra.as_object().cloned().unwrap_or_default());
            verdicts.push((name, s.emit(m)?.verdict, e.clone()));
        }
        if let Some((name, _, e)) = verdicts.iter().find(|v| v.1 != Verdict::Pass) {
            return Err(LabError::Invalid(format!(
                "{name}: the lab's training is {:.3}% from torch's at step {} (lab {:?}, torch {:?}; tolerance {}%)",
                100.0 * e.max_rel,
                e.worst_index.unwrap_or(0),
                e.worst_got,
                e.worst_expected,
                100.0 * if *name == "loss_curve" { LOSS.rtol } else { LR.rtol }
            )));
        }
        Ok(loss)
    }
}

/// The lab's losses and learning rates against torch's, step by step.
pub fn judge(lab: &[StepStats], torch: &[TorchStep]) -> (ErrorStats, ErrorStats) {
    let col = |f: &dyn Fn(usize) -> f64| (0..lab.len()).map(f).collect::<Vec<f64>>();
    let loss = compare(&col(&|i| lab[i].loss), &col(&|i| torch[i].loss), LOSS, "torch");
    let lr = compare(&col(&|i| lab[i].lr as f64), &col(&|i| torch[i].lr), LR, "torch");
    (loss, lr)
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
    fn curves() -> (Vec<StepStats>, Vec<TorchStep>) {
        let o = opt();
        let lab: Vec<StepStats> = (0..60).map(|i| StepStats { loss: 10.8 - 0.1 * i as f64, grad_norm: 2.0, lr: o.lr_at(i), tokens: 256 }).collect();
        let torch = lab.iter().map(|s| TorchStep { loss: s.loss * 1.001, lr: s.lr as f64, grad_norm: s.grad_norm, ms: 1.0 }).collect();
        (lab, torch)
    }

    #[test]
    fn curves_within_one_percent_pass_and_a_planted_fault_fails() {
        let (lab, torch) = curves();
        let (loss, lr) = judge(&lab, &torch);
        assert!(loss.passed() && lr.passed(), "{loss:?} {lr:?}");
        assert!((loss.max_rel - 1e-3 / 1.001).abs() < 1e-9, "{loss:?}");
        // One step's loss 1.5% off is caught, and named.
        let mut off = torch.clone();
        off[37].loss *= 1.015;
        let (loss, _) = judge(&lab, &off);
        assert!(!loss.passed() && loss.worst_index == Some(37), "{loss:?}");
        // torch's scheduler stepped before its optimizer: every lr one step early.
        let o = opt();
        let early: Vec<TorchStep> = torch.iter().enumerate().map(|(i, t)| TorchStep { lr: o.lr_at(i + 1) as f64, ..*t }).collect();
        let (_, lr) = judge(&lab, &early);
        assert!(!lr.passed() && lr.worst_index == Some(0), "an lr one step early passed: {lr:?}");
    }

    /// Speaks torch_train.py's protocol without torch: replies with the steps the request carries,
    /// one of them scaled by the factor it names.
    const STUB: &str = r#"
import json, sys
req = json.load(sys.stdin)
steps = req["steps"]
steps[req["at"]]["loss"] *= req["factor"]
print("stub: training", file=sys.stderr)
print(json.dumps({"torch": "0.0-stub", "device": "cpu", "steps": steps}))
"#;

    fn run_stub(factor: f64) -> (Result<ErrorStats>, Vec<crate::record::Record>) {
        let (lab, torch) = curves();
        let dir = tempfile::tempdir().unwrap();
        let steps: Vec<Value> = torch.iter().map(|t| json!({"loss": t.loss, "lr": t.lr, "grad_norm": t.grad_norm, "ms": t.ms})).collect();
        let peer = TorchPeer { init: dir.path().join("i"), batches: dir.path().join("b"), request: json!({"steps": steps, "at": 12, "factor": factor}), steps: 60 };
        let mut s = Session::new(Backend::Cpu, RunOptions::new(dir.path(), 1)).unwrap();
        s.experiment = "pipeline";
        let got = peer.compare_with(&crate::experiment::peers::python(), STUB, &mut s, &lab, &|v| v, 1);
        (got, s.records.clone())
    }

    #[test]
    fn the_torch_run_is_recorded_beside_the_lab_and_a_far_curve_is_an_error() {
        let (got, records) = run_stub(1.0);
        let loss = got.unwrap_or_else(|e| panic!("{e}"));
        assert!(loss.passed());
        let torch_steps = records.iter().filter(|r| r.variant == "train_step" && r.provider == "torch").count();
        assert_eq!(torch_steps, 60);
        let verdicts: Vec<_> = records.iter().filter(|r| r.provider == "lab").map(|r| (r.variant.as_str(), r.verdict)).collect();
        assert_eq!(verdicts, [("loss_curve", Verdict::Pass), ("lr_schedule", Verdict::Pass)]);

        let (got, records) = run_stub(1.02);
        let e = got.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("loss_curve") && e.contains("at step 12") && e.contains("tolerance 1%"), "{e}");
        let curve = records.iter().find(|r| r.variant == "loss_curve").expect("the loss_curve record is written before the error");
        assert_eq!(curve.verdict, Verdict::Fail);
    }
}
