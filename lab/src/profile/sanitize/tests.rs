//! The sanitizer's parsing and splitting, on a log of every report form the tool prints.

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

/// memcheck's report of a failed CUDA API call: the library whose frame calls into the driver is
/// named as if it were a kernel, so that reports made inside NCCL count as a library's; the same
/// call made by the program itself stays the lab's.
#[test]
fn an_api_error_is_the_library_that_made_the_call() {
    let log = |caller: &str| {
        format!(
            "========= COMPUTE-SANITIZER
========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to \"invalid argument\" on CUDA API call to cuPointerGetAttribute.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: cuPointerGetAttribute [0x2b1f40] in /lib/x86_64-linux-gnu/libcuda.so.1
=========         Host Frame: {caller}
=========         Host Frame: main [0x430084] in lab
========= 
========= ERROR SUMMARY: 1 error
"
        )
    };
    let lab: BTreeSet<String> = ["ring_reduce_scatter_f32".to_string()].into();
    let nccl = parse(&log("ncclCommInitRank [0x5e0a] in /usr/lib/x86_64-linux-gnu/libnccl.so.2"));
    assert_eq!(nccl.kernels.keys().collect::<Vec<_>>(), ["API call from libnccl.so.2"]);
    assert!(nccl.only_outside(&lab));
    let own = parse(&log("lab::collective::open [0x1234] in lab"));
    assert_eq!((own.unattributed, own.kernels.len()), (1, 0));
    assert!(!own.only_outside(&lab));
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

/// racecheck's other report forms: a warning (warp-synchronous code), errors and warnings
/// in one log, a demangled kernel with its parameters and source line, hazard mode
/// (`--racecheck-report hazard`), and the older `at 0x... in file:line:kernel` form.
const RACECHECK_WARNING: &str = "========= COMPUTE-SANITIZER
========= Warning: Race reported between Write access at llama_rope_cache_f16+0x550
=========     and Read access at llama_rope_cache_f16+0x580 [64 hazards]
========= 
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
";
const RACECHECK_MIXED: &str = "========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at attention_fa2_d64_f16+0x1a0
=========     and Read access at attention_fa2_d64_f16+0x2b0 [12 hazards]
=========     and Read access at attention_fa2_d64_f16+0x2c0 [12 hazards]
========= 
========= Warning: Race reported between Read access at fold_blend(const float *, float *, int, int)+0x7600 in san.cu:18
=========     and Write access at fold_blend(const float *, float *, int, int)+0x63d0 in san.cu:16 [2048 hazards]
========= 
========= Error: Potential WAW hazard detected at __shared__ 0x0 in block (0,0,0) :
=========     Write Thread (0,0,0) at void ns::waw<float>(float *)+0x2f0 in raceWAW.cu:20
=========     Write Thread (1,0,0) at void ns::waw<float>(float *)+0x2f0 in raceWAW.cu:20
=========     Current Value : 1, Incoming Value : 2
========= 
========= Error: Race reported between Write access at 0x00000120 in raceGroupBasic.cu:36:sumKernel(int*, int*)
=========     and Read access at 0x00000180 in raceGroupBasic.cu:36:sumKernel(int*, int*) [4 hazards]
========= 
========= RACECHECK SUMMARY: 4 hazards displayed (3 errors, 1 warning)
";
/// synccheck's report (the same shape as memcheck's).
const SYNCCHECK: &str = "========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in warp
=========     at divergence_sorted_f32+0x1a0 in divergence.cu:47
=========     by thread (37,0,0) in block (0,0,0)
========= 
========= ERROR SUMMARY: 1 error
";

#[test]
fn every_racecheck_report_counts_and_names_its_kernel() {
    let o = parse(RACECHECK_WARNING);
    assert_eq!((o.errors, o.warnings, o.printed, o.unattributed, o.finished), (1, 1, 1, 0, true), "a warning is a hazard");
    assert_eq!(o.kernels.keys().collect::<Vec<_>>(), ["llama_rope_cache_f16"]);
    assert!(o.first.unwrap().starts_with("Warning: Race reported between Write access at llama_rope_cache_f16+0x550\nand Read access"));
    let o = parse(RACECHECK_MIXED);
    assert_eq!((o.errors, o.warnings, o.printed, o.unattributed), (4, 1, 4, 0));
    let named: Vec<(&str, u64)> = o.kernels.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(named, [("attention_fa2_d64_f16", 1), ("fold_blend", 1), ("ns::waw<float>", 1), ("sumKernel", 1)]);
    let o = parse(SYNCCHECK);
    assert_eq!((o.errors, o.printed), (1, 1));
    assert_eq!(o.kernels.keys().collect::<Vec<_>>(), ["divergence_sorted_f32"]);
    // Lines that only look alike name nothing.
    for line in ["and is inside the nearest allocation at 0x2a9a004800 of size 2,294 bytes", "Error: Potential WAW hazard detected at __shared__ 0x0 in block (0,0,0) :", "Access to 0x2a9a0050f0 is out of bounds"] {
        assert_eq!(kernel_named(line), None, "{line}");
    }
}

/// A report that names no kernel, or one the summary leaves out, is counted: a run is clean
/// only when the tool printed nothing, and `library` only when every report is printed and
/// names a kernel outside the lab.
#[test]
fn a_report_naming_no_kernel_is_neither_clean_nor_library() {
    let lab: BTreeSet<String> = ["llama_rope_cache_f16".to_string()].into();
    let status = |log: &str| {
        let o = parse(log);
        let f = Finding { outcome: &o, seconds: 1.0, failure: None, uninstrumented: None, log: None };
        let m = measurement("x", "v", Tool::Racecheck, &json!({}), "t", f, &lab);
        (m.extra["sanitizer"]["status"].as_str().unwrap().to_string(), m.error.unwrap().mismatches, m.extra["sanitizer"].clone())
    };
    let unnamed = "========= Warning: Detected overflow of tracked cuda::barrier structures. Results might be incorrect.\n========= \n";
    let (st, n, s) = status(&format!("========= COMPUTE-SANITIZER\n{unnamed}========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"));
    assert_eq!((st.as_str(), n, &s["unattributed"]), ("errors", 1, &json!(1)), "{s}");
    // cuBLAS's report beside one that names nothing: not the library's alone.
    let both = RACECHECK.replace("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)", &format!("{unnamed}========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"));
    assert_eq!(status(&both).0, "errors");
    assert_eq!(status(RACECHECK).0, "library");
    // Reports in a library's kernel that the tool did not all print.
    let unprinted = RACECHECK.replace("1 hazard displayed (1 error, 0 warnings)", "3 hazards displayed (3 errors, 0 warnings)");
    let (st, n, s) = status(&unprinted);
    assert_eq!((st.as_str(), n, &s["not_printed"]), ("errors", 3, &json!(2)), "{s}");
    // A warning in the lab's kernel fails it.
    let (st, n, s) = status(RACECHECK_WARNING);
    assert_eq!((st.as_str(), n, &s["warnings"], &s["kernels"]["llama_rope_cache_f16"]), ("errors", 1, &json!(1), &json!(1)), "{s}");
}

#[test]
fn the_tool_leaves_the_named_kernels_uninstrumented() {
    let log = std::path::Path::new("/tmp/x.log");
    let args = |re| sanitizer_args(Tool::Memcheck, re, log).into_iter().map(|a| a.into_string().unwrap()).collect::<Vec<_>>();
    assert_eq!(args(None), ["--tool", "memcheck", "--print-limit", "50000", "--show-backtrace", "yes", "--log-file", "/tmp/x.log"]);
    assert_eq!(args(Some("a|b")), ["--tool", "memcheck", "--print-limit", "50000", "--show-backtrace", "yes", "--kernel-name-exclude", "regex=a|b", "--log-file", "/tmp/x.log"]);
    // NCCL's kernels match, mangled or not; none of the lab's does.
    let re = Regex::new(crate::collective::nccl::NCCL_KERNELS).unwrap();
    for k in ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "_Z40ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE", "ncclKernel_AllReduce_RING_LL_Sum_float"] {
        assert!(re.is_match(k), "{k}");
    }
    for family in crate::family::with_kernels() {
        for line in crate::kernels::source(family.name).unwrap().lines().filter(|l| l.contains("__global__")) {
            assert!(!re.is_match(line), "{}: {line}", family.name);
        }
    }
}

/// nccl_allreduce under the tools: two ranks, NCCL's kernels uninstrumented except under
/// initcheck (which sees memory written only by the kernels it instruments).
#[test]
fn nccl_allreduce_runs_two_ranks_and_leaves_nccl_uninstrumented_but_under_initcheck() {
    use crate::experiment::Experiment;
    let e = crate::ops::nccl_allreduce::NcclAllReduce;
    let cases = e.sanitize_cases(&Backend::Cpu);
    assert!(!cases.is_empty() && cases.iter().all(|c| c["ranks"] == 2), "{cases:?}");
    assert_eq!(e.sanitize_uninstrumented(Tool::Initcheck), None);
    for tool in [Tool::Memcheck, Tool::Racecheck, Tool::Synccheck] {
        assert_eq!(e.sanitize_uninstrumented(tool), Some(crate::collective::nccl::NCCL_KERNELS));
    }
}

/// A kept log keeps its head and tail, whole lines of each, and says how much it left out.
#[test]
fn kept_logs_are_bounded() {
    let text: String = (0..100_000).map(|i| format!("========= line {i}\n")).collect();
    let kept = bounded(&text, 64 << 10);
    assert!(kept.len() < (64 << 10) + 64, "{}", kept.len());
    assert!(kept.starts_with("========= line 0\n") && kept.ends_with("========= line 99999\n"));
    let cut = kept.lines().find(|l| l.starts_with("[... ")).unwrap();
    let left: usize = cut.trim_start_matches("[... ").split(' ').next().unwrap().parse().unwrap();
    assert_eq!(kept.len() - cut.len() - 1 + left, text.len(), "{cut}");
    assert!(kept.lines().all(|l| l.starts_with("========= line ") || l == cut));
    assert_eq!(bounded("short\n", 64), "short\n");
}

#[test]
fn reports_only_in_library_kernels_do_not_fail_a_variant_and_the_labs_own_do() {
    let lab: BTreeSet<String> = ["quant_w4a16_mma_pipelined_asym_b1_f16".to_string()].into();
    let case = json!({"n": 37});
    let status = |log: &str| {
        let o = parse(log);
        let m = measurement("x", "v", Tool::Racecheck, &case, "t", Finding { outcome: &o, seconds: 1.0, failure: None, uninstrumented: None, log: None }, &lab);
        (m.extra["sanitizer"]["status"].as_str().unwrap().to_string(), m.error.unwrap().mismatches)
    };
    assert_eq!(status(RACECHECK), ("library".into(), 0));
    assert_eq!(status(MEMCHECK), ("errors".into(), 64));
}

/// An experiment's environment under a tool (NCCL's protocol under initcheck) is named in its
/// record and leads the command that repeats it; other tools and experiments set none.
#[test]
fn the_environment_a_tool_runs_with_is_recorded_and_repeated() {
    let o = Outcome { finished: true, ..Outcome::default() };
    let finding = |o| Finding { outcome: o, seconds: 1.0, failure: None, uninstrumented: None, log: None };
    let case = json!({"ranks": 2, "len": 1});
    let m = measurement("nccl_allreduce", "ring_p2p", Tool::Initcheck, &case, "2025.3.1.0", finding(&o), &BTreeSet::new());
    assert_eq!(m.extra["sanitizer"]["env"], json!({"NCCL_PROTO": "Simple"}));
    let line = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/report/records/2026-11-22T14-00-38Z-h100-14a3904.jsonl")).unwrap();
    let mut r: crate::record::Record = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    (r.params, r.extra) = (m.params.clone(), m.extra.clone());
    assert!(reproduce(&r).unwrap().starts_with("NCCL_PROTO=Simple compute-sanitizer --tool initcheck"), "{:?}", reproduce(&r));
    for (experiment, tool) in [("nccl_allreduce", Tool::Memcheck), ("softmax", Tool::Initcheck)] {
        let m = measurement(experiment, "v", tool, &case, "2025.3.1.0", finding(&o), &BTreeSet::new());
        assert!(m.extra["sanitizer"].get("env").is_none(), "{experiment} under {}", tool.name());
    }
}
