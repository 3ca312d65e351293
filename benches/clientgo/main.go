// Command clientgo-elector is client-go's leader election as a typical
// controller uses it, for benches/versus_client_go.rs: one
// k8s.io/client-go/tools/leaderelection elector on a coordination.k8s.io/v1
// Lease (resourcelock.LeaseLock), ReleaseOnCancel set, cancelled by SIGTERM
// or SIGINT. While it leads it "acts" every -act-every (100 ms by default),
// as the bench's baton guest ticks.
//
// It prints one JSON object a line on stdout, each with the wall-clock
// time in microseconds since the Unix epoch ("us") taken just before the
// line is written:
//
//	{"us":...,"event":"started"}     OnStartedLeading was called
//	{"us":...,"event":"act","n":N}   an act while leading (the first is at once)
//	{"us":...,"event":"stopped"}     OnStoppedLeading was called
//	{"us":...,"event":"leader","leader":"ID"}  OnNewLeader
//	{"us":...,"event":"exit"}        RunOrDie returned (after the release)
//
// klog writes to stderr. The requests carry the user agent
// "clientgo-elector/<identity>", so an API server's audit log tells the
// processes apart.
//
// Built by benches/clientgo/build.sh inside a copy of the Kubernetes 1.20
// source tree (client-go from its staging folder, the rest vendored).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

var out sync.Mutex

func emit(event string, extra string) {
	out.Lock()
	defer out.Unlock()
	us := time.Now().UnixNano() / 1000
	fmt.Fprintf(os.Stdout, "{\"us\":%d,\"event\":%q%s}\n", us, event, extra)
}

func main() {
	// client-go jitters its retries with math/rand's global source, which
	// Go before 1.20 does not seed: every process would draw the same
	// "random" waits. Kubernetes' own commands seed it at start, so do we.
	rand.Seed(time.Now().UnixNano())
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (required)")
	name := flag.String("lease", "bench", "the Lease's name")
	namespace := flag.String("namespace", "default", "the Lease's namespace")
	identity := flag.String("identity", "", "this elector's identity (required)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	actEvery := flag.Duration("act-every", 100*time.Millisecond, "how often to act while leading")
	flag.Parse()
	if *kubeconfig == "" || *identity == "" {
		fmt.Fprintln(os.Stderr, "clientgo-elector: -kubeconfig and -identity are required")
		os.Exit(2)
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	config.UserAgent = "clientgo-elector/" + *identity
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		cancel()
	}()

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		ReleaseOnCancel: true,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		Name:            *name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				emit("started", "")
				// The work a controller does while it leads: it stops
				// when the context is cancelled, which client-go does
				// once a renewal has failed (or on SIGTERM).
				ticker := time.NewTicker(*actEvery)
				defer ticker.Stop()
				for n := 1; ; n++ {
					emit("act", fmt.Sprintf(",\"n\":%d", n))
					select {
					case <-ctx.Done():
						return
					case <-ticker.C:
					}
				}
			},
			OnStoppedLeading: func() {
				emit("stopped", "")
			},
			OnNewLeader: func(id string) {
				emit("leader", fmt.Sprintf(",\"leader\":%q", id))
			},
		},
	})
	emit("exit", "")
}
