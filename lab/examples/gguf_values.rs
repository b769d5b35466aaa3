//! Do two GGUF files hold the same values? Reads every tensor of each through the lab's readers
//! (`quant::ggml::to_f32`) and counts, tensor by tensor, the values whose f32 bits differ. With a
//! quantized file and llama.cpp's own dequantization of it (`llama-quantize --allow-requantize
//! IN OUT F32`), a count of zero says the lab reads every block as llama.cpp does.
//!
//! `cargo run --release --example gguf_values -- A.gguf B.gguf`

use lab::quant::ggml::to_f32;
use lab::weights::gguf::GgufFile;

fn main() -> lab::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [a, b] = args.as_slice() else {
        eprintln!("usage: gguf_values A.gguf B.gguf");
        std::process::exit(2);
    };
    let (fa, fb) = (GgufFile::open(a)?, GgufFile::open(b)?);
    let (ga, gb) = (fa.parse()?, fb.parse()?);
    let (mut tensors, mut values, mut differ) = (0, 0u64, 0u64);
    for t in &ga.tensors {
        let Some(u) = gb.tensor(&t.name) else {
            println!("{}: only in {a}", t.name);
            differ += t.elements();
            continue;
        };
        let (x, y) = (to_f32(t.ty, ga.data(t))?, to_f32(u.ty, gb.data(u))?);
        let n = if x.len() == y.len() { x.iter().zip(&y).filter(|(p, q)| p.to_bits() != q.to_bits()).count() as u64 } else { x.len().max(y.len()) as u64 };
        if n > 0 {
            println!("{}: {n} of {} values differ ({} against {})", t.name, x.len(), t.ty.name(), u.ty.name());
        }
        (tensors, values, differ) = (tensors + 1, values + x.len() as u64, differ + n);
    }
    println!("{tensors} tensors, {values} values, {differ} differ");
    if differ > 0 {
        std::process::exit(1);
    }
    Ok(())
}
