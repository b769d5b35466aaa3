//! Variable-length batches: sequences of different lengths packed end to end (q, o, dO and dQ
//! [total_q, hq, d]; k, v, dK and dV [total_k, hkv, d]) and found by cumulative offsets
//! (FlashAttention's `cu_seqlens`), so that a batch pays for its tokens, not for padding every
//! sequence to the longest. lse is [hq, total_q]. Masks apply within each sequence (causal aligned
//! bottom-right per sequence, as in the dense layout). On the GPU the forward's tiled rungs (fa2,
//! fa2_m32, the wgmma rungs) and the backward's fa2_bwd_det read the offsets on the device, so a
//! launch needs no host synchronisation; on the CPU, cpu_rows and cpu_bwd run each sequence as a
//! batch of one. Experiment cases `{"pass": "varlen", ...}` and `{"pass": "varlen_backward", ...}`.

use super::backward::{cpu_bwd, launch_fa2_det, CpuIn, Grads, Saved};
use super::backward_check::{measure_grads, ExpectedGrads, RowStats, EXACT_MAX};
use super::{check_rows, cpu_rows, input, launch_tiled, refusal, Dims, Elem, Expected, Kernel, Mask, Packed, FAMILY, VARIANTS};
use crate::experiment::{param_timed, param_usize, rng_for, Backend, Measurement, Session};
use crate::ops::compare::{compare_elems, merge_parts};
use crate::ops::variant;
use crate::ops::{measure_op_with, Check};
use crate::profile::Work;
use crate::record::{ErrorStats, Tolerance};
use crate::tensor::{check_placement, Tensor};
use crate::{LabError, Result};
use cudarc::driver::CudaSlice;
use serde_json::{json, Value};
use std::ops::Range;

/// A packed batch's offsets: checked once, and on the device where the backend is a GPU.
pub struct Varlen {
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
    device: Option<(CudaSlice<i32>, CudaSlice<i32>)>,
}

fn bad(why: String) -> LabError {
    LabError::shape("attention varlen", why)
}

/// Offsets start at 0 and never decrease (a sequence may be empty).
fn check_offsets(name: &str, cu: &[usize]) -> Result<()> {
    if cu.len() < 2 {
        return Err(bad(format!("{name} holds {} offsets: a batch of n sequences has n + 1, from 0", cu.len())));
    }
    if cu[0] != 0 {
        return Err(bad(format!("{name} starts at {}, not 0", cu[0])));
    }
    if let Some(i) = cu.windows(2).position(|w| w[1] < w[0]) {
        return Err(bad(format!("{name} decreases at index {}: {} then {} (offsets are cumulative lengths)", i + 1, cu[i], cu[i + 1])));
    }
    if cu[cu.len() - 1] > i32::MAX as usize {
        return Err(bad(format!("{name} ends at {} rows, past the kernels' 32-bit offsets", cu[cu.len() - 1])));
    }
    Ok(())
}

impl Varlen {
    pub fn new(dev: &Backend, cu_q: &[usize], cu_k: &[usize]) -> Result<Self> {
        check_offsets("cu_seqlens_q", cu_q)?;
        check_offsets("cu_seqlens_k", cu_k)?;
        if cu_q.len() != cu_k.len() {
            return Err(bad(format!("cu_seqlens_q holds {} offsets but cu_seqlens_k {}: one pair per sequence boundary", cu_q.len(), cu_k.len())));
        }
        let device = match dev {
            Backend::Cuda(gpu) => {
                let up = |cu: &[usize]| gpu.upload(&cu.iter().map(|&x| x as i32).collect::<Vec<i32>>());
                Some((up(cu_q)?, up(cu_k)?))
            }
            Backend::Cpu => None,
        };
        Ok(Varlen { cu_q: cu_q.to_vec(), cu_k: cu_k.to_vec(), device })
    }
    /// From (query, key) lengths per sequence.
    pub fn from_lengths(dev: &Backend, lens: &[(usize, usize)]) -> Result<Self> {
        let cum = |f: fn(&(usize, usize)) -> usize| {
            let mut c = vec![0];
            for l in lens {
                c.push(c[c.len() - 1] + f(l));
            }
            c
        };
        Self::new(dev, &cum(|l| l.0), &cum(|l| l.1))
    }
    pub fn batch(&self) -> usize {
        self.cu_q.len() - 1
    }
    /// Sequence b's query rows and key rows.
    pub fn seq(&self, b: usize) -> (Range<usize>, Range<usize>) {
        (self.cu_q[b]..self.cu_q[b + 1], self.cu_k[b]..self.cu_k[b + 1])
    }
    /// Query and key rows in all.
    pub fn totals(&self) -> (usize, usize) {
        (self.cu_q[self.batch()], self.cu_k[self.batch()])
    }
    /// The launch's sizes: the longest query and key lengths (they size the grid).
    pub fn dims(&self, hq: usize, hkv: usize, d: usize) -> Dims {
        let longest = |cu: &[usize]| cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        Dims { batch: self.batch(), sq: longest(&self.cu_q), sk: longest(&self.cu_k), hq, hkv, d }
    }
    /// Sequence b as a dense batch of one.
    pub fn seq_dims(&self, b: usize, hq: usize, hkv: usize, d: usize) -> Dims {
        let (rq, rk) = self.seq(b);
        Dims { batch: 1, sq: rq.len(), sk: rk.len(), hq, hkv, d }
    }
    /// The summed work of every sequence, each counted by `per` as the dense op counts one.
    pub fn work(&self, hq: usize, hkv: usize, d: usize, per: impl Fn(Dims) -> Work) -> Work {
        (0..self.batch()).map(|b| per(self.seq_dims(b, hq, hkv, d))).fold(Work { bytes: 0, flops: 0 }, |a, w| Work { bytes: a.bytes + w.bytes, flops: a.flops + w.flops })
    }
    /// The device offsets and totals a launch takes.
    fn packed(&self) -> Result<Packed<'_>> {
        let (cu_q, cu_k) = self.device.as_ref().ok_or_else(|| bad("the offsets were made for the CPU backend; make them with the GPU's".into()))?;
        let (total_q, total_k) = self.totals();
        Ok(Packed { cu_q, cu_k, total_q, total_k })
    }
    /// Sequence b's element ranges in q-shaped and k-shaped tensors.
    fn elems(&self, b: usize, hq: usize, hkv: usize, d: usize) -> (Range<usize>, Range<usize>) {
        let (rq, rk) = self.seq(b);
        (rq.start * hq * d..rq.end * hq * d, rk.start * hkv * d..rk.end * hkv * d)
    }
    /// Sequence b's lse rows out of [hq, total_q], as a batch of one holds them ([hq, sq]).
    fn lse_of(&self, b: usize, hq: usize, lse: &[f32]) -> Vec<f32> {
        let (rq, tq) = (self.seq(b).0, self.totals().0);
        (0..hq).flat_map(|h| lse[h * tq + rq.start..h * tq + rq.end].to_vec()).collect()
    }
}

/// The shapes of a packed call, checked against the offsets: (hq, hkv, d).
fn shapes<T: Elem>(q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, o: &Tensor<T>, lse: &Tensor<f32>, offs: &Varlen) -> Result<(usize, usize, usize)> {
    for (name, t) in [("q", q.shape()), ("k", k.shape()), ("v", v.shape()), ("o", o.shape())] {
        if t.len() != 3 {
            return Err(bad(format!("{name} is {t:?}: packed tensors are [total_rows, heads, head_dim]")));
        }
    }
    let (qs, ks) = (q.shape(), k.shape());
    let (tq, tk) = offs.totals();
    if k.shape() != v.shape() || o.shape() != qs {
        return Err(bad(format!("q {qs:?}, k {ks:?}, v {:?}, o {:?}: k and v, q and o must match", v.shape(), o.shape())));
    }
    if qs[0] != tq || ks[0] != tk {
        return Err(bad(format!("q has {} rows and k {}, but the offsets end at {tq} and {tk}", qs[0], ks[0])));
    }
    if qs[2] != ks[2] || qs[1] == 0 || qs[2] == 0 || ks[1] == 0 || qs[1] % ks[1] != 0 {
        return Err(bad(format!("q is {qs:?} and k {ks:?}: head_dim must match, and the query heads be a multiple of the key/value heads")));
    }
    if lse.shape() != [qs[1], tq] {
        return Err(bad(format!("lse is {:?}, not [heads, total_q] = {:?}", lse.shape(), [qs[1], tq])));
    }
    Ok((qs[1], ks[1], qs[2]))
}

/// The forward of a packed batch with the variant the dense forward would pick for its longest
/// sequence.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: Elem>(dev: &Backend, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, offs: &Varlen, mask: Mask, o: &mut Tensor<T>, lse: &mut Tensor<f32>) -> Result<()> {
    let (hq, hkv, d) = shapes(q, k, v, o, lse, offs)?;
    forward_with(dev, super::best(dev, offs.dims(hq, hkv, d)).name, q, k, v, offs, mask, o, lse)
}

/// [`forward`] with the named variant: a tiled rung or cpu_rows.
#[allow(clippy::too_many_arguments)]
pub fn forward_with<T: Elem>(dev: &Backend, variant: &str, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, offs: &Varlen, mask: Mask, o: &mut Tensor<T>, lse: &mut Tensor<f32>) -> Result<()> {
    let var = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, var, dev, T::DTYPE)?;
    check_placement("attention varlen", dev, &[("q", q.placement()), ("k", k.placement()), ("v", v.placement()), ("o", o.placement()), ("lse", lse.placement())])?;
    let (hq, hkv, d) = shapes(q, k, v, o, lse, offs)?;
    let dims = offs.dims(hq, hkv, d);
    match (var.config, dev) {
        (Kernel::CpuRows, _) => {
            let (qh, kh, vh) = (q.host().expect("placed"), k.host().expect("placed"), v.host().expect("placed"));
            let (oh, lh) = (o.host_mut().expect("placed"), lse.host_mut().expect("placed"));
            let tq = offs.totals().0;
            for b in 0..offs.batch() {
                let ((qr, kr), rq) = (offs.elems(b, hq, hkv, d), offs.seq(b).0);
                let mut l = vec![0f32; hq * rq.len()];
                cpu_rows(offs.seq_dims(b, hq, hkv, d), mask, &qh[qr.clone()], &kh[kr.clone()], &vh[kr], &mut oh[qr], &mut l);
                for h in 0..hq {
                    lh[h * tq + rq.start..h * tq + rq.end].copy_from_slice(&l[h * rq.len()..(h + 1) * rq.len()]);
                }
            }
            Ok(())
        }
        (Kernel::Fa2 { .. } | Kernel::Wgmma { .. }, Backend::Cuda(gpu)) => {
            if let Some(why) = refusal(var, dims) {
                return Err(bad(why));
            }
            let (dq, dk, dv) = (q.cuda().expect("placed"), k.cuda().expect("placed"), v.cuda().expect("placed"));
            let (dl, dout) = (lse.cuda_mut().expect("placed"), o.cuda_mut().expect("placed"));
            launch_tiled(gpu, var, dims, mask, (&dq.as_view(), &dk.as_view(), &dv.as_view()), &mut dout.as_view_mut(), &mut dl.as_view_mut(), Some(offs.packed()?))
        }
        _ => Err(bad(format!("`{variant}` takes dense batches only; packed ones run forward on fa2, fa2_m32, the wgmma rungs and cpu_rows"))),
    }
}

/// The backward of a packed batch: fa2_bwd_det on the GPU (bit-identical run to run), cpu_bwd on
/// the CPU.
pub fn backward<T: Elem>(dev: &Backend, s: &Saved<T>, offs: &Varlen, mask: Mask, g: &mut Grads<T>) -> Result<()> {
    backward_with(dev, if matches!(dev, Backend::Cpu) { "cpu_bwd" } else { "fa2_bwd_det" }, s, offs, mask, g)
}

/// [`backward`] with the named variant: fa2_bwd_det or cpu_bwd.
pub fn backward_with<T: Elem>(dev: &Backend, variant: &str, s: &Saved<T>, offs: &Varlen, mask: Mask, g: &mut Grads<T>) -> Result<()> {
    let var = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, var, dev, T::DTYPE)?;
    let places = [("q", s.q), ("k", s.k), ("v", s.v), ("o", s.o), ("dout", s.dout), ("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)].map(|(n, t)| (n, t.placement()));
    check_placement("attention varlen backward", dev, &places)?;
    check_placement("attention varlen backward", dev, &[("lse", s.lse.placement())])?;
    let (hq, hkv, d) = shapes(s.q, s.k, s.v, s.o, s.lse, offs)?;
    for (name, t, want) in [("dout", s.dout, s.q), ("dq", &g.dq, s.q), ("dk", &g.dk, s.k), ("dv", &g.dv, s.k)] {
        if t.shape() != want.shape() {
            return Err(bad(format!("{name} is {:?}, not {:?}", t.shape(), want.shape())));
        }
    }
    let dims = offs.dims(hq, hkv, d);
    match (var.config, dev) {
        (Kernel::CpuBwd, _) => {
            let h = |t: &Tensor<T>| t.host().expect("placed").to_vec();
            let (q, k, v, o, dout, lse) = (h(s.q), h(s.k), h(s.v), h(s.o), h(s.dout), s.lse.host().expect("placed").to_vec());
            for b in 0..offs.batch() {
                let (qr, kr) = offs.elems(b, hq, hkv, d);
                let l = offs.lse_of(b, hq, &lse);
                let x = CpuIn { q: &q[qr.clone()], k: &k[kr.clone()], v: &v[kr.clone()], o: &o[qr.clone()], dout: &dout[qr.clone()], lse: &l };
                let (dq, dk, dv) = cpu_bwd(offs.seq_dims(b, hq, hkv, d), mask, x, false);
                g.dq.host_mut().expect("placed")[qr].copy_from_slice(&dq);
                g.dk.host_mut().expect("placed")[kr.clone()].copy_from_slice(&dk);
                g.dv.host_mut().expect("placed")[kr].copy_from_slice(&dv);
            }
            Ok(())
        }
        (Kernel::Fa2Bwd { deterministic: true, .. }, Backend::Cuda(gpu)) => {
            if let Some(why) = super::backward::refusal(var, dims) {
                return Err(bad(why));
            }
            launch_fa2_det(gpu, dims, mask, s, g, Some(offs.packed()?))
        }
        _ => Err(bad(format!("`{variant}` takes dense batches only; packed ones run backward on fa2_bwd_det and cpu_bwd"))),
    }
}

/// The packed cases: odd lengths (one row, empty sequences, a sequence with no keys or no queries,
/// lengths across tiles) as gates, forward and backward, and timed batches of 16k tokens in
/// sequences from 256 to 8192.
pub fn cases(backend: &Backend, quick: bool) -> Vec<Value> {
    let case = |pass: &str, lens: &[(usize, usize)], (hq, hkv, d): (usize, usize, usize), causal: bool, window: usize, dtype: &str, timed: bool| {
        let mut c = json!({"pass": pass, "seq_q": lens.iter().map(|l| l.0).collect::<Vec<_>>(), "seq_k": lens.iter().map(|l| l.1).collect::<Vec<_>>(),
            "hq": hq, "hkv": hkv, "d": d, "causal": causal, "dtype": dtype, "timed": timed});
        if window > 0 {
            c["window"] = json!(window);
        }
        c
    };
    let odd: &[(usize, usize)] = &[(1, 1), (17, 17), (0, 0), (5, 40), (3, 0), (0, 9), (130, 130), (64, 64), (200, 77)];
    let mut out = Vec::new();
    for pass in ["varlen", "varlen_backward"] {
        out.extend([case(pass, odd, (4, 2, 64), true, 0, "bf16", false), case(pass, odd, (2, 2, 128), false, 0, "f16", false)]);
        if !quick || matches!(backend, Backend::Cuda(_)) {
            out.push(case(pass, &[(1000, 1000), (33, 33), (4097, 4097)], (9, 3, 64), true, 100, "bf16", false));
        }
        if let Backend::Cuda(_) = backend {
            let mixed: Vec<(usize, usize)> = [1024, 8192, 256, 2048, 512, 4096, 256].iter().map(|&s| (s, s)).collect();
            out.extend([false, true].map(|causal| case(pass, &mixed, (16, 16, 128), causal, 0, "bf16", true)));
        }
    }
    out
}

/// A packed case's sizes, mask and offsets, and its inputs q, k, v drawn from the case's seed
/// (the rng goes on to draw dO and pick the checked rows).
type Parsed<T> = ((usize, usize, usize), Mask, Varlen, [Vec<T>; 3]);
fn parse<T: Elem>(s: &Session, case: &Value, rng: &mut impl rand::Rng) -> Result<Parsed<T>> {
    let lens = |k: &str| -> Result<Vec<usize>> {
        let list = case.get(k).and_then(Value::as_array).ok_or_else(|| LabError::Invalid(format!("a varlen case needs `{k}`, a list of lengths: {case}")))?;
        list.iter().map(|x| x.as_u64().map(|x| x as usize).ok_or_else(|| LabError::Invalid(format!("`{k}` holds a non-length: {case}")))).collect()
    };
    let (sq, sk) = (lens("seq_q")?, lens("seq_k")?);
    if sq.len() != sk.len() {
        return Err(LabError::Invalid(format!("`seq_q` and `seq_k` differ in length: {case}")));
    }
    let heads = (param_usize(case, "hq")?, param_usize(case, "hkv")?, param_usize(case, "d")?);
    let mask = Mask { causal: case.get("causal").and_then(Value::as_bool).unwrap_or(false), window: case.get("window").map_or(Ok(0), |_| param_usize(case, "window"))? };
    let offs = Varlen::from_lengths(&s.backend, &sq.into_iter().zip(sk).collect::<Vec<_>>())?;
    let ((tq, tk), (hq, hkv, d)) = (offs.totals(), heads);
    let qkv = [input(tq * hq * d, 1.0, rng), input(tk * hkv * d, 1.0, rng), input(tk * hkv * d, 1.0, rng)];
    Ok((heads, mask, offs, qkv))
}

/// One packed forward case: every variant that takes packed batches against the f64 reference
/// of each sequence, O and lse.
pub fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let mut rng = rng_for(s.opts.seed, case);
    let ((hq, hkv, d), mask, offs, [q, k, v]) = parse::<T>(s, case, &mut rng)?;
    let (tq, tk) = offs.totals();
    // Each non-empty sequence's reference, as a dense batch of one; the bound is the loosest.
    let mut per = Vec::new();
    for b in (0..offs.batch()).filter(|&b| !offs.seq(b).0.is_empty()) {
        let ((qr, kr), db) = (offs.elems(b, hq, hkv, d), offs.seq_dims(b, hq, hkv, d));
        per.push((b, Expected::new(db, mask, &q[qr], &k[kr.clone()], &v[kr], check_rows(db, &mut rng))));
    }
    let tol = Tolerance { atol: per.iter().map(|(_, e)| e.tol.atol).fold(0.0, f64::max), rtol: per.first().map_or(0.0, |(_, e)| e.tol.rtol) };
    let (want_o, want_lse): (Vec<f64>, Vec<f64>) = (per.iter().flat_map(|(_, e)| e.o.clone()).collect(), per.iter().flat_map(|(_, e)| e.lse.clone()).collect());
    let gather = |o: &[T]| -> Vec<T> { per.iter().flat_map(|(b, e)| e.gather(offs.seq_dims(*b, hq, hkv, d), &o[offs.elems(*b, hq, hkv, d).0])).collect() };
    let gather_lse = |l: &[f32]| -> Vec<f32> { per.iter().flat_map(|(b, e)| e.gather_lse(offs.seq_dims(*b, hq, hkv, d), &offs.lse_of(*b, hq, l))).collect() };
    let compare_o = |o: &[T]| compare_elems(&gather(o), &want_o, tol, "cpu-f64 per sequence (sampled rows)");
    let dev = s.backend.clone();
    let check = Check { tol, compare: &compare_o, ceiling: crate::ops::product_ceiling(&dev, T::DTYPE) };
    let work = offs.work(hq, hkv, d, |db| db.work(mask, T::DTYPE.size()));
    let (qt, kt, vt) = (Tensor::from_slice(&dev, &[tq, hq, d], &q)?, Tensor::from_slice(&dev, &[tk, hkv, d], &k)?, Tensor::from_slice(&dev, &[tk, hkv, d], &v)?);
    let mut o = Tensor::<T>::zeros(&dev, &[tq, hq, d])?;
    let lse = std::cell::RefCell::new(Tensor::<f32>::zeros(&dev, &[hq, tq])?);
    let takes = |k: Kernel| matches!(k, Kernel::Fa2 { .. } | Kernel::Wgmma { .. } | Kernel::CpuRows);
    for var in VARIANTS.iter().filter(|v| takes(v.config) && v.requires.met_by(&dev) && refusal(v, offs.dims(hq, hkv, d)).is_none()) {
        if !s.wants(var.name, "lab") {
            continue;
        }
        measure_op_with(s, case, var.name, work, &check, param_timed(case), &mut o, Default::default(), |o| forward_with(&dev, var.name, &qt, &kt, &vt, &offs, mask, o, &mut lse.borrow_mut()))?;
        let mut m = Measurement::new(var.name, "lab", &super::experiment::lse_case(case), Work { bytes: 0, flops: 0 });
        let ltol = Tolerance { atol: 1e-3, rtol: 1e-4 };
        m.error = Some(compare_elems(&gather_lse(&lse.borrow().to_vec()?), &want_lse, ltol, "cpu-f64 per sequence (sampled rows)"));
        m.tolerance = Some(ltol);
        s.emit(m)?;
    }
    Ok(())
}

/// One packed backward case: O and lse from the lab's packed forward, then every variant that
/// takes packed batches against the f64 gradient of each sequence (the dense backward's rule).
pub fn run_backward<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let mut rng = rng_for(s.opts.seed, case);
    let ((hq, hkv, d), mask, offs, [q, k, v]) = parse::<T>(s, case, &mut rng)?;
    let ((tq, tk), dev) = (offs.totals(), s.backend.clone());
    let dout: Vec<T> = input(tq * hq * d, 1.0, &mut rng);
    let t = |shape: &[usize], x: &[T]| Tensor::from_slice(&dev, shape, x);
    let (qt, kt, vt, dot_) = (t(&[tq, hq, d], &q)?, t(&[tk, hkv, d], &k)?, t(&[tk, hkv, d], &v)?, t(&[tq, hq, d], &dout)?);
    let (mut ot, mut lt) = (Tensor::<T>::zeros(&dev, &[tq, hq, d])?, Tensor::<f32>::zeros(&dev, &[hq, tq])?);
    forward(&dev, &qt, &kt, &vt, &offs, mask, &mut ot, &mut lt)?;
    let (o, lse) = (ot.to_vec()?, lt.to_vec()?);
    // Each sequence with rows or keys, its reference as a dense batch of one.
    let mut per: Vec<(usize, ExpectedGrads)> = Vec::new();
    for b in (0..offs.batch()).filter(|&b| !(offs.seq(b).0.is_empty() && offs.seq(b).1.is_empty())) {
        let ((qr, kr), db, l) = (offs.elems(b, hq, hkv, d), offs.seq_dims(b, hq, hkv, d), offs.lse_of(b, hq, &lse));
        let x = CpuIn { q: &q[qr.clone()], k: &k[kr.clone()], v: &v[kr], o: &o[qr.clone()], dout: &dout[qr], lse: &l };
        let exact = db.hq * db.sq * db.sk * db.d <= EXACT_MAX;
        let (stats, reference) = if exact { (RowStats::exact(db, mask, &x), "cpu-f64 per sequence") } else { (RowStats::saved(db, &x), "cpu-f64 per sequence (sampled rows, saved lse and O)") };
        let (qrows, krows) = super::backward_check::rows(db, &mut rng);
        per.push((b, ExpectedGrads::new(db, mask, &x, &stats, qrows, krows, reference)));
    }
    // dQ, dK and dV laid end to end, each sequence against its own bounds.
    let judge = |dq: &[T], dk: &[T], dv: &[T]| -> ErrorStats {
        let mut offset = 0;
        let parts = per.iter().map(|(b, e)| {
            let (qr, kr) = offs.elems(*b, hq, hkv, d);
            let len = e.parts.iter().map(Vec::len).sum::<usize>();
            offset += len;
            (e.compare(&e.gather(offs.seq_dims(*b, hq, hkv, d), &dq[qr], &dk[kr.clone()], &dv[kr])), offset - len)
        });
        merge_parts(parts.collect())
    };
    let compare = |all: &[T]| -> ErrorStats {
        let (dq, rest) = all.split_at(tq * hq * d);
        let (dk, dv) = rest.split_at(tk * hkv * d);
        judge(dq, dk, dv)
    };
    let tol = Tolerance { atol: per.iter().map(|(_, e)| e.record_tol().atol).fold(0.0, f64::max), rtol: per.first().map_or(0.0, |(_, e)| e.record_tol().rtol) };
    let check = Check { tol, compare: &compare, ceiling: crate::ops::product_ceiling(&dev, T::DTYPE) };
    let work = offs.work(hq, hkv, d, |db| super::backward_check::work(db, mask, T::DTYPE.size()));
    let saved = Saved { q: &qt, k: &kt, v: &vt, o: &ot, lse: &lt, dout: &dot_ };
    let mut grads = Grads { dq: Tensor::zeros(&dev, &[tq, hq, d])?, dk: Tensor::zeros(&dev, &[tk, hkv, d])?, dv: Tensor::zeros(&dev, &[tk, hkv, d])? };
    let takes = |k: Kernel| matches!(k, Kernel::Fa2Bwd { deterministic: true, .. } | Kernel::CpuBwd);
    for var in VARIANTS.iter().filter(|v| takes(v.config) && v.requires.met_by(&dev) && super::backward::refusal(v, offs.dims(hq, hkv, d)).is_none()) {
        if s.wants(var.name, "lab") {
            measure_grads(s, case, var.name, work, &check, param_timed(case), &mut grads, &judge, |g| backward_with(&dev, var.name, &saved, &offs, mask, g))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
