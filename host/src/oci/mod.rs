//! Plugins from OCI registries: a plugin's `path` may be a [`Reference`]
//! (`oci://REGISTRY/REPOSITORY:TAG` or `…@sha256:HEX`). [`Registry::pull`]
//! resolves a tag to a manifest digest, pulls the one component layer into
//! a content-addressed [`Cache`] shared by the machine's hosts, and checks
//! its digest and, when a key is required, its cosign signature; the
//! runtime then compiles the cached file as any other.
//! It takes one layer in a component's layout only (its config's media
//! type checked too), and names a Spin application as one.
//! [`Registry::push`] publishes a component as `wkg oci push` does: the
//! layer titled with the file's name, the config saying what the
//! component exports and imports.
//!
//! Invariants: nothing runs that was not checked against its digest; a
//! pinned, cached reference needs no network; a tag the registry cannot be
//! asked about runs the digest it last resolved to on this machine; every
//! error names the reference, and no credential is ever logged.

mod auth;
mod cache;
mod client;
mod pull;
mod push;
mod reference;
mod sign;

pub use auth::{AuthError, Credentials};
pub use cache::{Cache, CacheError, sha256};
pub use client::{DEFAULT_POLL, DEFAULT_TIMEOUT, MIN_POLL, PullError, Settings};
pub use pull::{
    Pulled, Registry, SPIN_APPLICATION, WASM_CONFIG, WASM_CONFIG_OLD, WASM_LAYER, WASM_LAYER_OLD,
};
pub use push::{Artifact, ArtifactError, ComponentInfo, Pushed};
pub use reference::{Reference, ReferenceError, SCHEME, is_sha256};
pub use sign::{KeyError, SigningKey, VerifyKey};
