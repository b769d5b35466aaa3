//! The `allreduce` experiment: an OSU-style size sweep of the rings of [`crate::collective`]
//! beside MPI_Allreduce; and what every collective experiment shares: the per-rank context and
//! inputs, the tolerance, the case runner, and the collective timing every rank takes part in.
//!
//! Figures, as nccl-tests defines them (doc/PERFORMANCE.md in NVIDIA/nccl-tests):
//! algbw = S / t for a message of S bytes, and busbw = algbw * 2(n-1)/n for an all-reduce, the
//! rate each rank's link must sustain, comparable across rank counts. `t` is the median over
//! repetitions of the slowest rank's time, each repetition starting right after a barrier.

use crate::collective::ring::{Algorithm, Ring};
use crate::collective::transport::{all_gather_u64, bytes_of, run_threads, Transport, Wire};
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Measurement, RunOptions, Session};
use crate::kernels::DType;
use crate::ops::compare::compare_elems;
use crate::ops::Elem;
use crate::profile::{Budget, TimeSummary, TimingMode, Work, MAX_WARMUP_ROUNDS, SETTLED};
use crate::record::Tolerance;
use crate::{LabError, Result};
use serde_json::{json, Value};

pub struct AllReduce;

/// What every rank needs to run a case the same way.
#[derive(Clone)]
pub struct Ctx {
    pub seed: u64,
    pub budget: Budget,
    variants: Vec<String>,
    provider: Option<String>,
}

impl Ctx {
    pub fn new(opts: &RunOptions) -> Self {
        Ctx { seed: opts.seed, budget: opts.budget(), variants: opts.variants.clone(), provider: opts.provider.clone() }
    }
    pub fn wants(&self, variant: &str, provider: &str) -> bool {
        (self.variants.is_empty() || self.variants.iter().any(|v| v == variant))
            && self.provider.as_deref().is_none_or(|p| p == provider)
    }
}

/// Message sizes of the sweep: 4 B to `max` in steps of 4x, as OSU's osu_allreduce.
pub(super) fn sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(4usize), |b| Some(b * 4)).take_while(|&b| b <= max).collect()
}

impl Experiment for AllReduce {
    fn name(&self) -> &'static str {
        "allreduce"
    }
    fn description(&self) -> &'static str {
        "ring all-reduce (blocking, sendrecv, pipelined) vs MPI_Allreduce: latency, algbw, busbw by size"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["bytes=16777216 dtype=f32", "bytes=268435456 dtype=f32"]
    }
    fn cases(&self, _: &Backend, quick: bool) -> Vec<Value> {
        // Under mpirun the world is the launched one; otherwise thread worlds of 2 and 4 ranks.
        let (worlds, transport, max) = match crate::collective::launched().ok().flatten() {
            Some(t) => (vec![t.size()], "mpi", if quick { 1 << 20 } else { 256 << 20 }),
            None => (vec![2, 4], "threads", if quick { 1 << 20 } else { 64 << 20 }),
        };
        let mut cases = Vec::new();
        for &n in &worlds {
            let case = |len: usize, dtype: DType, timed: bool| {
                let mut c = json!({"bytes": len * dtype.size(), "len": len, "dtype": dtype.name(), "ranks": n, "transport": transport});
                if !timed {
                    c["timed"] = false.into();
                }
                c
            };
            // Correctness gates: empty, fewer elements than ranks, an odd length, half types.
            for len in [0, n - 1, 1001] {
                cases.push(case(len, DType::F32, false));
            }
            for dtype in [DType::F16, DType::Bf16] {
                cases.push(case(1001, dtype, false));
            }
            cases.extend(sizes(max).into_iter().map(|b| case(b / 4, DType::F32, true)));
            for dtype in [DType::F16, DType::Bf16] {
                cases.push(case(max.min(16 << 20) / 2, dtype, true));
            }
        }
        cases
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        run_case_with(s, case, measure)
    }
    fn follow_case(&self, opts: &RunOptions, case: &Value) -> Result<()> {
        follow_case_with(opts, case, measure)
    }
}

/// What a collective experiment measures on one rank of a world.
pub type Measure = fn(&dyn Transport, &Ctx, &Value) -> Result<Vec<Measurement>>;

/// Rank 0's side of a collective case: `measure` on the case's world (the MPI job, or a world of
/// threads), then the records, emitted by rank 0 alone.
pub fn run_case_with(s: &mut Session, case: &Value, measure: Measure) -> Result<()> {
    let ctx = Ctx::new(&s.opts);
    let n = param_usize(case, "ranks")?;
    let measurements = match param_str(case, "transport")? {
        "mpi" => measure(launched_world(n)?, &ctx, case)?,
        "threads" => run_threads(n, |t| measure(t, &ctx, case))?.swap_remove(0),
        other => return Err(LabError::Invalid(format!("unknown transport `{other}`"))),
    };
    for m in measurements {
        s.emit(m)?;
    }
    Ok(())
}

/// The other ranks' side: take part in the same collectives and keep nothing.
pub fn follow_case_with(opts: &RunOptions, case: &Value, measure: Measure) -> Result<()> {
    let n = param_usize(case, "ranks")?;
    measure(launched_world(n)?, &Ctx::new(opts), case).map(drop)
}

/// The launched world, which must have `n` ranks.
pub fn launched_world(n: usize) -> Result<&'static dyn Transport> {
    let t = crate::collective::launched()?.ok_or_else(|| LabError::Invalid(format!("this case needs an MPI world: run it under `mpirun -n {n}`")))?;
    if t.size() != n {
        return Err(LabError::Invalid(format!("this case needs {n} ranks and the world has {}", t.size())));
    }
    Ok(t)
}

/// One rank's input for a case: uniform in [-1, 1), from the run's seed, the case and the rank.
pub fn rank_input<T: Elem>(seed: u64, case: &Value, rank: usize, len: usize) -> Vec<T> {
    use rand::Rng;
    let mut rng = rng_for(seed, &json!({"case": case, "rank": rank}));
    (0..len).map(|_| T::from_f32(rng.random::<f32>() * 2.0 - 1.0)).collect()
}

/// Sum of `n` values in [-1, 1) in f32 in any order: at most (n-1) roundings of a partial sum no
/// larger than n, plus one rounding to the storage type.
pub fn tolerance(dtype: DType, n: usize) -> Tolerance {
    let atol = 1e-7 * (n * n) as f64;
    let rtol = match dtype {
        DType::F32 => 1e-6,
        DType::F16 => 4.9e-4,
        DType::Bf16 => 3.9e-3,
    };
    Tolerance { atol, rtol }
}

fn measure(t: &dyn Transport, ctx: &Ctx, case: &Value) -> Result<Vec<Measurement>> {
    match DType::parse(param_str(case, "dtype")?)? {
        DType::F32 => measure_typed::<f32>(t, ctx, case),
        DType::F16 => measure_typed::<half::f16>(t, ctx, case),
        DType::Bf16 => measure_typed::<half::bf16>(t, ctx, case),
    }
}

/// Runs every admitted provider on this rank's part of the case; rank 0 returns the checked
/// measurements, the other ranks theirs unchecked (discarded by the caller).
fn measure_typed<T: Elem + Wire>(t: &dyn Transport, ctx: &Ctx, case: &Value) -> Result<Vec<Measurement>> {
    let (r, n, len) = (t.rank(), t.size(), param_usize(case, "len")?);
    if param_usize(case, "ranks")? != n {
        return Err(LabError::Invalid(format!("case {case} is for another world size than {n}")));
    }
    let input: Vec<T> = rank_input(ctx.seed, case, r, len);
    // Only rank 0 judges: the exact sum of every rank's input, regenerated from the seed.
    let expected: Option<Vec<f64>> = (r == 0).then(|| {
        let mut acc = vec![0f64; len];
        for q in 0..n {
            let x: Vec<T> = if q == 0 { input.clone() } else { rank_input(ctx.seed, case, q, len) };
            acc.iter_mut().zip(&x).for_each(|(a, x)| *a += x.to_f64());
        }
        acc
    });
    let tol = tolerance(T::DTYPE, n);
    let check = |y: &[T]| expected.as_ref().map(|e| compare_elems(y, e, tol, "f64-sum"));
    let timed = param_timed(case);
    let bytes = (len * T::DTYPE.size()) as u64;
    let mut out = Vec::new();
    #[allow(unused_mut)]
    let mut peer: Option<Vec<f32>> = None;

    #[cfg(feature = "mpi")]
    if t.kind() == "mpi" && T::DTYPE == DType::F32 && ctx.wants("MPI_Allreduce", "mpi") {
        let w = crate::collective::mpi::world().expect("an MPI transport implies a world")?;
        let send: Vec<f32> = input.iter().map(|x| x.to_f32()).collect();
        let mut recv = vec![f32::NAN; len];
        w.all_reduce_f32(&send, &mut recv)?;
        let as_t = |v: &[f32]| v.iter().map(|&x| T::from_f32(x)).collect::<Vec<T>>();
        let before = check(&as_t(&recv));
        let time = if timed { Some(time_collective(t, &ctx.budget, || (), || w.all_reduce_f32(&send, &mut recv))?) } else { None };
        let after = check(&as_t(&recv));
        let same = ranks_identical(t, bytes_of(&recv))?;
        let mut m = figure("MPI_Allreduce", "mpi", case, bytes, n, time, before, after, tol, same);
        m.extra.insert("mpi_library".into(), crate::collective::mpi::library_version().into());
        out.push(m);
        peer = Some(recv);
    }

    for alg in Algorithm::ALL {
        if !ctx.wants(alg.name(), "lab") {
            continue;
        }
        let mut ring = Ring::new(t, len, T::DTYPE, alg)?;
        let mut y = vec![T::from_f32(f32::NAN); len];
        y.copy_from_slice(&input);
        ring.all_reduce(&mut y)?;
        let before = check(&y);
        let time = if timed {
            // In place: every repetition starts again from this rank's input (not timed).
            let y = std::cell::RefCell::new(&mut y);
            let ring = std::cell::RefCell::new(&mut ring);
            Some(time_collective(t, &ctx.budget, || y.borrow_mut().copy_from_slice(&input), || ring.borrow_mut().all_reduce(&mut y.borrow_mut()))?)
        } else {
            None
        };
        let after = check(&y);
        let same = ranks_identical(t, bytes_of(&y))?;
        let mut m = figure(alg.name(), "lab", case, bytes, n, time, before, after, tol, same);
        if let Some(p) = &peer {
            let d = y.iter().zip(p).map(|(a, b)| (a.to_f64() - *b as f64).abs()).fold(0.0, f64::max);
            m.extra.insert("max_abs_vs_mpi".into(), d.into());
        }
        m.extra.insert("wire_bytes_per_rank".into(), wire_bytes(len, n, T::DTYPE).into());
        if let Algorithm::Pipelined { segment_bytes } = alg {
            m.extra.insert("segment_bytes".into(), segment_bytes.into());
        }
        out.push(m);
    }
    Ok(out)
}

/// Bytes each rank sends in our ring: f32 partial sums in the reduce-scatter, the storage type in
/// the all-gather.
pub fn wire_bytes(len: usize, n: usize, dtype: DType) -> u64 {
    let moved = (len as u64 * (n as u64 - 1)).div_ceil(n as u64);
    moved * (4 + dtype.size() as u64)
}

/// A collective's measurement with its bandwidths (nccl-tests' algbw and busbw).
#[allow(clippy::too_many_arguments)]
pub(super) fn figure(
    variant: &str,
    provider: &str,
    case: &Value,
    bytes: u64,
    n: usize,
    time: Option<(TimeSummary, TimingMode)>,
    before: Option<crate::record::ErrorStats>,
    after: Option<crate::record::ErrorStats>,
    tol: Tolerance,
    same: bool,
) -> Measurement {
    let mut m = Measurement::new(variant, provider, case, Work { bytes, flops: 0 });
    m.error = match (before, after) {
        (Some(b), Some(a)) => Some(crate::ops::compare::first_failure(b, a)),
        (b, a) => b.or(a),
    };
    m.tolerance = Some(tol);
    if let Some((ts, _)) = &time {
        let algbw = bytes as f64 / (ts.median * 1e-3) / 1e9;
        let factor = 2.0 * (n as f64 - 1.0) / n as f64;
        m.extra.insert("algbw_gb_s".into(), algbw.into());
        m.extra.insert("busbw_gb_s".into(), (algbw * factor).into());
        m.extra.insert("bus_factor".into(), factor.into());
        m.extra.insert("latency_us".into(), (ts.median * 1e3).into());
    }
    m.extra.insert("ranks_identical".into(), same.into());
    m.time = time;
    m
}

/// Whether every rank holds the same bytes (a hash of each, compared on every rank).
pub fn ranks_identical(t: &dyn Transport, bytes: &[u8]) -> Result<bool> {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(bytes);
    let all = all_gather_u64(t, h.finish())?;
    Ok(all.iter().all(|&x| x == all[0]))
}

/// The largest of every rank's `x` (the same on every rank).
fn agree_max(t: &dyn Transport, x: f64) -> Result<f64> {
    Ok(all_gather_u64(t, x.to_bits())?.into_iter().map(f64::from_bits).fold(f64::MIN, f64::max))
}

/// Times a collective the way [`Budget::sample`] times a kernel, with every decision (warm-up
/// rounds, repetitions) taken on figures agreed by all ranks, so that all run the same count.
/// Each repetition: `prepare` (untimed), a barrier, then `op` timed. Rank 0 returns, per
/// repetition, the slowest rank's time.
pub fn time_collective(
    t: &dyn Transport,
    budget: &Budget,
    mut prepare: impl FnMut(),
    mut op: impl FnMut() -> Result<()>,
) -> Result<(TimeSummary, TimingMode)> {
    let mut once = |k: usize| -> Result<Vec<f64>> {
        (0..k)
            .map(|_| {
                prepare();
                t.barrier()?;
                let start = std::time::Instant::now();
                op()?;
                Ok(start.elapsed().as_secs_f64() * 1e3)
            })
            .collect()
    };
    let (mut trace, mut best, mut spent, mut last) = (Vec::new(), f64::INFINITY, 0.0, 0.0);
    for i in 0..MAX_WARMUP_ROUNDS {
        let k = budget.warmup.max(1);
        let round = once(k)?;
        let median = agree_max(t, TimeSummary::of(&round).median)?;
        trace.extend(round);
        let settled = i > 0 && median >= best * (1.0 - SETTLED);
        (best, spent, last) = (best.min(median), spent + median * k as f64, median);
        if settled || spent > budget.budget_ms {
            break;
        }
    }
    let mut raw = once(budget.reps(last))?;
    // The collective is done when its slowest rank is: rank 0 keeps the max of each repetition.
    let (r, n) = (t.rank(), t.size());
    if r == 0 {
        let mut theirs = vec![0f64; raw.len()];
        for q in 1..n {
            t.recv(q, crate::collective::transport::bytes_of_mut(&mut theirs))?;
            raw.iter_mut().zip(&theirs).for_each(|(a, b)| *a = a.max(*b));
        }
    } else {
        t.send(0, bytes_of(&raw))?;
    }
    let mode = TimingMode { l2: "warm".into(), launch: "host".into(), warmup: trace.len(), raw_ms: raw.clone(), warmup_ms: trace, clocks: None };
    Ok((TimeSummary::of(&raw), mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_spans_4_bytes_to_256_mb_in_steps_of_4() {
        let s = sizes(256 << 20);
        assert_eq!((s[0], *s.last().unwrap(), s.len()), (4, 256 << 20, 14));
    }

    #[test]
    fn collective_timing_gives_every_rank_the_same_repetition_count() {
        let budget = Budget { budget_ms: 5.0, ..Budget::new(true) };
        let out = run_threads(3, |t| {
            // Rank 2 is slow: the others must still take as many repetitions as it does.
            let pause = std::time::Duration::from_micros(if t.rank() == 2 { 300 } else { 10 });
            time_collective(t, &budget, || (), || {
                std::thread::sleep(pause);
                Ok(())
            })
        })
        .unwrap();
        let counts: Vec<usize> = out.iter().map(|(s, _)| s.samples).collect();
        assert!(counts.iter().all(|&c| c == counts[0]), "{counts:?}");
        // Rank 0 reports the slowest rank's time.
        assert!(out[0].0.median >= 0.3, "{:?}", out[0].0);
    }
}
