//! A training process's output, capped: its stdout and stderr come through pipes, and the
//! agent copies them to its own (the process's log, which the job master or the platform
//! opened) up to a cap in bytes for both together, per incarnation. Past the cap the rest is
//! read and dropped, so the process never blocks on a full pipe, and one note in the log says
//! so; when the process ends, the agent's own log says how much was dropped. The cap is the
//! operator's (`[launcher.sandbox] output_cap`), [`DEFAULT_CAP`] without one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::Child;
use tokio::task::JoinHandle;

/// A process's output kept when the operator sets no cap: 256 MiB.
pub const DEFAULT_CAP: u64 = 256 << 20;

/// How long the agent waits, once its process has exited, for the rest of the output to come
/// through (a child the process left behind may hold the pipes open for good).
pub const DRAIN_WITHIN: Duration = Duration::from_secs(2);

/// What is left of one process's output allowance, shared by its two streams.
struct Allowance {
    cap: u64,
    left: AtomicU64,
    dropped: AtomicU64,
    noted: AtomicBool,
}

impl Allowance {
    fn new(cap: u64) -> Arc<Allowance> {
        Arc::new(Allowance {
            cap,
            left: AtomicU64::new(cap),
            dropped: AtomicU64::new(0),
            noted: AtomicBool::new(false),
        })
    }

    /// How many of the next `n` bytes may be kept.
    fn take(&self, n: u64) -> u64 {
        let mut kept = 0;
        let _ = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                kept = left.min(n);
                Some(left - kept)
            });
        self.dropped.fetch_add(n - kept, Ordering::AcqRel);
        kept
    }
}

/// The copies of one process's output.
pub struct Output {
    allowance: Arc<Allowance>,
    copies: Vec<JoinHandle<()>>,
    what: String,
}

impl Output {
    /// Copies `child`'s piped stdout and stderr to this agent's stdout and stderr, `cap` bytes
    /// in all. `what` names the process in the note.
    pub fn follow(child: &mut Child, cap: u64, what: String) -> Output {
        let allowance = Allowance::new(cap);
        let mut copies = Vec::new();
        if let Some(out) = child.stdout.take() {
            copies.push(tokio::spawn(copy(
                out,
                tokio::io::stdout(),
                allowance.clone(),
                what.clone(),
            )));
        }
        if let Some(err) = child.stderr.take() {
            copies.push(tokio::spawn(copy(
                err,
                tokio::io::stderr(),
                allowance.clone(),
                what.clone(),
            )));
        }
        Output {
            allowance,
            copies,
            what,
        }
    }

    /// Waits, at most `within`, for the copies to reach the end of the output (the process
    /// has exited), then says what was dropped.
    pub async fn drained(self, within: Duration) {
        let all = async {
            for c in self.copies {
                let _ = c.await;
            }
        };
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!(
                "{}'s output is still open {} s after it exited (a process it left behind \
                 holds it): no longer waited for",
                self.what,
                within.as_secs()
            );
        }
        let dropped = self.allowance.dropped.load(Ordering::Acquire);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                cap = self.allowance.cap,
                "{}'s output passed its cap: {dropped} bytes dropped",
                self.what
            );
        }
    }
}

/// One stream: kept up to the allowance, then read and dropped until its end.
async fn copy(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    allowance: Arc<Allowance>,
    what: String,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut writable = true;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let kept = allowance.take(n as u64) as usize;
        if writable && kept > 0 && to.write_all(&buf[..kept]).await.is_err() {
            // The log is gone (a full disk): the output is still read, so the process runs.
            writable = false;
        }
        if kept < n && !allowance.noted.swap(true, Ordering::AcqRel) && writable {
            let note = format!(
                "\n[brain] {what}'s output reached its cap of {} bytes ([launcher.sandbox] \
                 output_cap): the rest is dropped\n",
                allowance.cap
            );
            let _ = to.write_all(note.as_bytes()).await;
        }
        if writable {
            let _ = to.flush().await;
        }
    }
    let _ = to.flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_past_the_cap_is_dropped_with_one_note_and_counted() {
        let (mut w, r) = tokio::io::duplex(1 << 16);
        let allowance = Allowance::new(100);
        let mut sink = Vec::new();
        let writer = tokio::spawn(async move {
            for _ in 0..30 {
                w.write_all(&[b'x'; 10]).await.unwrap();
            }
        });
        copy(r, &mut sink, allowance.clone(), "worker-0".into()).await;
        writer.await.unwrap();
        let text = String::from_utf8(sink).unwrap();
        let kept = text.split("\n[brain]").next().unwrap();
        assert_eq!(kept, "x".repeat(100), "{text}");
        assert_eq!(
            text.matches("reached its cap of 100 bytes").count(),
            1,
            "{text}"
        );
        assert_eq!(allowance.dropped.load(Ordering::Acquire), 200);
    }

    #[tokio::test]
    async fn output_within_the_cap_passes_whole() {
        let (mut w, r) = tokio::io::duplex(1 << 16);
        let allowance = Allowance::new(1000);
        let mut sink = Vec::new();
        tokio::spawn(async move { w.write_all(b"hello\nworld\n").await.unwrap() });
        copy(r, &mut sink, allowance.clone(), "worker-0".into()).await;
        assert_eq!(sink, b"hello\nworld\n");
        assert_eq!(allowance.dropped.load(Ordering::Acquire), 0);
    }
}
