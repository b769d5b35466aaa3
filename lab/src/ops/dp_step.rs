//! The `dp_step` experiment: the data-parallel training step of
//! [`crate::collective::data_parallel`] from one GPU to all the host's GPUs, each rank a fixed
//! batch of rows (weak scaling): step time with the bucketed gradient sums by ncclAllReduce or
//! by the lab's ring over NCCL send/recv, overlapped with the backward pass or after it, beside
//! the step without any sum (`compute_only`). Overlap gain = after-backward time / overlapped
//! time, same world, same reducer.
//!
//! The gate: a few steps on every world against one GPU training on the whole global batch
//! (losses within [`LOSS_RTOL`], weights within [`GATE_TOL`]: f32 sums in another order), and
//! one GPU against the CPU's single-process training of [`crate::collective::bucket`].
//! On the CPU backend the worlds are host groups whose sums run the lab's ring on threads.

use crate::collective::bucket::{losses_match, train_single, Mlp, Schedule, GATE_TOL, LOSS_RTOL, LR};
use crate::collective::data_parallel::{DataParallel, Reducer};
use crate::collective::group::Group;
use crate::collective::nccl::{gpus_for_nccl, world_sizes};
use crate::experiment::{param_timed, param_usize, Backend, Experiment, Measurement, Session};
use crate::ops::compare::compare;
use crate::profile::{host_time, Work};
use crate::{LabError, Result};
use serde_json::{json, Value};

pub struct DpStep;

const DIMS_GATE: [usize; 4] = [32, 64, 48, 16];

impl Experiment for DpStep {
    fn name(&self) -> &'static str {
        "dp_step"
    }
    fn description(&self) -> &'static str {
        "data-parallel MLP training step from 1 GPU to all: bucketed gradient sums (ncclAllReduce, lab NCCL ring) overlapped with backward or after it"
    }
    fn sweep_axis(&self) -> &'static str {
        "ranks"
    }
    fn sanitize_uninstrumented(&self, tool: crate::profile::sanitize::Tool) -> Option<&'static str> {
        crate::ops::nccl_allreduce::NcclAllReduce.sanitize_uninstrumented(tool)
    }
    fn sanitize_env(&self, tool: crate::profile::sanitize::Tool) -> &'static [(&'static str, &'static str)] {
        crate::ops::nccl_allreduce::NcclAllReduce.sanitize_env(tool)
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["bucket_mb=25.0"]
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        // 1024-4096-4096-1024 is 25M parameters (100 MB of gradients); 1024-8192-8192-1024, 84M.
        let (dims, rows, mbs): (&[usize], usize, &[f64]) = match (backend, quick) {
            (Backend::Cuda(_), false) => (&[1024, 8192, 8192, 1024], 128, &[5.0, 25.0, 100.0]),
            (Backend::Cuda(_), true) => (&[1024, 4096, 4096, 1024], 64, &[25.0]),
            (Backend::Cpu, _) => (&[64, 256, 256, 64], 8, &[0.25]),
        };
        // 0.002 MB buckets: several buckets even on the gate's small model.
        let mut cases = vec![json!({"dims": DIMS_GATE, "rows_per_rank": 3, "steps": 5, "bucket_mb": 0.002, "timed": false})];
        cases.extend(mbs.iter().map(|&mb| json!({"dims": dims, "rows_per_rank": rows, "bucket_mb": mb})));
        cases
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let dims: Vec<usize> = case
            .get("dims")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|v| v.as_u64().map(|v| v as usize)).collect())
            .ok_or_else(|| LabError::Invalid(format!("case {case} has no `dims` list")))?;
        let rows = param_usize(case, "rows_per_rank")?;
        let mb = case.get("bucket_mb").and_then(Value::as_f64).unwrap_or(25.0);
        let bucket_bytes = ((mb * (1 << 20) as f64) as usize).max(1);
        for n in worlds(&s.backend) {
            if param_timed(case) {
                timed(s, case, &dims, rows, bucket_bytes, n)?;
            } else {
                gate(s, case, &dims, rows, bucket_bytes, n)?;
            }
        }
        Ok(())
    }
}

fn worlds(backend: &Backend) -> Vec<usize> {
    match (backend, gpus_for_nccl(backend)) {
        (Backend::Cpu, _) => vec![1, 2, 3],
        (_, Ok(count)) => world_sizes(count),
        (_, Err(why)) => {
            eprintln!("note: dp_step: {why}; one GPU only");
            vec![1]
        }
    }
}

/// The schedules a world runs: (variant, reducer, overlap); one rank has nothing to sum.
fn schedules(g: &Group) -> Vec<(String, Reducer, bool)> {
    if g.size() == 1 {
        return Vec::new();
    }
    let reducers: &[Reducer] = if g.world.is_some() { &[Reducer::Nccl, Reducer::Ring, Reducer::PeerRing] } else { &[Reducer::Nccl] };
    let label = |r: Reducer| if g.world.is_some() { r.name() } else { "threads" };
    reducers.iter().flat_map(|&r| [(format!("{}_after_backward", label(r)), r, false), (format!("{}_overlap", label(r)), r, true)]).collect()
}

fn provider(reducer: Reducer, g: &Group) -> &'static str {
    if reducer == Reducer::Nccl && g.world.is_some() {
        "nccl"
    } else {
        "lab"
    }
}

fn work(dims: &[usize], rows: usize, n: usize) -> Work {
    let params = Mlp::count(dims);
    // Forward, and backward's two products per layer, over every rank's rows; the gradient's bytes.
    Work { bytes: 4 * params as u64, flops: 6 * (params * rows * n) as u64 }
}

fn with_ranks(case: &Value, n: usize) -> Value {
    let mut p = case.clone();
    p["ranks"] = n.into();
    p
}

fn train(g: Group, dims: &[usize], rows: usize, how: Schedule, reducer: Reducer, steps: usize, seed: u64) -> Result<(Vec<f64>, Vec<Vec<f32>>)> {
    let mut dp = DataParallel::new(g, dims, rows, LR, how, reducer, seed)?;
    let losses = (0..steps).map(|k| dp.step(k)).collect::<Result<_>>()?;
    Ok((losses, dp.params()?))
}

/// Losses and every rank's weights against a reference run, as one comparison.
fn against(losses: &[f64], params: &[Vec<f32>], want: &(Vec<f64>, Vec<f32>), reference: &str) -> crate::record::ErrorStats {
    let flat = |l: &[f64], p: &[f32]| -> Vec<f64> { l.iter().copied().chain(p.iter().map(|&v| v as f64)).collect() };
    let expected = flat(&want.0, &want.1);
    params
        .iter()
        .map(|p| {
            let mut e = compare(&flat(losses, p), &expected, GATE_TOL, reference);
            if !losses_match(losses, &want.0, LOSS_RTOL) {
                e.mismatches = e.mismatches.max(1);
            }
            e
        })
        .reduce(crate::ops::compare::first_failure)
        .expect("at least one rank")
}

fn gate(s: &mut Session, case: &Value, dims: &[usize], rows: usize, bucket_bytes: usize, n: usize) -> Result<()> {
    let steps = param_usize(case, "steps")?;
    let seed = s.opts.seed;
    let how = Schedule { bucket_bytes, overlap: true };
    // One device with the whole global batch: the reference of every world.
    let one = train(Group::on(&s.backend, 1)?, dims, rows * n, how, Reducer::Nccl, steps, seed)?;
    let one = (one.0, one.1.into_iter().next().expect("one rank"));
    if n == 1 {
        if s.wants("one_device", "lab") {
            let cpu = train_single(dims, rows, LR, steps, seed)?;
            let mut m = Measurement::new("one_device", "lab", &with_ranks(case, 1), work(dims, rows, 1));
            m.error = Some(against(&one.0, std::slice::from_ref(&one.1), &cpu, "cpu single-process training"));
            m.tolerance = Some(GATE_TOL);
            m.extra.insert("losses".into(), json!(one.0));
            s.emit(m)?;
        }
        return Ok(());
    }
    let g = Group::on(&s.backend, n)?;
    for (variant, reducer, overlap) in schedules(&g) {
        let p = provider(reducer, &g);
        if !s.wants(&variant, p) {
            continue;
        }
        let (losses, params) = train(Group::on(&s.backend, n)?, dims, rows, Schedule { bucket_bytes, overlap }, reducer, steps, seed)?;
        let mut m = Measurement::new(variant, p, &with_ranks(case, n), work(dims, rows, n));
        m.error = Some(against(&losses, &params, &one, "one device, whole batch"));
        m.tolerance = Some(GATE_TOL);
        m.extra.insert("losses".into(), json!(losses));
        m.extra.insert("one_device_losses".into(), json!(one.0));
        m.extra.insert("ranks_identical".into(), params.iter().all(|p| p == &params[0]).into());
        s.emit(m)?;
    }
    Ok(())
}

fn timed(s: &mut Session, case: &Value, dims: &[usize], rows: usize, bucket_bytes: usize, n: usize) -> Result<()> {
    let seed = s.opts.seed;
    let params = with_ranks(case, n);
    let g = Group::on(&s.backend, n)?;
    let mut runs: Vec<(String, Reducer, bool)> = vec![("compute_only".into(), Reducer::Nccl, false)];
    runs.extend(schedules(&g));
    let mut after_ms = std::collections::HashMap::new();
    let mut compute_ms = None;
    for (variant, reducer, overlap) in runs {
        let p = if variant == "compute_only" { "lab" } else { provider(reducer, &g) };
        if !s.wants(&variant, p) {
            continue;
        }
        let mut dp = DataParallel::new(Group::on(&s.backend, n)?, dims, rows, LR, Schedule { bucket_bytes, overlap }, reducer, seed)?;
        if variant == "compute_only" {
            // Every bucket left unsummed: the step without communication.
            dp.skip_all_buckets();
        }
        let mut loss = dp.step(0)?;
        let time = host_time(&s.budget, || Ok::<(), LabError>(()), || {
            // The same batch every repetition: drawing a batch on the host is not the step.
            loss = dp.step(0)?;
            dp.g.sync()
        })?;
        if !loss.is_finite() {
            return Err(LabError::Invalid(format!("dp_step {variant}: the loss became {loss}; lower the learning rate")));
        }
        let ms = time.0.median;
        let mut m = Measurement::new(&variant, p, &params, work(dims, rows, n));
        m.extra.insert("step_ms".into(), ms.into());
        m.extra.insert("buckets".into(), dp.buckets().len().into());
        m.extra.insert("grad_bytes".into(), (4 * Mlp::count(dims)).into());
        m.extra.insert("samples_per_s".into(), ((rows * n) as f64 / (ms * 1e-3)).into());
        m.extra.insert("loss".into(), loss.into());
        match (variant.as_str(), overlap) {
            ("compute_only", _) => compute_ms = Some(ms),
            (_, false) => _ = after_ms.insert(reducer.name(), ms),
            (_, true) => {
                if let Some(after) = after_ms.get(reducer.name()) {
                    m.extra.insert("overlap_gain".into(), (after / ms).into());
                }
            }
        }
        if let (Some(c), false) = (compute_ms, variant == "compute_only") {
            m.extra.insert("exposed_comm_ms".into(), (ms - c).into());
        }
        m.time = Some(time);
        s.emit(m)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::RunOptions;

    #[test]
    fn the_quick_sweep_passes_on_host_groups() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = RunOptions::new(dir.path(), 7);
        opts.quick = true;
        let mut s = Session::new(Backend::Cpu, opts).unwrap();
        s.run(&DpStep, &DpStep.cases(&Backend::Cpu, true)).unwrap();
        let variants: std::collections::BTreeSet<&str> = s.records.iter().map(|r| r.variant.as_str()).collect();
        assert_eq!(variants, ["compute_only", "one_device", "threads_after_backward", "threads_overlap"].into());
        for r in &s.records {
            assert_eq!(r.verdict, crate::record::Verdict::Pass, "{} {:?} {:?}", r.variant, r.params, r.error);
        }
        assert!(s.records.iter().any(|r| r.extra.contains_key("overlap_gain")));
    }
}
