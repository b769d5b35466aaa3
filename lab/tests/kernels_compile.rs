//! Every kernels/*.cu compiles with NVRTC for sm_80, sm_90 and sm_90a, and exports exactly the symbols
//! the Rust launchers ask for. Needs NVRTC (scripts/test.sh installs the wheels): a missing
//! NVRTC is a failure here, never a skip. PTX is cached under cargo's target folder for tests,
//! never in the user's cache.

use lab::gpu::compile::{compile_family_in, compile_source_in, nvrtc_version, Target};
use lab::kernels::{symbol, DType};
use lab::ops::variant::Requires;
use std::collections::BTreeSet;

/// The tests' PTX cache: cargo's scratch folder for integration tests (removed by `cargo clean`).
fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ptx")
}

fn compile_family(family: &str, target: impl Into<Target>) -> lab::Result<String> {
    compile_family_in(Some(&cache()), family, target)
}

fn entries(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| l.split(".entry ").nth(1))
        .map(|rest| rest.trim_end_matches(['(', ' ']).split('(').next().unwrap().trim().to_string())
        .collect()
}

#[test]
fn nvrtc_is_present() {
    let v = nvrtc_version().expect("NVRTC must be loadable for the test suite (run scripts/test.sh)");
    assert!(v.0 >= 12, "NVRTC {v:?} is older than CUDA 12");
}

/// Every .cu file under kernels/ belongs to exactly one family of `lab::family::FAMILIES`.
#[test]
fn families_match_the_kernels_folder() {
    fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let path = e.path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|x| x == "cu") {
                out.push(path.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let base = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels"));
    let mut on_disk = Vec::new();
    walk(base, base, &mut on_disk);
    on_disk.sort();
    let mut listed: Vec<String> = lab::family::FAMILIES.iter().flat_map(|f| f.kernels.iter().map(|(p, _)| p.to_string())).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "kernels/**/*.cu and lab::family::FAMILIES disagree");
}

#[test]
fn every_family_compiles_for_sm80_sm90_and_sm90a() {
    // 90a is what an H100 compiles (Target::for_device(90)); 80 and plain 90 keep the guarded
    // sm_90a code out and must still build.
    for target in [Target::from(80), Target::from(90), Target::for_device(90)] {
        for family in lab::family::with_kernels().map(|f| f.name) {
            let ptx = compile_family(family, target).unwrap_or_else(|e| panic!("{e}"));
            assert!(!entries(&ptx).is_empty(), "{family} for compute_{target} exports no kernel");
        }
    }
}

/// The decode step's kernels wait for their upstream (kernels/pdl.cuh) on sm_90, so a graph may
/// give them programmatic edges; on sm_80 none does, and kernels without the wait (the rest of
/// the quant ladder) are never taken for ones that have it.
#[test]
fn the_decode_steps_kernels_wait_for_their_upstream_on_sm90_only() {
    use lab::gpu::graph::kernels_that_wait;
    let decode = [
        (
            "llama",
            vec![
                "llama_embed_q8_0_f32",
                "llama_add_rmsnorm_f16",
                "llama_rope_cache_f16",
                "llama_swiglu_f16",
                "llama_argmax_f32",
                "llama_sample_f32",
                "llama_qkv_rope_q4_1_f16",
                "llama_gate_up_swiglu_q4_1_f16",
                "llama_residual_q4_1_f16",
            ],
        ),
        ("attention", vec!["attention_decode_split_d64_g4_f16", "attention_decode_split_d64_g4_bf16", "attention_decode_mma_d128_bf16", "attention_decode_merge_d64_f16", "attention_decode_combine_f16", "attention_decode_combine_bf16"]),
        ("quant", vec!["quant_w4a16_mma_tiled_post_asym_b1_f16", "quant_w4a16_mma_tiled_asym_b16_f16", "quant_w8a16_b1_f16", "quant_w8a16_b16_f16"]),
    ];
    for (family, kernels) in decode {
        let waiting: BTreeSet<String> = kernels_that_wait(&compile_family(family, Target::for_device(90)).unwrap()).into_iter().collect();
        for k in &kernels {
            assert!(waiting.contains(*k), "{k} does not wait for its upstream on sm_90a");
        }
        assert!(kernels_that_wait(&compile_family(family, 80).unwrap()).is_empty(), "{family} waits on sm_80");
        if family == "quant" {
            for k in ["quant_w4a16_mma_pipelined_asym_b1_f16", "quant_w4a16_mma_tiled_bulk_asym_b1_f16", "quant_dequant_q8_0_f16"] {
                assert!(!waiting.contains(k), "{k} has no wait but is taken for one that has");
            }
        }
    }
}

#[test]
fn the_wgmma_kernels_are_built_for_sm90a_only() {
    let hopper = [
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
        "cp.async.bulk.tensor.2d",
        "cp.async.bulk.tensor.3d",
        "mbarrier.test_wait.parity",
        "elect.sync",
        "mbarrier.try_wait.parity",
        "setmaxnreg.inc",
    ];
    let ptx = compile_family("gemm", Target::for_device(90)).unwrap_or_else(|e| panic!("{e}"));
    assert!(ptx.contains(".target sm_90a"), "not built for sm_90a");
    for needle in hopper {
        assert!(ptx.contains(needle), "`{needle}` missing from the sm_90a PTX");
    }
    let roof = compile_family("ceilings", Target::for_device(90)).unwrap_or_else(|e| panic!("{e}"));
    assert!(roof.contains("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16"), "the wgmma roof is missing from the sm_90a PTX");
    for target in [Target::from(80), Target::from(90)] {
        for family in ["gemm", "ceilings"] {
            let ptx = compile_family(family, target).unwrap_or_else(|e| panic!("{e}"));
            assert!(!ptx.contains("wgmma.mma_async"), "compute_{target} {family} PTX holds wgmma");
            assert!(!ptx.contains("cp.async.bulk.tensor"), "compute_{target} {family} PTX holds TMA copies");
        }
        let ptx = entries(&compile_family("gemm", target).unwrap_or_else(|e| panic!("{e}")));
        let sm90a = lab::ops::gemm::VARIANTS.iter().filter(|v| v.requires == Requires::Sm90a);
        for v in sm90a {
            assert!(ptx.contains(&symbol("gemm", v.name, DType::F16)), "compute_{target} lacks the (trapping) {} entry", v.name);
        }
    }
}

#[test]
fn exported_symbols_are_the_ones_the_launchers_use() {
    let expect = |family: &str, variants: &[&str], dtypes: &[DType]| -> BTreeSet<String> {
        variants.iter().flat_map(|v| dtypes.iter().map(move |d| symbol(family, v, *d))).collect()
    };
    use lab::ops::variant::gpu_symbols;
    // What an H100 loads (90a) and the portable targets export the same entries: a launcher never
    // asks for a symbol one of them lacks.
    for target in [Target::from(80), Target::from(90), Target::for_device(90)] {
        let ptx = |family| entries(&compile_family(family, target).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(ptx("softmax"), gpu_symbols("softmax", lab::ops::softmax::VARIANTS), "softmax for compute_{target}");
        assert_eq!(ptx("vector_add"), gpu_symbols("vector_add", lab::ops::vector_add::VARIANTS), "vector_add for compute_{target}");
        assert_eq!(ptx("ceilings"), gpu_symbols("ceilings", lab::ops::ceilings::VARIANTS), "ceilings for compute_{target}");
        assert_eq!(ptx("loader"), expect("loader", &["consume"], &[DType::F32]), "loader for compute_{target}");
        let all = [DType::F32, DType::F16, DType::Bf16];
        let gelu_kernels = ["unfused_add", "unfused_gelu_tanh", "unfused_gelu_erf", "fused_tanh", "fused_erf", "fused_tanh_sigmoid"];
        assert_eq!(ptx("bias_gelu"), expect("bias_gelu", &gelu_kernels, &all), "bias_gelu for compute_{target}");
        assert_eq!(ptx("layernorm"), gpu_symbols("layernorm", lab::ops::layernorm::VARIANTS), "layernorm for compute_{target}");
        let rmsnorm: BTreeSet<String> = gpu_symbols("rmsnorm", lab::ops::rmsnorm::VARIANTS).into_iter().chain(expect("rmsnorm", &lab::ops::rmsnorm::BACKWARD_KERNELS, &[DType::F32])).collect();
        assert_eq!(ptx("rmsnorm"), rmsnorm, "rmsnorm for compute_{target}");
        let linear = ["bias_act_none", "bias_act_relu", "bias_act_gelu", "act_backward_none", "act_backward_relu", "act_backward_gelu", "bias_grad_partial", "bias_grad_final"];
        assert_eq!(ptx("linear"), expect("linear", &linear, &[DType::F32, DType::Bf16]), "linear for compute_{target}");
        assert_eq!(ptx("gemm"), gpu_symbols("gemm", lab::ops::gemm::VARIANTS), "gemm for compute_{target}");
        assert_eq!(ptx("divergence"), gpu_symbols("divergence", lab::ops::divergence::VARIANTS), "divergence for compute_{target}");
        assert_eq!(ptx("quant"), lab::ops::quant::variants::gpu_kernels().into_iter().collect(), "quant for compute_{target}");
        let collective: BTreeSet<String> = expect("collective", &["add"], &all).into_iter().chain(["collective_copy".to_string()]).collect();
        assert_eq!(ptx("collective"), collective, "collective for compute_{target}");
        assert_eq!(ptx("attention"), lab::ops::attention::gpu_symbols(), "attention for compute_{target}");
        assert_eq!(ptx("llama"), gpu_symbols("llama", lab::ops::llama::VARIANTS), "llama for compute_{target}");
        assert_eq!(ptx("reference"), expect("reference", &["gemm"], &all), "reference for compute_{target}");
        assert_eq!(ptx("moe"), lab::ops::moe::gpu_symbols(), "moe for compute_{target}");
        assert_eq!(ptx("train"), expect("train", &lab::train::steps::KERNELS, &[DType::F32]), "train for compute_{target}");
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_a_clear_error() {
    let err = compile_family("no_such_family", 90).unwrap_err().to_string();
    assert!(err.contains("no kernel family `no_such_family`"), "{err}");
    // A syntax error comes back with the family, the architecture and NVRTC's own log.
    let broken = "extern \"C\" __global__ void broken_f32(float* y) { y[0] = undeclared_name; }";
    let err = compile_source_in(Some(&cache()), "broken", broken, 90).unwrap_err().to_string();
    assert!(err.contains("`broken` failed to compile for compute_90"), "{err}");
    assert!(err.contains("undeclared_name"), "NVRTC's log is missing: {err}");
}

/// An entry's header in PTX: (parameter count, `.maxntid` x, `.minnctapersm`).
fn entry_headers(ptx: &str) -> std::collections::BTreeMap<String, (usize, Option<usize>, Option<usize>)> {
    let directive = |head: &str, name: &str| head.lines().find_map(|l| l.trim().strip_prefix(name)).and_then(|v| v.split(',').next()).map(|v| v.trim().parse().unwrap());
    ptx.split(".entry ")
        .skip(1)
        .map(|chunk| {
            let name = chunk.split('(').next().unwrap().trim().to_string();
            let (params, rest) = chunk.split_once(')').unwrap();
            let head = rest.split('{').next().unwrap();
            (name, (params.matches("_param_").count(), directive(head, ".maxntid"), directive(head, ".minnctapersm")))
        })
        .collect()
}

/// The quant launchers' assumptions, read from what NVRTC compiles rather than from the text:
/// each W4A16 kernel takes the arguments its launcher pushes and is built for the block size
/// (and, where it reserves shared memory per block, the blocks per SM) the launcher uses.
#[test]
fn the_quant_kernels_take_the_launch_the_table_gives() {
    use lab::ops::quant::variants::{w4_designs, w4_kernel, BATCHES};
    use lab::quant::Scheme;
    let headers = entry_headers(&compile_family("quant", 90).unwrap_or_else(|e| panic!("{e}")));
    for (name, d) in w4_designs() {
        for scheme in [Scheme::Sym, Scheme::Asym] {
            for &b in BATCHES {
                let sym = symbol("quant", &w4_kernel(name, scheme, b), DType::F16);
                let (params, threads, min_blocks) = headers[&sym];
                // codes, scales, (mins), x, y, (workspace, counters), n, k, group
                assert_eq!(params, 7 + usize::from(scheme == Scheme::Asym) + 2 * usize::from(d.split_k()), "{sym}");
                assert_eq!(threads, Some(32 * d.warps), "{sym}");
                if d.launch_shape(8192, 8192, b, scheme, 132).2 > 0 {
                    assert_eq!(min_blocks, Some(d.blocks_per_sm()), "{sym}");
                }
            }
        }
    }
    for (name, _, _) in lab::ops::quant::variants::stream_reads() {
        // a, bytes, b, bytes, c, bytes, out; blocks of 256.
        assert_eq!(headers[&symbol("quant", name, DType::F16)], (7, Some(256), None), "{name}");
    }
    use lab::ops::quant::variants::{q8_symbol, W8_BATCHES, W8_WARPS};
    for &b in W8_BATCHES {
        // w, x, y, n, k, batch, rows per warp.
        assert_eq!(headers[&q8_symbol("w8a16", b).unwrap()], (7, Some(32 * W8_WARPS), None), "w8a16 b{b}");
    }
    // w, ids, out, ids, k, rows / w, out, rows, k.
    assert_eq!(headers[&q8_symbol("embed", 1).unwrap()].0, 6);
    assert_eq!(headers[&q8_symbol("dequant", 1).unwrap()].0, 4);
}

/// The constants the Rust side shares with kernels/quant/, as NVRTC evaluates them (probe_u32).
#[test]
fn the_quant_constants_are_the_kernels() {
    use lab::ops::quant::variants::*;
    use lab::quant::Scheme;
    let exprs = [
        "MMA_WARPS", "MMA_ROWS", "W4_WARPS", "PIPE_WARPS", "PIPE_CHUNKS", "PIPE_STAGES", "PIPE_SVECS", "PIPE_BLOCKS_PER_SM", "RING_STEPS",
        "BULK_STEPS", "GGML_SEGS", "RingSlot<false>::BYTES", "RingSlot<true>::BYTES", "PipeStage<false>::VECS", "PipeStage<true>::VECS",
        "MmaSteps<1>::U", "MmaSteps<2>::U", "MmaSteps<4>::U", "MmaSteps<8>::U", "MmaSteps<16>::U", "W8_WARPS", "W8_ROWS", "W8_RUN_VECS",
    ];
    let got = lab::gpu::compile::probe_u32(Some(&cache()), "quant", &exprs).unwrap_or_else(|e| panic!("{e}"));
    let (mma, pipe, cuda_cores) = (find("w4a16_mma").unwrap(), find("w4a16_mma_pipelined").unwrap(), find("w4a16").unwrap());
    let warps = |v: &lab::ops::variant::Variant<Kernel>| match v.config {
        Kernel::W4(d) => (d.warps, d.rows),
        _ => unreachable!(),
    };
    let want = [
        warps(mma).0, warps(mma).1, warps(cuda_cores).0, warps(pipe).0, PIPE_CHUNKS, PIPE_STAGES, PIPE_SVECS, PIPE_BLOCKS_PER_SM, RING_STEPS,
        BULK_STEPS, GGML_SEGS, ring_slot_bytes(Scheme::Sym), ring_slot_bytes(Scheme::Asym), pipe_stage_vecs(Scheme::Sym),
        pipe_stage_vecs(Scheme::Asym), mma_steps_in_flight(1), mma_steps_in_flight(2), mma_steps_in_flight(4), mma_steps_in_flight(8),
        mma_steps_in_flight(16), W8_WARPS, W8_ROWS, W8_RUN_VECS,
    ];
    for (i, e) in exprs.iter().enumerate() {
        assert_eq!(got[i] as usize, want[i], "{e}");
    }
    assert_eq!((lab::quant::tiles::TILE_ROWS, lab::quant::tiles::STEP_WEIGHTS), (warps(mma).1, 128));
}

/// The constants the llama launchers share with kernels/llama_fused.cu and llama_layer.cu, as
/// NVRTC evaluates them: a launch of layer_q4_1 with 512 threads, written for 1,024, gave NaN
/// logits on a GPU and passed every sanitizer tool (note h200-decode-layer).
#[test]
fn the_llama_constants_are_the_kernels() {
    use lab::ops::llama::*;
    let pairs: [(&str, usize); 20] = [
        ("LY_CLUSTER", LAYER_CLUSTER),
        ("LY_THREADS", LAYER_THREADS as usize),
        ("LY_NK", LAYER_KEY_SLOTS),
        ("LY_KS", LAYER_KEY_STRIDE),
        ("LY_D", LAYER_HEAD_DIM),
        ("LY_MAXH", LAYER_MAX_HEADS),
        ("LY_OWN / 2", LAYER_MAX_PAIRS),
        ("LY_CLUSTER * LY_NK", LAYER_MAX_POSITIONS),
        ("LY_MAXDIM", FUSED_MAX_NORMED),
        ("LY_MAXFFN", FUSED_MAX_WIDTH),
        ("AO_D", ATTENTION_O_HEAD_DIM),
        ("AO_CLUSTER", ATTENTION_O_MAX_KV_HEADS),
        ("AO_GMAX", ATTENTION_O_MAX_GROUP),
        ("AO_SMEM", ATTENTION_O_SMEM),
        ("FF_CLUSTER", FFN_CLUSTER),
        ("FF_COLS", FFN_BLOCK_COLS),
        ("LAB_TRACE_SLOTS", lab::gpu::trace::SLOTS),
        ("Q4_MAXB", FUSED_MAX_SEQS),
        ("32 * 32 * Q4_NORM_G", FUSED_MAX_NORMED),
        ("32 * 32 * Q4_RESIDUAL_G", FUSED_MAX_WIDTH),
    ];
    let exprs: Vec<&str> = pairs.iter().map(|p| p.0).collect();
    let got = lab::gpu::compile::probe_u32(Some(&cache()), "llama", &exprs).unwrap_or_else(|e| panic!("{e}"));
    for ((e, want), got) in pairs.iter().zip(got) {
        assert_eq!(got as usize, *want, "{e}");
    }
}

/// The cache is the folder given: a compile leaves its PTX there and the next reads it back from
/// there (a planted file proves which was read); with no folder nothing is read or written.
#[test]
fn compiled_ptx_is_cached_in_the_folder_given() {
    let dir = tempfile::tempdir().unwrap();
    let src = "extern \"C\" __global__ void cached_f32(float* y) { y[0] = 1.f; }";
    let ptx = compile_source_in(Some(dir.path()), "cached", src, 90).unwrap_or_else(|e| panic!("{e}"));
    assert!(ptx.contains(".entry cached_f32"), "{ptx}");
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].file_name().unwrap().to_str().unwrap().starts_with("cached-") && files[0].extension().is_some_and(|e| e == "ptx"), "{files:?}");
    std::fs::write(&files[0], "// planted").unwrap();
    assert_eq!(compile_source_in(Some(dir.path()), "cached", src, 90).unwrap(), "// planted");
    // Another target is another entry; no folder compiles afresh.
    assert!(compile_source_in(Some(dir.path()), "cached", src, 80).unwrap().contains(".entry cached_f32"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    assert!(compile_source_in(None, "cached", src, 90).unwrap().contains(".entry cached_f32"));
}
