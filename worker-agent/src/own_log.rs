//! The agent's own log, bounded: its lines go out (to stderr: the log file the job master or
//! the platform opened for it) until [`OWN_LOG_CAP`] bytes in all, then one line says that the
//! rest is dropped, and no line more is written. Whatever a job makes its agent say (names it
//! plants in the directories the agent reads, peers it makes fail again and again) can never
//! fill the disk the log is on. The process's own output is capped apart ([`crate::output`]).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The bytes of its own lines an agent writes at most: 64 MiB, far more than a job of weeks
/// fills at the default level.
pub const OWN_LOG_CAP: u64 = 64 << 20;

/// What is left of the log's allowance, shared by every line.
#[derive(Debug)]
struct Allowance {
    cap: u64,
    left: AtomicU64,
    noted: AtomicBool,
}

/// A [`tracing_subscriber::fmt::MakeWriter`] that writes each line through `inner` while the
/// allowance lasts.
#[derive(Clone, Debug)]
pub struct Bounded<M> {
    inner: M,
    allowance: Arc<Allowance>,
}

impl<M> Bounded<M> {
    pub fn new(inner: M, cap: u64) -> Bounded<M> {
        Bounded {
            inner,
            allowance: Arc::new(Allowance {
                cap,
                left: AtomicU64::new(cap),
                noted: AtomicBool::new(false),
            }),
        }
    }
}

/// One line's writer (the formatter writes each line at once).
pub struct Line<W> {
    inner: W,
    allowance: Arc<Allowance>,
}

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for Bounded<M>
{
    type Writer = Line<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            inner: self.inner.make_writer(),
            allowance: self.allowance.clone(),
        }
    }
}

impl<W: Write> Write for Line<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len() as u64;
        let a = &self.allowance;
        let kept = a
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                (left >= n).then(|| left - n)
            })
            .is_ok();
        if kept {
            self.inner.write_all(buf)?;
        } else if !a.noted.swap(true, Ordering::AcqRel) {
            let note = format!(
                "worker-agent: its own log reached its cap of {} bytes: further lines are \
                 dropped\n",
                a.cap
            );
            self.inner.write_all(note.as_bytes())?;
        }
        // A dropped line is still taken, so the formatter never retries it.
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_past_the_cap_are_dropped_with_one_note() {
        let out = Shared::default();
        let sink = out.clone();
        let log = Bounded::new(move || sink.clone(), 100);
        let line = [b'x'; 30];
        for _ in 0..1_000 {
            log.make_writer().write_all(&line).unwrap();
        }
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        // Three whole lines fit in 100 bytes, then the note, once.
        assert!(text.starts_with(&"x".repeat(90)), "{text}");
        assert_eq!(
            text.matches("further lines are dropped").count(),
            1,
            "{text}"
        );
        assert!(text.contains("cap of 100 bytes"), "{text}");
        assert!(!text[90..].contains('x'), "{text}");
    }

    #[test]
    fn a_log_through_tracing_stops_at_its_cap() {
        let out = Shared::default();
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(Bounded::new(move || sink.clone(), 4_096))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..10_000 {
                tracing::warn!(i, "removed a name the job planted");
            }
        });
        let len = out.0.lock().unwrap().len();
        assert!(len <= 4_096 + 200, "{len} bytes written");
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("further lines are dropped").count(), 1);
    }
}
