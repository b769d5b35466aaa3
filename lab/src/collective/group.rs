//! A group of ranks driven from one thread: a device per rank and the collectives between them,
//! over [`Tensor`]s. On GPUs they are NCCL's (one communicator per GPU, grouped calls, run on
//! each GPU's comm stream and ordered against its compute stream by events); on the CPU backend
//! each rank is a host tensor and the collectives run the lab's ring on a thread world of the
//! same size. Layers written on a group (tensor-parallel, data-parallel) thus run the same code
//! on a GPU host and in the CPU tests.

use super::nccl::{grouped, nccl_error, World};
use super::ring::{all_reduce, Algorithm};
use super::transport::{run_threads, Transport, Wire};
use crate::error::Doing;
use crate::experiment::Backend;
use crate::gpu::Gpu;
use crate::ops::Elem;
use crate::tensor::Tensor;
use crate::{LabError, Result};
use cudarc::nccl::safe::{NcclType, ReduceOp};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// The ranks' devices and how their collectives run.
pub struct Group {
    pub devs: Vec<Backend>,
    /// `None` on the CPU backend and for a single GPU.
    pub(crate) world: Option<Rc<World>>,
}

/// What a group's elements must be: a kernel type NCCL and the host ring both carry.
pub trait GroupElem: Elem + Wire + NcclType {}
impl<T: Elem + Wire + NcclType> GroupElem for T {}

impl Group {
    /// `n` host ranks (the CPU backend).
    pub fn host(n: usize) -> Result<Group> {
        if n == 0 {
            return Err(LabError::Invalid("a group has at least one rank".into()));
        }
        Ok(Group { devs: vec![Backend::Cpu; n], world: None })
    }

    /// GPUs 0..n, `first` being GPU 0 (the session's).
    pub fn gpus(first: &Arc<Gpu>, n: usize) -> Result<Group> {
        if n == 1 {
            return Ok(Group { devs: vec![Backend::Cuda(first.clone())], world: None });
        }
        let world = super::nccl::world(first, n)?;
        let devs = world.ranks.iter().map(|r| Backend::Cuda(r.gpu.clone())).collect();
        Ok(Group { devs, world: Some(world) })
    }

    /// A group of `n` ranks on `backend`'s kind of device.
    pub fn on(backend: &Backend, n: usize) -> Result<Group> {
        match backend {
            Backend::Cpu => Group::host(n),
            Backend::Cuda(first) => Group::gpus(first, n),
        }
    }

    pub fn size(&self) -> usize {
        self.devs.len()
    }

    /// Waits for every rank's work (GPUs: both streams, with a deadline).
    pub fn sync(&self) -> Result<()> {
        match (&self.world, &self.devs[0]) {
            (Some(w), _) => w.sync(),
            (None, Backend::Cuda(gpu)) => gpu.sync(),
            (None, Backend::Cpu) => Ok(()),
        }
    }

    fn check_len<T: GroupElem>(&self, xs: &[Tensor<T>], what: &str) -> Result<usize> {
        if xs.len() != self.size() {
            return Err(LabError::Invalid(format!("{what}: {} tensors for a group of {} ranks", xs.len(), self.size())));
        }
        let len = xs[0].len();
        if let Some((q, x)) = xs.iter().enumerate().find(|(_, x)| x.len() != len) {
            return Err(LabError::Invalid(format!("{what}: rank {q} holds {} elements and rank 0 {len}", x.len())));
        }
        Ok(len)
    }

    /// Sums every rank's `xs[r]` in place (ncclAllReduce, or the lab's ring on threads).
    pub fn all_reduce<T: GroupElem>(&self, xs: &mut [Tensor<T>]) -> Result<()> {
        let len = self.check_len(xs, "all-reduce")?;
        self.all_reduce_queued(xs, 0..len)?;
        self.join()
    }

    /// Sums elements `range` of every rank's `xs[r]` in place. On GPUs the sum is queued on the
    /// comm streams after the work queued so far on the compute streams, and work queued there
    /// later does not wait for it until [`Group::join`]: what lets a bucket's sum overlap the rest
    /// of a backward pass. On the host it is done on return.
    pub fn all_reduce_queued<T: GroupElem>(&self, xs: &mut [Tensor<T>], range: std::ops::Range<usize>) -> Result<()> {
        let len = self.check_len(xs, "all-reduce")?;
        if range.end > len {
            return Err(LabError::Invalid(format!("all-reduce of elements {range:?} of tensors of {len}")));
        }
        match &self.world {
            None if self.size() == 1 => Ok(()),
            None => on_threads(xs, |t, x| all_reduce(t, &mut x[range.clone()], Algorithm::SendRecv)),
            Some(w) => {
                for r in &w.ranks {
                    r.comm_stream.join(&r.gpu.stream).doing("ordering a collective after its inputs")?;
                }
                grouped(|| {
                    for (comm, x) in w.comms.iter().zip(xs.iter_mut()) {
                        let x = x.cuda_mut().ok_or_else(|| placement("all-reduce"))?;
                        comm.all_reduce_in_place(&mut x.slice_mut(range.clone()), &ReduceOp::Sum).map_err(nccl_error("issuing ncclAllReduce"))?;
                    }
                    Ok(())
                })
            }
        }
    }

    /// Makes the work queued next on every GPU's compute stream wait for its comm stream.
    pub fn join(&self) -> Result<()> {
        for r in self.world.iter().flat_map(|w| &w.ranks) {
            r.gpu.stream.join(&r.comm_stream).doing("ordering work after a collective")?;
        }
        Ok(())
    }

    /// Every rank's `xs[r]` concatenated in rank order into `out[r]` (n times as long).
    pub fn all_gather<T: GroupElem>(&self, xs: &[Tensor<T>], out: &mut [Tensor<T>]) -> Result<()> {
        let (len, n) = (self.check_len(xs, "all-gather")?, self.size());
        if self.check_len(out, "all-gather")? != n * len {
            return Err(LabError::Invalid(format!("all-gather: outputs hold {} elements; {n} ranks of {len} need {}", out[0].len(), n * len)));
        }
        match &self.world {
            None if n == 1 => out[0].copy_from(&xs[0]),
            None => {
                let ins: Vec<&[T]> = xs.iter().map(|x| x.host().ok_or_else(|| placement("all-gather"))).collect::<Result<_>>()?;
                on_threads(out, |t, o| {
                    o.copy_from_slice(&super::tensor_parallel::all_gather_parts(t, ins[t.rank()], &vec![len; n])?);
                    Ok(())
                })
            }
            Some(w) => on_comm_streams(w, || {
                for ((comm, x), o) in w.comms.iter().zip(xs).zip(out.iter_mut()) {
                    let (x, o) = (x.cuda().ok_or_else(|| placement("all-gather"))?, o.cuda_mut().ok_or_else(|| placement("all-gather"))?);
                    comm.all_gather(x, o).map_err(nccl_error("issuing ncclAllGather"))?;
                }
                Ok(())
            }),
        }
    }
}

fn placement(what: &str) -> LabError {
    LabError::Invalid(format!("{what}: a tensor is not on its rank's device"))
}

/// Runs `f` on a thread world, rank r on the host elements of `xs[r]`.
fn on_threads<T: GroupElem>(xs: &mut [Tensor<T>], f: impl Fn(&dyn Transport, &mut [T]) -> Result<()> + Sync) -> Result<()> {
    let cells: Vec<Mutex<&mut [T]>> = xs.iter_mut().map(|x| x.host_mut().map(Mutex::new).ok_or_else(|| placement("a host collective"))).collect::<Result<_>>()?;
    run_threads(cells.len(), |t| f(t, &mut cells[t.rank()].lock().expect("one thread per rank")))?;
    Ok(())
}

/// Issues NCCL calls on every GPU's comm stream, after the work queued on its compute stream and
/// before the work queued there next.
fn on_comm_streams(w: &World, issue: impl FnOnce() -> Result<()>) -> Result<()> {
    for r in &w.ranks {
        r.comm_stream.join(&r.gpu.stream).doing("ordering a collective after its inputs")?;
    }
    grouped(issue)?;
    for r in &w.ranks {
        r.gpu.stream.join(&r.comm_stream).doing("ordering work after a collective")?;
    }
    Ok(())
}

/// A `rows` x `width` block of a row-major matrix inside a flat buffer: it starts at element
/// `at`, its rows `pitch` elements apart.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub at: usize,
    pub pitch: usize,
}

/// Copies a `rows` x `width` block from `src` into `dst` on the tensors' device (one 2D copy on
/// a GPU): how a column-parallel layer places each rank's columns into the whole output.
pub fn copy_block<T: GroupElem>(dev: &Backend, src: &Tensor<T>, from: Block, dst: &mut Tensor<T>, to: Block, (rows, width): (usize, usize)) -> Result<()> {
    // Each row inside its pitch (one row: any run of elements), the last inside the buffer.
    let fits = |len: usize, b: Block| rows == 0 || ((rows == 1 || b.at % b.pitch.max(1) + width <= b.pitch) && b.at + (rows - 1) * b.pitch + width <= len);
    if !fits(src.len(), from) || !fits(dst.len(), to) {
        return Err(LabError::shape("copy_block", format!("{rows} x {width} from {from:?} of {:?} to {to:?} of {:?}", src.shape(), dst.shape())));
    }
    if rows == 0 || width == 0 {
        return Ok(());
    }
    match dev {
        Backend::Cpu => {
            let (s, d) = (src.host().ok_or_else(|| placement("copy_block"))?, dst.host_mut().ok_or_else(|| placement("copy_block"))?);
            for i in 0..rows {
                let (a, b) = (from.at + i * from.pitch, to.at + i * to.pitch);
                d[b..b + width].copy_from_slice(&s[a..a + width]);
            }
            Ok(())
        }
        Backend::Cuda(gpu) => {
            use cudarc::driver::sys::{cuMemcpy2DAsync_v2, CUmemorytype, CUDA_MEMCPY2D};
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let size = std::mem::size_of::<T>();
            let (s, d) = (src.cuda().ok_or_else(|| placement("copy_block"))?, dst.cuda_mut().ok_or_else(|| placement("copy_block"))?);
            let (sp, _) = s.device_ptr(&gpu.stream);
            let (dp, _) = d.device_ptr_mut(&gpu.stream);
            let copy = CUDA_MEMCPY2D {
                srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcDevice: sp + (from.at * size) as u64,
                srcPitch: from.pitch * size,
                dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstDevice: dp + (to.at * size) as u64,
                dstPitch: to.pitch * size,
                WidthInBytes: width * size,
                Height: rows,
                // Every field named: CUmemorytype has no zero value, so a zeroed struct is invalid.
                srcXInBytes: 0,
                srcY: 0,
                srcHost: std::ptr::null(),
                srcArray: std::ptr::null_mut(),
                dstXInBytes: 0,
                dstY: 0,
                dstHost: std::ptr::null_mut(),
                dstArray: std::ptr::null_mut(),
            };
            gpu.ctx.bind_to_thread().doing("binding a context")?;
            // SAFETY: both blocks were checked to lie inside their allocations, on this stream.
            unsafe { cuMemcpy2DAsync_v2(&copy, gpu.stream.cu_stream()) }.result().doing("copying a block of columns")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(v: Vec<f32>) -> Tensor<f32> {
        let n = v.len();
        Tensor::from_vec(&[n], v).unwrap()
    }

    #[test]
    fn host_collectives_sum_and_gather_in_rank_order() {
        for n in 1..=4 {
            let g = Group::host(n).unwrap();
            let mut xs: Vec<Tensor<f32>> = (0..n).map(|r| host((0..5).map(|i| (10 * r + i) as f32).collect())).collect();
            let mut out: Vec<Tensor<f32>> = (0..n).map(|_| host(vec![0.0; 5 * n])).collect();
            g.all_gather(&xs, &mut out).unwrap();
            let want: Vec<f32> = (0..n).flat_map(|r| (0..5).map(move |i| (10 * r + i) as f32)).collect();
            assert!(out.iter().all(|o| o.host().unwrap() == want.as_slice()), "n={n}");
            g.all_reduce(&mut xs).unwrap();
            let sum: Vec<f32> = (0..5).map(|i| (0..n).map(|r| (10 * r + i) as f32).sum()).collect();
            assert!(xs.iter().all(|x| x.host().unwrap() == sum.as_slice()), "n={n}");
        }
    }

    #[test]
    fn collectives_refuse_ranks_of_different_lengths() {
        let g = Group::host(2).unwrap();
        let mut xs = vec![host(vec![1.0; 3]), host(vec![1.0; 4])];
        let e = g.all_reduce(&mut xs).unwrap_err().to_string();
        assert!(e.contains("rank 1 holds 4 elements and rank 0 3"), "{e}");
        let mut out = vec![host(vec![0.0; 5]), host(vec![0.0; 5])];
        let e = g.all_gather(&[host(vec![1.0; 3]), host(vec![1.0; 3])], &mut out).unwrap_err().to_string();
        assert!(e.contains("need 6"), "{e}");
    }

    #[test]
    fn a_block_lands_at_its_column_and_out_of_range_blocks_are_refused() {
        let src = Tensor::from_vec(&[2, 3], vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let mut dst = Tensor::from_vec(&[2, 4], vec![0f32; 8]).unwrap();
        copy_block(&Backend::Cpu, &src, Block { at: 1, pitch: 3 }, &mut dst, Block { at: 2, pitch: 4 }, (2, 2)).unwrap();
        assert_eq!(dst.host().unwrap(), &[0.0, 0.0, 2.0, 3.0, 0.0, 0.0, 5.0, 6.0]);
        assert!(copy_block(&Backend::Cpu, &src, Block { at: 0, pitch: 3 }, &mut dst, Block { at: 3, pitch: 4 }, (2, 2)).is_err(), "past the buffer's end");
    }
}
