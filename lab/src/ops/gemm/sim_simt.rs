//! CPU replays of the SIMT rungs' thread maps (kernels/gemm/simt.cu), tests only.

/// The SIMT rungs' thread-to-output and thread-to-tile-load maps (mirrors of kernels/gemm/) cover
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
