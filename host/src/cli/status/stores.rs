//! Opening each kind of store `baton status` reads, as `baton run` opens
//! it, with errors that start with where the store was named.

use std::path::Path;
use std::sync::Arc;

use super::{Spreading, Target};
use crate::config::Config;
use crate::store::embedded::EmbeddedStore;

/// The embedded store `--store-dir` names (`--kubeconfig`, if given,
/// does not apply).
pub(super) fn open_store_dir(
    dir: &Path,
    kubeconfig_given: bool,
    spreading: Spreading,
) -> anyhow::Result<Target> {
    let origin = "--store-dir (or BATON_STORE_DIR)".to_owned();
    anyhow::ensure!(
        !kubeconfig_given,
        "--kubeconfig (or BATON_KUBECONFIG) applies to a kubernetes store, but {origin} names an \
         embedded store"
    );
    open_embedded(dir, origin, spreading)
}

/// Which kubeconfig a kubernetes store's client reads, in words: the
/// flag's (`flag`), the file's (`field`), or the defaults.
pub(super) fn which_kubeconfig(flag: Option<&Path>, field: Option<&Path>) -> String {
    match (flag, field) {
        (Some(path), _) => format!(
            "the kubeconfig {} (--kubeconfig or BATON_KUBECONFIG)",
            path.display()
        ),
        (None, Some(path)) => format!("the kubeconfig {} (field `kubeconfig`)", path.display()),
        (None, None) => "no kubeconfig named (field `kubeconfig`): KUBECONFIG, ~/.kube/config or the pod's \
                         service account"
            .to_owned(),
    }
}

/// The kubernetes store of `cfg`, opened as `baton run` opens it; errors
/// start with `origin`.
pub(super) async fn open_kubernetes(
    cfg: &Config,
    origin: String,
    spreading: Spreading,
) -> anyhow::Result<Target> {
    let store = crate::daemon::open_store(cfg)
        .await
        .map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    Ok(Target {
        store,
        kind: "kubernetes",
        spreading,
        origin,
        schedules: None,
    })
}

/// The embedded store at `dir`; errors start with `origin`.
pub(super) fn open_embedded(dir: &Path, origin: String, spreading: Spreading) -> anyhow::Result<Target> {
    anyhow::ensure!(
        dir.is_dir(),
        "{origin}: no embedded store at {}: no such directory",
        dir.display()
    );
    let store = EmbeddedStore::open(dir)
        .map_err(|e| anyhow::anyhow!("{origin}: embedded store at {}: {e}", dir.display()))?;
    Ok(Target {
        store: Arc::new(store),
        kind: "embedded",
        spreading,
        origin,
        schedules: None,
    })
}

/// The etcd or postgres store (`kind`) of `cfg` and its buckets (for the
/// schedules), opened as `baton run` opens them; errors start with
/// `origin`.
pub(super) async fn open_remote(
    cfg: &Config,
    kind: &'static str,
    kubeconfig_given: bool,
    file: &str,
    origin: String,
    spreading: Spreading,
) -> anyhow::Result<Target> {
    anyhow::ensure!(
        !kubeconfig_given,
        "--kubeconfig (or BATON_KUBECONFIG) applies to a kubernetes store, but {file} uses an {kind} store"
    );
    let (store, buckets) = crate::daemon::open_stores(cfg)
        .await
        .map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    let schedules = cfg
        .plugins
        .iter()
        .any(|p| p.schedule.is_some())
        .then(|| (cfg.clone(), buckets));
    Ok(Target {
        store,
        kind,
        spreading,
        origin,
        schedules,
    })
}
