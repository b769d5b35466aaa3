//! A zero-copy GGUF reader over `memmap2`.
//!
//! Format (ggml's `docs/gguf.md`, versions 2 and 3, little-endian): magic `GGUF`, u32 version,
//! u64 tensor count, u64 metadata count; metadata as (string key, u32 value type, value);
//! tensor infos as (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset);
//! padding to `general.alignment` (default 32); then the data section, each tensor at its
//! offset from the section's start. A string is a u64 length and that many UTF-8 bytes.
//!
//! Parsing copies only the metadata; tensor data stays in the map and is handed out as slices.
//! Every length, count and offset is checked against the bytes that remain before it is used,
//! so a truncated or corrupted file is an [`GgufError`] naming the problem, never a panic or an
//! out-of-bounds read, and a huge count cannot make it allocate more than the file could hold.
//! The module depends on nothing else in the crate, so the fuzz target (fuzz/) builds it alone.

use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: u32 = 4;
/// Arrays nested deeper than this are refused (recursion stays bounded on crafted input).
pub const MAX_DEPTH: usize = 8;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GgufError {
    #[error("{path}: {why}")]
    Io { path: PathBuf, why: String },
    #[error("not a GGUF file: magic is {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("GGUF version {0} is not supported (2 and 3 are; a big-endian file reads as a huge version)")]
    UnsupportedVersion(u32),
    #[error("truncated: {what} needs {need} bytes at offset {offset}, the file has {len}")]
    Truncated { what: String, offset: u64, need: u64, len: u64 },
    #[error("metadata `{key}` has unknown value type {ty}")]
    UnknownValueType { key: String, ty: u32 },
    #[error("metadata `{key}`: arrays nested deeper than {MAX_DEPTH}")]
    TooDeep { key: String },
    #[error("{what} at offset {offset} is not valid UTF-8")]
    BadUtf8 { what: String, offset: u64 },
    #[error("duplicate {what} `{name}`")]
    Duplicate { what: &'static str, name: String },
    #[error("general.alignment must be a power of two as a u32, got {0}")]
    BadAlignment(String),
    #[error("tensor `{tensor}`: {why}")]
    BadTensor { tensor: String, why: String },
    #[error("tensor `{tensor}` has unknown ggml type {ty}")]
    UnknownTensorType { tensor: String, ty: u32 },
    #[error("tensor `{tensor}`: data [{start}, {end}) lies outside the file ({len} bytes)")]
    TensorOutOfRange { tensor: String, start: u64, end: u64, len: u64 },
    #[error("tensor `{tensor}`: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned { tensor: String, offset: u64, alignment: u64 },
}

pub type Result<T> = std::result::Result<T, GgufError>;

/// ggml tensor types: (id, name, weights per block, bytes per block), from ggml.h's `ggml_type`
/// and ggml-common.h's block structs. Ids 4, 5 and 31..33, 36..38 were removed upstream.
pub const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

/// A ggml tensor type this reader knows the block size of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q3_K: GgmlType = GgmlType(11);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const IQ4_NL: GgmlType = GgmlType(20);
    pub const IQ4_XS: GgmlType = GgmlType(23);
    pub const BF16: GgmlType = GgmlType(30);

    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        GGML_TYPES.iter().find(|t| t.0 == self.0)
    }
    pub fn known(self) -> bool {
        self.entry().is_some()
    }
    pub fn name(self) -> &'static str {
        self.entry().map_or("unknown", |t| t.1)
    }
    /// (weights per block, bytes per block).
    pub fn block(self) -> Option<(u64, u64)> {
        self.entry().map(|t| (t.2, t.3))
    }
}

/// A metadata value. Strings and arrays are copied out of the map (they are small next to the
/// tensors).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (input) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// From the start of the data section.
    pub offset: u64,
    /// Bytes of data, from the type's block size.
    pub size: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file borrowing its bytes: metadata and tensor infos, and zero-copy data slices.
#[derive(Debug)]
pub struct Gguf<'a> {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where the data section starts in the file.
    pub data_offset: u64,
    bytes: &'a [u8],
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let left = (self.b.len() - self.pos) as u64;
        if n > left {
            return Err(GgufError::Truncated { what: what(), offset: self.pos as u64, need: n, len: self.b.len() as u64 });
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let at = self.pos as u64;
        let s = self.take(len, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::BadUtf8 { what: what(), offset: at })
    }
    fn left(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }
}

/// The smallest encoding of one value of a type (arrays: their 12-byte header).
fn min_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

fn value(r: &mut Reader, ty: u32, key: &str, depth: usize) -> Result<Value> {
    let what = || format!("the value of `{key}`");
    Ok(match ty {
        0 => Value::U8(r.array::<1>(&what)?[0]),
        1 => Value::I8(r.array::<1>(&what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(r.array(&what)?)),
        3 => Value::I16(i16::from_le_bytes(r.array(&what)?)),
        4 => Value::U32(u32::from_le_bytes(r.array(&what)?)),
        5 => Value::I32(i32::from_le_bytes(r.array(&what)?)),
        6 => Value::F32(f32::from_le_bytes(r.array(&what)?)),
        7 => Value::Bool(r.array::<1>(&what)?[0] != 0),
        8 => Value::String(r.string(&what)?),
        9 => {
            if depth >= MAX_DEPTH {
                return Err(GgufError::TooDeep { key: key.to_string() });
            }
            let ety = r.u32(&|| format!("the element type of `{key}`"))?;
            let min = min_size(ety).ok_or_else(|| GgufError::UnknownValueType { key: key.to_string(), ty: ety })?;
            let count = r.u64(&|| format!("the length of `{key}`"))?;
            // Every element takes at least `min` bytes: a count the file cannot hold is refused
            // before anything is allocated.
            if count.saturating_mul(min) > r.left() {
                return Err(GgufError::Truncated { what: format!("{count} elements of `{key}`"), offset: r.pos as u64, need: count.saturating_mul(min), len: r.b.len() as u64 });
            }
            // Capacity grows with what is parsed: a `Value` is larger than its smallest encoding.
            let mut v = Vec::with_capacity(count.min(1 << 16) as usize);
            for _ in 0..count {
                v.push(value(r, ety, key, depth + 1)?);
            }
            Value::Array(v)
        }
        10 => Value::U64(u64::from_le_bytes(r.array(&what)?)),
        11 => Value::I64(i64::from_le_bytes(r.array(&what)?)),
        12 => Value::F64(f64::from_le_bytes(r.array(&what)?)),
        _ => return Err(GgufError::UnknownValueType { key: key.to_string(), ty }),
    })
}

impl<'a> Gguf<'a> {
    /// Parses a whole GGUF file held in memory (or mapped).
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let mut r = Reader { b: bytes, pos: 0 };
        let magic = r.array::<4>(&|| "the magic".into())?;
        if &magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = r.u32(&|| "the version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64(&|| "the tensor count".into())?;
        let n_kv = r.u64(&|| "the metadata count".into())?;
        // A key-value pair takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 4 + 8.
        for (n, min, what) in [(n_kv, 13u64, "metadata entries"), (n_tensors, 24, "tensor infos")] {
            if n.saturating_mul(min) > r.left() {
                return Err(GgufError::Truncated { what: format!("{n} {what}"), offset: r.pos as u64, need: n.saturating_mul(min), len: bytes.len() as u64 });
            }
        }
        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
        let mut keys = std::collections::HashSet::new();
        for i in 0..n_kv {
            let key = r.string(&|| format!("metadata key {i}"))?;
            let ty = r.u32(&|| format!("the type of `{key}`"))?;
            let v = value(&mut r, ty, &key, 0)?;
            if !keys.insert(key.clone()) {
                return Err(GgufError::Duplicate { what: "metadata key", name: key });
            }
            metadata.push((key, v));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => *a as u64,
            Some((_, v)) => return Err(GgufError::BadAlignment(format!("{v:?}"))),
        };
        let mut infos = Vec::with_capacity(n_tensors as usize);
        let mut names = std::collections::HashSet::new();
        for i in 0..n_tensors {
            let name = r.string(&|| format!("tensor name {i}"))?;
            let n_dims = r.u32(&|| format!("the rank of `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadTensor { tensor: name, why: format!("rank {n_dims}, expected 1..={MAX_DIMS}") });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(r.u64(&|| format!("dimension {d} of `{name}`"))?);
            }
            let ty = GgmlType(r.u32(&|| format!("the type of `{name}`"))?);
            let offset = r.u64(&|| format!("the offset of `{name}`"))?;
            if !names.insert(name.clone()) {
                return Err(GgufError::Duplicate { what: "tensor", name });
            }
            infos.push((name, dims, ty, offset));
        }
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let len = bytes.len() as u64;
        if data_offset > len && n_tensors > 0 {
            return Err(GgufError::Truncated { what: "the padding before the data section".into(), offset: r.pos as u64, need: data_offset - r.pos as u64, len });
        }
        let mut tensors = Vec::with_capacity(infos.len());
        for (name, dims, ty, offset) in infos {
            let (block, block_bytes) = ty.block().ok_or_else(|| GgufError::UnknownTensorType { tensor: name.clone(), ty: ty.0 })?;
            let bad = |why: String| GgufError::BadTensor { tensor: name.clone(), why };
            let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
            if dims[0] % block != 0 {
                return Err(bad(format!("first dimension {} is not a multiple of the {} block size {block}", dims[0], ty.name())));
            }
            let size = (elements / block).checked_mul(block_bytes).ok_or_else(|| bad(format!("{elements} elements overflow")))?;
            if offset % alignment != 0 {
                return Err(GgufError::Misaligned { tensor: name, offset, alignment });
            }
            let start = data_offset.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(size));
            match (start, end) {
                (Some(_), Some(end)) if end <= len => tensors.push(TensorInfo { name, dims, ty, offset, size }),
                _ => return Err(GgufError::TensorOutOfRange { tensor: name, start: data_offset.saturating_add(offset), end: data_offset.saturating_add(offset).saturating_add(size), len }),
            }
        }
        Ok(Gguf { version, metadata, tensors, alignment, data_offset, bytes })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's bytes, straight from the file (bounds were checked by [`Gguf::parse`]).
    pub fn data(&self, t: &TensorInfo) -> &'a [u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.bytes[start..start + t.size as usize]
    }
}

/// A memory-mapped GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    map: memmap2::Mmap,
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |e: std::io::Error| GgufError::Io { path: path.clone(), why: e.to_string() };
        let file = std::fs::File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only; a file truncated underneath us by another process could
        // still fault, which no reader of a mapped file can rule out. Model files are not edited
        // in place.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(GgufFile { path, map })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn parse(&self) -> Result<Gguf<'_>> {
        Gguf::parse(&self.map)
    }
}
