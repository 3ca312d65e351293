//! What the runtime says about compiling components. Compiling a component
//! that is not in the compiled-code cache takes seconds (an 18 MB Python
//! component: 8 to 20 s), so each compilation is announced when it starts
//! (`compiling plugin`: the plugin, the file, its size) and when it is done
//! (`plugin compiled`: how long it took, and whether the cache had it), in
//! the log and to a [`CompileObserver`] (the terminal's progress display).
//!
//! One compilation per content: plugins that name the same file (or files
//! with the same bytes) share it, and it is announced under the name of the
//! first.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One compilation of a component.
#[derive(Clone, Debug)]
pub struct Compile {
    /// Unique in this process: tells compilations in flight apart.
    pub id: u64,
    /// The plugin whose load compiles it (the first, if several share it).
    pub plugin: Arc<str>,
    /// The component file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it started.
    pub started: Instant,
}

impl Compile {
    pub(crate) fn new(plugin: &str, path: &Path, bytes: usize) -> Compile {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Compile {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            plugin: Arc::from(plugin),
            path: path.to_owned(),
            bytes: bytes as u64,
            started: Instant::now(),
        }
    }

    /// The size for people (`17.5 MiB`).
    pub fn size(&self) -> String {
        bytesize::ByteSize::b(self.bytes).display().iec().to_string()
    }
}

/// Where a component's compiled code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheUse {
    /// From the compiled-code cache: nothing was compiled.
    Hit,
    /// Compiled now (and written to the cache).
    Miss,
    /// Compiled now; the engine has no cache.
    Off,
}

impl fmt::Display for CacheUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheUse::Hit => "hit",
            CacheUse::Miss => "miss",
            CacheUse::Off => "off",
        })
    }
}

/// Told of each compilation as it starts and ends (see the [module
/// documentation](self)). Called on the thread that compiles: return at
/// once.
pub trait CompileObserver: Send + Sync {
    /// A compilation starts.
    fn compiling(&self, compile: &Compile);
    /// It ended after `took`: `Some` with where the code came from, or
    /// `None` if the component cannot run (the plugin's error says why).
    fn compiled(&self, compile: &Compile, took: Duration, cache: Option<CacheUse>);
}

/// Observes nothing.
pub struct NoCompileObserver;

impl CompileObserver for NoCompileObserver {
    fn compiling(&self, _: &Compile) {}
    fn compiled(&self, _: &Compile, _: Duration, _: Option<CacheUse>) {}
}
