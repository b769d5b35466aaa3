//! The CUDA sources in `kernels/`, embedded at build time. One entry per family.

/// Shared device helpers, textually included by every family (`#include "common.cuh"`).
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// (family, source) for every `kernels/*.cu`. A test checks this list against the folder.
pub const FAMILIES: &[(&str, &str)] = &[
    ("ceilings", include_str!("../../kernels/ceilings.cu")),
    ("vector_add", include_str!("../../kernels/vector_add.cu")),
    ("softmax", include_str!("../../kernels/softmax.cu")),
    ("bias_gelu", include_str!("../../kernels/bias_gelu.cu")),
    ("layernorm", include_str!("../../kernels/layernorm.cu")),
    ("rmsnorm", include_str!("../../kernels/rmsnorm.cu")),
    ("linear", include_str!("../../kernels/linear.cu")),
    ("divergence", include_str!("../../kernels/divergence.cu")),
    ("gemm", include_str!("../../kernels/gemm.cu")),
    ("quant", include_str!("../../kernels/quant.cu")),
    ("collective", include_str!("../../kernels/collective.cu")),
];

/// Storage types a kernel is instantiated for; the suffix of every kernel symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }
    pub fn parse(s: &str) -> crate::Result<Self> {
        match s {
            "f32" => Ok(DType::F32),
            "bf16" => Ok(DType::Bf16),
            "f16" => Ok(DType::F16),
            _ => Err(crate::LabError::Invalid(format!("unknown dtype `{s}` (f32, bf16, f16)"))),
        }
    }
}

/// The one place kernel symbols are spelled: `<family>_<variant>_<dtype>`.
pub fn symbol(family: &str, variant: &str, dtype: DType) -> String {
    format!("{family}_{variant}_{}", dtype.name())
}

/// The source of a family with `common.cuh` inlined, so NVRTC needs no header callback and the
/// disk-cache key covers everything the kernel depends on.
pub fn source(family: &str) -> crate::Result<String> {
    let (_, src) = FAMILIES
        .iter()
        .find(|(f, _)| *f == family)
        .ok_or_else(|| crate::LabError::Invalid(format!("no kernel family `{family}` in kernels/")))?;
    Ok(src.replace("#include \"common.cuh\"", COMMON))
}
