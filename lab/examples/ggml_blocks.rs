//! Asks ggml for its own blocks of the types lab/src/quant/ggml_read.rs reads (its `TYPES`: Q5_0,
//! Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, IQ4_NL, IQ4_XS) and its reading of them, through lab/peers/ggml_blocks.c: the
//! fixtures
//! lab/tests/fixtures/ggml_blocks/*.{blocks,values} that the reader is checked against bit for bit
//! in CI, which has no llama.cpp. The inputs (`inputs.f32`, 4 rows of 256, seeded) hold the blocks
//! a reader gets wrong first: Gaussian values, a zero and a constant sub-block, magnitudes from
//! 1e-3 to 1e4 block by block, and positive values with one outlier (the min path of Q5_1, Q2_K,
//! Q4_K and Q5_K).
//!
//! `LAB_LLAMA_CPP=DIR/build/bin cargo run --release --example ggml_blocks -- FIXTURE_DIR`
//! (scripts/llama-cpp.sh build TAR DIR cpu builds llama.cpp).

use lab::experiment::llama_cpp;
use lab::quant::ggml_read::TYPES;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use std::path::PathBuf;

const ROW: usize = 256;

fn inputs() -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261129);
    let mut gauss = move || -> f32 { StandardNormal.sample(&mut rng) };
    let mut x: Vec<f32> = (0..4 * ROW).map(|_| gauss()).collect();
    let row = |r: usize| r * ROW..(r + 1) * ROW;
    x[row(1)][64..96].fill(0.0);
    x[row(1)][160..192].fill(0.7);
    for (b, v) in x[row(2)].chunks_exact_mut(32).enumerate() {
        v.iter_mut().for_each(|v| *v *= 10f32.powi(b as i32 - 3));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    x[row(3)].iter_mut().for_each(|v| *v = 2.0 + rng.random::<f32>());
    x[3 * ROW + 77] = 40.0;
    x
}

fn main() -> lab::Result<()> {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: ggml_blocks FIXTURE_DIR (LAB_LLAMA_CPP set)");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&dir).map_err(|e| lab::LabError::io(&dir, e))?;
    let x = inputs();
    let write = |name: String, bytes: &[u8]| std::fs::write(dir.join(&name), bytes).map_err(|e| lab::LabError::io(dir.join(name), e));
    write("inputs.f32".into(), &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    for ty in TYPES {
        let (blocks, values) = llama_cpp::ggml_blocks(ty, ROW, &x)?;
        let name = ty.name().to_lowercase();
        write(format!("{name}.blocks"), &blocks)?;
        write(format!("{name}.values"), &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
        println!("{name}: {} bytes of blocks for {} values", blocks.len(), values.len());
    }
    Ok(())
}
