//! What every request of the Kubernetes store shares: the field manager
//! its writes are recorded under, the selectors, resourceVersions as
//! numbers, and how the API server's errors map to [`StoreError`]s.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::{DynamicObject, PostParams};

use crate::store::StoreError;

/// Whether `err` is the API server's answer to a create of an object that
/// exists (409 AlreadyExists): nothing was created.
pub fn is_already_exists(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

/// Maps a client error to a store error.
pub fn map_error(lease: &str, verb: &str, err: kube::Error) -> StoreError {
    let lease = lease.to_owned();
    match err {
        kube::Error::Api(status) => {
            let message = if status.message.is_empty() {
                format!("{verb} failed: HTTP {} {}", status.code, status.reason)
            } else {
                status.message.clone()
            };
            match status.code {
                409 => StoreError::Conflict {
                    lease,
                    detail: message,
                },
                // Updating an object that was deleted: someone else wrote.
                404 if verb == "update" => StoreError::Conflict {
                    lease,
                    detail: message,
                },
                401 => StoreError::Refused {
                    lease,
                    detail: format!("unauthorized ({verb} leases): {message}"),
                },
                403 => StoreError::Refused {
                    lease,
                    detail: format!("forbidden: {message}"),
                },
                410 => StoreError::Unavailable {
                    lease,
                    detail: format!("watch expired (410 Gone): {message}"),
                },
                429 | 500..=599 => StoreError::Unavailable {
                    lease,
                    detail: format!("{verb}: HTTP {}: {message}", status.code),
                },
                code => StoreError::Refused {
                    lease,
                    detail: format!("{verb}: HTTP {code}: {message}"),
                },
            }
        }
        kube::Error::SerdeError(e) => StoreError::Malformed {
            lease,
            detail: format!("{verb}: cannot decode the API server's answer: {e}"),
        },
        other => StoreError::Unavailable {
            lease,
            detail: format!("{verb}: {}", with_causes(&other)),
        },
    }
}

/// An error and its causes, `: `-separated, each said once (a connection
/// error reads `... client error (Connect): tcp connect error: Connection
/// refused (os error 111)`, not only `client error (Connect)`).
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

/// The field manager of every write of baton's: the API server records in
/// `metadata.managedFields` which manager last changed each field.
pub const FIELD_MANAGER: &str = "baton";

/// Writes are recorded in `metadata.managedFields` under the manager
/// [`FIELD_MANAGER`].
pub(super) fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    }
}

/// Whether the object's `spec.leaseTransitions` was last changed by baton,
/// as the API server's `metadata.managedFields` say: the field belongs to
/// the manager [`FIELD_MANAGER`]. The API server gives a field to whoever
/// changes its value, whatever `managedFields` the writer sent, so a
/// Lease replaced in place with a lower `leaseTransitions` (`kubectl
/// replace`, a GitOps tool, client-go) reads `false` until baton writes a
/// new term over it; so does a Lease whose `managedFields` were cleared.
/// Only while it is `true` are terms known to have only grown within the
/// object (see [`Floors::raise_for_term`](super::floor::Floors::raise_for_term)).
pub fn baton_wrote_transitions(obj: &DynamicObject) -> bool {
    obj.metadata.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.subresource.as_deref().is_none_or(str::is_empty)
            && entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:spec"))
                .and_then(|spec| spec.get("f:leaseTransitions"))
                .is_some()
    })
}

/// Drops what baton never reads from an object the API server sent:
/// `metadata.managedFields`, a tree per field manager that is most of a
/// Lease's bytes and of what caching, cloning and dropping it cost. Keeps
/// what [`baton_wrote_transitions`] reads: one entry of [`FIELD_MANAGER`]
/// owning `spec.leaseTransitions`, if the object had one, so that it
/// answers as before. Writes send no managedFields: the API server then
/// keeps its own (it replaces them only when a write sends some).
pub(super) fn slim(obj: &mut DynamicObject) {
    let kept = baton_wrote_transitions(obj).then(|| {
        vec![ManagedFieldsEntry {
            manager: Some(FIELD_MANAGER.into()),
            operation: Some("Update".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(
                serde_json::json!({ "f:spec": { "f:leaseTransitions": {} } }),
            )),
            ..ManagedFieldsEntry::default()
        }]
    });
    obj.metadata.managed_fields = kept;
}

/// Selects one Lease by its name.
pub(super) fn field_selector(lease: &str) -> String {
    format!("metadata.name={lease}")
}

/// A resourceVersion as a number. The API server's resourceVersions are
/// etcd revisions, which grow with every write; `None` for one that is not
/// a number (then nothing is judged stale by it).
pub(super) fn rv_number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}
