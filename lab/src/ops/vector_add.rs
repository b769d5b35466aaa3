//! `vector_add`: c = a + b, the bandwidth baseline (kernels/vector_add.cu).
//! 12 bytes and 1 flop per element: every variant should sit on the copy roof.

use super::compare::compare_elems;
use super::{measure_cpu, measure_gpu, measure_torch, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_usize, Backend, Experiment, Peer, Session};
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct VectorAdd;

const FAMILY: &str = "vector_add";
pub const GPU_VARIANTS: &[&str] = &["scalar", "float4_grid_stride", "float4_one_pass"];
pub const CPU_VARIANTS: &[&str] = &["cpu_scalar", "cpu_parallel"];
/// f32 addition is correctly rounded: within half an ulp of the exact f64 sum.
const TOL: Tolerance = Tolerance { atol: 0.0, rtol: 6.0e-8 };

/// The exact sums, in f64.
pub fn reference(a: &[f32], b: &[f32]) -> Vec<f64> {
    a.par_iter().zip(b).map(|(&x, &y)| x as f64 + y as f64).collect()
}

impl Experiment for VectorAdd {
    fn name(&self) -> &'static str {
        "vector_add"
    }
    fn description(&self) -> &'static str {
        "c = a + b in f32: the bandwidth baseline (scalar vs float4 grid-stride)"
    }
    fn sweep_axis(&self) -> &'static str {
        "n"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let sizes: &[usize] = match (backend, quick) {
            (Backend::Cuda(_), false) => &[1_000_003, 1 << 20, 1 << 24, 1 << 26, 1 << 28],
            (Backend::Cuda(_), true) => &[1_000_003, 1 << 24],
            (Backend::Cpu, false) => &[1_000_003, 1 << 24],
            (Backend::Cpu, true) => &[1, 1003, 1 << 16],
        };
        sizes.iter().map(|&n| json!({"n": n, "dtype": "f32"})).collect()
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let n = param_usize(case, "n")?;
        if n == 0 {
            return Err(LabError::shape("vector_add", "n must be at least 1"));
        }
        let mut rng = crate::experiment::rng_for(s.opts.seed, case);
        let a: Vec<f32> = (0..n).map(|_| StandardNormal.sample(&mut rng)).collect();
        let b: Vec<f32> = (0..n).map(|_| StandardNormal.sample(&mut rng)).collect();
        let expected = reference(&a, &b);
        let work = Work { bytes: 12 * n as u64, flops: n as u64 };
        let backend = s.backend.clone();
        match &backend {
            Backend::Cuda(gpu) => run_gpu(s, gpu, case, &a, &b, &expected, work),
            Backend::Cpu => {
                let compare_c = |c: &[f32]| compare_elems(c, &expected, TOL, "cpu-f64");
                let check = Check::memory_bound(TOL, &compare_c);
                for &variant in CPU_VARIANTS {
                    measure_cpu(s, case, variant, work, &check, true, n, |c| cpu_add(variant, &a, &b, c))?;
                }
                Ok(())
            }
        }
    }
}

pub fn cpu_add(variant: &str, a: &[f32], b: &[f32], c: &mut [f32]) {
    match variant {
        "cpu_scalar" => c.iter_mut().zip(a.iter().zip(b)).for_each(|(c, (x, y))| *c = x + y),
        _ => c.par_chunks_mut(1 << 16).zip(a.par_chunks(1 << 16).zip(b.par_chunks(1 << 16))).for_each(
            |(c, (a, b))| c.iter_mut().zip(a.iter().zip(b)).for_each(|(c, (x, y))| *c = x + y),
        ),
    }
}

/// Launch shape per variant: one thread per element, a grid sized to fill the chip, or one
/// loop trip per thread.
fn launch_config(gpu: &Gpu, variant: &str, n: usize) -> LaunchConfig {
    let grid = match variant {
        "scalar" => n.div_ceil(256) as u32,
        // One trip of the unrolled loop per thread: 4 float4 = 16 elements.
        "float4_one_pass" => n.div_ceil(16 * 256).max(1) as u32,
        _ => (gpu.info.sm_count as u32 * 8).min(n.div_ceil(4 * 256).max(1) as u32),
    };
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn run_gpu(s: &mut Session, gpu: &Gpu, case: &Value, a: &[f32], b: &[f32], expected: &[f64], work: Work) -> Result<()> {
    let n = a.len();
    let (da, db) = (gpu.upload(a)?, gpu.upload(b)?);
    let mut dc = gpu.stream.alloc_zeros::<f32>(n).doing("allocating c")?;
    let compare_c = |c: &[f32]| compare_elems(c, expected, TOL, "cpu-f64");
    let check = Check::memory_bound(TOL, &compare_c);
    for &variant in GPU_VARIANTS {
        if !s.wants(variant, "lab") {
            continue;
        }
        let f = gpu.function(FAMILY, &symbol(FAMILY, variant, DType::F32))?;
        let cfg = launch_config(gpu, variant, n);
        let nn = n as i64;
        let launch = |dc: &mut cudarc::driver::CudaSlice<f32>| -> Result<()> {
            // SAFETY: a, b, c hold n floats; both kernels bound every access by n.
            unsafe { gpu.stream.launch_builder(&f).arg(&da).arg(&db).arg(dc).arg(&nn).launch(cfg) }
                .map(|_| ())
                .doing(&format!("launching vector_add {variant}"))
        };
        measure_gpu(s, gpu, case, variant, work, &check, true, &mut dc, launch)?;
    }
    if s.wants_peer(Peer::Torch, "torch.add", "torch") {
        let shape = [n];
        let inputs: [(&[u8], &[usize]); 2] = [(&f32::bytes(a), &shape), (&f32::bytes(b), &shape)];
        measure_torch(s, gpu, case, "add", json!({}), &inputs, work, &check)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_variants_match_the_reference_on_odd_lengths() {
        for n in [1usize, 3, 1003, 65537] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32).sin() * 1e3).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32).cos()).collect();
            let expected = reference(&a, &b);
            for v in CPU_VARIANTS {
                let mut c = vec![f32::NAN; n];
                cpu_add(v, &a, &b, &mut c);
                let e = compare_elems(&c, &expected, TOL, "cpu-f64");
                assert!(e.passed(), "{v} n={n}: {e:?}");
            }
        }
    }
}

/// TEMPORARY until the table lands.
pub fn variants() -> Vec<crate::ops::variant::VariantInfo> {
    Vec::new()
}
