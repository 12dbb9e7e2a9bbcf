package redisstore_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/kilat-dev/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Three instances of one layer, each with its own go-redis client, share one exact limit: of
// 3,000 concurrent requests from one client, exactly Max pass.
func TestLayersShareOneExactLimit(t *testing.T) {
	addr := sharedAddr(t)
	prefix := testPrefix(t, addr)
	const limit, total = 100, 3000
	var log errorLog
	var handlers []http.Handler
	for range 3 {
		// A generous StoreTimeout: 3,000 requests at once queue for the clients' connection pools,
		// and a store timeout would fail open and spoil the count.
		l := newLayer(t, newStore(t, addr, redisstore.WithPrefix(prefix)), limit, &log,
			func(o *ratelimit.Options) { o.StoreTimeout = 30 * time.Second })
		handlers = append(handlers, l.Handler(okHandler))
	}

	codes := make([]int, total)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range total {
		wg.Go(func() {
			<-start
			codes[i] = serve(handlers[i%len(handlers)]).Code
		})
	}
	close(start)
	wg.Wait()

	require.Empty(t, log.take(), "no store errors expected")
	byCode := map[int]int{}
	for _, c := range codes {
		byCode[c]++
	}
	require.Equal(t, map[int]int{http.StatusOK: limit, http.StatusTooManyRequests: total - limit}, byCode)

	// The layer's counter carries an expiry (twice the window).
	raw := newClient(t, addr)
	keys := scanKeys(t, context.Background(), raw, prefix)
	require.Equal(t, []string{prefix + "ratelimit:api:203.0.113.7:1800000000"}, keys)
	pttl, err := raw.PTTL(context.Background(), keys[0]).Result()
	require.NoError(t, err)
	require.Greater(t, pttl, time.Duration(0))
	require.LessOrEqual(t, pttl, 2*time.Minute)
}

// Redis crashes, the layers follow their failure policy, each request bounded by StoreTimeout;
// Redis comes back (empty, without the script) and counting resumes with no one's help.
func TestRedisStoppedAndRestarted(t *testing.T) {
	srv := startRedisServer(t)
	const storeTimeout = 300 * time.Millisecond
	// A small pool, so that the outage soon reaches go-redis's fast-failing state (after
	// PoolSize failed dials it fails at once and probes once a second): recovery from that
	// state is what a long outage looks like.
	store := func() *redisstore.Store {
		c := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true, PoolSize: 2})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(c)
		require.NoError(t, err)
		return s
	}
	var openLog, closedLog errorLog
	short := func(o *ratelimit.Options) { o.StoreTimeout = storeTimeout }
	open := newLayer(t, store(), 1000, &openLog, short).Handler(okHandler)
	closed := newLayer(t, store(), 1000, &closedLog, func(o *ratelimit.Options) {
		short(o)
		o.FailClosed = true
	}).Handler(okHandler)

	// Both layers count in the same key (same scope, same client).
	for i, h := range []http.Handler{open, closed, open} {
		rec := serve(h)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, `"api";r=`+strconv.Itoa(1000-i-1)+`;t=60`, rec.Header().Get("RateLimit"))
	}
	require.Empty(t, openLog.take())
	require.Empty(t, closedLog.take())

	srv.stop()
	const down = 10
	var openTook, closedTook []time.Duration
	for range down {
		rec, took := timedServe(open)
		openTook = append(openTook, took)
		require.Equal(t, http.StatusOK, rec.Code, "fail open: the request passes")
		require.Empty(t, rec.Header().Get("RateLimit"), "an uncounted request carries no RateLimit header")
		rec, took = timedServe(closed)
		closedTook = append(closedTook, took)
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, "fail closed: 503")
	}
	t.Logf("Redis stopped: request times, fail open %v; fail closed %v (StoreTimeout %v)", openTook, closedTook, storeTimeout)
	require.Less(t, slices.Max(append(openTook, closedTook...)), storeTimeout+1500*time.Millisecond)
	for _, log := range []*errorLog{&openLog, &closedLog} {
		errs := log.take()
		require.Len(t, errs, down)
		for _, err := range errs {
			require.ErrorIs(t, err, ratelimit.ErrStoreFailed)
			require.ErrorContains(t, err, "redisstore: increment")
		}
	}

	srv.start()
	// The restarted server is empty and has no script cached.
	recoveredAfter := waitCounted(t, open, &openLog, 15*time.Second)
	t.Logf("Redis restarted: counting resumed after %v", recoveredAfter)
	waitCounted(t, closed, &closedLog, 15*time.Second)
	rec := serve(open)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, `"api";r=997;t=60`, rec.Header().Get("RateLimit"), "the count starts again from the restarted, empty Redis")
	require.Empty(t, openLog.take())
}

// waitCounted sends requests through h until one is counted without a store error, and returns
// how long that took. It fails the test after limit.
func waitCounted(t *testing.T, h http.Handler, log *errorLog, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		rec := serve(h)
		errs := log.take()
		if rec.Code == http.StatusOK && rec.Header().Get("RateLimit") != "" && len(errs) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("counting did not resume within %v: last status %d, errors %v", limit, rec.Code, errors.Join(errs...))
		}
		time.Sleep(50 * time.Millisecond) // waiting for a reconnect, not for time logic
	}
}

// A Redis that accepts connections and never answers costs each request at most the layer's
// StoreTimeout, with the client settings the package documents.
func TestHungRedisBoundedByStoreTimeout(t *testing.T) {
	addr := hungServer(t)
	const storeTimeout = 200 * time.Millisecond
	tests := []struct {
		name       string
		failClosed bool
		want       int
	}{
		{"fail open", false, http.StatusOK},
		{"fail closed", true, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log errorLog
			h := newLayer(t, newStore(t, addr), 10, &log, func(o *ratelimit.Options) {
				o.StoreTimeout = storeTimeout
				o.FailClosed = tt.failClosed
			}).Handler(okHandler)

			// Twenty requests at once: each waits for the hung server (or for a pool connection
			// that one holds) and none may wait longer than StoreTimeout.
			const n = 20
			took := make([]time.Duration, n)
			codes := make([]int, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					var rec *httptest.ResponseRecorder
					rec, took[i] = timedServe(h)
					codes[i] = rec.Code
				})
			}
			wg.Wait()
			slowest := time.Duration(0)
			for i := range n {
				require.Equal(t, tt.want, codes[i])
				slowest = max(slowest, took[i])
			}
			t.Logf("hung Redis: slowest of %d concurrent requests took %v (StoreTimeout %v)", n, slowest, storeTimeout)
			require.GreaterOrEqual(t, slowest, storeTimeout, "the requests should have waited for the hung server")
			require.Less(t, slowest, storeTimeout+1500*time.Millisecond)
			errs := log.take()
			require.Len(t, errs, n)
			for _, err := range errs {
				require.ErrorIs(t, err, ratelimit.ErrStoreFailed)
			}
		})
	}
}

// A Redis that stalls (CLIENT PAUSE) is a slow store: requests end at StoreTimeout, follow the
// failure policy, and counting resumes when Redis does.
func TestPausedRedis(t *testing.T) {
	srv := startRedisServer(t)
	const storeTimeout = 200 * time.Millisecond
	var log errorLog
	h := newLayer(t, newStore(t, srv.addr()), 10, &log, func(o *ratelimit.Options) { o.StoreTimeout = storeTimeout }).Handler(okHandler)
	rec := serve(h)
	require.Equal(t, `"api";r=9;t=60`, rec.Header().Get("RateLimit"))

	admin := newClient(t, srv.addr())
	ctx := context.Background()
	// WRITE mode stalls scripts and writes but lets the admin's UNPAUSE through.
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", "10000", "WRITE").Err())
	rec, took := timedServe(h)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Empty(t, rec.Header().Get("RateLimit"))
	t.Logf("paused Redis: request took %v (StoreTimeout %v)", took, storeTimeout)
	require.GreaterOrEqual(t, took, storeTimeout)
	require.Less(t, took, storeTimeout+1500*time.Millisecond)
	errs := log.take()
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], ratelimit.ErrStoreFailed)

	require.NoError(t, admin.Do(ctx, "CLIENT", "UNPAUSE").Err())
	waitCounted(t, h, &log, 10*time.Second)
}
