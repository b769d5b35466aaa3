//! `moe`: a Mixture-of-Experts layer as callable ops (kernels/moe.cu, moe_backward.cu): the router (logits through
//! the gemm family's op, softmax or sigmoid scores, top-k, optional renormalisation and noisy
//! gating, the Switch load-balancing loss, the ST-MoE z-loss, the load histogram), capacity
//! (Switch's drop or dropless), the permutation into contiguous per-expert segments and back,
//! the grouped GEMM as a ladder (one cuBLAS GEMM per expert, one mma.sync launch over a schedule
//! built on the device), and the SwiGLU layer on top of them.
//!
//! Shapes: tokens x [T, H]; router weight [H, E] (and the noise projection, same shape);
//! gate and up projections packed as one [E, H, 2I] whose columns interleave them (column 2i is
//! gate i, 2i+1 is up i: [`pack_gate_up`]), so the mma fragment a thread holds carries both
//! halves of a SwiGLU output; down projection [E, I, H]. The layer returns
//! sum_j w_tj * expert_{e_tj}(x_t) only: a token whose every assignment was dropped gets 0,
//! which a residual block (x + moe(x)) passes through unchanged.
//!
//! Routing semantics (CPU and GPU alike):
//! - selection is on the (noisy) logits, largest first, ties to the lower expert index; the
//!   weights are the scores of the kept experts (softmax over all experts, or sigmoid), divided
//!   by their sum when `renormalize`;
//! - noisy top-k (Shazeer et al. 2017): h = logits + eps * softplus(x W_noise), eps ~ N(0, 1)
//!   drawn on the host from the seed ([`noise_eps`]), so every backend sees the same eps; scores,
//!   selection and the load-balancing loss read h, the z-loss the clean logits;
//! - the load-balancing loss is alpha E sum_i f_i P_i, f_i the share of the T k assignments
//!   given to expert i (before any drop), P_i the mean over tokens of the normalised scores;
//!   the z-loss is the mean over tokens of logsumexp(logits)^2;
//! - capacity: assignments are ranked slot-major (every token's first choice, in token order,
//!   before any second choice), and an expert keeps the first ceil(T / E * factor) of them;
//!   the rest are dropped. Dropless keeps all. Within an expert's segment rows follow that rank.
//!
//! Files: `cpu` (the CPU variant, f32), `gpu` (launches), `reference` (f64, the layer's bound),
//! `backward` (the layer's gradients on tensors), `backward_reference` (the same in f64, what
//! `backward` is checked against), `experiment`, `tests`; `mirrors` replays the kernels' index
//! math on the CPU (tests only).

mod backward;
pub mod backward_reference;
mod cpu;
mod experiment;
mod gpu;
pub mod reference;
#[cfg(test)]
mod mirrors;
#[cfg(test)]
mod tests;

pub use backward::{backward, backward_with, Grads, Upstream};
pub use experiment::Moe;

use crate::experiment::Backend;
use crate::kernels::DType;
use crate::ops::variant::{self, Requires, Variant, VariantInfo};
use crate::ops::Elem;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};

const FAMILY: &str = "moe";

/// The most experts a router takes (a warp holds a token's scores, 8 per lane).
pub const MAX_EXPERTS: usize = 256;
/// The most experts a token is sent to.
pub const MAX_K: usize = 8;

/// How a grouped-GEMM variant runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Each expert's segment through gemm's cpu_blocked (f32 accumulation), on the host.
    CpuLoop,
    /// One cuBLAS GEMM per expert: the host reads the segment offsets (a synchronisation).
    CublasLoop,
    /// One launch of a 128x128x32 mma.sync tile kernel over (n-tile, m-tile of some expert).
    GroupedMma,
    /// The same schedule on gemm's wgmma_tma loop (sm_90a), with this tile and ring; a block per
    /// tile, or (persistent) a block per SM looping over tiles. `fused_combine`: the layer's down
    /// product adds its weighted rows into the output's f32 sum ([`forward`] only; a plain
    /// grouped product runs as without it).
    GroupedWgmma { tile: crate::ops::gemm::wg::Tile, persistent: bool, fused_combine: bool },
}

/// The grouped GEMM's ladder; `forward` runs both of the layer's products with the same rung.
pub const VARIANTS: &[Variant<Kernel>] = &[
    Variant {
        name: "cublas_loop",
        dtypes: &[DType::Bf16, DType::F16],
        requires: Requires::Gpu,
        what: "the baseline: one cuBLAS GEMM per expert, the host reading the device's counts first (the one rung that synchronises)",
        config: Kernel::CublasLoop,
    },
    Variant {
        name: "grouped_mma",
        dtypes: &[DType::Bf16, DType::F16],
        requires: Requires::Gpu,
        what: "one mma.sync launch: blocks walk an (expert, m-tile, n-tile) schedule built on the device from the counts; partial tiles masked, no padding",
        config: Kernel::GroupedMma,
    },
    Variant {
        name: "grouped_wgmma",
        dtypes: &[DType::Bf16, DType::F16],
        requires: Requires::Sm90a,
        what: "grouped_mma's schedule on gemm's wgmma_tma loop: A (all rows) and B (E x K x N) by TMA into a 4-stage ring, two consumer warpgroups, 128x256 tiles, one block per SM",
        config: Kernel::GroupedWgmma { tile: crate::ops::gemm::wg::WIDE, persistent: false, fused_combine: false },
    },
    Variant {
        name: "grouped_wgmma_persistent",
        dtypes: &[DType::Bf16, DType::F16],
        requires: Requires::Sm90a,
        what: "grouped_wgmma with one block per SM looping over the tiles, its ring running on: the next tile's loads overlap the last one's stores",
        config: Kernel::GroupedWgmma { tile: crate::ops::gemm::wg::WIDE, persistent: true, fused_combine: false },
    },
    Variant {
        name: "grouped_wgmma_fused",
        dtypes: &[DType::Bf16, DType::F16],
        requires: Requires::Sm90a,
        what: "grouped_wgmma with the layer's weighted combine in the down product's epilogue: rows scaled by their weight and added (f32 vector atomics) into the output's f32 sum, cast once; the order of a token's k adds varies from run to run when k > 2",
        config: Kernel::GroupedWgmma { tile: crate::ops::gemm::wg::WIDE, persistent: false, fused_combine: true },
    },
    Variant {
        name: "grouped_wgmma_n128",
        dtypes: &[DType::Bf16, DType::F16],
        requires: Requires::Sm90a,
        what: "128x128 tiles, 3 stages, two blocks per SM: twice the tiles, for experts of few rows or narrow N",
        config: Kernel::GroupedWgmma { tile: crate::ops::gemm::wg::N128, persistent: false, fused_combine: false },
    },
    Variant {
        name: "cpu_loop",
        dtypes: &[DType::Bf16, DType::F16],
        requires: Requires::Cpu,
        what: "each expert's rows through gemm's cpu_blocked in f32, on the host",
        config: Kernel::CpuLoop,
    },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// The kernel symbols the launchers use, for the export check.
pub fn gpu_symbols() -> std::collections::BTreeSet<String> {
    let mut out: std::collections::BTreeSet<String> = ["chunk_counts", "scan", "scatter", "schedule", "losses"].iter().map(|k| crate::kernels::symbol(FAMILY, k, DType::F32)).collect();
    for d in [DType::Bf16, DType::F16] {
        for k in ["route", "gather", "combine", "cast", "grouped_mma", "grouped_wgmma", "grouped_wgmma_n128", "swiglu", "combine_backward", "swiglu_backward", "route_backward", "transpose", "grouped_wgrad"] {
            out.insert(crate::kernels::symbol(FAMILY, k, d));
        }
    }
    out
}

/// How scores are made from logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// softmax over all experts (Switch, Mixtral, Qwen3-MoE).
    Softmax,
    /// an independent sigmoid per expert (DeepSeek-V3).
    Sigmoid,
}

/// How many assignments an expert keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Capacity {
    /// Every assignment.
    Dropless,
    /// Switch: ceil(T / E * factor) per expert, the rest dropped.
    Factor(f64),
}

impl Capacity {
    /// Slots per expert for `tokens` tokens over `experts` (Dropless: `tokens`, since a token
    /// picks an expert at most once).
    pub fn slots(self, tokens: usize, experts: usize) -> usize {
        match self {
            Capacity::Dropless => tokens,
            Capacity::Factor(f) => (tokens as f64 / experts as f64 * f).ceil() as usize,
        }
    }
}

/// The router's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Router {
    pub k: usize,
    pub scoring: Scoring,
    pub renormalize: bool,
    pub capacity: Capacity,
    /// The load-balancing loss's alpha (Switch: 0.01).
    pub aux_alpha: f64,
    /// Noisy top-k gating with this seed for eps (the weights then need a noise projection).
    pub noise_seed: Option<u64>,
}

impl Router {
    /// Top-k softmax routing, renormalised, dropless, alpha 0.01: Mixtral's and Qwen3's.
    pub fn top_k(k: usize) -> Self {
        Router { k, scoring: Scoring::Softmax, renormalize: true, capacity: Capacity::Dropless, aux_alpha: 0.01, noise_seed: None }
    }
    /// Checks k against the experts and the capacity factor, naming what is wrong.
    pub fn validate(&self, experts: usize) -> Result<()> {
        if experts == 0 || experts > MAX_EXPERTS {
            return Err(LabError::shape(FAMILY, format!("{experts} experts: the router takes 1 to {MAX_EXPERTS}")));
        }
        if self.k == 0 || self.k > MAX_K {
            return Err(LabError::shape(FAMILY, format!("k = {}: each token goes to 1 to {MAX_K} experts", self.k)));
        }
        if self.k > experts {
            return Err(LabError::shape(FAMILY, format!("k = {} is more than the {experts} experts", self.k)));
        }
        if let Capacity::Factor(f) = self.capacity {
            if !(f.is_finite() && f > 0.0) {
                return Err(LabError::Invalid(format!("moe: capacity factor {f} must be a positive number (Capacity::Dropless keeps every assignment)")));
            }
        }
        if !(self.aux_alpha.is_finite() && self.aux_alpha >= 0.0) {
            return Err(LabError::Invalid(format!("moe: load-balancing alpha {} must be finite and not negative", self.aux_alpha)));
        }
        Ok(())
    }
}

/// The seeded standard-normal eps of noisy gating, [tokens, experts] row-major.
pub fn noise_eps(seed: u64, tokens: usize, experts: usize) -> Vec<f32> {
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..tokens * experts).map(|_| StandardNormal.sample(&mut rng)).collect()
}

/// What the router decided, on the backend's side.
pub struct Routing {
    /// [T, k] expert of each assignment, best first.
    pub experts: Tensor<i32>,
    /// [T, k] its weight in the combine.
    pub weights: Tensor<f32>,
    /// [E] assignments per expert before any drop: the load histogram.
    pub load: Tensor<i32>,
    /// [2]: the load-balancing loss and the z-loss.
    pub losses: Tensor<f32>,
}

/// The permutation: where each assignment's row went.
pub struct Permutation {
    /// [T, k] row of the permuted activations holding each assignment, -1 when dropped.
    pub slot: Tensor<i32>,
    /// [T k] token of each permuted row (the first `offsets[E]` rows are live).
    pub rows: Tensor<i32>,
    /// [E + 1] exclusive prefix of the kept rows per expert: expert e owns rows offsets[e]..offsets[e+1].
    pub offsets: Tensor<i32>,
}

/// What the grouped GEMM writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// C = A B.
    Store,
    /// B's columns interleave gate and up; C[:, i] = silu(gate_i) * up_i has half of B's columns.
    SwiGlu,
}

/// The layer's weights.
pub struct Weights<T: Elem> {
    /// [H, E].
    pub router: Tensor<T>,
    /// [H, E], for noisy gating.
    pub noise: Option<Tensor<T>>,
    /// [E, H, 2I], gate and up interleaved ([`pack_gate_up`]).
    pub gate_up: Tensor<T>,
    /// [E, I, H].
    pub down: Tensor<T>,
}

/// Gate [E, H, I] and up [E, H, I] (row-major) interleaved into [E, H, 2I].
pub fn pack_gate_up<T: Copy>(gate: &[T], up: &[T], inter: usize) -> Vec<T> {
    assert_eq!(gate.len(), up.len(), "gate and up differ in size");
    gate.chunks(inter).zip(up.chunks(inter)).flat_map(|(g, u)| g.iter().zip(u).flat_map(|(&a, &b)| [a, b])).collect()
}

/// The router: logits = x W_router (gemm's op), then [`route_logits`].
pub fn route<T: Elem>(dev: &Backend, x: &Tensor<T>, w: &Weights<T>, r: &Router) -> Result<Routing> {
    let (logits, noisy) = router_logits(dev, x, w, r)?;
    route_logits(dev, &logits, noisy.as_ref().map(|(n, e)| (n, e)), r)
}

/// Noisy gating's noise logits x W_noise and eps, both [T, E].
pub type NoisyLogits<T> = (Tensor<T>, Tensor<f32>);

/// The router's logits [T, E] and, when noisy, its noise logits and eps.
pub fn router_logits<T: Elem>(dev: &Backend, x: &Tensor<T>, w: &Weights<T>, r: &Router) -> Result<(Tensor<T>, Option<NoisyLogits<T>>)> {
    if x.shape().len() != 2 {
        return Err(LabError::shape(FAMILY, format!("x is {:?}; it must be [tokens, hidden]", x.shape())));
    }
    let (t, h) = (x.rows(), x.cols());
    if w.router.shape().len() != 2 || w.router.rows() != h {
        return Err(LabError::shape(FAMILY, format!("the router weight is {:?} but x is {:?}: it must be [hidden = {h}, experts]", w.router.shape(), x.shape())));
    }
    let e = w.router.cols();
    r.validate(e)?;
    let mut logits = Tensor::<T>::zeros(dev, &[t, e])?;
    crate::ops::gemm::matmul(dev, x, &w.router, &mut logits)?;
    let noisy = match (r.noise_seed, &w.noise) {
        (None, _) => None,
        (Some(_), None) => return Err(LabError::Invalid("moe: noisy gating needs the noise projection (Weights::noise)".into())),
        (Some(seed), Some(wn)) => {
            if wn.shape() != w.router.shape() {
                return Err(LabError::shape(FAMILY, format!("the noise weight is {:?}, the router's {:?}: they must match", wn.shape(), w.router.shape())));
            }
            let mut n = Tensor::<T>::zeros(dev, &[t, e])?;
            crate::ops::gemm::matmul(dev, x, wn, &mut n)?;
            Some((n, Tensor::from_slice(dev, &[t, e], &noise_eps(seed, t, e))?))
        }
    };
    Ok((logits, noisy))
}

/// Scores, top-k, weights, load histogram and losses from logits [T, E] (and, when noisy, the
/// noise logits and eps of the same shape).
pub fn route_logits<T: Elem>(dev: &Backend, logits: &Tensor<T>, noise: Option<(&Tensor<T>, &Tensor<f32>)>, r: &Router) -> Result<Routing> {
    if logits.shape().len() != 2 || logits.rows() == 0 {
        return Err(LabError::shape(FAMILY, format!("logits are {:?}; they must be [tokens >= 1, experts]", logits.shape())));
    }
    let (t, e) = (logits.rows(), logits.cols());
    r.validate(e)?;
    if r.noise_seed.is_some() != noise.is_some() {
        return Err(LabError::Invalid("moe: the router's noise seed and the noise logits come together".into()));
    }
    let mut places = vec![("logits", logits.placement())];
    if let Some((n, eps)) = noise {
        for (name, s) in [("noise logits", n.shape()), ("eps", eps.shape())] {
            if s != logits.shape() {
                return Err(LabError::shape(FAMILY, format!("{name} are {s:?}, the logits {:?}: they must match", logits.shape())));
            }
        }
        places.extend([("noise logits", n.placement()), ("eps", eps.placement())]);
    }
    check_placement(FAMILY, dev, &places)?;
    match dev {
        Backend::Cpu => {
            let host = |t: &Tensor<T>| t.host().expect("placement checked").to_vec();
            let noise = noise.map(|(n, eps)| (host(n), eps.host().expect("placement checked").to_vec()));
            let out = cpu::route(&host(logits), noise.as_ref().map(|(n, e)| (n.as_slice(), e.as_slice())), t, e, r);
            Ok(Routing {
                experts: Tensor::from_vec(&[t, r.k], out.experts)?,
                weights: Tensor::from_vec(&[t, r.k], out.weights)?,
                load: Tensor::from_vec(&[e], out.load)?,
                losses: Tensor::from_vec(&[2], vec![out.aux_loss, out.z_loss])?,
            })
        }
        Backend::Cuda(g) => gpu::route(g, logits, noise, t, e, r),
    }
}

/// Checks a routing's tensors against each other: (tokens, k, experts).
fn routing_dims(rt: &Routing) -> Result<(usize, usize, usize)> {
    let (t, k, e) = (rt.experts.rows(), rt.experts.cols(), rt.load.len());
    if rt.experts.shape().len() != 2 || rt.weights.shape() != rt.experts.shape() || rt.load.shape().len() != 1 {
        return Err(LabError::shape(FAMILY, format!("routing experts {:?}, weights {:?}, load {:?}: [T, k], [T, k], [E]", rt.experts.shape(), rt.weights.shape(), rt.load.shape())));
    }
    Ok((t, k, e))
}

/// Permutes x [T, H] into per-expert segments (returned [T k, H], live rows first), keeping at
/// most `capacity` rows per expert; counts and offsets never leave the device.
pub fn permute<T: Elem>(dev: &Backend, x: &Tensor<T>, rt: &Routing, capacity: Capacity) -> Result<(Permutation, Tensor<T>)> {
    let (t, k, e) = routing_dims(rt)?;
    if x.shape().len() != 2 || x.rows() != t {
        return Err(LabError::shape(FAMILY, format!("x is {:?} but the routing has {t} tokens", x.shape())));
    }
    if let Capacity::Factor(f) = capacity {
        if !(f.is_finite() && f > 0.0) {
            return Err(LabError::Invalid(format!("moe: capacity factor {f} must be a positive number")));
        }
    }
    check_placement(FAMILY, dev, &[("x", x.placement()), ("experts", rt.experts.placement())])?;
    let cap = capacity.slots(t, e);
    match dev {
        Backend::Cpu => {
            let p = cpu::permute(rt.experts.host().expect("placed"), t, k, e, cap);
            let xp = cpu::gather(x.host().expect("placed"), &p.rows, x.cols());
            let perm = Permutation { slot: Tensor::from_vec(&[t, k], p.slot)?, rows: Tensor::from_vec(&[t * k], p.rows)?, offsets: Tensor::from_vec(&[e + 1], p.offsets)? };
            Ok((perm, Tensor::from_vec(&[t * k, x.cols()], xp)?))
        }
        Backend::Cuda(g) => gpu::permute(g, x, &rt.experts, (t, k, e), cap),
    }
}

/// out[t] = sum_j weights[t, j] y[slot[t, j]] over the kept assignments (f32 sums in j order).
pub fn unpermute<T: Elem>(dev: &Backend, y: &Tensor<T>, perm: &Permutation, weights: &Tensor<f32>, out: &mut Tensor<T>) -> Result<()> {
    let (t, k) = (perm.slot.rows(), perm.slot.cols());
    if weights.shape() != perm.slot.shape() {
        return Err(LabError::shape(FAMILY, format!("weights are {:?}, the permutation's slots {:?}", weights.shape(), perm.slot.shape())));
    }
    if y.shape().len() != 2 || y.rows() != t * k || out.shape() != [t, y.cols()] {
        return Err(LabError::shape(FAMILY, format!("y is {:?} and out {:?}; they must be [T k = {}, N] and [T = {t}, N]", y.shape(), out.shape(), t * k)));
    }
    check_placement(FAMILY, dev, &[("y", y.placement()), ("weights", weights.placement()), ("out", out.placement())])?;
    match dev {
        Backend::Cpu => {
            let n = y.cols();
            cpu::combine(y.host().expect("placed"), perm.slot.host().expect("placed"), weights.host().expect("placed"), k, n, out.host_mut().expect("placed"));
            Ok(())
        }
        Backend::Cuda(g) => gpu::combine(g, y, perm, Some(weights), out),
    }
}

/// The grouped product's sizes: (experts, rows, K, N of B, N of C).
fn grouped_dims<T: Elem>(a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, ep: Epilogue, c: &Tensor<T>) -> Result<(usize, usize, usize, usize, usize)> {
    let bad = |why: String| Err(LabError::shape("moe grouped_matmul", why));
    if a.shape().len() != 2 || b.shape().len() != 3 || c.shape().len() != 2 {
        return bad(format!("A is {:?}, B {:?}, C {:?}: they must be [rows, K], [experts, K, N], [rows, N]", a.shape(), b.shape(), c.shape()));
    }
    let (e, k, n) = (b.shape()[0], b.shape()[1], b.shape()[2]);
    if e > MAX_EXPERTS {
        return bad(format!("B has {e} experts; the schedule takes at most {MAX_EXPERTS}"));
    }
    if a.cols() != k {
        return bad(format!("A is {:?} but B is {:?}: A's width must be B's K = {k}", a.shape(), b.shape()));
    }
    if offsets.shape() != [e + 1] {
        return bad(format!("offsets are {:?}; B has {e} experts, so they must be [{}]", offsets.shape(), e + 1));
    }
    let nc = match ep {
        Epilogue::Store => n,
        Epilogue::SwiGlu if n % 2 == 0 => n / 2,
        Epilogue::SwiGlu => return bad(format!("B has {n} columns: a SwiGLU epilogue needs gate and up pairs (an even count)")),
    };
    if c.shape() != [a.rows(), nc] {
        return bad(format!("C is {:?}; it must be [{}, {nc}]", c.shape(), a.rows()));
    }
    if a.rows() == 0 || k == 0 || n == 0 || e == 0 || [a.rows(), k, n].iter().any(|&v| v > i32::MAX as usize) {
        return bad(format!("A {:?}, B {:?}: every size must be 1 to 2^31 - 1", a.shape(), b.shape()));
    }
    Ok((e, a.rows(), k, n, nc))
}

/// The grouped product with the best rung for the backend ([`best`]).
pub fn grouped_matmul<T: Elem>(dev: &Backend, a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, ep: Epilogue, c: &mut Tensor<T>) -> Result<()> {
    grouped_matmul_with(dev, best(dev).name, a, b, offsets, ep, c)
}

/// C[rows of expert e] = A[rows of expert e] B[e] (then the epilogue), for rows
/// offsets[e]..offsets[e+1] of A and C; rows past offsets[E] are left as they are. Offsets
/// past A's rows are clamped to them (they live on the device and are not read here).
pub fn grouped_matmul_with<T: Elem>(dev: &Backend, variant: &str, a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, ep: Epilogue, c: &mut Tensor<T>) -> Result<()> {
    let v = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, v, dev, T::DTYPE)?;
    check_placement("moe grouped_matmul", dev, &[("A", a.placement()), ("B", b.placement()), ("offsets", offsets.placement()), ("C", c.placement())])?;
    let dims = grouped_dims(a, b, offsets, ep, c)?;
    match (v.config, dev) {
        (Kernel::CpuLoop, _) => {
            let (ah, bh, oh) = (a.host().expect("placed"), b.host().expect("placed"), offsets.host().expect("placed"));
            cpu::grouped(ah, bh, oh, dims, ep, c.host_mut().expect("placed"));
            Ok(())
        }
        (Kernel::CublasLoop, Backend::Cuda(g)) => gpu::grouped_cublas(g, a, b, offsets, dims, ep, c),
        (Kernel::GroupedMma, Backend::Cuda(g)) => gpu::grouped_mma(g, a, b, offsets, dims, ep, c),
        (Kernel::GroupedWgmma { tile, persistent, .. }, Backend::Cuda(g)) => gpu::grouped_wgmma(g, (tile, persistent), a, b, offsets, dims, ep, gpu::WgOut::Store(c)),
        (_, Backend::Cpu) => unreachable!("check_runs keeps GPU rungs off the CPU"),
    }
}

/// The rung [`forward`] and [`grouped_matmul`] run: grouped_wgmma on sm_90a, grouped_mma on
/// other GPUs, cpu_loop on the CPU.
pub fn best(dev: &Backend) -> &'static Variant<Kernel> {
    let wgmma = variant::find(FAMILY, VARIANTS, "grouped_wgmma").expect("grouped_wgmma is in the table");
    let name = match dev {
        Backend::Cpu => "cpu_loop",
        _ if wgmma.requires.met_by(dev) => return wgmma,
        _ => "grouped_mma",
    };
    variant::find(FAMILY, VARIANTS, name).expect("the best moe variant is in the table")
}

/// The layer's sizes from x and the weights: (tokens, hidden, experts, intermediate).
pub fn layer_dims<T: Elem>(x: &Tensor<T>, w: &Weights<T>) -> Result<(usize, usize, usize, usize)> {
    let bad = |why: String| Err(LabError::shape(FAMILY, why));
    if x.shape().len() != 2 || x.rows() == 0 || x.cols() == 0 {
        return bad(format!("x is {:?}; it must be [tokens >= 1, hidden >= 1]", x.shape()));
    }
    let (t, h) = (x.rows(), x.cols());
    let e = w.router.cols();
    if w.router.shape() != [h, e] {
        return bad(format!("the router weight is {:?} but x is {:?}: it must be [hidden = {h}, experts]", w.router.shape(), x.shape()));
    }
    let gu = w.gate_up.shape();
    if gu.len() != 3 || gu[0] != e || gu[1] != h || !gu[2].is_multiple_of(2) || gu[2] == 0 {
        return bad(format!("gate_up is {gu:?}; it must be [experts = {e}, hidden = {h}, 2 x intermediate]"));
    }
    let i = gu[2] / 2;
    if w.down.shape() != [e, i, h] {
        return bad(format!("down is {:?}; with gate_up {gu:?} it must be [{e}, {i}, {h}]", w.down.shape()));
    }
    Ok((t, h, e, i))
}

/// The layer with the best rung: out [T, H] = sum_j w_tj down_e(silu(x gate_e) * (x up_e)).
pub fn forward<T: Elem>(dev: &Backend, x: &Tensor<T>, w: &Weights<T>, r: &Router, out: &mut Tensor<T>) -> Result<Routing> {
    forward_with(dev, best(dev).name, x, w, r, out)
}

/// [`forward`] with the named grouped-GEMM rung; returns the routing (load, losses).
pub fn forward_with<T: Elem>(dev: &Backend, variant: &str, x: &Tensor<T>, w: &Weights<T>, r: &Router, out: &mut Tensor<T>) -> Result<Routing> {
    let v = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, v, dev, T::DTYPE)?;
    let (t, h, _, i) = layer_dims(x, w)?;
    if out.shape() != [t, h] {
        return Err(LabError::shape(FAMILY, format!("out is {:?}; it must be x's shape [{t}, {h}]", out.shape())));
    }
    let rt = route(dev, x, w, r)?;
    let (perm, xp) = permute(dev, x, &rt, r.capacity)?;
    let mut act = Tensor::<T>::zeros(dev, &[t * r.k, i])?;
    grouped_matmul_with(dev, variant, &xp, &w.gate_up, &perm.offsets, Epilogue::SwiGlu, &mut act)?;
    if let (Kernel::GroupedWgmma { tile, persistent, fused_combine: true }, Backend::Cuda(g)) = (v.config, dev) {
        use crate::error::Doing;
        let mut sum = g.stream.alloc_zeros::<f32>(t * h).doing("allocating the combine's f32 sum")?;
        let (e, rows) = (w.down.shape()[0], t * r.k);
        let out_sum = gpu::WgOut::Combine { perm: &perm, weights: &rt.weights, sum: &mut sum };
        gpu::grouped_wgmma(g, (tile, persistent), &act, &w.down, &perm.offsets, (e, rows, i, h, h), Epilogue::Store, out_sum)?;
        gpu::cast(g, &sum, out)?;
        return Ok(rt);
    }
    let mut y = Tensor::<T>::zeros(dev, &[t * r.k, h])?;
    grouped_matmul_with(dev, variant, &act, &w.down, &perm.offsets, Epilogue::Store, &mut y)?;
    unpermute(dev, &y, &perm, &rt.weights, out)?;
    Ok(rt)
}
