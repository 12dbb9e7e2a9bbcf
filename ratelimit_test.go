package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("ok"))
})

func newLimiter(t *testing.T, opts Options) *Limiter {
	t.Helper()
	l, err := New(opts)
	require.NoError(t, err)
	return l
}

func newRequest(path, remoteAddr string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "http://example.test"+path, nil)
	r.RemoteAddr = remoteAddr
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// storeKinds are the three ways the limiter talks to a store: the MemoryKV fast path, the
// generic Counter path, and the seed's KV read/modify/write. Every behaviour that should not
// depend on the store runs through all three.
func storeKinds(clock *fakeClock) []struct {
	name  string
	store func() KV
} {
	return []struct {
		name  string
		store func() KV
	}{
		{"MemoryKV", func() KV { return NewMemoryKV(WithClock(clock.Now)) }},
		{"Counter", func() KV { return &counterStore{mem: NewMemoryKV(WithClock(clock.Now))} }},
		{"seed KV", func() KV { return kvOnly{NewMemoryKV(WithClock(clock.Now))} }},
	}
}

func TestAllowsUpToMaxThen429(t *testing.T) {
	clock := newFakeClock(windowStart.Add(23 * time.Second))
	for _, kind := range storeKinds(clock) {
		t.Run(kind.name, func(t *testing.T) {
			l := newLimiter(t, Options{Scope: "auth", Max: 3, Window: time.Minute, Store: kind.store(), Now: clock.Now})
			h := l.Handler(okHandler)
			for i := 1; i <= 3; i++ {
				rec := serve(h, newRequest("/login", "192.0.2.1:1234"))
				require.Equal(t, http.StatusOK, rec.Code, "request %d", i)
				require.Equal(t, "ok", rec.Body.String())
				require.Equal(t, fmt.Sprintf(`"auth";r=%d;t=37`, 3-i), rec.Header().Get("RateLimit"))
				require.Equal(t, `"auth";q=3;w=60`, rec.Header().Get("RateLimit-Policy"))
				require.Empty(t, rec.Header().Get("Retry-After"))
			}
			for i := 0; i < 2; i++ {
				rec := serve(h, newRequest("/login", "192.0.2.1:1234"))
				require.Equal(t, http.StatusTooManyRequests, rec.Code)
				require.Equal(t, "Too Many Requests\n", rec.Body.String())
				require.Equal(t, "37", rec.Header().Get("Retry-After"))
				require.Equal(t, `"auth";r=0;t=37`, rec.Header().Get("RateLimit"))
				require.Equal(t, "text/plain; charset=utf-8", rec.Header().Get("Content-Type"))
			}
		})
	}
}

func TestWindowRolloverResetsCount(t *testing.T) {
	clock := newFakeClock(windowStart.Add(59 * time.Second))
	for _, kind := range storeKinds(clock) {
		t.Run(kind.name, func(t *testing.T) {
			clock.Set(windowStart.Add(59 * time.Second))
			l := newLimiter(t, Options{Scope: "auth", Max: 2, Window: time.Minute, Store: kind.store(), Now: clock.Now})
			h := l.Handler(okHandler)
			require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code)
			require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code)
			rec := serve(h, newRequest("/", "192.0.2.1:1"))
			require.Equal(t, http.StatusTooManyRequests, rec.Code)
			require.Equal(t, "1", rec.Header().Get("Retry-After"))

			clock.Advance(time.Second) // the next window begins
			rec = serve(h, newRequest("/", "192.0.2.1:1"))
			require.Equal(t, http.StatusOK, rec.Code)
			require.Equal(t, `"auth";r=1;t=60`, rec.Header().Get("RateLimit"))
		})
	}
}

func TestCountersAreSeparatePerScopeAndClient(t *testing.T) {
	clock := newFakeClock(windowStart)
	for _, kind := range storeKinds(clock) {
		t.Run(kind.name, func(t *testing.T) {
			store := kind.store() // one store shared by both layers, as in production
			auth := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: store, Now: clock.Now})
			global := newLimiter(t, Options{Scope: "global", Max: 1, Window: time.Minute, Store: store, Now: clock.Now})
			authH, globalH := auth.Handler(okHandler), global.Handler(okHandler)

			require.Equal(t, http.StatusOK, serve(authH, newRequest("/", "192.0.2.1:1")).Code)
			require.Equal(t, http.StatusOK, serve(globalH, newRequest("/", "192.0.2.1:1")).Code, "other scope")
			require.Equal(t, http.StatusOK, serve(authH, newRequest("/", "192.0.2.2:1")).Code, "other client")
			require.Equal(t, http.StatusOK, serve(authH, newRequest("/", "[2001:db8:1::1]:1")).Code, "IPv6 client")
			require.Equal(t, http.StatusTooManyRequests, serve(authH, newRequest("/", "192.0.2.1:9")).Code, "same client, other port")
			require.Equal(t, http.StatusTooManyRequests, serve(authH, newRequest("/", "[2001:db8:1::2]:1")).Code, "same IPv6 /64")
			require.Equal(t, http.StatusTooManyRequests, serve(globalH, newRequest("/", "192.0.2.1:1")).Code)
		})
	}
}

func TestStoreKeyAndSeedValue(t *testing.T) {
	clock := newFakeClock(windowStart.Add(5 * time.Second))
	mem := NewMemoryKV(WithClock(clock.Now))
	l := newLimiter(t, Options{Scope: "auth", Max: 5, Window: time.Minute, Store: kvOnly{mem}, Now: clock.Now})
	serve(l.Handler(okHandler), newRequest("/", "[::ffff:192.0.2.7]:443"))

	value, ok, err := mem.Get(context.Background(), "ratelimit:auth:192.0.2.7")
	require.NoError(t, err)
	require.True(t, ok, "the seed's key, with the IPv4-mapped address unmapped")
	require.JSONEq(t, fmt.Sprintf(`{"window":%d,"count":1}`, windowStart.Unix()), string(value))

	clock.Advance(2*time.Minute - time.Nanosecond)
	_, ok, _ = mem.Get(context.Background(), "ratelimit:auth:192.0.2.7")
	require.True(t, ok, "kept for twice the window after the write")
	clock.Advance(time.Nanosecond)
	_, ok, _ = mem.Get(context.Background(), "ratelimit:auth:192.0.2.7")
	require.False(t, ok, "gone after twice the window")
}

// A Cloudflare Worker running the seed and a Go service share counters: the Go side reads the
// Worker's value (extra fields ignored) and continues its count.
func TestSharesCountersWithTheSeedsWorker(t *testing.T) {
	clock := newFakeClock(windowStart.Add(10 * time.Second))
	mem := NewMemoryKV(WithClock(clock.Now))
	ctx := context.Background()
	worker := fmt.Sprintf(`{"window":%d,"count":29,"instances":{"a":29}}`, windowStart.Unix())
	require.NoError(t, mem.Put(ctx, "ratelimit:auth:192.0.2.1", []byte(worker), 2*time.Minute))

	l := newLimiter(t, Options{Scope: "auth", Max: 30, Window: time.Minute, Store: kvOnly{mem}, Now: clock.Now})
	h := l.Handler(okHandler)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/login", "192.0.2.1:1")).Code, "the 30th request")
	require.Equal(t, http.StatusTooManyRequests, serve(h, newRequest("/login", "192.0.2.1:1")).Code)

	// A value from an earlier window does not count.
	old := fmt.Sprintf(`{"window":%d,"count":29}`, windowStart.Unix()-60)
	require.NoError(t, mem.Put(ctx, "ratelimit:auth:192.0.2.2", []byte(old), 2*time.Minute))
	rec := serve(h, newRequest("/login", "192.0.2.2:1"))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, `"auth";r=29;t=50`, rec.Header().Get("RateLimit"))
}

func TestExactUnderConcurrency(t *testing.T) {
	const requests, limit = 1000, 100
	clock := newFakeClock(windowStart)
	for _, kind := range storeKinds(clock)[:2] { // the two atomic paths
		t.Run(kind.name, func(t *testing.T) {
			l := newLimiter(t, Options{Scope: "global", Max: limit, Window: time.Minute, Store: kind.store(), Now: clock.Now})
			h := l.Handler(okHandler)
			var passed, denied atomic.Int64
			var wg sync.WaitGroup
			for range requests {
				wg.Go(func() {
					switch serve(h, newRequest("/", "198.51.100.4:1")).Code {
					case http.StatusOK:
						passed.Add(1)
					case http.StatusTooManyRequests:
						denied.Add(1)
					}
				})
			}
			wg.Wait()
			require.EqualValues(t, limit, passed.Load())
			require.EqualValues(t, requests-limit, denied.Load())
		})
	}
}

// The seed's read-then-write is not atomic: requests that read the same count all write
// count+1. This documents the under-count that a Counter store avoids.
func TestSeedKVUnderCountsConcurrentBurst(t *testing.T) {
	const burst, limit = 10, 5
	clock := newFakeClock(windowStart)
	racy := newRacyKV(NewMemoryKV(WithClock(clock.Now)), burst)
	l := newLimiter(t, Options{Scope: "auth", Max: limit, Window: time.Minute, Store: racy, Now: clock.Now})
	h := l.Handler(okHandler)
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			if serve(h, newRequest("/", "198.51.100.4:1")).Code == http.StatusOK {
				passed.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, burst, passed.Load(), "every request read count 0, so all passed")
	value, _, _ := racy.kv.Get(context.Background(), "ratelimit:auth:198.51.100.4")
	require.Contains(t, string(value), `"count":1}`, "and the stored count is 1, not 10")
}

func TestRetryAfterAndRateLimitAcrossTheWindow(t *testing.T) {
	tests := []struct {
		at         time.Duration // since the window began
		wantT      string        // RateLimit t and Retry-After
		wantReset  time.Duration
		wantHeader string
	}{
		{0, "60", 60 * time.Second, `"auth";r=0;t=60`},
		{time.Millisecond, "60", 60*time.Second - time.Millisecond, `"auth";r=0;t=60`},
		{999 * time.Millisecond, "60", 59*time.Second + time.Millisecond, `"auth";r=0;t=60`},
		{time.Second, "59", 59 * time.Second, `"auth";r=0;t=59`},
		{30*time.Second + 500*time.Millisecond, "30", 29*time.Second + 500*time.Millisecond, `"auth";r=0;t=30`},
		{59 * time.Second, "1", time.Second, `"auth";r=0;t=1`},
		{59*time.Second + 999*time.Millisecond, "1", time.Millisecond, `"auth";r=0;t=1`},
	}
	for _, tt := range tests {
		t.Run(tt.at.String(), func(t *testing.T) {
			clock := newFakeClock(windowStart.Add(tt.at))
			l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: NewMemoryKV(), Now: clock.Now})
			h := l.Handler(okHandler)
			require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code)
			rec := serve(h, newRequest("/", "192.0.2.1:1"))
			require.Equal(t, http.StatusTooManyRequests, rec.Code)
			require.Equal(t, tt.wantT, rec.Header().Get("Retry-After"))
			require.Equal(t, tt.wantHeader, rec.Header().Get("RateLimit"))

			res, err := l.AllowAt(newRequest("/", "192.0.2.1:1"), clock.Now())
			require.NoError(t, err)
			require.Equal(t, Result{Limit: 1, Reset: tt.wantReset, RetryAfter: tt.wantReset}, res)
		})
	}
}

func TestHeaderStyles(t *testing.T) {
	clock := newFakeClock(windowStart.Add(15 * time.Second))
	reset := fmt.Sprint(windowStart.Unix() + 60)
	tests := []struct {
		style HeaderStyle
		want  map[string]string
	}{
		{HeadersStandard, map[string]string{"RateLimit-Policy": `"api";q=10;w=60`, "RateLimit": `"api";r=9;t=45`}},
		{HeadersLegacy, map[string]string{"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "X-RateLimit-Reset": reset}},
		{HeadersBoth, map[string]string{
			"RateLimit-Policy": `"api";q=10;w=60`, "RateLimit": `"api";r=9;t=45`,
			"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "X-RateLimit-Reset": reset,
		}},
		{HeadersNone, map[string]string{}},
	}
	all := []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.style), func(t *testing.T) {
			l := newLimiter(t, Options{Scope: "api", Max: 10, Window: time.Minute, Store: NewMemoryKV(), Headers: tt.style, Now: clock.Now})
			rec := serve(l.Handler(okHandler), newRequest("/", "192.0.2.1:1"))
			for _, name := range all {
				require.Equal(t, tt.want[name], rec.Header().Get(name), name)
			}
		})
	}
}

func TestSharedPolicyHeaderIsNotCorruptedByAdd(t *testing.T) {
	l := newLimiter(t, Options{Scope: "api", Max: 10, Window: time.Minute, Store: NewMemoryKV()})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Add("RateLimit-Policy", `"other";q=1;w=1`)
	}))
	first := serve(h, newRequest("/", "192.0.2.1:1"))
	require.Equal(t, []string{`"api";q=10;w=60`, `"other";q=1;w=1`}, first.Header().Values("RateLimit-Policy"))
	second := serve(h, newRequest("/", "192.0.2.1:1"))
	require.Equal(t, []string{`"api";q=10;w=60`, `"other";q=1;w=1`}, second.Header().Values("RateLimit-Policy"))
}

func TestCustomDenyHandler(t *testing.T) {
	clock := newFakeClock(windowStart.Add(50 * time.Second))
	var got Result
	l := newLimiter(t, Options{
		Scope: "api", Max: 1, Window: time.Minute, Store: NewMemoryKV(), Now: clock.Now,
		DenyHandler: func(w http.ResponseWriter, _ *http.Request, res Result) {
			got = res
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":"slow down"}`))
		},
	})
	h := l.Handler(okHandler)
	serve(h, newRequest("/", "192.0.2.1:1"))
	rec := serve(h, newRequest("/", "192.0.2.1:1"))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.JSONEq(t, `{"error":"slow down"}`, rec.Body.String())
	require.Equal(t, "10", rec.Header().Get("Retry-After"), "set before the deny handler runs")
	require.Equal(t, Result{Limit: 1, Reset: 10 * time.Second, RetryAfter: 10 * time.Second}, got)
}

func TestPathFilters(t *testing.T) {
	auth := DefaultConfig().Auth
	global := DefaultConfig().Global
	tests := []struct {
		path         string
		auth, global bool // counted by the layer
	}{
		{"/login", true, true},
		{"/login/", true, true},
		{"//login", true, true},
		{"/./login", true, true},
		{"/x/../login", true, true},
		{"/../login", true, true},
		{"/logout", true, true},
		{"/forgot-password", true, true},
		{"/reset-password", true, true},
		{"/register", true, true},
		{"/login/extra", false, true},
		{"/loginx", false, true},
		{"/LOGIN", false, true},
		{"/", false, true},
		{"", false, true},
		{"/api/users", false, true},
		{"/health", false, false},
		{"/health/", false, false},
		{"/healthz", false, true},
		{"/assets", false, false},
		{"/assets/app.js", false, false},
		{"/assets/../login", true, true},
		{"/assetsx", false, true},
		{"/.well-known/security.txt", false, false},
		{"/avatars/u/1.png", false, false},
		{"/avatars//1.png", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			for _, layer := range []struct {
				opts Options
				want bool
			}{{auth, tt.auth}, {global, tt.global}} {
				layer.opts.Store = NewMemoryKV()
				l := newLimiter(t, layer.opts)
				r := newRequest("/", "192.0.2.1:1")
				r.URL.Path = tt.path
				res, err := l.Allow(r)
				require.NoError(t, err)
				require.Equal(t, layer.want, res.Counted(), "layer %s", l.Scope())

				// Through the middleware: a counted request carries the layer's headers, an
				// uncounted one none (not even the policy, which a counted request gets before
				// its count).
				layer.opts.Headers = HeadersBoth
				layer.opts.Store = NewMemoryKV()
				rec := serve(newLimiter(t, layer.opts).Handler(okHandler), r)
				for _, name := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit"} {
					require.Equal(t, layer.want, rec.Header().Get(name) != "", "layer %s, header %s", l.Scope(), name)
				}
			}
		})
	}
}

func TestFailsOpenWithoutStoreAndLogsOnce(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Logger: logger})
	h := l.Handler(okHandler)
	for range 5 {
		rec := serve(h, newRequest("/login", "192.0.2.1:1"))
		require.Equal(t, http.StatusOK, rec.Code)
		require.Empty(t, rec.Header().Get("RateLimit"))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "\n"), logs.String())
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "no store configured")
	require.Contains(t, logs.String(), "scope=auth")
}

func TestDisabledWhenMaxIsNotPositive(t *testing.T) {
	for _, limit := range []int{0, -1} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			var logs bytes.Buffer
			mem := NewMemoryKV()
			l := newLimiter(t, Options{Scope: "auth", Max: limit, Window: time.Minute, Store: mem, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			h := l.Handler(okHandler)
			for range 3 {
				require.Equal(t, http.StatusOK, serve(h, newRequest("/login", "192.0.2.1:1")).Code)
			}
			res, err := l.Allow(newRequest("/login", "192.0.2.1:1"))
			require.NoError(t, err)
			require.Equal(t, Result{Allowed: true}, res)
			require.Zero(t, mem.Len(), "nothing counted")
			require.Contains(t, logs.String(), "layer disabled")
		})
	}
}

func TestStoreFailures(t *testing.T) {
	tests := []struct {
		name       string
		store      KV
		failClosed bool
		wantCode   int
	}{
		{"failing Counter, fail open", failingKV{}, false, http.StatusOK},
		{"failing Counter, fail closed", failingKV{}, true, http.StatusServiceUnavailable},
		{"failing KV, fail open", kvOnly{failingKV{}}, false, http.StatusOK},
		{"failing KV, fail closed", kvOnly{failingKV{}}, true, http.StatusServiceUnavailable},
		{"hanging Counter, fail open", hangingKV{}, false, http.StatusOK},
		{"hanging KV, fail closed", kvOnly{hangingKV{}}, true, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var reported []error
			var mu sync.Mutex
			const deadline = 50 * time.Millisecond
			l := newLimiter(t, Options{
				Scope: "auth", Max: 5, Window: time.Minute, Store: tt.store, FailClosed: tt.failClosed,
				StoreTimeout: deadline,
				OnError: func(_ *http.Request, err error) {
					mu.Lock()
					defer mu.Unlock()
					reported = append(reported, err)
				},
			})
			began := time.Now()
			rec := serve(l.Handler(okHandler), newRequest("/login", "192.0.2.1:1"))
			// A bound, not a speed measurement: the store may not hold a request past its deadline.
			require.Less(t, time.Since(began), deadline+2*time.Second)
			require.Equal(t, tt.wantCode, rec.Code)
			require.Empty(t, rec.Header().Get("RateLimit"), "an uncounted request carries no count")
			require.Len(t, reported, 1)
			require.ErrorIs(t, reported[0], ErrStoreFailed)
			require.Contains(t, reported[0].Error(), `layer "auth"`)
			if _, hangs := tt.store.(hangingKV); hangs {
				require.ErrorIs(t, reported[0], context.DeadlineExceeded)
			}
		})
	}
}

func TestCorruptStoredValues(t *testing.T) {
	values := []string{
		`not json`,
		``,
		`null`,
		`[]`,
		`{}`,
		`{"window":"x","count":1}`,
		`{"window":1700000040}`,
		`{"count":3}`,
		`{"window":1700000040,"count":-4}`,
		`{"window":1.5e9,"count":2}`,
		`{"window":1700000040,"count":99999999999999999999999}`,
		"\x00\xff\xfe",
	}
	for _, value := range values {
		t.Run(value, func(t *testing.T) {
			var reported error
			l := newLimiter(t, Options{
				Scope: "auth", Max: 2, Window: time.Minute, Store: corruptKV{value: []byte(value)},
				Now:     newFakeClock(windowStart).Now,
				OnError: func(_ *http.Request, err error) { reported = err },
			})
			rec := serve(l.Handler(okHandler), newRequest("/", "192.0.2.1:1"))
			require.Equal(t, http.StatusOK, rec.Code)
			require.Equal(t, `"auth";r=1;t=60`, rec.Header().Get("RateLimit"), "counted as a fresh window")
			require.ErrorIs(t, reported, ErrCorruptValue)
			require.NotErrorIs(t, reported, ErrStoreFailed)
		})
	}
}

// TestLateRequestDoesNotRestartTheWindow: a request whose clock reading is of the window before
// (a goroutine that read the clock just before the window turned, an instance whose clock lags)
// must neither pass over the old window's limit nor restart the new window's count, whichever
// way the store counts.
func TestLateRequestDoesNotRestartTheWindow(t *testing.T) {
	stores := map[string]func(clock *fakeClock) KV{
		"MemoryKV": func(c *fakeClock) KV { return NewMemoryKV(WithClock(c.Now)) },
		"Counter":  func(c *fakeClock) KV { return &counterStore{mem: NewMemoryKV(WithClock(c.Now))} },
		"seed KV":  func(c *fakeClock) KV { return kvOnly{NewMemoryKV(WithClock(c.Now))} },
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock(windowStart)
			l := newLimiter(t, Options{Scope: "api", Max: 2, Window: time.Minute, Store: store(clock), Now: clock.Now})
			allowedAt := func(at time.Time) bool {
				t.Helper()
				res, err := l.AllowAt(newRequest("/", "192.0.2.1:1"), at)
				require.NoError(t, err)
				return res.Allowed
			}
			old, next := windowStart.Add(59*time.Second), windowStart.Add(time.Minute)
			require.True(t, allowedAt(old))
			require.True(t, allowedAt(old))
			clock.Set(next)
			require.True(t, allowedAt(next))
			require.True(t, allowedAt(next))
			for i := range 10 {
				at := next
				if i%2 == 0 {
					at = old.Add(500 * time.Millisecond)
				}
				require.False(t, allowedAt(at), "request %d at %v: both windows are full", i+1, at.Sub(windowStart))
			}
			// Another client keeps its budget, and the window after next starts from zero.
			res, err := l.AllowAt(newRequest("/", "192.0.2.2:1"), old)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			clock.Set(next.Add(time.Minute))
			require.True(t, allowedAt(next.Add(time.Minute)))
		})
	}
}

// TestHugeStoredCountIsDenied: a stored count is any size a writer chose; counting one more must
// not wrap around into an allowed request.
func TestHugeStoredCountIsDenied(t *testing.T) {
	value := fmt.Sprintf(`{"window":%d,"count":%d}`, windowStart.Unix(), int64(math.MaxInt64))
	var reported error
	l := newLimiter(t, Options{
		Scope: "auth", Max: 5, Window: time.Minute, Store: corruptKV{value: []byte(value)},
		Now:     newFakeClock(windowStart).Now,
		OnError: func(_ *http.Request, err error) { reported = err },
	})
	res, err := l.Allow(newRequest("/", "192.0.2.1:1"))
	require.NoError(t, err)
	require.False(t, res.Allowed)
	rec := serve(l.Handler(okHandler), newRequest("/", "192.0.2.1:1"))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, `"auth";r=0;t=60`, rec.Header().Get("RateLimit"))
	require.NoError(t, reported, "a valid value, however large")
}

func TestCorruptValueIsOverwritten(t *testing.T) {
	clock := newFakeClock(windowStart)
	mem := NewMemoryKV(WithClock(clock.Now))
	require.NoError(t, mem.Put(context.Background(), "ratelimit:auth:192.0.2.1", []byte("garbage"), time.Hour))
	l := newLimiter(t, Options{Scope: "auth", Max: 2, Window: time.Minute, Store: kvOnly{mem}, Now: clock.Now, OnError: func(*http.Request, error) {}})
	h := l.Handler(okHandler)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code)
	require.Equal(t, http.StatusTooManyRequests, serve(h, newRequest("/", "192.0.2.1:1")).Code)
}

func TestDefaultErrorLogIsThrottled(t *testing.T) {
	var logs bytes.Buffer
	clock := newFakeClock(windowStart)
	l := newLimiter(t, Options{
		Scope: "auth", Max: 5, Window: time.Minute, Store: failingKV{}, Now: clock.Now,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	h := l.Handler(okHandler)
	for range 100 {
		serve(h, newRequest("/", "192.0.2.1:1"))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "store problem"))
	require.Contains(t, logs.String(), "boom: store unreachable")

	clock.Advance(time.Minute)
	serve(h, newRequest("/", "192.0.2.1:1"))
	require.Equal(t, 2, strings.Count(logs.String(), "store problem"))
	require.Contains(t, logs.String(), "unlogged_since_last=99")
	require.Contains(t, logs.String(), "errors_total=101")
}

func TestDenyCacheSparesTheStore(t *testing.T) {
	clock := newFakeClock(windowStart)
	store := &counterStore{mem: NewMemoryKV(WithClock(clock.Now))}
	l := newLimiter(t, Options{Scope: "auth", Max: 2, Window: time.Minute, Store: store, Now: clock.Now})
	h := l.Handler(okHandler)
	for range 3 {
		serve(h, newRequest("/", "192.0.2.1:1"))
	}
	require.EqualValues(t, 3, store.calls.Load())
	for range 10 {
		require.Equal(t, http.StatusTooManyRequests, serve(h, newRequest("/", "192.0.2.1:1")).Code)
	}
	require.EqualValues(t, 3, store.calls.Load(), "denied locally until the window ends")
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.2:1")).Code, "other clients still reach the store")

	clock.Advance(time.Minute)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code, "a new window asks the store again")
	require.EqualValues(t, 5, store.calls.Load())
}

func TestUnknownClientIsStillCounted(t *testing.T) {
	l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: NewMemoryKV()})
	h := l.Handler(okHandler)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "")).Code)
	require.Equal(t, http.StatusTooManyRequests, serve(h, newRequest("/", "@")).Code, "no address is one shared client, not a free pass")
	require.Equal(t, http.StatusTooManyRequests, serve(h, newRequest("/", "not-an-ip:80")).Code)
}

func TestNewRejectsBadOptions(t *testing.T) {
	valid := Options{Scope: "auth", Max: 1, Window: time.Minute}
	tests := []struct {
		name   string
		modify func(*Options)
		want   string
	}{
		{"empty scope", func(o *Options) { o.Scope = "" }, `scope "" must be 1 to 64 bytes long`},
		{"long scope", func(o *Options) { o.Scope = strings.Repeat("a", 65) }, "must be 1 to 64 bytes long"},
		{"scope with colon", func(o *Options) { o.Scope = "a:b" }, `scope "a:b" may hold only`},
		{"scope with quote", func(o *Options) { o.Scope = `a"b` }, "may hold only"},
		{"scope with slash", func(o *Options) { o.Scope = "a/b" }, "may hold only"},
		{"negative window", func(o *Options) { o.Window = -time.Second }, "window -1s must be positive"},
		{"zero window", func(o *Options) { o.Window = 0 }, "window 0s must be positive"},
		{"fractional window", func(o *Options) { o.Window = 1500 * time.Millisecond }, "window 1.5s is not a whole number of seconds"},
		{"huge window", func(o *Options) { o.Window = 366 * 24 * time.Hour }, "longer than 365 days"},
		{"relative path", func(o *Options) { o.Paths = []string{"login"} }, `Paths: path pattern "login" must start with "/"`},
		{"inner star", func(o *Options) { o.Paths = []string{"/a/*/b"} }, `"*" may only end a pattern`},
		{"bare star", func(o *Options) { o.ExemptPaths = []string{"/assets*"} }, `ExemptPaths: path pattern "/assets*"`},
		{"query", func(o *Options) { o.Paths = []string{"/login?x"} }, `path pattern "/login?x"`},
		{"unclean", func(o *Options) { o.Paths = []string{"/login/"} }, `is not a clean path (want "/login")`},
		{"dot dot", func(o *Options) { o.Paths = []string{"/a/../b"} }, "is not a clean path"},
		{"space", func(o *Options) { o.Paths = []string{"/log in"} }, "space or control character"},
		{"empty pattern", func(o *Options) { o.Paths = []string{""} }, `path pattern "" must start with "/"`},
		{"IPv6 bits", func(o *Options) { o.IPv6PrefixBits = 129 }, "IPv6PrefixBits 129 is outside 1..128"},
		{"negative IPv6 bits", func(o *Options) { o.IPv6PrefixBits = -1 }, "IPv6PrefixBits -1"},
		{"negative timeout", func(o *Options) { o.StoreTimeout = -time.Second }, "StoreTimeout -1s must be positive"},
		{"header style", func(o *Options) { o.Headers = 9 }, "unknown HeaderStyle 9"},
		{"disabled layer is still checked", func(o *Options) { o.Max = 0; o.Window = -time.Second }, "window -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := valid
			tt.modify(&opts)
			l, err := New(opts)
			require.Nil(t, l)
			require.ErrorContains(t, err, tt.want)
			require.True(t, strings.HasPrefix(err.Error(), "ratelimit: layer "), err.Error())
		})
	}

	t.Run("every problem at once", func(t *testing.T) {
		_, err := New(Options{Scope: "", Max: 1, Window: -1, Paths: []string{"x"}})
		require.ErrorContains(t, err, "scope")
		require.ErrorContains(t, err, "window")
		require.ErrorContains(t, err, "Paths")
	})

	t.Run("disabled layer may leave the window unset", func(t *testing.T) {
		_, err := New(Options{Scope: "auth", Max: 0, Logger: quietLogger})
		require.NoError(t, err)
	})
}

func TestAcceptedPatterns(t *testing.T) {
	l := newLimiter(t, Options{Scope: "s", Max: 1, Window: time.Second, Store: NewMemoryKV(), Paths: []string{"/*"}, ExemptPaths: []string{"/a/b/*", "/"}})
	for path, counted := range map[string]bool{"/x": true, "/": false, "/a/b": false, "/a/b/c": false, "/a/bc": true} {
		res, err := l.Allow(newRequest(path, "192.0.2.1:1"))
		require.NoError(t, err)
		require.Equal(t, counted, res.Counted(), path)
	}
}

func TestStandardMuxSubRouterMounting(t *testing.T) {
	clock := newFakeClock(windowStart)
	store := NewMemoryKV(WithClock(clock.Now))
	cfg := DefaultConfig()
	cfg.Auth.Store, cfg.Global.Store = store, store
	cfg.Auth.Max = 2
	cfg.Auth.Now, cfg.Global.Now = clock.Now, clock.Now
	layers, err := NewLayers(cfg)
	require.NoError(t, err)

	// The auth routes live under /auth/ on a sub-mux; StripPrefix runs before the auth layer, so
	// its patterns ("/login") are relative to the mount point.
	authMux := http.NewServeMux()
	authMux.Handle("/", okHandler)
	root := http.NewServeMux()
	root.Handle("/auth/", http.StripPrefix("/auth", layers.Auth.Handler(authMux)))
	root.Handle("/", okHandler)
	app := layers.Global.Handler(root)

	for i := 0; i < 2; i++ {
		require.Equal(t, http.StatusOK, serve(app, newRequest("/auth/login", "192.0.2.1:1")).Code)
	}
	rec := serve(app, newRequest("/auth/login/", "192.0.2.1:1"))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, []string{`"global";r=197;t=60`, `"auth";r=0;t=60`}, rec.Header().Values("RateLimit"), "both layers counted it")
	require.Equal(t, []string{`"global";q=200;w=60`, `"auth";q=2;w=60`}, rec.Header().Values("RateLimit-Policy"))
	require.Equal(t, http.StatusOK, serve(app, newRequest("/auth/me", "192.0.2.1:1")).Code, "not an auth path")
	require.Equal(t, http.StatusOK, serve(app, newRequest("/health", "192.0.2.1:1")).Code)
	// Both layers counted the auth requests: 3 global requests so far plus /auth/me.
	rec = serve(app, newRequest("/anything", "192.0.2.1:1"))
	require.Equal(t, `"global";r=195;t=60`, rec.Header().Get("RateLimit"))
}

func TestLayersHandlerMountsBothLayersOnOneHandler(t *testing.T) {
	store := NewMemoryKV()
	cfg := DefaultConfig()
	cfg.Auth.Store, cfg.Global.Store = store, store
	cfg.Auth.Max, cfg.Global.Max = 1, 3
	layers, err := NewLayers(cfg)
	require.NoError(t, err)
	app := layers.Handler(okHandler)

	require.Equal(t, http.StatusOK, serve(app, newRequest("/login", "192.0.2.1:1")).Code)
	require.Equal(t, http.StatusTooManyRequests, serve(app, newRequest("/login", "192.0.2.1:1")).Code, "auth layer")
	require.Equal(t, http.StatusOK, serve(app, newRequest("/home", "192.0.2.1:1")).Code)
	require.Equal(t, http.StatusTooManyRequests, serve(app, newRequest("/home", "192.0.2.1:1")).Code, "global layer")
	for range 10 {
		require.Equal(t, http.StatusOK, serve(app, newRequest("/health", "192.0.2.1:1")).Code, "exempt")
	}
}

func TestAllowIgnoresTheHandlerAndReportsErrors(t *testing.T) {
	l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: failingKV{}, FailClosed: true})
	res, err := l.Allow(newRequest("/", "192.0.2.1:1"))
	require.ErrorIs(t, err, ErrStoreFailed)
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, Result{}, res, "fail closed: not allowed, not counted")
	require.False(t, errors.Is(err, ErrCorruptValue))
}

// In a synctest bubble time moves only while every goroutine waits, so the cost of a hung store
// is measured exactly instead of with a wall clock.
func TestHungStoreCostsExactlyTheDeadline(t *testing.T) {
	for _, store := range []KV{hangingKV{}, kvOnly{hangingKV{}}} {
		t.Run(fmt.Sprintf("%T", store), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newLimiter(t, Options{Scope: "auth", Max: 5, Window: time.Minute, Store: store, StoreTimeout: 300 * time.Millisecond, OnError: func(*http.Request, error) {}})
				began := time.Now()
				rec := serve(l.Handler(okHandler), newRequest("/", "192.0.2.1:1"))
				require.Equal(t, http.StatusOK, rec.Code)
				require.Equal(t, 300*time.Millisecond, time.Since(began))

				l = newLimiter(t, Options{Scope: "auth", Max: 5, Window: time.Minute, Store: store, OnError: func(*http.Request, error) {}})
				began = time.Now()
				serve(l.Handler(okHandler), newRequest("/", "192.0.2.1:1"))
				require.Equal(t, DefaultStoreTimeout, time.Since(began), "the default deadline")
			})
		})
	}
}

func TestTypedNilStoreMeansNoStore(t *testing.T) {
	var logs bytes.Buffer
	var store *MemoryKV // a constructor that failed left a nil pointer
	l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: store, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	h := l.Handler(okHandler)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code, "fails open rather than panicking")
	require.Contains(t, logs.String(), "no store configured")
}

// Both layers count an auth request: the client sees both policies and both counts, so the
// response never claims more room than the tighter layer leaves. The legacy trio, which holds one
// policy, reports the most restrictive layer.
func TestTwoLayersOnOneRequestReportBoth(t *testing.T) {
	clock := newFakeClock(windowStart)
	store := NewMemoryKV(WithClock(clock.Now))
	for _, style := range []HeaderStyle{HeadersStandard, HeadersLegacy} {
		cfg := DefaultConfig()
		cfg.Auth.Store, cfg.Global.Store = store, store
		cfg.Auth.Max, cfg.Global.Max = 10, 3
		cfg.Auth.Now, cfg.Global.Now = clock.Now, clock.Now
		cfg.Auth.Headers, cfg.Global.Headers = style, style
		cfg.Auth.Scope, cfg.Global.Scope = "auth"+fmt.Sprint(style), "global"+fmt.Sprint(style)
		layers, err := NewLayers(cfg)
		require.NoError(t, err)
		app := layers.Handler(okHandler)

		rec := serve(app, newRequest("/login", "192.0.2.1:1"))
		require.Equal(t, http.StatusOK, rec.Code)
		if style == HeadersStandard {
			require.Equal(t, []string{`"global0";r=2;t=60`, `"auth0";r=9;t=60`}, rec.Header().Values("RateLimit"))
			require.Equal(t, []string{`"global0";q=3;w=60`, `"auth0";q=10;w=60`}, rec.Header().Values("RateLimit-Policy"))
			continue
		}
		require.Equal(t, []string{"3"}, rec.Header().Values("X-RateLimit-Limit"), "the global layer is tighter")
		require.Equal(t, []string{"2"}, rec.Header().Values("X-RateLimit-Remaining"))
		serve(app, newRequest("/login", "192.0.2.1:1"))
		rec = serve(app, newRequest("/login", "192.0.2.1:1"))
		require.Equal(t, []string{"0"}, rec.Header().Values("X-RateLimit-Remaining"))
		rec = serve(app, newRequest("/login", "192.0.2.1:1"))
		require.Equal(t, http.StatusTooManyRequests, rec.Code)
	}
}

// The shared Retry-After and RateLimit values of denied responses follow the clock.
func TestDeniedHeaderValuesFollowTheClock(t *testing.T) {
	clock := newFakeClock(windowStart.Add(23 * time.Second))
	l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: NewMemoryKV(WithClock(clock.Now)), Now: clock.Now})
	h := l.Handler(okHandler)
	serve(h, newRequest("/", "192.0.2.1:1"))
	for _, tt := range []struct {
		at   time.Duration
		want string
	}{{23 * time.Second, "37"}, {40 * time.Second, "20"}, {40 * time.Second, "20"}, {59 * time.Second, "1"}} {
		clock.Set(windowStart.Add(tt.at))
		rec := serve(h, newRequest("/", "192.0.2.1:1"))
		require.Equal(t, http.StatusTooManyRequests, rec.Code)
		require.Equal(t, tt.want, rec.Header().Get("Retry-After"), "at %v", tt.at)
		require.Equal(t, `"auth";r=0;t=`+tt.want, rec.Header().Get("RateLimit"), "at %v", tt.at)
	}
}

// A client that resets its stream after sending a request must not make the store call fail
// and so pass uncounted: the count does not depend on the client staying.
func TestClientGoingAwayIsStillCounted(t *testing.T) {
	clock := newFakeClock(windowStart)
	store := &counterStore{mem: NewMemoryKV(WithClock(clock.Now))}
	var reported atomic.Int64
	l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: store, Now: clock.Now,
		OnError: func(*http.Request, error) { reported.Add(1) }})
	h := l.Handler(okHandler)
	gone := func() *http.Request {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return newRequest("/", "192.0.2.1:1").WithContext(ctx)
	}
	require.Equal(t, http.StatusOK, serve(h, gone()).Code)
	for range 5 {
		require.Equal(t, http.StatusTooManyRequests, serve(h, gone()).Code)
	}
	require.Zero(t, reported.Load(), "a client going away is not a store failure")
}

// TestRequestWithoutURLIsCounted: net/http never serves a request without a URL, but a
// hand-built one passed to Allow or a handler must not panic the path filter; in doubt, it is
// counted, by every layer.
func TestRequestWithoutURLIsCounted(t *testing.T) {
	for _, opts := range []Options{DefaultConfig().Auth, DefaultConfig().Global, {Scope: "all", Max: 5, Window: time.Minute}} {
		opts.Store = NewMemoryKV()
		l := newLimiter(t, opts)
		r := &http.Request{Method: http.MethodGet, RemoteAddr: "192.0.2.1:1", Header: http.Header{}}
		res, err := l.Allow(r)
		require.NoError(t, err)
		require.True(t, res.Counted(), "layer %s", l.Scope())

		rec := httptest.NewRecorder()
		l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})).ServeHTTP(rec, r)
		require.Equal(t, http.StatusNoContent, rec.Code, "layer %s", l.Scope())
		require.NotEmpty(t, rec.Header().Get("RateLimit"), "layer %s", l.Scope())
	}
}

// Go's ServeMux and chi route on the escaped path, where "%2F" is no "/" and "%2E%2E" no "..":
// a path that cleans to an exempt one when decoded, but routes to a limited handler, is counted.
func TestEscapedPathsCannotDodgeTheFilter(t *testing.T) {
	tests := []struct {
		name, route, target string
	}{
		{"encoded slashes over a wildcard", "GET /api/users/{id}", "/api/users/x%2F..%2F..%2F..%2Fhealth"},
		{"encoded dots over a catch-all", "GET /files/{path...}", "/files/%2E%2E/assets/x"},
		{"encoded slash into an exempt prefix", "GET /api/users/{id}", "/api/users/..%2F..%2Fassets%2Fx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig().Global
			cfg.Max, cfg.Store = 2, NewMemoryKV()
			l := newLimiter(t, cfg)
			var served atomic.Int64
			mux := http.NewServeMux()
			mux.HandleFunc(tt.route, func(http.ResponseWriter, *http.Request) { served.Add(1) })
			h := l.Handler(mux)
			for range 5 {
				r := httptest.NewRequest(http.MethodGet, tt.target, nil)
				r.RemoteAddr = "192.0.2.1:1"
				serve(h, r)
			}
			require.EqualValues(t, 2, served.Load(), "the route's handler ran only within the limit")
		})
	}

	t.Run("an encoded path to an auth route is counted", func(t *testing.T) {
		cfg := DefaultConfig().Auth
		cfg.Max, cfg.Store = 1, NewMemoryKV()
		l := newLimiter(t, cfg)
		r := httptest.NewRequest(http.MethodPost, "/%6Cogin", nil)
		res, err := l.Allow(r)
		require.NoError(t, err)
		require.True(t, res.Counted())
	})
}

func TestDefaultLoggerIsReadWhenLogging(t *testing.T) {
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: failingKV{}})
	var logs bytes.Buffer
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil))) // after New, as a program might
	serve(l.Handler(okHandler), newRequest("/", "192.0.2.1:1"))
	require.Contains(t, logs.String(), "store problem")
}

// TestUnbuiltLimiterPassesRequests: a nil or zero Limiter, or zero Layers, is a mistake in the
// program (New builds layers), but serving requests through one must not panic: they pass
// unlimited, and mounting one logs an error.
func TestUnbuiltLimiterPassesRequests(t *testing.T) {
	var logs bytes.Buffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))

	var zero Limiter
	var layers Layers
	var nilLayers *Layers // as NewLayers returns it with an error
	for name, h := range map[string]http.Handler{
		"zero Limiter": zero.Handler(okHandler),
		"nil Limiter":  (*Limiter)(nil).Handler(okHandler),
		"zero Layers":  layers.Handler(okHandler),
		"nil Layers":   nilLayers.Handler(okHandler),
	} {
		for range 3 {
			require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.1:1")).Code, name)
		}
	}
	require.Equal(t, 5, strings.Count(logs.String(), "level=ERROR"), logs.String()) // one per Limiter mounted
	require.Contains(t, logs.String(), "Limiter that New did not build")

	for _, l := range []*Limiter{&zero, nil} {
		res, err := l.Allow(newRequest("/", "192.0.2.1:1"))
		require.NoError(t, err)
		require.True(t, res.Allowed)
		res, err = l.AllowAt(newRequest("/", "192.0.2.1:1"), time.Now())
		require.NoError(t, err)
		require.True(t, res.Allowed)
		require.Empty(t, l.Scope())
	}
}
