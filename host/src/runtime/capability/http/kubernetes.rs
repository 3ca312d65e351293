//! The Kubernetes API through the host, without the credentials.
//!
//! A plugin with a `kubernetes` grant sends ordinary `wasi:http` requests to
//! the virtual origin `http://kubernetes.baton` ([`KUBERNETES_ORIGIN`]). The
//! host checks each against the grant's rules (verb, API group, resource,
//! namespace), refuses anything else before it leaves the host, and
//! forwards the rest to the API server with its own client: its kubeconfig
//! (the grant's, or `KUBECONFIG`, `~/.kube/config`, the pod's service
//! account), its TLS settings and its credentials. The guest never sees a
//! token or a certificate: it sends no `Authorization`, and any
//! `Authorization`, `Impersonate-*` or `Baton-*` header it sets is removed.
//! The API server's RBAC still applies on top of the grant.
//!
//! The host adds `Baton-Lease` and `Baton-Term` as for any request (the API
//! server ignores them; they show in its audit log). To fence writes to
//! objects, a guest writes its term into the object and updates with the
//! `resourceVersion` it read: see `docs/fencing.md`.
//!
//! Requests are classified as the API server's authorizer does: `GET` of a
//! named object is `get`, of a collection `list` (`watch` with `watch=true`
//! or `watch=1`), `POST` is `create`, `PUT` `update`, `PATCH` `patch`,
//! `DELETE` of a named object `delete`, of a collection `deletecollection`.
//! Only resource requests (`/api/v1/...`, `/apis/GROUP/VERSION/...`) are
//! forwarded; discovery and other paths are refused.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use http::Method;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;
use tower::{ServiceBuilder, ServiceExt};

use crate::runtime::capability::unit::{GrantError, GrantSite};
use crate::runtime::fence::connections::Connections;

/// The authority of the virtual origin: `http://kubernetes.baton`.
pub const KUBERNETES_ORIGIN: &str = "kubernetes.baton";

/// One rule of a `kubernetes` grant: a request is allowed if its verb, API
/// group, resource and namespace are each listed (`*`: any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeRule {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`.
    pub verbs: Vec<String>,
    /// API groups; `""` is the core group (ConfigMaps, Secrets, Pods).
    pub groups: Vec<String>,
    /// Resources (plural, lowercase), or `resource/subresource`.
    pub resources: Vec<String>,
    /// Namespaces; cluster-scoped requests need `*`.
    pub namespaces: Vec<String>,
}

impl KubeRule {
    /// Whether the rule allows `request`.
    pub fn allows(&self, request: &ApiRequest) -> bool {
        let has = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
        has(&self.verbs, request.verb)
            && has(&self.groups, &request.group)
            && has(&self.resources, &request.resource)
            && match &request.namespace {
                Some(ns) => has(&self.namespaces, ns),
                None => self.namespaces.iter().any(|n| n == "*"),
            }
    }
}

/// The verbs a `kubernetes` grant's rule may name.
pub const VERBS: [&str; 9] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "*",
];

/// A `kubernetes` grant, as written.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RawKubeGrant {
    kubeconfig: Option<PathBuf>,
    term_headers: Option<bool>,
    allow: Vec<RawKubeRule>,
}

/// One of its rules, as written.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawKubeRule {
    verbs: Vec<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    namespaces: Vec<String>,
}

impl RawKubeGrant {
    /// The grant: every rule's verbs known and its lists not empty; the
    /// kubeconfig relative to the configuration's folder.
    pub fn grant(self, site: &GrantSite<'_>) -> Result<KubeGrant, GrantError> {
        let mut rules = Vec::new();
        for (i, r) in self.allow.into_iter().enumerate() {
            if let Some(v) = r.verbs.iter().find(|v| !VERBS.contains(&v.as_str())) {
                let why = format!("{v:?} is not a verb: use {}", VERBS.join(", "));
                return Err(site.error(format!("kubernetes.allow[{i}].verbs"), why));
            }
            for (what, list) in [
                ("verbs", &r.verbs),
                ("groups", &r.groups),
                ("resources", &r.resources),
                ("namespaces", &r.namespaces),
            ] {
                if list.is_empty() {
                    let why = "empty, which allows nothing (`\"*\"` allows any; the core group is `\"\"`)";
                    return Err(site.error(format!("kubernetes.allow[{i}].{what}"), why));
                }
            }
            rules.push(KubeRule {
                verbs: r.verbs,
                groups: r.groups,
                resources: r.resources,
                namespaces: r.namespaces,
            });
        }
        Ok(KubeGrant {
            rules,
            kubeconfig: self.kubeconfig.as_deref().map(|p| site.resolve(p)),
            term_headers: self.term_headers.unwrap_or(true),
        })
    }
}

/// A plugin's `kubernetes` grant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeGrant {
    /// What the plugin may do.
    pub rules: Vec<KubeRule>,
    /// The kubeconfig of the host's client; default: `KUBECONFIG`,
    /// `~/.kube/config` or the pod's service account.
    pub kubeconfig: Option<PathBuf>,
    /// Whether requests carry `Baton-Lease` and `Baton-Term` (default on).
    pub term_headers: bool,
}

/// Why the host has no client of the Kubernetes API for a plugin.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    /// The grant's kubeconfig cannot be read.
    #[error("cannot read the kubeconfig {}: {error}", path.display())]
    UnreadableKubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What reading it said.
        error: kube::config::KubeconfigError,
    },
    /// The grant's kubeconfig cannot be used.
    #[error("kubeconfig {}: {error}", path.display())]
    BadKubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What using it said.
        error: kube::config::KubeconfigError,
    },
    /// No kubeconfig and no service account (the grant names none).
    #[error("no Kubernetes client configuration: {0}")]
    NoConfiguration(kube::config::InferConfigError),
    /// The client cannot be built from the configuration.
    #[error("cannot build the Kubernetes client: {0}")]
    Build(kube::Error),
}

/// A `kubernetes` grant with its client configuration, read at the first
/// request and shared by every instance of the plugin. Each instance gets
/// a client of its own ([`KubeAccess::client_for`]), whose connections are
/// the instance's: reset at its force-stop with every other connection of
/// it, so no request of a term is still being sent after it.
pub struct KubeAccess {
    pub(crate) grant: KubeGrant,
    config: OnceCell<kube::Config>,
}

impl std::fmt::Debug for KubeAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAccess")
            .field("grant", &self.grant)
            .field("configured", &self.config.initialized())
            .finish()
    }
}

impl KubeAccess {
    /// The grant, without a client configuration yet.
    pub fn new(grant: KubeGrant) -> Arc<KubeAccess> {
        Arc::new(KubeAccess {
            grant,
            config: OnceCell::new(),
        })
    }

    /// The host's client configuration, read on first use.
    async fn config(&self) -> Result<&kube::Config, KubeClientError> {
        self.config
            .get_or_try_init(|| async {
                match &self.grant.kubeconfig {
                    Some(path) => {
                        let kc = kube::config::Kubeconfig::read_from(path).map_err(|error| {
                            KubeClientError::UnreadableKubeconfig {
                                path: path.clone(),
                                error,
                            }
                        })?;
                        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                            .await
                            .map_err(|error| KubeClientError::BadKubeconfig {
                                path: path.clone(),
                                error,
                            })
                    }
                    None => kube::Config::infer()
                        .await
                        .map_err(KubeClientError::NoConfiguration),
                }
            })
            .await
    }

    /// A client with the host's credentials whose every connection joins
    /// `connections` (its send buffer bounded, reset at the force-stop).
    pub(crate) async fn client_for(
        &self,
        connections: &Connections,
    ) -> Result<kube::Client, KubeClientError> {
        use kube::client::ConfigExt;
        let config = self.config().await?;
        let built = KubeClientError::Build;
        let joined = connections.clone();
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        let tcp = tcp.map_response(move |io: TokioIo<TcpStream>| {
            joined.add(io.inner().as_raw_fd());
            io
        });
        let https = config.rustls_https_connector_with_connector(tcp).map_err(built)?;
        let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
        let service = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer().map_err(built)?)
            .layer(config.extra_headers_layer().map_err(built)?)
            .map_err(tower::BoxError::from)
            .service(hyper);
        Ok(kube::Client::new(service, config.default_namespace.clone()))
    }

    /// The first rule that allows `request`.
    pub fn allows(&self, request: &ApiRequest) -> bool {
        self.grant.rules.iter().any(|r| r.allows(request))
    }
}

/// What a request asks of the API server, as its authorizer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiRequest {
    /// The verb.
    pub verb: &'static str,
    /// The API group (`""`: core).
    pub group: String,
    /// The resource, or `resource/subresource`.
    pub resource: String,
    /// The namespace; `None` for a cluster-scoped request.
    pub namespace: Option<String>,
    /// The object's name, if one is named.
    pub name: Option<String>,
}

impl std::fmt::Display for ApiRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {} ({group})", self.verb, self.resource)?;
        if let Some(name) = &self.name {
            write!(f, " {name:?}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns:?}"),
            None => write!(f, " (cluster-scoped)"),
        }
    }
}

/// Classifies a request by its method, path and query; `None` for a path
/// that is not a resource request.
///
/// ```
/// use baton::runtime::capability::http::kubernetes::classify;
/// use http::Method;
///
/// let r = classify(&Method::PUT, "/api/v1/namespaces/apps/configmaps/settings", None).unwrap();
/// assert_eq!((r.verb, r.group.as_str(), r.resource.as_str()), ("update", "", "configmaps"));
/// assert_eq!((r.namespace.as_deref(), r.name.as_deref()), (Some("apps"), Some("settings")));
///
/// let r = classify(&Method::GET, "/apis/apps/v1/namespaces/apps/deployments", Some("watch=true")).unwrap();
/// assert_eq!((r.verb, r.group.as_str(), r.resource.as_str()), ("watch", "apps", "deployments"));
///
/// let r = classify(&Method::PATCH, "/apis/apps/v1/namespaces/a/deployments/web/status", None).unwrap();
/// assert_eq!((r.verb, r.resource.as_str()), ("patch", "deployments/status"));
///
/// let r = classify(&Method::DELETE, "/api/v1/namespaces/old", None).unwrap();
/// assert_eq!((r.verb, r.resource.as_str(), r.namespace, r.name.as_deref()), ("delete", "namespaces", None, Some("old")));
///
/// assert!(classify(&Method::GET, "/apis", None).is_none());
/// assert!(classify(&Method::GET, "/version", None).is_none());
/// ```
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Option<ApiRequest> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return None;
    }
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, resource, name, sub) = match rest {
        ["namespaces", ns, resource, tail @ ..] => {
            (Some(*ns), *resource, tail.first().copied(), tail.get(1).copied())
        }
        [resource, tail @ ..] if !tail.is_empty() || *resource != "namespaces" => {
            (None, *resource, tail.first().copied(), tail.get(1).copied())
        }
        ["namespaces"] => (None, "namespaces", None, None),
        _ => return None,
    };
    // Deeper paths (proxy subresources' own paths) are not resource requests
    // this classifier understands.
    let depth = match namespace {
        Some(_) => rest.len() - 2,
        None => rest.len(),
    };
    if depth > 3 {
        return None;
    }
    let resource = match sub {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    let watching = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match (method.as_str(), name.is_some()) {
        ("GET" | "HEAD", _) if watching => "watch",
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(ApiRequest {
        verb,
        group: group.to_owned(),
        resource,
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
    })
}
