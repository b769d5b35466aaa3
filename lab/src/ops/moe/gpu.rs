//! Launches of kernels/moe.cu and moe_backward.cu on tensors the callable ops in `mod.rs` validated.

use super::{Epilogue, Permutation, Router, Routing, Scoring, FAMILY};
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::ops::gemm::{encode_tensor_map, raise_dynamic_smem, wg};
use crate::ops::Elem;
use crate::tensor::Tensor;
use crate::{LabError, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

/// Tokens per block of the router (MOE_ROUTE_TOKENS in kernels/moe.cu).
pub(super) const ROUTE_TOKENS: usize = 64;
/// Assignments per block of the counting sort (MOE_CHUNK in kernels/moe.cu).
pub(super) const CHUNK: usize = 256;
/// Rows per m-tile of grouped_mma and grouped_wgrad (tc1::BM in kernels/mma.cuh), columns per
/// n-tile (tc1::BN).
pub(super) const BM: usize = 128;
pub(super) const BN: usize = 128;

fn cfg(grid: usize, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

fn placed<U: crate::tensor::Scalar>(t: &Tensor<U>) -> &cudarc::driver::CudaSlice<U> {
    t.cuda().expect("placement checked")
}

/// Noisy gating's noise logits and eps as the router kernels' two pointer arguments, or two nulls.
fn noise_args<'a, T: Elem>(b: &mut cudarc::driver::LaunchArgs<'a>, noise: Option<(&'a Tensor<T>, &'a Tensor<f32>)>, null: &'a u64) {
    match noise {
        Some((n, eps)) => b.arg(placed(n)).arg(placed(eps)),
        None => b.arg(null).arg(null),
    };
}

pub fn route<T: Elem>(g: &Gpu, logits: &Tensor<T>, noise: Option<(&Tensor<T>, &Tensor<f32>)>, t: usize, e: usize, r: &Router) -> Result<Routing> {
    let s = &g.stream;
    let mut experts = s.alloc_zeros::<i32>(t * r.k).doing("allocating the routing")?;
    let mut weights = s.alloc_zeros::<f32>(t * r.k).doing("allocating the routing")?;
    let mut load = s.alloc_zeros::<i32>(e).doing("allocating the load histogram")?;
    let mut acc = s.alloc_zeros::<f32>(e + 1).doing("allocating the router's sums")?;
    let mut losses = s.alloc_zeros::<f32>(2).doing("allocating the losses")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "route", T::DTYPE))?;
    let (ti, ei, ki) = (t as i32, e as i32, r.k as i32);
    let (sigmoid, renorm) = ((r.scoring == Scoring::Sigmoid) as i32, r.renormalize as i32);
    let null = 0u64;
    let mut b = s.launch_builder(&f);
    b.arg(placed(logits));
    noise_args(&mut b, noise, &null);
    b.arg(&ti).arg(&ei).arg(&ki).arg(&sigmoid).arg(&renorm).arg(&mut experts).arg(&mut weights).arg(&mut load).arg(&mut acc);
    // SAFETY: blocks of 256 threads over 64 tokens each (ROUTE_TOKENS); logits, noise and eps
    // hold T x E elements (checked by route_logits), the outputs T x k, E and E + 1; k <= 8 and
    // E <= 256 (validated).
    unsafe { b.launch(cfg(t.div_ceil(ROUTE_TOKENS), 256)) }.doing("launching moe route")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "losses", DType::F32))?;
    let alpha = r.aux_alpha as f32;
    // SAFETY: one block reads E loads and E + 1 sums and writes two losses.
    unsafe { s.launch_builder(&f).arg(&load).arg(&acc).arg(&ti).arg(&ei).arg(&ki).arg(&alpha).arg(&mut losses).launch(cfg(1, 256)) }
        .doing("launching moe losses")?;
    Ok(Routing {
        experts: Tensor::from_cuda(&[t, r.k], experts)?,
        weights: Tensor::from_cuda(&[t, r.k], weights)?,
        load: Tensor::from_cuda(&[e], load)?,
        losses: Tensor::from_cuda(&[2], losses)?,
    })
}

pub fn permute<T: Elem>(g: &Gpu, x: &Tensor<T>, experts: &Tensor<i32>, (t, k, e): (usize, usize, usize), cap: usize) -> Result<(Permutation, Tensor<T>)> {
    let s = &g.stream;
    let (n, h) = (t * k, x.cols());
    let chunks = n.div_ceil(CHUNK);
    let mut hist = s.alloc_zeros::<i32>(chunks * e).doing("allocating the chunk counts")?;
    let mut offsets = s.alloc_zeros::<i32>(e + 1).doing("allocating the offsets")?;
    let mut slot = s.alloc_zeros::<i32>(n).doing("allocating the slots")?;
    let mut rows = s.alloc_zeros::<i32>(n).doing("allocating the rows")?;
    g.poison(&mut rows)?; // -1: no token
    let mut xp = s.alloc_zeros::<T>(n * h).doing("allocating the permuted rows")?;
    let (ti, ki, ei, ci, capi, hi) = (t as i32, k as i32, e as i32, chunks as i32, cap.min(i32::MAX as usize) as i32, h as i32);
    let ex = placed(experts);
    let f = g.function(FAMILY, &symbol(FAMILY, "chunk_counts", DType::F32))?;
    // SAFETY: a block per 256 assignments of the T k in `experts`; hist holds chunks x E.
    unsafe { s.launch_builder(&f).arg(ex).arg(&ti).arg(&ki).arg(&ei).arg(&mut hist).launch(cfg(chunks, CHUNK as u32)) }.doing("launching moe chunk_counts")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "scan", DType::F32))?;
    // SAFETY: one block of 256 threads (E <= 256) over chunks x E counts; offsets holds E + 1.
    unsafe { s.launch_builder(&f).arg(&mut hist).arg(&ci).arg(&ei).arg(&capi).arg(&mut offsets).launch(cfg(1, 256)) }.doing("launching moe scan")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "scatter", DType::F32))?;
    let mut b = s.launch_builder(&f);
    b.arg(ex).arg(&ti).arg(&ki).arg(&ei).arg(&capi).arg(&hist).arg(&offsets).arg(&mut slot).arg(&mut rows);
    // SAFETY: the same chunks; every kept rank is below its expert's kept count, so each row
    // offsets[e] + rank < offsets[E] <= T k is written once.
    unsafe { b.launch(cfg(chunks, CHUNK as u32)) }.doing("launching moe scatter")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "gather", T::DTYPE))?;
    // SAFETY: a block per possible row; rows past offsets[E] return, live rows name tokens < T.
    unsafe { s.launch_builder(&f).arg(placed(x)).arg(&rows).arg(&offsets).arg(&ei).arg(&hi).arg(&mut xp).launch(cfg(n, 128)) }.doing("launching moe gather")?;
    let perm = Permutation { slot: Tensor::from_cuda(&[t, k], slot)?, rows: Tensor::from_cuda(&[n], rows)?, offsets: Tensor::from_cuda(&[e + 1], offsets)? };
    Ok((perm, Tensor::from_cuda(&[n, h], xp)?))
}

/// out[t] = sum_j w_tj y[slot(t, j)]; no weights: w = 1.
pub fn combine<T: Elem>(g: &Gpu, y: &Tensor<T>, perm: &Permutation, weights: Option<&Tensor<f32>>, out: &mut Tensor<T>) -> Result<()> {
    let (t, k, n) = (perm.slot.rows(), perm.slot.cols(), y.cols());
    let (ki, ni) = (k as i32, n as i32);
    let f = g.function(FAMILY, &symbol(FAMILY, "combine", T::DTYPE))?;
    let null = 0u64;
    let mut b = g.stream.launch_builder(&f);
    b.arg(placed(y)).arg(placed(&perm.slot));
    match weights {
        Some(w) => b.arg(placed(w)),
        None => b.arg(&null),
    };
    b.arg(&ki).arg(&ni).arg(out.cuda_mut().expect("placement checked"));
    // SAFETY: a block per token; slots are -1 or rows of y (T k x N, checked by unpermute).
    unsafe { b.launch(cfg(t, 256)) }.map(|_| ()).doing("launching moe combine")
}

/// out = sum rounded to T, element by element.
pub fn cast<T: Elem>(g: &Gpu, sum: &cudarc::driver::CudaSlice<f32>, out: &mut Tensor<T>) -> Result<()> {
    let n = out.len() as u64;
    let f = g.function(FAMILY, &symbol(FAMILY, "cast", T::DTYPE))?;
    let blocks = (n as usize).div_ceil(256).min(g.info.sm_count as usize * 8).max(1);
    // SAFETY: a grid-stride loop over n elements of sum and out, which both hold n (the caller
    // allocates sum with out's length).
    unsafe { g.stream.launch_builder(&f).arg(sum).arg(&n).arg(out.cuda_mut().expect("placement checked")).launch(cfg(blocks, 256)) }
        .map(|_| ())
        .doing("launching moe cast")
}

type GroupedDims = (usize, usize, usize, usize, usize);

/// One cuBLAS gemm_ex (fp32 compute) per expert with rows: the host reads the offsets first.
pub fn grouped_cublas<T: Elem>(g: &Gpu, a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, (e, rows, k, n, nc): GroupedDims, ep: Epilogue, c: &mut Tensor<T>) -> Result<()> {
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t::CUBLAS_OP_N, cudaDataType_t};
    let off = offsets.to_vec()?; // the synchronisation this rung is allowed
    let blas = g.blas()?;
    let dt = match T::DTYPE {
        DType::Bf16 => cudaDataType_t::CUDA_R_16BF,
        DType::F16 => cudaDataType_t::CUDA_R_16F,
        DType::F32 => cudaDataType_t::CUDA_R_32F,
    };
    let mut staged = match ep {
        Epilogue::Store => None,
        Epilogue::SwiGlu => Some(g.stream.alloc_zeros::<T>(rows * n).doing("allocating the gate/up products")?),
    };
    let (da, db) = (placed(a), placed(b));
    let clamp = |v: i32| (v.max(0) as usize).min(rows);
    for x in 0..e {
        let (r0, r1) = (clamp(off[x]), clamp(off[x + 1]));
        if r1 <= r0 {
            continue;
        }
        let av = da.slice(r0 * k..r1 * k);
        let bv = db.slice(x * k * n..(x + 1) * k * n);
        let (alpha, beta) = (1f32, 0f32);
        let (ap, _ra) = av.device_ptr(&g.stream);
        let (bp, _rb) = bv.device_ptr(&g.stream);
        let run = |cp: u64| {
            // Row-major C = A B is column-major C^T = B^T A^T: B first, dimensions swapped.
            // SAFETY: B[x] is K x N, A's segment (r1 - r0) x K and C's the same rows x N, all
            // inside their buffers (offsets clamped to the rows); fp32 scalars for COMPUTE_32F.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *blas.handle(),
                    CUBLAS_OP_N,
                    CUBLAS_OP_N,
                    n as i32,
                    (r1 - r0) as i32,
                    k as i32,
                    (&alpha) as *const f32 as *const _,
                    bp as *const _,
                    dt,
                    n as i32,
                    ap as *const _,
                    dt,
                    k as i32,
                    (&beta) as *const f32 as *const _,
                    cp as *mut _,
                    dt,
                    n as i32,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .doing("cuBLAS GEMM of one expert")
        };
        match staged.as_mut() {
            Some(buf) => {
                let mut cv = buf.slice_mut(r0 * n..r1 * n);
                let (cp, _rc) = cv.device_ptr_mut(&g.stream);
                run(cp)?;
            }
            None => {
                let mut cv = c.cuda_mut().expect("placement checked").slice_mut(r0 * nc..r1 * nc);
                let (cp, _rc) = cv.device_ptr_mut(&g.stream);
                run(cp)?;
            }
        }
    }
    if let Some(gu) = staged {
        let f = g.function(FAMILY, &symbol(FAMILY, "swiglu", T::DTYPE))?;
        let (ei, ii) = (e as i32, nc as i32);
        let mut l = g.stream.launch_builder(&f);
        l.arg(&gu).arg(placed(offsets)).arg(&ei).arg(&ii).arg(c.cuda_mut().expect("placement checked"));
        // SAFETY: a block per row of A; rows past offsets[E] return; gu is rows x 2I, C rows x I.
        unsafe { l.launch(cfg(rows, 256)) }.doing("launching moe swiglu")?;
    }
    Ok(())
}

/// The m-tile prefix over the device's offsets (tile_start[e], total at [E]) that grouped_mma's
/// and grouped_wgmma's blocks search for their expert.
fn schedule(g: &Gpu, offsets: &Tensor<i32>, e: usize, rows: usize) -> Result<cudarc::driver::CudaSlice<i32>> {
    let mut tiles = g.stream.alloc_zeros::<i32>(e + 1).doing("allocating the tile schedule")?;
    let (ei, ri) = (e as i32, rows as i32);
    let f = g.function(FAMILY, &symbol(FAMILY, "schedule", DType::F32))?;
    // SAFETY: one block of 256 threads (E <= 256) reads E + 1 offsets, writes E + 1 starts.
    unsafe { g.stream.launch_builder(&f).arg(placed(offsets)).arg(&ei).arg(&ri).arg(&mut tiles).launch(cfg(1, 256)) }.doing("launching moe schedule")?;
    Ok(tiles)
}

/// The schedule, then one grouped_mma launch.
pub fn grouped_mma<T: Elem>(g: &Gpu, a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, (e, rows, k, n, _): GroupedDims, ep: Epilogue, c: &mut Tensor<T>) -> Result<()> {
    let tiles = schedule(g, offsets, e, rows)?;
    let (ei, ri, ki, ni, sw) = (e as i32, rows as i32, k as i32, n as i32, (ep == Epilogue::SwiGlu) as i32);
    let f = g.function(FAMILY, &symbol(FAMILY, "grouped_mma", T::DTYPE))?;
    // Every expert adds at most one partial tile: rows / BM + E bounds the m-tiles.
    let m_tiles = rows / BM + e;
    let launch = LaunchConfig { grid_dim: (n.div_ceil(BN) as u32, m_tiles as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut l = g.stream.launch_builder(&f);
    l.arg(placed(a)).arg(placed(b)).arg(c.cuda_mut().expect("placement checked")).arg(placed(offsets)).arg(&tiles);
    l.arg(&ei).arg(&ri).arg(&ki).arg(&ni).arg(&sw);
    // SAFETY: blocks past the schedule's total return; a block's rows lie in its expert's
    // segment clamped to A's rows (A rows x K, C rows x N or N / 2), loads are bounded by the
    // segment, K and N, stores by the segment and N; B holds E x K x N.
    unsafe { l.launch(launch) }.map(|_| ()).doing("launching moe grouped_mma")
}

/// Where grouped_wgmma's tiles go: C, or (the down product of grouped_wgmma_fused) scaled by each
/// row's combine weight and added into its token's row of an f32 sum [T, N].
pub enum WgOut<'a, T: Elem> {
    Store(&'a mut Tensor<T>),
    Combine { perm: &'a Permutation, weights: &'a Tensor<f32>, sum: &'a mut cudarc::driver::CudaSlice<f32> },
}

/// The kernel's k-tile loop is gemm's wgmma_tma loop with its ring counting k-tiles across the
/// block's tiles (gemm's runs a tile a block): sharing it through mma.cuh is for the next change
/// to gemm's wgmma kernels, whose source it would change.
///
/// The schedule, the two tensor maps (A: K x rows in boxes of 64 x 128; B: N x K x E in boxes of
/// 64 x 64 x 1), then one grouped_wgmma launch with `tile`'s ring in dynamic shared memory: a
/// block per tile, or `persistent`, as many as fit on the SMs at once.
#[allow(clippy::too_many_arguments)]
pub fn grouped_wgmma<T: Elem>(g: &Gpu, (tile, persistent): (wg::Tile, bool), a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, (e, rows, k, n, _): GroupedDims, ep: Epilogue, out: WgOut<T>) -> Result<()> {
    if !k.is_multiple_of(8) || !n.is_multiple_of(8) {
        return Err(LabError::shape("moe grouped_wgmma", format!("K = {k} and N = {n}: TMA reads rows of a multiple of 16 bytes, so both must be multiples of 8")));
    }
    let s = &g.stream;
    let tiles = schedule(g, offsets, e, rows)?;
    let el = T::DTYPE.size() as u64;
    let (k64, n64) = (k as u64, n as u64);
    let box_a = wg::TmaBox { rank: 2, dims: [k64, rows as u64, 1, 1], strides_bytes: [k64 * el, 0, 0], boxes: [wg::BK as u32, wg::BM as u32, 1, 1] };
    let box_b = wg::TmaBox { rank: 3, dims: [n64, k64, e as u64, 1], strides_bytes: [n64 * el, k64 * n64 * el, 0], boxes: [wg::B_BOX_N as u32, wg::BK as u32, 1, 1] };
    let map_a = encode_tensor_map(placed(a).device_ptr(s).0, box_a, T::DTYPE)?;
    let map_b = encode_tensor_map(placed(b).device_ptr(s).0, box_b, T::DTYPE)?;
    let name = if tile == wg::WIDE { "grouped_wgmma" } else { "grouped_wgmma_n128" };
    let f = g.function(FAMILY, &symbol(FAMILY, name, T::DTYPE))?;
    raise_dynamic_smem(&f, tile.smem())?;
    // Tiles: n-tiles x an upper bound of the m-tiles (rows / BM + E: every expert adds at most one
    // partial tile), which the kernel takes in groups of n-tiles.
    let m_bound = rows / wg::BM + e;
    let tiles_total = n.div_ceil(tile.bn) * m_bound;
    let blocks = if persistent { tiles_total.min(g.info.sm_count as usize * tile.blocks_per_sm) } else { tiles_total };
    let launch = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (tile.threads(), 1, 1),
        shared_mem_bytes: tile.smem() as u32,
    };
    let (ei, ri, ki, ni, sw, mb) = (e as i32, rows as i32, k as i32, n as i32, (ep == Epilogue::SwiGlu) as i32, m_bound as i32);
    let (c, combine) = match out {
        WgOut::Store(c) => (Some(c), None),
        WgOut::Combine { perm, weights, sum } => (None, Some((perm, weights, sum))),
    };
    let topk = combine.as_ref().map_or(0, |(perm, _, _)| perm.slot.cols() as i32);
    let null = 0u64;
    let mut l = s.launch_builder(&f);
    l.arg(&map_a).arg(&map_b);
    match c {
        Some(c) => l.arg(c.cuda_mut().expect("placement checked")),
        None => l.arg(&null),
    };
    l.arg(placed(offsets)).arg(&tiles).arg(&ei).arg(&ri).arg(&ki).arg(&ni).arg(&sw).arg(&mb);
    match combine {
        Some((perm, weights, sum)) => l.arg(placed(&perm.rows)).arg(placed(&perm.slot)).arg(placed(weights)).arg(&topk).arg(sum),
        None => l.arg(&null).arg(&null).arg(&null).arg(&topk).arg(&null),
    };
    // SAFETY: the maps describe A (rows x K) and B (E x K x N) as allocated, and TMA zero-fills
    // what lies outside them; blocks past the schedule's total return; stores are bounded by the
    // block's expert's segment (clamped to A's rows) and N, into C (rows x N or N / 2), or, when
    // combining, into the f32 sum at the live row's token (rows and slot from the permutation of
    // these rows: T x k slots, tokens < T, the sum T x N); the ring and its barriers fit the
    // dynamic shared memory the launch gives.
    unsafe { l.launch(launch) }.map(|_| ()).doing(&format!("launching moe {name}"))
}

// The backward's launches (backward.rs composes them).

/// [B, R, C] to [B, C, R].
pub fn transpose<T: Elem>(g: &Gpu, a: &Tensor<T>, (batch, r, c): (usize, usize, usize)) -> Result<cudarc::driver::CudaSlice<T>> {
    let mut out = g.stream.alloc_zeros::<T>(batch * r * c).doing("allocating a transpose")?;
    g.poison(&mut out)?; // every element must be written
    let f = g.function(FAMILY, &symbol(FAMILY, "transpose", T::DTYPE))?;
    let (ri, ci) = (r as i32, c as i32);
    let launch = LaunchConfig { grid_dim: (c.div_ceil(32) as u32, r.div_ceil(32) as u32, batch as u32), block_dim: (32, 8, 1), shared_mem_bytes: 0 };
    // SAFETY: `a` holds batch x r x c elements (its shape), out the same; every access is bounded by r and c.
    unsafe { g.stream.launch_builder(&f).arg(placed(a)).arg(&ri).arg(&ci).arg(&mut out).launch(launch) }.doing("launching moe transpose")?;
    Ok(out)
}

/// The live rows' SwiGLU activations [rows, I] from interleaved [rows, 2I].
pub fn swiglu<T: Elem>(g: &Gpu, pre: &Tensor<T>, offsets: &Tensor<i32>, (e, i): (usize, usize)) -> Result<cudarc::driver::CudaSlice<T>> {
    let rows = pre.rows();
    let mut act = g.stream.alloc_zeros::<T>(rows * i).doing("allocating the activations")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "swiglu", T::DTYPE))?;
    let (ei, ii) = (e as i32, i as i32);
    // SAFETY: a block per row; rows past offsets[E] <= rows return; pre is rows x 2I, act rows x I.
    unsafe { g.stream.launch_builder(&f).arg(placed(pre)).arg(placed(offsets)).arg(&ei).arg(&ii).arg(&mut act).launch(cfg(rows, 256)) }.doing("launching moe swiglu")?;
    Ok(act)
}

type Slices<A, B> = (cudarc::driver::CudaSlice<A>, cudarc::driver::CudaSlice<B>);

/// (dJ/dw [T k] f32, dy [T k, H]).
pub fn combine_backward<T: Elem>(g: &Gpu, dout: &Tensor<T>, y: &Tensor<T>, slot: &Tensor<i32>, weights: &Tensor<f32>) -> Result<Slices<f32, T>> {
    let (t, k, h) = (slot.rows(), slot.cols(), y.cols());
    let mut dw = g.stream.alloc_zeros::<f32>(t * k).doing("allocating dJ/dw")?;
    let mut dy = g.stream.alloc_zeros::<T>(t * k * h).doing("allocating dy")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "combine_backward", T::DTYPE))?;
    let (ki, hi) = (k as i32, h as i32);
    let mut b = g.stream.launch_builder(&f);
    b.arg(placed(dout)).arg(placed(y)).arg(placed(slot)).arg(placed(weights)).arg(&ki).arg(&hi).arg(&mut dy).arg(&mut dw);
    // SAFETY: a block per token of dout (T x H); slots are -1 or rows of y and dy (T k x H); w and dw T x k.
    unsafe { b.launch(cfg(t, 256)) }.doing("launching moe combine_backward")?;
    Ok((dw, dy))
}

/// d pre [rows, 2I] from pre [rows, 2I] and d act [rows, I], live rows only.
pub fn swiglu_backward<T: Elem>(g: &Gpu, pre: &Tensor<T>, dact: &Tensor<T>, offsets: &Tensor<i32>, e: usize) -> Result<cudarc::driver::CudaSlice<T>> {
    let (rows, i) = (dact.rows(), dact.cols());
    let mut dpre = g.stream.alloc_zeros::<T>(rows * 2 * i).doing("allocating d pre")?;
    let f = g.function(FAMILY, &symbol(FAMILY, "swiglu_backward", T::DTYPE))?;
    let (ei, ii) = (e as i32, i as i32);
    let mut b = g.stream.launch_builder(&f);
    b.arg(placed(pre)).arg(placed(dact)).arg(placed(offsets)).arg(&ei).arg(&ii).arg(&mut dpre);
    // SAFETY: a block per row; rows past offsets[E] <= rows return.
    unsafe { b.launch(cfg(rows, 256)) }.doing("launching moe swiglu_backward")?;
    Ok(dpre)
}

/// W [E, K, N] with W[e] = A[segment e]^T B[segment e].
pub fn grouped_wgrad<T: Elem>(g: &Gpu, a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, (e, rows, k, n): (usize, usize, usize, usize)) -> Result<cudarc::driver::CudaSlice<T>> {
    let mut w = g.stream.alloc_zeros::<T>(e * k * n).doing("allocating a weight gradient")?;
    g.poison(&mut w)?; // every element must be written, empty experts included
    let f = g.function(FAMILY, &symbol(FAMILY, "grouped_wgrad", T::DTYPE))?;
    let (ri, ki, ni) = (rows as i32, k as i32, n as i32);
    // grouped_mma's tile: W's K rows are its M.
    let launch = LaunchConfig { grid_dim: (n.div_ceil(BN) as u32, k.div_ceil(BM) as u32, e as u32), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut l = g.stream.launch_builder(&f);
    l.arg(placed(a)).arg(placed(b)).arg(placed(offsets)).arg(&ri).arg(&ki).arg(&ni).arg(&mut w);
    // SAFETY: segments are clamped to the rows A (rows x K) and B (rows x N) hold; W is E x K x N
    // and every store is bounded by K and N.
    unsafe { l.launch(launch) }.doing("launching moe grouped_wgrad")?;
    Ok(w)
}

/// (d logits, d noise logits), each [T, E].
pub fn route_backward<T: Elem>(
    g: &Gpu,
    logits: &Tensor<T>,
    noisy: Option<&super::NoisyLogits<T>>,
    (experts, dw, load): (&Tensor<i32>, &Tensor<f32>, &Tensor<i32>),
    (t, e): (usize, usize),
    r: &Router,
    (aux_c, z_c): (f32, f32),
) -> Result<(cudarc::driver::CudaSlice<T>, Option<cudarc::driver::CudaSlice<T>>)> {
    let s = &g.stream;
    // Poisoned: every element must be written.
    let mut dl = s.alloc_zeros::<T>(t * e).doing("allocating d logits")?;
    g.poison(&mut dl)?;
    let mut dn = match noisy {
        Some(_) => Some(s.alloc_zeros::<T>(t * e).doing("allocating d noise logits")?),
        None => None,
    };
    if let Some(d) = dn.as_mut() {
        g.poison(d)?;
    }
    let f = g.function(FAMILY, &symbol(FAMILY, "route_backward", T::DTYPE))?;
    let (ti, ei, ki) = (t as i32, e as i32, r.k as i32);
    let (sigmoid, renorm) = ((r.scoring == Scoring::Sigmoid) as i32, r.renormalize as i32);
    let null = 0u64;
    let mut b = s.launch_builder(&f);
    b.arg(placed(logits));
    noise_args(&mut b, noisy.map(|(n, eps)| (n, eps)), &null);
    b.arg(placed(experts)).arg(placed(dw)).arg(placed(load)).arg(&ti).arg(&ei).arg(&ki).arg(&sigmoid).arg(&renorm).arg(&aux_c).arg(&z_c).arg(&mut dl);
    match dn.as_mut() {
        Some(d) => b.arg(d),
        None => b.arg(&null),
    };
    // SAFETY: blocks of 256 threads, a warp per token (8 a block); logits, noise, eps and the
    // outputs hold T x E elements, experts and dw T x k, load E; k <= 8 and E <= 256 (validated).
    unsafe { b.launch(cfg(t.div_ceil(8), 256)) }.doing("launching moe route_backward")?;
    Ok((dl, dn))
}
