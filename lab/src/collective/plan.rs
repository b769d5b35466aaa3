//! The ring all-reduce as a list of phases, for executors that issue whole rounds of transfers at
//! once: the GPU ring over NCCL send/recv ([`super::nccl`]) and [`RingPlan::simulate`], which runs
//! the same phases on host vectors so that the schedule is checked without GPUs.
//!
//! In a phase every rank r sends one segment to r + 1, and r + 1 receives it into the same index
//! range of its own buffer: chunk indices agree because r + 1 folds at step s the chunk r sends
//! at step s ([`reduce_scatter_chunks`], [`all_gather_chunks`]). Each step's chunk is cut into
//! segments so that the sum of segment k can run while segment k + 1 travels.
//!
//! Dependencies an asynchronous executor must honour, per rank:
//! - a reduce-scatter segment lands in a scratch slot (its offset inside the chunk), and is added
//!   into the buffer after it arrives;
//! - every phase after the first reduce-scatter step sends, for segment k, what the previous
//!   step's add of segment k produced, and reuses segment k's scratch slot: it waits for that add.
//!
//! All-gather segments land in place; the all-gather needs no other ordering than issue order.

use super::ring::{all_gather_chunks, part_aligned, reduce_scatter_chunks};
use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPlan {
    pub len: usize,
    pub ranks: usize,
    /// Segments per chunk (at least one).
    pub segments: usize,
    /// Every chunk and segment starts at a multiple of this many elements.
    pub align: usize,
}

/// One segment on the move: rank r sends `sends[r].range` of its buffer to rank r + 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Send {
    pub range: Range<usize>,
    /// Where the segment starts inside its chunk: the receiver's scratch offset.
    pub in_chunk: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// True in the reduce-scatter (the receiver adds), false in the all-gather (it stores).
    pub reduce: bool,
    /// The step within its half (0-based).
    pub step: usize,
    pub segment: usize,
    /// Indexed by sending rank.
    pub sends: Vec<Send>,
}

impl Phase {
    /// What rank `r` sends to r + 1 in this phase; `None` when its segment is empty.
    pub fn outgoing(&self, r: usize) -> Option<&Send> {
        Some(&self.sends[r]).filter(|s| !s.range.is_empty())
    }

    /// What rank `r` receives from r - 1 (into the same range of its buffer); `None` when empty.
    /// A rank with nothing to send may still have something to receive.
    pub fn incoming(&self, r: usize) -> Option<&Send> {
        let n = self.sends.len();
        self.outgoing((r + n - 1) % n)
    }
}

impl RingPlan {
    /// A plan whose segments hold at most `segment_elems` elements (`None`: one per chunk).
    pub fn new(len: usize, ranks: usize, segment_elems: Option<usize>, align: usize) -> Self {
        let chunk = len.div_ceil(ranks.max(1)) + align;
        let segments = segment_elems.map_or(1, |s| chunk.div_ceil(s.max(align)).max(1));
        RingPlan { len, ranks, segments, align }
    }

    /// The largest chunk: the scratch each rank needs.
    pub fn max_chunk(&self) -> usize {
        (0..self.ranks).map(|c| self.chunk(c).len()).max().unwrap_or(0)
    }

    fn chunk(&self, c: usize) -> Range<usize> {
        part_aligned(self.len, self.ranks, c, self.align)
    }

    fn segment(&self, c: usize, k: usize) -> Send {
        let chunk = self.chunk(c);
        let within = part_aligned(chunk.len(), self.segments, k, self.align);
        Send { range: chunk.start + within.start..chunk.start + within.end, in_chunk: within.start }
    }

    /// Every phase, in the order they must be issued: reduce-scatter steps then all-gather steps,
    /// segment by segment.
    pub fn phases(&self) -> Vec<Phase> {
        let n = self.ranks;
        if n < 2 {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(2 * (n - 1) * self.segments);
        for reduce in [true, false] {
            for step in 0..n - 1 {
                for segment in 0..self.segments {
                    let sends = (0..n)
                        .map(|r| {
                            let (send, _) = if reduce { reduce_scatter_chunks(r, n, step) } else { all_gather_chunks(r, n, step) };
                            self.segment(send, segment)
                        })
                        .collect();
                    out.push(Phase { reduce, step, segment, sends });
                }
            }
        }
        out
    }

    /// Runs the plan on host buffers, one per rank, summing in f32 with `round` applied after
    /// every add (the storage type's rounding): what the GPU executor computes, phase by phase.
    pub fn simulate(&self, bufs: &mut [Vec<f32>], round: impl Fn(f32) -> f32) {
        let n = self.ranks;
        assert_eq!(bufs.len(), n, "one buffer per rank");
        for phase in self.phases() {
            // Every send of a phase reads the buffers as they were before the phase.
            let moved: Vec<Option<Vec<f32>>> = (0..n).map(|r| phase.outgoing(r).map(|s| bufs[r][s.range.clone()].to_vec())).collect();
            for (r, buf) in bufs.iter_mut().enumerate() {
                let Some(incoming) = phase.incoming(r) else { continue };
                let data = moved[(r + n - 1) % n].as_ref().expect("an incoming segment was sent");
                let dst = &mut buf[incoming.range.clone()];
                if phase.reduce {
                    dst.iter_mut().zip(data).for_each(|(a, b)| *a = round(*a + b));
                } else {
                    dst.copy_from_slice(data);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_sums_any_length_on_any_ring_and_every_rank_agrees() {
        for n in 1..=5 {
            for len in [0, 1, 3, 4, 7, 64, 1001, 4099] {
                for (segment, align) in [(None, 1), (None, 4), (Some(16), 4), (Some(3), 1), (Some(40), 8)] {
                    let inputs: Vec<Vec<f32>> = (0..n).map(|r| (0..len).map(|i| ((i * 31 + r * 7) % 13) as f32).collect()).collect();
                    let expected: Vec<f32> = (0..len).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
                    let plan = RingPlan::new(len, n, segment, align);
                    let mut bufs = inputs.clone();
                    plan.simulate(&mut bufs, |x| x);
                    for (r, b) in bufs.iter().enumerate() {
                        assert_eq!(b, &expected, "n={n} len={len} {plan:?} rank {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_rank_with_nothing_to_send_still_receives() {
        // One element on two ranks: chunk 0 is empty, chunk 1 holds the element.
        let plan = RingPlan::new(1, 2, None, 4);
        let first = &plan.phases()[0];
        assert!(first.outgoing(0).is_none() && first.incoming(0).is_some());
        assert!(first.outgoing(1).is_some() && first.incoming(1).is_none());
    }

    #[test]
    fn segments_are_aligned_disjoint_and_cover_every_chunk() {
        let plan = RingPlan::new(1001, 3, Some(64), 8);
        assert!(plan.segments > 1);
        let phases = plan.phases();
        assert_eq!(phases.len(), 2 * 2 * plan.segments);
        for p in &phases {
            for s in &p.sends {
                assert_eq!(s.range.start % 8, 0, "{s:?}");
                assert!(s.range.len() <= 64 + 8 && s.in_chunk + s.range.len() <= plan.max_chunk(), "{s:?}");
            }
            // The ranks of a phase send distinct chunks.
            let starts: std::collections::BTreeSet<_> = p.sends.iter().map(|s| s.range.start - s.in_chunk).collect();
            assert_eq!(starts.len(), 3);
        }
        // Over one step, the segments of a rank tile its chunk exactly.
        let covered: usize = phases.iter().filter(|p| p.reduce && p.step == 0).map(|p| p.sends[0].range.len()).sum();
        assert_eq!(covered, part_aligned(1001, 3, 0, 8).len());
    }
}
