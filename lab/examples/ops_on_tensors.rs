//! Four of the lab's kernels called on tensors this program makes: softmax, RMSNorm, a GEMM and a
//! W4A16 product, each checked element by element against its f64 reference.
//!
//! `cargo run --release --example ops_on_tensors -- [auto|cuda|cpu]` (default auto: the GPU when
//! one is usable). Exits non-zero when any result is off.

use half::f16;
use lab::ops::compare::compare_elems;
use lab::ops::quant::{Format, QuantTensor, Scheme};
use lab::ops::widen;
use lab::prelude::*;
use lab::record::{ErrorStats, Tolerance};

/// A deterministic spread of values in [-2, 2): no random crate needed to read this example.
fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + salt * 104_729) % 4001) as f32 / 1000.0 - 2.0).collect()
}

fn report(what: &str, e: ErrorStats) -> bool {
    println!("{what:<44} max abs error {:.2e}, {} element(s) out of tolerance", e.max_abs, e.mismatches);
    e.passed()
}

fn main() -> lab::Result<()> {
    let choice = match std::env::args().nth(1).as_deref() {
        None | Some("auto") => BackendChoice::Auto,
        Some("cuda") => BackendChoice::Cuda,
        Some("cpu") => BackendChoice::Cpu,
        Some(other) => return Err(LabError::Invalid(format!("unknown backend `{other}` (auto, cuda, cpu)"))),
    };
    let dev = choice.open()?;
    println!("backend: {}", dev.name());
    let mut ok = true;

    // Softmax over rows of an odd width, one row fully masked.
    let (rows, cols) = (5, 1001);
    let mut xs = values(rows * cols, 1);
    xs[..cols].fill(f32::NEG_INFINITY);
    let x = Tensor::from_slice(&dev, &[rows, cols], &xs)?;
    let mut y = Tensor::<f32>::zeros(&dev, &[rows, cols])?;
    softmax::forward(&dev, &x, &mut y)?;
    let e = compare_elems(&y.to_vec()?, &softmax::reference(&widen(&xs), cols), softmax::tolerance(DType::F32, cols), "cpu-f64");
    ok &= report(&format!("softmax {rows} x {cols} ({})", softmax::best(&dev, DType::F32, cols).name), e);

    // RMSNorm with a learned scale.
    let gs: Vec<f32> = values(cols, 2).iter().map(|v| 1.0 + 0.1 * v).collect();
    let g = Tensor::from_slice(&dev, &[cols], &gs)?;
    let xs = values(rows * cols, 3);
    let x = Tensor::from_slice(&dev, &[rows, cols], &xs)?;
    rmsnorm::forward(&dev, &x, &g, &mut y, 1e-5)?;
    let e = compare_elems(&y.to_vec()?, &rmsnorm::reference(&widen(&xs), &widen(&gs), 1e-5), lab::ops::layernorm::tolerance(DType::F32), "cpu-f64");
    ok &= report(&format!("rmsnorm {rows} x {cols}"), e);

    // C = A B in f16, odd M, N and K (the GPU picks its rung from the shape).
    let (m, n, k) = (37, 72, 136);
    let (a16, b16): (Vec<f16>, Vec<f16>) = (values(m * k, 4).iter().map(|&v| f16::from_f32(v)).collect(), values(k * n, 5).iter().map(|&v| f16::from_f32(v)).collect());
    let (a, b) = (Tensor::from_slice(&dev, &[m, k], &a16)?, Tensor::from_slice(&dev, &[k, n], &b16)?);
    let mut c = Tensor::<f16>::zeros(&dev, &[m, n])?;
    gemm::matmul(&dev, &a, &b, &mut c)?;
    let expected = gemm::reference(&a16, &b16, None, gemm::Dims::dense(m, n, k), (1.0, 0.0));
    // fp32 accumulation, one f16 rounding of the result: half an ulp of f16 plus a little.
    let e = compare_elems(&c.to_vec()?, &expected, Tolerance { atol: 1e-3, rtol: 2f64.powi(-10) }, "cpu-f64");
    ok &= report(&format!("gemm f16 {m} x {n} x {k}"), e);

    // y = x W^T with W quantized to 4 bits (asymmetric, groups of 128) and a batch of 2.
    let (out, inner, batch) = (96, 512, 2);
    let (ws, format) = (values(out * inner, 6), Format::Group { scheme: Scheme::Asym, group: 128 });
    let w_host = Tensor::from_slice(&Backend::Cpu, &[out, inner], &ws)?;
    let w = QuantTensor::quantize(&dev, &w_host, format)?;
    let xs: Vec<f16> = values(batch * inner, 7).iter().map(|&v| f16::from_f32(v)).collect();
    let x = Tensor::from_slice(&dev, &[batch, inner], &xs)?;
    let mut yq = Tensor::<f16>::zeros(&dev, &[batch, out])?;
    quant::w4a16_matvec(&dev, &w, &x, &mut yq)?;
    // The reference multiplies by what the 4-bit matrix holds: the same quantizer's output
    // (it runs on the host for every backend), dequantized on the CPU.
    let mut wf = Tensor::<f32>::zeros(&Backend::Cpu, &[out, inner])?;
    quant::dequantize(&Backend::Cpu, &QuantTensor::quantize(&Backend::Cpu, &w_host, format)?, &mut wf)?;
    let wd = widen(&wf.to_vec()?);
    let expected: Vec<f64> = (0..batch).flat_map(|r| (0..out).map(move |o| (r, o))).map(|(r, o)| (0..inner).map(|i| xs[r * inner + i].to_f64() * wd[o * inner + i]).sum()).collect();
    let e = compare_elems(&yq.to_vec()?, &expected, Tolerance { atol: 1e-2, rtol: 2f64.powi(-9) }, "cpu-f64");
    ok &= report(&format!("w4a16 {batch} x {inner} -> {out} (asym, g128)"), e);

    if ok { Ok(()) } else { Err(LabError::Invalid("a result is out of tolerance".into())) }
}
