//! Resolving a reference to a manifest digest and pulling its component
//! into the cache ([`Registry::pull`]), with its signature checked when a
//! key is required.
//!
//! Invariants: a reference pinned by digest whose component is cached
//! asks the registry nothing; a tag asks once per pull, and if the
//! registry cannot be reached (down, slow) runs the digest it last
//! resolved to here, with [`Pulled::stale`] saying why; every byte used
//! was checked against the digest it was asked for.

use std::path::PathBuf;

use oci_client::manifest::{
    OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest,
};

use super::cache::Cache;
use super::client::{Connection, PullError, Settings};
use super::reference::Reference;
use super::sign::{self, VerifyKey};

/// The media type of a component layer (what `wkg`, `oci-wasm` and `baton
/// push` write).
pub const WASM_LAYER: &str = "application/wasm";

/// The media type of a component's config (the same tools).
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";

/// The layer media type of the older `wasm-to-oci` layout, also accepted
/// (with [`WASM_CONFIG_OLD`] only).
pub const WASM_LAYER_OLD: &str = oci_client::manifest::WASM_LAYER_MEDIA_TYPE;

/// The config media type of the older `wasm-to-oci` layout (with
/// [`WASM_LAYER_OLD`] only).
pub const WASM_CONFIG_OLD: &str = oci_client::manifest::WASM_CONFIG_MEDIA_TYPE;

/// A Spin application's locked app: its config up to Spin 1.5, a layer
/// (beside an image config) since Spin 2.0. Refused, as `wkg` refuses it.
pub const SPIN_APPLICATION: &str = "application/vnd.fermyon.spin.application.v1+config";

/// The layouts of one component: a config's media type and its one layer's.
const LAYOUTS: [(&str, &str); 2] = [(WASM_CONFIG, WASM_LAYER), (WASM_CONFIG_OLD, WASM_LAYER_OLD)];

/// Manifests asked for.
const ACCEPTED: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
];

/// A component in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    /// The reference as configured.
    pub reference: Reference,
    /// The manifest's digest: what runs.
    pub digest: String,
    /// The component's file in the cache.
    pub component: PathBuf,
    /// Whether the registry was asked.
    pub asked: bool,
    /// Why the registry could not be asked, when a tag's last known digest
    /// runs instead.
    pub stale: Option<String>,
}

/// The registries, as [`Settings`] say.
#[derive(Clone, Debug)]
pub struct Registry {
    settings: Settings,
    cache: Cache,
}

impl Registry {
    /// Registries under `settings`.
    pub fn new(settings: Settings) -> Registry {
        Registry {
            cache: settings.cache(),
            settings,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The digest `reference` points to now, asking the registry (a HEAD
    /// of the manifest) unless it is pinned.
    pub async fn resolve(&self, reference: &Reference) -> Result<String, PullError> {
        if let Some(d) = reference.digest() {
            return Ok(d);
        }
        let c = Connection::open(&self.settings, reference)?;
        let auth = c.auth(reference);
        c.call(reference, c.client.fetch_manifest_digest(&reference.oci(), &auth))
            .await
    }

    /// The component of `reference` in the cache, pulled if need be, and
    /// its signature verified with `key` if one is required.
    pub async fn pull(&self, reference: &Reference, key: Option<&VerifyKey>) -> Result<Pulled, PullError> {
        if let Some(digest) = reference.digest()
            && let Some(pulled) = self.cached(reference, &digest, key, None)
        {
            return Ok(pulled);
        }
        let c = Connection::open(&self.settings, reference)?;
        let asked = self.fetch_manifest(&c, reference).await;
        let (digest, raw, manifest) = match asked {
            Ok(found) => found,
            // A tag the registry cannot be asked about now: its last digest.
            Err(e) if e.is_unavailable() && !reference.is_pinned() => {
                let last = self.cache.tag(reference);
                return last
                    .and_then(|d| self.cached(reference, &d, key, Some(e.to_string())))
                    .ok_or(e);
            }
            Err(e) => return Err(e),
        };
        let layer = component_layer(reference, &manifest)?;
        let component = match self.cache.checked_blob(&layer.digest) {
            Some(path) => path,
            None => self.fetch_blob(&c, reference, &layer).await?,
        };
        if let Some(key) = key {
            self.verify(&c, reference, &digest, key).await?;
        }
        let store = |r: Result<(), _>| {
            r.map_err(|error| PullError::Cache {
                reference: reference.clone(),
                error,
            })
        };
        store(self.cache.put_manifest(&digest, &raw))?;
        if reference.tag().is_some() {
            store(self.cache.set_tag(reference, &digest))?;
        }
        Ok(Pulled {
            reference: reference.clone(),
            digest,
            component,
            asked: true,
            stale: None,
        })
    }

    /// The component of the manifest `digest`, if everything it needs is
    /// cached: the manifest, its component, and a verification with `key`.
    fn cached(
        &self,
        reference: &Reference,
        digest: &str,
        key: Option<&VerifyKey>,
        stale: Option<String>,
    ) -> Option<Pulled> {
        let manifest: OciImageManifest = serde_json::from_slice(&self.cache.manifest(digest)?).ok()?;
        let layer = component_layer(reference, &manifest).ok()?;
        let component = self.cache.checked_blob(&layer.digest)?;
        if let Some(key) = key
            && !self.cache.is_verified(reference, digest, &key.fingerprint())
        {
            return None;
        }
        Some(Pulled {
            reference: reference.clone(),
            digest: digest.to_owned(),
            component,
            asked: false,
            stale,
        })
    }

    /// The manifest `reference` names: its digest (checked against the
    /// reference's, if pinned), its bytes, and what they say.
    async fn fetch_manifest(
        &self,
        c: &Connection,
        reference: &Reference,
    ) -> Result<(String, bytes::Bytes, OciImageManifest), PullError> {
        let auth = c.auth(reference);
        let (bytes, digest) = c
            .call(
                reference,
                c.client.pull_manifest_raw(&reference.oci(), &auth, ACCEPTED),
            )
            .await?;
        if let Some(pinned) = reference.digest()
            && pinned != digest
        {
            return Err(PullError::DigestMismatch {
                reference: reference.clone(),
                detail: format!("the registry served a manifest whose digest is {digest}"),
            });
        }
        let actual = super::cache::sha256(&bytes);
        if actual != digest {
            return Err(PullError::DigestMismatch {
                reference: reference.clone(),
                detail: format!("the manifest served as {digest} hashes to {actual}"),
            });
        }
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| PullError::NotAComponent {
                reference: reference.clone(),
                what: format!("its manifest is not JSON ({e})"),
            })?;
        if value.get("manifests").is_some() {
            return Err(PullError::NotAComponent {
                reference: reference.clone(),
                what: format!("an image index ({OCI_IMAGE_INDEX_MEDIA_TYPE}), not one component's manifest"),
            });
        }
        let manifest = serde_json::from_value(value).map_err(|e| PullError::NotAComponent {
            reference: reference.clone(),
            what: format!("not an image manifest ({e})"),
        })?;
        Ok((digest, bytes, manifest))
    }

    /// Pulls `layer` into the cache.
    async fn fetch_blob(
        &self,
        c: &Connection,
        reference: &Reference,
        layer: &OciDescriptor,
    ) -> Result<PathBuf, PullError> {
        let mut bytes: Vec<u8> = Vec::with_capacity(usize::try_from(layer.size).unwrap_or(0).min(1 << 28));
        c.call(reference, c.client.pull_blob(&reference.oci(), layer, &mut bytes))
            .await?;
        self.cache
            .put_blob(&layer.digest, &bytes)
            .map_err(|error| match error {
                super::cache::CacheError::Mismatch { .. } => PullError::DigestMismatch {
                    reference: reference.clone(),
                    detail: format!("the component layer: {error}"),
                },
                error => PullError::Cache {
                    reference: reference.clone(),
                    error,
                },
            })
    }

    /// Checks that a signature of `digest` by `key` is in the registry
    /// (`sha256-HEX.sig`), and remembers it.
    async fn verify(
        &self,
        c: &Connection,
        reference: &Reference,
        digest: &str,
        key: &VerifyKey,
    ) -> Result<(), PullError> {
        if self.cache.is_verified(reference, digest, &key.fingerprint()) {
            return Ok(());
        }
        let unsigned = |why: String| PullError::Unsigned {
            reference: reference.clone(),
            key: key.file.display().to_string(),
            why,
        };
        let sig_ref = reference.tagged(&sign::signature_tag(digest));
        let auth = c.auth(&sig_ref);
        let (bytes, _) = match c
            .call(
                &sig_ref,
                c.client.pull_manifest_raw(&sig_ref.oci(), &auth, ACCEPTED),
            )
            .await
        {
            Ok(found) => found,
            Err(PullError::NotFound { .. }) => {
                return Err(unsigned(format!(
                    "it is not signed (no {})",
                    sign::signature_tag(digest)
                )));
            }
            Err(e) => return Err(e),
        };
        let manifest: OciImageManifest =
            serde_json::from_slice(&bytes).map_err(|e| unsigned(format!("the signature's manifest: {e}")))?;
        let mut tried = 0;
        for layer in manifest
            .layers
            .iter()
            .filter(|l| l.media_type == sign::PAYLOAD_MEDIA_TYPE)
        {
            let Some(signature) = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(sign::SIGNATURE_ANNOTATION))
            else {
                continue;
            };
            tried += 1;
            let mut payload = Vec::new();
            c.call(&sig_ref, c.client.pull_blob(&sig_ref.oci(), layer, &mut payload))
                .await?;
            if key.verifies(&payload, signature) && sign::signed_digest(&payload).as_deref() == Some(digest) {
                let _ = self.cache.set_verified(reference, digest, &key.fingerprint());
                return Ok(());
            }
        }
        Err(unsigned(format!(
            "none of its {tried} signature(s) in {} verifies",
            sign::signature_tag(digest)
        )))
    }
}

/// The one component layer of `manifest`, or what it is instead: exactly
/// one layer, in one of the [`LAYOUTS`] (its config's media type checked
/// too, as `wkg` checks it).
fn component_layer(reference: &Reference, manifest: &OciImageManifest) -> Result<OciDescriptor, PullError> {
    let config = manifest.config.media_type.as_str();
    if let [one] = manifest.layers.as_slice()
        && LAYOUTS.contains(&(config, one.media_type.as_str()))
    {
        return Ok(one.clone());
    }
    let types: Vec<&str> = manifest.layers.iter().map(|l| l.media_type.as_str()).collect();
    let layers = format!("layers [{}]", types.join(", "));
    let expected = format!(
        "a component is one layer of {WASM_LAYER} with a config of {WASM_CONFIG} \
         (or of {WASM_LAYER_OLD} with {WASM_CONFIG_OLD})"
    );
    let reference = reference.clone();
    if config == SPIN_APPLICATION {
        return Err(PullError::SpinApplication {
            reference,
            mark: format!("config {config}"),
            layout: format!("{layers}; {expected}"),
        });
    }
    if types.contains(&SPIN_APPLICATION) {
        return Err(PullError::SpinApplication {
            reference,
            mark: format!("layer {SPIN_APPLICATION}"),
            layout: format!("config {config}, {layers}; {expected}"),
        });
    }
    Err(PullError::NotAComponent {
        reference,
        what: format!("config {config}, {layers}; {expected}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(config: &str, layers: &[&str]) -> OciImageManifest {
        let layers: Vec<serde_json::Value> = layers
            .iter()
            .map(|m| serde_json::json!({"mediaType": m, "digest": format!("sha256:{}", "1".repeat(64)), "size": 1}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": config, "digest": format!("sha256:{}", "2".repeat(64)), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn one_wasm_layer_is_a_component_and_anything_else_is_named() {
        let r = Reference::parse("oci://r.io/x:1").unwrap();
        assert!(component_layer(&r, &manifest(WASM_CONFIG, &[WASM_LAYER])).is_ok());
        assert!(component_layer(&r, &manifest(WASM_CONFIG_OLD, &[WASM_LAYER_OLD])).is_ok());
        let image = manifest(
            "application/vnd.oci.image.config.v1+json",
            &["application/vnd.oci.image.layer.v1.tar+gzip"],
        );
        let e = component_layer(&r, &image).unwrap_err().to_string();
        assert!(
            e.contains("oci://r.io/x:1")
                && e.contains("not a WebAssembly component")
                && e.contains("tar+gzip"),
            "{e}"
        );
        assert!(component_layer(&r, &manifest(WASM_CONFIG, &[WASM_LAYER, WASM_LAYER])).is_err());
    }

    #[test]
    fn only_the_two_layouts_with_one_layer_are_components() {
        let r = Reference::parse("oci://r.io/x:1").unwrap();
        let refused = [
            // The layouts mixed: `wkg` takes neither.
            manifest(WASM_CONFIG, &[WASM_LAYER_OLD]),
            manifest(WASM_CONFIG_OLD, &[WASM_LAYER]),
            // ORAS's default config (`oras push f.wasm:application/wasm`).
            manifest("application/vnd.oci.empty.v1+json", &[WASM_LAYER]),
            manifest("application/vnd.unknown.config.v1+json", &[WASM_LAYER]),
            // One component layer beside another.
            manifest(
                WASM_CONFIG,
                &[WASM_LAYER, "application/vnd.wasm.content.layer.v1+data"],
            ),
            manifest(WASM_CONFIG, &[]),
        ];
        for m in refused {
            let e = component_layer(&r, &m).unwrap_err();
            assert!(matches!(e, PullError::NotAComponent { .. }), "{e}");
            let e = e.to_string();
            assert!(
                e.starts_with("oci://r.io/x:1: not a WebAssembly component: config ")
                    && e.contains(&format!(
                        "a component is one layer of {WASM_LAYER} with a config of {WASM_CONFIG}"
                    )),
                "{e}"
            );
        }
    }

    #[test]
    fn a_spin_application_is_named_as_one() {
        let r = Reference::parse("oci://r.io/spin:1").unwrap();
        // Spin 1: the locked app as the config, one component.
        let e = component_layer(&r, &manifest(SPIN_APPLICATION, &[WASM_LAYER_OLD]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "oci://r.io/spin:1: a Spin application (config {SPIN_APPLICATION}), not a component: \
                 layers [{WASM_LAYER_OLD}]; a component is one layer of {WASM_LAYER}"
            )),
            "{e}"
        );
        // Spin 1 with static files, and a Spin config over a wkg layer.
        for layers in [
            &[WASM_LAYER_OLD, "application/vnd.wasm.content.layer.v1+data"][..],
            &[WASM_LAYER],
        ] {
            let e = component_layer(&r, &manifest(SPIN_APPLICATION, layers)).unwrap_err();
            assert!(matches!(e, PullError::SpinApplication { .. }), "{e}");
        }
        // Spin 2: an image config, the locked app as the last layer.
        let spin2 = manifest(
            "application/vnd.oci.image.config.v1+json",
            &[WASM_LAYER_OLD, SPIN_APPLICATION],
        );
        let e = component_layer(&r, &spin2).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "oci://r.io/spin:1: a Spin application (layer {SPIN_APPLICATION}), not a component: \
                 config application/vnd.oci.image.config.v1+json, layers [{WASM_LAYER_OLD}, {SPIN_APPLICATION}]"
            )),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_pinned_cached_reference_asks_no_registry() {
        let dir = tempfile::tempdir().unwrap();
        // A registry nobody answers for: any request would fail.
        let mut settings = Settings::with_cache(dir.path().to_path_buf());
        settings.plain_http = vec!["127.0.0.1:9".into()];
        let registry = Registry::new(settings);
        let component = b"\0asm\x0d\x00\x01\x00".to_vec();
        let layer = super::super::cache::sha256(&component);
        registry.cache().put_blob(&layer, &component).unwrap();
        let m = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": WASM_CONFIG, "digest": format!("sha256:{}", "2".repeat(64)), "size": 2},
            "layers": [{"mediaType": WASM_LAYER, "digest": layer, "size": component.len()}],
        }))
        .unwrap();
        let digest = super::super::cache::sha256(&m);
        registry.cache().put_manifest(&digest, &m).unwrap();
        let r = Reference::parse(&format!("oci://127.0.0.1:9/x@{digest}")).unwrap();
        let pulled = registry.pull(&r, None).await.unwrap();
        assert!(!pulled.asked && pulled.stale.is_none());
        assert_eq!(std::fs::read(&pulled.component).unwrap(), component);
        // A Spin application cached under a pinned digest is not run from
        // the cache: the registry is asked, and its answer refuses it.
        let spin = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": SPIN_APPLICATION, "digest": format!("sha256:{}", "2".repeat(64)), "size": 2},
            "layers": [{"mediaType": WASM_LAYER_OLD, "digest": layer, "size": component.len()}],
        }))
        .unwrap();
        let spin_digest = super::super::cache::sha256(&spin);
        registry.cache().put_manifest(&spin_digest, &spin).unwrap();
        let pinned_spin = Reference::parse(&format!("oci://127.0.0.1:9/x@{spin_digest}")).unwrap();
        let e = registry.pull(&pinned_spin, None).await.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        // A tag whose registry is down and was never pulled here: named.
        let tag = Reference::parse("oci://127.0.0.1:9/x:1").unwrap();
        let e = registry.pull(&tag, None).await.unwrap_err();
        assert!(
            e.is_unavailable() && e.to_string().contains("oci://127.0.0.1:9/x:1"),
            "{e}"
        );
        // Once resolved here, its last digest runs while the registry is down.
        registry.cache().set_tag(&tag, &digest).unwrap();
        let stale = registry.pull(&tag, None).await.unwrap();
        assert_eq!(stale.digest, digest);
        assert!(stale.stale.is_some());
    }
}
