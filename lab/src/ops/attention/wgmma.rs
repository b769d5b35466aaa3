//! The Hopper rungs of the forward (kernels/attention_wgmma.cu): Q, K and V reach shared memory
//! through TMA, each as a 4D tensor map (head_dim, heads, seq, batch) whose boxes are 64 elements
//! (128 bytes, the widest a 128-byte swizzle takes) of one head for 128 rows, so rows past a
//! sequence arrive as zeros rather than as the next sequence's.

use super::{Dims, Mask, Packed, FAMILY};
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::symbol;
use crate::ops::gemm::raise_dynamic_smem;
use crate::ops::gemm::tma::{encode_tensor_map, wg::TmaBox, TensorMap};
use crate::ops::Elem;
use crate::Result;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg};

/// Query rows per block (two warpgroups of 64) and keys per tile: `WgAttn` in the kernel.
pub const BM: usize = 128;
pub const BN: usize = 128;
/// Two warpgroups; one thread of the second issues the loads.
const THREADS: u32 = 256;

/// `WgAttn<D>::STAGES`: the ring's depth, as deep as 227 KiB allows at D128.
pub const fn stages(d: usize) -> usize {
    if d == 128 {
        3
    } else {
        4
    }
}

/// `WgAttn<D>::SMEM`: Q, a ring of K and V tiles, 1 KiB to align it to the swizzle atom, and
/// 1 + 3 x stages mbarriers.
pub const fn smem(d: usize) -> usize {
    BM * d * 2 + stages(d) * 2 * BN * d * 2 + 1024 + 8 * (1 + 3 * stages(d))
}

/// The map of a [batch, seq, heads, head_dim] tensor, boxes of 64 x 1 head x 128 rows.
fn tensor_box(batch: usize, seq: usize, heads: usize, d: usize, elem: usize) -> TmaBox {
    let row = (heads * d * elem) as u64;
    TmaBox {
        rank: 4,
        dims: [d as u64, heads as u64, seq as u64, batch as u64],
        strides_bytes: [(d * elem) as u64, row, row * seq as u64],
        boxes: [64, 1, BM as u32, 1],
    }
}

/// Launches a wgmma rung on views [`super::launch_tiled`] has checked.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch<T: Elem>(
    gpu: &Gpu,
    variant: &str,
    d: Dims,
    mask: Mask,
    (q, k, v): (&CudaView<T>, &CudaView<T>, &CudaView<T>),
    o: &mut CudaViewMut<T>,
    lse: &mut CudaViewMut<f32>,
    packed: Option<Packed>,
) -> Result<()> {
    let elem = T::DTYPE.size();
    // A packed batch: one batch of all its rows (the kernel offsets each sequence's coordinates).
    let (batch, rows_q, rows_k) = packed.map_or((d.batch, d.sq, d.sk), |p| (1, p.total_q, p.total_k));
    let map = |view: &CudaView<T>, seq: usize, heads: usize| -> Result<TensorMap> {
        let (ptr, _sync) = view.device_ptr(&gpu.stream);
        encode_tensor_map(ptr, tensor_box(batch, seq, heads, d.d, elem), T::DTYPE)
    };
    let (tq, tk, tv) = (map(q, rows_q, d.hq)?, map(k, rows_k, d.hkv)?, map(v, rows_k, d.hkv)?);
    let scale = 1.0 / (d.d as f32).sqrt();
    let (causal, window) = (mask.causal as i32, mask.window as i32);
    let [sq, sk, hq, hkv] = [d.sq, d.sk, d.hq, d.hkv].map(|x| x as i32);
    let f = gpu.function(FAMILY, &symbol(FAMILY, &format!("{variant}_d{}", d.d), T::DTYPE))?;
    raise_dynamic_smem(&f, smem(d.d))?;
    let cfg = LaunchConfig { grid_dim: (d.sq.div_ceil(BM) as u32, d.hq as u32, d.batch as u32), block_dim: (THREADS, 1, 1), shared_mem_bytes: smem(d.d) as u32 };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&tq).arg(&tk).arg(&tv).arg(o).arg(lse);
    super::push_offsets(&mut b, packed);
    b.arg(&sq).arg(&sk).arg(&hq).arg(&hkv).arg(&scale).arg(&causal).arg(&window);
    // SAFETY: the maps describe q, k and v within their lengths (checked by launch_tiled) and TMA bounds
    // every box by them; the grid covers ceil(Sq / 128) query tiles of every head, and the kernel
    // stores only rows below Sq into o and lse, which hold their shapes.
    unsafe { b.launch(cfg) }.map(|_| ()).doing(&format!("launching attention {variant}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tiles_threads_and_shared_memory_are_the_kernels() {
        let cache = tempfile::tempdir().unwrap();
        let exprs = ["WgAttn<64>::BM", "WgAttn<64>::BN", "WgAttn<64>::THREADS", "WgAttn<64>::SMEM", "WgAttn<128>::SMEM"];
        let got = crate::gpu::compile::probe_u32(Some(cache.path()), super::FAMILY, &exprs).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, [super::BM as u32, super::BN as u32, super::THREADS, super::smem(64) as u32, super::smem(128) as u32]);
    }

    #[test]
    fn the_maps_name_one_head_of_128_rows_and_the_ring_fits_a_block() {
        let t = super::tensor_box(3, 129, 9, 64, 2);
        assert_eq!((t.rank, t.dims, t.strides_bytes, t.boxes), (4, [64, 9, 129, 3], [128, 1152, 1152 * 129], [64, 1, 128, 1]));
        // 227 KiB of dynamic shared memory per block on an H100.
        assert_eq!(super::smem(128), 32768 + 196608 + 1024 + 80);
        assert!(super::smem(128) <= 232448 && super::smem(64) < super::smem(128));
    }
}
