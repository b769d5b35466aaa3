//! `vector_add`: c = a + b, the bandwidth baseline (kernels/vector_add.cu).
//! 12 bytes and 1 flop per element: every variant should sit on the copy roof.

use super::compare::compare_elems;
use super::variant::{self, Requires, Variant, VariantInfo};
use super::{measure_op, measure_torch, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_usize, Backend, Experiment, Peer, Session};
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct VectorAdd;

const FAMILY: &str = "vector_add";

/// How a variant runs.
#[derive(Clone, Copy, Debug)]
pub enum Add {
    /// A kernel of 256-thread blocks; the grid for n elements on a device of `sms` SMs.
    Gpu { grid: fn(usize, usize) -> usize },
    CpuScalar,
    /// Chunks of 64 Ki elements on the rayon pool.
    CpuParallel,
}

/// The variants, in order: the only place a vector_add variant is named.
pub const VARIANTS: &[Variant<Add>] = &[
    Variant {
        name: "scalar",
        dtypes: &[DType::F32],
        requires: Requires::Gpu,
        what: "one thread per element, 4 B loads",
        config: Add::Gpu { grid: |n, _| n.div_ceil(256) },
    },
    Variant {
        name: "float4_grid_stride",
        dtypes: &[DType::F32],
        requires: Requires::Gpu,
        what: "16 B loads in a grid-stride loop over a grid sized to fill the chip (8 blocks per SM)",
        config: Add::Gpu { grid: |n, sms| (sms * 8).min(n.div_ceil(4 * 256).max(1)) },
    },
    Variant {
        name: "float4_one_pass",
        dtypes: &[DType::F32],
        requires: Requires::Gpu,
        // One trip of the unrolled loop per thread: 4 float4 = 16 elements.
        what: "16 B loads, four per thread and one trip each: no loop overhead",
        config: Add::Gpu { grid: |n, _| n.div_ceil(16 * 256).max(1) },
    },
    Variant { name: "cpu_scalar", dtypes: &[DType::F32], requires: Requires::Cpu, what: "a plain loop on one core", config: Add::CpuScalar },
    Variant {
        name: "cpu_parallel",
        dtypes: &[DType::F32],
        requires: Requires::Cpu,
        what: "64 Ki-element chunks over every core",
        config: Add::CpuParallel,
    },
];
/// f32 addition is correctly rounded: within half an ulp of the exact f64 sum.
const TOL: Tolerance = Tolerance { atol: 0.0, rtol: 6.0e-8 };

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// The exact sums, in f64.
pub fn reference(a: &[f32], b: &[f32]) -> Vec<f64> {
    a.par_iter().zip(b).map(|(&x, &y)| x as f64 + y as f64).collect()
}

/// c = a + b elementwise, with the fastest variant for the backend (float4_one_pass on the GPU,
/// cpu_parallel on the CPU).
pub fn forward(dev: &Backend, a: &Tensor<f32>, b: &Tensor<f32>, c: &mut Tensor<f32>) -> Result<()> {
    forward_with(dev, if matches!(dev, Backend::Cpu) { "cpu_parallel" } else { "float4_one_pass" }, a, b, c)
}

/// [`forward`] with the named variant (any row of [`VARIANTS`]).
pub fn forward_with(dev: &Backend, variant: &str, a: &Tensor<f32>, b: &Tensor<f32>, c: &mut Tensor<f32>) -> Result<()> {
    let v = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, v, dev, DType::F32)?;
    check_placement(FAMILY, dev, &[("a", a.placement()), ("b", b.placement()), ("c", c.placement())])?;
    if a.shape() != b.shape() || a.shape() != c.shape() {
        return Err(LabError::shape(FAMILY, format!("a {:?}, b {:?} and c {:?} must have one shape", a.shape(), b.shape(), c.shape())));
    }
    match (v.config, dev) {
        (Add::Gpu { grid }, Backend::Cuda(gpu)) => {
            let f = gpu.function(FAMILY, &symbol(FAMILY, v.name, DType::F32))?;
            let cfg = LaunchConfig { grid_dim: (grid(a.len(), gpu.info.sm_count as usize) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let n = a.len() as i64;
            let (da, db, dc) = (a.cuda().expect("placement checked"), b.cuda().expect("placement checked"), c.cuda_mut().expect("placement checked"));
            // SAFETY: a, b, c hold n floats; every kernel bounds every access by n.
            unsafe { gpu.stream.launch_builder(&f).arg(da).arg(db).arg(dc).arg(&n).launch(cfg) }
                .map(|_| ())
                .doing(&format!("launching vector_add {variant}"))
        }
        (Add::Gpu { .. }, Backend::Cpu) => unreachable!("check_runs keeps GPU variants off the CPU"),
        (cpu, _) => {
            let (a, b, c) = (a.host().expect("placement checked"), b.host().expect("placement checked"), c.host_mut().expect("placement checked"));
            match cpu {
                Add::CpuScalar => c.iter_mut().zip(a.iter().zip(b)).for_each(|(c, (x, y))| *c = x + y),
                _ => c.par_chunks_mut(1 << 16).zip(a.par_chunks(1 << 16).zip(b.par_chunks(1 << 16))).for_each(
                    |(c, (a, b))| c.iter_mut().zip(a.iter().zip(b)).for_each(|(c, (x, y))| *c = x + y),
                ),
            }
            Ok(())
        }
    }
}

impl Experiment for VectorAdd {
    fn name(&self) -> &'static str {
        "vector_add"
    }
    fn description(&self) -> &'static str {
        "c = a + b in f32: the bandwidth baseline (scalar vs float4 grid-stride)"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["n=16777216", "n=268435456"]
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
        let dev = s.backend.clone();
        let compare_c = |c: &[f32]| compare_elems(c, &expected, TOL, "cpu-f64");
        let check = Check::memory_bound(TOL, &compare_c);
        let (ta, tb) = (Tensor::from_slice(&dev, &[n], &a)?, Tensor::from_slice(&dev, &[n], &b)?);
        let mut tc = Tensor::<f32>::zeros(&dev, &[n])?;
        for v in VARIANTS.iter().filter(|v| v.requires.met_by(&dev)) {
            if s.wants(v.name, "lab") {
                measure_op(s, case, v.name, work, &check, true, &mut tc, |c| forward_with(&dev, v.name, &ta, &tb, c))?;
            }
        }
        if let Backend::Cuda(gpu) = &dev {
            if s.wants_peer(Peer::Torch, "torch.add", "torch") {
                let shape = [n];
                let inputs: [(&[u8], &[usize]); 2] = [(&f32::bytes(&a), &shape), (&f32::bytes(&b), &shape)];
                measure_torch(s, gpu, case, "add", json!({}), &inputs, work, &check)?;
            }
        }
        Ok(())
    }
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
            let (ta, tb) = (Tensor::from_vec(&[n], a).unwrap(), Tensor::from_vec(&[n], b).unwrap());
            for v in VARIANTS.iter().filter(|v| v.requires == Requires::Cpu) {
                let mut c = Tensor::from_vec(&[n], vec![f32::NAN; n]).unwrap();
                forward_with(&Backend::Cpu, v.name, &ta, &tb, &mut c).unwrap();
                let e = compare_elems(&c.to_vec().unwrap(), &expected, TOL, "cpu-f64");
                assert!(e.passed(), "{} n={n}: {e:?}", v.name);
            }
        }
    }
}
