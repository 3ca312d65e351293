//! Route labels: while this host leads a lease with `route-label = true`,
//! its pod carries the label [`route_label`]`(lease) = "true"`, so that a
//! Service selecting it sends traffic only to the leader
//! (docs/kubernetes.md, "Traffic only to the leader").
//!
//! One [`LeaseRoute`] per such lease does every label request of it, one
//! at a time (a lock), on the election runtime:
//!
//! - **At start** the labelled pods are listed once (a missing Role rule
//!   is said at once, and the connection is open when a term begins).
//! - **A term begins** ([`follow`] sees this host lead): first the label
//!   is taken off every other pod still carrying it (a host that died
//!   leaves one), then put on this pod; both only while the term is not
//!   over. The same again every [`RECHECK`] while the term lasts.
//! - **A term ends**: once its tasks are gone the label is taken off this
//!   pod, before the lease is released (the elector awaits
//!   [`BeforeRelease`], bounded; a release is delayed a request timeout at
//!   most, never prevented), or, if the lease was lost, as soon as they
//!   are gone.
//!
//! A failed request is logged and counted; nothing waits for it, and
//! readiness never depends on it: the next leader removes what is left.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use tokio::time::timeout;

use super::error::ServeError;
use crate::config::{Config, StoreConfig};
use crate::election::{BeforeRelease, LeaseView, Term};
use crate::ops::metrics::Metrics;
use crate::store::kube::pod_label::{PodLabels, ROUTE_LABEL_VALUE, route_label};

/// How often a leader checks that its pod alone carries the label.
pub(super) const RECHECK: Duration = Duration::from_secs(5);

/// The pod this host runs in, `(namespace, name)`, if a lease asks for a
/// route label: `[store] pod` and `pod-namespace`, else the environment's
/// `POD_NAME` and `POD_NAMESPACE` (the downward API); no namespace means
/// the store's. An error names the lease and what is missing.
pub(super) fn own_pod(config: &Config) -> Result<Option<(Option<String>, String)>, ServeError> {
    let Some(lease) = config.leases.iter().find(|l| l.route_label) else {
        return Ok(None);
    };
    let StoreConfig::Kubernetes {
        pod, pod_namespace, ..
    } = &config.store
    else {
        return Ok(None);
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let Some(name) = pod.clone().or_else(|| env("POD_NAME")) else {
        return Err(ServeError::Store(format!(
            "lease {:?} has route-label = true, and this host's pod is unknown: set the POD_NAME \
             environment variable (the downward API's metadata.name) or `[store] pod`",
            lease.name
        )));
    };
    Ok(Some((
        pod_namespace.clone().or_else(|| env("POD_NAMESPACE")),
        name,
    )))
}

/// The route label of one lease on this host's pod; see the [module
/// documentation](self).
pub(super) struct LeaseRoute {
    lease: String,
    key: String,
    pod: PodLabels,
    /// The bound on each request (the lease's request timeout).
    bound: Duration,
    metrics: Option<Arc<Metrics>>,
    /// The term whose label may be on this pod: set before the request
    /// that puts it there, cleared when a removal is confirmed.
    labelled: Mutex<Option<u64>>,
}

impl LeaseRoute {
    /// The route label of `lease` on `pod`, each request bounded by
    /// `bound`. Logs the key.
    pub(super) fn new(
        lease: &str,
        pod: PodLabels,
        bound: Duration,
        metrics: Option<Arc<Metrics>>,
    ) -> LeaseRoute {
        let key = route_label(lease);
        tracing::info!(lease, label = %format!("{key}={ROUTE_LABEL_VALUE}"), pod = ?pod, "the leader's pod carries this label");
        LeaseRoute {
            lease: lease.to_owned(),
            key,
            pod,
            bound,
            metrics,
            labelled: Mutex::new(None),
        }
    }

    fn failed(&self, what: &str, error: &dyn std::fmt::Display) {
        tracing::warn!(lease = %self.lease, label = %self.key, error = %error, "{what} failed; the next leader or check removes what is left");
        if let Some(m) = &self.metrics {
            m.route_label_error(&self.lease);
        }
    }

    /// While `term` lasts: the label off every other pod, then on this one
    /// (again, if `quiet`, without saying so unless something changed).
    async fn claim(&self, term: &Arc<Term>, quiet: bool) {
        let mut labelled = self.labelled.lock().await;
        if term.is_over() {
            return;
        }
        let leading = || !term.is_over();
        match timeout(
            self.bound * 2,
            self.pod.clear_others(&self.lease, &self.key, leading),
        )
        .await
        {
            Ok(Ok(removed)) if !removed.is_empty() => {
                tracing::info!(lease = %self.lease, term = term.number(), label = %self.key, pods = ?removed, "removed the route label from other pods");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.failed("removing the route label from other pods", &e),
            Err(_) => self.failed("removing the route label from other pods", &"timed out"),
        }
        if term.is_over() || (quiet && *labelled == Some(term.number())) {
            return;
        }
        *labelled = Some(term.number());
        match timeout(self.bound, self.pod.set_own(&self.lease, &self.key, true)).await {
            Ok(Ok(())) => {
                tracing::info!(lease = %self.lease, term = term.number(), label = %self.key, "labelled this pod: traffic routes here");
            }
            Ok(Err(e)) => self.failed("labelling this pod", &e),
            Err(_) => self.failed("labelling this pod", &"timed out"),
        }
    }

    /// Lists the pods carrying the label once, at start: a Role without
    /// the pods rule is said at once, not at the first term, and the
    /// connection is open when a term begins.
    async fn check(&self) {
        match timeout(self.bound, self.pod.carrying(&self.lease, &self.key)).await {
            Ok(Ok(pods)) => {
                let pods: Vec<String> = pods.into_iter().filter_map(|p| p.metadata.name).collect();
                tracing::debug!(lease = %self.lease, label = %self.key, ?pods, "pods carrying the route label");
            }
            Ok(Err(e)) => self.failed("listing the pods carrying the route label", &e),
            Err(_) => self.failed("listing the pods carrying the route label", &"timed out"),
        }
    }

    /// The label off this pod, if a term may have put it there.
    async fn release(&self, term: u64) {
        let mut labelled = self.labelled.lock().await;
        if labelled.is_none() {
            return;
        }
        match timeout(self.bound, self.pod.set_own(&self.lease, &self.key, false)).await {
            Ok(Ok(())) => {
                *labelled = None;
                tracing::info!(lease = %self.lease, term, label = %self.key, "removed the route label from this pod");
            }
            Ok(Err(e)) => self.failed("removing the route label from this pod", &e),
            Err(_) => self.failed("removing the route label from this pod", &"timed out"),
        }
    }
}

#[async_trait::async_trait]
impl BeforeRelease for LeaseRoute {
    async fn before_release(&self, _lease: &str, term: u64) {
        self.release(term).await;
    }
}

/// Follows the lease's `view` until its elector is gone: labels this pod
/// for each term this host leads, and takes the label off once the term's
/// tasks are gone (if the elector's release did not already).
pub(super) async fn follow(route: Arc<LeaseRoute>, mut view: watch::Receiver<LeaseView>) {
    let mut last = 0;
    route.check().await;
    loop {
        let term = view.borrow_and_update().term.clone();
        if let Some(term) = term.filter(|t| t.number() != last) {
            last = term.number();
            route.claim(&term, false).await;
            loop {
                tokio::select! {
                    () = term.drained() => break,
                    () = tokio::time::sleep(RECHECK) => route.claim(&term, true).await,
                }
            }
            route.release(last).await;
            continue;
        }
        if view.changed().await.is_err() {
            return;
        }
    }
}

/// What the leases with route labels share: this host's pod, and the
/// metrics their failures are counted in.
pub(super) struct Routing {
    pod: PodLabels,
    metrics: Option<Arc<Metrics>>,
}

impl Routing {
    /// The route label of `lease`, each request bounded by `bound`.
    pub(super) fn route(&self, lease: &str, bound: Duration) -> Arc<LeaseRoute> {
        Arc::new(LeaseRoute::new(
            lease,
            self.pod.clone(),
            bound,
            self.metrics.clone(),
        ))
    }
}

/// The routing of `config`'s leases, if one asks for a route label: a
/// client of the Kubernetes store built on the `election` runtime (where
/// its requests run; none is made yet). An error if the pod is unknown.
pub(super) async fn routing(
    config: &Config,
    election: &tokio::runtime::Handle,
    metrics: Option<Arc<Metrics>>,
) -> Result<Option<Routing>, ServeError> {
    let Some((namespace, pod)) = own_pod(config)? else {
        return Ok(None);
    };
    let config = config.clone();
    let store = election
        .spawn(async move { super::stores::open_kube(&config).await })
        .await
        .map_err(|e| ServeError::Store(format!("opening the store for route labels failed: {e}")))??;
    Ok(Some(Routing {
        pod: store.pod_labels(namespace.as_deref(), &pod),
        metrics,
    }))
}

/// The leases of `config` with route labels, for reloads (a change needs a
/// restart).
pub(super) fn routed(config: &Config) -> Vec<&str> {
    config
        .leases
        .iter()
        .filter(|l| l.route_label)
        .map(|l| l.name.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(text, None).unwrap()
    }

    #[test]
    fn the_pod_is_looked_for_only_when_a_lease_asks_and_then_must_be_known() {
        let kube = "[store]\nkind = \"kubernetes\"\nnamespace = \"ns\"\n";
        let plain = parse(&format!("{kube}[[lease]]\nname = \"a\"\n"));
        assert!(own_pod(&plain).unwrap().is_none());
        let named = parse(&format!(
            "{kube}pod = \"p-0\"\npod-namespace = \"apps\"\n[[lease]]\nname = \"a\"\nroute-label = true\n"
        ));
        assert_eq!(
            own_pod(&named).unwrap(),
            Some((Some("apps".into()), "p-0".into()))
        );
        assert_eq!(routed(&named), ["a"]);
        // Turning it on or off needs a restart (the pod is found at start).
        let fixed = super::super::reload::Fixed {
            memory_reservation: None,
            pool_slots: None,
            cache_dir: std::path::PathBuf::new(),
            control_socket: None,
        };
        let why = super::super::reload::needs_restart(&plain, &named, &fixed);
        assert!(why.iter().any(|w| w.contains("route-label")), "{why:?}");
        // Without `pod`, POD_NAME (not set where the tests run).
        if std::env::var_os("POD_NAME").is_none() {
            let unknown = parse(&format!("{kube}[[lease]]\nname = \"jobs\"\nroute-label = true\n"));
            let e = own_pod(&unknown).unwrap_err().to_string();
            assert!(
                e.contains("lease \"jobs\" has route-label = true")
                    && e.contains("POD_NAME")
                    && e.contains("[store] pod"),
                "{e}"
            );
        }
    }
}
