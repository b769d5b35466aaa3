//! INT4 packing: two 4-bit codes per byte.
//!
//! Nibble order: element `2i` goes to the LOW nibble (bits 0..3) of byte `i`, element `2i + 1` to
//! the HIGH nibble (bits 4..7). Read as a little-endian u32, word `j` holds elements
//! `8j .. 8j + 7` in nibbles 0..7, lowest first: the GPU kernels rely on this.
//! An odd count packs its last element into a low nibble with a zero high nibble; unpacking needs
//! the element count and checks that the byte count matches it.
//! (GGUF's Q4_0 / Q4_1 blocks use a different order inside a block: see [`super::ggml`].)

use crate::{LabError, Result};
use rayon::prelude::*;

/// Below this many elements the work stays on one thread.
const PAR_MIN: usize = 1 << 20;
/// Elements per parallel task (even, so tasks split on byte boundaries).
const CHUNK: usize = 1 << 16;

/// Bytes needed for `n` codes.
pub fn packed_len(n: usize) -> usize {
    n.div_ceil(2)
}

/// Packs codes (each 0..=15) two per byte. A code above 15 is an error naming its index.
pub fn pack(codes: &[u8]) -> Result<Vec<u8>> {
    let mut out = vec![0u8; packed_len(codes.len())];
    pack_into(codes, &mut out)?;
    Ok(out)
}

/// Packs into `out`, which must hold exactly `packed_len(codes.len())` bytes.
pub fn pack_into(codes: &[u8], out: &mut [u8]) -> Result<()> {
    if out.len() != packed_len(codes.len()) {
        return Err(LabError::shape("int4 pack", format!("{} codes need {} bytes, the output has {}", codes.len(), packed_len(codes.len()), out.len())));
    }
    // OR of every code: one branch-free pass that vectorizes; the index is found only on failure.
    let seen = if codes.len() >= PAR_MIN {
        out.par_chunks_mut(CHUNK / 2).zip(codes.par_chunks(CHUNK)).map(|(o, c)| pack_serial(c, o)).reduce(|| 0, |a, b| a | b)
    } else {
        pack_serial(codes, out)
    };
    if seen > 15 {
        let i = codes.iter().position(|&c| c > 15).unwrap_or(0);
        return Err(LabError::Invalid(format!("int4 pack: code {} at index {i} does not fit in 4 bits", codes[i])));
    }
    Ok(())
}

fn pack_serial(codes: &[u8], out: &mut [u8]) -> u8 {
    // Eight codes at a time as one u64 (SWAR): pair each byte with its neighbour, then gather
    // the four pair bytes. No branches, no per-byte shifts: the loop vectorizes.
    let mut seen = 0u64;
    let words = codes.chunks_exact(8);
    let rest = words.remainder();
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        let x = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        seen |= x;
        let x = x & 0x0F0F_0F0F_0F0F_0F0F;
        let p = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF; // byte 2i = code 2i | code 2i+1 << 4
        let p = (p | (p >> 8)) & 0x0000_FFFF_0000_FFFF;
        let p = (p | (p >> 16)) as u32;
        o.copy_from_slice(&p.to_le_bytes());
    }
    let mut seen = (0..8).fold(0u8, |a, i| a | (seen >> (8 * i)) as u8);
    let done = codes.len() - rest.len();
    let pairs = rest.chunks_exact(2);
    let tail = pairs.remainder();
    for (o, p) in out[done / 2..].iter_mut().zip(pairs) {
        seen |= p[0] | p[1];
        *o = (p[0] & 15) | (p[1] << 4);
    }
    if let [last] = tail {
        seen |= last;
        out[codes.len() / 2] = last & 15;
    }
    seen
}

/// Unpacks `n` codes; `packed` must hold exactly `packed_len(n)` bytes.
pub fn unpack(packed: &[u8], n: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; n];
    unpack_into(packed, &mut out)?;
    Ok(out)
}

/// Unpacks into `out` (its length is the element count).
pub fn unpack_into(packed: &[u8], out: &mut [u8]) -> Result<()> {
    if packed.len() != packed_len(out.len()) {
        return Err(LabError::shape("int4 unpack", format!("{} codes come from {} bytes, got {}", out.len(), packed_len(out.len()), packed.len())));
    }
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(CHUNK).zip(packed.par_chunks(CHUNK / 2)).for_each(|(o, p)| unpack_serial(p, o));
    } else {
        unpack_serial(packed, out);
    }
    Ok(())
}

fn unpack_serial(packed: &[u8], out: &mut [u8]) {
    let mut pairs = out.chunks_exact_mut(2);
    for (o, &b) in (&mut pairs).zip(packed) {
        o[0] = b & 15;
        o[1] = b >> 4;
    }
    if let [last] = pairs.into_remainder() {
        *last = packed[packed.len() - 1] & 15;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nibble_pair_round_trips_and_the_order_is_low_first() {
        let codes: Vec<u8> = (0..256u32).flat_map(|b| [(b & 15) as u8, (b >> 4) as u8]).collect();
        let packed = pack(&codes).unwrap();
        assert_eq!(packed, (0..=255u8).collect::<Vec<_>>(), "byte i = code 2i | code 2i+1 << 4");
        assert_eq!(unpack(&packed, codes.len()).unwrap(), codes);
        assert_eq!(pack(&[0x3, 0xA]).unwrap(), vec![0xA3]);
    }

    #[test]
    fn odd_lengths_and_the_parallel_path_round_trip() {
        for n in [0usize, 1, 3, 31, 1001, PAR_MIN + 3, 3 * CHUNK + 17 + PAR_MIN] {
            let codes: Vec<u8> = (0..n).map(|i| ((i * 7 + i / 3) % 16) as u8).collect();
            let packed = pack(&codes).unwrap();
            assert_eq!(packed.len(), n.div_ceil(2));
            if n % 2 == 1 {
                assert_eq!(packed[n / 2] >> 4, 0, "the unused high nibble is zero");
            }
            assert_eq!(unpack(&packed, n).unwrap(), codes, "n = {n}");
        }
    }

    #[test]
    fn bad_input_is_named() {
        let mut codes = vec![1u8; PAR_MIN + 10];
        codes[PAR_MIN + 5] = 16;
        let e = pack(&codes).unwrap_err().to_string();
        assert!(e.contains("code 16 at index 1048581"), "{e}");
        assert!(unpack(&[0u8; 2], 5).unwrap_err().to_string().contains("5 codes come from 3 bytes, got 2"));
        assert!(pack_into(&[1, 2, 3], &mut [0u8; 1]).is_err());
    }
}
