//! `gemm`: C = alpha A B + beta C, row-major, a ladder from one thread per output to tensor cores
//! (kernels/gemm.cu), beside cuBLAS in the same run on the same inputs. fp32 variants are SIMT;
//! the TMA rungs (`mma_warp64_tma` and `mma_warp64_tail_split`: TMA and mbarriers feeding
//! mma.sync; `wgmma_tma` and its narrower tiles: the same with wgmma) exist on compute
//! capability 9.0 only and take row strides that are multiples of 16 bytes ([`not_applicable`]
//! says why not); fp16/bf16 variants accumulate in fp32 and write C in the input dtype (what
//! cuBLAS gemm_ex with CUBLAS_COMPUTE_32F does, so the peer and ours produce the same thing).
//!
//! Correctness is norm-wise: the relative Frobenius error against an f64 reference computed from
//! the stored inputs, < 1e-5 for fp32 and < 1e-2 for fp16/bf16; NaN never passes. Products up to
//! [`FULL_REFERENCE_MACS`] are checked in full (`reference: "cpu-f64"`); larger ones on
//! [`SAMPLES`] random entries plus the four corners, each computed in f64
//! (`"cpu-f64-sampled-<count>"`).

use super::compare::compare_frobenius;
use super::{measure_cpu, measure_gpu_as, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Session};
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance};
use crate::{LabError, Result};
use cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
use cudarc::cublas::{CudaBlas, Gemm as BlasGemm, GemmConfig};
use cudarc::driver::sys::CUdevice_attribute as DevAttr;
use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct Gemm;

const FAMILY: &str = "gemm";

/// The fp32 SIMT ladder, in order.
pub const F32_VARIANTS: &[&str] = &["naive", "smem_tiled", "blocktile_1d", "blocktile_2d", "vectorized", "warptiled"];
/// The fp16/bf16 tensor-core ladder, in order (the TMA rungs on compute capability 9.0 only).
pub const HALF_VARIANTS: &[&str] = &["mma_ldmatrix", "mma_pipelined", "mma_pipelined_wide", "mma_warp64", "mma_warp64_wide", "mma_warp64_k64", "mma_warp64_tma", "mma_warp64_tail_split", "mma_splitk", "wgmma_tma", "wgmma_n128", "wgmma_n128_deep", "wgmma_n64_deep"];
/// Variants built from sm_90a instructions (TMA and mbarriers; the wgmma rungs add wgmma and
/// setmaxnreg): offered on 9.0 alone, absent elsewhere (their PTX target, `compute_90a`, loads on
/// no other device). All take A and B through tensor maps ([`tensor_maps`], [`launch_tma`]).
pub const SM90A_VARIANTS: &[&str] = &["mma_warp64_tma", "mma_warp64_tail_split", "wgmma_tma", "wgmma_n128", "wgmma_n128_deep", "wgmma_n64_deep"];
/// The mma.sync rungs fed by TMA (mma_warp64_k64's warps and loop on wgmma_tma's stage layout).
pub const WARP64_TMA_VARIANTS: &[&str] = &["mma_warp64_tma", "mma_warp64_tail_split"];
pub const CPU_VARIANTS: &[&str] = &["cpu_blocked"];
/// The slow rungs (naive, smem_tiled) run only up to this many multiply-adds (2048^3).
pub const SLOW_MAX_MACS: u64 = 1 << 33;
/// Up to this many multiply-adds the f64 reference is computed in full.
pub const FULL_REFERENCE_MACS: u64 = 1 << 31;
/// Entries checked when the product is too large for a full reference.
pub const SAMPLES: usize = 4096;

/// Shape and leading dimensions (elements between consecutive rows) of one GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

impl Dims {
    /// Dense row-major operands: lda = K, ldb = ldc = N.
    pub fn dense(m: usize, n: usize, k: usize) -> Self {
        Dims { m, n, k, lda: k, ldb: n, ldc: n }
    }
    pub fn macs(&self) -> u64 {
        (self.m * self.n) as u64 * self.k as u64
    }
    /// flops = 2 M N K; bytes = A and B read once, C written once (and read once when beta != 0).
    pub fn work(&self, elem: usize, beta: f32) -> Work {
        let c = (self.m * self.n) as u64 * if beta != 0.0 { 2 } else { 1 };
        Work { bytes: elem as u64 * ((self.m * self.k + self.k * self.n) as u64 + c), flops: 2 * self.macs() }
    }
}

/// Checks a GEMM's arguments: every dimension >= 1 and < 2^31, each leading dimension at least
/// its row, and each buffer long enough for the rows it is read or written through.
/// Leading dimensions need no alignment: 16-byte loads fall back to element loads where a row
/// start is not 16-byte aligned.
pub fn validate(d: Dims, a_len: usize, b_len: usize, c_len: usize) -> Result<()> {
    let Dims { m, n, k, lda, ldb, ldc } = d;
    if m == 0 || n == 0 || k == 0 {
        return Err(LabError::shape("gemm", format!("M={m} N={n} K={k}: every dimension must be at least 1")));
    }
    if [m, n, k, lda, ldb, ldc].iter().any(|&v| v > i32::MAX as usize) {
        return Err(LabError::shape("gemm", format!("M={m} N={n} K={k} lda={lda} ldb={ldb} ldc={ldc}: each must be below 2^31")));
    }
    for (name, ld, row, what) in [("lda", lda, k, "K"), ("ldb", ldb, n, "N"), ("ldc", ldc, n, "N")] {
        if ld < row {
            return Err(LabError::shape("gemm", format!("{name}={ld} is shorter than a row ({what}={row})")));
        }
    }
    for (name, len, rows, ld, row) in [("A", a_len, m, lda, k), ("B", b_len, k, ldb, n), ("C", c_len, m, ldc, n)] {
        let need = (rows - 1) * ld + row;
        if len < need {
            return Err(LabError::shape("gemm", format!("{name} has {len} elements, {rows} rows of leading dimension {ld} need {need}")));
        }
    }
    Ok(())
}

/// Tolerance on the relative Frobenius error.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 | DType::Bf16 => 1e-2,
    }
}

/// One entry of the f64 reference: alpha * sum_k A[i,k] B[k,j] + beta * C0[i,j].
pub fn reference_at<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, (alpha, beta): (f32, f32), i: usize, j: usize) -> f64 {
    let ai = &a[i * d.lda..i * d.lda + d.k];
    let dot: f64 = ai.iter().enumerate().map(|(kk, x)| x.to_f64() * b[kk * d.ldb + j].to_f64()).sum();
    let old = match c0 {
        Some(c) if beta != 0.0 => beta as f64 * c[i * d.ldc + j].to_f64(),
        _ => 0.0,
    };
    alpha as f64 * dot + old
}

/// The full f64 reference, dense M x N (rows in parallel, B transposed once so every entry is a
/// contiguous dot product with four independent sums).
pub fn reference<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, (alpha, beta): (f32, f32)) -> Vec<f64> {
    let bt: Vec<f64> = (0..d.n * d.k).into_par_iter().map(|x| b[(x % d.k) * d.ldb + x / d.k].to_f64()).collect();
    let mut out = vec![0.0; d.m * d.n];
    out.par_chunks_mut(d.n).enumerate().for_each(|(i, row)| {
        let ai: Vec<f64> = a[i * d.lda..i * d.lda + d.k].iter().map(|x| x.to_f64()).collect();
        for (j, o) in row.iter_mut().enumerate() {
            let bj = &bt[j * d.k..(j + 1) * d.k];
            let mut s = [0.0f64; 4];
            let (ac, bc) = (ai.chunks_exact(4), bj.chunks_exact(4));
            let tail: f64 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
            for (x, y) in ac.zip(bc) {
                for q in 0..4 {
                    s[q] += x[q] * y[q];
                }
            }
            let dot = (s[0] + s[1]) + (s[2] + s[3]) + tail;
            let old = match c0 {
                Some(c) if beta != 0.0 => beta as f64 * c[i * d.ldc + j].to_f64(),
                _ => 0.0,
            };
            *o = alpha as f64 * dot + old;
        }
    });
    out
}

/// What a result is checked against: the whole product, or sampled entries.
pub enum Expected {
    Full(Vec<f64>),
    Sampled { picks: Vec<(usize, usize)>, values: Vec<f64> },
}

impl Expected {
    pub fn new<T: Elem>(a: &[T], b: &[T], c0: Option<&[T]>, d: Dims, ab: (f32, f32), rng: &mut impl Rng) -> Self {
        if d.macs() <= FULL_REFERENCE_MACS {
            return Expected::Full(reference(a, b, c0, d, ab));
        }
        let mut picks = vec![(0, 0), (0, d.n - 1), (d.m - 1, 0), (d.m - 1, d.n - 1)];
        picks.extend((0..SAMPLES).map(|_| (rng.random_range(0..d.m), rng.random_range(0..d.n))));
        let values = picks.par_iter().map(|&(i, j)| reference_at(a, b, c0, d, ab, i, j)).collect();
        Expected::Sampled { picks, values }
    }
    pub fn name(&self) -> String {
        match self {
            Expected::Full(_) => "cpu-f64".into(),
            Expected::Sampled { picks, .. } => format!("cpu-f64-sampled-{}", picks.len()),
        }
    }
    /// Relative Frobenius error of `c` (M rows of leading dimension ldc) against the reference.
    pub fn check<T: Elem>(&self, c: &[T], d: Dims, rel: f64) -> ErrorStats {
        let (got, expected): (Vec<f64>, &[f64]) = match self {
            Expected::Full(e) => ((0..d.m * d.n).into_par_iter().map(|x| c[(x / d.n) * d.ldc + x % d.n].to_f64()).collect(), e),
            Expected::Sampled { picks, values } => (picks.iter().map(|&(i, j)| c[i * d.ldc + j].to_f64()).collect(), values),
        };
        compare_frobenius(&got, expected, rel, &self.name())
    }
}

/// The CPU backend's variant: f32 arithmetic, cache-blocked (64-row blocks in parallel; within a
/// block, 512-column by 256-deep panels of B so the panel stays in L2 while every row of the
/// block streams over it as vectorisable row updates).
pub fn cpu_blocked<T: Elem>(a: &[T], b: &[T], c: &mut [T], d: Dims, (alpha, beta): (f32, f32)) {
    const MB: usize = 64;
    const NB: usize = 512;
    const KB: usize = 256;
    let af: Vec<f32> = a.par_iter().map(|x| x.to_f32()).collect();
    let bf: Vec<f32> = b.par_iter().map(|x| x.to_f32()).collect();
    c.par_chunks_mut(MB * d.ldc).enumerate().for_each(|(blk, cblk)| {
        let r0 = blk * MB;
        let rows = MB.min(d.m - r0);
        let mut acc = vec![0f32; rows * NB];
        for n0 in (0..d.n).step_by(NB) {
            let nw = NB.min(d.n - n0);
            acc.iter_mut().for_each(|v| *v = 0.0);
            for k0 in (0..d.k).step_by(KB) {
                for r in 0..rows {
                    let arow = &af[(r0 + r) * d.lda..];
                    let accr = &mut acc[r * NB..r * NB + nw];
                    for kk in k0..(k0 + KB).min(d.k) {
                        let x = arow[kk];
                        let brow = &bf[kk * d.ldb + n0..kk * d.ldb + n0 + nw];
                        // Plain multiply-add (not mul_add: without the fma target feature that is a libm call).
                        accr.iter_mut().zip(brow).for_each(|(o, &y)| *o += x * y);
                    }
                }
            }
            for r in 0..rows {
                let out = &mut cblk[r * d.ldc + n0..r * d.ldc + n0 + nw];
                for (o, &v) in out.iter_mut().zip(&acc[r * NB..r * NB + nw]) {
                    let old = if beta != 0.0 { beta * o.to_f32() } else { 0.0 };
                    *o = T::from_f32(alpha * v + old);
                }
            }
        }
    });
}

/// Does `variant` run on this shape and device (compute capability `arch`, 90 for 9.0)? Slow
/// rungs only up to 2048^3; the dynamic shared memory of the pipelined rungs must fit the
/// device; sm_90a rungs only on 9.0. These skips are silent; [`not_applicable`] names the rest.
pub fn applies(variant: &str, d: Dims, max_smem_optin: usize, arch: u32) -> bool {
    if SM90A_VARIANTS.contains(&variant) && arch != 90 {
        return false;
    }
    match variant {
        "naive" | "smem_tiled" => d.macs() <= SLOW_MAX_MACS,
        _ => dynamic_smem(variant) <= max_smem_optin,
    }
}

/// Why `variant` cannot take this shape, said once per case and kept in the record's `extra`:
/// TMA (the sm_90a rungs) reads rows whose stride is a multiple of 16 bytes, i.e. lda and ldb
/// multiples of 8 elements (K and N for dense operands). `None` when it can.
pub fn not_applicable(variant: &str, d: Dims) -> Option<String> {
    if !SM90A_VARIANTS.contains(&variant) {
        return None;
    }
    let bad: Vec<String> = [("lda", d.lda, "K", d.k), ("ldb", d.ldb, "N", d.n)]
        .iter()
        .filter(|t| !t.1.is_multiple_of(8))
        .map(|&(name, ld, dim, size)| if ld == size { format!("{dim} = {ld}") } else { format!("{name} = {ld}") })
        .collect();
    let verb = if bad.len() == 1 { "is" } else { "are" };
    (!bad.is_empty()).then(|| format!("TMA needs row strides that are multiples of 16 bytes (8 elements); {} {verb} not", bad.join(" and ")))
}

/// The wgmma rungs' block tiles and rings, as `WgTile` in gemm.cu states them, and the descriptor
/// offsets of kernels/common.cuh (`WG_A_LBO`, ...).
pub mod wg {
    pub const BM: usize = 128;
    pub const BK: usize = 64;
    /// B arrives as BN / B_BOX_N boxes of BK rows x 128 bytes (the widest a 128-byte swizzle takes).
    pub const B_BOX_N: usize = 64;

    /// A rung's tile width, ring depth and blocks per SM.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Tile {
        pub bn: usize,
        pub stages: usize,
        pub blocks_per_sm: usize,
    }
    /// wgmma_tma: 128x256 tiles, 4 stages, one block per SM.
    pub const WIDE: Tile = Tile { bn: 256, stages: 4, blocks_per_sm: 1 };
    /// wgmma_n128: 128x128 tiles, 3 stages, two blocks per SM.
    pub const N128: Tile = Tile { bn: 128, stages: 3, blocks_per_sm: 2 };
    /// wgmma_n128_deep: 128x128 tiles, 7 stages, one block per SM.
    pub const N128_DEEP: Tile = Tile { bn: 128, stages: 7, blocks_per_sm: 1 };
    /// wgmma_n64_deep: 128x64 tiles, 9 stages, one block per SM.
    pub const N64_DEEP: Tile = Tile { bn: 64, stages: 9, blocks_per_sm: 1 };

    impl Tile {
        /// The tile of a wgmma variant, `None` for any other.
        pub fn of(variant: &str) -> Option<Tile> {
            match variant {
                "wgmma_tma" => Some(WIDE),
                "wgmma_n128" => Some(N128),
                "wgmma_n128_deep" => Some(N128_DEEP),
                "wgmma_n64_deep" => Some(N64_DEEP),
                _ => None,
            }
        }
        pub const fn stage_bytes(self) -> usize {
            (BM * BK + BK * self.bn) * 2
        }
        /// The ring, 1 KiB of slack to align it to 1024 bytes, and a full and an empty mbarrier per stage.
        pub const fn smem(self) -> usize {
            self.stages * self.stage_bytes() + 1024 + 2 * self.stages * 8
        }
        /// Two consumer warpgroups, then the producer: a warpgroup that gives its registers away
        /// (setmaxnreg) at one block per SM, one warp at two.
        pub const fn threads(self) -> u32 {
            256 + if self.blocks_per_sm == 1 { 128 } else { 32 }
        }
    }
    /// Descriptor byte offsets: A K-major (leading unused for swizzled K-major, encoded 16;
    /// stride 8 rows x 128 bytes), B N-major (leading: one 64-column box to the next; stride 8 k-rows).
    pub const A_LBO: u32 = 16;
    pub const A_SBO: u32 = 1024;
    pub const B_LBO: u32 = (BK * B_BOX_N * 2) as u32;
    pub const B_SBO: u32 = 1024;
    /// Start-address step per k16 slice inside a stage: 16 halves of an A row, 16 rows of a B box.
    pub const A_K16_STEP: u32 = 32;
    pub const B_K16_STEP: u32 = 16 * 128;

    /// The 64-bit shared-memory matrix descriptor of wgmma (wg_desc in gemm.cu): bits 0-13 the
    /// start address / 16, 16-29 the leading byte offset / 16, 32-45 the stride byte offset / 16,
    /// 49-51 the base offset (0), 62-63 the swizzle mode (1: 128-byte).
    pub fn desc(addr: u32, lbo: u32, sbo: u32) -> u64 {
        ((addr as u64 & 0x3FFFF) >> 4) | (((lbo >> 4) as u64) << 16) | (((sbo >> 4) as u64) << 32) | (1u64 << 62)
    }

    /// Where the 128-byte swizzle puts byte `addr` (TMA writes and wgmma reads agree on it):
    /// the 16-byte chunk index (bits 4-6) XOR the row within the 1024-byte atom (bits 7-9).
    pub fn swizzle128(addr: u32) -> u32 {
        addr ^ (((addr >> 7) & 7) << 4)
    }

    /// One operand's cuTensorMapEncodeTiled arguments: sizes and box innermost (contiguous)
    /// dimension first, and the strides of the outer dimensions in bytes (rank 2: the row stride;
    /// rank 3: one more, `strides_bytes[1]`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct TmaBox {
        pub rank: usize,
        pub dims: [u64; 3],
        pub strides_bytes: [u64; 2],
        pub boxes: [u32; 3],
    }

    impl TmaBox {
        fn rank2(dims: [u64; 2], row_stride_bytes: u64, boxes: [u32; 2]) -> Self {
            TmaBox { rank: 2, dims: [dims[0], dims[1], 1], strides_bytes: [row_stride_bytes, 0], boxes: [boxes[0], boxes[1], 1] }
        }
        pub fn row_stride_bytes(&self) -> u64 {
            self.strides_bytes[0]
        }
    }

    /// A (M x K, row stride lda) in boxes of BK x BM, B (K x N, row stride ldb) in boxes of B_BOX_N x BK.
    pub fn tma_boxes(d: super::Dims, elem: usize) -> (TmaBox, TmaBox) {
        let a = TmaBox::rank2([d.k as u64, d.m as u64], (d.lda * elem) as u64, [BK as u32, BM as u32]);
        let b = TmaBox::rank2([d.n as u64, d.k as u64], (d.ldb * elem) as u64, [B_BOX_N as u32, BK as u32]);
        (a, b)
    }

    /// mma_warp64_tma's B as one copy per slab: dimensions (64 columns, K rows, column blocks of
    /// 64), strides (one row, 64 columns) in bytes, box (64, BK, 4), whose shared-memory image is
    /// the four 64-column boxes of the 2D map side by side. TMA bounds each dimension on its own,
    /// so the columns of a last, partial block past N are read from the row, not zero-filled:
    /// offered only where every block lies within a row (ceil(N / 64) * 64 <= ldb), else `None`
    /// (the 2D boxes then, one copy per box).
    pub fn tma_b_3d(d: super::Dims, elem: usize) -> Option<TmaBox> {
        let blocks = d.n.div_ceil(B_BOX_N);
        (blocks * B_BOX_N <= d.ldb).then(|| TmaBox {
            rank: 3,
            dims: [B_BOX_N as u64, d.k as u64, blocks as u64],
            strides_bytes: [(d.ldb * elem) as u64, (B_BOX_N * elem) as u64],
            boxes: [B_BOX_N as u32, BK as u32, (WIDE.bn / B_BOX_N) as u32],
        })
    }
}

/// A CUtensorMap as a kernel parameter (`const __grid_constant__ TmaDesc` in gemm.cu): 128
/// bytes, at least 64-byte aligned (CUDA 13's type is 128-byte aligned, which satisfies that).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct TensorMap(pub cudarc::driver::sys::CUtensorMap);

// SAFETY: 128 plain bytes that the driver copies into the kernel's parameter space, matching the
// kernel's 128-byte, 64-byte-aligned TmaDesc parameter.
unsafe impl DeviceRepr for TensorMap {}

/// Encodes one operand's tensor map: 128-byte swizzle, zero fill outside the tensor, 256-byte L2
/// promotion. `ptr` must be 16-byte aligned and the row stride a multiple of 16 bytes (checked).
pub fn encode_tensor_map(ptr: u64, b: wg::TmaBox, dtype: DType) -> Result<TensorMap> {
    use cudarc::driver::sys::{
        CUtensorMapDataType as Ty, CUtensorMapFloatOOBfill as Oob, CUtensorMapInterleave as Il, CUtensorMapL2promotion as L2,
        CUtensorMapSwizzle as Sw,
    };
    let ty = match dtype {
        DType::F16 => Ty::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::Bf16 => Ty::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F32 => return Err(LabError::Invalid("the TMA gemm rungs run in f16 and bf16 only".into())),
    };
    let strides = &b.strides_bytes[..b.rank - 1];
    if !ptr.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(16)) {
        return Err(LabError::Invalid(format!("TMA needs 16-byte aligned rows: base {ptr:#x}, strides {strides:?} bytes")));
    }
    let mut map = std::mem::MaybeUninit::<cudarc::driver::sys::CUtensorMap>::zeroed();
    let element_strides = [1u32; 3];
    // SAFETY: every pointer refers to a live local array of at least the length `b.rank` asks for
    // (rank dims, boxes and element strides, rank - 1 strides); the driver only writes the
    // 128-byte map.
    unsafe {
        cudarc::driver::sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            ty,
            b.rank as u32,
            ptr as *mut std::ffi::c_void,
            b.dims.as_ptr(),
            strides.as_ptr(),
            b.boxes.as_ptr(),
            element_strides.as_ptr(),
            Il::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Sw::CU_TENSOR_MAP_SWIZZLE_128B,
            L2::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            Oob::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .doing(&format!("encoding a TMA tensor map ({b:?})"))?;
    // SAFETY: zero-initialised plain data, filled by the driver.
    Ok(TensorMap(unsafe { map.assume_init() }))
}

/// The tensor maps of A and B for a TMA rung; the mma.sync ones take B as one 3D box per slab
/// where [`wg::tma_b_3d`] offers it, and the rank of B's map (2 or 3) tells the kernel which.
pub fn tensor_maps<T: Elem>(gpu: &Gpu, variant: &str, d: Dims, a: &CudaSlice<T>, b: &CudaSlice<T>) -> Result<TmaMaps> {
    let (ba, mut bb) = wg::tma_boxes(d, T::DTYPE.size());
    if WARP64_TMA_VARIANTS.contains(&variant) {
        bb = wg::tma_b_3d(d, T::DTYPE.size()).unwrap_or(bb);
    }
    let (pa, _ga) = a.device_ptr(&gpu.stream);
    let (pb, _gb) = b.device_ptr(&gpu.stream);
    Ok(TmaMaps { a: encode_tensor_map(pa, ba, T::DTYPE)?, b: encode_tensor_map(pb, bb, T::DTYPE)?, b_rank: bb.rank as i32 })
}

/// A TMA rung's tensor maps, and the rank of B's.
pub struct TmaMaps {
    pub a: TensorMap,
    pub b: TensorMap,
    pub b_rank: i32,
}

/// Dynamic shared memory of a variant (the pipelined rungs: stages x (A slab + B slab), as
/// `Pipe::SMEM` and `W64::SMEM` in gemm.cu; the kernel traps when launched with less).
pub fn dynamic_smem(variant: &str) -> usize {
    match variant {
        "mma_pipelined" => 4 * (128 * 64 + 64 * 128) * 2,
        "mma_pipelined_wide" => 4 * (128 * 64 + 64 * 256) * 2,
        "mma_warp64" => 4 * (128 * 32 + 32 * 128) * 2,
        "mma_warp64_wide" => 5 * (128 * 32 + 32 * 256) * 2,
        "mma_warp64_k64" => 4 * (128 * 64 + 64 * 256) * 2,
        "mma_splitk" => 4 * (16 * 64 + 64 * 128) * 2,
        // wgmma_tma's ring and stage layout, full barriers only.
        "mma_warp64_tma" | "mma_warp64_tail_split" => wg::WIDE.smem(),
        v if SM90A_VARIANTS.contains(&v) => wg::Tile::of(v).map_or(0, wg::Tile::smem),
        _ => 0,
    }
}

/// The tile each variant's block owns, as kernels/gemm.cu states it (for the record).
pub fn tile(variant: &str) -> &'static str {
    match variant {
        "naive" => "1 output/thread, block 32x8",
        "smem_tiled" => "32x32x32, 1024 threads",
        "blocktile_1d" => "64x64x8, 512 threads, 8x1 per thread",
        "blocktile_2d" => "128x128x8, 256 threads, 8x8 per thread",
        "vectorized" => "128x128x8, 256 threads, 8x8 per thread, float4",
        "warptiled" => "128x128x16, 4 warps of 64x64, 8x16 per thread, 2 smem buffers",
        "mma_ldmatrix" => "128x128x32, 8 warps of 64x32, padded smem, 2 buffers",
        "mma_pipelined" => "128x128x64, 8 warps of 64x32, 4-stage cp.async, XOR swizzle",
        "mma_pipelined_wide" => "128x256x64, 8 warps of 64x64, 4-stage cp.async, XOR swizzle",
        "mma_warp64" => "128x128x32, 4 warps of 64x64, 4-stage cp.async, 2 blocks/SM, one barrier per slab",
        "mma_warp64_wide" => "128x256x32, 8 warps of 64x64, 5-stage cp.async, one barrier per slab",
        "mma_warp64_k64" => "128x256x64, 8 warps of 64x64, 4-stage cp.async, one barrier per 64-deep slab",
        "mma_warp64_tma" => "128x256x64, 8 warps of 64x64, 4-stage TMA ring (128B swizzle) issued by one lane of warp 0 after the one barrier per slab",
        "mma_warp64_tail_split" => "mma_warp64_tma's 128x256x64 blocks; the tiles of the last partial wave split along K, fp32 partials summed in slice order",
        "mma_splitk" => "16x128x64, 8 warps of 16x16, 4-stage cp.async, K split over grid.y, fp32 partials summed in slice order",
        "wgmma_tma" => "128x256x64, 3 warpgroups (1 TMA producer, 2 wgmma consumers of 64x256), 4-stage mbarrier ring, 128B swizzle",
        "wgmma_n128" => "128x128x64, 2 wgmma consumer warpgroups of 64x128 + 1 TMA producer warp, 3-stage mbarrier ring, 2 blocks/SM",
        "wgmma_n128_deep" => "128x128x64, 3 warpgroups (1 TMA producer, 2 wgmma consumers of 64x128), 7-stage mbarrier ring, 1 block/SM",
        "wgmma_n64_deep" => "128x64x64, 3 warpgroups (1 TMA producer, 2 wgmma consumers of 64x64), 9-stage mbarrier ring, 1 block/SM",
        _ => "",
    }
}

/// Grid, block and dynamic shared memory per variant, as each kernel's line in gemm.cu states.
pub fn launch_config(variant: &str, m: usize, n: usize) -> LaunchConfig {
    let blocks = |bm: usize, bn: usize| (n.div_ceil(bn) as u32, m.div_ceil(bm) as u32, 1);
    let (grid_dim, block_dim) = match variant {
        "naive" => ((n.div_ceil(32) as u32, m.div_ceil(8) as u32, 1), (32, 8, 1)),
        "smem_tiled" => (blocks(32, 32), (32, 32, 1)),
        "blocktile_1d" => (blocks(64, 64), (512, 1, 1)),
        "blocktile_2d" | "vectorized" | "mma_ldmatrix" => (blocks(128, 128), (256, 1, 1)),
        "warptiled" => (blocks(128, 128), (128, 1, 1)),
        // One block index, unpacked into grouped (row, column) order by the kernel.
        "mma_pipelined" => (((m.div_ceil(128) * n.div_ceil(128)) as u32, 1, 1), (256, 1, 1)),
        "mma_pipelined_wide" => (((m.div_ceil(128) * n.div_ceil(256)) as u32, 1, 1), (256, 1, 1)),
        "mma_warp64" => (((m.div_ceil(128) * n.div_ceil(128)) as u32, 1, 1), (128, 1, 1)),
        // mma_warp64_tail_split: a block per tile here; launch_tma adds the split blocks (TailPlan).
        "mma_warp64_wide" | "mma_warp64_k64" | "mma_warp64_tma" | "mma_warp64_tail_split" => (((m.div_ceil(128) * n.div_ceil(256)) as u32, 1, 1), (256, 1, 1)),
        // grid.y: the K slices, set by run_kernel from splitk_slices.
        "mma_splitk" => (((m.div_ceil(16) * n.div_ceil(128)) as u32, 1, 1), (256, 1, 1)),
        v if SM90A_VARIANTS.contains(&v) => {
            let t = wg::Tile::of(v).expect("every other sm_90a variant is a wgmma rung");
            (((m.div_ceil(wg::BM) * n.div_ceil(t.bn)) as u32, 1, 1), (t.threads(), 1, 1))
        }
        other => unreachable!("no launch shape for gemm variant `{other}`"),
    };
    LaunchConfig { grid_dim, block_dim, shared_mem_bytes: dynamic_smem(variant) as u32 }
}

/// K slices (blocks per 16x128 tile along K, grid.y) of mma_splitk on `sms` SMs: enough for 2
/// blocks per SM, each slice at least 4 slabs of 64 deep, none empty; 1 where the tiles alone
/// fill the GPU twice.
pub fn splitk_slices(d: Dims, sms: usize) -> usize {
    let (tiles, slabs) = (d.m.div_ceil(16) * d.n.div_ceil(128), d.k.div_ceil(64));
    let want = (2 * sms).div_ceil(tiles).min(slabs / 4).max(1);
    slabs.div_ceil(slabs.div_ceil(want))
}

/// How mma_warp64_tail_split shares its 128x256 tiles (in grouped order) among `sms` SMs of one
/// block each: the first `dp_tiles` whole, as mma_warp64_tma's blocks; each of the other
/// `tiles - dp_tiles` as `slices` K ranges of ceil(nk / slices) slabs, one block per (slice,
/// tile), slice-major (the kernel decodes a block as [`TailPlan::unit`] does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailPlan {
    pub tiles: usize,
    pub dp_tiles: usize,
    pub slices: usize,
}

/// Tail split cost model, in slab-times (one block's 128x256x64 step, ~1.1 us on an H100 with
/// every SM busy): what a split block adds (its ring's first fill, its 128 KiB partial store,
/// its tile's blocks ending apart) and, per slice, the split tile's sum (its last block reads
/// every slice's 128 KiB through one SM). Fitted to the first run's figures across seven shapes
/// (h100-gemm-tail-split.md): 8 and 2, against the 2 and 1 guessed before it, which split shapes
/// that came out slower. Slices are at least 4 slabs, at most 16.
const TAIL_BLOCK_OVERHEAD_SLABS: usize = 8;
const TAIL_SUM_SLABS_PER_SLICE: usize = 2;
const TAIL_MIN_SLABS: usize = 4;
const TAIL_MAX_SLICES: usize = 16;

impl TailPlan {
    /// Blocks in the launch: the whole tiles, then every split tile's slices.
    pub fn blocks(&self) -> usize {
        self.dp_tiles + self.split_blocks()
    }
    pub fn split_blocks(&self) -> usize {
        self.split_tiles() * self.slices
    }
    pub fn split_tiles(&self) -> usize {
        self.tiles - self.dp_tiles
    }
    /// Block `b`'s tile (grouped order), first slab and number of slabs, for `nk` slabs of K.
    pub fn unit(&self, b: usize, nk: usize) -> (usize, usize, usize) {
        if b < self.dp_tiles {
            return (b, 0, nk);
        }
        let (u, per) = (b - self.dp_tiles, nk.div_ceil(self.slices));
        let kb = (u / self.split_tiles()) * per;
        (self.dp_tiles + u % self.split_tiles(), kb, nk.min(kb + per) - kb)
    }
}

/// The tail split for `d` on `sms` SMs: the tiles past the last whole wave (tiles % sms) are split
/// into the slice count whose waves of split blocks end soonest by the cost model above, or not
/// at all when no split beats one more wave of whole tiles (nk slab-times).
pub fn tail_plan(d: Dims, sms: usize) -> TailPlan {
    let (tiles, nk, sms) = (d.m.div_ceil(wg::BM) * d.n.div_ceil(wg::WIDE.bn), d.k.div_ceil(wg::BK), sms.max(1));
    let rest = tiles % sms;
    let mut best = (nk, 1);
    for want in 2..=TAIL_MAX_SLICES {
        let per = nk.div_ceil(want);
        if rest == 0 || per < TAIL_MIN_SLABS {
            break;
        }
        let slices = nk.div_ceil(per); // none empty
        let cost = (rest * slices).div_ceil(sms) * (per + TAIL_BLOCK_OVERHEAD_SLABS) + slices * TAIL_SUM_SLABS_PER_SLICE;
        if cost < best.0 {
            best = (cost, slices);
        }
    }
    let slices = best.1;
    TailPlan { tiles, dp_tiles: if slices == 1 { tiles } else { tiles - rest }, slices }
}

/// The fp32 partials and per-tile counters of a split variant, zero at rest (each split tile's
/// last block resets its counter), allocated once per shape, outside the timed launches:
/// mma_splitk's slices x M x N floats and a counter per 16x128 tile; mma_warp64_tail_split's
/// 128 x 256 floats per split block and a counter per split tile.
pub struct SplitK {
    pub slices: usize,
    /// mma_warp64_tail_split's plan; `None` for mma_splitk.
    pub tail: Option<TailPlan>,
    ws: CudaSlice<f32>,
    done: CudaSlice<u32>,
}

impl SplitK {
    /// The workspace `variant` needs for `d` on this GPU, `None` for a variant that splits nothing.
    pub fn for_variant(gpu: &Gpu, variant: &str, d: Dims) -> Result<Option<Self>> {
        let sms = gpu.info.sm_count as usize;
        let (slices, tail, ws_len, counters) = match variant {
            "mma_splitk" => {
                let slices = splitk_slices(d, sms);
                (slices, None, if slices > 1 { slices * d.m * d.n } else { 1 }, launch_config("mma_splitk", d.m, d.n).grid_dim.0 as usize)
            }
            "mma_warp64_tail_split" => {
                let plan = tail_plan(d, sms);
                (plan.slices, Some(plan), plan.split_blocks().max(1) * wg::BM * wg::WIDE.bn, plan.split_tiles().max(1))
            }
            _ => return Ok(None),
        };
        let ws = gpu.stream.alloc_zeros::<f32>(ws_len).doing("allocating the split-K workspace")?;
        let done = gpu.stream.alloc_zeros::<u32>(counters).doing("allocating the split-K counters")?;
        Ok(Some(SplitK { slices, tail, ws, done }))
    }

    /// The record's account of the split.
    pub fn describe(&self) -> (&'static str, Value) {
        match self.tail {
            Some(p) => ("tail_split", json!({"tiles": p.tiles, "dp_tiles": p.dp_tiles, "slices": p.slices, "blocks": p.blocks()})),
            None => ("splitk_slices", json!(self.slices)),
        }
    }
}

/// The compiled kernel's resources as the driver reports them, for the record's `extra`.
fn resources(f: &CudaFunction, variant: &str) -> Result<serde_json::Map<String, Value>> {
    let get = |a| f.get_attribute(a).doing("reading a kernel attribute");
    let mut extra = serde_json::Map::new();
    extra.insert("registers".into(), json!(get(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?));
    extra.insert("static_smem_bytes".into(), json!(get(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?));
    extra.insert("dynamic_smem_bytes".into(), json!(dynamic_smem(variant)));
    extra.insert("local_bytes_per_thread".into(), json!(get(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?));
    // Resident blocks per SM as the driver computes them (registers, shared memory, threads).
    let (bx, by, bz) = launch_config(variant, 1, 1).block_dim;
    let threads = bx * by * bz;
    let blocks = f.occupancy_max_active_blocks_per_multiprocessor(threads, dynamic_smem(variant), None).doing("querying occupancy")?;
    extra.insert("blocks_per_sm".into(), json!(blocks));
    extra.insert("tile".into(), json!(tile(variant)));
    Ok(extra)
}

impl Experiment for Gemm {
    fn name(&self) -> &'static str {
        "gemm"
    }
    fn description(&self) -> &'static str {
        "C = alpha A B + beta C, row-major: fp32 SIMT ladder (naive to warp tiling), fp16/bf16 mma.sync ladder (ldmatrix, cp.async + swizzle) and wgmma + TMA on sm_90a, beside cuBLAS"
    }
    fn sweep_axis(&self) -> &'static str {
        "m"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        // (m, n, k, alpha, beta, timed): untimed odd shapes are correctness gates.
        type Shape = (usize, usize, usize, f32, f32, bool);
        let gates: &[Shape] = match (backend, quick) {
            (Backend::Cpu, true) => &[(1, 1, 1, 1.0, 0.0, false), (1, 37, 29, 1.0, 0.0, false), (33, 47, 65, 0.5, -1.25, false), (97, 131, 77, 1.0, 0.0, false)],
            (Backend::Cpu, false) => &[(1, 1, 1, 1.0, 0.0, false), (1, 1000, 777, 1.0, 0.0, false), (1000, 1000, 1000, 1.0, 0.0, false), (4097, 513, 777, 0.5, -1.25, false)],
            // (300, 520, 96): K % 32 == 0, so interior blocks of mma_warp64(_wide) take the bare
            // cp.async path while the edge blocks of the same launch take the checked one;
            // (300, 520, 320) does the same for mma_warp64_k64 (K % 64 == 0), with more slabs
            // than slots in every ring (the copies wrap around while the edge blocks run).
            // The TMA rungs take only K and N multiples of 8 (TMA row strides): of these,
            // 1000^3, 300x520x96, 300x520x320 and the last three, which put their M, N and K edges
            // (a partial last k-tile, 8 columns past a 256- or 128-wide tile, M = 1) and
            // beta != 0 under the check. 130x264x1024 also gives mma_splitk 4 slices with beta != 0 (its epilogue
            // applies beta), and 1x4097x777 3 slices with an odd N. 130x320x104 is the one whose N is a
            // multiple of 64, so mma_warp64_tma takes B as 3D boxes there, with edges in M, K (104 = 64 + 40)
            // and N (one 64-column block in, three zero-filled) and beta != 0.
            // 2100x2040x4072 is 136 of mma_warp64_tail_split's tiles: on 132 SMs a whole wave, then
            // 4 tiles in 5 K slices (the last slab partial), with M and N edges and beta != 0.
            (Backend::Cuda(_), _) => &[
                (1, 4097, 777, 1.0, 0.0, false),
                (1000, 1000, 1000, 1.0, 0.0, false),
                (4097, 513, 777, 0.5, -1.25, false),
                (130, 260, 72, 1.0, 0.0, false),
                (300, 520, 96, 1.0, 0.0, false),
                (300, 520, 320, 1.0, 0.0, false),
                (130, 264, 72, 0.5, -1.25, false),
                (1, 1032, 776, 1.0, 0.0, false),
                (130, 264, 1024, 0.5, -1.25, false),
                (130, 320, 104, 0.5, -1.25, false),
                (2100, 2040, 4072, 0.5, -1.25, false),
            ],
        };
        let square = |n: usize| (n, n, n, 1.0, 0.0, true);
        let mut out = Vec::new();
        let mut push = |dtype: &str, shapes: &[Shape]| {
            for &(m, n, k, alpha, beta, timed) in shapes {
                out.push(json!({"m": m, "n": n, "k": k, "dtype": dtype, "alpha": alpha, "beta": beta, "timed": timed}));
            }
        };
        match (backend, quick) {
            (Backend::Cpu, true) => {
                for dtype in ["f32", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(128)]);
            }
            (Backend::Cpu, false) => {
                for dtype in ["f32", "f16", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(512), square(1024)]);
            }
            (Backend::Cuda(_), true) => {
                for dtype in ["f32", "f16", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(1024), square(2048)]);
                push("f16", &[square(2048), square(4096)]);
            }
            (Backend::Cuda(_), false) => {
                for dtype in ["f32", "f16", "bf16"] {
                    push(dtype, gates);
                }
                push("f32", &[square(1024), square(2048), square(4096), (16, 4096, 4096, 1.0, 0.0, true), (4096, 11008, 4096, 1.0, 0.0, true)]);
                let squares = [square(1024), square(2048), square(4096), square(8192)];
                push("f16", &squares);
                push("bf16", &squares);
                // Llama-style projections: decode (M = 1, 16) to prefill (M = 4096).
                let mut llama: Vec<Shape> = [1, 16, 128, 512, 4096].iter().map(|&m| (m, 4096, 4096, 1.0, 0.0, true)).collect();
                for m in [16, 4096] {
                    llama.extend([(m, 11008, 4096, 1.0, 0.0, true), (m, 4096, 11008, 1.0, 0.0, true), (m, 14336, 4096, 1.0, 0.0, true)]);
                }
                push("f16", &llama);
                push("bf16", &[(4096, 11008, 4096, 1.0, 0.0, true)]);
            }
        }
        out
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::F32 => run::<f32>(s, case),
            DType::F16 => run::<half::f16>(s, case),
            DType::Bf16 => run::<half::bf16>(s, case),
        }
    }
}

fn param_f32(case: &Value, key: &str, default: f32) -> f32 {
    case.get(key).and_then(Value::as_f64).map_or(default, |v| v as f32)
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()>
where
    CudaBlas: BlasGemm<T>,
{
    let d = Dims::dense(param_usize(case, "m")?, param_usize(case, "n")?, param_usize(case, "k")?);
    let ab = (param_f32(case, "alpha", 1.0), param_f32(case, "beta", 0.0));
    let timed = param_timed(case);
    // A --variant filter that admits nothing of this dtype skips the case before building inputs
    // and references (`--variant mma_warp64 --variant cublas_gemm_ex` runs no f32 case).
    if matches!(s.backend, Backend::Cuda(_)) {
        let peer = if T::DTYPE == DType::F32 { "cublas_sgemm" } else { "cublas_gemm_ex" };
        if !ladder(T::DTYPE).iter().any(|v| s.wants(v, "lab")) && !s.wants(peer, "cublas") {
            return Ok(());
        }
    }
    let mut rng = rng_for(s.opts.seed, case);
    validate(d, d.m * d.k, d.k * d.n, d.m * d.n)?;
    let fill = |len: usize, rng: &mut rand::rngs::StdRng| -> Vec<T> {
        (0..len)
            .map(|_| {
                let z: f32 = StandardNormal.sample(rng);
                T::from_f32(z)
            })
            .collect()
    };
    let a = fill(d.m * d.k, &mut rng);
    let b = fill(d.k * d.n, &mut rng);
    let c0 = (ab.1 != 0.0).then(|| fill(d.m * d.n, &mut rng));
    let expected = Expected::new(&a, &b, c0.as_deref(), d, ab, &mut rng);
    let rel = tolerance(T::DTYPE);
    let work = d.work(T::DTYPE.size(), ab.1);
    let compare_c = |c: &[T]| expected.check(c, d, rel);
    let backend = s.backend.clone();
    let ceiling = match (&backend, T::DTYPE) {
        (Backend::Cuda(_), DType::F16) => "tensor_f16_tflop_s",
        (Backend::Cuda(_), DType::Bf16) => "tensor_bf16_tflop_s",
        _ => "fma_tflop_s",
    };
    let check = Check { tol: Tolerance { atol: 0.0, rtol: rel }, compare: &compare_c, ceiling };
    match &backend {
        Backend::Cpu => {
            measure_cpu(s, case, "cpu_blocked", work, &check, timed, d.m * d.n, |c| {
                if let Some(c0) = &c0 {
                    c.copy_from_slice(c0);
                }
                cpu_blocked(&a, &b, c, d, ab)
            })?;
        }
        Backend::Cuda(gpu) => run_gpu(s, gpu, case, d, ab, (&a, &b, c0.as_deref()), work, &check, timed)?,
    }
    Ok(())
}

/// The GPU ladder a dtype runs.
pub fn ladder(dtype: DType) -> &'static [&'static str] {
    if dtype == DType::F32 { F32_VARIANTS } else { HALF_VARIANTS }
}

/// Is `variant` a GPU variant of this dtype whose shared memory fits the device?
pub fn check_variant(variant: &str, dtype: DType, max_smem_optin: usize) -> Result<()> {
    if !ladder(dtype).contains(&variant) {
        let runs = if F32_VARIANTS.contains(&variant) {
            "f32 only"
        } else if HALF_VARIANTS.contains(&variant) {
            "f16 and bf16 only"
        } else {
            return Err(LabError::UnknownVariant { experiment: "gemm".into(), variant: variant.into() });
        };
        return Err(LabError::Invalid(format!("gemm variant `{variant}` runs in {runs}, not {}", dtype.name())));
    }
    let smem = dynamic_smem(variant);
    if smem > max_smem_optin {
        return Err(LabError::Invalid(format!("gemm variant `{variant}` needs {smem} bytes of shared memory per block; this device allows {max_smem_optin}")));
    }
    Ok(())
}

/// A gemm kernel, ready to launch: the variant must belong to the dtype's ladder, and its dynamic
/// shared memory limit is raised to what [`launch_config`] asks for.
pub fn kernel(gpu: &Gpu, variant: &str, dtype: DType) -> Result<CudaFunction> {
    check_variant(variant, dtype, gpu.info.max_smem_per_block_optin as usize)?;
    if SM90A_VARIANTS.contains(&variant) && gpu.arch != 90 {
        return Err(LabError::Invalid(format!(
            "gemm variant `{variant}` uses sm_90a instructions (TMA, mbarriers, wgmma) and runs on compute capability 9.0 only; this device is {}",
            gpu.info.cc
        )));
    }
    let smem = dynamic_smem(variant);
    let f = gpu.function(FAMILY, &symbol(FAMILY, variant, dtype))?;
    raise_dynamic_smem(&f, smem)?;
    Ok(f)
}

/// Lets `f` launch with `smem` bytes of dynamic shared memory: the limit is raised to it (the
/// default 48 KiB counts static shared memory too) and the whole carveout preferred as shared
/// memory (so that, e.g., mma_warp64's two 64 KiB blocks per SM fit). Without dynamic shared
/// memory, nothing to do.
pub fn raise_dynamic_smem(f: &CudaFunction, smem: usize) -> Result<()> {
    set_dynamic_smem(f, smem, 100)
}

/// [`raise_dynamic_smem`] for a kernel that runs `blocks` blocks per SM and reads other data
/// through L1: the carveout preferred is only what those blocks need (dynamic and static shared
/// memory, plus the 1 KiB the system reserves per block), so that the rest of the SM's unified
/// L1/shared memory stays L1.
pub fn fit_dynamic_smem(gpu: &Gpu, f: &CudaFunction, smem: usize, blocks: usize) -> Result<()> {
    if smem == 0 {
        return Ok(());
    }
    let per_sm = gpu.ctx.attribute(DevAttr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR).doing("reading shared memory per SM")? as usize;
    let static_smem = f.get_attribute(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).doing("reading the kernel's static shared memory")? as usize;
    let need = blocks * (smem + static_smem + 1024);
    set_dynamic_smem(f, smem, (100 * need).div_ceil(per_sm).min(100) as i32)
}

fn set_dynamic_smem(f: &CudaFunction, smem: usize, carveout_percent: i32) -> Result<()> {
    if smem > 0 {
        f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .doing("raising the kernel's dynamic shared memory limit")?;
        f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carveout_percent)
            .doing("preferring a shared-memory carveout")?;
    }
    Ok(())
}

/// C = alpha A B + beta C on the GPU with one lab variant (`f` from [`kernel`]); the arguments
/// are validated first, so a mismatched buffer is an error, never an out-of-bounds access.
#[allow(clippy::too_many_arguments)]
pub fn run_kernel<T: Elem>(
    gpu: &Gpu,
    f: &CudaFunction,
    variant: &str,
    d: Dims,
    (alpha, beta): (f32, f32),
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    c: &mut CudaSlice<T>,
    splitk: Option<&SplitK>,
) -> Result<()> {
    validate(d, a.len(), b.len(), c.len())?;
    if SM90A_VARIANTS.contains(&variant) {
        if let Some(why) = not_applicable(variant, d) {
            return Err(LabError::Invalid(format!("gemm {variant}: {why}")));
        }
        let maps = tensor_maps(gpu, variant, d, a, b)?;
        return launch_tma(gpu, f, variant, d, (alpha, beta), &maps, c, splitk);
    }
    let mut cfg = launch_config(variant, d.m, d.n);
    let (m, n, k) = (d.m as i32, d.n as i32, d.k as i32);
    let (lda, ldb, ldc) = (d.lda as i32, d.ldb as i32, d.ldc as i32);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(a).arg(b).arg(c).arg(&m).arg(&n).arg(&k).arg(&lda).arg(&ldb).arg(&ldc).arg(&alpha).arg(&beta);
    if variant == "mma_splitk" {
        let sk = splitk.ok_or_else(|| LabError::Invalid("gemm mma_splitk needs its split-K workspace (SplitK::for_variant for this shape)".into()))?;
        if sk.tail.is_some() || sk.slices != splitk_slices(d, gpu.info.sm_count as usize) || (sk.slices > 1 && sk.ws.len() < sk.slices * d.m * d.n) || sk.done.len() < cfg.grid_dim.0 as usize {
            return Err(LabError::Invalid(format!("gemm mma_splitk: the split-K workspace was made for another shape than M={} N={} K={}", d.m, d.n, d.k)));
        }
        cfg.grid_dim.1 = sk.slices as u32;
        l.arg(&sk.ws).arg(&sk.done);
    }
    // SAFETY: validate() checked A (m x lda), B (k x ldb) and C (m x ldc) against M, N, K and the
    // buffers' lengths; every kernel bounds its loads and stores by M, N, K and the leading
    // dimensions; cfg is the launch shape (and dynamic smem) the kernel is written for.
    // mma_splitk: the workspace holds grid.y x M x N floats (when grid.y > 1) and the counters
    // one per tile (grid.x), zero at rest, checked above.
    unsafe { l.launch(cfg) }.map(|_| ()).doing(&format!("launching gemm {variant}"))
}

/// Launches a TMA rung (an mma.sync one or a wgmma rung) with the tensor maps of A and B (from
/// [`tensor_maps`] on buffers that [`validate`] accepted for `d`); mma_warp64_tail_split also
/// takes its workspace ([`SplitK::for_variant`] for this shape).
#[allow(clippy::too_many_arguments)]
pub fn launch_tma<T: Elem>(
    gpu: &Gpu,
    f: &CudaFunction,
    variant: &str,
    d: Dims,
    (alpha, beta): (f32, f32),
    maps: &TmaMaps,
    c: &mut CudaSlice<T>,
    splitk: Option<&SplitK>,
) -> Result<()> {
    let mut cfg = launch_config(variant, d.m, d.n);
    let (m, n, k, ldc) = (d.m as i32, d.n as i32, d.k as i32, d.ldc as i32);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&maps.a).arg(&maps.b).arg(c).arg(&m).arg(&n).arg(&k).arg(&ldc).arg(&alpha).arg(&beta);
    if WARP64_TMA_VARIANTS.contains(&variant) {
        l.arg(&maps.b_rank);
    }
    let (dp_tiles, slices);
    if variant == "mma_warp64_tail_split" {
        let plan = tail_plan(d, gpu.info.sm_count as usize);
        let sk = splitk.filter(|sk| sk.tail == Some(plan)).ok_or_else(|| {
            LabError::Invalid(format!("gemm {variant} needs the split-K workspace made for M={} N={} K={} (SplitK::for_variant)", d.m, d.n, d.k))
        })?;
        (dp_tiles, slices) = (plan.dp_tiles as i32, plan.slices as i32);
        cfg.grid_dim.0 = plan.blocks() as u32;
        l.arg(&dp_tiles).arg(&slices).arg(&sk.ws).arg(&sk.done);
    }
    // SAFETY: the maps describe A (M x K) and B (K x N) inside their buffers (TMA never reads
    // outside the described tensor; B's 3D map only where every column block lies within a
    // row); the kernel predicates every C store on M, N and ldc; cfg is the launch shape and
    // dynamic smem it is written for. mma_warp64_tail_split: the workspace was made for this
    // plan (a 128x256 slot per split block, a counter per split tile, zero at rest).
    unsafe { l.launch(cfg) }.map(|_| ()).doing(&format!("launching gemm {variant}"))
}

#[allow(clippy::too_many_arguments)]
fn run_gpu<T: Elem>(
    s: &mut Session,
    gpu: &Gpu,
    case: &Value,
    d: Dims,
    (alpha, beta): (f32, f32),
    (a, b, c0): (&[T], &[T], Option<&[T]>),
    work: Work,
    check: &Check<T>,
    timed: bool,
) -> Result<()>
where
    CudaBlas: BlasGemm<T>,
{
    let (da, db) = (gpu.upload(a)?, gpu.upload(b)?);
    let dc0 = c0.map(|c| gpu.upload(c)).transpose()?;
    let mut dc = gpu.stream.alloc_zeros::<T>(d.m * d.n).doing("allocating C")?;
    // beta != 0 reads C: every launch starts from the same C0 (such cases are untimed).
    let reset = |c: &mut CudaSlice<T>| -> Result<()> {
        match &dc0 {
            Some(c0) => gpu.stream.memcpy_dtod(c0, c).doing("restoring C before the GEMM"),
            None => Ok(()),
        }
    };
    let (m, n, k) = (d.m as i32, d.n as i32, d.k as i32);
    let (lda, ldb, ldc) = (d.lda as i32, d.ldb as i32, d.ldc as i32);
    let variants = ladder(T::DTYPE);
    let mut skipped = serde_json::Map::new();
    for &variant in variants {
        if !applies(variant, d, gpu.info.max_smem_per_block_optin as usize, gpu.arch) || !s.wants(variant, "lab") {
            continue;
        }
        if let Some(why) = not_applicable(variant, d) {
            eprintln!("note: gemm {variant} not applicable to M={} N={} K={}: {why}", d.m, d.n, d.k);
            skipped.insert(variant.into(), json!(format!("not applicable: {why}")));
            continue;
        }
        let f = kernel(gpu, variant, T::DTYPE)?;
        let mut extra = resources(&f, variant)?;
        if !skipped.is_empty() {
            extra.insert("not_applicable".into(), Value::Object(skipped.clone()));
        }
        let splitk = SplitK::for_variant(gpu, variant, d)?;
        if let Some(sk) = &splitk {
            let (key, value) = sk.describe();
            extra.insert(key.into(), value);
        }
        if SM90A_VARIANTS.contains(&variant) {
            // The maps are encoded once per case, outside the timed launches.
            let maps = tensor_maps(gpu, variant, d, &da, &db)?;
            let launch = |c: &mut CudaSlice<T>| -> Result<()> {
                reset(c)?;
                launch_tma(gpu, &f, variant, d, (alpha, beta), &maps, c, splitk.as_ref())
            };
            measure_gpu_as(s, gpu, case, (variant, "lab"), work, check, timed, &mut dc, extra, launch)?;
            continue;
        }
        let launch = |c: &mut CudaSlice<T>| -> Result<()> {
            reset(c)?;
            run_kernel(gpu, &f, variant, d, (alpha, beta), &da, &db, c, splitk.as_ref())
        };
        measure_gpu_as(s, gpu, case, (variant, "lab"), work, check, timed, &mut dc, extra, launch)?;
    }
    let peer = if T::DTYPE == DType::F32 { "cublas_sgemm" } else { "cublas_gemm_ex" };
    if s.wants(peer, "cublas") {
        let blas = CudaBlas::new(gpu.stream.clone()).doing("creating the cuBLAS handle")?;
        // Row-major C = A B is column-major C^T = B^T A^T: pass B first, with the dimensions
        // swapped. The handle keeps CUBLAS_DEFAULT_MATH: fp32 stays fp32 (no TF32).
        let cfg = GemmConfig {
            transa: CUBLAS_OP_N,
            transb: CUBLAS_OP_N,
            m: n,
            n: m,
            k,
            alpha: T::from_f32(alpha),
            lda: ldb,
            ldb: lda,
            beta: T::from_f32(beta),
            ldc,
        };
        let launch = |c: &mut CudaSlice<T>| -> Result<()> {
            reset(c)?;
            // SAFETY: the same buffers and dimensions the lab kernels were validated for.
            unsafe { blas.gemm(cfg, &db, &da, c) }.doing("cuBLAS GEMM")
        };
        let mut extra = serde_json::Map::new();
        extra.insert("math".into(), json!(if T::DTYPE == DType::F32 { "sgemm, CUBLAS_DEFAULT_MATH (no TF32)" } else { "gemm_ex, CUBLAS_COMPUTE_32F" }));
        if !skipped.is_empty() {
            extra.insert("not_applicable".into(), Value::Object(skipped));
        }
        measure_gpu_as(s, gpu, case, (peer, "cublas"), work, check, timed, &mut dc, extra, launch)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn inputs<T: Elem>(d: Dims, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut f = |len: usize| -> Vec<T> { (0..len).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect() };
        (f((d.m - 1) * d.lda + d.k), f((d.k - 1) * d.ldb + d.n), f((d.m - 1) * d.ldc + d.n))
    }

    fn check_cpu<T: Elem>(d: Dims, ab: (f32, f32)) {
        let (a, b, c0) = inputs::<T>(d, d.macs());
        let expected = Expected::Full(reference(&a, &b, Some(&c0), d, ab));
        let mut c = c0.clone();
        cpu_blocked(&a, &b, &mut c, d, ab);
        let e = expected.check(&c, d, tolerance(T::DTYPE));
        assert!(e.passed(), "{:?} {d:?}: {e:?}", T::DTYPE);
        // Padding between rows of C (ldc > N) is never written.
        for i in 0..d.m.saturating_sub(1) {
            for j in d.n..d.ldc {
                assert_eq!(c[i * d.ldc + j].to_f32(), c0[i * d.ldc + j].to_f32(), "padding at ({i}, {j}) changed");
            }
        }
    }

    #[test]
    fn cpu_variant_matches_the_reference_on_odd_shapes() {
        for (m, n, k) in [(1, 1, 1), (1, 1000, 777), (33, 47, 65), (97, 131, 600), (1000, 1000, 1000), (4097, 513, 777)] {
            check_cpu::<f32>(Dims::dense(m, n, k), (1.0, 0.0));
        }
        for (m, n, k) in [(1, 37, 29), (65, 130, 300)] {
            check_cpu::<f32>(Dims::dense(m, n, k), (0.5, -1.25));
            check_cpu::<half::f16>(Dims::dense(m, n, k), (1.0, 0.0));
            check_cpu::<half::bf16>(Dims::dense(m, n, k), (0.5, -1.25));
        }
        // Leading dimensions longer than the rows.
        check_cpu::<f32>(Dims { m: 19, n: 23, k: 29, lda: 31, ldb: 27, ldc: 25 }, (2.0, 0.5));
    }

    #[test]
    fn reference_agrees_with_an_independent_triple_loop() {
        let d = Dims { m: 7, n: 5, k: 9, lda: 11, ldb: 6, ldc: 8 };
        let (a, b, c0) = inputs::<f32>(d, 3);
        let full = reference(&a, &b, Some(&c0), d, (0.5, 2.0));
        for i in 0..d.m {
            for j in 0..d.n {
                let mut dot = 0.0f64;
                for kk in 0..d.k {
                    dot += a[i * d.lda + kk] as f64 * b[kk * d.ldb + j] as f64;
                }
                let want = 0.5 * dot + 2.0 * c0[i * d.ldc + j] as f64;
                assert!((full[i * d.n + j] - want).abs() < 1e-12);
                assert!((reference_at(&a, &b, Some(&c0), d, (0.5, 2.0), i, j) - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn sampled_checks_catch_a_wrong_entry_and_nan() {
        let d = Dims::dense(40, 30, 20);
        let (a, b, _) = inputs::<f32>(d, 5);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let picks: Vec<(usize, usize)> = (0..200).map(|_| (rng.random_range(0..d.m), rng.random_range(0..d.n))).chain([(39, 29)]).collect();
        let values = picks.iter().map(|&(i, j)| reference_at(&a, &b, None, d, (1.0, 0.0), i, j)).collect();
        let expected = Expected::Sampled { picks, values };
        assert_eq!(expected.name(), "cpu-f64-sampled-201");
        let mut c = vec![0f32; d.m * d.n];
        cpu_blocked(&a, &b, &mut c, d, (1.0, 0.0));
        assert!(expected.check(&c, d, 1e-5).passed());
        c[39 * 30 + 29] += 10.0;
        assert!(!expected.check(&c, d, 1e-5).passed());
        c[39 * 30 + 29] = f32::NAN;
        assert!(!expected.check(&c, d, 1e9).passed());
        // Large products use the sampled check, small ones the full one.
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let (a, b, _) = inputs::<f32>(Dims::dense(2, 3, 4), 1);
        assert_eq!(Expected::new(&a, &b, None, Dims::dense(2, 3, 4), (1.0, 0.0), &mut rng).name(), "cpu-f64");
    }

    #[test]
    fn bad_arguments_are_named() {
        let d = Dims::dense(2, 3, 4);
        assert!(validate(d, 8, 12, 6).is_ok());
        let err = |d: Dims, a: usize, b: usize, c: usize| validate(d, a, b, c).unwrap_err().to_string();
        assert!(err(Dims::dense(0, 3, 4), 0, 12, 0).contains("at least 1"));
        assert!(err(d, 7, 12, 6).contains("A has 7 elements"));
        assert!(err(d, 8, 11, 6).contains("B has 11 elements"));
        assert!(err(d, 8, 12, 5).contains("C has 5 elements"));
        assert!(err(Dims { lda: 3, ..d }, 8, 12, 6).contains("lda=3 is shorter than a row (K=4)"));
        assert!(err(Dims { ldc: 2, ..d }, 8, 12, 6).contains("ldc=2"));
        assert!(err(Dims::dense(1 << 31, 1, 1), 1 << 31, 1, 1 << 31).contains("below 2^31"));
        // A variant runs only in its own dtypes, and only where its shared memory fits.
        assert!(check_variant("warptiled", DType::F32, 227 * 1024).is_ok());
        assert!(check_variant("mma_pipelined_wide", DType::Bf16, 227 * 1024).is_ok());
        let e = check_variant("warptiled", DType::F16, 227 * 1024).unwrap_err().to_string();
        assert!(e.contains("runs in f32 only, not f16"), "{e}");
        let e = check_variant("mma_pipelined", DType::F32, 227 * 1024).unwrap_err().to_string();
        assert!(e.contains("runs in f16 and bf16 only, not f32"), "{e}");
        assert!(check_variant("tiled_by_magic", DType::F32, 1 << 20).unwrap_err().to_string().contains("unknown variant"));
        let e = check_variant("mma_pipelined_wide", DType::F16, 163 * 1024).unwrap_err().to_string();
        assert!(e.contains("needs 196608 bytes"), "{e}");
        assert!(!applies("mma_pipelined_wide", Dims::dense(64, 64, 64), 163 * 1024, 90));
        assert!(!applies("naive", Dims::dense(4096, 4096, 4096), 1 << 20, 90) && applies("naive", Dims::dense(2048, 2048, 2048), 0, 90));
        // Padded leading dimensions are fine when the buffers hold them.
        assert!(validate(Dims { m: 2, n: 3, k: 4, lda: 5, ldb: 3, ldc: 7 }, 9, 12, 10).is_ok());
    }

    /// mma_splitk's slices: every slice gets at least one slab (none empty, as the kernel's
    /// ceil(nk / S) split would leave past the last), decode shapes give every SM a block unless
    /// K is short, and shapes whose tiles fill the GPU are not split.
    #[test]
    fn splitk_slices_leave_no_slice_empty() {
        for (m, n, k) in [(1, 4096, 4096), (16, 4096, 11008), (16, 14336, 4096), (4, 4097, 777), (1, 1, 1), (8192, 8192, 8192), (16, 128, 64), (3, 513, 100000)] {
            let d = Dims::dense(m, n, k);
            let (s, slabs, tiles) = (splitk_slices(d, 132), k.div_ceil(64), m.div_ceil(16) * n.div_ceil(128));
            let per = slabs.div_ceil(s);
            assert!(s >= 1 && (s - 1) * per < slabs && s * per >= slabs, "{m}x{n}x{k}: {s} slices of {per}");
            assert!(s == 1 || per >= 4, "{m}x{n}x{k}: slices of {per} slabs");
            assert!(tiles * s >= 132 || per < 8, "{m}x{n}x{k}: {s} slices of {per} slabs leave SMs idle");
        }
        assert_eq!(splitk_slices(Dims::dense(16, 4096, 4096), 132), 8);
        assert_eq!(splitk_slices(Dims::dense(8192, 8192, 8192), 132), 1);
    }

    #[test]
    fn launch_shapes_cover_every_output() {
        for (m, n) in [(1, 1), (1, 4097), (4097, 513), (1000, 1000), (8192, 8192), (16, 14336)] {
            for v in F32_VARIANTS.iter().chain(HALF_VARIANTS) {
                let cfg = launch_config(v, m, n);
                // The wgmma rungs' producer (a warpgroup or a warp) owns no outputs.
                let threads = cfg.block_dim.0 * cfg.block_dim.1 - wg::Tile::of(v).map_or(0, |t| t.threads() - 256);
                let (bm, bn) = match *v {
                    "naive" => (8, 32),
                    "smem_tiled" => (32, 32),
                    "blocktile_1d" => (64, 64),
                    "mma_pipelined_wide" | "mma_warp64_wide" | "mma_warp64_k64" | "mma_warp64_tma" | "mma_warp64_tail_split" | "wgmma_tma" => (128, 256),
                    "wgmma_n128" | "wgmma_n128_deep" => (128, 128),
                    "wgmma_n64_deep" => (128, 64),
                    "mma_splitk" => (16, 128),
                    _ => (128, 128),
                };
                let blocks = (cfg.grid_dim.0 * cfg.grid_dim.1) as usize;
                assert_eq!(blocks, m.div_ceil(bm) * n.div_ceil(bn), "{v} {m}x{n}");
                let per_thread = match *v {
                    "naive" | "smem_tiled" => 1,
                    "blocktile_1d" => 8,
                    "blocktile_2d" | "vectorized" => 64,
                    "warptiled" => 128,
                    "mma_ldmatrix" | "mma_pipelined" => 64,
                    "mma_splitk" => 8,
                    "wgmma_n128" | "wgmma_n128_deep" => 64,
                    "wgmma_n64_deep" => 32,
                    _ => 128,
                };
                assert_eq!(threads as usize * per_thread, bm * bn, "{v}: threads x outputs per thread != tile");
                assert!(cfg.grid_dim.1 < 65536);
            }
        }
    }

    /// The SIMT rungs' thread-to-output and thread-to-tile-load maps (mirrors of gemm.cu) cover
    /// every output of the block tile and every element of the A and B slabs exactly once.
    #[test]
    fn simt_thread_maps_cover_tiles_exactly_once() {
        fn once(name: &str, size: usize, cells: impl Iterator<Item = usize>) {
            let mut seen = vec![0u32; size];
            cells.for_each(|c| seen[c] += 1);
            assert!(seen.iter().all(|&x| x == 1), "{name}: {:?}", seen.iter().position(|&x| x != 1));
        }
        // blocktile_1d: 64x64, BK 8, 512 threads, TM 8.
        once("1d out", 64 * 64, (0..512).flat_map(|t| (0..8).map(move |i| ((t / 64) * 8 + i) * 64 + t % 64)));
        once("1d A", 64 * 8, (0..512).map(|t| (t / 8) * 8 + t % 8));
        once("1d B", 8 * 64, (0..512).map(|t| (t / 64) * 64 + t % 64));
        // blocktile_2d / vectorized: 128x128, BK 8, 256 threads, 8x8.
        once("2d out", 128 * 128, (0..256).flat_map(|t| (0..64).map(move |x| ((t / 16) * 8 + x / 8) * 128 + (t % 16) * 8 + x % 8)));
        once("2d A", 128 * 8, (0..256).flat_map(|t| (0..128).step_by(32).map(move |o| (t / 8 + o) * 8 + t % 8)));
        once("2d B", 8 * 128, (0..256).flat_map(|t| (0..8).step_by(2).map(move |o| (t / 128 + o) * 128 + t % 128)));
        once("vec A", 128 * 8, (0..256).flat_map(|t| (0..4).map(move |e| (t / 2) * 8 + (t % 2) * 4 + e)));
        once("vec B", 8 * 128, (0..256).flat_map(|t| (0..4).map(move |e| (t / 32) * 128 + (t % 32) * 4 + e)));
        // warptiled: 128x128, BK 16, 128 threads = 4 warps of 64x64, thread 8 x (4 subtiles x 4).
        let wt_out = (0..128).flat_map(|t: usize| {
            let (lane, warp) = (t % 32, t / 32);
            let (wrow, wcol, trow, tcol) = (warp / 2, warp % 2, lane / 4, lane % 4);
            (0..8).flat_map(move |i| (0..4).flat_map(move |s| (0..4).map(move |j| (wrow * 64 + trow * 8 + i) * 128 + wcol * 64 + s * 16 + tcol * 4 + j)))
        });
        once("warptiled out", 128 * 128, wt_out);
        once("warptiled A", 128 * 16, (0..128).flat_map(|t| (0..4).flat_map(move |i| (0..4).map(move |e| (t / 4 + 32 * i) * 16 + (t % 4) * 4 + e))));
        once("warptiled B", 16 * 128, (0..128).flat_map(|t| (0..4).flat_map(move |i| (0..4).map(move |e| (t / 32 + 4 * i) * 128 + (t % 32) * 4 + e))));
    }

    // ---- CPU simulations of the tensor-core index math (mirrors of the expressions in gemm.cu) ----

    /// swz() of gemm.cu: byte offset of 16-byte chunk `chunk` of row `row`.
    fn swz(row: usize, chunk: usize, cpr: usize) -> usize {
        (row * cpr + (chunk ^ (row & 7))) * 16
    }

    #[test]
    fn swizzle_is_a_bijection_and_ldmatrix_phases_are_conflict_free() {
        for (rows, cpr) in [(128, 8), (64, 16), (64, 32)] {
            let mut seen = vec![false; rows * cpr];
            for r in 0..rows {
                for c in 0..cpr {
                    let off = swz(r, c, cpr);
                    assert_eq!(off / 16 / cpr, r, "a chunk left its row");
                    assert!(!std::mem::replace(&mut seen[off / 16], true), "two chunks at one place");
                }
            }
            // One ldmatrix phase: 8 consecutive rows (from a multiple of 8) at one logical chunk.
            // Each 16-byte slot covers 4 banks; 8 distinct slots modulo 128 bytes cover all 32.
            for r0 in (0..rows).step_by(8) {
                for c in 0..cpr {
                    let mut slots: Vec<usize> = (r0..r0 + 8).map(|r| (swz(r, c, cpr) % 128) / 16).collect();
                    slots.sort();
                    slots.dedup();
                    assert_eq!(slots.len(), 8, "bank conflict at rows {r0}.., chunk {c}, {cpr} chunks/row");
                }
            }
        }
        // The padded layout of mma_ldmatrix: rows of 40 and 136 halves.
        for stride_bytes in [80, 272] {
            let mut slots: Vec<usize> = (0..8).map(|r| (r * stride_bytes % 128) / 16).collect();
            slots.sort();
            slots.dedup();
            assert_eq!(slots.len(), 8, "padded stride {stride_bytes} conflicts");
        }
    }

    /// Simulates one block of a tensor-core kernel on the CPU: tiles written into a byte-addressed
    /// "shared memory" through `a_off` / `b_off` (element offsets of (row, col) in the A and B
    /// tiles), read back by per-lane ldmatrix addresses, combined by the m16n8k16 fragment
    /// layouts, and stored by the accumulator layout. Values are small integers: exact in f64.
    #[allow(clippy::too_many_arguments)]
    fn simulate_block(
        (bm_tiles, bn_tiles, bk): (usize, usize, usize),
        (wm, wn): (usize, usize),
        a_off: &dyn Fn(usize, usize) -> usize,
        b_off: &dyn Fn(usize, usize) -> usize,
        a: &dyn Fn(usize, usize) -> f64,
        b: &dyn Fn(usize, usize) -> f64,
        smem_elems: usize,
    ) -> Vec<f64> {
        let (tile_m, tile_n) = (bm_tiles, bn_tiles);
        let (mut sa, mut sb) = (vec![f64::NAN; smem_elems], vec![f64::NAN; smem_elems]);
        for r in 0..tile_m {
            for c in 0..bk {
                sa[a_off(r, c)] = a(r, c);
            }
        }
        for r in 0..bk {
            for c in 0..tile_n {
                sb[b_off(r, c)] = b(r, c);
            }
        }
        let mut out = vec![0.0; tile_m * tile_n];
        let warps_n = tile_n / wn;
        for warp in 0..(tile_m / wm) * warps_n {
            let (wm0, wn0) = ((warp / warps_n) * wm, (warp % warps_n) * wn);
            for ks in 0..bk / 16 {
                // ldmatrix.x4: lane l's register q holds matrix q at (row l/4, cols 2(l%4)..+1),
                // matrix q's rows addressed by lanes 8q..8q+7. Addresses as in the kernel.
                for i in 0..wm / 16 {
                    let addr = |lane: usize| a_off(wm0 + i * 16 + lane % 16, ks * 16 + (lane / 16) * 8);
                    let frag = |lane: usize, q: usize, h: usize| sa[addr(8 * q + lane / 4) + 2 * (lane % 4) + h];
                    for jp in (0..wn / 8).step_by(2) {
                        let baddr = |lane: usize| b_off(ks * 16 + lane % 16, wn0 + jp * 8 + (lane / 16) * 8);
                        // .trans: lane l's register q holds matrix q at (rows 2(l%4)..+1, col l/4).
                        let bfrag = |lane: usize, q: usize, h: usize| sb[baddr(8 * q + 2 * (lane % 4) + h) + lane / 4];
                        for (jt, q0) in [(jp, 0), (jp + 1, 2)] {
                            // Rebuild A (16x16) and B (16x8) from the fragment layouts and check
                            // they are the intended sub-matrices, then accumulate C by its layout.
                            let mut am = [[f64::NAN; 16]; 16];
                            let mut bmat = [[f64::NAN; 8]; 16];
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                for h in 0..2 {
                                    am[g][2 * t + h] = frag(lane, 0, h);
                                    am[g + 8][2 * t + h] = frag(lane, 1, h);
                                    am[g][2 * t + 8 + h] = frag(lane, 2, h);
                                    am[g + 8][2 * t + 8 + h] = frag(lane, 3, h);
                                    bmat[2 * t + h][g] = bfrag(lane, q0, h);
                                    bmat[2 * t + 8 + h][g] = bfrag(lane, q0 + 1, h);
                                }
                            }
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                for (row, col) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)] {
                                    let v: f64 = (0..16).map(|kk| am[row][kk] * bmat[kk][col]).sum();
                                    out[(wm0 + i * 16 + row) * tile_n + wn0 + jt * 8 + col] += v;
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn check_simulation(name: &str, tile: (usize, usize, usize), warp: (usize, usize), a_off: &dyn Fn(usize, usize) -> usize, b_off: &dyn Fn(usize, usize) -> usize, smem: usize) {
        let (tm, tn, bk) = tile;
        let a = |r: usize, c: usize| ((r * 7 + c * 3) % 11) as f64 - 5.0;
        let b = |r: usize, c: usize| ((r * 5 + c * 2) % 13) as f64 - 6.0;
        let got = simulate_block(tile, warp, a_off, b_off, &a, &b, smem);
        for r in 0..tm {
            for c in 0..tn {
                let want: f64 = (0..bk).map(|kk| a(r, kk) * b(kk, c)).sum();
                // Each output belongs to one lane of one warp: a gap or an overlap shows here.
                assert_eq!(got[r * tn + c], want, "{name}: ({r}, {c})");
            }
        }
    }

    #[test]
    fn tensor_core_fragment_addressing_reproduces_the_tile_product() {
        // mma_ldmatrix: padded rows of BK + 8 and BN + 8 halves.
        let (lda_s, ldb_s) = (32 + 8, 128 + 8);
        check_simulation("mma_ldmatrix", (128, 128, 32), (64, 32), &|r, c| r * lda_s + c, &|r, c| r * ldb_s + c, 128 * ldb_s.max(lda_s));
        // mma_pipelined(_wide): swizzled 16-byte chunks, offsets in halves.
        let sw = |cpr: usize| move |r: usize, c: usize| swz(r, c / 8, cpr) / 2 + c % 8;
        check_simulation("mma_pipelined", (128, 128, 64), (64, 32), &sw(8), &sw(16), 128 * 64);
        check_simulation("mma_pipelined_wide", (128, 256, 64), (64, 64), &sw(8), &sw(32), 256 * 64);
    }

    /// The cp.async ring of mma_pipelined, replayed on the CPU with the kernel's schedule: one
    /// commit group per prologue step and per iteration, `wait_group STAGES - 2` then a barrier at
    /// the top of each iteration. At every compute, the slab read must have landed, sit in the slot
    /// read, and no copy still in flight may target that slot; each prefetch must target a slot
    /// whose last reader finished before the barrier (iteration kt - 1 or earlier).
    #[test]
    fn cp_async_ring_schedule_has_no_hazards() {
        for stages in [2usize, 3, 4] {
            for nk in [1usize, 2, 3, 5, 13] {
                let mut groups: Vec<Option<(usize, usize)>> = Vec::new(); // (slot, slab) per group
                let mut slot_of = vec![usize::MAX; stages]; // slab held (or arriving) per slot
                let mut last_read = vec![None::<usize>; stages];
                let load = |g: &mut Vec<Option<(usize, usize)>>, slot: usize, slab: usize, kt: Option<usize>, slot_of: &mut Vec<usize>, last_read: &[Option<usize>]| {
                    if let (Some(kt), Some(r)) = (kt, last_read[slot]) {
                        assert!(r < kt, "S={stages} nk={nk}: slot {slot} overwritten in iteration {kt} while read in {r}");
                    }
                    slot_of[slot] = slab;
                    g.push(Some((slot, slab)));
                };
                for st in 0..stages - 1 {
                    if st < nk {
                        load(&mut groups, st, st, None, &mut slot_of, &last_read);
                    } else {
                        groups.push(None);
                    }
                }
                for kt in 0..nk {
                    // wait_group(S - 2): all but the newest S - 2 groups are complete.
                    let complete = groups.len().saturating_sub(stages - 2);
                    let next = kt + stages - 1;
                    if next < nk {
                        load(&mut groups, next % stages, next, Some(kt), &mut slot_of, &last_read);
                    } else {
                        groups.push(None);
                    }
                    let slot = kt % stages;
                    assert_eq!(slot_of[slot], kt, "S={stages} nk={nk}: slot {slot} holds the wrong slab at {kt}");
                    let landed = groups[..complete].contains(&Some((slot, kt)));
                    assert!(landed, "S={stages} nk={nk}: slab {kt} read before its copy completed");
                    let in_flight = groups[complete..].iter().flatten().any(|&(s, _)| s == slot);
                    assert!(!in_flight, "S={stages} nk={nk}: slot {slot} read while a copy into it is in flight");
                    last_read[slot] = Some(kt);
                }
            }
        }
    }

    // ---- the wgmma rungs: swizzle, descriptors, tensor maps, the mbarrier ring (mirrors of gemm.cu) ----

    #[test]
    fn swizzle128_matches_the_xor_swizzle_of_the_mma_rungs_and_stays_in_its_atom() {
        // Rows of 128 bytes from a 1024-aligned base: TMA's 128-byte swizzle is swz(row, chunk, 8).
        for base in [0u32, 1024, 0x1_0400] {
            let mut seen = std::collections::BTreeSet::new();
            for row in 0..64usize {
                for chunk in 0..8usize {
                    let a = wg::swizzle128(base + (row * 128 + chunk * 16) as u32);
                    assert_eq!(a - base, swz(row, chunk, 8) as u32, "base {base} row {row} chunk {chunk}");
                    assert_eq!((a - base) / 1024, (row / 8) as u32, "left its 1024-byte atom");
                    assert!(seen.insert(a));
                }
            }
        }
        // Bytes inside a 16-byte chunk keep their order; a 512-aligned but not 1024-aligned base
        // would give a different pattern (why the ring is aligned to 1024).
        assert_eq!(wg::swizzle128(128 + 5), 128 + 16 + 5);
        assert_ne!(wg::swizzle128(512) - 512, wg::swizzle128(0));
    }

    #[test]
    fn wgmma_descriptor_bit_fields() {
        let field = |d: u64, lo: u32, bits: u32| (d >> lo) & ((1u64 << bits) - 1);
        let d = wg::desc(0x1_2340, wg::B_LBO, wg::B_SBO);
        assert_eq!(field(d, 0, 14), 0x1_2340 >> 4);
        assert_eq!(field(d, 16, 14), 8192 >> 4);
        assert_eq!(field(d, 32, 14), 1024 >> 4);
        assert_eq!(field(d, 49, 3), 0, "base offset: the ring is 1024-aligned");
        assert_eq!(field(d, 62, 2), 1, "swizzle mode 1 = 128 bytes");
        assert_eq!(d & !(0x3FFF | (0x3FFF << 16) | (0x3FFF << 32) | (3u64 << 62)), 0, "reserved bits set");
        let a = wg::desc(0x3_FFF0, wg::A_LBO, wg::A_SBO);
        assert_eq!((field(a, 0, 14), field(a, 16, 14), field(a, 32, 14)), (0x3FFF, 1, 64));
        assert_eq!(wg::desc(0, 0, 0), 1u64 << 62);
        // Every address of the 227 KiB window and every offset used fits its 14-bit field.
        assert!((wg::WIDE.smem() as u32 + 1024) >> 4 < 1 << 14 && wg::B_LBO >> 4 < 1 << 14);
        // Exactly the kernel's constants: 1024-byte atoms, 8 KiB B boxes.
        assert_eq!((wg::A_SBO, wg::B_SBO, wg::B_LBO, wg::A_K16_STEP, wg::B_K16_STEP), (1024, 1024, 8192, 32, 2048));
    }

    /// Decodes a descriptor and reads element (r, c) of the operand it describes as the PTX ISA's
    /// canonical 128-byte-swizzled layouts define them (in 16-byte units T):
    ///   K-major  ((8, m), (T, 2k)) : ((8T, SBO), (1, T))  rows of 128 bytes, 8-row groups SBO apart
    ///   MN-major ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))  64-element atoms LBO apart along MN,
    ///            8-row groups of K SBO apart
    /// `k_major`: (r, c) = (m, k) of A; else (k, n) of B.
    fn wgmma_operand_addr(desc: u64, k_major: bool, r: usize, c: usize) -> u32 {
        let start = ((desc & 0x3FFF) << 4) as u32;
        let lbo = (((desc >> 16) & 0x3FFF) << 4) as u32;
        let sbo = (((desc >> 32) & 0x3FFF) << 4) as u32;
        assert_eq!(desc >> 62, 1, "only the 128-byte swizzle is modelled");
        let (r, c) = (r as u32, c as u32);
        let addr = if k_major {
            assert!(c < 16);
            start + (r % 8) * 128 + (r / 8) * sbo + c * 2
        } else {
            assert!(r < 16);
            start + (c % 64) * 2 + (c / 64) * lbo + (r % 8) * 128 + (r / 8) * sbo
        };
        wg::swizzle128(addr)
    }

    /// One block of each wgmma rung on the CPU: TMA boxes written through the swizzle into a ring that
    /// starts at a 1024-aligned address (not 0), each consumer's four k16 wgmmas read through its
    /// descriptors, the accumulators stored through the m64nNk16 fragment layout. Every output must
    /// equal the tile product, and each must be stored by exactly one (consumer, thread, register).
    #[test]
    fn wgmma_blocks_reproduce_the_tile_product() {
        use wg::*;
        // The three tile widths (wgmma_n128_deep lays out its stages as wgmma_n128 does).
        for tile in [WIDE, N128, N64_DEEP] {
            let (bn, stage_bytes) = (tile.bn, tile.stage_bytes());
            let a = |r: usize, c: usize| ((r * 7 + c * 3) % 11) as f64 - 5.0;
            let b = |r: usize, c: usize| ((r * 5 + c * 2) % 13) as f64 - 6.0;
            let ring = 0x400u32 + 2 * stage_bytes as u32; // stage 2 of a ring at 1 KiB
            assert_eq!(0x400 % 1024, 0);
            let mut smem = vec![f64::NAN; (ring as usize + stage_bytes) / 2];
            let mut put = |addr: u32, v: f64| {
                assert_eq!(addr % 2, 0);
                let slot = &mut smem[(addr / 2) as usize];
                assert!(slot.is_nan(), "two elements at byte {addr}");
                *slot = v;
            };
            // TMA: A box (BK x BM), box row r = A row r, 128 bytes; B boxes j (B_BOX_N x BK) after A.
            for r in 0..BM {
                for c in 0..BK {
                    put(swizzle128(ring + (r * 128 + c * 2) as u32), a(r, c));
                }
            }
            let b0 = ring + (BM * BK * 2) as u32;
            for j in 0..bn / B_BOX_N {
                for r in 0..BK {
                    for c in 0..B_BOX_N {
                        put(swizzle128(b0 + (j * BK * B_BOX_N * 2 + r * 128 + c * 2) as u32), b(r, j * B_BOX_N + c));
                    }
                }
            }
            let at = |addr: u32| smem[(addr / 2) as usize];
            let mut out = vec![f64::NAN; BM * bn];
            for consumer in 0..2usize {
                let a_rows = ring + (consumer * 64 * BK * 2) as u32;
                let mut d = vec![0.0f64; 64 * bn]; // the warpgroup's 64 x BN accumulator, row-major
                for ks in 0..BK / 16 {
                    let da = desc(a_rows + A_K16_STEP * ks as u32, A_LBO, A_SBO);
                    let db = desc(b0 + B_K16_STEP * ks as u32, B_LBO, B_SBO);
                    for m in 0..64 {
                        for n in 0..bn {
                            let dot: f64 = (0..16).map(|k| at(wgmma_operand_addr(da, true, m, k)) * at(wgmma_operand_addr(db, false, k, n))).sum();
                            d[m * bn + n] += dot;
                        }
                    }
                }
                // Registers of thread (warp w, lane l): d[4j + h] at row 16w + l/4 + 8 (h / 2), column 8j + 2 (l % 4) + h % 2.
                for tid in 0..128 {
                    let (warp, lane) = (tid / 32, tid % 32);
                    for j in 0..bn / 8 {
                        for h in 0..4 {
                            let (row, col) = (warp * 16 + lane / 4 + 8 * (h / 2), 8 * j + 2 * (lane % 4) + h % 2);
                            let o = &mut out[(consumer * 64 + row) * bn + col];
                            assert!(o.is_nan(), "output ({row}, {col}) stored twice");
                            *o = d[row * bn + col];
                        }
                    }
                }
            }
            for r in 0..BM {
                for c in 0..bn {
                    let want: f64 = (0..BK).map(|k| a(r, k) * b(k, c)).sum();
                    assert_eq!(out[r * bn + c], want, "({r}, {c})");
                }
            }
        }
    }

    #[test]
    fn wgmma_tma_tensor_maps_and_shared_memory() {
        use wg::*;
        let (ta, tb) = tma_boxes(Dims::dense(1000, 1032, 776), 2);
        assert_eq!(ta, TmaBox { rank: 2, dims: [776, 1000, 1], strides_bytes: [1552, 0], boxes: [64, 128, 1] });
        assert_eq!(tb, TmaBox { rank: 2, dims: [1032, 776, 1], strides_bytes: [2064, 0], boxes: [64, 64, 1] });
        // Padded leading dimensions are strides, never sizes.
        let (ta, tb) = tma_boxes(Dims { m: 3, n: 5, k: 7, lda: 16, ldb: 24, ldc: 5 }, 2);
        assert_eq!((ta.dims, ta.row_stride_bytes(), tb.dims, tb.row_stride_bytes()), ([7, 3, 1], 32, [5, 7, 1], 48));
        for t in [ta, tb] {
            assert_eq!(t.boxes[0] as usize * 2, 128, "a 128-byte swizzle takes boxes of at most 128 bytes along the row");
            assert!(t.boxes.iter().all(|&x| (1..=256).contains(&x)));
        }
        // The transaction bytes the producer expects per stage are the boxes it issues.
        let box_bytes = |t: TmaBox| t.boxes[0] as usize * t.boxes[1] as usize * 2;
        for tile in [WIDE, N128, N128_DEEP, N64_DEEP] {
            let bn = tile.bn;
            assert_eq!(box_bytes(ta) + (bn / B_BOX_N) * box_bytes(tb), tile.stage_bytes());
            // At the N edge the producer issues only the B boxes that reach inside N (gemm.cu:
            // b_boxes = min(BN / 64, ceil((N - bn) / 64))) and expects their bytes alone: every
            // column < N of the tile is loaded, and no box starts at or past N.
            for n in [1usize, 8, 64, 65, 128, 136, 256, 264, 520, 1000, 1032, 4096] {
                for b0 in (0..n).step_by(bn) {
                    let boxes = (bn / B_BOX_N).min((n - b0).div_ceil(B_BOX_N));
                    assert!(b0 + boxes * B_BOX_N >= n.min(b0 + bn), "BN={bn} N={n} bn={b0}: columns left unloaded");
                    assert!(b0 + (boxes - 1) * B_BOX_N < n, "BN={bn} N={n} bn={b0}: a box wholly outside N");
                    assert!(box_bytes(ta) + boxes * box_bytes(tb) <= tile.stage_bytes());
                }
            }
            // The blocks an SM holds fit its 228 KiB (each block also costs 1 KiB the system
            // reserves), and one more stage would not.
            let per_sm = |stages: usize| tile.blocks_per_sm * (Tile { stages, ..tile }.smem() + 1024);
            assert!(per_sm(tile.stages) <= 228 * 1024 && per_sm(tile.stages + 1) > 228 * 1024, "{tile:?}");
            // Registers: ptxas's limit for the launch shape leaves room for the BN / 2 accumulators.
            assert!(65536 / (tile.threads() as usize * tile.blocks_per_sm) >= bn / 2 + 24, "{tile:?}");
        }
        assert_eq!((WIDE.stage_bytes(), N128.stage_bytes()), (49152, 32768));
        assert_eq!((dynamic_smem("wgmma_tma"), dynamic_smem("wgmma_n128")), (197696, 99376));
        // Which of the experiment's odd shapes it takes: K and N multiples of 8.
        for ((m, n, k), takes) in [((1000, 1000, 1000), true), ((4097, 513, 777), false), ((130, 260, 72), false), ((300, 520, 96), true), ((300, 520, 320), true), ((1, 4097, 777), false), ((130, 264, 72), true), ((1, 1032, 776), true), ((8192, 8192, 8192), true)] {
            let why = not_applicable("wgmma_tma", Dims::dense(m, n, k));
            assert_eq!(why.is_none(), takes, "{m}x{n}x{k}: {why:?}");
            let (ta, tb) = tma_boxes(Dims::dense(m, n, k), 2);
            assert_eq!(ta.row_stride_bytes().is_multiple_of(16) && tb.row_stride_bytes().is_multiple_of(16), takes, "{m}x{n}x{k}");
        }
        assert_eq!(not_applicable("wgmma_tma", Dims::dense(4097, 513, 777)).unwrap(), "TMA needs row strides that are multiples of 16 bytes (8 elements); K = 777 and N = 513 are not");
        assert_eq!(not_applicable("wgmma_tma", Dims { m: 2, n: 8, k: 8, lda: 12, ldb: 8, ldc: 8 }).unwrap(), "TMA needs row strides that are multiples of 16 bytes (8 elements); lda = 12 is not");
        assert_eq!(not_applicable("mma_warp64", Dims::dense(4097, 513, 777)), None);
        // Offered on compute capability 9.0 only: not 8.x, not 10.x.
        for (arch, offered) in [(80, false), (89, false), (90, true), (100, false), (120, false)] {
            assert_eq!(applies("wgmma_tma", Dims::dense(1024, 1024, 1024), 227 * 1024, arch), offered, "sm_{arch}");
        }
        assert!(applies("mma_warp64_wide", Dims::dense(1024, 1024, 1024), 227 * 1024, 80));
        assert_eq!(crate::gpu::compile::Target::for_device(90).gpu_architecture(), "compute_90a");
        assert_eq!(crate::gpu::compile::Target::for_device(80).gpu_architecture(), "compute_80");
        assert_eq!(crate::gpu::compile::Target::for_device(100).gpu_architecture(), "compute_100");
        assert_eq!("90a".parse::<crate::gpu::compile::Target>().unwrap(), crate::gpu::compile::Target { arch: 90, specific: true });
        assert!("sm90".parse::<crate::gpu::compile::Target>().is_err());
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(std::mem::align_of::<TensorMap>() % 64, 0);
    }

    /// wgmma_tma's ring under random interleavings of the producer, the TMA engine and the eight
    /// consumer warps, with mbarrier semantics: a phase completes when its arrivals (and, for
    /// full[s], its transaction bytes) are in; try_wait.parity(p) succeeds when the number of
    /// completed phases n has n % 2 != p. Every read must find its tile landed in its slot, no
    /// TMA may overwrite a slot a warp may still read (wgmma groups in flight included).
    #[test]
    fn wgmma_tma_mbarrier_ring_has_no_hazards() {
        use rand::SeedableRng;
        const WARPS: usize = 8;
        for stages in [2usize, 3, 4] {
            for nk in [1usize, 2, 3, 4, 5, 7, 9, 13] {
                for seed in 0..60u64 {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + nk as u64 * 10 + stages as u64);
                    // (completed phases, arrivals in the current phase)
                    let mut full = vec![(0usize, 0usize); stages];
                    let mut empty = vec![(0usize, 0usize); stages];
                    let mut slot: Vec<Option<(usize, bool)>> = vec![None; stages]; // (tile, landed)
                    let mut in_flight: Vec<usize> = Vec::new(); // slots with a TMA under way
                    let mut producer = 0usize;
                    let mut warp_kt = [0usize; WARPS];
                    let mut reading: Vec<Vec<usize>> = vec![Vec::new(); WARPS]; // tiles whose wgmma may still read
                    let wait_ok = |b: (usize, usize), parity: usize| b.0 % 2 != parity;
                    let mut steps = 0;
                    while producer < nk || warp_kt.iter().any(|&k| k < nk) || !in_flight.is_empty() {
                        steps += 1;
                        assert!(steps < 100_000, "S={stages} nk={nk}: deadlock");
                        match rng.random_range(0..WARPS + 2) {
                            0 if producer < nk => {
                                let kt = producer;
                                let s = kt % stages;
                                if wait_ok(empty[s], ((kt / stages) & 1) ^ 1) {
                                    for (w, r) in reading.iter().enumerate() {
                                        assert!(!r.iter().any(|&t| t % stages == s), "S={stages} nk={nk}: tile {kt} overwrites slot {s} while warp {w} may read it");
                                    }
                                    slot[s] = Some((kt, false));
                                    full[s].1 += 1; // arrive.expect_tx: the arrival is in, the bytes are not
                                    in_flight.push(s);
                                    producer += 1;
                                }
                            }
                            1 if !in_flight.is_empty() => {
                                let s = in_flight.remove(rng.random_range(0..in_flight.len()));
                                slot[s].as_mut().unwrap().1 = true;
                                assert_eq!(full[s].1, 1);
                                full[s] = (full[s].0 + 1, 0); // bytes landed: the phase completes
                            }
                            w if w >= 2 => {
                                let w = w - 2;
                                let kt = warp_kt[w];
                                if kt < nk {
                                    let s = kt % stages;
                                    if wait_ok(full[s], (kt / stages) & 1) {
                                        assert_eq!(slot[s], Some((kt, true)), "S={stages} nk={nk}: warp {w} reads tile {kt} from slot {s}");
                                        reading[w].push(kt);
                                        // wait_group 1: tile kt - 1's group is done; arrive on its empty barrier.
                                        if kt > 0 {
                                            reading[w].retain(|&t| t != kt - 1);
                                            let e = &mut empty[(kt - 1) % stages];
                                            e.1 += 1;
                                            if e.1 == WARPS {
                                                *e = (e.0 + 1, 0);
                                            }
                                        }
                                        warp_kt[w] += 1;
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    // ---- mma_warp64(_wide, _k64): 64-byte A rows (swz64) or 128-byte ones (swz), precomputed
    // lane and loader offsets ----

    /// swz64() of gemm.cu: byte offset of chunk `chunk` (0..3) of row `row`, 64-byte rows.
    fn swz64(row: usize, chunk: usize) -> usize {
        let line = row >> 1;
        (line * 8 + ((((row & 1) << 2) | chunk) ^ (line & 7))) * 16
    }

    /// swz_a<BK>() of gemm.cu: the A slab layout for BK = 32 (64-byte rows) or 64 (128-byte rows).
    fn swz_a(bk: usize, row: usize, chunk: usize) -> usize {
        if bk == 32 { swz64(row, chunk) } else { swz(row, chunk, bk / 8) }
    }

    /// The tile shapes: (BM, BN, BK, warps along M, warps along N, stages), as the kernels instantiate them.
    const W64_SHAPES: [(usize, usize, usize, usize, usize, usize); 3] = [(128, 128, 32, 2, 2, 4), (128, 256, 32, 2, 4, 5), (128, 256, 64, 2, 4, 4)];

    #[test]
    fn warp64_shared_memory_matches_the_launcher() {
        for ((bm, bn, bk, _, _, stages), v) in W64_SHAPES.into_iter().zip(["mma_warp64", "mma_warp64_wide", "mma_warp64_k64"]) {
            assert_eq!(dynamic_smem(v), stages * (bm * bk + bk * bn) * 2, "{v}");
            assert!(dynamic_smem(v) <= 227 * 1024, "{v} must fit H100's 227 KiB per block");
        }
        assert_eq!(dynamic_smem("mma_warp64_k64"), 196608);
    }

    #[test]
    fn swz64_is_a_bijection_and_conflict_free_for_ldmatrix_and_cp_async() {
        let rows = 128;
        let mut seen = vec![false; rows * 4];
        for r in 0..rows {
            for c in 0..4 {
                let off = swz64(r, c);
                // Rows 2l and 2l + 1 share 128-byte line l and nothing leaves it.
                assert_eq!(off / 128, r / 2, "row {r} chunk {c} left its line");
                assert!(!std::mem::replace(&mut seen[off / 16], true), "two chunks at one place");
            }
        }
        // 16-byte slots modulo 128 bytes: 8 distinct slots cover all 32 banks once.
        let distinct = |offs: &[usize]| -> usize {
            let mut s: Vec<usize> = offs.iter().map(|o| (o % 128) / 16).collect();
            s.sort();
            s.dedup();
            s.len()
        };
        for r0 in (0..rows).step_by(8) {
            for c in 0..4 {
                // One ldmatrix phase: 8 consecutive rows from a multiple of 8, one logical chunk.
                let phase: Vec<usize> = (r0..r0 + 8).map(|r| swz64(r, c)).collect();
                assert_eq!(distinct(&phase), 8, "ldmatrix phase at rows {r0}.., chunk {c} conflicts");
            }
            // One warp of cp.async writes: 32 consecutive chunks = 8 rows x 4 chunks = 4 lines,
            // each line written whole (one 128-byte wavefront per line).
            let mut per_line = std::collections::BTreeMap::<usize, Vec<usize>>::new();
            for r in r0..r0 + 8 {
                for c in 0..4 {
                    per_line.entry(swz64(r, c) / 128).or_default().push(swz64(r, c));
                }
            }
            assert_eq!(per_line.len(), 4);
            assert!(per_line.values().all(|offs| distinct(offs) == 8));
        }
        // Without the XOR, 8 rows of 64 bytes fall on 2 slots (a 4-way conflict): the test can tell.
        let plain: Vec<usize> = (0..8).map(|r: usize| r * 64).collect();
        assert_eq!(distinct(&plain), 2);
    }

    #[test]
    fn warp64_fragment_addressing_reproduces_the_tile_product() {
        for (bm, bn, bk, _, _, _) in W64_SHAPES {
            let b_cpr = bn / 8;
            let a_off = move |r: usize, c: usize| swz_a(bk, r, c / 8) / 2 + c % 8;
            let b_off = move |r: usize, c: usize| swz(r, c / 8, b_cpr) / 2 + c % 8;
            check_simulation("mma_warp64", (bm, bn, bk), (64, 64), &a_off, &b_off, (bm * bk).max(bk * bn));
        }
    }

    /// The kernel does not call swz64()/swz() per ldmatrix or per cp.async: it keeps one lane (or
    /// thread) offset and derives the rest by XOR and constant strides. Every derived offset must
    /// equal the direct formula, and the loader must write each chunk of a slab exactly once.
    #[test]
    fn warp64_precomputed_offsets_match_the_swizzle() {
        for (bm, bn, bk, warps_m, warps_n, _) in W64_SHAPES {
            let threads = 32 * warps_m * warps_n;
            let (a_cpr, b_cpr) = (bk / 8, bn / 8);
            let (a_row_bytes, a_bytes) = (bk * 2, bm * bk * 2);
            let (a_rows_step, b_rows_step) = (threads / a_cpr, threads / b_cpr);
            let a_period = if bk == 32 { 16 } else { 8 };
            assert!(a_rows_step % a_period == 0 && b_rows_step % 8 == 0);
            for warp in 0..warps_m * warps_n {
                let (wm, wn) = ((warp / warps_n) * 64, (warp % warps_n) * 64);
                for lane in 0..32 {
                    let a_lane = swz_a(bk, wm + lane % 16, lane / 16);
                    let b_lane = a_bytes + swz(lane % 16, wn / 8 + lane / 16, b_cpr);
                    for ks in 0..bk / 16 {
                        for i in 0..4 {
                            let direct = swz_a(bk, wm + i * 16 + lane % 16, ks * 2 + lane / 16);
                            assert_eq!((a_lane ^ (ks * 32)) + i * 16 * a_row_bytes, direct, "A {bm}x{bn}x{bk} warp {warp} lane {lane} ks {ks} i {i}");
                        }
                        for jp in (0..8).step_by(2) {
                            let direct = a_bytes + swz(ks * 16 + lane % 16, (wn + jp * 8) / 8 + lane / 16, b_cpr);
                            assert_eq!((b_lane ^ (jp * 16)) + ks * 16 * bn * 2, direct, "B {bm}x{bn}x{bk} warp {warp} lane {lane} ks {ks} jp {jp}");
                        }
                    }
                }
            }
            let mut a_seen = vec![0; bm * a_cpr];
            let mut b_seen = vec![0; bk * b_cpr];
            for tid in 0..threads {
                let (a_row, a_ch, b_row, b_ch) = (tid / a_cpr, tid % a_cpr, tid / b_cpr, tid % b_cpr);
                for i in 0..bm / a_rows_step {
                    let off = swz_a(bk, a_row, a_ch) + i * a_rows_step * a_row_bytes;
                    assert_eq!(off, swz_a(bk, a_row + i * a_rows_step, a_ch));
                    a_seen[off / 16] += 1;
                }
                for i in 0..bk / b_rows_step {
                    let off = swz(b_row, b_ch, b_cpr) + i * b_rows_step * bn * 2;
                    assert_eq!(off, swz(b_row + i * b_rows_step, b_ch, b_cpr));
                    b_seen[off / 16] += 1;
                }
            }
            assert!(a_seen.iter().chain(&b_seen).all(|&x| x == 1), "{bm}x{bn}x{bk}: a slab chunk written twice or never");
            // The serpentine mma order still visits every (i, j) accumulator once per step.
            let mut hits = [[0; 8]; 4];
            for (i, row) in hits.iter_mut().enumerate() {
                for jj in 0..8 {
                    row[if i & 1 == 1 { 7 - jj } else { jj }] += 1;
                }
            }
            assert!(hits.iter().flatten().all(|&x| x == 1));
        }
    }

    /// mma_warp64's ring, replayed with its schedule. Prologue: slabs 0..S-1 into slots 0..S-1, one
    /// group each; wait_group(S-1), barrier, ldmatrix step 0 of slab 0. Iteration kt: ldmatrix
    /// steps 1..KS-1 of slab kt (KS = BK / 16: 2, or 4 for mma_warp64_k64); wait_group(S-2);
    /// barrier; cp.async slab kt+S into slot kt % S, commit; ldmatrix step 0 of slab kt+1. Every
    /// ldmatrix must read a slab whose copy completed before a barrier that precedes the read, from
    /// the slot that holds it, with no copy into that slot in flight; every copy into a slot must
    /// follow a barrier that follows every read of its previous slab.
    #[test]
    fn warp64_ring_schedule_has_no_hazards() {
        for (stages, steps) in [2usize, 3, 4, 5].into_iter().flat_map(|s| [(s, 2usize), (s, 4)]) {
            for nk in [1usize, 2, 3, 4, 5, 6, 7, 13] {
                let mut groups: Vec<Option<(usize, usize)>> = Vec::new(); // (slot, slab) per commit
                let mut slot_of = vec![usize::MAX; stages];
                let mut barriers = 0usize; // barriers so far
                let mut visible = 0usize; // groups[..visible] completed before the latest barrier
                let mut last_read_epoch = vec![None::<usize>; stages]; // barrier count at the last read
                let mut reads = vec![0usize; nk];
                let mut read = |slab: usize, groups: &[Option<(usize, usize)>], slot_of: &[usize], visible: usize, barriers: usize, lr: &mut Vec<Option<usize>>| {
                    let slot = slab % stages;
                    assert_eq!(slot_of[slot], slab, "S={stages} nk={nk}: slot {slot} does not hold slab {slab}");
                    assert!(groups[..visible].contains(&Some((slot, slab))), "S={stages} nk={nk}: slab {slab} read before it is visible");
                    assert!(!groups[visible..].iter().flatten().any(|&(s, _)| s == slot), "S={stages} nk={nk}: slot {slot} read while a copy into it is in flight");
                    lr[slot] = Some(barriers);
                    reads[slab] += 1;
                };
                let copy = |slot: usize, slab: usize, groups: &mut Vec<Option<(usize, usize)>>, slot_of: &mut Vec<usize>, barriers: usize, lr: &[Option<usize>]| {
                    if let Some(e) = lr[slot] {
                        assert!(e < barriers, "S={stages} nk={nk}: slot {slot} overwritten before a barrier after its last read");
                    }
                    slot_of[slot] = slab;
                    groups.push(Some((slot, slab)));
                };
                for s in 0..stages {
                    if s < nk {
                        copy(s, s, &mut groups, &mut slot_of, barriers, &last_read_epoch);
                    } else {
                        groups.push(None);
                    }
                }
                // wait_group(n): all but the newest n groups complete; the barrier publishes them.
                let wait_and_barrier = |groups: &[Option<(usize, usize)>], n: usize, barriers: &mut usize, visible: &mut usize| {
                    *visible = groups.len().saturating_sub(n);
                    *barriers += 1;
                };
                wait_and_barrier(&groups, stages - 1, &mut barriers, &mut visible);
                read(0, &groups, &slot_of, visible, barriers, &mut last_read_epoch); // step 0 of slab 0
                for kt in 0..nk {
                    for _step in 1..steps {
                        read(kt, &groups, &slot_of, visible, barriers, &mut last_read_epoch); // steps 1..KS-1 of slab kt
                    }
                    wait_and_barrier(&groups, stages - 2, &mut barriers, &mut visible);
                    if kt + stages < nk {
                        copy(kt % stages, kt + stages, &mut groups, &mut slot_of, barriers, &last_read_epoch);
                    } else {
                        groups.push(None);
                    }
                    if kt + 1 < nk {
                        read(kt + 1, &groups, &slot_of, visible, barriers, &mut last_read_epoch); // step 0 of slab kt+1
                    }
                }
                assert!(reads.iter().all(|&r| r == steps), "S={stages} nk={nk}: each slab is read at all {steps} k16 steps: {reads:?}");
            }
        }
    }

    // ---- mma_warp64_tma: k64's warps and loop on wgmma_tma's TMA stage layout ----

    /// The TMA stage as the kernel reads it: A one box of 128 rows x 128 bytes, B four boxes of 64
    /// k-rows x 128 bytes, each 128-byte swizzled from its own start (swz(row, chunk, 8)). The
    /// lane offsets and strides of mma_warp64_tma_body must address the same bytes as the direct
    /// formula, and the fragments read through them must give the tile product.
    #[test]
    fn warp64_tma_fragment_addressing_reproduces_the_tile_product() {
        let a_bytes = wg::BM * wg::BK * 2;
        let box_bytes = wg::BK * wg::B_BOX_N * 2;
        assert_eq!(a_bytes + 4 * box_bytes, wg::WIDE.stage_bytes());
        let a_off = |r: usize, c: usize| swz(r, c / 8, 8) / 2 + c % 8;
        let b_off = |r: usize, c: usize| (c / 64) * box_bytes / 2 + swz(r, (c % 64) / 8, 8) / 2 + c % 8;
        check_simulation("mma_warp64_tma", (128, 256, 64), (64, 64), &a_off, &b_off, 256 * 64);
        for warp in 0..8 {
            let (wm, wn) = ((warp / 4) * 64, (warp % 4) * 64);
            for lane in 0..32 {
                let a_lane = swz(wm + lane % 16, lane / 16, 8);
                let b_lane = a_bytes + (wn / 64) * box_bytes + swz(lane % 16, lane / 16, 8);
                for ks in 0..4 {
                    for i in 0..4 {
                        let (row, col) = (wm + i * 16 + lane % 16, ks * 16 + (lane / 16) * 8);
                        assert_eq!((a_lane ^ (ks * 32)) + i * 16 * 128, 2 * a_off(row, col), "A warp {warp} lane {lane} ks {ks} i {i}");
                    }
                    for jp in (0..8).step_by(2) {
                        let (row, col) = (ks * 16 + lane % 16, wn + jp * 8 + (lane / 16) * 8);
                        assert_eq!((b_lane ^ (jp * 16)) + ks * 16 * 128, a_bytes + 2 * b_off(row, col), "B warp {warp} lane {lane} ks {ks} jp {jp}");
                    }
                }
            }
        }
        assert_eq!(dynamic_smem("mma_warp64_tma"), dynamic_smem("wgmma_tma"));
        // B as one 3D box per slab: element (column c, row k, block j) of the box at coordinates
        // (0, k0, bn / 64) is B[k0 + k][bn + 64 j + c] in global memory (the strides), and lands
        // where the 2D box j puts B[k0 + k][bn + 64 j + c] in shared memory (the box order:
        // innermost first).
        let d = Dims { m: 256, n: 1000, k: 320, lda: 320, ldb: 1024, ldc: 1000 };
        let b3 = wg::tma_b_3d(d, 2).expect("ceil(1000 / 64) * 64 = 1024 <= ldb");
        assert_eq!((b3.rank, b3.dims, b3.strides_bytes, b3.boxes), (3, [64, 320, 16], [2048, 128], [64, 64, 4]));
        let (k0, bn) = (128usize, 512usize);
        for (c, k, j) in [(0usize, 0usize, 0usize), (5, 7, 1), (63, 63, 3), (17, 40, 2)] {
            let global = (k0 + k) as u64 * b3.strides_bytes[0] + (bn / 64 + j) as u64 * b3.strides_bytes[1] + 2 * c as u64;
            assert_eq!(global, 2 * ((k0 + k) * d.ldb + bn + 64 * j + c) as u64);
            let smem_3d = ((j * b3.boxes[1] as usize + k) * b3.boxes[0] as usize + c) * 2;
            assert_eq!(smem_3d, j * box_bytes + k * 128 + 2 * c, "not the 2D boxes' layout");
        }
        // Dense B with N % 64 != 0: a partial last block would read past the rows, so 2D boxes.
        assert!(wg::tma_b_3d(Dims::dense(256, 1000, 320), 2).is_none());
        assert!(wg::tma_b_3d(Dims::dense(8192, 8192, 8192), 2).is_some());
        assert!(wg::tma_b_3d(Dims::dense(130, 320, 104), 2).is_some(), "the gate that puts the 3D boxes' edges under the check");
        for (arch, offered) in [(80, false), (90, true), (100, false)] {
            assert_eq!(applies("mma_warp64_tma", Dims::dense(1024, 1024, 1024), 227 * 1024, arch), offered, "sm_{arch}");
        }
        assert!(not_applicable("mma_warp64_tma", Dims::dense(4097, 513, 777)).is_some());
    }

    /// mma_warp64_tma's ring, replayed with its schedule. Prologue: warp 0 issues slabs 0..S-1
    /// into slots 0..S-1; every thread waits on full[0] (parity 0), reads step 0 of slab 0.
    /// Iteration kt: steps 1..3 of slab kt; wait on full[kt + 1] with parity ((kt + 1) / S) & 1;
    /// barrier; warp 0 issues slab kt + S into slot kt % S; step 0 of slab kt + 1. The copy
    /// engine completes copies at any later time, in any order. A wait passes only once the
    /// slot's phase of that parity has completed (try_wait.parity: the barrier's completed-phase
    /// count has the other parity), and must then find its own slab there, never one a lap
    /// ahead; no copy may land in a slot a warp read after the latest barrier.
    #[test]
    fn warp64_tma_ring_schedule_has_no_hazards() {
        use rand::rngs::StdRng;
        use rand::SeedableRng;
        const S: usize = 4;
        /// Slots' completed phases and slabs, the copies issued and not landed, and which slots a
        /// warp read since the latest barrier.
        struct Ring {
            phases: [usize; S],
            slab_in: [usize; S],
            pending: Vec<(usize, usize)>,
            read_since_barrier: [bool; S],
        }
        impl Ring {
            fn land(&mut self, rng: &mut StdRng, all: bool) {
                while !self.pending.is_empty() && (all || rng.random_bool(0.5)) {
                    let (slot, slab) = self.pending.remove(rng.random_range(0..self.pending.len()));
                    assert!(!self.read_since_barrier[slot], "slab {slab} landed in slot {slot} while a warp may read it");
                    self.slab_in[slot] = slab;
                    self.phases[slot] += 1;
                }
            }
            // Polls until the phase completes, the copy engine progressing meanwhile.
            fn wait(&mut self, rng: &mut StdRng, slab: usize) {
                let (slot, parity) = (slab % S, (slab / S) & 1);
                while self.phases[slot] & 1 == parity {
                    assert!(self.pending.iter().any(|&(s, _)| s == slot), "waiting on slab {slab}, never issued");
                    self.land(rng, false);
                }
                assert_eq!(self.slab_in[slot], slab, "the wait for slab {slab} passed on another slab");
            }
            fn read(&mut self, slab: usize) {
                assert_eq!(self.slab_in[slab % S], slab, "slab {slab} is not in its slot");
                self.read_since_barrier[slab % S] = true;
            }
        }
        for nk in [1usize, 2, 3, 4, 5, 6, 9, 13] {
            for seed in 0..50u64 {
                let mut rng = StdRng::seed_from_u64(seed * 100 + nk as u64);
                let mut r = Ring { phases: [0; S], slab_in: [usize::MAX; S], pending: (0..nk.min(S)).map(|kt| (kt, kt)).collect(), read_since_barrier: [false; S] };
                r.wait(&mut rng, 0);
                r.read(0); // step 0 of slab 0
                for kt in 0..nk {
                    r.read(kt); // steps 1..3
                    if kt + 1 < nk {
                        r.wait(&mut rng, kt + 1);
                    }
                    r.read_since_barrier = [false; S]; // the block barrier
                    if kt + S < nk {
                        r.pending.push(((kt + S) % S, kt + S));
                    }
                    r.land(&mut rng, false);
                    if kt + 1 < nk {
                        r.read(kt + 1); // step 0 of slab kt + 1
                    }
                }
                r.land(&mut rng, true);
                assert_eq!(r.phases.iter().sum::<usize>(), nk, "nk={nk}: every slab copied once");
            }
        }
    }

    /// mma_warp64_tail_split's plan: every (tile, slab) is computed by exactly one block, no block
    /// is empty, only the tiles past the last whole wave are split (slices of >= 4 slabs), and a
    /// split is chosen only where the model says it ends sooner than one more wave of whole tiles.
    #[test]
    fn tail_plan_covers_every_slab_once_and_splits_only_the_last_wave() {
        let shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 11008, 4096), (4096, 14336, 4096), (4096, 4096, 11008), (128, 4096, 4096), (16, 4096, 11008), (1000, 1000, 1000), (2100, 2040, 4072), (1, 1032, 776), (130, 320, 104), (1, 8, 8)];
        for sms in [132, 114, 78, 1] {
            for (m, n, k) in shapes {
                let d = Dims::dense(m, n, k);
                let (p, nk) = (tail_plan(d, sms), k.div_ceil(64));
                let tiles = m.div_ceil(128) * n.div_ceil(256);
                assert_eq!(p.tiles, tiles);
                let what = format!("{m}x{n}x{k} on {sms} SMs: {p:?}");
                if p.slices == 1 {
                    assert_eq!((p.dp_tiles, p.blocks()), (tiles, tiles), "{what}");
                } else {
                    assert!(p.dp_tiles.is_multiple_of(sms) && p.split_tiles() == tiles % sms && p.split_tiles() > 0, "{what}");
                    assert!(nk.div_ceil(p.slices) >= 4 && p.slices <= 16, "{what}");
                }
                let mut seen = vec![0u8; tiles * nk];
                for b in 0..p.blocks() {
                    let (t, kb, len) = p.unit(b, nk);
                    assert!(t < tiles && len > 0 && kb + len <= nk, "{what}: block {b} -> {t} {kb}+{len}");
                    assert!(b < p.dp_tiles || t >= p.dp_tiles, "{what}: block {b} splits a whole-wave tile");
                    seen[t * nk + kb..t * nk + kb + len].iter_mut().for_each(|x| *x += 1);
                }
                assert!(seen.iter().all(|&x| x == 1), "{what}");
            }
        }
        let plan = |m, n, k| {
            let p = tail_plan(Dims::dense(m, n, k), 132);
            (p.dp_tiles, p.slices)
        };
        // 8192^3: 15 whole waves, the last 68 tiles in 3 slices of 43 slabs (2 waves of them).
        assert_eq!(plan(8192, 8192, 8192), (1980, 3));
        assert_eq!(plan(4096, 11008, 4096), (1320, 2));
        assert_eq!(plan(128, 4096, 4096), (0, 5));
        // The gate: a whole wave and 4 tiles in 5 slices.
        assert_eq!(plan(2100, 2040, 4072), (132, 5));
        // 4096^3 (116 of 132 SMs busy in the last wave) and 4096 x 14336 x 4096 (76): no split
        // beats a last wave of whole tiles.
        assert_eq!(plan(4096, 4096, 4096), (512, 1));
        assert_eq!(plan(4096, 14336, 4096), (1792, 1));
    }

    /// The tile loaders of the pipelined kernel write every chunk of a stage exactly once, and the
    /// grouped block order visits every (row, column) tile exactly once.
    #[test]
    fn pipelined_loads_and_block_order_cover_everything_once() {
        for (bm, bn) in [(128, 128), (128, 256)] {
            let (a_cpr, b_cpr) = (8, bn / 8);
            let mut a_seen = vec![0; bm * a_cpr];
            let mut b_seen = vec![0; 64 * b_cpr];
            for tid in 0..256 {
                for i in 0..bm * a_cpr / 256 {
                    let c = tid + i * 256;
                    a_seen[swz(c / a_cpr, c % a_cpr, a_cpr) / 16] += 1;
                }
                for i in 0..64 * b_cpr / 256 {
                    let c = tid + i * 256;
                    b_seen[swz(c / b_cpr, c % b_cpr, b_cpr) / 16] += 1;
                }
            }
            assert!(a_seen.iter().chain(&b_seen).all(|&x| x == 1));
            for (m, n) in [(1usize, 1usize), (4097, 513), (1000, 1000), (8192, 8192), (16, 14336)] {
                let (gm, gn) = (m.div_ceil(bm), n.div_ceil(bn));
                let mut seen = vec![0; gm * gn];
                for pid in 0..gm * gn {
                    let per_group = 8 * gn;
                    let first = (pid / per_group) * 8;
                    let rows = (gm - first).min(8);
                    let (r, c) = (first + (pid % per_group) % rows, (pid % per_group) / rows);
                    assert!(r < gm && c < gn, "{m}x{n}: pid {pid} -> ({r}, {c})");
                    seen[r * gn + c] += 1;
                }
                assert!(seen.iter().all(|&x| x == 1), "{m}x{n} ({bm}x{bn})");
            }
        }
    }
}

/// TEMPORARY until the table lands.
pub fn variants() -> Vec<crate::ops::variant::VariantInfo> {
    Vec::new()
}
