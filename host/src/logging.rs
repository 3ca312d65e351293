//! The host's log: `tracing` events, as text or JSON lines, on standard
//! error, through a writer that never blocks the host.
//!
//! A stalled standard error (a full pipe that nobody reads, a paused
//! journald or log shipper, a terminal on hold) must not stall the host:
//! if a log call blocked, the thread that logged would block with it, a
//! tokio worker, or the election's. So each event is formatted into a line
//! and queued, and a thread of its own (`baton-log`) writes the queue to
//! stderr. When the queue is full, lines are dropped and counted; the count
//! is reported, as a warning of its own, once the writer has caught up
//! (no line was dropped for a second), and at exit.
//!
//! At exit the host reports what was dropped and waits up to [`EXIT_WAIT`]
//! for the queue to be written out; lines that stderr does not take by then
//! are lost.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tracing_subscriber::fmt::MakeWriter;

/// How many formatted lines wait for a slow standard error before lines
/// are dropped: under a megabyte of typical lines (a few seconds of a busy
/// host), and at most 64 MiB of the longest guest lines (see
/// [`MAX_OUTPUT_LINE`](crate::runtime::output::MAX_OUTPUT_LINE)).
pub const LOG_QUEUE_LINES: usize = 4096;

/// How often dropped lines are looked for (and reported, once the writer
/// has caught up).
pub const DROP_REPORT_PERIOD: Duration = Duration::from_secs(1);

/// How long the host waits at exit for its queued log lines to be written.
pub const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The default filter: informational events of baton and guests, warnings
/// of wasmtime and cranelift.
pub const DEFAULT_FILTER: &str = "info,wasmtime=warn,cranelift=warn";

/// How log lines look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

enum Message {
    Line(Vec<u8>),
    /// Answer once everything queued before has been written.
    Flush(Sender<()>),
}

/// The writer the `tracing` subscriber formats into: each event becomes one
/// queued line.
#[derive(Clone)]
struct QueueWriter {
    queue: Sender<Message>,
    dropped: Arc<AtomicUsize>,
    /// Set at exit: lines wait for room until then, instead of being
    /// dropped (the last report gets through once stderr is read again).
    exiting: Arc<std::sync::OnceLock<Instant>>,
}

impl Write for QueueWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = Message::Line(buf.to_vec());
        let sent = match self.exiting.get() {
            Some(deadline) => self.queue.send_deadline(line, *deadline).is_ok(),
            None => !matches!(self.queue.try_send(line), Err(TrySendError::Full(_))),
        };
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for QueueWriter {
    type Writer = QueueWriter;

    fn make_writer(&'a self) -> QueueWriter {
        self.clone()
    }
}

/// The running log; keep it until the process ends. Dropping it reports
/// what was dropped and not reported yet, then waits up to [`EXIT_WAIT`]
/// for the queue to be written out.
pub struct Logging {
    queue: Sender<Message>,
    dropped: Arc<AtomicUsize>,
    reported: Arc<Reported>,
    exiting: Arc<std::sync::OnceLock<Instant>>,
}

/// What the reports said so far.
#[derive(Default)]
struct Reported {
    /// Dropped lines reported.
    reported: AtomicUsize,
    /// The count when last looked at.
    seen: AtomicUsize,
}

impl Drop for Logging {
    fn drop(&mut self) {
        let deadline = Instant::now() + EXIT_WAIT;
        let _ = self.exiting.set(deadline);
        report(&self.dropped, &self.reported, true);
        let (done, written) = crossbeam_channel::bounded(1);
        if self.queue.send_deadline(Message::Flush(done), deadline).is_ok() {
            let _ = written.recv_deadline(deadline);
        }
    }
}

/// The count of dropped lines of the log that [`init`] set up (the
/// subscriber is global, so is its count).
static DROPPED: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();

/// How many log lines were dropped since the process started because
/// standard error did not keep up (0 if [`init`] was not called).
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |d| d.load(Ordering::Relaxed) as u64)
}

/// Sets up the global subscriber: `BATON_LOG` (an `EnvFilter`) or
/// [`DEFAULT_FILTER`], the given format, standard error through the queue,
/// its writer thread, and the thread that reports dropped lines.
pub fn init(format: LogFormat) -> Logging {
    let (queue, lines) = crossbeam_channel::bounded(LOG_QUEUE_LINES);
    let dropped = Arc::new(AtomicUsize::new(0));
    let _ = DROPPED.set(dropped.clone());
    std::thread::Builder::new()
        .name("baton-log".into())
        .spawn(move || write_out(lines))
        .expect("spawn the log writer thread");
    let exiting = Arc::new(std::sync::OnceLock::new());
    let writer = QueueWriter {
        queue: queue.clone(),
        dropped: dropped.clone(),
        exiting: exiting.clone(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
    }
    let reported = Arc::new(Reported::default());
    let (counter, so_far) = (dropped.clone(), reported.clone());
    std::thread::Builder::new()
        .name("baton-log-drops".into())
        .spawn(move || {
            loop {
                std::thread::sleep(DROP_REPORT_PERIOD);
                report(&counter, &so_far, false);
            }
        })
        .expect("spawn the thread that reports dropped log lines");
    Logging {
        queue,
        dropped,
        reported,
        exiting,
    }
}

/// The writer thread: writes each queued line to stderr, blocking as long as
/// stderr does (only this thread waits).
/// (stderr is locked per line, not for good: others, a panic message or
/// `main`'s last error, may write to it too.)
fn write_out(lines: Receiver<Message>) {
    for message in lines {
        match message {
            Message::Line(line) => {
                let _ = std::io::stderr().write_all(&line);
            }
            Message::Flush(done) => {
                let _ = std::io::stderr().flush();
                let _ = done.send(());
            }
        }
    }
}

/// Reports lines dropped since the last report, once the writer has caught
/// up (no line was dropped since the last look), or at once if `now`. If the
/// report itself is dropped, the count moves on and a later report includes
/// what this one would have said.
fn report(dropped: &AtomicUsize, reported: &Reported, now: bool) {
    let count = dropped.load(Ordering::SeqCst);
    let caught_up = reported.seen.swap(count, Ordering::SeqCst) == count;
    let before = reported.reported.load(Ordering::SeqCst);
    if count > before && (caught_up || now) {
        tracing::warn!(
            dropped_lines = count - before,
            total = count,
            "log lines were dropped: standard error did not keep up"
        );
        if dropped.load(Ordering::SeqCst) == count {
            reported.reported.store(count, Ordering::SeqCst);
        }
    }
}
