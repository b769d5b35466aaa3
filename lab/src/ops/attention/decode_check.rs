//! Decode attention as an experiment case (`{"pass": "decode", ...}` in the attention
//! experiment): one query row per sequence against a paged cache whose pages are shuffled over
//! the whole pool, every sequence at `context` rows, timed against the copy ceiling with the
//! bytes of K and V it must read. A decode row attends every cached row, so the f64 reference is
//! the forward's with one query and `context` keys ([`Expected`]), checked on the same rows.

use super::decode::{Decode, KvCache};
use super::{check_rows, input, Dims, Elem, Expected, Mask};
use crate::error::Doing;
use crate::experiment::{param_timed, param_usize, rng_for, Backend, Session};
use crate::ops::compare::compare_elems;
use crate::ops::{measure_gpu_as, Check};
use crate::profile::Work;
use crate::Result;
use rand::seq::SliceRandom;
use serde_json::{json, Value};

/// (batch, context, hq, hkv, d, page).
type C = (usize, usize, usize, usize, usize, usize);

fn case(&(batch, context, hq, hkv, d, page): &C, dtype: &str, timed: bool) -> Value {
    json!({"pass": "decode", "batch": batch, "context": context, "hq": hq, "hkv": hkv, "d": d, "page": page, "dtype": dtype, "timed": timed})
}

/// GPU only: odd gates (a context that is no multiple of a page or a split, GQA 9/3, a page of
/// 16 rows), then Llama-3-8B's heads (32/8, D128) at contexts 128 to 32k and batches 1 to 64,
/// pages of 64 rows, and one contiguous cache (a page per sequence) beside them.
pub fn cases(backend: &Backend, quick: bool) -> Vec<Value> {
    if let Backend::Cpu = backend {
        return Vec::new();
    }
    let mut out = sanitize_cases();
    out.push(case(&(1, 4097, 32, 8, 128, 256), "bf16", false));
    let timed: Vec<C> = if quick {
        vec![(8, 1024, 32, 8, 128, 64)]
    } else {
        // 64 sequences of 32k rows would be 8.6 GB of cache: the largest is 64 x 8k (2.1 GB).
        let mut t: Vec<C> = [128, 1024, 8192, 32768].iter().flat_map(|&c| [1, 8].map(|b| (b, c, 32, 8, 128, 64))).collect();
        t.extend([128, 1024, 8192].map(|c| (64, c, 32, 8, 128, 64)));
        t.push((1, 32768, 32, 8, 128, 32768));
        t
    };
    out.extend(timed.iter().map(|c| case(c, "bf16", true)));
    out
}

/// The pool row holding row j of sequence b: page table[b * per + j / page], row j % page in it.
fn pool_row(table: &[i32], per: usize, page: usize, b: usize, j: usize) -> usize {
    table[b * per + j / page] as usize * page + j % page
}

/// The small odd gates, for `lab sanitize` too: a context of 1000 in pages of 16 at 9/3 heads,
/// and a context of one row.
pub fn sanitize_cases() -> Vec<Value> {
    [(3, 1000, 9, 3, 64, 16), (2, 1, 4, 1, 128, 16)].iter().map(|c| case(c, "bf16", false)).collect()
}

pub fn run<T: Elem>(s: &mut Session, case: &Value) -> Result<()> {
    let Backend::Cuda(gpu) = s.backend.clone() else { return Ok(()) };
    let variants: Vec<&str> = super::VARIANTS.iter().filter(|v| matches!(v.config, super::Kernel::Decode { .. }) && s.wants(v.name, "lab")).map(|v| v.name).collect();
    if variants.is_empty() {
        return Ok(());
    }
    let [batch, context, hq, hkv, d, page] = ["batch", "context", "hq", "hkv", "d", "page"].map(|k| param_usize(case, k));
    let (batch, context, hq, hkv, d, page) = (batch?, context?, hq?, hkv?, d?, page?);
    let dims = Dims { batch, sq: 1, sk: context, hq, hkv, d };
    let mut rng = rng_for(s.opts.seed, case);
    let row = hkv * d;
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (input(batch * hq * d, 1.0, &mut rng), input(batch * context * row, 1.0, &mut rng), input(batch * context * row, 1.0, &mut rng));
    let expected = Expected::new(dims, Mask::default(), &q, &k, &v, check_rows(dims, &mut rng));
    // The pool: ceil(context / page) pages per sequence, handed out in a shuffled order.
    let per = context.div_ceil(page);
    let mut table: Vec<i32> = (0..(batch * per) as i32).collect();
    table.shuffle(&mut rng);
    let mut cache = KvCache::<T>::paged(&gpu, page, batch * per, &table, per, hkv, d)?;
    let scatter = |logical: &[T]| {
        let mut pool = vec![T::from_f32(0.0); batch * per * page * row];
        for b in 0..batch {
            for j in 0..context {
                let at = pool_row(&table, per, page, b, j) * row;
                pool[at..at + row].copy_from_slice(&logical[(b * context + j) * row..][..row]);
            }
        }
        pool
    };
    (cache.k, cache.v) = (gpu.upload(&scatter(&k))?, gpu.upload(&scatter(&v))?);
    let (dq, pos) = (gpu.upload(&q)?, gpu.upload(&vec![context as i32 - 1; batch])?);
    let mut o = gpu.stream.alloc_zeros::<T>(batch * hq * d).doing("allocating the decode output")?;
    let elem = T::DTYPE.size();
    let work = Work { bytes: ((2 * batch * context * row + 2 * batch * hq * d) * elem) as u64, flops: (4 * batch * hq * context * d) as u64 };
    let compare = |out: &[T]| compare_elems(&expected.gather(dims, out), &expected.o, expected.tol, "cpu-f64 (sampled rows)");
    let check = Check { tol: expected.tol, compare: &compare, ceiling: "copy_gb_s" };
    let mut extra = serde_json::Map::new();
    extra.insert("kv_bytes".into(), json!(2 * batch * context * row * elem));
    for name in variants {
        let plan = std::cell::RefCell::new(Decode::with(&gpu, name, batch, hq, hkv, d, per * page)?);
        measure_gpu_as(s, &gpu, case, (name, "lab"), work, &check, param_timed(case), &mut o, extra.clone(), |o| plan.borrow_mut().run(&dq, &cache, &pos, o, None))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn every_cached_row_has_its_own_pool_row_and_the_cpu_has_no_decode_cases() {
        let (batch, context, page): (usize, usize, usize) = (3, 1000, 16);
        let per = context.div_ceil(page);
        let mut table: Vec<i32> = (0..(batch * per) as i32).collect();
        table.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
        let mut rows: Vec<usize> = (0..batch).flat_map(|b| (0..context).map(move |j| (b, j))).map(|(b, j)| pool_row(&table, per, page, b, j)).collect();
        rows.sort_unstable();
        rows.dedup();
        assert_eq!(rows.len(), batch * context);
        assert!(rows.iter().all(|&r| r < batch * per * page));
        assert!(cases(&Backend::Cpu, false).is_empty());
    }
}
