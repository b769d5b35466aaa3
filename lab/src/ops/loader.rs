//! `loader`: [`crate::data::Loader`] streaming a file it writes itself to the GPU, against
//! min(read ceiling, host-to-device ceiling): from the page cache (a memory map copied from with
//! non-temporal stores over most cores, beside buffered reads and fewer threads, each with the
//! reads alone timed as `cache_read`; and the map registered with the driver, which the copy
//! engine reads without a CPU copy) and from a cold file (O_DIRECT, the file's pages dropped with
//! posix_fadvise(DONTNEED) before every epoch, and the share still resident recorded); its
//! overlap with a compute kernel of known length (kernels/loader.cu); torch's DataLoader as peer.
//! The read ceiling (O_DIRECT at queue depth 1 to 64) is measured on the data file's own file
//! system, once per run. Every delivered sample is checked against the file (xxh3 per sample,
//! each sample exactly once) in an untimed epoch before timing.

use super::variant::{self, Requires, Variant, VariantInfo};
use crate::data::{self, read, BatchData, Config, Loader, ReadMode, Tally};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, Backend, Ceiling, Experiment, Measurement, Peer, Session};
use crate::gpu::{timing::time_gpu, Gpu};
use crate::kernels::{symbol, DType};
use crate::profile::{host_time, Budget, TimeSummary, TimingMode, Work};
use crate::record::ErrorStats;
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand::{RngCore, SeedableRng};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub struct LoaderExp;

const FAMILY: &str = "loader";
const MIB: usize = 1 << 20;
/// The read ceiling's request size and queue depths.
const READ_BLOCK: usize = MIB;
const QUEUE_DEPTHS: [usize; 4] = [1, 4, 16, 64];
/// The run's O_DIRECT read roof (best over queue depths) on the data file's file system.
pub const READ_CEILING: &str = "read_direct_gb_s";

pub const VARIANTS: &[Variant<()>] = &[
    Variant { name: "pinned_ring", dtypes: &[DType::F32], requires: Requires::Gpu, what: "a reader thread fills pinned host buffers; async copies on a copy stream, prefetch batches ahead", config: () },
    Variant { name: "registered_map", dtypes: &[DType::F32], requires: Requires::Gpu, what: "the file's map pinned and registered read-only: the copy engine reads the page cache, one batched copy per batch, no CPU copy", config: () },
    Variant { name: "overlap", dtypes: &[DType::F32], requires: Requires::Gpu, what: "pinned_ring with the consume kernel (kernels/loader.cu) run on every batch on the compute stream", config: () },
    Variant { name: "host_ring", dtypes: &[DType::F32], requires: Requires::Cpu, what: "the same pipeline into host buffers (the CPU backend)", config: () },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

impl Experiment for LoaderExp {
    fn name(&self) -> &'static str {
        "loader"
    }
    fn description(&self) -> &'static str {
        "lab::data's loader: file to GPU from the page cache (CPU copies, or the copy engine reading a registered map) and cold (O_DIRECT), overlap with compute, torch DataLoader peer"
    }
    fn sweep_axis(&self) -> &'static str {
        "sample"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["what=read", "what=load cache=warm", "what=load cache=cold", "what=overlap"]
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let gpu = matches!(backend, Backend::Cuda(_));
        let file = match (gpu, quick) {
            (true, true) => 256 * MIB,
            (true, false) => 8192 * MIB,
            (false, true) => 16 * MIB,
            (false, false) => 256 * MIB,
        };
        // 64 KiB samples (32 Ki u16 tokens) in 8 MiB batches; 1 MiB samples for the cold file,
        // where each sample is one request of the read ceiling's size.
        let (wide, small) = (cache_threads(), 64 << 10);
        // The read ceiling on the data file's file system, before the cold cases need it.
        let mut cases = vec![json!({"what": "read", "file_bytes": file})];
        // The page-cache design, then buffered reads and 8 threads (the first design) to show
        // what each lever is worth.
        let warm = [("mmap", wide), ("buffered", wide), ("mmap", 8), ("buffered", 8)];
        for (k, &(read, threads)) in warm.iter().enumerate() {
            if warm[..k].contains(&(read, threads)) {
                continue; // every core but two is 8 threads: the cases at 8 are the same ones
            }
            cases.push(json!({"what": "load", "cache": "warm", "read": read, "threads": threads, "sample": small, "batch": 128, "file_bytes": file}));
        }
        if gpu {
            // No CPU copy: one thread; 1 MiB samples show what each copy's own cost is.
            for (sample, batch) in [(small, 128), (MIB, 8)] {
                cases.push(json!({"what": "load", "cache": "warm", "read": "registered", "threads": 1, "sample": sample, "batch": batch, "file_bytes": file}));
            }
        }
        for (sample, batch) in [(small, 128), (MIB, 8)] {
            cases.push(json!({"what": "load", "cache": "cold", "read": "direct", "threads": 8, "sample": sample, "batch": batch, "file_bytes": file}));
        }
        if gpu {
            cases.push(json!({"what": "overlap", "cache": "warm", "read": "mmap", "threads": wide, "sample": small, "batch": 128, "file_bytes": file}));
            cases.push(json!({"what": "overlap", "cache": "warm", "read": "registered", "threads": 1, "sample": small, "batch": 128, "file_bytes": file}));
        }
        cases
    }
    /// A few odd-sized samples (not a multiple of 4 KiB or of the streamed copy's blocks, read
    /// through the map) and a trailing partial one, batches of 3: every copy and the consume
    /// kernel on ragged sizes.
    fn sanitize_cases(&self, backend: &Backend) -> Vec<Value> {
        let small = |what: &str, read: &str| json!({"what": what, "cache": "warm", "read": read, "threads": 2, "sample": 8192 + 16, "batch": 3, "file_bytes": 13 * (8192 + 16) + 100});
        match backend {
            Backend::Cuda(_) => vec![small("load", "mmap"), small("overlap", "mmap"), small("load", "registered"), small("overlap", "registered")],
            Backend::Cpu => vec![small("load", "mmap")],
        }
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        let file = DataFile::create(s, case)?;
        match param_str(case, "what")? {
            "read" => read_ceiling(s, case, &file.path).map(|_| ()),
            "load" => load(s, case, &file.path),
            "overlap" => match s.backend.clone() {
                Backend::Cuda(gpu) => overlap(s, &gpu, case, &file.path),
                Backend::Cpu => Err(LabError::Invalid("the overlap case needs a GPU".into())),
            },
            other => Err(LabError::Invalid(format!("no loader case `{other}` (read | load | overlap)"))),
        }
    }
}

/// The case's data file: seeded random bytes under `--data-dir` (or a temp dir), removed after
/// the case.
struct DataFile {
    path: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl DataFile {
    fn create(s: &Session, case: &Value) -> Result<DataFile> {
        let bytes = param_usize(case, "file_bytes")?;
        let (dir, temp) = match &s.opts.data_dir {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(|e| LabError::io(d, format!("cannot create the data folder: {e}")))?;
                (d.clone(), None)
            }
            None => {
                let t = tempfile::tempdir().map_err(|e| LabError::io(std::env::temp_dir(), format!("cannot make a temp dir: {e}")))?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let path = dir.join(format!("lab-loader-{bytes}.bin"));
        write_random(&path, bytes, s.opts.seed)?;
        Ok(DataFile { path, _temp: temp })
    }
}

impl Drop for DataFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `bytes` seeded random bytes (every sample distinct), written back to disk before returning.
fn write_random(path: &Path, bytes: usize, seed: u64) -> Result<()> {
    use std::io::Write;
    const CHUNK: usize = 8 * MIB;
    let err = |e: std::io::Error| LabError::io(path, format!("cannot write the data file: {e}"));
    let mut file = std::fs::File::create(path).map_err(err)?;
    let mut buf = vec![0u8; CHUNK * 8];
    for start in (0..bytes).step_by(buf.len()) {
        let n = buf.len().min(bytes - start);
        buf[..n].par_chunks_mut(CHUNK).enumerate().for_each(|(k, c)| {
            rand::rngs::StdRng::seed_from_u64(seed ^ ((start / CHUNK + k) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).fill_bytes(c);
        });
        file.write_all(&buf[..n]).map_err(err)?;
    }
    file.sync_all().map_err(err)
}

/// Threads copying out of the page cache in the loader's design: every core but two (the
/// caller's thread issuing copies and the reader's), at least two.
fn cache_threads() -> usize {
    std::thread::available_parallelism().map_or(8, |n| n.get()).saturating_sub(2).max(2)
}

/// The loader's settings for a case: its read mode and threads (O_DIRECT at queue depth 32 for
/// the cold file); a ring of 8 host buffers, 4 batches copied ahead, a seeded shuffle. Cases
/// recorded before `read` and `threads` were parameters rerun as they ran: buffered (warm) or
/// O_DIRECT (cold) reads, 8 threads.
fn config(s: &Session, case: &Value) -> Result<Config> {
    let read = match case.get("read") {
        Some(_) => param_str(case, "read")?,
        None if param_str(case, "cache")? == "cold" => "direct",
        None => "buffered",
    };
    let threads = if case.get("threads").is_some() { param_usize(case, "threads")? } else { 8 };
    Ok(Config {
        ring: 8,
        prefetch: 4,
        shuffle: Some(s.opts.seed),
        read: <ReadMode as clap::ValueEnum>::from_str(read, false).map_err(|_| LabError::Invalid(format!("case {case}: no read mode `{read}` (direct | buffered | mmap | registered)")))?,
        queue_depth: 32,
        threads,
        ..Config::bytes(param_usize(case, "sample")?, param_usize(case, "batch")?)
    })
}

/// One untimed epoch with every sample checked against the file: the error figures, and the
/// first problem named.
fn verify(loader: &mut Loader) -> Result<(ErrorStats, Option<String>)> {
    let mut tally = Tally::of_file(loader.path(), loader.config())?;
    let stream = loader.compute_stream().cloned();
    let mut e = loader.epoch(0)?;
    let mut host = Vec::new();
    while let Some(b) = e.next_batch()? {
        match (b.data, &stream) {
            (BatchData::Host(bytes), _) => tally.add(b.samples, bytes)?,
            (BatchData::Cuda(view), Some(stream)) => {
                host.resize(view.len(), 0u8);
                stream.memcpy_dtoh(&view, &mut host).doing("reading a delivered batch back")?;
                stream.synchronize().doing("waiting for a batch's read-back")?;
                tally.add(b.samples, &host)?;
            }
            (BatchData::Cuda(_), None) => unreachable!("device batches come with a compute stream"),
        }
    }
    Ok((tally.stats(), tally.check().err().map(|e| e.to_string())))
}

/// Times whole epochs (host clock, from the epoch's start to the compute stream's end),
/// `prepare` untimed before each, `consume` on every batch.
fn time_epochs(budget: &Budget, loader: &mut Loader, mut prepare: impl FnMut() -> Result<()>, mut consume: impl FnMut(&BatchData) -> Result<()>) -> Result<(TimeSummary, TimingMode)> {
    let mut epoch = 1;
    let stream = loader.compute_stream().cloned();
    host_time(budget, &mut prepare, || {
        let mut e = loader.epoch(epoch)?;
        epoch += 1;
        while let Some(b) = e.next_batch()? {
            consume(&b.data)?;
        }
        drop(e);
        match &stream {
            Some(st) => st.synchronize().doing("waiting for the epoch's last batch"),
            None => Ok(()),
        }
    })
}

/// The run's O_DIRECT read ceiling on `path`'s file system: measured on first use (the `read`
/// case, or the first cold case run without it), a record per queue depth, the best kept; None
/// where the file system refuses O_DIRECT.
fn read_ceiling(s: &mut Session, case: &Value, path: &Path) -> Result<Option<Ceiling>> {
    if let Some(c) = s.ceilings.get(READ_CEILING) {
        return Ok(Some(*c));
    }
    if !param_timed(case) {
        return Ok(None);
    }
    let bytes = std::fs::metadata(path).map_err(|e| LabError::io(path, e))?.len();
    for depth in QUEUE_DEPTHS {
        let params = json!({"what": "read", "queue_depth": depth, "block": READ_BLOCK, "file_bytes": case["file_bytes"]});
        let mut read_path = None;
        let (t, mode) = host_time(&s.budget, || Ok(()), || {
            read_path = Some(read::read_through(path, ReadMode::Direct, READ_BLOCK, depth, bytes)?.1);
            Ok::<(), LabError>(())
        })?;
        let work = Work { bytes: bytes / READ_BLOCK as u64 * READ_BLOCK as u64, flops: 0 };
        let mut m = Measurement::new("o_direct_read", "linux", &params, work);
        m.extra.insert("read_path".into(), json!(read_path));
        let gb_s = work.throughput(t.median).gb_s;
        if read_path.as_ref().is_some_and(|r| r.mode == "direct") && s.ceilings.get(READ_CEILING).is_none_or(|c| c.value < gb_s) {
            s.ceilings.insert(READ_CEILING, Ceiling { value: gb_s, spread: work.throughput(t.p20).gb_s / gb_s - 1.0 });
        }
        m.time = Some((t, mode));
        m.ceiling = s.ceilings.contains_key(READ_CEILING).then_some(READ_CEILING);
        s.emit(m)?;
    }
    random_reads(s, case, path, bytes)?;
    Ok(s.ceilings.get(READ_CEILING).copied())
}

/// The disk's own rate for the cold case's pattern: 64 KiB samples in a shuffled order, O_DIRECT
/// at the loader's queue depth, batches of 128 into a ring of two buffers, no copies. Placed
/// against the read ceiling (sequential 1 MiB requests), which it does not set: it says what a
/// shuffled small-sample epoch can reach on this disk.
fn random_reads(s: &mut Session, case: &Value, path: &Path, bytes: u64) -> Result<()> {
    let (sample, batch, depth) = (64 << 10, 128, 32);
    if bytes < sample as u64 {
        return Ok(());
    }
    let mut src = read::Source::open(path, ReadMode::Direct, sample, depth, 1)?;
    let order = data::epoch_order(bytes / sample as u64, Some(s.opts.seed), 0);
    let mut ring: Vec<read::AlignedBuf> = (0..2).map(|_| read::AlignedBuf::zeroed(sample * batch)).collect();
    let (t, mode) = host_time(&s.budget, || Ok(()), || read::read_samples(&mut src, &order, sample, batch, &mut ring))?;
    let params = json!({"what": "read", "queue_depth": depth, "block": sample, "order": "shuffled", "file_bytes": case["file_bytes"]});
    let mut m = Measurement::new("o_direct_read", "linux", &params, Work { bytes: order.len() as u64 * sample as u64, flops: 0 });
    m.extra.insert("read_path".into(), json!(src.read_path));
    m.time = Some((t, mode));
    m.ceiling = s.ceilings.contains_key(READ_CEILING).then_some(READ_CEILING);
    s.emit(m).map(|_| ())
}

/// The roof a case is a fraction of: host-to-device (page cache) or the lower of it and the
/// read ceiling (cold; the copy roof alone where O_DIRECT is refused, and the record says so);
/// on the CPU backend host memory copy bandwidth stands for host-to-device.
fn roof(s: &mut Session, case: &Value, path: &Path) -> Result<(&'static str, Option<&'static str>)> {
    let h2d = if matches!(s.backend, Backend::Cuda(_)) { "h2d_pinned_gb_s" } else { "copy_gb_s" };
    let h2d_value = s.ceiling(h2d)?.value;
    if param_str(case, "cache")? != "cold" {
        return Ok((h2d, None));
    }
    Ok(match read_ceiling(s, case, path)? {
        Some(read) if read.value < h2d_value => (READ_CEILING, None),
        Some(_) => (h2d, None),
        None => (h2d, Some("no O_DIRECT on this file system: no read ceiling, the bound is the copy roof alone")),
    })
}

/// The loader's record: its work, verdict, settings and how the file was read.
fn measurement(variant: &str, case: &Value, loader: &Loader, (error, problem): (ErrorStats, Option<String>)) -> Measurement {
    let work = Work { bytes: loader.samples() * loader.config().sample_bytes as u64, flops: 0 };
    let mut m = Measurement::new(variant, "lab", case, work);
    m.error = Some(error);
    if let Some(p) = problem {
        m.extra.insert("check_failure".into(), json!(p));
    }
    m.extra.insert("loader".into(), json!(loader.config()));
    m.extra.insert("read_path".into(), json!(loader.read_path()));
    if let Some(ms) = loader.register_ms() {
        m.extra.insert("register_ms".into(), json!(ms));
    }
    m.extra.insert("samples".into(), json!(loader.samples()));
    m.extra.insert("batches".into(), json!(loader.batches()));
    m.extra.insert("dropped_tail_bytes".into(), json!(loader.dropped_tail_bytes()));
    m
}

fn load(s: &mut Session, case: &Value, path: &Path) -> Result<()> {
    let cfg = config(s, case)?;
    let variant = match (&s.backend, cfg.read) {
        (Backend::Cpu, _) => "host_ring",
        (Backend::Cuda(_), ReadMode::Registered) => "registered_map",
        (Backend::Cuda(_), _) => "pinned_ring",
    };
    let cold = param_str(case, "cache")? == "cold";
    if s.wants(variant, "lab") {
        let mut loader = Loader::open(path, cfg.clone(), &s.backend)?;
        let error = verify(&mut loader)?;
        let mut m = measurement(variant, case, &loader, error);
        if param_timed(case) {
            let (ceiling, caveat) = roof(s, case, path)?;
            if let Some(c) = caveat {
                m.extra.insert("bound_caveat".into(), json!(c));
            }
            let mut resident = Vec::new();
            let time = if cold {
                time_epochs(
                    &s.budget,
                    &mut loader,
                    || {
                        resident.push(read::evict(path)?);
                        Ok(())
                    },
                    |_| Ok(()),
                )?
            } else {
                // Read once through the page cache: the timed epochs find it there.
                read::read_through(path, ReadMode::Buffered, MIB, 1, u64::MAX)?;
                resident.push(read::resident(path)?);
                time_epochs(&s.budget, &mut loader, || Ok(()), |_| Ok(()))?
            };
            // A registered map has no reads of its own to time.
            if !cold && cfg.read != ReadMode::Registered && s.wants("cache_read", "linux") {
                cache_read(s, case, &loader)?;
            }
            let how = if cold { "posix_fadvise(POSIX_FADV_DONTNEED) after fsync before every epoch; O_DIRECT reads" } else { "read once through the page cache before timing" };
            m.extra.insert("cache_state".into(), json!({"how": how, "resident_fraction_max": resident.iter().cloned().fold(0.0, f64::max)}));
            (m.time, m.ceiling) = (Some(time), Some(ceiling));
        }
        s.emit(m)?;
    }
    let design = cfg.read == ReadMode::Mmap && cfg.threads == cache_threads();
    if !cold && design && param_timed(case) {
        if let Backend::Cuda(gpu) = s.backend.clone() {
            torch_peers(s, &gpu, case, path)?;
        }
    }
    Ok(())
}

/// The loader's reads alone, out of the page cache into a ring of host buffers like its own
/// (touched first, as pinned memory is), in its sample order and with its read mode and
/// threads: whether the reads outrun the copies. Placed against the host-to-device roof they
/// feed.
fn cache_read(s: &mut Session, case: &Value, loader: &Loader) -> Result<()> {
    let cfg = loader.config();
    let mut src = read::Source::open(loader.path(), cfg.read, cfg.sample_bytes, cfg.queue_depth, cfg.threads)?;
    let mut ring: Vec<read::AlignedBuf> = (0..cfg.ring).map(|_| read::AlignedBuf::zeroed(cfg.sample_bytes * cfg.batch_samples)).collect();
    ring.iter_mut().for_each(|b| b.fill(1));
    let mut epoch = 0;
    let (t, mode) = host_time(&s.budget, || Ok(()), || {
        epoch += 1;
        read::read_samples(&mut src, &data::epoch_order(loader.samples(), cfg.shuffle, epoch), cfg.sample_bytes, cfg.batch_samples, &mut ring)
    })?;
    let params = json!({"what": "cache_read", "read": cfg.read, "threads": cfg.threads, "sample": case["sample"], "batch": case["batch"], "file_bytes": case["file_bytes"]});
    let mut m = Measurement::new("cache_read", "linux", &params, Work { bytes: loader.samples() * cfg.sample_bytes as u64, flops: 0 });
    m.extra.insert("read_path".into(), json!(src.read_path));
    let h2d = if matches!(s.backend, Backend::Cuda(_)) { "h2d_pinned_gb_s" } else { "copy_gb_s" };
    (m.time, m.ceiling) = (Some((t, mode)), Some(h2d));
    s.emit(m).map(|_| ())
}

/// A per-sample checksum torch computes on the GPU as easily: sum of byte * (j % 251 + 1).
fn weighted_sum(sample: &[u8]) -> u64 {
    sample.iter().enumerate().map(|(j, &b)| b as u64 * (j as u64 % 251 + 1)).sum()
}

/// torch's DataLoader on the same file and sample order: 8 workers, pinned batches copied with
/// non_blocking=True; and pageable batches copied as they come.
fn torch_peers(s: &mut Session, gpu: &Gpu, case: &Value, path: &Path) -> Result<()> {
    let (sample, batch) = (param_usize(case, "sample")?, param_usize(case, "batch")?);
    let len = std::fs::metadata(path).map_err(|e| LabError::io(path, e))?.len();
    let samples = len / sample as u64;
    let order = data::epoch_order(samples, Some(s.opts.seed), 0);
    let dir = tempfile::tempdir().map_err(|e| LabError::io(std::env::temp_dir(), e))?;
    let order_path = dir.path().join("order.u64");
    std::fs::write(&order_path, order.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>()).map_err(|e| LabError::io(&order_path, e))?;
    let file = std::fs::read(path).map_err(|e| LabError::io(path, e))?;
    let expected: Vec<u64> = order.par_iter().map(|&i| weighted_sum(&file[i as usize * sample..(i as usize + 1) * sample])).collect();
    drop(file);
    for pinned in [true, false] {
        let variant = if pinned { "torch DataLoader (pin_memory, non_blocking)" } else { "torch DataLoader (pageable)" };
        if !s.wants_peer(Peer::Torch, variant, "torch") {
            continue;
        }
        let args = json!({"path": path.display().to_string(), "order": order_path.display().to_string(), "sample_bytes": sample, "batch": batch, "workers": 8, "pin_memory": pinned});
        let run = crate::experiment::peers::torch("dataloader", "u8", args, &[], &s.budget, gpu.info.l2_bytes)?;
        let got: Vec<u64> = run.output.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let flags: Vec<u32> = (0..expected.len()).map(|k| u32::from(got.get(k) == Some(&expected[k]))).collect();
        let mut m = Measurement::new(run.variant, "torch", case, Work { bytes: samples * sample as u64, flops: 0 });
        m.error = Some(crate::ops::compare::compare_bits(&flags, &vec![1; flags.len()], "weighted byte sum of each sample, in delivery order"));
        (m.time, m.ceiling, m.extra) = (Some(run.time), Some("h2d_pinned_gb_s"), run.extra);
        s.emit(m)?;
    }
    Ok(())
}

/// Load + compute against the longer of the two: the consume kernel is set to take as long per
/// batch as loading it (the hardest case for overlap), timed alone, then the epoch is timed with
/// it on every batch. The record's throughput and fraction are the data's bytes against the
/// host-to-device roof; the efficiency is `extra.overlap.efficiency`.
fn overlap(s: &mut Session, gpu: &Gpu, case: &Value, path: &Path) -> Result<()> {
    if !s.wants("overlap", "lab") {
        return Ok(());
    }
    let mut loader = Loader::open(path, config(s, case)?, &s.backend)?;
    let f = gpu.function(FAMILY, &symbol(FAMILY, "consume", DType::F32))?;
    let cfg = LaunchConfig { grid_dim: (gpu.info.sm_count as u32 * 4, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut out = gpu.stream.alloc_zeros::<f32>(gpu.info.sm_count as usize * 4 * 256).doing("allocating the consume kernel's output")?;
    let consume = |data: &BatchData, iters: i32, out: &mut cudarc::driver::CudaSlice<f32>| -> Result<()> {
        let BatchData::Cuda(view) = data else { unreachable!("overlap runs on the GPU") };
        let words = (view.len() / 16) as i64;
        // SAFETY: the view holds `words` 16-byte words (device allocations are 256-B aligned and
        // batches start at their buffer's start); out one float per launched thread.
        unsafe { gpu.stream.launch_builder(&f).arg(view).arg(&words).arg(out).arg(&iters).launch(cfg) }.map(|_| ()).doing("launching loader_consume")
    };
    let error = verify(&mut loader)?;
    let mut m = measurement("overlap", case, &loader, error);
    if !param_timed(case) {
        // Under a sanitizer: one epoch with the kernel on every (ragged) batch.
        let mut e = loader.epoch(1)?;
        while let Some(b) = e.next_batch()? {
            consume(&b.data, 8, &mut out)?;
        }
        drop(e);
        gpu.sync()?;
        return s.emit(m).map(|_| ());
    }
    read::read_through(path, ReadMode::Buffered, MIB, 1, u64::MAX)?;
    let budget = s.budget;
    let load = time_epochs(&budget, &mut loader, || Ok(()), |_| Ok(()))?.0.median;
    // The kernel's time is a + b iters (a: launch and the read of the batch): fitted on a
    // batch-sized buffer at two lengths, then set to one batch's share of the load time. (The
    // first design scaled one length through zero, which left it ~14% short.)
    let batch_bytes = loader.config().sample_bytes * loader.config().batch_samples;
    let probe = gpu.stream.alloc_zeros::<u8>(batch_bytes).doing("allocating a batch-sized probe")?;
    let probe_view = BatchData::Cuda(probe.slice(..));
    let per_batch = |iters: i32, out: &mut cudarc::driver::CudaSlice<f32>| time_gpu(gpu, &budget, || consume(&probe_view, iters, out)).map(|t| t.0.median);
    let (short, long) = (1024, 8192);
    let (t_short, t_long) = (per_batch(short, &mut out)?, per_batch(long, &mut out)?);
    let slope = (t_long - t_short) / (long - short) as f64;
    let target = load / loader.batches() as f64;
    let iters = if slope > 0.0 { ((target - (t_short - slope * short as f64)) / slope).round().clamp(1.0, i32::MAX as f64) as i32 } else { long };
    let kernel = per_batch(iters, &mut out)?;
    let compute = kernel * loader.batches() as f64;
    let both = time_epochs(&budget, &mut loader, || Ok(()), |b| consume(b, iters, &mut out))?;
    let efficiency = load.max(compute) / both.0.median;
    m.extra.insert("overlap".into(), json!({"load_ms": load, "compute_ms": compute, "kernel_ms": kernel, "target_kernel_ms": target, "iters": iters, "efficiency": efficiency}));
    (m.time, m.ceiling) = (Some(both), Some("h2d_pinned_gb_s"));
    s.emit(m).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::RunOptions;

    /// The whole experiment on the CPU backend at test size: every record passes, the cold
    /// case is placed against a measured roof, and the data files are gone afterwards.
    #[test]
    fn the_cpu_sweep_checks_every_sample_and_cleans_up() {
        let (out, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let opts = RunOptions { quick: true, data_dir: Some(data.path().into()), ..RunOptions::new(out.path(), 5) };
        let mut s = Session::new(Backend::Cpu, opts).unwrap();
        s.budget = Budget { warmup: 1, min: 2, max: 2, budget_ms: 0.0, ..s.budget };
        let cases: Vec<Value> = LoaderExp.cases(&Backend::Cpu, true).into_iter().map(|mut c| {
            c["file_bytes"] = json!(4 * MIB + 123);
            c
        }).collect();
        s.run(&LoaderExp, &cases).unwrap();
        let of = |variant: &str, cache: &str| -> Vec<&crate::record::Record> {
            s.records.iter().filter(|r| r.experiment == "loader" && r.variant == variant && r.params.get("cache").is_none_or(|c| c == cache)).collect()
        };
        let (warm, cold) = (of("host_ring", "warm"), of("host_ring", "cold"));
        let warm_cases = LoaderExp.cases(&Backend::Cpu, true).iter().filter(|c| c["cache"] == "warm").count();
        assert_eq!((warm.len(), cold.len()), (warm_cases, 2));
        let modes: std::collections::BTreeSet<_> = warm.iter().map(|r| r.extra["read_path"]["mode"].as_str().unwrap()).collect();
        assert_eq!(modes, ["buffered", "mmap"].into(), "the page cache is read both ways");
        assert_eq!(s.records.first().map(|r| r.params["what"].clone()), Some(json!("read")), "the read ceiling comes first");
        for r in warm.iter().chain(&cold) {
            assert_eq!(r.verdict, crate::record::Verdict::Pass, "{:?}", r.error);
            assert_eq!(r.extra["dropped_tail_bytes"], json!(123));
            assert!(r.fraction_of_ceiling.is_some() && r.time_ms.is_some());
        }
        // Each warm case also times its reads alone, with the same mode and threads.
        let reads_alone = of("cache_read", "warm");
        assert_eq!(reads_alone.len(), warm.len());
        for (r, l) in reads_alone.iter().zip(&warm) {
            assert_eq!((&r.params["read"], &r.params["threads"]), (&l.params["read"], &l.params["threads"]));
            assert!(r.time_ms.is_some() && r.ceiling.as_deref() == Some("copy_gb_s"), "{r:?}");
        }
        assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0, "data files removed");
        let reads = s.records.iter().filter(|r| r.variant == "o_direct_read").count();
        match cold[0].extra["read_path"]["mode"].as_str() {
            Some("direct") => {
                assert_eq!(reads, QUEUE_DEPTHS.len() + 1, "a read record per queue depth and the shuffled 64 KiB reads, once per run");
                let lower = if s.ceilings[READ_CEILING].value < s.ceilings["copy_gb_s"].value { READ_CEILING } else { "copy_gb_s" };
                assert_eq!(cold[0].ceiling.as_deref(), Some(lower), "the cold case is placed against the lower roof");
            }
            _ => assert!(cold[0].extra["bound_caveat"].is_string()),
        }
    }

    #[test]
    fn a_case_with_an_unknown_read_mode_is_named() {
        let s = Session::new(Backend::Cpu, RunOptions::new(tempfile::tempdir().unwrap().path(), 5)).unwrap();
        let case = json!({"what": "load", "cache": "warm", "read": "mmapped", "threads": 2, "sample": 4096, "batch": 2, "file_bytes": 8192});
        let err = config(&s, &case).unwrap_err().to_string();
        assert!(err.contains("no read mode `mmapped`"), "{err}");
        // A case recorded before the read mode was a parameter runs as it did.
        let old = |cache: &str| config(&s, &json!({"what": "load", "cache": cache, "sample": 4096, "batch": 2, "file_bytes": 8192})).unwrap();
        assert_eq!((old("warm").read, old("warm").threads, old("cold").read), (ReadMode::Buffered, 8, ReadMode::Direct));
    }

    #[test]
    fn the_torch_checksum_weights_position_within_a_sample() {
        assert_eq!(weighted_sum(&[1, 2, 3]), 1 + 4 + 9);
        let (a, b) = ([5u8, 0, 0].repeat(100), [0u8, 5, 0].repeat(100));
        assert_ne!(weighted_sum(&a), weighted_sum(&b));
        assert_eq!(weighted_sum(&[1; 252]), (1..=251).sum::<u64>() + 1);
    }
}
