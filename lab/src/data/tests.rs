//! The loader on the CPU backend, on small files in a temp dir.

use super::*;
use rand::RngCore;

/// A file of `len` seeded random bytes (every sample distinct).
fn data_file(dir: &Path, len: usize) -> PathBuf {
    let mut bytes = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(len as u64).fill_bytes(&mut bytes);
    let path = dir.join(format!("data-{len}.bin"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs one epoch, checking every batch's size and tallying every sample against the file.
fn run_epoch(loader: &mut Loader, epoch: u64, tally: &mut Tally) -> Result<Vec<u64>> {
    let (batch, batches) = (loader.config().batch_samples, loader.batches());
    let mut order = Vec::new();
    let mut e = loader.epoch(epoch)?;
    while let Some(b) = e.next_batch()? {
        let BatchData::Host(data) = b.data else { panic!("the CPU backend hands out host bytes") };
        assert!(b.samples.len() == batch || b.index == batches - 1, "only the last batch may be short");
        tally.add(b.samples, data)?;
        order.extend_from_slice(b.samples);
    }
    assert_eq!(e.delivered(), batches);
    Ok(order)
}

#[test]
fn every_sample_is_delivered_once_per_epoch_for_each_ring_prefetch_and_read_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_file(dir.path(), 37 * 4096);
    for read in [ReadMode::Direct, ReadMode::Buffered, ReadMode::Mmap, ReadMode::Registered] {
        for (ring, prefetch) in [(1, 1), (2, 1), (1, 3), (4, 2), (8, 8)] {
            let cfg = Config { ring, prefetch, shuffle: Some(11), read, queue_depth: 3, ..Config::bytes(4096, 5) };
            let mut loader = Loader::open(&path, cfg, &Backend::Cpu).unwrap();
            assert_eq!((loader.samples(), loader.batches()), (37, 8));
            let mut orders = Vec::new();
            for epoch in 0..2 {
                let mut tally = Tally::of_file(&path, loader.config()).unwrap();
                orders.push(run_epoch(&mut loader, epoch, &mut tally).unwrap());
                tally.check().unwrap_or_else(|e| panic!("{read:?} ring {ring} prefetch {prefetch} epoch {epoch}: {e}"));
                assert_eq!(tally.stats().mismatches, 0);
            }
            assert_ne!(orders[0], orders[1], "each epoch has its own permutation");
            assert_ne!(orders[0], (0..37).collect::<Vec<_>>(), "shuffled");
            assert_eq!(orders[0], epoch_order(37, Some(11), 0), "the seed alone sets the order");
        }
    }
}

#[test]
fn a_trailing_partial_sample_is_dropped_and_the_last_batch_holds_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    // Token windows of 25 u16 tokens (50 B): 10 whole windows and 7 bytes.
    let path = data_file(dir.path(), 10 * 50 + 7);
    let mut loader = Loader::open(&path, Config::tokens(25, 2, 4), &Backend::Cpu).unwrap();
    assert_eq!((loader.samples(), loader.dropped_tail_bytes(), loader.batches()), (10, 7, 3));
    let mut tally = Tally::of_file(&path, loader.config()).unwrap();
    let mut sizes = Vec::new();
    {
        let mut e = loader.epoch(0).unwrap();
        while let Some(b) = e.next_batch().unwrap() {
            sizes.push(b.samples.len());
            let BatchData::Host(data) = b.data else { unreachable!() };
            tally.add(b.samples, data).unwrap();
        }
    }
    assert_eq!(sizes, [4, 4, 2]);
    tally.check().unwrap();
    // Samples of 50 B cannot be read with O_DIRECT: the loader says so and reads buffered.
    let rp = loader.read_path();
    assert_eq!(rp.mode, "buffered");
    assert!(rp.fallback.as_deref().unwrap().contains("multiples of 4096 B, not 50 B"), "{rp:?}");
    // A file shorter than one sample is an error, not an empty epoch.
    let tiny = data_file(dir.path(), 49);
    let err = Loader::open(&tiny, Config::bytes(50, 4), &Backend::Cpu).err().unwrap().to_string();
    assert!(err.contains("data-49.bin") && err.contains("not one sample of 50 bytes"), "{err}");
}

#[test]
fn direct_reads_are_used_or_their_absence_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_file(dir.path(), 16 * 4096);
    let loader = Loader::open(&path, Config::bytes(4096, 4), &Backend::Cpu).unwrap();
    let rp = loader.read_path();
    match rp.mode {
        "direct" => assert!(rp.fallback.is_none()),
        "buffered" => assert!(rp.fallback.as_deref().is_some_and(|w| w.contains("O_DIRECT") || w.contains("io_uring")), "{rp:?}"),
        other => panic!("read mode {other}"),
    }
    eprintln!("read path here: {rp:?}");
}

/// Where io_uring is refused, O_DIRECT reads go through preads from a pool of threads: the
/// same bytes, and the source says so.
#[test]
fn without_io_uring_direct_reads_use_threads_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_file(dir.path(), 24 * 4096);
    let mut src = Source::open_with(&path, ReadMode::Direct, 4096, 4, 1, false).unwrap();
    let rp = src.read_path.clone();
    if rp.fallback.as_deref().is_some_and(|w| w.contains("refuses O_DIRECT")) {
        return eprintln!("no O_DIRECT here: {rp:?}");
    }
    assert_eq!(rp.mode, "direct");
    assert!(rp.fallback.as_deref().unwrap().contains("io_uring is not available (not asked for): O_DIRECT preads from 4 threads"), "{rp:?}");
    let file = std::fs::read(&path).unwrap();
    let mut bufs: Vec<read::AlignedBuf> = (0..6).map(|_| read::AlignedBuf::zeroed(2 * 4096)).collect();
    let offsets = [0u64, 5, 9, 11, 17, 22].map(|i| i * 4096);
    let mut reads: Vec<(u64, &mut [u8])> = offsets.iter().zip(bufs.iter_mut()).map(|(&o, b)| (o, &mut b[..])).collect();
    src.read(&mut reads).unwrap();
    for (o, b) in offsets.iter().zip(&bufs) {
        assert_eq!(&b[..], &file[*o as usize..*o as usize + 2 * 4096], "the block at {o}");
    }
    // Past the end: a short read, named.
    let mut tail = read::AlignedBuf::zeroed(2 * 4096);
    let err = src.read(&mut [(23 * 4096, &mut tail[..])]).unwrap_err().to_string();
    assert!(err.contains("ends at offset 98304"), "{err}");
}

#[test]
fn a_file_truncated_under_the_loader_is_an_error_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    for read in [ReadMode::Direct, ReadMode::Buffered, ReadMode::Mmap, ReadMode::Registered] {
        let path = data_file(dir.path(), 40 * 4096);
        let mut loader = Loader::open(&path, Config { read, prefetch: 3, ..Config::bytes(4096, 4) }, &Backend::Cpu).unwrap();
        // Cut mid-sample 21: the first 5 batches (samples 0..20) are whole, batch 5 is not.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(21 * 4096 + 100).unwrap();
        let mut e = loader.epoch(0).unwrap();
        let mut whole = 0;
        let err = loop {
            match e.next_batch() {
                Ok(Some(_)) => whole += 1,
                Ok(None) => panic!("{read:?}: the epoch ended without an error"),
                Err(err) => break err.to_string(),
            }
        };
        assert_eq!(whole, 5, "{read:?}: whole batches before the cut ({err})");
        assert!(err.contains(&path.display().to_string()) && err.contains("ends at offset 86116") && err.contains("short read"), "{read:?}: {err}");
        drop(e);
        std::fs::remove_file(&path).unwrap();
    }
}

/// A registered map needs a copy engine: on the CPU backend the map is copied by the CPU, and
/// the loader says so. The registered path's own reader only checks the file's length: a cut
/// inside a later range is named, ranges before it pass.
#[test]
fn registered_maps_fall_back_on_the_cpu_and_their_length_check_names_a_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_file(dir.path(), 10 * 4096);
    let loader = Loader::open(&path, Config { read: ReadMode::Registered, ..Config::bytes(4096, 4) }, &Backend::Cpu).unwrap();
    let rp = loader.read_path();
    assert_eq!(rp.mode, "mmap");
    assert!(rp.fallback.as_deref().is_some_and(|w| w.contains("no copy engine on the CPU backend")), "{rp:?}");
    assert_eq!(loader.register_ms(), None);
    let src = Source::open(&path, ReadMode::Registered, 4096, 1, 1).unwrap();
    src.check_len([(0, 4096), (9 * 4096, 4096)]).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(5 * 4096 + 10).unwrap();
    src.check_len([(0, 4096), (4 * 4096, 4096)]).unwrap();
    let err = src.check_len([(0, 4096), (5 * 4096, 4096), (9 * 4096, 4096)]).unwrap_err().to_string();
    assert!(err.contains("short read") && err.contains("ends at offset 20490 inside the 4096-byte read at offset 20480"), "{err}");
}

#[test]
fn a_missing_or_unreadable_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.bin");
    let err = Loader::open(&missing, Config::bytes(64, 4), &Backend::Cpu).err().unwrap().to_string();
    assert!(err.contains("absent.bin") && err.contains("cannot open"), "{err}");
    let err = Loader::open(dir.path(), Config::bytes(64, 4), &Backend::Cpu).err().unwrap().to_string();
    assert!(err.contains("not a regular file"), "{err}");
    let err = Loader::open(&missing, Config { prefetch: 0, ..Config::bytes(64, 4) }, &Backend::Cpu).err().unwrap().to_string();
    assert!(err.contains("prefetch must be at least 1"), "{err}");
}

/// The check earns its keep: a corrupted byte, a repeated sample and a missing one each fail.
#[test]
fn the_tally_catches_a_wrong_a_repeated_and_a_missing_sample() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_file(dir.path(), 12 * 256);
    let file = std::fs::read(&path).unwrap();
    let sample = |i: usize| &file[i * 256..(i + 1) * 256];
    let clean = |skip: usize| -> Tally {
        let mut t = Tally::of_file(&path, &Config::bytes(256, 1)).unwrap();
        for i in (0..12).filter(|&i| i != skip) {
            t.add(&[i as u64], sample(i)).unwrap();
        }
        t
    };
    clean(usize::MAX).check().unwrap();
    // A flipped byte in sample 7.
    let mut t = clean(7);
    let mut bad = sample(7).to_vec();
    bad[100] ^= 1;
    t.add(&[7], &bad).unwrap();
    let err = t.check().unwrap_err().to_string();
    assert!(err.contains("sample 7 (offset 1792)") && err.contains("differ from the file"), "{err}");
    assert_eq!((t.stats().mismatches, t.stats().worst_index), (1, Some(7)));
    // Sample 3 delivered in place of sample 4: 3 twice, 4 never.
    let mut t = clean(4);
    t.add(&[3], sample(3)).unwrap();
    assert!(t.check().unwrap_err().to_string().contains("sample 3 (offset 768) was delivered 2 times"));
    assert_eq!(t.stats().mismatches, 2);
    // Sample 11 never delivered.
    let err = clean(11).check().unwrap_err().to_string();
    assert!(err.contains("sample 11 (offset 2816) was never delivered"), "{err}");
    // And through the loader: an epoch over an order that repeats a sample fails the tally.
    let mut loader = Loader::open(&path, Config::bytes(256, 5), &Backend::Cpu).unwrap();
    let mut order = epoch_order(12, Some(3), 0);
    order[5] = order[6];
    let mut t = Tally::of_file(&path, loader.config()).unwrap();
    let mut e = loader.epoch_in(order).unwrap();
    while let Some(b) = e.next_batch().unwrap() {
        let BatchData::Host(data) = b.data else { unreachable!() };
        t.add(b.samples, data).unwrap();
    }
    assert!(t.check().unwrap_err().to_string().contains("delivered 2 times"));
    drop(e);
    assert!(loader.epoch_in(vec![12]).err().unwrap().to_string().contains("sample 12 is past the last of 12 samples"));
}

#[test]
fn neighbouring_samples_merge_into_one_read_up_to_a_cap() {
    let plain = |size| Config::bytes(size, 1).layout();
    assert_eq!(plan_reads(&[4, 5, 6, 9, 10, 2], plain(100)), [(400, 0, 300), (900, 300, 200), (200, 500, 100)]);
    let big = MAX_MERGED_READ / 2;
    assert_eq!(plan_reads(&[0, 1, 2], plain(big)).len(), 2, "merged reads stop at {MAX_MERGED_READ} B");
    // Overlapping windows after a header never merge: each is read whole.
    let windows = Config { offset: 8, stride: Some(60), ..Config::bytes(64, 1) }.layout();
    assert_eq!(plan_reads(&[0, 1, 3], windows), [(8, 0, 64), (68, 64, 64), (188, 128, 64)]);
}

/// Samples after a header and overlapping windows: what a token file of windows sharing their
/// last token with the next one's first needs. Every window arrives with the file's bytes, the
/// bytes after the last whole window are counted as dropped, and O_DIRECT (which reads whole
/// blocks from block starts) gives way to buffered reads and says why.
#[test]
fn windows_after_a_header_may_overlap() {
    let dir = tempfile::tempdir().unwrap();
    // A 100-byte header, then windows of 16 B every 12 B: 1000 bytes hold 74 windows, the last
    // ending at 100 + 73 * 12 + 16 = 992, so 8 bytes are dropped.
    let path = data_file(dir.path(), 1000);
    let file = std::fs::read(&path).unwrap();
    for read in [ReadMode::Direct, ReadMode::Buffered, ReadMode::Mmap] {
        let cfg = Config { offset: 100, stride: Some(12), read, shuffle: Some(4), ..Config::bytes(16, 5) };
        let mut loader = Loader::open(&path, cfg, &Backend::Cpu).unwrap();
        assert_eq!((loader.samples(), loader.dropped_tail_bytes(), loader.batches()), (74, 8, 15));
        if read == ReadMode::Direct {
            let rp = loader.read_path();
            assert_eq!(rp.mode, "buffered");
            assert!(rp.fallback.as_deref().unwrap().contains("multiples of 4096 B, not 16 B"), "{rp:?}");
        }
        let mut tally = Tally::of_file(&path, loader.config()).unwrap();
        for (samples, data) in epoch_bytes(&mut loader, 0) {
            tally.add(&samples, &data).unwrap();
            for (k, &i) in samples.iter().enumerate() {
                let at = 100 + 12 * i as usize;
                assert_eq!(&data[k * 16..(k + 1) * 16], &file[at..at + 16], "{read:?}: window {i}");
            }
        }
        tally.check().unwrap();
    }
    // Blocks of 4 KiB after a 100-byte header: the size would do for O_DIRECT, the start not.
    let big = data_file(dir.path(), 100 + 3 * 4096);
    let loader = Loader::open(&big, Config { offset: 100, ..Config::bytes(4096, 2) }, &Backend::Cpu).unwrap();
    assert_eq!((loader.samples(), loader.dropped_tail_bytes()), (3, 0));
    let rp = loader.read_path();
    assert!(rp.mode == "buffered" && rp.fallback.as_deref().unwrap().contains("not at offset 100 with a stride of 4096 B"), "{rp:?}");
    // Too short for one window after the header: named, with the header.
    let err = Loader::open(&path, Config { offset: 990, ..Config::bytes(16, 5) }, &Backend::Cpu).err().unwrap().to_string();
    assert!(err.contains("not one sample of 16 bytes (after 990 header bytes)"), "{err}");
    let err = Loader::open(&path, Config { stride: Some(0), ..Config::bytes(16, 5) }, &Backend::Cpu).err().unwrap().to_string();
    assert!(err.contains("stride must be at least 1 byte"), "{err}");
}

#[test]
fn a_read_pass_and_the_cold_state_report_what_they_did() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_file(dir.path(), 64 * 4096);
    let (bytes, rp) = read::read_through(&path, ReadMode::Direct, 16 * 4096, 2, u64::MAX).unwrap();
    assert_eq!(bytes, 64 * 4096);
    assert!(rp.mode == "direct" || rp.fallback.is_some(), "{rp:?}");
    let left = read::evict(&path).unwrap();
    assert!((0.0..=1.0).contains(&left), "{left}");
    std::fs::read(&path).unwrap();
    assert!(read::resident(&path).unwrap() > 0.0, "a file just read is in the page cache");
}

/// Every batch of an epoch, as (samples, bytes).
fn epoch_bytes(loader: &mut Loader, epoch: u64) -> Vec<(Vec<u64>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut e = loader.epoch(epoch).unwrap();
    while let Some(b) = e.next_batch().unwrap() {
        let BatchData::Host(data) = b.data else { unreachable!() };
        out.push((b.samples.to_vec(), data.to_vec()));
    }
    out
}

/// The mapped path (streamed copies) hands out what pread does, batch for batch, with samples
/// that are no multiple of the copy's 32-byte alignment or 128-byte blocks, a trailing partial
/// sample, and one thread or several.
#[test]
fn mapped_reads_deliver_the_bytes_and_order_of_pread() {
    let dir = tempfile::tempdir().unwrap();
    let (sample, samples) = (4100, 37);
    let path = data_file(dir.path(), sample * samples + 77);
    let file = std::fs::read(&path).unwrap();
    for threads in [1, 3] {
        let open = |read| Loader::open(&path, Config { read, threads, shuffle: Some(5), ..Config::bytes(sample, 6) }, &Backend::Cpu).unwrap();
        let (mut pread, mut mapped) = (open(ReadMode::Buffered), open(ReadMode::Mmap));
        assert_eq!((pread.read_path().mode, mapped.read_path().mode), ("buffered", "mmap"));
        assert_eq!((mapped.samples(), mapped.dropped_tail_bytes()), (37, 77));
        for epoch in 0..2 {
            let (a, b) = (epoch_bytes(&mut pread, epoch), epoch_bytes(&mut mapped, epoch));
            assert_eq!(a.len(), 7);
            for (k, ((sa, da), (sb, db))) in a.iter().zip(&b).enumerate() {
                assert_eq!(sa, sb, "threads {threads} epoch {epoch} batch {k}: sample order");
                assert!(da == db, "threads {threads} epoch {epoch} batch {k}: bytes differ");
                for (j, &i) in sb.iter().enumerate() {
                    assert!(db[j * sample..(j + 1) * sample] == file[i as usize * sample..(i as usize + 1) * sample], "sample {i}");
                }
            }
        }
    }
}

/// The streamed copy equals a plain one at every misalignment of either side and every length
/// around its block size, and leaves the bytes around the destination alone.
#[test]
fn the_streamed_copy_matches_a_plain_copy_at_any_alignment_and_length() {
    let mut src = vec![0u8; 1200];
    rand::rngs::StdRng::seed_from_u64(9).fill_bytes(&mut src);
    for len in [0, 1, 31, 32, 127, 128, 129, 255, 300, 1000] {
        for (s_off, d_off) in [(0, 0), (1, 0), (0, 1), (7, 33), (31, 5), (64, 96)] {
            let mut dst = vec![0xAAu8; len + 200];
            read::stream_copy(&mut dst[d_off..d_off + len], &src[s_off..s_off + len]);
            assert!(dst[d_off..d_off + len] == src[s_off..s_off + len], "len {len}, offsets {s_off}/{d_off}");
            assert!(dst[..d_off].iter().chain(&dst[d_off + len..]).all(|&b| b == 0xAA), "len {len}, offsets {s_off}/{d_off}: wrote outside");
        }
    }
}
