//! The one list of families: each names its kernel sources, its experiment and its variant
//! table. `lab run all`, `lab list`, `lab compile`, the kernel tests and the report all read it.
//! Adding a family is one entry here (see DESIGN.md, "Adding a kernel family").

use crate::experiment::Experiment;
use crate::ops::variant::VariantInfo;

pub struct Family {
    /// The kernel-symbol prefix and the name NVRTC modules and caches carry.
    pub name: &'static str,
    /// Its CUDA sources as (path under `kernels/`, text), concatenated in this order.
    pub kernels: &'static [(&'static str, &'static str)],
    /// Its sweep, when it has one.
    pub experiment: Option<&'static dyn Experiment>,
    /// Its variant table, without the launch configs.
    pub variants: fn() -> Vec<VariantInfo>,
}

macro_rules! kernel {
    ($path:literal) => {
        ($path, include_str!(concat!("../../kernels/", $path)))
    };
}

fn none() -> Vec<VariantInfo> {
    Vec::new()
}

/// Every family, in the order `lab run all` takes them (ceilings first: the others are
/// fractions of it).
pub static FAMILIES: &[Family] = &[
    Family {
        name: "ceilings",
        kernels: &[kernel!("ceilings.cu")],
        experiment: Some(&crate::ops::ceilings::Ceilings),
        variants: crate::ops::ceilings::variants,
    },
    Family {
        name: "vector_add",
        kernels: &[kernel!("vector_add.cu")],
        experiment: Some(&crate::ops::vector_add::VectorAdd),
        variants: crate::ops::vector_add::variants,
    },
    Family {
        name: "softmax",
        kernels: &[kernel!("softmax.cu")],
        experiment: Some(&crate::ops::softmax::Softmax),
        variants: crate::ops::softmax::variants,
    },
    Family {
        name: "bias_gelu",
        kernels: &[kernel!("bias_gelu.cu")],
        experiment: Some(&crate::ops::bias_gelu::BiasGelu),
        variants: crate::ops::bias_gelu::variants,
    },
    Family {
        name: "layernorm",
        kernels: &[kernel!("layernorm.cu")],
        experiment: Some(&crate::ops::layernorm::LayerNorm),
        variants: crate::ops::layernorm::variants,
    },
    Family {
        name: "rmsnorm",
        kernels: &[kernel!("rmsnorm.cu")],
        experiment: Some(&crate::ops::rmsnorm::RmsNorm),
        variants: crate::ops::rmsnorm::variants,
    },
    Family {
        name: "linear",
        kernels: &[kernel!("linear.cu")],
        experiment: Some(&crate::ops::linear::Linear),
        variants: crate::ops::linear::variants,
    },
    Family {
        name: "divergence",
        kernels: &[kernel!("divergence.cu")],
        experiment: Some(&crate::ops::divergence::Divergence),
        variants: crate::ops::divergence::variants,
    },
    Family {
        name: "gemm",
        kernels: &[
            kernel!("gemm/simt.cu"),
            kernel!("gemm/mma_sync.cu"),
            kernel!("gemm/warp64.cu"),
            kernel!("gemm/wgmma.cu"),
            kernel!("gemm/mma_tma.cu"),
        ],
        experiment: Some(&crate::ops::gemm::Gemm),
        variants: crate::ops::gemm::variants,
    },
    Family {
        name: "quant",
        kernels: &[
            kernel!("quant/pack_dequant.cu"),
            kernel!("quant/w4a16.cu"),
            kernel!("quant/w4a16_mma.cu"),
            kernel!("quant/w4a16_mma_tiled.cu"),
            kernel!("quant/w4a16_mma_rings.cu"),
            kernel!("quant/w4a16_mma_splitk.cu"),
            kernel!("quant/w4a16_mma_pipelined.cu"),
            kernel!("quant/stream_read.cu"),
            kernel!("quant/w8a16.cu"),
        ],
        experiment: Some(&crate::ops::quant::Quant),
        variants: crate::ops::quant::variants,
    },
    Family {
        name: "attention",
        kernels: &[kernel!("attention.cu"), kernel!("attention_wgmma.cu"), kernel!("attention_backward.cu"), kernel!("attention_decode.cu")],
        experiment: Some(&crate::ops::attention::Attention),
        variants: crate::ops::attention::variants,
    },
    Family {
        name: "llama",
        kernels: &[kernel!("llama.cu"), kernel!("llama_fused.cu"), kernel!("llama_layer.cu"), kernel!("llama_head.cu")],
        experiment: Some(&crate::ops::llama::Llama),
        variants: crate::ops::llama::variants,
    },
    Family { name: "allreduce", kernels: &[], experiment: Some(&crate::ops::allreduce::AllReduce), variants: none },
    Family { name: "bucketing", kernels: &[], experiment: Some(&crate::ops::bucketing::Bucketing), variants: none },
    // The kernels NCCL's experiment launches beside the collective (a reduction into a buffer).
    Family {
        name: "collective",
        kernels: &[kernel!("collective.cu")],
        experiment: Some(&crate::ops::nccl_allreduce::NcclAllReduce),
        variants: none,
    },
    // f64 kernels that check others where the CPU reference would be too slow (no sweep of their own).
    Family { name: "reference", kernels: &[kernel!("reference.cu")], experiment: None, variants: none },
    // The softmax as a streaming hardware design, simulated by Verilator (hw/softmax/); last, so
    // that the families before it keep their colours.
    Family { name: "fpga", kernels: &[], experiment: Some(&crate::ops::fpga::Fpga), variants: crate::ops::fpga::variants },
    // Multi-GPU layers and training over NCCL (the `collective` family's kernels and cuBLAS).
    Family { name: "tp_linear", kernels: &[], experiment: Some(&crate::ops::tp_linear::TpLinear), variants: none },
    Family { name: "dp_step", kernels: &[], experiment: Some(&crate::ops::dp_step::DpStep), variants: none },
    // lab::data's loader (file to GPU) and the kernel its overlap case consumes batches with.
    Family {
        name: "loader",
        kernels: &[kernel!("loader.cu")],
        experiment: Some(&crate::ops::loader::LoaderExp),
        variants: crate::ops::loader::variants,
    },
    // After fpga, so that the families before it keep their colours.
    Family {
        name: "moe",
        kernels: &[kernel!("moe.cu"), kernel!("moe_backward.cu")],
        experiment: Some(&crate::ops::moe::Moe),
        variants: crate::ops::moe::variants,
    },
    // The training step's own kernels (embedding, RoPE, SwiGLU, loss, AdamW) and the step on the GPU.
    Family {
        name: "train",
        kernels: &[kernel!("train.cu")],
        experiment: Some(&crate::train::experiment::Train),
        variants: none,
    },
    // A model and the lab's requantized copies scored on held-out text, beside llama.cpp.
    Family { name: "perplexity", kernels: &[], experiment: Some(&crate::ops::perplexity::PerplexityExp), variants: none },
];

/// The family called `name`.
pub fn find(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// The families that have CUDA sources.
pub fn with_kernels() -> impl Iterator<Item = &'static Family> {
    FAMILIES.iter().filter(|f| !f.kernels.is_empty())
}
