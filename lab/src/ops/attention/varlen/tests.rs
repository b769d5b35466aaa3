use super::*;
use rand::SeedableRng;

const CAUSAL: Mask = Mask { causal: true, window: 0 };

/// Packed inputs for `offs` and the CPU forward of them: (q, k, v, o, lse).
type Packed<T> = (Vec<T>, Vec<T>, Vec<T>, Vec<T>, Vec<f32>);
fn packed_cpu<T: Elem>(offs: &Varlen, (hq, hkv, d): (usize, usize, usize), m: Mask) -> Packed<T> {
    let (tq, tk) = offs.totals();
    let mut rng = rand::rngs::StdRng::seed_from_u64(tq as u64 * 7 + tk as u64);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (input(tq * hq * d, 1.0, &mut rng), input(tk * hkv * d, 1.0, &mut rng), input(tk * hkv * d, 1.0, &mut rng));
    let (o, lse) = forward_cpu(offs, (hq, hkv, d), m, (&q, &k, &v));
    (q, k, v, o, lse)
}

fn forward_cpu<T: Elem>(offs: &Varlen, (hq, hkv, d): (usize, usize, usize), m: Mask, (q, k, v): (&[T], &[T], &[T])) -> (Vec<T>, Vec<f32>) {
    let dev = Backend::Cpu;
    let (tq, tk) = offs.totals();
    let t = |shape: &[usize], x: &[T]| Tensor::from_slice(&dev, shape, x).unwrap();
    let mut o = t(&[tq, hq, d], &vec![T::from_f32(f32::NAN); tq * hq * d]);
    let mut lse = Tensor::from_slice(&dev, &[hq, tq], &vec![f32::NAN; hq * tq]).unwrap();
    forward(&dev, &t(&[tq, hq, d], q), &t(&[tk, hkv, d], k), &t(&[tk, hkv, d], v), offs, m, &mut o, &mut lse).unwrap();
    (o.to_vec().unwrap(), lse.to_vec().unwrap())
}

/// Every row of every sequence against the f64 reference of that sequence alone.
fn judge<T: Elem>(offs: &Varlen, (hq, hkv, d): (usize, usize, usize), m: Mask, (q, k, v, o, lse): &Packed<T>) -> bool {
    (0..offs.batch()).filter(|&b| !offs.seq(b).0.is_empty()).all(|b| {
        let ((qr, kr), db) = (offs.elems(b, hq, hkv, d), offs.seq_dims(b, hq, hkv, d));
        let rows: Vec<_> = (0..hq * db.sq).map(|r| (0, r / db.sq, r % db.sq)).collect();
        let e = Expected::new(db, m, &q[qr.clone()], &k[kr.clone()], &v[kr], rows);
        compare_elems(&e.gather(db, &o[qr]), &e.o, e.tol, "f64").passed() && compare_elems(&e.gather_lse(db, &offs.lse_of(b, hq, lse)), &e.lse, Tolerance { atol: 1e-3, rtol: 1e-4 }, "f64").passed()
    })
}

const ODD: [(usize, usize); 8] = [(1, 1), (17, 17), (0, 0), (5, 40), (3, 0), (0, 9), (130, 130), (200, 77)];

#[test]
fn each_packed_sequence_matches_its_own_reference() {
    let offs = Varlen::from_lengths(&Backend::Cpu, &ODD).unwrap();
    assert_eq!((offs.batch(), offs.totals(), offs.dims(4, 2, 64).sq, offs.dims(4, 2, 64).sk), (8, (356, 274), 200, 130));
    for (m, heads) in [(CAUSAL, (4, 2, 64)), (Mask { causal: false, window: 9 }, (2, 2, 128))] {
        let p = packed_cpu::<half::bf16>(&offs, heads, m);
        assert!(judge(&offs, heads, m, &p), "{m:?} {heads:?}");
        // A row of a sequence with no keys: O = 0 and lse = -inf (sequence 4, rows 23..26).
        assert!(p.3[23 * heads.0 * heads.2..26 * heads.0 * heads.2].iter().all(|x| x.to_f32() == 0.0));
        assert_eq!(p.4[24], f32::NEG_INFINITY);
    }
}

#[test]
fn the_check_catches_sequences_read_with_the_wrong_offsets() {
    let heads = (2, 1, 64);
    let offs = Varlen::from_lengths(&Backend::Cpu, &[(9, 9), (30, 30)]).unwrap();
    let p = packed_cpu::<half::bf16>(&offs, heads, CAUSAL);
    assert!(judge(&offs, heads, CAUSAL, &p));
    // The planted fault: the second sequence's keys taken from row 8 instead of row 9.
    let shifted = Varlen::new(&Backend::Cpu, &[0, 9, 39], &[0, 8, 39]).unwrap();
    let (q, k, v, ..) = &p;
    let (o, lse) = forward_cpu(&shifted, heads, CAUSAL, (q, k, v));
    assert!(!judge(&offs, heads, CAUSAL, &(q.clone(), k.clone(), v.clone(), o, lse)), "a sequence read from the wrong rows passed");
}

/// The packed CPU backward's gradients, and whether every sequence's match its f64 reference.
fn backward_cpu(offs: &Varlen, heads: (usize, usize, usize), m: Mask, p: &Packed<half::bf16>, dout: &[half::bf16], graded: &Varlen) -> bool {
    let ((hq, hkv, d), dev, (tq, tk)) = (heads, Backend::Cpu, offs.totals());
    let t = |shape: &[usize], x: &[half::bf16]| Tensor::from_slice(&dev, shape, x).unwrap();
    let (q, k, v, o, dt) = (t(&[tq, hq, d], &p.0), t(&[tk, hkv, d], &p.1), t(&[tk, hkv, d], &p.2), t(&[tq, hq, d], &p.3), t(&[tq, hq, d], dout));
    let lse = Tensor::from_slice(&dev, &[hq, tq], &p.4).unwrap();
    let nan = |n: usize| vec![half::bf16::NAN; n];
    let mut g = Grads { dq: t(&[tq, hq, d], &nan(tq * hq * d)), dk: t(&[tk, hkv, d], &nan(tk * hkv * d)), dv: t(&[tk, hkv, d], &nan(tk * hkv * d)) };
    backward(&dev, &Saved { q: &q, k: &k, v: &v, o: &o, lse: &lse, dout: &dt }, graded, m, &mut g).unwrap();
    let (dq, dk, dv) = (g.dq.to_vec().unwrap(), g.dk.to_vec().unwrap(), g.dv.to_vec().unwrap());
    (0..offs.batch()).filter(|&b| !(offs.seq(b).0.is_empty() && offs.seq(b).1.is_empty())).all(|b| {
        let ((qr, kr), db, l) = (offs.elems(b, hq, hkv, d), offs.seq_dims(b, hq, hkv, d), offs.lse_of(b, hq, &p.4));
        let x = CpuIn { q: &p.0[qr.clone()], k: &p.1[kr.clone()], v: &p.2[kr.clone()], o: &p.3[qr.clone()], dout: &dout[qr.clone()], lse: &l };
        let (qrows, krows) = super::super::backward_check::rows(db, &mut rand::rngs::StdRng::seed_from_u64(1));
        let e = ExpectedGrads::new(db, m, &x, &RowStats::exact(db, m, &x), qrows, krows, "f64");
        e.compare(&e.gather(db, &dq[qr], &dk[kr.clone()], &dv[kr])).passed()
    })
}

#[test]
fn each_packed_sequences_gradients_match_its_own_reference_and_a_shifted_batch_fails() {
    let heads = (4, 2, 64);
    let offs = Varlen::from_lengths(&Backend::Cpu, &ODD).unwrap();
    let p = packed_cpu::<half::bf16>(&offs, heads, CAUSAL);
    let dout: Vec<half::bf16> = input(offs.totals().0 * 4 * 64, 1.0, &mut rand::rngs::StdRng::seed_from_u64(5));
    assert!(backward_cpu(&offs, heads, CAUSAL, &p, &dout, &offs));
    // The planted fault: sequence 6's keys start one row late (sequence 5 ends one key longer).
    let late = Varlen::new(&Backend::Cpu, &[0, 1, 18, 18, 23, 26, 26, 156, 356], &[0, 1, 18, 18, 58, 58, 68, 197, 274]).unwrap();
    assert!(!backward_cpu(&offs, heads, CAUSAL, &p, &dout, &late), "gradients from the wrong key rows passed");
}

#[test]
fn bad_offsets_and_shapes_are_named() {
    let dev = Backend::Cpu;
    let err = |q: &[usize], k: &[usize]| Varlen::new(&dev, q, k).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(&[0, 5, 3], &[0, 5, 9]).contains("cu_seqlens_q decreases at index 2: 5 then 3"), "{}", err(&[0, 5, 3], &[0, 5, 9]));
    assert!(err(&[1, 5], &[0, 5]).contains("cu_seqlens_q starts at 1, not 0"));
    assert!(err(&[0], &[0]).contains("holds 1 offsets"));
    assert!(err(&[0, 5, 9], &[0, 5]).contains("cu_seqlens_q holds 3 offsets but cu_seqlens_k 2"));
    let offs = Varlen::from_lengths(&dev, &[(3, 4), (2, 2)]).unwrap();
    let t = |shape: &[usize]| Tensor::<half::bf16>::zeros(&dev, shape).unwrap();
    let run = |variant: &str, q: &[usize], k: &[usize], lse: &[usize]| {
        let (mut o, mut l) = (t(q), Tensor::<f32>::zeros(&dev, lse).unwrap());
        forward_with(&dev, variant, &t(q), &t(k), &t(k), &offs, Mask::default(), &mut o, &mut l).err().map(|e| e.to_string()).unwrap_or_default()
    };
    assert_eq!(run("cpu_rows", &[5, 4, 64], &[6, 2, 64], &[4, 5]), "");
    assert!(run("cpu_rows", &[6, 4, 64], &[6, 2, 64], &[4, 6]).contains("q has 6 rows and k 6, but the offsets end at 5 and 6"));
    assert!(run("cpu_rows", &[5, 3, 64], &[6, 2, 64], &[3, 5]).contains("query heads be a multiple of the key/value heads"));
    assert!(run("cpu_rows", &[5, 4, 64], &[6, 2, 64], &[5, 4]).contains("lse is [5, 4], not [heads, total_q] = [4, 5]"));
    assert!(run("cpu_rows", &[1, 5, 4, 64], &[6, 2, 64], &[4, 5]).contains("packed tensors are [total_rows, heads, head_dim]"));
    assert!(run("cpu_bwd", &[5, 4, 64], &[6, 2, 64], &[4, 5]).contains("`cpu_bwd` takes dense batches only"));
    let (q, k, lse) = (t(&[5, 4, 64]), t(&[6, 2, 64]), Tensor::<f32>::zeros(&dev, &[4, 5]).unwrap());
    let saved = Saved { q: &q, k: &k, v: &k, o: &q, lse: &lse, dout: &q };
    let bwd = |variant: &str, dq: &[usize]| backward_with(&dev, variant, &saved, &offs, Mask::default(), &mut Grads { dq: t(dq), dk: t(&[6, 2, 64]), dv: t(&[6, 2, 64]) }).err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(bwd("cpu_bwd", &[5, 4, 64]), "");
    assert!(bwd("cpu_bwd", &[5, 4, 32]).contains("dq is [5, 4, 32], not [5, 4, 64]"));
    assert!(bwd("cpu_rows", &[5, 4, 64]).contains("`cpu_rows` takes dense batches only; packed ones run backward on fa2_bwd_det and cpu_bwd"));
}
