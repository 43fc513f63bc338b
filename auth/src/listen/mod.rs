//! Listeners nobody can lock out. Every server of Brain (the brain, a job master, a parameter
//! server) takes its connections through [`incoming`], which hands tonic only connections that
//! have shown they speak: a TLS handshake finished (when the server has TLS) and a first byte
//! read, both within [`ConnLimits::handshake_timeout_ms`]. Until then a connection is
//! *pending*. Connections are capped in all and per peer address; at a cap a new connection is
//! still taken, and room is made by closing the oldest pending connection (of that peer, at the
//! peer cap), else the one idle longest: a flood of connections that never speak costs the
//! flooder its own connections, not the clients that speak. A connection that moves no byte
//! either way for [`ConnLimits::idle_timeout_ms`] is closed (a gRPC client reconnects on its
//! next call). The cap in all never passes what the process's open-file limit leaves (see
//! [`raise_open_files`], which every binary calls at start). Each closing is counted
//! ([`ConnStats`]) and said in the log, at most every ten seconds per listener.
//!
//! `guard` keeps the table of one listener's connections (caps, room made, idle sweep,
//! counts); `conn` is the connection tonic serves ([`Conn`]); here are the limits and the
//! accept loop with its handshakes.

mod conn;
mod guard;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

pub use conn::Conn;
use conn::Inner;
pub use guard::{ConnCounts, ConnStats};
use guard::{Guard, Slot};

/// How a listener treats the connections it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnLimits {
    /// Time from accept to a finished TLS handshake (with TLS) and the first byte, ms; a
    /// connection that takes longer is closed.
    #[serde(default = "default_handshake_ms")]
    pub handshake_timeout_ms: u64,
    /// A connection that moves no byte either way for this long is closed, ms.
    #[serde(default = "default_idle_ms")]
    pub idle_timeout_ms: u64,
    /// Connections open at once, pending or not (never more than the open-file limit leaves).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    #[serde(default = "default_max_per_peer")]
    pub max_per_peer: usize,
}

fn default_handshake_ms() -> u64 {
    10_000
}
fn default_idle_ms() -> u64 {
    300_000
}
fn default_max_connections() -> usize {
    4096
}
fn default_max_per_peer() -> usize {
    1024
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            handshake_timeout_ms: default_handshake_ms(),
            idle_timeout_ms: default_idle_ms(),
            max_connections: default_max_connections(),
            max_per_peer: default_max_per_peer(),
        }
    }
}

impl ConnLimits {
    /// The first problem with these limits, named as `at` (a config table) says.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        if self.handshake_timeout_ms == 0 || self.idle_timeout_ms == 0 {
            return Err(format!(
                "{at}: handshake_timeout_ms ({}) and idle_timeout_ms ({}) must be above 0",
                self.handshake_timeout_ms, self.idle_timeout_ms
            ));
        }
        if self.max_connections == 0 || self.max_per_peer == 0 {
            return Err(format!(
                "{at}: max_connections ({}) and max_per_peer ({}) must be at least 1",
                self.max_connections, self.max_per_peer
            ));
        }
        Ok(())
    }
}

/// Raises this process's open-file limit (soft) to its hard limit, as servers that hold many
/// connections do; returns the soft limit now in force.
pub fn raise_open_files() -> io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
        return Ok(hard);
    }
    Ok(soft)
}

/// File descriptors a server keeps for what is not a connection (its database, logs, the
/// processes it starts).
const FD_RESERVE: u64 = 256;

/// The cap in all a listener can keep: `wanted`, or less where the open-file limit leaves less.
fn effective_cap(wanted: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => wanted.min(soft.saturating_sub(FD_RESERVE).max(16) as usize),
        Err(_) => wanted,
    }
}

/// What a listener serves with: its limits, and TLS when it has it.
#[derive(Clone)]
pub struct Listening {
    pub name: &'static str,
    pub limits: ConnLimits,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub stats: Arc<ConnStats>,
}

impl Listening {
    pub fn new(
        name: &'static str,
        limits: ConnLimits,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Listening {
        Listening {
            name,
            limits,
            tls,
            stats: Arc::default(),
        }
    }
}

/// Accepts on `listener` until the returned stream is dropped, yielding only connections that
/// have spoken (see the module's comment). Many pending connections are handled at once: a
/// slow or silent one never holds up the next.
pub fn incoming(
    listener: TcpListener,
    how: Listening,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn>> {
    let cap = effective_cap(how.limits.max_connections);
    if cap < how.limits.max_connections {
        tracing::warn!(
            listener = how.name,
            "at most {cap} connections at once (asked {}): the open-file limit leaves no more",
            how.limits.max_connections
        );
    }
    let guard = Arc::new(Guard::new(how.name, how.limits, cap, how.stats.clone()));
    let (tx, rx) = mpsc::channel(64);
    let acceptor = how.tls.map(tokio_rustls::TlsAcceptor::from);
    let sweeper = {
        let guard = Arc::downgrade(&guard);
        let every = Duration::from_millis((how.limits.idle_timeout_ms / 4).clamp(50, 5_000));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match guard.upgrade() {
                    Some(g) => g.sweep(),
                    None => return,
                }
            }
        })
    };
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => break,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait a little
                    // rather than spin.
                    tracing::warn!(listener = guard.name(), "accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            stream.set_nodelay(true).ok();
            let (id, slot) = guard.admit(peer.ip());
            let taken = take(guard.clone(), id, slot, stream, peer, acceptor.clone());
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Some(conn) = taken.await {
                    // A server that stopped taking connections drops this one.
                    let _ = tx.send(Ok(conn)).await;
                }
            });
        }
        sweeper.abort();
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// One accepted connection through its handshake, within the handshake timeout and unless the
/// listener closes it meanwhile: the connection, once it has spoken.
async fn take(
    guard: Arc<Guard>,
    id: u64,
    slot: Arc<Slot>,
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
) -> Option<Conn> {
    let local = stream.local_addr().ok();
    let timeout = Duration::from_millis(guard.limits().handshake_timeout_ms);
    let outcome = tokio::select! {
        r = tokio::time::timeout(timeout, handshake(stream, acceptor)) => Some(r),
        () = slot.kill.notified() => None,
    };
    let (inner, first) = match outcome {
        Some(Ok(Ok(ok))) => ok,
        failed => {
            let counter = match failed {
                Some(Ok(Err(_))) => Some(&guard.stats().handshake_failures),
                Some(Err(_)) => Some(&guard.stats().handshake_timeouts),
                _ => None,
            };
            if let Some(c) = counter {
                c.fetch_add(1, Ordering::Relaxed);
            }
            guard.remove(id, &slot);
            return None;
        }
    };
    guard.spoke(&slot);
    let info = tonic::transport::server::TcpConnectInfo {
        local_addr: local,
        remote_addr: Some(peer),
    };
    Some(Conn::new(inner, first, id, slot, guard, info))
}

/// TLS (when the listener has it), then the first bytes the peer sends.
async fn handshake(
    stream: TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
) -> io::Result<(Inner, Vec<u8>)> {
    let mut first = vec![0u8; 512];
    let (inner, n) = match acceptor {
        None => {
            let mut s = stream;
            let n = s.read(&mut first).await?;
            (Inner::Plain(s), n)
        }
        Some(a) => {
            let mut s = a.accept(stream).await?;
            let n = s.read(&mut first).await?;
            (Inner::Tls(s), n)
        }
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before sending anything",
        ));
    }
    first.truncate(n);
    Ok((inner, first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use tokio::io::AsyncWriteExt;
    use tokio_stream::StreamExt;

    fn limits(handshake_ms: u64, idle_ms: u64, max: usize, per_peer: usize) -> ConnLimits {
        ConnLimits {
            handshake_timeout_ms: handshake_ms,
            idle_timeout_ms: idle_ms,
            max_connections: max,
            max_per_peer: per_peer,
        }
    }

    async fn serve(l: ConnLimits) -> (SocketAddr, ReceiverStreamOf, Arc<ConnStats>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let how = Listening::new("test", l, None);
        let stats = how.stats.clone();
        (addr, incoming(listener, how), stats)
    }

    type ReceiverStreamOf = tokio_stream::wrappers::ReceiverStream<io::Result<Conn>>;

    /// Connects from `from` (a loopback address) to `to`.
    async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        s.connect(to).await.unwrap()
    }

    /// Whether the server closed `s` (EOF or reset) within `within`.
    async fn closed(s: &mut TcpStream, within: Duration) -> bool {
        let mut b = [0u8; 16];
        matches!(
            tokio::time::timeout(within, s.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn a_flood_of_silent_connections_costs_the_flooder_not_a_client_that_speaks() {
        let (addr, mut conns, stats) = serve(limits(5_000, 60_000, 20, 20)).await;
        let mut silent = Vec::new();
        for _ in 0..300 {
            silent.push(connect_from([127, 0, 0, 1], addr).await);
        }
        // Room is made for each new one: the cap holds.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(stats.counts().open <= 20, "{:?}", stats.counts());
        let mut client = connect_from([127, 0, 0, 1], addr).await;
        client.write_all(b"hello").await.unwrap();
        let mut conn = tokio::time::timeout(Duration::from_secs(5), conns.next())
            .await
            .expect("the client's connection is served")
            .unwrap()
            .unwrap();
        let mut got = [0u8; 5];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        let c = stats.counts();
        assert!(c.evicted >= 280, "{c:?}");
        assert_eq!(c.pending + 1, c.open, "{c:?}");
        // The oldest silent ones were closed.
        assert!(closed(&mut silent[0], Duration::from_secs(2)).await);
        // Another flood closes silent ones only, never the client that spoke.
        for _ in 0..100 {
            silent.push(connect_from([127, 0, 0, 1], addr).await);
        }
        conn.write_all(b"still here").await.unwrap();
        let mut back = [0u8; 10];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"still here");
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_handshake_timeout_and_an_idle_one_after_the_idle_timeout()
     {
        let (addr, mut conns, stats) = serve(limits(300, 400, 100, 100)).await;
        let mut silent = connect_from([127, 0, 0, 1], addr).await;
        assert!(closed(&mut silent, Duration::from_secs(3)).await);
        assert_eq!(stats.counts().handshake_timeouts, 1);
        let mut client = connect_from([127, 0, 0, 1], addr).await;
        client.write_all(b"x").await.unwrap();
        let mut conn = conns.next().await.unwrap().unwrap();
        let mut b = [0u8; 1];
        conn.read_exact(&mut b).await.unwrap();
        // Nothing moves: the listener closes it, and the server's read fails.
        let r = tokio::time::timeout(Duration::from_secs(3), conn.read(&mut b)).await;
        assert!(matches!(r, Ok(Err(_))), "{r:?}");
        drop(conn);
        assert!(closed(&mut client, Duration::from_secs(2)).await);
        let c = stats.counts();
        assert_eq!((c.idle_closed, c.open, c.pending), (1, 0, 0), "{c:?}");
    }

    #[tokio::test]
    async fn a_flood_from_one_peer_closes_that_peers_own_connections() {
        let (addr, mut conns, stats) = serve(limits(5_000, 60_000, 100, 5)).await;
        // A client from one address is still connecting (pending) when another floods.
        let mut client = connect_from([127, 0, 0, 1], addr).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut flood = Vec::new();
        for _ in 0..50 {
            flood.push(connect_from([127, 0, 0, 2], addr).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(stats.counts().evicted >= 45, "{:?}", stats.counts());
        client.write_all(b"ok").await.unwrap();
        let conn = tokio::time::timeout(Duration::from_secs(5), conns.next())
            .await
            .expect("the client's connection survived the other peer's flood")
            .unwrap()
            .unwrap();
        assert_eq!(conn.peer().unwrap().ip(), IpAddr::from([127, 0, 0, 1]));
    }

    #[test]
    fn limits_are_checked_and_the_open_file_limit_bounds_the_cap() {
        assert!(ConnLimits::default().validate("x").is_ok());
        let e = limits(0, 1, 1, 1)
            .validate("limits.connections")
            .unwrap_err();
        assert!(
            e.starts_with("limits.connections: handshake_timeout_ms (0)"),
            "{e}"
        );
        let e = limits(1, 1, 1, 0).validate("t").unwrap_err();
        assert!(e.contains("max_per_peer (0)"), "{e}");
        let soft = raise_open_files().unwrap();
        assert_eq!(effective_cap(16), 16);
        assert!(effective_cap(usize::MAX) as u64 <= soft);
    }
}
