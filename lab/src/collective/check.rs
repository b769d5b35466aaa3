//! `lab collective-check`: the ring all-reduce on the world it runs in (mpirun's, or thread
//! worlds of 2 and 4 ranks), on awkward lengths and every dtype, against the f64 sum of the
//! inputs and, under MPI, against MPI_Allreduce on the same inputs; then a length mismatch, which
//! must fail on every rank. Prints one line per check on rank 0.

use super::ring::{all_reduce, Algorithm};
use super::transport::{Transport, Wire};
use crate::ops::allreduce::{rank_input, ranks_identical, tolerance};
use crate::ops::compare::compare_elems;
use crate::ops::Elem;
use crate::{LabError, Result};
use serde_json::json;

/// Runs every check on this rank; returns rank 0's report lines (empty elsewhere), or the first
/// failure.
pub fn run(t: &dyn Transport, seed: u64) -> Result<Vec<String>> {
    let n = t.size();
    let mut lines = Vec::new();
    for len in [0, 1, n.saturating_sub(1), n + 1, 1001, 65537] {
        for alg in Algorithm::ALL.into_iter().chain([Algorithm::Pipelined { segment_bytes: 1000 }]) {
            lines.push(one::<f32>(t, seed, len, alg)?);
            lines.push(one::<half::f16>(t, seed, len, alg)?);
            lines.push(one::<half::bf16>(t, seed, len, alg)?);
        }
    }
    // Mismatched lengths: rank 1 holds one element more; every rank must get the error.
    if n > 1 {
        let mut v = vec![1.0f32; if t.rank() == 1 { 11 } else { 10 }];
        match all_reduce(t, &mut v, Algorithm::SendRecv) {
            Err(e) if e.to_string().contains("lengths differ across ranks") => lines.push(format!("ok mismatched lengths: {e}")),
            other => return Err(LabError::Invalid(format!("mismatched lengths were not refused: {other:?}"))),
        }
    }
    Ok(if t.rank() == 0 { lines } else { Vec::new() })
}

fn one<T: Elem + Wire>(t: &dyn Transport, seed: u64, len: usize, alg: Algorithm) -> Result<String> {
    let (r, n) = (t.rank(), t.size());
    let case = json!({"check": len, "dtype": T::DTYPE.name()});
    let input: Vec<T> = rank_input(seed, &case, r, len);
    let mut y = input.clone();
    all_reduce(t, &mut y, alg)?;
    let same = ranks_identical(t, super::transport::bytes_of(&y))?;
    let tol = tolerance(T::DTYPE, n);
    let what = format!("{} {} len {len} on {n} ranks ({})", alg.name(), T::DTYPE.name(), t.kind());
    let vs_mpi = mpi_difference(t, &input, &y, tol)?;
    if r != 0 {
        return Ok(String::new());
    }
    let mut expected = vec![0f64; len];
    for q in 0..n {
        let x: Vec<T> = rank_input(seed, &case, q, len);
        expected.iter_mut().zip(&x).for_each(|(a, x)| *a += x.to_f64());
    }
    let e = compare_elems(&y, &expected, tol, "f64-sum");
    if !e.passed() || !same {
        return Err(LabError::Invalid(format!("{what}: wrong (ranks identical: {same}): {e:?}")));
    }
    Ok(format!("ok {what}: max abs error {:.2e}{vs_mpi}", e.max_abs))
}

/// Under MPI and for f32: MPI_Allreduce on the same input, and its largest distance to ours
/// (which must be within the tolerance).
#[cfg(feature = "mpi")]
fn mpi_difference<T: Elem>(t: &dyn Transport, input: &[T], ours: &[T], tol: crate::record::Tolerance) -> Result<String> {
    if t.kind() != "mpi" || T::DTYPE != crate::kernels::DType::F32 {
        return Ok(String::new());
    }
    let w = super::mpi::world().expect("an MPI transport implies a world")?;
    let send: Vec<f32> = input.iter().map(|x| x.to_f32()).collect();
    let mut recv = vec![f32::NAN; send.len()];
    w.all_reduce_f32(&send, &mut recv)?;
    let theirs: Vec<f64> = recv.iter().map(|&x| x as f64).collect();
    let e = compare_elems(ours, &theirs, tol, "MPI_Allreduce");
    if !e.passed() {
        return Err(LabError::Invalid(format!("rank {}: ring and MPI_Allreduce differ: {e:?}", t.rank())));
    }
    Ok(format!(", vs MPI_Allreduce {:.2e}", e.max_abs))
}

#[cfg(not(feature = "mpi"))]
fn mpi_difference<T: Elem>(_: &dyn Transport, _: &[T], _: &[T], _: crate::record::Tolerance) -> Result<String> {
    Ok(String::new())
}
