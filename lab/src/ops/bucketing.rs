//! The `bucketing` experiment: data-parallel training of the MLP of [`crate::collective::bucket`]
//! on the launched MPI world or on thread worlds, its step time with the bucketed gradient
//! all-reduce overlapped with the backward pass or after it, by bucket size; and a gate against
//! single-process training.

use crate::collective::bucket::{buckets, train_parallel, train_single, Mlp, Schedule, Trainer, GATE_TOL, LR};
use crate::collective::ring::Algorithm;
use crate::collective::transport::Transport;
use crate::experiment::{param_timed, param_usize, Backend, Experiment, Measurement, RunOptions, Session};
use crate::ops::allreduce::{follow_case_with, ranks_identical, run_case_with, time_collective, Ctx};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::{LabError, Result};
use serde_json::{json, Value};

/// The `bucketing` experiment: step time of data-parallel MLP training with and without overlap,
/// by bucket size, on the launched MPI world or on thread worlds.
pub struct Bucketing;

/// MLP widths of the timed cases (1024-4096-4096-1024: 24M parameters, 96 MB of gradients).
const DIMS: [usize; 4] = [1024, 4096, 4096, 1024];
const DIMS_QUICK: [usize; 4] = [256, 1024, 1024, 256];
/// The correctness gate: small enough for a single-process reference, several buckets.
const DIMS_GATE: [usize; 4] = [32, 64, 48, 16];

impl Experiment for Bucketing {
    fn name(&self) -> &'static str {
        "bucketing"
    }
    fn description(&self) -> &'static str {
        "data-parallel MLP step time: bucketed gradient all-reduce overlapped with backward vs after it"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["bucket_mb=25.0"]
    }
    fn sweep_axis(&self) -> &'static str {
        "bucket_mb"
    }
    fn cases(&self, _: &Backend, quick: bool) -> Vec<Value> {
        let (worlds, transport) = match crate::collective::launched().ok().flatten() {
            Some(t) => (vec![t.size()], "mpi"),
            None => (if quick { vec![2, 4] } else { vec![2] }, "threads"),
        };
        let (dims, rows, mbs): (&[usize], usize, &[f64]) =
            if quick { (&DIMS_QUICK, 8, &[0.25, 1.0, 4.0]) } else { (&DIMS, 16, &[1.0, 5.0, 25.0, 100.0]) };
        let mut cases = Vec::new();
        for &n in &worlds {
            let base = json!({"ranks": n, "transport": transport});
            let with = |extra: Value| {
                let mut c = base.clone();
                c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
                c
            };
            // 0.002 MB buckets: several buckets even on the gate's small model.
            cases.push(with(json!({"dims": DIMS_GATE, "rows_per_rank": 3, "steps": 5, "bucket_mb": 0.002, "timed": false})));
            cases.push(with(json!({"dims": dims, "rows_per_rank": rows, "bucket_mb": 0.0})));
            for &mb in mbs {
                cases.push(with(json!({"dims": dims, "rows_per_rank": rows, "bucket_mb": mb})));
            }
        }
        cases
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        run_case_with(s, case, measure)
    }
    fn follow_case(&self, opts: &RunOptions, case: &Value) -> Result<()> {
        follow_case_with(opts, case, measure)
    }
}

fn dims_of(case: &Value) -> Result<Vec<usize>> {
    case.get("dims")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|v| v.as_u64().map(|v| v as usize)).collect::<Option<Vec<_>>>())
        .ok_or_else(|| LabError::Invalid(format!("case {case} has no `dims` list")))
}

fn measure(t: &dyn Transport, ctx: &Ctx, case: &Value) -> Result<Vec<Measurement>> {
    let (n, dims, rows) = (t.size(), dims_of(case)?, param_usize(case, "rows_per_rank")?);
    let mb = case.get("bucket_mb").and_then(Value::as_f64).unwrap_or(25.0);
    let bucket_bytes = (mb * (1 << 20) as f64) as usize;
    let params = Mlp::count(&dims);
    let work = Work { bytes: 4 * params as u64, flops: 6 * (params * rows) as u64 };
    let mut out = Vec::new();
    if !param_timed(case) {
        // The gate: data-parallel losses and final parameters against single-process training
        // on the whole global batch.
        let steps = param_usize(case, "steps")?;
        let reference = if t.rank() == 0 { Some(train_single(&dims, rows * n, LR, steps, ctx.seed)?) } else { None };
        for (variant, overlap) in [("overlap", true), ("after_backward", false)] {
            if !ctx.wants(variant, "lab") {
                continue;
            }
            let how = Schedule { bucket_bytes, overlap };
            let (losses, params) = train_parallel(t, &dims, rows, LR, steps, how, ctx.seed)?;
            let same = ranks_identical(t, crate::collective::transport::bytes_of(&params))?;
            let mut m = Measurement::new(variant, "lab", case, work);
            if let Some((want_losses, want_params)) = &reference {
                let got: Vec<f64> = losses.iter().copied().chain(params.iter().map(|&p| p as f64)).collect();
                let want: Vec<f64> = want_losses.iter().copied().chain(want_params.iter().map(|&p| p as f64)).collect();
                m.error = Some(crate::ops::compare::compare(&got, &want, GATE_TOL, "single-process"));
                m.extra.insert("losses".into(), json!(losses));
                m.extra.insert("single_process_losses".into(), json!(want_losses));
            }
            m.tolerance = Some(GATE_TOL);
            m.extra.insert("ranks_identical".into(), same.into());
            m.extra.insert("buckets".into(), buckets(&Mlp::new(&dims, 0).tensors(), bucket_bytes).len().into());
            out.push(m);
        }
        return Ok(out);
    }
    let variants: &[(&str, bool)] = if bucket_bytes == 0 { &[("compute_only", false)] } else { &[("overlap", true), ("after_backward", false)] };
    for &(variant, overlap) in variants {
        if !ctx.wants(variant, "lab") {
            continue;
        }
        let how = Schedule { bucket_bytes: bucket_bytes.max(1), overlap };
        let mut tr = Trainer::new(t, &dims, rows, LR, how, ctx.seed)?;
        let mut m = Measurement::new(variant, "lab", case, work);
        let reduce = variant != "compute_only";
        if reduce {
            // Step 0's bucketed gradient against one flat all-reduce of the same local gradients.
            tr.gradients(0, false)?;
            let mut flat = tr.grads.clone();
            crate::collective::all_reduce(t, &mut flat, Algorithm::SendRecv)?;
            tr.gradients(0, true)?;
            if t.rank() == 0 {
                // The same sums in another order: (n-1) f32 roundings of partial sums no larger
                // than n times the largest gradient.
                let largest = flat.iter().fold(0f32, |m, g| m.max(g.abs())) as f64;
                let tol = Tolerance { atol: (n * n) as f64 * 6e-8 * largest, rtol: 1e-6 };
                m.error = Some(crate::ops::compare::compare(&crate::ops::widen(&tr.grads), &crate::ops::widen(&flat), tol, "flat-allreduce"));
                m.tolerance = Some(tol);
            }
        }
        let mut k = 0;
        let losses = std::cell::RefCell::new(Vec::new());
        let time = time_collective(t, &ctx.budget, || (), || {
            k += 1;
            if reduce {
                losses.borrow_mut().push(tr.step(k)?);
            } else {
                tr.gradients(k, false)?;
            }
            Ok(())
        })?;
        m.extra.insert("step_ms".into(), time.0.median.into());
        m.extra.insert("buckets".into(), if reduce { tr.buckets().len() } else { 0 }.into());
        m.extra.insert("grad_bytes".into(), (4 * params).into());
        let losses = losses.into_inner();
        if let (Some(a), Some(b)) = (losses.first(), losses.last()) {
            m.extra.insert("loss_first_last".into(), json!([a, b]));
        }
        // Training that blew up would time NaN arithmetic: not a figure of a training step.
        if losses.iter().any(|l| !l.is_finite()) {
            return Err(LabError::Invalid(format!("{variant}: the loss became {:?}; lower the learning rate", losses.last())));
        }
        m.time = Some(time);
        out.push(m);
    }
    Ok(out)
}
