package benchmarks

import (
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Settings of the benchmarks. The allow scenarios use a limit no benchmark can reach; the deny
// scenario uses a small one and exhausts its client before the timer starts.
const (
	allowLimit  = 1 << 30
	allowWindow = time.Hour
	denyLimit   = 5
	denyWindow  = time.Hour

	distinctClients  = 100_000
	clientsPerWorker = 1024
	maxWorkers       = 64
)

var (
	addrsOnce     sync.Once
	distinctAddrs []string   // the RemoteAddr of distinctClients clients
	workerAddrs   [][]string // maxWorkers disjoint sets of clientsPerWorker clients
)

// prebuilt builds every client address once, before any timer runs, and shares them between
// contenders. A scenario with many clients reuses one request and sets its RemoteAddr: a
// request per client would make the harness's live heap (100,000 requests) larger than most
// contenders' own, and the garbage collector's work with it.
func prebuilt() {
	addrsOnce.Do(func() {
		distinctAddrs = clientAddrs(0, distinctClients)
		workerAddrs = make([][]string, maxWorkers)
		for g := range workerAddrs {
			workerAddrs[g] = clientAddrs(1<<20+g*clientsPerWorker, clientsPerWorker)
		}
	})
}

func clientAddrs(from, n int) []string {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = clientRequest(from + i).RemoteAddr
	}
	return addrs
}

// BenchmarkLimiters runs every contender through four scenarios:
//
//   - one: a single client, allowed;
//   - distinct: 100,000 distinct clients cycled (all seen once before the timer), allowed;
//   - parallel: b.RunParallel, each goroutine cycling its own 1,024 clients, allowed;
//   - deny: a single client over its limit, every request answered 429.
//
// Requests and client addresses are built and the response writer allocated before the timer;
// the writer's header map is cleared between requests.
func BenchmarkLimiters(b *testing.B) {
	prebuilt()
	for _, sc := range []struct {
		name string
		run  func(b *testing.B, c contender)
	}{
		{"one", benchOne},
		{"distinct", benchDistinct},
		{"parallel", benchParallel},
		{"deny", benchDeny},
	} {
		for _, c := range contenders {
			if sc.name == "deny" && !c.limiter {
				continue // the baseline never denies
			}
			b.Run("scenario="+sc.name+"/limiter="+c.name, func(b *testing.B) { sc.run(b, c) })
		}
	}
}

func benchOne(b *testing.B, c contender) {
	h := c.wrap(b, allowLimit, allowWindow, okHandler)
	r := clientRequest(7)
	w := newRecorder()
	h.ServeHTTP(w, r)
	cpu := startTimer(b)
	for range b.N {
		w.reset()
		h.ServeHTTP(w, r)
	}
	stopTimer(b, cpu)
	mustStatus(b, w, http.StatusOK)
}

func benchDistinct(b *testing.B, c contender) {
	h := c.wrap(b, allowLimit, allowWindow, okHandler)
	w := newRecorder()
	r := clientRequest(0)
	for _, addr := range distinctAddrs {
		w.reset()
		r.RemoteAddr = addr
		h.ServeHTTP(w, r)
	}
	cpu := startTimer(b)
	i := 0
	for range b.N {
		w.reset()
		r.RemoteAddr = distinctAddrs[i]
		h.ServeHTTP(w, r)
		if i++; i == len(distinctAddrs) {
			i = 0
		}
	}
	stopTimer(b, cpu)
	mustStatus(b, w, http.StatusOK)
}

func benchParallel(b *testing.B, c contender) {
	h := c.wrap(b, allowLimit, allowWindow, okHandler)
	w := newRecorder()
	r := clientRequest(0)
	for _, addrs := range workerAddrs {
		for _, addr := range addrs {
			w.reset()
			r.RemoteAddr = addr
			h.ServeHTTP(w, r)
		}
	}
	var next, failed atomic.Int64
	cpu := startTimer(b)
	b.RunParallel(func(pb *testing.PB) {
		addrs := workerAddrs[int(next.Add(1)-1)%maxWorkers]
		r := clientRequest(0)
		w := newRecorder()
		w.status = http.StatusOK // a goroutine may get no iteration at all
		i := 0
		for pb.Next() {
			w.reset()
			r.RemoteAddr = addrs[i]
			h.ServeHTTP(w, r)
			if i++; i == len(addrs) {
				i = 0
			}
		}
		if w.status != http.StatusOK {
			failed.Add(1)
		}
	})
	stopTimer(b, cpu)
	if failed.Load() > 0 {
		b.Fatalf("%d goroutines ended on a status other than 200", failed.Load())
	}
}

func benchDeny(b *testing.B, c contender) {
	h := c.wrap(b, denyLimit, denyWindow, okHandler)
	r := clientRequest(9)
	w := newRecorder()
	for range denyLimit + 1 {
		w.reset()
		h.ServeHTTP(w, r)
	}
	mustStatus(b, w, http.StatusTooManyRequests)
	cpu := startTimer(b)
	for range b.N {
		w.reset()
		h.ServeHTTP(w, r)
	}
	stopTimer(b, cpu)
	mustStatus(b, w, http.StatusTooManyRequests)
}

// startTimer starts the benchmark's timer and returns the process's CPU time so far. It first
// collects the garbage of the setup (the shared requests, the warm-up), so that the collection
// the setup made due does not land on whichever contender happens to allocate first.
func startTimer(b *testing.B) int64 {
	b.ReportAllocs()
	runtime.GC()
	b.ResetTimer()
	return processCPU()
}

// stopTimer stops the timer and reports, next to the wall-clock ns/op, the CPU time per request
// (cpu-ns/op): on a shared, loaded machine the wall clock also counts the time other processes
// held the CPU, while CPU time counts only this process (the contender, its goroutines and the
// garbage collector it keeps busy). For the parallel scenario it is summed over all cores.
func stopTimer(b *testing.B, start int64) {
	end := processCPU()
	b.StopTimer()
	if start >= 0 && end >= start && b.N > 0 {
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
	}
}

func mustStatus(b *testing.B, w *recorder, want int) {
	b.Helper()
	if w.status != want {
		b.Fatalf("last response: status %d, want %d", w.status, want)
	}
}
