//! The [`Transport`] over Open MPI (rsmpi), and MPI_Allreduce as the peer of our rings.
//!
//! MPI is initialised once per process, on first use, and only when the process was started by a
//! launcher (mpirun sets `OMPI_COMM_WORLD_SIZE`); [`finish`] finalises it before exit.

use super::transport::Transport;
use crate::{LabError, Result};
use mpi::collective::SystemOperation;
use mpi::environment::{Threading, Universe};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use std::sync::{Mutex, OnceLock};

/// MPI_COMM_WORLD of this process.
pub struct Mpi {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
}

// SAFETY: MPI is initialised with at least MPI_THREAD_SERIALIZED (checked in `world`), and the
// lab never calls MPI from two threads at once: the pipelined ring moves bytes on one thread
// while another only adds, and the bucketing thread owns the transport while the backward pass
// makes no MPI call.
unsafe impl Send for Mpi {}
unsafe impl Sync for Mpi {}

static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
static WORLD: OnceLock<std::result::Result<Mpi, String>> = OnceLock::new();

/// MPI_COMM_WORLD, initialising MPI on first call; `None` when not started by a launcher.
pub fn world() -> Option<Result<&'static Mpi>> {
    if !super::under_launcher() {
        return None;
    }
    let w = WORLD.get_or_init(|| {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| "MPI was already initialised elsewhere".to_string())?;
        if provided < Threading::Serialized {
            return Err(format!("this MPI provides only {provided:?} threading; the lab needs Serialized"));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        *UNIVERSE.lock().expect("universe lock") = Some(universe);
        Ok(Mpi { world, rank, size })
    });
    Some(w.as_ref().map_err(|e| LabError::Invalid(e.clone())))
}

/// Finalises MPI if it was initialised (every rank must call it, after its last collective).
pub fn finish() {
    drop(UNIVERSE.lock().expect("universe lock").take());
}

/// Ends every rank of the job: a rank that fails must not leave the others waiting.
pub fn abort(code: i32) -> ! {
    match WORLD.get() {
        Some(Ok(m)) => m.world.abort(code),
        _ => std::process::exit(code),
    }
}

/// The Open MPI library version string (MPI_Get_library_version).
pub fn library_version() -> String {
    mpi::environment::library_version().unwrap_or_default().lines().next().unwrap_or_default().trim().to_string()
}

impl Mpi {
    /// The peer: MPI_Allreduce with MPI_SUM over f32, out of place.
    pub fn all_reduce_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        if send.len() != recv.len() {
            return Err(LabError::Invalid("MPI_Allreduce: send and receive lengths differ".into()));
        }
        self.world.all_reduce_into(send, recv, SystemOperation::sum());
        Ok(())
    }
}

impl Transport for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn send(&self, to: usize, data: &[u8]) -> Result<()> {
        self.world.process_at_rank(to as i32).send(data);
        Ok(())
    }
    fn recv(&self, from: usize, buf: &mut [u8]) -> Result<()> {
        // A longer message aborts the job in MPI (MPI_ERR_TRUNCATE); a shorter one is caught here.
        let status = self.world.process_at_rank(from as i32).receive_into(buf);
        let got = status.count(u8::equivalent_datatype()) as usize;
        if got != buf.len() {
            return Err(LabError::Invalid(format!("rank {} expected {} bytes from rank {from} and got {got}", self.rank, buf.len())));
        }
        Ok(())
    }
    fn sendrecv(&self, data: &[u8], to: usize, buf: &mut [u8], from: usize) -> Result<()> {
        let (dst, src) = (self.world.process_at_rank(to as i32), self.world.process_at_rank(from as i32));
        let status = mpi::point_to_point::send_receive_into(data, &dst, buf, &src);
        let got = status.count(u8::equivalent_datatype()) as usize;
        if got != buf.len() {
            return Err(LabError::Invalid(format!("rank {} expected {} bytes from rank {from} and got {got}", self.rank, buf.len())));
        }
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "mpi"
    }
}
