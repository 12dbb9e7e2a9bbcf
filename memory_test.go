package ratelimit

import (
	"runtime"
	"strconv"
	"testing"
	"time"
)

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// ipv4Client returns the RemoteAddr of client number i, a distinct IPv4 address for i < 2^24.
func ipv4Client(i int) string {
	return "10." + strconv.Itoa(i>>16&0xff) + "." + strconv.Itoa(i>>8&0xff) + "." + strconv.Itoa(i&0xff) + ":40000"
}

// trackClients counts one request from each of n distinct clients, from, from+1, ..., through
// l.AllowAt at now.
func trackClients(tb testing.TB, l *Limiter, from, n int, now time.Time) {
	tb.Helper()
	r := benchRequest(tb, 0)
	for i := from; i < from+n; i++ {
		r.RemoteAddr = ipv4Client(i)
		if res, err := l.AllowAt(r, now); err != nil || !res.Allowed {
			tb.Fatalf("client %d: %+v, %v", i, res, err)
		}
	}
}

// TestMemoryPerClient reports the live heap a MemoryKV holds per tracked client (the benchmarks
// module measures it over 1,000,000 clients) and guards it loosely.
func TestMemoryPerClient(t *testing.T) {
	const clients = 50_000
	store := NewMemoryKV()
	l, err := New(Options{Scope: "global", Max: 100, Window: time.Minute, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	before := liveHeap()
	trackClients(t, l, 0, clients, time.Now())
	after := liveHeap()
	if store.Len() != clients {
		t.Fatalf("Len = %d, want %d", store.Len(), clients)
	}
	perClient := float64(after-before) / clients
	t.Logf("%.1f bytes per tracked client (%d clients, keys like %q)", perClient, clients, "ratelimit:global:10.0.195.79")
	if perClient > 192 {
		t.Errorf("%.1f bytes per tracked client, want at most 192", perClient)
	}
	runtime.KeepAlive(l)
}

// TestMemoryFlatUnderFlood sends a flood of clients never seen before, window after window, on an
// injected clock: once the first windows have expired, the live heap stops growing.
func TestMemoryFlatUnderFlood(t *testing.T) {
	const (
		perWindow = 5_000
		windows   = 24
		window    = time.Minute
	)
	now := time.Unix(1_700_000_040, 0)
	clock := func() time.Time { return now }
	store := NewMemoryKV(WithClock(clock))
	l, err := New(Options{Scope: "global", Max: 100, Window: window, Store: store, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	var heap [windows]uint64
	var entries [windows]int
	for w := range windows {
		trackClients(t, l, w*perWindow, perWindow, now)
		heap[w] = liveHeap()
		entries[w] = store.Len()
		now = now.Add(window)
	}
	t.Logf("entries per window: %v", entries)
	t.Logf("live heap per window (KiB): %v", kib(heap[:]))
	// A counter lives for twice the window, and a shard sweeps when it next gets a new entry:
	// at most about three windows of clients are held at any time.
	for w := 4; w < windows; w++ {
		if entries[w] > 3*perWindow {
			t.Errorf("window %d: %d entries, want at most %d", w, entries[w], 3*perWindow)
		}
	}
	settled := heap[6]
	if last := heap[windows-1]; float64(last) > 1.5*float64(settled)+256<<10 {
		t.Errorf("live heap grew from %d KiB (window 6) to %d KiB (window %d)", settled>>10, last>>10, windows-1)
	}
}

func kib(v []uint64) []uint64 {
	out := make([]uint64, len(v))
	for i, b := range v {
		out[i] = b >> 10
	}
	return out
}
