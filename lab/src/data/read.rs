//! Reading samples from one file: O_DIRECT through io_uring at a chosen queue depth (no page
//! cache, the disk's own bandwidth), buffered `pread`, or a memory map copied from with
//! non-temporal stores ([`stream_copy`]). A read that comes back short (the file shrank) is an
//! error naming the file and the offset. (The fourth mode, a map the copy engine reads itself,
//! is the CUDA sink's: [`super::sink::Registered`].)

use crate::{LabError, Result};
use io_uring::{opcode, types, IoUring};
use rayon::prelude::*;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// O_DIRECT wants offsets, lengths and buffer addresses on the device's logical block; 4 KiB
/// covers every common one (512 B and 4 KiB sectors).
pub const DIRECT_ALIGN: usize = 4096;

/// How samples come off the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    /// O_DIRECT through io_uring; buffered reads where the file system, the sample size or the
    /// kernel does not allow it (the loader says why).
    Direct,
    /// `pread` through the page cache.
    Buffered,
    /// A memory map of the file, copied from with non-temporal stores: the fastest CPU copy
    /// out of the page cache (reports/notes/h100-loader.md).
    Mmap,
    /// A memory map of the file pinned and registered with the driver read-only: the copy
    /// engine reads the page cache itself, no CPU copy (CUDA; `mmap` on the CPU backend or where
    /// the driver refuses, and the loader says why).
    Registered,
}

impl ReadMode {
    pub fn name(self) -> &'static str {
        match self {
            ReadMode::Direct => "direct",
            ReadMode::Buffered => "buffered",
            ReadMode::Mmap => "mmap",
            ReadMode::Registered => "registered",
        }
    }
}

/// What a source does, and why it is not what was asked for (the record's `read_path`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReadPath {
    pub mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

enum Kind {
    Direct(Box<IoUring>),
    Buffered,
    Mmap(memmap2::Mmap),
}

/// An open data file.
pub struct Source {
    path: PathBuf,
    file: File,
    len: u64,
    kind: Kind,
    queue_depth: usize,
    /// Threads for buffered and mapped reads (None: the reader's own).
    pool: Option<rayon::ThreadPool>,
    pub read_path: ReadPath,
}

/// Opens `path` for reading, naming it in any error; it must be a regular file.
fn open_plain(path: &Path) -> Result<(File, u64)> {
    let file = File::open(path).map_err(|e| LabError::io(path, format!("cannot open for reading: {e}")))?;
    let meta = file.metadata().map_err(|e| LabError::io(path, format!("cannot stat: {e}")))?;
    if !meta.is_file() {
        return Err(LabError::io(path, "not a regular file"));
    }
    Ok((file, meta.len()))
}

/// An O_DIRECT descriptor, or why there cannot be one.
fn open_direct(path: &Path) -> std::result::Result<File, String> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).map_err(|e| format!("the file system refuses O_DIRECT ({e})"))
}

/// A pool of `n` read threads (None for one: the reader's own thread).
fn read_pool(n: usize) -> Result<Option<rayon::ThreadPool>> {
    match n {
        0 | 1 => Ok(None),
        n => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("lab-data-read-{i}"))
            .build()
            .map(Some)
            .map_err(|e| LabError::Invalid(format!("cannot start {n} read threads: {e}"))),
    }
}

impl Source {
    /// Opens `path` to read samples of `sample_bytes` with `mode`: `queue_depth` reads in flight
    /// with O_DIRECT, `threads` copying at once with the other modes. O_DIRECT falls back to
    /// buffered reads when the sample size is not a multiple of [`DIRECT_ALIGN`] or the file
    /// system refuses it, and to O_DIRECT preads from `queue_depth` threads where io_uring is
    /// refused (containers often block it); `read_path` says which and why.
    pub fn open(path: &Path, mode: ReadMode, sample_bytes: usize, queue_depth: usize, threads: usize) -> Result<Source> {
        Self::open_with(path, mode, sample_bytes, queue_depth, threads, true)
    }

    /// [`Source::open`], with io_uring allowed or not (the tests take the pread path).
    pub(super) fn open_with(path: &Path, mode: ReadMode, sample_bytes: usize, queue_depth: usize, threads: usize, uring: bool) -> Result<Source> {
        let (file, len) = open_plain(path)?;
        let queue_depth = queue_depth.max(1);
        let source = |file, kind, pool, mode: &'static str, fallback| Source { path: path.into(), file, len, kind, queue_depth, pool, read_path: ReadPath { mode, fallback } };
        match mode {
            ReadMode::Buffered => Ok(source(file, Kind::Buffered, read_pool(threads)?, "buffered", None)),
            ReadMode::Mmap | ReadMode::Registered => {
                // SAFETY: a shrinking file would fault the map: every read checks the length first.
                let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LabError::io(path, format!("cannot map: {e}")))?;
                Ok(source(file, Kind::Mmap(map), read_pool(threads)?, "mmap", None))
            }
            ReadMode::Direct if !sample_bytes.is_multiple_of(DIRECT_ALIGN) => {
                let why = format!("O_DIRECT needs samples in multiples of {DIRECT_ALIGN} B, not {sample_bytes} B");
                Ok(source(file, Kind::Buffered, read_pool(threads)?, "buffered", Some(why)))
            }
            ReadMode::Direct => match open_direct(path) {
                Err(why) => Ok(source(file, Kind::Buffered, read_pool(threads)?, "buffered", Some(why))),
                Ok(direct) => {
                    let ring = if uring { IoUring::new(queue_depth.next_power_of_two() as u32).map_err(|e| e.to_string()) } else { Err("not asked for".into()) };
                    match ring {
                        Ok(ring) => Ok(source(direct, Kind::Direct(Box::new(ring)), None, "direct", None)),
                        Err(e) => {
                            let why = format!("io_uring is not available ({e}): O_DIRECT preads from {queue_depth} threads");
                            Ok(source(direct, Kind::Buffered, read_pool(queue_depth)?, "direct", Some(why)))
                        }
                    }
                }
            },
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn short(&self, offset: u64, got: usize, want: usize) -> LabError {
        let now = self.file.metadata().map(|m| m.len().to_string()).unwrap_or_else(|_| "unknown".into());
        LabError::io(&self.path, format!("short read: the file ends at offset {} inside the {want}-byte read at offset {offset} (it was {} bytes when opened, {now} now)", offset + got as u64, self.len))
    }

    /// Fills each buffer with the bytes at its offset. O_DIRECT buffers must start on
    /// [`DIRECT_ALIGN`] and have lengths in multiples of it. Buffered and mapped reads are
    /// spread over the source's threads (copies out of the page cache are CPU-bound).
    pub fn read(&mut self, reads: &mut [(u64, &mut [u8])]) -> Result<()> {
        if let Kind::Direct(_) = self.kind {
            return self.read_direct(reads);
        }
        // A page past the end of a shrunk file is SIGBUS, not an error: look first.
        let now = self.file.metadata().map_err(|e| LabError::io(&self.path, format!("cannot stat: {e}")))?.len();
        let this = &*self;
        let one = |(offset, buf): &mut (u64, &mut [u8])| -> Result<()> {
            match &this.kind {
                Kind::Mmap(map) => {
                    let end = (*offset + buf.len() as u64).min(now).min(map.len() as u64);
                    let got = end.saturating_sub(*offset) as usize;
                    if got < buf.len() {
                        return Err(this.short(*offset, got, buf.len()));
                    }
                    stream_copy(buf, &map[*offset as usize..end as usize]);
                    Ok(())
                }
                _ => this.pread(*offset, buf),
            }
        };
        match &self.pool {
            Some(pool) if reads.len() > 1 => pool.install(|| reads.par_iter_mut().try_for_each(one)),
            _ => reads.iter_mut().try_for_each(one),
        }
    }

    /// Checks that the file still holds every `(offset, bytes)` range, without reading it: the
    /// registered map's copies read pinned pages, which outlive a truncation with stale bytes.
    pub fn check_len(&self, ranges: impl IntoIterator<Item = (u64, usize)>) -> Result<()> {
        let now = self.file.metadata().map_err(|e| LabError::io(&self.path, format!("cannot stat: {e}")))?.len().min(self.len);
        match ranges.into_iter().find(|&(offset, bytes)| offset + bytes as u64 > now) {
            Some((offset, bytes)) => Err(self.short(offset, now.saturating_sub(offset) as usize, bytes)),
            None => Ok(()),
        }
    }

    fn pread(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => return Err(self.short(offset, done, buf.len())),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(LabError::io(&self.path, format!("read failed at offset {}: {e}", offset + done as u64))),
            }
        }
        Ok(())
    }

    /// Keeps up to `queue_depth` reads in flight until every buffer is full.
    fn read_direct(&mut self, reads: &mut [(u64, &mut [u8])]) -> Result<()> {
        let Kind::Direct(ring) = &mut self.kind else { unreachable!("read_direct on a direct source") };
        let fd = types::Fd(self.file.as_raw_fd());
        // The first failure, as (offset, bytes read or the OS error, bytes wanted); reads in
        // flight finish first.
        type Failure = (u64, std::result::Result<usize, std::io::Error>, usize);
        let (mut next, mut in_flight, mut failure): (usize, usize, Option<Failure>) = (0, 0, None);
        while next < reads.len() || in_flight > 0 {
            while next < reads.len() && in_flight < self.queue_depth && failure.is_none() {
                let (offset, buf) = &mut reads[next];
                let entry = opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32).offset(*offset).build().user_data(next as u64);
                // SAFETY: the buffer outlives the read: this function waits for every completion.
                if unsafe { ring.submission().push(&entry) }.is_err() {
                    break;
                }
                (next, in_flight) = (next + 1, in_flight + 1);
            }
            if in_flight == 0 {
                break;
            }
            ring.submit_and_wait(1).map_err(|e| LabError::io(&self.path, format!("io_uring submit failed: {e}")))?;
            for cqe in ring.completion() {
                in_flight -= 1;
                let i = cqe.user_data() as usize;
                let (offset, want, n) = (reads[i].0, reads[i].1.len(), cqe.result());
                if n < 0 {
                    failure.get_or_insert((offset, Err(std::io::Error::from_raw_os_error(-n)), want));
                } else if (n as usize) < want {
                    failure.get_or_insert((offset, Ok(n as usize), want));
                }
            }
        }
        match failure {
            None => Ok(()),
            Some((offset, Ok(got), want)) => Err(self.short(offset, got, want)),
            Some((offset, Err(e), _)) => Err(LabError::io(&self.path, format!("read failed at offset {offset}: {e}"))),
        }
    }
}

/// Copies `src` into `dst` (equal lengths) with non-temporal stores where the CPU has AVX2:
/// the destination is read next by the copy engine, not by this core, so its lines need neither
/// be read for ownership nor kept in cache. Out of the page cache that is ~1.5x a plain memcpy
/// per core (glibc streams only copies of several MiB; samples are smaller): see
/// reports/notes/h100-loader.md and examples/page_cache_copy.rs.
pub fn stream_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy between slices of different lengths");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { stream_copy_avx2(dst, src) };
    }
    dst.copy_from_slice(src);
}

/// Plain copies up to `dst`'s first 32-byte boundary and after its last whole 128-byte block;
/// the blocks between streamed, then fenced so the bytes are visible before the batch is handed
/// over.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_copy_avx2(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    let body = (dst.len() - head) / 128 * 128;
    dst[..head].copy_from_slice(&src[..head]);
    for i in (head..head + body).step_by(128) {
        // SAFETY: i + 128 <= head + body <= len for both slices; dst + i is 32-byte aligned.
        unsafe {
            let (s, d) = (src.as_ptr().add(i) as *const __m256i, dst.as_mut_ptr().add(i) as *mut __m256i);
            let v = [_mm256_loadu_si256(s), _mm256_loadu_si256(s.add(1)), _mm256_loadu_si256(s.add(2)), _mm256_loadu_si256(s.add(3))];
            for (k, v) in v.into_iter().enumerate() {
                _mm256_stream_si256(d.add(k), v);
            }
        }
    }
    _mm_sfence();
    dst[head + body..].copy_from_slice(&src[head + body..]);
}

/// A heap buffer on [`DIRECT_ALIGN`], as O_DIRECT needs (the CPU backend's host ring).
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: an owned allocation, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1), DIRECT_ALIGN).expect("buffer size fits a layout")
    }
    pub fn zeroed(len: usize) -> Self {
        // SAFETY: the layout is non-zero sized.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        AlignedBuf { ptr: std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(len))), len }
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

/// Reads `bytes` from the start of `path` (rounded down to whole blocks) in `block`-sized reads,
/// `depth` in flight, with `mode`; returns the bytes read and how the file was read. The read
/// ceiling's one pass.
pub fn read_through(path: &Path, mode: ReadMode, block: usize, depth: usize, bytes: u64) -> Result<(u64, ReadPath)> {
    let mut src = Source::open(path, mode, block, depth, depth)?;
    let blocks = (bytes.min(src.len()) / block as u64) as usize;
    let mut bufs: Vec<AlignedBuf> = (0..depth.max(1)).map(|_| AlignedBuf::zeroed(block)).collect();
    for first in (0..blocks).step_by(bufs.len()) {
        let mut reads: Vec<(u64, &mut [u8])> = bufs.iter_mut().zip(first..blocks).map(|(b, i)| ((i * block) as u64, &mut b[..])).collect();
        src.read(&mut reads)?;
    }
    Ok(((blocks * block) as u64, src.read_path.clone()))
}

/// Reads the samples `order` (indices of `sample`-byte samples) through `src` in batches of
/// `batch`, batch k into `ring[k % ring.len()]`: the loader's reads without its copies, to time
/// how fast a source copies out of the page cache.
pub fn read_samples(src: &mut Source, order: &[u64], sample: usize, batch: usize, ring: &mut [AlignedBuf]) -> Result<()> {
    let slots = ring.len();
    for (k, samples) in order.chunks(batch).enumerate() {
        let buf = &mut ring[k % slots];
        if buf.len() < samples.len() * sample {
            return Err(LabError::Invalid(format!("a {}-byte buffer cannot hold {} samples of {sample} bytes", buf.len(), samples.len())));
        }
        let mut reads: Vec<(u64, &mut [u8])> = samples.iter().zip(buf.chunks_exact_mut(sample)).map(|(&i, b)| (i * sample as u64, b)).collect();
        src.read(&mut reads)?;
    }
    Ok(())
}

/// Drops `path`'s pages from the page cache (written back first) and says what share of the
/// file is still resident afterwards (mincore): the cold state, and whether it took.
pub fn evict(path: &Path) -> Result<f64> {
    let file = File::open(path).map_err(|e| LabError::io(path, format!("cannot open: {e}")))?;
    file.sync_all().map_err(|e| LabError::io(path, format!("cannot write back before evicting: {e}")))?;
    // SAFETY: a plain advice call on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(LabError::io(path, format!("posix_fadvise(DONTNEED) failed: {}", std::io::Error::from_raw_os_error(rc))));
    }
    resident(path)
}

/// The share of `path`'s pages in the page cache (mincore over a map of it).
pub fn resident(path: &Path) -> Result<f64> {
    let (file, len) = open_plain(path)?;
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: the map is only passed to mincore, never read.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LabError::io(path, format!("cannot map: {e}")))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let pages = (len as usize).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: vec holds one byte per page of the mapped range.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len as usize, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(LabError::io(path, format!("mincore failed: {}", std::io::Error::last_os_error())));
    }
    Ok(vec.iter().filter(|&&v| v & 1 == 1).count() as f64 / pages as f64)
}
