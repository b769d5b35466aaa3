use super::*;
use crate::ops::compare::compare_elems;
use rand::SeedableRng;

fn dims(batch: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> Dims {
    Dims { batch, sq, sk, hq, hkv, d }
}

/// The CPU path against the f64 reference on every row, by FlashAttention's accuracy rule.
fn check_cpu<T: Elem>(d: Dims, m: Mask, qscale: f32) -> (Vec<T>, Expected) {
    let mut rng = rand::rngs::StdRng::seed_from_u64((d.sq * 31 + d.sk * 7 + d.d) as u64);
    let (qn, kn) = (d.batch * d.sq * d.hq * d.d, d.batch * d.sk * d.hkv * d.d);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (input(qn, qscale, &mut rng), input(kn, 1.0, &mut rng), input(kn, 1.0, &mut rng));
    let rows: Vec<_> = (0..d.batch * d.hq * d.sq).map(|r| (r / (d.hq * d.sq), r / d.sq % d.hq, r % d.sq)).collect();
    let e = Expected::new(d, m, &q, &k, &v, rows);
    let (mut o, mut lse) = (vec![T::from_f32(f32::NAN); qn], vec![f32::NAN; d.batch * d.hq * d.sq]);
    cpu_rows(d, m, &q, &k, &v, &mut o, &mut lse);
    let stats = compare_elems(&e.gather(d, &o), &e.o, e.tol, "cpu-f64");
    assert!(stats.passed(), "{:?} {d:?} {m:?}: {stats:?}", T::DTYPE);
    let l = compare_elems(&e.gather_lse(d, &lse), &e.lse, Tolerance { atol: 1e-3, rtol: 1e-4 }, "cpu-f64");
    assert!(l.passed(), "lse {d:?} {m:?}: {l:?}");
    (o, e)
}

#[test]
fn the_cpu_path_matches_the_reference_on_odd_shapes_masks_and_large_logits() {
    let causal = Mask { causal: true, window: 0 };
    for (d, m, scale) in [
        (dims(1, 1, 1, 2, 1, 64), causal, 1.0),                                // one row, one key
        (dims(2, 17, 5, 3, 1, 64), causal, 1.0),                               // 12 rows keep no key
        (dims(1, 33, 33, 4, 2, 128), Mask { causal: false, window: 7 }, 1.0),  // a window alone
        (dims(1, 40, 40, 9, 3, 64), Mask { causal: true, window: 16 }, 1.0),   // GQA, causal + window
        (dims(2, 9, 21, 2, 2, 128), Mask::default(), 100.0),                   // scores of 1e3..1e4
    ] {
        check_cpu::<half::bf16>(d, m, scale);
        check_cpu::<half::f16>(d, m, scale);
    }
}

#[test]
fn a_row_with_no_key_is_zero_and_its_lse_minus_infinity() {
    let d = dims(1, 3, 1, 1, 1, 64);
    let (o, e) = check_cpu::<half::bf16>(d, Mask { causal: true, window: 0 }, 1.0);
    // Bottom-right alignment: rows 0 and 1 of 3 see no key of 1; row 2 sees key 0.
    assert!(o[..2 * 64].iter().all(|x| x.to_f32() == 0.0));
    assert_eq!(&e.lse[..2], &[f64::NEG_INFINITY, f64::NEG_INFINITY]);
    assert!(e.lse[2].is_finite());
}

#[test]
fn one_kept_key_returns_its_value_row() {
    let d = dims(1, 1, 4, 1, 1, 64);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (q, k, v): (Vec<half::bf16>, Vec<_>, Vec<_>) = (input(64, 1.0, &mut rng), input(256, 1.0, &mut rng), input(256, 1.0, &mut rng));
    // A window of 1 with causal keeps key j = i + Sk - Sq = 3 only.
    let (o, lse, _) = reference_row(d, Mask { causal: true, window: 1 }, &q, &k, &v, (0, 0, 0));
    assert_eq!(o, v[3 * 64..].iter().map(|x| x.to_f64()).collect::<Vec<_>>());
    let s: f64 = q.iter().zip(&k[3 * 64..]).map(|(a, b)| a.to_f64() * b.to_f64()).sum::<f64>() / 8.0;
    assert!((lse - s).abs() < 1e-12);
}

#[test]
fn the_check_catches_a_planted_fault() {
    let d = dims(1, 20, 20, 2, 1, 64);
    let (mut o, e) = check_cpu::<half::bf16>(d, Mask::default(), 1.0);
    let x = o[5 * 2 * 64 + 3].to_f32();
    o[5 * 2 * 64 + 3] = half::bf16::from_f32(x + 0.05 * (1.0 + x.abs()));
    assert!(!compare_elems(&e.gather(d, &o), &e.o, e.tol, "cpu-f64").passed(), "a wrong element passed");
}

#[test]
fn kept_pairs_are_counted_exactly() {
    let d = dims(1, 4096, 4096, 1, 1, 128);
    assert_eq!(d.pairs(Mask::default()), 4096 * 4096);
    assert_eq!(d.pairs(Mask { causal: true, window: 0 }), 4096 * 4097 / 2);
    // A window of w keeps min(i + 1, w) keys of row i.
    assert_eq!(dims(1, 10, 10, 1, 1, 64).pairs(Mask { causal: true, window: 3 }), 1 + 2 + 8 * 3);
    let w = d.work(Mask::default(), 2);
    assert_eq!(w.flops, 4 * 128 * 4096 * 4096);
}

#[test]
fn the_callable_op_runs_on_the_cpu_and_names_bad_input() {
    let dev = Backend::Cpu;
    let t = |shape: &[usize]| Tensor::<half::bf16>::zeros(&dev, shape).unwrap();
    let (q, k, v) = (t(&[1, 5, 4, 64]), t(&[1, 7, 2, 64]), t(&[1, 7, 2, 64]));
    let (mut o, mut lse) = (t(&[1, 5, 4, 64]), Tensor::<f32>::zeros(&dev, &[1, 4, 5]).unwrap());
    forward(&dev, &q, &k, &v, Mask { causal: true, window: 0 }, &mut o, &mut lse).unwrap();
    // Zero q and k: every kept key weighs the same, and v is zero.
    assert!(o.to_vec().unwrap().iter().all(|x| x.to_f32() == 0.0));
    let lse = lse.to_vec().unwrap();
    assert!((lse[0] - 3f32.ln()).abs() < 1e-6, "row 0 keeps keys 0..=2: {lse:?}");
    let err = |q: &Tensor<half::bf16>, k: &Tensor<half::bf16>, lse_shape: &[usize]| {
        let mut lse = Tensor::<f32>::zeros(&dev, lse_shape).unwrap();
        let mut o = t(q.shape());
        forward(&dev, q, k, k, Mask::default(), &mut o, &mut lse).unwrap_err().to_string()
    };
    assert!(err(&t(&[1, 5, 3, 64]), &k, &[1, 3, 5]).contains("3 query heads are not a multiple of 2 key/value heads"));
    assert!(err(&q, &t(&[1, 7, 2, 32]), &[1, 4, 5]).contains("batch and head_dim must match"));
    assert!(err(&q, &k, &[1, 5, 4]).contains("lse is [1, 5, 4], not [batch, heads, seq_q] = [1, 4, 5]"));
    assert!(err(&t(&[5, 4, 64]), &k, &[1, 4, 5]).contains("tensors are [batch, seq, heads, head_dim]"));
    let mut lse = Tensor::<f32>::zeros(&dev, &[1, 4, 5]).unwrap();
    let e = forward_with(&dev, "fa2", &q, &k, &v, Mask::default(), &mut o, &mut lse).unwrap_err().to_string();
    assert!(e.contains("`fa2` needs gpu, not the CPU backend"), "{e}");
}

#[test]
fn a_shape_a_rung_cannot_take_is_named() {
    let fa2 = variant::find(FAMILY, VARIANTS, "fa2").unwrap();
    let why = refusal(fa2, dims(1, 8, 8, 2, 2, 96)).unwrap();
    assert_eq!(why, "`fa2` takes head_dim [64, 128], not 96");
    assert!(refusal(fa2, dims(1, 8, 8, 2, 2, 128)).is_none());
    let naive = variant::find(FAMILY, VARIANTS, "naive").unwrap();
    assert!(refusal(naive, dims(4, 4096, 4096, 16, 16, 128)).is_none(), "2^30 scores fit");
    assert!(refusal(naive, dims(8, 4096, 4096, 16, 16, 128)).unwrap().contains("it takes at most 1073741824"));
}
