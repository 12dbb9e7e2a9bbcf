package cloudflarekv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/stretchr/testify/require"
)

func newTestStore(t *testing.T, f *fakeAPI, edit ...func(*Config)) *Store {
	t.Helper()
	cfg := f.config()
	for _, e := range edit {
		e(&cfg)
	}
	s, err := NewStore(cfg)
	require.NoError(t, err)
	return s
}

func TestStoreRoundTripsOddKeys(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestStore(t, f)
	ctx := context.Background()

	keys := []string{
		"ratelimit:auth:203.0.113.7",
		"ratelimit:auth:2001:db8:abcd:12::",  // IPv6 /64, as the limiter writes it
		"ratelimit:global:2001:db8::1",       // full IPv6
		"ratelimit:global:::1",               // loopback: three colons in a row
		"ratelimit:global:fe80::1%eth0",      // a zone, should one slip through
		"ratelimit:global:[2001:db8::1]:443", // brackets and port
		"a/b/../c", "100%", "%2F", "sp ace", "q?x=1#frag", "plus+sign", "ünïcødé", "...", "-", "tab\there",
		strings.Repeat("k", MaxKeyLen),
	}
	for i, key := range keys {
		value := fmt.Appendf(nil, `{"window":1,"count":%d}`, i)
		require.NoError(t, s.Put(ctx, key, value, time.Minute), key)
		stored, ok := f.value(key)
		require.True(t, ok, "the API stored the key under its exact name: %q", key)
		require.Equal(t, string(value), stored)
		got, ok, err := s.Get(ctx, key)
		require.NoError(t, err, key)
		require.True(t, ok, key)
		require.Equal(t, value, got, key)
	}
	require.Zero(t, f.rejected.Load())

	// Keys Workers KV refuses are refused before any call is spent on them.
	calls := f.calls.Load()
	for _, key := range []string{"", ".", "..", strings.Repeat("k", MaxKeyLen+1)} {
		_, _, err := s.Get(ctx, key)
		require.ErrorContains(t, err, "cloudflarekv: key")
		require.ErrorContains(t, s.Put(ctx, key, []byte("x"), time.Minute), "cloudflarekv: key")
	}
	require.Equal(t, calls, f.calls.Load())
}

func TestStoreMissingKeyIsNotFound(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	s := newTestStore(t, f)
	v, ok, err := s.Get(context.Background(), "ratelimit:auth:198.51.100.1")
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, v)
	require.True(t, s.Stats().PausedUntil.IsZero(), "a missing key is not a failure")
}

func TestStoreClampsTTLToSixtySeconds(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestStore(t, f)
	ctx := context.Background()

	// The fake refuses what Cloudflare refuses.
	req, _ := http.NewRequest(http.MethodPut, f.srv.URL+"/accounts/"+fakeAccount+"/storage/kv/namespaces/"+fakeNamespace+"/values/k?expiration_ttl=59", strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer "+fakeToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, string(body), "Expiration TTL must be at least 60")

	for i, tc := range []struct {
		ttl  time.Duration
		want int
	}{{time.Second, 60}, {20 * time.Second, 60}, {60 * time.Second, 60}, {90*time.Second + time.Millisecond, 91}, {2 * time.Hour, 7200}} {
		require.NoError(t, s.Put(ctx, fmt.Sprint("k", i), []byte("v"), tc.ttl))
		f.mu.Lock()
		got := f.ttls[len(f.ttls)-1]
		f.mu.Unlock()
		require.Equal(t, tc.want, got, "ttl %v", tc.ttl)
	}
	// A clamped entry lives 60 s: gone after, there before.
	clock.Advance(59 * time.Second)
	_, ok, err := s.Get(ctx, "k0")
	require.NoError(t, err)
	require.True(t, ok)
	clock.Advance(time.Second)
	_, ok, err = s.Get(ctx, "k0")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestStoreMissingNamespaceIsConfigurationError(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	s := newTestStore(t, f, func(c *Config) { c.NamespaceID = "doesnotexist" })

	v, ok, err := s.Get(context.Background(), "ratelimit:auth:192.0.2.1")
	require.Error(t, err, "a missing namespace is not an empty counter")
	require.False(t, ok)
	require.Nil(t, v)
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, http.StatusNotFound, ae.Status)
	require.Equal(t, CodeNamespaceNotFound, ae.Code)
	require.Equal(t, "get: 'namespace not found'", ae.Message)
	require.ErrorIs(t, err, ErrConfiguration)
	require.NotErrorIs(t, err, ErrRateLimited)
	require.ErrorContains(t, err, "code 10013")

	err = s.Put(context.Background(), "ratelimit:auth:192.0.2.1", []byte("x"), time.Minute)
	require.ErrorIs(t, err, ErrPaused, "a configuration error backs off too")
	require.ErrorIs(t, err, ErrConfiguration, "the pause carries its cause")
}

func TestStoreRejectedTokenSurfacesCodeThroughLimiter(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()

	for _, failClosed := range []bool{false, true} {
		s := newTestStore(t, f, func(c *Config) { c.APIToken = "revoked" })
		var mu sync.Mutex
		var reported []error
		l, err := ratelimit.New(ratelimit.Options{
			Scope: "auth", Max: 30, Window: time.Minute, Store: s, FailClosed: failClosed,
			OnError: func(_ *http.Request, err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() },
		})
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/login", nil)
		l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })).ServeHTTP(rec, req)
		if failClosed {
			require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		} else {
			require.Equal(t, http.StatusNoContent, rec.Code, "fails open, as the seed does")
		}
		require.Len(t, reported, 1)
		require.ErrorIs(t, reported[0], ratelimit.ErrStoreFailed)
		require.ErrorIs(t, reported[0], ErrConfiguration)
		var ae *APIError
		require.ErrorAs(t, reported[0], &ae)
		require.Equal(t, http.StatusForbidden, ae.Status)
		require.Equal(t, 10000, ae.Code)
		require.Equal(t, "Authentication error", ae.Message)
	}
}

func TestStore429HonoursRetryAfterWithoutRetrying(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	f.set(func(f *fakeAPI) { f.budget, f.retryAfter = 2, 30 })
	s := newTestStore(t, f)
	ctx := context.Background()
	key := "ratelimit:auth:192.0.2.9"

	for range 2 {
		_, _, err := s.Get(ctx, key)
		require.NoError(t, err)
	}
	// The client under both stores reports the 429 as it came.
	_, _, err := s.c.get(ctx, key)
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.ErrorIs(t, err, ErrRateLimited)
	require.Equal(t, http.StatusTooManyRequests, ae.Status)
	require.Equal(t, 971, ae.Code)
	require.Equal(t, 30*time.Second, ae.RetryAfter)
	require.EqualValues(t, 3, f.calls.Load(), "one attempt: the SDK's hidden retries are off")

	// Until Retry-After has passed, no call is made at all.
	clock.Advance(29 * time.Second)
	_, _, err = s.c.get(ctx, key)
	require.ErrorIs(t, err, ErrPaused)
	require.ErrorIs(t, err, ErrRateLimited)
	require.EqualValues(t, 3, f.calls.Load())
	require.Equal(t, t0.Add(30*time.Second), s.Stats().PausedUntil)
	// The plain Store answers from memory meanwhile, without a call and without an error.
	require.NoError(t, s.Put(ctx, key, []byte(`{"window":1,"count":4}`), time.Minute))
	v, ok, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	require.JSONEq(t, `{"window":1,"count":4}`, string(v))
	require.EqualValues(t, 3, f.calls.Load())
	require.EqualValues(t, 1, s.Stats().AnsweredLocally)
	require.EqualValues(t, 1, s.Stats().HeldLocally)

	clock.Advance(5 * time.Minute) // the fake's budget period has passed too
	_, _, err = s.Get(ctx, key)
	require.NoError(t, err)
	require.EqualValues(t, 4, f.calls.Load())
}

// A Retry-After given as an HTTP date is read against the store's clock (Config.Now), not the
// machine's: here the fake clock is years behind it.
func TestRetryAfterDateUsesTheInjectedClock(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	f.set(func(f *fakeAPI) { f.budget, f.retryAfterDate = 1, true })
	s := newTestStore(t, f)
	ctx := context.Background()
	_, _, err := s.c.get(ctx, "k")
	require.NoError(t, err)
	_, _, err = s.c.get(ctx, "k")
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 30*time.Second, ae.RetryAfter)
	require.Equal(t, t0.Add(30*time.Second), s.Stats().PausedUntil)

	date := t0.Add(45 * time.Second).UTC().Format(http.TimeFormat)
	require.Equal(t, 45*time.Second, parseRetryAfter(date, t0))
	require.Zero(t, parseRetryAfter(date, t0.Add(time.Minute)), "a date in the past: no wait")
	require.Equal(t, time.Hour, parseRetryAfter(date, t0.Add(-2*time.Hour)), "capped at an hour")
}

// A second write to one key within a second gets 429 without Retry-After: that is about the key,
// so the store does not pause. The plain Store does not even send a second write of its own
// within the second, and holds a write refused that way (another writer got there first) in
// memory, where its Get finds it.
func TestStorePerKeyWriteLimitDoesNotPauseTheStore(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestStore(t, f)
	ctx := context.Background()
	require.NoError(t, s.c.put(ctx, "k", []byte("1"), time.Minute))
	err := s.c.put(ctx, "k", []byte("2"), time.Minute)
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, http.StatusTooManyRequests, ae.Status)
	require.Zero(t, ae.RetryAfter)
	require.True(t, perKeyLimit(err))
	require.True(t, s.Stats().PausedUntil.IsZero())
	require.NoError(t, s.Put(ctx, "other", []byte("1"), time.Minute))

	// Another writer wrote "w" this second: the API refuses ours, which is held.
	value := func(n int) []byte { return fmt.Appendf(nil, `{"window":%d,"count":%d}`, t0.Unix(), n) }
	other := newTestStore(t, f)
	require.NoError(t, other.Put(ctx, "w", value(1), time.Minute))
	calls := f.calls.Load()
	require.NoError(t, s.Put(ctx, "w", value(2), time.Minute))
	require.Equal(t, calls+1, f.calls.Load())
	require.EqualValues(t, 2, f.rejected.Load(), "the API refused it, as it did the second c.put")
	got, _, err := s.Get(ctx, "w")
	require.NoError(t, err)
	require.Equal(t, value(2), got, "ahead of the stored count: the held value")
	// Our own write of "other" was accepted a moment ago: the next is not sent at all.
	calls = f.calls.Load()
	require.NoError(t, s.Put(ctx, "other", []byte("2"), time.Minute))
	require.Equal(t, calls, f.calls.Load())
	require.EqualValues(t, 2, s.Stats().HeldLocally)
	require.True(t, s.Stats().PausedUntil.IsZero())
	// A second later it is written, with the latest value.
	clock.Advance(time.Second)
	require.NoError(t, s.Put(ctx, "other", []byte("3"), time.Minute))
	stored, _ := f.value("other")
	require.Equal(t, "3", stored)
}

func TestStore5xxBacksOffExponentially(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	f.set(func(f *fakeAPI) { f.outage = http.StatusServiceUnavailable })
	s := newTestStore(t, f)
	ctx := context.Background()

	var pauses []time.Duration
	for range 4 {
		before := f.calls.Load()
		_, _, err := s.Get(ctx, "k")
		var ae *APIError
		require.ErrorAs(t, err, &ae)
		require.Equal(t, http.StatusServiceUnavailable, ae.Status)
		require.Contains(t, ae.Message, "503 Service Unavailable", "a non-JSON body is quoted")
		require.Equal(t, before+1, f.calls.Load(), "no hidden retries")
		until := s.Stats().PausedUntil
		pauses = append(pauses, until.Sub(clock.Now()))
		_, _, err = s.Get(ctx, "k")
		require.ErrorIs(t, err, ErrPaused)
		require.Equal(t, before+1, f.calls.Load(), "paused: no call")
		clock.Set(until)
	}
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}, pauses)

	f.set(func(f *fakeAPI) { f.outage = 0 })
	_, _, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, s.Stats().PausedUntil.IsZero())
}

// A hung API costs a request at most the limiter's StoreTimeout; the request then fails open,
// and the requests after it do not wait at all while the store backs off.
func TestHungAPICostsAtMostTheDeadline(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	f.setHang(true)
	s := newTestStore(t, f) // the store's budget and back-off read the fake clock
	const deadline = 150 * time.Millisecond
	l, err := ratelimit.New(ratelimit.Options{
		Scope: "auth", Max: 30, Window: time.Minute, Store: s, StoreTimeout: deadline,
		OnError: func(*http.Request, error) {},
	})
	require.NoError(t, err)

	req := httptest.NewRequest(http.MethodGet, "/login", nil)
	start := time.Now()
	res, err := l.Allow(req)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, ratelimit.ErrStoreFailed)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, res.Allowed, "fails open")
	require.Less(t, elapsed, deadline+time.Second, "bound check: the deadline plus generous slack")
	require.GreaterOrEqual(t, elapsed, deadline)
	t.Logf("hung API: request took %v with a %v deadline", elapsed, deadline)

	start = time.Now()
	res, err = l.Allow(req)
	require.ErrorIs(t, err, ErrPaused)
	require.True(t, res.Allowed)
	require.Less(t, time.Since(start), deadline, "backing off: no wait")

	// A slow API that answers after the deadline costs the same, and no more.
	f.setHang(false)
	f.set(func(f *fakeAPI) { f.latency = 10 * time.Second })
	s2 := newTestStore(t, f)
	l2, err := ratelimit.New(ratelimit.Options{Scope: "auth", Max: 30, Window: time.Minute, Store: s2,
		StoreTimeout: deadline, FailClosed: true, OnError: func(*http.Request, error) {}})
	require.NoError(t, err)
	start = time.Now()
	res, err = l2.Allow(req)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, res.Allowed, "fails closed when asked to")
	require.Less(t, time.Since(start), deadline+time.Second)
}

// The seed's Worker writes {"window":W,"count":n}; plain mode reads it, adds one and writes the
// same format back with the seed's TTL of twice the window.
func TestStoreInteroperatesWithSeedWorker(t *testing.T) {
	clock := newFakeClock(t0.Add(5 * time.Second))
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestStore(t, f)
	l, err := ratelimit.New(ratelimit.Options{Scope: "auth", Max: 30, Window: time.Minute, Store: s, Now: clock.Now})
	require.NoError(t, err)
	key := "ratelimit:auth:203.0.113.50"
	f.store(key, fmt.Sprintf(`{"window":%d,"count":28}`, t0.Unix()), 2*time.Minute)

	req := httptest.NewRequest(http.MethodGet, "/login", nil)
	req.RemoteAddr = "203.0.113.50:4711"
	res, err := l.Allow(req)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Equal(t, 1, res.Remaining)
	v, _ := f.value(key)
	require.JSONEq(t, fmt.Sprintf(`{"window":%d,"count":29}`, t0.Unix()), v)
	f.mu.Lock()
	require.Equal(t, 120, f.ttls[len(f.ttls)-1])
	f.mu.Unlock()

	clock.Advance(time.Second) // Workers KV: one write per second per key
	res, err = l.Allow(req)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Equal(t, 0, res.Remaining)

	clock.Advance(time.Second)
	calls := f.calls.Load()
	res, err = l.Allow(req)
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.Equal(t, calls+1, f.calls.Load(), "over the limit: a GET, no PUT")
	res, err = l.Allow(req)
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.Equal(t, calls+1, f.calls.Load(), "the limiter's deny cache: no call until the window ends")
	v, _ = f.value(key)
	require.JSONEq(t, fmt.Sprintf(`{"window":%d,"count":30}`, t0.Unix()), v)
}

// The SDK's default client-side limiter (4/s, burst 1) would serialise these; the fake holds
// every request until all nine are in flight together, so they only succeed if the store sends
// them concurrently.
func TestStoreDoesNotSerialiseRequests(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	const n = 9
	f.set(func(f *fakeAPI) { f.barrier = n })
	s := newTestStore(t, f)
	// At 4 requests per second the ninth would start after 2 s.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, _, errs[i] = s.Get(ctx, fmt.Sprint("k", i)) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// countingTransport counts response bodies opened and closed.
type countingTransport struct {
	base           http.RoundTripper
	opened, closed atomic.Int64
}

type countingBody struct {
	io.ReadCloser
	t    *countingTransport
	once sync.Once
}

func (b *countingBody) Close() error {
	b.once.Do(func() { b.t.closed.Add(1) })
	return b.ReadCloser.Close()
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil {
		t.opened.Add(1)
		resp.Body = &countingBody{ReadCloser: resp.Body, t: t}
	}
	return resp, err
}

func TestResponseBodiesAlwaysClosed(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	ct := &countingTransport{base: http.DefaultTransport}
	s := newTestStore(t, f, func(c *Config) { c.HTTPClient = &http.Client{Transport: ct} })
	ctx := context.Background()

	require.NoError(t, s.Put(ctx, "k", []byte("v"), time.Minute)) // 200
	_, _, err := s.Get(ctx, "k")                                  // 200
	require.NoError(t, err)
	_, _, err = s.Get(ctx, "missing") // 404 10009
	require.NoError(t, err)
	require.Error(t, s.c.put(ctx, "k", []byte("v"), time.Minute)) // 429: second write within a second
	clock.Advance(time.Minute)
	f.set(func(f *fakeAPI) { f.outage = http.StatusBadGateway })
	_, _, err = s.Get(ctx, "k") // 502, which the SDK leaves open
	require.Error(t, err)
	require.EqualValues(t, 5, ct.opened.Load())
	require.Equal(t, ct.opened.Load(), ct.closed.Load())
}

func TestBudgetBoundsPlainMode(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestStore(t, f, func(c *Config) { c.Budget, c.BudgetPeriod = 3, time.Minute })
	ctx := context.Background()
	for range 3 {
		_, _, err := s.Get(ctx, "k")
		require.NoError(t, err)
	}
	_, _, err := s.c.get(ctx, "k")
	require.ErrorIs(t, err, ErrBudgetExhausted)
	require.ErrorIs(t, s.c.put(ctx, "k", []byte("v"), time.Minute), ErrBudgetExhausted)
	// The plain Store answers from memory instead: absent, then what it held.
	_, ok, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, s.Put(ctx, "k", []byte("v"), time.Minute))
	v, ok, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "v", string(v))
	require.EqualValues(t, 3, f.calls.Load())
	st := s.Stats()
	require.EqualValues(t, 2, st.AnsweredLocally)
	require.EqualValues(t, 1, st.HeldLocally)
	require.Equal(t, 1, st.Keys)
	clock.Advance(time.Minute)
	_, _, err = s.Get(ctx, "k")
	require.NoError(t, err)
	require.EqualValues(t, 4, f.calls.Load())
}

// A budget must fit the ring that tracks it: a long period with a proportionally large budget
// passes the rate check but is refused, with its value quoted, instead of allocating 8 bytes
// per call of the period.
func TestBudgetIsBounded(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	budget, period := 2_000_000, 1000*time.Hour // 0.56 calls per second, far under the limit
	_, err := NewStore(Config{APIToken: "t", AccountID: "a", NamespaceID: "n", Budget: budget, BudgetPeriod: period})
	require.ErrorContains(t, err, "cloudflarekv: Config.Budget 2000000 per 1000h0m0s is more than the 100000 calls per period the store can track")
	_, err = NewSynced(Config{APIToken: "t", AccountID: "a", NamespaceID: "n", Budget: budget, BudgetPeriod: period})
	require.ErrorContains(t, err, "Config.Budget 2000000")
	s := newTestStore(t, f, func(c *Config) { c.Budget, c.BudgetPeriod = MaxBudget, 100*time.Hour })
	require.Len(t, s.c.budget.times, MaxBudget)
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{EnvAPIToken: "tok", EnvAccountID: " acc ", EnvNamespaceID: "ns"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := ConfigFromEnv(lookup)
	require.NoError(t, err)
	require.Equal(t, Config{APIToken: "tok", AccountID: "acc", NamespaceID: "ns"}, cfg)

	delete(env, EnvAPIToken)
	env[EnvNamespaceID] = "  "
	_, err = ConfigFromEnv(lookup)
	require.ErrorIs(t, err, ErrNotConfigured)
	require.EqualError(t, err, "cloudflarekv: not configured: CLOUDFLARE_API_TOKEN, RATE_LIMIT_KV_NAMESPACE_ID not set")
}

func TestConstructorsRejectBadConfig(t *testing.T) {
	_, err := NewStore(Config{AccountID: "a/b", NamespaceID: "", BaseURL: "ftp://x", Budget: 5000})
	require.Error(t, err)
	for _, want := range []string{
		"cloudflarekv: Config.APIToken is empty",
		`cloudflarekv: Config.AccountID "a/b" is not a Cloudflare account id`,
		`cloudflarekv: Config.NamespaceID "" is not a Workers KV namespace id`,
		`cloudflarekv: Config.BaseURL "ftp://x" is not an http(s) URL`,
		"cloudflarekv: Config.Budget 5000 per 5m0s is more than Cloudflare's 1200 per 5m",
	} {
		require.ErrorContains(t, err, want)
	}
	_, err = NewSynced(Config{APIToken: "t", AccountID: "a", NamespaceID: "n", SyncInterval: 1500 * time.Millisecond, InstanceID: "has space", CallTimeout: -1})
	for _, want := range []string{
		"cloudflarekv: Config.SyncInterval 1.5s must be a whole number of seconds, at least 1s",
		`cloudflarekv: Config.InstanceID "has space" must be 1 to 64`,
		"cloudflarekv: Config.CallTimeout -1ns must be positive",
	} {
		require.ErrorContains(t, err, want)
	}
	s, err := NewSynced(Config{APIToken: "t", AccountID: "a", NamespaceID: "n"})
	require.NoError(t, err)
	require.True(t, validInstance(s.InstanceID()), s.InstanceID())
	require.Equal(t, 20, s.perSync, "600 per 5 minutes, synced every 10 s")
}

func TestAPIErrorMessage(t *testing.T) {
	err := error(&APIError{Op: "get", Key: "k", Status: 429, Code: 971, Message: "Please wait", RetryAfter: 30 * time.Second})
	require.EqualError(t, err, `cloudflarekv: get "k": HTTP 429, code 971: Please wait (retry after 30s)`)
	require.True(t, errors.Is(err, ErrRateLimited))
	require.False(t, errors.Is(err, ErrConfiguration))
	require.True(t, errors.Is(&APIError{Status: 401}, ErrConfiguration))
	require.False(t, errors.Is(&APIError{Status: 404, Code: CodeKeyNotFound}, ErrConfiguration))
	require.Equal(t, 30*time.Second, parseRetryAfter(" 30 ", t0))
	require.Zero(t, parseRetryAfter("soon", t0))
}

// plainRun drives one real limiter over a plain Store, one request at a time, with the
// limiter's default policy (fail open), and counts what it admits and the errors it returns.
type plainRun struct {
	clock    *fakeClock
	f        *fakeAPI
	store    *Store
	limiter  *ratelimit.Limiter
	reported atomic.Int64 // errors Allow returned; the request then failed open
}

func newPlainRun(t *testing.T, max int, edit ...func(*Config)) *plainRun {
	clock := newFakeClock(t0.Add(5 * time.Second))
	f := newFakeAPI(clock)
	t.Cleanup(f.Close)
	f.set(func(f *fakeAPI) { f.budget = APIRequestLimit })
	p := &plainRun{clock: clock, f: f, store: newTestStore(t, f, edit...)}
	var err error
	p.limiter, err = ratelimit.New(ratelimit.Options{Scope: "auth", Max: max, Window: time.Minute, Store: p.store, Now: clock.Now})
	require.NoError(t, err)
	return p
}

// burst sends n requests from ip, step apart, and returns how many were admitted.
func (p *plainRun) burst(t *testing.T, ip string, n int, step time.Duration) (admitted int) {
	t.Helper()
	for range n {
		res, err := p.limiter.Allow(clientRequest(ip))
		if err != nil && p.reported.Add(1) == 1 {
			t.Logf("first store error: %v", err)
		}
		if res.Allowed {
			admitted++
		}
		p.clock.Advance(step)
	}
	return admitted
}

// One client bursts 400 requests at one instance in 0.4 s, far faster than Workers KV's one
// write per second per key. The plain Store holds the writes KV refuses (or that it does not
// send) in memory, so the limiter, failing open by default, still admits exactly Max; then a
// new client gets exactly Max too (the budget is not spent: the deny cache stops the calls).
func TestPlainStoreLimitsABurstOnOneInstance(t *testing.T) {
	const max = 3
	p := newPlainRun(t, max)
	require.Equal(t, max, p.burst(t, "203.0.113.7", 400, time.Millisecond), "one client, 400 requests")
	require.Equal(t, max, p.burst(t, "198.51.100.9", 10, time.Millisecond), "then another client, 10 requests")
	st := p.store.Stats()
	require.Zero(t, p.reported.Load(), "no store error: nothing failed open")
	require.Zero(t, p.f.rejected.Load(), "no call refused by the API")
	require.Equal(t, p.f.calls.Load(), st.Calls)
	require.EqualValues(t, 2*(max+2), st.Calls, "per client: Max+1 GETs (the last finds it over) and one PUT (KV's one per second)")
	// What KV holds: the one write per second it took; the rest is in this instance's memory.
	v, ok := p.f.value("ratelimit:auth:203.0.113.7")
	require.True(t, ok)
	require.JSONEq(t, fmt.Sprintf(`{"window":%d,"count":1}`, t0.Unix()), v)
	t.Logf("plain burst: 400+10 requests from 2 clients, admitted %d+%d (Max %d), %d API calls, %d writes held in memory",
		max, max, max, st.Calls, st.HeldLocally)
}

// Many clients, one instance: the budget runs out (or the API answers 429 for the token), and
// the Store then answers from memory, so each client still gets exactly Max instead of the
// layer failing open for everyone.
func TestPlainStoreLimitsWhenCallsRunOut(t *testing.T) {
	const max, clients, each = 3, 40, 10
	for _, tc := range []struct {
		name      string
		storeCfg  func(*Config)
		apiBudget int
	}{
		{"store budget spent", func(c *Config) { c.Budget = 30 }, APIRequestLimit},
		{"API-wide 429", func(*Config) {}, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlainRun(t, max, tc.storeCfg)
			p.f.set(func(f *fakeAPI) { f.budget = tc.apiBudget })
			for i := range clients {
				require.Equal(t, max, p.burst(t, fmt.Sprint("192.0.2.", i), each, 10*time.Millisecond), "client %d", i)
			}
			st := p.store.Stats()
			require.Zero(t, p.reported.Load(), "no store error: nothing failed open")
			require.LessOrEqual(t, st.Calls, int64(31))
			require.Positive(t, st.AnsweredLocally)
			t.Logf("%s: %d clients × %d requests, each admitted %d (Max %d), %d API calls, %d GETs answered and %d PUTs held in memory",
				tc.name, clients, each, max, max, st.Calls, st.AnsweredLocally, st.HeldLocally)
		})
	}
}

// The plain Store's memory is bounded and expires: past localMaxKeys a new key is not
// remembered (its writes refused for capacity then fail as the API answered), and entries go
// once their TTL has passed, except a key written less than a second ago, whose write time is
// kept for Workers KV's per-key limit.
func TestPlainStoreMemoryIsBoundedAndExpires(t *testing.T) {
	var l localValues
	now := t0.UnixNano()
	perShard := localMaxKeys / localShards
	var keys []string
	for i := 0; len(keys) <= perShard; i++ {
		if k := fmt.Sprint("ratelimit:global:10.", i); fnv32(k)%localShards == 0 {
			keys = append(keys, k)
		}
	}
	for _, k := range keys[:perShard] {
		require.True(t, l.keep(k, []byte(`{"window":1,"count":1}`), time.Minute, now, false))
	}
	require.False(t, l.keep(keys[perShard], []byte(`{"window":1,"count":1}`), time.Minute, now, false), "full")
	require.True(t, l.keep(keys[0], []byte(`{"window":1,"count":2}`), time.Minute, now, true), "known keys still update")
	v, ok := l.get(keys[0], now)
	require.True(t, ok)
	require.Equal(t, `{"window":1,"count":2}`, string(v))
	require.True(t, l.keep(keys[0], []byte(`{"window":1,"count":1}`), time.Minute, now, false))
	v, _ = l.get(keys[0], now)
	require.Equal(t, `{"window":1,"count":2}`, string(v), "a value behind the remembered one does not replace it")

	later := now + int64(time.Minute)
	_, ok = l.get(keys[1], later)
	require.False(t, ok, "expired")
	require.True(t, l.keep(keys[perShard], []byte(`{"window":2,"count":1}`), time.Minute, later, false), "room again")
	require.Equal(t, 1, l.len(), "expired entries are swept")
	_, ok = l.get(keys[0], later)
	require.False(t, ok)
}

func TestPlainStoreConcurrentUse(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestStore(t, f)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				key := fmt.Sprint("k", i%3)
				if _, _, err := s.Get(ctx, key); err != nil {
					t.Error(err)
				}
				if err := s.Put(ctx, key, fmt.Appendf(nil, `{"window":%d,"count":%d}`, t0.Unix(), g*20+i), time.Minute); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, s.Stats().Failed-f.rejected.Load(), "only per-key 429s failed")
	require.Equal(t, 3, s.Stats().Keys)
}
