//! The CUDA sources in `kernels/`, embedded at build time: the shared headers here, each
//! family's files in [`crate::family::FAMILIES`].

/// Headers a kernel file may `#include "..."`; each is inlined once per family.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    ("mma.cuh", include_str!("../../kernels/mma.cuh")),
    ("pdl.cuh", include_str!("../../kernels/pdl.cuh")),
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

/// The source of a family: its files in order, each `#include "<header>"` of [`HEADERS`]
/// inlined at its first appearance and dropped after (as `#pragma once` would), so NVRTC needs no
/// header callback and the disk-cache key covers everything the kernels depend on.
pub fn source(family: &str) -> crate::Result<String> {
    let f = crate::family::find(family)
        .filter(|f| !f.kernels.is_empty())
        .ok_or_else(|| crate::LabError::Invalid(format!("no kernel family `{family}` in kernels/")))?;
    let mut included = std::collections::BTreeSet::new();
    let mut out = String::new();
    for (i, (_, text)) in f.kernels.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&inline_headers(text, &mut included));
    }
    Ok(out)
}

/// A short hash (SHA-256, 16 hex digits) of a family's source as NVRTC compiles it, headers
/// inlined: records say which kernels they ran by it, and the report compares it with the
/// committed kernels' to say whether a family's current kernels have passed on a GPU. The
/// sources are built into the binary, so each family's hash is computed once per process.
pub fn hash(family: &str) -> crate::Result<String> {
    static ALL: std::sync::OnceLock<std::collections::BTreeMap<&'static str, String>> = std::sync::OnceLock::new();
    let all = ALL.get_or_init(|| {
        use sha2::{Digest, Sha256};
        let digest = |f: &str| source(f).map(|s| format!("{:x}", Sha256::digest(s.as_bytes()))[..16].to_string());
        crate::family::with_kernels().filter_map(|f| digest(f.name).ok().map(|h| (f.name, h))).collect()
    });
    all.get(family).cloned().ok_or_else(|| crate::LabError::Invalid(format!("no kernel family `{family}` in kernels/")))
}

/// [`hash`] of each of `families` (those without kernels are left out).
pub fn hashes<'a>(families: impl IntoIterator<Item = &'a str>) -> std::collections::BTreeMap<String, String> {
    families.into_iter().filter_map(|f| hash(f).ok().map(|h| (f.to_string(), h))).collect()
}

fn inline_headers(text: &str, included: &mut std::collections::BTreeSet<&'static str>) -> String {
    let mut out = text.to_string();
    for (name, header) in HEADERS {
        let line = format!("#include \"{name}\"");
        if let Some(at) = out.find(&line) {
            let body = if included.insert(name) { inline_headers(header, included) } else { String::new() };
            out.replace_range(at..at + line.len(), &body);
            out = out.replace(&line, "");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_header_is_inlined_once_and_an_unknown_family_is_named() {
        let src = super::source("softmax").unwrap();
        assert!(!src.contains("#include \"common.cuh\""));
        let file = include_str!("../../kernels/softmax.cu");
        assert_eq!(src.len(), file.len() - "#include \"common.cuh\"".len() + super::HEADERS[0].1.len());
        let err = super::source("allreduce").unwrap_err().to_string();
        assert!(err.contains("no kernel family `allreduce`"), "{err}");
    }

    #[test]
    fn a_family_hash_covers_its_headers_and_differs_between_families() {
        let (softmax, rmsnorm) = (super::hash("softmax").unwrap(), super::hash("rmsnorm").unwrap());
        assert_eq!(softmax.len(), 16);
        assert_ne!(softmax, rmsnorm);
        // The hash is of the source with common.cuh inlined, not of softmax.cu alone.
        use sha2::{Digest, Sha256};
        let file_only = format!("{:x}", Sha256::digest(include_str!("../../kernels/softmax.cu").as_bytes()));
        assert_ne!(softmax, file_only[..16]);
        let h = super::hashes(["softmax", "allreduce"]);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["softmax"]);
    }
}
