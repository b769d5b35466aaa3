//! Tensor-parallel linear layers (the split of Megatron-LM: Shoeybi et al., 2019, section 3) on a
//! [`Group`]: GPUs over NCCL, or host ranks over the lab's ring on threads, with the same code.
//!
//! y = x W^T + b with W stored out x in (`ops::linear`'s layout). Column-parallel: each rank holds
//! a slice of W's output rows (the columns of W^T) and computes that slice of y; an all-gather
//! and one 2D copy per rank assemble y. Row-parallel: each rank holds a slice of W's input columns
//! and the matching slice of x; an all-reduce sums the partial products. The bias rides on rank
//! 0's partial, so it is added once. A column-parallel layer whose output stays sharded feeds a
//! row-parallel one directly: an MLP with one all-reduce.
//!
//! Shards are as even as [`part`] makes them. NCCL's all-gather takes the same count from every
//! rank, so a column shard narrower than the widest is padded with zero rows of W (zero columns
//! of its output, never copied into y).

use super::group::{copy_block, Block, Group, GroupElem};
use super::ring::part;
use super::transport::{bytes_of, bytes_of_mut, Transport, Wire};
use crate::ops::linear::{forward, Act};
use crate::tensor::Tensor;
use crate::{LabError, Result};
use cudarc::cublas::{CudaBlas, Gemm};
use std::ops::Range;

/// Every rank's `local` slice, concatenated in rank order on every rank; rank `q` contributes
/// `sizes[q]` elements (ring all-gather of unequal parts).
pub fn all_gather_parts<T: Wire + Default>(t: &dyn Transport, local: &[T], sizes: &[usize]) -> Result<Vec<T>> {
    let (r, n) = (t.rank(), t.size());
    if sizes.len() != n || sizes[r] != local.len() {
        return Err(LabError::Invalid(format!("all-gather: rank {r} holds {} elements, the plan says {:?}", local.len(), sizes)));
    }
    let starts: Vec<usize> = sizes.iter().scan(0, |acc, &s| Some(std::mem::replace(acc, *acc + s))).collect();
    let at = |q: usize| starts[q]..starts[q] + sizes[q];
    let mut all = vec![T::default(); sizes.iter().sum()];
    all[at(r)].copy_from_slice(local);
    for step in 0..n - 1 {
        let (send, recv) = (at((r + n - step) % n), at((r + 2 * n - step - 1) % n));
        let outgoing = all[send].to_vec();
        t.sendrecv(bytes_of(&outgoing), (r + 1) % n, bytes_of_mut(&mut all[recv]), (r + n - 1) % n)?;
    }
    Ok(all)
}

/// W's rows `rows` of a row-major `fan_out` x `fan_in` matrix (a column-parallel shard).
pub fn rows_of<T: Copy>(w: &[T], fan_in: usize, rows: Range<usize>) -> Vec<T> {
    w[rows.start * fan_in..rows.end * fan_in].to_vec()
}

/// Columns `cols` of every row of a row-major matrix `width` wide (a row-parallel shard of W, or
/// of x).
pub fn cols_of<T: Copy>(m: &[T], width: usize, cols: Range<usize>) -> Vec<T> {
    m.chunks(width).flat_map(|row| row[cols.clone()].iter().copied()).collect()
}

/// Rank q's shard, [`part`] of the sharded dimension.
pub fn even(len: usize, n: usize) -> Vec<Range<usize>> {
    (0..n).map(|q| part(len, n, q)).collect()
}

fn check_full<T>(w: &[T], b: &[T], fan_in: usize, fan_out: usize) -> Result<()> {
    if fan_in == 0 || fan_out == 0 || w.len() != fan_in * fan_out || b.len() != fan_out {
        let why = format!("W holds {} elements and b {}; a {fan_in} -> {fan_out} layer needs {} and {fan_out}", w.len(), b.len(), fan_in * fan_out);
        return Err(LabError::shape("tensor-parallel linear", why));
    }
    Ok(())
}

/// A column-parallel layer: rank q holds W's output rows `rows[q]` (zero-padded to `width`).
pub struct ColumnParallel<T: GroupElem> {
    pub fan_in: usize,
    pub fan_out: usize,
    /// Where each rank's columns go in y.
    pub rows: Vec<Range<usize>>,
    /// Rows of every rank's (padded) shard.
    pub width: usize,
    w: Vec<Tensor<T>>,
    b: Vec<Tensor<T>>,
}

/// A column-parallel layer's buffers for `tokens` rows of x, one per rank: the shard's output,
/// the gathered shards, and y.
pub struct ColumnBufs<T: GroupElem> {
    pub tokens: usize,
    z: Vec<Tensor<T>>,
    shard: Vec<Tensor<T>>,
    gathered: Vec<Tensor<T>>,
    pub y: Vec<Tensor<T>>,
}

impl<T: GroupElem> ColumnParallel<T>
where
    CudaBlas: Gemm<T>,
{
    /// Shards a full layer (W `fan_out` x `fan_in`, b `fan_out`) evenly over the group.
    pub fn shard(g: &Group, w: &[T], b: &[T], fan_in: usize, fan_out: usize) -> Result<Self> {
        check_full(w, b, fan_in, fan_out)?;
        let rows = even(fan_out, g.size());
        let shards = rows.iter().map(|r| (rows_of(w, fan_in, r.clone()), b[r.clone()].to_vec())).collect();
        Self::from_shards(g, shards, fan_in, fan_out)
    }

    /// A layer from each rank's (W rows, b slice), in rank order: rank q's columns follow rank
    /// q - 1's in y.
    pub fn from_shards(g: &Group, shards: Vec<(Vec<T>, Vec<T>)>, fan_in: usize, fan_out: usize) -> Result<Self> {
        if shards.len() != g.size() {
            return Err(LabError::Invalid(format!("{} column shards for a group of {}", shards.len(), g.size())));
        }
        let widths: Vec<usize> = shards.iter().map(|(_, b)| b.len()).collect();
        if widths.iter().sum::<usize>() != fan_out || shards.iter().any(|(w, b)| w.len() != b.len() * fan_in) {
            return Err(LabError::shape("column-parallel linear", format!("shards of widths {widths:?} (each W rows x {fan_in}) do not make a {fan_in} -> {fan_out} layer")));
        }
        let width = widths.iter().copied().max().unwrap_or(0).max(1);
        let rows = widths.iter().scan(0, |at, &w| Some(std::mem::replace(at, *at + w)..*at)).collect();
        let (mut ws, mut bs) = (Vec::new(), Vec::new());
        for ((mut w, mut b), dev) in shards.into_iter().zip(&g.devs) {
            w.resize(width * fan_in, T::from_f32(0.0));
            b.resize(width, T::from_f32(0.0));
            ws.push(Tensor::from_slice(dev, &[width, fan_in], &w)?);
            bs.push(Tensor::from_slice(dev, &[width], &b)?);
        }
        Ok(ColumnParallel { fan_in, fan_out, rows, width, w: ws, b: bs })
    }

    pub fn buffers(&self, g: &Group, tokens: usize) -> Result<ColumnBufs<T>> {
        let (n, each) = (g.size(), tokens * self.width);
        let per_rank = |shape: &[usize]| g.devs.iter().map(|d| Tensor::zeros(d, shape)).collect::<Result<Vec<_>>>();
        Ok(ColumnBufs { tokens, z: per_rank(&[tokens, self.width])?, shard: per_rank(&[tokens, self.width])?, gathered: per_rank(&[n * each])?, y: per_rank(&[tokens, self.fan_out])? })
    }

    /// Each rank's slice of y into `bufs.shard`, no communication (what a row-parallel layer
    /// after this one takes, `width` columns of which this rank's first `rows[q].len()` are real).
    // Rank q indexes its device, input, shard and buffers together.
    #[allow(clippy::needless_range_loop)]
    pub fn forward_sharded(&self, g: &Group, x: &[Tensor<T>], bufs: &mut ColumnBufs<T>) -> Result<()> {
        check_input(x, g, bufs.tokens, self.fan_in)?;
        for q in 0..g.size() {
            forward(&g.devs[q], &x[q], &self.w[q], &self.b[q], &mut bufs.z[q], &mut bufs.shard[q], Act::None)?;
        }
        Ok(())
    }

    /// The whole y (`tokens` x `fan_out`) on every rank, into `bufs.y`, from the whole x on
    /// every rank.
    pub fn forward(&self, g: &Group, x: &[Tensor<T>], bufs: &mut ColumnBufs<T>) -> Result<()> {
        self.forward_sharded(g, x, bufs)?;
        let (tokens, width, fan_out) = (bufs.tokens, self.width, self.fan_out);
        g.all_gather(&bufs.shard, &mut bufs.gathered)?;
        for (r, dev) in g.devs.iter().enumerate() {
            for (q, cols) in self.rows.iter().enumerate() {
                let from = Block { at: q * tokens * width, pitch: width };
                copy_block(dev, &bufs.gathered[r], from, &mut bufs.y[r], Block { at: cols.start, pitch: fan_out }, (tokens, cols.len()))?;
            }
        }
        Ok(())
    }
}

fn check_input<T: GroupElem>(x: &[Tensor<T>], g: &Group, tokens: usize, width: usize) -> Result<()> {
    if x.len() != g.size() || x.iter().any(|x| x.rows() != tokens || x.cols() != width) {
        let shapes: Vec<_> = x.iter().map(|x| x.shape().to_vec()).collect();
        return Err(LabError::shape("tensor-parallel linear", format!("inputs {shapes:?}; each of {} ranks needs [{tokens}, {width}]", g.size())));
    }
    Ok(())
}

/// A row-parallel layer: rank q holds W's input columns `cols[q]`; rank 0 also holds b.
pub struct RowParallel<T: GroupElem> {
    pub fan_in: usize,
    pub fan_out: usize,
    pub cols: Vec<Range<usize>>,
    w: Vec<Tensor<T>>,
    b: Vec<Tensor<T>>,
}

/// A row-parallel layer's buffers for `tokens` rows: each rank's partial product, then y.
pub struct RowBufs<T: GroupElem> {
    pub tokens: usize,
    z: Vec<Tensor<T>>,
    pub y: Vec<Tensor<T>>,
}

impl<T: GroupElem> RowParallel<T>
where
    CudaBlas: Gemm<T>,
{
    /// Shards a full layer evenly over the group by input features.
    pub fn shard(g: &Group, w: &[T], b: &[T], fan_in: usize, fan_out: usize) -> Result<Self> {
        check_full(w, b, fan_in, fan_out)?;
        let cols = even(fan_in, g.size());
        Self::from_shards(g, cols.iter().map(|c| cols_of(w, fan_in, c.clone())).collect(), b, fan_in, fan_out)
    }

    /// A layer from each rank's columns of W (`fan_out` x its width), in rank order, and the bias.
    pub fn from_shards(g: &Group, shards: Vec<Vec<T>>, b: &[T], fan_in: usize, fan_out: usize) -> Result<Self> {
        let widths: Vec<usize> = shards.iter().map(|w| w.len() / fan_out.max(1)).collect();
        if shards.len() != g.size() || b.len() != fan_out || widths.iter().sum::<usize>() != fan_in || shards.iter().any(|w| w.len() % fan_out.max(1) != 0) {
            return Err(LabError::shape("row-parallel linear", format!("{} shards of widths {widths:?} and a bias of {} for a {fan_in} -> {fan_out} layer on {} ranks", shards.len(), b.len(), g.size())));
        }
        let cols: Vec<Range<usize>> = widths.iter().scan(0, |at, &w| Some(std::mem::replace(at, *at + w)..*at)).collect();
        let zero = vec![T::from_f32(0.0); fan_out];
        let mut ws = Vec::new();
        let mut bs = Vec::new();
        for (q, (w, dev)) in shards.into_iter().zip(&g.devs).enumerate() {
            // A rank with no input columns still takes part (a product of zero width is zero).
            let (w, width) = if widths[q] == 0 { (vec![T::from_f32(0.0); fan_out], 1) } else { (w, widths[q]) };
            ws.push(Tensor::from_slice(dev, &[fan_out, width], &w)?);
            bs.push(Tensor::from_slice(dev, &[fan_out], if q == 0 { b } else { &zero })?);
        }
        Ok(RowParallel { fan_in, fan_out, cols, w: ws, b: bs })
    }

    /// Each rank's columns of a whole x (`tokens` x `fan_in`, on the host), on its device.
    pub fn input_shards(&self, g: &Group, x: &[T], tokens: usize) -> Result<Vec<Tensor<T>>> {
        self.cols
            .iter()
            .zip(&g.devs)
            .map(|(c, dev)| match c.len() {
                0 => Tensor::zeros(dev, &[tokens, 1]),
                w => Tensor::from_slice(dev, &[tokens, w], &cols_of(x, self.fan_in, c.clone())),
            })
            .collect()
    }

    pub fn buffers(&self, g: &Group, tokens: usize) -> Result<RowBufs<T>> {
        let per_rank = || g.devs.iter().map(|d| Tensor::zeros(d, &[tokens, self.fan_out])).collect::<Result<Vec<_>>>();
        Ok(RowBufs { tokens, z: per_rank()?, y: per_rank()? })
    }

    /// Each rank's partial product (rank 0's with the bias) into `bufs.y`, not yet summed.
    #[allow(clippy::needless_range_loop)]
    pub fn partial(&self, g: &Group, x_shards: &[Tensor<T>], bufs: &mut RowBufs<T>) -> Result<()> {
        if x_shards.len() != g.size() {
            return Err(LabError::shape("row-parallel linear", format!("{} input shards for a group of {}", x_shards.len(), g.size())));
        }
        // `forward` checks each shard's shape against its W and buffers.
        for q in 0..g.size() {
            forward(&g.devs[q], &x_shards[q], &self.w[q], &self.b[q], &mut bufs.z[q], &mut bufs.y[q], Act::None)?;
        }
        Ok(())
    }

    /// y (`tokens` x `fan_out`) on every rank from each rank's input columns.
    pub fn forward(&self, g: &Group, x_shards: &[Tensor<T>], bufs: &mut RowBufs<T>) -> Result<()> {
        self.partial(g, x_shards, bufs)?;
        g.all_reduce(&mut bufs.y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::compare::compare;
    use crate::ops::linear::forward_f64;
    use crate::record::Tolerance;

    fn values(len: usize, salt: usize) -> Vec<f32> {
        (0..len).map(|i| (((i * 2654435761 + salt * 40503) % 2001) as f32 / 1000.0 - 1.0) * 0.5).collect()
    }

    const TOL: Tolerance = Tolerance { atol: 1e-5, rtol: 1e-5 };

    /// Every rank's y against the single-rank layer's.
    fn matches(ys: &[Tensor<f32>], want: &[f64]) -> bool {
        ys.iter().all(|y| compare(&crate::ops::widen(y.host().unwrap()), want, TOL, "single-rank").passed())
    }

    fn layer(fan_in: usize, fan_out: usize, tokens: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f64>) {
        let (x, w, b) = (values(tokens * fan_in, 1), values(fan_out * fan_in, 2), values(fan_out, 3));
        let w64: Vec<f64> = crate::ops::widen(&w);
        let (_, want) = forward_f64(&crate::ops::widen(&x), &w64, &crate::ops::widen(&b), (tokens, fan_out, fan_in), Act::None);
        (x, w, b, want)
    }

    fn column(g: &Group, l: &ColumnParallel<f32>, x: &[f32], tokens: usize) -> Vec<Tensor<f32>> {
        let xs: Vec<Tensor<f32>> = (0..g.size()).map(|_| Tensor::from_vec(&[tokens, l.fan_in], x.to_vec()).unwrap()).collect();
        let mut bufs = l.buffers(g, tokens).unwrap();
        l.forward(g, &xs, &mut bufs).unwrap();
        bufs.y
    }

    fn row(g: &Group, l: &RowParallel<f32>, x: &[f32], tokens: usize, reduce: bool) -> Vec<Tensor<f32>> {
        let xs = l.input_shards(g, x, tokens).unwrap();
        let mut bufs = l.buffers(g, tokens).unwrap();
        if reduce { l.forward(g, &xs, &mut bufs) } else { l.partial(g, &xs, &mut bufs) }.unwrap();
        bufs.y
    }

    #[test]
    fn column_and_row_parallel_layers_match_the_single_rank_layer() {
        // Widths not divisible by the group, and smaller than it (empty shards).
        for n in 1..=5 {
            let g = Group::host(n).unwrap();
            for (fan_in, fan_out, tokens) in [(13, 7, 3), (5, 3, 2), (64, 33, 1)] {
                let (x, w, b, want) = layer(fan_in, fan_out, tokens);
                let col = ColumnParallel::shard(&g, &w, &b, fan_in, fan_out).unwrap();
                assert!(matches(&column(&g, &col, &x, tokens), &want), "column n={n} {fan_in}->{fan_out}");
                let rp = RowParallel::shard(&g, &w, &b, fan_in, fan_out).unwrap();
                assert!(matches(&row(&g, &rp, &x, tokens, true), &want), "row n={n} {fan_in}->{fan_out}");
            }
        }
    }

    #[test]
    fn a_shard_taken_one_row_off_fails_the_check() {
        let (fan_in, fan_out, tokens, n) = (16, 12, 3, 3);
        let (x, w, b, want) = layer(fan_in, fan_out, tokens);
        let g = Group::host(n).unwrap();
        // Rank 1 loads W from one row too far (its shard's offset is wrong); widths stay right.
        let shards = even(fan_out, n)
            .into_iter()
            .enumerate()
            .map(|(q, r)| {
                let from = if q == 1 { r.start + 1..r.end + 1 } else { r.clone() };
                (rows_of(&w, fan_in, from), b[r].to_vec())
            })
            .collect();
        let bad = ColumnParallel::from_shards(&g, shards, fan_in, fan_out).unwrap();
        assert!(!matches(&column(&g, &bad, &x, tokens), &want));
        // The same for a row-parallel shard one input column off.
        let shards = even(fan_in, n).into_iter().enumerate().map(|(q, c)| cols_of(&w, fan_in, if q == 2 { c.start - 1..c.end - 1 } else { c })).collect();
        let bad = RowParallel::from_shards(&g, shards, &b, fan_in, fan_out).unwrap();
        assert!(!matches(&row(&g, &bad, &x, tokens, true), &want));
    }

    #[test]
    fn a_row_parallel_layer_without_its_all_reduce_fails_the_check() {
        let (fan_in, fan_out, tokens) = (20, 6, 4);
        let (x, w, b, want) = layer(fan_in, fan_out, tokens);
        let g = Group::host(2).unwrap();
        let rp = RowParallel::shard(&g, &w, &b, fan_in, fan_out).unwrap();
        assert!(matches(&row(&g, &rp, &x, tokens, true), &want));
        assert!(!matches(&row(&g, &rp, &x, tokens, false), &want), "partial products passed as the sum");
    }

    #[test]
    fn a_column_then_row_parallel_mlp_needs_one_all_reduce() {
        // relu(x W1^T + b1) W2^T + b2, the hidden layer never gathered.
        let (d, h, o, tokens) = (16, 36, 9, 4);
        let (x, w1, b1, w2, b2) = (values(tokens * d, 4), values(h * d, 5), values(h, 6), values(o * h, 7), values(o, 8));
        let w = |v: &[f32]| crate::ops::widen(v);
        let (_, mut hidden) = forward_f64(&w(&x), &w(&w1), &w(&b1), (tokens, h, d), Act::Relu);
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        let (_, want) = forward_f64(&hidden, &w(&w2), &w(&b2), (tokens, o, h), Act::None);
        for n in [1, 2, 3, 4] {
            let g = Group::host(n).unwrap();
            let up = ColumnParallel::shard(&g, &w1, &b1, d, h).unwrap();
            let down = RowParallel::shard(&g, &w2, &b2, h, o).unwrap();
            assert_eq!(up.rows, down.cols, "the hidden shard of one is the input shard of the other");
            let xs: Vec<Tensor<f32>> = (0..n).map(|_| Tensor::from_vec(&[tokens, d], x.clone()).unwrap()).collect();
            let mut ub = up.buffers(&g, tokens).unwrap();
            up.forward_sharded(&g, &xs, &mut ub).unwrap();
            // Each rank's real hidden columns, ReLU'd: the input shard of the row-parallel layer.
            let hs: Vec<Tensor<f32>> = (0..n)
                .map(|q| {
                    let wd = up.rows[q].len().max(1);
                    let v: Vec<f32> = ub.shard[q].host().unwrap().chunks(up.width).flat_map(|r| r[..wd].iter().map(|v| v.max(0.0))).collect();
                    Tensor::from_vec(&[tokens, wd], v).unwrap()
                })
                .collect();
            let mut db = down.buffers(&g, tokens).unwrap();
            down.forward(&g, &hs, &mut db).unwrap();
            assert!(matches(&db.y, &want), "n={n}");
        }
    }
}
