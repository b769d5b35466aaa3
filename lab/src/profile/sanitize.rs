//! Memory safety under NVIDIA's compute-sanitizer: `lab sanitize` runs each experiment's
//! variants once on its small, odd sanitizer shapes (`lab run --once`, see
//! [`crate::experiment::Experiment::sanitize_cases`]) under each tool, several processes at a
//! time, and records per (variant, tool, shape) the error count and the first error's text.
//! A clean process clears every launch it made; one with errors is split by case, then by
//! variant, until each error is pinned on the variant and shape that made it.

use crate::experiment::{Backend, Measurement, Session};
use crate::profile::Work;
use crate::record::{ErrorStats, Record};
use crate::{LabError, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Tool {
    /// Out-of-bounds and misaligned accesses, invalid frees, errors of the CUDA API.
    Memcheck,
    /// Shared-memory data races between threads of a block.
    Racecheck,
    /// Reads of device global memory never written.
    Initcheck,
    /// Barriers that not every thread they name reaches.
    Synccheck,
}

impl Tool {
    pub const ALL: [Tool; 4] = [Tool::Memcheck, Tool::Racecheck, Tool::Initcheck, Tool::Synccheck];
    pub fn name(self) -> &'static str {
        match self {
            Tool::Memcheck => "memcheck",
            Tool::Racecheck => "racecheck",
            Tool::Initcheck => "initcheck",
            Tool::Synccheck => "synccheck",
        }
    }
}

/// `compute-sanitizer` unless `LAB_COMPUTE_SANITIZER` names another.
pub fn program() -> String {
    std::env::var("LAB_COMPUTE_SANITIZER").unwrap_or_else(|_| "compute-sanitizer".into())
}

/// What one process under a tool came to.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Outcome {
    pub errors: u64,
    /// The first error report, its host backtrace left out.
    pub first: Option<String>,
    /// Reports printed per kernel they name (`at <kernel>+0x...`).
    pub kernels: BTreeMap<String, u64>,
    /// The tool printed its summary: the process ran to its end under it.
    pub finished: bool,
}

const PREFIX: &str = "=========";

/// The kernel a report line names: `... at <kernel>+0x1560 ...`.
fn kernel_named(line: &str) -> Option<&str> {
    let at = line.find("at ")?;
    let rest = &line[at + 3..];
    let end = rest.find("+0x")?;
    let name = &rest[..end];
    (!name.is_empty() && !name.contains(' ')).then_some(name)
}

/// Reads a compute-sanitizer log (`--log-file`): the error count from its summary line
/// (`ERROR SUMMARY: N errors`, or racecheck's `RACECHECK SUMMARY: H hazards displayed (N errors,
/// W warnings)`), the first error's report, and the kernels the printed reports name.
pub fn parse(log: &str) -> Outcome {
    let mut out = Outcome::default();
    // A report opens at an unindented line that is no header or summary; its indented lines
    // follow until an empty `=========` line.
    let mut reports: Vec<Vec<&str>> = Vec::new();
    let mut open = false;
    for l in log.lines().filter_map(|l| l.strip_prefix(PREFIX)) {
        let body = l.trim();
        let count = if let Some(rest) = body.strip_prefix("ERROR SUMMARY:") {
            Some(rest.split_whitespace().next())
        } else {
            body.strip_prefix("RACECHECK SUMMARY:").map(|rest| rest.split_once('(').and_then(|(_, r)| r.split_whitespace().next()))
        };
        if let Some(count) = count {
            out.finished = true;
            out.errors = out.errors.max(count.and_then(|n| n.parse().ok()).unwrap_or(0));
            open = false;
        } else if body.is_empty() || body.starts_with("COMPUTE-SANITIZER") || body.starts_with("Target application returned") {
            open = false;
        } else if !l.starts_with("     ") && !open {
            reports.push(vec![body]);
            open = true;
        } else if open && !body.starts_with("Saved host backtrace") && !body.starts_with("Host Frame") {
            reports.last_mut().expect("open").push(body);
        }
    }
    for r in &reports {
        if let Some(k) = r.iter().find_map(|l| kernel_named(l)) {
            *out.kernels.entry(k.to_string()).or_default() += 1;
        }
    }
    if out.errors > 0 {
        out.first = reports.first().map(|r| r.iter().take(8).copied().collect::<Vec<_>>().join("\n"));
    }
    out
}

/// One process of `lab run <experiment> --once` under `tool` (or under nothing: the run that
/// lists the launches), on the cases given with their places in the experiment's list.
pub struct Job<'a> {
    pub experiment: &'a str,
    pub tool: Option<Tool>,
    pub cases: Vec<(usize, Value)>,
    pub variant: Option<String>,
}

/// What the process did: the tool's outcome, the launches the run recorded as (case index,
/// variant), how long it took, and why it ended early if it did.
pub struct Ran {
    pub outcome: Outcome,
    pub launches: Vec<(usize, String)>,
    pub seconds: f64,
    pub failure: Option<String>,
    /// The kernel families the process ran, with their hashes (from its records).
    pub kernels: std::collections::BTreeMap<String, String>,
}

/// Runs one job; a process still running after the plan's timeout is killed with its group and
/// reported as a failure.
pub fn run_job(job: &Job, plan: &Plan) -> Result<Ran> {
    let dir = tempfile::tempdir().map_err(|e| LabError::Invalid(format!("cannot make a scratch folder: {e}")))?;
    let log = dir.path().join("sanitizer.log");
    let exe = std::env::current_exe().map_err(|e| LabError::Invalid(format!("cannot find this program: {e}")))?;
    let mut cmd = match job.tool {
        Some(tool) => {
            let mut c = Command::new(program());
            c.args(["--tool", tool.name(), "--print-limit", "200", "--log-file"]).arg(&log).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(["run", job.experiment, "--backend", plan.backend, "--once", "--seed", &plan.seed.to_string(), "--out"]).arg(dir.path());
    for (_, c) in &job.cases {
        cmd.args(["--case", &c.to_string()]);
    }
    if let Some(v) = &job.variant {
        cmd.args(["--variant", v]);
    }
    use std::os::unix::process::CommandExt;
    let stderr_path = dir.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| LabError::io(&stderr_path, e))?;
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .map_err(|e| LabError::Invalid(format!("cannot start `{}` (install the CUDA toolkit's compute-sanitizer or set LAB_COMPUTE_SANITIZER): {e}", program())))?;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| LabError::Invalid(format!("waiting for {}: {e}", program())))? {
            break Some(s);
        }
        if start.elapsed() > plan.timeout {
            // SAFETY: signals the process group this child leads; no memory is touched.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let seconds = start.elapsed().as_secs_f64();
    let outcome = if job.tool.is_some() { parse(&std::fs::read_to_string(&log).unwrap_or_default()) } else { Outcome { finished: true, ..Outcome::default() } };
    let (records, _) = crate::record::read_records(dir.path())?;
    let last_err = std::fs::read_to_string(&stderr_path).unwrap_or_default().lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").to_string();
    let failure = match status {
        None => Some(format!("did not finish in {} s", plan.timeout.as_secs())),
        // `lab run` exits 1 when a check failed: the launches still ran under the tool.
        Some(s) if s.code() == Some(0) || s.code() == Some(1) => (!outcome.finished).then(|| "the tool printed no summary".to_string()),
        Some(s) => Some(format!("exited with {s}: {last_err}")),
    };
    // Records carry their place in the list the run was given: map it back to the experiment's.
    let mut launches: Vec<(usize, String)> = Vec::new();
    for r in &records {
        let i = r.extra.get("case_index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let key = (job.cases.get(i).map_or(i, |c| c.0), crate::report::model::variant_name(r));
        if !launches.contains(&key) {
            launches.push(key);
        }
    }
    let kernels = records.iter().flat_map(|r| r.kernels.clone()).collect();
    Ok(Ran { outcome, launches, seconds, failure, kernels })
}

/// How a (variant, tool, case) came out.
struct Finding<'a> {
    errors: u64,
    outcome: &'a Outcome,
    seconds: f64,
    failure: Option<&'a str>,
}

/// One sanitizer record: `variant` of `experiment` under `tool` on `case`. Reports that name only
/// kernels outside the lab (a vendor library the variant calls) are kept but do not fail it.
fn measurement(experiment: &str, variant: &str, tool: Tool, case: &Value, version: &str, f: Finding, lab_kernels: &BTreeSet<String>) -> Measurement {
    let params = json!({"experiment": experiment, "tool": tool.name(), "case": case});
    let mut m = Measurement::new(variant, "compute-sanitizer", &params, Work { bytes: 0, flops: 0 });
    let outside: Vec<&String> = f.outcome.kernels.keys().filter(|k| !lab_kernels.is_empty() && !lab_kernels.contains(*k)).collect();
    let library = f.errors > 0 && !f.outcome.kernels.is_empty() && outside.len() == f.outcome.kernels.len();
    let status = match (f.failure, f.errors) {
        (Some(_), _) => "incomplete",
        (None, 0) => "clean",
        _ if library => "library",
        _ => "errors",
    };
    // A failed run counts as one error: nothing it did not finish can be called clean.
    let mut e = ErrorStats::empty(&format!("compute-sanitizer {version} --tool {}", tool.name()));
    e.mismatches = match status {
        "incomplete" => f.errors.max(1),
        "errors" => f.errors,
        _ => 0,
    };
    m.error = Some(e);
    let mut s = json!({"tool": tool.name(), "status": status, "errors": f.errors, "seconds": f.seconds, "version": version});
    if f.errors > 0 {
        s["kernels"] = json!(f.outcome.kernels);
        if let Some(first) = &f.outcome.first {
            s["first_error"] = json!(first);
        }
    }
    if let Some(why) = f.failure {
        s["failure"] = json!(why);
    }
    let covers: Vec<String> = crate::experiment::find(experiment)
        .map(|e| e.sanitize_covers().iter().filter(|c| c.0 == variant).map(|&(_, f, v)| format!("{f}/{v}")).collect())
        .unwrap_or_default();
    if !covers.is_empty() {
        s["covers"] = json!(covers);
    }
    m.extra.insert("sanitizer".into(), s);
    m
}

/// The sanitizer's version line (`Version 2025.3.0.0 ...`), for the records.
pub fn version() -> Result<String> {
    let out = Command::new(program()).arg("--version").output().map_err(|e| {
        LabError::Invalid(format!("cannot start `{}` (install the CUDA toolkit's compute-sanitizer or set LAB_COMPUTE_SANITIZER): {e}", program()))
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().find_map(|l| l.trim().strip_prefix("Version ")).map(|v| v.split_whitespace().next().unwrap_or(v).to_string()).unwrap_or_else(|| "unknown".into()))
}

/// What `lab sanitize` asks for.
pub struct Plan {
    pub experiments: Vec<&'static str>,
    pub tools: Vec<Tool>,
    pub variants: Vec<String>,
    pub jobs: usize,
    pub timeout: Duration,
    pub seed: u64,
    /// The runs' backend: "cuda" (the CPU backend only tests the driver, under a stub tool).
    pub backend: &'static str,
}

/// The entry points of every family's kernels as NVRTC compiles them for `gpu`: which kernels
/// a report names are the lab's own. Compiled once before any process starts, which also fills
/// the disk cache they all read, instead of each compiling the same family side by side.
fn lab_kernels(backend: &Backend) -> Result<BTreeSet<String>> {
    let Backend::Cuda(gpu) = backend else { return Ok(BTreeSet::new()) };
    let target = crate::gpu::compile::Target::for_device(gpu.arch);
    let mut names = BTreeSet::new();
    for family in crate::family::with_kernels() {
        let ptx = crate::gpu::compile::compile_family(family.name, target)?;
        names.extend(ptx.lines().filter_map(|l| l.trim().strip_prefix(".visible .entry ")).map(|l| l.split('(').next().unwrap_or(l).trim().to_string()));
    }
    Ok(names)
}

type Launched = std::sync::Mutex<BTreeMap<&'static str, Vec<String>>>;

/// Runs the plan, emitting one record per (variant, tool, case) through `session` as each
/// process ends; returns the variants of each experiment's family that no case launched.
pub fn run(session: &mut Session, plan: &Plan) -> Result<Vec<(String, Vec<String>)>> {
    let version = version()?;
    let backend = session.backend.clone();
    let lab_kernels = lab_kernels(&backend)?;
    let variant = plan.variants.first().cloned().filter(|_| plan.variants.len() == 1);
    // Each experiment's cases, and the launches a plain run of them makes (a run under a tool
    // may end at its first fault, before it records what it launched).
    // The cases exactly as `lab run --once` takes them.
    let once = crate::experiment::RunOptions { once: true, ..session.opts.clone() };
    let mut work: Vec<(&'static str, Vec<(usize, Value)>)> = Vec::new();
    for &name in &plan.experiments {
        let cases = crate::experiment::cases_for(crate::experiment::find(name)?, &backend, &once)?;
        work.push((name, cases.into_iter().enumerate().collect()));
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(plan.jobs.max(1)).build().map_err(|e| LabError::Invalid(format!("thread pool: {e}")))?;
    let listed: Vec<Result<Ran>> = pool.install(|| {
        use rayon::prelude::*;
        work.par_iter().map(|(name, cases)| run_job(&Job { experiment: name, tool: None, cases: cases.clone(), variant: variant.clone() }, plan)).collect()
    });
    let launched: Launched = Default::default();
    // racecheck is by far the slowest tool: one process per case (or per case and variant where
    // the experiment asks), so that they run side by side.
    // (experiment, tool, its cases, what a plain run of them launched, the one variant it runs)
    type Queued = (&'static str, Tool, Vec<(usize, Value)>, Vec<(usize, String)>, Option<String>);
    let mut queue: Vec<Queued> = Vec::new();
    for ((name, cases), listed) in work.iter().zip(listed) {
        let listed = listed?;
        if let Some(why) = &listed.failure {
            eprintln!("sanitize: {name} without a tool: {why}");
        }
        launched.lock().unwrap_or_else(|p| p.into_inner()).entry(name).or_default().extend(listed.launches.iter().map(|(_, v)| v.clone()));
        for &tool in &plan.tools {
            let per_variant = tool == Tool::Racecheck && variant.is_none() && crate::experiment::find(name)?.sanitize_racecheck_per_variant();
            if per_variant {
                for l in &listed.launches {
                    let case = cases.iter().find(|c| c.0 == l.0).cloned().into_iter().collect();
                    queue.push((name, tool, case, vec![l.clone()], Some(l.1.clone())));
                }
            } else if tool == Tool::Racecheck {
                queue.extend(cases.iter().map(|c| (*name, tool, vec![c.clone()], listed.launches.iter().filter(|l| l.0 == c.0).cloned().collect(), variant.clone())));
            } else {
                queue.push((name, tool, cases.clone(), listed.launches.clone(), variant.clone()));
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel::<Result<Vec<Measurement>>>();
    std::thread::scope(|scope| -> Result<()> {
        scope.spawn(|| {
            pool.install(|| {
                use rayon::prelude::*;
                queue.par_iter().for_each_with(tx, |tx, (name, tool, cases, launches, variant)| {
                    let job = Sanitize { name, tool: *tool, cases, launches, variant: variant.clone(), version: &version, lab_kernels: &lab_kernels };
                    let _ = tx.send(job.run(plan));
                });
            })
        });
        let mut first_err = None;
        for result in rx {
            match result {
                Ok(ms) => {
                    for m in ms {
                        session.experiment = "sanitize";
                        session.emit(m)?;
                    }
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        first_err.map_or(Ok(()), Err)
    })?;
    let launched = launched.into_inner().unwrap_or_default();
    let ran = |family: &str, variant: &str| {
        launched.get(family).is_some_and(|vs| vs.iter().any(|v| v == variant))
            || crate::experiment::registry().iter().any(|e| {
                e.sanitize_covers().iter().any(|&(by, f, v)| f == family && v == variant && launched.get(e.name()).is_some_and(|vs| vs.iter().any(|x| x == by)))
            })
    };
    let mut missing = Vec::new();
    for &name in &plan.experiments {
        let Some(family) = crate::family::find(name) else { continue };
        let left: Vec<String> = (family.variants)()
            .iter()
            .filter(|v| v.requires != "cpu" && !ran(name, v.name) && (plan.variants.is_empty() || plan.variants.iter().any(|p| p == v.name)))
            .map(|v| v.name.to_string())
            .collect();
        if !left.is_empty() {
            missing.push((name.to_string(), left));
        }
    }
    Ok(missing)
}

/// One experiment under one tool on some of its cases.
struct Sanitize<'a> {
    name: &'static str,
    tool: Tool,
    cases: &'a [(usize, Value)],
    /// What a plain run of these cases launched: (case index, variant).
    launches: &'a [(usize, String)],
    variant: Option<String>,
    version: &'a str,
    lab_kernels: &'a BTreeSet<String>,
}

impl Sanitize<'_> {
    /// The cases in one process; where it reports errors or fails, each case alone, then each
    /// variant of an erring case alone, so every error is pinned on a variant and a case.
    fn run(&self, plan: &Plan) -> Result<Vec<Measurement>> {
        let job = |cases: Vec<(usize, Value)>, variant: Option<String>| Job { experiment: self.name, tool: Some(self.tool), cases, variant };
        let whole = run_job(&job(self.cases.to_vec(), self.variant.clone()), plan)?;
        eprintln!(
            "sanitize: {}{} under {} on {} case(s) in {:.0} s: {} error(s){}",
            self.name,
            self.variant.as_deref().map(|v| format!(" {v}")).unwrap_or_default(),
            self.tool.name(),
            self.cases.len(),
            whole.seconds,
            whole.outcome.errors,
            whole.failure.as_deref().map(|f| format!(", {f}")).unwrap_or_default()
        );
        let mut out = Vec::new();
        if whole.outcome.errors == 0 && whole.failure.is_none() {
            out.extend(self.launches.iter().map(|(i, v)| self.record(*i, v, &whole)));
            return Ok(out);
        }
        for (i, case) in self.cases {
            let in_case: Vec<&String> = self.launches.iter().filter(|l| l.0 == *i).map(|l| &l.1).collect();
            let one = if self.cases.len() == 1 { None } else { Some(run_job(&job(vec![(*i, case.clone())], self.variant.clone()), plan)?) };
            if let Some(one) = one.as_ref().filter(|o| o.outcome.errors == 0 && o.failure.is_none()) {
                out.extend(in_case.iter().map(|v| self.record(*i, v, one)));
                continue;
            }
            if in_case.len() == 1 {
                out.push(self.record(*i, in_case[0], one.as_ref().unwrap_or(&whole)));
                continue;
            }
            for v in in_case {
                let alone = run_job(&job(vec![(*i, case.clone())], Some(v.clone())), plan)?;
                out.push(self.record(*i, v, &alone));
            }
        }
        Ok(out)
    }

    fn record(&self, i: usize, variant: &str, ran: &Ran) -> Measurement {
        let case = self.cases.iter().find(|c| c.0 == i).map(|c| c.1.clone()).unwrap_or(Value::Null);
        let finding = Finding { errors: ran.outcome.errors, outcome: &ran.outcome, seconds: ran.seconds, failure: ran.failure.as_deref() };
        let mut m = measurement(self.name, variant, self.tool, &case, self.version, finding, self.lab_kernels);
        m.kernels = ran.kernels.clone();
        m
    }
}

/// The command that repeats one record's run under its tool, for the whole report.
pub fn reproduce(record: &Record) -> Option<String> {
    let s = record.extra.get("sanitizer")?;
    let experiment = record.params.get("experiment")?.as_str()?;
    let case = record.params.get("case")?;
    Some(format!(
        "{} --tool {} lab run {experiment} --backend cuda --once --case '{case}' --variant {} --seed {}",
        program(),
        s.get("tool")?.as_str()?,
        record.variant,
        record.seed
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// memcheck on an H100 (compute-sanitizer 2025.3.1) over the W4A16 kernel before its fix,
    /// `--print-limit 3`, host frames cut short.
    const MEMCHECK: &str = "========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at quant_w4a16_mma_pipelined_asym_b1_f16+0x1560
=========     by thread (24,0,0) in block (2,0,0)
=========     Access to 0x2a9a0050f0 is out of bounds
=========     and is inside the nearest allocation at 0x2a9a004800 of size 2,294 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x39fb94] in libcuda.so.1
=========         Host Frame: main [0x430084] in lab-planted
========= 
========= Invalid __global__ read of size 16 bytes
=========     at quant_w4a16_mma_pipelined_asym_b1_f16+0x1560
=========     by thread (29,0,0) in block (2,0,0)
=========     Access to 0x2a9a0050f0 is out of bounds
=========     and is inside the nearest allocation at 0x2a9a004800 of size 2,294 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: main [0x430084] in lab-planted
========= 
========= Target application returned an error
========= ERROR SUMMARY: 64 errors
========= ERROR SUMMARY: 61 errors were not printed. Use --print-limit option to adjust the number of printed errors
";

    /// racecheck on cuBLASLt's Hopper kernel (the same host), as its report reads.
    const RACECHECK: &str = "========= COMPUTE-SANITIZER
========= Error: Race reported between Read access at nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT+0xa50
=========     and Write access at nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT+0x34b0 [512 hazards]
========= 
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
";

    #[test]
    fn reads_a_memcheck_report() {
        let o = parse(MEMCHECK);
        assert!(o.finished);
        assert_eq!(o.errors, 64, "the total, not the printed count");
        assert_eq!(o.kernels.into_iter().collect::<Vec<_>>(), [("quant_w4a16_mma_pipelined_asym_b1_f16".to_string(), 2)]);
        let first = o.first.unwrap();
        assert!(first.starts_with("Invalid __global__ read of size 16 bytes\nat quant_w4a16"), "{first}");
        assert!(first.contains("of size 2,294 bytes") && !first.contains("Host Frame"), "{first}");
    }

    #[test]
    fn reads_a_racecheck_report_and_its_kernel() {
        let o = parse(RACECHECK);
        assert_eq!((o.errors, o.finished), (1, true));
        assert_eq!(o.kernels.keys().collect::<Vec<_>>(), ["nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"]);
        assert!(o.first.unwrap().ends_with("[512 hazards]"));
    }

    #[test]
    fn reads_clean_logs_of_every_tool() {
        for log in ["========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n", "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"] {
            assert_eq!(parse(log), Outcome { finished: true, ..Outcome::default() });
        }
        assert!(!parse("========= COMPUTE-SANITIZER\n").finished, "no summary: the run did not end under the tool");
    }

    #[test]
    fn reports_only_in_library_kernels_do_not_fail_a_variant_and_the_labs_own_do() {
        let lab: BTreeSet<String> = ["quant_w4a16_mma_pipelined_asym_b1_f16".to_string()].into();
        let case = json!({"n": 37});
        let status = |log: &str| {
            let o = parse(log);
            let m = measurement("x", "v", Tool::Racecheck, &case, "t", Finding { errors: o.errors, outcome: &o, seconds: 1.0, failure: None }, &lab);
            (m.extra["sanitizer"]["status"].as_str().unwrap().to_string(), m.error.unwrap().mismatches)
        };
        assert_eq!(status(RACECHECK), ("library".into(), 0));
        assert_eq!(status(MEMCHECK), ("errors".into(), 64));
    }
}
