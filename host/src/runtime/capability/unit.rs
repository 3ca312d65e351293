//! What every capability is: a unit that owns its grant, its part of each
//! instance's Store and its link step, in the manner of Spin's factors and
//! wasmtime-wasi's views.
//!
//! A [`Capability`] is a type with no data of its own. Its `Grant` is what
//! a plugin's table grants (its `Default`: a plugin that grants nothing);
//! its `Plugin` is what one plugin keeps of it across instances (made as
//! the plugin is loaded); its `Ctx` is its part of one instance's Store
//! (made by `prepare`, finished by `start` once the instance's run begins,
//! which is later for an instance prepared ahead of its term); its
//! `View` is what its host functions see, made from its `Ctx` and the
//! parts every capability shares ([`Shared`]). Its functions reach the
//! Store only through that view: no capability names the host's Store type.
//!
//! Invariant: nothing here decides whether a call may act: every call into
//! the host passes the fence first ([`crate::runtime::fence`]), and what
//! may act after its host call returned (a socket, a file write, a
//! lookup) asks the instance's term again in the view's [`StoreTerm`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiView};

use crate::election::{Hosts, LeaseView, Term};
use crate::runtime::fence::connections::Connections;
use crate::runtime::store_term::StoreTerm;
use crate::runtime::world::World;
use crate::schedule::ScheduledRun;
use crate::store::buckets::BucketStore;
use crate::support::raw_keys::RawKeys;

/// One capability of the host: see the [module docs](self).
pub trait Capability {
    /// Its keys of a plugin's table, as written.
    type Raw: RawKeys;
    /// What a plugin's table grants; `Default` grants nothing (or the
    /// documented default, as a plugin's own bucket).
    type Grant: Clone + std::fmt::Debug + Default + Send + Sync + 'static;
    /// What one plugin keeps across its instances.
    type Plugin: Send + Sync + 'static;
    /// Its part of one instance's Store.
    type Ctx: Send + 'static;
    /// What its host functions see of a Store.
    type View<'a>;

    /// Its grant from its keys of a plugin's table (those not given take
    /// their defaults), checked; `Err` names the key at fault.
    fn grant(raw: Self::Raw, site: &GrantSite<'_>) -> Result<Self::Grant, GrantError>;

    /// Checks `grant` for a plugin being loaded and makes the plugin's
    /// part; `Err` says why the plugin cannot be loaded.
    fn load(grant: &Self::Grant, plugin: &LoadContext<'_>) -> Result<Self::Plugin, String>;

    /// Its part of a new instance's Store, and of its WASI context.
    fn prepare(plugin: &Self::Plugin, setup: &mut Setup<'_>) -> Result<Self::Ctx, SetupError>;

    /// Finishes its part as the instance's run starts.
    fn start(_ctx: &mut Self::Ctx, _plugin: &Self::Plugin, _run: &RunStart<'_>) -> Result<(), SetupError> {
        Ok(())
    }

    /// Its view of a Store: its own part and the shared ones.
    fn view<'a>(ctx: &'a mut Self::Ctx, shared: Shared<'a>) -> Self::View<'a>;

    /// Links its imports into the linker of `world`, reaching its view of
    /// a Store through `get`.
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        world: World,
        get: for<'a> fn(&'a mut T) -> Self::View<'a>,
    ) -> wasmtime::Result<()>;

    /// Its grant in the `plugin loaded` log line (names, never secrets).
    fn describe(_grant: &Self::Grant) -> Vec<String> {
        Vec::new()
    }
}

/// Where a plugin's grants are read: the plugin, its table's place in the
/// file, and the file's folder.
pub struct GrantSite<'a> {
    /// The plugin's name.
    pub plugin: &'a str,
    /// Where its table is in the file (a byte offset), for errors.
    pub at: usize,
    /// The configuration file's folder.
    pub base: &'a Path,
}

impl GrantSite<'_> {
    /// `path`, relative to the file's folder unless absolute.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.base.join(path)
        }
    }

    /// An error in `field` (a key, or a path into its value such as
    /// `kubernetes.allow[0].verbs`), at the plugin's table.
    pub fn error(&self, field: impl Into<String>, reason: impl std::fmt::Display) -> GrantError {
        GrantError {
            at: self.at,
            field: field.into(),
            reason: reason.to_string(),
        }
    }
}

/// A grant that cannot be used: the key at fault and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct GrantError {
    /// Where in the file (a byte offset): the entry at fault, or the
    /// plugin's table.
    pub at: usize,
    /// The key, or a path into its value.
    pub field: String,
    /// Why not.
    pub reason: String,
}

impl GrantError {
    /// The same error, at `at` (an entry of its own position).
    pub fn at(mut self, at: usize) -> GrantError {
        self.at = at;
        self
    }
}

/// What a capability is given as a plugin is loaded.
pub struct LoadContext<'a> {
    /// The plugin's name.
    pub plugin: &'a Arc<str>,
    /// Where its buckets are kept; none without a lease store (`baton
    /// check`).
    pub buckets: Option<&'a Arc<dyn BucketStore>>,
}

/// What a capability is given to make its part of a new instance's Store.
pub struct Setup<'a> {
    /// The plugin's name.
    pub plugin: &'a Arc<str>,
    /// The lease it runs under.
    pub lease: &'a str,
    /// The instance's term: unset while it is prepared ahead.
    pub term: &'a StoreTerm,
    /// The instance's TCP connections, reset at the force-stop.
    pub connections: &'a Connections,
    /// The lease as this host sees it.
    pub view: &'a watch::Receiver<LeaseView>,
    /// The live hosts.
    pub hosts: &'a watch::Receiver<Hosts>,
    /// The instance's WASI context, being built.
    pub wasi: &'a mut WasiCtxBuilder,
}

/// What a capability is told as the instance's run starts.
pub struct RunStart<'a> {
    /// The term the run is in.
    pub term: &'a Arc<Term>,
    /// The lease as this host sees it.
    pub view: &'a watch::Receiver<LeaseView>,
    /// The scheduled run it is for, if one.
    pub scheduled: Option<&'a ScheduledRun>,
}

/// The parts of a Store every capability's view may use.
pub struct Shared<'a> {
    /// The instance's resources.
    pub table: &'a mut ResourceTable,
    /// Its WASI context.
    pub wasi: &'a mut WasiCtx,
    /// Its term, which every effect that may come after its host call asks.
    pub term: &'a StoreTerm,
    /// Its TCP connections.
    pub connections: &'a Connections,
}

/// Why a capability could not make or start its part of an instance.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SetupError(Box<dyn std::error::Error + Send + Sync>);

impl SetupError {
    /// A setup error saying `error`.
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> SetupError {
        SetupError(error.into())
    }
}
