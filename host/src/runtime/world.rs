//! The world a plugin targets and the version of the contract
//! (`baton:leader`) it was built against.

/// The world a plugin targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// `baton:leader/future-plugin`: component-model async.
    Future,
    /// `baton:leader/pollable-plugin`: WASI 0.2 pollables.
    Pollable,
}

impl World {
    /// The world's WIT name in the newest version of the contract.
    pub fn wit_name(self) -> &'static str {
        self.wit_name_in(Contract::NEWEST)
    }

    /// The world's WIT name in `contract`.
    pub fn wit_name_in(self, contract: Contract) -> &'static str {
        match (self, contract) {
            (World::Future, Contract::V0_1) => "baton:leader/future-plugin@0.1.0",
            (World::Pollable, Contract::V0_1) => "baton:leader/pollable-plugin@0.1.0",
            (World::Future, Contract::V0_2) => "baton:leader/future-plugin@0.2.0",
            (World::Pollable, Contract::V0_2) => "baton:leader/pollable-plugin@0.2.0",
            (World::Future, Contract::V0_3) => "baton:leader/future-plugin@0.3.0",
            (World::Pollable, Contract::V0_3) => "baton:leader/pollable-plugin@0.3.0",
            (World::Future, Contract::V0_4) => "baton:leader/future-plugin@0.4.0",
            (World::Pollable, Contract::V0_4) => "baton:leader/pollable-plugin@0.4.0",
        }
    }
}

/// The version of the contract (`baton:leader`) a plugin was built
/// against. Every one is served: a 0.x minor version is a breaking one, so
/// a plugin of 0.1.0 cannot run as one of 0.2.0, nor one of 0.2.0 as one
/// of 0.3.0, and so on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contract {
    /// `baton:leader@0.1.0` (`wit/v0.1.0/leader.wit`).
    V0_1,
    /// `baton:leader@0.2.0` (`wit/v0.2.0/leader.wit`): adds the live hosts.
    V0_2,
    /// `baton:leader@0.3.0` (`wit/v0.3.0/leader.wit`): adds the scheduled
    /// run (`current-run`).
    V0_3,
    /// `baton:leader@0.4.0` (`wit/leader.wit`): adds the holder's address
    /// to the status and the health check a plugin may export.
    V0_4,
}

impl Contract {
    /// The newest version, which `wit/leader.wit` and the Rust SDK target.
    pub const NEWEST: Contract = Contract::V0_4;

    /// Whether a plugin of this version can learn which scheduled run it
    /// is for (`current-run`, from 0.3.0). An older one still runs on a
    /// schedule; it is just not told the due time.
    pub fn tells_scheduled_run(self) -> bool {
        self >= Contract::V0_3
    }

    /// Whether a plugin of this version sees the holder's address and may
    /// export a health check (from 0.4.0).
    pub fn has_health_check(self) -> bool {
        self >= Contract::V0_4
    }

    /// Which version an export's version suffix names, if one this host
    /// serves.
    pub(crate) fn of_version(version: &str) -> Option<Contract> {
        match version {
            "0.1.0" => Some(Contract::V0_1),
            "0.2.0" => Some(Contract::V0_2),
            "0.3.0" => Some(Contract::V0_3),
            "0.4.0" => Some(Contract::V0_4),
            _ => None,
        }
    }
}
