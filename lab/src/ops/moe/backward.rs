//! The layer's backward on tensors: dJ/d(x, router, noise projection, gate_up, down) for
//! J = sum(dout * out) + d_aux aux_loss + d_z z_loss, with top-k selection and capacity held
//! fixed (`backward_reference` derives the math in f64 and is what this is checked against).
//!
//! The forward is run again, keeping what the backward reads (routing, permutation, the
//! permuted rows, the gate/up pre-activations, the activations and each assignment's expert
//! output), then, on either backend and without a host synchronisation on the GPU:
//! 1. combine: dy[slot(t, j)] = w_tj dout_t, dJ/dw_tj = dout_t . y[slot(t, j)];
//! 2. down: d act = dy down_e^T (grouped product over down transposed), d down_e = act_e^T dy_e;
//! 3. SwiGLU: d(gate, up) from the pre-activations;
//! 4. gate/up: d xp = d pre gate_up_e^T, d gate_up_e = xp_e^T d pre_e; dx = sum over a token's
//!    kept assignments of d xp (the combine kernel without weights);
//! 5. router: d logits (and d noise logits) per token, d router = x^T d logits,
//!    dx += d logits router^T (and the same for the noise projection).
//!
//! Gradients are stored in the inputs' type, their sums taken in f32.

use super::{cpu, gpu, grouped_matmul_with, layer_dims, permute, route_logits, router_logits, Epilogue, Permutation, Routing, Weights, FAMILY};
use crate::experiment::Backend;
use crate::ops::gemm;
use crate::ops::Elem;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};

/// dJ for each of the layer's inputs, in the shapes of x and [`Weights`].
pub struct Grads<T: Elem> {
    pub x: Tensor<T>,
    pub router: Tensor<T>,
    pub noise: Option<Tensor<T>>,
    pub gate_up: Tensor<T>,
    pub down: Tensor<T>,
}

/// The upstream gradient: dout [T, H] and the objective's weights on the two router losses.
pub struct Upstream<'a, T: Elem> {
    pub dout: &'a Tensor<T>,
    pub d_aux: f32,
    pub d_z: f32,
}

/// The layer's gradients with the best rung for the backend; returns the routing too.
pub fn backward<T: Elem>(dev: &Backend, x: &Tensor<T>, w: &Weights<T>, r: &super::Router, up: &Upstream<T>) -> Result<(Routing, Grads<T>)> {
    backward_with(dev, super::best(dev).name, x, w, r, up)
}

/// [`backward`] with the grouped products (the forward again and the two data gradients) on
/// rung `variant`; the weight gradients are grouped_wgrad's whatever the rung.
pub fn backward_with<T: Elem>(dev: &Backend, variant: &str, x: &Tensor<T>, w: &Weights<T>, r: &super::Router, up: &Upstream<T>) -> Result<(Routing, Grads<T>)> {
    let (t, h, e, i) = layer_dims(x, w)?;
    if up.dout.shape() != [t, h] {
        return Err(LabError::shape(FAMILY, format!("dout is {:?}; it must be the output's shape [{t}, {h}]", up.dout.shape())));
    }
    if !(up.d_aux.is_finite() && up.d_z.is_finite()) {
        return Err(LabError::Invalid(format!("moe backward: the losses' upstream gradients {} and {} must be finite", up.d_aux, up.d_z)));
    }
    check_placement(FAMILY, dev, &[("x", x.placement()), ("dout", up.dout.placement()), ("gate_up", w.gate_up.placement()), ("down", w.down.placement())])?;
    let k = r.k;
    let rows = t * k;
    // The forward again, keeping its intermediates.
    let (logits, noisy) = router_logits(dev, x, w, r)?;
    let rt = route_logits(dev, &logits, noisy.as_ref().map(|(n, eps)| (n, eps)), r)?;
    let (perm, xp) = permute(dev, x, &rt, r.capacity)?;
    let mut pre = Tensor::<T>::zeros(dev, &[rows, 2 * i])?;
    grouped_matmul_with(dev, variant, &xp, &w.gate_up, &perm.offsets, Epilogue::Store, &mut pre)?;
    let act = swiglu(dev, &pre, &perm.offsets, e, i)?;
    let mut y = Tensor::<T>::zeros(dev, &[rows, h])?;
    grouped_matmul_with(dev, variant, &act, &w.down, &perm.offsets, Epilogue::Store, &mut y)?;

    // 1. the combine.
    let (dw, dy) = combine_backward(dev, up.dout, &y, &perm.slot, &rt.weights)?;
    drop(y);
    // 2. the down projection.
    let mut dact = Tensor::<T>::zeros(dev, &[rows, i])?;
    grouped_matmul_with(dev, variant, &dy, &transpose(dev, &w.down, e)?, &perm.offsets, Epilogue::Store, &mut dact)?;
    let d_down = grouped_wgrad(dev, &act, &dy, &perm.offsets, e)?;
    drop((act, dy));
    // 3. SwiGLU, 4. the gate/up projection.
    let dpre = swiglu_backward(dev, &pre, &dact, &perm.offsets, e)?;
    drop((pre, dact));
    let mut dxp = Tensor::<T>::zeros(dev, &[rows, h])?;
    grouped_matmul_with(dev, variant, &dpre, &transpose(dev, &w.gate_up, e)?, &perm.offsets, Epilogue::Store, &mut dxp)?;
    let d_gate_up = grouped_wgrad(dev, &xp, &dpre, &perm.offsets, e)?;
    let mut dx = Tensor::<T>::zeros(dev, &[t, h])?;
    sum_rows(dev, &dxp, &perm, &mut dx)?;
    // 5. the router.
    let (dlogits, dnoise) = route_backward(dev, &logits, noisy.as_ref(), &rt, &dw, r, up)?;
    let xt = transpose(dev, x, 1)?;
    let project = |d: &Tensor<T>, wt: &Tensor<T>, dx: &mut Tensor<T>| -> Result<Tensor<T>> {
        let mut dwt = Tensor::<T>::zeros(dev, &[h, e])?;
        gemm::matmul(dev, &xt, d, &mut dwt)?;
        let v = gemm::best(dev, T::DTYPE, gemm::Dims::dense(t, h, e)).name;
        gemm::gemm(dev, v, 1.0, d, &transpose(dev, wt, 1)?, 1.0, dx)?;
        Ok(dwt)
    };
    let d_router = project(&dlogits, &w.router, &mut dx)?;
    let d_noise = match (dnoise, &w.noise) {
        (Some(dn), Some(wn)) => Some(project(&dn, wn, &mut dx)?),
        _ => None,
    };
    Ok((rt, Grads { x: dx, router: d_router, noise: d_noise, gate_up: d_gate_up, down: d_down }))
}

fn host<U: crate::tensor::Scalar>(t: &Tensor<U>) -> &[U] {
    t.host().expect("placement checked")
}

/// [B, R, C] (or [R, C] with `batch` 1) to [B, C, R].
fn transpose<T: Elem>(dev: &Backend, a: &Tensor<T>, batch: usize) -> Result<Tensor<T>> {
    let s = a.shape();
    let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
    let shape: Vec<usize> = s[..s.len() - 2].iter().copied().chain([c, r]).collect();
    match dev {
        Backend::Cpu => Tensor::from_vec(&shape, host(a).chunks(r * c).flat_map(|m| crate::ops::linear::transpose(m, r, c)).collect()),
        Backend::Cuda(g) => Tensor::from_cuda(&shape, gpu::transpose(g, a, (batch, r, c))?),
    }
}

/// The SwiGLU activations of the live rows from interleaved pre-activations [rows, 2I].
fn swiglu<T: Elem>(dev: &Backend, pre: &Tensor<T>, offsets: &Tensor<i32>, e: usize, i: usize) -> Result<Tensor<T>> {
    let rows = pre.rows();
    match dev {
        Backend::Cpu => {
            let live = host(offsets)[e].max(0) as usize;
            let mut act = vec![T::from_f32(0.0); rows * i];
            for (a, p) in act.chunks_mut(i).zip(host(pre).chunks(2 * i)).take(live) {
                a.iter_mut().zip(p.chunks(2)).for_each(|(a, p)| *a = T::from_f32(cpu::swiglu(p[0].to_f32(), p[1].to_f32())));
            }
            Tensor::from_vec(&[rows, i], act)
        }
        Backend::Cuda(g) => Tensor::from_cuda(&[rows, i], gpu::swiglu(g, pre, offsets, (e, i))?),
    }
}

/// dx [T, H]: each token's kept rows of d xp summed (the combine with weights 1).
fn sum_rows<T: Elem>(dev: &Backend, dxp: &Tensor<T>, perm: &Permutation, dx: &mut Tensor<T>) -> Result<()> {
    match dev {
        Backend::Cpu => {
            let ones = vec![1f32; perm.slot.len()];
            cpu::combine(host(dxp), host(&perm.slot), &ones, perm.slot.cols(), dxp.cols(), dx.host_mut().expect("placement checked"));
            Ok(())
        }
        Backend::Cuda(g) => gpu::combine(g, dxp, perm, None, dx),
    }
}

/// (dJ/dw [T, k] in f32, dy [T k, H]).
fn combine_backward<T: Elem>(dev: &Backend, dout: &Tensor<T>, y: &Tensor<T>, slot: &Tensor<i32>, weights: &Tensor<f32>) -> Result<(Tensor<f32>, Tensor<T>)> {
    let (t, k, h) = (slot.rows(), slot.cols(), y.cols());
    match dev {
        Backend::Cpu => {
            let (dw, dy) = cpu::combine_backward(host(dout), host(y), host(slot), host(weights), k, h);
            Ok((Tensor::from_vec(&[t, k], dw)?, Tensor::from_vec(&[t * k, h], dy)?))
        }
        Backend::Cuda(g) => {
            let (dw, dy) = gpu::combine_backward(g, dout, y, slot, weights)?;
            Ok((Tensor::from_cuda(&[t, k], dw)?, Tensor::from_cuda(&[t * k, h], dy)?))
        }
    }
}

/// d pre [rows, 2I] (gate and up interleaved) from the pre-activations and d act [rows, I].
fn swiglu_backward<T: Elem>(dev: &Backend, pre: &Tensor<T>, dact: &Tensor<T>, offsets: &Tensor<i32>, e: usize) -> Result<Tensor<T>> {
    let shape = pre.shape().to_vec();
    match dev {
        Backend::Cpu => Tensor::from_vec(&shape, cpu::swiglu_backward(host(pre), host(dact), host(offsets)[e].max(0) as usize, dact.cols())),
        Backend::Cuda(g) => Tensor::from_cuda(&shape, gpu::swiglu_backward(g, pre, dact, offsets, e)?),
    }
}

/// W[e] = A[segment e]^T B[segment e], [E, A's width, B's width].
fn grouped_wgrad<T: Elem>(dev: &Backend, a: &Tensor<T>, b: &Tensor<T>, offsets: &Tensor<i32>, e: usize) -> Result<Tensor<T>> {
    let (k, n) = (a.cols(), b.cols());
    match dev {
        Backend::Cpu => Tensor::from_vec(&[e, k, n], cpu::grouped_wgrad(host(a), host(b), host(offsets), (e, a.rows(), k, n))),
        Backend::Cuda(g) => Tensor::from_cuda(&[e, k, n], gpu::grouped_wgrad(g, a, b, offsets, (e, a.rows(), k, n))?),
    }
}

/// (d logits, d noise logits) [T, E].
fn route_backward<T: Elem>(
    dev: &Backend,
    logits: &Tensor<T>,
    noisy: Option<&super::NoisyLogits<T>>,
    rt: &Routing,
    dw: &Tensor<f32>,
    r: &super::Router,
    up: &Upstream<T>,
) -> Result<(Tensor<T>, Option<Tensor<T>>)> {
    let (t, e) = (logits.rows(), logits.cols());
    // The constant factors of the two losses' gradients.
    let aux_c = up.d_aux * r.aux_alpha as f32 * e as f32 / t as f32;
    let z_c = 2.0 * up.d_z / t as f32;
    match dev {
        Backend::Cpu => {
            let noise = noisy.map(|(n, eps)| (host(n), host(eps)));
            let (dl, dn) = cpu::route_backward(host(logits), noise, (host(&rt.experts), host(dw), host(&rt.load)), (t, e), r, (aux_c, z_c));
            Ok((Tensor::from_vec(&[t, e], dl)?, dn.map(|d| Tensor::from_vec(&[t, e], d)).transpose()?))
        }
        Backend::Cuda(g) => {
            let (dl, dn) = gpu::route_backward(g, logits, noisy, (&rt.experts, dw, &rt.load), (t, e), r, (aux_c, z_c))?;
            Ok((Tensor::from_cuda(&[t, e], dl)?, dn.map(|d| Tensor::from_cuda(&[t, e], d)).transpose()?))
        }
    }
}
