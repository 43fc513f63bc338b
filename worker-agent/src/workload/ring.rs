//! Ring all-reduce over TCP between the members of one rendezvous round.
//!
//! Rank `r` connects to rank `r+1` and accepts from rank `r-1` (both mod world size); each
//! connection opens with a handshake (rank, round) so a straggler from an older round is turned
//! away. `allreduce_sum` is the bandwidth-optimal two-phase ring: reduce-scatter, then
//! all-gather, each `world-1` steps of one chunk, sending and receiving at once.

use std::time::{Duration, Instant};

use bytemuck::Pod;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::Error;

pub struct Ring {
    rank: u32,
    world: u32,
    next: Option<TcpStream>,
    prev: Option<TcpStream>,
}

impl Ring {
    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn world(&self) -> u32 {
        self.world
    }

    /// Forms the ring for `rank` of `peers.len()` in `round`, listening on `listener`.
    pub async fn connect(
        rank: u32,
        peers: &[String],
        round: u64,
        listener: &TcpListener,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let world = peers.len() as u32;
        if world <= 1 {
            return Ok(Self {
                rank,
                world: 1,
                next: None,
                prev: None,
            });
        }
        let next_rank = (rank + 1) % world;
        let prev_rank = (rank + world - 1) % world;
        let deadline = Instant::now() + timeout;
        let connect_next = async {
            loop {
                match TcpStream::connect(&peers[next_rank as usize]).await {
                    Ok(mut s) => {
                        s.set_nodelay(true).ok();
                        let mut hello = [0u8; 12];
                        hello[..4].copy_from_slice(&rank.to_le_bytes());
                        hello[4..].copy_from_slice(&round.to_le_bytes());
                        if s.write_all(&hello).await.is_ok() {
                            return Ok(s);
                        }
                    }
                    Err(e) if Instant::now() > deadline => {
                        return Err(Error::Ring {
                            peer: next_rank,
                            source: e,
                        });
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let accept_prev = async {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let (mut s, _) = tokio::time::timeout(left, listener.accept())
                    .await
                    .map_err(|_| Error::Ring {
                        peer: prev_rank,
                        source: std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no connection from the previous rank",
                        ),
                    })?
                    .map_err(|e| Error::Ring {
                        peer: prev_rank,
                        source: e,
                    })?;
                s.set_nodelay(true).ok();
                let mut hello = [0u8; 12];
                if tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut hello))
                    .await
                    .is_err()
                {
                    continue;
                }
                let from = u32::from_le_bytes(hello[..4].try_into().expect("4"));
                let their_round = u64::from_le_bytes(hello[4..].try_into().expect("8"));
                if from == prev_rank && their_round == round {
                    return Ok::<_, Error>(s);
                }
                tracing::warn!(
                    from,
                    their_round,
                    "turned away a ring connection from another round"
                );
            }
        };
        let (next, prev) = tokio::try_join!(connect_next, accept_prev)?;
        Ok(Self {
            rank,
            world,
            next: Some(next),
            prev: Some(prev),
        })
    }

    fn bounds(len: usize, world: usize, chunk: usize) -> std::ops::Range<usize> {
        (len * chunk / world)..(len * (chunk + 1) / world)
    }

    async fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        let (next, prev) = (
            self.next.as_mut().expect("world > 1"),
            self.prev.as_mut().expect("world > 1"),
        );
        let next_rank = (self.rank + 1) % self.world;
        let prev_rank = (self.rank + self.world - 1) % self.world;
        let w = async {
            next.write_all(send).await.map_err(|e| Error::Ring {
                peer: next_rank,
                source: e,
            })
        };
        let r = async {
            prev.read_exact(recv)
                .await
                .map(|_| ())
                .map_err(|e| Error::Ring {
                    peer: prev_rank,
                    source: e,
                })
        };
        tokio::try_join!(w, r)?;
        Ok(())
    }

    /// Replaces `buf` on every rank with the element-wise sum over all ranks.
    pub async fn allreduce_sum<T>(&mut self, buf: &mut [T]) -> Result<(), Error>
    where
        T: Pod + std::ops::AddAssign,
    {
        let w = self.world as usize;
        if w <= 1 {
            return Ok(());
        }
        let r = self.rank as usize;
        let len = buf.len();
        let mut recv: Vec<T> = Vec::with_capacity(len / w + 1);
        // Reduce-scatter: after w-1 steps rank r holds the full sum of chunk r+1.
        for s in 0..w - 1 {
            let send_c = (r + w - s) % w;
            let recv_c = (r + w - s - 1) % w;
            let send: Vec<T> = buf[Self::bounds(len, w, send_c)].to_vec();
            let rb = Self::bounds(len, w, recv_c);
            recv.clear();
            recv.resize(rb.len(), T::zeroed());
            self.exchange(
                bytemuck::cast_slice(&send),
                bytemuck::cast_slice_mut(&mut recv),
            )
            .await?;
            for (d, &v) in buf[rb].iter_mut().zip(&recv) {
                *d += v;
            }
        }
        // All-gather: pass the finished chunks around.
        for s in 0..w - 1 {
            let send_c = (r + 1 + w - s) % w;
            let recv_c = (r + w - s) % w;
            let send: Vec<T> = buf[Self::bounds(len, w, send_c)].to_vec();
            let rb = Self::bounds(len, w, recv_c);
            self.exchange(
                bytemuck::cast_slice(&send),
                bytemuck::cast_slice_mut(&mut buf[rb]),
            )
            .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn ring_of(world: usize, len: usize) -> Vec<Vec<f64>> {
        let listeners: Vec<TcpListener> = futures_listeners(world).await;
        let peers: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        let mut tasks = Vec::new();
        for (rank, l) in listeners.into_iter().enumerate() {
            let peers = peers.clone();
            tasks.push(tokio::spawn(async move {
                let mut ring = Ring::connect(rank as u32, &peers, 7, &l, Duration::from_secs(10))
                    .await
                    .unwrap();
                let mut buf: Vec<f64> = (0..len).map(|i| (i * (rank + 1)) as f64).collect();
                ring.allreduce_sum(&mut buf).await.unwrap();
                buf
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    async fn futures_listeners(n: usize) -> Vec<TcpListener> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        v
    }

    #[tokio::test]
    async fn every_rank_gets_the_sum_for_any_world_and_length() {
        for (world, len) in [(1, 5), (2, 7), (3, 10), (4, 3), (5, 1000)] {
            let out = ring_of(world, len).await;
            let factor: f64 = (1..=world).map(|r| r as f64).sum();
            for buf in out {
                for (i, v) in buf.iter().enumerate() {
                    assert_eq!(*v, i as f64 * factor, "world {world} len {len}");
                }
            }
        }
    }
}
