//! `lab rerun`: a recorded figure run again with its recorded seed, params and timing mode, its
//! check and timing compared with the record's.

use clap::ValueEnum;
use lab::experiment::{self, BackendChoice, Peer, RunOptions, Session};
use lab::profile::{Launch, L2};
use lab::record::compare::{self, View};
use lab::record::{self, Record, Verdict};
use lab::{LabError, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// The records a target names, and every record of the runs they belong to (the peers and
/// ceilings they are read against).
pub(crate) fn select_in_runs(target: &str, dir: &std::path::Path) -> Result<(Vec<Record>, Vec<Record>)> {
    let path = PathBuf::from(target);
    let (all, damage) = if path.is_file() { record::read_records(&path)? } else { record::read_records(dir)? };
    for d in &damage {
        eprintln!("skipped a damaged record line: {d}");
    }
    let chosen: Vec<Record> = if path.is_file() {
        all.clone()
    } else {
        all.iter().filter(|r| r.record_id == target || r.run_id == target).cloned().collect()
    };
    if chosen.is_empty() {
        return Err(LabError::Invalid(format!("no record, run or run file `{target}` (looked in {})", dir.display())));
    }
    let runs: std::collections::BTreeSet<&str> = chosen.iter().map(|r| r.run_id.as_str()).collect();
    let context = all.iter().filter(|r| runs.contains(r.run_id.as_str())).cloned().collect();
    Ok((chosen, context))
}

/// The rerun's timings against the recorded run's, as `lab compare` reads them: net of the drift
/// and noise between the two runs where they share enough figures, else absolutely, said so.
fn print_timing(old_runs: &[Record], new: &[Record], view: View, threshold: f64) -> Result<()> {
    let (Some(o), Some(n)) = (old_runs.first(), new.first()) else { return Ok(()) };
    let cmp = compare::compare_runs(old_runs, new, threshold, true)?;
    if cmp.rows.is_empty() {
        return Ok(());
    }
    println!("\ntiming, A = the recorded run, B = this rerun:");
    let differ = compare::fingerprint_differences(o, n);
    if !differ.is_empty() {
        println!("(made on different hardware or environments: {}; the change net of drift is the one to read)", differ.join("; "));
    }
    print!("{}", compare::render(&cmp, view));
    Ok(())
}

pub(crate) fn rerun(target: &str, dir: &std::path::Path, backend: BackendChoice, out: PathBuf, threshold: f64, view: View) -> Result<ExitCode> {
    if lab::collective::under_launcher() {
        return Err(LabError::Invalid(
            "`lab rerun` runs in one process; rerun an MPI record with `mpirun -n RANKS lab run EXPERIMENT --seed SEED --variant VARIANT`".into(),
        ));
    }
    compare::check_threshold(threshold)?;
    let (old, old_runs) = select_in_runs(target, dir)?;
    let backend = backend.open()?;
    let mut session: Option<Session> = None;
    let mut pairs = Vec::new();
    for r in &old {
        if r.backend != backend.name() {
            return Err(LabError::Invalid(format!(
                "record {} was made on the {} backend; this rerun has the {} backend",
                r.record_id, r.backend, backend.name()
            )));
        }
        let exp = experiment::find(&r.experiment)?;
        let opts = RunOptions {
            quick: r.quick,
            peers: if r.provider == "torch" { vec![Peer::Torch] } else { vec![] },
            out: out.clone(),
            seed: r.seed,
            variants: vec![r.variant.clone()],
            provider: Some(r.provider.clone()),
            progress: false,
            // The recorded mode by name; records from before the mode was kept were scrubbed by
            // zeroing (cold), and host-timed ones ("host") were launched eagerly.
            l2: r.timing.as_ref().and_then(|t| L2::from_str(&t.l2, false).ok()).unwrap_or(L2::Cold),
            launch: r.timing.as_ref().and_then(|t| Launch::from_str(&t.launch, false).ok()).unwrap_or(Launch::Eager),
            ncu: false,
            shapes: Vec::new(),
            params_from: r.params_from.clone(),
            once: false,
            cases: Vec::new(),
            data_dir: None,
        };
        let s = match session.as_mut() {
            Some(s) => {
                s.opts = RunOptions { out: s.opts.out.clone(), ..opts };
                s.budget = s.opts.budget();
                s
            }
            None => session.insert(Session::new(backend.clone(), opts)?),
        };
        let before = s.records.len();
        s.run(exp, std::slice::from_ref(&r.params))?;
        let new = s.records[before..].iter().find(|n| n.variant == r.variant && n.provider == r.provider).cloned();
        pairs.push((r.clone(), new));
    }
    println!(
        "{:<34} {:<22} {:<8} {:>10} {:>10} {:>10} {:>10} {:<9} {:<9}",
        "record", "variant", "provider", "old ms", "new ms", "old err", "new err", "old", "new"
    );
    let mut broken = 0;
    for (o, n) in &pairs {
        let ms = |r: &Record| r.time_ms.as_ref().map_or("-".into(), |t| format!("{:.4}", t.median));
        let err = |r: &Record| r.error.as_ref().map_or("-".into(), |e| format!("{:.1e}", e.max_abs));
        let verdict = |r: &Record| format!("{:?}", r.verdict).to_lowercase();
        match n {
            Some(n) => {
                if o.verdict != Verdict::Fail && n.verdict == Verdict::Fail {
                    broken += 1;
                }
                println!(
                    "{:<34} {:<22} {:<8} {:>10} {:>10} {:>10} {:>10} {:<9} {:<9}",
                    o.record_id, o.variant, o.provider, ms(o), ms(n), err(o), err(n), verdict(o), verdict(n)
                );
            }
            None => {
                broken += 1;
                println!("{:<34} {:<22} {:<8} not reproduced: the variant no longer runs on this shape", o.record_id, o.variant, o.provider);
            }
        }
    }
    if let Some(s) = &session {
        print_timing(&old_runs, &s.records, view, threshold)?;
        println!("\nnew records -> {}", s.run_file().display());
    }
    if broken > 0 {
        eprintln!("{broken} record(s) no longer hold their correctness figures");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
