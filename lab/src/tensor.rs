//! A contiguous buffer with a shape, on the GPU or on the host behind one API: what every op in
//! [`crate::ops`] takes. Not a general tensor library: row-major, no strides, no broadcasting;
//! what the kernels and a Llama model need.
//!
//! ```
//! use lab::prelude::*;
//! let cpu = Backend::Cpu;
//! let x = Tensor::from_vec(&[2, 3], vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! let y = x.to(&cpu).unwrap();                      // a copy (on a GPU backend: an upload)
//! assert_eq!((y.rows(), y.cols()), (2, 3));
//! assert_eq!(y.row(1).unwrap(), vec![4.0, 5.0, 6.0]);
//! let z = Tensor::<half::bf16>::zeros(&cpu, &[4, 8]).unwrap();
//! assert_eq!(z.to_vec().unwrap().len(), 32);
//! ```

use crate::error::Doing;
use crate::experiment::Backend;
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

/// A type a tensor can hold: the kernels' storage types, and bytes for packed 4- and 8-bit blocks.
pub trait Scalar: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + Unpin + std::fmt::Debug + 'static {
    const NAME: &'static str;
}

macro_rules! scalars {
    ($($t:ty => $n:literal),*) => { $(impl Scalar for $t { const NAME: &'static str = $n; })* };
}
scalars!(f32 => "f32", half::bf16 => "bf16", half::f16 => "f16", u8 => "u8", u32 => "u32", i32 => "i32");

/// Where the elements live.
pub enum Buffer<T: Scalar> {
    Host(Vec<T>),
    Cuda(CudaSlice<T>),
}

/// Row-major elements with a shape. `rows()` is the product of all dimensions but the last,
/// `cols()` the last: what the row-wise ops (softmax, norms) work on.
pub struct Tensor<T: Scalar> {
    shape: Vec<usize>,
    buf: Buffer<T>,
}

fn count(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn shape_error(what: &str, shape: &[usize], len: usize) -> LabError {
    LabError::shape("tensor", format!("{what}: shape {shape:?} holds {} elements, the data {len}", count(shape)))
}

impl<T: Scalar> Tensor<T> {
    /// A host tensor over `data`; its length must be the shape's product.
    pub fn from_vec(shape: &[usize], data: Vec<T>) -> Result<Self> {
        if count(shape) != data.len() {
            return Err(shape_error("from_vec", shape, data.len()));
        }
        Ok(Tensor { shape: shape.to_vec(), buf: Buffer::Host(data) })
    }

    /// A tensor on `dev` holding a copy of `data`.
    pub fn from_slice(dev: &Backend, shape: &[usize], data: &[T]) -> Result<Self> {
        if count(shape) != data.len() {
            return Err(shape_error("from_slice", shape, data.len()));
        }
        let buf = match dev {
            Backend::Cpu => Buffer::Host(data.to_vec()),
            Backend::Cuda(gpu) => Buffer::Cuda(gpu.upload(data)?),
        };
        Ok(Tensor { shape: shape.to_vec(), buf })
    }

    /// Zeros (all-zero bits) on `dev`.
    pub fn zeros(dev: &Backend, shape: &[usize]) -> Result<Self> {
        let n = count(shape);
        let buf = match dev {
            Backend::Cpu => Buffer::Host(vec![T::default(); n]),
            Backend::Cuda(gpu) => Buffer::Cuda(gpu.stream.alloc_zeros::<T>(n).doing("allocating a tensor")?),
        };
        Ok(Tensor { shape: shape.to_vec(), buf })
    }

    /// Wraps a device buffer already holding `shape`'s elements.
    pub fn from_cuda(shape: &[usize], data: CudaSlice<T>) -> Result<Self> {
        if count(shape) != data.len() {
            return Err(shape_error("from_cuda", shape, data.len()));
        }
        Ok(Tensor { shape: shape.to_vec(), buf: Buffer::Cuda(data) })
    }

    /// A copy of this tensor on `dev`.
    pub fn to(&self, dev: &Backend) -> Result<Self> {
        let data = self.to_vec()?;
        Tensor::from_slice(dev, &self.shape, &data)
    }

    /// The elements, copied to the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        match &self.buf {
            Buffer::Host(v) => Ok(v.clone()),
            Buffer::Cuda(d) => d.stream().clone_dtoh(d).doing("copying a tensor to the host"),
        }
    }

    /// Row `i` (of [`Tensor::rows`]), copied to the host.
    pub fn row(&self, i: usize) -> Result<Vec<T>> {
        self.row_range(i, 1)
    }

    /// `n` rows from row `start`, copied to the host.
    pub fn row_range(&self, start: usize, n: usize) -> Result<Vec<T>> {
        let cols = self.cols();
        if start + n > self.rows() {
            return Err(LabError::shape("tensor", format!("rows {start}..{} of a tensor with {} rows", start + n, self.rows())));
        }
        let range = start * cols..(start + n) * cols;
        match &self.buf {
            Buffer::Host(v) => Ok(v[range].to_vec()),
            Buffer::Cuda(d) => d.stream().clone_dtoh(&d.slice(range)).doing("copying tensor rows to the host"),
        }
    }

    /// Copies `src`'s elements in (same element count; any placement on either side).
    pub fn copy_from(&mut self, src: &Tensor<T>) -> Result<()> {
        if src.len() != self.len() {
            return Err(LabError::shape("tensor copy", format!("{:?} into {:?}", src.shape, self.shape)));
        }
        match (&mut self.buf, &src.buf) {
            (Buffer::Host(dst), Buffer::Host(s)) => dst.copy_from_slice(s),
            (Buffer::Host(dst), Buffer::Cuda(s)) => s.stream().memcpy_dtoh(s, dst).doing("copying a tensor to the host")?,
            (Buffer::Cuda(dst), Buffer::Host(s)) => dst.stream().clone().memcpy_htod(s, dst).doing("copying a tensor to the device")?,
            (Buffer::Cuda(dst), Buffer::Cuda(s)) => dst.stream().clone().memcpy_dtod(s, dst).doing("copying a tensor on the device")?,
        }
        Ok(())
    }

    /// The same elements under another shape with the same count.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self> {
        if count(shape) != self.len() {
            return Err(shape_error("reshape", shape, self.len()));
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn len(&self) -> usize {
        count(&self.shape)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The last dimension (1 for a scalar).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    /// Every dimension but the last, multiplied.
    pub fn rows(&self) -> usize {
        count(&self.shape[..self.shape.len().saturating_sub(1)])
    }
    pub fn dtype(&self) -> &'static str {
        T::NAME
    }
    /// "cuda" or "cpu", as [`Backend::name`] says.
    pub fn placement(&self) -> &'static str {
        match self.buf {
            Buffer::Host(_) => "cpu",
            Buffer::Cuda(_) => "cuda",
        }
    }
    pub fn buffer(&self) -> &Buffer<T> {
        &self.buf
    }
    pub fn buffer_mut(&mut self) -> &mut Buffer<T> {
        &mut self.buf
    }
    pub fn host(&self) -> Option<&[T]> {
        match &self.buf {
            Buffer::Host(v) => Some(v),
            Buffer::Cuda(_) => None,
        }
    }
    pub fn host_mut(&mut self) -> Option<&mut [T]> {
        match &mut self.buf {
            Buffer::Host(v) => Some(v),
            Buffer::Cuda(_) => None,
        }
    }
    pub fn cuda(&self) -> Option<&CudaSlice<T>> {
        match &self.buf {
            Buffer::Cuda(d) => Some(d),
            Buffer::Host(_) => None,
        }
    }
    pub fn cuda_mut(&mut self) -> Option<&mut CudaSlice<T>> {
        match &mut self.buf {
            Buffer::Cuda(d) => Some(d),
            Buffer::Host(_) => None,
        }
    }
}

impl<T: Scalar> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor<{}>{:?} on {}", T::NAME, self.shape, self.placement())
    }
}

/// Checks that an op's tensors live where its backend runs, naming the op and the tensor that
/// does not.
pub fn check_placement(op: &str, dev: &Backend, tensors: &[(&str, &'static str)]) -> Result<()> {
    for (name, placement) in tensors {
        if *placement != dev.name() {
            return Err(LabError::Invalid(format!(
                "{op}: `{name}` is on {placement} but the backend is {}; move it with Tensor::to",
                dev.name()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_checked_and_rows_are_the_leading_dimensions() {
        let err = Tensor::from_vec(&[2, 3], vec![0f32; 5]).unwrap_err().to_string();
        assert!(err.contains("[2, 3] holds 6 elements, the data 5"), "{err}");
        let t = Tensor::from_vec(&[2, 2, 3], (0..12).map(|i| i as f32).collect()).unwrap();
        assert_eq!((t.rows(), t.cols(), t.len()), (4, 3, 12));
        assert_eq!(t.row_range(2, 2).unwrap(), vec![6.0, 7.0, 8.0, 9.0, 10.0, 11.0]);
        assert!(t.row(4).unwrap_err().to_string().contains("rows 4..5 of a tensor with 4 rows"));
        let t = t.reshape(&[12]).unwrap();
        assert_eq!((t.rows(), t.cols()), (1, 12));
        assert!(t.reshape(&[5]).is_err());
    }

    #[test]
    fn copies_keep_the_elements_and_refuse_another_length() {
        let a = Tensor::from_vec(&[3], vec![1u8, 2, 3]).unwrap();
        let mut b = Tensor::<u8>::zeros(&Backend::Cpu, &[3]).unwrap();
        b.copy_from(&a).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3]);
        let mut c = Tensor::<u8>::zeros(&Backend::Cpu, &[4]).unwrap();
        assert!(c.copy_from(&a).unwrap_err().to_string().contains("[3] into [4]"));
    }

    #[test]
    fn placement_is_checked_against_the_backend() {
        let x = Tensor::from_vec(&[1], vec![0f32]).unwrap();
        assert!(check_placement("op", &Backend::Cpu, &[("x", x.placement())]).is_ok());
        let err = check_placement("softmax", &Backend::Cpu, &[("y", "cuda")]).unwrap_err().to_string();
        assert!(err.contains("softmax: `y` is on cuda but the backend is cpu"), "{err}");
    }
}
