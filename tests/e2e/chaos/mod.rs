//! Chaos on the embedded store (the engine is in [`engine`]): the host
//! faults, and the lease deleted or garbled (and repaired the way an
//! operator can, by deleting it); and the spread scenario ([`layout`]):
//! several leases spread, reloads of the watched file and `baton yield`.

pub mod counter;
pub mod engine;
pub mod layout;
pub mod schedule;

use std::time::{Duration, SystemTime};

use rand::Rng;
use rand::rngs::StdRng;

use crate::support::*;
use engine::{Bed, Fault, HOST_FAULTS, Scenario};

/// The embedded store in a scratch folder of each segment.
#[derive(Default)]
struct EmbeddedBed {
    store: Option<std::path::PathBuf>,
}

impl Bed for EmbeddedBed {
    fn store(&self) -> &'static str {
        "embedded"
    }

    fn faults(&self) -> Vec<Fault> {
        let mut all = HOST_FAULTS.to_vec();
        all.extend([Fault::DeleteLease, Fault::GarbleLease]);
        all
    }

    fn timings(&self) -> (Duration, Duration) {
        (LEASE_DURATION, RETRY_PERIOD)
    }

    fn config(&mut self, s: &Scratch) -> String {
        self.store = Some(s.store());
        config(&s.store(), &[])
    }

    fn store_table(&mut self, s: &Scratch) -> String {
        self.store = Some(s.store());
        format!(
            "[store]\nkind = \"embedded\"\ndir = {:?}\n",
            s.store().display().to_string()
        )
    }

    fn defaults(&self) -> [String; 2] {
        [
            "[defaults]\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\nretry-period = \"200ms\"\ngrace = \"500ms\"\n".into(),
            "[defaults]\nlease-duration = \"3s\"\nrenew-deadline = \"1500ms\"\nretry-period = \"300ms\"\ngrace = \"700ms\"\n".into(),
        ]
    }

    fn env(&mut self, _: &Scratch, _: &str) -> Vec<(String, String)> {
        Vec::new()
    }

    fn inject(&mut self, fault: Fault, rng: &mut StdRng, _: &[&str], _: usize) -> Option<SystemTime> {
        let store = self.store.as_deref().expect("a segment's store");
        match fault {
            Fault::DeleteLease => {
                let at = SystemTime::now();
                if lease_dir(store, "demo").exists() {
                    delete_lease(store, "demo");
                }
                Some(at)
            }
            Fault::GarbleLease => {
                let file = lease_file(store, "demo")?;
                std::fs::write(&file, "garbage\n").unwrap();
                std::thread::sleep(Duration::from_millis(rng.random_range(1000..4000)));
                // Repaired the only way an operator can: the lease deleted
                // (its terms go on from the floor).
                let at = SystemTime::now();
                delete_lease(store, "demo");
                Some(at)
            }
            other => panic!("not a fault of the embedded store: {other:?}"),
        }
    }
}

#[test]
fn chaos_on_the_embedded_store_never_overlaps_terms_or_lands_a_stale_write() {
    engine::run(&mut EmbeddedBed::default(), Scenario::OneLease);
}

#[test]
fn chaos_on_the_embedded_store_with_spread_leases_reloads_and_yields_never_runs_a_plugin_twice() {
    engine::run(&mut EmbeddedBed::default(), Scenario::Spread);
}
