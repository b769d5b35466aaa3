//! Collectives under a real `mpirun` (Open MPI): built with `--features mpi` only. A missing
//! `mpirun` fails these tests; it is never a reason to skip them.
#![cfg(feature = "mpi")]

use lab::record::{read_records, Record, Verdict};
use std::path::Path;
use std::process::{Command, Output};

/// `mpirun --oversubscribe -n N lab ARGS`: more ranks than cores is fine for correctness, and
/// the suite may run as root (Open MPI refuses that unless told).
fn mpirun(n: usize, args: &[&str]) -> Output {
    Command::new("mpirun")
        .args(["--oversubscribe", "-n", &n.to_string(), env!("CARGO_BIN_EXE_lab")])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Containers often forbid the cross-memory attach Open MPI's shared-memory transport
        // uses for large messages (open-mpi/ompi#4948); copying through shared memory always works.
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .output()
        .expect("mpirun (Open MPI) must be installed to test the collectives: apt-get install openmpi-bin libopenmpi-dev")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// One run file (rank 0 alone writes), and its records.
fn only_run(dir: &Path) -> Vec<Record> {
    let files: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert_eq!(files.len(), 1, "exactly one rank writes records: {files:?}");
    let (records, damage) = read_records(dir).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    records
}

fn check_world(n: usize) {
    let o = mpirun(n, &["collective-check", "--seed", "5"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    // Every algorithm and dtype on awkward lengths, and f32 against MPI_Allreduce.
    for alg in ["ring_blocking", "ring_sendrecv", "ring_pipelined"] {
        for dtype in ["f32", "f16", "bf16"] {
            for len in [0, 1, n - 1, n + 1, 1001, 65537] {
                let line = format!("ok {alg} {dtype} len {len} on {n} ranks (mpi)");
                assert!(out.contains(&line), "missing `{line}`:\n{out}");
            }
        }
    }
    assert_eq!(out.matches("vs MPI_Allreduce").count(), 6 * 4, "{out}");
    assert!(out.contains("ok mismatched lengths: all-reduce lengths differ across ranks"), "{out}");
}

#[test]
fn ring_allreduce_matches_mpi_allreduce_on_2_ranks() {
    check_world(2);
}

#[test]
fn ring_allreduce_matches_mpi_allreduce_on_4_ranks() {
    check_world(4);
}

fn allreduce_run(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let o = mpirun(n, &["run", "allreduce", "--quick", "--seed", "9", "--out", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let records = only_run(dir.path());
    let providers: std::collections::BTreeSet<_> = records.iter().map(|r| (r.provider.as_str(), r.variant.as_str())).collect();
    for p in [("lab", "ring_blocking"), ("lab", "ring_sendrecv"), ("lab", "ring_pipelined"), ("mpi", "MPI_Allreduce")] {
        assert!(providers.contains(&p), "no {p:?} records: {providers:?}");
    }
    for r in &records {
        assert_eq!(r.verdict, Verdict::Pass, "{} {} {}: {:?}", r.variant, r.provider, r.params, r.error);
        assert_eq!((r.params["ranks"].as_u64(), r.params["transport"].as_str()), (Some(n as u64), Some("mpi")));
        assert!(r.error.is_some(), "every figure is checked against the f64 sum");
        assert_eq!(r.extra["ranks_identical"], true, "{} {}", r.variant, r.params);
        if r.time_ms.is_some() {
            let (alg, bus) = (r.extra["algbw_gb_s"].as_f64().unwrap(), r.extra["busbw_gb_s"].as_f64().unwrap());
            assert!((bus / alg - 2.0 * (n as f64 - 1.0) / n as f64).abs() < 1e-9);
        }
        // Same inputs as MPI_Allreduce, and within the tolerance of its result.
        if let Some(d) = r.extra.get("max_abs_vs_mpi") {
            let tol = r.tolerance.unwrap();
            assert!(d.as_f64().unwrap() <= tol.atol + tol.rtol * n as f64, "{} {}: {d}", r.variant, r.params);
        }
    }
    let timed_f32_lab = records.iter().filter(|r| r.provider == "lab" && r.params["dtype"] == "f32" && r.time_ms.is_some());
    assert!(timed_f32_lab.clone().count() > 0 && timed_f32_lab.clone().all(|r| r.extra.contains_key("max_abs_vs_mpi")));
}

#[test]
fn allreduce_experiment_under_mpirun_2_writes_one_run_of_passing_figures() {
    allreduce_run(2);
}

#[test]
fn allreduce_experiment_under_mpirun_4_writes_one_run_of_passing_figures() {
    allreduce_run(4);
}

#[test]
fn bucketed_training_under_mpirun_2_follows_single_process_training() {
    let dir = tempfile::tempdir().unwrap();
    let o = mpirun(2, &["run", "bucketing", "--quick", "--seed", "4", "--out", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let records = only_run(dir.path());
    let gates: Vec<_> = records.iter().filter(|r| r.params["timed"] == false).collect();
    assert_eq!(gates.len(), 2, "overlap and after_backward gates");
    for r in &gates {
        assert_eq!(r.verdict, Verdict::Pass, "{} {:?}", r.variant, r.error);
        assert!(r.extra["buckets"].as_u64().unwrap() > 1, "the gate uses several buckets");
        let (a, b) = (r.extra["losses"].as_array().unwrap(), r.extra["single_process_losses"].as_array().unwrap());
        assert_eq!(a.len(), 5);
        for (x, y) in a.iter().zip(b) {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= lab::collective::bucket::LOSS_RTOL * y.abs(), "{a:?} vs {b:?}");
        }
    }
    for r in records.iter().filter(|r| r.time_ms.is_some()) {
        assert_eq!(r.verdict, Verdict::Pass, "{} {}: {:?}", r.variant, r.params, r.error);
        assert_eq!(r.params["transport"], "mpi");
        if r.variant != "compute_only" {
            let l = r.extra["loss_first_last"].as_array().unwrap();
            assert!(l.iter().all(|x| x.as_f64().is_some_and(f64::is_finite)), "{l:?}");
        }
    }
    assert!(records.iter().any(|r| r.variant == "overlap" && r.time_ms.is_some()));
}

#[test]
fn a_refused_command_ends_the_whole_job_with_its_reason() {
    // `lab rerun` is single-process: every rank refuses it and the job ends, none left waiting.
    let o = mpirun(2, &["rerun", "x#0"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("`lab rerun` runs in one process"), "{}", text(&o));
}
