//! The quant family's callable ops on tensors: INT4 packing, dequantization, the read floor and
//! the W4A16 product, each as `op(dev, ..)` (the best variant for the backend) and
//! `op_with(dev, variant, ..)` (any row of [`super::variants::VARIANTS`] that does this op), on
//! the GPU or the CPU backend. Bad input is an error naming the problem, never a bad launch.
//!
//! ```
//! use lab::prelude::*;
//! use lab::ops::quant::{w4a16_matvec, QuantTensor};
//! use lab::quant::{Format, Scheme};
//! let cpu = Backend::Cpu;
//! let w = Tensor::from_vec(&[8, 64], (0..512).map(|i| (i % 7) as f32 - 3.0).collect()).unwrap();
//! let q = QuantTensor::quantize(&cpu, &w, Format::Group { scheme: Scheme::Sym, group: 32 }).unwrap();
//! let x = Tensor::from_vec(&[1, 64], vec![half::f16::ONE; 64]).unwrap();
//! let mut y = Tensor::<half::f16>::zeros(&cpu, &[1, 8]).unwrap();
//! w4a16_matvec(&cpu, &q, &x, &mut y).unwrap();
//! ```

use super::models::w4a16_cuda_cores;
use super::reference::{validate_w4a16, Quantized};
use super::variants::{self, find, kernel_symbol, Kernel, Layout, W4Design, FAMILY};
use crate::error::Doing;
use crate::experiment::Backend;
use crate::gpu::Gpu;
use crate::kernels::DType;
use crate::ops::variant::{check_runs, Variant};
use crate::ops::Elem;
use crate::quant::group::{Format, GroupQuant, Scheme};
use crate::quant::{int4, tiles};
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::f16;
use rayon::prelude::*;
use std::collections::HashSet;
use std::sync::Mutex;

/// A weight matrix (`rows x cols`, row-major as given) in a 4-bit format, on one backend.
pub struct QuantTensor {
    format: Format,
    rows: usize,
    cols: usize,
    layout: Layout,
    data: Data,
    scratch: Mutex<Scratch>,
}

enum Data {
    /// On the host, in the library's own form: the CPU paths run on it as it is.
    Host(Quantized),
    /// On a GPU: the codes (group formats, in the tensor's layout) or the GGUF blocks as
    /// stored; scales and mins of the group formats (mins for asymmetric only).
    Cuda { codes: CudaSlice<u8>, scales: Option<CudaSlice<f16>>, mins: Option<CudaSlice<f16>> },
}

/// What launches keep between calls, so that a call in a timing loop does no setup.
#[derive(Default)]
struct Scratch {
    /// Split-K: fp32 partials (slices x B x N) and one u32 counter per 16-row tile, zero at
    /// rest (every launch leaves them zeroed).
    splitk: Option<(CudaSlice<f32>, CudaSlice<u32>)>,
    /// Kernels whose dynamic shared memory limit is already raised.
    fitted: HashSet<String>,
}

impl QuantTensor {
    /// Quantizes an f32 matrix (`rows x cols`) on any backend, in the layout the fastest W4A16
    /// designs read there ([`default_layout`]). The quantizer runs on the host (a GPU tensor is
    /// copied down first); the result lives on `dev`.
    pub fn quantize(dev: &Backend, w: &Tensor<f32>, format: Format) -> Result<Self> {
        Self::quantize_in(dev, w, format, default_layout(dev, format))
    }

    /// [`QuantTensor::quantize`] in a given layout (the tile layouts: group formats on a GPU).
    pub fn quantize_in(dev: &Backend, w: &Tensor<f32>, format: Format, layout: Layout) -> Result<Self> {
        if w.shape().len() != 2 {
            return Err(LabError::shape("quantize", format!("w is {:?}: a matrix (rows, cols) is quantized", w.shape())));
        }
        let q = match w.host() {
            Some(h) => Quantized::new(format, h, w.rows(), w.cols())?,
            None => Quantized::new(format, &w.to_vec()?, w.rows(), w.cols())?,
        };
        Self::from_quantized(dev, q, (w.rows(), w.cols()), layout)
    }

    /// GGUF Q4_1 blocks of a `rows x cols` matrix (a tensor of dims `[cols, rows]`: `rows` is the
    /// output dimension) on `dev`, repacked losslessly as asymmetric groups of 32
    /// ([`GroupQuant::from_q4_1`]) in the layout the fastest W4A16 designs read there.
    pub fn from_gguf_q4_1(dev: &Backend, blocks: &[u8], rows: usize, cols: usize) -> Result<Self> {
        let q = Quantized::Group(GroupQuant::from_q4_1(blocks, rows, cols)?);
        Self::from_quantized(dev, q, (rows, cols), default_layout(dev, Format::Group { scheme: Scheme::Asym, group: 32 }))
    }

    /// Places an already quantized `rows x cols` matrix on `dev` in `layout` (the tile layouts
    /// are built here, on the host, once).
    pub fn from_quantized(dev: &Backend, q: Quantized, (rows, cols): (usize, usize), layout: Layout) -> Result<Self> {
        if let Quantized::Blocks(crate::quant::ggml::Block::Q8_0, _) = q {
            return Err(LabError::Invalid("QuantTensor holds 4-bit formats; Q8_0 blocks are a Q8Tensor".into()));
        }
        let format = q.format();
        if q.len() != rows * cols {
            return Err(LabError::shape("QuantTensor", format!("{rows} x {cols} weights, but the quantized form holds {}", q.len())));
        }
        let fail = |why: String| Err(LabError::Invalid(format!("QuantTensor in the {} layout: {why}", layout.name())));
        let blocks = matches!(q, Quantized::Blocks(..));
        let data = match (dev, layout) {
            (_, Layout::Tiles | Layout::StepMajor) if blocks => return fail(format!("{} blocks have no tile layout", format.name())),
            (Backend::Cpu, Layout::Tiles | Layout::StepMajor) => return fail("the tile layouts are for the GPU designs; the CPU keeps rows".into()),
            (Backend::Cpu, Layout::Rows) => Data::Host(q),
            (Backend::Cuda(gpu), _) => match &q {
                Quantized::Blocks(_, blocks) => Data::Cuda { codes: gpu.upload(blocks)?, scales: None, mins: None },
                Quantized::Group(g) => {
                    let opt = |v: &[f16]| if v.is_empty() { Ok(None) } else { gpu.upload(v).map(Some) };
                    match layout {
                        Layout::Rows => Data::Cuda { codes: gpu.upload(&g.packed)?, scales: opt(&g.scales)?, mins: opt(&g.mins)? },
                        Layout::Tiles | Layout::StepMajor => {
                            let t = tiles::tile(g);
                            let codes = if layout == Layout::Tiles { gpu.upload(&t.codes)? } else { gpu.upload(&tiles::step_major(&t))? };
                            Data::Cuda { codes, scales: opt(&t.scales)?, mins: opt(&t.mins)? }
                        }
                    }
                }
            },
        };
        Ok(QuantTensor { format, rows, cols, layout, data, scratch: Mutex::new(Scratch::default()) })
    }

    pub fn format(&self) -> Format {
        self.format
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// "cuda" or "cpu", as [`Backend::name`] says.
    pub fn placement(&self) -> &'static str {
        match self.data {
            Data::Host(_) => "cpu",
            Data::Cuda { .. } => "cuda",
        }
    }
    /// The host form (CPU backend).
    pub fn host(&self) -> Option<&Quantized> {
        match &self.data {
            Data::Host(q) => Some(q),
            Data::Cuda { .. } => None,
        }
    }
    fn group(&self) -> Option<(Scheme, usize)> {
        match self.format {
            Format::Group { scheme, group } => Some((scheme, group)),
            Format::Q4_0 | Format::Q4_1 => None,
        }
    }
    /// The device buffers: codes, scales, and mins (the scales where there are none: symmetric
    /// kernels ignore them, and the read floor reads 0 bytes of them).
    fn cuda(&self) -> (&CudaSlice<u8>, Option<&CudaSlice<f16>>, Option<&CudaSlice<f16>>) {
        match &self.data {
            Data::Cuda { codes, scales, mins } => (codes, scales.as_ref(), mins.as_ref().or(scales.as_ref())),
            Data::Host(_) => unreachable!("placement checked"),
        }
    }
    fn check_rows_layout(&self, op: &str) -> Result<()> {
        if self.layout != Layout::Rows {
            return Err(LabError::Invalid(format!(
                "{op} reads row-major codes; this weight is in the {} layout (QuantTensor::quantize_in(.., Layout::Rows))",
                self.layout.name()
            )));
        }
        Ok(())
    }
}

impl std::fmt::Debug for QuantTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantTensor<{}>[{}, {}] ({} layout) on {}", self.format.name(), self.rows, self.cols, self.layout.name(), self.placement())
    }
}

/// The layout [`QuantTensor::quantize`] gives: on a GPU, group formats in the tile layout that
/// [`best_w4a16`]'s designs read; rows everywhere else.
pub fn default_layout(dev: &Backend, format: Format) -> Layout {
    match (dev, format) {
        (Backend::Cuda(_), Format::Group { .. }) => Layout::Tiles,
        _ => Layout::Rows,
    }
}

/// A grid-stride launch filling the chip (as vector_add's float4 kernel).
pub(super) fn stride_grid(gpu: &Gpu, items: usize) -> LaunchConfig {
    let grid = (gpu.info.sm_count as usize * 8).min(items.div_ceil(256)).max(1) as u32;
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The row `variant`, checked to be one of `kinds` and to run on `dev`.
pub(super) fn variant_for(op: &str, dev: &Backend, variant: &str, dtype: DType, kinds: fn(&Kernel) -> bool) -> Result<&'static Variant<Kernel>> {
    let v = find(variant)?;
    if !kinds(&v.config) {
        let these: Vec<&str> = variants::VARIANTS.iter().filter(|v| kinds(&v.config)).map(|v| v.name).collect();
        return Err(LabError::Invalid(format!("`{variant}` is a quant variant but not a {op} (one of: {})", these.join(", "))));
    }
    check_runs(FAMILY, v, dev, dtype)?;
    Ok(v)
}

fn is_pack(k: &Kernel) -> bool {
    matches!(k, Kernel::PackInt4 | Kernel::CpuPack)
}
fn is_unpack(k: &Kernel) -> bool {
    matches!(k, Kernel::UnpackInt4 | Kernel::CpuUnpack)
}
fn is_dequant(k: &Kernel) -> bool {
    matches!(k, Kernel::Dequant { .. } | Kernel::CpuDequantize)
}
fn is_stream_read(k: &Kernel) -> bool {
    matches!(k, Kernel::StreamRead { .. })
}
fn is_w4a16(k: &Kernel) -> bool {
    matches!(k, Kernel::W4(_) | Kernel::CpuW4a16)
}

/// Packs 4-bit codes (one per byte, each < 16) two per byte, low nibble first.
pub fn pack_int4(dev: &Backend, codes: &Tensor<u8>, packed: &mut Tensor<u8>) -> Result<()> {
    pack_int4_with(dev, if matches!(dev, Backend::Cpu) { "cpu_pack" } else { "pack_int4" }, codes, packed)
}

/// [`pack_int4`] with a named variant (`pack_int4` on the GPU, `cpu_pack` on the CPU).
pub fn pack_int4_with(dev: &Backend, variant: &str, codes: &Tensor<u8>, packed: &mut Tensor<u8>) -> Result<()> {
    let v = variant_for("packing", dev, variant, DType::F16, is_pack)?;
    int4_args("pack_int4", dev, codes, packed, codes.len(), int4::packed_len(codes.len()))?;
    let n = codes.len();
    match (v.config, dev) {
        (Kernel::CpuPack, _) => int4::pack_into(codes.host().expect("placement checked"), packed.host_mut().expect("placement checked")),
        (_, Backend::Cuda(gpu)) => {
            let f = gpu.function(FAMILY, &kernel_symbol(v.name, Scheme::Sym, 1, Format::Q4_0)?)?;
            let (c, p) = (codes.cuda().expect("placement checked"), packed.cuda_mut().expect("placement checked"));
            let nn = n as i64;
            // SAFETY: codes holds n bytes, packed ceil(n/2) (checked); the kernel bounds by n.
            unsafe { gpu.stream.launch_builder(&f).arg(c).arg(p).arg(&nn).launch(stride_grid(gpu, n.div_ceil(32))) }.map(|_| ()).doing("launching pack_int4")
        }
        _ => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

/// Unpacks two codes per byte into one per byte (`codes.len()` of them).
pub fn unpack_int4(dev: &Backend, packed: &Tensor<u8>, codes: &mut Tensor<u8>) -> Result<()> {
    unpack_int4_with(dev, if matches!(dev, Backend::Cpu) { "cpu_unpack" } else { "unpack_int4" }, packed, codes)
}

/// [`unpack_int4`] with a named variant (`unpack_int4` on the GPU, `cpu_unpack` on the CPU).
pub fn unpack_int4_with(dev: &Backend, variant: &str, packed: &Tensor<u8>, codes: &mut Tensor<u8>) -> Result<()> {
    let v = variant_for("unpacking", dev, variant, DType::F16, is_unpack)?;
    let n = codes.len();
    int4_args("unpack_int4", dev, packed, codes, int4::packed_len(n), n)?;
    match (v.config, dev) {
        (Kernel::CpuUnpack, _) => int4::unpack_into(packed.host().expect("placement checked"), codes.host_mut().expect("placement checked")),
        (_, Backend::Cuda(gpu)) => {
            let f = gpu.function(FAMILY, &kernel_symbol(v.name, Scheme::Sym, 1, Format::Q4_0)?)?;
            let (p, c) = (packed.cuda().expect("placement checked"), codes.cuda_mut().expect("placement checked"));
            let nn = n as i64;
            // SAFETY: packed holds ceil(n/2) bytes, codes n (checked); the kernel bounds by n.
            unsafe { gpu.stream.launch_builder(&f).arg(p).arg(c).arg(&nn).launch(stride_grid(gpu, n.div_ceil(32))) }.map(|_| ()).doing("launching unpack_int4")
        }
        _ => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

fn int4_args(op: &str, dev: &Backend, src: &Tensor<u8>, dst: &Tensor<u8>, src_len: usize, dst_len: usize) -> Result<()> {
    check_placement(op, dev, &[("input", src.placement()), ("output", dst.placement())])?;
    if src.len() != src_len || dst.len() != dst_len {
        return Err(LabError::shape(op, format!("{} bytes in, {} out: {op} of these takes {src_len} and gives {dst_len}", src.len(), dst.len())));
    }
    Ok(())
}

/// out (rows x cols) = the dequantized weights, with the best variant for the backend.
pub fn dequantize<T: Elem>(dev: &Backend, w: &QuantTensor, out: &mut Tensor<T>) -> Result<()> {
    dequantize_with(dev, if matches!(dev, Backend::Cpu) { "cpu_dequantize" } else { "dequant" }, w, out)
}

/// [`dequantize`] with a named variant: `dequant` (f16, any format), `dequant_cp_async` (f16,
/// GGUF blocks) on the GPU; `cpu_dequantize` (f32 or f16) on the CPU. Bit-exact with
/// [`super::reference::reference_dequantize`] (rounded once to f16 for f16 outputs).
pub fn dequantize_with<T: Elem>(dev: &Backend, variant: &str, w: &QuantTensor, out: &mut Tensor<T>) -> Result<()> {
    let v = variant_for("dequantize", dev, variant, T::DTYPE, is_dequant)?;
    check_placement("dequantize", dev, &[("w", w.placement()), ("out", out.placement())])?;
    if out.shape() != [w.rows, w.cols] {
        return Err(LabError::shape("dequantize", format!("w is {} x {} but out is {:?}", w.rows, w.cols, out.shape())));
    }
    w.check_rows_layout("dequantize")?;
    let n = w.rows * w.cols;
    match (v.config, dev) {
        (Kernel::CpuDequantize, _) => {
            let (q, o) = (w.host().expect("placement checked"), out.host_mut().expect("placement checked"));
            if T::DTYPE == DType::F32 {
                // SAFETY: T is f32 (its DTYPE says so): the same slice, typed as what it is.
                q.dequantize_into(unsafe { std::slice::from_raw_parts_mut(o.as_mut_ptr().cast::<f32>(), o.len()) });
            } else {
                let values = q.dequantize();
                o.par_iter_mut().zip(values.par_iter()).for_each(|(o, &v)| *o = T::from_f32(v));
            }
            Ok(())
        }
        (_, Backend::Cuda(gpu)) => {
            let sym = kernel_symbol(v.name, Scheme::Sym, 1, w.format)?;
            let f = gpu.function(FAMILY, &sym)?;
            let (codes, scales, mins) = w.cuda();
            let o = out.cuda_mut().expect("placement checked");
            match w.group() {
                Some((scheme, group)) => {
                    let (nn, g) = (n as i64, group as i32);
                    let mut b = gpu.stream.launch_builder(&f);
                    b.arg(codes).arg(scales.expect("group formats have scales"));
                    if scheme == Scheme::Asym {
                        b.arg(mins.expect("asymmetric formats have mins"));
                    }
                    // SAFETY: codes hold n/2 bytes, scales (mins) n/group halves, out n halves (its
                    // shape checked); n % 32 == 0 and group % 32 == 0 (validated formats).
                    unsafe { b.arg(o).arg(&nn).arg(&g).launch(stride_grid(gpu, n / 32)) }.map(|_| ()).doing("launching a group dequantize")
                }
                None => {
                    let nblocks = (n / 32) as i64;
                    // SAFETY: codes hold nblocks whole blocks, out 32 halves per block.
                    unsafe { gpu.stream.launch_builder(&f).arg(codes).arg(o).arg(&nblocks).launch(stride_grid(gpu, nblocks as usize)) }
                        .map(|_| ())
                        .doing("launching a block dequantize")
                }
            }
        }
        _ => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

/// Blocks the read floor `variant` runs on `gpu` for `w`: one u32 of output each.
pub fn stream_read_blocks(gpu: &Gpu, variant: &str, w: &QuantTensor) -> Result<usize> {
    let Kernel::StreamRead { loads, blocks_per_sm } = find(variant)?.config else {
        return Err(LabError::Invalid(format!("`{variant}` is not a stream read")));
    };
    // Never more than `loads` 16 B vectors per thread (4224 blocks for SmolLM2's 166 KB layers
    // cost 2 us more than the layers' GEMVs themselves).
    let vectors = (w.bytes() as usize).div_ceil(16);
    Ok((blocks_per_sm * gpu.info.sm_count as usize).min(vectors.div_ceil(256 * loads)))
}

impl QuantTensor {
    /// Bytes of the quantized form (codes, scales, mins) in rows.
    pub fn bytes(&self) -> u64 {
        match &self.data {
            Data::Host(q) => q.bytes(),
            Data::Cuda { codes, scales, mins } => {
                let halves = scales.as_ref().map_or(0, |s| s.len()) + mins.as_ref().map_or(0, |m| m.len());
                (codes.len() + 2 * halves) as u64
            }
        }
    }
}

/// The read floor: reads every byte of `w` (codes, scales, mins) once, decoding nothing; block
/// i writes the XOR of the u32 words it read to out[i] (out holds [`stream_read_blocks`] words).
pub fn stream_read_with(dev: &Backend, variant: &str, w: &QuantTensor, out: &mut Tensor<u32>) -> Result<()> {
    let v = variant_for("stream read", dev, variant, DType::F16, is_stream_read)?;
    check_placement("stream_read", dev, &[("w", w.placement()), ("out", out.placement())])?;
    w.check_rows_layout("stream_read")?;
    let Backend::Cuda(gpu) = dev else { unreachable!("check_runs keeps GPU variants off the CPU") };
    let Some((scheme, _)) = w.group() else {
        return Err(LabError::Invalid(format!("stream_read reads group-wise weights, not {}", w.format.name())));
    };
    let blocks = stream_read_blocks(gpu, v.name, w)?;
    if out.len() != blocks {
        return Err(LabError::shape("stream_read", format!("out holds {} words; `{variant}` writes {blocks} here", out.len())));
    }
    let f = gpu.function(FAMILY, &kernel_symbol(v.name, scheme, 1, w.format)?)?;
    let (codes, scales, mins) = w.cuda();
    let (scales, mins) = (scales.expect("group formats have scales"), mins.expect("scales stand in"));
    let nq = codes.len() as i64;
    let ns = 2 * scales.len() as i64;
    let nm = if scheme == Scheme::Asym { 2 * mins.len() as i64 } else { 0 };
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let o = out.cuda_mut().expect("placement checked");
    // SAFETY: each buffer holds at least the byte count passed with it (mins: 0 bytes read when
    // symmetric); out holds one word per block of the grid (checked).
    unsafe { gpu.stream.launch_builder(&f).arg(codes).arg(&nq).arg(scales).arg(&ns).arg(mins).arg(&nm).arg(o).launch(cfg) }
        .map(|_| ())
        .doing("launching stream_read")
}

/// The W4A16 design [`w4a16_matvec`] runs for weights in `layout` and `batch` rows of X: the
/// fastest measured (H100, 8192 x 8192 g128, medians over the committed runs): in the tile
/// layout `w4a16_mma_tiled_post` up to batch 8 (17.9-18.9 us) and `w4a16_mma_tiled` at 16
/// (29.9 us); step-major `w4a16_mma_tiled_sweep` and, at 16, `w4a16_mma_tiled_sweep4`; rows
/// `w4a16_mma_occ8`. The CPU runs `cpu_w4a16`.
pub fn best_w4a16(dev: &Backend, layout: Layout, batch: usize) -> &'static Variant<Kernel> {
    let name = match (dev, layout) {
        (Backend::Cpu, _) => "cpu_w4a16",
        (Backend::Cuda(_), Layout::Tiles) if batch > 8 => "w4a16_mma_tiled",
        (Backend::Cuda(_), Layout::Tiles) => "w4a16_mma_tiled_post",
        (Backend::Cuda(_), Layout::StepMajor) if batch > 8 => "w4a16_mma_tiled_sweep4",
        (Backend::Cuda(_), Layout::StepMajor) => "w4a16_mma_tiled_sweep",
        (Backend::Cuda(_), Layout::Rows) => "w4a16_mma_occ8",
    };
    find(name).expect("the best W4A16 design is in the table")
}

/// y (batch x N) = x (batch x K) w^T for 4-bit weights w (N x K), f16 activations, fp32
/// accumulation, with the best design for the backend, w's layout and the batch.
pub fn w4a16_matvec(dev: &Backend, w: &QuantTensor, x: &Tensor<f16>, y: &mut Tensor<f16>) -> Result<()> {
    w4a16_matvec_with(dev, best_w4a16(dev, w.layout, x.rows()).name, w, x, y)
}

/// [`w4a16_matvec`] with a named design. GPU designs take group-wise weights in the layout they
/// read, K and the group multiples of 32, and a batch of 1, 2, 4, 8 or 16; `cpu_w4a16` (the
/// `w4a16` kernel's arithmetic) takes any format and batch.
pub fn w4a16_matvec_with(dev: &Backend, variant: &str, w: &QuantTensor, x: &Tensor<f16>, y: &mut Tensor<f16>) -> Result<()> {
    let v = variant_for("W4A16 design", dev, variant, DType::F16, is_w4a16)?;
    check_placement("w4a16_matvec", dev, &[("w", w.placement()), ("x", x.placement()), ("y", y.placement())])?;
    let (n, k, batch) = (w.rows, w.cols, x.rows());
    if x.cols() != k || y.cols() != n || y.rows() != batch || batch == 0 {
        return Err(LabError::shape(
            "w4a16_matvec",
            format!("w is {n} x {k}, x {:?} and y {:?}: x must be (batch, {k}) and y (batch, {n}), batch at least 1", x.shape(), y.shape()),
        ));
    }
    match (v.config, dev) {
        (Kernel::CpuW4a16, _) => {
            let x = x.host().expect("placement checked");
            let out = match w.host().expect("placement checked") {
                Quantized::Group(g) => w4a16_cuda_cores(g, x, batch),
                // GGUF's 4-bit blocks are groups of 32 in another nibble order.
                Quantized::Blocks(b, blocks) => w4a16_cuda_cores(&GroupQuant::from_blocks(*b, blocks, n, k)?, x, batch),
            };
            y.host_mut().expect("placement checked").copy_from_slice(&out);
            Ok(())
        }
        (Kernel::W4(design), Backend::Cuda(gpu)) => {
            let Some((scheme, group)) = w.group() else {
                return Err(LabError::Invalid(format!("`{variant}` takes group-wise weights, not {} blocks (cpu_w4a16 takes any format)", w.format.name())));
            };
            if w.layout != design.layout {
                return Err(LabError::Invalid(format!(
                    "`{variant}` reads weights in the {} layout, w is in the {} layout (QuantTensor::quantize_in)",
                    design.layout.name(),
                    w.layout.name()
                )));
            }
            validate_w4a16(n, k, group, batch)?;
            launch_w4(gpu, v.name, design, w, scheme, group, x, y)
        }
        _ => unreachable!("check_runs keeps GPU variants off the CPU"),
    }
}

#[allow(clippy::too_many_arguments)]
fn launch_w4(gpu: &Gpu, name: &str, design: W4Design, w: &QuantTensor, scheme: Scheme, group: usize, x: &Tensor<f16>, y: &mut Tensor<f16>) -> Result<()> {
    let (n, k, batch) = (w.rows, w.cols, x.rows());
    let symbol = kernel_symbol(name, scheme, batch, w.format)?;
    let f = gpu.function(FAMILY, &symbol)?;
    let ((gx, gy), block, smem) = design.launch_shape(n, k, batch, scheme, gpu.info.sm_count as usize);
    let mut scratch = w.scratch.lock().expect("quant scratch poisoned");
    if !scratch.fitted.contains(&symbol) {
        // The rings' blocks per SM get the shared memory they need; the rest stays L1 for X and
        // the scales.
        crate::ops::gemm::fit_dynamic_smem(gpu, &f, smem, design.blocks_per_sm())?;
        scratch.fitted.insert(symbol);
    }
    if design.split_k() {
        let need = (gy * batch * n, n.div_ceil(design.rows));
        if scratch.splitk.as_ref().is_none_or(|(ws, done)| ws.len() < need.0 || done.len() < need.1) {
            let ws = gpu.stream.alloc_zeros::<f32>(need.0).doing("allocating the split-K workspace")?;
            let done = gpu.stream.alloc_zeros::<u32>(need.1).doing("allocating the split-K counters")?;
            scratch.splitk = Some((ws, done));
        }
    }
    let (codes, scales, mins) = w.cuda();
    let (dx, dy) = (x.cuda().expect("placement checked"), y.cuda_mut().expect("placement checked"));
    let (ni, ki, gi) = (n as i32, k as i32, group as i32);
    let cfg = LaunchConfig { grid_dim: (gx as u32, gy as u32, 1), block_dim: (block as u32, 1, 1), shared_mem_bytes: smem as u32 };
    let mut l = gpu.stream.launch_builder(&f);
    l.arg(codes).arg(scales.expect("group formats have scales"));
    if scheme == Scheme::Asym {
        l.arg(mins.expect("asymmetric formats have mins"));
    }
    l.arg(dx).arg(dy);
    if let (true, Some((ws, done))) = (design.split_k(), scratch.splitk.as_ref()) {
        l.arg(ws).arg(done);
    }
    // SAFETY: codes n*k/2 bytes, scales (mins) n*k/group halves (tiled: the padded tile layout,
    // in either order, ceil(n/16) tiles of ceil(k/128) 1 KB blocks and 16 x k/group scales; the
    // grid is one block per tile), X batch*k, Y batch*n halves (shapes checked); k and group are
    // multiples of 32 (validated); rows past n are never stored. Split-K: the workspace holds at
    // least grid.y x batch x n floats and the counters one per 16-row tile (grid.x), zeroed at
    // allocation and left zeroed by every launch. Rings and the pipelined design: the dynamic
    // shared memory is the ring's size, its limit raised above.
    unsafe { l.arg(&ni).arg(&ki).arg(&gi).launch(cfg) }.map(|_| ()).doing("launching w4a16")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quant::reference::check_w4a16;

    fn matrix(rows: usize, cols: usize) -> Tensor<f32> {
        Tensor::from_vec(&[rows, cols], (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 70.0).collect()).unwrap()
    }

    /// The CPU product (w4a16's f32 arithmetic) in every format against the f64 product of the
    /// dequantized weights: within the W4A16 bound and not the reference rounded. Row 5 with one
    /// nibble decoded with the other scheme's zero point, or one code word left out, fails the
    /// same check at row 5.
    #[test]
    fn the_cpu_matvec_meets_the_reference_and_a_planted_fault_fails_it() {
        use crate::ops::quant::models::{codes8, w4a16_cuda_cores_decoding};
        use crate::ops::quant::reference::{reference_magnitudes, reference_w4a16, w4a16_bound};
        let cpu = Backend::Cpu;
        let (n, k) = (37, 384);
        let mut rounded_reference = true;
        for format in crate::quant::Format::all() {
            let w = QuantTensor::quantize(&cpu, &matrix(n, k), format).unwrap();
            let q = w.host().unwrap();
            let (wd, mags) = (q.dequantize(), reference_magnitudes(q));
            let g = match q {
                Quantized::Group(g) => g.clone(),
                Quantized::Blocks(b, blocks) => GroupQuant::from_blocks(*b, blocks, n, k).unwrap(),
            };
            let bias = if g.scheme == Scheme::Sym { 8.0 } else { 0.0 };
            for batch in [1, 3, 8] {
                let x: Vec<f16> = (0..batch * k).map(|i| f16::from_f32((i % 13) as f32 / 4.3 - 1.5)).collect();
                let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
                let expected = reference_w4a16(&xf, &wd, batch, n, k);
                let scale = reference_w4a16(&xf.iter().map(|v| v.abs()).collect::<Vec<_>>(), &mags, batch, n, k);
                let xt = Tensor::from_vec(&[batch, k], x.clone()).unwrap();
                let mut y = Tensor::<f16>::zeros(&cpu, &[batch, n]).unwrap();
                w4a16_matvec(&cpu, &w, &xt, &mut y).unwrap();
                let got = y.to_vec().unwrap();
                let e = check_w4a16(&got, &expected, &scale, w4a16_bound(k));
                assert!(e.passed(), "{} batch {batch}: {e:?}", format.name());
                rounded_reference &= got.iter().zip(&expected).all(|(g, &e)| *g == f16::from_f64(e));
                type Decode<'a> = &'a (dyn Fn(usize, usize, u32) -> Option<[f32; 8]> + Sync);
                let faults: [(&str, Decode); 2] = [
                    ("nibble 2 of word 3 with the other zero point", &|r, w, bits| {
                        let mut v = codes8(bits, bias);
                        if (r, w) == (5, 3) {
                            v[2] = codes8(bits, 8.0 - bias)[2];
                        }
                        Some(v)
                    }),
                    ("word 7 left out", &|r, w, bits| ((r, w) != (5, 7)).then(|| codes8(bits, bias))),
                ];
                for (what, decode) in faults {
                    let e = check_w4a16(&w4a16_cuda_cores_decoding(&g, &x, batch, decode), &expected, &scale, w4a16_bound(k));
                    assert_eq!((e.passed(), e.worst_index.map(|i| i % n as u64)), (false, Some(5)), "{} batch {batch}, {what}: {e:?}", format.name());
                }
            }
        }
        assert!(!rounded_reference, "every output is the f64 reference rounded");
    }

    #[test]
    fn the_cpu_ops_round_trip_and_bad_input_is_named() {
        let cpu = Backend::Cpu;
        let codes = Tensor::from_vec(&[5], vec![1u8, 15, 0, 7, 9]).unwrap();
        let mut packed = Tensor::<u8>::zeros(&cpu, &[3]).unwrap();
        pack_int4(&cpu, &codes, &mut packed).unwrap();
        assert_eq!(packed.to_vec().unwrap(), vec![0xF1, 0x70, 0x09]);
        let mut back = Tensor::<u8>::zeros(&cpu, &[5]).unwrap();
        unpack_int4(&cpu, &packed, &mut back).unwrap();
        assert_eq!(back.to_vec().unwrap(), codes.to_vec().unwrap());
        let err = pack_int4(&cpu, &codes, &mut back).unwrap_err().to_string();
        assert!(err.contains("5 bytes in, 5 out: pack_int4 of these takes 5 and gives 3"), "{err}");
        let err = pack_int4_with(&cpu, "pack_int4", &codes, &mut packed).unwrap_err().to_string();
        assert!(err.contains("`pack_int4` needs gpu, not the CPU backend"), "{err}");

        let format = Format::Group { scheme: Scheme::Asym, group: 32 };
        let w = QuantTensor::quantize(&cpu, &matrix(4, 64), format).unwrap();
        let mut out = Tensor::<f32>::zeros(&cpu, &[4, 64]).unwrap();
        dequantize(&cpu, &w, &mut out).unwrap();
        assert_eq!(out.to_vec().unwrap(), w.host().unwrap().dequantize());
        let mut wrong = Tensor::<f32>::zeros(&cpu, &[64, 4]).unwrap();
        assert!(dequantize(&cpu, &w, &mut wrong).unwrap_err().to_string().contains("w is 4 x 64 but out is [64, 4]"));
        let mut bf = Tensor::<half::bf16>::zeros(&cpu, &[4, 64]).unwrap();
        assert!(dequantize(&cpu, &w, &mut bf).unwrap_err().to_string().contains("takes f32, f16, not bf16"));

        let x = Tensor::from_vec(&[2, 64], vec![f16::ONE; 128]).unwrap();
        let mut y = Tensor::<f16>::zeros(&cpu, &[2, 3]).unwrap();
        let err = w4a16_matvec(&cpu, &w, &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("w is 4 x 64, x [2, 64] and y [2, 3]"), "{err}");
        let mut y = Tensor::<f16>::zeros(&cpu, &[2, 4]).unwrap();
        let err = w4a16_matvec_with(&cpu, "w4a16_mma_pipelined", &w, &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("`w4a16_mma_pipelined` needs gpu, not the CPU backend"), "{err}");
        let err = w4a16_matvec_with(&cpu, "dequant", &w, &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("`dequant` is a quant variant but not a W4A16 design (one of: w4a16, w4a16_mma,"), "{err}");
        let err = w4a16_matvec_with(&cpu, "w4a16_mma_sym_b1", &w, &x, &mut y).unwrap_err().to_string();
        assert!(err.contains("`w4a16_mma_sym_b1` is not a quant variant"), "{err}");
        let err = QuantTensor::quantize_in(&cpu, &matrix(4, 64), format, Layout::Tiles).unwrap_err().to_string();
        assert!(err.contains("the tile layouts are for the GPU designs"), "{err}");
        assert!(QuantTensor::quantize(&cpu, &matrix(4, 60), format).is_err());
    }

    #[test]
    fn gguf_q4_1_bytes_become_asymmetric_groups_of_32_in_one_call() {
        let x: Vec<f32> = matrix(5, 64).to_vec().unwrap();
        let blocks = crate::quant::ggml::quantize(crate::quant::ggml::Block::Q4_1, &x).unwrap();
        let w = QuantTensor::from_gguf_q4_1(&Backend::Cpu, &blocks, 5, 64).unwrap();
        assert_eq!((w.format(), w.layout(), w.rows(), w.cols()), (Format::Group { scheme: Scheme::Asym, group: 32 }, Layout::Rows, 5, 64));
        assert_eq!(w.host().unwrap().dequantize(), crate::quant::ggml::dequantize(crate::quant::ggml::Block::Q4_1, &blocks).unwrap());
        assert!(QuantTensor::from_gguf_q4_1(&Backend::Cpu, &blocks, 64, 5).is_err());
        let q8 = Quantized::Blocks(crate::quant::ggml::Block::Q8_0, vec![0; 34]);
        assert!(QuantTensor::from_quantized(&Backend::Cpu, q8, (1, 32), Layout::Rows).unwrap_err().to_string().contains("Q8_0 blocks are a Q8Tensor"));
    }

    /// Each design's launch covers its rows: a grid of tiles over N, split-K slices that give a
    /// warp one load round, a persistent grid that holds every tile.
    #[test]
    fn launch_shapes_cover_every_row() {
        for (name, d) in variants::w4_designs() {
            for (n, k, batch) in [(37usize, 992usize, 1usize), (8192, 8192, 16), (576, 1536, 4), (11008, 4096, 8)] {
                for scheme in [Scheme::Sym, Scheme::Asym] {
                    let ((gx, gy), block, smem) = d.launch_shape(n, k, batch, scheme, 132);
                    assert_eq!(block, 32 * d.warps, "{name}");
                    let covered = if d.pipelined() { gx * n.div_ceil(16).div_ceil(gx) * 16 } else { gx * d.rows };
                    assert!(covered >= n && gy >= 1, "{name} N={n}");
                    // 4 blocks per SM (2 pipelined) fit in 227 KB of shared memory at batch 16.
                    assert!(d.blocks_per_sm() * (smem + 8 * 16 * 16 * 4) <= 227 * 1024, "{name} {scheme:?}: {smem} B");
                }
            }
        }
    }
}
