package ratelimit

import (
	"net/http"
	"testing"
	"time"
)

// Allocation guards for the hot path, counted rather than timed so that they hold on any machine:
// through Limiter.Handler with a MemoryKV, a request from a client the store already holds.

func TestHandlerAllocs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers HeaderStyle
		max     int
		status  int
		allocs  float64
	}{
		{"allow/HeadersNone", HeadersNone, 1 << 30, http.StatusOK, 0},
		{"allow/HeadersStandard", HeadersStandard, 1 << 30, http.StatusOK, 2},
		// A denied response's one allocation is its own header slices (Retry-After and the
		// rest); the header text is shared.
		{"deny/HeadersNone", HeadersNone, 1, http.StatusTooManyRequests, 1},
		{"deny/HeadersStandard", HeadersStandard, 1, http.StatusTooManyRequests, 1},
		{"deny/HeadersBoth", HeadersBoth, 1, http.StatusTooManyRequests, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(Options{Scope: "alloc", Max: tc.max, Window: time.Hour, Store: NewMemoryKV(), Headers: tc.headers})
			if err != nil {
				t.Fatal(err)
			}
			h := l.Handler(benchOK)
			r := benchRequest(t, 1)
			w := newBenchWriter()
			for range 2 { // the first request creates the client's entry
				w.reset()
				h.ServeHTTP(w, r)
			}
			got := testing.AllocsPerRun(200, func() {
				w.reset()
				h.ServeHTTP(w, r)
			})
			if w.status != tc.status {
				t.Fatalf("status %d, want %d", w.status, tc.status)
			}
			if got > tc.allocs {
				t.Errorf("%v allocations per request, want at most %v", got, tc.allocs)
			}
		})
	}
}

// TestIncrementAllocs guards the store alone: counting an existing key allocates nothing, whether
// the key is a string (Increment) or the limiter's stack buffer (increment).
func TestIncrementAllocs(t *testing.T) {
	m := NewMemoryKV()
	window := time.Now().Truncate(time.Hour)
	key := "ratelimit:alloc:192.0.2.1"
	if _, err := m.Increment(t.Context(), key, window, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := testing.AllocsPerRun(200, func() { _, _ = m.Increment(t.Context(), key, window, time.Hour) }); got != 0 {
		t.Errorf("Increment: %v allocations, want 0", got)
	}
	buf := []byte(key)
	if got := testing.AllocsPerRun(200, func() { increment(m, buf, window.UnixNano(), time.Hour) }); got != 0 {
		t.Errorf("increment: %v allocations, want 0", got)
	}
}

// TestHeaderValuesAreNotShared: whoever edits one response's headers in place, or appends to
// them, cannot change what another response carries, allowed or denied.
func TestHeaderValuesAreNotShared(t *testing.T) {
	for _, limit := range []int{1 << 30, 1} { // allowed responses, then denied ones
		l, err := New(Options{Scope: "shared", Max: limit, Window: time.Hour, Store: NewMemoryKV(), Headers: HeadersBoth})
		if err != nil {
			t.Fatal(err)
		}
		h := l.Handler(benchOK)
		r := benchRequest(t, 1)
		if limit == 1 {
			h.ServeHTTP(newBenchWriter(), r) // the one allowed request
		}
		first := newBenchWriter()
		h.ServeHTTP(first, r)
		for name, values := range first.h {
			values[0] = "tampered"
			first.h.Add(name, "appended")
		}
		second := newBenchWriter()
		h.ServeHTTP(second, r)
		for name, values := range second.h {
			if len(values) != 1 || values[0] == "tampered" {
				t.Errorf("max %d: second response %s = %q", limit, name, values)
			}
		}
	}
}

// TestCachedRateLimitValues: RateLimit values shared through the layer's cache are those of the
// request at hand, as the remaining count and the seconds left change.
func TestCachedRateLimitValues(t *testing.T) {
	now := time.Unix(1_700_000_040, 0) // a window start for 60 s windows
	clock := func() time.Time { return now }
	l, err := New(Options{Scope: "cache", Max: 10, Window: time.Minute, Store: NewMemoryKV(WithClock(clock)), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Handler(benchOK)
	a, b, c := benchRequest(t, 1), benchRequest(t, 2), benchRequest(t, 3)
	steps := []struct {
		r       *http.Request
		advance time.Duration
		want    string
	}{
		{a, 0, `"cache";r=9;t=60`},
		{b, 0, `"cache";r=9;t=60`},
		{a, 0, `"cache";r=8;t=60`},
		{c, 1500 * time.Millisecond, `"cache";r=9;t=59`},
		{a, 0, `"cache";r=7;t=59`},
		{b, 57 * time.Second, `"cache";r=8;t=2`},
		{b, 2 * time.Second, `"cache";r=9;t=60`}, // a new window
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		w := newBenchWriter()
		h.ServeHTTP(w, s.r)
		if got := w.h.Get("RateLimit"); got != s.want {
			t.Errorf("step %d (%s): RateLimit %q, want %q", i, s.r.RemoteAddr, got, s.want)
		}
	}
}

// TestResetMatchesTimeSub: the integer arithmetic of the hot path gives the Reset that
// time.Time.Sub gives, near the epoch, today, and beyond the years Unix nanoseconds can hold.
func TestResetMatchesTimeSub(t *testing.T) {
	l, err := New(Options{Scope: "reset", Max: 1 << 30, Window: time.Hour, Store: NewMemoryKV()})
	if err != nil {
		t.Fatal(err)
	}
	r := benchRequest(t, 1)
	for _, now := range []time.Time{
		time.Unix(0, 1),
		time.Unix(1_764_400_000, 123_456_789),
		time.Date(2261, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(2300, 1, 1, 0, 30, 0, 0, time.UTC),
		time.Date(1600, 1, 1, 0, 30, 0, 5, time.UTC),
	} {
		res, err := l.AllowAt(r, now)
		if err != nil {
			t.Fatal(err)
		}
		sec := now.Unix()
		start := sec - sec%3600
		if start > sec {
			start -= 3600 // floor, not toward zero, before 1970
		}
		if res.Reset <= 0 || res.Reset > time.Hour {
			t.Errorf("at %v: Reset %v is outside the window", now, res.Reset)
		}
		if want := time.Unix(start+3600, 0).Sub(now); res.Reset != want {
			t.Errorf("at %v: Reset %v, want %v", now, res.Reset, want)
		}
	}
}
