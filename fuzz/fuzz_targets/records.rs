//! The bytes of one run file, plain or gzip-compressed: the record reader returns the records
//! that read and the damaged lines, each naming the file and its line, and never panics. Lines
//! the lab's own writer finished still read back, whatever is appended after them.
#![no_main]

use lab::record::{parse_run_file, RunWriter};
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

/// A file written by `RunWriter` (records of a committed fixture), the file gzip-compressed, and
/// each record as JSON.
fn written() -> &'static (Vec<u8>, Vec<u8>, Vec<String>) {
    static WRITTEN: OnceLock<(Vec<u8>, Vec<u8>, Vec<String>)> = OnceLock::new();
    WRITTEN.get_or_init(|| {
        let fixture = include_bytes!("../../lab/tests/fixtures/report/records/2026-11-22T16-00-00Z-h100-6f6f6f6.jsonl");
        let (records, damage) = parse_run_file(Path::new("fixture.jsonl"), fixture);
        assert!(damage.is_empty() && records.len() >= 3, "{damage:?}");
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunWriter::create(dir.path(), "fuzz").unwrap();
        for r in &records[..3] {
            w.append(r).unwrap();
        }
        let bytes = std::fs::read(&w.path).unwrap();
        (gzip(&bytes), bytes, records[..3].iter().map(|r| serde_json::to_string(r).unwrap()).collect())
    })
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

// The first byte picks the case: the rest as a plain file or as gzip data; or appended to the
// writer's lines, plain, or after their gzip stream.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&case, rest)) = data.split_first() else { return };
    let (gzipped, lines, expected) = written();
    let file = Path::new(if case & 1 == 1 { "run.jsonl.gz" } else { "run.jsonl" });
    let bytes = match case % 4 {
        0 | 1 => rest.to_vec(),
        2 => [lines.as_slice(), rest].concat(),
        _ => [gzipped.as_slice(), rest].concat(),
    };
    let (records, damage) = parse_run_file(file, &bytes);

    let mut last = 0;
    for d in &damage {
        assert!(d.file == file && d.line > last && !d.why.is_empty(), "{damage:?}");
        assert!(d.to_string().starts_with(&format!("{}:{}: ", file.display(), d.line)), "{d}");
        last = d.line;
    }
    if case % 4 == 0 {
        let pieces = bytes.split_inclusive(|&b| b == b'\n').count();
        assert!(last <= pieces && records.len() + damage.len() <= pieces, "{pieces} lines, {} records, {damage:?}", records.len());
    }
    if case % 4 >= 2 {
        assert!(records.len() >= expected.len(), "the written lines did not all read back: {damage:?}");
        for (r, e) in records.iter().zip(expected) {
            assert_eq!(&serde_json::to_string(r).unwrap(), e);
        }
    }
});
