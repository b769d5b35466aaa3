//! What ptxas makes of a family's PTX, per kernel: registers, spills, stack, and the
//! performance notes it prints (a wgmma serialised for want of registers, a setmaxnreg ignored).
//! `ptxas` from the PATH, or `LAB_PTXAS`; it must read the PTX version NVRTC writes.

use super::compile::Target;
use crate::{LabError, Result};
use std::process::Command;

/// One kernel as ptxas reported it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelRegs {
    pub name: String,
    pub registers: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// ptxas's "Potential Performance Loss" and similar notes about this kernel.
    pub notes: Vec<String>,
}

/// `ptxas` unless `LAB_PTXAS` names another.
pub fn ptxas() -> String {
    std::env::var("LAB_PTXAS").unwrap_or_else(|_| "ptxas".into())
}

/// Assembles `ptx` for `target` with `ptxas -v` and reads back every kernel's figures.
pub fn report(ptx: &str, target: Target) -> Result<Vec<KernelRegs>> {
    report_with(&ptxas(), ptx, target)
}

/// [`report`] with the named ptxas.
pub fn report_with(program: &str, ptx: &str, target: Target) -> Result<Vec<KernelRegs>> {
    let dir = tempfile::tempdir().map_err(|e| LabError::Invalid(format!("a temporary folder for ptxas: {e}")))?;
    let (src, out) = (dir.path().join("k.ptx"), dir.path().join("k.cubin"));
    std::fs::write(&src, ptx).map_err(|e| LabError::io(&src, e))?;
    let run = Command::new(program)
        .arg(format!("-arch=sm_{target}"))
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| LabError::Invalid(format!("cannot start `{program}` (set LAB_PTXAS to a ptxas): {e}")))?;
    let log = String::from_utf8_lossy(&run.stderr);
    if !run.status.success() {
        let why: Vec<&str> = log.lines().filter(|l| l.contains("error") || l.contains("fatal")).take(3).collect();
        return Err(LabError::Invalid(format!("`{program}` failed for sm_{target}: {}", why.join("; "))));
    }
    Ok(parse(&log))
}

/// The first unsigned number in `text` after `key`.
fn number_after(text: &str, key: &str) -> Option<u32> {
    let rest = &text[text.find(key)? + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty())?.parse().ok()
}

/// The number just before `key` in `text` ("24 bytes spill stores").
fn number_before(text: &str, key: &str) -> Option<u32> {
    text[..text.find(key)?].split_whitespace().last()?.parse().ok()
}

/// Reads `ptxas -v` output: "Compiling entry function 'k'" starts a kernel; its "Function
/// properties" line carries stack and spills, "Used N registers" its registers; notes that name a
/// function ('k') are attached to it.
pub fn parse(log: &str) -> Vec<KernelRegs> {
    let mut out: Vec<KernelRegs> = Vec::new();
    let quoted = |l: &str| l.split('\'').nth(1).map(str::to_string);
    for line in log.lines() {
        if line.contains("Compiling entry function") {
            if let Some(name) = quoted(line) {
                out.push(KernelRegs { name, ..Default::default() });
            }
        } else if line.contains("bytes stack frame") {
            if let Some(k) = out.last_mut() {
                k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used") && line.contains("registers") {
            if let Some(k) = out.last_mut() {
                k.registers = number_after(line, "Used").unwrap_or(0);
            }
        }
    }
    // Notes come before the kernel's own lines: attach each to the kernel it names.
    for line in log.lines().filter(|l| l.contains("Potential Performance Loss") || l.contains("(C75")) {
        if let Some(name) = quoted(line) {
            if let Some(k) = out.iter_mut().find(|k| k.name == name) {
                k.notes.push(line.split(": ").skip(1).collect::<Vec<_>>().join(": ").trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'attention_wgmma_overlap_d128_bf16'
ptxas info    : 176 bytes gmem
ptxas info    : Compiling entry function 'attention_wgmma_overlap_d128_bf16' for 'sm_90a'
ptxas info    : Function properties for attention_wgmma_overlap_d128_bf16
    144 bytes stack frame, 244 bytes spill stores, 232 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 144 bytes cumulative stack size
ptxas info    : Compile time = 986.074 ms
ptxas info    : Compiling entry function 'attention_wgmma_d64_bf16' for 'sm_90a'
ptxas info    : Function properties for attention_wgmma_d64_bf16
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 140 registers, used 1 barriers
";

    #[test]
    fn reads_registers_spills_and_the_notes_of_each_kernel() {
        let k = parse(LOG);
        assert_eq!(k.len(), 2);
        assert_eq!((k[0].name.as_str(), k[0].registers, k[0].stack_bytes, k[0].spill_stores, k[0].spill_loads), ("attention_wgmma_overlap_d128_bf16", 168, 144, 244, 232));
        assert_eq!(k[0].notes.len(), 1);
        assert!(k[0].notes[0].starts_with("(C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized"), "{:?}", k[0].notes);
        assert_eq!((k[1].registers, k[1].spill_stores, k[1].notes.len()), (140, 0, 0));
    }

    #[test]
    fn a_missing_ptxas_is_named() {
        let e = report_with("/nonexistent/ptxas", ".version 9.0\n", "90a".parse().unwrap()).unwrap_err().to_string();
        assert!(e.contains("cannot start `/nonexistent/ptxas` (set LAB_PTXAS to a ptxas)"), "{e}");
    }
}
