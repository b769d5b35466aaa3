use super::model::{Batch, Fault, Model};
use super::reference::loss_f64;
use crate::experiment::Backend;
use crate::model::llama::config::RopeScaling;
use crate::model::llama::Config;
use crate::ops::compare::compare;
use crate::record::Tolerance;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// SmolLM2's shape at toy size: 2 layers, width 24, 4 query heads over 2 KV heads, an odd vocabulary.
pub(crate) fn tiny(tied: bool) -> Config {
    Config {
        layers: 2,
        dim: 24,
        heads: 4,
        kv_heads: 2,
        head_dim: 6,
        ffn: 40,
        vocab: 37,
        context: 32,
        eps: 1e-5,
        rope_base: 10000.0,
        rope_dims: 6,
        rope_scaling: RopeScaling::None,
        rope_factors: None,
        tied_embeddings: tied,
    }
}

/// A tiny model with weights large enough that every path carries signal, and norm weights away from 1.
pub(crate) fn random_model(c: &Config, seed: u64) -> Model {
    super::experiment::gate_model(c, seed).unwrap()
}

pub(crate) fn random_batch(vocab: usize, rows: usize, seq: usize, seed: u64) -> Batch {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Batch::new((0..rows * (seq + 1)).map(|_| rng.random_range(0..vocab as u32)).collect(), rows, seq).unwrap()
}

/// Every parameter's gradient against central differences of the f64 loss. Bound per element:
/// |got - fd| <= 2e-6 max|fd| + 2e-5 |fd|: the trainer's f32 arithmetic (its worst element used
/// a fifth of this when written); the differences are exact to ~1e-9 with h = 1e-4.
fn gradient_check(c: &Config, fault: Fault) -> crate::record::ErrorStats {
    let m = random_model(c, 11);
    let batch = random_batch(c.vocab, 2, 7, 12);
    let mut grads = vec![0f32; m.layout.len];
    let loss = m.loss_and_grads_with(&Backend::Cpu, &batch, &mut grads, fault).unwrap();
    let w: Vec<f64> = m.params.iter().map(|&v| v as f64).collect();
    let exact = loss_f64(&m.layout, &w, &batch);
    assert!((loss - exact).abs() <= 1e-5 * exact, "f32 loss {loss} vs f64 {exact}");
    let h = 1e-4;
    let fd: Vec<f64> = (0..w.len())
        .into_par_iter()
        .map(|i| {
            let mut w = w.clone();
            w[i] += h;
            let up = loss_f64(&m.layout, &w, &batch);
            w[i] -= 2.0 * h;
            (up - loss_f64(&m.layout, &w, &batch)) / (2.0 * h)
        })
        .collect();
    let scale = fd.iter().fold(0f64, |a, b| a.max(b.abs()));
    let got: Vec<f64> = grads.iter().map(|&g| g as f64).collect();
    compare(&got, &fd, Tolerance { atol: 2e-6 * scale, rtol: 2e-5 }, "central differences of the f64 loss")
}

#[test]
fn every_gradient_matches_central_differences_tied_and_untied() {
    for tied in [false, true] {
        let e = gradient_check(&tiny(tied), Fault::None);
        assert!(e.passed(), "tied={tied}: {e:?}");
        eprintln!("tied={tied}: worst fraction of tolerance {:.3}", e.worst_fraction_of_tolerance);
    }
}

#[test]
fn the_gradient_check_catches_rmsnorm_without_its_mean_term() {
    let e = gradient_check(&tiny(false), Fault::RmsNormMeanTerm);
    assert!(!e.passed(), "a backward missing RMSNorm's mean term passed: {e:?}");
    eprintln!("planted fault: {} mismatches, worst fraction {:.1}", e.mismatches, e.worst_fraction_of_tolerance);
}

fn trainer(seed: u64, steps: usize) -> super::Trainer {
    use super::data::Stream;
    use super::optim::{AdamW, State};
    let c = tiny(true);
    let m = Model::init(&c, 0.1, seed).unwrap();
    let opt = AdamW { lr: 1e-2, min_lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, clip: 1.0, warmup: 3, steps };
    let tokens: Vec<u32> = random_batch(c.vocab, 1, 199, seed).tokens;
    let n = m.layout.len;
    super::Trainer::new(m, opt, State::new(n), Stream::new(tokens, 8).unwrap(), (3, 8), seed).unwrap()
}

#[test]
fn the_loss_of_a_fixed_batch_falls_until_it_is_learnt() {
    let mut t = trainer(3, 60);
    let batch = random_batch(37, 3, 8, 99);
    let losses: Vec<f64> = (0..60).map(|_| t.step_on(&Backend::Cpu, &batch).unwrap().loss).collect();
    // Uniform guessing over 37 tokens costs ln 37 = 3.61; 24 targets are memorised well below that.
    assert!(losses[0] > 3.0, "{losses:?}");
    assert!(losses[59] < 0.3, "the fixed batch was not learnt: {losses:?}");
}

#[test]
fn resuming_from_a_checkpoint_continues_bit_for_bit() {
    let dev = Backend::Cpu;
    let mut straight = trainer(4, 8);
    for _ in 0..8 {
        straight.step(&dev).unwrap();
    }
    let mut first = trainer(4, 8);
    for _ in 0..4 {
        first.step(&dev).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    first.save(&path).unwrap();
    assert!(first.save(&path).unwrap_err().to_string().contains("exists"), "a checkpoint was overwritten");
    let mut resumed = super::Trainer::resume(&path, first.stream.tokens.clone()).unwrap();
    for _ in 0..4 {
        resumed.step(&dev).unwrap();
    }
    assert_eq!(resumed.state.step, 8);
    assert_eq!(resumed.stream.position, straight.stream.position);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&resumed.model.params) == bits(&straight.model.params), "weights differ after resume");
    assert!(bits(&resumed.state.m) == bits(&straight.state.m) && bits(&resumed.state.v) == bits(&straight.state.v), "moments differ after resume");
    // The check can fail: a resume that lost its data position ends elsewhere.
    let mut lost = super::Trainer::resume(&path, first.stream.tokens.clone()).unwrap();
    lost.stream.position = 0;
    for _ in 0..4 {
        lost.step(&dev).unwrap();
    }
    assert!(bits(&lost.model.params) != bits(&straight.model.params), "a lost data position went unnoticed");
    let err = super::Trainer::resume(&path, vec![1; 10]).err().unwrap().to_string();
    assert!(err.contains("trained on a stream of 200 tokens; this one has 10"), "{err}");
}

/// The pipeline's loop takes its windows from the token file through the data loader: the same
/// windows in the same order as the in-memory stream, so the same weights bit for bit after
/// steps that wrap around the text twice, and the stream's position where the stream's own
/// steps leave it. The check can fail: windows one place off train other weights.
#[test]
fn windows_read_through_the_loader_train_as_the_stream_does() {
    let dev = Backend::Cpu;
    let steps = 20; // 60 windows of 24 in the text: two wraps
    let mut straight = trainer(6, steps);
    for _ in 0..steps {
        straight.step(&dev).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.safetensors");
    let mut fed = trainer(6, steps);
    super::data::write_tokens(&fed.stream.tokens, Default::default(), &path).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let run = |t: &mut super::Trainer, shift: u64| {
        let mut loader = super::data::window_loader(&path, 3, 8).unwrap();
        assert_eq!(loader.samples(), 24);
        let order: Vec<u64> = t.stream.take_window_indices(steps * 3, 8).unwrap().into_iter().map(|j| (j + shift) % 24).collect();
        let mut epoch = loader.epoch_in(order).unwrap();
        for _ in 0..steps {
            t.step_on(&dev, &super::data::next_window_batch(&mut epoch, 8).unwrap()).unwrap();
        }
        assert!(epoch.next_batch().unwrap().is_none());
    };
    run(&mut fed, 0);
    assert_eq!(fed.stream.position, straight.stream.position);
    assert!(bits(&fed.model.params) == bits(&straight.model.params), "the loader's windows trained other weights");
    let mut shifted = trainer(6, steps);
    run(&mut shifted, 1);
    assert!(bits(&shifted.model.params) != bits(&straight.model.params), "windows one place off went unnoticed");
    // A position between window starts cannot be read as windows.
    shifted.stream.position = 3;
    assert!(shifted.stream.take_window_indices(3, 8).unwrap_err().to_string().contains("data position 3 is not a window start"));
    let (offset, count) = super::data::token_data(&path).unwrap();
    assert_eq!((count, std::fs::metadata(&path).unwrap().len()), (200, offset + 800));
}

/// The GPU path's judge: the reference passes against itself, a path half as far from it as the
/// f32 attention's passes, and a backward missing RMSNorm's mean term fails.
#[test]
fn the_gpu_gradient_judge_passes_bf16_attention_and_catches_a_planted_fault() {
    use super::model::{Grads, Weights};
    let c = tiny(true);
    let m = random_model(&c, 21);
    let batch = random_batch(c.vocab, 2, 7, 22);
    let run = |fault: Fault| {
        let mut g = vec![0f32; m.layout.len];
        m.loss_and_grads_at::<half::bf16>(&Backend::Cpu, Weights::Host(&m.params), Grads::Host(&mut g), &batch, fault).unwrap();
        g
    };
    let (bf, bad) = (run(Fault::None), run(Fault::RmsNormMeanTerm));
    let mut f32g = vec![0f32; m.layout.len];
    m.loss_and_grads(&Backend::Cpu, &batch, &mut f32g).unwrap();
    let judge = super::experiment::judge_grads;
    assert_eq!(judge(&m, &bf, &bf, &f32g).mismatches, 0);
    let near: Vec<f32> = bf.iter().zip(&f32g).map(|(&b, &f)| b + 0.9 * (f - b)).collect();
    assert_eq!(judge(&m, &near, &bf, &f32g).mismatches, 0);
    let e = judge(&m, &bad, &bf, &f32g);
    assert!(e.mismatches > 0, "a backward missing RMSNorm's mean term passed: {e:?}");
    eprintln!("planted fault: {} of {} tensors, worst fraction {:.1}", e.mismatches, m.layout.spans().len(), e.worst_fraction_of_tolerance);
}

/// Two and three ranks (threads of the CPU backend) each taking their rows of the batch, the
/// gradients summed by the lab's ring: the same training as one rank on the whole batch, to the
/// order of f32 sums; and a batch that does not split is refused.
#[test]
fn data_parallel_training_follows_one_rank() {
    use super::parallel::Parallel;
    use crate::collective::group::Group;
    let steps = 6;
    let mut single = trainer(5, steps);
    single.rows = 6;
    let want: Vec<f64> = (0..steps).map(|_| single.step(&Backend::Cpu).unwrap().loss).collect();
    for n in [2, 3] {
        let mut t = trainer(5, steps);
        t.rows = 6;
        let mut p = Parallel::new(Group::host(n).unwrap(), t).unwrap();
        let got: Vec<f64> = (0..steps).map(|_| p.step().unwrap().loss).collect();
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * w, "{n} ranks, step {s}: loss {g} vs {w}");
        }
        for (r, t) in p.ranks.iter().enumerate() {
            let e = compare(&t.model.params.iter().map(|&v| v as f64).collect::<Vec<_>>(), &single.model.params.iter().map(|&v| v as f64).collect::<Vec<_>>(), Tolerance { atol: 1e-6, rtol: 1e-4 }, "one rank");
            assert!(e.passed(), "{n} ranks, rank {r}: {e:?}");
        }
    }
    let mut t = trainer(5, steps);
    t.rows = 5;
    assert!(Parallel::new(Group::host(2).unwrap(), t).err().unwrap().to_string().contains("do not split over 2 ranks"));
}
