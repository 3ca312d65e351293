//! The plugin's settings, over `wasi:config/store` (`0.2.0-rc.1`).
//!
//! Needs the `config` feature, and works in both worlds (plain blocking
//! calls). The values are those of the plugin's `config` table in the
//! host's configuration: a literal, the contents of a file
//! (`{ from-file = "/run/secrets/token" }`) or a variable of the host's
//! environment (`{ env = "REGION" }`):
//!
//! ```toml
//! [[plugin]]
//! name = "reports"
//! config = { interval = "30s", token = { from-file = "/run/secrets/t" } }
//! ```
//!
//! Unlike the `env` grant, a setting can come from a file (a mounted
//! secret) without the host copying it into the plugin's environment.
//!
//! ```no_run
//! # fn main() -> Result<(), baton_guest::config::Error> {
//! let interval = baton_guest::config::get("interval")?.unwrap_or_else(|| "1s".into());
//! for (key, _value) in baton_guest::config::get_all()? {
//!     println!("setting {key}");
//! }
//! # Ok(())
//! # }
//! ```

use std::fmt;

use crate::__private::wasi_bindings::wasi::config::store;

/// Why a setting could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Where the value comes from failed (`wasi:config`'s `upstream`).
    Upstream(String),
    /// Reading it failed (`wasi:config`'s `io`), e.g. its file.
    Io(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Upstream(message) => write!(f, "config source failed: {message}"),
            Error::Io(message) => write!(f, "config read failed: {message}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<store::Error> for Error {
    fn from(e: store::Error) -> Error {
        match e {
            store::Error::Upstream(message) => Error::Upstream(message),
            store::Error::Io(message) => Error::Io(message),
        }
    }
}

/// The value of setting `key`, or `None` when the plugin's `config` table
/// has no such key.
pub fn get(key: &str) -> Result<Option<String>, Error> {
    Ok(store::get(key)?)
}

/// Every setting, as (key, value) pairs.
pub fn get_all() -> Result<Vec<(String, String)>, Error> {
    Ok(store::get_all()?)
}
