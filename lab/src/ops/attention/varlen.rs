//! Variable-length batches of the forward: sequences of different lengths packed end to end (q
//! and o [total_q, hq, d], k and v [total_k, hkv, d]) and found by cumulative offsets
//! (FlashAttention's `cu_seqlens`), so that a batch pays for its tokens, not for padding every
//! sequence to the longest. lse is [hq, total_q]. Masks apply within each sequence (causal aligned
//! bottom-right per sequence, as in the dense layout). The tiled rungs (fa2, fa2_m32, the wgmma
//! rungs) read the offsets on the device, so a launch needs no host synchronisation; cpu_rows runs
//! each sequence as a batch of one. Its experiment cases are `{"pass": "varlen", ...}`.

use super::{
    check_rows, cpu_rows, input, launch_tiled_at, refusal, Dims, Elem, Expected, Kernel, Mask,
    Packed, FAMILY, VARIANTS,
};
use crate::experiment::{param_timed, param_usize, rng_for, Backend, Measurement, Session};
use crate::ops::compare::compare_elems;
use crate::ops::variant;
use crate::ops::{measure_op_with, Check};
use crate::profile::Work;
use crate::record::Tolerance;
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
        return Err(bad(format!(
            "{name} holds {} offsets: a batch of n sequences has n + 1, from 0",
            cu.len()
        )));
    }
    if cu[0] != 0 {
        return Err(bad(format!("{name} starts at {}, not 0", cu[0])));
    }
    if let Some(i) = cu.windows(2).position(|w| w[1] < w[0]) {
        return Err(bad(format!(
            "{name} decreases at index {}: {} then {} (offsets are cumulative lengths)",
            i + 1,
            cu[i],
            cu[i + 1]
        )));
    }
    if cu[cu.len() - 1] > i32::MAX as usize {
        return Err(bad(format!(
            "{name} ends at {} rows, past the kernels' 32-bit offsets",
            cu[cu.len() - 1]
        )));
    }
    Ok(())
}

impl Varlen {
    pub fn new(dev: &Backend, cu_q: &[usize], cu_k: &[usize]) -> Result<Self> {
        check_offsets("cu_seqlens_q", cu_q)?;
        check_offsets("cu_seqlens_k", cu_k)?;
        if cu_q.len() != cu_k.len() {
            return Err(bad(format!(
                "cu_seqlens_q holds {} offsets but cu_seqlens_k {}: one pair per sequence boundary",
                cu_q.len(),
                cu_k.len()
            )));
        }
        let device = match dev {
            Backend::Cuda(gpu) => {
                let up =
                    |cu: &[usize]| gpu.upload(&cu.iter().map(|&x| x as i32).collect::<Vec<i32>>());
                Some((up(cu_q)?, up(cu_k)?))
            }
            Backend::Cpu => None,
        };
        Ok(Varlen {
            cu_q: cu_q.to_vec(),
            cu_k: cu_k.to_vec(),
            device,
        })
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
        (
            self.cu_q[b]..self.cu_q[b + 1],
            self.cu_k[b]..self.cu_k[b + 1],
        )
    }
    /// Query and key rows in all.
    pub fn totals(&self) -> (usize, usize) {
        (self.cu_q[self.batch()], self.cu_k[self.batch()])
    }
    /// The launch's sizes: the longest query and key lengths (they size the grid).
    pub fn dims(&self, hq: usize, hkv: usize, d: usize) -> Dims {
        let longest = |cu: &[usize]| cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        Dims {
            batch: self.batch(),
            sq: longest(&self.cu_q),
            sk: longest(&self.cu_k),
            hq,
            hkv,
            d,
        }
    }
    /// Sequence b as a dense batch of one.
    pub fn seq_dims(&self, b: usize, hq: usize, hkv: usize, d: usize) -> Dims {
        let (rq, rk) = self.seq(b);
        Dims {
            batch: 1,
            sq: rq.len(),
            sk: rk.len(),
            hq,
            hkv,
            d,
        }
    }
    /// The work of every sequence, counted as the dense forward counts one.
    pub fn work(&self, hq: usize, hkv: usize, d: usize, m: Mask, elem: usize) -> Work {
        (0..self.batch())
            .map(|b| self.seq_dims(b, hq, hkv, d).work(m, elem))
            .fold(Work { bytes: 0, flops: 0 }, |a, w| Work {
                bytes: a.bytes + w.bytes,
                flops: a.flops + w.flops,
            })
    }
}

/// The shapes of a packed call, checked against the offsets: (hq, hkv, d).
fn shapes<T: Elem>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    o: &Tensor<T>,
    lse: &Tensor<f32>,
    offs: &Varlen,
) -> Result<(usize, usize, usize)> {
    for (name, t) in [
        ("q", q.shape()),
        ("k", k.shape()),
        ("v", v.shape()),
        ("o", o.shape()),
    ] {
        if t.len() != 3 {
            return Err(bad(format!(
                "{name} is {t:?}: packed tensors are [total_rows, heads, head_dim]"
            )));
        }
    }
    let (qs, ks) = (q.shape(), k.shape());
    let (tq, tk) = offs.totals();
    if k.shape() != v.shape() || o.shape() != qs {
        return Err(bad(format!(
            "q {qs:?}, k {ks:?}, v {:?}, o {:?}: k and v, q and o must match",
            v.shape(),
            o.shape()
        )));
    }
    if qs[0] != tq || ks[0] != tk {
        return Err(bad(format!(
            "q has {} rows and k {}, but the offsets end at {tq} and {tk}",
            qs[0], ks[0]
        )));
    }
    if qs[2] != ks[2] || qs[1] == 0 || qs[2] == 0 || ks[1] == 0 || qs[1] % ks[1] != 0 {
        return Err(bad(format!("q is {qs:?} and k {ks:?}: head_dim must match, and the query heads be a multiple of the key/value heads")));
    }
    if lse.shape() != [qs[1], tq] {
        return Err(bad(format!(
            "lse is {:?}, not [heads, total_q] = {:?}",
            lse.shape(),
            [qs[1], tq]
        )));
    }
    Ok((qs[1], ks[1], qs[2]))
}

/// The forward of a packed batch with the variant the dense forward would pick for its longest
/// sequence.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: Elem>(
    dev: &Backend,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    offs: &Varlen,
    mask: Mask,
    o: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
) -> Result<()> {
    let (hq, hkv, d) = shapes(q, k, v, o, lse, offs)?;
    forward_with(
        dev,
        super::best(dev, offs.dims(hq, hkv, d)).name,
        q,
        k,
        v,
        offs,
        mask,
        o,
        lse,
    )
}

/// [`forward`] with the named variant: a tiled rung or cpu_rows.
#[allow(clippy::too_many_arguments)]
pub fn forward_with<T: Elem>(
    dev: &Backend,
    variant: &str,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    offs: &Varlen,
    mask: Mask,
    o: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
) -> Result<()> {
    let var = variant::find(FAMILY, VARIANTS, variant)?;
    variant::check_runs(FAMILY, var, dev, T::DTYPE)?;
    check_placement(
        "attention varlen",
        dev,
        &[
            ("q", q.placement()),
            ("k", k.placement()),
            ("v", v.placement()),
            ("o", o.placement()),
            ("lse", lse.placement()),
        ],
    )?;
    let (hq, hkv, d) = shapes(q, k, v, o, lse, offs)?;
    let dims = offs.dims(hq, hkv, d);
    match (var.config, dev) {
        (Kernel::CpuRows, _) => {
            let (qh, kh, vh) = (q.host().expect("placed"), k.host().expect("placed"), v.host().expect("placed"));
            let (oh, lh) = (o.host_mut().expect("placed"), lse.host_mut().expect("placed"));
            let tq = offs.totals().0;
            for b in 0..offs.batch() {
                let ((rq, rk), db) = (offs.seq(b), offs.seq_dims(b, hq, hkv, d));
                let mut l = vec![0f32; hq * rq.len()];
                let (qr, kr) = (rq.start * hq * d..rq.end * hq * d, rk.start * hkv * d..rk.end * hkv * d);
                cpu_rows(db, mask, &qh[qr.clone()], &kh[kr.clone()], &vh[kr], &mut oh[qr], &mut l);
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
            let (cu_q, cu_k) = offs.device.as_ref().ok_or_else(|| bad("the offsets were made for the CPU backend; make them with the GPU's".into()))?;
            let (total_q, total_k) = offs.totals();
            let packed = Packed { cu_q, cu_k, total_q, total_k };
            let (dq, dk, dv) = (q.cuda().expect("placed"), k.cuda().expect("placed"), v.cuda().expect("placed"));
            let (dl, dout) = (lse.cuda_mut().expect("placed"), o.cuda_mut().expect("placed"));
            launch_tiled_at(gpu, var, dims, mask, (&dq.as_view(), &dk.as_view(), &dv.as_view()), &mut dout.as_view_mut(), &mut dl.as_view_mut(), Some(packed))
        }
        _ => Err(bad(format!("`{variant}` takes dense batches only; packed ones run on fa2, fa2_m32, the wgmma rungs and cpu_rows"))),
    }
}

/// The packed cases: odd lengths (one row, empty sequences, a sequence with no keys, lengths
/// across tiles) as gates, and a timed batch of 16k tokens in sequences from 256 to 8192.
pub fn cases(backend: &Backend, quick: bool) -> Vec<Value> {
    let case = |lens: &[(usize, usize)],
                (hq, hkv, d): (usize, usize, usize),
                causal: bool,
                window: usize,
                dtype: &str,
                timed: bool| {
        let mut c = json!({"pass": "varlen", "seq_q": lens.iter().map(|l| l.0).collect::<Vec<_>>(), "seq_k": lens.iter().map(|l| l.1).collect::<Vec<_>>(),
            "hq": hq, "hkv": hkv, "d": d, "causal": causal, "dtype": dtype, "timed": timed});
        if window > 0 {
            c["window"] = json!(window);
        }
        c
    };
    let odd: &[(usize, usize)] = &[
        (1, 1),
        (17, 17),
        (0, 0),
        (5, 40),
        (3, 0),
        (130, 130),
        (64, 64),
        (200, 77),
    ];
    let mut out = vec![
        case(odd, (4, 2, 64), true, 0, "bf16", false),
        case(odd, (2, 2, 128), false, 0, "f16", false),
    ];
    if !quick || matches!(backend, Backend::Cuda(_)) {
        out.push(case(
            &[(1000, 1000), (33, 33), (4097, 4097)],
            (9, 3, 64),
            true,
            100,
            "bf16",
            false,
        ));
    }
    if let Backend::Cuda(_) = backend {
        let mixed: Vec<(usize, usize)> = [1024, 8192, 256, 2048, 512, 4096, 256]
            .iter()
            .map(|&s| (s, s))
            .collect();
        for causal in [false, true] {
            out.push(case(&mixed, (16, 16, 128), causal, 0, "bf16", true));
        }
    }
    out
}

/// One packed case: every variant that takes packed batches against the f64 reference of each
/// sequence, O and lse.
pub fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let lens = |k: &str| -> Result<Vec<usize>> {
        case.get(k)
            .and_then(Value::as_array)
            .ok_or_else(|| {
                LabError::Invalid(format!(
                    "a varlen case needs `{k}`, a list of lengths: {case}"
                ))
            })?
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| LabError::Invalid(format!("`{k}` holds a non-length: {case}")))
            })
            .collect()
    };
    let (sq, sk) = (lens("seq_q")?, lens("seq_k")?);
    if sq.len() != sk.len() {
        return Err(LabError::Invalid(format!(
            "`seq_q` and `seq_k` differ in length: {case}"
        )));
    }
    let (hq, hkv, d) = (
        param_usize(case, "hq")?,
        param_usize(case, "hkv")?,
        param_usize(case, "d")?,
    );
    let mask = Mask {
        causal: case.get("causal").and_then(Value::as_bool).unwrap_or(false),
        window: case
            .get("window")
            .map_or(Ok(0), |_| param_usize(case, "window"))?,
    };
    let dev = s.backend.clone();
    let offs = Varlen::from_lengths(
        &dev,
        &sq.iter()
            .copied()
            .zip(sk.iter().copied())
            .collect::<Vec<_>>(),
    )?;
    let (tq, tk) = offs.totals();
    let mut rng = rng_for(s.opts.seed, case);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (
        input(tq * hq * d, 1.0, &mut rng),
        input(tk * hkv * d, 1.0, &mut rng),
        input(tk * hkv * d, 1.0, &mut rng),
    );
    // Each non-empty sequence's reference, as a dense batch of one; the bound is the loosest.
    let mut per = Vec::new();
    for b in (0..offs.batch()).filter(|&b| sq[b] > 0) {
        let ((rq, rk), db) = (offs.seq(b), offs.seq_dims(b, hq, hkv, d));
        let (qr, kr) = (
            rq.start * hq * d..rq.end * hq * d,
            rk.start * hkv * d..rk.end * hkv * d,
        );
        per.push((
            b,
            Expected::new(
                db,
                mask,
                &q[qr],
                &k[kr.clone()],
                &v[kr],
                check_rows(db, &mut rng),
            ),
        ));
    }
    let tol = Tolerance {
        atol: per.iter().map(|(_, e)| e.tol.atol).fold(0.0, f64::max),
        rtol: per.first().map_or(0.0, |(_, e)| e.tol.rtol),
    };
    let (want_o, want_lse): (Vec<f64>, Vec<f64>) = (
        per.iter().flat_map(|(_, e)| e.o.clone()).collect(),
        per.iter().flat_map(|(_, e)| e.lse.clone()).collect(),
    );
    let gather = |o: &[T]| -> Vec<T> {
        per.iter()
            .flat_map(|(b, e)| {
                e.gather(
                    offs.seq_dims(*b, hq, hkv, d),
                    &o[offs.seq(*b).0.start * hq * d..],
                )
            })
            .collect()
    };
    let gather_lse = |l: &[f32]| -> Vec<f32> {
        per.iter()
            .flat_map(|(b, e)| {
                e.rows
                    .iter()
                    .map(|&(_, h, i)| l[h * tq + offs.seq(*b).0.start + i])
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let compare_o = |o: &[T]| {
        compare_elems(
            &gather(o),
            &want_o,
            tol,
            "cpu-f64 per sequence (sampled rows)",
        )
    };
    let check = Check {
        tol,
        compare: &compare_o,
        ceiling: crate::ops::product_ceiling(&dev, T::DTYPE),
    };
    let work = offs.work(hq, hkv, d, mask, T::DTYPE.size());
    let (qt, kt, vt) = (
        Tensor::from_slice(&dev, &[tq, hq, d], &q)?,
        Tensor::from_slice(&dev, &[tk, hkv, d], &k)?,
        Tensor::from_slice(&dev, &[tk, hkv, d], &v)?,
    );
    let mut o = Tensor::<T>::zeros(&dev, &[tq, hq, d])?;
    let lse = std::cell::RefCell::new(Tensor::<f32>::zeros(&dev, &[hq, tq])?);
    let takes = |k: Kernel| {
        matches!(
            k,
            Kernel::Fa2 { .. } | Kernel::Wgmma { .. } | Kernel::CpuRows
        )
    };
    for var in VARIANTS.iter().filter(|v| {
        takes(v.config) && v.requires.met_by(&dev) && refusal(v, offs.dims(hq, hkv, d)).is_none()
    }) {
        if !s.wants(var.name, "lab") {
            continue;
        }
        measure_op_with(
            s,
            case,
            var.name,
            work,
            &check,
            param_timed(case),
            &mut o,
            Default::default(),
            |o| {
                forward_with(
                    &dev,
                    var.name,
                    &qt,
                    &kt,
                    &vt,
                    &offs,
                    mask,
                    o,
                    &mut lse.borrow_mut(),
                )
            },
        )?;
        let mut m = Measurement::new(
            var.name,
            "lab",
            &super::experiment::lse_case(case),
            Work { bytes: 0, flops: 0 },
        );
        let ltol = Tolerance {
            atol: 1e-3,
            rtol: 1e-4,
        };
        m.error = Some(compare_elems(
            &gather_lse(&lse.borrow().to_vec()?),
            &want_lse,
            ltol,
            "cpu-f64 per sequence (sampled rows)",
        ));
        m.tolerance = Some(ltol);
        s.emit(m)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
