//! The CLI end to end on the CPU backend: runs, records, loading, rerun, and bad input.

use lab::record::{load_with_damage, read_records, Verdict};
use std::path::Path;
use std::process::{Command, Output};

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lab")).args(args).output().expect("lab runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn run_quick(out: &Path, experiment: &str) -> Output {
    lab(&["run", experiment, "--quick", "--backend", "cpu", "--seed", "11", "--out", out.to_str().unwrap()])
}

#[test]
fn every_experiment_runs_on_the_cpu_backend_and_passes() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_quick(dir.path(), "all");
    assert!(o.status.success(), "{}", text(&o));
    let (records, damage) = read_records(dir.path()).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    for exp in lab::experiment::registry() {
        let mine: Vec<_> = records.iter().filter(|r| r.experiment == exp.name()).collect();
        assert!(!mine.is_empty(), "{} made no records", exp.name());
        for r in mine {
            assert_ne!(r.verdict, Verdict::Fail, "{} {} {}: {:?}", r.experiment, r.variant, r.params, r.error);
            // Correctness gates (odd shapes, hostile values) are checked, not timed.
            let gate = r.params["timed"] == false || r.params["fill"] == "hostile";
            match &r.time_ms {
                Some(t) => assert!(!gate && t.median > 0.0 && t.p20 <= t.median && t.median <= t.p80, "{:?}", r.params),
                None => assert!(gate && r.error.is_some(), "{} {} {} has no time", r.experiment, r.variant, r.params),
            }
            assert_eq!((r.backend.as_str(), r.device.name.as_str(), r.seed), ("cpu", "cpu", 11));
        }
    }
    // Ids are unique and run-scoped; the memory-bound ones are placed against the copy ceiling.
    let ids: std::collections::BTreeSet<_> = records.iter().map(|r| r.record_id.clone()).collect();
    assert_eq!(ids.len(), records.len());
    assert!(records.iter().any(|r| r.experiment == "vector_add" && r.fraction_of_ceiling.is_some()));
    // The checked-in softmax edge cases ran: a hostile fill and a 1 x 1 row.
    assert!(records.iter().any(|r| r.experiment == "softmax" && r.params["fill"] == "hostile"));
    assert!(records.iter().any(|r| r.experiment == "softmax" && r.params["cols"] == 1));
}

#[test]
fn records_load_into_a_frame_and_damage_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run_quick(dir.path(), "vector_add").status.success());
    let file = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let good = std::fs::read_to_string(&file).unwrap().lines().count();
    let mut future = serde_json::from_str::<serde_json::Value>(std::fs::read_to_string(&file).unwrap().lines().next().unwrap()).unwrap();
    future["schema"] = 99.into();
    let extra = format!("{{not json\n{future}\n{{\"schema\": 1, \"experiment\": \"x\"}}\n");
    std::fs::write(dir.path().join("zz-damaged.jsonl"), extra).unwrap();

    let (frame, damage) = load_with_damage(dir.path()).unwrap();
    assert_eq!(frame.height(), good);
    let lines: Vec<usize> = damage.iter().map(|d| d.line).collect();
    assert_eq!(lines, vec![1, 2, 3], "{damage:?}");
    assert!(damage[0].to_string().contains("zz-damaged.jsonl:1"));
    assert!(damage[1].why.contains("schema 99"));
    for col in ["experiment", "variant", "provider", "time_ms.median", "throughput.gb_s", "params.n", "device.name", "verdict"] {
        assert!(frame.column(col).is_ok(), "missing column {col}");
    }
}

/// A finished run kept gzip-compressed reads as the plain file does, by folder, by file and by
/// record id; a damaged one is damage that names it.
#[test]
fn gzip_compressed_run_files_read_as_the_plain_ones() {
    use std::io::Write;
    let plain = tempfile::tempdir().unwrap();
    assert!(run_quick(plain.path(), "vector_add").status.success());
    let file = std::fs::read_dir(plain.path()).unwrap().next().unwrap().unwrap().path();
    let packed = tempfile::tempdir().unwrap();
    let gz = packed.path().join(format!("{}.gz", file.file_name().unwrap().to_str().unwrap()));
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::best());
    enc.write_all(&std::fs::read(&file).unwrap()).unwrap();
    enc.finish().unwrap();

    let (a, damage_a) = read_records(plain.path()).unwrap();
    let (b, damage_b) = read_records(packed.path()).unwrap();
    assert!(!a.is_empty() && damage_a.is_empty() && damage_b.is_empty());
    let ids = |rs: &[lab::record::Record]| rs.iter().map(|r| r.record_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b));
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
    assert_eq!(read_records(&gz).unwrap().0.len(), a.len(), "the one file given");
    let out = tempfile::tempdir().unwrap();
    let o = lab(&["rerun", &a[0].record_id, "--records", packed.path().to_str().unwrap(), "--backend", "cpu", "--out", out.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));

    std::fs::write(packed.path().join("zz.jsonl.gz"), b"not gzip at all").unwrap();
    let (records, damage) = read_records(packed.path()).unwrap();
    assert_eq!(records.len(), a.len(), "a damaged file stops no other from loading");
    assert!(damage.len() == 1 && damage[0].to_string().contains("zz.jsonl.gz:1: not readable as gzip"), "{damage:?}");
}

#[test]
fn rerun_of_a_cpu_record_reproduces_its_correctness() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run_quick(dir.path(), "softmax").status.success());
    let (records, _) = read_records(dir.path()).unwrap();
    let target = records.iter().find(|r| r.variant == "cpu_online_rows" && r.params["fill"] == "hostile").unwrap();
    let out = tempfile::tempdir().unwrap();
    let o = lab(&["rerun", &target.record_id, "--records", dir.path().to_str().unwrap(), "--backend", "cpu", "--out", out.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (new, _) = read_records(out.path()).unwrap();
    // The rerun also measures the copy ceiling its record is a fraction of.
    let new: Vec<_> = new.into_iter().filter(|r| r.experiment == "softmax").collect();
    assert_eq!(new.len(), 1);
    assert_eq!((&new[0].variant, &new[0].params, new[0].seed), (&target.variant, &target.params, target.seed));
    assert_eq!(new[0].error.as_ref().unwrap().max_abs, target.error.as_ref().unwrap().max_abs, "same seed, same inputs, same error");
    assert!(text(&o).contains(&target.record_id));

    // A whole run file reruns too, and its timings are read as `lab compare` reads them.
    let file = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let o = lab(&["rerun", file.to_str().unwrap(), "--backend", "cpu", "--out", out.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("timing, A = the recorded run, B = this rerun:"), "{}", text(&o));
    assert!(text(&o).contains("with their run's ceiling") && text(&o).contains("between the runs: "), "{}", text(&o));
    let o = lab(&["rerun", file.to_str().unwrap(), "--backend", "cpu", "--absolute", "--threshold", "2", "--out", out.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("the threshold is a relative change from 0 up to 1"), "{}", text(&o));
}

/// A copy of the one run file in `from`, each record passed through `edit`, as the only file in
/// a fresh folder (a record id must name one record).
fn edited_run(from: &Path, edit: impl Fn(&mut serde_json::Value)) -> tempfile::TempDir {
    let file = std::fs::read_dir(from).unwrap().next().unwrap().unwrap().path();
    let text: String = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| {
            let mut r: serde_json::Value = serde_json::from_str(l).unwrap();
            edit(&mut r);
            format!("{r}\n")
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(file.file_name().unwrap()), text).unwrap();
    dir
}

fn rerun_in(records: &Path, target: &str, env: &[(&str, &Path)]) -> Output {
    let out = tempfile::tempdir().unwrap();
    let args = ["rerun", target, "--records", records.to_str().unwrap(), "--backend", "cpu", "--out", out.path().to_str().unwrap()];
    Command::new(env!("CARGO_BIN_EXE_lab")).args(args).envs(env.iter().copied()).output().expect("lab runs")
}

/// The llama check recorded on SmolLM2 as shipped, rerun on a copy of the file whose final norm
/// is negated (a changed model file, or a loader that reads it wrong): the figure no longer holds,
/// and the rerun exits 1 naming the record, its old and new verdicts.
#[test]
fn rerun_exits_1_when_a_correctness_figure_no_longer_holds() {
    let model = std::env::var("LAB_SMOLLM2_GGUF").expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh installs it)");
    let dir = tempfile::tempdir().unwrap();
    let o = lab(&["run", "llama", "--quick", "--backend", "cpu", "--seed", "11", "--variant", "engine", "--out", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (records, _) = read_records(dir.path()).unwrap();
    let check = records.iter().find(|r| r.params["op"] == "check").expect("a check record");
    assert_eq!(check.verdict, Verdict::Pass);

    let mut bytes = std::fs::read(&model).unwrap();
    let g = lab::weights::gguf::Gguf::parse(&bytes).unwrap();
    let norm = g.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.ty.name(), "F32");
    let (at, len) = ((g.data_offset + norm.offset) as usize, 4 * norm.elements() as usize);
    for w in bytes[at..at + len].chunks_exact_mut(4) {
        let v = -f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        w.copy_from_slice(&v.to_le_bytes());
    }
    let damaged = dir.path().join("damaged.gguf");
    std::fs::write(&damaged, bytes).unwrap();

    let o = rerun_in(dir.path(), &check.record_id, &[("LAB_SMOLLM2_GGUF", &damaged)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let row = String::from_utf8_lossy(&o.stdout).lines().find(|l| l.starts_with(&check.record_id)).map(str::to_string).unwrap_or_default();
    assert!(row.trim_end().ends_with("pass      fail"), "old pass, new fail: `{row}`\n{}", text(&o));
    assert!(text(&o).contains("1 record(s) no longer hold their correctness figures"), "{}", text(&o));
    // On the file as shipped the same record holds.
    let o = rerun_in(dir.path(), &check.record_id, &[("LAB_SMOLLM2_GGUF", Path::new(&model))]);
    assert!(o.status.success(), "{}", text(&o));
}

/// Records a rerun cannot reproduce: one naming a variant the table no longer has exits 1 and
/// says so; one whose params the experiment refuses is a usage error naming the problem. A record
/// much faster than the rerun is reported slower, but only correctness fails a rerun.
#[test]
fn rerun_names_what_it_cannot_reproduce_and_reports_a_slowdown_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run_quick(dir.path(), "vector_add").status.success());
    let (records, _) = read_records(dir.path()).unwrap();
    let target = records.iter().find(|r| r.variant == "cpu_scalar" && r.params["n"] == 65536).unwrap();
    let id = target.record_id.clone();
    let this = |r: &serde_json::Value| r["record_id"] == id.as_str();

    let retired = edited_run(dir.path(), |r| {
        if this(r) {
            r["variant"] = "cpu_retired".into();
        }
    });
    let o = rerun_in(retired.path(), &id, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("cpu_retired") && text(&o).contains("not reproduced: the variant no longer runs on this shape"), "{}", text(&o));
    assert!(text(&o).contains("1 record(s) no longer hold their correctness figures"), "{}", text(&o));

    let refused = edited_run(dir.path(), |r| {
        if this(r) {
            r["params"]["n"] = 0.into();
        }
    });
    let o = rerun_in(refused.path(), &id, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("error: ") && text(&o).contains("n must be at least 1"), "{}", text(&o));

    let faster = edited_run(dir.path(), |r| {
        if this(r) {
            for t in r["timing"]["raw_ms"].as_array_mut().unwrap() {
                *t = (t.as_f64().unwrap() / 10.0).into();
            }
            for k in ["median", "p20", "p80"] {
                r["time_ms"][k] = (r["time_ms"][k].as_f64().unwrap() / 10.0).into();
            }
        }
    });
    let o = rerun_in(faster.path(), &id, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let row = String::from_utf8_lossy(&o.stdout).lines().skip_while(|l| !l.starts_with("timing, A = the recorded run")).find(|l| l.starts_with("vector_add")).map(str::to_string);
    assert!(row.as_deref().is_some_and(|l| l.contains("cpu_scalar") && l.contains("slower")), "{row:?}\n{}", text(&o));
}

#[test]
fn rerun_of_a_thread_world_allreduce_record_reproduces_its_figure() {
    let dir = tempfile::tempdir().unwrap();
    let o = lab(&["run", "allreduce", "--quick", "--backend", "cpu", "--seed", "11", "--variant", "ring_blocking", "--out", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (records, _) = read_records(dir.path()).unwrap();
    assert!(records.iter().all(|r| r.variant == "ring_blocking" && r.params["transport"] == "threads"));
    // Fewer elements than ranks, on 4 ranks: an untimed gate.
    let target = records.iter().find(|r| r.params["ranks"] == 4 && r.params["len"] == 3).unwrap();
    let out = tempfile::tempdir().unwrap();
    let o = lab(&["rerun", &target.record_id, "--records", dir.path().to_str().unwrap(), "--backend", "cpu", "--out", out.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let (new, _) = read_records(out.path()).unwrap();
    assert_eq!(new.len(), 1);
    assert_eq!((&new[0].params, new[0].verdict), (&target.params, Verdict::Pass));
    assert_eq!(new[0].error.as_ref().unwrap().max_abs, target.error.as_ref().unwrap().max_abs, "same seed, same inputs, same sums");
}

#[test]
fn bad_input_gets_a_clear_error_and_no_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["run", "no_such_experiment", "--backend", "cpu", "--out", d], "unknown experiment `no_such_experiment`"),
        (&["rerun", "nothing#0", "--records", d, "--backend", "cpu"], "no record, run or run file `nothing#0`"),
        (&["rerun", "x#0", "--records", "/nonexistent/records", "--backend", "cpu"], "/nonexistent/records"),
    ];
    for (args, expect) in cases {
        let o = lab(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(expect), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{args:?}: {}", text(&o));
    }
    // No GPU here: asking for CUDA says so plainly.
    if lab::gpu::unavailable_reason().is_some() {
        let o = lab(&["run", "softmax", "--backend", "cuda", "--quick", "--out", d]);
        assert_eq!(o.status.code(), Some(2));
        assert!(text(&o).contains("no CUDA GPU is usable"), "{}", text(&o));
    }
}

#[test]
fn list_names_every_experiment() {
    let o = lab(&["list"]);
    for e in lab::experiment::registry() {
        assert!(text(&o).contains(e.name()));
    }
}

/// The table rows of `lab compare`'s output (the header and the summary after the blank line
/// left out).
fn table_rows(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout).lines().skip(1).take_while(|l| !l.is_empty()).map(str::to_string).collect()
}

#[test]
fn compare_reads_a_run_against_itself_as_no_change_and_refuses_other_hardware() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run_quick(dir.path(), "vector_add").status.success());
    let file = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let f = file.to_str().unwrap();
    for view in [&[][..], &["--absolute"][..]] {
        let o = lab(&[&["compare", f, f][..], view].concat());
        assert!(o.status.success(), "{}", text(&o));
        let lines = table_rows(&o);
        let same = |l: &String| l.contains("no detectable change") || l.ends_with("yardstick: its change is drift");
        assert!(!lines.is_empty() && lines.iter().all(same), "{}", text(&o));
        assert!(text(&o).contains("0 slower, 0 faster"), "{}", text(&o));
    }

    // The same run, said to come from another GPU: refused, then compared when forced.
    let other = dir.path().join("other.jsonl");
    let moved = std::fs::read_to_string(&file).unwrap().replace("\"name\":\"cpu\"", "\"name\":\"NVIDIA H100 80GB HBM3\"");
    std::fs::write(&other, moved).unwrap();
    let o = lab(&["compare", f, other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("device.name: `cpu` vs `NVIDIA H100 80GB HBM3`"), "{}", text(&o));
    assert!(lab(&["compare", f, other.to_str().unwrap(), "--force"]).status.success());

    for bad in ["--threshold=1.5", "--threshold=-0.01", "--threshold=NaN"] {
        let o = lab(&["compare", f, f, bad]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("the threshold is a relative change from 0 up to 1"), "{}", text(&o));
    }
}

/// A run whose every time is 50% longer (the machine slowed down, the code did not): a quick
/// vector_add run shares too few figures to estimate the drift between the runs, so the default
/// view reads each kernel against the copy ceiling of its run, says so and flags nothing;
/// `--absolute` calls every figure slower. The samples of both runs are set to a fixed ±0.2%
/// spread around each figure's first sample, so the verdicts depend on the comparison alone and
/// not on how busy the machine running the test is (a 1-element CPU add can vary by 2x).
#[test]
fn compare_reads_a_uniform_slowdown_as_drift_unless_asked_for_the_absolute_change() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run_quick(dir.path(), "vector_add").status.success());
    let file = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let retimed = |scale: f64| -> String {
        let run = std::fs::read_to_string(&file).unwrap();
        run.lines()
            .map(|l| {
                let mut r: serde_json::Value = serde_json::from_str(l).unwrap();
                if let Some(raw) = r["timing"]["raw_ms"].as_array_mut() {
                    let first = raw[0].as_f64().unwrap();
                    raw.iter_mut().enumerate().for_each(|(k, t)| *t = (first * scale * (1.0 + 0.001 * (k % 5) as f64 - 0.002)).into());
                }
                format!("{r}\n")
            })
            .collect()
    };
    let (steady, slowed) = (dir.path().join("steady.jsonl"), dir.path().join("slowed.jsonl"));
    std::fs::write(&steady, retimed(1.0)).unwrap();
    std::fs::write(&slowed, retimed(1.5)).unwrap();
    let (a, b) = (steady.to_str().unwrap(), slowed.to_str().unwrap());

    let o = lab(&["compare", a, b]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = table_rows(&o);
    let kernels: Vec<_> = rows.iter().filter(|l| l.starts_with("vector_add")).collect();
    assert!(!kernels.is_empty() && kernels.iter().all(|l| l.contains("copy_gb_s") && l.ends_with("no detectable change (relative)")), "{}", text(&o));
    assert!(rows.iter().filter(|l| l.starts_with("ceilings")).all(|l| l.ends_with("yardstick: its change is drift")), "{}", text(&o));
    assert!(text(&o).contains("each figure is judged as the relative view judges it"), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "relative to the peer or ceiling of its run (interval beyond ±2.0%): 0 slower, 0 faster; absolute (--absolute; interval beyond ±2.0%, yardsticks judged too): {} slower",
            rows.len()
        )),
        "{}",
        text(&o)
    );

    let o = lab(&["compare", a, b, "--absolute"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(table_rows(&o).iter().all(|l| l.ends_with("slower")), "{}", text(&o));
}

#[test]
fn a_shape_from_the_command_line_is_run_and_recorded_and_a_bad_key_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let o = lab(&["run", "softmax", "--backend", "cpu", "--quick", "--shape", "rows=3,cols=5,dtype=f32", "--out", out]);
    assert!(o.status.success(), "{}", text(&o));
    let (records, _) = read_records(dir.path()).unwrap();
    let mine: Vec<_> = records.iter().filter(|r| r.experiment == "softmax").collect();
    assert!(!mine.is_empty());
    for r in mine {
        assert_eq!((r.params["rows"].as_u64(), r.params["cols"].as_u64(), r.params["dtype"].as_str()), (Some(3), Some(5), Some("f32")));
        assert_eq!(r.params_from.as_deref(), Some("command line"));
    }
    // The run's ceiling is its own measurement, not the command line's.
    assert!(records.iter().filter(|r| r.experiment == "ceilings").all(|r| r.params_from.is_none()));
    let o = lab(&["run", "softmax", "--backend", "cpu", "--quick", "--shape", "rows=3,colz=5", "--out", out]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("softmax has no parameter `colz`; it takes cols"), "{}", text(&o));
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, 1, "a refused --shape must not leave a run file");
}

#[test]
fn variant_tables_are_listed_per_family() {
    let o = lab(&["list", "--variants", "softmax"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("onchip_block_per_row") && text(&o).contains("sm_90+"), "{}", text(&o));
    let o = lab(&["list", "--variants", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("no family `nope` (one of: ceilings,"), "{}", text(&o));
}

/// The README's promise: softmax, RMSNorm, a GEMM and a W4A16 product on tensors a program made,
/// through the public functions, checked element by element (here on the CPU backend).
#[test]
fn the_ops_example_runs_on_the_cpu_backend() {
    let exe = Path::new(env!("CARGO_BIN_EXE_lab")).parent().unwrap().join("examples/ops_on_tensors");
    let o = Command::new(&exe).arg("cpu").output().unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    assert!(o.status.success(), "{}", text(&o));
    for what in ["softmax 5 x 1001", "rmsnorm 5 x 1001", "gemm f16 37 x 72 x 136", "w4a16 2 x 512 -> 96"] {
        assert!(text(&o).contains(what), "{what} missing: {}", text(&o));
    }
    let o = Command::new(&exe).arg("tpu").output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("unknown backend `tpu`"), "{}", text(&o));
}

/// Stands in for compute-sanitizer: runs the command it wraps and writes a log that reports two
/// errors for any run that launches gemm's case with m = 33 (a whole gemm run launches it), none
/// otherwise. With LAB_STUB_HANG set, a run of a case with m = 97 hangs after the log's header.
const STUB_SANITIZER: &str = r#"#!/bin/sh
while [ "${1#--}" != "$1" ]; do
  case "$1" in
    --version) echo "Version 0.0.1 (stub)"; exit 0;;
    --log-file) log="$2"; shift 2;;
    *) shift 2;;
  esac
done
case "$LAB_STUB_HANG $*" in
  1*'"m":97'*) echo "========= COMPUTE-SANITIZER" > "$log"; echo "stub: hanging" >&2; sleep 30;;
esac
"$@"; rc=$?
n=0
case "$*" in
  *'"m":33'*) n=2;;
  *--case*) ;;
  *" run gemm "*) n=2;;
esac
{
  echo "========= COMPUTE-SANITIZER"
  if [ "$n" -gt 0 ]; then
    echo "========= Invalid __global__ read of size 4 bytes"
    echo "=========     at planted_kernel+0x10"
    echo "=========     by thread (0,0,0) in block (0,0,0)"
    echo "========="
  fi
  echo "========= ERROR SUMMARY: $n errors"
} > "$log"
exit $rc
"#;

/// A folder holding STUB_SANITIZER as an executable `compute-sanitizer`.
fn stub_sanitizer() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let stub = dir.path().join("compute-sanitizer");
    std::fs::write(&stub, STUB_SANITIZER).unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, stub)
}

#[test]
fn sanitize_pins_each_error_on_its_variant_and_shape_and_exits_1() {
    let (dir, stub) = stub_sanitizer();
    let out = dir.path().join("records");
    let sanitize = |exp: &str| {
        Command::new(env!("CARGO_BIN_EXE_lab"))
            .args(["sanitize", exp, "--tool", "memcheck,racecheck", "--backend", "cpu", "--seed", "3", "--out", out.to_str().unwrap()])
            .env("LAB_COMPUTE_SANITIZER", &stub)
            .output()
            .unwrap()
    };
    let o = sanitize("gemm");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("planted_kernel"), "{}", text(&o));
    let (records, damage) = read_records(&out).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    // Every gate of cpu_blocked under both tools; only those with m = 33 carry the errors.
    assert!(!records.is_empty());
    for r in &records {
        let s = &r.extra["sanitizer"];
        assert_eq!((r.experiment.as_str(), r.variant.as_str(), r.params["experiment"].as_str()), ("sanitize", "cpu_blocked", Some("gemm")));
        let planted = r.params["case"]["m"] == 33;
        assert_eq!(s["errors"], if planted { 2 } else { 0 }, "{}", r.params);
        assert_eq!(r.verdict == Verdict::Fail, planted);
        assert_eq!(s["status"], if planted { "errors" } else { "clean" });
        if planted {
            assert_eq!(s["kernels"]["planted_kernel"], 1);
            assert!(s["first_error"].as_str().unwrap().starts_with("Invalid __global__ read"));
        }
    }
    let tools: std::collections::BTreeSet<_> = records.iter().map(|r| r.params["tool"].as_str().unwrap()).collect();
    assert_eq!(tools.into_iter().collect::<Vec<_>>(), ["memcheck", "racecheck"]);
    assert_eq!(records.iter().filter(|r| r.verdict == Verdict::Fail).count(), 4, "m = 33 in f32 and bf16, under each tool");
    // Where nothing erred, the command passes.
    let o = sanitize("softmax");
    assert!(o.status.success(), "{}", text(&o));
}

/// The log of every process that found something or did not finish is kept beside the records
/// and named in its record; a clean record names none.
#[test]
fn sanitize_keeps_the_log_of_each_finding_and_of_each_run_that_did_not_finish() {
    let (dir, stub) = stub_sanitizer();
    let out = dir.path().join("records");
    let o = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(["sanitize", "gemm", "--tool", "memcheck", "--backend", "cpu", "--seed", "3", "--timeout", "3", "--out", out.to_str().unwrap()])
        .env("LAB_COMPUTE_SANITIZER", &stub)
        .env("LAB_STUB_HANG", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (records, _) = read_records(&out).unwrap();
    let mut kept = std::collections::BTreeSet::new();
    for r in &records {
        let s = &r.extra["sanitizer"];
        let m = &r.params["case"]["m"];
        let Some(log) = s.get("log").and_then(|l| l.as_str()) else {
            assert_eq!(s["status"], "clean", "{s}");
            continue;
        };
        let path = out.join(log);
        let body = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(log.starts_with(&format!("sanitizer-logs/{}/gemm-cpu_blocked-memcheck-", r.run_id)), "{log}");
        assert!(body.contains("==== the run's standard error ===="), "{body}");
        if *m == 33 {
            assert_eq!(s["status"], "errors");
            assert!(body.contains("at planted_kernel+0x10") && body.contains("ERROR SUMMARY: 2 errors"), "{body}");
        } else {
            assert_eq!((m, &s["status"], &s["failure"]), (&serde_json::json!(97), &serde_json::json!("incomplete"), &serde_json::json!("did not finish in 3 s")), "{s}");
            assert!(body.starts_with("========= COMPUTE-SANITIZER") && body.contains("stub: hanging"), "{body}");
        }
        assert!(text(&o).contains(&format!("log: {}", path.display())), "{}", text(&o));
        kept.insert(path);
    }
    assert_eq!(kept.len(), 4, "m = 33 and m = 97, in f32 and bf16");
    let folder = kept.iter().next().unwrap().parent().unwrap();
    assert_eq!(std::fs::read_dir(folder).unwrap().count(), kept.len(), "no log that no record names");
}

/// A run killed mid-way (SIGKILL, nothing flushed on the way out) leaves a file whose complete
/// lines all read back; a line torn by the kill is reported as such, by the reader and by the
/// report, and the records before it are kept.
#[test]
fn a_killed_run_keeps_every_complete_record_and_a_torn_last_line_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(["run", "softmax", "layernorm", "rmsnorm", "gemm", "--backend", "cpu", "--seed", "5", "--out", dir.path().to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let file = loop {
        let lines = std::fs::read_dir(dir.path())
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| (e.path(), std::fs::read_to_string(e.path()).unwrap_or_default().lines().count()));
        match lines {
            Some((path, n)) if n >= 3 => break path,
            _ if started.elapsed().as_secs() > 120 => panic!("the run wrote no 3 records in 120 s"),
            _ => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    };
    child.kill().unwrap(); // SIGKILL
    assert!(!child.wait().unwrap().success(), "the run finished before it was killed; the test needs a longer one");
    let text = std::fs::read_to_string(&file).unwrap();
    let complete = text.matches('\n').count();
    let (records, damage) = read_records(dir.path()).unwrap();
    assert_eq!(records.len(), complete, "every complete line reads back");
    assert!(damage.len() <= 1, "{damage:?}");

    // Tear the last line as a kill during its write would, and read again.
    let last_start = text[..text.len() - 1].rfind('\n').map_or(0, |i| i + 1);
    let torn = &text[..last_start + (text.len() - last_start) / 2];
    std::fs::write(&file, torn).unwrap();
    let (records, damage) = read_records(dir.path()).unwrap();
    assert_eq!(records.len(), complete - 1);
    assert_eq!(damage.len(), 1);
    assert!(damage[0].why.starts_with("torn last line"), "{}", damage[0]);
    let notes = tempfile::tempdir().unwrap();
    let templates = concat!(env!("CARGO_MANIFEST_DIR"), "/../templates").into();
    let opts = lab::report::ReportOptions { records: dir.path().into(), notes: notes.path().into(), templates, ..Default::default() };
    let rendered = lab::report::render(&opts).unwrap();
    assert!(rendered.warnings.iter().any(|w| w.contains("torn last line")), "{:?}", rendered.warnings);
}

/// `lab quantize` writes a model the reader takes, in the format asked for, and never replaces a
/// file or writes a format it does not know.
#[test]
fn quantize_writes_a_model_and_keeps_an_existing_file() {
    let model = std::env::var("LAB_SMOLLM2_GGUF").expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q8.gguf");
    let o = lab(&["quantize", "--model", &model, "--format", "q8_0", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("(Q8_0, "), "{}", text(&o));
    let file = lab::weights::gguf::GgufFile::open(&out).unwrap();
    let g = file.parse().unwrap();
    assert_eq!(g.tensor("blk.0.attn_q.weight").unwrap().ty, lab::weights::gguf::GgmlType::Q8_0);
    let before = std::fs::read(&out).unwrap().len();
    let o = lab(&["quantize", "--model", &model, "--format", "q4_0", "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("exists: choose another name"), "{}", text(&o));
    assert_eq!(std::fs::read(&out).unwrap().len(), before);
    let o = lab(&["quantize", "--model", &model, "--format", "q3_k", "--out", dir.path().join("x.gguf").to_str().unwrap()]);
    assert!(text(&o).contains("unknown format `q3_k`"), "{}", text(&o));
}

#[test]
fn compile_takes_named_families_and_names_an_unknown_one() {
    let dir = tempfile::tempdir().unwrap();
    let o = lab(&["compile", "--arch", "80", "--family", "softmax", "--emit", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let written: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(written, ["softmax.compute_80.ptx"]);
    let o = lab(&["compile", "--arch", "80", "--family", "sotfmax"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no kernel family `sotfmax` (families with kernels: "), "{}", text(&o));
}
