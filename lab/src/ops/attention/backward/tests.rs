use super::super::backward_check::{rows, ExpectedGrads, RowStats};
use super::super::{cpu_rows, forward_with, input, reference_row, FAMILY};
use super::*;
use rand::SeedableRng;

fn dims(batch: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> Dims {
    Dims { batch, sq, sk, hq, hkv, d }
}
const CAUSAL: Mask = Mask { causal: true, window: 0 };

/// Random q (scaled by `qscale`), k, v, dO, and O and lse from the CPU forward.
struct Case<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    o: Vec<T>,
    dout: Vec<T>,
    lse: Vec<f32>,
}

impl<T: Elem> Case<T> {
    fn new(d: Dims, m: Mask, qscale: f32) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64((d.sq * 31 + d.sk * 7 + d.d + d.hq) as u64);
        let (qn, kn) = (d.batch * d.sq * d.hq * d.d, d.batch * d.sk * d.hkv * d.d);
        let (q, k, v, dout) = (input(qn, qscale, &mut rng), input(kn, 1.0, &mut rng), input(kn, 1.0, &mut rng), input(qn, 1.0, &mut rng));
        let (mut o, mut lse) = (vec![T::from_f32(0.0); qn], vec![0f32; d.batch * d.hq * d.sq]);
        cpu_rows(d, m, &q, &k, &v, &mut o, &mut lse);
        Case { q, k, v, o, dout, lse }
    }
    fn x(&self) -> CpuIn<'_, T> {
        CpuIn { q: &self.q, k: &self.k, v: &self.v, o: &self.o, dout: &self.dout, lse: &self.lse }
    }
    /// The f64 reference at every row (or a sample, for large shapes), from the forward's
    /// definition alone.
    fn expected(&self, d: Dims, m: Mask) -> ExpectedGrads {
        let (qr, kr) = rows(d, &mut rand::rngs::StdRng::seed_from_u64(3));
        ExpectedGrads::new(d, m, &self.x(), &RowStats::exact(d, m, &self.x()), qr, kr, "cpu-f64")
    }
}

/// cpu_bwd (fa2_bwd's tiling) against the reference; returns the judgement and the gradients.
fn judge<T: Elem>(d: Dims, m: Mask, c: &Case<T>, e: &ExpectedGrads, drop_last_kv_tile: bool) -> (crate::record::ErrorStats, HostGrads<T>) {
    let g = cpu_bwd(d, m, c.x(), drop_last_kv_tile);
    (e.compare(&e.gather(d, &g.0, &g.1, &g.2)), g)
}

#[test]
fn the_kernels_tiling_matches_the_reference_on_odd_shapes_masks_and_large_logits() {
    for (d, m, qscale) in [
        (dims(1, 1, 1, 2, 1, 64), CAUSAL, 1.0),                               // one row, one key, MQA
        (dims(2, 17, 5, 3, 1, 64), CAUSAL, 1.0),                              // 12 rows keep no key
        (dims(1, 17, 17, 2, 2, 128), Mask::default(), 100.0),                 // scores of 1e3..1e4
        (dims(1, 100, 70, 4, 2, 64), Mask { causal: true, window: 16 }, 1.0), // GQA, 2 x 2 tiles, window
        (dims(3, 129, 257, 6, 2, 128), Mask::default(), 1.0),                 // partial last tiles
        (dims(1, 77, 130, 4, 2, 128), Mask { causal: false, window: 40 }, 1.0),
        (dims(1, 1000, 1000, 1, 1, 64), CAUSAL, 1.0),
        (dims(1, 4097, 4097, 1, 1, 64), CAUSAL, 1.0),
    ] {
        let c = Case::<half::bf16>::new(d, m, qscale);
        let (s, _) = judge(d, m, &c, &c.expected(d, m), false);
        assert!(s.passed(), "bf16 {d:?} {m:?}: {s:?}");
        if d.sq < 1000 {
            let c = Case::<half::f16>::new(d, m, qscale);
            let (s, _) = judge(d, m, &c, &c.expected(d, m), false);
            assert!(s.passed(), "f16 {d:?} {m:?}: {s:?}");
        }
    }
}

#[test]
fn the_check_catches_a_dropped_kv_tile() {
    // Two KV tiles; without the last one dK and dV of keys 64..70 stay zero and dQ misses their share.
    let (d, m) = (dims(1, 100, 70, 2, 1, 64), Mask::default());
    let c = Case::<half::bf16>::new(d, m, 1.0);
    let e = c.expected(d, m);
    assert!(judge(d, m, &c, &e, false).0.passed());
    let (s, _) = judge(d, m, &c, &e, true);
    assert!(!s.passed(), "a dropped KV tile passed: {s:?}");
    assert!(s.mismatches > 6 * 64, "every dK and dV row of the dropped keys must fail: {s:?}");
}

#[test]
fn the_check_catches_one_wrong_element() {
    let (d, m) = (dims(1, 20, 20, 2, 1, 64), CAUSAL);
    let c = Case::<half::bf16>::new(d, m, 1.0);
    let e = c.expected(d, m);
    let (_, (dq, dk, mut dv)) = judge(d, m, &c, &e, false);
    let x = dv[7 * 64 + 5].to_f32();
    dv[7 * 64 + 5] = half::bf16::from_f32(x + 0.05 * (1.0 + x.abs()));
    assert!(!e.compare(&e.gather(d, &dq, &dk, &dv)).passed(), "a wrong dV element passed");
}

#[test]
fn a_row_with_no_key_has_a_zero_gradient() {
    // Bottom-right causal: rows 0..12 of 17 see none of 5 keys.
    let (d, m) = (dims(1, 17, 5, 1, 1, 64), CAUSAL);
    let c = Case::<half::bf16>::new(d, m, 1.0);
    let (dq, _, _) = cpu_bwd(d, m, c.x(), false);
    assert!(dq[..12 * 64].iter().all(|x| x.to_f32() == 0.0));
    assert!(dq[12 * 64..].iter().any(|x| x.to_f32() != 0.0));
}

#[test]
fn the_reference_is_the_gradient_of_the_forward() {
    // L = sum(O * dO) with the forward's f64 reference; central differences in q, k and v,
    // with GQA, a causal window and Sq != Sk.
    let (d, m) = (dims(1, 6, 9, 2, 1, 64), Mask { causal: true, window: 5 });
    let c = Case::<f32>::new(d, m, 1.0);
    let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
        let mut l = 0.0;
        for h in 0..d.hq {
            for i in 0..d.sq {
                let (o, _, _) = reference_row(d, m, q, k, v, (0, h, i));
                l += o.iter().zip(&c.dout[(i * d.hq + h) * d.d..]).map(|(a, b)| a * *b as f64).sum::<f64>();
            }
        }
        l
    };
    let e = c.expected(d, m);
    let (qr, kr) = (e.qrows.clone(), e.krows.clone());
    assert_eq!((qr.len(), kr.len()), (d.hq * d.sq, d.sk), "every row is checked at this size");
    // (tensor: 0 q, 1 k, 2 v; flat index)
    for (which, at) in [(0, 5 * 2 * 64 + 64 + 3), (0, 2 * 64 + 17), (1, 8 * 64 + 9), (1, 3 * 64), (2, 4 * 64 + 63), (2, 8 * 64 + 1)] {
        let fd = |sign: f32| {
            let (mut q, mut k, mut v) = (c.q.clone(), c.k.clone(), c.v.clone());
            [&mut q, &mut k, &mut v][which][at] += sign * 1e-3;
            (loss(&q, &k, &v), [&q, &k, &v][which][at] as f64)
        };
        let ((lp, xp), (lm, xm)) = (fd(1.0), fd(-1.0));
        let numeric = (lp - lm) / (xp - xm);
        // The parts list rows in the order of qrows (b, h, i) and krows (b, hk, j).
        let (row, c) = (at / d.d, at % d.d);
        let pos = if which == 0 { qr.iter().position(|&r| r == (0, row % d.hq, row / d.hq)) } else { kr.iter().position(|&r| r == (0, row % d.hkv, row / d.hkv)) };
        let analytic = e.parts[which][pos.expect("a checked row") * d.d + c];
        assert!((numeric - analytic).abs() < 1e-6 + 1e-4 * analytic.abs(), "tensor {which} element {at}: {numeric} vs {analytic}");
    }
}

#[test]
fn the_saved_stats_give_the_same_reference() {
    // Large shapes take lse and D from the forward's outputs: the same judgement here.
    let (d, m) = (dims(2, 33, 47, 4, 2, 64), CAUSAL);
    let c = Case::<half::bf16>::new(d, m, 1.0);
    let (qr, kr) = rows(d, &mut rand::rngs::StdRng::seed_from_u64(3));
    let e = ExpectedGrads::new(d, m, &c.x(), &RowStats::saved(d, &c.x()), qr, kr, "cpu-f64 (saved lse and O)");
    let exact = c.expected(d, m);
    for (a, b) in e.parts.iter().zip(&exact.parts) {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f64, f64::max);
        assert!(worst < 0.02, "saved and exact stats differ by {worst}");
    }
    assert!(judge(d, m, &c, &e, false).0.passed());
}

#[test]
fn backward_flops_are_two_and_a_half_forwards() {
    let d = dims(4, 4096, 4096, 16, 16, 128);
    let w = super::super::backward_check::work(d, CAUSAL, 2);
    assert_eq!(w.flops * 2, d.work(CAUSAL, 2).flops * 5);
    assert_eq!(w.flops, 10 * 128 * 64 * (4096 * 4097 / 2));
}

#[test]
fn the_callable_op_runs_on_the_cpu_and_names_bad_input() {
    let dev = Backend::Cpu;
    let d = dims(1, 5, 7, 4, 2, 64);
    let c = Case::<half::bf16>::new(d, CAUSAL, 1.0);
    let t = |shape: &[usize], v: &[half::bf16]| Tensor::from_slice(&dev, shape, v).unwrap();
    let (qs, ks) = ([1, 5, 4, 64], [1, 7, 2, 64]);
    let (q, k, v, o, dout) = (t(&qs, &c.q), t(&ks, &c.k), t(&ks, &c.v), t(&qs, &c.o), t(&qs, &c.dout));
    let lse = Tensor::from_slice(&dev, &[1, 4, 5], &c.lse).unwrap();
    let saved = Saved { q: &q, k: &k, v: &v, o: &o, lse: &lse, dout: &dout };
    let mut g = Grads::zeros(&dev, d).unwrap();
    backward(&dev, &saved, CAUSAL, &mut g).unwrap();
    assert_eq!(g.dq.to_vec().unwrap(), cpu_bwd(d, CAUSAL, c.x(), false).0);
    let bad_dout = Tensor::<half::bf16>::zeros(&dev, &[1, 5, 2, 64]).unwrap();
    let e = backward(&dev, &Saved { dout: &bad_dout, ..saved }, CAUSAL, &mut g).unwrap_err().to_string();
    assert!(e.contains("dout is [1, 5, 2, 64], not [1, 5, 4, 64]"), "{e}");
    let mut small = Grads::zeros(&dev, dims(1, 5, 6, 4, 2, 64)).unwrap();
    let e = backward(&dev, &saved, CAUSAL, &mut small).unwrap_err().to_string();
    assert!(e.contains("dk is [1, 6, 2, 64], not [1, 7, 2, 64]"), "{e}");
    let e = backward_with(&dev, "fa2_bwd", &saved, CAUSAL, &mut g).unwrap_err().to_string();
    assert!(e.contains("`fa2_bwd` needs gpu, not the CPU backend"), "{e}");
    let e = backward_with(&dev, "cpu_rows", &saved, CAUSAL, &mut g).unwrap_err().to_string();
    assert!(e.contains("`cpu_rows` is a forward variant"), "{e}");
    let (mut o2, mut l2) = (o.to(&dev).unwrap(), lse.to(&dev).unwrap());
    let e = forward_with(&dev, "cpu_bwd", &q, &k, &v, CAUSAL, &mut o2, &mut l2).unwrap_err().to_string();
    assert!(e.contains("`cpu_bwd` is a backward variant"), "{e}");
    let fa2 = variant::find(FAMILY, VARIANTS, "fa2_bwd").unwrap();
    assert_eq!(refusal(fa2, dims(1, 8, 8, 2, 2, 96)).unwrap(), "`fa2_bwd` takes head_dim [64, 128], not 96");
}

#[test]
fn the_tiles_and_shared_memory_are_the_kernels() {
    let cache = tempfile::tempdir().unwrap();
    let names = ["FA_BWD_BM", "FA_BN", "FA_BWD_SMEM(64)", "FA_BWD_SMEM(128)", "FA_BWD_DQ_SMEM(64)", "FA_BWD_DQ_SMEM(128)"];
    let got = crate::gpu::compile::probe_u32(Some(cache.path()), FAMILY, &names).unwrap_or_else(|e| panic!("{e}"));
    let want = [BM, BN, fa2_bwd_smem(64), fa2_bwd_smem(128), fa2_bwd_dq_smem(64), fa2_bwd_dq_smem(128)];
    assert_eq!(got, want.map(|x| x as u32));
    assert_eq!(fa2_bwd_smem(128), 114688, "112 KiB at D128: under sm_80's 163 KiB and sm_90's 227 KiB");
}

#[test]
fn the_repeat_check_sees_one_changed_bit_and_only_fa2_bwd_may_fail_it() {
    use super::super::backward_check::grad_bits;
    use crate::ops::compare::compare_bits;
    let d = dims(1, 9, 9, 2, 1, 64);
    let c = Case::<half::bf16>::new(d, CAUSAL, 1.0);
    let (dq, dk, dv) = cpu_bwd(d, CAUSAL, c.x(), false);
    let grads = |dk: &[half::bf16]| [dq.clone(), dk.to_vec(), dv.clone()];
    let first = grad_bits(&grads(&dk));
    assert!(compare_bits(&grad_bits(&grads(&dk)), &first, "first").passed());
    let mut planted = dk.clone();
    planted[5] = half::bf16::from_bits(planted[5].to_bits() ^ 1); // one ulp
    let s = compare_bits(&grad_bits(&grads(&planted)), &first, "first");
    assert_eq!((s.mismatches, s.worst_index), (1, Some((dq.len() + 5) as u64)));
    let nondeterministic: Vec<_> = VARIANTS.iter().filter(|v| v.config.is_backward() && !v.config.deterministic()).map(|v| v.name).collect();
    assert_eq!(nondeterministic, ["fa2_bwd"]);
}
