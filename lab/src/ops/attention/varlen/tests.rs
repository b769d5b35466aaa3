use super::*;
use rand::SeedableRng;

const CAUSAL: Mask = Mask {
    causal: true,
    window: 0,
};

/// Packed inputs for `lens` and the CPU forward of them: (q, k, v, o, lse).
type Packed<T> = (Vec<T>, Vec<T>, Vec<T>, Vec<T>, Vec<f32>);
fn packed_cpu<T: Elem>(offs: &Varlen, (hq, hkv, d): (usize, usize, usize), m: Mask) -> Packed<T> {
    let dev = Backend::Cpu;
    let (tq, tk) = offs.totals();
    let mut rng = rand::rngs::StdRng::seed_from_u64(tq as u64 * 7 + tk as u64);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (
        input(tq * hq * d, 1.0, &mut rng),
        input(tk * hkv * d, 1.0, &mut rng),
        input(tk * hkv * d, 1.0, &mut rng),
    );
    let t = |shape: &[usize], x: &[T]| Tensor::from_slice(&dev, shape, x).unwrap();
    let mut o = t(&[tq, hq, d], &vec![T::from_f32(f32::NAN); tq * hq * d]);
    let mut lse = Tensor::from_slice(&dev, &[hq, tq], &vec![f32::NAN; hq * tq]).unwrap();
    forward(
        &dev,
        &t(&[tq, hq, d], &q),
        &t(&[tk, hkv, d], &k),
        &t(&[tk, hkv, d], &v),
        offs,
        m,
        &mut o,
        &mut lse,
    )
    .unwrap();
    (q, k, v, o.to_vec().unwrap(), lse.to_vec().unwrap())
}

/// Every row of every sequence against the f64 reference of that sequence alone.
fn judge<T: Elem>(
    offs: &Varlen,
    (hq, hkv, d): (usize, usize, usize),
    m: Mask,
    (q, k, v, o, lse): &Packed<T>,
) -> bool {
    let tq = offs.totals().0;
    (0..offs.batch())
        .filter(|&b| !offs.seq(b).0.is_empty())
        .all(|b| {
            let ((rq, rk), db) = (offs.seq(b), offs.seq_dims(b, hq, hkv, d));
            let (qr, kr) = (
                rq.start * hq * d..rq.end * hq * d,
                rk.start * hkv * d..rk.end * hkv * d,
            );
            let rows: Vec<_> = (0..hq * db.sq).map(|r| (0, r / db.sq, r % db.sq)).collect();
            let e = Expected::new(db, m, &q[qr.clone()], &k[kr.clone()], &v[kr], rows);
            let lse_b: Vec<f32> = (0..hq)
                .flat_map(|h| lse[h * tq + rq.start..h * tq + rq.end].to_vec())
                .collect();
            compare_elems(&e.gather(db, &o[qr]), &e.o, e.tol, "f64").passed()
                && compare_elems(
                    &e.gather_lse(db, &lse_b),
                    &e.lse,
                    Tolerance {
                        atol: 1e-3,
                        rtol: 1e-4,
                    },
                    "f64",
                )
                .passed()
        })
}

#[test]
fn each_packed_sequence_matches_its_own_reference() {
    let lens = [
        (1, 1),
        (17, 17),
        (0, 0),
        (5, 40),
        (3, 0),
        (130, 130),
        (200, 77),
    ];
    let offs = Varlen::from_lengths(&Backend::Cpu, &lens).unwrap();
    assert_eq!(
        (
            offs.batch(),
            offs.totals(),
            offs.dims(4, 2, 64).sq,
            offs.dims(4, 2, 64).sk
        ),
        (7, (356, 265), 200, 130)
    );
    for (m, heads) in [
        (CAUSAL, (4, 2, 64)),
        (
            Mask {
                causal: false,
                window: 9,
            },
            (2, 2, 128),
        ),
    ] {
        let p = packed_cpu::<half::bf16>(&offs, heads, m);
        assert!(judge(&offs, heads, m, &p), "{m:?} {heads:?}");
        // A row of a sequence with no keys: O = 0 and lse = -inf (sequence 4, rows 23..26).
        assert!(p.3[23 * heads.0 * heads.2..26 * heads.0 * heads.2]
            .iter()
            .all(|x| x.to_f32() == 0.0));
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
    let (o, lse) = {
        let dev = Backend::Cpu;
        let t = |shape: &[usize], x: &[half::bf16]| Tensor::from_slice(&dev, shape, x).unwrap();
        let (mut o, mut lse) = (
            t(&[39, 2, 64], q),
            Tensor::<f32>::zeros(&dev, &[2, 39]).unwrap(),
        );
        forward(
            &dev,
            &t(&[39, 2, 64], q),
            &t(&[39, 1, 64], k),
            &t(&[39, 1, 64], v),
            &shifted,
            CAUSAL,
            &mut o,
            &mut lse,
        )
        .unwrap();
        (o.to_vec().unwrap(), lse.to_vec().unwrap())
    };
    assert!(
        !judge(
            &offs,
            heads,
            CAUSAL,
            &(q.clone(), k.clone(), v.clone(), o, lse)
        ),
        "a sequence read from the wrong rows passed"
    );
}

#[test]
fn bad_offsets_and_shapes_are_named() {
    let dev = Backend::Cpu;
    let err = |q: &[usize], k: &[usize]| {
        Varlen::new(&dev, q, k)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(
        err(&[0, 5, 3], &[0, 5, 9]).contains("cu_seqlens_q decreases at index 2: 5 then 3"),
        "{}",
        err(&[0, 5, 3], &[0, 5, 9])
    );
    assert!(err(&[1, 5], &[0, 5]).contains("cu_seqlens_q starts at 1, not 0"));
    assert!(err(&[0], &[0]).contains("holds 1 offsets"));
    assert!(err(&[0, 5, 9], &[0, 5]).contains("cu_seqlens_q holds 3 offsets but cu_seqlens_k 2"));
    let offs = Varlen::from_lengths(&dev, &[(3, 4), (2, 2)]).unwrap();
    let t = |shape: &[usize]| Tensor::<half::bf16>::zeros(&dev, shape).unwrap();
    let run = |variant: &str, q: &[usize], k: &[usize], lse: &[usize]| {
        let (mut o, mut l) = (t(q), Tensor::<f32>::zeros(&dev, lse).unwrap());
        forward_with(
            &dev,
            variant,
            &t(q),
            &t(k),
            &t(k),
            &offs,
            Mask::default(),
            &mut o,
            &mut l,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    assert_eq!(run("cpu_rows", &[5, 4, 64], &[6, 2, 64], &[4, 5]), "");
    assert!(run("cpu_rows", &[6, 4, 64], &[6, 2, 64], &[4, 6])
        .contains("q has 6 rows and k 6, but the offsets end at 5 and 6"));
    assert!(run("cpu_rows", &[5, 3, 64], &[6, 2, 64], &[3, 5])
        .contains("query heads be a multiple of the key/value heads"));
    assert!(run("cpu_rows", &[5, 4, 64], &[6, 2, 64], &[5, 4])
        .contains("lse is [5, 4], not [heads, total_q] = [4, 5]"));
    assert!(run("cpu_rows", &[1, 5, 4, 64], &[6, 2, 64], &[4, 5])
        .contains("packed tensors are [total_rows, heads, head_dim]"));
    assert!(run("cpu_bwd", &[5, 4, 64], &[6, 2, 64], &[4, 5])
        .contains("`cpu_bwd` takes dense batches only"));
}
