//! Purpose-built bad guests ([`crate::bad_guests`]), each beside a
//! well-behaved neighbour on the same host and lease: the host keeps its
//! lease and a bounded memory, the neighbour is never starved, and the bad
//! one is retried with back-off or stopped by force, with a one-line
//! reason. How evenly the neighbour ticks beside each is a figure, not a
//! verdict: `benches/neighbours.rs` prints it.

use crate::bad_guests::*;
use crate::support::*;
use crate::{SECS, STARTED, STOPPED};

#[test]
fn bad_guests_cost_neither_the_lease_nor_the_neighbours_schedule_nor_unbounded_memory() {
    let mut alone = run(None);
    println!(
        "misbehaving guests: the neighbour alone: p99 tick interval {:.1} ms ({} ticks), host memory {:.0} MiB",
        alone.percentile_ms(0.99),
        alone.ticks,
        alone.rss_max_mib
    );
    // Stopped, its figures kept for the comparisons below.
    alone.host.sigterm();
    alone.host.wait_exit(SECS(10));
    for bad in BAD {
        let mut r = run(Some(bad));
        let h = &r.host;
        let name = bad.name;
        println!(
            "misbehaving guests: beside {name}: neighbour p99 {:.1} ms ({} ticks; alone {:.1}), host memory {:.0} MiB \
             at first, {:.0} at most, {:.0} at the end",
            r.percentile_ms(0.99),
            r.ticks,
            alone.percentile_ms(0.99),
            r.rss_first_mib,
            r.rss_max_mib,
            r.rss_last_mib
        );
        // The lease was kept: one term, never a step-down.
        assert!(
            h.all(|e| e.message() == "stepping down").is_empty(),
            "{name}: the host stepped down"
        );
        assert_eq!(
            h.all(|e| e.is(STARTED, Some("neighbour"))).len(),
            1,
            "{name}: the neighbour was restarted"
        );
        // The neighbour was never starved: a guest that held the
        // neighbour's thread would stop its ticks for as long as it ran
        // (RUN, or until its forced stop). Half of that is far beyond what
        // a busy machine adds to a 100 ms tick: a host stalled that long
        // would have lost its lease (renew deadline 1 s), asserted above.
        assert!(
            r.longest_ms() < RUN.as_secs_f64() * 1e3 / 2.0,
            "{name}: the neighbour waited {:.0} ms for a tick ({} ticks in {RUN:?}; alone, at most {:.0} ms)",
            r.longest_ms(),
            r.ticks,
            alone.longest_ms()
        );
        // Memory stayed bounded: what the bad guest may hold (its limit,
        // twice over while an instance is replaced) above the start.
        let bound = alone.rss_max_mib + 2.0 * MEMORY_LIMIT_MIB as f64 + 32.0;
        assert!(
            r.rss_max_mib <= bound,
            "{name}: the host grew to {:.0} MiB (bound {bound:.0})",
            r.rss_max_mib
        );
        match bad.expect {
            Expect::Retried { message, reason } => {
                let events = h.all(|e| e.is(message, Some(name)));
                assert!(
                    events.len() >= 2,
                    "{name}: {} {message:?} events: {}",
                    events.len(),
                    h.output()
                );
                let error = events[0].str("error").unwrap_or_default();
                assert!(error.starts_with(reason), "{name}: {error:?}");
                assert!(!error.contains('\n'), "{name}: more than one line: {error:?}");
                let backoff: Vec<u64> = events.iter().filter_map(|e| e.u64("retry_in_ms")).collect();
                assert!(
                    backoff.windows(2).all(|w| w[1] > w[0]) || backoff.last() == Some(&30_000),
                    "{name}: the back-off does not grow: {backoff:?}"
                );
                println!("misbehaving guests: {name}: \"{error}\", retried after {backoff:?} ms");
            }
            Expect::Limited => {
                let reports = h.all(|e| e.message() == "guest output over the plugin's limits was dropped");
                assert!(
                    reports.iter().any(|e| e.str("plugin") == Some(name)),
                    "{name}: its dropped output was not reported"
                );
            }
            Expect::Forced => {}
        }
        // Shut down: every guest stops within the grace, the bad one by
        // force if it ignores the change.
        let termed = r.host.sigterm();
        let status = r.host.wait_exit(SECS(10));
        assert!(status.success(), "{name}: {status}");
        r.host.try_wait_for(SECS(2), &|e| e.message() == "baton stopped");
        if let Some(stop) = r
            .host
            .all(|e| e.is(STOPPED, Some(name)))
            .into_iter()
            .find(|e| e.at >= termed)
        {
            // Forced: after the grace, at the force-stop time the host
            // computed; otherwise it returned within the grace (how soon is
            // the bench's figure: `benches/handover.rs`).
            let after = ms_between(termed, stop.at);
            if matches!(bad.expect, Expect::Forced) || stop.str("how") == Some("forced") {
                assert_stopped_by_force(&r.host, &stop, GRACE);
                println!("misbehaving guests: {name}: stopped by force {after:.0} ms after SIGTERM");
            } else {
                assert_eq!(stop.str("how"), Some("cooperative"), "{name}: {:?}", stop.json);
            }
        } else {
            assert!(
                !matches!(bad.expect, Expect::Forced),
                "{name}: no stop after SIGTERM:\n{}",
                r.host.output()
            );
        }
    }
}
