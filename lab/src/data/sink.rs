//! Where batches go once read: device buffers filled by asynchronous copies from a ring of
//! pinned host buffers on a copy stream (CUDA), or plain host buffers (the CPU backend).
//!
//! CUDA ordering, per device buffer d and host slot h: the copy stream waits `consumed[d]` (the
//! compute stream is done with d's last batch) before copying h into d, then records `copied[d]`
//! and `host_done[h]`; the compute stream waits `copied[d]` before the batch is handed out; the
//! reader waits `host_done[h]` before reading into h again.

use super::read::AlignedBuf;
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::Result;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtrMut, PinnedHostSlice};
use std::sync::Arc;

/// One host slot as the reader thread sees it: a buffer it may write while it holds the slot.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    pub ptr: usize,
    pub len: usize,
}

/// A delivered batch's bytes: on the device (read them on [`super::Loader::compute_stream`]) or on
/// the host.
pub enum BatchData<'a> {
    Host(&'a [u8]),
    Cuda(CudaView<'a, u8>),
}

pub(super) enum Sink {
    Cpu { host: Vec<AlignedBuf>, dev: Vec<Vec<u8>> },
    Cuda(Box<CudaSink>),
}

pub(super) struct CudaSink {
    pub copy: Arc<CudaStream>,
    pub compute: Arc<CudaStream>,
    host: Vec<PinnedHostSlice<u8>>,
    ptrs: Vec<usize>,
    /// Per host slot: its last copy has finished (blocking-sync: the reader sleeps on it).
    pub host_done: Arc<Vec<CudaEvent>>,
    dev: Vec<CudaSlice<u8>>,
    copied: Vec<CudaEvent>,
    consumed: Vec<CudaEvent>,
}

impl Sink {
    pub fn cpu(ring: usize, devs: usize, batch_bytes: usize) -> Sink {
        Sink::Cpu { host: (0..ring).map(|_| AlignedBuf::zeroed(batch_bytes)).collect(), dev: (0..devs).map(|_| vec![0u8; batch_bytes]).collect() }
    }

    pub fn cuda(gpu: &Gpu, ring: usize, devs: usize, batch_bytes: usize) -> Result<Sink> {
        let ctx = &gpu.ctx;
        let event = |flags| ctx.new_event(Some(flags)).doing("creating a loader event");
        let mut host = Vec::with_capacity(ring);
        let mut ptrs = Vec::with_capacity(ring);
        for _ in 0..ring {
            // Plain page-locked memory (flags 0): cudarc's default is write-combined, which the
            // host reads (checksums) crawl through.
            // SAFETY: the bytes are written by the reader before any copy reads them.
            let mut h = unsafe { ctx.alloc_pinned_with_flags::<u8>(batch_bytes, 0) }.doing("allocating a pinned host buffer")?;
            ptrs.push(h.as_mut_ptr().doing("mapping a pinned host buffer")? as usize);
            host.push(h);
        }
        let dev = (0..devs).map(|_| gpu.stream.alloc_zeros::<u8>(batch_bytes).doing("allocating a device batch buffer")).collect::<Result<_>>()?;
        // Stream-ordered allocations and their zeroing are on the compute stream: finish them
        // before the copy stream writes the buffers.
        gpu.sync()?;
        Ok(Sink::Cuda(Box::new(CudaSink {
            copy: ctx.new_stream().doing("creating the copy stream")?,
            compute: gpu.stream.clone(),
            host,
            ptrs,
            host_done: Arc::new((0..ring).map(|_| event(CUevent_flags::CU_EVENT_BLOCKING_SYNC)).collect::<Result<_>>()?),
            dev,
            copied: (0..devs).map(|_| event(CUevent_flags::CU_EVENT_DISABLE_TIMING)).collect::<Result<_>>()?,
            consumed: (0..devs).map(|_| event(CUevent_flags::CU_EVENT_DISABLE_TIMING)).collect::<Result<_>>()?,
        })))
    }

    pub fn slots(&mut self) -> Vec<Slot> {
        match self {
            Sink::Cpu { host, .. } => host.iter_mut().map(|h| Slot { ptr: h.as_mut_ptr() as usize, len: h.len() }).collect(),
            Sink::Cuda(c) => c.ptrs.iter().zip(&c.host).map(|(&ptr, h)| Slot { ptr, len: h.len() }).collect(),
        }
    }

    /// Starts moving the first `bytes` of host slot `h` into device buffer `d`.
    pub fn copy(&mut self, h: usize, d: usize, bytes: usize) -> Result<()> {
        match self {
            Sink::Cpu { host, dev } => {
                dev[d][..bytes].copy_from_slice(&host[h][..bytes]);
                Ok(())
            }
            Sink::Cuda(c) => {
                c.copy.wait(&c.consumed[d]).doing("ordering a copy after the batch's last use")?;
                // SAFETY: the reader filled these bytes and holds the slot no longer; it waits
                // `host_done[h]` before writing it again.
                let src = unsafe { std::slice::from_raw_parts(c.ptrs[h] as *const u8, bytes) };
                let (dst, _) = c.dev[d].device_ptr_mut(&c.copy);
                // SAFETY: dst holds batch_bytes >= bytes; src is page-locked, so the copy is async.
                unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, c.copy.cu_stream()) }.doing("copying a batch to the device")?;
                c.copied[d].record(&c.copy).doing("recording a batch copy")?;
                c.host_done[h].record(&c.copy).doing("recording a host slot's release")
            }
        }
    }

    /// Orders the consumer after device buffer `d`'s copy.
    pub fn ready(&self, d: usize) -> Result<()> {
        match self {
            Sink::Cpu { .. } => Ok(()),
            Sink::Cuda(c) => c.compute.wait(&c.copied[d]).doing("ordering the compute stream after a batch copy"),
        }
    }

    /// The consumer has enqueued all its work on `d`: its next copy waits for that work.
    pub fn consumed(&self, d: usize) -> Result<()> {
        match self {
            Sink::Cpu { .. } => Ok(()),
            Sink::Cuda(c) => c.consumed[d].record(&c.compute).doing("recording a batch's last use"),
        }
    }

    pub fn view(&self, d: usize, bytes: usize) -> BatchData<'_> {
        match self {
            Sink::Cpu { dev, .. } => BatchData::Host(&dev[d][..bytes]),
            Sink::Cuda(c) => BatchData::Cuda(c.dev[d].slice(..bytes)),
        }
    }

    /// Waits for every copy in flight (before host buffers are freed or reused by another epoch).
    pub fn drain(&self) -> Result<()> {
        match self {
            Sink::Cpu { .. } => Ok(()),
            Sink::Cuda(c) => c.copy.synchronize().doing("waiting for the loader's copies"),
        }
    }

    /// What the reader waits for before writing a slot again.
    pub fn host_events(&self) -> Option<Arc<Vec<CudaEvent>>> {
        match self {
            Sink::Cpu { .. } => None,
            Sink::Cuda(c) => Some(c.host_done.clone()),
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // Pinned buffers must outlive the copies reading them.
        let _ = self.drain();
    }
}
