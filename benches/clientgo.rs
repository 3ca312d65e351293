//! The client-go elector the Kubernetes benches run beside baton
//! (`benches/clientgo/main.go`), shared by them.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The elector's binary: `BATON_CLIENTGO_ELECTOR`, or built (and cached) by
/// `benches/clientgo/build.sh`, which prints its path last.
pub fn build() -> PathBuf {
    if let Some(p) = std::env::var_os("BATON_CLIENTGO_ELECTOR") {
        return p.into();
    }
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../benches/clientgo/build.sh"
    ))
    .stderr(Stdio::inherit())
    .output()
    .expect("run benches/clientgo/build.sh");
    assert!(out.status.success(), "benches/clientgo/build.sh failed");
    let path = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(path.lines().last().expect("a path").trim())
}
