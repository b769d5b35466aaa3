//! The TMA rungs' side of the host: the wgmma tiles and descriptor constants the kernels use,
//! each operand's tensor-map geometry, and the encoded maps (cached: encoding is a driver call,
//! kept out of the timed launches).

use super::variants::{Config, Kind};
use super::Dims;
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::DType;
use crate::ops::Elem;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};
use std::sync::Mutex;

/// The wgmma rungs' block tiles and rings, as `WgTile` in kernels/gemm/wgmma.cu states them, and the descriptor
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

    /// The 64-bit shared-memory matrix descriptor of wgmma (wg_desc in kernels/common.cuh): bits 0-13 the
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
    /// ranks 3 and 4: one or two more). Entries past the rank are 1 (sizes, boxes) or 0 (strides).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct TmaBox {
        pub rank: usize,
        pub dims: [u64; 4],
        pub strides_bytes: [u64; 3],
        pub boxes: [u32; 4],
    }

    impl TmaBox {
        fn rank2(dims: [u64; 2], row_stride_bytes: u64, boxes: [u32; 2]) -> Self {
            TmaBox { rank: 2, dims: [dims[0], dims[1], 1, 1], strides_bytes: [row_stride_bytes, 0, 0], boxes: [boxes[0], boxes[1], 1, 1] }
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
            dims: [B_BOX_N as u64, d.k as u64, blocks as u64, 1],
            strides_bytes: [(d.ldb * elem) as u64, (B_BOX_N * elem) as u64, 0],
            boxes: [B_BOX_N as u32, BK as u32, (WIDE.bn / B_BOX_N) as u32, 1],
        })
    }
}

/// A CUtensorMap as a kernel parameter (`const __grid_constant__ TmaDesc`, kernels/mma.cuh): 128
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
        DType::F32 => return Err(LabError::Invalid("the TMA rungs run in f16 and bf16 only".into())),
    };
    let strides = &b.strides_bytes[..b.rank - 1];
    if !ptr.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(16)) {
        return Err(LabError::Invalid(format!("TMA needs 16-byte aligned rows: base {ptr:#x}, strides {strides:?} bytes")));
    }
    let mut map = std::mem::MaybeUninit::<cudarc::driver::sys::CUtensorMap>::zeroed();
    let element_strides = [1u32; 4];
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

/// A TMA rung's tensor maps, and the rank of B's.
#[derive(Clone, Copy)]
pub struct TmaMaps {
    pub a: TensorMap,
    pub b: TensorMap,
    pub b_rank: i32,
}

/// What a set of maps was encoded for: the operands' addresses and geometry (a map holds nothing
/// else, so a buffer reallocated at the same address with the same shape reuses it correctly).
#[derive(Clone, Copy, PartialEq, Eq)]
struct MapKey {
    a: u64,
    b: u64,
    d: Dims,
    dtype: DType,
    b_3d: bool,
}

/// The maps encoded last, newest at the end.
static MAPS: Mutex<Vec<(MapKey, TmaMaps)>> = Mutex::new(Vec::new());
const MAPS_KEPT: usize = 16;

/// The tensor maps of A and B for a TMA rung; the mma.sync ones take B as one 3D box per slab
/// where [`wg::tma_b_3d`] offers it, and the rank of B's map (2 or 3) tells the kernel which.
pub fn tensor_maps<T: Elem>(gpu: &Gpu, config: &Config, d: Dims, a: &CudaSlice<T>, b: &CudaSlice<T>) -> Result<TmaMaps> {
    let b_3d = matches!(config.kind, Kind::MmaTma | Kind::TailSplit);
    let (pa, _ga) = a.device_ptr(&gpu.stream);
    let (pb, _gb) = b.device_ptr(&gpu.stream);
    let key = MapKey { a: pa, b: pb, d, dtype: T::DTYPE, b_3d };
    let mut cache = MAPS.lock().expect("tensor map cache poisoned");
    if let Some((_, maps)) = cache.iter().find(|(k, _)| *k == key) {
        return Ok(*maps);
    }
    let (ba, mut bb) = wg::tma_boxes(d, T::DTYPE.size());
    if b_3d {
        bb = wg::tma_b_3d(d, T::DTYPE.size()).unwrap_or(bb);
    }
    let maps = TmaMaps { a: encode_tensor_map(pa, ba, T::DTYPE)?, b: encode_tensor_map(pb, bb, T::DTYPE)?, b_rank: bb.rank as i32 };
    if cache.len() == MAPS_KEPT {
        cache.remove(0);
    }
    cache.push((key, maps));
    Ok(maps)
}
