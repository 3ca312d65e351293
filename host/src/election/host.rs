//! What this host says of itself in every record it holds: its
//! [`HostInfo`] (address, draining, weight), kept in one [`HostHandle`]
//! that the daemon owns and every elector reads.
//!
//! Each write that holds a lease (acquire, renew; the membership record
//! and every ordinary lease) carries the handle's value at the time of the
//! write; a release carries none. A change made through the handle is
//! published by each lease's next renewal (within a retry period), never by
//! a write of its own: it decides nothing about who may lead.

use std::sync::Arc;

use tokio::sync::watch;

use crate::store::HostInfo;

/// This host's [`HostInfo`], shared by the daemon and its electors;
/// clones share one value.
#[derive(Clone, Debug)]
pub struct HostHandle(Arc<watch::Sender<HostInfo>>);

impl HostHandle {
    /// A handle holding `info`.
    pub fn new(info: HostInfo) -> HostHandle {
        HostHandle(Arc::new(watch::Sender::new(info)))
    }

    /// What the electors read: [`ElectorConfig::host`](super::ElectorConfig::host).
    pub fn subscribe(&self) -> watch::Receiver<HostInfo> {
        self.0.subscribe()
    }

    /// The current value.
    pub fn get(&self) -> HostInfo {
        self.0.borrow().clone()
    }

    /// Changes the value with `change`; the next write of each lease held
    /// here publishes it. Whether it changed.
    pub fn modify(&self, change: impl FnOnce(&mut HostInfo)) -> bool {
        self.0.send_if_modified(|info| {
            let before = info.clone();
            change(info);
            *info != before
        })
    }

    /// Sets [`HostInfo::draining`]; whether it changed.
    pub fn set_draining(&self, draining: bool) -> bool {
        self.modify(|info| info.draining = draining)
    }
}

impl Default for HostHandle {
    /// No address, not draining, the default weight.
    fn default() -> HostHandle {
        HostHandle::new(HostInfo::default())
    }
}
