//! Tensor-parallel linear layers (the split of Megatron-LM: Shoeybi et al., 2019, section 3).
//!
//! y = x W^T + b with W stored out x in. Column-parallel: each rank holds a slice of W's output
//! rows (the columns of W^T) and computes that slice of y; an all-gather assembles y. Row-parallel:
//! each rank holds a slice of W's input columns and the matching slice of x; the partial products
//! are summed by an all-reduce, and the bias is added once after. A column-parallel layer whose
//! output stays sharded feeds a row-parallel one directly: an MLP with one all-reduce.

use super::bucket::linear;
use super::ring::{all_reduce, part, Algorithm};
use super::transport::{bytes_of, bytes_of_mut, Transport};
use crate::{LabError, Result};
use std::ops::Range;

/// Every rank's `local` slice, concatenated in rank order on every rank; rank `q` contributes
/// `sizes[q]` elements (ring all-gather of unequal parts).
pub fn all_gather_parts(t: &dyn Transport, local: &[f32], sizes: &[usize]) -> Result<Vec<f32>> {
    let (r, n) = (t.rank(), t.size());
    if sizes.len() != n || sizes[r] != local.len() {
        return Err(LabError::Invalid(format!("all-gather: rank {r} holds {} elements, the plan says {:?}", local.len(), sizes)));
    }
    let starts: Vec<usize> = sizes.iter().scan(0, |acc, &s| Some(std::mem::replace(acc, *acc + s))).collect();
    let at = |q: usize| starts[q]..starts[q] + sizes[q];
    let mut all = vec![0.0f32; sizes.iter().sum()];
    all[at(r)].copy_from_slice(local);
    for step in 0..n - 1 {
        let (send, recv) = (at((r + n - step) % n), at((r + 2 * n - step - 1) % n));
        let outgoing = all[send].to_vec();
        t.sendrecv(bytes_of(&outgoing), (r + 1) % n, bytes_of_mut(&mut all[recv]), (r + n - 1) % n)?;
    }
    Ok(all)
}

/// This rank's slice of W's output rows.
pub struct ColumnParallel {
    pub fan_in: usize,
    pub fan_out: usize,
    pub rows: Range<usize>,
    w: Vec<f32>,
    b: Vec<f32>,
}

impl ColumnParallel {
    /// Takes this rank's shard of a full layer (every rank passes the same `w`, `b`).
    pub fn shard(t: &dyn Transport, w: &[f32], b: &[f32], fan_in: usize, fan_out: usize) -> Self {
        let rows = part(fan_out, t.size(), t.rank());
        ColumnParallel { fan_in, fan_out, w: w[rows.start * fan_in..rows.end * fan_in].to_vec(), b: b[rows.clone()].to_vec(), rows }
    }

    /// This rank's slice of y: `batch` x `rows.len()`, no communication.
    pub fn forward_sharded(&self, x: &[f32], batch: usize) -> Vec<f32> {
        linear(x, batch, &self.w, &self.b, self.fan_in, self.rows.len())
    }

    /// The whole y on every rank (`batch` x `fan_out`): the shards all-gathered and interleaved.
    pub fn forward(&self, t: &dyn Transport, x: &[f32], batch: usize) -> Result<Vec<f32>> {
        let n = t.size();
        let widths: Vec<usize> = (0..n).map(|q| part(self.fan_out, n, q).len()).collect();
        let sizes: Vec<usize> = widths.iter().map(|w| w * batch).collect();
        let blocks = all_gather_parts(t, &self.forward_sharded(x, batch), &sizes)?;
        let mut y = vec![0.0f32; batch * self.fan_out];
        let mut at = 0;
        for q in 0..n {
            let cols = part(self.fan_out, n, q);
            for i in 0..batch {
                y[i * self.fan_out + cols.start..i * self.fan_out + cols.end].copy_from_slice(&blocks[at..at + cols.len()]);
                at += cols.len();
            }
        }
        Ok(y)
    }
}

/// This rank's slice of W's input columns, and the whole bias (added once, after the sum).
pub struct RowParallel {
    pub fan_in: usize,
    pub fan_out: usize,
    pub cols: Range<usize>,
    w: Vec<f32>,
    b: Vec<f32>,
}

impl RowParallel {
    pub fn shard(t: &dyn Transport, w: &[f32], b: &[f32], fan_in: usize, fan_out: usize) -> Self {
        let cols = part(fan_in, t.size(), t.rank());
        let w = (0..fan_out).flat_map(|o| w[o * fan_in + cols.start..o * fan_in + cols.end].iter().copied()).collect();
        RowParallel { fan_in, fan_out, cols, w, b: b.to_vec() }
    }

    /// This rank's columns of a full input.
    pub fn input_shard(&self, x: &[f32], batch: usize) -> Vec<f32> {
        (0..batch).flat_map(|i| x[i * self.fan_in + self.cols.start..i * self.fan_in + self.cols.end].iter().copied()).collect()
    }

    /// y (`batch` x `fan_out`) on every rank from this rank's input columns.
    pub fn forward(&self, t: &dyn Transport, x_shard: &[f32], batch: usize) -> Result<Vec<f32>> {
        let zero = vec![0.0; self.fan_out];
        let mut y = linear(x_shard, batch, &self.w, &zero, self.cols.len(), self.fan_out);
        all_reduce(t, &mut y, Algorithm::SendRecv)?;
        y.chunks_mut(self.fan_out).for_each(|row| row.iter_mut().zip(&self.b).for_each(|(y, b)| *y += b));
        Ok(y)
    }
}

/// relu(x W1^T + b1) W2^T + b2 with W1 column-parallel and W2 row-parallel: one all-reduce.
pub fn mlp_forward(t: &dyn Transport, up: &ColumnParallel, down: &RowParallel, x: &[f32], batch: usize) -> Result<Vec<f32>> {
    if up.rows != down.cols {
        return Err(LabError::Invalid("the column-parallel output shard must be the row-parallel input shard".into()));
    }
    let mut h = up.forward_sharded(x, batch);
    h.iter_mut().for_each(|v| *v = v.max(0.0));
    down.forward(t, &h, batch)
}

#[cfg(test)]
mod tests {
    use super::super::transport::run_threads;
    use super::*;
    use crate::ops::compare::compare;
    use crate::record::Tolerance;

    fn values(len: usize, salt: usize) -> Vec<f32> {
        (0..len).map(|i| (((i * 2654435761 + salt * 40503) % 2001) as f32 / 1000.0 - 1.0) * 0.5).collect()
    }

    const TOL: Tolerance = Tolerance { atol: 1e-5, rtol: 1e-5 };

    fn close(got: &[f32], want: &[f32], what: &str) {
        let e = compare(&crate::ops::widen(got), &crate::ops::widen(want), TOL, "single-process");
        assert!(e.passed(), "{what}: {e:?}");
    }

    #[test]
    fn column_and_row_parallel_layers_match_the_single_process_layer() {
        // Output and input widths not divisible by the world, and smaller than it.
        for n in 1..=4 {
            for (fan_in, fan_out, batch) in [(13, 7, 3), (5, 3, 2), (64, 33, 1)] {
                let (x, w, b) = (values(batch * fan_in, 1), values(fan_out * fan_in, 2), values(fan_out, 3));
                let want = linear(&x, batch, &w, &b, fan_in, fan_out);
                let out = run_threads(n, |t| {
                    let col = ColumnParallel::shard(t, &w, &b, fan_in, fan_out).forward(t, &x, batch)?;
                    let row = RowParallel::shard(t, &w, &b, fan_in, fan_out);
                    let rowy = row.forward(t, &row.input_shard(&x, batch), batch)?;
                    Ok((col, rowy))
                })
                .unwrap();
                for (r, (col, row)) in out.iter().enumerate() {
                    let what = format!("n={n} {fan_in}->{fan_out} rank {r}");
                    // Column-parallel computes every output with the same dot product: exact.
                    assert_eq!(col, &want, "column-parallel {what}");
                    close(row, &want, &format!("row-parallel {what}"));
                }
            }
        }
    }

    #[test]
    fn a_tensor_parallel_mlp_matches_the_single_process_mlp() {
        let (d, h, o, batch) = (16, 37, 9, 4);
        let (x, w1, b1, w2, b2) = (values(batch * d, 4), values(h * d, 5), values(h, 6), values(o * h, 7), values(o, 8));
        let mut hidden = linear(&x, batch, &w1, &b1, d, h);
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        let want = linear(&hidden, batch, &w2, &b2, h, o);
        for n in 1..=4 {
            let out = run_threads(n, |t| {
                let up = ColumnParallel::shard(t, &w1, &b1, d, h);
                let down = RowParallel::shard(t, &w2, &b2, h, o);
                mlp_forward(t, &up, &down, &x, batch)
            })
            .unwrap();
            for (r, y) in out.iter().enumerate() {
                close(y, &want, &format!("n={n} rank {r}"));
            }
        }
    }
}
