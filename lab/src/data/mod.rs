//! A streaming loader of fixed-size samples (token windows or raw byte blocks) from one file to
//! device buffers, for a training loop.
//!
//! A reader thread fills a ring of host buffers (pinned on CUDA) with one batch each, through
//! O_DIRECT + io_uring where the file allows it ([`read`]); the caller's thread copies each
//! filled buffer to a device buffer on a copy stream, `prefetch` batches ahead, and hands the
//! batch out ordered on the compute stream ([`sink`]). With [`ReadMode::Registered`] on CUDA the
//! copy engine reads the file's pinned page-cache pages itself and the reader only checks the
//! file's length. The CPU backend runs the same pipeline into host buffers.
//!
//! Rules: sample i is the bytes `[o + i T, o + i T + S)` of the file (S = `sample_bytes`, T =
//! `stride`, S unless set, o = `offset`: a header before the samples; windows overlap where
//! T < S, as token windows whose last token is the next one's first); bytes past the last whole
//! sample are never delivered ([`Loader::dropped_tail_bytes`]); every whole sample is delivered
//! exactly once per epoch, in file order or in a seeded permutation of it; the last batch of an
//! epoch holds what is left (fewer than `batch_samples` when they do not divide). A read that comes back short is an
//! error naming the file and the offset, never a short batch.
//!
//! ```no_run
//! use lab::data::{BatchData, Config, Loader};
//! use lab::experiment::Backend;
//! # fn main() -> lab::Result<()> {
//! let backend = Backend::Cpu; // or Backend::Cuda(gpu): batches arrive in device buffers
//! let cfg = Config { shuffle: Some(7), ..Config::tokens(2048, 2, 64) };
//! let mut loader = Loader::open("tokens.bin".as_ref(), cfg, &backend)?;
//! for epoch in 0..2 {
//!     let mut batches = loader.epoch(epoch)?;
//!     while let Some(batch) = batches.next_batch()? {
//!         match batch.data {
//!             BatchData::Host(bytes) => assert_eq!(bytes.len(), batch.samples.len() * 4096),
//!             BatchData::Cuda(_view) => { /* launch on loader.compute_stream() reading it */ }
//!         }
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod read;
mod sink;

pub use read::{ReadMode, ReadPath};
pub use sink::BatchData;

use crate::experiment::Backend;
use crate::record::ErrorStats;
use crate::{LabError, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use read::Source;
use sink::{Registered, Sink, Slot};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// How the loader cuts and moves the file.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Config {
    pub sample_bytes: usize,
    pub batch_samples: usize,
    /// Host buffers, one batch each: how far reads run ahead of copies.
    pub ring: usize,
    /// Batches copied to the device ahead of the one being consumed.
    pub prefetch: usize,
    /// Seed of the per-epoch permutation; `None` keeps file order.
    pub shuffle: Option<u64>,
    pub read: ReadMode,
    /// O_DIRECT reads in flight.
    pub queue_depth: usize,
    /// Threads copying out of the page cache (buffered and mapped reads).
    pub threads: usize,
    /// Bytes of the file before the first sample (a header).
    pub offset: u64,
    /// Bytes from one sample's start to the next's; `None`: `sample_bytes`.
    pub stride: Option<usize>,
}

impl Config {
    /// Raw byte blocks of `sample_bytes`, in batches of `batch_samples`; ring 4, prefetch 2,
    /// O_DIRECT at queue depth 32 (else 4 read threads), file order.
    pub fn bytes(sample_bytes: usize, batch_samples: usize) -> Config {
        Config { sample_bytes, batch_samples, ring: 4, prefetch: 2, shuffle: None, read: ReadMode::Direct, queue_depth: 32, threads: 4, offset: 0, stride: None }
    }

    /// Windows of `tokens` tokens of `token_bytes` each (2 for u16 ids, 4 for u32).
    pub fn tokens(tokens: usize, token_bytes: usize, batch_samples: usize) -> Config {
        Config::bytes(tokens * token_bytes, batch_samples)
    }

    fn validate(&self) -> Result<()> {
        let bad = |why: &str| Err(LabError::Invalid(format!("loader config {self:?}: {why}")));
        match self {
            c if c.sample_bytes == 0 => bad("sample_bytes must be at least 1"),
            c if c.batch_samples == 0 => bad("batch_samples must be at least 1"),
            c if c.ring == 0 => bad("the ring needs at least one host buffer"),
            c if c.prefetch == 0 => bad("prefetch must be at least 1 (one batch copied ahead)"),
            c if c.sample_bytes.checked_mul(c.batch_samples).is_none_or(|b| b > u32::MAX as usize) => bad("a batch must fit in 4 GiB"),
            c if c.stride == Some(0) => bad("the stride must be at least 1 byte"),
            _ => Ok(()),
        }
    }

    fn layout(&self) -> Layout {
        Layout { offset: self.offset, stride: self.stride.unwrap_or(self.sample_bytes) as u64, size: self.sample_bytes }
    }
}

/// Where samples lie in a file: sample i at `offset + i stride`, `size` bytes.
#[derive(Clone, Copy, Debug)]
struct Layout {
    offset: u64,
    stride: u64,
    size: usize,
}

impl Layout {
    fn start(&self, i: u64) -> u64 {
        self.offset + i * self.stride
    }

    /// Whole samples in a file of `len` bytes.
    fn samples(&self, len: u64) -> u64 {
        match len.checked_sub(self.offset + self.size as u64) {
            Some(rest) => rest / self.stride + 1,
            None => 0,
        }
    }

    /// Bytes past the last whole sample.
    fn tail(&self, len: u64) -> u64 {
        match self.samples(len) {
            0 => len.saturating_sub(self.offset),
            n => len - (self.start(n - 1) + self.size as u64),
        }
    }
}

/// The order of an epoch's samples: file order, or a permutation seeded by (seed, epoch).
pub fn epoch_order(samples: u64, shuffle: Option<u64>, epoch: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..samples).collect();
    if let Some(seed) = shuffle {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ epoch.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        order.shuffle(&mut rng);
    }
    order
}

/// Reads no more than this in one request when neighbouring samples are merged: keeps the
/// queue depth meaningful for file-order batches.
const MAX_MERGED_READ: usize = 1 << 20;

/// The reads filling one batch: samples adjacent in the file and in the buffer become one read.
fn plan_reads(samples: &[u64], layout: Layout) -> Vec<(u64, usize, usize)> {
    let sample_bytes = layout.size;
    let mut reads: Vec<(u64, usize, usize)> = Vec::new(); // (file offset, buffer offset, bytes)
    for (k, &i) in samples.iter().enumerate() {
        let (offset, at) = (layout.start(i), k * sample_bytes);
        match reads.last_mut() {
            Some(r) if r.0 + r.2 as u64 == offset && r.1 + r.2 == at && r.2 + sample_bytes <= MAX_MERGED_READ => r.2 += sample_bytes,
            _ => reads.push((offset, at, sample_bytes)),
        }
    }
    reads
}

/// The loader: open once, then one [`Epoch`] at a time.
pub struct Loader {
    path: PathBuf,
    cfg: Config,
    samples: u64,
    len: u64,
    read_path: ReadPath,
    source: Option<Source>,
    /// Declared before `registered`: dropping it drains the copies that read the map.
    sink: Sink,
    registered: Option<Registered>,
}

impl Loader {
    /// Opens `path` for `backend` (device buffers on CUDA, host buffers on the CPU).
    pub fn open(path: &Path, cfg: Config, backend: &Backend) -> Result<Loader> {
        cfg.validate()?;
        let layout = cfg.layout();
        // O_DIRECT reads whole blocks: samples must also start on them (the source itself
        // checks their size).
        let block = read::DIRECT_ALIGN as u64;
        let unaligned = cfg.read == ReadMode::Direct && (layout.size as u64).is_multiple_of(block) && !(layout.offset.is_multiple_of(block) && layout.stride.is_multiple_of(block));
        let mut source = Source::open(path, if unaligned { ReadMode::Buffered } else { cfg.read }, cfg.sample_bytes, cfg.queue_depth, cfg.threads)?;
        if unaligned {
            source.read_path.fallback = Some(format!("O_DIRECT needs samples to start on multiples of {} B, not at offset {} with a stride of {} B", read::DIRECT_ALIGN, layout.offset, layout.stride));
        }
        let samples = layout.samples(source.len());
        if samples == 0 {
            let after = if cfg.offset > 0 { format!(" (after {} header bytes)", cfg.offset) } else { String::new() };
            return Err(LabError::io(path, format!("holds {} bytes: not one sample of {} bytes{after}", source.len(), cfg.sample_bytes)));
        }
        let mut read_path = source.read_path.clone();
        let registered = match (cfg.read, backend) {
            (ReadMode::Registered, Backend::Cuda(gpu)) => Registered::new(path, gpu).map_err(|why| read_path.fallback = Some(why)).ok(),
            (ReadMode::Registered, Backend::Cpu) => {
                read_path.fallback = Some("no copy engine on the CPU backend: the map is copied by the CPU".into());
                None
            }
            _ => None,
        };
        if registered.is_some() {
            read_path.mode = "registered";
        }
        let batch_bytes = cfg.sample_bytes * cfg.batch_samples;
        // One device buffer being consumed, `prefetch` being filled.
        let sink = match backend {
            Backend::Cpu => Sink::cpu(cfg.ring, cfg.prefetch + 1, batch_bytes),
            Backend::Cuda(gpu) => Sink::cuda(gpu, cfg.ring, cfg.prefetch + 1, batch_bytes, registered.is_some())?,
        };
        Ok(Loader { path: path.into(), read_path, len: source.len(), samples, cfg, source: Some(source), sink, registered })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whole samples per epoch.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Batches per epoch (the last may be short).
    pub fn batches(&self) -> usize {
        self.samples.div_ceil(self.cfg.batch_samples as u64) as usize
    }

    /// Bytes past the last whole sample: never delivered.
    pub fn dropped_tail_bytes(&self) -> u64 {
        self.cfg.layout().tail(self.len)
    }

    /// Milliseconds pinning and registering the file's map took, where the copy engine reads it.
    pub fn register_ms(&self) -> Option<f64> {
        self.registered.as_ref().map(|r| r.register_ms)
    }

    /// How the file is read, and why not the mode asked for.
    pub fn read_path(&self) -> &ReadPath {
        &self.read_path
    }

    /// The stream batches are ordered on (CUDA): launch the work that reads a batch here.
    pub fn compute_stream(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaStream>> {
        match &self.sink {
            Sink::Cuda(c) => Some(&c.compute),
            Sink::Cpu { .. } => None,
        }
    }

    /// Starts epoch `epoch` (its permutation when shuffling).
    pub fn epoch(&mut self, epoch: u64) -> Result<Epoch<'_>> {
        let order = epoch_order(self.samples, self.cfg.shuffle, epoch);
        self.epoch_in(order)
    }

    /// Starts an epoch over `order` (sample indices, each below [`Loader::samples`]), as a loop
    /// resuming mid-epoch would.
    pub fn epoch_in(&mut self, order: Vec<u64>) -> Result<Epoch<'_>> {
        if let Some(&bad) = order.iter().find(|&&i| i >= self.samples) {
            return Err(LabError::Invalid(format!("{}: sample {bad} is past the last of {} samples", self.path.display(), self.samples)));
        }
        let source = self.source.take().ok_or_else(|| LabError::Invalid(format!("{}: the last epoch's reader thread panicked", self.path.display())))?;
        let (free_tx, free_rx) = mpsc::channel::<usize>();
        let (full_tx, full_rx) = mpsc::channel::<Result<(usize, usize)>>();
        (0..self.cfg.ring).for_each(|h| free_tx.send(h).expect("receiver alive"));
        let slots = self.sink.slots();
        let events = self.sink.host_events();
        let (layout, batch, check_only) = (self.cfg.layout(), self.cfg.batch_samples, self.registered.is_some());
        let batches: Vec<Vec<u64>> = order.chunks(batch).map(<[u64]>::to_vec).collect();
        let pending: VecDeque<Vec<u64>> = batches.iter().cloned().collect();
        let reader = std::thread::Builder::new()
            .name("lab-data-reader".into())
            .spawn(move || read_batches(source, &batches, layout, check_only, &slots, events.as_deref(), free_rx, full_tx))
            .map_err(|e| LabError::Invalid(format!("cannot start the reader thread: {e}")))?;
        Ok(Epoch { loader: self, reader: Some(reader), free_tx: Some(free_tx), full_rx, pending, in_flight: VecDeque::new(), last: None, next_dev: 0, delivered: 0, failed: None })
    }
}

/// The reader thread: each batch into the next free slot, in order (or, `check_only`, the file's
/// length checked to hold it: the copy engine reads a registered map); stops at the first error
/// (sent to the consumer) or when the consumer hangs up. Gives the source back.
#[allow(clippy::too_many_arguments)]
fn read_batches(
    mut source: Source,
    batches: &[Vec<u64>],
    layout: Layout,
    check_only: bool,
    slots: &[Slot],
    events: Option<&Vec<cudarc::driver::CudaEvent>>,
    free: mpsc::Receiver<usize>,
    full: mpsc::Sender<Result<(usize, usize)>>,
) -> Source {
    for (b, samples) in batches.iter().enumerate() {
        let Ok(h) = free.recv() else { break };
        let filled = (|| -> Result<()> {
            if let Some(events) = events {
                events[h].synchronize().map_err(|e| LabError::Invalid(format!("waiting for a host buffer's copy: {e}")))?;
            }
            if check_only {
                return source.check_len(plan_reads(samples, layout).into_iter().map(|(offset, _, bytes)| (offset, bytes)));
            }
            // SAFETY: the slot is this thread's until it is sent back as full; its buffer lives
            // as long as the loader, which joins this thread before dropping it.
            let buf = unsafe { std::slice::from_raw_parts_mut(slots[h].ptr as *mut u8, slots[h].len) };
            let mut rest = &mut buf[..samples.len() * layout.size];
            let mut reads = Vec::new();
            let mut at = 0;
            for (offset, start, bytes) in plan_reads(samples, layout) {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
                let (this, tail) = tail.split_at_mut(bytes);
                reads.push((offset, this));
                (rest, at) = (tail, start + bytes);
            }
            source.read(&mut reads)
        })();
        let failed = filled.is_err();
        if full.send(filled.map(|()| (b, h))).is_err() || failed {
            break;
        }
    }
    source
}

/// One pass over the file. Dropping it early stops the reader and waits for it.
pub struct Epoch<'a> {
    loader: &'a mut Loader,
    reader: Option<std::thread::JoinHandle<Source>>,
    free_tx: Option<mpsc::Sender<usize>>,
    full_rx: mpsc::Receiver<Result<(usize, usize)>>,
    /// Batches not yet copied, by their sample indices.
    pending: VecDeque<Vec<u64>>,
    /// Copied or being copied: (batch number, sample indices, device buffer).
    in_flight: VecDeque<(usize, Vec<u64>, usize)>,
    /// The device buffer handed out last, and its samples.
    last: Option<(usize, Vec<u64>)>,
    next_dev: usize,
    delivered: usize,
    /// A read failed: handed out once the batches before it are.
    failed: Option<LabError>,
}

/// One delivered batch.
pub struct Batch<'a> {
    /// Its place in the epoch.
    pub index: usize,
    /// The samples it holds, in order: sample `samples[k]` is bytes `[k S, (k + 1) S)`.
    pub samples: &'a [u64],
    pub data: BatchData<'a>,
}

impl Epoch<'_> {
    /// The next batch, once it is on the device (ordered on the compute stream), or `None` at
    /// the end of the epoch. Work the caller enqueued on the previous batch's buffer is waited
    /// for before that buffer is written again. A failed read is returned once the batches
    /// before it have been; the epoch ends there.
    pub fn next_batch(&mut self) -> Result<Option<Batch<'_>>> {
        if let Some((d, _)) = &self.last {
            self.loader.sink.consumed(*d)?;
        }
        let devs = self.loader.cfg.prefetch + 1;
        while self.in_flight.len() < self.loader.cfg.prefetch && !self.pending.is_empty() && self.failed.is_none() {
            let (b, h) = match self.full_rx.recv() {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    self.failed = Some(e);
                    break;
                }
                Err(_) => return Err(LabError::Invalid(format!("{}: the reader thread stopped without a reason", self.loader.path.display()))),
            };
            let samples = self.pending.pop_front().expect("pending is not empty");
            let d = self.next_dev;
            self.next_dev = (d + 1) % devs;
            match &self.loader.registered {
                Some(map) => self.loader.sink.gather(map.base(), &plan_reads(&samples, self.loader.cfg.layout()), h, d)?,
                None => self.loader.sink.copy(h, d, samples.len() * self.loader.cfg.sample_bytes)?,
            }
            // The reader waits for this copy before writing the slot again.
            let _ = self.free_tx.as_ref().expect("open until drop").send(h);
            self.in_flight.push_back((b, samples, d));
        }
        // The batches read before a failed one are delivered first, then the failure.
        let Some((b, samples, d)) = self.in_flight.pop_front() else {
            return match self.failed.take() {
                Some(e) => {
                    self.pending.clear();
                    Err(e)
                }
                None => Ok(None),
            };
        };
        self.loader.sink.ready(d)?;
        self.delivered += 1;
        self.last = Some((d, samples));
        let (_, samples) = self.last.as_ref().expect("just set");
        Ok(Some(Batch { index: b, samples, data: self.loader.sink.view(d, samples.len() * self.loader.cfg.sample_bytes) }))
    }

    /// Batches handed out so far.
    pub fn delivered(&self) -> usize {
        self.delivered
    }
}

impl Drop for Epoch<'_> {
    fn drop(&mut self) {
        self.free_tx = None;
        if let Some(reader) = self.reader.take() {
            // A reader that panicked leaves no source: the next epoch says so.
            if let Ok(source) = reader.join() {
                self.loader.source = Some(source);
            }
        }
        let _ = self.loader.sink.drain();
    }
}

/// The checksum of one sample's bytes.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Checks delivered samples against the file: each sample's checksum, and that each is
/// delivered exactly once.
pub struct Tally {
    path: PathBuf,
    layout: Layout,
    expected: Vec<u64>,
    seen: Vec<u32>,
    wrong: Vec<bool>,
}

impl Tally {
    /// The checksum of every whole sample of `path` as `cfg` lays them out, read through the
    /// page cache.
    pub fn of_file(path: &Path, cfg: &Config) -> Result<Tally> {
        use std::os::unix::fs::FileExt;
        let layout = cfg.layout();
        let file = std::fs::File::open(path).map_err(|e| LabError::io(path, format!("cannot open: {e}")))?;
        let samples = layout.samples(file.metadata().map_err(|e| LabError::io(path, e))?.len());
        let mut buf = vec![0u8; layout.size];
        let mut expected = Vec::with_capacity(samples as usize);
        for i in 0..samples {
            file.read_exact_at(&mut buf, layout.start(i)).map_err(|e| LabError::io(path, format!("reading sample {i} at offset {}: {e}", layout.start(i))))?;
            expected.push(checksum(&buf));
        }
        Ok(Tally { path: path.into(), layout, seen: vec![0; expected.len()], wrong: vec![false; expected.len()], expected })
    }

    /// Counts a delivered batch: `data` holds `samples.len()` samples in order.
    pub fn add(&mut self, samples: &[u64], data: &[u8]) -> Result<()> {
        let size = self.layout.size;
        if data.len() != samples.len() * size {
            return Err(LabError::Invalid(format!("a batch of {} samples holds {} bytes, not {}", samples.len(), data.len(), samples.len() * size)));
        }
        for (&i, bytes) in samples.iter().zip(data.chunks_exact(size)) {
            let i = i as usize;
            if i >= self.expected.len() {
                return Err(LabError::Invalid(format!("sample {i} delivered: the file has {}", self.expected.len())));
            }
            self.seen[i] += 1;
            self.wrong[i] |= checksum(bytes) != self.expected[i];
        }
        Ok(())
    }

    /// Samples delivered exactly once with the file's bytes, over all samples: 1 for a clean
    /// epoch. Mismatches count the samples wrong, missing or repeated; the worst index is the first.
    pub fn stats(&self) -> ErrorStats {
        let got: Vec<u32> = self.seen.iter().zip(&self.wrong).map(|(&n, &w)| u32::from(n == 1 && !w)).collect();
        crate::ops::compare::compare_bits(&got, &vec![1; got.len()], "xxh3 of each sample of the file, delivered once")
    }

    /// The first problem, named: a sample with the wrong bytes, one delivered twice, one missing.
    pub fn check(&self) -> Result<()> {
        let at = |i: usize| format!("{}: sample {i} (offset {})", self.path.display(), self.layout.start(i as u64));
        if let Some(i) = self.wrong.iter().position(|&w| w) {
            return Err(LabError::Invalid(format!("{} was delivered with bytes that differ from the file", at(i))));
        }
        if let Some(i) = self.seen.iter().position(|&n| n > 1) {
            return Err(LabError::Invalid(format!("{} was delivered {} times in one epoch", at(i), self.seen[i])));
        }
        if let Some(i) = self.seen.iter().position(|&n| n == 0) {
            return Err(LabError::Invalid(format!("{} was never delivered", at(i))));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
