//! A test plugin that exports the `pollable-plugin` task but also imports
//! `probe:missing/gadget`, which no baton host provides: instantiating it
//! must fail with a clear error. `run` calls `poke` so that the import is
//! kept in the component.

wit_bindgen::generate!({
    world: "probe:missing/missing-import@0.1.0",
    // The baton contract first, then this crate's package, which uses it.
    path: ["../../../wit/v0.1.0", "wit"],
    generate_all,
});

use exports::baton::leader::task_sync::{Guest, Status};

struct Probe;

impl Guest for Probe {
    fn run(status: Status) -> Result<(), String> {
        let n = probe::missing::gadget::poke();
        println!("missing-import poked term={} n={n}", status.term);
        Ok(())
    }
}

export!(Probe);
