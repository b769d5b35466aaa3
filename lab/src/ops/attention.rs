//! `attention`: scaled dot-product attention forward (kernels/attention.cu), a ladder from a
//! naive kernel that materializes the scores to FlashAttention 2's loop on mma.sync, beside
//! torch SDPA's backends; its backward in [`backward`] (kernels/attention_backward.cu).
//!
//! Tensors are [batch, seq, heads, head_dim] (FlashAttention's layout); `lse` is [batch, heads,
//! seq_q] in fp32. Query head h reads key/value head h / (Hq / Hkv): MHA, GQA and MQA. Key j of
//! query i is kept when j < Sk, and, when causal, j <= i + Sk - Sq (aligned bottom-right, as
//! FlashAttention 2 does), and, with a window w > 0, j > i + Sk - Sq - w. A row that keeps no key
//! gives O = 0 and lse = -inf. The scale is 1 / sqrt(head_dim).
//!
//! The family's one variant table, forward and backward, lives here with the forward's op and
//! reference; the forward's experiment cases in [`experiment`], the backward's and decode's in
//! their own modules.

use super::gemm::raise_dynamic_smem;
use super::variant::{self, Requires, Variant, VariantInfo};
use super::Elem;
use crate::error::Doing;
use crate::experiment::Backend;
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchArgs, LaunchConfig, PushKernelArg};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

pub struct Attention;

const FAMILY: &str = "attention";

pub mod backward;
pub mod backward_check;
pub mod decode;
pub mod decode_check;
mod experiment;
pub mod varlen;
pub mod wgmma;

use experiment::{case_dims, case_json, CaseShape};

/// How a variant runs.
#[derive(Clone, Copy, Debug)]
pub enum Kernel {
    /// Scores, softmax and P V as three kernels through an fp32 scratch of B Hq Sq Sk scores.
    Naive,
    /// FlashAttention 2 on mma.sync, for the head dims it was instantiated for, with `mt` 16-row
    /// m-tiles per warp (a block of 4 warps owns 64 mt query rows).
    Fa2 { head_dims: &'static [usize], mt: usize },
    /// The Hopper rungs (attention/wgmma.rs): TMA and wgmma, two warpgroups of 64 query rows, for
    /// these head dims.
    Wgmma { head_dims: &'static [usize] },
    /// [`cpu_rows`].
    CpuRows,
    /// One query row per sequence over a paged cache: [`decode::Decode`], not [`forward_with`];
    /// decode_split on CUDA cores, or decode_mma on mma.sync behind a cp.async ring; `merge`: the
    /// combine step done by each head group's last split instead of a second kernel.
    Decode { mma: bool, merge: bool },
    /// Backward ([`backward::backward_with`]): P, dP and dS through fp32 scratches of B Hq Sq Sk.
    NaiveBwd,
    /// Backward: FlashAttention 2's loop over query tiles per 64-key tile, for these head dims;
    /// `deterministic`: dQ by a second kernel over query tiles instead of fp32 atomics.
    Fa2Bwd { head_dims: &'static [usize], deterministic: bool },
    /// Backward: [`backward::cpu_bwd`], fa2_bwd's tiling on the CPU.
    CpuBwd,
}

impl Kernel {
    /// Does the variant compute the backward?
    pub fn is_backward(&self) -> bool {
        matches!(self, Kernel::NaiveBwd | Kernel::Fa2Bwd { .. } | Kernel::CpuBwd)
    }
    /// Does the variant give the same bits on every run of the same inputs? All but fa2_bwd,
    /// whose dQ atomics add in the order the blocks reach them.
    pub fn deterministic(&self) -> bool {
        !matches!(self, Kernel::Fa2Bwd { deterministic: false, .. })
    }
}

const F16_BF16: &[DType] = &[DType::F16, DType::Bf16];
/// The CPU rungs also take f32: the trainer (`crate::train`) runs attention in f32 on the CPU.
const CPU_DTYPES: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

/// The ladder, in order: the only place an attention variant is named.
pub const VARIANTS: &[Variant<Kernel>] = &[
    Variant {
        name: "naive",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "S = QK^T written to memory in fp32, a row softmax, then PV: the traffic FlashAttention removes",
        config: Kernel::Naive,
    },
    Variant {
        name: "fa2",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "FlashAttention 2: 64-row query tiles on mma.sync, K/V tiles through cp.async, online softmax in registers",
        config: Kernel::Fa2 { head_dims: &[64, 128], mt: 1 },
    },
    Variant {
        name: "fa2_m32",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "32 query rows per warp: each K/V fragment from shared memory feeds two mmas",
        config: Kernel::Fa2 { head_dims: &[64, 128], mt: 2 },
    },
    Variant {
        name: "wgmma",
        dtypes: F16_BF16,
        requires: Requires::Sm90a,
        what: "Hopper: Q, K, V by TMA into a ring of 3-4 stages, QK^T and PV as wgmma (P from registers), two warpgroups of 64 rows",
        config: Kernel::Wgmma { head_dims: &[64, 128] },
    },
    Variant {
        name: "wgmma_overlap",
        dtypes: F16_BF16,
        requires: Requires::Sm90a,
        what: "the next tile's QK^T and this tile's PV in flight while the softmax runs (FlashAttention 3's intra-warpgroup overlap)",
        config: Kernel::Wgmma { head_dims: &[64, 128] },
    },
    Variant {
        name: "wgmma_pingpong",
        dtypes: F16_BF16,
        requires: Requires::Sm90a,
        what: "wgmma_overlap with the two warpgroups taking turns to issue (FlashAttention 3's ping-pong): one's softmax beside the other's GEMMs",
        config: Kernel::Wgmma { head_dims: &[64, 128] },
    },
    Variant {
        name: "decode_split",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "decode: the context split over blocks (flash-decoding), a KV row read once for its query heads, paged cache",
        config: Kernel::Decode { mma: false, merge: false },
    },
    Variant {
        name: "decode_mma",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "decode_split with a group's query heads as the rows of mma.sync tiles and K/V through a 3-stage cp.async ring",
        config: Kernel::Decode { mma: true, merge: false },
    },
    Variant {
        name: "decode_merge",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "decode_mma with the combine folded in: the last split of a head group to finish merges the group's splits (one launch a step)",
        config: Kernel::Decode { mma: true, merge: true },
    },
    Variant {
        name: "cpu_rows",
        dtypes: CPU_DTYPES,
        requires: Requires::Cpu,
        what: "one query row at a time, online softmax in f32, rows in parallel",
        config: Kernel::CpuRows,
    },
    Variant {
        name: "naive_bwd",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "backward: P and dP written to memory in fp32, dS in place, then dQ and dK/dV one thread per output",
        config: Kernel::NaiveBwd,
    },
    Variant {
        name: "fa2_bwd",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "backward: FlashAttention 2's loop, a block per 64-key tile over query tiles, P recomputed from lse, dQ by fp32 atomics",
        config: Kernel::Fa2Bwd { head_dims: &[64, 128], deterministic: false },
    },
    Variant {
        name: "fa2_bwd_det",
        dtypes: F16_BF16,
        requires: Requires::Gpu,
        what: "backward, deterministic: fa2_bwd's dK/dV kernel without the atomics, dQ by a kernel per 64 query rows summing the key tiles in order (S and dP recomputed)",
        config: Kernel::Fa2Bwd { head_dims: &[64, 128], deterministic: true },
    },
    Variant {
        name: "cpu_bwd",
        dtypes: CPU_DTYPES,
        requires: Requires::Cpu,
        what: "backward: fa2_bwd's tiling on the CPU in f32, (batch, KV head) pairs in parallel",
        config: Kernel::CpuBwd,
    },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// The kernel symbols the launchers use, for the export check.
pub fn gpu_symbols() -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::from([symbol(FAMILY, "naive_softmax", DType::F32), symbol(FAMILY, "naive_bwd_ds", DType::F32)]);
    for &d in F16_BF16 {
        for k in ["naive_scores", "naive_pv", "fa2_d64", "fa2_d128", "fa2_m32_d64", "fa2_m32_d128", "wgmma_d64", "wgmma_d128", "wgmma_overlap_d64", "wgmma_overlap_d128", "wgmma_pingpong_d64", "wgmma_pingpong_d128"] {
            out.insert(symbol(FAMILY, k, d));
        }
        for dh in [64, 128] {
            for gm in [1, 2, 4, 8] {
                out.insert(symbol(FAMILY, &format!("decode_split_d{dh}_g{gm}"), d));
            }
            out.insert(symbol(FAMILY, &format!("decode_mma_d{dh}"), d));
            out.insert(symbol(FAMILY, &format!("decode_merge_d{dh}"), d));
        }
        out.insert(symbol(FAMILY, "decode_combine", d));
        for k in ["naive_bwd_pdp", "naive_bwd_dq", "naive_bwd_dkv", "fa2_bwd_pre", "fa2_bwd_d64", "fa2_bwd_d128", "fa2_bwd_dq", "fa2_bwd_det_pre"] {
            out.insert(symbol(FAMILY, k, d));
        }
        for k in ["fa2_bwd_det_d64", "fa2_bwd_det_d128", "fa2_bwd_det_dq_d64", "fa2_bwd_det_dq_d128"] {
            out.insert(symbol(FAMILY, k, d));
        }
    }
    out
}

/// Beyond this many scores (4 GiB of fp32 scratch) the naive rung is not run.
pub const NAIVE_MAX_SCORES: usize = 1 << 30;

/// Why `v` does not take shape `d`, or None when it does.
pub fn refusal(v: &Variant<Kernel>, d: Dims) -> Option<String> {
    match v.config {
        Kernel::Fa2 { head_dims, .. } | Kernel::Wgmma { head_dims } if !head_dims.contains(&d.d) => Some(format!("`{}` takes head_dim {head_dims:?}, not {}", v.name, d.d)),
        Kernel::Naive if d.batch * d.hq * d.sq * d.sk > NAIVE_MAX_SCORES => {
            Some(format!("`naive` materializes {} scores; it takes at most {NAIVE_MAX_SCORES}", d.batch * d.hq * d.sq * d.sk))
        }
        Kernel::Decode { .. } => Some(format!("`{}` serves one query row per sequence over a KV cache (attention::decode::Decode)", v.name)),
        k if k.is_backward() => Some(format!("`{}` is a backward variant (attention::backward::backward_with)", v.name)),
        _ => None,
    }
}

/// The mask: causal (bottom-right aligned) and a left window (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mask {
    pub causal: bool,
    pub window: usize,
}

/// The sizes an attention call works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub sq: usize,
    pub sk: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
}

impl Dims {
    /// Is key j kept for query i?
    pub fn keep(&self, m: Mask, i: usize, j: usize) -> bool {
        let (i, j, off) = (i as i64, j as i64, self.sk as i64 - self.sq as i64);
        j < self.sk as i64 && (!m.causal || j <= i + off) && (m.window == 0 || j > i + off - m.window as i64)
    }
    /// Kept (query, key) pairs of one head, counted exactly.
    pub fn pairs(&self, m: Mask) -> u64 {
        (0..self.sq).map(|i| (0..self.sk).filter(|&j| self.keep(m, i, j)).count() as u64).sum()
    }
    /// FlashAttention 3's count: 4 D flops per kept pair (QK^T and PV); bytes: Q, K, V and O once,
    /// and the fp32 lse.
    pub fn work(&self, m: Mask, elem: usize) -> Work {
        let heads = (self.batch * self.hq) as u64;
        let flops = 4 * self.d as u64 * heads * self.pairs(m);
        let (q, kv) = (self.batch * self.sq * self.hq * self.d, self.batch * self.sk * self.hkv * self.d);
        Work { bytes: ((2 * q + 2 * kv) * elem + 4 * self.batch * self.hq * self.sq) as u64, flops }
    }
}

/// The variant [`forward`] runs: on sm_90a `wgmma` (an H100, run
/// 2026-11-27T13-12-20Z-h100-5f878e8-9838: 1.6-1.9x fa2_m32 across FlashAttention 3's sweep, 2.1x
/// at SmolLM2's prefill; its two overlapped variants no faster except at 512-1024 tokens);
/// elsewhere, as measured on an H200 (2026-11-26T02-14-22Z-h200-4f89ed0), `fa2_m32` where its
/// 128-row blocks fill the GPU twice over (1.2-1.5x `fa2` from 2048 tokens up), `fa2` for fewer
/// query tiles, the naive rung for other head dims; the CPU path on the CPU.
pub fn best(dev: &Backend, d: Dims) -> &'static Variant<Kernel> {
    let takes = |name: &str| {
        let v = variant::find(FAMILY, VARIANTS, name).expect("in the table");
        v.requires.met_by(dev) && refusal(v, d).is_none()
    };
    let name = match dev {
        Backend::Cpu => "cpu_rows",
        Backend::Cuda(_) if takes("wgmma") => "wgmma",
        Backend::Cuda(_) if !takes("fa2") => "naive",
        Backend::Cuda(g) if d.sq.div_ceil(128) * d.hq * d.batch >= 2 * g.info.sm_count as usize => "fa2_m32",
        Backend::Cuda(_) => "fa2",
    };
    variant::find(FAMILY, VARIANTS, name).expect("the best attention variant is in the table")
}

/// O = softmax(QK^T / sqrt(D) + mask) V and the rows' log-sum-exp, with the best variant.
pub fn forward<T: Elem>(dev: &Backend, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, mask: Mask, o: &mut Tensor<T>, lse: &mut Tensor<f32>) -> Result<()> {
    let d = dims(q, k, v, o, lse)?;
    forward_with(dev, best(dev, d).name, q, k, v, mask, o, lse)
}

/// The shapes of q, k, v, o and lse, checked against each other: clear errors naming the problem.
pub fn dims<T: Elem>(q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &Tensor<T>, lse: &Tensor<f32>) -> Result<Dims> {
    let bad = |why: String| LabError::shape("attention", why);
    for (name, t) in [("q", q.shape()), ("k", k.shape()), ("v", v.shape()), ("o", o.shape())] {
        if t.len() != 4 {
            return Err(bad(format!("{name} is {t:?}: tensors are [batch, seq, heads, head_dim]")));
        }
    }
    let (qs, ks) = (q.shape(), k.shape());
    let d = Dims { batch: qs[0], sq: qs[1], hq: qs[2], d: qs[3], sk: ks[1], hkv: ks[2] };
    if k.shape() != v.shape() {
        return Err(bad(format!("k is {:?} but v is {:?}", k.shape(), v.shape())));
    }
    if ks[0] != d.batch || ks[3] != d.d {
        return Err(bad(format!("q is {qs:?} but k is {ks:?}: batch and head_dim must match")));
    }
    if d.hkv == 0 || !d.hq.is_multiple_of(d.hkv) {
        return Err(bad(format!("{} query heads are not a multiple of {} key/value heads", d.hq, d.hkv)));
    }
    if o.shape() != qs {
        return Err(bad(format!("q is {qs:?} but o is {:?}", o.shape())));
    }
    if lse.shape() != [d.batch, d.hq, d.sq] {
        return Err(bad(format!("lse is {:?}, not [batch, heads, seq_q] = {:?}", lse.shape(), [d.batch, d.hq, d.sq])));
    }
    if d.batch * d.sq * d.sk * d.hq * d.d == 0 {
        return Err(bad(format!("q is {qs:?} and k {ks:?}: every size must be at least 1")));
    }
    Ok(d)
}

/// [`forward`] with the named variant (any row of [`VARIANTS`]).
#[allow(clippy::too_many_arguments)]
pub fn forward_with<T: Elem>(
    dev: &Backend,
    variant: &str,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    mask: Mask,
    o: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
) -> Result<()> {
    let var = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, var, dev, T::DTYPE)?;
    let places = [("q", q.placement()), ("k", k.placement()), ("v", v.placement()), ("o", o.placement()), ("lse", lse.placement())];
    check_placement("attention", dev, &places)?;
    let d = dims(q, k, v, o, lse)?;
    if let Some(why) = refusal(var, d) {
        return Err(LabError::shape("attention", why));
    }
    let scale = 1.0 / (d.d as f32).sqrt();
    let (causal, window) = (mask.causal as i32, mask.window as i32);
    // The kernels' int arguments, kept alive for the launch builders: Sq, Sk, Hq, Hkv, D.
    let [sq, sk, hq, hkv, hd] = [d.sq, d.sk, d.hq, d.hkv, d.d].map(|x| x as i32);
    match (var.config, dev) {
        (Kernel::CpuRows, _) => {
            let (qh, kh, vh) = (q.host().expect("placed"), k.host().expect("placed"), v.host().expect("placed"));
            cpu_rows(d, mask, qh, kh, vh, o.host_mut().expect("placed"), lse.host_mut().expect("placed"));
            Ok(())
        }
        (Kernel::Fa2 { .. } | Kernel::Wgmma { .. }, Backend::Cuda(gpu)) => {
            let (dq, dk, dv) = (q.cuda().expect("placed"), k.cuda().expect("placed"), v.cuda().expect("placed"));
            let (dl, dout) = (lse.cuda_mut().expect("placed"), o.cuda_mut().expect("placed"));
            launch_tiled(gpu, var, d, mask, (&dq.as_view(), &dk.as_view(), &dv.as_view()), &mut dout.as_view_mut(), &mut dl.as_view_mut(), None)
        }
        (Kernel::Naive, Backend::Cuda(gpu)) => {
            let scores = d.batch * d.hq * d.sq * d.sk;
            // SAFETY: every score is written by the scores kernel before it is read.
            let mut s = unsafe { gpu.stream.alloc::<f32>(scores) }.doing("allocating the naive scores")?;
            let (dq, dk, dv) = (q.cuda().expect("placed"), k.cuda().expect("placed"), v.cuda().expect("placed"));
            let heads = (d.batch * d.hq) as u32;
            let f = gpu.function(FAMILY, &symbol(FAMILY, "naive_scores", T::DTYPE))?;
            let cfg = LaunchConfig { grid_dim: (d.sk.div_ceil(256) as u32, d.sq as u32, heads), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(dq).arg(dk).arg(&mut s).arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&hd);
            b.arg(&scale).arg(&causal).arg(&window);
            // SAFETY: the grid covers (key, query, batch x head) once; q, k and s hold their shapes.
            unsafe { b.launch(cfg) }.doing("launching attention naive scores")?;
            let f = gpu.function(FAMILY, &symbol(FAMILY, "naive_softmax", DType::F32))?;
            let cfg = LaunchConfig { grid_dim: ((d.batch * d.hq * d.sq) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let dl = lse.cuda_mut().expect("placed");
            // SAFETY: one block per score row; s holds B Hq Sq rows of Sk, lse one per row.
            unsafe { gpu.stream.launch_builder(&f).arg(&mut s).arg(dl).arg(&sk).launch(cfg) }.doing("launching attention naive softmax")?;
            let f = gpu.function(FAMILY, &symbol(FAMILY, "naive_pv", T::DTYPE))?;
            let cfg = LaunchConfig { grid_dim: (d.d.div_ceil(64) as u32, d.sq as u32, heads), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
            let dout = o.cuda_mut().expect("placed");
            let mut b = gpu.stream.launch_builder(&f);
            b.arg(&s).arg(dv).arg(dout).arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&hd);
            // SAFETY: the grid covers (d, query, batch x head) once; p, v and o hold their shapes.
            unsafe { b.launch(cfg) }.map(|_| ()).doing("launching attention naive pv")
        }
        (Kernel::Decode { .. } | Kernel::NaiveBwd | Kernel::Fa2Bwd { .. } | Kernel::CpuBwd, _) => unreachable!("refusal() turns the decode and backward variants away"),
        (_, Backend::Cpu) => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

/// A packed batch's cumulative offsets on the device and its row totals (q, k): [`varlen`].
#[derive(Clone, Copy)]
pub struct Packed<'a> {
    pub cu_q: &'a CudaSlice<i32>,
    pub cu_k: &'a CudaSlice<i32>,
    pub total_q: usize,
    pub total_k: usize,
}

/// The kernels' two offset arguments (cu_q, cu_k): a packed batch's, or null pointers for the
/// dense layout.
pub(crate) fn push_offsets<'a>(b: &mut LaunchArgs<'a>, packed: Option<Packed<'a>>) {
    static NULL: u64 = 0;
    match packed {
        Some(p) => b.arg(p.cu_q).arg(p.cu_k),
        None => b.arg(&NULL).arg(&NULL),
    };
}

/// Launches a tiled rung (fa2 or wgmma) on device views: what [`forward_with`] runs, and what a
/// model calls on a slice of its KV cache. Dense (`packed` None: `d.batch` sequences of `d.sq` and
/// `d.sk` rows) or over a packed batch (`d.sq` and `d.sk` the longest sequences, which size the
/// grid). Views shorter than `d` needs are an error.
#[allow(clippy::too_many_arguments)]
pub fn launch_tiled<T: Elem>(
    gpu: &crate::gpu::Gpu,
    var: &Variant<Kernel>,
    d: Dims,
    mask: Mask,
    qkv: (&CudaView<T>, &CudaView<T>, &CudaView<T>),
    o: &mut CudaViewMut<T>,
    lse: &mut CudaViewMut<f32>,
    packed: Option<Packed>,
) -> Result<()> {
    let (rows_q, rows_k) = packed.map_or((d.batch * d.sq, d.batch * d.sk), |p| (p.total_q, p.total_k));
    let ((q, k, v), (qn, kn)) = (qkv, (rows_q * d.hq * d.d, rows_k * d.hkv * d.d));
    if q.len() < qn || k.len() < kn || v.len() < kn || o.len() < qn || lse.len() < d.hq * rows_q {
        return Err(LabError::shape("attention", format!("{d:?}: q {}, k {}, v {}, o {}, lse {} elements", q.len(), k.len(), v.len(), o.len(), lse.len())));
    }
    match var.config {
        Kernel::Fa2 { mt, .. } => launch_fa2(gpu, var.name, mt, d, mask, qkv, o, lse, packed),
        Kernel::Wgmma { .. } => wgmma::launch(gpu, var.name, d, mask, qkv, o, lse, packed),
        _ => Err(LabError::Invalid(format!("`{}` is not a tiled attention rung (fa2, wgmma)", var.name))),
    }
}

/// Launches an fa2 rung (`mt` m-tiles per warp) on views [`launch_tiled`] has checked.
#[allow(clippy::too_many_arguments)]
fn launch_fa2<T: Elem>(
    gpu: &crate::gpu::Gpu,
    variant: &str,
    mt: usize,
    d: Dims,
    mask: Mask,
    (q, k, v): (&CudaView<T>, &CudaView<T>, &CudaView<T>),
    o: &mut CudaViewMut<T>,
    lse: &mut CudaViewMut<f32>,
    packed: Option<Packed>,
) -> Result<()> {
    let scale = 1.0 / (d.d as f32).sqrt();
    let (causal, window) = (mask.causal as i32, mask.window as i32);
    let [sq, sk, hq, hkv] = [d.sq, d.sk, d.hq, d.hkv].map(|x| x as i32);
    let f = gpu.function(FAMILY, &symbol(FAMILY, &format!("{variant}_d{}", d.d), T::DTYPE))?;
    let smem = (64 * mt + 4 * 64) * (d.d + 8) * 2; // FA_SMEM(D, MT) in kernels/attention.cu
    raise_dynamic_smem(&f, smem)?;
    let grid = (d.sq.div_ceil(64 * mt) as u32, d.hq as u32, d.batch as u32);
    let cfg = LaunchConfig { grid_dim: grid, block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(q).arg(k).arg(v).arg(o).arg(lse);
    push_offsets(&mut b, packed);
    b.arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&scale).arg(&causal).arg(&window);
    // SAFETY: every view holds at least its shape's elements (checked by launch_tiled; a packed
    // batch's offsets by varlen::Varlen::new); the grid covers ceil(Sq / (64 mt)) query tiles of
    // every head, and the kernel bounds rows by its sequence's Sq and keys by its Sk.
    unsafe { b.launch(cfg) }.map(|_| ()).doing(&format!("launching attention {variant}"))
}

/// The CPU backend's variant: each (batch, head, query row) in parallel, online softmax over the
/// kept keys in f32.
pub fn cpu_rows<T: Elem>(d: Dims, m: Mask, q: &[T], k: &[T], v: &[T], o: &mut [T], lse: &mut [f32]) {
    let scale = 1.0 / (d.d as f32).sqrt();
    let group = d.hq / d.hkv;
    let rows: Vec<(Vec<T>, f32)> = (0..d.batch * d.hq * d.sq)
        .into_par_iter()
        .map(|r| {
            let (b, h, i) = (r / (d.hq * d.sq), r / d.sq % d.hq, r % d.sq);
            let qi = &q[((b * d.sq + i) * d.hq + h) * d.d..][..d.d];
            let (mut mx, mut sum, mut acc) = (f32::NEG_INFINITY, 0f32, vec![0f32; d.d]);
            for j in (0..d.sk).filter(|&j| d.keep(m, i, j)) {
                let kv = ((b * d.sk + j) * d.hkv + h / group) * d.d;
                let s = scale * qi.iter().zip(&k[kv..kv + d.d]).map(|(a, b)| a.to_f32() * b.to_f32()).sum::<f32>();
                let m_new = mx.max(s);
                let (alpha, p) = ((mx - m_new).exp(), (s - m_new).exp());
                sum = sum * alpha + p;
                for (a, x) in acc.iter_mut().zip(&v[kv..kv + d.d]) {
                    *a = *a * alpha + p * x.to_f32();
                }
                mx = m_new;
            }
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            (acc.iter().map(|a| T::from_f32(a * inv)).collect(), if sum > 0.0 { mx + sum.ln() } else { f32::NEG_INFINITY })
        })
        .collect();
    for (r, (row, l)) in rows.into_iter().enumerate() {
        let (b, h, i) = (r / (d.hq * d.sq), r / d.sq % d.hq, r % d.sq);
        o[((b * d.sq + i) * d.hq + h) * d.d..][..d.d].copy_from_slice(&row);
        lse[r] = l;
    }
}

/// One (batch, head, query row) computed two ways from the stored inputs: in f64 (the
/// reference), and naively in the storage precision as an unfused kernel would (fp32 scores and
/// softmax, P rounded to T, fp32 accumulation, O rounded to T): the baseline error of
/// FlashAttention's accuracy rule. Returns (o f64, lse f64, o naive).
pub fn reference_row<T: Elem>(d: Dims, m: Mask, q: &[T], k: &[T], v: &[T], (b, h, i): (usize, usize, usize)) -> (Vec<f64>, f64, Vec<f64>) {
    let scale = 1.0 / (d.d as f64).sqrt();
    let qi = &q[((b * d.sq + i) * d.hq + h) * d.d..][..d.d];
    let kv = |j: usize| ((b * d.sk + j) * d.hkv + h / (d.hq / d.hkv)) * d.d;
    let keys: Vec<usize> = (0..d.sk).filter(|&j| d.keep(m, i, j)).collect();
    let s64: Vec<f64> = keys.iter().map(|&j| scale * qi.iter().zip(&k[kv(j)..]).map(|(a, b)| a.to_f64() * b.to_f64()).sum::<f64>()).collect();
    let s32: Vec<f32> = keys.iter().map(|&j| scale as f32 * qi.iter().zip(&k[kv(j)..]).map(|(a, b)| a.to_f32() * b.to_f32()).sum::<f32>()).collect();
    let mx64 = s64.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mx32 = s32.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let sum64: f64 = s64.iter().map(|s| (s - mx64).exp()).sum();
    let sum32: f32 = s32.iter().map(|s| (s - mx32).exp()).sum();
    let (mut o64, mut o32) = (vec![0f64; d.d], vec![0f32; d.d]);
    for (n, &j) in keys.iter().enumerate() {
        let (p64, p32) = ((s64[n] - mx64).exp() / sum64, T::from_f32((s32[n] - mx32).exp() / sum32).to_f32());
        for (c, x) in v[kv(j)..kv(j) + d.d].iter().enumerate() {
            o64[c] += p64 * x.to_f64();
            o32[c] += p32 * x.to_f32();
        }
    }
    let lse = if keys.is_empty() { f64::NEG_INFINITY } else { mx64 + sum64.ln() };
    (o64, lse, o32.iter().map(|&x| T::from_f32(x).to_f64()).collect())
}

/// The rows a check compares: all of them when the problem is small, else 384 drawn at random
/// plus the first and last of every head's query range ends.
pub fn check_rows(d: Dims, rng: &mut impl Rng) -> Vec<(usize, usize, usize)> {
    let all = d.batch * d.hq * d.sq;
    let rows: Vec<usize> = if all * d.sk * d.d <= 1 << 24 {
        (0..all).collect()
    } else {
        let mut r: Vec<usize> = (0..384).map(|_| rng.random_range(0..all)).chain([0, d.sq - 1, all - d.sq, all - 1]).collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    rows.into_iter().map(|r| (r / (d.hq * d.sq), r / d.sq % d.hq, r % d.sq)).collect()
}

/// What a check compares: the expected O (and lse) at the checked rows, and the tolerance from
/// the naive baseline.
pub struct Expected {
    pub rows: Vec<(usize, usize, usize)>,
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub tol: Tolerance,
}

impl Expected {
    pub fn new<T: Elem>(d: Dims, m: Mask, q: &[T], k: &[T], v: &[T], rows: Vec<(usize, usize, usize)>) -> Self {
        let per: Vec<_> = rows.par_iter().map(|&r| reference_row(d, m, q, k, v, r)).collect();
        let mut naive_err = 0f64;
        let (mut o, mut lse) = (Vec::new(), Vec::new());
        for (o64, l, naive) in per {
            naive_err = o64.iter().zip(&naive).map(|(a, b)| (a - b).abs()).fold(naive_err, f64::max);
            o.extend(o64);
            lse.push(l);
        }
        // FlashAttention's rule: within a small multiple (2x) of the same computation done
        // naively in the storage precision, plus one rounding of the output.
        let ulp = if T::DTYPE == DType::Bf16 { 2f64.powi(-8) } else { 2f64.powi(-11) };
        Expected { rows, o, lse, tol: Tolerance { atol: 2.0 * naive_err + 1e-6, rtol: ulp } }
    }
    /// The checked rows of an output in [B, Sq, Hq, D].
    pub fn gather<T: Elem>(&self, d: Dims, out: &[T]) -> Vec<T> {
        self.rows.iter().flat_map(|&(b, h, i)| out[((b * d.sq + i) * d.hq + h) * d.d..][..d.d].to_vec()).collect()
    }
    pub fn gather_lse(&self, d: Dims, lse: &[f32]) -> Vec<f32> {
        self.rows.iter().map(|&(b, h, i)| lse[(b * d.hq + h) * d.sq + i]).collect()
    }
}

/// Inputs: N(0, 1), or "large" (q scaled by 100: scores of order 1e3 to 1e4).
pub fn input<T: Elem>(len: usize, scale: f32, rng: &mut impl Rng) -> Vec<T> {
    (0..len)
        .map(|_| {
            let z: f32 = StandardNormal.sample(rng);
            T::from_f32(scale * z)
        })
        .collect()
}

#[cfg(test)]
mod tests;
