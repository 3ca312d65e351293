//! A real crash of the file system under a leading host: the embedded
//! store on an ext4 loop mount, shut down without flushing its journal
//! (`EXT4_IOC_SHUTDOWN` with `NOLOGFLUSH`: what a power loss leaves) while
//! the host renews, then unmounted and mounted again (the journal
//! replayed). A new host must lead within LD + RP of first seeing the
//! lease, in a term above the old one.
//!
//! Needs root and loop devices: runs only with `BATON_TEST_LOOP_MOUNT=1`,
//! and says why it skips otherwise. `BATON_TEST_LEAD_SECS` sets how long
//! the host leads before the shutdown (8 s).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::SECS;
use crate::support::*;

/// `_IOR('X', 125, __u32)`, and its flag that drops the journal's tail.
const EXT4_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587D;
const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Unmounts `mnt` when dropped.
struct Mount<'a>(&'a Path);

impl Drop for Mount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

fn mount(img: &Path, mnt: &Path) -> Result<(), String> {
    run(Command::new("mount").args(["-o", "loop"]).arg(img).arg(mnt))
}

/// Shuts the file system at `mnt` down as a power loss would.
fn shut_down(mnt: &Path) {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(mnt).unwrap();
    let flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), EXT4_IOC_SHUTDOWN as _, &flags) };
    assert_eq!(rc, 0, "EXT4_IOC_SHUTDOWN: {}", std::io::Error::last_os_error());
}

#[test]
fn a_file_system_shut_down_under_a_leader_is_led_again_after_remount() {
    if std::env::var_os("BATON_TEST_LOOP_MOUNT").is_none() {
        println!("skipped: set BATON_TEST_LOOP_MOUNT=1 to run it (needs root, mount -o loop, mkfs.ext4)");
        return;
    }
    let s = Scratch::new();
    let img = s.dir.path().join("fs.img");
    let mnt = s.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let prepared = run(Command::new("truncate").args(["-s", "64M"]).arg(&img))
        .and_then(|()| run(Command::new("mkfs.ext4").arg("-q").arg(&img)))
        .and_then(|()| mount(&img, &mnt));
    if let Err(e) = prepared {
        println!("skipped: cannot make and mount an ext4 loop file system here: {e}");
        return;
    }
    let mounted = Mount(&mnt);
    let store = mnt.join("leases");
    let cfg = s.write(
        "baton.toml",
        &config(&store, &[probe("probe", "pollable", "cooperative")]),
    );
    let mut a = Host::start("host-a", &cfg);
    let first = a.wait_for(SECS(30), "a's guest start", |e| {
        e.guest_line("probe", "probe start")
    });
    let term_a = first.guest_term().unwrap();
    // Renewals past a journal commit (every 5 s): their names are on disk,
    // their data (written back after 30 s) may not be.
    let led_for = std::env::var("BATON_TEST_LEAD_SECS").map_or(8, |v| v.parse().unwrap());
    std::thread::sleep(SECS(led_for));
    shut_down(&mnt);
    // The machine is gone: so is every process on it.
    a.sigkill();
    drop(mounted);
    mount(&img, &mnt).expect("mounted again");
    let _mounted = Mount(&mnt);
    let versions = lease_dir(&store, "demo");
    let mut names: Vec<(String, u64)> = std::fs::read_dir(&versions)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), e.metadata().unwrap().len())
        })
        .collect();
    names.sort();
    let readable = |name: &str| {
        std::fs::read(versions.join(name))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["counter"].as_u64().map(|c| format!("{c:020}.json")).as_deref() == Some(name))
    };
    let torn: Vec<&str> = names
        .iter()
        .filter(|(n, _)| n.ends_with(".json") && !readable(n))
        .map(|(n, _)| n.as_str())
        .collect();
    println!(
        "after the shutdown and remount: {} versions (name, bytes): {names:?}; unreadable: {torn:?}",
        names.len()
    );

    let b = Host::start("host-b", &cfg);
    let seen = b.wait_for(SECS(30), "b's first sighting", |e| {
        e.message() == "lease status changed"
    });
    let led = b.wait_for(SECS(10), "b leading", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("leading")
    });
    let took = ms_between(seen.at, led.at);
    // A bound only a wedged lease breaks (how soon is a figure: LD + RP on
    // an idle machine).
    let bound = (LEASE_DURATION + RETRY_PERIOD + SECS(2)).as_millis() as f64;
    println!(
        "after the shutdown: b led {took:.0} ms after it first saw the lease (LD + RP = {} ms)",
        (LEASE_DURATION + RETRY_PERIOD).as_millis()
    );
    assert!(took <= bound, "led {took:.0} ms after its first sighting");
    let term_b = led.u64("term").unwrap();
    assert!(term_b > term_a, "term {term_b} after {term_a}");
    b.wait_for(SECS(15), "b's guest start", |e| {
        e.guest_line("probe", "probe start")
    });
    drop(b);
    std::thread::sleep(Duration::from_millis(200));
}
