//! `baton run`'s command-line settings (and their environment variables)
//! over the file's: applied after every read of the file, at start and at
//! each reload, so the command line always wins.

use std::path::{Path, PathBuf};

use super::{
    AdminAddressError, AdvertiseAddressError, Config, ConfigError, StoreConfig, parse_admin_address,
    validate_advertise_address,
};

/// The command line's settings; `None`: the file's.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--identity`.
    pub identity: Option<String>,
    /// `--store-dir`: an embedded store there.
    pub store_dir: Option<PathBuf>,
    /// `--cache-dir`.
    pub cache_dir: Option<PathBuf>,
    /// `--coredump-dir`.
    pub coredump_dir: Option<PathBuf>,
    /// `--kubeconfig`, for a kubernetes store.
    pub kubeconfig: Option<PathBuf>,
    /// `--etcd-endpoints`, for an etcd store.
    pub etcd_endpoints: Option<Vec<String>>,
    /// `--admin-address`, as given.
    pub admin_address: Option<String>,
    /// `--control-socket`.
    pub control_socket: Option<PathBuf>,
    /// `--advertise-address`.
    pub advertise_address: Option<String>,
}

/// A command-line setting that cannot apply, naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    /// `--identity` is blank.
    #[error("--identity (or BATON_IDENTITY) is empty")]
    EmptyIdentity,
    /// `--kubeconfig` with an embedded store.
    #[error(
        "--kubeconfig (or BATON_KUBECONFIG) applies to a kubernetes store, but the \
         configuration uses the embedded store"
    )]
    KubeconfigWithoutKubernetes,
    /// `--etcd-endpoints` with another store.
    #[error(
        "--etcd-endpoints (or BATON_ETCD_ENDPOINTS) applies to an etcd store, but the configuration uses another"
    )]
    EtcdEndpointsWithoutEtcd,
    /// `--etcd-endpoints` names something that is not an endpoint.
    #[error("--etcd-endpoints (or BATON_ETCD_ENDPOINTS): {0}")]
    EtcdEndpoint(String),
    /// `--admin-address` is not an IP address and port.
    #[error("--admin-address (or BATON_ADMIN_ADDRESS): {0}")]
    AdminAddress(AdminAddressError),
    /// `--advertise-address` cannot be an address.
    #[error("--advertise-address (or BATON_ADVERTISE_ADDRESS): {0}")]
    AdvertiseAddress(AdvertiseAddressError),
}

/// Why a configuration could not be loaded with the command line's
/// settings.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A command-line setting.
    #[error(transparent)]
    Override(#[from] OverrideError),
}

impl Overrides {
    /// Sets these over `cfg`'s settings.
    pub fn apply(&self, cfg: &mut Config) -> Result<(), OverrideError> {
        if let Some(path) = &self.control_socket {
            cfg.control_socket = Some(path.clone());
        }
        if let Some(identity) = &self.identity {
            if identity.trim().is_empty() {
                return Err(OverrideError::EmptyIdentity);
            }
            cfg.identity = identity.clone();
            cfg.identity_declared = true;
        }
        if let Some(dir) = &self.store_dir {
            cfg.store = StoreConfig::Embedded { dir: dir.clone() };
        }
        if let Some(dir) = &self.cache_dir {
            cfg.cache_dir = Some(std::path::absolute(dir).unwrap_or_else(|_| dir.clone()));
        }
        if let Some(dir) = &self.coredump_dir {
            cfg.coredump_dir = Some(dir.clone());
        }
        if let Some(path) = &self.kubeconfig {
            match &mut cfg.store {
                StoreConfig::Kubernetes { kubeconfig, .. } => *kubeconfig = Some(path.clone()),
                StoreConfig::Embedded { .. } | StoreConfig::Etcd(_) | StoreConfig::Postgres(_) => {
                    return Err(OverrideError::KubeconfigWithoutKubernetes);
                }
            }
        }
        if let Some(list) = &self.etcd_endpoints {
            let StoreConfig::Etcd(etcd) = &mut cfg.store else {
                return Err(OverrideError::EtcdEndpointsWithoutEtcd);
            };
            etcd.endpoints = list
                .iter()
                .map(|e| super::etcd_endpoint(e).map_err(OverrideError::EtcdEndpoint))
                .collect::<Result<_, _>>()?;
        }
        if let Some(address) = &self.admin_address {
            let parsed = parse_admin_address(address).map_err(OverrideError::AdminAddress)?;
            cfg.admin_address = Some(parsed);
        }
        if let Some(address) = &self.advertise_address {
            validate_advertise_address(address).map_err(OverrideError::AdvertiseAddress)?;
            cfg.advertise_address = Some(address.clone());
        }
        Ok(())
    }
}

impl Config {
    /// Reads and validates the file at `path`, then sets `overrides` over
    /// it.
    pub fn load_with_overrides(path: &Path, overrides: &Overrides) -> Result<Config, LoadError> {
        let mut cfg = Config::load(path)?;
        overrides.apply(&mut cfg)?;
        Ok(cfg)
    }
}
