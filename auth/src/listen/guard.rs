//! One listener's table of connections: each connection's shared state ([`Slot`]), the caps in
//! all and per peer with room made by closing the oldest pending connection (else the one idle
//! longest), the idle sweep, and the counts a server's metrics read ([`ConnStats`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::ConnLimits;

/// What a listener has seen, for a server's metrics.
#[derive(Debug, Default)]
pub struct ConnStats {
    accepted: AtomicU64,
    open: AtomicU64,
    pending: AtomicU64,
    pub(super) handshake_timeouts: AtomicU64,
    pub(super) handshake_failures: AtomicU64,
    idle_closed: AtomicU64,
    evicted: AtomicU64,
}

/// A reading of [`ConnStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnCounts {
    pub accepted: u64,
    pub open: u64,
    pub pending: u64,
    pub handshake_timeouts: u64,
    pub handshake_failures: u64,
    pub idle_closed: u64,
    /// Closed to make room at a cap.
    pub evicted: u64,
}

impl ConnStats {
    pub fn counts(&self) -> ConnCounts {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConnCounts {
            accepted: r(&self.accepted),
            open: r(&self.open),
            pending: r(&self.pending),
            handshake_timeouts: r(&self.handshake_timeouts),
            handshake_failures: r(&self.handshake_failures),
            idle_closed: r(&self.idle_closed),
            evicted: r(&self.evicted),
        }
    }
}

/// Why a connection was closed by its listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closed {
    Idle,
    Evicted,
}

/// One connection's shared state: what the table, the sweeper and the connection itself see.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) peer: IpAddr,
    /// Milliseconds since the table's epoch of the last byte moved (accept time at first).
    pub(super) last: AtomicU64,
    pub(super) pending: AtomicBool,
    pub(super) killed: AtomicBool,
    /// Wakes a pending connection's handshake.
    pub(super) kill: Notify,
    /// Wakes the reader of an established connection.
    pub(super) waker: Mutex<Option<Waker>>,
}

impl Slot {
    fn close(&self) {
        self.killed.store(true, Ordering::Release);
        self.kill.notify_one();
        if let Some(w) = self.waker.lock().expect("no panic under the lock").take() {
            w.wake();
        }
    }
}

struct Table {
    slots: HashMap<u64, Arc<Slot>>,
    per_peer: HashMap<IpAddr, usize>,
    next_id: u64,
}

/// The connections of one listener.
pub(super) struct Guard {
    name: &'static str,
    limits: ConnLimits,
    cap: usize,
    epoch: Instant,
    table: Mutex<Table>,
    stats: Arc<ConnStats>,
    last_said: Mutex<Option<Instant>>,
}

impl Guard {
    pub(super) fn new(
        name: &'static str,
        limits: ConnLimits,
        cap: usize,
        stats: Arc<ConnStats>,
    ) -> Guard {
        Guard {
            name,
            limits,
            cap,
            epoch: Instant::now(),
            table: Mutex::new(Table {
                slots: HashMap::new(),
                per_peer: HashMap::new(),
                next_id: 0,
            }),
            stats,
            last_said: Mutex::new(None),
        }
    }

    pub(super) fn name(&self) -> &'static str {
        self.name
    }

    pub(super) fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    pub(super) fn stats(&self) -> &ConnStats {
        &self.stats
    }

    /// `slot`'s connection has spoken: it is pending no more.
    pub(super) fn spoke(&self, slot: &Slot) {
        if slot.pending.swap(false, Ordering::AcqRel) {
            self.stats.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Registers a new connection from `peer`, closing another first where a cap is reached.
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr) -> (u64, Arc<Slot>) {
        let slot = Arc::new(Slot {
            peer,
            last: AtomicU64::new(self.now_ms()),
            pending: AtomicBool::new(true),
            killed: AtomicBool::new(false),
            kill: Notify::new(),
            waker: Mutex::new(None),
        });
        let mut victims = Vec::new();
        let id = {
            let mut t = self.table.lock().expect("no panic under the lock");
            if t.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.max_per_peer
                && let Some(v) = victim(&t, Some(peer), &[])
            {
                victims.push(v);
            }
            if t.slots.len() - victims.len() >= self.cap
                && let Some(v) = victim(&t, None, &victims)
            {
                victims.push(v);
            }
            for v in &victims {
                self.forget(&mut t, *v);
            }
            let id = t.next_id;
            t.next_id += 1;
            t.slots.insert(id, slot.clone());
            *t.per_peer.entry(peer).or_default() += 1;
            id
        };
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        self.stats.pending.fetch_add(1, Ordering::Relaxed);
        (id, slot)
    }

    /// Removes `id` from the table (its counts go when the connection is dropped) and closes it.
    fn forget(&self, t: &mut Table, id: u64) {
        if let Some(s) = t.slots.remove(&id) {
            release_peer(t, s.peer);
            s.close();
            self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            self.say(Closed::Evicted, s.peer, t.slots.len());
        }
    }

    /// A connection ended: it leaves the table (if the table still holds it).
    pub(super) fn remove(&self, id: u64, slot: &Slot) {
        let mut t = self.table.lock().expect("no panic under the lock");
        if t.slots.remove(&id).is_some() {
            release_peer(&mut t, slot.peer);
        }
        drop(t);
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
        if slot.pending.swap(false, Ordering::AcqRel) {
            self.stats.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Closes the connections idle past the idle timeout.
    pub(super) fn sweep(&self) {
        let now = self.now_ms();
        let idle = self.limits.idle_timeout_ms;
        let mut t = self.table.lock().expect("no panic under the lock");
        let stale: Vec<u64> = t
            .slots
            .iter()
            .filter(|(_, s)| {
                !s.pending.load(Ordering::Acquire)
                    && now.saturating_sub(s.last.load(Ordering::Relaxed)) >= idle
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some(s) = t.slots.remove(&id) {
                release_peer(&mut t, s.peer);
                s.close();
                self.stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                self.say(Closed::Idle, s.peer, t.slots.len());
            }
        }
    }

    /// Says a closing in the log, at most every ten seconds.
    fn say(&self, why: Closed, peer: IpAddr, open: usize) {
        let mut last = self.last_said.lock().expect("no panic under the lock");
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            return;
        }
        *last = Some(Instant::now());
        let c = self.stats.counts();
        match why {
            Closed::Evicted => tracing::warn!(
                listener = self.name,
                %peer,
                open,
                cap = self.cap,
                per_peer = self.limits.max_per_peer,
                pending = c.pending,
                evicted_total = c.evicted,
                "connection cap reached: closed the oldest pending (or longest idle) connection \
                 to take a new one"
            ),
            Closed::Idle => tracing::info!(
                listener = self.name,
                %peer,
                idle_closed_total = c.idle_closed,
                "closed connections idle for {} ms",
                self.limits.idle_timeout_ms
            ),
        }
    }
}

fn release_peer(t: &mut Table, peer: IpAddr) {
    if let Some(n) = t.per_peer.get_mut(&peer) {
        *n -= 1;
        if *n == 0 {
            t.per_peer.remove(&peer);
        }
    }
}

/// The connection to close to make room: the oldest pending one (of `peer` when given), else
/// the one idle longest; none of `chosen`.
fn victim(t: &Table, peer: Option<IpAddr>, chosen: &[u64]) -> Option<u64> {
    t.slots
        .iter()
        .filter(|(id, s)| peer.is_none_or(|p| s.peer == p) && !chosen.contains(id))
        .min_by_key(|(id, s)| {
            (
                !s.pending.load(Ordering::Acquire),
                s.last.load(Ordering::Relaxed),
                **id,
            )
        })
        .map(|(id, _)| *id)
}
