//! Tests of [`spread`](super).

use super::*;

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn loads(a: &BTreeMap<String, String>, hosts: &[String]) -> Vec<usize> {
    hosts
        .iter()
        .map(|h| a.values().filter(|p| *p == h).count())
        .collect()
}

#[test]
fn every_host_gets_at_most_the_ceiling_and_the_rest_fill_up() {
    for (m, n) in [(30, 3), (30, 2), (31, 3), (100, 7), (5, 8), (1, 3), (0, 2)] {
        let leases = names("lease-", m);
        let hosts = names("host-", n);
        let a = assign(&leases, &hosts);
        assert_eq!(a.len(), m);
        let l = loads(&a, &hosts);
        assert!(
            l.iter().all(|&x| x == m / n || x == m.div_ceil(n)),
            "{m} on {n}: {l:?}"
        );
    }
}

#[test]
fn the_assignment_depends_only_on_the_names() {
    let leases = names("jobs.", 20);
    let hosts = names("node-", 4);
    let mut rl = leases.clone();
    rl.reverse();
    let mut rh = hosts.clone();
    rh.reverse();
    assert_eq!(assign(&leases, &hosts), assign(&rl, &rh));
}

#[test]
fn a_host_joining_or_leaving_moves_few_leases() {
    // The least a join can move is M / (N + 1); bounded loads move more
    // than plain rendezvous hashing, but stay within a small multiple.
    let leases = names("lease-", 30);
    let three = names("host-", 3);
    let four = names("host-", 4);
    let a = assign(&leases, &three);
    let b = assign(&leases, &four);
    let moved = leases.iter().filter(|l| a[*l] != b[*l]).count();
    assert!(moved <= 2 * 30 / 4 + 1, "a join moved {moved} of 30");
    let two = names("host-", 2);
    let c = assign(&leases, &two);
    let moved = leases.iter().filter(|l| a[*l] != c[*l]).count();
    assert!(moved <= 2 * 30 / 3 + 1, "a leave moved {moved} of 30");
}

#[test]
fn member_leases_are_valid_lease_names_and_distinct() {
    for id in [
        "node-a",
        "Node_A",
        "node_a",
        "a.b",
        "-x-",
        "___",
        &"x".repeat(300),
    ] {
        let name = member_lease(id);
        crate::store::validate_lease_name(&name).unwrap_or_else(|e| panic!("{id:?}: {e}"));
        assert!(name.starts_with(MEMBER_PREFIX));
    }
    assert_ne!(member_lease("Node_A"), member_lease("node_a"));
    assert_ne!(member_lease("___"), member_lease("__"));
}

use crate::election::tests::timings;
use crate::store::memory::MemoryStore;
use tokio::task::JoinHandle;

/// A host: its electors and its spreader, on its own client of one store.
struct Host {
    views: Vec<(String, watch::Receiver<LeaseView>)>,
    intents: Vec<watch::Sender<Intent>>,
    tasks: Vec<JoinHandle<()>>,
    hosts: watch::Receiver<Hosts>,
    identity: String,
    client: Arc<dyn LeaseStore>,
    clock: TermClock,
    changes: mpsc::UnboundedSender<LeaseChange>,
    hosts_tx: watch::Sender<Hosts>,
    /// Its spreader, if one runs: its settings, stop and task.
    spreader: Option<(SpreadConfig, CancellationToken, JoinHandle<()>)>,
    /// What its membership record says of it (weight, draining).
    host: HostHandle,
}

const HEAD_START: Duration = Duration::from_millis(500);

fn spread_cfg() -> SpreadConfig {
    SpreadConfig {
        forget_after: DEFAULT_FORGET_AFTER,
        member_timings: timings(),
        head_start: HEAD_START,
        settle: Duration::from_secs(2),
    }
}

/// An elector of `name` for `identity`, started with `initial`.
fn elector(
    client: &Arc<dyn LeaseStore>,
    clock: &TermClock,
    identity: &str,
    name: &str,
    initial: Option<Intent>,
) -> (JoinHandle<()>, SteeredLease) {
    let cfg = ElectorConfig {
        lease: name.to_owned(),
        identity: identity.into(),
        timings: timings(),
        host: HostHandle::default().subscribe(),
    };
    let (elector, view, intent) = Elector::new(cfg, client.clone(), clock.clone());
    if let Some(initial) = initial {
        intent.send_replace(initial);
    }
    let task = tokio::spawn(async move {
        let _ = elector.run().await;
    });
    let lease = SteeredLease {
        name: name.to_owned(),
        intent,
        view,
        placement: Placement::default(),
    };
    (task, lease)
}

impl Host {
    fn start(store: &MemoryStore, clock: &TermClock, identity: &str, leases: &[String]) -> Host {
        Host::start_with(store, clock, identity, leases, Some(spread_cfg()))
    }

    /// A host of `leases`, spreading with `spread` (`None`: off).
    fn start_with(
        store: &MemoryStore,
        clock: &TermClock,
        identity: &str,
        leases: &[String],
        spread: Option<SpreadConfig>,
    ) -> Host {
        let client: Arc<dyn LeaseStore> = Arc::new(store.client());
        let mut tasks = Vec::new();
        let mut steered = Vec::new();
        let mut views = Vec::new();
        let mut intents = Vec::new();
        for name in leases {
            let (task, lease) = elector(&client, clock, identity, name, None);
            tasks.push(task);
            views.push((name.clone(), lease.view.clone()));
            intents.push(lease.intent.clone());
            steered.push(lease);
        }
        let (hosts_tx, hosts) = watch::channel(Hosts::default());
        let (changes, _) = mpsc::unbounded_channel();
        let mut host = Host {
            views,
            intents,
            tasks,
            hosts,
            identity: identity.to_owned(),
            client,
            clock: clock.clone(),
            changes,
            hosts_tx,
            spreader: None,
            host: HostHandle::default(),
        };
        if let Some(cfg) = spread {
            host.start_spreader(cfg, steered);
        }
        host
    }

    fn start_spreader(&mut self, cfg: SpreadConfig, steered: Vec<SteeredLease>) {
        let (changes, changes_rx) = mpsc::unbounded_channel();
        let spreader = Spreader::new(
            &self.identity,
            self.client.clone(),
            cfg,
            steered,
            self.hosts_tx.clone(),
        )
        .with_host(self.host.clone())
        .follow(changes_rx);
        let stop = CancellationToken::new();
        let task = tokio::spawn(spreader.run(self.clock.clone(), stop.clone()));
        self.changes = changes;
        self.spreader = Some((cfg, stop, task));
    }

    /// A reload changes spreading to `spread`, as `baton run` applies
    /// it: the running spreader is stopped and awaited, the leases set
    /// back to contending if spreading is now off, and a new spreader
    /// started with every lease.
    async fn respread(&mut self, spread: Option<SpreadConfig>) {
        if let Some((_, stop, task)) = self.spreader.take() {
            stop.cancel();
            task.await.unwrap();
        }
        match spread {
            None => {
                for intent in &self.intents {
                    unsteer(intent);
                }
            }
            Some(cfg) => {
                let steered = self
                    .views
                    .iter()
                    .zip(&self.intents)
                    .map(|((name, view), intent)| SteeredLease {
                        name: name.clone(),
                        intent: intent.clone(),
                        view: view.clone(),
                        placement: Placement::default(),
                    })
                    .collect();
                self.start_spreader(cfg, steered);
            }
        }
    }

    /// Each lease's term, in order.
    fn terms(&self) -> Vec<u64> {
        self.views.iter().map(|(_, v)| v.borrow().status.term).collect()
    }

    /// A reload adds `name`: its elector starts deferring, as `baton
    /// run` starts it, and the spreader steers it.
    fn add(&mut self, name: &str) {
        let initial = Intent::Defer {
            head_start: HEAD_START,
        };
        let (task, lease) = elector(&self.client, &self.clock, &self.identity, name, Some(initial));
        self.tasks.push(task);
        self.views.push((name.to_owned(), lease.view.clone()));
        self.intents.push(lease.intent.clone());
        self.changes.send(LeaseChange::Add(lease)).unwrap();
    }

    /// A reload removes `name`.
    fn remove(&self, name: &str) {
        self.changes.send(LeaseChange::Remove(name.to_owned())).unwrap();
    }

    fn intent(&self, name: &str) -> Intent {
        let i = self.views.iter().position(|(n, _)| n == name).unwrap();
        *self.intents[i].borrow()
    }

    fn leads(&self, name: &str) -> bool {
        self.views
            .iter()
            .any(|(n, v)| n == name && v.borrow().status.is_leading())
    }

    /// Waits until this host counts `live` hosts, itself among them.
    async fn counts(&self, live: u32, within: Duration) {
        let want = Hosts {
            live,
            this_host_live: true,
        };
        let mut rx = self.hosts.clone();
        let seen = timeout(within, rx.wait_for(|h| *h == want)).await;
        assert!(seen.is_ok(), "counts {:?}, want {want:?}", *self.hosts.borrow());
    }

    fn leading(&self) -> usize {
        self.views
            .iter()
            .filter(|(_, v)| v.borrow().status.is_leading())
            .count()
    }

    /// Dies: nothing is released.
    fn kill(self) {
        for t in self.tasks {
            t.abort();
        }
        if let Some((_, _, task)) = self.spreader {
            task.abort();
        }
    }
}

fn leads(hosts: &[&Host]) -> Vec<usize> {
    hosts.iter().map(|h| h.leading()).collect()
}

/// No lease is led by two hosts at once.
fn no_overlap(hosts: &[&Host], leases: &[String]) {
    for l in leases {
        let n = hosts
            .iter()
            .filter(|h| {
                h.views
                    .iter()
                    .any(|(name, v)| name == l && v.borrow().status.is_leading())
            })
            .count();
        assert!(n <= 1, "{l} led by {n} hosts");
    }
}

/// Hosts `a` and `b` spreading two leases, settled at one each; and the
/// index of the lease `a` leads.
async fn two_hosts_settled(store: &MemoryStore, clock: &TermClock) -> (Vec<String>, Host, Host, usize) {
    let leases = names("lease-", 2);
    let a = Host::start(store, clock, "a", &leases);
    let b = Host::start(store, clock, "b", &leases);
    settle(&[&a, &b], &leases, &[1, 1], Duration::from_secs(20)).await;
    let i = a
        .views
        .iter()
        .position(|(_, v)| v.borrow().status.is_leading())
        .unwrap();
    (leases, a, b, i)
}

async fn settle(hosts: &[&Host], leases: &[String], want: &[usize], within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        no_overlap(hosts, leases);
        if leads(hosts) == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "leads {:?}, want {want:?}",
            leads(hosts)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn three_hosts_share_the_leases_and_the_survivors_take_a_dead_hosts_share() {
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let leases = names("lease-", 12);
    let a = Host::start(&store, &clock, "a", &leases);
    // a takes everything while alone; b and c join and get their share
    // handed over.
    settle(&[&a], &leases, &[12], Duration::from_secs(5)).await;
    let b = Host::start(&store, &clock, "b", &leases);
    let c = Host::start(&store, &clock, "c", &leases);
    settle(&[&a, &b, &c], &leases, &[4, 4, 4], Duration::from_secs(20)).await;
    for h in [&a, &b, &c] {
        h.counts(3, Duration::ZERO).await;
    }
    // Steady: nothing moves any more.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(leads(&[&a, &b, &c]), [4, 4, 4]);
    // c dies: its leases expire (10 s) and a and b share all of them.
    c.kill();
    settle(&[&a, &b], &leases, &[6, 6], Duration::from_secs(30)).await;
    a.counts(2, Duration::from_secs(2)).await;
    b.counts(2, Duration::from_secs(2)).await;
    // It comes back: the share is 4 each again.
    let c = Host::start(&store, &clock, "c", &leases);
    settle(&[&a, &b, &c], &leases, &[4, 4, 4], Duration::from_secs(30)).await;
    for h in [&a, &b, &c] {
        h.counts(3, Duration::from_secs(2)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_record_of_a_host_gone_for_long_is_deleted_and_written_again_when_it_comes_back() {
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let leases = names("lease-", 2);
    let forget_after = Duration::from_secs(30);
    let cfg = SpreadConfig {
        forget_after,
        ..spread_cfg()
    };
    let a = Host::start_with(&store, &clock, "a", &leases, Some(cfg));
    let b = Host::start_with(&store, &clock, "b", &leases, Some(cfg));
    a.counts(2, Duration::from_secs(5)).await;
    // b dies: its record expires (10 s), then stays for forget_after
    // and a little more (one listing), then is gone; a's stays.
    b.kill();
    a.counts(1, Duration::from_secs(12)).await;
    tokio::time::sleep(forget_after - Duration::from_secs(2)).await;
    assert!(store.peek(&member_lease("b")).is_some(), "deleted too early");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(store.peek(&member_lease("b")).is_none(), "not deleted");
    assert!(store.peek(&member_lease("a")).is_some(), "its own record");
    // A deleted record is not a tombstone for a: b coming back is
    // counted again.
    let b = Host::start_with(&store, &clock, "b", &leases, Some(cfg));
    a.counts(2, Duration::from_secs(5)).await;
    b.counts(2, Duration::from_secs(5)).await;
    // Released records go too (a host stopped the clean way).
    b.spreader.as_ref().unwrap().1.cancel();
    a.counts(1, Duration::from_secs(5)).await;
    tokio::time::sleep(forget_after + Duration::from_secs(12)).await;
    assert!(
        store.peek(&member_lease("b")).is_none(),
        "a released record stays"
    );
}

#[tokio::test(start_paused = true)]
async fn a_host_that_does_not_serve_its_preferred_leases_is_offered_them_less_and_less_often() {
    // b prefers some of a's leases but does not serve them: a hands each
    // over, takes it back after the head start, and offers it again
    // only after a wait that doubles.
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let leases = names("lease-", 6);
    let a = Host::start(&store, &clock, "a", &leases);
    settle(&[&a], &leases, &[6], Duration::from_secs(5)).await;
    let _b = Host::start(&store, &clock, "b", &[]);
    tokio::time::sleep(Duration::from_secs(75)).await;
    let early = a.terms();
    // Offered after 2 s (settle), then 4, 8, 16 and 32 s after each.
    assert!(early.iter().any(|&t| t > 1), "nothing was offered: {early:?}");
    assert!(early.iter().all(|&t| t <= 7), "offered too often: {early:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    let late = a.terms();
    for (e, l) in early.iter().zip(&late) {
        assert!(
            l - e <= 1,
            "offered more than once in a minute: {early:?} -> {late:?}"
        );
    }
    assert_eq!(a.leading(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_yield_wins_over_spreading_for_its_time_then_the_lease_goes_back_once() {
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let (leases, a, b, i) = two_hosts_settled(&store, &clock).await;
    let (lease, a_view) = &a.views[i];
    let b_view = &b.views[i].1;
    let term = a_view.borrow().status.term;
    // a yields its lease for 30 s: b takes it at once, although a is
    // its preferred host (no head start: a does not want it).
    let yielded = Instant::now();
    a.intents[i].send_replace(Intent::StandBy {
        until: yielded + Duration::from_secs(30),
    });
    let mut rx = b_view.clone();
    rx.wait_for(|v| v.status.is_leading()).await.unwrap();
    assert!(
        yielded.elapsed() < Duration::from_millis(100),
        "b took {lease} {:?} after the yield",
        yielded.elapsed()
    );
    let b_term = b_view.borrow().status.term;
    assert_eq!(b_term, term + 1);
    // For the yield's time neither spreader moves it: a's does not make
    // a contend, b's does not hand it back to a (which would not take
    // it), in a loop or at all.
    for _ in 0..28 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        no_overlap(&[&a, &b], &leases);
        let now = b_view.borrow().status.clone();
        assert!(now.is_leading() && now.term == b_term, "{lease} moved: {now:?}");
        assert!(matches!(*a.intents[i].borrow(), Intent::StandBy { .. }));
    }
    // Then it goes back to a, which prefers it, once, and stays.
    let mut rx = a_view.clone();
    timeout(Duration::from_secs(10), rx.wait_for(|v| v.status.is_leading()))
        .await
        .expect("the lease goes back to a after the yield")
        .unwrap();
    assert!(yielded.elapsed() >= Duration::from_secs(30));
    assert_eq!(a_view.borrow().status.term, b_term + 1);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let now = a_view.borrow().status.clone();
    assert!(now.is_leading() && now.term == b_term + 1, "{now:?}");
    assert_eq!(leads(&[&a, &b]), [1, 1]);
}

#[tokio::test(start_paused = true)]
async fn leases_added_and_removed_at_run_time_are_spread_and_a_removed_one_is_released() {
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let mut leases = names("lease-", 4);
    let mut a = Host::start(&store, &clock, "a", &leases);
    let mut b = Host::start(&store, &clock, "b", &leases);
    settle(&[&a, &b], &leases, &[2, 2], Duration::from_secs(20)).await;
    let ab = ["a".to_owned(), "b".to_owned()];
    // Two leases added by a reload on a, then on b a second later:
    // each is led once, by the host that prefers it, and the spread
    // stays even.
    let added = names("added-", 2);
    for l in &added {
        a.add(l);
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let preferred = assign(&[leases.clone(), added.clone()].concat(), &ab);
    for l in &added {
        let want = if preferred[l] == "a" {
            Intent::Contend
        } else {
            Intent::Defer {
                head_start: HEAD_START,
            }
        };
        assert_eq!(a.intent(l), want, "{l} on a, steered from its start");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for l in &added {
        b.add(l);
    }
    leases.extend(added.iter().cloned());
    settle(&[&a, &b], &leases, &[3, 3], Duration::from_secs(30)).await;
    for l in &leases {
        let by = if a.leads(l) { "a" } else { "b" };
        assert_eq!(preferred[l], by, "{l}");
    }
    // Steady: nothing moves any more.
    tokio::time::sleep(Duration::from_secs(20)).await;
    no_overlap(&[&a, &b], &leases);
    assert_eq!(leads(&[&a, &b]), [3, 3]);
    // Two leases removed, one led by each: on a first. a's elector is
    // told to stop (drain, release); b, not reloaded yet, may take
    // a's; once both reloaded nobody leads either, and the four left
    // are spread evenly again.
    let gone: Vec<String> = ["a", "b"]
        .iter()
        .map(|h| leases.iter().find(|l| preferred[*l] == *h).unwrap().clone())
        .collect();
    for l in &gone {
        a.remove(l);
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    for l in &gone {
        assert_eq!(a.intent(l), Intent::Stop);
    }
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        no_overlap(&[&a, &b], &leases);
    }
    for l in &gone {
        assert!(!a.leads(l), "{l} still led by a");
        b.remove(l);
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    for l in &gone {
        assert_eq!(b.intent(l), Intent::Stop);
    }
    leases.retain(|l| !gone.contains(l));
    let all: Vec<String> = [leases.clone(), gone.clone()].concat();
    let start = Instant::now();
    loop {
        no_overlap(&[&a, &b], &all);
        let led = |h: &Host| leases.iter().filter(|l| h.leads(l)).count();
        if !gone.iter().any(|l| a.leads(l) || b.leads(l)) && [led(&a), led(&b)] == [2, 2] {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "not spread again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    no_overlap(&[&a, &b], &all);
    for l in &gone {
        assert!(!a.leads(l) && !b.leads(l), "{l} led after its removal");
        let held = store.client().get(l).await.unwrap();
        assert!(
            held.is_none_or(|v| v.record.holder().is_none()),
            "{l} not released"
        );
    }
    let preferred = assign(&leases, &ab);
    for l in &leases {
        let by = if a.leads(l) { "a" } else { "b" };
        assert_eq!(preferred[l], by, "{l}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_reload_now_stand_by_is_not_overwritten_and_the_lease_comes_back_in_a_new_term() {
    // reload = "now" stands a lease by for one retry period: the
    // spreader leaves that alone, the lease is handed over, and it
    // ends up led by its preferred host again, in a later term.
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let (leases, a, b, i) = two_hosts_settled(&store, &clock).await;
    let term = a.views[i].1.borrow().status.term;
    let until = Instant::now() + timings().retry_period;
    a.intents[i].send_replace(Intent::StandBy { until });
    while Instant::now() < until {
        assert_eq!(*a.intents[i].borrow(), Intent::StandBy { until });
        no_overlap(&[&a, &b], &leases);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut rx = a.views[i].1.clone();
    timeout(Duration::from_secs(30), rx.wait_for(|v| v.status.is_leading()))
        .await
        .expect("back to a")
        .unwrap();
    assert!(a.views[i].1.borrow().status.term > term);
    tokio::time::sleep(Duration::from_secs(30)).await;
    no_overlap(&[&a, &b], &leases);
    assert_eq!(leads(&[&a, &b]), [1, 1]);
    assert!(a.views[i].1.borrow().status.is_leading());
}

#[tokio::test(start_paused = true)]
async fn unsteering_leaves_a_stop_and_a_stand_by_whose_time_is_not_up() {
    let now = Instant::now();
    let second = Duration::from_secs(1);
    let cases = [
        (Intent::Defer { head_start: second }, Intent::Contend),
        (
            Intent::HandOver {
                term: 3,
                head_start: second,
            },
            Intent::Contend,
        ),
        (Intent::Contend, Intent::Contend),
        (Intent::Stop, Intent::Stop),
        (
            Intent::StandBy { until: now + second },
            Intent::StandBy { until: now + second },
        ),
        (Intent::StandBy { until: now }, Intent::Contend),
    ];
    for (before, after) in cases {
        let (intent, _rx) = watch::channel(before);
        unsteer(&intent);
        assert_eq!(*intent.borrow(), after, "from {before:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn spreading_turned_on_changed_and_off_at_run_time_spreads_then_moves_nothing() {
    // As reloads apply it: two hosts start with spreading off; turned
    // on (a first, then b), the leases are spread by the assignment;
    // new settings (a spreader replaced, its record released and taken
    // again) move nothing; turned off (a first, then b), every lease
    // goes back to contending, is still led by one host, and nothing
    // moves any more, a stand-by left alone.
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let leases = names("lease-", 4);
    let ab = ["a".to_owned(), "b".to_owned()];
    let mut a = Host::start_with(&store, &clock, "a", &leases, None);
    settle(&[&a], &leases, &[4], Duration::from_secs(5)).await;
    let mut b = Host::start_with(&store, &clock, "b", &leases, None);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(leads(&[&a, &b]), [4, 0], "not spread while off");
    assert!(b.intents.iter().all(|i| *i.borrow() == Intent::Contend));
    // On, on a: alone in its listing, it keeps all four.
    a.respread(Some(spread_cfg())).await;
    a.counts(1, Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(leads(&[&a, &b]), [4, 0]);
    // On, on b too: b's share is handed over, each lease once.
    let before = a.terms();
    b.respread(Some(spread_cfg())).await;
    settle(&[&a, &b], &leases, &[2, 2], Duration::from_secs(20)).await;
    let preferred = assign(&leases, &ab);
    for l in &leases {
        let by = if a.leads(l) { "a" } else { "b" };
        assert_eq!(preferred[l], by, "{l}");
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    no_overlap(&[&a, &b], &leases);
    assert_eq!(leads(&[&a, &b]), [2, 2]);
    let moved: Vec<u64> = a.terms().iter().zip(&before).map(|(t, b)| t - b).collect();
    assert!(moved.iter().all(|m| *m <= 1), "a lease moved twice: {moved:?}");
    // New settings on b (its spreader replaced, its record released
    // and taken again): nothing moves.
    let terms = (a.terms(), b.terms());
    let slower = SpreadConfig {
        settle: Duration::from_secs(3),
        head_start: Duration::from_secs(1),
        ..spread_cfg()
    };
    b.respread(Some(slower)).await;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        no_overlap(&[&a, &b], &leases);
    }
    assert_eq!((a.terms(), b.terms()), terms, "a lease moved");
    assert_eq!(leads(&[&a, &b]), [2, 2]);
    b.counts(2, Duration::ZERO).await;
    // a yields one of its leases for a minute, and turns spreading
    // off: its stand-by is left alone, the others contend.
    let i = a
        .views
        .iter()
        .position(|(_, v)| v.borrow().status.is_leading())
        .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    a.intents[i].send_replace(Intent::StandBy { until });
    a.respread(None).await;
    assert_eq!(*a.intents[i].borrow(), Intent::StandBy { until });
    for (j, intent) in a.intents.iter().enumerate().filter(|(j, _)| *j != i) {
        assert_eq!(*intent.borrow(), Intent::Contend, "{}", leases[j]);
    }
    // b, still spreading, takes the yielded lease; then b turns it off.
    let mut rx = b.views[i].1.clone();
    timeout(Duration::from_secs(5), rx.wait_for(|v| v.status.is_leading()))
        .await
        .expect("b takes the yielded lease")
        .unwrap();
    b.respread(None).await;
    assert!(b.intents.iter().all(|i| *i.borrow() == Intent::Contend));
    // Nothing steers any more: nothing moves, past the stand-by too.
    let terms = (a.terms(), b.terms());
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        no_overlap(&[&a, &b], &leases);
    }
    assert_eq!((a.terms(), b.terms()), terms, "a lease moved");
    assert_eq!(leads(&[&a, &b]), [1, 3]);
    // Both records released: the other host is not counted.
    for id in ["a", "b"] {
        let record = store.client().get(&member_lease(id)).await.unwrap();
        assert!(
            record.is_none_or(|v| v.record.holder().is_none()),
            "{id}'s record"
        );
    }
}

/// Drains `h` as `baton drain` does: marked draining, every elector told
/// to drain; or resumes it.
fn drain(h: &Host, draining: bool) {
    h.host.set_draining(draining);
    for intent in &h.intents {
        intent.send_replace(if draining { Intent::Drain } else { Intent::Contend });
    }
}

#[tokio::test(start_paused = true)]
async fn a_draining_host_is_left_out_takes_nothing_and_gets_its_share_back_after_resume() {
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let leases = names("lease-", 6);
    let a = Host::start(&store, &clock, "a", &leases);
    let b = Host::start(&store, &clock, "b", &leases);
    let c = Host::start(&store, &clock, "c", &leases);
    let all = [&a, &b, &c];
    settle(&all, &leases, &[2, 2, 2], Duration::from_secs(20)).await;
    // b drains: its two leases go to a and c, in the next term, and the
    // spreaders of a and c leave b out (its record says it drains).
    let before = b.terms();
    drain(&b, true);
    // Taken at once (the release says b yielded them), by whichever of a
    // and c is first; then spread 3 and 3.
    let drained = Instant::now();
    loop {
        no_overlap(&all, &leases);
        let l = leads(&all);
        if l[1] == 0 && l[0] + l[2] == 6 {
            break;
        }
        assert!(
            drained.elapsed() < Duration::from_secs(1),
            "b's leases not taken: {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    settle(&all, &leases, &[3, 0, 3], Duration::from_secs(10)).await;
    for (i, (lease, view)) in b.views.iter().enumerate() {
        let term = a.views[i]
            .1
            .borrow()
            .status
            .term
            .max(c.views[i].1.borrow().status.term);
        assert!(term >= before[i], "{lease}");
        assert!(!view.borrow().status.is_leading());
    }
    // A lease that went to the host the new view does not prefer moves
    // once more, after the settle time; then it is steady while b drains:
    // nothing goes back to b, nothing moves.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = a.terms();
    for (i, lease) in leases.iter().enumerate() {
        assert!(
            after[i] <= before[i] + 2,
            "{lease} moved more than twice: {before:?} -> {after:?}"
        );
    }
    let terms = (a.terms(), c.terms());
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        no_overlap(&all, &leases);
        assert_eq!(leads(&all), [3, 0, 3]);
    }
    assert_eq!((a.terms(), c.terms()), terms, "a lease moved while b drained");
    assert!(
        b.intents.iter().all(|i| *i.borrow() == Intent::Drain),
        "a drain was overwritten"
    );
    let record = store.client().get(&member_lease("b")).await.unwrap().unwrap();
    assert!(
        record.record.host.as_ref().is_some_and(|h| h.draining),
        "{record:?}"
    );
    // Resumed: its share comes back, the graceful way.
    drain(&b, false);
    settle(&all, &leases, &[2, 2, 2], Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    no_overlap(&all, &leases);
    assert_eq!(leads(&all), [2, 2, 2]);
}

#[tokio::test(start_paused = true)]
async fn hosts_take_shares_in_proportion_to_their_weights_from_the_records() {
    let store = MemoryStore::new();
    let clock = TermClock::paused();
    let leases = names("lease-", 6);
    let mut a = Host::start_with(&store, &clock, "a", &leases, None);
    a.host.modify(|h| h.weight = 2);
    a.respread(Some(spread_cfg())).await;
    let b = Host::start(&store, &clock, "b", &leases);
    // 6 * 2 / 3 and 6 * 1 / 3: both hosts compute it, a's weight read
    // from its membership record.
    settle(&[&a, &b], &leases, &[4, 2], Duration::from_secs(30)).await;
    let members = [
        Member {
            identity: "a".into(),
            weight: 2,
        },
        Member::new("b"),
    ];
    let placed: BTreeMap<String, Placement> =
        leases.iter().map(|l| (l.clone(), Placement::default())).collect();
    let want = assign_placed(&placed, &members);
    tokio::time::sleep(Duration::from_secs(20)).await;
    for l in &leases {
        let by = if a.leads(l) { "a" } else { "b" };
        assert_eq!(want[l], by, "{l}");
    }
}
