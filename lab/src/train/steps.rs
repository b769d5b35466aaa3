//! The parts of a training step that no op family has, each on the CPU and as a kernel of the
//! `train` family (kernels/train.cu): the embedding and its backward, RoPE over rows, SwiGLU,
//! the fused softmax cross-entropy, adding in place, the casts around the 16-bit attention, and
//! the optimizer's global norm and AdamW step. The CPU code is the reference the GPU path is
//! checked against (`train` experiment); both take and return tensors on their backend.

use crate::error::Doing;
use crate::experiment::Backend;
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::model::llama::cpu::{rope, silu};
use crate::model::llama::Config;
// 256-thread blocks over `len` elements, at most 8 per SM (the kernels stride over the rest).
use crate::ops::linear::elementwise as grid;
use super::optim::AdamStep;
use crate::tensor::Tensor;
use crate::{LabError, Result};
use cudarc::driver::{CudaFunction, CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};
use half::bf16;
use rayon::prelude::*;

pub const FAMILY: &str = "train";

/// The family's kernels (f32 only; symbols `train_<name>_f32`).
pub const KERNELS: [&str; 11] = ["embed", "embed_backward", "rope", "swiglu", "swiglu_backward", "cross_entropy", "add", "to_bf16", "from_bf16", "sum_squares", "adamw"];

fn kernel(gpu: &Gpu, name: &str) -> Result<CudaFunction> {
    debug_assert!(KERNELS.contains(&name), "{name} is not in train's KERNELS");
    gpu.function(FAMILY, &symbol(FAMILY, name, DType::F32))
}


fn host(t: &Tensor<f32>) -> &[f32] {
    t.host().expect("a CPU backend's tensor is on the host")
}

fn host_mut(t: &mut Tensor<f32>) -> &mut [f32] {
    t.host_mut().expect("a CPU backend's tensor is on the host")
}

fn dev_of(t: &Tensor<f32>) -> &CudaSlice<f32> {
    t.cuda().expect("a CUDA backend's tensor is on the device")
}

fn dev_mut(t: &mut Tensor<f32>) -> &mut CudaSlice<f32> {
    t.cuda_mut().expect("a CUDA backend's tensor is on the device")
}

/// Rows of `table` ([vocab, d]) at `tokens`: [tokens, d].
pub fn embed(dev: &Backend, table: &Tensor<f32>, tokens: &[u32], d: usize) -> Result<Tensor<f32>> {
    let n = tokens.len();
    match dev {
        Backend::Cpu => Tensor::from_vec(&[n, d], tokens.iter().flat_map(|&t| host(table)[t as usize * d..][..d].to_vec()).collect()),
        Backend::Cuda(gpu) => {
            let mut out = Tensor::zeros(dev, &[n, d])?;
            let ids = gpu.upload(tokens)?;
            let (nn, di) = (n as i64, d as i32);
            // SAFETY: ids holds n tokens < vocab (checked by the model), table vocab x d, out n x d.
            unsafe { gpu.stream.launch_builder(&kernel(gpu, "embed")?).arg(&ids).arg(dev_of(table)).arg(dev_mut(&mut out)).arg(&nn).arg(&di).launch(grid(gpu, n * d)) }
                .doing("launching train_embed")?;
            Ok(out)
        }
    }
}

/// Adds each row of `dx` ([tokens, d]) into the row of `de` ([vocab, d]) of its token. Per token
/// the rows are summed in position order and then added: the same on every run.
pub fn embed_backward(dev: &Backend, tokens: &[u32], dx: &Tensor<f32>, mut de: CudaOrHost) -> Result<()> {
    let d = dx.cols();
    let mut order: Vec<u32> = (0..tokens.len() as u32).collect();
    order.sort_by_key(|&i| (tokens[i as usize], i));
    let mut uniq: Vec<u32> = Vec::new();
    let mut starts: Vec<i32> = Vec::new();
    for (p, &i) in order.iter().enumerate() {
        if uniq.last() != Some(&tokens[i as usize]) {
            uniq.push(tokens[i as usize]);
            starts.push(p as i32);
        }
    }
    starts.push(order.len() as i32);
    match (dev, &mut de) {
        (Backend::Cpu, CudaOrHost::Host(de)) => {
            let dx = host(dx);
            for (b, &t) in uniq.iter().enumerate() {
                let mut s = vec![0f32; d];
                for &i in &order[starts[b] as usize..starts[b + 1] as usize] {
                    s.iter_mut().zip(&dx[i as usize * d..][..d]).for_each(|(s, v)| *s += v);
                }
                de[t as usize * d..][..d].iter_mut().zip(s).for_each(|(e, s)| *e += s);
            }
            Ok(())
        }
        (Backend::Cuda(gpu), CudaOrHost::Cuda(de)) => {
            if uniq.is_empty() {
                return Ok(());
            }
            let (order, starts, uniq_d) = (gpu.upload(&order)?, gpu.upload(&starts)?, gpu.upload(&uniq)?);
            let cfg = LaunchConfig { grid_dim: (uniq.len() as u32, 1, 1), block_dim: (d.clamp(32, 256).div_ceil(32) as u32 * 32, 1, 1), shared_mem_bytes: 0 };
            let di = d as i32;
            // SAFETY: starts has uniq + 1 entries into order (n positions < dx's rows); de holds vocab x d.
            unsafe { gpu.stream.launch_builder(&kernel(gpu, "embed_backward")?).arg(&order).arg(&starts).arg(&uniq_d).arg(dev_of(dx)).arg(de).arg(&di).launch(cfg) }
                .doing("launching train_embed_backward")?;
            Ok(())
        }
        _ => Err(LabError::Invalid("the embedding gradient is not on the backend's side".into())),
    }
}

/// A gradient span to add into: a host slice or a device view.
pub enum CudaOrHost<'a> {
    Host(&'a mut [f32]),
    Cuda(CudaViewMut<'a, f32>),
}

/// The RoPE table of `seq` positions: (cos, sin) of each pair's angle, computed in f64 as the
/// engine's CPU reference does.
pub fn rope_table(c: &Config, seq: usize) -> Vec<[f32; 2]> {
    (0..seq)
        .flat_map(|pos| {
            (0..c.rope_dims / 2).map(move |i| {
                let (s, co) = c.rope_angle(pos, i).sin_cos();
                [co as f32, s as f32]
            })
        })
        .collect()
}

/// RoPE on every row of `x` ([tokens, heads x head_dim]), row n at position n mod seq;
/// `inverse` turns the rotation back (its backward). `table` is [`rope_table`] on the device.
pub fn rope_rows(dev: &Backend, c: &Config, x: &mut Tensor<f32>, seq: usize, inverse: bool, table: Option<&CudaSlice<f32>>) -> Result<()> {
    let w = x.cols();
    match dev {
        Backend::Cpu => {
            host_mut(x).par_chunks_mut(w).enumerate().for_each(|(n, row)| rope(c, n % seq, row, inverse));
            Ok(())
        }
        Backend::Cuda(gpu) => {
            let table = table.ok_or_else(|| LabError::Invalid("RoPE on the GPU needs its angle table".into()))?;
            let (rows, heads, half) = (x.rows(), w / c.head_dim, c.rope_dims / 2);
            if half == 0 || rows == 0 {
                return Ok(());
            }
            if table.len() < seq * half * 2 {
                return Err(LabError::Invalid(format!("the RoPE table holds {} values; {seq} positions need {}", table.len(), seq * half * 2)));
            }
            let (ri, hi, hd, hf, sq, inv) = (rows as i64, heads as i32, c.head_dim as i32, half as i32, seq as i32, inverse as i32);
            // SAFETY: x is rows x heads*head_dim, table seq x half (cos, sin) pairs (checked).
            unsafe { gpu.stream.launch_builder(&kernel(gpu, "rope")?).arg(dev_mut(x)).arg(table).arg(&ri).arg(&hi).arg(&hd).arg(&hf).arg(&sq).arg(&inv).launch(grid(gpu, rows * heads * half)) }
                .doing("launching train_rope")
                .map(|_| ())
        }
    }
}

fn same_len(what: &str, a: &Tensor<f32>, b: &Tensor<f32>) -> Result<()> {
    if a.len() != b.len() {
        return Err(LabError::shape(what, format!("{:?} and {:?} differ in size", a.shape(), b.shape())));
    }
    Ok(())
}

/// a = silu(g) u.
pub fn swiglu(dev: &Backend, g: &Tensor<f32>, u: &Tensor<f32>) -> Result<Tensor<f32>> {
    same_len("swiglu", g, u)?;
    match dev {
        Backend::Cpu => Tensor::from_vec(g.shape(), host(g).par_iter().zip(host(u)).map(|(&g, &u)| (silu(g as f64) * u as f64) as f32).collect()),
        Backend::Cuda(gpu) => {
            let mut a = Tensor::zeros(dev, g.shape())?;
            let n = g.len() as i64;
            // SAFETY: g, u and a hold n elements.
            unsafe { gpu.stream.launch_builder(&kernel(gpu, "swiglu")?).arg(dev_of(g)).arg(dev_of(u)).arg(dev_mut(&mut a)).arg(&n).launch(grid(gpu, g.len())) }.doing("launching train_swiglu")?;
            Ok(a)
        }
    }
}

/// dG and dU of a = silu(g) u from dA.
pub fn swiglu_backward(dev: &Backend, da: &Tensor<f32>, g: &Tensor<f32>, u: &Tensor<f32>) -> Result<(Tensor<f32>, Tensor<f32>)> {
    same_len("swiglu backward", g, u)?;
    same_len("swiglu backward", g, da)?;
    match dev {
        Backend::Cpu => {
            let (dg, du): (Vec<f32>, Vec<f32>) = host(da)
                .par_iter()
                .zip(host(g).par_iter().zip(host(u)))
                .map(|(&da, (&gv, &uv))| {
                    let (gv, sig) = (gv as f64, 1.0 / (1.0 + (-gv as f64).exp()));
                    ((da as f64 * uv as f64 * sig * (1.0 + gv * (1.0 - sig))) as f32, (da as f64 * silu(gv)) as f32)
                })
                .unzip();
            Ok((Tensor::from_vec(g.shape(), dg)?, Tensor::from_vec(g.shape(), du)?))
        }
        Backend::Cuda(gpu) => {
            let (mut dg, mut du) = (Tensor::zeros(dev, g.shape())?, Tensor::zeros(dev, g.shape())?);
            let n = g.len() as i64;
            // SAFETY: every tensor holds n elements.
            unsafe {
                gpu.stream
                    .launch_builder(&kernel(gpu, "swiglu_backward")?)
                    .arg(dev_of(da))
                    .arg(dev_of(g))
                    .arg(dev_of(u))
                    .arg(dev_mut(&mut dg))
                    .arg(dev_mut(&mut du))
                    .arg(&n)
                    .launch(grid(gpu, g.len()))
            }
            .doing("launching train_swiglu_backward")?;
            Ok((dg, du))
        }
    }
}

/// A mean loss, or the row losses it is the mean of still on the device: read them only once
/// every GPU of a group has its work queued, and the GPUs run side by side.
pub enum Loss {
    Ready(f64),
    Pending { rows: CudaSlice<f64>, n: usize },
}

impl Loss {
    pub fn value(self, dev: &Backend) -> Result<f64> {
        match (self, dev) {
            (Loss::Ready(v), _) => Ok(v),
            (Loss::Pending { rows, n }, Backend::Cuda(gpu)) => Ok(gpu.stream.clone_dtoh(&rows).doing("reading the row losses")?[..n].iter().sum::<f64>() / n as f64),
            (Loss::Pending { .. }, Backend::Cpu) => Err(LabError::Invalid("a device loss read on the CPU backend".into())),
        }
    }
}

/// Mean over rows of -log softmax(logits)[target], and its gradient with respect to the logits;
/// each row's log-sum-exp in f64 (on the GPU: the max in f32, the sum of exponentials in f64).
pub fn cross_entropy(dev: &Backend, logits: &Tensor<f32>, targets: &[u32]) -> Result<(Loss, Tensor<f32>)> {
    let (n, vocab) = (logits.rows(), logits.cols());
    if targets.len() != n {
        return Err(LabError::shape("cross entropy", format!("{} targets for {n} rows of logits", targets.len())));
    }
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= vocab) {
        return Err(LabError::Invalid(format!("target {t} is outside the vocabulary of {vocab}")));
    }
    match dev {
        Backend::Cpu => {
            let mut grad = vec![0f32; logits.len()];
            let losses: Vec<f64> = grad
                .par_chunks_mut(vocab)
                .zip(host(logits).par_chunks(vocab).zip(targets))
                .map(|(g, (l, &t))| {
                    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
                    let lse = m + l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                    for (j, (g, &v)) in g.iter_mut().zip(l).enumerate() {
                        *g = (((v as f64 - lse).exp() - f64::from(j == t as usize)) / n as f64) as f32;
                    }
                    lse - l[t as usize] as f64
                })
                .collect();
            Ok((Loss::Ready(losses.iter().sum::<f64>() / n as f64), Tensor::from_vec(logits.shape(), grad)?))
        }
        Backend::Cuda(gpu) => {
            let mut dl = Tensor::zeros(dev, logits.shape())?;
            let mut loss = gpu.stream.alloc_zeros::<f64>(n.max(1)).doing("allocating the row losses")?;
            let ids = gpu.upload(targets)?;
            let (vi, inv) = (vocab as i32, 1.0f32 / n as f32);
            let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
            if n > 0 {
                // SAFETY: logits and dl are n x vocab, ids n targets < vocab (checked), loss n values.
                unsafe { gpu.stream.launch_builder(&kernel(gpu, "cross_entropy")?).arg(dev_of(logits)).arg(&ids).arg(dev_mut(&mut dl)).arg(&mut loss).arg(&vi).arg(&inv).launch(cfg) }
                    .doing("launching train_cross_entropy")?;
            }
            Ok((Loss::Pending { rows: loss, n }, dl))
        }
    }
}

/// y += x.
pub fn add(dev: &Backend, y: &mut Tensor<f32>, x: &Tensor<f32>) -> Result<()> {
    same_len("add", y, x)?;
    match dev {
        Backend::Cpu => {
            host_mut(y).iter_mut().zip(host(x)).for_each(|(a, b)| *a += b);
            Ok(())
        }
        Backend::Cuda(gpu) => add_view(gpu, &mut dev_mut(y).as_view_mut(), &dev_of(x).as_view()),
    }
}

/// y += x over device views of the same length.
pub fn add_view(gpu: &Gpu, y: &mut CudaViewMut<f32>, x: &CudaView<f32>) -> Result<()> {
    if y.len() != x.len() {
        return Err(LabError::shape("add", format!("views of {} and {} elements", y.len(), x.len())));
    }
    let n = x.len() as i64;
    // SAFETY: both views hold n elements.
    unsafe { gpu.stream.launch_builder(&kernel(gpu, "add")?).arg(y).arg(x).arg(&n).launch(grid(gpu, x.len())) }.doing("launching train_add").map(|_| ())
}

/// A bf16 copy of `x` (rounded to nearest even).
pub fn to_bf16(dev: &Backend, x: &Tensor<f32>) -> Result<Tensor<bf16>> {
    match dev {
        Backend::Cpu => Tensor::from_vec(x.shape(), host(x).iter().map(|&v| bf16::from_f32(v)).collect()),
        Backend::Cuda(gpu) => {
            let mut y = Tensor::<bf16>::zeros(dev, x.shape())?;
            let n = x.len() as i64;
            // SAFETY: x and y hold n elements.
            unsafe { gpu.stream.launch_builder(&kernel(gpu, "to_bf16")?).arg(dev_of(x)).arg(y.cuda_mut().expect("on the device")).arg(&n).launch(grid(gpu, x.len())) }
                .doing("launching train_to_bf16")?;
            Ok(y)
        }
    }
}

/// An f32 copy of `x`.
pub fn from_bf16(dev: &Backend, x: &Tensor<bf16>) -> Result<Tensor<f32>> {
    match dev {
        Backend::Cpu => Tensor::from_vec(x.shape(), x.host().expect("on the host").iter().map(|v| v.to_f32()).collect()),
        Backend::Cuda(gpu) => {
            let mut y = Tensor::zeros(dev, x.shape())?;
            let n = x.len() as i64;
            // SAFETY: x and y hold n elements.
            unsafe { gpu.stream.launch_builder(&kernel(gpu, "from_bf16")?).arg(x.cuda().expect("on the device")).arg(dev_mut(&mut y)).arg(&n).launch(grid(gpu, x.len())) }
                .doing("launching train_from_bf16")?;
            Ok(y)
        }
    }
}

/// The sum of squares of a device buffer in f64: block partials summed on the host in order.
pub fn sum_squares(gpu: &Gpu, x: &CudaSlice<f32>) -> Result<f64> {
    let cfg = grid(gpu, x.len());
    let mut partial = gpu.stream.alloc_zeros::<f64>(cfg.grid_dim.0 as usize).doing("allocating the norm's partials")?;
    let n = x.len() as i64;
    // SAFETY: x holds n elements, partial one value per block.
    unsafe { gpu.stream.launch_builder(&kernel(gpu, "sum_squares")?).arg(x).arg(&n).arg(&mut partial).launch(cfg) }.doing("launching train_sum_squares")?;
    Ok(gpu.stream.clone_dtoh(&partial).doing("reading the norm's partials")?.iter().sum())
}

/// The flat device buffers of a model being trained: weights, gradients, moments, decay mask.
pub struct DeviceState {
    pub params: CudaSlice<f32>,
    pub grads: CudaSlice<f32>,
    pub m: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    pub decay: CudaSlice<u8>,
}

/// One AdamW step over the whole buffer.
pub fn adamw(gpu: &Gpu, s: &mut DeviceState, a: &AdamStep) -> Result<()> {
    let n = s.params.len() as i64;
    let cfg = grid(gpu, s.params.len());
    // SAFETY: the five buffers hold n elements each (DeviceState is built from one layout).
    unsafe {
        gpu.stream
            .launch_builder(&kernel(gpu, "adamw")?)
            .arg(&mut s.params)
            .arg(&s.grads)
            .arg(&mut s.m)
            .arg(&mut s.v)
            .arg(&s.decay)
            .arg(&n)
            .arg(&a.lr)
            .arg(&a.weight_decay)
            .arg(&a.beta1)
            .arg(&a.beta2)
            .arg(&a.eps)
            .arg(&a.step_size)
            .arg(&a.bc2_sqrt)
            .arg(&a.clip)
            .launch(cfg)
    }
    .doing("launching train_adamw")
    .map(|_| ())
}
