//! Write [baton] leader-task plugins in Rust.
//!
//! A baton host takes part in a lease election and runs a plugin's leader
//! task only while it holds the plugin's lease. A plugin is a WebAssembly
//! component that exports the task and watches the lease status to learn
//! when its term is over. The contract (`baton:leader@0.4.0`, in the `wit/`
//! folder of the baton repository) comes in two flavours, one WIT world
//! each; this crate wraps both behind a small API:
//!
//! | Cargo feature | module       | world                                              | task       |
//! |---------------|--------------|----------------------------------------------------|------------|
//! | `future`      | [`future`]   | `baton:leader/future-plugin-with-health@0.4.0`     | `async fn` |
//! | `pollable`    | [`pollable`] | `baton:leader/pollable-plugin-with-health@0.4.0`   | `fn`       |
//!
//! Each world is the plain one (`future-plugin`, `pollable-plugin`) plus a
//! health check: the export macros always export `LeaderTask::check`, which
//! says healthy unless the plugin overrides it. The host calls it only for
//! a plugin whose configuration has a `health-check` table: every period
//! while it leads, in an instance of its own beside the task's; failing
//! checks in a row make the host hand the lease over.
//!
//! Neither feature is on by default: enable the one your plugin targets,
//! implement that module's `LeaderTask` trait and export it with
//! [`export_future!`] or [`export_pollable!`]. Build the plugin as a
//! `cdylib` for `wasm32-wasip2`; the result is a component:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! baton-guest = { path = "../../guest-sdk", features = ["pollable"] }
//! ```
//!
//! ```sh
//! cargo build --release --target wasm32-wasip2
//! ```
//!
//! Enabling both world features at once is fine (Cargo does that when it
//! builds a `future` and a `pollable` plugin in one command): the world of
//! a plugin is chosen by the export macro it calls, and each plugin must
//! call exactly one of them, once. The imports of the other world are left out of the
//! component because nothing calls them.
//!
//! In either world, [`schedule::current_run`] tells a plugin with a
//! schedule which due time its run is for.
//!
//! Three more features add what a plugin may import in either world:
//!
//! | Cargo feature | module     | imports                                            |
//! |---------------|------------|----------------------------------------------------|
//! | `http`        | [`http`]   | `wasi:http/outgoing-handler@0.2.12`                |
//! | `keyvalue`    | [`kv`]     | `wasi:keyvalue/{store,atomics,batch}@0.2.0-draft2` |
//! | `config`      | [`config`] | `wasi:config/store@0.2.0-rc.1`                     |
//!
//! [`kv`] keeps state across terms (a counter or a cursor that the next
//! leader continues), in buckets the host fences by term; [`config`] reads
//! the plugin's settings. Both are plain blocking calls in either world.
//!
//! # Writing a task
//!
//! A task is called with the status that made this host the leader and must
//! return promptly once that status is outdated. Both flavours follow the
//! same pattern:
//!
//! 1. Call `watch(&status)` first: it gives a [`Change`](pollable::Change)
//!    signal that fires as soon as the lease status differs from the one
//!    `run` was called with, including a change that happened before `run`
//!    started.
//! 2. Do the work in small steps and wait on the change signal *together*
//!    with any timer, so that a change is noticed at once.
//! 3. Tag external writes with `status.term` (a fencing token).
//! 4. Return `Ok(())` once the change fires. Returning `Err` (or panicking)
//!    while the term lasts makes the host retry in a fresh instance.
//!
//! A task that ignores the change is stopped by force after the host's
//! grace period.
//!
//! Standard output and standard error go to the host's log, one line at a
//! time; environment variables are the ones that the plugin's host
//! configuration grants.
//!
//! [baton]: https://example.invalid/baton
#![deny(missing_docs)]

use std::fmt;

#[cfg(feature = "config")]
pub mod config;
#[cfg(feature = "future")]
pub mod future;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "keyvalue")]
pub mod kv;
#[cfg(feature = "pollable")]
pub mod pollable;
#[cfg(any(feature = "future", feature = "pollable"))]
pub mod schedule;

/// This host's role for one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// No holder is known: before the first election round, after this host
    /// gave up the lead without learning who holds it next, or while this
    /// host is shutting down.
    Pending,
    /// This host holds the lease: leader tasks run.
    Leading,
    /// Another holder is known and its lease has not expired.
    Following,
}

impl Role {
    /// The role's name as the WIT contract spells it: `pending`, `leading`
    /// or `following`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Pending => "pending",
            Role::Leading => "leading",
            Role::Following => "following",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The status of one lease as seen by this host.
///
/// Two statuses are the same when every field is equal; a change signal
/// fires only for a status that differs from the one it watches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Status {
    /// This host's role.
    pub role: Role,
    /// The identity of the holder, when one is known. While `role` is
    /// [`Role::Leading`] it is this host's own identity.
    pub holder: Option<String>,
    /// The name of the lease.
    pub lease: String,
    /// The fencing token of the newest term this host knows of.
    ///
    /// Every time any host starts leading this lease the term grows by at
    /// least one; a term number is never reused. While leading, tag external
    /// writes with it so that a store that remembers the highest term it has
    /// seen can reject a stale leader's writes. Zero means no term is known
    /// yet.
    pub term: u64,
    /// Where the holder's host can be reached, as it advertises itself
    /// (configured, or a pod's IP), when known: route work to the leader
    /// with it. `None` while no holder is known or it advertises nothing.
    pub holder_address: Option<String>,
}

impl Status {
    /// Whether this host holds the lease in this status.
    pub fn is_leading(&self) -> bool {
        self.role == Role::Leading
    }

    /// Whether this status says that this host leads in term `term`.
    ///
    /// A task for term `term` may go on working exactly while the current
    /// status says this.
    ///
    /// ```
    /// # use baton_guest::{Role, Status};
    /// let status = Status {
    ///     role: Role::Leading,
    ///     holder: Some("host-a".into()),
    ///     lease: "reports".into(),
    ///     term: 7,
    ///     holder_address: Some("10.0.0.7:8080".into()),
    /// };
    /// assert!(status.is_leading_term(7));
    /// assert!(!status.is_leading_term(6));
    /// ```
    pub fn is_leading_term(&self, term: u64) -> bool {
        self.is_leading() && self.term == term
    }
}

impl fmt::Display for Status {
    /// Formats as `lease=NAME role=ROLE term=N holder=ID` (`holder=-` when
    /// no holder is known), then ` at=ADDRESS` when the holder's address is
    /// known.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease={} role={} term={} holder={}",
            self.lease,
            self.role,
            self.term,
            self.holder.as_deref().unwrap_or("-")
        )?;
        match &self.holder_address {
            Some(at) => write!(f, " at={at}"),
            None => Ok(()),
        }
    }
}

/// How many hosts take part, as this host last saw the lease store (the
/// contract's `membership.hosts`, new in `baton:leader@0.2.0`).
///
/// Every host keeps a membership record in the lease store; a host is live
/// while its record is held and not expired. Read it with
/// `current_hosts()` in [`future`] or [`pollable`], which also gives a
/// signal that fires when it changes. Use it to size work the hosts share
/// (k0s sizes its work by its count of controllers), never to decide who
/// acts: only the lease decides that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Hosts {
    /// The number of live hosts, this one included when
    /// [`this_host_live`](Self::this_host_live) is true. Zero until the
    /// host first listed the store.
    pub live: u32,
    /// Whether this host's own record is among them: false before it is
    /// first written, and once it expired because the store could not be
    /// reached.
    pub this_host_live: bool,
}

impl fmt::Display for Hosts {
    /// Formats as `live=N this-host-live=BOOL`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "live={} this-host-live={}", self.live, self.this_host_live)
    }
}

/// Converts a [`std::time::Duration`] to the nanoseconds that WASI clocks
/// take, saturating at `u64::MAX` (about 584 years).
#[cfg(any(feature = "future", feature = "pollable", feature = "http"))]
fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Generated bindings and glue for the export macros. Not public API.
#[doc(hidden)]
#[allow(missing_docs)]
pub mod __private {
    pub use wit_bindgen;

    /// Converts the generated `status` and `hosts` records to
    /// [`crate::Status`] and [`crate::Hosts`].
    #[allow(unused_macros)]
    macro_rules! status_from_generated {
        ($types:path, $membership:path) => {
            use $membership as membership;
            use $types as types;

            impl From<membership::Hosts> for crate::Hosts {
                fn from(h: membership::Hosts) -> Self {
                    crate::Hosts {
                        live: h.live,
                        this_host_live: h.this_host_live,
                    }
                }
            }

            impl From<types::Role> for crate::Role {
                fn from(role: types::Role) -> Self {
                    match role {
                        types::Role::Pending => crate::Role::Pending,
                        types::Role::Leading => crate::Role::Leading,
                        types::Role::Following => crate::Role::Following,
                    }
                }
            }

            impl From<types::Status> for crate::Status {
                fn from(s: types::Status) -> Self {
                    crate::Status {
                        role: s.role.into(),
                        holder: s.holder,
                        lease: s.lease,
                        term: s.term,
                        holder_address: s.holder_address,
                    }
                }
            }
        };
    }

    /// The WASI 0.2 imports (`wasi:io`, the 0.2 clock, `wasi:http`), bound
    /// once so that a pollable of the change signal, of a timer and of an
    /// HTTP response are one type and can be polled together; and
    /// `wasi:keyvalue` and `wasi:config`, which either world may import.
    #[cfg(any(
        feature = "pollable",
        feature = "http",
        feature = "keyvalue",
        feature = "config"
    ))]
    pub mod wasi_bindings {
        wit_bindgen::generate!({
            world: "baton:guest-sdk/wasi-imports@0.1.0",
            path: ["../wit", "wit"],
            generate_all,
        });
    }

    #[cfg(feature = "pollable")]
    pub mod pollable_bindings {
        wit_bindgen::generate!({
            world: "baton:leader/pollable-plugin-with-health@0.4.0",
            path: "../wit",
            // The world's exports are described by a custom section that the
            // export macro emits in the plugin crate; this crate only
            // carries the imports, which are dropped from a component that
            // does not call them.
            pub_export_macro: true,
            export_macro_name: "export",
            with: {
                "wasi:io/poll@0.2.12": crate::__private::wasi_bindings::wasi::io::poll,
                "wasi:clocks/monotonic-clock@0.2.12": crate::__private::wasi_bindings::wasi::clocks0_2_12::monotonic_clock,
            },
            generate_all,
        });

        status_from_generated!(self::baton::leader::types, self::baton::leader::membership);

        /// Adapts a [`crate::pollable::LeaderTask`] to the generated trait.
        pub struct Adapter<T>(core::marker::PhantomData<T>);

        impl<T: crate::pollable::LeaderTask> exports::baton::leader::task_sync::Guest for Adapter<T> {
            fn run(status: baton::leader::types::Status) -> Result<(), String> {
                T::run(status.into())
            }
        }

        impl<T: crate::pollable::LeaderTask> exports::baton::leader::health_sync::Guest for Adapter<T> {
            fn check() -> Result<(), String> {
                T::check()
            }
        }
    }

    #[cfg(feature = "future")]
    pub mod future_bindings {
        wit_bindgen::generate!({
            world: "baton:leader/future-plugin-with-health@0.4.0",
            path: "../wit",
            // See `pollable_bindings`.
            pub_export_macro: true,
            export_macro_name: "export",
            generate_all,
        });

        status_from_generated!(self::baton::leader::types, self::baton::leader::membership);

        /// Adapts a [`crate::future::LeaderTask`] to the generated trait.
        pub struct Adapter<T>(core::marker::PhantomData<T>);

        impl<T: crate::future::LeaderTask> exports::baton::leader::task_async::Guest for Adapter<T> {
            async fn run(status: baton::leader::types::Status) -> Result<(), String> {
                T::run(status.into()).await
            }
        }

        impl<T: crate::future::LeaderTask> exports::baton::leader::health_async::Guest for Adapter<T> {
            async fn check() -> Result<(), String> {
                T::check().await
            }
        }
    }
}

/// Exports a [`pollable::LeaderTask`] as the plugin's task, making the
/// component target `baton:leader/pollable-plugin-with-health@0.4.0` (its
/// health check is [`pollable::LeaderTask::check`]).
///
/// Call it once, in the plugin's (`cdylib`) crate, with the type that
/// implements the task. Needs the `pollable` feature.
///
/// ```ignore
/// struct MyTask;
///
/// impl baton_guest::pollable::LeaderTask for MyTask {
///     fn run(status: baton_guest::Status) -> Result<(), String> {
///         Ok(())
///     }
/// }
///
/// baton_guest::export_pollable!(MyTask);
/// ```
#[cfg(feature = "pollable")]
#[macro_export]
macro_rules! export_pollable {
    ($task:ty) => {
        const _: () = {
            type __BatonPollableTask = $crate::__private::pollable_bindings::Adapter<$task>;
            $crate::__private::pollable_bindings::export!(
                __BatonPollableTask with_types_in $crate::__private::pollable_bindings
            );
        };
    };
}

/// Exports a [`future::LeaderTask`] as the plugin's task, making the
/// component target `baton:leader/future-plugin-with-health@0.4.0` (its
/// health check is [`future::LeaderTask::check`]).
///
/// Call it once, in the plugin's (`cdylib`) crate, with the type that
/// implements the task. Needs the `future` feature.
///
/// ```ignore
/// struct MyTask;
///
/// impl baton_guest::future::LeaderTask for MyTask {
///     async fn run(status: baton_guest::Status) -> Result<(), String> {
///         Ok(())
///     }
/// }
///
/// baton_guest::export_future!(MyTask);
/// ```
#[cfg(feature = "future")]
#[macro_export]
macro_rules! export_future {
    ($task:ty) => {
        const _: () = {
            type __BatonFutureTask = $crate::__private::future_bindings::Adapter<$task>;
            $crate::__private::future_bindings::export!(
                __BatonFutureTask with_types_in $crate::__private::future_bindings
            );
        };
    };
}
