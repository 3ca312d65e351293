//! The cost of the host-call fence (`runtime/fence.rs`): a guest calls a
//! host function that does nothing, two million times in a loop, in Stores
//! with and without baton's call hook; and the term's question alone
//! (`Term::must_stop`: two coarse clock reads while the force-stop time is
//! more than 450 ms off, the exact `CLOCK_BOOTTIME` read near it).
//!
//! The hook runs on every transition between guest and host (four per host
//! call: into the host, back, and the same for the guest side), but asks
//! the term only when entering the host or the guest. The aim is under
//! 50 ns per host call.
//!
//! Run: `scripts/bench.sh` (or `cargo bench --bench fence`).
//! `BATON_BENCH_RUNS` sets the number of runs (default 8).
// A bench is a test program: exempt from the production length limit.
#![allow(clippy::too_many_lines)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::election::{Term, TermClock};
use baton::runtime::StoreTerm;
use baton::runtime::fence::call_fence;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

/// A component whose `run(n)` calls the imported `tick` n times.
const GUEST: &str = r#"
(component
  (import "tick" (func $tick))
  (core func $tick_lowered (canon lower (func $tick)))
  (core module $m
    (import "host" "tick" (func $tick))
    (func (export "run") (param $n i32)
      (loop $again
        call $tick
        local.get $n
        i32.const 1
        i32.sub
        local.tee $n
        br_if $again)))
  (core instance $host (export "tick" (func $tick_lowered)))
  (core instance $i (instantiate $m (with "host" (instance $host))))
  (func (export "run") (param "n" u32) (canon lift (core func $i "run"))))
"#;

const CALLS: u32 = 2_000_000;

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// One question asked 10 million times per run, of a term whose deadline
/// is an hour off: ns per ask, (min, median, max) over `runs`.
fn per_ask(runs: usize, ask: impl Fn() -> bool) -> (f64, f64, f64) {
    const ASKS: u32 = 10_000_000;
    let mut samples = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let mut yes = 0u32;
        for _ in 0..ASKS {
            yes += u32::from(ask());
        }
        assert_eq!(yes, 0, "the deadline is an hour off");
        samples.push(start.elapsed().as_nanos() as f64 / f64::from(ASKS));
    }
    median(samples)
}

fn main() {
    let runs: usize = std::env::var("BATON_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(8);
    let engine = Engine::new(&Config::new()).expect("engine");
    let component = Component::new(&engine, GUEST).expect("the benchmark guest");
    let mut linker = Linker::<()>::new(&engine);
    linker
        .root()
        .func_wrap("tick", |_, (): ()| Ok(()))
        .expect("link tick");
    let pre = linker.instantiate_pre(&component).expect("instantiate_pre");
    let clock = TermClock::system();
    let term: Arc<Term> = Term::begin(
        "bench",
        1,
        Duration::from_secs(1),
        clock.clone(),
        clock.now() + Duration::from_secs(3600),
    );

    let per_call = |fenced: bool| {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let mut store = Store::new(&engine, ());
            if fenced {
                store.call_hook(call_fence(StoreTerm::of(term.clone())));
            }
            let instance = pre.instantiate(&mut store).expect("instantiate");
            let run = instance
                .get_typed_func::<(u32,), ()>(&mut store, "run")
                .expect("run");
            let start = Instant::now();
            run.call(&mut store, (CALLS,)).expect("run");
            samples.push(start.elapsed().as_nanos() as f64 / f64::from(CALLS));
        }
        median(samples)
    };
    // One warm-up of each.
    per_call(false);
    per_call(true);
    let bare = per_call(false);
    let fenced = per_call(true);
    println!(
        "fence: host call without the hook: {:.1} / {:.1} / {:.1} ns (min / median / max over {runs} runs of {CALLS} calls)",
        bare.0, bare.1, bare.2
    );
    println!(
        "fence: host call with the hook:    {:.1} / {:.1} / {:.1} ns",
        fenced.0, fenced.1, fenced.2
    );
    println!(
        "fence: the hook costs {:.1} ns per host call (median; aim: under 50 ns)",
        fenced.1 - bare.1
    );

    let asks = per_ask(runs, || std::hint::black_box(&term).must_stop());
    println!(
        "fence: Term::must_stop alone, the deadline far off (coarse clocks): {:.1} / {:.1} / {:.1} ns",
        asks.0, asks.1, asks.2
    );
    // What must_stop costs within half a second of the deadline, or after a
    // suspend: the exact clock.
    let exact = per_ask(runs, || std::hint::black_box(&clock).now() >= term.stop_at());
    println!(
        "fence: near the deadline (the exact CLOCK_BOOTTIME read): {:.1} / {:.1} / {:.1} ns",
        exact.0, exact.1, exact.2
    );

    // A file write inside the kernel-closed window (runtime/fence/window.rs)
    // against a plain one: 64-byte positioned writes to a temporary file.
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        const WRITES: u32 = 200_000;
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = std::fs::File::create(dir.path().join("w")).expect("file");
        let data = [b'x'; 64];
        let stop_at = term.stop_at().as_nanos();
        let mut plain = Vec::new();
        let mut windowed = Vec::new();
        for _ in 0..runs {
            let start = Instant::now();
            for i in 0..WRITES {
                file.write_at(&data, u64::from(i % 1024) * 64).expect("write");
            }
            plain.push(start.elapsed().as_nanos() as f64 / f64::from(WRITES));
            let start = Instant::now();
            for i in 0..WRITES {
                baton::runtime::fence::window::write_before(
                    file.as_raw_fd(),
                    stop_at,
                    || term.must_stop(),
                    || file.write_at(&data, u64::from(i % 1024) * 64),
                )
                .expect("in time")
                .expect("write");
            }
            windowed.push(start.elapsed().as_nanos() as f64 / f64::from(WRITES));
        }
        let (plain, windowed) = (median(plain), median(windowed));
        println!(
            "fence: a 64-byte file write: {:.0} ns plain, {:.0} ns in the closed window (median; +{:.0} ns)",
            plain.1,
            windowed.1,
            windowed.1 - plain.1
        );
    }
}
