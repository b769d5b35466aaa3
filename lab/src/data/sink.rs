//! Where batches go once read: device buffers filled by asynchronous copies from a ring of
//! pinned host buffers on a copy stream (CUDA), or plain host buffers (the CPU backend).
//!
//! CUDA ordering, per device buffer d and host slot h: the copy stream waits `consumed[d]` (the
//! compute stream is done with d's last batch) before copying h into d, then records `copied[d]`
//! and `host_done[h]`; the compute stream waits `copied[d]` before the batch is handed out; the
//! reader waits `host_done[h]` before reading into h again.
//!
//! With a [`Registered`] map the copy engine reads the page cache itself: each batch is one
//! batched copy of its samples from the map into d (the slots have no buffers; `host_done[h]`
//! still paces the reader, which only checks the file's length).

use super::read::AlignedBuf;
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::Result;
use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtrMut, PinnedHostSlice};
use std::path::Path;
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

    /// `ring` host slots (pinned buffers unless `registered`: the copy engine then reads the
    /// file's map, and the slots only pace the reader), `devs` device buffers.
    pub fn cuda(gpu: &Gpu, ring: usize, devs: usize, batch_bytes: usize, registered: bool) -> Result<Sink> {
        let ctx = &gpu.ctx;
        let event = |flags| ctx.new_event(Some(flags)).doing("creating a loader event");
        let buffers = if registered { 0 } else { ring };
        let mut host = Vec::with_capacity(buffers);
        let mut ptrs = Vec::with_capacity(buffers);
        for _ in 0..buffers {
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

    /// Starts the copy engine moving `reads` (file offset, offset in the batch, bytes) from the
    /// registered map at `base` into device buffer `d`, in one batched call; `h` is the host slot
    /// the reader passed along, released when the copies are done.
    pub fn gather(&mut self, base: u64, reads: &[(u64, usize, usize)], h: usize, d: usize) -> Result<()> {
        let Sink::Cuda(c) = self else { unreachable!("a registered map is only made for a CUDA sink") };
        c.copy.wait(&c.consumed[d]).doing("ordering a copy after the batch's last use")?;
        let (dst, _) = c.dev[d].device_ptr_mut(&c.copy);
        let mut dsts: Vec<sys::CUdeviceptr> = reads.iter().map(|r| dst + r.1 as u64).collect();
        let mut srcs: Vec<sys::CUdeviceptr> = reads.iter().map(|r| base + r.0).collect();
        let mut sizes: Vec<usize> = reads.iter().map(|r| r.2).collect();
        let location = |type_, id| sys::CUmemLocation { type_, id };
        let mut attrs = sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: location(sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, 0),
            dstLocHint: location(sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, c.copy.context().ordinal() as i32),
            flags: 0,
        };
        let mut first = [0usize];
        // SAFETY: every source range lies in the registered map (the reader checked the file still
        // holds it) and every destination range in d (reads are planned inside one batch).
        unsafe { sys::cuMemcpyBatchAsync_v2(dsts.as_mut_ptr(), srcs.as_mut_ptr(), sizes.as_mut_ptr(), reads.len(), &mut attrs, first.as_mut_ptr(), 1, c.copy.cu_stream()) }
            .result()
            .doing("copying a batch from the registered map")?;
        c.copied[d].record(&c.copy).doing("recording a batch copy")?;
        c.host_done[h].record(&c.copy).doing("recording a host slot's release")
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

/// A memory map of a data file whose pages are pinned and registered with the driver read-only,
/// so that the copy engine reads them: the page cache goes to the device without a CPU copy. Its
/// own map (not the reader's), unregistered before it is unmapped.
pub(super) struct Registered {
    map: memmap2::Mmap,
    ctx: Arc<CudaContext>,
    /// How long pinning and registering took (it faults in every page of the file).
    pub register_ms: f64,
}

impl Registered {
    /// Maps and registers `path`; the error says why the driver or the file refused.
    pub fn new(path: &Path, gpu: &Gpu) -> std::result::Result<Registered, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("cannot open to map: {e}"))?;
        // SAFETY: read-only; the reader checks the file's length before each batch is copied.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("cannot map: {e}"))?;
        gpu.ctx.bind_to_thread().map_err(|e| format!("cannot bind the context: {e}"))?;
        let start = std::time::Instant::now();
        // SAFETY: the range is this map's, which lives until the registration is dropped.
        unsafe { sys::cuMemHostRegister_v2(map.as_ptr() as *mut _, map.len(), sys::CU_MEMHOSTREGISTER_READ_ONLY) }
            .result()
            .map_err(|e| format!("the driver cannot register the file's map read-only ({e}): the map is copied by the CPU"))?;
        Ok(Registered { map, ctx: gpu.ctx.clone(), register_ms: start.elapsed().as_secs_f64() * 1e3 })
    }

    /// The map's address, which copies take as their source under unified addressing.
    pub fn base(&self) -> u64 {
        self.map.as_ptr() as u64
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // The loader drains its copies before this drops (its sink is declared first).
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: registered in `new` at this address.
            let _ = unsafe { sys::cuMemHostUnregister(self.map.as_ptr() as *mut _) };
        }
    }
}
