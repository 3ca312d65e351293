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
//!
//! On a terminal, the start-up's progress is drawn below the log lines by
//! the same writer thread (see [`crate::ops::progress`]).
//!
//! Figures are rounded for people here, in one place: [`ms`] for the
//! `_ms` fields, [`human`] for durations in fields and messages, [`secs`]
//! for `baton status`.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use tracing_subscriber::fmt::MakeWriter;

/// How many formatted lines wait for a slow standard error before lines
/// are dropped: under a megabyte of typical lines (a few seconds of a busy
/// host), and at most 64 MiB of the longest guest lines (see
/// [`MAX_OUTPUT_LINE`](crate::runtime::capability::output::MAX_OUTPUT_LINE)).
pub const LOG_QUEUE_LINES: usize = 4096;

/// How often dropped lines are looked for (and reported, once the writer
/// has caught up).
pub const DROP_REPORT_PERIOD: Duration = Duration::from_secs(1);

/// How long the host waits at exit for its queued log lines to be written.
pub const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The default filter: informational events of baton and guests, warnings
/// of wasmtime and cranelift, errors of the PostgreSQL store's pool (its
/// warnings of a closed connection say nothing of which store or lease:
/// the store's own errors, which the electors log, do).
pub const DEFAULT_FILTER: &str = "info,wasmtime=warn,cranelift=warn,deadpool=error";

/// Whether the start-up's progress is drawn on a terminal (see
/// [`crate::ops::progress`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// When standard error is a terminal (`TERM` set, not `dumb`) and the
    /// log is text.
    #[default]
    Auto,
    /// Never: log lines only.
    Never,
}

/// How many bytes of queued lines the writer writes at once (lines that
/// wait behind the first, up to this, go in the same write, and in the
/// same pause of the progress display).
const BATCH_BYTES: usize = 64 << 10;

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
    /// Answer once everything queued before has been written (and clear
    /// the progress display for good: the process exits).
    Flush(Sender<()>),
    /// The progress display changed.
    Wake,
    /// Answer once everything queued before has been written.
    Sync(Sender<()>),
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

/// The default filter of commands that only report (`baton status`):
/// their errors are printed as the command's own, so only baton's
/// warnings are logged (not the Kubernetes client's account of a failed
/// connection, for one).
pub const QUIET_FILTER: &str = "warn,kube_client=off";

/// The count of dropped lines of the log that [`init`] set up (the
/// subscriber is global, so is its count).
static DROPPED: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();

/// How many log lines were dropped since the process started because
/// standard error did not keep up (0 if [`init`] was not called).
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |d| d.load(Ordering::Relaxed) as u64)
}

/// The log's queue, once [`init`] set it up.
static QUEUE: std::sync::OnceLock<Sender<Message>> = std::sync::OnceLock::new();

/// Waits until the lines logged so far are written to standard error, at
/// most `timeout` (a command's output on standard output then comes after
/// its log lines on a terminal). Returns at once if [`init`] was not called.
pub fn written(timeout: Duration) {
    let Some(queue) = QUEUE.get() else {
        return;
    };
    let deadline = Instant::now() + timeout;
    let (done, written) = crossbeam_channel::bounded(1);
    if queue.send_deadline(Message::Sync(done), deadline).is_ok() {
        let _ = written.recv_deadline(deadline);
    }
}

/// The progress display's board, if [`init`] set one up.
static BOARD: std::sync::OnceLock<Arc<crate::ops::progress::Board>> = std::sync::OnceLock::new();

/// The progress of a start-up of `total` plugins: drawn on a terminal if
/// [`init`] found one (see [`crate::ops::progress`]), nothing otherwise.
pub fn progress(total: usize) -> crate::ops::progress::Progress {
    crate::ops::progress::Progress::start(BOARD.get().cloned(), total)
}

/// Sets up the global subscriber: `BATON_LOG` (an `EnvFilter`) or
/// [`DEFAULT_FILTER`], the given format, standard error through the queue,
/// its writer thread, and the thread that reports dropped lines.
pub fn init(format: LogFormat) -> Logging {
    init_with(format, DEFAULT_FILTER, ProgressMode::Auto)
}

/// As [`init`], with `default` as the filter when `BATON_LOG` is not set,
/// and the progress display as `progress` says.
pub fn init_with(format: LogFormat, default: &str, progress: ProgressMode) -> Logging {
    let (queue, lines) = crossbeam_channel::bounded(LOG_QUEUE_LINES);
    let dropped = Arc::new(AtomicUsize::new(0));
    let _ = DROPPED.set(dropped.clone());
    let _ = QUEUE.set(queue.clone());
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let painter =
        draws_progress(progress, format, terminal, std::env::var_os("TERM").as_deref()).then(|| {
            let waker = queue.clone();
            let board = Arc::new(crate::ops::progress::Board::new(move || {
                let _ = waker.try_send(Message::Wake);
            }));
            let _ = BOARD.set(board.clone());
            crate::ops::progress::Painter::new(board)
        });
    std::thread::Builder::new()
        .name("baton-log".into())
        .spawn(move || write_out(lines, painter))
        .expect("spawn the log writer thread");
    let exiting = Arc::new(std::sync::OnceLock::new());
    let writer = QueueWriter {
        queue: queue.clone(),
        dropped: dropped.clone(),
        exiting: exiting.clone(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(paints(terminal, std::env::var_os("NO_COLOR").as_deref()))
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

/// Whether the progress display is drawn: `auto`, a text log, standard
/// error a terminal, and `TERM` set and not `dumb` (such a terminal cannot
/// move the cursor). `NO_COLOR` does not matter: the display has no
/// colours.
fn draws_progress(
    mode: ProgressMode,
    format: LogFormat,
    terminal: bool,
    term: Option<&std::ffi::OsStr>,
) -> bool {
    mode == ProgressMode::Auto
        && format == LogFormat::Text
        && terminal
        && term.is_some_and(|t| !t.is_empty() && t != "dumb")
}

/// Whether the text log is coloured: only on a terminal, and only while
/// `NO_COLOR` is unset or empty (<https://no-color.org>). A file, a pipe,
/// journald, `kubectl logs` or `docker logs` get plain lines. (The JSON log
/// has no colours either way.)
fn paints(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// The writer thread: writes the queued lines to stderr, blocking as long
/// as stderr does (only this thread waits), and draws the progress display
/// if there is one.
/// (stderr is locked per write, not for good: others, a panic message or
/// `main`'s last error, may write to it too.)
fn write_out(lines: Receiver<Message>, mut painter: Option<crate::ops::progress::Painter>) {
    loop {
        let message = match painter.as_ref().and_then(|p| p.wait()) {
            Some(wait) => match lines.recv_timeout(wait) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
            None => match lines.recv() {
                Ok(message) => Some(message),
                Err(_) => break,
            },
        };
        // A message that came after a batch of lines.
        let mut next = None;
        match message {
            Some(Message::Line(mut batch)) => {
                while batch.len() < BATCH_BYTES {
                    match lines.try_recv() {
                        Ok(Message::Line(line)) => batch.extend_from_slice(&line),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                match &mut painter {
                    Some(painter) => painter.write(&batch),
                    None => {
                        let _ = std::io::stderr().write_all(&batch);
                    }
                }
            }
            other => next = other,
        }
        match next {
            Some(Message::Flush(done)) => {
                if let Some(painter) = &mut painter {
                    painter.close();
                }
                let _ = std::io::stderr().flush();
                let _ = done.send(());
            }
            Some(Message::Sync(done)) => {
                let _ = std::io::stderr().flush();
                let _ = done.send(());
            }
            _ => {}
        }
        // Woken or not, the display follows the board.
        if let Some(painter) = &mut painter {
            painter.update();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_drawn_only_on_a_terminal_that_can_draw_it_under_a_text_log() {
        use std::ffi::OsStr;
        let xterm = Some(OsStr::new("xterm-256color"));
        assert!(draws_progress(ProgressMode::Auto, LogFormat::Text, true, xterm));
        // Not a terminal (a pipe, a file, journald).
        assert!(!draws_progress(ProgressMode::Auto, LogFormat::Text, false, xterm));
        // JSON lines are for machines.
        assert!(!draws_progress(ProgressMode::Auto, LogFormat::Json, true, xterm));
        // Turned off.
        assert!(!draws_progress(ProgressMode::Never, LogFormat::Text, true, xterm));
        // A terminal that cannot move the cursor, or an unknown one.
        assert!(!draws_progress(
            ProgressMode::Auto,
            LogFormat::Text,
            true,
            Some(OsStr::new("dumb"))
        ));
        assert!(!draws_progress(
            ProgressMode::Auto,
            LogFormat::Text,
            true,
            Some(OsStr::new(""))
        ));
        assert!(!draws_progress(ProgressMode::Auto, LogFormat::Text, true, None));
    }

    #[test]
    fn the_text_log_is_coloured_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(paints(true, None));
        // A file, a pipe, journald.
        assert!(!paints(false, None));
        // NO_COLOR set to anything but the empty string.
        assert!(!paints(true, Some(OsStr::new("1"))));
        assert!(!paints(false, Some(OsStr::new("1"))));
        assert!(paints(true, Some(OsStr::new(""))));
    }
}
