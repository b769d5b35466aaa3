//! Experiments: the [`Experiment`] trait, the one [`registry`] that drives the CLI, the tests,
//! the sweeps and the report, and the [`Session`] that turns measurements into records.

pub mod doctor;
pub mod llama_cpp;
pub mod peers;

use crate::gpu::{DeviceInfo, Gpu};
use crate::profile::{Budget, Launch, TimeSummary, TimingMode, Work, L2};
use crate::record::{self, ErrorStats, Record, RunWriter, Tolerance, Verdict};
use crate::{LabError, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// One family's sweep: which parameter sets to run and how to run one of them.
pub trait Experiment: Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    /// The parameter a sweep varies: the x axis of the report's scaling curve.
    fn sweep_axis(&self) -> &'static str {
        "bytes"
    }
    /// The shapes the research log leads with: each is `key=value ...`, matched against a
    /// record's parameters (a record matches when it has every pair; its other parameters split
    /// the headline into one row group per value). Empty: the largest shape timed.
    fn headlines(&self) -> &'static [&'static str] {
        &[]
    }
    /// The parameter sets of the sweep on this backend (`quick`: small sizes for tests and CI).
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value>;
    /// Runs every variant and peer that `filter` admits on one parameter set, emitting records
    /// through `session`. Variants that do not apply to the shape are skipped silently.
    fn run_case(&self, session: &mut Session, case: &Value) -> Result<()>;
    /// The shapes `lab sanitize` launches every variant on, once each under compute-sanitizer:
    /// small and odd, so that racecheck's slowness stays bounded. By default the quick sweep's
    /// untimed gates (its first case when it has none); an experiment whose gates are large, or
    /// leave variants out, lists its own.
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        let gates = quick_gates(self, backend);
        if gates.is_empty() {
            self.cases(backend, true).into_iter().take(1).collect()
        } else {
            gates
        }
    }
    /// Under racecheck, one process per variant of `case` instead of one for the case: for cases
    /// that launch many variants that each take long under the tool (a GEMM ladder on its
    /// 1000^3 gates: ~6 minutes per case in one process), so they run side by side. Each process
    /// costs its own start under the tool (~15 s with 15 side by side on an H100 host), so
    /// small cases keep one.
    fn sanitize_racecheck_per_variant(&self, _case: &Value) -> bool {
        false
    }
    /// Under every tool, one process per case instead of one for all (racecheck always runs one
    /// per case): for an experiment whose cases each take long under any tool (a model's engine).
    fn sanitize_case_per_process(&self) -> bool {
        false
    }
    /// Kernels `tool` leaves uninstrumented, as a regex searched in their names: a library's own
    /// kernels that the experiment launches beside the lab's (NCCL's), which run unchecked so
    /// that the lab's are what is checked. Records name it.
    fn sanitize_uninstrumented(&self, _tool: crate::profile::sanitize::Tool) -> Option<&'static str> {
        None
    }
    /// Environment the experiment's process takes under `tool` (a library's setting that changes
    /// what the tool sees, not what the lab's kernels compute); records name it.
    fn sanitize_env(&self, _tool: crate::profile::sanitize::Tool) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// Variants launched only inside another one (a model's engine), as (that variant, family,
    /// variant it launches): `lab sanitize` counts them checked wherever that one ran.
    fn sanitize_covers(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[]
    }
    /// Launches one variant once on `case`'s inputs, untimed and unchecked: what a profiler
    /// wrapped around `lab launch-once` sees (see `profile::ncu`).
    fn launch_once(&self, _gpu: &Gpu, _case: &Value, _variant: &str, _seed: u64) -> Result<()> {
        Err(LabError::Invalid(format!("experiment `{}` has no single-launch mode for profilers", self.name())))
    }
    /// On ranks above 0 of an MPI job (see `collective`): take part in this case's collectives
    /// and emit nothing; only rank 0 holds a [`Session`]. Experiments without collectives do
    /// nothing here.
    fn follow_case(&self, _opts: &RunOptions, _case: &Value) -> Result<()> {
        Ok(())
    }
}

/// Every experiment, in the order of [`crate::family::FAMILIES`] (ceilings first: the others
/// are fractions of it).
pub fn registry() -> Vec<&'static dyn Experiment> {
    crate::family::FAMILIES.iter().filter_map(|f| f.experiment).collect()
}

pub fn find(name: &str) -> Result<&'static dyn Experiment> {
    registry()
        .into_iter()
        .find(|e| e.name() == name)
        .ok_or_else(|| LabError::UnknownExperiment(name.to_string()))
}

#[derive(Clone)]
pub enum Backend {
    Cuda(Arc<Gpu>),
    Cpu,
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cuda(_) => "cuda",
            Backend::Cpu => "cpu",
        }
    }
    pub fn device(&self) -> DeviceInfo {
        match self {
            Backend::Cuda(gpu) => gpu.info.clone(),
            Backend::Cpu => DeviceInfo {
                name: "cpu".into(),
                cc: String::new(),
                driver: String::new(),
                cuda: String::new(),
                nvrtc: String::new(),
                sm_count: 0,
                l2_bytes: 0,
                memory_bytes: 0,
                max_smem_per_block_optin: 0,
                board: None,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// CUDA when a GPU is usable, else the CPU (said once).
    Auto,
    Cuda,
    Cpu,
}

impl BackendChoice {
    /// Opens the backend; `auto` falls back to the CPU and says why on stderr.
    pub fn open(self) -> Result<Backend> {
        match self {
            BackendChoice::Cpu => Ok(Backend::Cpu),
            BackendChoice::Cuda => Ok(Backend::Cuda(Gpu::new(0)?)),
            BackendChoice::Auto => match Gpu::new(0) {
                Ok(gpu) => Ok(Backend::Cuda(gpu)),
                Err(e) => {
                    eprintln!("note: {e}; running on the CPU backend");
                    Ok(Backend::Cpu)
                }
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// PyTorch through `lab/peers/torch_peers.py` (needs `python3` with torch on the GPU host).
    Torch,
    /// transformers on the same GGUF (`lab/peers/transformers_llama.py`; needs the `gguf` package).
    Transformers,
    /// llama.cpp's `llama-bench` (`LAB_LLAMA_CPP` names the folder of its built tools).
    LlamaCpp,
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub quick: bool,
    pub peers: Vec<Peer>,
    pub out: PathBuf,
    pub seed: u64,
    /// Only these variants (all when empty); peers are selected by `peers`.
    pub variants: Vec<String>,
    /// Only this provider (rerun of one record).
    pub provider: Option<String>,
    /// Show progress bars.
    pub progress: bool,
    pub l2: L2,
    pub launch: Launch,
    /// Profile the experiments that support it under Nsight Compute (their records gain `extra.ncu`).
    pub ncu: bool,
    /// `--shape` specs: run these cases instead of the sweep (see [`shape_case`]).
    pub shapes: Vec<String>,
    /// Where the params come from when not from the sweep ("command line"), for the records.
    pub params_from: Option<String>,
    /// Each variant launched once (a timed figure from a single repetition) on the experiment's
    /// [`Experiment::sanitize_cases`], every case untimed: what `lab sanitize` runs under
    /// compute-sanitizer. Records carry `extra.case_index`, the case's place in that list.
    pub once: bool,
    /// These cases (JSON, as records hold them) instead of the sweep.
    pub cases: Vec<Value>,
    /// Where experiments that stream from a file write it (`loader`); None: a temp dir.
    pub data_dir: Option<PathBuf>,
}

impl RunOptions {
    /// `lab run`'s defaults: full sizes, no peers, every variant, the default L2 scrub (clean),
    /// eager launches, no profiler, no progress bars; records go to `out`.
    pub fn new(out: impl Into<PathBuf>, seed: u64) -> Self {
        RunOptions {
            quick: false,
            peers: Vec::new(),
            out: out.into(),
            seed,
            variants: Vec::new(),
            provider: None,
            progress: false,
            l2: L2::default(),
            launch: Launch::Eager,
            ncu: false,
            shapes: Vec::new(),
            params_from: None,
            once: false,
            cases: Vec::new(),
            data_dir: None,
        }
    }

    /// Repetitions and timing mode for these options.
    pub fn budget(&self) -> Budget {
        let base = if self.once { Budget::once() } else { Budget::new(self.quick) };
        Budget { l2: self.l2, launch: self.launch, ..base }
    }
}

/// A measured ceiling: the best figure and its own relative spread (p80 / median - 1).
#[derive(Clone, Copy, Debug)]
pub struct Ceiling {
    pub value: f64,
    pub spread: f64,
}

/// What one provider produced on one parameter set, before provenance is attached.
pub struct Measurement {
    pub variant: String,
    pub provider: String,
    pub params: Value,
    pub work: Work,
    pub time: Option<(TimeSummary, TimingMode)>,
    pub error: Option<ErrorStats>,
    pub tolerance: Option<Tolerance>,
    /// Which ceiling this is a fraction of: "copy_gb_s" or "fma_tflop_s" (None: not placed).
    pub ceiling: Option<&'static str>,
    pub extra: serde_json::Map<String, Value>,
    /// The kernels it ran, where another process ran them (a sanitizer's child); else the
    /// session's GPU says.
    pub kernels: BTreeMap<String, String>,
}

impl Measurement {
    pub fn new(variant: impl Into<String>, provider: &str, params: &Value, work: Work) -> Self {
        Measurement {
            variant: variant.into(),
            provider: provider.into(),
            params: params.clone(),
            work,
            time: None,
            error: None,
            tolerance: None,
            ceiling: None,
            extra: Default::default(),
            kernels: BTreeMap::new(),
        }
    }
}

/// One invocation: a backend, a run file, the run's ceilings, and the provenance every record
/// shares.
pub struct Session {
    pub backend: Backend,
    pub opts: RunOptions,
    pub budget: Budget,
    pub ceilings: BTreeMap<&'static str, Ceiling>,
    pub records: Vec<Record>,
    /// The experiment being run (set by [`Session::run`]).
    pub experiment: &'static str,
    writer: RunWriter,
    bar: indicatif::ProgressBar,
    case: String,
    case_index: usize,
    device: DeviceInfo,
    host: record::HostInfo,
    time: String,
    command: String,
}

impl Session {
    pub fn new(backend: Backend, opts: RunOptions) -> Result<Self> {
        let device = backend.device();
        let time = record::utc_now();
        let run_id = record::run_id(&device.name, &time);
        let writer = RunWriter::create(&opts.out, &run_id)?;
        Ok(Session {
            budget: opts.budget(),
            backend,
            opts,
            ceilings: BTreeMap::new(),
            records: Vec::new(),
            experiment: "",
            writer,
            bar: indicatif::ProgressBar::hidden(),
            case: String::new(),
            case_index: 0,
            device,
            host: record::host_info(),
            time,
            command: std::env::args().collect::<Vec<_>>().join(" "),
        })
    }

    pub fn run_id(&self) -> &str {
        &self.writer.run_id
    }

    pub fn run_file(&self) -> &std::path::Path {
        &self.writer.path
    }

    /// Runs one experiment over the given cases with a progress bar (on a terminal): cases done,
    /// time spent and left, the case in hand and the last figure recorded.
    pub fn run(&mut self, exp: &'static dyn Experiment, cases: &[Value]) -> Result<()> {
        let bar = if self.opts.progress {
            indicatif::ProgressBar::new(cases.len() as u64)
        } else {
            indicatif::ProgressBar::hidden()
        };
        self.bar = bar.clone();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {elapsed} elapsed, ~{eta} left  {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(exp.name());
        if let Backend::Cuda(gpu) = &self.backend {
            gpu.forget_families();
        }
        for (i, case) in cases.iter().enumerate() {
            self.experiment = exp.name();
            self.case = case.to_string();
            self.case_index = i;
            bar.set_message(self.case.clone());
            exp.run_case(self, case)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Does the run's filter admit this variant and provider?
    pub fn wants(&self, variant: &str, provider: &str) -> bool {
        (self.opts.variants.is_empty() || self.opts.variants.iter().any(|v| v == variant))
            && self.opts.provider.as_deref().is_none_or(|p| p == provider)
    }

    /// Is this peer asked for? `--peers` selects peers; the variant filter applies to them only
    /// when a provider is named too (a rerun of one peer's record).
    pub fn wants_peer(&self, peer: Peer, variant: &str, provider: &str) -> bool {
        self.opts.peers.contains(&peer) && (self.opts.provider.is_none() || self.wants(variant, provider))
    }

    /// A ceiling of this run, measuring it first when no experiment has yet.
    pub fn ceiling(&mut self, name: &'static str) -> Result<Ceiling> {
        if let Some(c) = self.ceilings.get(name) {
            return Ok(*c);
        }
        // The ceiling is the run's own measurement: no filter or --shape applies to it.
        let saved = (self.experiment, std::mem::take(&mut self.opts.variants), self.opts.provider.take(), self.opts.params_from.take());
        let result = crate::ops::ceilings::measure(self, name);
        (self.experiment, self.opts.variants, self.opts.provider, self.opts.params_from) = saved;
        result?;
        self.ceilings
            .get(name)
            .copied()
            .ok_or_else(|| LabError::Invalid(format!("ceiling `{name}` could not be measured on this backend")))
    }

    /// Attaches provenance, throughput, fraction of ceiling and a verdict; appends the record.
    pub fn emit(&mut self, m: Measurement) -> Result<Record> {
        // Only a timed figure is a fraction of its ceiling: an untimed check (a sanitizer run of
        // odd shapes, say) does not measure one.
        let ceiling = match (m.ceiling, &m.time) {
            (Some(name), Some(_)) => Some((name, self.ceiling(name)?)),
            _ => None,
        };
        let throughput = m.time.as_ref().map(|(t, _)| m.work.throughput(t.median));
        let fraction = match (&throughput, ceiling) {
            (Some(tp), Some((name, c))) => Some(if name.ends_with("gb_s") { tp.gb_s } else { tp.tflop_s } / c.value),
            _ => None,
        };
        let correct = m.error.as_ref().is_none_or(|e| e.passed());
        // The guard needs cold caches: a warm host run of a cache-sized input may beat DRAM.
        let cold = m.time.as_ref().is_some_and(|(_, mode)| mode.l2 != "warm");
        let verdict = match (correct, fraction, ceiling) {
            (false, _, _) => Verdict::Fail,
            (true, Some(f), Some((_, c))) if cold && f > 1.0 + c.spread.max(0.02) => Verdict::Implausible,
            _ => Verdict::Pass,
        };
        let git = record::git_info();
        let kernels = match &self.backend {
            Backend::Cuda(gpu) if m.kernels.is_empty() => crate::kernels::hashes(gpu.families().iter().map(String::as_str)),
            _ => m.kernels,
        };
        let mut extra = m.extra;
        if self.opts.once {
            extra.insert("case_index".into(), self.case_index.into());
        }
        let record = Record {
            schema: record::SCHEMA,
            run_id: self.writer.run_id.clone(),
            record_id: self.writer.next_id(),
            experiment: self.experiment.to_string(),
            variant: m.variant,
            provider: m.provider,
            params: m.params,
            seed: self.opts.seed,
            time_ms: m.time.as_ref().map(|(t, _)| t.clone()),
            work: m.work,
            throughput,
            fraction_of_ceiling: fraction,
            ceiling: m.ceiling.map(str::to_string),
            error: m.error,
            tolerance: m.tolerance,
            verdict,
            timing: m.time.map(|(_, mode)| mode),
            backend: self.backend.name().into(),
            device: self.device.clone(),
            host: self.host.clone(),
            git,
            lab_version: env!("CARGO_PKG_VERSION").into(),
            time: self.time.clone(),
            command: self.command.clone(),
            quick: self.opts.quick,
            params_from: self.opts.params_from.clone(),
            env: record::env_allow_listed(),
            kernels,
            extra,
        };
        self.writer.append(&record)?;
        self.bar.set_message(format!("{}  (last: {} {})", self.case, record.variant, record.provider));
        self.records.push(record.clone());
        Ok(record)
    }
}

/// The untimed gates of `exp`'s quick sweep on this backend: where `sanitize_cases` starts.
pub fn quick_gates<E: Experiment + ?Sized>(exp: &E, backend: &Backend) -> Vec<Value> {
    exp.cases(backend, true).into_iter().filter(|c| !param_timed(c)).collect()
}

/// The cases a run takes for `exp`: its sweep, one case per `--shape` spec, the cases given as
/// JSON, or (once) its sanitizer shapes; every case untimed when each variant runs once.
pub fn cases_for(exp: &dyn Experiment, backend: &Backend, opts: &RunOptions) -> Result<Vec<Value>> {
    let mut cases = if !opts.cases.is_empty() {
        opts.cases.clone()
    } else if !opts.shapes.is_empty() {
        opts.shapes.iter().map(|spec| shape_case(exp, backend, opts.quick, spec)).collect::<Result<_>>()?
    } else if opts.once {
        exp.sanitize_cases(backend)
    } else {
        exp.cases(backend, opts.quick)
    };
    if opts.once {
        for c in &mut cases {
            c["timed"] = Value::Bool(false);
        }
    }
    Ok(cases)
}

/// A case from a `--shape` spec (`rows=4096,cols=50257,dtype=bf16`). The keys an experiment
/// takes are those its sweep's cases carry; each value must have the type those cases give it,
/// and a string one of the values they use. Keys left out take the values of the sweep's first
/// timed case (its first case, when none is timed); the case is timed unless it says otherwise.
pub fn shape_case(exp: &dyn Experiment, backend: &Backend, quick: bool, spec: &str) -> Result<Value> {
    let mut sweep = exp.cases(backend, quick);
    sweep.extend(exp.cases(backend, !quick));
    let name = exp.name();
    let template = sweep.iter().find(|c| param_timed(c)).or(sweep.first()).ok_or_else(|| LabError::Invalid(format!("{name} has no cases to shape")))?;
    let mut keys: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for c in &sweep {
        for (k, v) in c.as_object().into_iter().flatten() {
            let seen = keys.entry(k.as_str()).or_default();
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
    }
    let accepted = || keys.iter().map(|(k, vs)| format!("{k} ({})", describe(vs))).collect::<Vec<_>>().join(", ");
    let mut case = template.clone();
    case["timed"] = Value::Bool(true);
    for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (key, text) = pair.split_once('=').ok_or_else(|| LabError::Invalid(format!("--shape `{pair}` is not key=value; {name} takes {}", accepted())))?;
        let (key, text) = (key.trim(), text.trim());
        let seen = keys.get(key).ok_or_else(|| LabError::Invalid(format!("--shape: {name} has no parameter `{key}`; it takes {}", accepted())))?;
        let bad = || LabError::Invalid(format!("--shape: {name}'s `{key}` takes {}, not `{text}`", describe(seen)));
        let value = match seen[0] {
            Value::String(_) => {
                let v = Value::String(text.to_string());
                if !seen.contains(&&v) {
                    return Err(bad());
                }
                v
            }
            Value::Bool(_) => Value::Bool(text.parse().map_err(|_| bad())?),
            Value::Number(n) if n.is_u64() => Value::from(text.parse::<u64>().map_err(|_| bad())?),
            Value::Number(_) => serde_json::Number::from_f64(text.parse::<f64>().map_err(|_| bad())?).map(Value::Number).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        case[key] = value;
    }
    Ok(case)
}

/// What values a parameter takes, as its sweep's cases show them.
fn describe(seen: &[&Value]) -> String {
    match seen[0] {
        Value::String(_) => seen.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>().join(" | "),
        Value::Bool(_) => "true | false".into(),
        Value::Number(n) if n.is_u64() => "an unsigned integer".into(),
        Value::Number(_) => "a number".into(),
        _ => "a JSON value".into(),
    }
}

/// A seeded generator for one case: the same seed and params give the same inputs.
pub fn rng_for(seed: u64, case: &Value) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{seed}:{case}").as_bytes());
    rand::rngs::StdRng::from_seed(digest.into())
}

/// Reads a required unsigned parameter from a case.
pub fn param_usize(case: &Value, key: &str) -> Result<usize> {
    case.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| LabError::Invalid(format!("case {case} has no unsigned `{key}`")))
}

/// Whether a case is timed: unless it says `"timed": false`, and never on a hostile fill, whose
/// time says nothing about the kernel. Untimed cases are correctness gates.
pub fn param_timed(case: &Value) -> bool {
    case.get("timed").and_then(Value::as_bool).unwrap_or(true) && case.get("fill").and_then(Value::as_str) != Some("hostile")
}

pub fn param_str<'a>(case: &'a Value, key: &str) -> Result<&'a str> {
    case.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| LabError::Invalid(format!("case {case} has no string `{key}`")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::TimingMode;

    fn session(dir: &std::path::Path) -> Session {
        let opts = RunOptions { quick: true, l2: L2::Cold, ..RunOptions::new(dir, 1) };
        let mut s = Session::new(Backend::Cpu, opts).unwrap();
        s.experiment = "vector_add";
        s.ceilings.insert("copy_gb_s", Ceiling { value: 100.0, spread: 0.01 });
        s
    }

    fn timed(ms: f64, l2: &str) -> Option<(TimeSummary, TimingMode)> {
        let mode = TimingMode { l2: l2.into(), launch: "eager".into(), warmup: 1, raw_ms: vec![ms], warmup_ms: vec![], clocks: None };
        Some((TimeSummary::of(&[ms]), mode))
    }

    /// 1 GB in 5 ms is 200 GB/s against a 100 GB/s ceiling.
    fn too_fast(l2: &str) -> Measurement {
        let mut m = Measurement::new("cached", "lab", &serde_json::json!({"n": 1}), Work { bytes: 1_000_000_000, flops: 0 });
        (m.time, m.ceiling) = (timed(5.0, l2), Some("copy_gb_s"));
        m
    }

    #[test]
    fn runs_started_in_the_same_second_get_distinct_ids_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (session(dir.path()), session(dir.path()));
        assert_eq!(a.time, b.time, "the test needs both in one second");
        assert_ne!(a.run_id(), b.run_id());
        assert_ne!(a.run_file(), b.run_file());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_figure_above_the_ceiling_with_cold_caches_is_implausible() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = session(dir.path());
        let r = s.emit(too_fast("cold")).unwrap();
        assert_eq!(r.verdict, Verdict::Implausible);
        assert!((r.fraction_of_ceiling.unwrap() - 2.0).abs() < 1e-9);
        // A warm host measurement may legitimately beat DRAM: it is not flagged.
        assert_eq!(s.emit(too_fast("warm")).unwrap().verdict, Verdict::Pass);
    }

    #[test]
    fn a_wrong_result_fails_whatever_its_speed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = session(dir.path());
        let tol = Tolerance { atol: 0.0, rtol: 1e-6 };
        let mut m = too_fast("cold");
        m.error = Some(crate::ops::compare::compare(&[1.0, 2.5], &[1.0, 2.0], tol, "test"));
        let r = s.emit(m).unwrap();
        assert_eq!(r.verdict, Verdict::Fail);
        // The report keeps its time but gives it no speed-up over a peer.
        let mut peer = Measurement::new("peer", "torch", &serde_json::json!({"n": 1}), Work { bytes: 1, flops: 0 });
        peer.time = timed(50.0, "cold");
        let p = s.emit(peer).unwrap();
        let peers = crate::report::model::best_peer_times(&[r.clone(), p]);
        let row = crate::report::model::row(&r, &peers);
        assert_eq!((row.speedup.as_str(), row.verdict.as_str(), row.flagged), ("-", "fail", true));
        assert_ne!(row.median_ms, "-");
    }

    /// The whole house path with a real, deliberately wrong kernel (kept here only): a vector add
    /// that forgets the last element leaves the NaN poison there and fails, however fast it is.
    #[test]
    fn a_kernel_that_skips_an_element_fails_through_the_house_path() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = session(dir.path());
        let (a, b): (Vec<f32>, Vec<f32>) = ((0..1001).map(|i| i as f32).collect(), (0..1001).map(|i| 0.5 * i as f32).collect());
        let expected: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (*x + *y) as f64).collect();
        let compare = |y: &[f32]| crate::ops::compare::compare_elems(y, &expected, Tolerance { atol: 0.0, rtol: 1e-6 }, "cpu-f64");
        let check = crate::ops::Check::memory_bound(Tolerance { atol: 0.0, rtol: 1e-6 }, &compare);
        let case = serde_json::json!({"n": 1001});
        let off_by_one = |y: &mut [f32]| (0..y.len() - 1).for_each(|i| y[i] = a[i] + b[i]);
        crate::ops::measure_cpu(&mut s, &case, "off_by_one", Work { bytes: 12 * 1001, flops: 1001 }, &check, true, 1001, off_by_one).unwrap();
        let r = s.records.last().unwrap();
        assert_eq!(r.verdict, Verdict::Fail);
        let e = r.error.as_ref().unwrap();
        assert_eq!((e.mismatches, e.worst_index), (1, Some(1000)));
        assert!(r.time_ms.is_some(), "the time is kept, never shown as a result");
    }

    #[test]
    fn a_shape_spec_becomes_a_case_and_bad_keys_or_values_are_named() {
        let softmax = find("softmax").unwrap();
        let case = shape_case(softmax, &Backend::Cpu, true, "rows=3,cols=5,dtype=f32").unwrap();
        assert_eq!((case["rows"].as_u64(), case["cols"].as_u64(), case["dtype"].as_str()), (Some(3), Some(5), Some("f32")));
        assert_eq!((case["fill"].as_str(), case["timed"].as_bool()), (Some("normal"), Some(true)));
        let err = shape_case(softmax, &Backend::Cpu, true, "rows=3,colz=5").unwrap_err().to_string();
        assert!(err.contains("softmax has no parameter `colz`; it takes cols (an unsigned integer), dtype (f32 | bf16)"), "{err}");
        let err = shape_case(softmax, &Backend::Cpu, true, "dtype=f16").unwrap_err().to_string();
        assert!(err.contains("softmax's `dtype` takes f32 | bf16, not `f16`"), "{err}");
        let err = shape_case(softmax, &Backend::Cpu, true, "rows=-1").unwrap_err().to_string();
        assert!(err.contains("`rows` takes an unsigned integer, not `-1`"), "{err}");
        assert!(shape_case(softmax, &Backend::Cpu, true, "rows").unwrap_err().to_string().contains("is not key=value"));
    }

    #[test]
    fn a_variant_filter_keeps_the_peers_unless_a_provider_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = session(dir.path());
        (s.opts.variants, s.opts.peers) = (vec!["fused".into()], vec![Peer::Torch]);
        assert!(s.wants("fused", "lab") && !s.wants("unfused", "lab"));
        assert!(s.wants_peer(Peer::Torch, "torch gelu", "torch"));
        // A rerun of one peer record names its provider and variant: only that peer runs.
        (s.opts.variants, s.opts.provider) = (vec!["torch gelu".into()], Some("torch".into()));
        assert!(s.wants_peer(Peer::Torch, "torch gelu", "torch"));
        assert!(!s.wants_peer(Peer::Torch, "torch.compile(gelu)", "torch"));
        s.opts.peers.clear();
        assert!(!s.wants_peer(Peer::Torch, "torch gelu", "torch"));
    }
}
