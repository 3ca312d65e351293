//! Publishing a component ([`Registry::push`]): one layer of
//! `application/wasm` and a config of `application/vnd.wasm.config.v0+json`
//! (the layout `wkg` and `oci-wasm` write), and, with a signing key, a
//! cosign signature of the manifest ([`super::sign`]).

use std::collections::BTreeMap;

use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};

use super::cache::sha256;
use super::client::{Connection, PullError};
use super::pull::{Registry, WASM_CONFIG, WASM_LAYER};
use super::reference::Reference;
use super::sign::{self, SigningKey};

/// What a push published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The manifest's digest.
    pub digest: String,
    /// The signature's tag, if signed.
    pub signature: Option<String>,
}

impl Registry {
    /// Publishes `component` (a component's bytes) as `reference` (a tag),
    /// signed with `key` if given.
    pub async fn push(
        &self,
        component: Vec<u8>,
        reference: &Reference,
        key: Option<&SigningKey>,
    ) -> Result<Pushed, PullError> {
        let c = Connection::open(self.settings(), reference)?;
        let auth = c.auth(reference);
        let layer_digest = sha256(&component);
        let config = serde_json::json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer_digest],
            "created": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        });
        let config = Config::new(
            serde_json::to_vec(&config).expect("json"),
            WASM_CONFIG.to_owned(),
            None,
        );
        let layers = [ImageLayer::new(component, WASM_LAYER.to_owned(), None)];
        let mut manifest = OciImageManifest::build(&layers, &config, None);
        manifest.media_type = Some(OCI_IMAGE_MEDIA_TYPE.to_owned());
        manifest.artifact_type = Some(WASM_CONFIG.to_owned());
        let oci = reference.oci();
        c.call(
            reference,
            c.client.push(&oci, &layers, config, &auth, Some(manifest)),
        )
        .await?;
        let digest = c
            .call(reference, c.client.fetch_manifest_digest(&oci, &auth))
            .await?;
        let signature = match key {
            Some(key) => Some(sign_manifest(&c, reference, &digest, key).await?),
            None => None,
        };
        Ok(Pushed { digest, signature })
    }
}

/// Pushes a signature of `digest` by `key` to `sha256-HEX.sig`.
async fn sign_manifest(
    c: &Connection,
    reference: &Reference,
    digest: &str,
    key: &SigningKey,
) -> Result<String, PullError> {
    let tag = sign::signature_tag(digest);
    let sig_ref = reference.tagged(&tag);
    let payload = sign::payload(&reference.name(), digest);
    let annotations = BTreeMap::from([(sign::SIGNATURE_ANNOTATION.to_owned(), key.sign(&payload))]);
    let layers = [ImageLayer::new(
        payload.clone(),
        sign::PAYLOAD_MEDIA_TYPE.to_owned(),
        Some(annotations),
    )];
    let config = serde_json::json!({
        "architecture": "",
        "os": "",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&payload)]},
    });
    let config = Config::oci_v1(serde_json::to_vec(&config).expect("json"), None);
    let mut manifest = OciImageManifest::build(&layers, &config, None);
    manifest.media_type = Some(OCI_IMAGE_MEDIA_TYPE.to_owned());
    let auth = c.auth(&sig_ref);
    c.call(
        &sig_ref,
        c.client
            .push(&sig_ref.oci(), &layers, config, &auth, Some(manifest)),
    )
    .await?;
    Ok(tag)
}
