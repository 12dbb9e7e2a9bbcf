package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// In-package benchmarks of the hot path; benchmarks/ compares the library with other limiters.

// benchWriter is a reusable http.ResponseWriter whose header map is cleared between requests.
type benchWriter struct {
	h      http.Header
	status int
}

func (w *benchWriter) Header() http.Header { return w.h }
func (w *benchWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *benchWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}
func (w *benchWriter) reset() { clear(w.h); w.status = 0 }

func newBenchWriter() *benchWriter { return &benchWriter{h: make(http.Header, 8)} }

var (
	benchBody = []byte("ok\n")
	benchOK   = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(benchBody) })
)

func benchRequest(tb testing.TB, i int) *http.Request {
	tb.Helper()
	r, err := http.NewRequest(http.MethodGet, "http://example.com/", nil)
	if err != nil {
		tb.Fatal(err)
	}
	r.RemoteAddr = ipv4Client(i)
	return r
}

func benchHandler(tb testing.TB, max int, headers HeaderStyle) http.Handler {
	tb.Helper()
	l, err := New(Options{Scope: "bench", Max: max, Window: time.Hour, Store: NewMemoryKV(), Headers: headers})
	if err != nil {
		tb.Fatal(err)
	}
	return l.Handler(benchOK)
}

// runBench serves one request, from each of clients in turn, through h; every client is seen
// once before the timer starts. The request is reused: only its RemoteAddr changes.
func runBench(b *testing.B, h http.Handler, clients []string, want int) {
	r := benchRequest(b, 0)
	w := newBenchWriter()
	for _, addr := range clients {
		w.reset()
		r.RemoteAddr = addr
		h.ServeHTTP(w, r)
	}
	b.ReportAllocs()
	runtime.GC()
	b.ResetTimer()
	i := 0
	for range b.N {
		w.reset()
		r.RemoteAddr = clients[i]
		h.ServeHTTP(w, r)
		if i++; i == len(clients) {
			i = 0
		}
	}
	b.StopTimer()
	if w.status != want {
		b.Fatalf("status %d, want %d", w.status, want)
	}
}

// BenchmarkWithout is the baseline: the handler without any limiter.
func BenchmarkWithout(b *testing.B) {
	runBench(b, benchOK, []string{benchRequest(b, 1).RemoteAddr}, http.StatusOK)
}

func BenchmarkHandler(b *testing.B) {
	runBench(b, benchHandler(b, 1<<30, HeadersStandard), []string{benchRequest(b, 1).RemoteAddr}, http.StatusOK)
}

func BenchmarkHandlerNoHeaders(b *testing.B) {
	runBench(b, benchHandler(b, 1<<30, HeadersNone), []string{benchRequest(b, 1).RemoteAddr}, http.StatusOK)
}

func BenchmarkHandlerLegacyHeaders(b *testing.B) {
	runBench(b, benchHandler(b, 1<<30, HeadersLegacy), []string{benchRequest(b, 1).RemoteAddr}, http.StatusOK)
}

func BenchmarkHandlerDistinct(b *testing.B) {
	clients := make([]string, 100_000)
	for i := range clients {
		clients[i] = ipv4Client(i)
	}
	runBench(b, benchHandler(b, 1<<30, HeadersStandard), clients, http.StatusOK)
}

// BenchmarkHandlerDistinctRandom is BenchmarkHandlerDistinct with the clients met in a random
// order, as a server meets them, rather than in the order they were first counted: memory laid
// out in that order (anything allocated per client) then gives no help to the processor's
// prefetcher.
func BenchmarkHandlerDistinctRandom(b *testing.B) {
	clients := make([]string, 100_000)
	for i := range clients {
		clients[i] = ipv4Client(i)
	}
	h := benchHandler(b, 1<<30, HeadersStandard)
	r, w := benchRequest(b, 0), newBenchWriter()
	for _, addr := range clients {
		w.reset()
		r.RemoteAddr = addr
		h.ServeHTTP(w, r)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(clients), func(i, j int) { clients[i], clients[j] = clients[j], clients[i] })
	for i := range clients {
		// The addresses' own bytes in the new order: the harness's memory stays sequential.
		clients[i] = strings.Clone(clients[i])
	}
	runBench(b, h, clients, http.StatusOK)
}

func BenchmarkHandlerDeny(b *testing.B) {
	runBench(b, benchHandler(b, 1, HeadersStandard), []string{benchRequest(b, 1).RemoteAddr}, http.StatusTooManyRequests)
}

func BenchmarkHandlerParallel(b *testing.B) { benchParallel(b, HeadersStandard) }

func BenchmarkHandlerParallelNoHeaders(b *testing.B) { benchParallel(b, HeadersNone) }

// BenchmarkHandlerDenyFlood: one client over its limit floods the layer from every goroutine, as
// an attacker from one address would from many connections. The clock is fixed, so that no new
// window lets a request through mid-run.
func BenchmarkHandlerDenyFlood(b *testing.B) {
	now := time.Unix(1_800_000_030, 0)
	clock := func() time.Time { return now }
	l, err := New(Options{Scope: "bench", Max: 1, Window: time.Hour, Store: NewMemoryKV(WithClock(clock)), Now: clock})
	if err != nil {
		b.Fatal(err)
	}
	h := l.Handler(benchOK)
	r := benchRequest(b, 1) // only read by the layer: shared by the goroutines
	h.ServeHTTP(newBenchWriter(), r)
	var passed atomic.Int64
	b.ReportAllocs()
	runtime.GC()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := newBenchWriter()
		for pb.Next() {
			w.reset()
			h.ServeHTTP(w, r)
			if w.status != http.StatusTooManyRequests {
				passed.Add(1)
			}
		}
	})
	b.StopTimer()
	if passed.Load() > 0 {
		b.Fatalf("%d requests of the flooding client were let through", passed.Load())
	}
}

// benchParallel: every goroutine cycles through 1,024 clients of its own.
func benchParallel(b *testing.B, headers HeaderStyle) {
	h := benchHandler(b, 1<<30, headers)
	const perWorker = 1024
	sets := make([][]string, 64)
	for g := range sets {
		sets[g] = make([]string, perWorker)
		for i := range sets[g] {
			sets[g][i] = ipv4Client(g*perWorker + i)
		}
	}
	var next atomic.Int64
	b.ReportAllocs()
	runtime.GC()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		clients := sets[int(next.Add(1)-1)%len(sets)]
		r := benchRequest(b, 0)
		w := newBenchWriter()
		i := 0
		for pb.Next() {
			w.reset()
			r.RemoteAddr = clients[i]
			h.ServeHTTP(w, r)
			if i++; i == len(clients) {
				i = 0
			}
		}
	})
}

func BenchmarkMemoryKVIncrement(b *testing.B) {
	m := NewMemoryKV()
	ctx := context.Background()
	window := time.Unix(0, 0)
	b.ReportAllocs()
	for range b.N {
		if _, err := m.Increment(ctx, "ratelimit:bench:10.0.0.1", window, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
