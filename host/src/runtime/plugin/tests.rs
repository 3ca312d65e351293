//! Tests of [`plugin`](super).

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::*;
use crate::runtime::{CacheUse, Compile, CompileObserver, EngineOptions, PluginEngine};

/// A test guest built by `scripts/build-guests.sh`, found through
/// `BATON_GUESTS_DIR` (set by `scripts/test.sh`).
fn guest(file: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("BATON_GUESTS_DIR").expect("BATON_GUESTS_DIR: run scripts/test.sh");
    std::path::Path::new(&dir).join(file)
}

#[test]
fn a_file_named_again_is_read_again_only_when_it_changed() {
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugin.wasm");
    std::fs::copy(guest("probe_pollable.wasm"), &path).unwrap();
    assert_eq!(runtime.check("a", &path).unwrap().world(), World::Pollable);
    // Unchanged: the same compilation, not read again.
    assert_eq!(runtime.check("b", &path).unwrap().world(), World::Pollable);
    assert_eq!(runtime.files.lock().unwrap().len(), 1);
    assert_eq!(runtime.components(), 1);
    // Rewritten in place: read again, and judged by its new bytes.
    std::fs::write(&path, b"not a component").unwrap();
    let e = runtime.check("c", &path).err().expect("garbage is refused");
    assert!(e.to_string().contains("not a WebAssembly file"), "{e}");
    // Replaced by another component: that one's world.
    std::fs::copy(guest("probe_future.wasm"), &path).unwrap();
    assert_eq!(runtime.check("d", &path).unwrap().world(), World::Future);
    assert_eq!(runtime.components(), 2);
}

/// One thing a [`CompileObserver`] was told: the plugin, the size, and
/// `None` for a start or `Some` with the end's cache use.
type Event = (String, u64, Option<Option<CacheUse>>);

/// What a [`CompileObserver`] was told, in order.
#[derive(Default)]
struct Told(Mutex<Vec<Event>>);

impl CompileObserver for Told {
    fn compiling(&self, c: &Compile) {
        self.0.lock().unwrap().push((c.plugin.to_string(), c.bytes, None));
    }
    fn compiled(&self, c: &Compile, _: std::time::Duration, cache: Option<CacheUse>) {
        self.0
            .lock()
            .unwrap()
            .push((c.plugin.to_string(), c.bytes, Some(cache)));
    }
}

#[test]
fn each_compilation_is_announced_with_where_its_code_came_from() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = |cache_dir: Option<&Path>| {
        let engine = PluginEngine::new(EngineOptions {
            cache_dir: cache_dir.map(Path::to_owned),
            ..EngineOptions::default()
        })
        .unwrap();
        let mut runtime = PluginRuntime::new(engine).unwrap();
        let told = Arc::new(Told::default());
        runtime.set_compile_observer(told.clone());
        (runtime, told)
    };
    let file = guest("probe_pollable.wasm");
    let bytes = std::fs::metadata(&file).unwrap().len();
    let (first, told) = runtime(Some(cache.path()));
    first.check("a", &file).unwrap();
    // Named again, or by another plugin: compiled once.
    first.check("b", &file).unwrap();
    let miss = vec![
        ("a".to_owned(), bytes, None),
        ("a".to_owned(), bytes, Some(Some(CacheUse::Miss))),
    ];
    assert_eq!(*told.0.lock().unwrap(), miss);
    // Another process (engine) on the same cache: from the cache.
    let (second, told) = runtime(Some(cache.path()));
    second.check("c", &file).unwrap();
    assert_eq!(
        told.0.lock().unwrap().last(),
        Some(&("c".to_owned(), bytes, Some(Some(CacheUse::Hit))))
    );
    // Without a cache.
    let (third, told) = runtime(None);
    third.check("d", &file).unwrap();
    assert_eq!(
        told.0.lock().unwrap().last(),
        Some(&("d".to_owned(), bytes, Some(Some(CacheUse::Off))))
    );
    // A component that does not compile: announced, and ended without
    // a cache use (its error says why).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm\x0d\x00\x01\x00garbage").unwrap();
    assert!(third.check("e", &bad).is_err());
    assert_eq!(
        told.0.lock().unwrap().last(),
        Some(&("e".to_owned(), 15, Some(None)))
    );
}

#[test]
fn both_versions_of_the_contract_are_served_and_told_apart() {
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    // Built with the SDK: 0.2.0; these call `current-hosts`, the probes
    // do not (and so do not import it).
    for (file, world, hosts) in [
        ("hosts_pollable.wasm", World::Pollable, true),
        ("hosts_future.wasm", World::Future, true),
        ("probe_pollable.wasm", World::Pollable, false),
        ("probe_future.wasm", World::Future, false),
    ] {
        let p = runtime.check(file, &guest(file)).unwrap();
        assert_eq!(
            (p.world(), p.contract(), p.uses_hosts()),
            (world, Contract::V0_2, hosts),
            "{file}"
        );
        assert_eq!(p.wit_world(), world.wit_name_in(Contract::V0_2));
    }
    // Built with wit-bindgen against wit/v0.1.0.
    let p = runtime.check("http", &guest("http_probe.wasm")).unwrap();
    assert_eq!(
        (p.world(), p.contract(), p.uses_hosts()),
        (World::Pollable, Contract::V0_1, false)
    );
    assert_eq!(p.wit_world(), "baton:leader/pollable-plugin@0.1.0");
    // The SDK's ticker does not call `current-hosts`: not imported.
    let p = runtime
        .check("ticker", &guest("rust_pollable_ticker.wasm"))
        .unwrap();
    assert_eq!((p.contract(), p.uses_hosts()), (Contract::V0_2, false));
}
