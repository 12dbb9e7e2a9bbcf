package cloudflarekv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/stretchr/testify/require"
)

func newTestSynced(t *testing.T, f *fakeAPI, id string, edit ...func(*Config)) *Synced {
	t.Helper()
	cfg := f.config()
	cfg.InstanceID = id
	for _, e := range edit {
		e(&cfg)
	}
	s, err := NewSynced(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func newTestLimiter(t *testing.T, store ratelimit.KV, clock *fakeClock, max int) *ratelimit.Limiter {
	t.Helper()
	l, err := ratelimit.New(ratelimit.Options{Scope: "auth", Max: max, Window: time.Minute, Store: store, Now: clock.Now,
		OnError: func(_ *http.Request, err error) { t.Errorf("store error: %v", err) }})
	require.NoError(t, err)
	return l
}

func clientRequest(ip string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/login", nil)
	r.RemoteAddr = ip + ":50000"
	return r
}

const burstKey = "ratelimit:auth:203.0.113.7"

func decodeValue(t *testing.T, f *fakeAPI, key string) syncedValue {
	t.Helper()
	raw, ok := f.value(key)
	require.True(t, ok, "no value for %q", key)
	var v syncedValue
	require.NoError(t, json.Unmarshal([]byte(raw), &v))
	return v
}

func TestSyncedCountsLocallyWithoutCalls(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestSynced(t, f, "a")
	ctx := context.Background()

	for i := 1; i <= 5; i++ {
		n, err := s.Increment(ctx, "k", t0, 2*time.Minute)
		require.NoError(t, err)
		require.EqualValues(t, i, n)
	}
	n, _ := s.Increment(ctx, "other", t0, 2*time.Minute)
	require.EqualValues(t, 1, n, "keys are counted apart")
	n, _ = s.Increment(ctx, "k", t0.Add(time.Minute), 2*time.Minute)
	require.EqualValues(t, 1, n, "a new window starts from zero")
	n, _ = s.Increment(ctx, "k", t0, 2*time.Minute)
	require.EqualValues(t, 2, n, "a late call for the old window counts in the current one")
	require.Zero(t, f.calls.Load(), "Increment never calls the API")
}

func TestSyncedDropsEntriesWhenTheirWindowEnds(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	s := newTestSynced(t, f, "a", func(c *Config) { c.Budget = 1 })
	for i := range 1000 {
		_, err := s.Increment(context.Background(), fmt.Sprint("ratelimit:global:10.0.", i/256, ".", i%256), t0, 2*time.Minute)
		require.NoError(t, err)
	}
	require.Equal(t, 1000, s.Stats().Keys)
	clock.Set(t0.Add(time.Minute - time.Nanosecond))
	_ = s.Sync(context.Background())
	require.Equal(t, 1000, s.Stats().Keys, "the window has not ended yet")
	clock.Set(t0.Add(time.Minute))
	require.NoError(t, s.Sync(context.Background()))
	require.Zero(t, s.Stats().Keys, "memory is given back when the window ends")
}

func TestSyncedMergesInstancesAndKeepsSeedFormat(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a, b := newTestSynced(t, f, "a"), newTestSynced(t, f, "b")
	ctx := context.Background()
	incr := func(s *Synced, times int) (n int64) {
		for range times {
			n, _ = s.Increment(ctx, burstKey, t0, 2*time.Minute)
		}
		return n
	}
	incr(a, 5)
	incr(b, 3)
	require.NoError(t, a.Sync(ctx)) // reads nothing, writes a=5
	v := decodeValue(t, f, burstKey)
	require.Equal(t, t0.Unix(), *v.Window)
	require.EqualValues(t, 5, *v.Count)
	require.Equal(t, map[string]int64{"a": 5}, v.Instances)

	clock.Advance(time.Second)
	require.NoError(t, b.Sync(ctx)) // reads a=5, writes a=5,b=3
	v = decodeValue(t, f, burstKey)
	require.EqualValues(t, 8, *v.Count, "count is the fleet's sum, which the seed's Worker reads")
	require.Equal(t, map[string]int64{"a": 5, "b": 3}, v.Instances)
	require.EqualValues(t, 9, incr(b, 1), "b's 4 and a's 5")

	clock.Advance(time.Second)
	require.NoError(t, a.Sync(ctx)) // reads b=3; a is not dirty
	require.EqualValues(t, 6+3, incr(a, 1))
	f.mu.Lock()
	for _, ttl := range f.ttls {
		require.Equal(t, 120, ttl, "the seed's TTL of twice the window")
	}
	f.mu.Unlock()
	require.Zero(t, f.rejected.Load())

	// The root package's parser reads the value as the seed's {"window","count"}.
	kv := ratelimit.NewMemoryKV()
	raw, _ := f.value(burstKey)
	require.NoError(t, kv.Put(ctx, burstKey, []byte(raw), time.Minute))
	l := newTestLimiter(t, struct{ ratelimit.KV }{kv}, clock, 30) // hides Counter: Get, then Put
	res, err := l.Allow(clientRequest("203.0.113.7"))
	require.NoError(t, err)
	require.Equal(t, 30-8-1, res.Remaining, "a seed-format reader sees the count of 8")
}

// writtenOnce returns instance "a" after it counted 4 requests of burstKey at t0 in a window of
// ttl/2 and wrote them, a second later, with the fake API and the clock, and the time of the
// value it wrote (Unix milliseconds).
func writtenOnce(t *testing.T, ttl time.Duration) (*fakeClock, *fakeAPI, *Synced, int64) {
	t.Helper()
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	t.Cleanup(f.Close)
	a := newTestSynced(t, f, "a")
	for range 4 {
		a.Increment(context.Background(), burstKey, t0, ttl)
	}
	clock.Advance(time.Second)
	composed := clock.Now().UnixMilli()
	require.NoError(t, a.Sync(context.Background()))
	require.Equal(t, map[string]int64{"a": 4}, decodeValue(t, f, burstKey).Instances)
	return clock, f, a, composed
}

// requireHealed checks that the value holds a's count and b's again.
func requireHealed(t *testing.T, f *fakeAPI) {
	t.Helper()
	v := decodeValue(t, f, burstKey)
	require.Equal(t, map[string]int64{"a": 4, "b": 4}, v.Instances)
	require.EqualValues(t, 8, *v.Count)
}

// A value composed after ours by a writer that had not seen ours overwrote it: the next sync
// writes it again.
func TestSyncedLostUpdateHeals(t *testing.T) {
	clock, f, a, _ := writtenOnce(t, 2*time.Minute)
	// b composes its value a second later, from a read that did not show a's write yet.
	clock.Advance(time.Second)
	f.store(burstKey, fmt.Sprintf(`{"window":%d,"count":4,"instances":{"b":4},"at":%d}`, t0.Unix(), clock.Now().UnixMilli()), 2*time.Minute)
	clock.Advance(time.Second)
	require.NoError(t, a.Sync(context.Background())) // reads b=4 and no a, in a later value
	requireHealed(t, f)
}

// The seed's Worker left the key's value of the last window (undated, as the seed writes it), or
// something that is no counter: a read that still shows it after our write is most likely
// stale, and the write is not made again at every sync.
func TestSyncedDoesNotRewriteOverAnOlderValueAtEverySync(t *testing.T) {
	for name, value := range map[string]string{
		"the seed Worker's last window":  fmt.Sprintf(`{"window":%d,"count":3}`, t0.Add(-5*time.Minute).Unix()),
		"another instance's last window": fmt.Sprintf(`{"window":%d,"count":3,"instances":{"b":3},"at":%d}`, t0.Add(-5*time.Minute).Unix(), t0.Add(-time.Minute).UnixMilli()),
		"no counter":                     `garbage`,
	} {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock(t0.Add(-2 * time.Minute))
			f := newFakeAPI(clock)
			defer f.Close()
			f.store(burstKey, value, 10*time.Minute)
			clock.Set(t0)
			f.set(func(f *fakeAPI) { f.readLag = time.Minute })
			a := newTestSynced(t, f, "a")
			a.Increment(context.Background(), burstKey, t0, 10*time.Minute)
			for range 6 { // up to 60 s after the write, which the reads then show
				clock.Advance(10 * time.Second)
				require.NoError(t, a.Sync(context.Background()))
			}
			require.EqualValues(t, 1, a.Stats().PairsWritten)
		})
	}
}

// A value composed before ours that lands after it (or a reader's stale view) looks the same
// as a read from before our write became visible: the write is made again once it is a minute
// old, when Workers KV would have shown it, or half a window old in a shorter window.
func TestSyncedLostUpdateOfAnOlderValueHealsLater(t *testing.T) {
	for _, tc := range []struct {
		ttl   time.Duration // twice the window
		grace time.Duration
	}{
		{10 * time.Minute, time.Minute},
		{2 * time.Minute, 30 * time.Second},
	} {
		t.Run(tc.ttl.String(), func(t *testing.T) {
			clock, f, a, composed := writtenOnce(t, tc.ttl)
			written := clock.Now()
			f.store(burstKey, fmt.Sprintf(`{"window":%d,"count":4,"instances":{"b":4},"at":%d}`, t0.Unix(), composed-1), tc.ttl)
			for clock.Now().Add(5*time.Second).Sub(written) < tc.grace {
				clock.Advance(5 * time.Second)
				require.NoError(t, a.Sync(context.Background()))
				require.Equal(t, map[string]int64{"b": 4}, decodeValue(t, f, burstKey).Instances, "%v after the write", clock.Now().Sub(written))
			}
			clock.Set(written.Add(tc.grace))
			require.NoError(t, a.Sync(context.Background()))
			requireHealed(t, f)
		})
	}
}

// A value that does not say when it was composed (an instance on an older release of this
// package) may have overwritten ours: the next sync writes it again.
func TestSyncedLostUpdateByAnUndatedValueHeals(t *testing.T) {
	clock, f, a, _ := writtenOnce(t, 2*time.Minute)
	f.store(burstKey, fmt.Sprintf(`{"window":%d,"count":4,"instances":{"b":4}}`, t0.Unix()), 2*time.Minute)
	clock.Advance(time.Second)
	require.NoError(t, a.Sync(context.Background()))
	requireHealed(t, f)
}

// A value of a later window, undated (the seed's Worker, on a clock that runs ahead) or not,
// is not replaced by writing ours again: only new requests here write this window's value.
func TestSyncedLeavesALaterWindowsValueAlone(t *testing.T) {
	for name, value := range map[string]string{
		"undated": `{"window":%d,"count":3}`,
		"dated":   `{"window":%d,"count":3,"instances":{"b":3},"at":9999999999999}`,
	} {
		t.Run(name, func(t *testing.T) {
			clock, f, a, _ := writtenOnce(t, 2*time.Minute)
			later := fmt.Sprintf(value, t0.Add(time.Minute).Unix())
			f.store(burstKey, later, 2*time.Minute)
			for range 5 {
				clock.Advance(5 * time.Second)
				require.NoError(t, a.Sync(context.Background()))
			}
			got, ok := f.value(burstKey)
			require.True(t, ok)
			require.Equal(t, later, got)
		})
	}
}

// Counts in KV are whatever a writer put there: a huge one denies, and never wraps around into
// an allowed request; a negative one is no count, and the client keeps exactly its budget.
func TestSyncedHugeStoredCounts(t *testing.T) {
	for name, tc := range map[string]struct {
		value    string
		admitted int // of the limit of 5, after the first request
	}{
		"instance":             {`{"window":%d,"count":9223372036854775807,"instances":{"b":9223372036854775807,"c":9223372036854775807}}`, 0},
		"seed Worker":          {`{"window":%d,"count":9223372036854775807}`, 0},
		"negative seed Worker": {`{"window":%d,"count":-9223372036854775808}`, 4},
		"negative instance":    {`{"window":%d,"count":1,"instances":{"b":-9223372036854775808}}`, 4},
	} {
		t.Run(name, func(t *testing.T) {
			clock := newFakeClock(t0)
			f := newFakeAPI(clock)
			defer f.Close()
			a := newTestSynced(t, f, "a")
			l := newTestLimiter(t, a, clock, 5)
			res, err := l.Allow(clientRequest("203.0.113.7"))
			require.NoError(t, err)
			require.True(t, res.Allowed)
			require.NoError(t, a.Sync(context.Background())) // writes a=1
			clock.Advance(time.Second)
			f.store(burstKey, fmt.Sprintf(tc.value, t0.Unix()), 2*time.Minute)
			clock.Advance(time.Second)
			require.NoError(t, a.Sync(context.Background()))
			admitted := 0
			for range 20 {
				res, err = l.Allow(clientRequest("203.0.113.7"))
				require.NoError(t, err)
				if res.Allowed {
					admitted++
				}
			}
			require.Equal(t, tc.admitted, admitted)
		})
	}
}

// Workers KV may take a minute to show a write to reads, and caches "not found" as long: a key
// written once, with no new requests, is not written again at every sync meanwhile.
func TestSyncedDoesNotRewriteWhatReadsDoNotShowYet(t *testing.T) {
	for _, tc := range []struct {
		ttl, lag time.Duration
	}{
		{10 * time.Minute, 0},
		{10 * time.Minute, 30 * time.Second},
		{10 * time.Minute, time.Minute},
		{2 * time.Minute, 30 * time.Second}, // a 60 s window: "not found" is never doubted in it
		{2 * time.Minute, 35 * time.Second},
		{2 * time.Minute, time.Minute},
	} {
		t.Run(fmt.Sprintf("window %v, read lag %v", tc.ttl/2, tc.lag), func(t *testing.T) {
			clock := newFakeClock(t0)
			f := newFakeAPI(clock)
			defer f.Close()
			f.set(func(f *fakeAPI) { f.readLag = tc.lag })
			a := newTestSynced(t, f, "a")
			ctx := context.Background()
			a.Increment(ctx, burstKey, t0, tc.ttl)
			syncs := int64(0)
			for clock.Now().Add(10 * time.Second).Before(t0.Add(min(tc.ttl/2, 3*time.Minute))) {
				clock.Advance(10 * time.Second)
				require.NoError(t, a.Sync(ctx))
				syncs++
			}
			st := a.Stats()
			require.EqualValues(t, 1, st.PairsWritten, "one request, one write")
			require.Equal(t, syncs, st.Reads, "the key was read at every sync")
		})
	}
}

// A second write to a key within a second is refused by Workers KV; in a bulk write the key comes
// back in unsuccessful_keys, which the SDK's WriteWorkersKVEntries would drop. The store reads
// them, reports them, and writes the key again at the next sync.
func TestSyncedRetriesUnsuccessfulKeys(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a, b := newTestSynced(t, f, "a"), newTestSynced(t, f, "b")
	ctx := context.Background()
	a.Increment(ctx, burstKey, t0, 2*time.Minute)
	b.Increment(ctx, burstKey, t0, 2*time.Minute)
	b.Increment(ctx, "ratelimit:auth:198.51.100.2", t0, 2*time.Minute)
	require.NoError(t, a.Sync(ctx))
	err := b.Sync(ctx) // same second: burstKey refused, the other key accepted
	require.ErrorContains(t, err, "1 of 2 keys unsuccessful")
	require.EqualValues(t, 1, b.Stats().UnsuccessfulKeys)
	require.EqualValues(t, 1, b.Stats().PairsWritten)

	clock.Advance(time.Second)
	require.NoError(t, b.Sync(ctx))
	v := decodeValue(t, f, burstKey)
	require.Equal(t, map[string]int64{"a": 1, "b": 1}, v.Instances)
	require.EqualValues(t, 2, b.Stats().PairsWritten)
	require.EqualValues(t, 1, f.unsuccessful.Load())
}

func TestSyncedWritesEachKeyAtMostOncePerSecond(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a := newTestSynced(t, f, "a")
	ctx := context.Background()
	a.Increment(ctx, burstKey, t0, 2*time.Minute)
	require.NoError(t, a.Sync(ctx))
	a.Increment(ctx, burstKey, t0, 2*time.Minute)
	clock.Advance(999 * time.Millisecond)
	require.NoError(t, a.Sync(ctx))
	require.EqualValues(t, 1, a.Stats().BulkWrites, "not written again within the second")
	clock.Advance(time.Millisecond)
	require.NoError(t, a.Sync(ctx))
	require.EqualValues(t, 2, a.Stats().BulkWrites)
	require.Zero(t, f.rejected.Load()+f.unsuccessful.Load())
}

func TestSyncedBulkWritesManyKeysInOneCall(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a := newTestSynced(t, f, "a", func(c *Config) { c.Budget, c.SyncInterval = 60, 10*time.Second })
	ctx := context.Background()
	for i := range 2500 {
		a.Increment(ctx, fmt.Sprint("ratelimit:global:10.1.", i/256, ".", i%256), t0, 2*time.Minute)
	}
	require.NoError(t, a.Sync(ctx))
	st := a.Stats()
	require.EqualValues(t, 1, st.BulkWrites)
	require.EqualValues(t, 2500, st.PairsWritten)
	require.EqualValues(t, 1, a.perSync-int(st.Reads), "60 per 5 minutes every 10 s: 2 calls, 1 read and 1 write")
	require.Equal(t, st.Calls, f.calls.Load())
}

func TestSyncedStaysWithinBudget(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a := newTestSynced(t, f, "a", func(c *Config) { c.Budget, c.BudgetPeriod, c.SyncInterval = 6, time.Minute, 20*time.Second })
	require.Equal(t, 2, a.perSync)
	ctx := context.Background()
	for i := range 50 {
		a.Increment(ctx, fmt.Sprint("k", i), t0, 10*time.Minute)
	}
	var errs []error
	for range 10 {
		errs = append(errs, a.Sync(ctx))
		clock.Advance(time.Second)
	}
	require.EqualValues(t, 6, f.calls.Load(), "never more than the budget")
	require.ErrorIs(t, errors.Join(errs...), ErrBudgetExhausted)
	clock.Advance(time.Minute)
	require.NoError(t, a.Sync(ctx))
	require.EqualValues(t, 8, f.calls.Load())
}

func TestSyncedBacksOffOn429AndKeepsCounting(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	f.set(func(f *fakeAPI) { f.budget, f.retryAfter = 1, 45 }) // another user of the token spent it
	a := newTestSynced(t, f, "a")
	ctx := context.Background()
	a.Increment(ctx, burstKey, t0, 10*time.Minute)
	a.Increment(ctx, "k2", t0, 10*time.Minute)

	err := a.Sync(ctx) // one read passes, the second gets 429: the sync stops there
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 45*time.Second, ae.RetryAfter)
	require.EqualValues(t, 2, f.calls.Load())
	require.Equal(t, t0.Add(45*time.Second), a.Stats().PausedUntil)

	clock.Advance(44 * time.Second)
	require.ErrorIs(t, a.Sync(ctx), ErrPaused)
	require.EqualValues(t, 2, f.calls.Load(), "paused: no call")
	n, err := a.Increment(ctx, burstKey, t0, 10*time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "counting goes on")

	clock.Advance(5 * time.Minute)
	require.NoError(t, a.Sync(ctx))
}

func TestSyncedHungAPINeverHoldsARequest(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a := newTestSynced(t, f, "a", func(c *Config) { c.CallTimeout = time.Minute })
	l := newTestLimiter(t, a, clock, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := l.Allow(clientRequest("203.0.113.7"))
	require.NoError(t, err)

	f.setHang(true)
	syncDone := make(chan error)
	go func() { syncDone <- a.Sync(ctx) }()
	require.Eventually(t, func() bool { return f.inFlight.Load() == 1 }, 5*time.Second, time.Millisecond)
	start := time.Now()
	for range 100 {
		res, err := l.Allow(clientRequest("203.0.113.7"))
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	require.Less(t, time.Since(start), time.Second, "bound check: requests do not wait for a hung sync")
	cancel()
	require.ErrorIs(t, <-syncDone, context.Canceled)
}

func TestSyncedReadsSeedWorkerValue(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a := newTestSynced(t, f, "a")
	ctx := context.Background()
	a.Increment(ctx, burstKey, t0, 2*time.Minute)
	f.store(burstKey, fmt.Sprintf(`{"window":%d,"count":10}`, t0.Unix()), 2*time.Minute)
	require.NoError(t, a.Sync(ctx))
	n, _ := a.Increment(ctx, burstKey, t0, 2*time.Minute)
	require.EqualValues(t, 12, n, "the Worker's 10 and our 2")
	v := decodeValue(t, f, burstKey)
	require.Equal(t, map[string]int64{"a": 1, seedInstance: 10}, v.Instances)
}

func TestSyncedRunAndClose(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	a := newTestSynced(t, f, "a", func(c *Config) { c.SyncInterval = time.Second })
	ran := make(chan error)
	go func() { ran <- a.Run(context.Background()) }()
	require.Eventually(t, func() bool { a.runMu.Lock(); defer a.runMu.Unlock(); return a.running }, 5*time.Second, time.Millisecond)
	require.ErrorContains(t, a.Run(context.Background()), "Run called twice")
	require.NoError(t, a.Close())
	require.NoError(t, <-ran, "Close stops Run, and Run has returned when Close does")
	require.ErrorIs(t, a.Run(context.Background()), ErrClosed)
	require.NoError(t, a.Close(), "Close is idempotent")

	b := newTestSynced(t, f, "b")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { ran <- b.Run(ctx) }()
	cancel()
	require.ErrorIs(t, <-ran, context.Canceled)
}

func TestSyncSlotsArePhasedByInstance(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	phases := map[time.Duration]bool{}
	for _, id := range []string{"web-1", "web-2", "web-3"} {
		s := newTestSynced(t, f, id, func(c *Config) { c.SyncInterval = 10 * time.Second })
		d := s.untilNextSync(t0)
		require.Greater(t, d, time.Duration(0))
		require.LessOrEqual(t, d, 10*time.Second)
		require.Zero(t, d%time.Second, "slots fall on whole seconds")
		phases[d] = true
		next := t0.Add(d)
		require.Equal(t, 10*time.Second, s.untilNextSync(next), "then every interval")
		require.Equal(t, d-300*time.Millisecond, s.untilNextSync(t0.Add(300*time.Millisecond)))
	}
	require.Len(t, phases, 3, "these three IDs sync in different seconds")
}

func TestSyncErrorsAreReported(t *testing.T) {
	f := newFakeAPI(newFakeClock(t0))
	defer f.Close()
	var got []error
	a := newTestSynced(t, f, "a", func(c *Config) { c.OnSyncError = func(err error) { got = append(got, err) } })
	a.report(fmt.Errorf("%w until later", ErrPaused))
	boom := &APIError{Op: "get", Status: 500}
	a.report(boom)
	require.Equal(t, []error{boom}, got, "a pause is not reported again")
}

// burst drives three real limiters, each with its own Synced store, against one fake API and
// one client. Instance i syncs at the whole seconds s with s%3 == i (SyncInterval 3 s), as Run
// does with distinct phases, so no two instances write a key in the same second.
type burst struct {
	clock    *fakeClock
	f        *fakeAPI
	stores   []*Synced
	limiters []*ratelimit.Limiter
	nextSync []time.Time
	admitted int
}

const (
	burstInstances = 3
	burstMax       = 30
	burstBudget    = 200 // per instance per 5 minutes: 2 calls per 3-second sync
	burstInterval  = 3 * time.Second
)

func newBurst(t *testing.T) *burst {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	t.Cleanup(f.Close)
	// The fake API allows the fleet exactly its budget: a call past it would be rejected.
	f.set(func(f *fakeAPI) { f.budget = burstInstances * burstBudget })
	b := &burst{clock: clock, f: f}
	for i := range burstInstances {
		s := newTestSynced(t, f, fmt.Sprint("web-", i), func(c *Config) {
			c.Budget, c.SyncInterval = burstBudget, burstInterval
		})
		b.stores = append(b.stores, s)
		b.limiters = append(b.limiters, newTestLimiter(t, s, clock, burstMax))
		b.nextSync = append(b.nextSync, t0.Add(time.Duration(i)*time.Second))
	}
	return b
}

// advance moves the clock to at, running every sync that falls due on the way.
func (b *burst) advance(t *testing.T, at time.Time) {
	for {
		i := 0
		for j := range b.nextSync {
			if b.nextSync[j].Before(b.nextSync[i]) {
				i = j
			}
		}
		if b.nextSync[i].After(at) {
			break
		}
		b.clock.Set(b.nextSync[i])
		require.NoError(t, b.stores[i].Sync(context.Background()))
		b.nextSync[i] = b.nextSync[i].Add(burstInterval)
	}
	b.clock.Set(at)
}

func (b *burst) request(t *testing.T, instance int) bool {
	res, err := b.limiters[instance].Allow(clientRequest("203.0.113.7"))
	require.NoError(t, err)
	if res.Allowed {
		b.admitted++
	}
	return res.Allowed
}

func (b *burst) check(t *testing.T) (calls int64) {
	t.Helper()
	require.Zero(t, b.f.rejected.Load(), "the API rejected no call")
	require.Zero(t, b.f.unsuccessful.Load(), "and no key of a bulk write")
	for _, s := range b.stores {
		calls += s.Stats().Calls
	}
	require.Equal(t, b.f.calls.Load(), calls)
	require.LessOrEqual(t, calls, int64(burstInstances*burstBudget), "within the fleet's budget")
	return calls
}

// 2,000 requests from one client across three instances in 4 seconds: far faster than the sync
// interval, so each instance admits its M before it hears of the others (the bound's worst
// case, N×M), then all of them deny for the rest of the window, with a handful of API calls.
func TestBurstAcrossThreeInstances(t *testing.T) {
	b := newBurst(t)
	const requests = 2000
	for k := range requests {
		b.advance(t, t0.Add(time.Duration(k)*2*time.Millisecond))
		b.request(t, k%burstInstances)
	}
	b.advance(t, t0.Add(10*time.Second))
	calls := b.check(t)
	require.LessOrEqual(t, b.admitted, burstInstances*burstMax, "the documented bound N×M")
	require.GreaterOrEqual(t, b.admitted, burstMax)
	for i := range burstInstances {
		n, _ := b.stores[i].Increment(context.Background(), burstKey, t0, 2*time.Minute)
		require.Greater(t, n, int64(burstInstances*burstMax), "instance %d knows the fleet's count", i)
	}
	t.Logf("burst: %d requests, %d admitted (max %d, bound N×M = %d), %d API calls (budget %d)",
		requests, b.admitted, burstMax, burstInstances*burstMax, calls, burstInstances*burstBudget)
}

// One request per second per instance for a whole window: slower than the sync, so the
// overshoot is bounded by what the others admit within the lag L = 2 × SyncInterval (the fake
// API's reads see writes at once, so D = 0): M + (N−1)·r·L.
func TestPacedTrafficStaysWithinSyncBound(t *testing.T) {
	b := newBurst(t)
	const r = 1 // requests per second per instance
	lag := 2 * burstInterval
	for sec := range 60 {
		for i := range burstInstances {
			b.advance(t, t0.Add(time.Duration(sec)*time.Second+time.Duration(i+1)*100*time.Millisecond))
			b.request(t, i)
		}
	}
	calls := b.check(t)
	bound := burstMax + (burstInstances-1)*r*int(lag/time.Second)
	require.LessOrEqual(t, b.admitted, bound)
	require.Less(t, b.admitted, burstInstances*burstMax, "syncing beats counting alone")
	t.Logf("paced: %d requests, %d admitted (max %d, bound M+(N-1)·r·L = %d), %d API calls",
		60*burstInstances, b.admitted, burstMax, bound, calls)
}

func TestSyncedConcurrentUse(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a := newTestSynced(t, f, "a")
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				a.Increment(ctx, fmt.Sprint("k", (g*500+i)%50), t0, 2*time.Minute)
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			clock.Advance(time.Second)
			_ = a.Sync(ctx)
		}
	})
	wg.Wait()
	var total int64
	for i := range 50 {
		n, _ := a.Increment(ctx, fmt.Sprint("k", i), t0, 2*time.Minute)
		total += n - 1
	}
	require.EqualValues(t, 8*500, total, "exact under concurrency")
}

// With calls for one read, the key with the most new requests is the one read.
func TestSyncedReadsTheBusiestKeysFirst(t *testing.T) {
	clock := newFakeClock(t0)
	f := newFakeAPI(clock)
	defer f.Close()
	a := newTestSynced(t, f, "a", func(c *Config) { c.Budget, c.SyncInterval = 60, 10*time.Second }) // 2 calls per sync
	ctx := context.Background()
	for _, key := range []string{"cold-1", "hot", "cold-2"} {
		f.store(key, fmt.Sprintf(`{"window":%d,"count":7,"instances":{"b":7}}`, t0.Unix()), time.Hour)
	}
	a.Increment(ctx, "cold-1", t0, 2*time.Minute)
	for range 20 {
		a.Increment(ctx, "hot", t0, 2*time.Minute)
	}
	a.Increment(ctx, "cold-2", t0, 2*time.Minute)
	require.NoError(t, a.Sync(ctx)) // 1 read (1 call kept for the bulk write)
	require.EqualValues(t, 1, a.Stats().Reads)
	n, _ := a.Increment(ctx, "hot", t0, 2*time.Minute)
	require.EqualValues(t, 21+7, n, "the hot key was read")
	n, _ = a.Increment(ctx, "cold-1", t0, 2*time.Minute)
	require.EqualValues(t, 2, n, "the cold keys wait for spare calls")
}

// The KV key of a client is the same in every window, and Workers KV takes one write per second
// per key: the first write of a new window waits for the old window's last, whether the old
// entry was still in memory or already swept when the new window began.
func TestSyncedKeepsTheLastWriteTimeAcrossWindows(t *testing.T) {
	for _, swept := range []bool{false, true} {
		t.Run(fmt.Sprint("swept=", swept), func(t *testing.T) {
			clock := newFakeClock(t0.Add(time.Minute - 500*time.Millisecond))
			f := newFakeAPI(clock)
			defer f.Close()
			a := newTestSynced(t, f, "a")
			ctx := context.Background()
			a.Increment(ctx, burstKey, t0, 2*time.Minute)
			require.NoError(t, a.Sync(ctx)) // written half a second before the window ends
			require.EqualValues(t, 1, a.Stats().BulkWrites)

			t1 := t0.Add(time.Minute)
			clock.Set(t1)
			if swept {
				require.NoError(t, a.Sync(ctx)) // sweeps every ended entry
			}
			n, _ := a.Increment(ctx, burstKey, t1, 2*time.Minute)
			require.EqualValues(t, 1, n, "a new window")
			clock.Set(t1.Add(200 * time.Millisecond))
			require.NoError(t, a.Sync(ctx), "0.7 s after the last write: not written again")
			require.EqualValues(t, 1, a.Stats().BulkWrites)
			require.Zero(t, f.rejected.Load()+f.unsuccessful.Load(), "no write refused by the API")

			clock.Set(t1.Add(500 * time.Millisecond))
			require.NoError(t, a.Sync(ctx))
			require.EqualValues(t, 2, a.Stats().BulkWrites)
			v := decodeValue(t, f, burstKey)
			require.Equal(t, t1.Unix(), *v.Window)
			require.EqualValues(t, 1, *v.Count)
			require.Zero(t, f.rejected.Load()+f.unsuccessful.Load())

			clock.Set(t1.Add(2 * time.Minute))
			require.NoError(t, a.Sync(ctx))
			require.Zero(t, a.Stats().Keys, "ended entries are still dropped")
		})
	}
}
