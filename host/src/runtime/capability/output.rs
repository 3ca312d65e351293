//! Guest stdout and stderr, turned into log events tagged with the
//! plugin's name: one event per line, within the plugin's output limits,
//! and never after its term's force-stop time.
//!
//! Each plugin has an [`OutputBudget`], shared by all its instances (a task
//! that traps and is retried cannot reset it): a token bucket of
//! [`OutputLimits::bytes_per_second`], and a longest line
//! ([`OutputLimits::line`]) beyond which a line is cut. Lines over the
//! budget are dropped; what was dropped or cut is counted and reported as a
//! warning of its own, at most once per [`REPORT_PERIOD`] and when the
//! stream ends.
//!
//! Writes are handled inside the guest's host call (the WASI 0.2 stream is
//! synchronous, not the usual background writer), so the host-call fence
//! covers them; a write that reaches the logger once its term must stop is
//! discarded all the same, and counted.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime::component::Linker;
use wasmtime_wasi::WasiView;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::runtime::store_term::StoreTerm;
use crate::runtime::world::World;
use bytesize::ByteSize;

/// The capability: the instance's stdout and stderr (WASI's own streams,
/// replaced by loggers), within the plugin's `output-rate` and
/// `output-line`.
pub struct Output;

crate::raw_keys! {
    /// `output-rate` and `output-line`.
    pub struct RawOutput {
        rate: ByteSize = "output-rate",
        line: ByteSize = "output-line",
    }
}

impl Capability for Output {
    type Raw = RawOutput;
    type Grant = OutputGrant;
    type Plugin = Arc<OutputBudget>;
    /// The last lines it wrote to stderr (a panic message), for the trap
    /// report.
    type Ctx = StderrTail;
    type View<'a> = ();

    /// Each limit defaulted; neither zero, the line at most
    /// [`MAX_OUTPUT_LINE`].
    fn grant(raw: RawOutput, site: &GrantSite<'_>) -> Result<OutputGrant, GrantError> {
        let defaults = OutputLimits::default();
        let limits = OutputLimits {
            bytes_per_second: raw.rate.map_or(defaults.bytes_per_second, |r| r.as_u64()),
            line: raw.line.map_or(defaults.line, |l| {
                usize::try_from(l.as_u64()).unwrap_or(usize::MAX)
            }),
        };
        if limits.line > MAX_OUTPUT_LINE {
            let kib = MAX_OUTPUT_LINE / 1024;
            return Err(site.error("output-line", format!("at most {kib} KiB (longer lines are cut)")));
        }
        if limits.bytes_per_second == 0 || limits.line == 0 {
            return Err(site.error(
                "output-rate",
                "`output-rate` and `output-line` must be above zero \
                 (to silence a plugin, filter its log target: BATON_LOG=info,guest=off)",
            ));
        }
        Ok(OutputGrant { limits, tap: None })
    }

    fn load(grant: &OutputGrant, plugin: &LoadContext<'_>) -> Result<Arc<OutputBudget>, String> {
        let budget = OutputBudget::new(plugin.plugin.clone(), grant.limits);
        if let Some(tap) = &grant.tap {
            let _ = budget.tap.set(tap.clone());
        }
        Ok(budget)
    }

    fn prepare(budget: &Arc<OutputBudget>, setup: &mut Setup<'_>) -> Result<StderrTail, SetupError> {
        let tail = StderrTail::default();
        let output = |stream| GuestOutput::new(budget.clone(), stream, setup.term.clone(), tail.clone());
        let (stdout, stderr) = (output(GuestStream::Stdout), output(GuestStream::Stderr));
        setup.wasi.stdout(stdout);
        setup.wasi.stderr(stderr);
        Ok(tail)
    }

    fn view<'a>(_: &'a mut StderrTail, _: Shared<'a>) {}

    /// Nothing of its own: the streams are WASI's.
    fn add_to_linker<T: WasiView + 'static>(
        _: &mut Linker<T>,
        _: World,
        _: for<'a> fn(&'a mut T),
    ) -> wasmtime::Result<()> {
        Ok(())
    }
}

/// What a plugin's table grants of output: its limits; and, given by a
/// harness (`baton test`), a tap that sees every line logged.
#[derive(Clone, Debug, Default)]
pub struct OutputGrant {
    /// The plugin's limits.
    pub limits: OutputLimits,
    /// Sees each line as it is logged (after the limits).
    pub tap: Option<Arc<dyn OutputTap>>,
}

/// Sees a plugin's output lines.
pub trait OutputTap: Send + Sync + std::fmt::Debug {
    /// `text`, a line the plugin wrote to `stream` (`stdout`, `stderr`).
    fn line(&self, stream: &'static str, text: &str);
}

/// How much a plugin may print, and the longest line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLimits {
    /// The sustained rate, in bytes per second; a plugin may print up to one
    /// second's worth at once.
    pub bytes_per_second: u64,
    /// The longest line, in bytes; the rest of a longer line is cut.
    pub line: usize,
}

impl Default for OutputLimits {
    /// 64 KiB per second (hundreds of ordinary lines a second, while a
    /// guest printing in a loop cannot grow the host's log by more than
    /// about 230 MB an hour), and lines of 4 KiB.
    fn default() -> Self {
        OutputLimits {
            bytes_per_second: 64 * 1024,
            line: 4 * 1024,
        }
    }
}

/// The longest `line` a plugin may be given: the log's queue holds lines,
/// not bytes, so this bounds the memory a stalled stderr can tie up.
pub const MAX_OUTPUT_LINE: usize = 16 * 1024;

/// How often a plugin's dropped output is reported, at most.
pub const REPORT_PERIOD: Duration = Duration::from_secs(1);

/// How many of an instance's last stderr lines are kept for its trap report
/// (a Rust panic prints its message on the line after "panicked at").
const STDERR_TAIL: usize = 8;

/// The last lines an instance wrote to stderr.
pub type StderrTail = Arc<Mutex<VecDeque<String>>>;

/// A plugin's output budget; see the [module documentation](self).
#[derive(Debug)]
pub struct OutputBudget {
    plugin: Arc<str>,
    limits: OutputLimits,
    bucket: Mutex<Bucket>,
    /// Lines dropped by the rate limit since the plugin was loaded (for
    /// metrics; the reports count since the last report).
    dropped_lines_total: std::sync::atomic::AtomicU64,
    /// The grant's tap, if any.
    tap: std::sync::OnceLock<Arc<dyn OutputTap>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    reported: Instant,
    /// Not reported yet.
    dropped: Dropped,
}

/// What was dropped or cut since the last report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Dropped {
    lines: u64,
    bytes: u64,
    cut_lines: u64,
    cut_bytes: u64,
    after_stop_bytes: u64,
}

impl OutputBudget {
    /// A full budget for `plugin`.
    pub fn new(plugin: Arc<str>, limits: OutputLimits) -> Arc<OutputBudget> {
        let now = Instant::now();
        Arc::new(OutputBudget {
            plugin,
            bucket: Mutex::new(Bucket {
                tokens: Self::capacity(&limits),
                refilled: now,
                reported: now,
                dropped: Dropped::default(),
            }),
            limits,
            dropped_lines_total: Default::default(),
            tap: Default::default(),
        })
    }

    /// The limits.
    pub fn limits(&self) -> OutputLimits {
        self.limits
    }

    /// How many lines the rate limit dropped since the plugin was loaded.
    pub fn dropped_lines_total(&self) -> u64 {
        self.dropped_lines_total
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn capacity(limits: &OutputLimits) -> f64 {
        // At least one longest line fits, whatever the rate.
        (limits.bytes_per_second as f64).max(limits.line as f64 + 1.0)
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.bucket.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a line of `len` bytes (newline included) may be logged now;
    /// counts it as dropped if not.
    fn admit(&self, len: usize) -> bool {
        let mut b = self.bucket();
        let now = Instant::now();
        let rate = self.limits.bytes_per_second as f64;
        b.tokens = (b.tokens + rate * (now - b.refilled).as_secs_f64()).min(Self::capacity(&self.limits));
        b.refilled = now;
        if b.tokens >= len as f64 {
            b.tokens -= len as f64;
            true
        } else {
            b.dropped.lines += 1;
            b.dropped.bytes += len as u64;
            self.dropped_lines_total
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            false
        }
    }

    fn count(&self, f: impl FnOnce(&mut Dropped)) {
        f(&mut self.bucket().dropped);
    }

    /// Logs what was dropped since the last report, if anything, once a
    /// report period has passed (or now, if `now`).
    pub fn report(&self, now: bool) {
        let dropped = {
            let mut b = self.bucket();
            if b.dropped == Dropped::default() || (!now && b.reported.elapsed() < REPORT_PERIOD) {
                return;
            }
            b.reported = Instant::now();
            std::mem::take(&mut b.dropped)
        };
        tracing::warn!(
            plugin = &*self.plugin,
            dropped_lines = dropped.lines,
            dropped_bytes = dropped.bytes,
            cut_lines = dropped.cut_lines,
            cut_bytes = dropped.cut_bytes,
            after_stop_bytes = dropped.after_stop_bytes,
            bytes_per_second = self.limits.bytes_per_second,
            longest_line = self.limits.line,
            "guest output over the plugin's limits was dropped"
        );
    }
}

/// Which guest stream.
#[derive(Clone, Copy, Debug)]
pub enum GuestStream {
    /// The guest's stdout.
    Stdout,
    /// The guest's stderr.
    Stderr,
}

/// A WASI output stream that logs each line an instance writes.
#[derive(Clone, Debug)]
pub struct GuestOutput {
    budget: Arc<OutputBudget>,
    stream: GuestStream,
    term: StoreTerm,
    tail: StderrTail,
}

impl GuestOutput {
    /// Output of one instance of the plugin behind `budget`, in `term`, on
    /// `stream`; stderr lines are also kept in `tail`.
    pub fn new(
        budget: Arc<OutputBudget>,
        stream: GuestStream,
        term: StoreTerm,
        tail: StderrTail,
    ) -> GuestOutput {
        GuestOutput {
            budget,
            stream,
            term,
            tail,
        }
    }

    fn logger(&self) -> LineLogger {
        LineLogger {
            out: self.clone(),
            buf: Vec::new(),
            cut: 0,
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.logger())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.logger())
    }
}

struct LineLogger {
    out: GuestOutput,
    /// The line so far, up to the longest line.
    buf: Vec<u8>,
    /// Bytes cut off the current line.
    cut: usize,
}

impl LineLogger {
    fn take(&mut self, data: &[u8]) {
        if self.out.term.must_stop() {
            self.out.budget.count(|d| d.after_stop_bytes += data.len() as u64);
            return;
        }
        let longest = self.out.budget.limits.line;
        for &b in data {
            if b == b'\n' {
                self.emit();
            } else if self.buf.len() < longest {
                self.buf.push(b);
            } else {
                self.cut += 1;
            }
        }
    }

    /// Logs the current line, if the budget allows.
    fn emit(&mut self) {
        let line = std::mem::take(&mut self.buf);
        let cut = std::mem::take(&mut self.cut);
        let budget = &self.out.budget;
        if cut > 0 {
            budget.count(|d| {
                d.cut_lines += 1;
                d.cut_bytes += cut as u64;
            });
        }
        if !budget.admit(line.len() + 1) {
            budget.report(false);
            return;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches('\r');
        let plugin = &*budget.plugin;
        if let Some(tap) = budget.tap.get() {
            let stream = match self.out.stream {
                GuestStream::Stdout => "stdout",
                GuestStream::Stderr => "stderr",
            };
            tap.line(stream, text);
        }
        match self.out.stream {
            GuestStream::Stdout => tracing::info!(target: "guest", plugin, stream = "stdout", "{text}"),
            GuestStream::Stderr => {
                tracing::warn!(target: "guest", plugin, stream = "stderr", "{text}");
                let mut tail = self.out.tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(text.to_owned());
            }
        }
        budget.report(false);
    }

    fn flush_partial(&mut self) {
        if !self.buf.is_empty() || self.cut > 0 {
            if self.out.term.must_stop() {
                let n = self.buf.len() + self.cut;
                self.out.budget.count(|d| d.after_stop_bytes += n as u64);
                self.buf.clear();
                self.cut = 0;
            } else {
                self.emit();
            }
        }
    }
}

impl OutputStream for LineLogger {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.take(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Never full: what the budget does not admit is dropped, so a
        // guest never waits on its own output.
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LineLogger {
    async fn ready(&mut self) {}
}

impl AsyncWrite for LineLogger {
    fn poll_write(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.take(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flush_partial();
        Poll::Ready(Ok(()))
    }
}

impl Drop for LineLogger {
    fn drop(&mut self) {
        self.flush_partial();
        self.out.budget.report(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::{Term, TermClock};

    fn output(limits: OutputLimits) -> (GuestOutput, Arc<OutputBudget>) {
        let clock = TermClock::system();
        let term = Term::begin(
            "demo",
            1,
            Duration::from_secs(1),
            clock.clone(),
            clock.now() + Duration::from_secs(60),
        );
        let budget = OutputBudget::new(Arc::from("p"), limits);
        let out = GuestOutput::new(
            budget.clone(),
            GuestStream::Stderr,
            StoreTerm::of(term),
            StderrTail::default(),
        );
        (out, budget)
    }

    #[test]
    fn lines_over_the_rate_are_dropped_and_counted() {
        // The budget refills by the real clock (10 bytes, a line, per
        // 100 ms): what it admits is judged against the time the test took.
        let begun = Instant::now();
        let (out, budget) = output(OutputLimits {
            bytes_per_second: 100,
            line: 50,
        });
        let mut log = out.logger();
        // 100 bytes at once: ten lines of 9 + newline fit, the rest not.
        for _ in 0..15 {
            log.take(b"123456789\n");
        }
        let took = begun.elapsed();
        let dropped = budget.bucket().dropped;
        // At most the 100 bytes it started with and those refilled since
        // were admitted: a line more for each whole 10 bytes refilled (none
        // in the usual few microseconds, so exactly five dropped; a busy
        // machine may take longer).
        let refilled = (took.as_secs_f64() * 100.0 / 10.0).floor() as u64;
        let fewest = 5u64.saturating_sub(refilled);
        assert!((fewest..=5).contains(&dropped.lines), "{dropped:?} in {took:?}");
        assert_eq!(budget.dropped_lines_total(), dropped.lines);
        assert_eq!(dropped.bytes, 10 * dropped.lines);
        budget.report(true);
        assert_eq!(budget.bucket().dropped, Dropped::default(), "reported");
    }

    #[test]
    fn long_lines_are_cut_and_the_tail_keeps_the_last_stderr_lines() {
        let (out, budget) = output(OutputLimits {
            bytes_per_second: 1 << 20,
            line: 8,
        });
        let tail = out.tail.clone();
        let mut log = out.logger();
        log.take(b"0123456789abcdef\nshort\n");
        let dropped = budget.bucket().dropped;
        assert_eq!((dropped.cut_lines, dropped.cut_bytes), (1, 8));
        let tail: Vec<String> = tail.lock().unwrap().iter().cloned().collect();
        assert_eq!(tail, vec!["01234567".to_owned(), "short".to_owned()]);
    }

    #[test]
    fn nothing_is_logged_once_the_term_must_stop() {
        let clock = TermClock::system();
        let term = Term::begin("demo", 1, Duration::ZERO, clock.clone(), clock.now());
        let budget = OutputBudget::new(Arc::from("p"), OutputLimits::default());
        let tail = StderrTail::default();
        let mut log = GuestOutput::new(
            budget.clone(),
            GuestStream::Stderr,
            StoreTerm::of(term),
            tail.clone(),
        )
        .logger();
        log.take(b"too late\n");
        assert!(tail.lock().unwrap().is_empty());
        assert_eq!(budget.bucket().dropped.after_stop_bytes, 9);
    }
}
