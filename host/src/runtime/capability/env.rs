//! Environment: the variables a plugin's `env` and `inherit-env` grant
//! (nothing of the host's environment is inherited otherwise).

use wasmtime::component::Linker;
use wasmtime_wasi::WasiView;

use std::collections::BTreeMap;

use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::runtime::world::World;

/// The capability: WASI's own `environment`, filled from the grant.
pub struct Env;

/// The variables a guest sees, in order (values as resolved when the
/// configuration was read).
pub type EnvGrant = Vec<(String, String)>;

crate::raw_keys! {
    /// `env` and `inherit-env`.
    pub struct RawEnv {
        env: BTreeMap<String, String> = "env",
        inherit: Vec<String> = "inherit-env",
    }
}

impl Capability for Env {
    type Raw = RawEnv;
    type Grant = EnvGrant;
    type Plugin = EnvGrant;
    type Ctx = ();
    type View<'a> = ();

    /// `env`'s values, then each `inherit-env` variable the host has (one
    /// it has not is left out, with a warning).
    fn grant(raw: RawEnv, site: &GrantSite<'_>) -> Result<EnvGrant, GrantError> {
        let mut vars: EnvGrant = raw.env.unwrap_or_default().into_iter().collect();
        for var in raw.inherit.unwrap_or_default() {
            match std::env::var(&var) {
                Ok(v) => vars.push((var, v)),
                Err(_) => tracing::warn!(plugin = %site.plugin, variable = %var,
                    "inherit-env: not set on the host; not passed"),
            }
        }
        Ok(vars)
    }

    fn load(vars: &EnvGrant, _: &LoadContext<'_>) -> Result<EnvGrant, String> {
        Ok(vars.clone())
    }

    fn prepare(vars: &EnvGrant, setup: &mut Setup<'_>) -> Result<(), SetupError> {
        for (k, v) in vars {
            setup.wasi.env(k, v);
        }
        Ok(())
    }

    fn view<'a>(_: &'a mut (), _: Shared<'a>) {}

    /// Nothing of its own: the variables are WASI's.
    fn add_to_linker<T: WasiView + 'static>(
        _: &mut Linker<T>,
        _: World,
        _: for<'a> fn(&'a mut T),
    ) -> wasmtime::Result<()> {
        Ok(())
    }

    /// The names, never the values.
    fn describe(vars: &EnvGrant) -> Vec<String> {
        if vars.is_empty() {
            return Vec::new();
        }
        let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
        vec![format!("env {}", names.join(","))]
    }
}
