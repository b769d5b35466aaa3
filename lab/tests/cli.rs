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
/// record id; a damaged one is an error that names it.
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
    let e = read_records(packed.path()).unwrap_err().to_string();
    assert!(e.contains("zz.jsonl.gz") && e.contains("gzip"), "{e}");
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

/// A run whose every time is 50% longer (the machine slowed down, the code did not; the CPU
/// backend's samples on a busy machine are too noisy for less to be certain): a quick
/// vector_add run shares too few figures to estimate the drift between the runs, so the default
/// view reads each kernel against the copy ceiling of its run, says so and flags nothing;
/// `--absolute` calls every figure slower.
#[test]
fn compare_reads_a_uniform_slowdown_as_drift_unless_asked_for_the_absolute_change() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run_quick(dir.path(), "vector_add").status.success());
    let file = std::fs::read_dir(dir.path()).unwrap().next().unwrap().unwrap().path();
    let slowed: String = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| {
            let mut r: serde_json::Value = serde_json::from_str(l).unwrap();
            if let Some(raw) = r["timing"]["raw_ms"].as_array_mut() {
                raw.iter_mut().for_each(|t| *t = (t.as_f64().unwrap() * 1.5).into());
            }
            format!("{r}\n")
        })
        .collect();
    let other = dir.path().join("slowed.jsonl");
    std::fs::write(&other, slowed).unwrap();
    let (a, b) = (file.to_str().unwrap(), other.to_str().unwrap());

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
