//! Why an instance trapped, in one line of plain words.
//!
//! wasmtime reports a trap as an error whose chain ends in the trap code
//! (or the error a host callback returned) and carries a multi-line wasm
//! backtrace. Operators want the reason: a stack overflow, the memory
//! limit, the host stopping a task whose term ended, the guest's own panic
//! message. [`Trap::from_error`] says that, from the error and what the
//! instance left behind (its last stderr lines, a refused memory growth);
//! [`Trap::detail`] keeps the whole error, backtrace included, for the
//! debug log. It is formatted only when that log line is written: with
//! `RUST_BACKTRACE` set, the error carries a Rust backtrace too, and
//! resolving its symbols takes a good part of a second.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::{ResourceLimiter, StoreLimits};

/// How wasmtime's `WasmBacktrace` context starts.
const BACKTRACE_HEADING: &str = "error while executing at wasm backtrace";

use crate::election::Term;

/// The error that stops a guest when its term's force-stop time has come:
/// returned by the epoch callback and by the host-call fence.
#[derive(Debug, thiserror::Error)]
#[error("stopped by the host: term {term} of lease {lease:?} is over and its grace has passed")]
pub struct StoppedByHost {
    /// The term number.
    pub term: u64,
    /// The lease.
    pub lease: String,
}

impl StoppedByHost {
    /// The error for an instance of `term`.
    pub fn of(term: &Term) -> StoppedByHost {
        StoppedByHost {
            term: term.number(),
            lease: term.lease().to_owned(),
        }
    }
}

/// An instance's memory limiter: wasmtime's [`StoreLimits`], plus a note of
/// the last growth it refused, so that a trap that follows (a Rust guest
/// aborts when an allocation fails) is reported as the memory limit.
pub struct GuestLimits {
    inner: StoreLimits,
    limit: u64,
    refused: Option<usize>,
    /// The linear memory of all running instances of its plugin, which
    /// this instance's memory is counted in while it lives.
    usage: Option<Arc<AtomicU64>>,
    /// This instance's linear memory (every memory it created), in bytes.
    mine: u64,
}

impl GuestLimits {
    /// Limits an instance's linear memory to `limit` bytes.
    pub fn new(limit: u64) -> GuestLimits {
        GuestLimits {
            inner: wasmtime::StoreLimitsBuilder::new()
                .memory_size(usize::try_from(limit).unwrap_or(usize::MAX))
                .build(),
            limit,
            refused: None,
            usage: None,
            mine: 0,
        }
    }

    /// Counts this instance's linear memory in `usage` from now on,
    /// including what it has already (an instance prepared ahead of its
    /// term is counted once it starts). Once only: a second call does
    /// nothing.
    pub fn count_in(&mut self, usage: Arc<AtomicU64>) {
        if self.usage.is_none() {
            usage.fetch_add(self.mine, Ordering::Relaxed);
            self.usage = Some(usage);
        }
    }
}

impl Drop for GuestLimits {
    fn drop(&mut self) {
        if let Some(usage) = &self.usage {
            usage.fetch_sub(self.mine, Ordering::Relaxed);
        }
    }
}

impl ResourceLimiter for GuestLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.inner.memory_growing(current, desired, maximum)?;
        if !allowed {
            self.refused = Some(desired);
        } else {
            // Also called when a memory is created (from zero).
            let grown = desired.saturating_sub(current) as u64;
            self.mine += grown;
            if let Some(usage) = &self.usage {
                usage.fetch_add(grown, Ordering::Relaxed);
            }
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// Why an instance trapped; its `Display` is the one-line reason.
#[derive(Debug)]
pub struct Trap {
    reason: String,
    by_host: bool,
    /// The error as wasmtime reported it (`None`: the instance could not be
    /// set up, and the reason says everything).
    error: Option<wasmtime::Error>,
}

/// The whole error of a [`Trap`], formatted when displayed.
pub struct TrapDetail<'a>(&'a Trap);

impl fmt::Display for TrapDetail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.error {
            Some(e) => write!(f, "{e:?}"),
            None => f.write_str(&self.0.reason),
        }
    }
}

impl fmt::Display for Trap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl Trap {
    /// A trap that is not about guest code: the instance could not be set
    /// up.
    pub fn setup(reason: String) -> Trap {
        Trap {
            reason,
            by_host: false,
            error: None,
        }
    }

    /// Reads `error`, given what the instance left behind: its last stderr
    /// lines, and the memory growth its limiter refused, if any.
    pub fn from_error(error: wasmtime::Error, stderr_tail: &[String], limits: &GuestLimits) -> Trap {
        if let Some(stop) = error.downcast_ref::<StoppedByHost>() {
            return Trap {
                reason: format!(
                    "stopped by the host because term {} ended (its grace had passed)",
                    stop.term
                ),
                by_host: true,
                error: Some(error),
            };
        }
        let panic = panic_message(stderr_tail);
        let reason = match error.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::StackOverflow) => "stack overflow".to_owned(),
            Some(wasmtime::Trap::UnreachableCodeReached) => match (limits.refused, panic) {
                (Some(desired), _) => memory_reason(limits.limit, desired),
                (None, Some(message)) => format!("the guest panicked: {message}"),
                (None, None) => "the guest aborted (wasm `unreachable`)".to_owned(),
            },
            Some(wasmtime::Trap::Interrupt) => "interrupted by the host".to_owned(),
            Some(code) => format!("wasm trap: {code}"),
            None => match (limits.refused, panic) {
                (Some(desired), _) => memory_reason(limits.limit, desired),
                (None, Some(message)) => format!("the guest panicked: {message}"),
                (None, None) => without_backtrace(&error),
            },
        };
        Trap {
            reason,
            by_host: false,
            error: Some(error),
        }
    }

    /// Whether the host stopped the instance because its term ended.
    pub fn stopped_by_host(&self) -> bool {
        self.by_host
    }

    /// The whole error, backtrace included, formatted when displayed.
    pub fn detail(&self) -> TrapDetail<'_> {
        TrapDetail(self)
    }
}

fn memory_reason(limit: u64, desired: usize) -> String {
    format!(
        "memory limit of {} reached (the guest asked for {} in all)",
        bytesize::ByteSize::b(limit).display().iec(),
        bytesize::ByteSize::b(desired as u64).display().iec()
    )
}

/// A Rust panic's message from stderr: the line(s) after "panicked at".
fn panic_message(tail: &[String]) -> Option<String> {
    let at = tail.iter().rposition(|l| l.contains("panicked at"))?;
    let rest: Vec<&str> = tail[at + 1..]
        .iter()
        .map(|l| l.as_str())
        .take_while(|l| !l.starts_with("note: "))
        .collect();
    if rest.is_empty() {
        // Older formats put the message on the same line.
        let line = &tail[at];
        Some(
            line.split_once("panicked at")
                .map_or(line.as_str(), |(_, m)| m)
                .trim()
                .to_owned(),
        )
    } else {
        Some(rest.join(" / "))
    }
}

/// The error's messages, without the wasm backtrace (a context whose text
/// starts with wasmtime's fixed heading) and on one line.
fn without_backtrace(error: &wasmtime::Error) -> String {
    let parts: Vec<String> = error
        .chain()
        .map(|e| e.to_string())
        .filter(|m| !m.starts_with(BACKTRACE_HEADING))
        .map(|m| m.lines().map(str::trim).collect::<Vec<_>>().join(" "))
        .collect();
    if parts.is_empty() {
        error.root_cause().to_string()
    } else {
        parts.join(": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_rust_panic_is_read_from_stderr() {
        let tail = lines(&[
            "starting",
            "thread '<unnamed>' panicked at src/lib.rs:62:24:",
            "probe trap on purpose",
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
        ]);
        assert_eq!(panic_message(&tail).as_deref(), Some("probe trap on purpose"));
        assert_eq!(panic_message(&lines(&["nothing"])), None);
    }

    #[test]
    fn reasons_are_one_line() {
        let limits = GuestLimits::new(64 << 20);
        let e = wasmtime::Error::new(wasmtime::Trap::StackOverflow);
        assert_eq!(Trap::from_error(e, &[], &limits).to_string(), "stack overflow");
        let e = wasmtime::Error::new(StoppedByHost {
            term: 4,
            lease: "demo".into(),
        });
        let t = Trap::from_error(e, &[], &limits);
        assert!(t.stopped_by_host());
        assert_eq!(
            t.to_string(),
            "stopped by the host because term 4 ended (its grace had passed)"
        );
        let mut limits = GuestLimits::new(64 << 20);
        assert!(!limits.memory_growing(60 << 20, 130 << 20, None).unwrap());
        let e = wasmtime::Error::new(wasmtime::Trap::UnreachableCodeReached);
        assert_eq!(
            Trap::from_error(e, &[], &limits).to_string(),
            "memory limit of 64.0 MiB reached (the guest asked for 130.0 MiB in all)"
        );
    }
}
