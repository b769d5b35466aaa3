//! The attention backward (kernels/attention_backward.cu): dQ, dK and dV from Q, K, V, the
//! forward's O and lse, and dO. With P_ij = exp(scale q_i.k_j - lse_i) on kept pairs (0 elsewhere),
//! dP = dO V^T, D_i = rowsum(dO_i * O_i), dS = P (dP - D): dQ = scale dS K, dK = scale dS^T Q,
//! dV = P^T dO, a key/value head summing over the query heads that share it (GQA, MQA).
//! The variants are rows of the family's table ([`super::VARIANTS`]); `cpu_bwd` is
//! [`cpu_bwd`], the kernel's tiling replayed on the CPU, which the tests hold to the f64
//! reference ([`super::backward_check`]) before the kernel ever runs.

use super::{dims, variant, Dims, Elem, Kernel, Mask, FAMILY, NAIVE_MAX_SCORES, VARIANTS};
use crate::error::Doing;
use crate::experiment::Backend;
use crate::kernels::{symbol, DType};
use crate::ops::gemm::raise_dynamic_smem;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rayon::prelude::*;

/// Query rows and keys per tile of fa2_bwd (FA_BWD_BM and FA_BN in the kernel).
pub const BM: usize = 64;
pub const BN: usize = 64;

/// The gradients, shaped as q ([batch, sq, hq, d]) and k ([batch, sk, hkv, d]).
pub struct Grads<T: Elem> {
    pub dq: Tensor<T>,
    pub dk: Tensor<T>,
    pub dv: Tensor<T>,
}

impl<T: Elem> Grads<T> {
    pub fn zeros(dev: &Backend, d: Dims) -> Result<Self> {
        let (qs, ks) = ([d.batch, d.sq, d.hq, d.d], [d.batch, d.sk, d.hkv, d.d]);
        Ok(Grads { dq: Tensor::zeros(dev, &qs)?, dk: Tensor::zeros(dev, &ks)?, dv: Tensor::zeros(dev, &ks)? })
    }
}

/// The forward's tensors the backward reads: its inputs, its output O and lse, and dO.
pub struct Saved<'a, T: Elem> {
    pub q: &'a Tensor<T>,
    pub k: &'a Tensor<T>,
    pub v: &'a Tensor<T>,
    pub o: &'a Tensor<T>,
    pub lse: &'a Tensor<f32>,
    pub dout: &'a Tensor<T>,
}

/// Why backward variant `v` does not take shape `d`, or None when it does.
pub fn refusal(v: &variant::Variant<Kernel>, d: Dims) -> Option<String> {
    match v.config {
        Kernel::Fa2Bwd { head_dims, .. } if !head_dims.contains(&d.d) => Some(format!("`{}` takes head_dim {head_dims:?}, not {}", v.name, d.d)),
        // Its dK/dV kernel walks Sq rows per output: past this it runs for minutes.
        Kernel::NaiveBwd if d.batch * d.hq * d.sq * d.sk > NAIVE_MAX_SCORES / 16 => {
            Some(format!("`naive_bwd` materializes 2 x {} scores; it takes at most {}", d.batch * d.hq * d.sq * d.sk, NAIVE_MAX_SCORES / 16))
        }
        Kernel::NaiveBwd | Kernel::Fa2Bwd { .. } | Kernel::CpuBwd => None,
        _ => Some(format!("`{}` is a forward variant (attention::forward_with)", v.name)),
    }
}

/// The variant [`backward`] runs: fa2_bwd_det on the GPU where it takes the head dim, else
/// naive_bwd; cpu_bwd on the CPU. fa2_bwd_det is bit-identical run to run and was also faster
/// than fa2_bwd's atomics at every timed shape on an H200 (1.2-1.4x, runs
/// 2026-11-29T01-14-15Z-h200-03de38f-0251 and 01-15-50Z-...-15c4).
pub fn best(dev: &Backend, d: Dims) -> &'static variant::Variant<Kernel> {
    let fa2 = variant::find(FAMILY, VARIANTS, "fa2_bwd_det").expect("in the table");
    let name = match dev {
        Backend::Cpu => "cpu_bwd",
        Backend::Cuda(_) if refusal(fa2, d).is_some() => "naive_bwd",
        Backend::Cuda(_) => "fa2_bwd_det",
    };
    variant::find(FAMILY, VARIANTS, name).expect("the best attention backward variant is in the table")
}

/// dQ, dK, dV of attention with the best backward variant.
pub fn backward<T: Elem>(dev: &Backend, s: &Saved<T>, mask: Mask, g: &mut Grads<T>) -> Result<()> {
    let d = check(s, g)?;
    backward_with(dev, best(dev, d).name, s, mask, g)
}

/// The shapes of the saved tensors and the gradients, checked against each other.
pub fn check<T: Elem>(s: &Saved<T>, g: &Grads<T>) -> Result<Dims> {
    let d = dims(s.q, s.k, s.v, s.o, s.lse)?;
    let bad = |why: String| LabError::shape("attention backward", why);
    for (name, t, want) in [("dout", s.dout, s.q), ("dq", &g.dq, s.q), ("dk", &g.dk, s.k), ("dv", &g.dv, s.k)] {
        if t.shape() != want.shape() {
            return Err(bad(format!("{name} is {:?}, not {:?}", t.shape(), want.shape())));
        }
    }
    Ok(d)
}

/// [`backward`] with the named backward variant.
pub fn backward_with<T: Elem>(dev: &Backend, variant: &str, s: &Saved<T>, mask: Mask, g: &mut Grads<T>) -> Result<()> {
    let var = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, var, dev, T::DTYPE)?;
    let places = [
        ("q", s.q.placement()),
        ("k", s.k.placement()),
        ("v", s.v.placement()),
        ("o", s.o.placement()),
        ("lse", s.lse.placement()),
        ("dout", s.dout.placement()),
        ("dq", g.dq.placement()),
        ("dk", g.dk.placement()),
        ("dv", g.dv.placement()),
    ];
    check_placement("attention backward", dev, &places)?;
    let d = check(s, g)?;
    if let Some(why) = refusal(var, d) {
        return Err(LabError::shape("attention backward", why));
    }
    match (var.config, dev) {
        (Kernel::CpuBwd, _) => {
            let h = |t: &Tensor<T>| t.host().expect("placed").to_vec();
            let (q, k, v, o, dout) = (h(s.q), h(s.k), h(s.v), h(s.o), h(s.dout));
            let lse = s.lse.host().expect("placed").to_vec();
            let (dq, dk, dv) = cpu_bwd(d, mask, CpuIn { q: &q, k: &k, v: &v, o: &o, dout: &dout, lse: &lse }, false);
            g.dq.host_mut().expect("placed").copy_from_slice(&dq);
            g.dk.host_mut().expect("placed").copy_from_slice(&dk);
            g.dv.host_mut().expect("placed").copy_from_slice(&dv);
            Ok(())
        }
        (Kernel::NaiveBwd, Backend::Cuda(gpu)) => launch_naive(gpu, d, mask, s, g),
        (Kernel::Fa2Bwd { deterministic: false, .. }, Backend::Cuda(gpu)) => launch_fa2(gpu, d, mask, s, g),
        (Kernel::Fa2Bwd { deterministic: true, .. }, Backend::Cuda(gpu)) => launch_fa2_det(gpu, d, mask, s, g, None),
        (Kernel::NaiveBwd | Kernel::Fa2Bwd { .. }, Backend::Cpu) => unreachable!("check_runs keeps GPU variants off the CPU"),
        _ => unreachable!("refusal() turns forward variants away"),
    }
}

fn placed<T: Elem>(t: &Tensor<T>) -> &cudarc::driver::CudaSlice<T> {
    t.cuda().expect("placed")
}

fn launch_naive<T: Elem>(gpu: &crate::gpu::Gpu, d: Dims, mask: Mask, s: &Saved<T>, g: &mut Grads<T>) -> Result<()> {
    let scale = 1.0 / (d.d as f32).sqrt();
    let (causal, window) = (mask.causal as i32, mask.window as i32);
    let [sq, sk, hq, hkv, hd] = [d.sq, d.sk, d.hq, d.hkv, d.d].map(|x| x as i32);
    let scores = d.batch * d.hq * d.sq * d.sk;
    // SAFETY: every element of p and dp is written by the pdp kernel before it is read.
    let mut p = unsafe { gpu.stream.alloc::<f32>(scores) }.doing("allocating naive_bwd's P")?;
    let mut dp = unsafe { gpu.stream.alloc::<f32>(scores) }.doing("allocating naive_bwd's dP")?;
    let (q, k, v, dout, lse) = (placed(s.q), placed(s.k), placed(s.v), placed(s.dout), s.lse.cuda().expect("placed"));
    let heads = (d.batch * d.hq) as u32;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "naive_bwd_pdp", T::DTYPE))?;
    let cfg = LaunchConfig { grid_dim: (d.sk.div_ceil(256) as u32, d.sq as u32, heads), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(q).arg(k).arg(v).arg(dout).arg(lse).arg(&mut p).arg(&mut dp);
    b.arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&hd).arg(&scale).arg(&causal).arg(&window);
    // SAFETY: the grid covers (key, query, batch x head) once; every buffer holds its shape.
    unsafe { b.launch(cfg) }.doing("launching attention naive_bwd pdp")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "naive_bwd_ds", DType::F32))?;
    let cfg = LaunchConfig { grid_dim: (heads * d.sq as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: one block per row of Sk scores; p and dp hold B Hq Sq rows.
    unsafe { gpu.stream.launch_builder(&f).arg(&p).arg(&mut dp).arg(&sk).launch(cfg) }.doing("launching attention naive_bwd ds")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "naive_bwd_dq", T::DTYPE))?;
    let cfg = LaunchConfig { grid_dim: (d.d.div_ceil(64) as u32, d.sq as u32, heads), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&dp).arg(k).arg(g.dq.cuda_mut().expect("placed")).arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&hd).arg(&scale);
    // SAFETY: the grid covers (d, query, batch x head) once; ds, k and dq hold their shapes.
    unsafe { b.launch(cfg) }.doing("launching attention naive_bwd dq")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "naive_bwd_dkv", T::DTYPE))?;
    let cfg = LaunchConfig { grid_dim: (d.d.div_ceil(64) as u32, d.sk as u32, (d.batch * d.hkv) as u32), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
    let (dk, dv) = (g.dk.cuda_mut().expect("placed"), g.dv.cuda_mut().expect("placed"));
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&p).arg(&dp).arg(q).arg(dout).arg(dk).arg(dv).arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&hd).arg(&scale);
    // SAFETY: the grid covers (d, key, batch x kv head) once; every buffer holds its shape.
    unsafe { b.launch(cfg) }.map(|_| ()).doing("launching attention naive_bwd dkv")
}

/// Bytes of fa2_bwd's dynamic shared memory (FA_BWD_SMEM(D) in the kernel).
pub fn fa2_bwd_smem(d: usize) -> usize {
    (2 * BN + 4 * BM) * (d + 8) * 2 + BM * (BN + 8) * 2 + 4 * BM * 4
}

fn launch_fa2<T: Elem>(gpu: &crate::gpu::Gpu, d: Dims, mask: Mask, s: &Saved<T>, g: &mut Grads<T>) -> Result<()> {
    let scale = 1.0 / (d.d as f32).sqrt();
    let (causal, window) = (mask.causal as i32, mask.window as i32);
    let [sq, sk, hq, hkv, hd] = [d.sq, d.sk, d.hq, d.hkv, d.d].map(|x| x as i32);
    let rows = d.batch * d.sq * d.hq;
    // SAFETY: the preprocessing kernel writes every element of delta and zeroes dq_acc.
    let mut delta = unsafe { gpu.stream.alloc::<f32>(rows) }.doing("allocating fa2_bwd's D")?;
    let mut dq_acc = unsafe { gpu.stream.alloc::<f32>(rows * d.d) }.doing("allocating fa2_bwd's dQ accumulator")?;
    let (q, k, v, o, dout, lse) = (placed(s.q), placed(s.k), placed(s.v), placed(s.o), placed(s.dout), s.lse.cuda().expect("placed"));
    let f = gpu.function(FAMILY, &symbol(FAMILY, "fa2_bwd_pre", T::DTYPE))?;
    let cfg = LaunchConfig { grid_dim: (rows.div_ceil(4) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let rows_i = rows as i32;
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(o).arg(dout).arg(&mut delta).arg(&mut dq_acc).arg(&rows_i).arg(&sq).arg(&hq).arg(&hd);
    // SAFETY: a warp per row of [B, Sq, Hq], bounded by `rows`; o, dout and dq_acc hold rows x D.
    unsafe { b.launch(cfg) }.doing("launching attention fa2_bwd preprocessing")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, &format!("fa2_bwd_d{}", d.d), T::DTYPE))?;
    let smem = fa2_bwd_smem(d.d);
    raise_dynamic_smem(&f, smem)?;
    let cfg = LaunchConfig { grid_dim: (d.sk.div_ceil(BN) as u32, d.hkv as u32, d.batch as u32), block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
    let (dk, dv) = (g.dk.cuda_mut().expect("placed"), g.dv.cuda_mut().expect("placed"));
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(q).arg(k).arg(v).arg(dout).arg(lse).arg(&delta).arg(&mut dq_acc).arg(dk).arg(dv);
    b.arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&scale).arg(&causal).arg(&window);
    // SAFETY: the grid covers every 64-key tile of every KV head; the kernel bounds query rows by
    // Sq and keys by Sk, and every buffer holds its shape (checked by `check`).
    unsafe { b.launch(cfg) }.doing("launching attention fa2_bwd")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "fa2_bwd_dq", T::DTYPE))?;
    let n = (rows * d.d) as i64;
    let cfg = LaunchConfig { grid_dim: ((rows * d.d).div_ceil(256).min(65535) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: grid-stride over n elements of dq_acc and dq.
    unsafe { gpu.stream.launch_builder(&f).arg(&dq_acc).arg(g.dq.cuda_mut().expect("placed")).arg(&n).arg(&scale).launch(cfg) }
        .map(|_| ())
        .doing("launching attention fa2_bwd dq")
}

/// Bytes of fa2_bwd_det's dQ kernel's dynamic shared memory (FA_BWD_DQ_SMEM(D)).
pub fn fa2_bwd_dq_smem(d: usize) -> usize {
    (2 * BM + 4 * BN) * (d + 8) * 2
}

/// fa2_bwd_det: D, then dK and dV (fa2_bwd's kernel without dQ), then dQ by query tiles; dense,
/// or over a packed batch (`d.sq` and `d.sk` its longest sequences; shapes checked by the caller).
pub(super) fn launch_fa2_det<T: Elem>(gpu: &crate::gpu::Gpu, d: Dims, mask: Mask, s: &Saved<T>, g: &mut Grads<T>, packed: Option<super::Packed>) -> Result<()> {
    let scale = 1.0 / (d.d as f32).sqrt();
    let (causal, window) = (mask.causal as i32, mask.window as i32);
    let [sq, sk, hq, hkv, hd] = [d.sq, d.sk, d.hq, d.hkv, d.d].map(|x| x as i32);
    let rows = packed.map_or(d.batch * d.sq, |p| p.total_q) * d.hq;
    let packed_i = packed.is_some() as i32;
    // SAFETY: the preprocessing kernel writes every element of delta.
    let mut delta = unsafe { gpu.stream.alloc::<f32>(rows) }.doing("allocating fa2_bwd_det's D")?;
    let (q, k, v, o, dout, lse) = (placed(s.q), placed(s.k), placed(s.v), placed(s.o), placed(s.dout), s.lse.cuda().expect("placed"));
    let f = gpu.function(FAMILY, &symbol(FAMILY, "fa2_bwd_det_pre", T::DTYPE))?;
    let cfg = LaunchConfig { grid_dim: (rows.div_ceil(4) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    let rows_i = rows as i32;
    // SAFETY: a warp per row of [B, Sq, Hq] (or [total_q, Hq]), bounded by `rows`; o and dout hold rows x D.
    unsafe { gpu.stream.launch_builder(&f).arg(o).arg(dout).arg(&mut delta).arg(&rows_i).arg(&sq).arg(&hq).arg(&hd).arg(&packed_i).launch(cfg) }
        .doing("launching attention fa2_bwd_det preprocessing")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, &format!("fa2_bwd_det_d{}", d.d), T::DTYPE))?;
    let smem = fa2_bwd_smem(d.d);
    raise_dynamic_smem(&f, smem)?;
    let cfg = LaunchConfig { grid_dim: (d.sk.div_ceil(BN) as u32, d.hkv as u32, d.batch as u32), block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
    let (dk, dv) = (g.dk.cuda_mut().expect("placed"), g.dv.cuda_mut().expect("placed"));
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(q).arg(k).arg(v).arg(dout).arg(lse).arg(&delta).arg(dk).arg(dv);
    super::push_offsets(&mut b, packed);
    b.arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&scale).arg(&causal).arg(&window);
    // SAFETY: as fa2_bwd's launch (a packed batch's offsets checked by varlen::Varlen::new); this
    // kernel writes dK and dV only.
    unsafe { b.launch(cfg) }.doing("launching attention fa2_bwd_det dK/dV")?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, &format!("fa2_bwd_det_dq_d{}", d.d), T::DTYPE))?;
    let smem = fa2_bwd_dq_smem(d.d);
    raise_dynamic_smem(&f, smem)?;
    let cfg = LaunchConfig { grid_dim: (d.sq.div_ceil(BM) as u32, d.hq as u32, d.batch as u32), block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(q).arg(k).arg(v).arg(dout).arg(lse).arg(&delta).arg(g.dq.cuda_mut().expect("placed"));
    super::push_offsets(&mut b, packed);
    b.arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&scale).arg(&causal).arg(&window);
    // SAFETY: the grid covers every 64-row query tile of every head; the kernel bounds rows by Sq
    // and keys by Sk, and every buffer holds its shape (checked by `check`).
    unsafe { b.launch(cfg) }.map(|_| ()).doing("launching attention fa2_bwd_det dQ")
}

/// dQ, dK, dV on the host.
pub type HostGrads<T> = (Vec<T>, Vec<T>, Vec<T>);

/// The backward's inputs on the host.
#[derive(Clone, Copy)]
pub struct CpuIn<'a, T> {
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    pub o: &'a [T],
    pub dout: &'a [T],
    pub lse: &'a [f32],
}

/// fa2_bwd's algorithm on the CPU, tile for tile: D by the preprocessing step, then per (batch,
/// KV head) in parallel the 64-key tiles in order, each walking the same query tiles of every
/// head of its group from the same `lo`, with the same edge test and keep rule, P recomputed from
/// lse in log2 units, P and dS rounded to T where the mma reads them, fp32 accumulation, dQ
/// summed over key tiles in an fp32 accumulator and scaled at the end. `drop_last_kv_tile` plants
/// the fault the tests must catch. Returns (dq, dk, dv).
pub fn cpu_bwd<T: Elem>(d: Dims, m: Mask, x: CpuIn<T>, drop_last_kv_tile: bool) -> HostGrads<T> {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let (dd, group, off) = (d.d, d.hq / d.hkv, d.sk as i64 - d.sq as i64);
    let scale = 1.0 / (dd as f32).sqrt();
    let sl2 = scale * LOG2E;
    let f = |v: &[T]| -> Vec<f32> { v.iter().map(|a| a.to_f32()).collect() };
    let (q, k, v, dout) = (f(x.q), f(x.k), f(x.v), f(x.dout));
    let round = |a: f32| T::from_f32(a).to_f32();
    let qrow = |b: usize, i: usize, h: usize| ((b * d.sq + i) * d.hq + h) * dd;
    let krow = |b: usize, j: usize, hk: usize| ((b * d.sk + j) * d.hkv + hk) * dd;
    // The preprocessing kernel: D = rowsum(dO * O) in fp32, indexed like lse.
    let delta: Vec<f32> = (0..d.batch * d.hq * d.sq)
        .map(|r| {
            let (b, h, i) = (r / (d.hq * d.sq), r / d.sq % d.hq, r % d.sq);
            x.o[qrow(b, i, h)..][..dd].iter().zip(&dout[qrow(b, i, h)..][..dd]).map(|(o, g)| o.to_f32() * g).sum()
        })
        .collect();
    let tiles = d.sk.div_ceil(BN) - drop_last_kv_tile as usize;
    // Per (batch, KV head): its dK and dV rows [sk][d], and the dQ accumulator of its group's heads [sq][group][d].
    let parts: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..d.batch * d.hkv)
        .into_par_iter()
        .map(|bk| {
            let (b, hk) = (bk / d.hkv, bk % d.hkv);
            let (mut dk, mut dv, mut dq) = (vec![0f32; d.sk * dd], vec![0f32; d.sk * dd], vec![0f32; d.sq * group * dd]);
            for tile in 0..tiles {
                let kv0 = (tile * BN) as i64;
                let mut lo = 0i64;
                let mut hi = d.sq as i64;
                if m.causal {
                    lo = (kv0 - off).max(0);
                }
                if m.window > 0 {
                    hi = hi.min((kv0 + BN as i64).min(d.sk as i64) - 1 - off + m.window as i64);
                }
                lo = lo / BM as i64 * BM as i64;
                let qtiles = if hi > lo { (hi - lo + BM as i64 - 1) / BM as i64 } else { 0 };
                for it in 0..group as i64 * qtiles {
                    let (hh, i0) = ((it / qtiles) as usize, lo + it % qtiles * BM as i64);
                    let h = hk * group + hh;
                    let edge = i0 + BM as i64 > d.sq as i64
                        || kv0 + BN as i64 > d.sk as i64
                        || (m.causal && kv0 + BN as i64 - 1 > i0 + off)
                        || (m.window > 0 && kv0 <= i0 + BM as i64 - 1 + off - m.window as i64);
                    // Rows past Sq and keys past Sk are zero-filled tiles: masked, they add nothing.
                    for i in (i0 as usize)..(i0 as usize + BM).min(d.sq) {
                        let (qi, gi) = (&q[qrow(b, i, h)..][..dd], &dout[qrow(b, i, h)..][..dd]);
                        let lse2 = x.lse[(b * d.hq + h) * d.sq + i] * LOG2E;
                        let di = delta[(b * d.hq + h) * d.sq + i];
                        for j in (kv0 as usize)..(kv0 as usize + BN).min(d.sk) {
                            if edge && !d.keep(m, i, j) {
                                continue;
                            }
                            let (kj, vj) = (&k[krow(b, j, hk)..][..dd], &v[krow(b, j, hk)..][..dd]);
                            let s: f32 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
                            let dp: f32 = gi.iter().zip(vj).map(|(a, b)| a * b).sum();
                            let p = (s * sl2 - lse2).exp2();
                            let ds = round(p * (dp - di));
                            let p = round(p);
                            for c in 0..dd {
                                dv[j * dd + c] += p * gi[c];
                                dk[j * dd + c] += ds * qi[c];
                                dq[(i * group + hh) * dd + c] += ds * kj[c];
                            }
                        }
                    }
                }
            }
            (dk, dv, dq)
        })
        .collect();
    let (mut gq, mut gk, mut gv) = (vec![T::from_f32(0.0); d.batch * d.sq * d.hq * dd], vec![T::from_f32(0.0); d.batch * d.sk * d.hkv * dd], vec![T::from_f32(0.0); d.batch * d.sk * d.hkv * dd]);
    for (bk, (dk, dv, dq)) in parts.into_iter().enumerate() {
        let (b, hk) = (bk / d.hkv, bk % d.hkv);
        for j in 0..d.sk {
            for c in 0..dd {
                gk[krow(b, j, hk) + c] = T::from_f32(dk[j * dd + c] * scale);
                gv[krow(b, j, hk) + c] = T::from_f32(dv[j * dd + c]);
            }
        }
        for i in 0..d.sq {
            for hh in 0..group {
                for c in 0..dd {
                    gq[qrow(b, i, hk * group + hh) + c] = T::from_f32(dq[(i * group + hh) * dd + c] * scale);
                }
            }
        }
    }
    (gq, gk, gv)
}

#[cfg(test)]
mod tests;
