//! The GGUF reader on hand-built files: every value type, alignment, zero-copy data, and bad
//! files (truncated, bad magic, unknown types, out-of-range offsets, random corruption), which
//! must come back as errors naming the problem, never as a panic.

use lab::weights::gguf::{GgmlType, Gguf, GgufError, GgufFile, Value};
use proptest::prelude::*;

/// A small GGUF writer: metadata as (key, type id, encoded value), tensors as
/// (name, dims, ggml type, data).
struct Writer {
    version: u32,
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    alignment: u64,
}

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend(x.as_bytes());
    v
}

impl Writer {
    fn new() -> Self {
        Writer { version: 3, kv: vec![], tensors: vec![], alignment: 32 }
    }
    fn kv(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
        self.kv.push((key.into(), ty, value));
        self
    }
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }
    /// (file bytes, offset of each tensor's data in the file).
    fn build(&self) -> (Vec<u8>, Vec<usize>) {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            b.extend(s(k));
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        let a = self.alignment as usize;
        let mut offset = 0usize;
        let mut offsets = vec![];
        for (name, dims, ty, data) in &self.tensors {
            b.extend(s(name));
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(ty.to_le_bytes());
            b.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).div_ceil(a) * a;
        }
        b.resize(b.len().div_ceil(a) * a, 0);
        let start = b.len();
        for (i, (_, _, _, data)) in self.tensors.iter().enumerate() {
            b.resize(start + offsets[i], 0);
            b.extend(data);
        }
        (b, offsets.iter().map(|o| o + start).collect())
    }
}

fn array(ety: u32, items: &[Vec<u8>]) -> Vec<u8> {
    let mut v = ety.to_le_bytes().to_vec();
    v.extend((items.len() as u64).to_le_bytes());
    items.iter().for_each(|i| v.extend(i));
    v
}

/// A file with every metadata type, an F32, an F16 and a Q4_1 tensor.
fn sample() -> Writer {
    let q4_1: Vec<u8> = (0..40u8).collect();
    Writer::new()
        .kv("general.architecture", 8, s("llama"))
        .kv("u8", 0, vec![200])
        .kv("i8", 1, vec![0xfe])
        .kv("u16", 2, 60000u16.to_le_bytes().to_vec())
        .kv("i16", 3, (-300i16).to_le_bytes().to_vec())
        .kv("u32", 4, 7u32.to_le_bytes().to_vec())
        .kv("i32", 5, (-7i32).to_le_bytes().to_vec())
        .kv("f32", 6, 1.5f32.to_le_bytes().to_vec())
        .kv("bool", 7, vec![1])
        .kv("u64", 10, u64::MAX.to_le_bytes().to_vec())
        .kv("i64", 11, i64::MIN.to_le_bytes().to_vec())
        .kv("f64", 12, 2.25f64.to_le_bytes().to_vec())
        .kv("tokens", 9, array(8, &[s("a"), s("héllo"), s("")]))
        .kv("nested", 9, array(9, &[array(4, &[1u32.to_le_bytes().to_vec(), 2u32.to_le_bytes().to_vec()]), array(4, &[])]))
        .tensor("norm", &[3], 0, [1.0f32, -2.0, 0.5].iter().flat_map(|x| x.to_le_bytes()).collect())
        .tensor("half", &[2, 2], 1, [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect())
        .tensor("w", &[32, 2], 3, q4_1)
}

#[test]
fn a_hand_built_file_reads_back_whole() {
    let (bytes, offsets) = sample().build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!((g.version, g.alignment, g.metadata.len(), g.tensors.len()), (3, 32, 14, 3));
    assert_eq!(g.get("general.architecture").unwrap().as_str(), Some("llama"));
    assert_eq!(g.get("u8"), Some(&Value::U8(200)));
    assert_eq!(g.get("i8"), Some(&Value::I8(-2)));
    assert_eq!(g.get("u16"), Some(&Value::U16(60000)));
    assert_eq!(g.get("i16"), Some(&Value::I16(-300)));
    assert_eq!(g.get("i32"), Some(&Value::I32(-7)));
    assert_eq!(g.get("f32"), Some(&Value::F32(1.5)));
    assert_eq!(g.get("bool"), Some(&Value::Bool(true)));
    assert_eq!(g.get("u64").unwrap().as_u64(), Some(u64::MAX));
    assert_eq!(g.get("i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(g.get("f64"), Some(&Value::F64(2.25)));
    let tokens: Vec<&str> = g.get("tokens").unwrap().as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(tokens, ["a", "héllo", ""]);
    assert_eq!(g.get("nested").unwrap().as_array().unwrap()[0], Value::Array(vec![Value::U32(1), Value::U32(2)]));
    let w = g.tensor("w").unwrap();
    assert_eq!((w.dims.as_slice(), w.ty, w.size, w.elements()), (&[32u64, 2][..], GgmlType::Q4_1, 40, 64));
    // Zero-copy: the slice points into the file's own bytes.
    let data = g.data(w);
    assert_eq!(data.as_ptr(), bytes[offsets[2]..].as_ptr());
    assert_eq!(data, (0..40u8).collect::<Vec<_>>().as_slice());
    let norm = g.data(g.tensor("norm").unwrap());
    assert_eq!(f32::from_le_bytes(norm[4..8].try_into().unwrap()), -2.0);
    assert_eq!(g.data_offset % 32, 0);
}

#[test]
fn a_mapped_file_and_a_custom_alignment() {
    let mut w = sample().kv("general.alignment", 4, 64u32.to_le_bytes().to_vec());
    w.alignment = 64;
    w.version = 2;
    let (bytes, offsets) = w.build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let g = f.parse().unwrap();
    assert_eq!((g.version, g.alignment, g.data_offset % 64), (2, 64, 0));
    assert_eq!(g.data(g.tensor("w").unwrap()).as_ptr(), f.bytes()[offsets[2]..].as_ptr());
    let e = GgufFile::open(dir.path().join("missing.gguf")).err().unwrap().to_string();
    assert!(e.contains("missing.gguf"), "{e}");
}

fn err(bytes: &[u8]) -> GgufError {
    Gguf::parse(bytes).expect_err("a damaged file must not parse")
}

#[test]
fn damaged_files_are_named_errors() {
    let (good, _) = sample().build();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(err(&b), GgufError::BadMagic(_)));
    let mut b = good.clone();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(err(&b), GgufError::UnsupportedVersion(1));
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err(&b).to_string().contains("big-endian"));
    // Every truncation is an error, whatever the cut.
    for cut in 0..good.len() {
        let e = err(&good[..cut]);
        assert!(matches!(e, GgufError::Truncated { .. } | GgufError::BadMagic(_) | GgufError::TensorOutOfRange { .. }), "cut {cut}: {e}");
    }
    // A count or length far past the end.
    let mut b = good.clone();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&b).to_string().contains("metadata entries"), "{}", err(&b));
    let key_len_at = 24;
    b = good.clone();
    b[key_len_at..key_len_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(err(&b).to_string().contains("metadata key 0"), "{}", err(&b));
    let e = err(&Writer::new().kv("big", 9, { let mut v = 0u32.to_le_bytes().to_vec(); v.extend(u64::MAX.to_le_bytes()); v }).build().0);
    assert!(e.to_string().contains("elements of `big`"), "{e}");
    // Unknown types.
    assert_eq!(err(&Writer::new().kv("k", 13, vec![0; 8]).build().0), GgufError::UnknownValueType { key: "k".into(), ty: 13 });
    assert!(matches!(err(&Writer::new().tensor("t", &[4], 4, vec![0; 32]).build().0), GgufError::UnknownTensorType { ty: 4, .. }));
    // Arrays nested past the limit.
    let mut deep = array(4, &[]);
    for _ in 0..10 {
        deep = array(9, &[deep]);
    }
    assert!(matches!(err(&Writer::new().kv("deep", 9, deep).build().0), GgufError::TooDeep { .. }));
    // Bad strings, alignment, duplicates, shapes.
    assert!(matches!(err(&Writer::new().kv("s", 8, { let mut v = 2u64.to_le_bytes().to_vec(); v.extend([0xff, 0xfe]); v }).build().0), GgufError::BadUtf8 { .. }));
    assert!(matches!(err(&Writer::new().kv("general.alignment", 4, 48u32.to_le_bytes().to_vec()).build().0), GgufError::BadAlignment(_)));
    assert!(matches!(err(&Writer::new().kv("general.alignment", 10, 64u64.to_le_bytes().to_vec()).build().0), GgufError::BadAlignment(_)));
    assert!(matches!(err(&Writer::new().kv("a", 0, vec![1]).kv("a", 0, vec![2]).build().0), GgufError::Duplicate { .. }));
    assert!(matches!(err(&Writer::new().tensor("t", &[4], 0, vec![0; 16]).tensor("t", &[4], 0, vec![0; 16]).build().0), GgufError::Duplicate { .. }));
    assert!(err(&Writer::new().tensor("q", &[33], 3, vec![0; 40]).build().0).to_string().contains("not a multiple of the Q4_1 block size 32"));
    assert!(err(&Writer::new().tensor("r", &[1, 1, 1, 1, 1], 0, vec![0; 4]).build().0).to_string().contains("rank 5"));
    assert!(err(&Writer::new().tensor("o", &[u64::MAX, 4], 0, vec![0; 4]).build().0).to_string().contains("overflow"));
}

/// Offsets of the tensor infos' offset fields in `sample()`'s file.
fn offset_field(bytes: &[u8], g: &Gguf, name: &str) -> usize {
    let t = g.tensor(name).unwrap();
    let mut pat = s(name);
    pat.extend((t.dims.len() as u32).to_le_bytes());
    let at = bytes.windows(pat.len()).position(|w| w == pat.as_slice()).unwrap();
    at + pat.len() + 8 * t.dims.len() + 4
}

#[test]
fn tensor_offsets_out_of_range_or_misaligned_are_refused() {
    let (good, _) = sample().build();
    let g = Gguf::parse(&good).unwrap();
    let at = offset_field(&good, &g, "w");
    for (offset, expect) in [(1u64 << 20, "outside the file"), (u64::MAX - 31, "outside the file"), (8, "not a multiple of the alignment")] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&offset.to_le_bytes());
        let e = err(&b).to_string();
        assert!(e.contains(expect), "{offset}: {e}");
        assert!(e.contains("`w`"), "{e}");
    }
    // A dimension that makes the tensor run past the end.
    let mut b = good.clone();
    let dims_at = at - 4 - 16;
    b[dims_at..dims_at + 8].copy_from_slice(&(32u64 * 1000).to_le_bytes());
    assert!(matches!(err(&b), GgufError::TensorOutOfRange { .. }));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any byte flipped, cut, or spliced: Ok or Err, never a panic, and an Ok file's data slices
    /// lie inside it.
    #[test]
    fn random_corruption_never_panics(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), cut in any::<prop::sample::Index>(), do_cut in any::<bool>()) {
        let (mut b, _) = sample().build();
        for (i, v) in edits {
            let i = i.index(b.len());
            b[i] = v;
        }
        if do_cut {
            b.truncate(cut.index(b.len() + 1));
        }
        if let Ok(g) = Gguf::parse(&b) {
            for t in &g.tensors {
                let d = g.data(t);
                prop_assert_eq!(d.len() as u64, t.size);
            }
        }
    }

    /// Random bytes after a valid header.
    #[test]
    fn random_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..512), n_t in 0u64..4, n_kv in 0u64..4) {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_t.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b.extend(body);
        let _ = Gguf::parse(&b);
    }
}
