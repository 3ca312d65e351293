//! The registry client: [`Settings`] (credentials, trusted roots, which
//! registries speak plain HTTP, a timeout, the cache) and [`PullError`],
//! which names the reference and says in one line what went wrong.
//!
//! A client is made for each operation, so that credentials read from a
//! file that changed (a rotated Secret) are used at once; making one costs
//! well under a millisecond next to a registry's round trip.

use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;

use super::auth::{AuthError, Credentials};
use super::cache::{Cache, CacheError};
use super::reference::Reference;

/// How long one registry operation may take, unless configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How often `--watch` asks a registry where a tag points, unless
/// configured; and the least that may be configured.
pub const DEFAULT_POLL: Duration = Duration::from_secs(60);

/// See [`DEFAULT_POLL`].
pub const MIN_POLL: Duration = Duration::from_secs(1);

/// How this host talks to registries (`[registry]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The credentials file; `None`: the usual places ([`super::auth`]).
    pub auth_file: Option<PathBuf>,
    /// A CA certificate (PEM) trusted besides the web's roots.
    pub ca: Option<PathBuf>,
    /// Registries (`host:port`) spoken to over plain HTTP.
    pub plain_http: Vec<String>,
    /// How long one operation (a resolve, a pull, a push) may take.
    pub timeout: Duration,
    /// How often `--watch` re-resolves each tag.
    pub poll: Duration,
    /// The cache of pulled components.
    pub cache_dir: PathBuf,
}

impl Settings {
    /// The defaults, with the cache in `cache_dir`.
    pub fn with_cache(cache_dir: PathBuf) -> Settings {
        Settings {
            auth_file: None,
            ca: None,
            plain_http: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            poll: DEFAULT_POLL,
            cache_dir,
        }
    }

    /// The cache.
    pub fn cache(&self) -> Cache {
        Cache::new(self.cache_dir.clone())
    }
}

/// Why a component could not be resolved, pulled, verified or pushed; each
/// names the reference.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// 401 or 403: no credentials, or the wrong ones.
    #[error("{reference}: the registry refused access (401/403; {credentials})")]
    Unauthorized {
        /// The reference.
        reference: Reference,
        /// Which credentials were presented.
        credentials: String,
    },
    /// 404: no such repository, tag or digest.
    #[error("{reference}: not found in the registry (404{})", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    NotFound {
        /// The reference.
        reference: Reference,
        /// What the registry said.
        detail: Option<String>,
    },
    /// The registry could not be reached, or the TLS handshake failed.
    #[error("{reference}: the registry cannot be reached: {detail}")]
    Unreachable {
        /// The reference.
        reference: Reference,
        /// Why (the whole chain of causes).
        detail: String,
    },
    /// No answer in time.
    #[error("{reference}: the registry did not answer within {}", humantime::format_duration(*timeout))]
    TimedOut {
        /// The reference.
        reference: Reference,
        /// The bound.
        timeout: Duration,
    },
    /// The manifest is not that of one WebAssembly component.
    #[error("{reference}: not a WebAssembly component: {what}")]
    NotAComponent {
        /// The reference.
        reference: Reference,
        /// What it is instead.
        what: String,
    },
    /// The manifest is a Spin application's (its locked app as the config,
    /// Spin 1, or as a layer, Spin 2), not one component's.
    #[error("{reference}: a Spin application ({mark}), not a component: {layout}")]
    SpinApplication {
        /// The reference.
        reference: Reference,
        /// What says it is Spin's: its config's or a layer's media type.
        mark: String,
        /// Its layout, and what a component's is.
        layout: String,
    },
    /// Content does not match the digest it was asked for or served under.
    #[error("{reference}: digest mismatch: {detail}")]
    DigestMismatch {
        /// The reference.
        reference: Reference,
        /// Which digests.
        detail: String,
    },
    /// A signature is required and none verifies.
    #[error("{reference}: signature not verified with key {key}: {why}")]
    Unsigned {
        /// The reference.
        reference: Reference,
        /// The key's file.
        key: String,
        /// Why not.
        why: String,
    },
    /// The credentials file cannot be used.
    #[error("{reference}: {error}")]
    Credentials {
        /// The reference.
        reference: Reference,
        /// Why.
        error: AuthError,
    },
    /// The cache could not keep what was pulled.
    #[error("{reference}: the cache: {error}")]
    Cache {
        /// The reference.
        reference: Reference,
        /// Why.
        error: CacheError,
    },
    /// Anything else the registry or the client said.
    #[error("{reference}: {detail}")]
    Other {
        /// The reference.
        reference: Reference,
        /// What.
        detail: String,
    },
}

impl PullError {
    /// Whether the registry could not be asked at all (down, unreachable,
    /// slow): then a tag's last known digest may still be run.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, PullError::Unreachable { .. } | PullError::TimedOut { .. })
    }
}

/// A connection to the registries under [`Settings`].
pub(super) struct Connection {
    pub(super) client: oci_client::Client,
    credentials: Credentials,
    timeout: Duration,
}

impl Connection {
    /// A client for `settings`, with credentials read now.
    pub(super) fn open(settings: &Settings, reference: &Reference) -> Result<Connection, PullError> {
        static PROVIDER: Once = Once::new();
        PROVIDER.call_once(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
        let credentials =
            Credentials::load(settings.auth_file.as_deref()).map_err(|error| PullError::Credentials {
                reference: reference.clone(),
                error,
            })?;
        let mut roots: Vec<Certificate> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|c| Certificate {
                encoding: CertificateEncoding::Der,
                data: c.to_vec(),
            })
            .collect();
        if let Some(ca) = &settings.ca {
            let data = std::fs::read(ca).map_err(|e| PullError::Other {
                reference: reference.clone(),
                detail: format!("cannot read the registry CA {}: {e}", ca.display()),
            })?;
            roots.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(settings.plain_http.clone()),
            tls_certs_only: roots,
            platform_resolver: None,
            connect_timeout: Some(settings.timeout),
            read_timeout: Some(settings.timeout),
            user_agent: concat!("baton/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        let client = oci_client::Client::try_from(config).map_err(|e| PullError::Other {
            reference: reference.clone(),
            detail: format!("cannot make a registry client: {}", chain(&e)),
        })?;
        Ok(Connection {
            client,
            credentials,
            timeout: settings.timeout,
        })
    }

    /// What to present to `reference`'s registry.
    pub(super) fn auth(&self, reference: &Reference) -> RegistryAuth {
        self.credentials.for_registry(&reference.registry())
    }

    /// `op`, bounded by the timeout, its error classified.
    pub(super) async fn call<T>(
        &self,
        reference: &Reference,
        op: impl Future<Output = Result<T, OciDistributionError>>,
    ) -> Result<T, PullError> {
        match tokio::time::timeout(self.timeout, op).await {
            Err(_) => Err(PullError::TimedOut {
                reference: reference.clone(),
                timeout: self.timeout,
            }),
            Ok(result) => result.map_err(|e| self.classify(reference, e)),
        }
    }

    fn classify(&self, reference: &Reference, e: OciDistributionError) -> PullError {
        let reference = reference.clone();
        let registry = reference.registry();
        let unauthorized = |reference| PullError::Unauthorized {
            reference,
            credentials: match &self.credentials.file {
                Some(f) if self.credentials.has(&registry) => {
                    format!("credentials for {registry} from {}", f.display())
                }
                Some(f) => format!("none for {registry} in {}", f.display()),
                None => "no credentials file found".to_owned(),
            },
        };
        match e {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => unauthorized(reference),
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                let detail = envelope
                    .errors
                    .iter()
                    .map(|e| e.message.clone())
                    .collect::<Vec<_>>()
                    .join("; ");
                if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    unauthorized(reference)
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    PullError::NotFound {
                        reference,
                        detail: Some(detail),
                    }
                } else {
                    PullError::Other { reference, detail }
                }
            }
            OciDistributionError::ServerError { code: 401 | 403, .. } => unauthorized(reference),
            OciDistributionError::ServerError { code: 404, .. }
            | OciDistributionError::ImageManifestNotFoundError(_) => PullError::NotFound {
                reference,
                detail: None,
            },
            OciDistributionError::ServerError { code, message, .. } => PullError::Other {
                reference,
                detail: format!("the registry answered {code}: {}", message.trim()),
            },
            OciDistributionError::DigestError(d) => PullError::DigestMismatch {
                reference,
                detail: d.to_string(),
            },
            OciDistributionError::RequestError(r) if r.is_timeout() => PullError::TimedOut {
                reference,
                timeout: self.timeout,
            },
            OciDistributionError::RequestError(r) => PullError::Unreachable {
                reference,
                detail: chain(&r),
            },
            other => PullError::Other {
                reference,
                detail: chain(&other),
            },
        }
    }
}

/// An error and its causes, one line.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}
