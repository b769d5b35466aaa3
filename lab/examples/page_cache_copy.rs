//! How fast can samples be copied out of the page cache into host buffers? The loader's reads
//! alone (lab::data::read::read_samples: 64 KiB samples in a shuffled order, batches of 128 into
//! a ring of 8 buffers touched beforehand, as pinned ones are), by `pread`, by copying from a map
//! of the file with non-temporal stores (the loader's mmap path), and by a plain memcpy from the
//! map (what the non-temporal stores are measured against), over 1 and N threads.
//!
//! `cargo run --release --example page_cache_copy -- [FILE_MIB] [THREADS,...] [EPOCHS]`
//! (default 1024 MiB, threads 1 and every core, 6 epochs). The file is written to a temp dir
//! and read once before timing. GB/s per CPU-second (user + system time of the process) is the
//! figure that holds on a machine other work shares; epoch 0 of a map pays its page faults.

use lab::data::read::{self, AlignedBuf, ReadMode, Source};
use lab::data::epoch_order;
use lab::profile::TimeSummary;
use lab::{LabError, Result};
use rand::{RngCore, SeedableRng};
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

const SAMPLE: usize = 64 << 10;
const BATCH: usize = 128;
const RING: usize = 8;

/// User + system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    // SAFETY: zeroed, then filled by the call above.
    let u = unsafe { u.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// One way of filling a batch: through the loader's source, or a plain memcpy from a map.
enum How {
    Source(Source),
    Memcpy(memmap2::Mmap, rayon::ThreadPool),
}

impl How {
    fn epoch(&mut self, order: &[u64], ring: &mut [AlignedBuf]) -> Result<()> {
        match self {
            How::Source(src) => read::read_samples(src, order, SAMPLE, BATCH, ring),
            How::Memcpy(map, pool) => {
                for (k, samples) in order.chunks(BATCH).enumerate() {
                    let buf = &mut ring[k % RING];
                    pool.install(|| {
                        buf.par_chunks_mut(SAMPLE).zip(samples).for_each(|(b, &i)| b.copy_from_slice(&map[i as usize * SAMPLE..(i as usize + 1) * SAMPLE]));
                    });
                }
                Ok(())
            }
        }
    }
}

fn open(path: &Path, what: &str, threads: usize) -> Result<How> {
    Ok(match what {
        "pread" => How::Source(Source::open(path, ReadMode::Buffered, SAMPLE, 1, threads)?),
        "mmap+stream" => How::Source(Source::open(path, ReadMode::Mmap, SAMPLE, 1, threads)?),
        _ => {
            let file = std::fs::File::open(path).map_err(|e| LabError::io(path, e))?;
            // SAFETY: the example's own file, not changed while mapped.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LabError::io(path, e))?;
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| LabError::Invalid(e.to_string()))?;
            How::Memcpy(map, pool)
        }
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bad = |what: &str, v: &str| LabError::Invalid(format!("{what} `{v}` is not a number"));
    let mib: usize = args.first().map(|v| v.parse().map_err(|_| bad("FILE_MIB", v))).transpose()?.unwrap_or(1024);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<usize> = match args.get(1) {
        Some(v) => v.split(',').map(|t| t.parse().map_err(|_| bad("THREADS", t))).collect::<Result<_>>()?,
        None => if cores > 1 { vec![1, cores] } else { vec![1] },
    };
    let epochs: usize = args.get(2).map(|v| v.parse().map_err(|_| bad("EPOCHS", v))).transpose()?.unwrap_or(6).max(2);

    let dir = tempfile::tempdir().map_err(|e| LabError::io(std::env::temp_dir(), e))?;
    let path = dir.path().join("samples.bin");
    let mut bytes = vec![0u8; mib << 20];
    rand::rngs::StdRng::seed_from_u64(1).fill_bytes(&mut bytes);
    std::fs::write(&path, &bytes).map_err(|e| LabError::io(&path, e))?;
    drop(bytes);
    read::read_through(&path, ReadMode::Buffered, 1 << 20, 1, u64::MAX)?;
    println!("{mib} MiB file, page cache resident {:.0}%, {cores} cores; {SAMPLE} B samples shuffled, batches of {BATCH}", 100.0 * read::resident(&path)?);
    println!("{:<12} {:>7} {:>14} {:>22} {:>16}", "how", "threads", "epoch 0 GB/s", "later GB/s (p20-p80)", "GB/s per CPU-s");

    let samples = (mib << 20) as u64 / SAMPLE as u64;
    let mut ring: Vec<AlignedBuf> = (0..RING).map(|_| AlignedBuf::zeroed(SAMPLE * BATCH)).collect();
    ring.iter_mut().for_each(|b| b.fill(1));
    // Interleaved, so that other work on the machine spreads over all of them alike.
    for &t in &threads {
        for what in ["pread", "mmap+stream", "mmap+memcpy"] {
            let mut how = open(&path, what, t)?;
            let (mut ms, mut cpu) = (Vec::new(), 0.0);
            for epoch in 0..epochs {
                let order = epoch_order(samples, Some(7), epoch as u64);
                let (t0, c0) = (Instant::now(), cpu_seconds());
                how.epoch(&order, &mut ring)?;
                ms.push(t0.elapsed().as_secs_f64() * 1e3);
                if epoch > 0 {
                    cpu += cpu_seconds() - c0;
                }
            }
            let gb = (samples as usize * SAMPLE) as f64 / 1e9;
            let later = TimeSummary::of(&ms[1..]);
            println!(
                "{what:<12} {t:>7} {:>14.2} {:>9.2} ({:.2}-{:.2}) {:>16.2}",
                gb / ms[0] * 1e3,
                gb / later.median * 1e3,
                gb / later.p80 * 1e3,
                gb / later.p20 * 1e3,
                gb * (epochs - 1) as f64 / cpu
            );
        }
    }
    Ok(())
}
