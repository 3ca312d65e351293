//! Test support: real `baton` processes, their JSON logs, and guest
//! components built from source by `scripts/build-guests.sh`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

/// Where the guest components are: `BATON_GUESTS_DIR`, or the shared
/// target dir's release folder for wasm32-wasip2.
pub fn guests_dir() -> PathBuf {
    let dir = std::env::var_os("BATON_GUESTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/baton/target"));
            target.join("wasm32-wasip2/release")
        });
    assert!(
        dir.join("probe_pollable.wasm").is_file(),
        "guest components not found in {}: run scripts/build-guests.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// A guest component by file name.
pub fn guest(file: &str) -> PathBuf {
    guests_dir().join(file)
}

/// The compiled-code cache shared by the tests (compiling in a debug build
/// takes a while; a shared cache keeps the suite fast).
pub fn shared_cache_dir() -> PathBuf {
    std::env::var_os("BATON_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/baton/compiled"))
}

/// Election timings for tests: short, and safe by the rule
/// (1 s + 500 ms + 150 ms margin < 2 s).
pub const LEASE_DURATION: Duration = Duration::from_secs(2);
pub const RETRY_PERIOD: Duration = Duration::from_millis(200);
pub const GRACE: Duration = Duration::from_millis(500);

/// One plugin in a test configuration.
#[derive(Clone)]
pub struct PluginDef<'a> {
    pub name: &'a str,
    pub path: PathBuf,
    pub mode: &'a str,
}

pub fn probe<'a>(name: &'a str, world: &str, mode: &'a str) -> PluginDef<'a> {
    PluginDef {
        name,
        path: guest(&format!("probe_{world}.wasm")),
        mode,
    }
}

/// A configuration with one lease, "demo", and the given plugins.
pub fn config(store: &Path, plugins: &[PluginDef]) -> String {
    let mut text = format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n\n[defaults]\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\n\
         retry-period = \"200ms\"\ngrace = \"500ms\"\n\n[[lease]]\nname = \"demo\"\n",
        store.display().to_string()
    );
    text.push_str(&plugin_tables("demo", plugins));
    text
}

/// A `[[plugin]]` table under `lease` for each of `plugins`, with its mode.
pub fn plugin_tables(lease: &str, plugins: &[PluginDef]) -> String {
    plugins
        .iter()
        .map(|p| {
            format!(
                "\n[[plugin]]\nname = {:?}\npath = {:?}\nlease = {lease:?}\nenv = {{ PROBE_MODE = {:?} }}\n",
                p.name,
                p.path.display().to_string(),
                p.mode
            )
        })
        .collect()
}

/// A scratch folder with a lease store and config files.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn store(&self) -> PathBuf {
        self.dir.path().join("leases")
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// One log event of a host.
#[derive(Clone, Debug)]
pub struct Event {
    pub json: Value,
    /// The host's own timestamp (wall clock, shared by all processes here).
    pub at: SystemTime,
}

impl Event {
    pub fn message(&self) -> &str {
        self.json.get("message").and_then(Value::as_str).unwrap_or("")
    }
    pub fn str(&self, key: &str) -> Option<&str> {
        self.json.get(key).and_then(Value::as_str)
    }
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.json.get(key).and_then(Value::as_u64)
    }
    pub fn f64(&self, key: &str) -> Option<f64> {
        self.json.get(key).and_then(Value::as_f64)
    }
    pub fn is(&self, message: &str, plugin: Option<&str>) -> bool {
        self.message() == message && plugin.is_none_or(|p| self.str("plugin") == Some(p))
    }
    /// A guest's stdout line starting with `prefix`.
    pub fn guest_line(&self, plugin: &str, prefix: &str) -> bool {
        self.str("target") == Some("guest")
            && self.str("plugin") == Some(plugin)
            && self.message().starts_with(prefix)
    }
    /// The `term=N` in a guest line.
    pub fn guest_term(&self) -> Option<u64> {
        self.message()
            .split_whitespace()
            .find_map(|w| w.strip_prefix("term="))
            .and_then(|t| t.parse().ok())
    }
}

type Log = Arc<(Mutex<Vec<Event>>, Condvar)>;

/// A running `baton run` process.
pub struct Host {
    pub name: String,
    child: Option<Child>,
    log: Log,
    raw: Arc<Mutex<Vec<String>>>,
    /// While set, the host's stderr is not read (its pipe fills up).
    held: Arc<AtomicBool>,
    /// The thread reading its stderr, until the end of it.
    reader: Option<std::thread::JoinHandle<()>>,
}

/// More ways to start a host.
#[derive(Default)]
pub struct Opts<'a> {
    /// The compiled-code cache (default: the shared one).
    pub cache_dir: Option<&'a Path>,
    /// More arguments for `baton run`.
    pub args: &'a [&'a std::ffi::OsStr],
    /// Environment variables of the process.
    pub env: &'a [(&'a str, &'a str)],
    /// Its identity from the configuration file, not `--identity`.
    pub identity_from_file: bool,
}

/// The `baton` binary: the one built with the tests, or `BATON_BIN` (for
/// the benches, to measure two builds side by side).
pub fn baton() -> Command {
    Command::new(baton_bin())
}

/// The `baton` binary under test: `BATON_BIN`, else the one cargo built.
pub fn baton_bin() -> PathBuf {
    std::env::var_os("BATON_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_baton")), PathBuf::from)
}

impl Host {
    pub fn start(name: &str, config: &Path) -> Host {
        Host::start_with(name, config, &shared_cache_dir())
    }

    pub fn start_with(name: &str, config: &Path, cache_dir: &Path) -> Host {
        Host::start_with_args(name, config, cache_dir, &[])
    }

    /// Like [`Host::start_with`], with more arguments for `baton run`.
    #[allow(dead_code)] // used by tests/kube
    pub fn start_with_args(name: &str, config: &Path, cache_dir: &Path, args: &[&std::ffi::OsStr]) -> Host {
        Host::start_opts(
            name,
            config,
            Opts {
                cache_dir: Some(cache_dir),
                args,
                ..Opts::default()
            },
        )
    }

    pub fn start_opts(name: &str, config: &Path, opts: Opts) -> Host {
        let cache_dir = opts.cache_dir.map_or_else(shared_cache_dir, Path::to_path_buf);
        let mut child = baton()
            .args(["--log-format", "json", "run", "--config"])
            .arg(config)
            .args(
                if opts.identity_from_file {
                    None
                } else {
                    Some(["--identity", name])
                }
                .into_iter()
                .flatten(),
            )
            .arg("--cache-dir")
            .arg(cache_dir)
            .args(opts.args)
            .env("BATON_LOG", "info")
            .envs(opts.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start baton");
        let log: Log = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let raw = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let held = Arc::new(AtomicBool::new(false));
        let (log2, raw2, host, held2) = (log.clone(), raw.clone(), name.to_owned(), held.clone());
        let reader = std::thread::spawn(move || {
            let mut lines = BufReader::with_capacity(4096, stderr).lines();
            loop {
                while held2.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let Some(line) = lines.next() else { break };
                let Ok(line) = line else { break };
                if std::env::var_os("BATON_TEST_ECHO").is_some() {
                    eprintln!("[{host}] {line}");
                }
                raw2.lock().unwrap().push(line.clone());
                let Ok(json) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let at = json
                    .get("timestamp")
                    .and_then(Value::as_str)
                    .and_then(|t| humantime::parse_rfc3339(t).ok())
                    .unwrap_or_else(SystemTime::now);
                let (events, cv) = &*log2;
                events.lock().unwrap().push(Event { json, at });
                cv.notify_all();
            }
            let (_, cv) = &*log2;
            cv.notify_all();
        });
        Host {
            name: name.to_owned(),
            child: Some(child),
            log,
            raw,
            held,
            reader: Some(reader),
        }
    }

    /// Stops (or resumes) reading the host's stderr: its pipe fills up, as
    /// with a log shipper that stalled.
    #[allow(dead_code)]
    pub fn hold_stderr(&self, hold: bool) {
        self.held.store(hold, Ordering::SeqCst);
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn events(&self) -> Vec<Event> {
        self.log.0.lock().unwrap().clone()
    }

    /// Everything the host wrote, for failure messages.
    pub fn output(&self) -> String {
        self.raw.lock().unwrap().join("\n")
    }

    /// The first event matching `pred`, waiting up to `timeout`.
    pub fn wait_for(&self, timeout: Duration, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
        self.try_wait_for(timeout, &pred).unwrap_or_else(|| {
            panic!(
                "host {}: no {what} within {timeout:?}; its log:\n{}",
                self.name,
                self.output()
            )
        })
    }

    pub fn try_wait_for(&self, timeout: Duration, pred: &dyn Fn(&Event) -> bool) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        let (events, cv) = &*self.log;
        let mut guard = events.lock().unwrap();
        loop {
            if let Some(e) = guard.iter().find(|e| pred(e)) {
                return Some(e.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            guard = cv.wait_timeout(guard, deadline - now).unwrap().0;
        }
    }

    /// Every event matching `pred` so far.
    pub fn all(&self, pred: impl Fn(&Event) -> bool) -> Vec<Event> {
        self.events().into_iter().filter(|e| pred(e)).collect()
    }

    pub fn signal(&self, sig: i32) -> SystemTime {
        let at = SystemTime::now();
        // SAFETY: kill(2) with a pid we spawned and still own.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill {sig} {}", self.name);
        at
    }

    pub fn sigterm(&self) -> SystemTime {
        self.signal(libc::SIGTERM)
    }

    pub fn sigkill(&mut self) -> SystemTime {
        let at = self.signal(libc::SIGKILL);
        self.wait_exit(Duration::from_secs(5));
        at
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut().expect("running").try_wait().unwrap();
        if status.is_some() {
            self.read_to_the_end();
        }
        status
    }

    /// Once the process has exited: waits until everything it wrote was
    /// read (on a busy machine the reader lags behind the exit), unless its
    /// stderr is held; 10 s at most.
    fn read_to_the_end(&mut self) {
        if self.held.load(Ordering::SeqCst) {
            return;
        }
        let Some(reader) = self.reader.take() else { return };
        let until = Instant::now() + Duration::from_secs(10);
        while !reader.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if reader.is_finished() {
            let _ = reader.join();
        }
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.read_to_the_end();
                return status;
            }
            if Instant::now() >= deadline {
                panic!(
                    "host {} did not exit within {timeout:?}; its log:\n{}",
                    self.name,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Milliseconds from `a` to `b` (negative if `b` is earlier).
/// The last `n` lines of `text`, for failure messages.
#[allow(dead_code)] // not every test binary uses it
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub fn ms_between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

/// The embedded store's directory of `lease` in `store` (one version file
/// per write; the newest is the record).
pub fn lease_dir(store: &Path, lease: &str) -> PathBuf {
    store.join(format!("{lease}.lease"))
}

/// The names of `lease`'s version files, oldest first (`None`: no folder).
fn version_names(dir: &Path) -> Option<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
        .collect();
    names.sort();
    Some(names)
}

/// The newest version file of `lease`, if it has one.
pub fn lease_file(store: &Path, lease: &str) -> Option<PathBuf> {
    let dir = lease_dir(store, lease);
    let mut names = version_names(&dir)?;
    Some(dir.join(names.pop()?))
}

/// The record of `lease` as JSON (the store's whole version file), if it
/// has one that reads.
pub fn read_lease(store: &Path, lease: &str) -> Option<Value> {
    // The newest may be removed as old between listing and reading.
    for _ in 0..10 {
        if let Ok(bytes) = std::fs::read(lease_file(store, lease)?) {
            return serde_json::from_slice(&bytes).ok();
        }
    }
    None
}

/// Deletes `lease` behind the store's back, as an operator would: moved
/// away at once (a plain `rm -r` can race with a write and fail with
/// "directory not empty"), then removed.
pub fn delete_lease(store: &Path, lease: &str) {
    let trash = store.join(format!(".{lease}.deleted-by-test"));
    std::fs::rename(lease_dir(store, lease), &trash).unwrap();
    // A holder writing through a handle it opened before the rename may
    // add a version while the directory is removed: try again.
    for attempt in 0.. {
        match std::fs::remove_dir_all(&trash) {
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempt < 20 => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
}

/// Overwrites every version of `lease` with `garbage`, again until the
/// newest stays garbled; returns its path. Every version, not only the
/// newest: a newest version that cannot be read above a holder's readable
/// one is read as that holder's torn renewal (see `docs/embedded-store.md`)
/// and renewed over, as after a crash. And again: a holder renews over its
/// own last version without reading it, so it may write the next version
/// before its watch reports the garbling.
pub fn garble_lease(store: &Path, lease: &str, garbage: &str) -> PathBuf {
    let dir = lease_dir(store, lease);
    for _ in 0..60 {
        let newest = lease_file(store, lease).expect("a lease to garble");
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") && !name.starts_with('.') {
                // Removed as old meanwhile: nothing to garble.
                if let Ok(mut file) = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(entry.path())
                {
                    std::io::Write::write_all(&mut file, garbage.as_bytes()).unwrap();
                }
            }
        }
        std::thread::sleep(RETRY_PERIOD * 2);
        if lease_file(store, lease).as_ref() == Some(&newest) {
            return newest;
        }
    }
    panic!("{lease} kept being written over its garbled versions");
}

/// The leases a host leads now, by its last status event of each (its
/// membership record left out).
pub fn led(h: &Host) -> std::collections::BTreeSet<String> {
    led_at(h, SystemTime::now() + Duration::from_secs(3600))
}

/// The leases a host led at `at`, by its last status event of each before
/// then (its membership record left out).
pub fn led_at(h: &Host, at: SystemTime) -> std::collections::BTreeSet<String> {
    let mut last: std::collections::BTreeMap<String, bool> = std::collections::BTreeMap::new();
    for e in h.all(|e| e.message() == "lease status changed" && e.at <= at) {
        let Some(lease) = e.str("lease") else { continue };
        if lease.starts_with("baton-member.") {
            continue;
        }
        last.insert(lease.to_owned(), e.str("role") == Some("leading"));
    }
    last.into_iter().filter(|(_, l)| *l).map(|(n, _)| n).collect()
}

/// `GET path` from the HTTP server at `addr` (`host:port`): the status code
/// and the body. One request per connection, bounded by five seconds.
#[allow(dead_code)] // not every test binary uses it
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {head:?}")))?;
    // Bodies come whole (Content-Length) from baton's admin server.
    Ok((status, body.to_owned()))
}

/// The value of one series in a Prometheus text body: `series` is the name
/// with its labels as written (`baton_lease_term{lease="demo"}`). `None` if
/// it is not there.
#[allow(dead_code)]
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of every series of `name` whose labels contain all of `labels`
/// (each `key="value"`); 0 if none.
#[allow(dead_code)]
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            if !(rest.is_empty() || rest.starts_with('{')) {
                return None;
            }
            labels
                .iter()
                .all(|want| rest.contains(want))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[allow(dead_code)]
impl Host {
    /// The address of its admin endpoints, from its log (started with
    /// `--admin-address`).
    pub fn admin_address(&self) -> String {
        self.wait_for(Duration::from_secs(30), "the admin endpoints", |e| {
            e.message().starts_with("admin endpoints listening")
        })
        .str("address")
        .expect("address")
        .to_owned()
    }

    /// `GET path` from its admin endpoints: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        let addr = self.admin_address();
        http_get(&addr, path).unwrap_or_else(|e| panic!("host {}: GET {path}: {e}", self.name))
    }

    /// Its metrics, as text.
    pub fn scrape(&self) -> String {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "host {}: /metrics: {body}", self.name);
        body
    }
}

/// A pseudo-terminal (`openpty`): a host gets its terminal side as
/// standard error, as on a terminal; the test keeps the other side, the
/// master, and reads it ([`Pty::record`]) or never does (a terminal on
/// hold: once its buffer is full, every write to the terminal blocks).
#[allow(dead_code)]
pub struct Pty {
    pub master: std::fs::File,
    pub terminal: std::fs::File,
}

#[allow(dead_code)]
impl Pty {
    /// A terminal of `cols` columns and `rows` rows.
    pub fn open(cols: u16, rows: u16) -> Pty {
        use std::os::fd::FromRawFd;
        let (mut master, mut terminal) = (0, 0);
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes the two descriptors; the name and the
        // terminal settings are not asked for.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut terminal,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors are new and owned by nobody else.
        unsafe {
            Pty {
                master: std::fs::File::from_raw_fd(master),
                terminal: std::fs::File::from_raw_fd(terminal),
            }
        }
    }

    /// `baton` with the terminal as standard error, `TERM=xterm`, no
    /// `NO_COLOR`, and standard input and output elsewhere.
    pub fn baton(&self) -> Command {
        let mut command = baton();
        command
            .env("TERM", "xterm")
            .env_remove("NO_COLOR")
            .env_remove("BATON_PROGRESS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.terminal.try_clone().unwrap());
        command
    }

    /// Writes to the terminal until its buffer is full: from then on a
    /// write blocks until the master is read, which it never is. Returns
    /// how many bytes it took.
    pub fn fill(&self) -> usize {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let fd = self.terminal.as_raw_fd();
        let set_blocking = |blocking: bool| {
            // SAFETY: fcntl on a descriptor this Pty owns.
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFL);
                let flags = if blocking {
                    flags & !libc::O_NONBLOCK
                } else {
                    flags | libc::O_NONBLOCK
                };
                assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags), 0);
            }
        };
        set_blocking(false);
        let mut total = 0;
        let chunk = [b'.'; 1024];
        loop {
            match (&self.terminal).write(&chunk) {
                Ok(n) => total += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the terminal: {e}"),
            }
        }
        // The file status flags are shared with the host's copy: blocking
        // again, as a terminal is.
        set_blocking(true);
        total
    }

    /// Reads everything written to the terminal into the returned buffer,
    /// until the hosts started on it have exited (this Pty's own copy of
    /// the terminal side is closed here: start them first).
    pub fn record(self) -> Arc<Mutex<Vec<u8>>> {
        use std::io::Read;
        let out = Arc::new(Mutex::new(Vec::new()));
        let Pty { mut master, terminal } = self;
        drop(terminal);
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            // EIO once the terminal side is closed everywhere.
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        out
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; for an admin address
/// whose log line cannot be read).
#[allow(dead_code)]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A host whose probe guests tag their records with its name
/// (`PROBE_HOST`, passed through `inherit-env`).
pub fn probe_host(name: &str, cfg: &Path) -> Host {
    Host::start_opts(
        name,
        cfg,
        Opts {
            env: &[("PROBE_HOST", name)],
            ..Opts::default()
        },
    )
}

/// The user + system CPU time of process `pid` so far, in seconds.
#[allow(dead_code)] // for the benches
pub fn cpu_secs(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces: fields count from after its ')'.
    let rest = &text[text.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The user + system CPU time of each of process `pid`'s threads so far,
/// in seconds, summed by thread name (`baton-election`, `tokio-runtime-w`,
/// …; a thread that ended meanwhile is not counted).
#[allow(dead_code)] // for the benches
pub fn thread_cpu_secs(pid: i32) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    // SAFETY: sysconf has no memory-safety preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (text.find('('), text.rfind(')')) else {
            continue;
        };
        let name = text[open + 1..close].to_owned();
        let fields: Vec<&str> = text[close + 2..].split_whitespace().collect();
        let ticks = fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        *by_name.entry(name).or_insert(0.0) += ticks as f64 / tick;
    }
    by_name
}

/// What hosts say they did, from their `/metrics` (start them with
/// `--admin-address 127.0.0.1:0`): the renewals each lease's leader had
/// confirmed, the failed writes of their electors that a read answers
/// (conflicts, timeouts), and the terms gained and lost. Counting what the
/// hosts did, rather than what a window of wall-clock time should hold,
/// keeps a test true on a machine of any speed.
#[allow(dead_code)]
#[derive(Clone, Debug, Default)]
pub struct HostCounts {
    /// Confirmed renewals by lease (a lease several hosts led: summed).
    /// The membership records' renewals are not counted by the hosts.
    pub renewed: std::collections::BTreeMap<String, u64>,
    /// Terms started (acquisitions: writes that are not renewals) by lease.
    pub taken: std::collections::BTreeMap<String, u64>,
    /// All of them.
    pub renewals: u64,
    /// Conflicts and timeouts of the electors' requests.
    pub failed: u64,
    /// Terms started, and ended, on these hosts (leadership changes).
    pub gained: u64,
    pub lost: u64,
}

#[allow(dead_code)]
impl HostCounts {
    const RENEWALS: &'static str = "baton_lease_renewal_seconds_count{";
    const CHANGES: &'static str = "baton_lease_leadership_changes_total{";

    /// The series of `metric` (its name and `{`) in `text` whose labels
    /// include `with`: each one's lease and value.
    fn by_lease<'t>(
        text: &'t str,
        metric: &'t str,
        with: &'t str,
    ) -> impl Iterator<Item = (String, u64)> + 't {
        text.lines().filter_map(move |line| {
            let (labels, value) = line.strip_prefix(metric)?.split_once("} ")?;
            if !labels.contains(with) {
                return None;
            }
            let lease = labels
                .split(',')
                .find_map(|l| l.strip_prefix("lease=\""))
                .map(|l| l.trim_end_matches('"').to_owned())
                .unwrap_or_default();
            Some((lease, value.trim().parse::<f64>().unwrap() as u64))
        })
    }

    /// The counts of `hosts`, summed.
    pub fn read(hosts: &[Host]) -> HostCounts {
        let mut counts = HostCounts::default();
        for h in hosts {
            let text = h.scrape();
            for (lease, n) in Self::by_lease(&text, Self::RENEWALS, "") {
                counts.renewals += n;
                *counts.renewed.entry(lease).or_default() += n;
            }
            for (lease, n) in Self::by_lease(&text, Self::CHANGES, "change=\"gained\"") {
                *counts.taken.entry(lease).or_default() += n;
            }
            let sum = |name: &str, label: &str| metric_sum(&text, name, &[label]) as u64;
            counts.failed += sum("baton_lease_store_errors_total", "kind=\"conflict\"")
                + sum("baton_lease_store_errors_total", "kind=\"timeout\"");
            counts.gained += sum("baton_lease_leadership_changes_total", "change=\"gained\"");
            counts.lost += sum("baton_lease_leadership_changes_total", "change=\"lost\"");
        }
        counts
    }

    /// What was done since `before`.
    pub fn since(&self, before: &HostCounts) -> HostCounts {
        HostCounts {
            renewed: self
                .renewed
                .iter()
                .map(|(l, n)| (l.clone(), n - before.renewed.get(l).copied().unwrap_or(0)))
                .collect(),
            taken: self
                .taken
                .iter()
                .map(|(l, n)| (l.clone(), n - before.taken.get(l).copied().unwrap_or(0)))
                .collect(),
            renewals: self.renewals - before.renewals,
            failed: self.failed - before.failed,
            gained: self.gained - before.gained,
            lost: self.lost - before.lost,
        }
    }
}

/// Asserts that `new` took `lease` from `old` through `old`'s release, not
/// by waiting for the lease to expire, after `since`: `old` released it
/// once every task of its term had stopped, and `new` saw the lease with
/// no holder (its status `pending`, holder "") before it led. A take by
/// expiry never shows that: the record still names the old holder. No two
/// hosts' log times are compared (the releasing host logs its release
/// after the write, which the taker may log having seen first), and no
/// time is judged: returns the ms from the release's log line to `new`'s
/// lead, a figure for the benches (`handover`, `versus_client_go`).
#[allow(dead_code)]
pub fn assert_handed_over_by_release(old: &Host, new: &Host, lease: &str, since: SystemTime) -> f64 {
    let of_lease = |e: &Event| e.at >= since && e.str("lease") == Some(lease);
    let released = old.wait_for(Duration::from_secs(30), "the release", |e| {
        of_lease(e) && e.message() == "released the lease"
    });
    let led = new.wait_for(Duration::from_secs(30), "the new leader", |e| {
        of_lease(e) && e.message() == "lease status changed" && e.str("role") == Some("leading")
    });
    for stop in old.all(|e| e.at >= since && e.message() == "leader task stopped") {
        assert!(
            stop.at <= released.at,
            "{}: a task stopped after the release: {:?} after {:?}",
            old.name,
            stop.json,
            released.json
        );
    }
    let saw_it_free = new.all(|e| {
        of_lease(e)
            && e.at <= led.at
            && e.message() == "lease status changed"
            && e.str("role") == Some("pending")
            && e.str("holder") == Some("")
    });
    assert!(
        !saw_it_free.is_empty(),
        "{} took {lease:?} without seeing it released by {} (a take by expiry?); its log:\n{}",
        new.name,
        old.name,
        tail(&new.output(), 30)
    );
    ms_between(released.at, led.at)
}

/// Asserts that `stop` (a `leader task stopped` event) is a forced stop
/// that honoured the grace, at the force-stop time the host computed: the
/// guest ignored the change, was given `grace`, and then stopped by
/// force. How soon after that time the stop was logged depends on the
/// machine's load and is not judged (no effect of the guest reaches the
/// outside after it: the fence tests and the witnesses prove that), but
/// for a bound that only a stuck host breaks: a second.
#[allow(dead_code)]
pub fn assert_stopped_by_force(host: &Host, stop: &Event, grace: Duration) {
    assert_eq!(stop.str("how"), Some("forced"), "{}: {:?}", host.name, stop.json);
    let after = stop.f64("after_ms").expect("after_ms");
    let grace_ms = grace.as_secs_f64() * 1e3;
    assert!(
        after >= grace_ms - 1.0,
        "{}: stopped by force {after:.1} ms after its term ended, before the grace of {grace_ms:.0} ms: {:?}",
        host.name,
        stop.json
    );
    assert!(
        after <= grace_ms + 1000.0,
        "{}: stopped by force {after:.1} ms after its term ended (grace {grace_ms:.0} ms): stuck: {:?}",
        host.name,
        stop.json
    );
}

/// On the embedded store `store`: whether `taker` took `lease` in `term`
/// by writing over a released record (no holder) of the term before it,
/// that is through the release, not once the lease had expired (an
/// expired record still names its holder). Judged from the lease's
/// version files, not from anyone's clock or log. The store keeps only
/// its newest versions: call it soon after the take; `None` if the
/// version before the take is gone already (nothing left to judge by).
#[allow(dead_code)]
pub fn taken_over_a_release(store: &Path, lease: &str, taker: &str, term: u64) -> Option<Result<(), String>> {
    let dir = lease_dir(store, lease);
    let names = version_names(&dir)?;
    // (A version pruned between the listing and the reading is left out.)
    let versions: Vec<(String, Value)> = names
        .into_iter()
        .filter_map(|n| {
            let json = serde_json::from_slice(&std::fs::read(dir.join(&n)).ok()?).ok()?;
            Some((n, json))
        })
        .collect();
    let holder = |v: &Value| v["record"]["holder"].as_str().unwrap_or("").to_owned();
    let of_term = |v: &Value| v["record"]["transitions"].as_u64();
    let first = versions
        .iter()
        .position(|(_, v)| holder(v) == taker && of_term(v) == Some(term))?;
    let (name, before) = versions.get(first.checked_sub(1)?)?;
    let (taken_name, _) = &versions[first];
    let counter = |n: &str| n.trim_end_matches(".json").parse::<u64>().ok();
    if counter(name)?.checked_add(1) != counter(taken_name) {
        return None;
    }
    Some(
        if holder(before).is_empty() && of_term(before) == Some(term - 1) {
            Ok(())
        } else {
            Err(format!(
                "{taker} took {lease:?} in term {term} ({taken_name}) over {name}, which is not a release of term {}: {before}",
                term - 1
            ))
        },
    )
}
