//! The route label: the label a host puts on its own pod while it leads a
//! lease (`route-label = true`), so that a Service selecting it sends
//! traffic only to the leader. The key is [`route_label`]`(lease)`, the
//! value [`ROUTE_LABEL_VALUE`]; docs/kubernetes.md ("Traffic only to the
//! leader") says when the host sets and removes it.
//!
//! - **Own pod.** Set and removed with a JSON merge patch of its labels
//!   alone (`null` removes), which never touches another field or label.
//! - **Other pods.** A stale label (left by a host that died) is removed by
//!   a merge patch that carries the `resourceVersion` the pod was listed
//!   with: the API server refuses it (409) if the pod changed since, so a
//!   label that a newer leader put there after the listing is never taken
//!   off. The pod is listed again and retried while the caller still leads.
//!
//! Every request is bounded by the caller.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};

use super::gate::Gated;
use sha2::{Digest, Sha256};

use super::requests::{FIELD_MANAGER, map_error};
use crate::store::StoreError;

/// The prefix and name start of every route label's key.
pub const ROUTE_LABEL_PREFIX: &str = "baton.dev/lead-";

/// The value of a route label.
pub const ROUTE_LABEL_VALUE: &str = "true";

/// The longest name part of a label key (after the `/`).
const NAME_PART: usize = 63;

/// How many characters of a long lease name a key keeps before its hash.
const KEPT: usize = 41;

/// The route label's key of `lease`: `baton.dev/lead-<lease>` when that
/// name part (`lead-<lease>`) fits in 63 characters (a lease name of at
/// most 58); else `baton.dev/lead-<first 41 characters>-<16 hex digits>`,
/// the digits the start of the SHA-256 of the whole lease name, so that
/// two long names with a common start get different keys. A lease name is
/// a DNS subdomain, whose characters are all allowed in a label key.
pub fn route_label(lease: &str) -> String {
    let name = ROUTE_LABEL_PREFIX.split('/').nth(1).unwrap_or_default();
    if name.len() + lease.len() <= NAME_PART {
        return format!("{ROUTE_LABEL_PREFIX}{lease}");
    }
    let digest = Sha256::digest(lease.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{ROUTE_LABEL_PREFIX}{}-{hex}", &lease[..KEPT])
}

/// This host's pod, and the requests on the route labels of its namespace.
#[derive(Clone)]
pub struct PodLabels {
    api: Gated<Pod>,
    namespace: String,
    pod: String,
}

impl std::fmt::Debug for PodLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.pod)
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

impl PodLabels {
    /// The pod `pod` in `namespace`, through a store's client and gate.
    /// Makes no request.
    pub(super) fn new(store: &Gated<DynamicObject>, namespace: &str, pod: &str) -> PodLabels {
        PodLabels {
            api: store.other(|client| Api::namespaced(client, namespace)),
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        }
    }

    /// This host's pod.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// The pod's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Sets (`on`) or removes the label `key` on this host's pod. Errors
    /// name `lease`.
    pub async fn set_own(&self, lease: &str, key: &str, on: bool) -> Result<(), StoreError> {
        let value = if on {
            serde_json::Value::from(ROUTE_LABEL_VALUE)
        } else {
            serde_json::Value::Null
        };
        let patch = serde_json::json!({ "metadata": { "labels": { key: value } } });
        self.api
            .patch(&self.pod, &params(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| map_error(lease, "patch pods", e))
    }

    /// The pods of the namespace carrying the label `key` (any value).
    pub async fn carrying(&self, lease: &str, key: &str) -> Result<Vec<Pod>, StoreError> {
        let listed = self
            .api
            .list(&ListParams::default().labels(key))
            .await
            .map_err(|e| map_error(lease, "list pods", e))?;
        Ok(listed.items)
    }

    /// Removes the label `key` from every other pod of the namespace that
    /// carries it, each patch conditional on the pod's listed
    /// `resourceVersion`; on a conflict lists again, at most three times,
    /// and only while `leading()`. Returns the pods it was removed from.
    pub async fn clear_others(
        &self,
        lease: &str,
        key: &str,
        leading: impl Fn() -> bool,
    ) -> Result<Vec<String>, StoreError> {
        let mut removed = Vec::new();
        for _ in 0..3 {
            let mut conflicted = false;
            for pod in self.carrying(lease, key).await? {
                let name = pod.metadata.name.unwrap_or_default();
                if name == self.pod || name.is_empty() {
                    continue;
                }
                if !leading() {
                    return Ok(removed);
                }
                let patch = serde_json::json!({ "metadata": {
                    "resourceVersion": pod.metadata.resource_version,
                    "labels": { key: null },
                } });
                match self.api.patch(&name, &params(), &Patch::Merge(&patch)).await {
                    Ok(_) => removed.push(name),
                    Err(kube::Error::Api(s)) if s.code == 409 => conflicted = true,
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(map_error(lease, "patch pods", e)),
                }
            }
            if !conflicted || !leading() {
                break;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::validate_lease_name;

    /// A label key's name part as the API server checks it: at most 63
    /// characters, alphanumeric at both ends, `-`, `_`, `.` between.
    fn valid_name_part(key: &str) -> bool {
        let (prefix, name) = key.split_once('/').expect("a prefixed key");
        let b = name.as_bytes();
        let alnum = |c: &u8| c.is_ascii_alphanumeric();
        prefix == "baton.dev"
            && (1..=63).contains(&b.len())
            && alnum(&b[0])
            && alnum(&b[b.len() - 1])
            && b.iter().all(|c| alnum(c) || b"-_.".contains(c))
    }

    #[test]
    fn a_short_lease_name_is_the_key_as_is() {
        assert_eq!(route_label("demo"), "baton.dev/lead-demo");
        assert_eq!(route_label("jobs.eu-1"), "baton.dev/lead-jobs.eu-1");
        let longest = "a".repeat(58);
        assert_eq!(route_label(&longest), format!("baton.dev/lead-{longest}"));
        assert!(valid_name_part(&route_label(&longest)));
    }

    #[test]
    fn a_long_lease_name_is_cut_and_hashed_into_a_valid_distinct_key() {
        let long = "b".repeat(59);
        let key = route_label(&long);
        assert_eq!(key.len(), "baton.dev/".len() + 63, "{key}");
        assert!(
            key.starts_with(&format!("baton.dev/lead-{}-", "b".repeat(41))),
            "{key}"
        );
        assert!(valid_name_part(&key), "{key}");
        // The same name, the same key (every host derives it alike); two
        // names with a common start of 41+ characters, different keys.
        assert_eq!(route_label(&long), key);
        let other = format!("{}c", "b".repeat(58));
        assert_ne!(route_label(&other), key);
        // The longest lease name, cut where a `.` or `-` falls at the cut.
        let dotted = format!("{}.{}", "x".repeat(40), "y".repeat(212));
        validate_lease_name(&dotted).unwrap();
        let key = route_label(&dotted);
        assert!(valid_name_part(&key), "{key}");
        assert_eq!(
            &key["baton.dev/lead-".len()..][..42],
            format!("{}.-", "x".repeat(40))
        );
    }

    #[test]
    fn the_hash_is_pinned() {
        // The documented scheme, which every version must keep so that
        // hosts of two versions agree on the key during an upgrade
        // (`printf %s NAME | sha256sum | cut -c1-16`).
        let name = "a-lease-name-that-is-far-too-long-to-fit-in-one-label-name-part";
        assert_eq!(
            route_label(name),
            "baton.dev/lead-a-lease-name-that-is-far-too-long-to-fit--5da364a2ae70e084"
        );
    }
}
