use super::reference::{self, dense_masked, kept};
use super::*;
use crate::ops::compare::compare_within;
use crate::experiment::Experiment;
use half::bf16;

const CPU: Backend = Backend::Cpu;

fn lcg(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect()
}

fn b16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

struct Layer {
    x: Vec<bf16>,
    router: Vec<bf16>,
    gate_up: Vec<bf16>,
    down: Vec<bf16>,
    dims: (usize, usize, usize, usize),
}

/// A layer of random bf16 weights; `hot` biases every token's first choice to one expert.
fn layer(t: usize, h: usize, e: usize, i: usize, hot: Option<usize>) -> Layer {
    let mut router = lcg(h * e, 3, 1.0 / (h as f32).sqrt());
    let mut x = lcg(t * h, 1, 1.0);
    if let Some(hot) = hot {
        x.iter_mut().step_by(h).for_each(|v| *v = 1.0);
        router[..e].iter_mut().enumerate().for_each(|(j, w)| *w = if j == hot { 30.0 } else { 0.0 });
    }
    Layer { x: b16(&x), router: b16(&router), gate_up: b16(&lcg(e * h * 2 * i, 5, 1.0 / (h as f32).sqrt())), down: b16(&lcg(e * i * h, 7, 1.0 / (i as f32).sqrt())), dims: (t, h, e, i) }
}

fn weights(l: &Layer, dev: &Backend) -> Weights<bf16> {
    let (_, h, e, i) = l.dims;
    Weights {
        router: Tensor::from_slice(dev, &[h, e], &l.router).unwrap(),
        noise: None,
        gate_up: Tensor::from_slice(dev, &[e, h, 2 * i], &l.gate_up).unwrap(),
        down: Tensor::from_slice(dev, &[e, i, h], &l.down).unwrap(),
    }
}

fn logits64(l: &Layer) -> Vec<f64> {
    let (t, h, e, _) = l.dims;
    let (x, w) = (Tensor::from_vec(&[t, h], l.x.clone()).unwrap(), weights(l, &CPU));
    let mut lg = Tensor::<bf16>::zeros(&CPU, &[t, e]).unwrap();
    crate::ops::gemm::matmul(&CPU, &x, &w.router, &mut lg).unwrap();
    crate::ops::widen(&lg.to_vec().unwrap())
}

/// The CPU layer against the f64 reference on the routing it made (each element within its
/// allowance); returns the comparison.
fn check_layer(l: &Layer, r: &Router) -> crate::record::ErrorStats {
    let (t, h, e, i) = l.dims;
    let x = Tensor::from_vec(&[t, h], l.x.clone()).unwrap();
    let mut out = Tensor::<bf16>::zeros(&CPU, &[t, h]).unwrap();
    forward(&CPU, &x, &weights(l, &CPU), r, &mut out).unwrap();
    let rref = reference::route(&logits64(l), None, t, e, r);
    let keep = kept(&rref.experts, t, r.k, e, r.capacity.slots(t, e));
    let want = reference::layer(&l.x, &l.gate_up, &l.down, (h, e, i), r.k, &rref.experts, &rref.weights, &keep, &(0..t).collect::<Vec<_>>());
    compare_within(&crate::ops::widen(&out.to_vec().unwrap()), &want.out, &want.allow, "test", "cpu-f64")
}

#[test]
fn routing_matches_the_f64_router_and_ties_go_to_the_lower_expert() {
    // Ties: experts 1, 2 and 3 share the largest logit; 0 and 4 the next.
    let logits = vec![bf16::from_f32(0.5), bf16::from_f32(2.0), bf16::from_f32(2.0), bf16::from_f32(2.0), bf16::from_f32(0.5)];
    let lt = Tensor::from_vec(&[1, 5], logits).unwrap();
    for (k, want) in [(1, vec![1]), (2, vec![1, 2]), (4, vec![1, 2, 3, 0])] {
        let rt = route_logits(&CPU, &lt, None, &Router::top_k(k)).unwrap();
        assert_eq!(rt.experts.to_vec().unwrap(), want);
        let r64 = reference::route(&[0.5, 2.0, 2.0, 2.0, 0.5], None, 1, 5, &Router::top_k(k));
        assert_eq!(r64.experts, want.iter().map(|&v| v as usize).collect::<Vec<_>>());
    }
    for (t, e, k, scoring, renorm) in [(1, 4, 2, Scoring::Softmax, true), (3, 8, 1, Scoring::Sigmoid, false), (1000, 64, 8, Scoring::Softmax, false), (37, 256, 8, Scoring::Sigmoid, true)] {
        let l = layer(t, 24, e, 8, None);
        let r = Router { scoring, renormalize: renorm, ..Router::top_k(k) };
        let lg = Tensor::from_vec(&[t, e], b16(&logits64(&l).iter().map(|&v| v as f32).collect::<Vec<_>>())).unwrap();
        let rt = route_logits(&CPU, &lg, None, &r).unwrap();
        let rref = reference::route(&crate::ops::widen(&lg.to_vec().unwrap()), None, t, e, &r);
        let got: Vec<usize> = rt.experts.to_vec().unwrap().iter().map(|&v| v as usize).collect();
        assert_eq!(got, rref.experts, "{t} tokens, {e} experts, top-{k}");
        for (g, w) in rt.weights.to_vec().unwrap().iter().zip(&rref.weights) {
            assert!((*g as f64 - w).abs() <= 1e-5 * w.abs() + 1e-9, "weight {g} against {w}");
        }
        if renorm {
            for row in rt.weights.to_vec().unwrap().chunks(k) {
                assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "renormalised weights sum to 1: {row:?}");
            }
        }
        let load: Vec<usize> = rt.load.to_vec().unwrap().iter().map(|&v| v as usize).collect();
        assert_eq!(load, rref.load);
        assert_eq!(load.iter().sum::<usize>(), t * k);
        let losses = rt.losses.to_vec().unwrap();
        assert!((losses[0] as f64 - rref.aux_loss).abs() <= 1e-4 * rref.aux_loss, "aux {} against {}", losses[0], rref.aux_loss);
        assert!((losses[1] as f64 - rref.z_loss).abs() <= 1e-4 * rref.z_loss, "z {} against {}", losses[1], rref.z_loss);
    }
}

#[test]
fn the_losses_are_switch_and_st_moe_by_hand() {
    // Two tokens, two experts, top-1, equal logits per token: P = (1/2, 1/2); token 0 picks
    // expert 0 (tie), token 1 prefers expert 1. f = (1/2, 1/2): aux = alpha 2 (1/4 + 1/4) = alpha.
    let r = Router { renormalize: false, ..Router::top_k(1) };
    let rref = reference::route(&[0.0, 0.0, 0.0, 1e-9], None, 2, 2, &r);
    assert_eq!(rref.experts, vec![0, 1]);
    assert!((rref.aux_loss - 0.01).abs() < 1e-9, "{}", rref.aux_loss);
    // lse of (0, 0) is ln 2: z = (ln 2)^2.
    assert!((rref.z_loss - 2f64.ln().powi(2)).abs() < 1e-8, "{}", rref.z_loss);
    // All tokens on one expert: f = (1, 0), P -> (1, 0): aux -> alpha E.
    let rref = reference::route(&[50.0, 0.0, 50.0, 0.0], None, 2, 2, &r);
    assert!((rref.aux_loss - 0.02).abs() < 1e-9, "{}", rref.aux_loss);
}

#[test]
fn noisy_gating_is_seeded_and_moves_the_choice() {
    let (t, h, e) = (64, 16, 8);
    let l = layer(t, h, e, 8, None);
    let mut w = weights(&l, &CPU);
    w.noise = Some(Tensor::from_slice(&CPU, &[h, e], &b16(&lcg(h * e, 11, 2.0))).unwrap());
    let x = Tensor::from_vec(&[t, h], l.x.clone()).unwrap();
    let r = Router { noise_seed: Some(9), ..Router::top_k(2) };
    let a = route(&CPU, &x, &w, &r).unwrap().experts.to_vec().unwrap();
    assert_eq!(a, route(&CPU, &x, &w, &r).unwrap().experts.to_vec().unwrap(), "same seed, same routing");
    let clean = route(&CPU, &x, &w, &Router::top_k(2)).unwrap().experts.to_vec().unwrap();
    assert_ne!(a, clean, "noise of scale softplus(2) moves some choices");
    let other = route(&CPU, &x, &w, &Router { noise_seed: Some(10), ..r }).unwrap().experts.to_vec().unwrap();
    assert_ne!(a, other, "another seed, another routing");
    // The reference with the same eps agrees.
    let (lg, noisy) = router_logits(&CPU, &x, &w, &r).unwrap();
    let (n, eps) = noisy.unwrap();
    let eps64: Vec<f64> = eps.to_vec().unwrap().iter().map(|&v| v as f64).collect();
    let rref = reference::route(&crate::ops::widen(&lg.to_vec().unwrap()), Some((&crate::ops::widen(&n.to_vec().unwrap()), &eps64)), t, e, &r);
    assert_eq!(a.iter().map(|&v| v as usize).collect::<Vec<_>>(), rref.experts);
}

#[test]
fn capacity_drops_the_late_assignments_and_dropless_keeps_all() {
    // All four tokens on expert 2 first, then expert 0: capacity ceil(4 / 4 * 1.0) = 1.
    let experts = vec![2, 0, 2, 0, 2, 1, 2, 3];
    let p = cpu::permute(&experts, 4, 2, 4, 1);
    let want_keep = kept(&[2, 0, 2, 0, 2, 1, 2, 3], 4, 2, 4, 1);
    let keep: Vec<bool> = p.slot.iter().map(|&s| s >= 0).collect();
    assert_eq!(keep, want_keep);
    // Expert 2 keeps token 0's first choice only; expert 0 token 0's second (first choices
    // before second), expert 1 and 3 theirs.
    assert_eq!(keep, vec![true, true, false, false, false, true, false, true]);
    assert_eq!(p.offsets, vec![0, 1, 2, 3, 4]);
    // Dropless: every assignment, segments in expert order, rows slot-major within one.
    let p = cpu::permute(&experts, 4, 2, 4, 4);
    assert_eq!(p.offsets, vec![0, 2, 3, 7, 8]);
    assert_eq!(p.rows, vec![0, 1, 2, 0, 1, 2, 3, 3]);
    assert!(p.slot.iter().all(|&s| s >= 0));
    // Switch's count: ceil(T / E * factor).
    assert_eq!(Capacity::Factor(1.25).slots(1000, 16), 79);
    assert_eq!(Capacity::Dropless.slots(1000, 16), 1000);
}

#[test]
fn permute_then_unpermute_with_unit_weights_sums_the_copies() {
    let (t, k, e, h) = (5, 2, 3, 4);
    let x: Vec<bf16> = b16(&(0..t * h).map(|v| v as f32).collect::<Vec<_>>());
    let xt = Tensor::from_vec(&[t, h], x.clone()).unwrap();
    let rt = Routing {
        experts: Tensor::from_vec(&[t, k], vec![2, 0, 1, 2, 2, 1, 0, 1, 2, 0]).unwrap(),
        weights: Tensor::from_vec(&[t, k], vec![1.0; t * k]).unwrap(),
        load: Tensor::from_vec(&[e], vec![0; e]).unwrap(),
        losses: Tensor::from_vec(&[2], vec![0.0; 2]).unwrap(),
    };
    let (perm, xp) = permute(&CPU, &xt, &rt, Capacity::Dropless).unwrap();
    let mut out = Tensor::<bf16>::zeros(&CPU, &[t, h]).unwrap();
    unpermute(&CPU, &xp, &perm, &rt.weights, &mut out).unwrap();
    let got: Vec<f32> = out.to_vec().unwrap().iter().map(|v| v.to_f32()).collect();
    assert_eq!(got, x.iter().map(|v| 2.0 * v.to_f32()).collect::<Vec<_>>());
    assert_eq!(perm.offsets.to_vec().unwrap(), vec![0, 3, 6, 10]);
}

#[test]
fn dropless_layer_equals_the_dense_masked_layer() {
    for (t, h, e, i, k) in [(1, 16, 4, 8, 2), (3, 24, 8, 16, 2), (1000, 16, 16, 8, 4)] {
        let l = layer(t, h, e, i, None);
        let r = Router::top_k(k);
        let x = Tensor::from_vec(&[t, h], l.x.clone()).unwrap();
        let mut out = Tensor::<bf16>::zeros(&CPU, &[t, h]).unwrap();
        let rt = forward(&CPU, &x, &weights(&l, &CPU), &r, &mut out).unwrap();
        let mut gates = vec![0f64; t * e];
        let (ex, wt) = (rt.experts.to_vec().unwrap(), rt.weights.to_vec().unwrap());
        for a in 0..t * k {
            gates[(a / k) * e + ex[a] as usize] = wt[a] as f64;
        }
        let w64 = |v: &[bf16]| crate::ops::widen(v);
        let dense = dense_masked(&w64(&l.x), &w64(&l.gate_up), &w64(&l.down), l.dims, &gates);
        let rref = reference::route(&logits64(&l), None, t, e, &r);
        let keep = vec![true; t * k];
        let want = reference::layer(&l.x, &l.gate_up, &l.down, (h, e, i), k, &rref.experts, &rref.weights, &keep, &(0..t).collect::<Vec<_>>());
        let got = crate::ops::widen(&out.to_vec().unwrap());
        let s = compare_within(&got, &dense, &want.allow, "test", "dense masked");
        assert!(s.passed(), "{t} tokens: {s:?}");
        assert!(check_layer(&l, &r).passed());
    }
}

#[test]
fn odd_loads_pass_and_a_planted_fault_fails() {
    // All tokens on one expert (the rest empty), with and without a capacity that drops most.
    let l = layer(33, 24, 8, 16, Some(5));
    assert!(check_layer(&l, &Router::top_k(2)).passed());
    let r = Router { capacity: Capacity::Factor(1.0), ..Router::top_k(2) };
    let (t, h, e, _) = l.dims;
    let x = Tensor::from_vec(&[t, h], l.x.clone()).unwrap();
    let rt = route(&CPU, &x, &weights(&l, &CPU), &r).unwrap();
    assert_eq!(rt.load.to_vec().unwrap()[5], 33, "every first choice on expert 5");
    let (perm, _) = permute(&CPU, &x, &rt, r.capacity).unwrap();
    let kept_rows = perm.offsets.to_vec().unwrap()[e];
    assert!((5..66).contains(&kept_rows), "capacity 5 per expert drops: {kept_rows} rows kept");
    assert!(check_layer(&l, &r).passed());
    // Planted faults: one output element nudged past its allowance; an expert's weights swapped.
    let (t, h, e, i) = (17, 16, 4, 8);
    let l = layer(t, h, e, i, None);
    let r = Router::top_k(2);
    let x = Tensor::from_vec(&[t, h], l.x.clone()).unwrap();
    let mut out = Tensor::<bf16>::zeros(&CPU, &[t, h]).unwrap();
    forward(&CPU, &x, &weights(&l, &CPU), &r, &mut out).unwrap();
    let rref = reference::route(&logits64(&l), None, t, e, &r);
    let keep = vec![true; t * 2];
    let want = reference::layer(&l.x, &l.gate_up, &l.down, (h, e, i), 2, &rref.experts, &rref.weights, &keep, &(0..t).collect::<Vec<_>>());
    let mut got = crate::ops::widen(&out.to_vec().unwrap());
    assert!(compare_within(&got, &want.out, &want.allow, "t", "t").passed());
    got[40] += 3.0 * want.allow[40];
    let s = compare_within(&got, &want.out, &want.allow, "t", "t");
    assert_eq!((s.mismatches, s.worst_index), (1, Some(40)), "{s:?}");
    let mut swapped = layer(t, h, e, i, None);
    let per = h * 2 * i;
    let (a, b) = swapped.gate_up.split_at_mut(per);
    a.swap_with_slice(&mut b[..per]);
    let xs = Tensor::from_vec(&[t, h], swapped.x.clone()).unwrap();
    let mut bad = Tensor::<bf16>::zeros(&CPU, &[t, h]).unwrap();
    forward(&CPU, &xs, &weights(&swapped, &CPU), &r, &mut bad).unwrap();
    let s = compare_within(&crate::ops::widen(&bad.to_vec().unwrap()), &want.out, &want.allow, "t", "t");
    assert!(s.mismatches > 0, "experts 0 and 1 swapped must fail: {s:?}");
}

#[test]
fn bad_input_is_named() {
    let l = layer(4, 8, 4, 4, None);
    let x = Tensor::from_vec(&[4, 8], l.x.clone()).unwrap();
    let w = weights(&l, &CPU);
    let mut out = Tensor::<bf16>::zeros(&CPU, &[4, 8]).unwrap();
    let err = |r: Result<Routing>| r.err().expect("must fail").to_string();
    assert!(err(forward(&CPU, &x, &w, &Router::top_k(5), &mut out)).contains("k = 5 is more than the 4 experts"));
    assert!(err(forward(&CPU, &x, &w, &Router::top_k(0), &mut out)).contains("k = 0: each token goes to 1 to 8 experts"));
    let r = Router { capacity: Capacity::Factor(-1.0), ..Router::top_k(2) };
    assert!(err(forward(&CPU, &x, &w, &r, &mut out)).contains("capacity factor -1 must be a positive number"));
    let narrow = Tensor::from_vec(&[4, 7], vec![bf16::ZERO; 28]).unwrap();
    let e = err(forward(&CPU, &narrow, &w, &Router::top_k(2), &mut out));
    assert!(e.contains("the router weight is [8, 4] but x is [4, 7]"), "{e}");
    let mut short = Tensor::<bf16>::zeros(&CPU, &[4, 6]).unwrap();
    assert!(err(forward(&CPU, &x, &w, &Router::top_k(2), &mut short)).contains("out is [4, 6]; it must be x's shape [4, 8]"));
    let bad_down = Weights { down: Tensor::from_vec(&[4, 3, 8], vec![bf16::ZERO; 96]).unwrap(), ..weights(&l, &CPU) };
    let e = err(forward(&CPU, &x, &bad_down, &Router::top_k(2), &mut out));
    assert!(e.contains("down is [4, 3, 8]; with gate_up [4, 8, 8] it must be [4, 4, 8]"), "{e}");
    let e = err(forward_with(&CPU, "grouped_mma", &x, &w, &Router::top_k(2), &mut out));
    assert!(e.contains("`grouped_mma` needs gpu, not the CPU backend"), "{e}");
    let e = err(forward_with(&CPU, "magic", &x, &w, &Router::top_k(2), &mut out));
    assert!(e.contains("`magic` is not a moe variant (one of: cublas_loop, grouped_mma, grouped_wgmma, grouped_wgmma_persistent, grouped_wgmma_fused, grouped_wgmma_n128, cpu_loop)"), "{e}");
    let e = err(forward_with(&CPU, "grouped_wgmma", &x, &w, &Router::top_k(2), &mut out));
    assert!(e.contains("`grouped_wgmma` needs sm_90a, not the CPU backend"), "{e}");
    let noisy = Router { noise_seed: Some(1), ..Router::top_k(2) };
    assert!(err(forward(&CPU, &x, &w, &noisy, &mut out)).contains("noisy gating needs the noise projection"));
    // The grouped product names its mismatches too.
    let a = Tensor::from_vec(&[3, 8], vec![bf16::ZERO; 24]).unwrap();
    let off = Tensor::from_vec(&[5], vec![0, 1, 2, 3, 3]).unwrap();
    let mut c = Tensor::<bf16>::zeros(&CPU, &[3, 4]).unwrap();
    let e = grouped_matmul(&CPU, &a, &w.gate_up, &off, Epilogue::Store, &mut c).unwrap_err().to_string();
    assert!(e.contains("C is [3, 4]; it must be [3, 8]"), "{e}");
    let off3 = Tensor::from_vec(&[3], vec![0, 1, 2]).unwrap();
    let e = grouped_matmul(&CPU, &a, &w.gate_up, &off3, Epilogue::SwiGlu, &mut c).unwrap_err().to_string();
    assert!(e.contains("offsets are [3]; B has 4 experts, so they must be [5]"), "{e}");
}

#[test]
fn the_table_names_each_rung_once_and_the_cpu_runs_cpu_loop() {
    assert_eq!(best(&CPU).name, "cpu_loop");
    let names = variant::names(VARIANTS);
    assert_eq!(names, vec!["cublas_loop", "grouped_mma", "grouped_wgmma", "grouped_wgmma_persistent", "grouped_wgmma_fused", "grouped_wgmma_n128", "cpu_loop"]);
    assert!(gpu_symbols().contains("moe_grouped_mma_bf16") && gpu_symbols().contains("moe_grouped_wgmma_n128_f16"));
    // The experiment's gates are small and odd; its quick sweep is tiny on the CPU.
    let cases = Moe.cases(&CPU, true);
    assert!(cases.iter().any(|c| c["tokens"] == 1) && cases.iter().any(|c| c["tokens"] == 3) && cases.iter().any(|c| c["tokens"] == 1000));
    assert!(cases.iter().any(|c| c["load"] == "one") && cases.iter().any(|c| c["noisy"] == true));
}

/// The CPU backward against the f64 gradients: (the judgement, the gradients, the expected ones).
fn check_backward(l: &Layer, r: &Router, noisy: bool) -> (crate::record::ErrorStats, [Option<Vec<f64>>; 5], (backward_reference::Grads, backward_reference::Grads)) {
    let (t, h, e, _) = l.dims;
    let x = Tensor::from_vec(&[t, h], l.x.clone()).unwrap();
    let mut w = weights(l, &CPU);
    w.noise = noisy.then(|| Tensor::from_vec(&[h, e], b16(&lcg(h * e, 11, 0.5))).unwrap());
    let dout = Tensor::from_vec(&[t, h], b16(&lcg(t * h, 13, 1.0))).unwrap();
    let up = Upstream { dout: &dout, d_aux: 40.0, d_z: 0.5 };
    let (rt, g) = backward(&CPU, &x, &w, r, &up).unwrap();
    let select: Vec<usize> = rt.experts.to_vec().unwrap().iter().map(|&v| v as usize).collect();
    let want = backward_reference::expected(&x, &w, r, &up, &select, None).unwrap();
    let got = backward_reference::widened(&g).unwrap();
    let stats = backward_reference::compare(got.each_ref().map(|g| g.as_deref()), &want, DType::Bf16);
    (stats, got, want)
}

#[test]
fn the_backward_matches_the_f64_gradients_and_a_planted_fault_fails() {
    let base = Router::top_k(2);
    let cases = [
        (layer(13, 24, 6, 10, None), base, false),
        (layer(9, 16, 5, 6, None), Router { scoring: Scoring::Sigmoid, renormalize: false, k: 3, capacity: Capacity::Factor(1.0), ..base }, false),
        (layer(11, 20, 8, 12, None), Router { noise_seed: Some(4), ..base }, true),
        // Every first choice on expert 2: the other experts' weight gradients come from second choices only.
        (layer(17, 16, 8, 8, Some(2)), Router::top_k(1), false),
    ];
    for (l, r, noisy) in &cases {
        let (s, _, _) = check_backward(l, r, *noisy);
        assert!(s.passed(), "{r:?}: {s:?}");
    }
    // Planted faults the judgement must catch: gate and up gradients swapped, and the z-loss's
    // term missing from the router gradient.
    let (l, r, _) = &cases[0];
    let (_, got, want) = check_backward(l, r, false);
    let mut swapped = got.clone();
    swapped[3].as_mut().unwrap().chunks_mut(2).for_each(|p| p.swap(0, 1));
    let s = backward_reference::compare(swapped.each_ref().map(|g| g.as_deref()), &want, DType::Bf16);
    assert!(s.mismatches > 0, "gate and up swapped must fail: {s:?}");
    let (t, h, _, _) = l.dims;
    let x = Tensor::from_vec(&[t, h], l.x.clone()).unwrap();
    let dout = Tensor::from_vec(&[t, h], b16(&lcg(t * h, 13, 1.0))).unwrap();
    let (_, g) = backward(&CPU, &x, &weights(l, &CPU), r, &Upstream { dout: &dout, d_aux: 40.0, d_z: 0.0 }).unwrap();
    let no_z = backward_reference::widened(&g).unwrap();
    let s = backward_reference::compare(no_z.each_ref().map(|g| g.as_deref()), &want, DType::Bf16);
    let router_over = s.bound.as_deref().unwrap().split(", ").any(|p| p.starts_with("router") && p.ends_with("(over)"));
    assert!(s.mismatches > 0 && router_over, "a router gradient without the z-loss must fail in norm: {s:?}");
}

#[test]
fn bad_backward_input_is_named() {
    let l = layer(5, 8, 4, 6, None);
    let x = Tensor::from_vec(&[5, 8], l.x.clone()).unwrap();
    let w = weights(&l, &CPU);
    let short = Tensor::<bf16>::zeros(&CPU, &[4, 8]).unwrap();
    let err = backward(&CPU, &x, &w, &Router::top_k(2), &Upstream { dout: &short, d_aux: 0.0, d_z: 0.0 }).err().unwrap().to_string();
    assert!(err.contains("dout is [4, 8]"), "{err}");
    let dout = Tensor::<bf16>::zeros(&CPU, &[5, 8]).unwrap();
    let err = backward(&CPU, &x, &w, &Router::top_k(2), &Upstream { dout: &dout, d_aux: f32::NAN, d_z: 0.0 }).err().unwrap().to_string();
    assert!(err.contains("must be finite"), "{err}");
}
