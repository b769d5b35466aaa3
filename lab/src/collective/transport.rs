//! Point-to-point transports the collectives run over: ranks exchanging byte slices.
//!
//! [`Threads`] is a world of ranks in one process (one thread each, std channels between every
//! pair), so the algorithms are tested without MPI; `super::mpi::Mpi` is the same trait over
//! Open MPI.

use crate::{LabError, Result};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Barrier, Mutex};

/// A rank's view of a world of `size` ranks. Messages between one pair of ranks arrive in the
/// order they were sent; a receive must name the exact length of the message it takes.
pub trait Transport: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sends `data` to rank `to`; returns when `data` may be reused (it may not have arrived).
    fn send(&self, to: usize, data: &[u8]) -> Result<()>;
    /// Receives the next message from rank `from` into `buf`, which it must fill exactly.
    fn recv(&self, from: usize, buf: &mut [u8]) -> Result<()>;
    /// Sends to `to` and receives from `from` at once: no ordering between ranks needed.
    fn sendrecv(&self, data: &[u8], to: usize, buf: &mut [u8], from: usize) -> Result<()>;
    /// Returns once every rank has entered it.
    fn barrier(&self) -> Result<()>;
    /// What carries the bytes ("threads", "mpi"), for records.
    fn kind(&self) -> &'static str;
}

/// Plain numbers whose every bit pattern is a value and that have no padding: they travel as
/// their bytes.
pub trait Wire: Copy + Send + Sync + 'static {}
impl Wire for u8 {}
impl Wire for u64 {}
impl Wire for f32 {}
impl Wire for f64 {}
impl Wire for half::f16 {}
impl Wire for half::bf16 {}

pub fn bytes_of<T: Wire>(v: &[T]) -> &[u8] {
    // SAFETY: `Wire` types have no padding, so every byte of the slice is initialised.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

pub fn bytes_of_mut<T: Wire>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above, and any bytes written form a valid `T` (no invalid bit patterns).
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

fn bad_rank(t: &dyn Transport, r: usize) -> Result<()> {
    if r >= t.size() {
        return Err(LabError::Invalid(format!("rank {r} is outside a world of {} ranks", t.size())));
    }
    Ok(())
}

/// One rank of an in-process world: channels to and from every other rank.
pub struct Threads {
    rank: usize,
    size: usize,
    to: Vec<Sender<Vec<u8>>>,
    from: Vec<Mutex<Receiver<Vec<u8>>>>,
    barrier: Arc<Barrier>,
}

impl Threads {
    /// The `n` ranks of a new world, in rank order.
    pub fn world(n: usize) -> Vec<Threads> {
        assert!(n > 0, "a world has at least one rank");
        // chan[i][j] carries messages from i to j.
        let mut senders: Vec<Vec<Sender<Vec<u8>>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
        let mut receivers: Vec<Vec<Mutex<Receiver<Vec<u8>>>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
        for outbox in senders.iter_mut() {
            for inbox in receivers.iter_mut() {
                let (tx, rx) = channel();
                outbox.push(tx);
                inbox.push(Mutex::new(rx));
            }
        }
        let barrier = Arc::new(Barrier::new(n));
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (to, from))| Threads { rank, size: n, to, from, barrier: barrier.clone() })
            .collect()
    }
}

impl Transport for Threads {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn send(&self, to: usize, data: &[u8]) -> Result<()> {
        bad_rank(self, to)?;
        self.to[to].send(data.to_vec()).map_err(|_| LabError::Invalid(format!("rank {to} has left the world")))
    }
    fn recv(&self, from: usize, buf: &mut [u8]) -> Result<()> {
        bad_rank(self, from)?;
        let msg = self.from[from]
            .lock()
            .expect("receiver lock")
            .recv()
            .map_err(|_| LabError::Invalid(format!("rank {from} left the world before sending")))?;
        if msg.len() != buf.len() {
            return Err(LabError::Invalid(format!(
                "rank {} expected {} bytes from rank {from} and got {}",
                self.rank,
                buf.len(),
                msg.len()
            )));
        }
        buf.copy_from_slice(&msg);
        Ok(())
    }
    fn sendrecv(&self, data: &[u8], to: usize, buf: &mut [u8], from: usize) -> Result<()> {
        // Sends never block here (unbounded channels), so send-then-receive cannot deadlock.
        self.send(to, data)?;
        self.recv(from, buf)
    }
    fn barrier(&self) -> Result<()> {
        self.barrier.wait();
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "threads"
    }
}

/// Runs `f` on every rank of a new `n`-rank thread world and returns the ranks' results in rank
/// order (the first error, if any rank failed).
pub fn run_threads<R: Send>(n: usize, f: impl Fn(&Threads) -> Result<R> + Sync) -> Result<Vec<R>> {
    let world = Threads::world(n);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = world.into_iter().map(|t| s.spawn(move || f(&t))).collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// Every rank's `value`, in rank order, on every rank (a ring of `size - 1` exchanges).
pub fn all_gather_u64(t: &dyn Transport, value: u64) -> Result<Vec<u64>> {
    let (r, n) = (t.rank(), t.size());
    let mut all = vec![0u64; n];
    all[r] = value;
    for step in 0..n.saturating_sub(1) {
        let send = (r + n - step) % n;
        let recv = (r + n - step - 1) % n;
        let mut got = [0u64];
        t.sendrecv(bytes_of(&all[send..send + 1]), (r + 1) % n, bytes_of_mut(&mut got), (r + n - 1) % n)?;
        all[recv] = got[0];
    }
    Ok(all)
}

/// Rank `root`'s `value` on every rank.
pub fn broadcast_u64(t: &dyn Transport, value: u64, root: usize) -> Result<u64> {
    Ok(all_gather_u64(t, value)?[root])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_between_a_pair_arrive_in_order_and_lengths_are_checked() {
        let out = run_threads(3, |t| {
            let next = (t.rank() + 1) % 3;
            let prev = (t.rank() + 2) % 3;
            t.send(next, &[t.rank() as u8, 1])?;
            t.send(next, &[t.rank() as u8, 2])?;
            let (mut a, mut b) = ([0u8; 2], [0u8; 2]);
            t.recv(prev, &mut a)?;
            t.recv(prev, &mut b)?;
            let mut short = [0u8; 1];
            t.send(next, &[9, 9])?;
            let err = t.recv(prev, &mut short).unwrap_err().to_string();
            t.barrier()?;
            Ok((a, b, err))
        })
        .unwrap();
        for (r, (a, b, err)) in out.iter().enumerate() {
            let prev = ((r + 2) % 3) as u8;
            assert_eq!((*a, *b), ([prev, 1], [prev, 2]));
            assert!(err.contains("expected 1 bytes") && err.contains("got 2"), "{err}");
        }
    }

    #[test]
    fn all_gather_gives_every_rank_every_value() {
        for n in 1..=5 {
            let out = run_threads(n, |t| all_gather_u64(t, 10 * t.rank() as u64 + 1)).unwrap();
            let want: Vec<u64> = (0..n as u64).map(|r| 10 * r + 1).collect();
            assert!(out.iter().all(|v| *v == want), "n={n}: {out:?}");
        }
    }
}
