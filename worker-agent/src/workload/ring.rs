//! Ring all-reduce over TCP between the members of one rendezvous round.
//!
//! Rank `r` connects to rank `r+1` and accepts from rank `r-1` (both mod world size); each
//! connection opens with a handshake (rank, round, and a proof of the job's secret bound to
//! both: [`auth::Token::proof`]) so a straggler from an older round, or a connection from
//! outside the job, is turned away. When the job runs with TLS each connection is mutual TLS
//! with the job's certificate first ([`auth::tls::JobTls`]), and the handshake goes inside it.
//! `allreduce_sum` is the bandwidth-optimal two-phase ring: reduce-scatter, then all-gather,
//! each `world-1` steps of one chunk, sending and receiving at once.

use std::time::{Duration, Instant};

use bytemuck::Pod;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::Error;

/// How much a rank forwards of a broadcast at a time (it reads the next while the ranks after
/// it take this one).
const BROADCAST_CHUNK: usize = 4 << 20;

/// The handshake: rank (4 bytes), round (8), proof (32).
const HELLO: usize = 12 + 32;

/// What a ring handshake's proof is bound to: the sender's rank and the round.
fn context(rank: u32, round: u64) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[..4].copy_from_slice(&rank.to_le_bytes());
    c[4..].copy_from_slice(&round.to_le_bytes());
    c
}

/// A ring link: plain TCP, or TLS over it.
trait Link: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Link for T {}

/// The job's TLS for the ring's two sides, when the job runs with it.
struct RingTls {
    connector: tokio_rustls::TlsConnector,
    acceptor: tokio_rustls::TlsAcceptor,
    name: tokio_rustls::rustls::pki_types::ServerName<'static>,
}

impl RingTls {
    fn of(creds: &auth::JobCreds) -> Result<Option<RingTls>, Error> {
        let Some(tls) = &creds.tls else {
            return Ok(None);
        };
        let secret = |e: auth::AuthError| Error::Secret(e.to_string());
        Ok(Some(RingTls {
            connector: tls.rustls_client().map_err(secret)?.into(),
            acceptor: tls.rustls_server().map_err(secret)?.into(),
            name: auth::tls::JOB_SERVER_NAME
                .try_into()
                .expect("a valid DNS name"),
        }))
    }
}

pub struct Ring {
    rank: u32,
    world: u32,
    next: Option<Box<dyn Link>>,
    prev: Option<Box<dyn Link>>,
}

/// Connections from would-be previous ranks being vetted at once; at this many, the oldest is
/// dropped to take a new one, so that silent connections cannot hold the ring's port.
const VETTING: usize = 64;

/// Takes the connection of the previous rank in `round`: every accepted connection is vetted
/// (TLS when the job has it, then the hello) in a task of its own, so that connections that
/// never speak, or speak wrongly, do not hold up the real one; the first that passes is it.
async fn accept_prev(
    listener: &TcpListener,
    prev_rank: u32,
    round: u64,
    deadline: Instant,
    token: &auth::Token,
    tls: Option<&RingTls>,
) -> Result<Box<dyn Link>, Error> {
    let mut vetting = tokio::task::JoinSet::new();
    let mut order = std::collections::VecDeque::new();
    let timed_out = || Error::Ring {
        peer: prev_rank,
        source: std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no connection from the previous rank",
        ),
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::select! {
            accepted = tokio::time::timeout(left, listener.accept()) => {
                let (s, _) = accepted.map_err(|_| timed_out())?.map_err(|e| Error::Ring {
                    peer: prev_rank,
                    source: e,
                })?;
                s.set_nodelay(true).ok();
                if order.len() >= VETTING
                    && let Some(oldest) = order.pop_front()
                {
                    tokio::task::AbortHandle::abort(&oldest);
                }
                let (token, acceptor) = (token.clone(), tls.map(|t| t.acceptor.clone()));
                order.push_back(vetting.spawn(vet(s, acceptor, token, prev_rank, round)));
            }
            Some(done) = vetting.join_next_with_id(), if !vetting.is_empty() => {
                if let Ok((id, vetted)) = done {
                    order.retain(|h: &tokio::task::AbortHandle| h.id() != id);
                    if let Some(link) = vetted {
                        return Ok(link);
                    }
                }
            }
        }
    }
}

/// One connection to the ring's port: the link when it is the previous rank of this round.
async fn vet(
    s: TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    token: auth::Token,
    prev_rank: u32,
    round: u64,
) -> Option<Box<dyn Link>> {
    let mut s: Box<dyn Link> = match acceptor {
        None => Box::new(s),
        Some(a) => match tokio::time::timeout(Duration::from_secs(5), a.accept(s)).await {
            Ok(Ok(s)) => Box::new(s),
            Ok(Err(e)) => {
                tracing::warn!("turned away a ring connection without the job's certificate: {e}");
                return None;
            }
            Err(_) => return None,
        },
    };
    let mut hello = [0u8; HELLO];
    if !matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut hello)).await,
        Ok(Ok(_))
    ) {
        return None;
    }
    let from = u32::from_le_bytes(hello[..4].try_into().expect("4"));
    let their_round = u64::from_le_bytes(hello[4..12].try_into().expect("8"));
    let proof: [u8; 32] = hello[12..].try_into().expect("32");
    if !auth::digests_match(&proof, &token.proof(&hello[..12])) {
        tracing::warn!("turned away a ring connection without the job's secret");
        return None;
    }
    if from == prev_rank && their_round == round {
        return Some(s);
    }
    tracing::warn!(
        from,
        their_round,
        "turned away a ring connection from another round"
    );
    None
}

impl Ring {
    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn world(&self) -> u32 {
        self.world
    }

    /// Forms the ring for `rank` of `peers.len()` in `round`, listening on `listener`; every
    /// member proves it holds the job's secret (and presents the job's certificate when the
    /// job runs with TLS).
    pub async fn connect(
        rank: u32,
        peers: &[String],
        round: u64,
        listener: &TcpListener,
        timeout: Duration,
        creds: &auth::JobCreds,
    ) -> Result<Self, Error> {
        let token = &creds.token;
        let tls = RingTls::of(creds)?;
        let tls = tls.as_ref();
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
                    Ok(s) => {
                        s.set_nodelay(true).ok();
                        let mut s: Box<dyn Link> = match tls {
                            None => Box::new(s),
                            // A peer that never answers the handshake must not hold the ring
                            // past its deadline.
                            Some(t) => match tokio::time::timeout(
                                deadline
                                    .saturating_duration_since(Instant::now())
                                    .max(Duration::from_secs(1)),
                                t.connector.connect(t.name.clone(), s),
                            )
                            .await
                            .unwrap_or_else(|_| {
                                Err(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    "no TLS handshake from the next rank",
                                ))
                            }) {
                                Ok(s) => Box::new(s),
                                Err(e) if Instant::now() > deadline => {
                                    return Err(Error::Ring {
                                        peer: next_rank,
                                        source: e,
                                    });
                                }
                                Err(e) => {
                                    tracing::debug!("ring TLS to rank {next_rank}: {e}");
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    continue;
                                }
                            },
                        };
                        let mut hello = [0u8; HELLO];
                        hello[..12].copy_from_slice(&context(rank, round));
                        hello[12..].copy_from_slice(&token.proof(&context(rank, round)));
                        if s.write_all(&hello).await.is_ok() && s.flush().await.is_ok() {
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
        let accept_prev = accept_prev(listener, prev_rank, round, deadline, token, tls);
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
            // A TLS link may hold the last record until flushed.
            next.write_all(send).await?;
            next.flush().await
        };
        let w = async {
            w.await.map_err(|e| Error::Ring {
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

    /// Rank 0's `data` on every rank, passed along the ring (rank r reads from r-1 and
    /// forwards to r+1, chunk by chunk, so the ranks pipeline): what rank 0 gave on rank 0,
    /// what it sent elsewhere. `data` is read on rank 0 only; a length over `max_len` (said
    /// first, 8 bytes) is refused, so a wrong peer cannot make a rank allocate at will.
    pub async fn broadcast_from_rank0(
        &mut self,
        data: Vec<u8>,
        max_len: usize,
    ) -> Result<Vec<u8>, Error> {
        if self.world <= 1 {
            return Ok(data);
        }
        let next_rank = (self.rank + 1) % self.world;
        let prev_rank = (self.rank + self.world - 1) % self.world;
        let last = next_rank == 0;
        let (next, prev) = (
            self.next.as_mut().expect("world > 1"),
            self.prev.as_mut().expect("world > 1"),
        );
        let to_next = |source| Error::Ring {
            peer: next_rank,
            source,
        };
        let from_prev = |source| Error::Ring {
            peer: prev_rank,
            source,
        };
        if self.rank == 0 {
            next.write_all(&(data.len() as u64).to_le_bytes())
                .await
                .map_err(to_next)?;
            next.write_all(&data).await.map_err(to_next)?;
            next.flush().await.map_err(to_next)?;
            return Ok(data);
        }
        let mut len = [0u8; 8];
        prev.read_exact(&mut len).await.map_err(from_prev)?;
        let len = u64::from_le_bytes(len);
        if len > max_len as u64 {
            return Err(from_prev(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("rank 0 sends {len} bytes, over the {max_len} expected"),
            )));
        }
        let mut out = vec![0u8; len as usize];
        if !last {
            next.write_all(&len.to_le_bytes()).await.map_err(to_next)?;
        }
        for chunk in out.chunks_mut(BROADCAST_CHUNK) {
            prev.read_exact(chunk).await.map_err(from_prev)?;
            if !last {
                next.write_all(chunk).await.map_err(to_next)?;
            }
        }
        if !last {
            next.flush().await.map_err(to_next)?;
        }
        Ok(out)
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

    /// A job's credentials: a fresh secret, and the job's TLS (made in `dir`) when given.
    fn creds(tls: Option<&std::path::Path>) -> auth::JobCreds {
        auth::JobCreds {
            token: auth::Token::generate(),
            tls: tls.map(|d| auth::tls::JobTls::make_or_load(d).unwrap()),
        }
    }

    async fn ring_of(world: usize, len: usize, creds: &auth::JobCreds) -> Vec<Vec<f64>> {
        let listeners = futures_listeners(world).await;
        on_each_rank(listeners, 7, creds, move |mut ring| async move {
            let rank = ring.rank() as usize;
            let mut buf: Vec<f64> = (0..len).map(|i| (i * (rank + 1)) as f64).collect();
            ring.allreduce_sum(&mut buf).await.unwrap();
            buf
        })
        .await
    }

    /// The addresses of `listeners`, by rank.
    fn peers_of(listeners: &[TcpListener]) -> Vec<String> {
        listeners
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect()
    }

    /// `f` run on every rank of the ring formed over `listeners` in `round` (each its own
    /// task): what each gave, by rank.
    async fn on_each_rank<T, F, Fut>(
        listeners: Vec<TcpListener>,
        round: u64,
        creds: &auth::JobCreds,
        f: F,
    ) -> Vec<T>
    where
        F: Fn(Ring) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = T> + Send,
        T: Send + 'static,
    {
        let peers = peers_of(&listeners);
        let mut tasks = Vec::new();
        for (rank, l) in listeners.into_iter().enumerate() {
            let (peers, creds, f) = (peers.clone(), creds.clone(), f.clone());
            tasks.push(tokio::spawn(async move {
                let timeout = Duration::from_secs(20);
                let ring = Ring::connect(rank as u32, &peers, round, &l, timeout, &creds)
                    .await
                    .unwrap();
                f(ring).await
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
        let dir = tempfile::tempdir().unwrap();
        for (world, len, tls) in [
            (1, 5, false),
            (2, 7, false),
            (3, 10, false),
            (4, 3, false),
            (5, 1000, false),
            (2, 7, true),
            (3, 100_000, true),
        ] {
            let out = ring_of(world, len, &creds(tls.then_some(dir.path()))).await;
            let factor: f64 = (1..=world).map(|r| r as f64).sum();
            for buf in out {
                for (i, v) in buf.iter().enumerate() {
                    assert_eq!(*v, i as f64 * factor, "world {world} len {len}");
                }
            }
        }
    }

    /// Rank 0's bytes reach every rank, for worlds of one to five, empty, under one chunk and
    /// over several, plain and over TLS; the ring sums as before after it; a length over what
    /// a rank expects is refused.
    #[tokio::test]
    async fn every_rank_gets_rank_0_s_bytes_and_the_ring_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        for (world, len, tls) in [
            (1, 10, false),
            (2, 0, false),
            (3, 1000, false),
            (4, 2 * BROADCAST_CHUNK + 3, false),
            (5, 17, false),
            (3, BROADCAST_CHUNK + 1, true),
        ] {
            let creds = creds(tls.then_some(dir.path()));
            let sent: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let to_send = sent.clone();
            let listeners = futures_listeners(world).await;
            let out = on_each_rank(listeners, 5, &creds, move |mut ring| {
                let mine = if ring.rank() == 0 {
                    to_send.clone()
                } else {
                    vec![9; 3]
                };
                async move {
                    let got = ring.broadcast_from_rank0(mine, len).await.unwrap();
                    let mut buf = vec![1.0f32; 4];
                    ring.allreduce_sum(&mut buf).await.unwrap();
                    (got, buf)
                }
            })
            .await;
            for (got, buf) in out {
                assert!(got == sent, "world {world} len {len}");
                assert_eq!(buf, vec![world as f32; 4]);
            }
        }
        // Rank 1 expects at most 99 bytes: 100 are refused with the sizes.
        let listeners = futures_listeners(2).await;
        let outs = on_each_rank(listeners, 5, &creds(None), |mut ring| async move {
            ring.broadcast_from_rank0(vec![0; 100], 99).await
        })
        .await;
        let e = outs[1].as_ref().unwrap_err().to_string();
        assert!(
            e.contains("rank 0 sends 100 bytes, over the 99 expected"),
            "{e}"
        );
    }

    /// Issue 40, attack 1 on the ring: connections that never speak, more than are vetted at
    /// once, are held on every rank's port before the ring forms (each used to hold the accept
    /// loop for 5 s, one after another); the ring forms and sums, plain and over TLS.
    #[tokio::test]
    async fn silent_connections_on_the_ring_ports_do_not_stop_it_forming() {
        let dir = tempfile::tempdir().unwrap();
        for creds in [creds(None), creds(Some(dir.path()))] {
            let listeners = futures_listeners(3).await;
            let mut silent = Vec::new();
            for p in &peers_of(&listeners) {
                for _ in 0..(2 * VETTING) {
                    silent.push(TcpStream::connect(p).await.unwrap());
                }
            }
            let out = on_each_rank(listeners, 9, &creds, |mut ring| async move {
                let mut buf = vec![ring.rank() as f64 + 1.0; 5];
                ring.allreduce_sum(&mut buf).await.unwrap();
                buf
            })
            .await;
            for buf in out {
                assert_eq!(buf, vec![6.0; 5]);
            }
            drop(silent);
        }
    }

    #[tokio::test]
    async fn a_peer_without_the_jobs_secret_is_turned_away() {
        let listeners = futures_listeners(2).await;
        let peers: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        let (ours, theirs) = (creds(None), creds(None));
        let mut ls = listeners.into_iter();
        let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
        // Rank 1 holds another job's secret: rank 0 never accepts its connection, and a raw
        // hello with a zero proof is turned away as well.
        let mut raw = TcpStream::connect(&peers[0]).await.unwrap();
        raw.write_all(&[0u8; HELLO]).await.unwrap();
        let p0 = peers.clone();
        let r0 = tokio::spawn(async move {
            Ring::connect(0, &p0, 3, &l0, Duration::from_secs(2), &ours)
                .await
                .map(|_| ())
        });
        let r1 = tokio::spawn(async move {
            Ring::connect(1, &peers, 3, &l1, Duration::from_secs(2), &theirs)
                .await
                .map(|_| ())
        });
        let e0 = r0.await.unwrap().unwrap_err().to_string();
        assert!(e0.contains("no connection from the previous rank"), "{e0}");
        assert!(r1.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn over_tls_a_peer_without_the_jobs_certificate_is_turned_away() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ours = creds(Some(a.path()));
        // The job's secret, but another job's certificate; then a plain TCP peer.
        let theirs = auth::JobCreds {
            token: ours.token.clone(),
            tls: creds(Some(b.path())).tls,
        };
        let plain = auth::JobCreds {
            token: ours.token.clone(),
            tls: None,
        };
        for other in [theirs, plain] {
            let listeners = futures_listeners(2).await;
            let peers: Vec<String> = listeners
                .iter()
                .map(|l| l.local_addr().unwrap().to_string())
                .collect();
            let mut ls = listeners.into_iter();
            let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
            let (p0, ours) = (peers.clone(), ours.clone());
            let r0 = tokio::spawn(async move {
                Ring::connect(0, &p0, 3, &l0, Duration::from_secs(2), &ours)
                    .await
                    .map(|_| ())
            });
            let r1 = tokio::spawn(async move {
                Ring::connect(1, &peers, 3, &l1, Duration::from_secs(2), &other)
                    .await
                    .map(|_| ())
            });
            // Both of rank 0's halves fail at the same deadline, so either may be reported: it
            // heard no valid hello from rank 1, or it could not verify rank 1 as the next rank.
            // Either way the ring never forms with the stranger.
            let e0 = r0.await.unwrap().unwrap_err().to_string();
            assert!(e0.starts_with("ring all-reduce with rank 1"), "{e0}");
            assert!(r1.await.unwrap().is_err());
        }
    }
}
