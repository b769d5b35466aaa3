//! Memory safety under NVIDIA's compute-sanitizer: `lab sanitize` runs each experiment's
//! variants once on its small, odd sanitizer shapes (`lab run --once`, see
//! [`crate::experiment::Experiment::sanitize_cases`]) under each tool, several processes at a
//! time, and records per (variant, tool, shape) the error count and the first error's text.
//! A clean process clears every launch it made; one with errors is split by case, then by
//! variant, until each error is pinned on the variant and shape that made it. The log of every
//! process that found something or did not finish is kept beside the records
//! (`sanitizer-logs/<run-id>/<experiment>-<variant>-<tool>-<case>.log`, bounded) and named in its
//! record.

use crate::experiment::{Backend, Measurement, Session};
use crate::profile::Work;
use crate::record::{ErrorStats, Record};
use crate::{LabError, Result};
use regex::Regex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
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
    /// The tool's count of what it found (memcheck, initcheck, synccheck: errors; racecheck:
    /// hazards displayed, errors and warnings alike), or the reports it printed where those are
    /// more: a report the summary leaves out is still a report.
    pub errors: u64,
    /// Of those, racecheck's warnings (hazards it judges may be intended, warp-synchronous code
    /// among them: on Volta and later they are races all the same).
    pub warnings: u64,
    /// Reports printed (at most `--print-limit`; memcheck counts the rest without printing them).
    pub printed: u64,
    /// The first report, its host backtrace left out.
    pub first: Option<String>,
    /// Printed reports per kernel they name (`at <kernel>+0x...`).
    pub kernels: BTreeMap<String, u64>,
    /// Printed reports that name no kernel.
    pub unattributed: u64,
    /// The tool printed its summary: the process ran to its end under it.
    pub finished: bool,
}

impl Outcome {
    /// Every report is printed and names a kernel, none of them the lab's: what a vendor library
    /// the variant calls was found doing, not the lab's kernels (`lab` empty: none can be told
    /// apart, so none is).
    pub fn only_outside(&self, lab: &BTreeSet<String>) -> bool {
        self.errors > 0 && !lab.is_empty() && self.unattributed == 0 && self.printed >= self.errors && !self.kernels.is_empty() && self.kernels.keys().all(|k| !lab.contains(k))
    }
}

const PREFIX: &str = "=========";

/// The summary lines: `ERROR SUMMARY: N errors` (memcheck also prints `ERROR SUMMARY: N errors
/// were not printed ...`), racecheck's `RACECHECK SUMMARY: H hazards displayed (E errors, W
/// warnings)`, singular where the count is 1.
fn summary(line: &str) -> Option<(u64, u64)> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"^(?:ERROR SUMMARY: (\d+) errors?\b|RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\))").expect("a valid pattern")
    });
    let c = re.captures(line)?;
    let n = |i: usize| c.get(i).and_then(|m| m.as_str().parse().ok()).unwrap_or(0);
    Some(if c.get(1).is_some() { (n(1), 0) } else { (n(2).max(n(3) + n(4)), n(4)) })
}

/// The kernel a report line names, as the tool prints it: `at <kernel>+0x1560` (memcheck,
/// initcheck, synccheck, racecheck's `Race reported between Write access at <kernel>+0x...`
/// and its hazard reports' `Write Thread (0,0,0) at <kernel>+0x...`), or the older
/// `at 0x1560 in <file>:<line>:<kernel>`. The lab's kernels are `extern "C"` and print bare;
/// others print demangled (`void ns::k<float>(float *, int)`): the name is kept without its
/// return type and parameters.
fn kernel_named(line: &str) -> Option<String> {
    static RE: OnceLock<[Regex; 2]> = OnceLock::new();
    let [at, old] = RE.get_or_init(|| {
        [r"(?:^|\s)at (\S.*?)\+0x[0-9a-fA-F]+", r"(?:^|\s)at 0x[0-9a-fA-F]+ in (?:[^\s:]+:\d+:)?(\S.*)$"].map(|p| Regex::new(p).expect("a valid pattern"))
    });
    let name = at.captures(line).or_else(|| old.captures(line))?.get(1)?.as_str().trim();
    let name = name.strip_prefix("void ").unwrap_or(name);
    let name = name.split_once('(').map_or(name, |(n, _)| n).trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// Reads a compute-sanitizer log (`--log-file`): the count from its summary line, the first
/// report, and the kernels the printed reports name. A report opens at an unindented line that
/// is no header or summary (`Error: Race reported ...`, `Warning: Race reported ...`,
/// `Invalid __global__ read ...`, `Barrier error detected ...`); the lines after it are its own
/// until an empty `=========` line.
pub fn parse(log: &str) -> Outcome {
    let mut out = Outcome::default();
    // Each report's lines, and its host backtrace's frames.
    let mut reports: Vec<(Vec<&str>, Vec<&str>)> = Vec::new();
    let mut open = false;
    for l in log.lines().filter_map(|l| l.strip_prefix(PREFIX)) {
        let body = l.trim();
        if let Some((count, warnings)) = summary(body) {
            out.finished = true;
            out.errors = out.errors.max(count);
            out.warnings = out.warnings.max(warnings);
            open = false;
        } else if body.is_empty() || body.starts_with("COMPUTE-SANITIZER") || body.starts_with("Target application returned") {
            open = false;
        } else if !l.starts_with("  ") && !open {
            reports.push((vec![body], Vec::new()));
            open = true;
        } else if open {
            let (lines, frames) = reports.last_mut().expect("open");
            match body.strip_prefix("Host Frame:") {
                Some(frame) => frames.push(frame.trim()),
                None if !body.starts_with("Saved host backtrace") => lines.push(body),
                None => {}
            }
        }
    }
    out.printed = reports.len() as u64;
    out.errors = out.errors.max(out.printed);
    for (lines, frames) in &reports {
        match lines.iter().find_map(|l| kernel_named(l)).or_else(|| calling_library(frames).map(|lib| format!("{API_CALL_FROM}{lib}"))) {
            Some(k) => *out.kernels.entry(k).or_default() += 1,
            None => out.unattributed += 1,
        }
    }
    out.first = reports.first().map(|(r, _)| r.iter().take(8).copied().collect::<Vec<_>>().join("\n"));
    out
}

/// How [`parse`] names an error of the CUDA API (memcheck's `Program hit CUDA_ERROR_... on CUDA
/// API call to cu...`) that a library made: as if it were a kernel of that library.
pub const API_CALL_FROM: &str = "API call from ";

/// The library a report's host backtrace entered the CUDA driver from: its first frame outside
/// the driver and runtime, when that is a shared library (`libnccl.so.2`). `None` when it is the
/// program itself (an API error of the lab's own) or there is no backtrace.
fn calling_library(frames: &[&str]) -> Option<String> {
    let module = |f: &&str| f.rsplit_once(" in ").map(|(_, m)| m.trim().rsplit('/').next().unwrap_or(m).to_string());
    frames
        .iter()
        .filter_map(module)
        .find(|m| !m.starts_with("libcuda.so") && !m.starts_with("libcudart"))
        .filter(|m| m.starts_with("lib") && m.contains(".so"))
}

/// One process of `lab run <experiment> --once` under `tool` (or under nothing: the run that
/// lists the launches), on the cases given with their places in the experiment's list.
pub struct Job<'a> {
    pub experiment: &'a str,
    pub tool: Option<Tool>,
    pub cases: Vec<(usize, Value)>,
    pub variant: Option<String>,
    /// Kernels the tool leaves uninstrumented (a regex of their names; see
    /// [`crate::experiment::Experiment::sanitize_uninstrumented`]).
    pub uninstrumented: Option<&'static str>,
}

/// cuBLAS's Hopper GEMM kernels (`nvjet_sm90_*`), as a regex searched in kernel names, for an
/// experiment that leaves them uninstrumented under a tool too slow on them.
pub const CUBLAS_KERNELS: &str = ".*nvjet.*";

/// The sanitizer's arguments before the program it runs: the tool, the report limit, the log
/// file, and the kernels it leaves uninstrumented (`--kernel-name-exclude`: a kernel that matches
/// runs at full speed, unchecked; `regex=` searches its name, mangled or not).
pub fn sanitizer_args(tool: Tool, uninstrumented: Option<&str>, log: &std::path::Path) -> Vec<std::ffi::OsString> {
    // Every report should be printed: one that is not cannot be told to be a library's. NCCL's
    // LL kernels read their own buffers before anything writes them, thousands of initcheck
    // reports a process (on two H100s, 50,000 printed in 200 s did not reach the end of one);
    // initcheck's reports need no host backtrace (it finds no API errors), the slow part.
    let (limit, backtrace) = match tool {
        Tool::Initcheck => ("500000", "device"),
        _ => ("50000", "yes"),
    };
    let mut args: Vec<std::ffi::OsString> = ["--tool", tool.name(), "--print-limit", limit, "--show-backtrace", backtrace].map(Into::into).into();
    if let Some(re) = uninstrumented {
        args.extend(["--kernel-name-exclude".into(), format!("regex={re}").into()]);
    }
    args.extend(["--log-file".into(), log.as_os_str().to_owned()]);
    args
}

/// The most of a sanitizer log kept beside the records: its head and tail.
const LOG_KEPT: usize = 1 << 20;
/// The most of the run's own standard error kept with it.
const STDERR_KEPT: usize = 64 << 10;

/// At most `max` bytes of `text`: three quarters from its head, a quarter from its tail, each cut
/// at a line's end, and a line saying how much was left out between them.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let head = text[..text.floor_char_boundary(max / 4 * 3)].rfind('\n').map_or(0, |i| i + 1);
    let tail = text.ceil_char_boundary(text.len() - max / 4);
    let tail = text[tail..].find('\n').map_or(text.len(), |i| tail + i + 1);
    format!("{}[... {} bytes left out ...]\n{}", &text[..head], tail - head, &text[tail..])
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
    /// The sanitizer's log and the run's standard error after it, bounded (empty without a tool).
    pub log: String,
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
            c.args(sanitizer_args(tool, job.uninstrumented, &log)).arg(exe);
            c.envs(env_of(job.experiment, tool).iter().copied());
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
    let log_text = std::fs::read(&log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let outcome = if job.tool.is_some() { parse(&log_text) } else { Outcome { finished: true, ..Outcome::default() } };
    let (records, _) = crate::record::read_records(dir.path())?;
    let stderr_text = std::fs::read(&stderr_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let last_err = stderr_text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").to_string();
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
    let log = match job.tool {
        Some(_) => format!("{}\n==== the run's standard error ====\n{}", bounded(&log_text, LOG_KEPT), bounded(&stderr_text, STDERR_KEPT)),
        None => String::new(),
    };
    Ok(Ran { outcome, launches, seconds, failure, kernels, log })
}

/// How a (variant, tool, case) came out.
struct Finding<'a> {
    outcome: &'a Outcome,
    seconds: f64,
    failure: Option<&'a str>,
    /// The kernels left uninstrumented (a regex of their names).
    uninstrumented: Option<&'a str>,
    /// Where the process's log was kept, relative to the records' folder.
    log: Option<&'a str>,
}

/// One sanitizer record: `variant` of `experiment` under `tool` on `case`. Reports that all name
/// kernels outside the lab (a vendor library the variant calls) are kept but do not fail it;
/// a report naming no kernel, or one the tool did not print, might be the lab's and fails it.
fn measurement(experiment: &str, variant: &str, tool: Tool, case: &Value, version: &str, f: Finding, lab_kernels: &BTreeSet<String>) -> Measurement {
    let params = json!({"experiment": experiment, "tool": tool.name(), "case": case});
    let mut m = Measurement::new(variant, "compute-sanitizer", &params, Work { bytes: 0, flops: 0 });
    let o = f.outcome;
    let status = match (f.failure, o.errors) {
        (Some(_), _) => "incomplete",
        (None, 0) => "clean",
        _ if o.only_outside(lab_kernels) => "library",
        _ => "errors",
    };
    // A failed run counts as one error: nothing it did not finish can be called clean.
    let mut e = ErrorStats::empty(&format!("compute-sanitizer {version} --tool {}", tool.name()));
    e.mismatches = match status {
        "incomplete" => o.errors.max(1),
        "errors" => o.errors,
        _ => 0,
    };
    m.error = Some(e);
    let mut s = json!({"tool": tool.name(), "status": status, "errors": o.errors, "seconds": f.seconds, "version": version});
    if o.errors > 0 {
        s["kernels"] = json!(o.kernels);
        for (key, n) in [("warnings", o.warnings), ("unattributed", o.unattributed)] {
            if n > 0 {
                s[key] = json!(n);
            }
        }
        if o.printed < o.errors {
            s["not_printed"] = json!(o.errors - o.printed);
        }
        if let Some(first) = &o.first {
            s["first_error"] = json!(first);
        }
    }
    if let Some(why) = f.failure {
        s["failure"] = json!(why);
    }
    if let Some(re) = f.uninstrumented {
        s["uninstrumented"] = json!(re);
    }
    let env = env_of(experiment, tool);
    if !env.is_empty() {
        s["env"] = json!(env.iter().copied().collect::<BTreeMap<&str, &str>>());
    }
    if let Some(log) = f.log {
        s["log"] = json!(log);
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
    let logs = Logs { dir: session.opts.out.clone(), sub: format!("sanitizer-logs/{}", session.run_id()) };
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
        work.par_iter().map(|(name, cases)| run_job(&Job { experiment: name, tool: None, cases: cases.clone(), variant: variant.clone(), uninstrumented: None }, plan)).collect()
    });
    let launched: Launched = Default::default();
    // racecheck is by far the slowest tool: one process per case (or per case and variant where
    // the experiment asks), so that they run side by side; every tool, where the experiment asks.
    // (experiment, tool, its cases, what a plain run of them launched, the one variant it runs)
    type Queued = (&'static str, Tool, Vec<(usize, Value)>, Vec<(usize, String)>, Option<String>);
    let mut queue: Vec<Queued> = Vec::new();
    for ((name, cases), listed) in work.iter().zip(listed) {
        let listed = listed?;
        if let Some(why) = &listed.failure {
            eprintln!("sanitize: {name} without a tool: {why}");
        }
        launched.lock().unwrap_or_else(|p| p.into_inner()).entry(name).or_default().extend(listed.launches.iter().map(|(_, v)| v.clone()));
        let exp = crate::experiment::find(name)?;
        for &tool in &plan.tools {
            if tool != Tool::Racecheck && !exp.sanitize_case_per_process() {
                queue.push((name, tool, cases.clone(), listed.launches.clone(), variant.clone()));
                continue;
            }
            for c in cases {
                let launches: Vec<(usize, String)> = listed.launches.iter().filter(|l| l.0 == c.0).cloned().collect();
                if tool == Tool::Racecheck && variant.is_none() && exp.sanitize_racecheck_per_variant(&c.1) {
                    queue.extend(launches.iter().map(|l| (*name, tool, vec![c.clone()], vec![l.clone()], Some(l.1.clone()))));
                } else {
                    queue.push((name, tool, vec![c.clone()], launches, variant.clone()));
                }
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel::<Result<Vec<Measurement>>>();
    std::thread::scope(|scope| -> Result<()> {
        scope.spawn(|| {
            pool.install(|| {
                use rayon::prelude::*;
                queue.par_iter().for_each_with(tx, |tx, (name, tool, cases, launches, variant)| {
                    let uninstrumented = crate::experiment::find(name).ok().and_then(|e| e.sanitize_uninstrumented(*tool));
                    let job = Sanitize { name, tool: *tool, cases, launches, variant: variant.clone(), version: &version, lab_kernels: &lab_kernels, uninstrumented, logs: &logs };
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
    uninstrumented: Option<&'static str>,
    logs: &'a Logs,
}

/// Where the logs of processes that found something or did not finish are kept: `sub` (relative,
/// as records name them) under the records' folder `dir`.
struct Logs {
    dir: std::path::PathBuf,
    sub: String,
}

impl Logs {
    /// Writes `text` as `<experiment>-<variant>-<tool>-<case index>.log`; returns its name
    /// relative to the records' folder.
    fn keep(&self, experiment: &str, variant: &str, tool: Tool, case: usize, text: &str) -> Result<String> {
        let folder = self.dir.join(&self.sub);
        std::fs::create_dir_all(&folder).map_err(|e| LabError::io(&folder, e))?;
        let name = format!("{experiment}-{variant}-{}-{case}.log", tool.name());
        let path = folder.join(&name);
        std::fs::write(&path, text).map_err(|e| LabError::io(&path, e))?;
        Ok(format!("{}/{name}", self.sub))
    }
}

impl Sanitize<'_> {
    /// The cases in one process; where it reports errors that may be the lab's or fails, each
    /// case alone, then each variant of an erring case alone, so every error is pinned on a
    /// variant and a case.
    fn run(&self, plan: &Plan) -> Result<Vec<Measurement>> {
        let job = |cases: Vec<(usize, Value)>, variant: Option<String>| Job { experiment: self.name, tool: Some(self.tool), cases, variant, uninstrumented: self.uninstrumented };
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
        // Nothing to pin when nothing is the lab's: reports all in a library (NCCL's kernels and
        // API calls in every collective process) stay on every launch of the process.
        if whole.failure.is_none() && (whole.outcome.errors == 0 || whole.outcome.only_outside(self.lab_kernels)) {
            out.extend(self.launches.iter().map(|(i, v)| self.record(*i, v, &whole)).collect::<Result<Vec<_>>>()?);
            return Ok(out);
        }
        for (i, case) in self.cases {
            let in_case: Vec<&String> = self.launches.iter().filter(|l| l.0 == *i).map(|l| &l.1).collect();
            let one = if self.cases.len() == 1 { None } else { Some(run_job(&job(vec![(*i, case.clone())], self.variant.clone()), plan)?) };
            if let Some(one) = one.as_ref().filter(|o| o.outcome.errors == 0 && o.failure.is_none()) {
                out.extend(in_case.iter().map(|v| self.record(*i, v, one)).collect::<Result<Vec<_>>>()?);
                continue;
            }
            if in_case.len() == 1 {
                out.push(self.record(*i, in_case[0], one.as_ref().unwrap_or(&whole))?);
                continue;
            }
            for v in in_case {
                let alone = run_job(&job(vec![(*i, case.clone())], Some(v.clone())), plan)?;
                out.push(self.record(*i, v, &alone)?);
            }
        }
        Ok(out)
    }

    /// The record of `variant` on case `i` from the process `ran`, its log kept where it found
    /// something or did not finish.
    fn record(&self, i: usize, variant: &str, ran: &Ran) -> Result<Measurement> {
        let case = self.cases.iter().find(|c| c.0 == i).map(|c| c.1.clone()).unwrap_or(Value::Null);
        let log = if ran.outcome.errors > 0 || ran.failure.is_some() { Some(self.logs.keep(self.name, variant, self.tool, i, &ran.log)?) } else { None };
        let finding = Finding { outcome: &ran.outcome, seconds: ran.seconds, failure: ran.failure.as_deref(), uninstrumented: self.uninstrumented, log: log.as_deref() };
        let mut m = measurement(self.name, variant, self.tool, &case, self.version, finding, self.lab_kernels);
        m.kernels = ran.kernels.clone();
        Ok(m)
    }
}

/// What [`crate::experiment::Experiment::sanitize_env`] sets for `experiment` under `tool`.
fn env_of(experiment: &str, tool: Tool) -> &'static [(&'static str, &'static str)] {
    crate::experiment::find(experiment).map(|e| e.sanitize_env(tool)).unwrap_or(&[])
}

/// The command that repeats one record's run under its tool, for the whole report.
pub fn reproduce(record: &Record) -> Option<String> {
    let s = record.extra.get("sanitizer")?;
    let experiment = record.params.get("experiment")?.as_str()?;
    let case = record.params.get("case")?;
    let exclude = s.get("uninstrumented").and_then(Value::as_str).map(|re| format!(" --kernel-name-exclude 'regex={re}'")).unwrap_or_default();
    let env: String = s.get("env").and_then(Value::as_object).into_iter().flatten().filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v} "))).collect();
    Some(format!(
        "{env}{} --tool {}{exclude} lab run {experiment} --backend cuda --once --case '{case}' --variant {} --seed {}",
        program(),
        s.get("tool")?.as_str()?,
        record.variant,
        record.seed
    ))
}

#[cfg(test)]
mod tests;
