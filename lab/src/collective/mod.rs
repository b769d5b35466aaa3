//! Collectives on CPU ranks: ring all-reduce over a [`Transport`] (threads in one process, or Open
//! MPI with `--features mpi`) and gradient bucketing for data-parallel training; across the GPUs
//! of one host, NCCL's all-reduce beside the same ring over NCCL send/recv ([`nccl`], NCCL's own
//! choices read from its log by [`nccl_log`]). A [`group::Group`] drives several devices from one
//! thread (GPUs over NCCL, or host ranks over the ring on threads): the tensor-parallel layers
//! ([`tensor_parallel`]) and data-parallel training ([`data_parallel`]) run on it. The
//! experiments that measure them (`allreduce`, `bucketing`, `nccl_allreduce`, `tp_linear`,
//! `dp_step`) are in [`crate::ops`].
//!
//! Under a launcher (`mpirun -n N lab run allreduce`) every process runs the same command. Only
//! rank 0 opens a [`crate::experiment::Session`] and writes records; ranks above 0 are followers:
//! they walk the same cases through [`crate::experiment::Experiment::follow_case`], take part in
//! every collective, and discard what they measure. Inputs are drawn from rank 0's seed, which
//! [`agree_seed`] hands to every rank first.

pub mod bucket;
pub mod check;
pub mod data_parallel;
pub mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod nccl;
pub mod nccl_log;
pub mod plan;
pub mod ring;
pub mod tensor_parallel;
pub mod transport;

pub use ring::{all_reduce, Algorithm, Ring};
pub use transport::{run_threads, Threads, Transport};

use crate::experiment::{Experiment, RunOptions};
use crate::Result;

/// This process's rank in a job started by mpirun (Open MPI) or another PMI launcher.
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK"].iter().find_map(|k| std::env::var(k).ok()?.parse().ok())
}

/// Whether this process was started by an MPI launcher.
pub fn under_launcher() -> bool {
    launcher_rank().is_some()
}

/// The launched world as a transport (`None` when not started by a launcher); initialises MPI on
/// first call.
#[cfg(feature = "mpi")]
pub fn launched() -> Result<Option<&'static dyn Transport>> {
    Ok(mpi::world().transpose()?.map(|w| w as &'static dyn Transport))
}

/// Without the `mpi` feature a launched job cannot form a world: say so rather than let every
/// rank measure alone and write its own records.
#[cfg(not(feature = "mpi"))]
pub fn launched() -> Result<Option<&'static dyn Transport>> {
    if under_launcher() {
        return Err(crate::LabError::Invalid("started by an MPI launcher, but this lab was built without `--features mpi`".into()));
    }
    Ok(None)
}

/// Rank 0's seed on every rank (unchanged outside a launcher).
pub fn agree_seed(seed: u64) -> Result<u64> {
    match launched()? {
        Some(t) => transport::broadcast_u64(t, seed, 0),
        None => Ok(seed),
    }
}

/// Whether this process is a rank above 0 of a launched world.
pub fn is_follower() -> Result<bool> {
    Ok(launched()?.is_some_and(|t| t.rank() > 0))
}

/// A follower's whole run: the same experiments and cases as rank 0, nothing written.
pub fn follow(exps: &[&'static dyn Experiment], opts: &RunOptions) -> Result<()> {
    for e in exps {
        for case in crate::experiment::cases_for(*e, &crate::experiment::Backend::Cpu, opts)? {
            e.follow_case(opts, &case)?;
        }
    }
    Ok(())
}

/// Finalises MPI when it was started (call once, after the last collective, on every rank).
pub fn finish() {
    #[cfg(feature = "mpi")]
    mpi::finish();
}

/// Ends the run with `code`; in a launched world, ends every rank (MPI_Abort), so a failing rank
/// never leaves the others blocked in a collective.
pub fn exit_all(code: i32) -> ! {
    #[cfg(feature = "mpi")]
    if under_launcher() {
        mpi::abort(code);
    }
    std::process::exit(code)
}
