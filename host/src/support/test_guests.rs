//! Where the test guest components are (tests only): built by
//! `scripts/build-guests.sh` into `BATON_GUESTS_DIR`, which
//! `scripts/test.sh` sets. Here, in the base layer, so that every layer's
//! tests may load them.

/// The path of the test guest `file` (for example `probe_pollable.wasm`).
pub(crate) fn guest(file: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("BATON_GUESTS_DIR").expect("BATON_GUESTS_DIR: run scripts/test.sh");
    std::path::Path::new(&dir).join(file)
}
