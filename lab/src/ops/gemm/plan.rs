//! How the split rungs divide their work: mma_splitk's K slices and mma_warp64_tail_split's plan
//! for the last partial wave, and the fp32 workspace both sum their partials in (made inside the
//! operation, once per shape and stream).

use super::tma::wg;
use super::variants::{Config, Kind};
use super::Dims;
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::Result;
use cudarc::driver::CudaSlice;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

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

/// How a split variant divides its work on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// mma_splitk: K slices per 16x128 tile, grid.y.
    K { slices: usize },
    /// mma_warp64_tail_split.
    Tail(TailPlan),
}

impl Split {
    /// The split of a variant of this kind for `d` on `sms` SMs, `None` for one that splits nothing.
    pub fn plan(kind: Kind, d: Dims, sms: usize) -> Option<Split> {
        match kind {
            Kind::SplitK => Some(Split::K { slices: splitk_slices(d, sms) }),
            Kind::TailSplit => Some(Split::Tail(tail_plan(d, sms))),
            _ => None,
        }
    }

    /// The record's account of the split.
    pub fn describe(&self) -> (&'static str, Value) {
        match self {
            Split::Tail(p) => ("tail_split", json!({"tiles": p.tiles, "dp_tiles": p.dp_tiles, "slices": p.slices, "blocks": p.blocks()})),
            Split::K { slices } => ("splitk_slices", json!(slices)),
        }
    }
}

/// The fp32 partials and per-tile counters of a split, zero at rest (each split tile's last block
/// resets its counter): mma_splitk's slices x M x N floats and a counter per 16x128 tile;
/// mma_warp64_tail_split's 128 x 256 floats per split block and a counter per split tile.
pub struct Workspace {
    pub split: Split,
    pub ws: CudaSlice<f32>,
    pub done: CudaSlice<u32>,
}

/// (stream, split, M, N): what a workspace's sizes follow from. The stream is kept alive by the
/// workspace's buffers, so its address names it while the entry lives.
type WorkspaceKey = (usize, Split, usize, usize);

/// Workspaces made last, newest at the end: allocating is kept out of the timed launches.
static WORKSPACES: Mutex<Vec<(WorkspaceKey, Arc<Workspace>)>> = Mutex::new(Vec::new());
const WORKSPACES_KEPT: usize = 4;

/// The workspace a split variant needs for `d` on this GPU (made on first use), `None` for a
/// variant that splits nothing. Launches on one stream run in order, so they can share it.
pub fn workspace(gpu: &Gpu, config: &Config, d: Dims) -> Result<Option<Arc<Workspace>>> {
    let Some(split) = Split::plan(config.kind, d, gpu.info.sm_count as usize) else { return Ok(None) };
    let key = (Arc::as_ptr(&gpu.stream) as usize, split, d.m, d.n);
    let mut cache = WORKSPACES.lock().expect("split-K workspace cache poisoned");
    if let Some((_, w)) = cache.iter().find(|(k, _)| *k == key) {
        return Ok(Some(w.clone()));
    }
    let (ws_len, counters) = match split {
        Split::K { slices } => (if slices > 1 { slices * d.m * d.n } else { 1 }, config.launch_config(d.m, d.n).grid_dim.0 as usize),
        Split::Tail(plan) => (plan.split_blocks().max(1) * wg::BM * wg::WIDE.bn, plan.split_tiles().max(1)),
    };
    let ws = gpu.stream.alloc_zeros::<f32>(ws_len).doing("allocating the split-K workspace")?;
    let done = gpu.stream.alloc_zeros::<u32>(counters).doing("allocating the split-K counters")?;
    let w = Arc::new(Workspace { split, ws, done });
    if cache.len() == WORKSPACES_KEPT {
        cache.remove(0);
    }
    cache.push((key, w.clone()));
    Ok(Some(w))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
