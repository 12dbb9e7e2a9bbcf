package ratelimit

import (
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// Allocation guards for the hot path, counted rather than timed so that they hold on any machine:
// through Limiter.Handler with a MemoryKV, a request from a client the store already holds.

func TestHandlerAllocs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers HeaderStyle
		max     int
		layers  int
		status  int
		// Each request opens a new window of one second: with Max 1 it is allowed with nothing
		// remaining, the last request of its window.
		newWindowEach bool
	}{
		{"allow/HeadersNone", HeadersNone, 1 << 30, 1, http.StatusOK, false},
		{"allow/HeadersStandard", HeadersStandard, 1 << 30, 1, http.StatusOK, false},
		{"allow/HeadersLegacy", HeadersLegacy, 1 << 30, 1, http.StatusOK, false},
		{"allow/HeadersBoth", HeadersBoth, 1 << 30, 1, http.StatusOK, false},
		{"allow/HeadersStandard/two layers", HeadersStandard, 1 << 30, 2, http.StatusOK, false},
		{"allow last/HeadersStandard", HeadersStandard, 1, 1, http.StatusOK, true},
		{"allow last/HeadersBoth", HeadersBoth, 1, 1, http.StatusOK, true},
		{"deny/HeadersNone", HeadersNone, 1, 1, http.StatusTooManyRequests, false},
		{"deny/HeadersStandard", HeadersStandard, 1, 1, http.StatusTooManyRequests, false},
		{"deny/HeadersBoth", HeadersBoth, 1, 1, http.StatusTooManyRequests, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if raceEnabled && !(tc.headers == HeadersNone && tc.status == http.StatusOK) {
				t.Skip("sync.Pool drops the header arenas at random under the race detector; .ci/run runs this test without it")
			}
			var h http.Handler = benchOK
			for i := range tc.layers {
				opts := Options{Scope: fmt.Sprint("alloc", i), Max: tc.max, Window: time.Hour, Store: NewMemoryKV(), Headers: tc.headers}
				if tc.newWindowEach {
					var sec atomic.Int64
					sec.Store(1_800_000_000)
					clock := func() time.Time { return time.Unix(sec.Add(1), 0) }
					opts.Window, opts.Now, opts.Store = time.Second, clock, NewMemoryKV(WithClock(clock))
				}
				l, err := New(opts)
				if err != nil {
					t.Fatal(err)
				}
				h = l.Handler(h)
			}
			r := benchRequest(t, 1)
			w := newBenchWriter()
			for range 2 { // the first request creates the client's entry
				w.reset()
				h.ServeHTTP(w, r)
			}
			// Header memory comes in blocks for many responses: count over many requests, with
			// the precision testing.AllocsPerRun rounds away.
			const requests = 10_000
			got := mallocsPerRun(requests, func() {
				w.reset()
				h.ServeHTTP(w, r)
			})
			if w.status != tc.status {
				t.Fatalf("status %d, want %d", w.status, tc.status)
			}
			// No header, no allocation; with headers, a block of values or text now and then.
			// (Allocations are counted process-wide: allow for a stray one of the runtime's.)
			want := 0.1
			if tc.headers == HeadersNone && tc.status == http.StatusOK {
				want = 0.001
			}
			if got > want {
				t.Errorf("%.3f allocations per request, want at most %v", got, want)
			}
		})
	}
}

// mallocsPerRun returns the average number of heap allocations of f over runs calls, unrounded.
func mallocsPerRun(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}

// TestIncrementAllocs guards the store alone: counting an existing key allocates nothing, whether
// the key is a string (Increment) or the limiter's stack buffer (incrementAt).
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
	if got := testing.AllocsPerRun(200, func() {
		m.incrementAt(counterKeyOfBytes(m.seedsOf(), buf), window.UnixNano(), time.Hour, m.clock(), 0)
	}); got != 0 {
		t.Errorf("incrementAt: %v allocations, want 0", got)
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

// TestRateLimitValues: RateLimit values, whose seconds-left part is built once per second and
// shared, are those of the request at hand as the remaining count and the seconds left change.
func TestRateLimitValues(t *testing.T) {
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

// TestHeaderValuesOutliveLaterResponses: header values are cut from blocks shared by many
// responses; no later response, in this block or the next, overwrites an earlier one's values,
// even when every handler appends to each of its headers, which must then change nothing else in
// its own response either. Two layers also exercise the values added to another layer's.
func TestHeaderValuesOutliveLaterResponses(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	const max = 1 << 30
	// The slices each response got, before its handler appended to them: appending moves the
	// values out of the arena, so the final check of the headers alone would not see the arena's.
	got := make(map[http.ResponseWriter]http.Header)
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got[w] = maps.Clone(w.Header()) // a new map holding the same slices
		names := slices.Sorted(maps.Keys(w.Header()))
		for _, name := range names {
			w.Header()[name] = append(w.Header()[name], "appended")
		}
	})
	for _, scope := range []string{"inner", "outer"} {
		l, err := New(Options{Scope: scope, Max: max, Window: time.Hour, Store: NewMemoryKV(WithClock(clock)), Now: clock, Headers: HeadersBoth})
		if err != nil {
			t.Fatal(err)
		}
		h = l.Handler(h)
	}
	r := benchRequest(t, 1)
	const requests = 3 * arenaValues // several blocks of values and of text
	responses := make([]*benchWriter, requests)
	for i := range responses {
		responses[i] = newBenchWriter()
		h.ServeHTTP(responses[i], r)
	}
	secondsLeft := fmt.Sprint(3600 - now.Unix()%3600)
	reset := fmt.Sprint(now.Truncate(time.Hour).Add(time.Hour).Unix())
	for i, w := range responses {
		left := fmt.Sprint(max - 1 - i)
		want := http.Header{
			"Ratelimit-Policy":      {`"outer";q=1073741824;w=3600`, `"inner";q=1073741824;w=3600`, "appended"},
			"Ratelimit":             {`"outer";r=` + left + `;t=` + secondsLeft, `"inner";r=` + left + `;t=` + secondsLeft, "appended"},
			"X-Ratelimit-Limit":     {"1073741824", "appended"},
			"X-Ratelimit-Remaining": {left, "appended"},
			"X-Ratelimit-Reset":     {reset, "appended"},
		}
		if !reflect.DeepEqual(want, w.h) {
			t.Fatalf("response %d:\n got %q\nwant %q", i, w.h, want)
		}
		for name, values := range want {
			want[name] = values[:len(values)-1] // without "appended"
		}
		if !reflect.DeepEqual(want, got[w]) {
			t.Fatalf("response %d, the slices it was given:\n got %q\nwant %q", i, got[w], want)
		}
	}
}

// TestRateLimitValueCache: a value is cached once two requests need it, and then shared; a
// single client, whose remaining count changes with every request, never enters the cache.
func TestRateLimitValueCache(t *testing.T) {
	now := time.Unix(1_700_000_040, 0)
	clock := func() time.Time { return now }
	l, err := New(Options{Scope: "cache", Max: 10, Window: time.Minute, Store: NewMemoryKV(WithClock(clock)), Now: clock})
	require.NoError(t, err)
	h := l.Handler(benchOK)
	value := func(client int) string {
		w := newBenchWriter()
		h.ServeHTTP(w, benchRequest(t, client))
		return w.h.Get("RateLimit")
	}

	require.Equal(t, `"cache";r=9;t=60`, value(1))
	require.Equal(t, `"cache";r=8;t=60`, value(1))
	for slot := range l.rateLimitTexts {
		require.Nil(t, l.rateLimitTexts[slot].Load(), "values needed once are not cached")
	}

	require.Equal(t, `"cache";r=9;t=60`, value(2)) // r=9 again: now cached
	third, fourth := value(3), value(4)
	require.Equal(t, `"cache";r=9;t=60`, third)
	require.Same(t, unsafe.StringData(third), unsafe.StringData(fourth), "later clients share the cached value")

	now = now.Add(time.Second) // another second: another value, not the cached one
	require.Equal(t, `"cache";r=9;t=59`, value(5))
}

// TestHeaderArenaNeverHandsOutTextTwice: text and value slots the arena handed out stay as they
// were, across several blocks of each, and after a value outgrew the room textBuffer promises
// (which the layer's values never do).
func TestHeaderArenaNeverHandsOutTextTwice(t *testing.T) {
	var a headerArena
	var texts, wantTexts []string
	var slices [][]string
	var wantSlices [][]string
	addText := func(value string) {
		text := a.textBuffer()
		start := len(text)
		s := a.string(append(text, value...), start)
		texts = append(texts, s)
		wantTexts = append(wantTexts, value)
	}
	addValues := func(i int) {
		vals := a.values(2)
		require.Zero(t, len(vals))
		require.Equal(t, 2, cap(vals), "appending past its values must move, not write the next slice's")
		vals = append(vals, fmt.Sprint("a", i), fmt.Sprint("b", i))
		slices = append(slices, vals)
		wantSlices = append(wantSlices, []string{vals[0], vals[1]})
	}
	long := func(i int) string { // as long as the longest value the layer builds
		v := fmt.Sprint(i, ":")
		return v + strings.Repeat("x", maxValueText-len(v))
	}
	for i := range 3 * arenaText / maxValueText { // three blocks of text and more
		addText(long(i))
		addValues(i)
	}
	addText(strings.Repeat("y", arenaText)) // more than the block has left: moves to memory of its own
	for i := range 3 * arenaValues {        // three blocks of values and more
		addText(long(-i))
		addValues(-i)
	}
	require.Equal(t, wantTexts, texts)
	require.Equal(t, wantSlices, slices)
}
