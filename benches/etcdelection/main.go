// Command etcd-elector is etcd's own leader election as a typical service
// uses it, for benches/versus_etcd_election.rs: the clientv3 3.4 client's
// go.etcd.io/etcd/clientv3/concurrency package, a Session (an etcd lease
// kept alive by the client, TTL -ttl) and an Election on a key prefix.
// Campaign blocks until this process leads; while it leads it "acts" every
// -act-every (100 ms by default), as the bench's baton guest ticks, until
// its session ends (the lease expired or could not be kept alive) or
// SIGTERM/SIGINT, on which it Resigns (deletes its key, so that the next
// candidate leads at once), closes its session (revokes its lease) and
// exits. A session that ends while it leads (it was frozen past its TTL,
// or cut off) stops the acts; it campaigns again on a new session, as a
// long-running service would.
//
// It prints one JSON object a line on stdout, each with the wall-clock
// time in microseconds since the Unix epoch ("us") taken just before the
// line is written, in the format of benches/clientgo/main.go:
//
//	{"us":...,"event":"campaign"}    about to Campaign (on a new session)
//	{"us":...,"event":"leader","leader":"ID"}  its key is in, and ID leads
//	                                 (the first-created key's value)
//	{"us":...,"event":"started"}     Campaign returned: it leads
//	{"us":...,"event":"act","n":N}   an act while leading (the first is at once)
//	{"us":...,"event":"stopped"}     the acts stopped (session ended, or SIGTERM)
//	{"us":...,"event":"exit"}        resigned and closed, about to exit
//
// With -elections N > 1 (the idle CPU measure), the process campaigns in N
// elections at once, on prefixes <prefix>/0000 ... (one session each, or
// one shared with -shared-session), acts in none and prints
// {"event":"leading","count":N} once it leads all N.
//
// The client's own log (zap) goes to stderr.
//
// Built by benches/etcdelection/build.sh against Debian's
// golang-etcd-server-dev 3.4.23 (/usr/share/gocode), GOPATH mode, offline.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

var out sync.Mutex

func emit(event string, extra string) {
	out.Lock()
	defer out.Unlock()
	us := time.Now().UnixNano() / 1000
	fmt.Fprintf(os.Stdout, "{\"us\":%d,\"event\":%q%s}\n", us, event, extra)
}

func main() {
	endpoints := flag.String("endpoints", "http://127.0.0.1:2379", "etcd client URLs, comma-separated")
	prefix := flag.String("prefix", "/etcd-election/bench", "the election's key prefix")
	identity := flag.String("identity", "", "this elector's identity, the value it campaigns with (required)")
	ttl := flag.Duration("ttl", 15*time.Second, "the session's TTL (etcd counts whole seconds: rounded up)")
	actEvery := flag.Duration("act-every", 100*time.Millisecond, "how often to act while leading (0: never)")
	elections := flag.Int("elections", 1, "how many elections to campaign in (prefixes <prefix>/NNNN when more than one)")
	shared := flag.Bool("shared-session", false, "with -elections > 1: one session for all of them")
	dialTimeout := flag.Duration("dial-timeout", 2*time.Second, "the client's dial timeout")
	resignTimeout := flag.Duration("resign-timeout", 2*time.Second, "the bound on Resign and on closing the session at exit")
	flag.Parse()
	if *identity == "" {
		fmt.Fprintln(os.Stderr, "etcd-elector: -identity is required")
		os.Exit(2)
	}
	ttlSecs := int((*ttl + time.Second - 1) / time.Second)

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: *dialTimeout,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd-elector: client: %v\n", err)
		os.Exit(1)
	}
	defer cli.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		cancel()
	}()

	if *elections > 1 {
		many(ctx, cli, *prefix, *identity, ttlSecs, *elections, *shared, *resignTimeout)
		emit("exit", "")
		return
	}
	for ctx.Err() == nil {
		one(ctx, cli, *prefix, *identity, ttlSecs, *actEvery, *resignTimeout)
	}
	emit("exit", "")
}

// one campaigns on a new session and, once it leads, acts until the
// session ends or ctx is cancelled. It returns to campaign again, or
// resigned and closed when ctx was cancelled.
func one(ctx context.Context, cli *clientv3.Client, prefix, identity string, ttl int, actEvery, resignTimeout time.Duration) {
	// The session's keep-alive is not tied to ctx: on SIGTERM the leader
	// resigns first, then revokes its lease.
	session, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "etcd-elector: session: %v\n", err)
			time.Sleep(time.Second)
		}
		return
	}
	e := concurrency.NewElection(session, prefix)
	closeSession := func() {
		cctx, ccancel := context.WithTimeout(context.Background(), resignTimeout)
		defer ccancel()
		// Revokes the lease, which deletes every key attached to it.
		cli.Revoke(cctx, session.Lease())
		session.Orphan()
	}
	emit("campaign", "")
	// Tells the bench when this candidate's key is in (Campaign's first
	// request) and who leads: a few reads at start only.
	campaigned := make(chan struct{})
	go func() {
		key := fmt.Sprintf("%s/%x", prefix, session.Lease())
		for {
			select {
			case <-campaigned:
				return
			case <-time.After(5 * time.Millisecond):
			}
			r, err := cli.Get(ctx, key)
			if err != nil || len(r.Kvs) == 0 {
				continue
			}
			if l, err := e.Leader(ctx); err == nil && len(l.Kvs) > 0 {
				emit("leader", fmt.Sprintf(",\"leader\":%q", string(l.Kvs[0].Value)))
			}
			return
		}
	}()
	err = e.Campaign(ctx, identity)
	close(campaigned)
	if err != nil {
		// Cancelled (Campaign resigned its key), or an error: campaign again
		// on a new session.
		if ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "etcd-elector: campaign: %v\n", err)
		}
		closeSession()
		return
	}
	emit("started", "")
	var tick <-chan time.Time
	if actEvery > 0 {
		ticker := time.NewTicker(actEvery)
		defer ticker.Stop()
		tick = ticker.C
		emit("act", ",\"n\":1")
	}
	for n := 2; ; n++ {
		select {
		case <-ctx.Done():
			emit("stopped", "")
			rctx, rcancel := context.WithTimeout(context.Background(), resignTimeout)
			if err := e.Resign(rctx); err != nil {
				fmt.Fprintf(os.Stderr, "etcd-elector: resign: %v\n", err)
			}
			rcancel()
			closeSession()
			return
		case <-session.Done():
			// The lease expired, or keeping it alive failed: this process
			// no longer leads.
			emit("stopped", "")
			session.Orphan()
			return
		case <-tick:
			emit("act", fmt.Sprintf(",\"n\":%d", n))
		}
	}
}

// many campaigns in n elections at once and waits for ctx, leading
// (and acting in) none but holding all it wins. For the idle CPU measure:
// a standby elsewhere is not part of it.
func many(ctx context.Context, cli *clientv3.Client, prefix, identity string, ttl, n int, shared bool, resignTimeout time.Duration) {
	var one *concurrency.Session
	session := func() *concurrency.Session {
		if shared && one != nil {
			return one
		}
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcd-elector: session: %v\n", err)
			os.Exit(1)
		}
		one = s
		return s
	}
	sessions := make([]*concurrency.Session, n)
	electionsOf := make([]*concurrency.Election, n)
	for i := 0; i < n; i++ {
		sessions[i] = session()
		electionsOf[i] = concurrency.NewElection(sessions[i], fmt.Sprintf("%s/%04d", prefix, i))
	}
	var leading int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := electionsOf[i].Campaign(ctx, identity); err != nil {
				if ctx.Err() == nil {
					fmt.Fprintf(os.Stderr, "etcd-elector: campaign %d: %v\n", i, err)
				}
				return
			}
			if atomic.AddInt64(&leading, 1) == int64(n) {
				emit("leading", fmt.Sprintf(",\"count\":%d", n))
			}
		}(i)
	}
	wg.Wait()
	<-ctx.Done()
	cctx, ccancel := context.WithTimeout(context.Background(), resignTimeout)
	defer ccancel()
	seen := map[clientv3.LeaseID]bool{}
	for _, s := range sessions {
		if !seen[s.Lease()] {
			seen[s.Lease()] = true
			cli.Revoke(cctx, s.Lease())
			s.Orphan()
		}
	}
}
