//! Ring all-reduce: a reduce-scatter then an all-gather around the ring r -> r+1.
//!
//! Napkin math: the data is cut into `n` chunks; each of the `2(n-1)` steps moves one chunk to
//! the next rank, so every rank sends and receives `2(n-1)/n` of the buffer: the bandwidth
//! optimum for an all-reduce (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
//! clusters of workstations", JPDC 2009), whatever `n` is.
//!
//! Sums are kept in f32 whatever the storage type: the reduce-scatter carries f32 partial sums,
//! each rank rounds its finished chunk once to the storage type, and the all-gather carries the
//! rounded values. For f16/bf16 the reduce-scatter therefore moves twice the storage bytes.

use super::transport::{all_gather_u64, bytes_of, bytes_of_mut, Transport, Wire};
use crate::kernels::DType;
use crate::ops::Elem;
use crate::{LabError, Result};
use std::ops::Range;

/// How each step of the ring moves its chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Blocking send and receive as in the textbook ring. Even ranks send first and odd ranks
    /// receive first: if every rank sent first, sends too large to be buffered would deadlock.
    Blocking,
    /// One combined send-receive per step (MPI_Sendrecv): no ordering needed.
    SendRecv,
    /// Send-receive in segments of at most this many bytes; the sum of segment k is added while
    /// segment k+1 is in flight (on another thread).
    Pipelined { segment_bytes: usize },
}

/// Segment of the pipelined ring: large enough to amortise a message, small enough that the
/// add of one overlaps the transfer of the next (tuned by the `allreduce` sweep, not derived).
pub const DEFAULT_SEGMENT_BYTES: usize = 1 << 20;

impl Algorithm {
    pub const ALL: [Algorithm; 3] =
        [Algorithm::Blocking, Algorithm::SendRecv, Algorithm::Pipelined { segment_bytes: DEFAULT_SEGMENT_BYTES }];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Blocking => "ring_blocking",
            Algorithm::SendRecv => "ring_sendrecv",
            Algorithm::Pipelined { .. } => "ring_pipelined",
        }
    }

    pub fn parse(name: &str) -> Result<Self> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| LabError::Invalid(format!("unknown ring algorithm `{name}`")))
    }

    fn code(self) -> u64 {
        match self {
            Algorithm::Blocking => 1,
            Algorithm::SendRecv => 2,
            Algorithm::Pipelined { segment_bytes } => 3 | (segment_bytes as u64) << 8,
        }
    }
}

/// The `i`-th of `n` nearly equal parts of `0..len` (sizes differ by at most one; some are empty
/// when `len < n`).
pub fn part(len: usize, n: usize, i: usize) -> Range<usize> {
    part_aligned(len, n, i, 1)
}

/// [`part`] with every boundary but the last a multiple of `align`, so that each part starts on
/// a vector boundary (the GPU ring's 16-byte loads).
pub fn part_aligned(len: usize, n: usize, i: usize, align: usize) -> Range<usize> {
    let at = |i: usize| if i == n { len } else { (i as u128 * len as u128 / n as u128) as usize / align * align };
    at(i)..at(i + 1)
}

/// The ring's schedule, shared by every implementation: at reduce-scatter step `step`, rank `r`
/// sends chunk `.0` to the next rank and folds chunk `.1` from the previous one into its own.
/// After `n - 1` steps rank r holds the full sum of chunk (r + 1) mod n.
pub fn reduce_scatter_chunks(r: usize, n: usize, step: usize) -> (usize, usize) {
    ((r + n - step) % n, (r + 2 * n - step - 1) % n)
}

/// At all-gather step `step`, rank `r` forwards chunk `.0` and stores chunk `.1`: each rank starts
/// with its finished chunk (r + 1) mod n.
pub fn all_gather_chunks(r: usize, n: usize, step: usize) -> (usize, usize) {
    ((r + 1 + n - step) % n, (r + n - step) % n)
}

/// A checked all-reduce of `len` elements of one dtype over one transport: made collectively
/// (every rank states its length, dtype and algorithm, and all ranks fail alike when they differ,
/// instead of hanging on a receive that never matches), then run as often as needed.
pub struct Ring<'t> {
    t: &'t dyn Transport,
    len: usize,
    dtype: DType,
    alg: Algorithm,
    /// Receive buffers of the reduce-scatter (two segments when pipelined).
    scratch: Vec<f32>,
    /// The f32 sums of a half-type buffer.
    wide: Vec<f32>,
}

impl<'t> Ring<'t> {
    /// Collective: every rank must call it.
    pub fn new(t: &'t dyn Transport, len: usize, dtype: DType, alg: Algorithm) -> Result<Self> {
        let lens = all_gather_u64(t, len as u64)?;
        if lens.iter().any(|&l| l != len as u64) {
            return Err(LabError::Invalid(format!("all-reduce lengths differ across ranks: {lens:?} (rank order)")));
        }
        let code = (dtype as u64) | alg.code() << 4;
        let codes = all_gather_u64(t, code)?;
        if codes.iter().any(|&c| c != code) {
            return Err(LabError::Invalid(format!(
                "all-reduce dtype or algorithm differs across ranks (rank {} has {} {})",
                t.rank(),
                dtype.name(),
                alg.name()
            )));
        }
        let n = t.size();
        let max_chunk = len.div_ceil(n);
        let scratch_len = match alg {
            Algorithm::Pipelined { .. } => 2 * max_chunk.div_ceil(segments(alg, len, n)),
            _ => max_chunk,
        };
        Ok(Ring { t, len, dtype, alg, scratch: vec![0.0; scratch_len], wide: Vec::new() })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sums `data` elementwise over all ranks, in place, on every rank.
    pub fn all_reduce<T: Elem + Wire>(&mut self, data: &mut [T]) -> Result<()> {
        if data.len() != self.len || T::DTYPE != self.dtype {
            return Err(LabError::Invalid(format!(
                "all-reduce was set up for {} x {} and given {} x {}",
                self.len,
                self.dtype.name(),
                data.len(),
                T::DTYPE.name()
            )));
        }
        let n = self.t.size();
        if n == 1 || self.len == 0 {
            return Ok(());
        }
        let own = part(self.len, n, (self.t.rank() + 1) % n);
        if let Some(acc) = as_f32_mut(data) {
            self.reduce_scatter(acc)?;
        } else {
            // The f32 copy is kept between calls: a fresh one would fault in its pages every time.
            let mut acc = std::mem::take(&mut self.wide);
            acc.resize(self.len, 0.0);
            widen_into(data, &mut acc);
            let summed = self.reduce_scatter(&mut acc);
            narrow_into(&acc[own.clone()], &mut data[own]);
            self.wide = acc;
            summed?;
        }
        self.all_gather(data)
    }

    /// Sends `send` to the next rank and receives `recv` from the previous one.
    fn exchange(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (r, n) = (self.t.rank(), self.t.size());
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        match self.alg {
            Algorithm::Blocking if r % 2 == 0 => {
                self.t.send(next, send)?;
                self.t.recv(prev, recv)
            }
            Algorithm::Blocking => {
                self.t.recv(prev, recv)?;
                self.t.send(next, send)
            }
            _ => self.t.sendrecv(send, next, recv, prev),
        }
    }

    /// After this, rank r holds the full sum of chunk (r + 1) mod n.
    fn reduce_scatter(&mut self, acc: &mut [f32]) -> Result<()> {
        let (r, n, len) = (self.t.rank(), self.t.size(), self.len);
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = (|| {
            for step in 0..n - 1 {
                let (send, recv) = reduce_scatter_chunks(r, n, step);
                let (send, recv) = (part(len, n, send), part(len, n, recv));
                match self.alg {
                    Algorithm::Pipelined { .. } => self.pipelined_step(acc, send, recv, &mut scratch)?,
                    _ => {
                        let tmp = &mut scratch[..recv.len()];
                        self.exchange(bytes_of(&acc[send]), bytes_of_mut(tmp))?;
                        add(&mut acc[recv], tmp);
                    }
                }
            }
            Ok(())
        })();
        self.scratch = scratch;
        result
    }

    /// One reduce-scatter step in `k` segments: while segment i travels, segment i-1 is added on
    /// a helper thread. Two receive slots go back and forth between the threads, so a slot is
    /// refilled only once its sum is done. (Not rayon: a blocking receive inside its pool can
    /// starve the very ranks it waits for when several ranks share one process.)
    fn pipelined_step(&self, acc: &mut [f32], send: Range<usize>, recv: Range<usize>, scratch: &mut [f32]) -> Result<()> {
        let k = segments(self.alg, self.len, self.t.size());
        let (send_chunk, recv_chunk) = disjoint(acc, send, recv);
        if k == 1 {
            let tmp = &mut scratch[..recv_chunk.len()];
            self.exchange(bytes_of(send_chunk), bytes_of_mut(tmp))?;
            add(recv_chunk, tmp);
            return Ok(());
        }
        let recv_len = recv_chunk.len();
        let half = scratch.len() / 2;
        let (a, b) = scratch.split_at_mut(half);
        let (full_tx, full_rx) = std::sync::mpsc::channel::<(usize, &mut [f32])>();
        let (free_tx, free_rx) = std::sync::mpsc::channel::<&mut [f32]>();
        free_tx.send(a).and_then(|_| free_tx.send(b)).expect("fresh channel");
        std::thread::scope(|s| {
            s.spawn(move || {
                for (i, slot) in full_rx {
                    let q = part(recv_chunk.len(), k, i);
                    add(&mut recv_chunk[q.clone()], &slot[..q.len()]);
                    if free_tx.send(slot).is_err() {
                        break;
                    }
                }
            });
            for i in 0..k {
                let slot = free_rx.recv().expect("the adder returns every slot");
                let (out, q) = (part(send_chunk.len(), k, i), part(recv_len, k, i));
                self.exchange(bytes_of(&send_chunk[out]), bytes_of_mut(&mut slot[..q.len()]))?;
                full_tx.send((i, slot)).expect("the adder runs until the channel closes");
            }
            drop(full_tx);
            Ok(())
        })
    }

    /// Each rank starts with its finished chunk (r + 1) mod n and forwards what it receives.
    fn all_gather<T: Wire>(&self, data: &mut [T]) -> Result<()> {
        let (r, n, len) = (self.t.rank(), self.t.size(), self.len);
        for step in 0..n - 1 {
            let (send, recv) = all_gather_chunks(r, n, step);
            let (send, recv) = (part(len, n, send), part(len, n, recv));
            let (s, q) = disjoint(data, send, recv);
            self.exchange(bytes_of(s), bytes_of_mut(q))?;
        }
        Ok(())
    }
}

/// Segments per reduce-scatter step: the same on every rank (it depends on `len` and `n` only),
/// so every send has its matching receive.
fn segments(alg: Algorithm, len: usize, n: usize) -> usize {
    match alg {
        Algorithm::Pipelined { segment_bytes } => (len.div_ceil(n) * 4).div_ceil(segment_bytes.max(4)).max(1),
        _ => 1,
    }
}

fn add(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
}

/// A shared view of `a` and a mutable view of `b`, two disjoint ranges of one slice.
fn disjoint<T>(v: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    assert!(a.end <= b.start || b.end <= a.start, "ranges overlap: {a:?} {b:?}");
    if a.end <= b.start {
        let (lo, hi) = v.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = v.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

/// Storage type to f32; half's slice conversions use the CPU's F16C instructions when present.
fn widen_into<T: Elem>(src: &[T], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    match T::DTYPE {
        DType::F16 => cast::<T, half::f16>(src).convert_to_f32_slice(dst),
        DType::Bf16 => cast::<T, half::bf16>(src).convert_to_f32_slice(dst),
        DType::F32 => dst.copy_from_slice(cast::<T, f32>(src)),
    }
}

/// f32 to the storage type, rounding to nearest even.
fn narrow_into<T: Elem>(src: &[f32], dst: &mut [T]) {
    use half::slice::HalfFloatSliceExt;
    match T::DTYPE {
        DType::F16 => cast_mut::<T, half::f16>(dst).convert_from_f32_slice(src),
        DType::Bf16 => cast_mut::<T, half::bf16>(dst).convert_from_f32_slice(src),
        DType::F32 => cast_mut::<T, f32>(dst).copy_from_slice(src),
    }
}

/// `v` as a slice of `U`, which `T::DTYPE` says it is.
fn cast<T: 'static, U: 'static>(v: &[T]) -> &[U] {
    assert_eq!(std::any::TypeId::of::<T>(), std::any::TypeId::of::<U>(), "dtype and type disagree");
    // SAFETY: T and U are the same type.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) }
}

fn cast_mut<T: 'static, U: 'static>(v: &mut [T]) -> &mut [U] {
    assert_eq!(std::any::TypeId::of::<T>(), std::any::TypeId::of::<U>(), "dtype and type disagree");
    // SAFETY: T and U are the same type.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len()) }
}

fn as_f32_mut<T: 'static>(v: &mut [T]) -> Option<&mut [f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32.
        Some(unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len()) })
    } else {
        None
    }
}

/// One-shot all-reduce: [`Ring::new`] then [`Ring::all_reduce`].
pub fn all_reduce<T: Elem + Wire>(t: &dyn Transport, data: &mut [T], alg: Algorithm) -> Result<()> {
    Ring::new(t, data.len(), T::DTYPE, alg)?.all_reduce(data)
}

/// The exact elementwise sum, in f64, of every rank's input.
pub fn reference_sum<T: Elem>(inputs: &[Vec<T>]) -> Vec<f64> {
    use rayon::prelude::*;
    let len = inputs.first().map_or(0, Vec::len);
    (0..len).into_par_iter().map(|i| inputs.iter().map(|v| v[i].to_f64()).sum()).collect()
}

#[cfg(test)]
mod tests {
    use super::super::transport::run_threads;
    use super::*;
    use crate::ops::compare::compare_elems;
    use crate::record::Tolerance;
    use half::{bf16, f16};

    /// Deterministic, rank-dependent values of both signs (no zeros).
    fn input<T: Elem>(rank: usize, len: usize) -> Vec<T> {
        (0..len).map(|i| T::from_f32(((i * 7919 + rank * 104729) % 1000) as f32 / 250.0 - 1.9987)).collect()
    }

    /// Every rank's result equals the f64 sum within `rtol` and all ranks agree bit for bit.
    fn check<T: Elem + Wire + PartialEq + std::fmt::Debug>(n: usize, len: usize, alg: Algorithm, tol: Tolerance) {
        let inputs: Vec<Vec<T>> = (0..n).map(|r| input(r, len)).collect();
        let expected = reference_sum(&inputs);
        let out = run_threads(n, |t| {
            let mut v = inputs[t.rank()].clone();
            all_reduce(t, &mut v, alg)?;
            Ok(v)
        })
        .unwrap();
        for (r, v) in out.iter().enumerate() {
            let e = compare_elems(v, &expected, tol, "f64");
            assert!(e.passed(), "{} n={n} len={len} {} rank {r}: {e:?}", alg.name(), T::DTYPE.name());
            assert_eq!(v, &out[0], "ranks disagree");
        }
    }

    #[test]
    fn every_algorithm_sums_any_length_on_any_world_size() {
        let tol = Tolerance { atol: 1e-5, rtol: 1e-5 };
        let small = Algorithm::Pipelined { segment_bytes: 12 };
        for n in 1..=5 {
            for len in [0, 1, 2, 3, 4, 5, 7, 64, 1001, 4099] {
                for alg in [Algorithm::Blocking, Algorithm::SendRecv, Algorithm::ALL[2], small] {
                    check::<f32>(n, len, alg, tol);
                }
            }
        }
    }

    #[test]
    fn half_types_accumulate_in_f32_and_round_once() {
        // One rounding of an exact-in-f32 sum: within half an ulp of the storage type (plus the
        // f32 sum's own error, far smaller).
        for n in [2, 3, 4] {
            for len in [0, 1, 3, 1001] {
                for alg in Algorithm::ALL {
                    check::<f16>(n, len, alg, Tolerance { atol: 1e-6, rtol: 4.9e-4 });
                    check::<bf16>(n, len, alg, Tolerance { atol: 1e-6, rtol: 3.9e-3 });
                }
            }
        }
    }

    #[test]
    fn a_ring_runs_again_with_the_same_result() {
        for alg in Algorithm::ALL {
            let out = run_threads(3, |t| {
                let x: Vec<f16> = input(t.rank(), 1001);
                let mut ring = Ring::new(t, x.len(), DType::F16, alg)?;
                let (mut a, mut b) = (x.clone(), x.clone());
                ring.all_reduce(&mut a)?;
                ring.all_reduce(&mut b)?;
                Ok((a, b))
            })
            .unwrap();
            assert!(out.iter().all(|(a, b)| a == b && a == &out[0].0), "{}", alg.name());
        }
    }

    #[test]
    fn mismatched_lengths_fail_on_every_rank_instead_of_hanging() {
        let out = run_threads(3, |t| {
            let mut v = vec![1.0f32; if t.rank() == 1 { 10 } else { 11 }];
            Ok(all_reduce(t, &mut v, Algorithm::SendRecv).unwrap_err().to_string())
        })
        .unwrap();
        for e in &out {
            assert!(e.contains("lengths differ across ranks: [11, 10, 11]"), "{e}");
        }
        let out = run_threads(2, |t| {
            let alg = if t.rank() == 0 { Algorithm::Blocking } else { Algorithm::SendRecv };
            Ok(Ring::new(t, 4, DType::F32, alg).err().map(|e| e.to_string()))
        })
        .unwrap();
        assert!(out.iter().all(|e| e.as_deref().is_some_and(|e| e.contains("differs across ranks"))), "{out:?}");
    }

    #[test]
    fn parts_cover_the_range_in_order() {
        for (len, n) in [(0, 3), (2, 5), (10, 3), (1 << 20, 7)] {
            let parts: Vec<_> = (0..n).map(|i| part(len, n, i)).collect();
            assert_eq!(parts[0].start, 0);
            assert_eq!(parts[n - 1].end, len);
            assert!(parts.windows(2).all(|w| w[0].end == w[1].start && w[1].len().abs_diff(w[0].len()) <= 1));
        }
        for (len, n, align) in [(0, 2, 4), (3, 2, 4), (1001, 3, 8), (1 << 20, 7, 4)] {
            let parts: Vec<_> = (0..n).map(|i| part_aligned(len, n, i, align)).collect();
            assert_eq!((parts[0].start, parts[n - 1].end), (0, len));
            assert!(parts.windows(2).all(|w| w[0].end == w[1].start && w[1].start % align == 0));
            assert!(parts.iter().all(|p| p.len() <= len.div_ceil(n) + align), "{parts:?}");
        }
    }
}
