//! `bias_gelu`: y = GeLU(x + b), b broadcast over rows, in f32, f16 and bf16
//! (kernels/bias_gelu.cu). Eager frameworks run it as two kernels with an HBM round trip of
//! x + b (5 tensor-sized transfers: read x, write t, read t, write y, plus the bias); fused it
//! is one read and one write, so the fused kernel should be ~2x the unfused and ~2x torch eager.

use super::compare::compare_elems;
use super::variant::{self, Requires, Variant, VariantInfo};
use super::{measure_op, measure_torch, widen, Check, Elem};
use crate::error::Doing;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Peer, Session};
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::profile::Work;
use crate::record::Tolerance;
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde_json::{json, Value};

pub struct BiasGelu;

const FAMILY: &str = "bias_gelu";

/// The two GeLU forms: the tanh approximation (GPT-2, BERT) and the exact erf form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Approx {
    Tanh,
    Erf,
}

impl Approx {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "tanh" => Ok(Approx::Tanh),
            "erf" => Ok(Approx::Erf),
            _ => Err(LabError::Invalid(format!("unknown GeLU approximation `{s}` (tanh, erf)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Approx::Tanh => "tanh",
            Approx::Erf => "erf",
        }
    }
    /// torch's `approximate=` argument.
    fn torch_name(self) -> &'static str {
        match self {
            Approx::Tanh => "tanh",
            Approx::Erf => "none",
        }
    }
}

/// GeLU in f64: the reference.
pub fn gelu(v: f64, approx: Approx) -> f64 {
    match approx {
        Approx::Tanh => 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh()),
        // libm's erf (the musl port) is accurate to an ulp; statrs' is off by ~1e-11.
        Approx::Erf => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
    }
}

/// Checks the shapes a caller gives: x is rows x cols, b has cols entries, nothing is empty.
pub fn validate(x_len: usize, b_len: usize, rows: usize, cols: usize) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(LabError::shape("bias_gelu", format!("{rows} x {cols}: rows and cols must be at least 1")));
    }
    if x_len != rows * cols {
        return Err(LabError::shape("bias_gelu", format!("x has {x_len} elements, not {rows} x {cols}")));
    }
    if b_len != cols {
        return Err(LabError::shape("bias_gelu", format!("bias has {b_len} elements; rows are {cols} wide")));
    }
    Ok(())
}

pub fn reference(x: &[f64], b: &[f64], approx: Approx) -> Vec<f64> {
    let cols = b.len();
    x.par_iter().enumerate().map(|(i, &v)| gelu(v + b[i % cols], approx)).collect()
}

/// The tanh form's constants in f32, as kernels/common.cuh spells them: sqrt(2 / pi) and the cubic's.
pub const GELU_C: f32 = 0.797_884_6;
pub const GELU_A: f32 = 0.044715;

/// GeLU in f32 as the kernels write it (kernels/common.cuh `gelu_tanh`, `gelu_erf`: the same
/// constants, h (1 + t) as h t + h), with libm's tanhf and erff: what the CPU variants compute,
/// checked against [`gelu`] like any variant.
pub fn gelu_f32(v: f32, approx: Approx) -> f32 {
    let h = 0.5 * v;
    let t = match approx {
        Approx::Tanh => libm::tanhf(v * (v * v * (GELU_C * GELU_A) + GELU_C)),
        Approx::Erf => libm::erff(v * std::f32::consts::FRAC_1_SQRT_2),
    };
    h * t + h
}

/// The CPU backend's variant: fused, x + b and GeLU in f32 ([`gelu_f32`]), rows in parallel.
pub fn cpu_fused_rows<T: Elem>(x: &[T], b: &[T], y: &mut [T], approx: Approx) {
    let cols = b.len();
    y.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(y, x)| {
        for ((y, x), b) in y.iter_mut().zip(x).zip(b) {
            *y = T::from_f32(gelu_f32(x.to_f32() + b.to_f32(), approx));
        }
    });
}

pub fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance { atol: 1e-6, rtol: 1e-5 },
        // Output rounding, plus one rounding of x + b to the storage type, which the unfused
        // variant and every eager framework make: near v = -2 GeLU's relative sensitivity is
        // ~3.7, so that rounding costs ~4 ulp of the output. The fused kernel needs far less.
        DType::F16 => Tolerance { atol: 1e-4, rtol: 2f64.powi(-9) },
        DType::Bf16 => Tolerance { atol: 2e-4, rtol: 2f64.powi(-6) },
    }
}

/// How a variant runs.
#[derive(Clone, Copy, Debug)]
pub enum Gelu {
    /// x + b into a scratch tensor, then GeLU of it: two kernels, as eager frameworks run it.
    Unfused,
    /// One kernel; `sigmoid`: the tanh form as v / (1 + e^(-2u)) (tanh approximation only);
    /// `one_pass`: one loop trip per thread instead of a grid-stride loop.
    Fused { sigmoid: bool, one_pass: bool },
    /// [`cpu_fused_rows`].
    Cpu,
}

const ALL: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

/// The variants, in order: the only place a bias_gelu variant is named.
pub const VARIANTS: &[Variant<Gelu>] = &[
    Variant { name: "unfused", dtypes: ALL, requires: Requires::Gpu, what: "two kernels with an HBM round trip of x + b", config: Gelu::Unfused },
    Variant {
        name: "fused",
        dtypes: ALL,
        requires: Requires::Gpu,
        what: "one kernel: read x, write y; a grid-stride loop over a few blocks per SM",
        config: Gelu::Fused { sigmoid: false, one_pass: false },
    },
    Variant {
        name: "fused_one_pass",
        dtypes: ALL,
        requires: Requires::Gpu,
        what: "fused, with enough blocks for one loop trip per thread (as a Triton kernel tiles)",
        config: Gelu::Fused { sigmoid: false, one_pass: true },
    },
    Variant {
        name: "fused_sigmoid",
        dtypes: ALL,
        requires: Requires::Gpu,
        what: "fused, the tanh form as one exponential and a division (tanh approximation only)",
        config: Gelu::Fused { sigmoid: true, one_pass: false },
    },
    Variant {
        name: "fused_sigmoid_one_pass",
        dtypes: ALL,
        requires: Requires::Gpu,
        what: "fused_sigmoid with one loop trip per thread",
        config: Gelu::Fused { sigmoid: true, one_pass: true },
    },
    Variant { name: "cpu_fused_rows", dtypes: ALL, requires: Requires::Cpu, what: "fused, x + b and GeLU in f32 as the kernels write it, rows in parallel", config: Gelu::Cpu },
];

pub fn variants() -> Vec<VariantInfo> {
    variant::infos(VARIANTS)
}

/// Does `v` compute this form of GeLU? (The sigmoid rewrite is an identity of tanh's only.)
pub fn takes(v: &Variant<Gelu>, approx: Approx) -> bool {
    !matches!(v.config, Gelu::Fused { sigmoid: true, .. }) || approx == Approx::Tanh
}

/// y = GeLU(x + b), b broadcast over the rows of x, with the fastest variant measured on an H100
/// (fused_one_pass; cpu_fused_rows on the CPU).
pub fn forward<T: Elem>(dev: &Backend, x: &Tensor<T>, b: &Tensor<T>, y: &mut Tensor<T>, approx: Approx) -> Result<()> {
    forward_with(dev, if matches!(dev, Backend::Cpu) { "cpu_fused_rows" } else { "fused_one_pass" }, x, b, y, approx, None)
}

/// [`forward`] with the named variant. `unfused` writes x + b to `scratch` (x's shape), or to a
/// tensor it allocates when none is given.
pub fn forward_with<T: Elem>(
    dev: &Backend,
    variant: &str,
    x: &Tensor<T>,
    b: &Tensor<T>,
    y: &mut Tensor<T>,
    approx: Approx,
    scratch: Option<&mut Tensor<T>>,
) -> Result<()> {
    let v = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, v, dev, T::DTYPE)?;
    check_placement(FAMILY, dev, &[("x", x.placement()), ("b", b.placement()), ("y", y.placement())])?;
    if x.shape() != y.shape() {
        return Err(LabError::shape(FAMILY, format!("x is {:?} but y is {:?}", x.shape(), y.shape())));
    }
    let (rows, cols) = (x.rows(), x.cols());
    validate(x.len(), b.len(), rows, cols)?;
    if !takes(v, approx) {
        return Err(LabError::Invalid(format!("`{variant}` computes the tanh approximation only, not {}", approx.name())));
    }
    let gpu = match (v.config, dev) {
        (Gelu::Cpu, _) => {
            cpu_fused_rows(x.host().expect("placement checked"), b.host().expect("placement checked"), y.host_mut().expect("placement checked"), approx);
            return Ok(());
        }
        (_, Backend::Cuda(gpu)) => gpu,
        (_, Backend::Cpu) => unreachable!("check_runs keeps GPU variants off the CPU"),
    };
    let (r, c, n) = (rows as i64, cols as i32, x.len() as i64);
    let (dx, db) = (x.cuda().expect("placement checked"), b.cuda().expect("placement checked"));
    let dy = y.cuda_mut().expect("placement checked");
    match v.config {
        Gelu::Fused { sigmoid, one_pass } => {
            let kernel = if sigmoid { "fused_tanh_sigmoid".to_string() } else { format!("fused_{}", approx.name()) };
            let f = gpu.function(FAMILY, &symbol(FAMILY, &kernel, T::DTYPE))?;
            let cfg = launch_config(gpu, T::DTYPE, x.len(), one_pass);
            // SAFETY: x and y hold rows*cols elements, b holds cols; the kernel bounds by them.
            unsafe { gpu.stream.launch_builder(&f).arg(dx).arg(db).arg(dy).arg(&r).arg(&c).launch(cfg) }
                .map(|_| ())
                .doing("launching bias_gelu fused")
        }
        _ => {
            let mut own = None;
            let tmp = match scratch {
                Some(t) if t.len() == x.len() && t.placement() == "cuda" => t,
                Some(t) => return Err(LabError::shape(FAMILY, format!("the scratch tensor is {:?} on {}; x is {:?}", t.shape(), t.placement(), x.shape()))),
                None => own.insert(Tensor::zeros(dev, x.shape())?),
            };
            let t = tmp.cuda_mut().expect("checked on the GPU");
            let add = gpu.function(FAMILY, &symbol(FAMILY, "unfused_add", T::DTYPE))?;
            let act = gpu.function(FAMILY, &symbol(FAMILY, &format!("unfused_gelu_{}", approx.name()), T::DTYPE))?;
            let cfg = launch_config(gpu, T::DTYPE, x.len(), false);
            // SAFETY: as the fused kernel; the scratch holds rows*cols elements. One stream orders
            // the two launches.
            unsafe { gpu.stream.launch_builder(&add).arg(dx).arg(db).arg(&mut *t).arg(&r).arg(&c).launch(cfg) }
                .doing("launching bias_gelu unfused_add")?;
            unsafe { gpu.stream.launch_builder(&act).arg(&*t).arg(dy).arg(&n).launch(cfg) }
                .map(|_| ())
                .doing("launching bias_gelu unfused_gelu")
        }
    }
}

impl Experiment for BiasGelu {
    fn name(&self) -> &'static str {
        "bias_gelu"
    }
    fn description(&self) -> &'static str {
        "y = GeLU(x + b), tanh and erf, f32/f16/bf16: unfused two kernels vs fused, against torch eager and torch.compile"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["rows=16384 cols=8192 approx=tanh"]
    }
    fn sweep_axis(&self) -> &'static str {
        "cols"
    }
    fn cases(&self, backend: &Backend, quick: bool) -> Vec<Value> {
        let shapes: &[(usize, usize, bool)] = match (backend, quick) {
            (Backend::Cuda(_), false) => &[(1, 1, false), (1823, 781, false), (4096, 4096, true), (16384, 8192, true)],
            (Backend::Cuda(_), true) => &[(1, 1, false), (1823, 781, false), (16384, 8192, true)],
            (Backend::Cpu, false) => &[(1, 1, false), (1823, 781, false), (1024, 4096, true)],
            (Backend::Cpu, true) => &[(1, 1, false), (37, 781, false), (64, 1024, true)],
        };
        let mut cases = Vec::new();
        for dtype in ["f32", "f16", "bf16"] {
            for approx in ["tanh", "erf"] {
                for &(rows, cols, timed) in shapes {
                    cases.push(json!({"rows": rows, "cols": cols, "dtype": dtype, "approx": approx, "timed": timed}));
                }
            }
        }
        cases
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        match DType::parse(param_str(case, "dtype")?)? {
            DType::F32 => run::<f32>(s, case),
            DType::F16 => run::<half::f16>(s, case),
            DType::Bf16 => run::<half::bf16>(s, case),
        }
    }
}

fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let (rows, cols) = (param_usize(case, "rows")?, param_usize(case, "cols")?);
    let approx = Approx::parse(param_str(case, "approx")?)?;
    let timed = param_timed(case);
    let mut rng = rng_for(s.opts.seed, case);
    let x: Vec<T> = (0..rows * cols).map(|_| T::from_f32(StandardNormal.sample(&mut rng))).collect();
    let b: Vec<T> = (0..cols).map(|_| T::from_f32(StandardNormal.sample(&mut rng))).collect();
    validate(x.len(), b.len(), rows, cols)?;
    let expected = reference(&widen(&x), &widen(&b), approx);
    let n = (rows * cols) as u64;
    let size = T::DTYPE.size() as u64;
    // The fused floor: read x, write y (the bias is cols elements, kept in cache). GeLU counts
    // ~20 flops (the polynomial, tanh or erf, the products).
    let work = Work { bytes: 2 * n * size + cols as u64 * size, flops: 20 * n };
    let tol = tolerance(T::DTYPE);
    let compare_y = |y: &[T]| compare_elems(y, &expected, tol, "cpu-f64");
    let check = Check::memory_bound(tol, &compare_y);
    let dev = s.backend.clone();
    let (tx, tb) = (Tensor::from_slice(&dev, &[rows, cols], &x)?, Tensor::from_slice(&dev, &[cols], &b)?);
    let mut ty = Tensor::<T>::zeros(&dev, &[rows, cols])?;
    let mut scratch = match &dev {
        Backend::Cuda(_) => Some(Tensor::<T>::zeros(&dev, &[rows, cols])?),
        Backend::Cpu => None,
    };
    for v in VARIANTS {
        if !v.requires.met_by(&dev) || !takes(v, approx) || !s.wants(v.name, "lab") {
            continue;
        }
        // The closure must be Fn: the scratch is borrowed through a cell, one launch at a time.
        let scratch = std::cell::RefCell::new(scratch.as_mut());
        measure_op(s, case, v.name, work, &check, timed, &mut ty, |y| {
            forward_with(&dev, v.name, &tx, &tb, y, approx, scratch.borrow_mut().as_deref_mut())
        })?;
    }
    if let (Backend::Cuda(gpu), true) = (&dev, timed) {
        let (xb, bb) = (T::bytes(&x), T::bytes(&b));
        let (xs, bs) = ([rows, cols], [cols]);
        let inputs: [(&[u8], &[usize]); 2] = [(&xb, &xs), (&bb, &bs)];
        // torch.compile costs a compile per process: only at the chip-filling shape.
        let compile_too = rows * cols >= 1 << 27;
        for compile in [false, true].into_iter().filter(|c| !c || compile_too) {
            let args = json!({"approximate": approx.torch_name(), "compile": compile});
            if s.wants_peer(Peer::Torch, &torch_variant(approx, compile), "torch") {
                measure_torch(s, gpu, case, "bias_gelu", args, &inputs, work, &check)?;
            }
        }
    }
    Ok(())
}

/// The variant name torch_peers.py gives each peer.
fn torch_variant(approx: Approx, compile: bool) -> String {
    let a = approx.torch_name();
    if compile { format!("torch.compile(gelu(x+b, {a}))") } else { format!("torch gelu(x+b, {a})") }
}

/// Block 256; a grid of a few blocks per SM, each thread handling 16-byte vectors.
/// `one_pass`: instead, enough blocks for every thread to make a single trip of the loop (its two
/// vectors), as a Triton kernel tiles the tensor: many short blocks, no grid-stride.
fn launch_config(gpu: &Gpu, dtype: DType, n: usize, one_pass: bool) -> LaunchConfig {
    let per_block = 256 * (16 / dtype.size());
    let grid = if one_pass { n.div_ceil(2 * per_block) } else { (gpu.info.sm_count as usize * 8).min(n.div_ceil(per_block)) }.max(1);
    LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_matches_known_values() {
        // GeLU(0) = 0, GeLU(x) -> x for large x, -> 0 for very negative x; erf form at 1.
        for a in [Approx::Tanh, Approx::Erf] {
            assert_eq!(gelu(0.0, a), 0.0);
            assert!((gelu(10.0, a) - 10.0).abs() < 1e-12);
            assert!(gelu(-10.0, a).abs() < 1e-12);
        }
        // Python's math.erf and math.tanh give these.
        assert!((gelu(1.0, Approx::Erf) - 0.841_344_746_068_542_9).abs() < 1e-12, "{}", gelu(1.0, Approx::Erf));
        assert!((gelu(1.0, Approx::Tanh) - 0.841_191_990_607_477_2).abs() < 1e-12);
    }

    #[test]
    fn cpu_variant_matches_reference_in_every_dtype() {
        let (rows, cols) = (13, 781);
        let xf: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1000) as f32 / 125.0 - 4.0).collect();
        let bf: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        fn one<T: Elem>(xf: &[f32], bf: &[f32], a: Approx) {
            let x: Vec<T> = xf.iter().map(|&v| T::from_f32(v)).collect();
            let b: Vec<T> = bf.iter().map(|&v| T::from_f32(v)).collect();
            let mut y = vec![T::from_f32(f32::NAN); x.len()];
            cpu_fused_rows(&x, &b, &mut y, a);
            let expected = reference(&widen(&x), &widen(&b), a);
            let e = compare_elems(&y, &expected, tolerance(T::DTYPE), "t");
            assert!(e.passed(), "{:?} {a:?}: {e:?}", T::DTYPE);
            // f32 arithmetic, not the reference rounded: some outputs differ from it.
            if T::DTYPE == DType::F32 {
                assert!(e.max_ulp > Some(0), "{a:?}: the CPU variant reproduces the reference to the bit");
            }
            // The other form of GeLU is caught (the forms differ by up to ~1e-3).
            let other = if a == Approx::Tanh { Approx::Erf } else { Approx::Tanh };
            cpu_fused_rows(&x, &b, &mut y, other);
            assert!(!compare_elems(&y, &expected, tolerance(T::DTYPE), "t").passed(), "{:?} {a:?}: the {other:?} form passed", T::DTYPE);
        }
        for a in [Approx::Tanh, Approx::Erf] {
            one::<f32>(&xf, &bf, a);
            one::<half::f16>(&xf, &bf, a);
            one::<half::bf16>(&xf, &bf, a);
        }
    }

    #[test]
    fn the_callable_op_runs_on_tensors_and_refuses_what_a_variant_cannot_do() {
        let dev = Backend::Cpu;
        let x = Tensor::from_vec(&[2, 3], vec![-1f32, 0.0, 1.0, 2.0, -3.0, 0.5]).unwrap();
        let b = Tensor::from_vec(&[3], vec![0.5f32, -0.5, 0.0]).unwrap();
        let mut y = Tensor::<f32>::zeros(&dev, &[2, 3]).unwrap();
        forward(&dev, &x, &b, &mut y, Approx::Erf).unwrap();
        let expected = reference(&widen(&x.to_vec().unwrap()), &widen(&b.to_vec().unwrap()), Approx::Erf);
        assert!(compare_elems(&y.to_vec().unwrap(), &expected, tolerance(DType::F32), "t").passed());
        let err = forward_with(&dev, "fused", &x, &b, &mut y, Approx::Erf, None).unwrap_err().to_string();
        assert!(err.contains("needs gpu, not the CPU backend"), "{err}");
        let sigmoid = variant::find(FAMILY, VARIANTS, "fused_sigmoid").unwrap();
        assert!(takes(sigmoid, Approx::Tanh) && !takes(sigmoid, Approx::Erf));
        let short = Tensor::from_vec(&[2], vec![0f32; 2]).unwrap();
        let err = forward(&dev, &x, &short, &mut y, Approx::Tanh).unwrap_err().to_string();
        assert!(err.contains("bias has 2 elements; rows are 3 wide"), "{err}");
    }

    #[test]
    fn bad_shapes_are_named() {
        assert!(validate(6, 3, 2, 3).is_ok());
        let e = validate(6, 2, 2, 3).unwrap_err().to_string();
        assert!(e.contains("bias has 2 elements; rows are 3 wide"), "{e}");
        assert!(validate(0, 3, 0, 3).unwrap_err().to_string().contains("at least 1"));
        assert!(validate(5, 3, 2, 3).unwrap_err().to_string().contains("x has 5 elements"));
    }

    /// The identity behind `fused_sigmoid` (kernels/bias_gelu.cu): 0.5 v (1 + tanh(u)) equals
    /// v / (1 + e^(-2u)), and its f32 evaluation stays inside the f32 tolerance everywhere,
    /// including where 1 + tanh(u) cancels (v << 0). The kernel's exponential is the hardware
    /// approximation; the GPU run checks that one against the same tolerance.
    #[test]
    fn the_sigmoid_form_is_the_tanh_form() {
        let tol = tolerance(DType::F32);
        for i in -4000..4000 {
            let v = i as f32 * 0.005 - 0.0013;
            let u = v * (0.044715f32 * 0.797_884_6 * v * v + 0.797_884_6);
            let got = (v / (1.0 + (-2.0 * u).exp())) as f64;
            let want = reference(&[v as f64], &[0.0], Approx::Tanh)[0];
            assert!((got - want).abs() <= tol.atol + tol.rtol * want.abs(), "v={v}: {got} vs {want}");
        }
    }
}
