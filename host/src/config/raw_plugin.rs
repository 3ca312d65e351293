//! A `[[plugins]]` table as written: the plugin's own keys here, each
//! capability's keys read by that capability ([`RawGrants`]), any other
//! key refused with the list of those known, at its place in the file.

use std::fmt;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use bytesize::ByteSize;
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use toml::Spanned;

use super::health_check::RawHealthCheck;
use super::{RawCatchUp, RawOverlap, ReloadMode};
use crate::runtime::RawGrants;
use crate::support::raw_keys::RawKeys;

crate::raw_keys! {
    /// The keys of a plugin's table that are no capability's.
    struct PluginKeys {
        name: Spanned<String> = "name",
        path: Spanned<PathBuf> = "path",
        lease: Spanned<String> = "lease",
        memory_limit: ByteSize = "memory-limit",
        reload: ReloadMode = "reload",
        schedule: String = "schedule",
        every: humantime_serde::Serde<Duration> = "every",
        time_zone: String = "time-zone",
        starting_deadline: humantime_serde::Serde<Duration> = "starting-deadline",
        catch_up: RawCatchUp = "catch-up",
        overlap: RawOverlap = "overlap",
        jitter: humantime_serde::Serde<Duration> = "jitter",
        suspend: bool = "suspend",
        health_check: RawHealthCheck = "health-check",
        verify_key: PathBuf = "verify-key",
    }
}

/// A plugin's table: its own keys, and its capabilities' as written.
#[derive(Debug)]
pub(super) struct RawPlugin {
    pub(super) name: Spanned<String>,
    pub(super) path: Spanned<PathBuf>,
    pub(super) lease: Spanned<String>,
    pub(super) memory_limit: Option<ByteSize>,
    pub(super) reload: ReloadMode,
    pub(super) schedule: Option<String>,
    pub(super) every: Option<Duration>,
    pub(super) time_zone: Option<String>,
    pub(super) starting_deadline: Option<Duration>,
    pub(super) catch_up: Option<RawCatchUp>,
    pub(super) overlap: Option<RawOverlap>,
    pub(super) jitter: Option<Duration>,
    pub(super) suspend: bool,
    pub(super) health_check: Option<RawHealthCheck>,
    pub(super) verify_key: Option<PathBuf>,
    /// Every capability's keys.
    pub(super) grants: RawGrants,
}

/// Every key a plugin's table may have: its own, then the capabilities'.
static KEYS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut keys = PluginKeys::keys().to_vec();
    keys.extend(RawGrants::keys());
    keys
});

/// A key of a plugin's table, refused where it is written if it is none
/// of [`KEYS`].
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        let key = String::deserialize(d)?;
        if KEYS.contains(&key.as_str()) {
            Ok(Key(key))
        } else {
            Err(de::Error::unknown_field(&key, &KEYS))
        }
    }
}

impl<'de> Deserialize<'de> for RawPlugin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawPlugin, D::Error> {
        d.deserialize_map(PluginVisitor)
    }
}

struct PluginVisitor;

impl<'de> Visitor<'de> for PluginVisitor {
    type Value = RawPlugin;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a plugin's table")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawPlugin, A::Error> {
        let mut own = PluginKeys::default();
        let mut grants = RawGrants::default();
        while let Some(Key(key)) = map.next_key()? {
            if !own.take(&key, &mut map)? && !grants.take(&key, &mut map)? {
                unreachable!("a key of KEYS is its own or a capability's");
            }
        }
        let duration = |d: Option<humantime_serde::Serde<Duration>>| d.map(|d| d.into_inner());
        Ok(RawPlugin {
            name: own.name.ok_or_else(|| de::Error::missing_field("name"))?,
            path: own.path.ok_or_else(|| de::Error::missing_field("path"))?,
            lease: own.lease.ok_or_else(|| de::Error::missing_field("lease"))?,
            memory_limit: own.memory_limit,
            reload: own.reload.unwrap_or_default(),
            schedule: own.schedule,
            every: duration(own.every),
            time_zone: own.time_zone,
            starting_deadline: duration(own.starting_deadline),
            catch_up: own.catch_up,
            overlap: own.overlap,
            jitter: duration(own.jitter),
            suspend: own.suspend.unwrap_or(false),
            health_check: own.health_check,
            verify_key: own.verify_key,
            grants,
        })
    }
}
