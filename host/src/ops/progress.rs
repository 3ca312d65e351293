//! The start-up's progress on a terminal: how many plugins are loaded out
//! of all, and a spinner per compilation in flight (plugin, file, size,
//! time so far), drawn below the log lines with `indicatif` and cleared
//! when the start-up ends.
//!
//! Only the log's writer thread (`baton-log`, see [`crate::ops::logging`]) draws,
//! as it is the only thread that writes to standard error: a terminal on
//! hold (Ctrl-S, a pty nobody reads) blocks it alone. The host's threads
//! change the [`Board`] (a mutex held for an assignment, never while
//! writing) and wake the writer through the log's queue without waiting (a
//! full queue means it has lines to write, and it looks at the board after
//! each batch). The writer pauses the display for each batch of log lines
//! (clears it, writes the lines, draws it again below them), turns the
//! spinners every [`PROGRESS_TICK`], and clears the display once the
//! start-up has ended or the process exits.
//!
//! Drawn only when standard error is a terminal, `TERM` is set and not
//! `dumb`, the log is text (not `--log-format json`) and `--progress` is
//! `auto`. A start-up shorter than [`PROGRESS_DELAY`] draws nothing. The
//! display has no colours (so `NO_COLOR` changes nothing in it) and uses
//! ASCII only.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::runtime::{CacheUse, Compile, CompileObserver};

/// How long a start-up goes undrawn: a warm one (every component in the
/// compiled-code cache) is usually over by then, and draws nothing.
pub const PROGRESS_DELAY: Duration = Duration::from_millis(200);

/// How often the spinners turn (and the display is redrawn at most).
pub const PROGRESS_TICK: Duration = Duration::from_millis(100);

/// What the display shows, changed by the host's threads and read by the
/// writer thread.
pub(crate) struct Board {
    state: Mutex<Option<Run>>,
    /// Sends the writer thread a wake-up; never waits.
    waker: Box<dyn Fn() + Send + Sync>,
    /// A wake-up is queued and not seen yet: no other is sent (at most one
    /// waits in the log's queue, taking a line's place).
    woken: AtomicBool,
}

/// One start-up under way.
#[derive(Clone)]
struct Run {
    id: u64,
    /// Plugins to load.
    total: u64,
    /// Loaded or refused so far.
    done: u64,
    started: Instant,
    /// Compilations in flight, by [`Compile::id`]: what the spinner says.
    compiling: BTreeMap<u64, (String, Instant)>,
}

impl Board {
    pub(crate) fn new(waker: impl Fn() + Send + Sync + 'static) -> Board {
        Board {
            state: Mutex::new(None),
            waker: Box::new(waker),
            woken: AtomicBool::new(false),
        }
    }

    fn wake(&self) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            (self.waker)();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Run>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The progress of one start-up, from [`crate::ops::logging::progress`]: nothing
/// is drawn unless the log set up a display (see the [module
/// documentation](self)). Ends when [`end`](Progress::end) is called or it
/// is dropped.
pub struct Progress {
    board: Option<Arc<Board>>,
    id: u64,
}

impl Progress {
    /// A start-up of `total` plugins on `board`, if any.
    pub(crate) fn start(board: Option<Arc<Board>>, total: usize) -> Progress {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let progress = Progress { board, id };
        if let Some(board) = &progress.board {
            *board.lock() = Some(Run {
                id,
                total: total as u64,
                done: 0,
                started: Instant::now(),
                compiling: BTreeMap::new(),
            });
            board.wake();
        }
        progress
    }

    /// Whether it is drawn on a terminal.
    pub fn is_drawn(&self) -> bool {
        self.board.is_some()
    }

    /// One more plugin is loaded (or refused).
    pub fn step(&self) {
        self.change(|run| run.done = (run.done + 1).min(run.total));
    }

    /// The start-up is over: the display is cleared.
    pub fn end(&self) {
        if let Some(board) = &self.board {
            let mut state = board.lock();
            if state.as_ref().is_some_and(|run| run.id == self.id) {
                *state = None;
            }
            drop(state);
            board.wake();
        }
    }

    fn change(&self, f: impl FnOnce(&mut Run)) {
        if let Some(board) = &self.board {
            if let Some(run) = board.lock().as_mut().filter(|run| run.id == self.id) {
                f(run);
            }
            board.wake();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.end();
    }
}

impl CompileObserver for Progress {
    fn compiling(&self, compile: &Compile) {
        let file = compile.path.file_name().map_or_else(
            || compile.path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let text = format!("{}: compiling {file} ({})", compile.plugin, compile.size());
        self.change(|run| {
            run.compiling.insert(compile.id, (text, compile.started));
        });
    }

    fn compiled(&self, compile: &Compile, _took: Duration, _cache: Option<CacheUse>) {
        self.change(|run| {
            run.compiling.remove(&compile.id);
        });
    }
}

/// The writer thread's side: the bars on the terminal.
pub(crate) struct Painter {
    board: Arc<Board>,
    multi: MultiProgress,
    /// Plugins loaded out of all; `Some` while the display is drawn.
    overall: Option<ProgressBar>,
    spinners: BTreeMap<u64, ProgressBar>,
    /// Set at exit: nothing is drawn any more.
    closed: bool,
}

impl Painter {
    pub(crate) fn new(board: Arc<Board>) -> Painter {
        let hz = (1000 / PROGRESS_TICK.as_millis()).clamp(1, 20) as u8;
        Painter {
            board,
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(hz)),
            overall: None,
            spinners: BTreeMap::new(),
            closed: false,
        }
    }

    fn drawn(&self) -> bool {
        self.overall.is_some()
    }

    /// How long the writer may wait for a line before the display needs it
    /// again: `None` while nothing is under way or drawn.
    pub(crate) fn wait(&self) -> Option<Duration> {
        let running = !self.closed && self.board.lock().is_some();
        (running || self.drawn()).then_some(PROGRESS_TICK)
    }

    /// Writes log lines above the display.
    pub(crate) fn write(&mut self, lines: &[u8]) {
        let write = || {
            let _ = std::io::stderr().write_all(lines);
        };
        if self.drawn() {
            self.multi.suspend(write);
        } else {
            write();
        }
    }

    /// Brings the display up to date with the board.
    pub(crate) fn update(&mut self) {
        // Cleared before the board is read: a change after this sends
        // another wake-up.
        self.board.woken.store(false, Ordering::Release);
        let run = if self.closed {
            None
        } else {
            self.board.lock().clone()
        };
        match run {
            None => self.clear(),
            Some(run) if !self.drawn() && run.started.elapsed() < PROGRESS_DELAY => {}
            Some(run) => self.draw(&run),
        }
    }

    /// Clears the display for good (at exit).
    pub(crate) fn close(&mut self) {
        self.closed = true;
        self.clear();
    }

    fn draw(&mut self, run: &Run) {
        let multi = &self.multi;
        let overall = self.overall.get_or_insert_with(|| {
            let bar = multi.add(ProgressBar::new(run.total));
            bar.set_style(
                ProgressStyle::with_template(
                    "baton starting: {pos}/{len} plugins loaded [{bar:24}] {elapsed}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar
        });
        overall.set_length(run.total);
        overall.set_position(run.done);
        overall.tick();
        self.spinners.retain(|id, bar| {
            let keep = run.compiling.contains_key(id);
            if !keep {
                bar.finish_and_clear();
                multi.remove(bar);
            }
            keep
        });
        for (id, (text, started)) in &run.compiling {
            let bar = self.spinners.entry(*id).or_insert_with(|| {
                let bar = multi.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("  {spinner} {msg}")
                        .expect("a valid template")
                        .tick_chars("-\\|/ "),
                );
                bar
            });
            bar.set_message(format!("{text} {:.1}s", started.elapsed().as_secs_f64()));
            bar.tick();
        }
    }

    fn clear(&mut self) {
        if !self.drawn() {
            return;
        }
        for bar in self.spinners.values().chain(self.overall.iter()) {
            bar.finish_and_clear();
            self.multi.remove(bar);
        }
        let _ = self.multi.clear();
        self.spinners.clear();
        self.overall = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;

    fn board() -> (Arc<Board>, Arc<AtomicUsize>) {
        let wakes = Arc::new(AtomicUsize::new(0));
        let counted = wakes.clone();
        let board = Arc::new(Board::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        (board, wakes)
    }

    #[test]
    fn the_display_follows_the_start_up_and_is_cleared_when_it_ends() {
        let (board, wakes) = board();
        // Drawn into nothing: tests have no terminal, so indicatif hides it.
        let mut painter = Painter::new(board.clone());
        assert_eq!(
            painter.wait(),
            None,
            "nothing under way: the writer just waits for lines"
        );
        let begun = Instant::now();
        let progress = Progress::start(Some(board.clone()), 3);
        assert!(progress.is_drawn());
        assert_eq!(painter.wait(), Some(PROGRESS_TICK));
        let compile = Compile::new("py", Path::new("/plugins/python.wasm"), 18 << 20);
        progress.compiling(&compile);
        progress.step();
        // One wake-up waits at most, however many changes.
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        painter.update();
        // Judged only if this thread got here within the delay (the
        // start-up began no sooner than `begun`): a busy machine may
        // deschedule it for longer, and then drawing is right.
        let checked = begun.elapsed();
        if checked < PROGRESS_DELAY {
            assert!(!painter.drawn(), "not drawn before {PROGRESS_DELAY:?}");
        } else {
            println!("not judged whether drawn before {PROGRESS_DELAY:?}: got there after {checked:?}");
        }
        std::thread::sleep(PROGRESS_DELAY);
        painter.update();
        assert!(painter.drawn());
        assert_eq!(painter.spinners.len(), 1);
        let overall = painter.overall.as_ref().unwrap();
        assert_eq!((overall.position(), overall.length()), (1, Some(3)));
        let text = painter.spinners[&compile.id].message();
        assert!(
            text.starts_with("py: compiling python.wasm (18.0 MiB) ") && text.ends_with('s'),
            "{text}"
        );
        progress.compiled(&compile, Duration::from_secs(8), Some(CacheUse::Miss));
        progress.step();
        assert_eq!(wakes.load(Ordering::SeqCst), 2, "woken again after the update");
        painter.update();
        assert!(painter.spinners.is_empty());
        assert_eq!(painter.overall.as_ref().unwrap().position(), 2);
        // Another start-up's end does not end this one.
        drop(Progress::start(None, 1));
        painter.update();
        assert!(painter.drawn());
        progress.end();
        painter.update();
        assert!(!painter.drawn());
        assert_eq!(painter.wait(), None);
        // Changes after the end change nothing.
        progress.compiling(&compile);
        assert!(board.lock().is_none());
    }

    #[test]
    fn nothing_is_drawn_after_exit() {
        let (board, _) = board();
        let mut painter = Painter::new(board.clone());
        let progress = Progress::start(Some(board), 1);
        std::thread::sleep(PROGRESS_DELAY);
        painter.update();
        assert!(painter.drawn());
        painter.close();
        assert!(!painter.drawn());
        painter.update();
        assert!(!painter.drawn(), "the process exits: the display stays cleared");
        assert_eq!(painter.wait(), None);
        drop(progress);
    }
}
