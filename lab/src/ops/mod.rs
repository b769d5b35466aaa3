//! One module per kernel family: CPU reference, variants, launchers, the experiment, tests.

pub mod ceilings;
pub mod compare;
pub mod softmax;
pub mod vector_add;

use crate::kernels::DType;
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

/// A storage type kernels are instantiated for; arithmetic is f32, references f64.
pub trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + Unpin + 'static {
    const DTYPE: DType;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    /// Raw little-endian bytes, as peers read them.
    fn bytes(v: &[Self]) -> Vec<u8>;
    fn from_bytes(b: &[u8]) -> Vec<Self>;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn bytes(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Vec<Self> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}

impl Elem for half::bf16 {
    const DTYPE: DType = DType::Bf16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn bytes(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Vec<Self> {
        b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]])).collect()
    }
}

impl Elem for half::f16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn bytes(v: &[Self]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Vec<Self> {
        b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])).collect()
    }
}

/// Widens to f64 for comparison (in parallel: references run over hundreds of MB).
pub fn widen<T: Elem>(v: &[T]) -> Vec<f64> {
    use rayon::prelude::*;
    v.par_iter().map(|x| x.to_f64()).collect()
}
