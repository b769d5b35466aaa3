//! The variant table: each family lists its variants once, as `&[Variant<Config>]`, and
//! everything else (the callable ops, the sweeps, `--variant`, `lab list --variants`, the tests,
//! the report) reads that table. Names carry no parameters: scheme, batch and dtype are params.

use crate::experiment::Backend;
use crate::kernels::DType;
use crate::{LabError, Result};

/// What a variant needs to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requires {
    /// The CPU backend (a variant written in Rust).
    Cpu,
    /// Any CUDA GPU the lab supports (sm_80 and up).
    Gpu,
    /// sm_90 and up (thread-block clusters, distributed shared memory).
    Sm90,
    /// Hopper's architecture-specific instructions (wgmma, TMA): compute capability 9.0 exactly,
    /// compiled for sm_90a.
    Sm90a,
}

impl Requires {
    pub fn label(self) -> &'static str {
        match self {
            Requires::Cpu => "cpu",
            Requires::Gpu => "gpu",
            Requires::Sm90 => "sm_90+",
            Requires::Sm90a => "sm_90a",
        }
    }
    /// Does this backend run it?
    pub fn met_by(self, dev: &Backend) -> bool {
        match (self, dev) {
            (Requires::Cpu, Backend::Cpu) => true,
            (Requires::Gpu, Backend::Cuda(_)) => true,
            (Requires::Sm90, Backend::Cuda(g)) => g.arch >= 90,
            (Requires::Sm90a, Backend::Cuda(g)) => g.arch == 90,
            _ => false,
        }
    }
    pub fn on_gpu(self) -> bool {
        self != Requires::Cpu
    }
}

/// One row of a family's table. `config` is the family's own: how to launch it, which shapes it
/// takes.
#[derive(Clone, Copy, Debug)]
pub struct Variant<C: 'static> {
    pub name: &'static str,
    pub dtypes: &'static [DType],
    pub requires: Requires,
    /// What it changes against the rung below, in one line.
    pub what: &'static str,
    pub config: C,
}

/// A table row without its family-specific config: what listings and the report show.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VariantInfo {
    pub name: &'static str,
    pub dtypes: Vec<&'static str>,
    pub requires: &'static str,
    pub what: &'static str,
}

impl<C> Variant<C> {
    pub fn info(&self) -> VariantInfo {
        VariantInfo { name: self.name, dtypes: self.dtypes.iter().map(|d| d.name()).collect(), requires: self.requires.label(), what: self.what }
    }
}

/// Every row of a table, without configs.
pub fn infos<C>(table: &[Variant<C>]) -> Vec<VariantInfo> {
    table.iter().map(Variant::info).collect()
}

/// The names of a table's rows, in order.
pub fn names<C>(table: &[Variant<C>]) -> Vec<&'static str> {
    table.iter().map(|v| v.name).collect()
}

/// The kernel symbols a family's module must export for its table: every GPU row in each of its
/// dtypes (for families whose kernels are named after their variants).
pub fn gpu_symbols<C>(family: &str, table: &[Variant<C>]) -> std::collections::BTreeSet<String> {
    table.iter().filter(|v| v.requires.on_gpu()).flat_map(|v| v.dtypes.iter().map(move |&d| crate::kernels::symbol(family, v.name, d))).collect()
}

/// The row called `name`, or an error listing the family's variants.
pub fn find<'a, C>(family: &str, table: &'a [Variant<C>], name: &str) -> Result<&'a Variant<C>> {
    table.iter().find(|v| v.name == name).ok_or_else(|| {
        LabError::Invalid(format!("`{name}` is not a {family} variant (one of: {})", names(table).join(", ")))
    })
}

/// Checks that `v` runs on `dev` in `dtype`, with an error that says which condition fails.
pub fn check_runs<C>(family: &str, v: &Variant<C>, dev: &Backend, dtype: DType) -> Result<()> {
    if !v.dtypes.contains(&dtype) {
        let takes: Vec<_> = v.dtypes.iter().map(|d| d.name()).collect();
        return Err(LabError::Invalid(format!("{family} variant `{}` takes {}, not {}", v.name, takes.join(", "), dtype.name())));
    }
    if !v.requires.met_by(dev) {
        let on = match dev {
            Backend::Cpu => "the CPU backend".to_string(),
            Backend::Cuda(g) => format!("a GPU of compute capability {}", g.info.cc),
        };
        return Err(LabError::Invalid(format!("{family} variant `{}` needs {}, not {on}", v.name, v.requires.label())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[Variant<()>] = &[
        Variant { name: "fast", dtypes: &[DType::F32], requires: Requires::Gpu, what: "x", config: () },
        Variant { name: "cpu_rows", dtypes: &[DType::F32, DType::Bf16], requires: Requires::Cpu, what: "y", config: () },
    ];

    #[test]
    fn unknown_names_list_the_table_and_mismatches_say_why() {
        let err = find("demo", TABLE, "fastest").unwrap_err().to_string();
        assert!(err.contains("`fastest` is not a demo variant (one of: fast, cpu_rows)"), "{err}");
        let cpu = find("demo", TABLE, "cpu_rows").unwrap();
        check_runs("demo", cpu, &Backend::Cpu, DType::Bf16).unwrap();
        let err = check_runs("demo", cpu, &Backend::Cpu, DType::F16).unwrap_err().to_string();
        assert!(err.contains("takes f32, bf16, not f16"), "{err}");
        let err = check_runs("demo", &TABLE[0], &Backend::Cpu, DType::F32).unwrap_err().to_string();
        assert!(err.contains("`fast` needs gpu, not the CPU backend"), "{err}");
    }
}
