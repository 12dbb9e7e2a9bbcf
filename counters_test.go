package ratelimit

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slotsOf returns t's slots, nil when it has none.
func slotsOf(t *counterTable) []counterSlot {
	if p := t.slots.Load(); p != nil {
		return *p
	}
	return nil
}

// checkTable requires t to hold exactly the counters of model, each found with and without the
// lock, and every slot's entry reachable from its home slot without crossing an empty slot.
func checkTable(tb testing.TB, t *counterTable, model map[counterKey]*counterEntry) {
	tb.Helper()
	require.Equal(tb, len(model), t.used, "used")
	for k, e := range model {
		require.Same(tb, e, t.lookup(k), "lookup of %v", k)
		require.Same(tb, e, t.load(k), "load of %v", k)
	}
	slots := slotsOf(t)
	if slots == nil {
		require.Zero(tb, t.used)
		return
	}
	n := 0
	mask := len(slots) - 1
	for i := range slots {
		e := slots[i].e.Load()
		if e == nil {
			require.Zero(tb, slots[i].hi.Load(), "slot %d: empty slots hold no hash", i)
			continue
		}
		n++
		require.Equal(tb, e.key.hi, slots[i].hi.Load(), "slot %d", i)
		home := int(e.key.hi) & mask
		for j := home; j != i; j = (j + 1) & mask {
			require.NotNil(tb, slots[j].e.Load(), "slot %d (home %d) is cut off by the empty slot %d", i, home, j)
		}
	}
	require.Equal(tb, t.used, n, "occupied slots")
	require.Less(tb, t.used*maxLoadDen, len(slots)*maxLoadNum+1, "load")
}

// TestCounterTableMatchesMap runs random inserts, lookups and sweeps against a Go map. Keys share
// a few home slots on purpose, so that probe sequences are long, wrap around the end of the
// table, and deletion must shift entries back across the wrap.
func TestCounterTableMatchesMap(t *testing.T) {
	for _, homes := range []uint64{1, 3, 16, 1 << 20} {
		rng := rand.New(rand.NewPCG(homes, 7))
		var table counterTable
		model := map[counterKey]*counterEntry{}
		key := func() counterKey {
			// hi picks the home slot: few distinct values, some near the table's end.
			return counterKey{hi: rng.Uint64N(homes) - homes/2, lo: rng.Uint64N(200)}
		}
		now := int64(0)
		for step := range 5000 {
			switch op := rng.IntN(10); {
			case op < 6:
				k := key()
				e := table.insert(k)
				if old, ok := model[k]; ok {
					require.Same(t, old, e, "step %d: insert of a present key returns its counter", step)
				} else {
					require.Equal(t, k, e.key, "step %d", step)
					require.Zero(t, e.count, "step %d: a new counter starts at zero", step)
					model[k] = e
				}
				e.expires = now + rng.Int64N(50)
			case op < 9:
				k := key()
				require.Same(t, model[k], table.lookup(k), "step %d", step)
			default:
				now += rng.Int64N(30)
				table.sweep(now)
				for k, e := range model {
					if e.expires <= now {
						require.EqualValues(t, removedEntry, e.expires, "step %d: a swept entry is marked removed", step)
						delete(model, k)
					}
				}
			}
			checkTable(t, &table, model)
		}
	}
}

// TestCounterTableGivesMemoryBack: a table swept nearly empty is rebuilt small, and an empty one
// holds no slots at all.
func TestCounterTableGivesMemoryBack(t *testing.T) {
	var table counterTable
	model := map[counterKey]*counterEntry{}
	for i := range 10_000 {
		k := counterKey{hi: uint64(i) * 0x9e3779b97f4a7c15, lo: uint64(i)}
		e := table.insert(k)
		e.expires = 100
		if i%100 == 0 {
			e.expires = 200 // survives the first sweep
		}
		model[k] = e
	}
	require.Len(t, slotsOf(&table), 16384, "10,000 counters at most 3/4 full")

	table.sweep(100)
	for k, e := range model {
		if e.expires <= 100 {
			delete(model, k)
		}
	}
	checkTable(t, &table, model)
	require.Len(t, slotsOf(&table), 256, "100 counters left: rebuilt half full")

	table.sweep(200)
	require.Nil(t, slotsOf(&table))
	require.Zero(t, table.used)
	require.Nil(t, table.lookup(counterKey{hi: 1, lo: 1}))
}

// TestCounterKeysDiffer: the two hashes use different seeds, and different stores different
// seeds, so a collision in one hash is not one in the other.
func TestCounterKeysDiffer(t *testing.T) {
	a, b := NewMemoryKV(), NewMemoryKV()
	ka := counterKeyOfString(a.seedsOf(), "ratelimit:x:192.0.2.1")
	require.NotEqual(t, ka.hi, ka.lo)
	require.Equal(t, ka, counterKeyOfBytes(a.seedsOf(), []byte("ratelimit:x:192.0.2.1")), "string and bytes agree")
	require.NotEqual(t, ka, counterKeyOfString(b.seedsOf(), "ratelimit:x:192.0.2.1"), "stores have seeds of their own")
	var zero MemoryKV
	first := counterKeyOfString(zero.seedsOf(), "k")
	require.Equal(t, first, counterKeyOfString(zero.seedsOf(), "k"), "the zero value chooses its seeds once")
}

// TestMemoryKVCountsExactlyWhileTablesChange: known keys are counted without the shard's lock
// while other goroutines add keys (so tables grow) and let them expire (so sweeps delete entries
// and shrink tables). Every increment of a long-lived key must get its own count, 1 to n.
func TestMemoryKVCountsExactlyWhileTablesChange(t *testing.T) {
	clock := newFakeClock(windowStart)
	m := NewMemoryKV(WithClock(clock.Now))
	ctx := t.Context()
	const (
		workers  = 8
		perWork  = 3000
		hotKeys  = 16
		longTTL  = 1000 * time.Hour
		shortTTL = time.Second
	)
	seen := make([][hotKeys][]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range perWork {
				k := rng.IntN(hotKeys)
				n, err := m.Increment(ctx, fmt.Sprint("hot-", k), windowStart, longTTL)
				if err != nil {
					t.Error(err)
					return
				}
				seen[w][k] = append(seen[w][k], n)
				// Churn: a new short-lived key, and now and then time passes, so that the
				// next new key sweeps its shard.
				_, _ = m.Increment(ctx, fmt.Sprint("churn-", w, "-", i), windowStart, shortTTL)
				if i%100 == 99 {
					clock.Advance(time.Second)
				}
			}
		}()
	}
	wg.Wait()
	for k := range hotKeys {
		var counts []int64
		for w := range workers {
			counts = append(counts, seen[w][k]...)
		}
		slices.Sort(counts)
		for i, n := range counts {
			require.EqualValues(t, i+1, n, "key %d: the counts handed out must be 1 to %d, each once", k, len(counts))
		}
	}
	require.Less(t, m.Len(), workers*perWork/2, "expired churn keys were swept")
}

// TestRemovedEntryIsNotCounted: an entry a sweep has taken out of its table refuses counts, so a
// request that found it just before is counted again through the table, in a live entry.
func TestRemovedEntryIsNotCounted(t *testing.T) {
	m := NewMemoryKV()
	k := counterKeyOfString(m.seedsOf(), "k")
	const ttl = int64(time.Minute)
	require.EqualValues(t, 1, m.incrementAt(k, 0, time.Minute, 0, 0))
	s := &m.shards[shardOf(k)]
	stale := s.counters.load(k)
	require.NotNil(t, stale)

	s.mu.Lock()
	s.sweep(ttl) // expired at ttl: removed
	s.mu.Unlock()
	require.Nil(t, s.counters.load(k))
	_, ok := stale.add(0, ttl, ttl, 0)
	require.False(t, ok, "a removed entry refuses counts")
	_, ok = stale.countIn(0, ttl)
	require.False(t, ok)

	require.EqualValues(t, 1, m.incrementAt(k, 0, time.Minute, ttl, 0), "counted afresh in a new entry")
	require.EqualValues(t, 2, m.incrementAt(k, 0, time.Minute, ttl, 0))
	require.NotSame(t, stale, s.counters.load(k))
}

// TestFoundCounterSweptBeforeTheCount: the limiter looks a counter up, then sets headers, then
// counts; a sweep in between leaves it a removed entry, and the request is counted exactly once,
// in a live entry.
func TestFoundCounterSweptBeforeTheCount(t *testing.T) {
	m := NewMemoryKV()
	k := counterKeyOfString(m.seedsOf(), "k")
	const ttl = int64(time.Minute)
	require.EqualValues(t, 1, m.incrementAt(k, 0, time.Minute, 0, 0))
	found := m.findCounter(k)
	require.NotNil(t, found.e)

	s := &m.shards[shardOf(k)]
	s.mu.Lock()
	s.sweep(ttl)
	s.mu.Unlock()
	require.EqualValues(t, 1, m.incrementFound(found, ttl, time.Minute, ttl, 0))
	live := s.counters.load(k)
	require.NotNil(t, live)
	require.NotSame(t, found.e, live)
	require.EqualValues(t, 2, m.incrementAt(k, ttl, time.Minute, ttl, 0), "the request counted once")
}

func TestExpirySaturates(t *testing.T) {
	for _, tc := range []struct{ now, ttl, want int64 }{
		{100, 50, 150},
		{100, 0, 100},
		{100, -50, 50},
		{math.MaxInt64 - 10, 10, math.MaxInt64},
		{math.MaxInt64 - 10, 11, math.MaxInt64},
		{1, math.MaxInt64, math.MaxInt64},
		{math.MinInt64 + 10, -11, math.MinInt64 + 1},
	} {
		got := expiry(tc.now, tc.ttl)
		require.Equal(t, tc.want, got, "expiry(%d, %d)", tc.now, tc.ttl)
		require.NotEqual(t, int64(removedEntry), got)
	}
}

// TestMemoryKVTTLForever: a TTL too long to add to the time ("forever") keeps the entry, and
// never makes a live counter look removed.
func TestMemoryKVTTLForever(t *testing.T) {
	ctx := t.Context()
	now := time.Unix(1_700_000_000, 0)
	m := NewMemoryKV(WithClock(func() time.Time { return now }))
	for _, ttl := range []time.Duration{
		math.MaxInt64,
		time.Duration(math.MaxInt64 - now.UnixNano() + 1), // now + ttl wraps to exactly math.MinInt64
	} {
		key := fmt.Sprint("k", ttl)
		for want := int64(1); want <= 3; want++ {
			n, err := m.Increment(ctx, key, now, ttl)
			require.NoError(t, err)
			require.Equal(t, want, n, "ttl %d", ttl)
		}
		require.NoError(t, m.Put(ctx, key, []byte("v"), ttl))
		_, ok, err := m.Get(ctx, key)
		require.NoError(t, err)
		require.True(t, ok, "ttl %d", ttl)
	}
}

// TestFullMark: a window and a limit that fit are marked and read back; others are not marked.
func TestFullMark(t *testing.T) {
	for _, tc := range []struct {
		windowSec, limit int64
		ok               bool
	}{
		{windowSec: 0, limit: 1, ok: true},
		{windowSec: 1_700_000_040, limit: 30, ok: true},
		{windowSec: 1<<40 - 1, limit: 1<<24 - 1, ok: true},
		{windowSec: 1 << 40, limit: 30},
		{windowSec: -60, limit: 30},
		{windowSec: 60, limit: 0},
		{windowSec: 60, limit: -1},
		{windowSec: 60, limit: 1 << 24},
	} {
		m := makeFullMark(tc.windowSec, tc.limit)
		if !tc.ok {
			require.Zero(t, m, "%+v", tc)
			continue
		}
		require.NotZero(t, m)
		require.EqualValues(t, tc.windowSec, m.windowSec(), "%+v", tc)
		require.Equal(t, tc.limit, m.limit(), "%+v", tc)
	}
}

// TestCounterEntryExhausted: the lock-free check of a request says exhausted only once the
// counter has reached the limit in the same window, and forgets it when the counter starts again.
func TestCounterEntryExhausted(t *testing.T) {
	const limit, ttl = 3, int64(500)
	const window = int64(7 * time.Second)
	full := makeFullMark(7, limit)
	for _, tc := range []struct {
		name  string
		count func(e *counterEntry) // counts in window 7 at time 0 unless it says otherwise
		ask   fullMark
		at    int64 // the time of the check
		want  bool
	}{
		{name: "fresh", ask: full},
		{name: "below the limit", count: counts(limit-1, window, 0, full), ask: full},
		{name: "at the limit", count: counts(limit, window, 0, full), ask: full, want: true},
		{name: "over the limit", count: counts(limit+2, window, 0, full), ask: full, want: true},
		{name: "another window", count: counts(limit, window, 0, full), ask: makeFullMark(8, limit)},
		{name: "a lower limit", count: counts(limit, window, 0, full), ask: makeFullMark(7, limit-1), want: true},
		{name: "a higher limit", count: counts(limit, window, 0, full), ask: makeFullMark(7, limit+1)},
		{name: "no mark asked", count: counts(limit, window, 0, full), ask: 0},
		{name: "no mark asked, in the window of 1970", count: counts(limit, 0, 0, makeFullMark(0, limit)), ask: 0},
		{name: "counted without a mark", count: counts(limit, window, 0, 0), ask: full},
		{name: "next window counted", count: func(e *counterEntry) {
			counts(limit, window, 0, full)(e)
			counts(1, window+int64(time.Second), 1, makeFullMark(8, limit))(e)
		}, ask: full},
		{name: "back to the window", count: func(e *counterEntry) {
			counts(limit, window, 0, full)(e)
			counts(1, window+int64(time.Second), 1, makeFullMark(8, limit))(e)
			counts(1, window, 2, full)(e)
		}, ask: full},
		{name: "expired and counted again", count: func(e *counterEntry) {
			counts(limit, window, 0, full)(e)
			counts(1, window, ttl, full)(e)
		}, ask: full, at: ttl},
		{name: "just before the count expires", count: counts(limit, window, 0, full), ask: full, at: ttl - 1, want: true},
		{name: "the count expired, not counted since", count: counts(limit, window, 0, full), ask: full, at: ttl},
		{name: "counted over the limit later: the mark lasts longer", count: func(e *counterEntry) {
			counts(limit, window, 0, full)(e)
			counts(1, window, 300, full)(e)
		}, ask: full, at: ttl + 299, want: true},
		{name: "a lower limit keeps a higher mark", count: func(e *counterEntry) {
			counts(limit+1, window, 0, makeFullMark(7, limit+1))(e)
			counts(1, window, 0, full)(e)
		}, ask: makeFullMark(7, limit+1), want: true},
		{name: "counted without a mark, the mark stays", count: func(e *counterEntry) {
			counts(limit, window, 0, full)(e)
			counts(1, window, 0, 0)(e)
		}, ask: full, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e counterEntry
			if tc.count != nil {
				tc.count(&e)
			}
			require.Equal(t, tc.want, e.exhausted(tc.ask, tc.at))
		})
	}
}

// counts returns a function that counts n requests in window at now with the mark full.
func counts(n int, window, now int64, full fullMark) func(*counterEntry) {
	return func(e *counterEntry) {
		for range n {
			_, ok := e.add(window, 500, now, full)
			if !ok {
				panic("counted in a removed entry")
			}
		}
	}
}

// TestCounterEntryLateRequest: a request of the window just before the live count's counts in
// the newer window instead of restarting it; one of any other window replaces the count.
func TestCounterEntryLateRequest(t *testing.T) {
	const w = int64(time.Minute) // a window; the TTL is two
	const w1, w2 = 100 * w, 101 * w
	type step struct {
		window, now int64
		want        int64
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"late requests count in the newer window", []step{
			{w1, 0, 1}, {w1, 0, 2}, {w2, 1, 1}, {w2, 1, 2}, {w1, 2, 3}, {w2, 3, 4}, {w1, 4, 5},
		}},
		{"a window further back replaces the count", []step{
			{w2, 0, 1}, {w2, 0, 2}, {w1 - w, 1, 1}, {w2, 2, 1},
		}},
		{"a later window replaces the count", []step{
			{w1, 0, 1}, {w1, 0, 2}, {w2 + w, 1, 1},
		}},
		{"a late request after the newer count expired starts its own", []step{
			{w2, 0, 1}, {w1, 2 * w, 1}, {w1, 2 * w, 2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e counterEntry
			for i, st := range tc.steps {
				n, ok := e.add(st.window, 2*w, st.now, 0)
				require.True(t, ok)
				require.Equal(t, st.want, n, "step %d", i+1)
			}
		})
	}
	t.Run("a late request marks nothing", func(t *testing.T) {
		var e counterEntry
		counts(1, w2, 0, 0)(&e)
		n, _ := e.add(w1, 2*w, 1, makeFullMark(w1/int64(time.Second), 1))
		require.EqualValues(t, 2, n)
		require.Zero(t, e.full.Load(), "the older window's limit is no mark of the newer window")
	})
}

// TestMemoryKVDeniesWithoutCounting: once a client holds the limit, its denied requests leave the
// count alone, as the seed's do, and the next window counts from zero.
func TestMemoryKVDeniesWithoutCounting(t *testing.T) {
	const limit = 3
	clock := newFakeClock(windowStart)
	m := NewMemoryKV(WithClock(clock.Now))
	l := newLimiter(t, Options{Scope: "auth", Max: limit, Window: time.Minute, Store: m, Now: clock.Now})
	h := l.Handler(okHandler)
	k := counterKeyOfString(m.seedsOf(), "ratelimit:auth:192.0.2.7")
	count := func() int64 {
		start := clock.Now().Truncate(time.Minute) // windowStart is a whole minute
		n, ok := m.peek(k, start.UnixNano())
		require.True(t, ok)
		return n
	}
	for i := range limit {
		require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.7:1")).Code, "request %d", i+1)
	}
	for range 5 {
		rec := serve(h, newRequest("/", "192.0.2.7:1"))
		require.Equal(t, http.StatusTooManyRequests, rec.Code)
		require.Equal(t, `"auth";r=0;t=60`, rec.Header().Get("RateLimit"))
		require.Equal(t, "60", rec.Header().Get("Retry-After"))
	}
	require.EqualValues(t, limit, count(), "denied requests are not counted")

	res, err := l.AllowAt(newRequest("/", "192.0.2.7:1"), clock.Now())
	require.NoError(t, err)
	require.Equal(t, Result{Limit: limit, Reset: time.Minute, RetryAfter: time.Minute}, res)
	require.EqualValues(t, limit, count())

	clock.Advance(time.Minute)
	require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.7:1")).Code, "a new window")
	require.EqualValues(t, 1, count())
}

// TestLayersWithDifferentLimitsShareACounter: two layers of one scope and store, with different
// limits, count in one counter; each still lets through exactly what its own limit allows.
func TestLayersWithDifferentLimitsShareACounter(t *testing.T) {
	clock := newFakeClock(windowStart)
	m := NewMemoryKV(WithClock(clock.Now))
	low := newLimiter(t, Options{Scope: "api", Max: 2, Window: time.Minute, Store: m, Now: clock.Now})
	high := newLimiter(t, Options{Scope: "api", Max: 4, Window: time.Minute, Store: m, Now: clock.Now})
	allow := func(l *Limiter) bool { return allowed(t, l, "192.0.2.8:1") }
	require.True(t, allow(low))   // 1
	require.True(t, allow(low))   // 2: low is full
	require.False(t, allow(low))  // not counted
	require.True(t, allow(high))  // 3
	require.True(t, allow(high))  // 4: high is full
	require.False(t, allow(high)) // not counted
	require.False(t, allow(low))
	require.False(t, allow(high))
}

// TestDenialEndsWithTheCount: when the store's clock runs ahead of the layer's, a client's count
// can expire inside the layer's window; the client is then counted afresh, not denied for the
// rest of the window on an old mark.
func TestDenialEndsWithTheCount(t *testing.T) {
	layerClock, storeClock := newFakeClock(windowStart), newFakeClock(windowStart)
	m := NewMemoryKV(WithClock(storeClock.Now))
	l := newLimiter(t, Options{Scope: "auth", Max: 2, Window: time.Minute, Store: m, Now: layerClock.Now})
	h := l.Handler(okHandler)
	codes := func(n int) []int {
		var got []int
		for range n {
			got = append(got, serve(h, newRequest("/", "192.0.2.9:1")).Code)
		}
		return got
	}
	require.Equal(t, []int{200, 200, 429, 429}, codes(4))
	storeClock.Advance(2*time.Minute - time.Nanosecond)
	require.Equal(t, []int{429}, codes(1), "the count has not expired yet")
	storeClock.Advance(time.Nanosecond)
	require.Equal(t, []int{200, 200, 429}, codes(3), "the count expired: a fresh one")
}

// TestMarkFollowsTheCountsExpiry: a count that moves a marked counter's expiry (a count without a
// mark, a shorter TTL) moves the end of its mark too, so no denial outlives the count.
func TestMarkFollowsTheCountsExpiry(t *testing.T) {
	t.Run("Increment with a shorter TTL", func(t *testing.T) {
		clock := newFakeClock(windowStart)
		m := NewMemoryKV(WithClock(clock.Now))
		l := newLimiter(t, Options{Scope: "auth", Max: 1, Window: time.Minute, Store: m, Now: clock.Now})
		h := l.Handler(okHandler)
		require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.10:1")).Code)
		require.Equal(t, http.StatusTooManyRequests, serve(h, newRequest("/", "192.0.2.10:1")).Code)
		_, err := m.Increment(t.Context(), "ratelimit:auth:192.0.2.10", windowStart, time.Second)
		require.NoError(t, err)
		clock.Advance(2 * time.Second)
		require.Equal(t, http.StatusOK, serve(h, newRequest("/", "192.0.2.10:1")).Code, "the count expired: a fresh one")
	})
	t.Run("a layer of the same scope with a shorter window", func(t *testing.T) {
		// New warns of this set-up, but allows it (a reload builds the new layer while the
		// old one still exists): the counts must stay consistent meanwhile.
		clock := newFakeClock(time.Unix(1_699_999_200, 0)) // on an hour: both layers' windows start here
		m := NewMemoryKV(WithClock(clock.Now))
		hour := newLimiter(t, Options{Scope: "api", Max: 2, Window: time.Hour, Store: m, Now: clock.Now})
		minute := newLimiter(t, Options{Scope: "api", Max: 10, Window: time.Minute, Store: m, Now: clock.Now, Logger: quietLogger})
		allow := func(l *Limiter) bool { return allowed(t, l, "192.0.2.11:1") }
		require.True(t, allow(hour))
		require.True(t, allow(hour))
		require.False(t, allow(hour))
		clock.Advance(10 * time.Second)
		require.True(t, allow(minute)) // the count now expires two minutes from here
		clock.Advance(5 * time.Minute)
		require.True(t, allow(hour), "the count expired: a fresh one")
	})
}

// TestLayersWithoutAMarkStillDenyExactly: a layer whose windows cannot be marked (before 1970)
// counts every request under the counter's lock, and denies exactly as the others do.
func TestLayersWithoutAMarkStillDenyExactly(t *testing.T) {
	clock := newFakeClock(time.Unix(-3600, 0))
	m := NewMemoryKV(WithClock(clock.Now))
	l := newLimiter(t, Options{Scope: "old", Max: 2, Window: time.Minute, Store: m, Now: clock.Now})
	h := l.Handler(okHandler)
	var codes []int
	for range 4 {
		codes = append(codes, serve(h, newRequest("/", "192.0.2.12:1")).Code)
	}
	require.Equal(t, []int{200, 200, 429, 429}, codes)
	n, ok := m.peek(counterKeyOfString(m.seedsOf(), "ratelimit:old:192.0.2.12"), int64(-3600*time.Second))
	require.True(t, ok)
	require.EqualValues(t, 4, n, "no mark: every request counted")
}

// allowed reports whether l allows a request from remoteAddr now.
func allowed(t *testing.T, l *Limiter, remoteAddr string) bool {
	t.Helper()
	res, err := l.Allow(newRequest("/", remoteAddr))
	require.NoError(t, err)
	return res.Allowed
}

// TestMemoryKVWarnsOfASecondWindowForAScope: layers of one scope in one MemoryKV share counters,
// which keep one window at a time, so New warns when a scope gets another window length there;
// the same window (shared counters, as documented), another scope, another store or a disabled
// layer is quiet. It does not refuse: a reload builds the new layers while the old ones exist.
func TestMemoryKVWarnsOfASecondWindowForAScope(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	m := NewMemoryKV()
	build := func(scope string, max int, window time.Duration, store KV) {
		newLimiter(t, Options{Scope: scope, Max: max, Window: window, Store: store, Logger: logger})
	}
	build("api", 100, 10*time.Second, m)
	build("api", 20, 10*time.Second, m)
	build("api-minute", 20, time.Minute, m)
	build("api", 20, time.Minute, NewMemoryKV())
	build("api", 0, time.Minute, m) // disabled: counts nothing
	require.NotContains(t, logs.String(), "level=WARN")

	build("api", 20, time.Minute, m)
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
	require.Contains(t, logs.String(), "another window")
	require.Contains(t, logs.String(), "scope=api window=1m0s earlier_window=10s")

	// A reload that changes a window on a long-lived store succeeds.
	cfg := DefaultConfig()
	cfg.Auth.Store, cfg.Global.Store = m, m
	cfg.Auth.Logger, cfg.Global.Logger = logger, logger
	_, err := NewLayers(cfg)
	require.NoError(t, err)
	cfg.Global.Window = 2 * time.Minute
	_, err = NewLayers(cfg)
	require.NoError(t, err)
	require.Contains(t, logs.String(), "scope=global window=2m0s earlier_window=1m0s")
}
