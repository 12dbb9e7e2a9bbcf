package benchmarks

import (
	"runtime"
	"testing"
	"time"

	"github.com/kilat-dev/ratelimit"
)

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// track counts one request from each of the clients from, from+1, ..., from+n-1 at now.
func track(b *testing.B, l *ratelimit.Limiter, from, n int, now time.Time) {
	r := clientRequest(0)
	for i := from; i < from+n; i++ {
		r.RemoteAddr = clientRequest(i).RemoteAddr
		if res, err := l.AllowAt(r, now); err != nil || !res.Allowed {
			b.Fatalf("client %d: %+v, %v", i, res, err)
		}
	}
}

// BenchmarkMemoryPerClient tracks 1,000,000 distinct clients in a MemoryKV, through the limiter
// (keys "ratelimit:global:10.x.y.z"), and reports the live heap they hold per client (target:
// at most 128 B). ns/op is the time to track all of them. With -short it tracks 100,000.
func BenchmarkMemoryPerClient(b *testing.B) {
	clients := 1_000_000
	if testing.Short() {
		clients = 100_000
	}
	var perClient float64
	for range b.N {
		store := ratelimit.NewMemoryKV()
		l, err := ratelimit.New(ratelimit.Options{Scope: "global", Max: 200, Window: time.Minute, Store: store})
		if err != nil {
			b.Fatal(err)
		}
		before := liveHeap()
		track(b, l, 0, clients, time.Now())
		after := liveHeap()
		if store.Len() != clients {
			b.Fatalf("Len = %d, want %d", store.Len(), clients)
		}
		perClient = float64(after-before) / float64(clients)
		runtime.KeepAlive(l)
	}
	b.ReportMetric(perClient, "B/client")
}

// BenchmarkMemoryFlood sends 50,000 new clients in every one of 40 one-minute windows, on an
// injected clock, 2,000,000 clients in all. It reports the live heap after window 5 and after the
// last window: the same, because counters expire two windows after their last request and their
// shard gives the memory back. With -short it sends 5,000 clients per window.
func BenchmarkMemoryFlood(b *testing.B) {
	const (
		windows = 40
		window  = time.Minute
	)
	perWindow := 50_000
	if testing.Short() {
		perWindow = 5_000
	}
	var early, last uint64
	var entries int
	for range b.N {
		now := time.Unix(1_700_000_040, 0)
		clock := func() time.Time { return now }
		store := ratelimit.NewMemoryKV(ratelimit.WithClock(clock))
		l, err := ratelimit.New(ratelimit.Options{Scope: "global", Max: 200, Window: window, Store: store, Now: clock})
		if err != nil {
			b.Fatal(err)
		}
		base := liveHeap()
		for w := range windows {
			track(b, l, w*perWindow, perWindow, now)
			if w == 5 {
				early = liveHeap() - base
			}
			now = now.Add(window)
		}
		last = liveHeap() - base
		entries = store.Len()
		runtime.KeepAlive(l)
	}
	b.ReportMetric(float64(early)/(1<<20), "MiB-live-window5")
	b.ReportMetric(float64(last)/(1<<20), "MiB-live-window40")
	b.ReportMetric(float64(entries), "entries-at-end")
}
