//! Decode attention (kernels/attention_decode.cu): one query row per sequence against a paged
//! KV cache, the context split over blocks and merged by a combine step (flash-decoding), by
//! decode_split (CUDA cores), decode_mma (tensor cores behind a cp.async ring) or decode_merge
//! (decode_mma with the combine done by each group's last split: one launch; [`BEST`]).
//! Sequence b attends its rows 0..=pos[b], with `pos` on the device: a captured CUDA graph of a
//! decode step replays as the sequences grow.

use super::{Elem, Kernel, FAMILY, VARIANTS};
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::ops::gemm::raise_dynamic_smem;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// Query heads one block serves at most (decode_split's GM); a larger group takes several
/// blocks per KV head.
const GMAX: usize = 8;

/// The decode_split instance for a group of `g` query heads per KV head: the smallest GM of 1, 2,
/// 4 and 8 that holds the group (8 beyond), so the kernel's per-head loops stop at the group.
fn heads_per_block(g: usize) -> usize {
    g.clamp(1, GMAX).next_power_of_two()
}
/// Rows per split at least: four warps' tiles of 32 (decode_split).
const MIN_CHUNK: usize = 128;

/// Splits at most: decode_combine keeps a weight per split and the sum in 48 KiB of shared
/// memory.
const MAX_SPLITS: usize = 12 * 1024 - 1;

/// The decode variant ops and the engine use.
pub const BEST: &str = "decode_merge";
/// decode_mma's tile of rows (DM_BN), and its shared memory (DM_SMEM: 16 query rows and three
/// stages of K and V tiles, pitch d + 8).
const MMA_TILE: usize = 64;
fn mma_smem(d: usize) -> usize {
    (16 + 2 * 3 * MMA_TILE) * (d + 8) * 2
}

/// Splits of a `capacity`-row context for `pairs` (sequence, head group) pairs on `slots`
/// resident blocks, each split a multiple of `tile` rows: at least one wave, and of the counts up
/// to four waves the one whose last wave is fullest (the fewest splits among equals). Returns
/// (rows per split, splits).
fn plan_waves(pairs: usize, capacity: usize, slots: usize, tile: usize) -> (usize, usize) {
    let lo = slots.div_ceil(pairs).max(1);
    let mut best = (0, 0, 0.0);
    for want in lo..=4 * lo {
        let chunk = capacity.div_ceil(want).next_multiple_of(tile);
        let n = capacity.div_ceil(chunk);
        let blocks = pairs * n;
        let fill = blocks as f64 / (blocks.div_ceil(slots) * slots) as f64;
        if fill > best.2 + 1e-9 {
            best = (chunk, n, fill);
        }
    }
    (best.0, best.1)
}

/// A paged cache of keys and values, [pages, page, hkv, d] each; sequence b's row j is in page
/// `table[b * max_pages + j / page]`. [`KvCache::contiguous`] gives each sequence one page.
pub struct KvCache<T> {
    pub k: CudaSlice<T>,
    pub v: CudaSlice<T>,
    pub table: CudaSlice<i32>,
    pub batch: usize,
    pub page: usize,
    pub max_pages: usize,
    pub hkv: usize,
    pub d: usize,
}

impl<T: Elem> KvCache<T> {
    /// `batch` sequences of up to `capacity` rows, each its own contiguous page.
    pub fn contiguous(gpu: &Gpu, batch: usize, capacity: usize, hkv: usize, d: usize) -> Result<Self> {
        let table: Vec<i32> = (0..batch as i32).collect();
        Self::paged(gpu, capacity, batch, &table, 1, hkv, d)
    }

    /// A cache of `pages` pages of `page` rows, and a block table of `max_pages` entries per
    /// sequence (each entry a page index below `pages`).
    pub fn paged(gpu: &Gpu, page: usize, pages: usize, table: &[i32], max_pages: usize, hkv: usize, d: usize) -> Result<Self> {
        if page == 0 || max_pages == 0 || !table.len().is_multiple_of(max_pages) || table.is_empty() {
            return Err(LabError::shape("KvCache", format!("{} table entries for {max_pages} pages per sequence of {page} rows", table.len())));
        }
        if let Some((i, p)) = table.iter().enumerate().find(|(_, &p)| p < 0 || p as usize >= pages) {
            return Err(LabError::shape("KvCache", format!("block table entry {i} points to page {p}, past the cache's {pages} pages")));
        }
        let n = pages * page * hkv * d;
        Ok(KvCache {
            k: gpu.stream.alloc_zeros(n).doing("allocating the key cache")?,
            v: gpu.stream.alloc_zeros(n).doing("allocating the value cache")?,
            table: gpu.upload(table)?,
            batch: table.len() / max_pages,
            page,
            max_pages,
            hkv,
            d,
        })
    }

    /// Rows a sequence can hold.
    pub fn capacity(&self) -> usize {
        self.page * self.max_pages
    }
}

/// The split plan and partial buffers of one decode shape for one variant, made once (a graph
/// captures their addresses).
pub struct Decode {
    gpu: Arc<Gpu>,
    mma: bool,
    /// The combine done by each group's last split (decode_merge), counting on `counts`.
    merge: bool,
    batch: usize,
    hq: usize,
    chunk: usize,
    nsplit: usize,
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    /// Splits done per (sequence, head group); each group's last split resets its count.
    counts: CudaSlice<i32>,
}

impl Decode {
    /// [`BEST`]'s plan.
    pub fn new(gpu: &Arc<Gpu>, batch: usize, hq: usize, hkv: usize, d: usize, capacity: usize) -> Result<Self> {
        Self::with(gpu, BEST, batch, hq, hkv, d, capacity)
    }

    /// The plan of decode variant `variant` for `batch` sequences of up to `capacity` rows.
    /// decode_split: `batch x KV heads x splits` blocks fill the chip about four times (four
    /// blocks fit an SM at 128 registers for groups of up to 4 heads, three at 8), each split at
    /// least [`MIN_CHUNK`] rows. decode_mma: [`plan_waves`] over the blocks that fit the chip at
    /// once (two per SM at d 128); decode_merge the same, its last split's merge holding a weight
    /// per split and head of the group in decode_mma's shared memory.
    pub fn with(gpu: &Arc<Gpu>, variant: &str, batch: usize, hq: usize, hkv: usize, d: usize, capacity: usize) -> Result<Self> {
        let (mma, merge) = match crate::ops::variant::find(FAMILY, VARIANTS, variant)?.config {
            Kernel::Decode { mma, merge } => (mma, merge),
            _ => return Err(LabError::Invalid(format!("`{variant}` is not an attention decode variant (decode_split, decode_mma, decode_merge)"))),
        };
        if hkv == 0 || !hq.is_multiple_of(hkv) || ![64, 128].contains(&d) || batch == 0 || capacity == 0 {
            return Err(LabError::shape(
                "attention decode",
                format!("{hq} query heads over {hkv} KV heads of size {d}, batch {batch}, capacity {capacity}: Hq a multiple of Hkv, head size 64 or 128"),
            ));
        }
        let (chunk, nsplit) = if mma {
            let f = gpu.function(FAMILY, &symbol(FAMILY, &format!("decode_mma_d{d}"), DType::Bf16))?;
            raise_dynamic_smem(&f, mma_smem(d))?;
            let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(128, mma_smem(d), None).doing("querying decode_mma's occupancy")?;
            let pairs = batch * hkv * (hq / hkv).div_ceil(16);
            plan_waves(pairs, capacity, per_sm.max(1) as usize * gpu.info.sm_count as usize, MMA_TILE)
        } else {
            let blocks = batch * hkv * (hq / hkv).div_ceil(heads_per_block(hq / hkv));
            let want = (4 * gpu.info.sm_count as usize).div_ceil(blocks).max(1);
            let chunk = capacity.div_ceil(want).max(MIN_CHUNK);
            (chunk, capacity.div_ceil(chunk))
        };
        if nsplit > MAX_SPLITS {
            return Err(LabError::shape("attention decode", format!("a capacity of {capacity} rows takes {nsplit} splits; the combine step holds {MAX_SPLITS}")));
        }
        let group = (hq / hkv).min(16);
        if merge && group * (nsplit + 1) > mma_smem(d) / 4 {
            let most = mma_smem(d) / 4 / group - 1;
            return Err(LabError::shape("attention decode", format!("a capacity of {capacity} rows takes {nsplit} splits; decode_merge's merge holds {most} for {group} heads of {d}")));
        }
        let slots = batch * hq * nsplit;
        let groups = batch * hkv * (hq / hkv).div_ceil(16);
        Ok(Decode {
            gpu: gpu.clone(),
            mma,
            merge,
            batch,
            hq,
            chunk,
            nsplit,
            part_o: gpu.stream.alloc_zeros(slots * d).doing("allocating decode partials")?,
            part_ml: gpu.stream.alloc_zeros(slots * 2).doing("allocating decode partials")?,
            counts: gpu.stream.alloc_zeros(if merge { groups } else { 0 }).doing("allocating decode split counts")?,
        })
    }

    /// o [batch, hq, d] = attention of q [batch, hq, d] over rows 0..=pos[b] of each sequence
    /// (natural-log lse per (b, h) when given). The caller keeps pos[b] below the capacity.
    pub fn run<T: Elem>(&mut self, q: &CudaSlice<T>, cache: &KvCache<T>, pos: &CudaSlice<i32>, o: &mut CudaSlice<T>, mut lse: Option<&mut CudaSlice<f32>>) -> Result<()> {
        let (b, hq, hkv, d) = (self.batch, self.hq, cache.hkv, cache.d);
        if cache.batch != b || q.len() != b * hq * d || o.len() != b * hq * d || pos.len() != b || lse.as_ref().is_some_and(|l| l.len() != b * hq) {
            return Err(LabError::shape(
                "attention decode",
                format!("planned for batch {b} x {hq} heads of {d}; cache batch {}, q {}, o {}, pos {}", cache.batch, q.len(), o.len(), pos.len()),
            ));
        }
        if cache.capacity() > self.nsplit * self.chunk {
            return Err(LabError::shape("attention decode", format!("a cache of {} rows, planned for {}", cache.capacity(), self.nsplit * self.chunk)));
        }
        let gpu = &self.gpu;
        let (name, groups, smem) = if self.mma {
            (format!("decode_{}_d{d}", if self.merge { "merge" } else { "mma" }), hkv * (hq / hkv).div_ceil(16), mma_smem(d))
        } else {
            let gm = heads_per_block(hq / hkv);
            (format!("decode_split_d{d}_g{gm}"), hkv * (hq / hkv).div_ceil(gm), 0)
        };
        let f = gpu.function(FAMILY, &symbol(FAMILY, &name, T::DTYPE))?;
        if smem > 0 {
            raise_dynamic_smem(&f, smem)?;
        }
        let cfg = LaunchConfig { grid_dim: (self.nsplit as u32, groups as u32, b as u32), block_dim: (128, 1, 1), shared_mem_bytes: smem as u32 };
        let scale_log2 = std::f32::consts::LOG2_E / (d as f32).sqrt();
        let [hq_i, hkv_i, page, max_pages, chunk, nsplit, d_i] = [hq, hkv, cache.page, cache.max_pages, self.chunk, self.nsplit, d].map(|x| x as i32);
        let null = 0u64;
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(q).arg(&cache.k).arg(&cache.v).arg(&cache.table).arg(pos).arg(&mut self.part_o).arg(&mut self.part_ml);
        if self.merge {
            l.arg(&mut self.counts).arg(&mut *o);
            match lse.as_deref_mut() {
                Some(lse) => l.arg(lse),
                None => l.arg(&null),
            };
        }
        l.arg(&hq_i).arg(&hkv_i).arg(&page).arg(&max_pages).arg(&chunk).arg(&scale_log2);
        // SAFETY: q and o hold batch x hq x d, pos batch entries (checked); the table holds
        // max_pages entries per sequence, each a page of the cache (checked at construction) and
        // the caller keeps pos[b] < capacity = page x max_pages; the partials hold batch x hq x
        // nsplit slots and the grid has nsplit splits; decode_mma's dynamic shared memory is
        // DM_SMEM(d), which holds decode_merge's weights (checked in `with`); counts holds one
        // zeroed entry per (sequence, head group) of the grid, each left at zero by the group's
        // last split; lse holds batch x hq or is null.
        unsafe { l.launch(cfg) }.doing("launching attention decode")?;
        if self.merge {
            return Ok(());
        }
        let f = gpu.function(FAMILY, &symbol(FAMILY, "decode_combine", T::DTYPE))?;
        let cfg = LaunchConfig { grid_dim: (hq as u32, b as u32, 1), block_dim: (d as u32, 1, 1), shared_mem_bytes: 4 * (self.nsplit as u32 + 1) };
        let mut l = gpu.stream.launch_builder(&f);
        l.arg(&self.part_o).arg(&self.part_ml).arg(pos).arg(o);
        match lse {
            Some(lse) => l.arg(lse),
            None => l.arg(&null),
        };
        l.arg(&hq_i).arg(&d_i).arg(&chunk).arg(&nsplit);
        // SAFETY: the combine reads the ceil((pos + 1) / chunk) <= nsplit splits the split kernel
        // wrote for each (b, h), with a weight for each and the sum in its 4 (nsplit + 1) bytes
        // of shared memory,
        // and writes o (batch x hq x d) and lse (batch x hq, or null).
        unsafe { l.launch(cfg) }.map(|_| ()).doing("launching attention decode_combine")
    }
}

#[cfg(test)]
mod tests {
    /// Groups up to 8 get the smallest instance that holds them; larger ones take blocks of 8.
    /// One wave where the pairs alone fill it; else the split count whose last wave is fullest,
    /// each split whole tiles.
    #[test]
    fn the_mma_plan_fills_its_last_wave() {
        // Batch 64 x 8 heads on 264 slots: no split (two waves, 97% full).
        assert_eq!(super::plan_waves(512, 8192, 264, 64), (8192, 1));
        // Batch 1 x 8 heads at 8192 rows: 32 splits of 256 rows, 256 of 264 slots.
        assert_eq!(super::plan_waves(8, 8192, 264, 64), (256, 32));
        // A short context cannot fill the chip: splits of one tile.
        assert_eq!(super::plan_waves(8, 100, 264, 64), (64, 2));
        for (pairs, cap) in [(3, 1000), (24, 4097), (1, 32768), (512, 128)] {
            let (chunk, n) = super::plan_waves(pairs, cap, 264, 64);
            assert!(chunk % 64 == 0 && n * chunk >= cap && (n - 1) * chunk < cap, "{pairs} pairs, {cap} rows: {n} x {chunk}");
        }
    }

    #[test]
    fn each_group_gets_the_smallest_instance_that_holds_it() {
        let got: Vec<usize> = [1, 2, 3, 4, 5, 7, 8, 12, 16].map(super::heads_per_block).to_vec();
        assert_eq!(got, vec![1, 2, 4, 4, 8, 8, 8, 8, 8]);
    }
}
