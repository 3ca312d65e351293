//! `baton status`'s versions: which digest of each plugin from a registry
//! each host has loaded, as the records it holds say (its membership
//! record, and the leases it leads).

use std::collections::BTreeSet;

use serde::Serialize;

use crate::store::Versioned;

/// One plugin on one host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct VersionStatus {
    /// The plugin.
    pub plugin: String,
    /// The host's identity.
    pub host: String,
    /// The manifest digest it has loaded: what its next term runs.
    pub digest: String,
}

/// The versions the held records of `all` publish, by plugin and host.
pub fn rows(all: &[(String, Versioned)]) -> Vec<VersionStatus> {
    let mut rows = BTreeSet::new();
    for (_, v) in all {
        let (Some(holder), Some(host)) = (v.record.holder(), v.record.host.as_ref()) else {
            continue;
        };
        for (plugin, digest) in &host.versions {
            rows.insert(VersionStatus {
                plugin: plugin.clone(),
                host: holder.to_owned(),
                digest: digest.clone(),
            });
        }
    }
    rows.into_iter().collect()
}

/// The table of `rows`.
pub fn table(rows: &[VersionStatus]) -> String {
    let mut cells = vec![vec!["PLUGIN".to_owned(), "HOST".to_owned(), "DIGEST".to_owned()]];
    for r in rows {
        cells.push(vec![r.plugin.clone(), r.host.clone(), r.digest.clone()]);
    }
    super::table(&cells, &[])
}
