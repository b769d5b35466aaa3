//! The `lab` command line: list, run, rerun, doctor, compile.

use clap::{Parser, Subcommand};
use lab::experiment::{self, BackendChoice, Peer, RunOptions, Session};
use lab::profile::{Launch, L2};
use lab::record::compare::{self, View};
use lab::record::{Record, Verdict};
use lab::{LabError, Result};
use std::path::PathBuf;
use std::process::ExitCode;

mod rerun;
use rerun::{rerun, select_in_runs};

#[derive(Parser)]
#[command(name = "lab", version, about = "GPU-kernel research lab: run experiments, record them, rerun them")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the experiments, or one family's variants.
    List {
        /// Show this family's variant table: name, dtypes, what it needs, what it changes.
        #[arg(long, value_name = "FAMILY")]
        variants: Option<String>,
    },
    /// Run an experiment (or `all`) and append its records to a new run file.
    Run {
        /// Experiment names from `lab list`, or `all`.
        #[arg(required = true)]
        experiments: Vec<String>,
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
        /// Small sizes and few repetitions (tests, CI, a first look).
        #[arg(long)]
        quick: bool,
        /// Peers to run beside lab's kernels on the same inputs.
        #[arg(long, value_enum, value_delimiter = ',')]
        peers: Vec<Peer>,
        /// Folder for the run's JSONL file.
        #[arg(long, default_value = "reports/records")]
        out: PathBuf,
        /// Seed for the inputs (default: fresh from the clock; always recorded).
        #[arg(long)]
        seed: Option<u64>,
        /// Only these variants (repeatable).
        #[arg(long = "variant")]
        variants: Vec<String>,
        /// Run this case instead of the sweep, e.g. `rows=4096,cols=50257,dtype=bf16` (repeatable;
        /// keys the sweep's cases do not set are an error that lists the ones it takes).
        #[arg(long = "shape", value_name = "KEY=VALUE,...")]
        shapes: Vec<String>,
        /// Scrub L2 before every repetition by zeroing a buffer (cold) or reading one (clean: no
        /// dirty lines left to write back); or not (warm).
        #[arg(long, value_enum, default_value_t)]
        l2: L2,
        /// Launch every repetition from the host (eager) or replay a captured CUDA graph.
        #[arg(long, value_enum, default_value = "eager")]
        launch: Launch,
        /// Also profile each kernel under Nsight Compute (`ncu`, or LAB_NCU), where the
        /// experiment supports it; the metrics land in the records' `extra.ncu`.
        #[arg(long)]
        ncu: bool,
        /// Launch each variant once on the experiment's sanitizer shapes, untimed (what
        /// `sanitize` runs under compute-sanitizer).
        #[arg(long, hide = true)]
        once: bool,
        /// Run this case, given as JSON as records hold it (repeatable).
        #[arg(long = "case", hide = true)]
        cases: Vec<String>,
        /// Folder for the data files experiments write and read (`loader`; default: a temp dir
        /// per case). It must be on the file system to measure.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Launch every variant of the named experiments (all by default) once on a few small, odd
    /// shapes under compute-sanitizer, and record per variant, tool and shape the errors found.
    /// Exits 1 on any error. Run it after any kernel change.
    Sanitize {
        /// Experiment names from `lab list` (default: every experiment with kernels).
        experiments: Vec<String>,
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = lab::profile::sanitize::Tool::ALL)]
        tool: Vec<lab::profile::sanitize::Tool>,
        /// Only this variant (repeatable).
        #[arg(long = "variant")]
        variants: Vec<String>,
        /// This case instead of the experiment's sanitizer shapes (JSON, as records hold it;
        /// repeatable; one experiment only).
        #[arg(long = "case")]
        cases: Vec<String>,
        /// Sanitizer processes at a time.
        #[arg(long, default_value_t = 4)]
        jobs: usize,
        /// Seconds one process may take before it is killed and recorded as incomplete.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[arg(long, default_value = "reports/records")]
        out: PathBuf,
        #[arg(long)]
        seed: Option<u64>,
        /// The backend of the runs under the tool (the CPU one only tests this command).
        #[arg(long, value_enum, default_value = "cuda", hide = true)]
        backend: BackendChoice,
    },
    /// Launch one variant of one case once (what `run --ncu` wraps in Nsight Compute).
    #[command(hide = true)]
    LaunchOnce {
        experiment: String,
        /// The case as JSON, as the record's `params` holds it.
        #[arg(long)]
        case: String,
        #[arg(long)]
        variant: String,
        #[arg(long)]
        seed: u64,
    },
    /// Re-execute recorded configurations and compare old with new.
    Rerun {
        /// A record id (`<run-id>#<n>`), a run id, or a run file.
        target: String,
        /// Where to look up record and run ids.
        #[arg(long, default_value = "reports/records")]
        records: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
        /// Folder for the new run's JSONL file.
        #[arg(long, default_value = "reports/records")]
        out: PathBuf,
        /// Changes inside this band are never reported as faster or slower; the default view
        /// widens it to 4 x the noise between the runs where that is larger.
        #[arg(long, default_value_t = 0.02)]
        threshold: f64,
        /// Judge the timings on their raw change in median, not net of the drift between the runs.
        #[arg(long)]
        absolute: bool,
    },
    /// Compare two runs: per figure, the change in median time (bootstrap 95% interval) and in the
    /// fastest repetition; absolute, relative to the peer (else the ceiling) of its run, and net
    /// of the drift between the runs. By default a lab kernel is called faster or slower only when
    /// both changes, drift divided out, lie beyond max(--threshold, 4 x the runs' noise).
    Compare {
        /// The baseline: a run id or a run file.
        a: String,
        /// The candidate: a run id or a run file.
        b: String,
        #[arg(long, default_value = "reports/records")]
        records: PathBuf,
        /// Changes inside this band are never reported as faster or slower; the default view
        /// widens it to 4 x the noise between the runs where that is larger.
        #[arg(long, default_value_t = 0.02)]
        threshold: f64,
        /// Compare even when device, driver, host or environment differ.
        #[arg(long)]
        force: bool,
        /// Call every figure, peers and ceilings too, faster or slower on its raw change in median
        /// (interval beyond --threshold), which moves with the machine, instead of net of the
        /// drift and noise between the runs.
        #[arg(long)]
        absolute: bool,
    },
    /// Check the ring all-reduce on awkward lengths and every dtype: on mpirun's world against
    /// MPI_Allreduce and the f64 sum, else on thread worlds of 2 and 4 ranks.
    CollectiveCheck {
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Continue a prompt with a Llama-architecture GGUF model (greedy, or sampled with
    /// --temperature), streaming the text.
    Generate {
        /// The .gguf file.
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt in the model's chat template as a user message.
        #[arg(long)]
        chat: bool,
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// Softmax temperature of the draw; 0 is greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Draw among the k most likely tokens only (0: all).
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        /// Draw among the fewest most likely tokens holding this share of the mass (1: all).
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// Seed of the draws: the same seed, prompt and settings give the same text on either backend.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
    },
    /// Write a GGUF model with its matrices in another format (the lab's quantizers; vectors,
    /// metadata and tokenizer kept), for the lab's engine or llama.cpp.
    Quantize {
        /// The .gguf file to read.
        #[arg(long)]
        model: PathBuf,
        /// f32, f16, bf16, q8_0, q6_k, q4_0 or q4_1.
        #[arg(long)]
        format: String,
        /// The .gguf file to write (never an existing one).
        #[arg(long)]
        out: PathBuf,
    },
    /// Train a small Llama (SmolLM2's design scaled down, its tokenizer) from scratch on the GPU
    /// or the CPU, evaluate it on a held-out text, write its checkpoint and GGUF file and requantized copies
    /// under --out, and score every file on the held-out text; records (experiment `pipeline`)
    /// go to --records.
    Pipeline {
        /// `--plan quick`.
        #[arg(long, conflicts_with = "plan")]
        quick: bool,
        /// quick: 2 layers of width 64, 40 steps (tests, a first look); cpu: 2 of 128, 100 steps
        /// (minutes on a CPU); full: 6 of 256, 200 steps (a GPU host).
        #[arg(long, default_value = "full")]
        plan: String,
        /// Peers beside the lab: llama-cpp scores the same files (LAB_LLAMA_CPP); torch trains the
        /// same model from the same weights on the same batches (its loss within 1% over 200 steps).
        #[arg(long, value_enum, value_delimiter = ',')]
        peers: Vec<Peer>,
        /// Folder for the token files, checkpoint.safetensors and model.gguf (none may exist).
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "reports/records")]
        records: PathBuf,
        /// Training steps instead of the plan's.
        #[arg(long)]
        steps: Option<usize>,
        /// The training text (default: Python's pydoc_data/topics.py, found through python3).
        #[arg(long)]
        text: Option<PathBuf>,
        #[arg(long, default_value = "/usr/share/common-licenses/GPL-3")]
        held_out: PathBuf,
        /// The GGUF whose tokenizer the model takes (default: $LAB_SMOLLM2_GGUF).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// The GGUF's matrix format: f32, f16, q8_0, q4_0 or q4_1.
        #[arg(long, default_value = "f32")]
        format: String,
        /// Seed of the initial weights (default: fresh from the clock; always recorded).
        #[arg(long)]
        seed: Option<u64>,
        /// Where training and the held-out evaluation run.
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
        /// Data-parallel ranks: GPUs 0..N, or N threads on the CPU backend (the batch's rows
        /// split evenly).
        #[arg(long, default_value_t = 1)]
        ranks: usize,
    },
    /// Say which GPU, driver, NVRTC, cuBLAS, MPI and Python/torch this machine has.
    Doctor,
    /// Compile every kernel family with NVRTC (for the device, or for the given architectures).
    Compile {
        /// Only these families (repeatable; default: every family with kernels).
        #[arg(long = "family")]
        families: Vec<String>,
        /// Compute capabilities as numbers, e.g. 80,90,90a (default: the device's own target,
        /// 90a on 9.0).
        #[arg(long, value_delimiter = ',')]
        arch: Vec<lab::gpu::compile::Target>,
        /// Also write each family's PTX to DIR/<family>.compute_<arch>.ptx (for ptxas -v, cuobjdump).
        #[arg(long)]
        emit: Option<PathBuf>,
        /// Also assemble it with `ptxas -v` (or LAB_PTXAS) and print each kernel's registers,
        /// spills and ptxas's performance notes (a wgmma serialised, a setmaxnreg ignored).
        #[arg(long)]
        ptxas: bool,
    },
}

fn main() -> ExitCode {
    // Like any Unix filter: `lab list | head` ends quietly instead of panicking on the pipe.
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    match dispatch(Cli::parse()) {
        Ok(code) => {
            lab::collective::finish();
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            // Under mpirun the other ranks may be waiting in a collective: end them too.
            if lab::collective::under_launcher() {
                lab::collective::exit_all(2);
            }
            ExitCode::from(2)
        }
    }
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::List { variants: None } => {
            for e in experiment::registry() {
                println!("{:<14} {}", e.name(), e.description());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::List { variants: Some(family) } => {
            let f = lab::family::find(&family).ok_or_else(|| {
                let names: Vec<_> = lab::family::FAMILIES.iter().map(|f| f.name).collect();
                LabError::Invalid(format!("no family `{family}` (one of: {})", names.join(", ")))
            })?;
            let table = (f.variants)();
            if table.is_empty() {
                println!("{family} has no variant table");
            }
            for v in table {
                println!("{:<26} {:<14} {:<7} {}", v.name, v.dtypes.join(","), v.requires, v.what);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { experiments, backend, quick, peers, out, seed, variants, shapes, l2, launch, ncu, once, cases, data_dir } => {
            let cases = cases.iter().map(|c| case_json(c)).collect::<Result<Vec<_>>>()?;
            let exps = if experiments.iter().any(|e| e == "all") {
                experiment::registry()
            } else {
                experiments.iter().map(|e| experiment::find(e)).collect::<Result<Vec<_>>>()?
            };
            // Under mpirun every rank runs this command: all take rank 0's seed, and only rank 0
            // opens a session and writes records (the others follow: see `lab::collective`).
            let seed = lab::collective::agree_seed(seed.unwrap_or_else(fresh_seed))?;
            if lab::collective::is_follower()? {
                let params_from = (!shapes.is_empty()).then(|| "command line".to_string());
                let opts = RunOptions { quick, peers, out, seed, variants, provider: None, progress: false, l2, launch, ncu, shapes, params_from, once, cases, data_dir };
                lab::collective::follow(&exps, &opts)?;
                return Ok(ExitCode::SUCCESS);
            }
            let backend = backend.open()?;
            note_if_dirty();
            let params_from = (!shapes.is_empty()).then(|| "command line".to_string());
            let opts = RunOptions { quick, peers, out, seed, variants, provider: None, progress: !once, l2, launch, ncu, shapes, params_from, once, cases, data_dir };
            // Every --shape is checked against every experiment before anything runs.
            let cases = exps.iter().map(|e| experiment::cases_for(*e, &backend, &opts)).collect::<Result<Vec<_>>>()?;
            let mut session = Session::new(backend, opts)?;
            let mut result = Ok(());
            for (e, cases) in exps.into_iter().zip(cases) {
                result = session.run(e, &cases);
                if result.is_err() {
                    break;
                }
            }
            print_table(&session.records);
            println!("\n{} records -> {}", session.records.len(), session.run_file().display());
            result?;
            Ok(exit_for(&session.records))
        }
        Command::Rerun { target, records, backend, out, threshold, absolute } => rerun(&target, &records, backend, out, threshold, view(absolute)),
        Command::Compare { a, b, records, threshold, force, absolute } => {
            let cmp = compare::compare_runs(&select(&a, &records)?, &select(&b, &records)?, threshold, force)?;
            if cmp.rows.is_empty() {
                return Err(LabError::Invalid(format!("`{a}` and `{b}` share no timed, passing figure")));
            }
            print!("{}", compare::render(&cmp, view(absolute)));
            Ok(ExitCode::SUCCESS)
        }
        Command::Sanitize { experiments, tool, variants, cases, jobs, timeout, out, seed, backend } => {
            let cases = cases.iter().map(|c| case_json(c)).collect::<Result<Vec<_>>>()?;
            if !cases.is_empty() && experiments.len() != 1 {
                return Err(LabError::Invalid(format!("--case needs exactly one experiment, not {}", experiments.len())));
            }
            let plan = (tool, variants, jobs, std::time::Duration::from_secs(timeout), seed.unwrap_or_else(fresh_seed));
            note_if_dirty();
            sanitize(experiments, plan, cases, out, backend)
        }
        Command::LaunchOnce { experiment, case, variant, seed } => {
            let case = case_json(&case)?;
            let gpu = lab::gpu::Gpu::new(0)?;
            experiment::find(&experiment)?.launch_once(&gpu, &case, &variant, seed)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::CollectiveCheck { seed } => {
            let seed = lab::collective::agree_seed(seed)?;
            let lines = match lab::collective::launched()? {
                Some(t) => lab::collective::check::run(t, seed)?,
                None => {
                    let mut lines = Vec::new();
                    for n in [2, 4] {
                        lines.extend(lab::collective::run_threads(n, |t| lab::collective::check::run(t, seed))?.swap_remove(0));
                    }
                    lines
                }
            };
            for l in &lines {
                println!("{l}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate { model, prompt, chat, max_tokens, temperature, top_k, top_p, seed, backend } => {
            let sampling = lab::model::llama::Sampling { temperature, top_k, top_p, seed };
            generate(&model, &prompt, chat, max_tokens, sampling, backend)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Quantize { model, format, out } => {
            use lab::weights::gguf_writer::{parse_format, requantize};
            let to = parse_format(&format)?;
            let file = lab::weights::gguf::GgufFile::open(&model)?;
            let g = file.parse()?;
            let w = requantize(&g, to)?;
            w.write(&out)?;
            let size = std::fs::metadata(&out).map_err(|e| LabError::io(&out, e))?.len();
            println!("wrote {} ({}, {:.1} MB, from {:.1} MB)", out.display(), to.name(), size as f64 / 1e6, file.bytes().len() as f64 / 1e6);
            Ok(ExitCode::SUCCESS)
        }
        Command::Pipeline { quick, plan, peers, out, records, steps, text, held_out, tokenizer, format, seed, backend, ranks } => {
            let tokenizer = match tokenizer.or_else(|| std::env::var_os("LAB_SMOLLM2_GGUF").map(PathBuf::from)) {
                Some(t) => t,
                None => return Err(LabError::Invalid("no tokenizer: pass --tokenizer PATH.gguf or set LAB_SMOLLM2_GGUF".into())),
            };
            let text = match text {
                Some(t) => t,
                None => python_topics()?,
            };
            let format = lab::weights::gguf_writer::parse_format(&format)?;
            let plan = if quick { "quick".into() } else { plan };
            let opts = lab::train::pipeline::Options { out, records, plan, steps, text, held_out, tokenizer, format, seed: seed.unwrap_or_else(fresh_seed), backend: backend.open()?, ranks, progress: true, peers };
            let s = lab::train::pipeline::run(&opts)?;
            println!(
                "loss {:.3} -> {:.3} over {} steps, {:.0} tokens/s; held-out loss {:.3}",
                s.losses.first().copied().unwrap_or(f64::NAN),
                s.losses.last().copied().unwrap_or(f64::NAN),
                s.losses.len(),
                s.tokens_per_s,
                s.held_out_loss
            );
            if let Some(t) = &s.torch {
                let n = s.losses.len().min(lab::train::torch_ref::COMPARED_STEPS);
                for (dtype, e) in &t.runs {
                    println!("loss within {:.4}% of torch {dtype}'s over the first {n} steps (worst at step {})", 100.0 * e.max_rel, e.worst_index.unwrap_or(0));
                }
            }
            println!("wrote {} ({:.1} MB), {} and {}", s.gguf.display(), s.gguf_bytes as f64 / 1e6, s.checkpoint.display(), s.run_file.display());
            for r in &s.scores {
                let (x, num) = (&r.extra, |k: &str| r.extra[k].as_f64().unwrap_or(f64::NAN));
                let theirs = x.get("llama_cpp_ppl").and_then(|v| v.as_f64()).map_or(String::new(), |p| format!(", llama.cpp {p:.3}, logits cosine {}", x["logits_cosines"]));
                println!("{:>5}: {:.2} MB, {:.2} bits/weight, perplexity {:.3}{theirs}, KL {:.5}", r.params["format"].as_str().unwrap_or(""), num("file_bytes") / 1e6, num("bits_per_weight"), num("ppl"), num("mean_kl"));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor => {
            lab::experiment::doctor::print();
            Ok(ExitCode::SUCCESS)
        }
        Command::Compile { families, arch, emit, ptxas } => {
            let all: Vec<&str> = lab::family::with_kernels().map(|f| f.name).collect();
            if let Some(bad) = families.iter().find(|f| !all.contains(&f.as_str())) {
                return Err(LabError::Invalid(format!("no kernel family `{bad}` (families with kernels: {})", all.join(", "))));
            }
            let chosen: Vec<&str> = all.into_iter().filter(|f| families.is_empty() || families.iter().any(|g| g == f)).collect();
            let archs = if arch.is_empty() { vec![lab::gpu::compile::Target::for_device(lab::gpu::Gpu::new(0)?.arch)] } else { arch };
            for a in archs {
                for &family in &chosen {
                    let ptx = lab::gpu::compile::compile_family(family, a)?;
                    match &emit {
                        Some(dir) => {
                            let path = dir.join(format!("{family}.compute_{a}.ptx"));
                            std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, &ptx)).map_err(|e| LabError::io(&path, e))?;
                            println!("compiled {family} for compute_{a} -> {}", path.display());
                        }
                        None => println!("compiled {family} for compute_{a}"),
                    }
                    if ptxas {
                        for k in lab::gpu::ptxas::report(&ptx, a)? {
                            let spill = if k.spill_stores + k.spill_loads > 0 { format!(", SPILLS {} B stored / {} B loaded", k.spill_stores, k.spill_loads) } else { String::new() };
                            println!("  {:<44} {:>3} registers, {} B stack{spill}", k.name, k.registers, k.stack_bytes);
                            for n in &k.notes {
                                println!("    {n}");
                            }
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

type SanitizePlan = (Vec<lab::profile::sanitize::Tool>, Vec<String>, usize, std::time::Duration, u64);

fn sanitize(experiments: Vec<String>, (tools, variants, jobs, timeout, seed): SanitizePlan, cases: Vec<serde_json::Value>, out: PathBuf, backend: BackendChoice) -> Result<ExitCode> {
    use lab::profile::sanitize;
    let experiments: Vec<&'static str> = if experiments.is_empty() {
        lab::family::with_kernels().filter_map(|f| f.experiment).map(|e| e.name()).collect()
    } else {
        experiments.iter().map(|e| experiment::find(e).map(|e| e.name())).collect::<Result<_>>()?
    };
    let mut tools = tools;
    tools.sort();
    tools.dedup();
    let backend = backend.open()?;
    let plan = sanitize::Plan { experiments, tools, variants, jobs, timeout, seed, backend: backend.name() };
    let mut session = Session::new(backend, RunOptions { cases, ..RunOptions::new(out.clone(), seed) })?;
    let missing = sanitize::run(&mut session, &plan)?;
    let bad: Vec<&Record> = session.records.iter().filter(|r| r.verdict == Verdict::Fail).collect();
    for r in &bad {
        let s = &r.extra["sanitizer"];
        let what = s.get("first_error").or(s.get("failure")).and_then(|v| v.as_str()).unwrap_or("");
        println!("{} {} under {}: {} error(s) on {}
  {}", r.params["experiment"].as_str().unwrap_or(""), r.variant, s["tool"].as_str().unwrap_or(""), s["errors"], r.params["case"], what.replace('\n', "\n  "));
        if let Some(log) = s.get("log").and_then(|l| l.as_str()) {
            println!("  log: {}", out.join(log).display());
        }
        if let Some(cmd) = sanitize::reproduce(r) {
            println!("  again: {cmd}");
        }
    }
    for (e, vs) in &missing {
        println!("{e}: no sanitizer shape launches {}", vs.join(", "));
    }
    let library = session.records.iter().filter(|r| r.extra["sanitizer"]["status"] == "library").count();
    if library > 0 {
        println!("{library} record(s) with reports only in kernels outside the lab (a library the variant calls): kept in the records, not failed");
    }
    println!("\n{} records ({} with errors) -> {}", session.records.len(), bad.len(), session.run_file().display());
    Ok(if bad.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// A `--case`: a case as JSON, as records hold it.
fn case_json(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| LabError::Invalid(format!("--case `{text}` is not JSON: {e}")))
}

fn view(absolute: bool) -> View {
    if absolute {
        View::Absolute
    } else {
        View::Noise
    }
}

/// Python's `pydoc_data/topics.py` (it ships with every CPython), found through `python3`.
fn python_topics() -> Result<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import pydoc_data.topics as t; print(t.__file__)"])
        .output()
        .map_err(|e| LabError::Invalid(format!("cannot run python3 to find pydoc_data/topics.py ({e}): pass --text PATH")))?;
    if !out.status.success() {
        return Err(LabError::Invalid(format!("python3 could not find pydoc_data/topics.py ({}): pass --text PATH", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Says so when this binary was built from uncommitted changes: its records name the commit before
/// them, marked dirty, and the report's verification does not count them (build after committing).
fn note_if_dirty() {
    let git = lab::record::git_info();
    if git.dirty {
        eprintln!("note: this binary was built from {} with uncommitted changes: its records are marked dirty and do not count toward the report's verification", &git.commit[..git.commit.len().min(7)]);
    }
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
}

/// Non-zero when any figure failed its check.
fn exit_for(records: &[Record]) -> ExitCode {
    let implausible = records.iter().filter(|r| r.verdict == Verdict::Implausible).count();
    if implausible > 0 {
        eprintln!(
            "{implausible} record(s) beat the measured ceiling and are not results; likely causes: inputs \
             served from cache, an output nobody checked, or a wrong byte/flop count"
        );
    }
    let failed = records.iter().filter(|r| r.verdict == Verdict::Fail).count();
    if failed > 0 {
        eprintln!("{failed} record(s) failed their correctness check");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_table(records: &[Record]) {
    println!(
        "\n{:<11} {:<22} {:<12} {:<54} {:>10} {:>9} {:>8} {:>6} {:>9} {:<11}",
        "experiment", "variant", "provider", "params", "median ms", "GB/s", "TFLOP/s", "%ceil", "max err", "verdict"
    );
    for r in records {
        let params = r.params.to_string();
        let (median, tp) = (r.time_ms.as_ref().map(|t| t.median), r.throughput);
        println!(
            "{:<11} {:<22} {:<12} {:<54} {:>10} {:>9} {:>8} {:>6} {:>9} {:<11}",
            r.experiment,
            r.variant,
            r.provider,
            params,
            median.map_or("-".into(), |m| format!("{m:.4}")),
            tp.map_or("-".into(), |t| format!("{:.1}", t.gb_s)),
            tp.map_or("-".into(), |t| format!("{:.2}", t.tflop_s)),
            r.fraction_of_ceiling.map_or("-".into(), |f| format!("{:.0}%", f * 100.0)),
            r.error.as_ref().map_or("-".into(), |e| format!("{:.1e}", e.max_abs)),
            format!("{:?}", r.verdict).to_lowercase(),
        );
    }
}

/// Records a target names: one record id, every record of a run id, or a run file.
fn select(target: &str, dir: &std::path::Path) -> Result<Vec<Record>> {
    select_in_runs(target, dir).map(|(chosen, _)| chosen)
}

/// `lab generate`: tokens stream to stdout as they come, rates to stderr at the end.
fn generate(model: &std::path::Path, prompt: &str, chat: bool, max_tokens: usize, sampling: lab::model::llama::Sampling, backend: BackendChoice) -> Result<()> {
    use lab::model::llama::Engine;
    use lab::model::tokenizer::{ChatTemplate, Tokenizer};
    use std::io::Write;
    let file = lab::weights::gguf::GgufFile::open(model).map_err(|e| LabError::Invalid(e.to_string()))?;
    let g = file.parse().map_err(|e| LabError::Invalid(format!("{}: {e}", model.display())))?;
    let tok = Tokenizer::from_gguf(&g)?;
    let text = if chat {
        let template = ChatTemplate::from_gguf(&g)?.ok_or_else(|| LabError::Invalid(format!("{} has no chat template (tokenizer.chat_template)", model.display())))?;
        template.render(&[("user", prompt)], true)?
    } else {
        prompt.to_string()
    };
    let ids = tok.encode(&text, true)?;
    sampling.check()?;
    let engine = Engine::load(&backend.open()?, &g)?;
    let mut stream = tok.stream();
    let mut out = std::io::stdout().lock();
    let done = lab::model::llama::generate(&engine, &ids, max_tokens, sampling, |t| {
        if tok.is_eog(t) {
            return Ok(false);
        }
        if let Some(piece) = stream.step(t)? {
            out.write_all(piece.as_bytes()).and_then(|_| out.flush()).map_err(|e| LabError::io("stdout", e))?;
        }
        Ok(true)
    })?;
    writeln!(out).map_err(|e| LabError::io("stdout", e))?;
    let rate = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
    eprintln!(
        "{} prompt tokens in {:.1} ms ({:.0} tokens/s), {} new tokens at {:.1} tokens/s",
        ids.len(),
        done.prompt.as_secs_f64() * 1e3,
        rate(ids.len(), done.prompt),
        done.tokens.len(),
        rate(done.tokens.len().saturating_sub(1), done.decode)
    );
    Ok(())
}
