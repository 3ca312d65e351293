//! Operating a running host: its log, the start-up's progress display, the
//! metrics, the health and readiness checks, and the admin endpoints that
//! serve them. Observes the layers below; *steers* nothing.
//!
//! - [`logging`]: the non-blocking log and its writer thread.
//! - [`progress`]: the start-up's progress on a terminal.
//! - [`metrics`]: Prometheus metrics of leases, tasks and reloads.
//! - [`health`]: `/healthz` (the runtimes answer) and `/readyz`.
//! - [`leases`]: `/leases`, who leads each lease and where it is.
//! - [`admin`]: the admin address's HTTP server.

pub mod admin;
pub mod health;
pub mod leases;
pub mod logging;
pub mod metrics;
pub mod progress;
