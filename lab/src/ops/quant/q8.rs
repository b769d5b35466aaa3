//! Q8_0 weights as callable ops. SmolLM2's token embedding, tied as its LM head, is a 49152 x 576
//! Q8_0 matrix; [`Q8Tensor`] keeps its GGUF blocks as stored (the kernels read the 34-byte blocks
//! directly), [`w8a16_matvec`] is the LM head's product, [`embed_q8_0`] the token lookup and
//! [`dequantize_q8_0`] the whole matrix, each on the GPU (kernels/quant/w8a16.cu) or the CPU.
//!
//! The product writes f32: logits feed a softmax and an argmax over 49152 entries, and f16 (11
//! significant bits) would round logits near 20 to steps of 1/64, turning close candidates into
//! ties; an f32 row of logits is 192 KB beside the 30 MB of weights read.

use super::launch::{stride_grid, variant_for};
use super::models::w8a16_blocks;
use super::reference::reference_w4a16;
use super::variants::{q8_symbol, w8a16_chunk, w8a16_instance, w8a16_shape, w8a16_smem, Kernel, FAMILY, W8_ROWS, W8_WARPS};
use crate::error::Doing;
use crate::experiment::Backend;
use crate::gpu::Gpu;
use crate::kernels::DType;
use crate::ops::compare::{compare_product, ProductBound};
use crate::ops::Elem;
use crate::quant::ggml::{self, Block, QK};
use crate::record::ErrorStats;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::f16;
use rayon::prelude::*;

/// A `rows x cols` matrix in Q8_0 blocks (32 along each row, rows one after another), on one
/// backend.
pub struct Q8Tensor {
    rows: usize,
    cols: usize,
    data: Data,
}

enum Data {
    Host(Vec<u8>),
    Cuda(CudaSlice<u8>),
}

impl Q8Tensor {
    /// The Q8_0 blocks of a `rows x cols` matrix as GGUF stores them (a tensor of dims
    /// `[cols, rows]`: `rows` is the output dimension), placed on `dev` unchanged.
    pub fn from_blocks(dev: &Backend, blocks: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let n = rows.checked_mul(cols).filter(|_| rows.max(cols) <= i32::MAX as usize && rows > 0 && cols > 0 && cols.is_multiple_of(QK));
        if n.is_none_or(|n| blocks.len() != Block::Q8_0.size_of(n)) {
            return Err(LabError::shape(
                "Q8Tensor",
                format!("{} bytes for a {rows} x {cols} matrix: rows >= 1, cols a multiple of {QK}, {} bytes per {QK} weights", blocks.len(), Block::Q8_0.bytes()),
            ));
        }
        let data = match dev {
            Backend::Cpu => Data::Host(blocks.to_vec()),
            Backend::Cuda(gpu) => Data::Cuda(gpu.upload(blocks)?),
        };
        Ok(Q8Tensor { rows, cols, data })
    }

    /// Quantizes an f32 matrix (`rows x cols`) into Q8_0 as llama.cpp's reference quantizer does
    /// (on the host), placed on `dev`.
    pub fn quantize(dev: &Backend, w: &Tensor<f32>) -> Result<Self> {
        if w.shape().len() != 2 {
            return Err(LabError::shape("Q8Tensor::quantize", format!("w is {:?}: a matrix (rows, cols) is quantized", w.shape())));
        }
        let blocks = match w.host() {
            Some(h) => ggml::quantize(Block::Q8_0, h)?,
            None => ggml::quantize(Block::Q8_0, &w.to_vec()?)?,
        };
        Self::from_blocks(dev, &blocks, w.rows(), w.cols())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes of the blocks.
    pub fn bytes(&self) -> u64 {
        Block::Q8_0.size_of(self.rows * self.cols) as u64
    }
    /// "cuda" or "cpu", as [`Backend::name`] says.
    pub fn placement(&self) -> &'static str {
        match self.data {
            Data::Host(_) => "cpu",
            Data::Cuda(_) => "cuda",
        }
    }
    /// The blocks (CPU backend).
    pub fn host(&self) -> Option<&[u8]> {
        match &self.data {
            Data::Host(b) => Some(b),
            Data::Cuda(_) => None,
        }
    }
    /// The blocks (CUDA backend).
    pub fn device(&self) -> Option<&CudaSlice<u8>> {
        match &self.data {
            Data::Cuda(b) => Some(b),
            Data::Host(_) => None,
        }
    }
    fn cuda(&self) -> &CudaSlice<u8> {
        self.device().expect("placement checked")
    }
    fn row_bytes(&self) -> usize {
        Block::Q8_0.size_of(self.cols)
    }
}

impl std::fmt::Debug for Q8Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Q8Tensor[{}, {}] on {}", self.rows, self.cols, self.placement())
    }
}

fn on_cpu(dev: &Backend) -> bool {
    matches!(dev, Backend::Cpu)
}

/// y (batch x N, f32) = x (batch x K, f16) w^T for Q8_0 weights w (N x K), fp32 accumulation:
/// `w8a16` on the GPU, `cpu_w8a16` (the kernel's arithmetic at 16 rows per warp) on the CPU. Any
/// batch of at least 1.
pub fn w8a16_matvec(dev: &Backend, w: &Q8Tensor, x: &Tensor<f16>, y: &mut Tensor<f32>) -> Result<()> {
    w8a16_matvec_with(dev, if on_cpu(dev) { "cpu_w8a16" } else { "w8a16" }, w, x, y)
}

/// [`w8a16_matvec`] with a named variant (`w8a16` or `cpu_w8a16`).
pub fn w8a16_matvec_with(dev: &Backend, variant: &str, w: &Q8Tensor, x: &Tensor<f16>, y: &mut Tensor<f32>) -> Result<()> {
    let v = variant_for("W8A16 product", dev, variant, DType::F16, |k| matches!(k, Kernel::W8a16 | Kernel::CpuW8a16))?;
    check_placement("w8a16_matvec", dev, &[("w", w.placement()), ("x", x.placement()), ("y", y.placement())])?;
    let (n, k, batch) = (w.rows, w.cols, x.rows());
    if x.shape().len() != 2 || x.cols() != k || y.shape() != [batch, n] || batch == 0 {
        return Err(LabError::shape(
            "w8a16_matvec",
            format!("w is {n} x {k}, x {:?} and y {:?}: x must be (batch, {k}) and y (batch, {n}), batch at least 1", x.shape(), y.shape()),
        ));
    }
    match (v.config, dev) {
        (Kernel::CpuW8a16, _) => {
            let out = w8a16_blocks(w.host().expect("placement checked"), (n, k), x.host().expect("placement checked"), batch, W8_ROWS);
            y.host_mut().expect("placement checked").copy_from_slice(&out);
            Ok(())
        }
        (_, Backend::Cuda(gpu)) => launch_w8a16(gpu, v.name, w, x, y),
        _ => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

/// One launch per [`w8a16_chunk`] rows of X; each reads all of W.
fn launch_w8a16(gpu: &Gpu, name: &str, w: &Q8Tensor, x: &Tensor<f16>, y: &mut Tensor<f32>) -> Result<()> {
    let (n, k, batch) = (w.rows, w.cols, x.rows());
    let chunk = w8a16_chunk(k).ok_or_else(|| LabError::shape("w8a16_matvec", format!("K = {k}: one row of X does not fit the kernel's shared memory")))?;
    let (grid, rows_per_warp) = w8a16_shape(n, gpu.info.sm_count as usize);
    let (dw, dx, dy) = (w.cuda(), x.cuda().expect("placement checked"), y.cuda_mut().expect("placement checked"));
    let (ni, ki, rpw) = (n as i32, k as i32, rows_per_warp as i32);
    for b0 in (0..batch).step_by(chunk) {
        let nb = (batch - b0).min(chunk);
        let f = gpu.function(FAMILY, &q8_symbol(name, nb)?)?;
        let (fixed, smem) = w8a16_smem(w8a16_instance(nb), nb, k);
        if fixed + smem > 48 * 1024 {
            // Past the default 48 KB a kernel must ask for its dynamic shared memory.
            crate::ops::gemm::fit_dynamic_smem(gpu, &f, smem, 2)?;
        }
        let cfg = LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (32 * W8_WARPS as u32, 1, 1), shared_mem_bytes: smem as u32 };
        let xs = dx.slice(b0 * k..(b0 + nb) * k);
        let mut ys = dy.slice_mut(b0 * n..(b0 + nb) * n);
        let nbi = nb as i32;
        // SAFETY: w holds n x k/32 whole blocks, xs nb x k halves, ys nb x n floats (shapes
        // checked; nb <= the kernel's batch instantiation); k is a multiple of 32 and n, k fit in
        // an i32 (Q8Tensor::from_blocks). The dynamic shared memory holds the padded copy of xs
        // (w8a16_smem), its limit raised past 48 KB. The grid of W8_WARPS-warp blocks gives each
        // warp rows_per_warp <= W8_ROWS rows (w8a16_shape); warps past n return after the block's
        // barrier; the last partial 16 B vector of w is read 2 bytes at a time.
        unsafe { gpu.stream.launch_builder(&f).arg(dw).arg(&xs).arg(&mut ys).arg(&ni).arg(&ki).arg(&nbi).arg(&rpw).launch(cfg) }.doing("launching w8a16")?;
    }
    Ok(())
}

/// out (ids x K, f32) = the rows of w at token `ids`: the embedding lookup, each value `q d` as an
/// f32 product (bit-exact between backends). An id past w's rows is an error on the CPU; on the
/// GPU, where the ids live, its row comes out NaN.
pub fn embed_q8_0(dev: &Backend, w: &Q8Tensor, ids: &Tensor<u32>, out: &mut Tensor<f32>) -> Result<()> {
    embed_q8_0_with(dev, if on_cpu(dev) { "cpu_embed" } else { "embed" }, w, ids, out)
}

/// [`embed_q8_0`] with a named variant (`embed` or `cpu_embed`).
pub fn embed_q8_0_with(dev: &Backend, variant: &str, w: &Q8Tensor, ids: &Tensor<u32>, out: &mut Tensor<f32>) -> Result<()> {
    let v = variant_for("Q8_0 row gather", dev, variant, DType::F32, |k| matches!(k, Kernel::Embed | Kernel::CpuEmbed))?;
    check_placement("embed_q8_0", dev, &[("w", w.placement()), ("ids", ids.placement()), ("out", out.placement())])?;
    let (n, k) = (ids.len(), w.cols);
    if out.shape() != [n, k] || n == 0 {
        return Err(LabError::shape("embed_q8_0", format!("{n} ids of a {} x {k} table, out {:?}: out must be ({n}, {k}), at least one id", w.rows, out.shape())));
    }
    match (v.config, dev) {
        (Kernel::CpuEmbed, _) => {
            let (blocks, rb) = (w.host().expect("placement checked"), w.row_bytes());
            let ids = ids.host().expect("placement checked");
            if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= w.rows) {
                return Err(LabError::Invalid(format!("embed_q8_0: id {id} (at {i}) is past the table's {} rows", w.rows)));
            }
            let o = out.host_mut().expect("placement checked");
            o.par_chunks_mut(k).zip(ids.par_iter()).try_for_each(|(row, &id)| ggml::dequantize_into(Block::Q8_0, &blocks[id as usize * rb..(id as usize + 1) * rb], row))
        }
        (_, Backend::Cuda(gpu)) => {
            let f = gpu.function(FAMILY, &q8_symbol(v.name, 1)?)?;
            let (dw, di, o) = (w.cuda(), ids.cuda().expect("placement checked"), out.cuda_mut().expect("placement checked"));
            let (nn, ki, rows) = (n as i64, k as i32, w.rows as i32);
            // SAFETY: ids holds n u32, out n x k floats (checked), w rows x k/32 blocks; the kernel
            // reads no row of w for an id >= rows (it writes NaN there).
            unsafe { gpu.stream.launch_builder(&f).arg(dw).arg(di).arg(o).arg(&nn).arg(&ki).arg(&rows).launch(stride_grid(gpu, 32 * n)) }
                .map(|_| ())
                .doing("launching the Q8_0 row gather")
        }
        _ => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

/// out (rows x cols) = all of w dequantized: `dequant` (f16) on the GPU, `cpu_dequantize` (f32 or
/// f16) on the CPU; `q d` as an f32 product, rounded once to f16 for f16 outputs.
pub fn dequantize_q8_0<T: Elem>(dev: &Backend, w: &Q8Tensor, out: &mut Tensor<T>) -> Result<()> {
    dequantize_q8_0_with(dev, if on_cpu(dev) { "cpu_dequantize" } else { "dequant" }, w, out)
}

/// [`dequantize_q8_0`] with a named variant.
pub fn dequantize_q8_0_with<T: Elem>(dev: &Backend, variant: &str, w: &Q8Tensor, out: &mut Tensor<T>) -> Result<()> {
    let v = variant_for("dequantize", dev, variant, T::DTYPE, |k| matches!(k, Kernel::Dequant { .. } | Kernel::CpuDequantize))?;
    check_placement("dequantize_q8_0", dev, &[("w", w.placement()), ("out", out.placement())])?;
    if out.shape() != [w.rows, w.cols] {
        return Err(LabError::shape("dequantize_q8_0", format!("w is {} x {} but out is {:?}", w.rows, w.cols, out.shape())));
    }
    match (v.config, dev) {
        (Kernel::CpuDequantize, _) => {
            let values = ggml::dequantize(Block::Q8_0, w.host().expect("placement checked"))?;
            out.host_mut().expect("placement checked").par_iter_mut().zip(values.par_iter()).for_each(|(o, &v)| *o = T::from_f32(v));
            Ok(())
        }
        (_, Backend::Cuda(gpu)) => {
            let f = gpu.function(FAMILY, &q8_symbol(v.name, 1)?)?;
            let (dw, o) = (w.cuda(), out.cuda_mut().expect("placement checked"));
            let (rows, ki) = (w.rows as i64, w.cols as i32);
            // SAFETY: w holds rows x k/32 blocks, out rows x k halves (T is f16: the variant's only
            // dtype, checked); one warp per row, grid-stride.
            unsafe { gpu.stream.launch_builder(&f).arg(dw).arg(o).arg(&rows).arg(&ki).launch(stride_grid(gpu, 32 * w.rows)) }
                .map(|_| ())
                .doing("launching the Q8_0 dequantize")
        }
        _ => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

/// The f64 product of x and the dequantized weights (as [`reference_w4a16`]) and, per output, the
/// sum of |x w| its rounding error scales with.
pub fn reference_w8a16(x: &[f64], w: &[f32], batch: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let xa: Vec<f64> = x.iter().map(|v| v.abs()).collect();
    let wa: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    (reference_w4a16(x, w, batch, n, k), reference_w4a16(&xa, &wa, batch, n, k))
}

/// The W8A16 bound: X is f16 in both the output and its f64 reference, so the only error is f32
/// arithmetic, K products (each weight scaled by its block's d once) in any order
/// ([`ProductBound::fp32_accumulation`]); the reference's own rounding of `q d` to f32 is within it.
pub fn w8a16_bound(k: usize) -> ProductBound {
    ProductBound::fp32_accumulation(k, DType::F32)
}

/// Checks a W8A16 output against its f64 reference element by element, `abs` the sum of |x w|
/// of each output ([`reference_w8a16`]), within [`w8a16_bound`].
pub fn check_w8a16(y: &[f32], expected: &[f64], abs: &[f64], k: usize) -> ErrorStats {
    compare_product(&crate::ops::widen(y), expected, abs, w8a16_bound(k), "cpu-f64-dequantized")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quant::reference::reference_dequantize_blocks;

    fn matrix(rows: usize, cols: usize) -> Tensor<f32> {
        Tensor::from_vec(&[rows, cols], (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 70.0 * (1.0 + (i % 5) as f32)).collect()).unwrap()
    }

    fn activations(batch: usize, k: usize) -> Vec<f16> {
        (0..batch * k).map(|i| f16::from_f32(((i * 29 % 23) as f32 - 11.0) / 7.3)).collect()
    }

    /// The CPU product (the kernel's f32 arithmetic) on N = 37, K = 96 and on N = 70, K = 576
    /// (runs of 32 blocks that start and end inside rows) against the f64 product of an
    /// element-by-element reading of the blocks, batches 1 and 3: within the bound, and not the
    /// reference rounded. One block skipped, or one flipped weight byte, fails the same check at
    /// its row.
    #[test]
    fn the_cpu_product_meets_the_f64_reference_and_a_planted_fault_fails_it() {
        let cpu = Backend::Cpu;
        let mut rounded_reference = true;
        for (n, k) in [(37, 96), (70, 576)] {
            let w = Q8Tensor::quantize(&cpu, &matrix(n, k)).unwrap();
            let blocks = w.host().unwrap().to_vec();
            let wd = reference_dequantize_blocks(Block::Q8_0, &blocks);
            let kb = k / 32;
            for batch in [1, 3] {
                let x = activations(batch, k);
                let (expected, abs) = reference_w8a16(&x.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &wd, batch, n, k);
                let xt = Tensor::from_vec(&[batch, k], x.clone()).unwrap();
                let mut y = Tensor::<f32>::zeros(&cpu, &[batch, n]).unwrap();
                w8a16_matvec(&cpu, &w, &xt, &mut y).unwrap();
                let got = y.to_vec().unwrap();
                let e = check_w8a16(&got, &expected, &abs, k);
                assert!(e.passed(), "{n} x {k} batch {batch}: {e:?}");
                rounded_reference &= got.iter().zip(&expected).all(|(&g, &e)| g == e as f32);
                // Row 5's block 1 skipped by the variant's own loop.
                let skipped = crate::ops::quant::models::w8a16_decoding(&blocks, (n, k), &x, batch, W8_ROWS, |r, c, b| {
                    if (r, c) == (5, 1) { ([0.0; 32], 0.0) } else { crate::ops::quant::models::q8_block(b) }
                });
                let e = check_w8a16(&skipped, &expected, &abs, k);
                assert_eq!((e.passed(), e.mismatches, e.worst_index.map(|i| i % n as u64)), (false, batch as u64, Some(5)), "{n} x {k} batch {batch}: {e:?}");
                // Row 5's first code of block 1: the sign bit flipped.
                let mut bad = blocks.clone();
                bad[(5 * kb + 1) * 34 + 2] ^= 0x80;
                let wb = Q8Tensor::from_blocks(&cpu, &bad, n, k).unwrap();
                w8a16_matvec(&cpu, &wb, &xt, &mut y).unwrap();
                let e = check_w8a16(&y.to_vec().unwrap(), &expected, &abs, k);
                assert_eq!((e.passed(), e.mismatches, e.worst_index.map(|i| i % n as u64)), (false, batch as u64, Some(5)), "{n} x {k} batch {batch}: {e:?}");
            }
        }
        assert!(!rounded_reference, "every output is the f64 reference rounded to f32");
    }

    #[test]
    fn the_cpu_gather_and_dequantize_are_the_blocks_values() {
        let cpu = Backend::Cpu;
        let (n, k) = (37, 96);
        let w = Q8Tensor::quantize(&cpu, &matrix(n, k)).unwrap();
        let wd = reference_dequantize_blocks(Block::Q8_0, w.host().unwrap());
        let ids = [36u32, 0, 5, 36];
        let mut out = Tensor::<f32>::zeros(&cpu, &[4, k]).unwrap();
        embed_q8_0(&cpu, &w, &Tensor::from_vec(&[4], ids.to_vec()).unwrap(), &mut out).unwrap();
        let want: Vec<u32> = ids.iter().flat_map(|&id| wd[id as usize * k..(id as usize + 1) * k].iter().map(|v| v.to_bits())).collect();
        assert_eq!(out.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        let err = embed_q8_0(&cpu, &w, &Tensor::from_vec(&[4], vec![1u32, 2, 37, 0]).unwrap(), &mut out).unwrap_err().to_string();
        assert!(err.contains("id 37 (at 2) is past the table's 37 rows"), "{err}");

        let mut full = Tensor::<f32>::zeros(&cpu, &[n, k]).unwrap();
        dequantize_q8_0(&cpu, &w, &mut full).unwrap();
        assert_eq!(full.to_vec().unwrap(), wd);
        let mut half = Tensor::<f16>::zeros(&cpu, &[n, k]).unwrap();
        dequantize_q8_0(&cpu, &w, &mut half).unwrap();
        assert_eq!(half.to_vec().unwrap(), wd.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>());
    }

    #[test]
    fn bad_input_is_named() {
        let cpu = Backend::Cpu;
        let err = Q8Tensor::from_blocks(&cpu, &[0u8; 68], 1, 96).unwrap_err().to_string();
        assert!(err.contains("68 bytes for a 1 x 96 matrix"), "{err}");
        assert!(Q8Tensor::from_blocks(&cpu, &[0u8; 34], 1, 16).is_err());
        assert!(Q8Tensor::quantize(&cpu, &Tensor::from_vec(&[64], vec![0f32; 64]).unwrap()).is_err());
        let w = Q8Tensor::quantize(&cpu, &matrix(4, 64)).unwrap();
        assert_eq!((w.rows(), w.cols(), w.bytes(), format!("{w:?}")), (4, 64, 4 * 2 * 34, "Q8Tensor[4, 64] on cpu".to_string()));
        let x = Tensor::from_vec(&[2, 64], vec![f16::ONE; 128]).unwrap();
        let mut y = Tensor::<f32>::zeros(&cpu, &[2, 3]).unwrap();
        let err = w8a16_matvec(&cpu, &w, &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("w is 4 x 64, x [2, 64] and y [2, 3]"), "{err}");
        let mut y = Tensor::<f32>::zeros(&cpu, &[2, 4]).unwrap();
        let err = w8a16_matvec_with(&cpu, "w8a16", &w, &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("`w8a16` needs gpu, not the CPU backend"), "{err}");
        let err = w8a16_matvec_with(&cpu, "cpu_w4a16", &w, &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("not a W8A16 product (one of: w8a16, cpu_w8a16)"), "{err}");
        let mut out = Tensor::<f32>::zeros(&cpu, &[2, 60]).unwrap();
        let err = embed_q8_0(&cpu, &w, &Tensor::from_vec(&[2], vec![0u32, 1]).unwrap(), &mut out).unwrap_err().to_string();
        assert!(err.contains("out must be (2, 64)"), "{err}");
        let mut wrong = Tensor::<f32>::zeros(&cpu, &[64, 4]).unwrap();
        assert!(dequantize_q8_0(&cpu, &w, &mut wrong).unwrap_err().to_string().contains("w is 4 x 64 but out is [64, 4]"));
    }
}
