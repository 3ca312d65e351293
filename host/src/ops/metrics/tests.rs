use super::*;

fn status(role: Role, term: u64) -> Status {
    Status {
        role,
        holder: None,
        lease: "demo".into(),
        term,
    }
}

/// The line of `metric` (name and labels as written), if any.
fn value(text: &str, metric: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn lease_and_task_events_are_counted_under_their_names() {
    let m = Metrics::new();
    m.status_changed(&status(Role::Pending, 0), &status(Role::Following, 4));
    m.status_changed(&status(Role::Following, 4), &status(Role::Leading, 5));
    m.renewed("demo", Duration::from_millis(3));
    m.store_error("demo", StoreErrorKind::Timeout);
    m.store_error("demo", StoreErrorKind::Timeout);
    m.state("p", TaskState::Running);
    m.started("p");
    m.ended("p", TaskEnd::Trapped);
    m.ended("p", TaskEnd::Forced);
    m.stopped("p", true, Duration::from_millis(510));
    let text = m.encode();
    let v = |metric: &str| value(&text, metric).unwrap_or_else(|| panic!("no {metric} in:\n{text}"));
    assert_eq!(v("baton_lease_role{lease=\"demo\",role=\"leading\"}"), 1.0);
    assert_eq!(v("baton_lease_role{lease=\"demo\",role=\"following\"}"), 0.0);
    assert_eq!(v("baton_lease_term{lease=\"demo\"}"), 5.0);
    assert_eq!(
        v("baton_lease_leadership_changes_total{lease=\"demo\",change=\"gained\"}"),
        1.0
    );
    assert_eq!(v("baton_lease_renewal_seconds_count{lease=\"demo\"}"), 1.0);
    assert_eq!(
        v("baton_lease_store_errors_total{lease=\"demo\",kind=\"timeout\"}"),
        2.0
    );
    assert!(v("baton_lease_seconds_since_renewal{lease=\"demo\"}") < 5.0);
    assert_eq!(v("baton_plugin_task_state{plugin=\"p\",state=\"running\"}"), 1.0);
    assert_eq!(v("baton_plugin_task_state{plugin=\"p\",state=\"waiting\"}"), 0.0);
    assert_eq!(v("baton_plugin_task_starts_total{plugin=\"p\"}"), 1.0);
    assert_eq!(v("baton_plugin_task_traps_total{plugin=\"p\"}"), 1.0);
    assert_eq!(v("baton_plugin_forced_stops_total{plugin=\"p\"}"), 1.0);
    assert_eq!(
        v("baton_plugin_stop_seconds_count{plugin=\"p\",how=\"forced\"}"),
        1.0
    );
    assert_eq!(v("baton_plugins_loaded"), 0.0);
    assert_eq!(v("baton_log_dropped_lines_total"), 0.0);
    assert!(
        text.contains("# TYPE baton_lease_renewal_seconds histogram"),
        "{text}"
    );

    // Losing the lead: counted, and no time since a renewal any more.
    m.status_changed(&status(Role::Leading, 5), &status(Role::Pending, 5));
    let text = m.encode();
    assert_eq!(
        value(
            &text,
            "baton_lease_leadership_changes_total{lease=\"demo\",change=\"lost\"}"
        ),
        Some(1.0)
    );
    assert!(!text.contains("baton_lease_seconds_since_renewal{"), "{text}");
}

#[test]
fn lease_timings_are_exported_and_counters_start_at_zero() {
    let m = Metrics::new();
    let mut lease = crate::config::LeaseConfig {
        name: "demo".into(),
        timings: Timings::default(),
        placement: Default::default(),
        route_label: false,
    };
    m.leases(std::slice::from_ref(&lease));
    let text = m.encode();
    let v =
        |text: &str, metric: &str| value(text, metric).unwrap_or_else(|| panic!("no {metric} in:\n{text}"));
    assert_eq!(v(&text, "baton_lease_duration_seconds{lease=\"demo\"}"), 15.0);
    assert_eq!(
        v(&text, "baton_lease_renew_deadline_seconds{lease=\"demo\"}"),
        10.0
    );
    assert_eq!(v(&text, "baton_lease_retry_period_seconds{lease=\"demo\"}"), 2.0);
    for kind in ["conflict", "unavailable", "malformed", "refused", "timeout"] {
        let series = format!("baton_lease_store_errors_total{{lease=\"demo\",kind=\"{kind}\"}}");
        assert_eq!(v(&text, &series), 0.0);
    }
    assert_eq!(
        v(
            &text,
            "baton_lease_leadership_changes_total{lease=\"demo\",change=\"gained\"}"
        ),
        0.0
    );
    // A reload's new timings replace the old.
    lease.timings.lease_duration = Duration::from_secs(30);
    m.leases(&[lease]);
    assert_eq!(
        v(&m.encode(), "baton_lease_duration_seconds{lease=\"demo\"}"),
        30.0
    );
}
