package redisstore_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilat-dev/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// None of these clients connects before its first command, so no Redis is needed here.
func TestNewRejectsBadConfiguration(t *testing.T) {
	const addr = "127.0.0.1:1"
	tests := []struct {
		name   string
		client func() redis.UniversalClient
		opts   []redisstore.Option
		want   string
	}{
		{"nil client", func() redis.UniversalClient { return nil }, nil, "client is nil"},
		{"client without ContextTimeoutEnabled",
			func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr}) },
			nil, "set ContextTimeoutEnabled: true in its redis.Options"},
		{"client with ReadTimeout -2",
			func() redis.UniversalClient {
				return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: -2})
			},
			nil, "turns socket deadlines off"},
		{"client with WriteTimeout -2",
			func() redis.UniversalClient {
				return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, WriteTimeout: -2})
			},
			nil, "turns socket deadlines off"},
		{"cluster without ContextTimeoutEnabled",
			func() redis.UniversalClient {
				return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
			},
			nil, "set ContextTimeoutEnabled: true in its redis.ClusterOptions"},
		{"cluster with ReadTimeout -2",
			func() redis.UniversalClient {
				return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true, ReadTimeout: -2})
			},
			nil, "turns socket deadlines off"},
		{"ring without ContextTimeoutEnabled",
			func() redis.UniversalClient {
				return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
			},
			nil, "set ContextTimeoutEnabled: true in its redis.RingOptions"},
		{"ring with ReadTimeout -2",
			func() redis.UniversalClient {
				return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: true, ReadTimeout: -2})
			},
			nil, "turns socket deadlines off"},
		{"universal client without ContextTimeoutEnabled",
			func() redis.UniversalClient {
				return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}})
			},
			nil, "ContextTimeoutEnabled"},
		{"prefix with an opening brace", goodClient, []redisstore.Option{redisstore.WithPrefix("{shop}:")}, `contains '{'`},
		{"prefix with a closing brace", goodClient, []redisstore.Option{redisstore.WithPrefix("shop}:")}, `contains '}'`},
		{"prefix with a space", goodClient, []redisstore.Option{redisstore.WithPrefix("my shop:")}, "printable ASCII without spaces"},
		{"prefix with a newline", goodClient, []redisstore.Option{redisstore.WithPrefix("shop\n")}, "printable ASCII without spaces"},
		{"prefix not ASCII", goodClient, []redisstore.Option{redisstore.WithPrefix("café:")}, "printable ASCII without spaces"},
		{"prefix too long", goodClient, []redisstore.Option{redisstore.WithPrefix(strings.Repeat("p", redisstore.MaxPrefixLen+1))}, "more than 128"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.client()
			if c != nil {
				defer c.Close()
			}
			s, err := redisstore.New(c, tt.opts...)
			require.Nil(t, s)
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), "redisstore: "), "error %q lacks the package prefix", err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func goodClient() redis.UniversalClient {
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
}

func TestNewAcceptsClientsThatHonourDeadlines(t *testing.T) {
	const addr = "127.0.0.1:1"
	tests := []struct {
		name   string
		client redis.UniversalClient
		prefix string
	}{
		{"single node", redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true}), ""},
		{"single node, no timeout of its own", redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: -1}), "shop:"},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true}), "a-b_c.d/e:"},
		{"ring, no timeout of its own", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: true, ReadTimeout: -1}), "x"},
		{"universal", redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true}), strings.Repeat("p", redisstore.MaxPrefixLen)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer tt.client.Close()
			s, err := redisstore.New(tt.client, redisstore.WithPrefix(tt.prefix))
			require.NoError(t, err)
			require.Equal(t, tt.prefix, s.Prefix())
		})
	}
}

func TestIncrementCountsPerWindowInItsOwnKey(t *testing.T) {
	s, raw, prefix := prefixedStore(t)
	ctx := context.Background()
	w1 := time.Unix(1_800_000_000, 0)
	w2 := w1.Add(time.Minute)

	for want := int64(1); want <= 5; want++ {
		n, err := s.Increment(ctx, "ratelimit:api:192.0.2.1", w1, 2*time.Minute)
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	// The next window starts from zero in a key of its own; the old window's count is untouched.
	n, err := s.Increment(ctx, "ratelimit:api:192.0.2.1", w2, 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	// Going back to the old window (an instance whose clock lags) does not reset the new one.
	n, err = s.Increment(ctx, "ratelimit:api:192.0.2.1", w1, 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(6), n)

	old, err := raw.Get(ctx, prefix+"ratelimit:api:192.0.2.1:1800000000").Int64()
	require.NoError(t, err)
	require.Equal(t, int64(6), old)
	cur, err := raw.Get(ctx, prefix+"ratelimit:api:192.0.2.1:1800000060").Int64()
	require.NoError(t, err)
	require.Equal(t, int64(1), cur)

	// Another client's key counts on its own.
	n, err = s.Increment(ctx, "ratelimit:api:2001:db8::", w1, 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func TestIncrementKeyNames(t *testing.T) {
	addr := sharedAddr(t)
	prefix := testPrefix(t, addr)
	raw := newClient(t, addr)
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name   string
		prefix string
		key    string
		window time.Time
		want   string // without the test's prefix
	}{
		{"whole seconds", "", "ratelimit:auth:192.0.2.1", base, "ratelimit:auth:192.0.2.1:1800000000"},
		{"with prefix", "shop:", "ratelimit:auth:192.0.2.1", base, "shop:ratelimit:auth:192.0.2.1:1800000000"},
		{"half a second", "", "k", base.Add(500 * time.Millisecond), "k:1800000000.5"},
		{"one nanosecond", "", "k", base.Add(time.Nanosecond), "k:1800000000.000000001"},
		{"time zone does not matter", "", "z", base.In(time.FixedZone("X", 3600)), "z:1800000000"},
		{"empty key", "", "", base, ":1800000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t, addr, redisstore.WithPrefix(prefix+tt.prefix))
			_, err := s.Increment(ctx, tt.key, tt.window, time.Minute)
			require.NoError(t, err)
			n, err := raw.Exists(ctx, prefix+tt.want).Result()
			require.NoError(t, err)
			require.Equal(t, int64(1), n, "key %q missing; keys: %q", prefix+tt.want, scanKeys(t, ctx, raw, prefix))
			require.NoError(t, raw.Del(ctx, prefix+tt.want).Err())
		})
	}
}

func TestIncrementSetsExpiryOnEveryKey(t *testing.T) {
	s, raw, prefix := prefixedStore(t)
	ctx := context.Background()
	const ttl = 2 * time.Minute
	w := time.Unix(1_800_000_000, 0)

	// A counter that somebody left without a TTL gets one with its next increment.
	require.NoError(t, raw.Set(ctx, prefix+"stale:1800000000", "7", 0).Err())
	n, err := s.Increment(ctx, "stale", w, ttl)
	require.NoError(t, err)
	require.Equal(t, int64(8), n)

	// Many clients, two windows, concurrently.
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 100 {
		for _, win := range []time.Time{w, w.Add(time.Minute)} {
			wg.Go(func() {
				_, err := s.Increment(ctx, "ratelimit:api:198.51.100."+strconv.Itoa(i), win, ttl)
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	keys := scanKeys(t, ctx, raw, prefix)
	require.Len(t, keys, 201)
	for _, k := range keys {
		pttl, err := raw.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Greater(t, pttl, time.Duration(0), "key %q has no expiry", k)
		require.LessOrEqual(t, pttl, ttl, "key %q", k)
	}

	// Each increment sets the expiry again, so the count lives ttl after the latest request.
	require.NoError(t, raw.PExpire(ctx, prefix+"stale:1800000000", time.Second).Err())
	_, err = s.Increment(ctx, "stale", w, ttl)
	require.NoError(t, err)
	pttl, err := raw.PTTL(ctx, prefix+"stale:1800000000").Result()
	require.NoError(t, err)
	require.Greater(t, pttl, ttl-time.Minute)
}

// A TTL near the largest Duration ("forever") rounds up to milliseconds without wrapping into a
// negative PEXPIRE, which would delete the counter at every call, or a SET without an expiry.
func TestHugeTTLKeepsCountingAndExpiring(t *testing.T) {
	s, raw, prefix := prefixedStore(t)
	ctx := context.Background()
	const forever = time.Duration(math.MaxInt64)
	for want := int64(1); want <= 3; want++ {
		n, err := s.Increment(ctx, "k", fixedNow, forever)
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	require.NoError(t, s.Put(ctx, "v", []byte("x"), forever))
	for _, k := range scanKeys(t, ctx, raw, prefix) {
		pttl, err := raw.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Greater(t, pttl, time.Duration(0), "key %q has no expiry", k)
	}
}

func TestIncrementRejectsNonPositiveTTL(t *testing.T) {
	s, raw, prefix := prefixedStore(t)
	for _, ttl := range []time.Duration{0, -time.Second} {
		_, err := s.Increment(context.Background(), "k", fixedNow, ttl)
		require.ErrorContains(t, err, "redisstore: increment")
		require.ErrorContains(t, err, "must be positive")
	}
	require.Empty(t, scanKeys(t, context.Background(), raw, prefix), "no key may be created without a TTL")
}

func TestIncrementErrorSaysWhatFailed(t *testing.T) {
	s, raw, prefix := prefixedStore(t)
	ctx := context.Background()
	key := prefix + "list:1800000000"
	require.NoError(t, raw.RPush(ctx, key, "x").Err())

	_, err := s.Increment(ctx, "list", fixedNow, time.Minute)
	require.Error(t, err)
	require.ErrorContains(t, err, `redisstore: increment "`+key+`"`)
	var redisErr redis.Error
	require.ErrorAs(t, err, &redisErr, "the Redis error must stay reachable with errors.As")
	require.ErrorContains(t, err, "WRONGTYPE")
	// The script stopped at INCR: the foreign key was neither changed nor given an expiry.
	pttl, err := raw.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), pttl)
}

// Three stores, each on its own client, count one key concurrently: every count from 1 to 3000 is
// handed out exactly once.
func TestIncrementIsAtomicAcrossClients(t *testing.T) {
	addr := sharedAddr(t)
	prefix := testPrefix(t, addr)
	stores := []*redisstore.Store{
		newStore(t, addr, redisstore.WithPrefix(prefix)),
		newStore(t, addr, redisstore.WithPrefix(prefix)),
		newStore(t, addr, redisstore.WithPrefix(prefix)),
	}
	const total = 3000
	counts := make([]int64, total)
	errs := make([]error, total)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range total {
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			counts[i], errs[i] = stores[i%len(stores)].Increment(ctx, "hot", fixedNow, time.Minute)
		})
	}
	close(start)
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	slices.Sort(counts)
	for i, n := range counts {
		require.Equal(t, int64(i+1), n, "counts must be 1..%d, each once", total)
	}
}

func TestGetAndPut(t *testing.T) {
	addr := sharedAddr(t)
	prefix := testPrefix(t, addr)
	s := newStore(t, addr, redisstore.WithPrefix(prefix+"app:"))
	raw := newClient(t, addr)
	ctx := context.Background()

	v, ok, err := s.Get(ctx, "missing")
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, v)

	tests := []struct {
		name string
		ttl  time.Duration
		want time.Duration // the PTTL Redis reports, at most
	}{
		{"whole seconds", time.Minute, time.Minute},
		{"milliseconds", 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"sub-millisecond rounds up", 59*time.Second + 1, 59*time.Second + time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			value := []byte(`{"window":1800000000,"count":3}`)
			require.NoError(t, s.Put(ctx, "ratelimit:api:192.0.2.9", value, tt.ttl))
			got, ok, err := s.Get(ctx, "ratelimit:api:192.0.2.9")
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, value, got)

			pttl, err := raw.PTTL(ctx, prefix+"app:ratelimit:api:192.0.2.9").Result()
			require.NoError(t, err)
			require.Greater(t, pttl, tt.want-time.Second)
			require.LessOrEqual(t, pttl, tt.want)
		})
	}

	// A ttl below a millisecond rounds up to one, never down to zero (which for SET would mean
	// "no expiry"): the key is gone or about to go, never kept for good.
	require.NoError(t, s.Put(ctx, "tiny", []byte("x"), time.Nanosecond))
	pttl, err := raw.PTTL(ctx, prefix+"app:tiny").Result()
	require.NoError(t, err)
	require.NotEqual(t, time.Duration(-1), pttl, "a key without expiry")
	n, err := s.Increment(ctx, "tiny", fixedNow, time.Nanosecond)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	pttl, err = raw.PTTL(ctx, prefix+"app:tiny:1800000000").Result()
	require.NoError(t, err)
	require.NotEqual(t, time.Duration(-1), pttl, "a counter without expiry")

	// A ttl that is not positive removes the key rather than leaving it without an expiry.
	require.NoError(t, s.Put(ctx, "ratelimit:api:192.0.2.9", []byte("x"), 0))
	_, ok, err = s.Get(ctx, "ratelimit:api:192.0.2.9")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestPrefixesKeepApplicationsApart(t *testing.T) {
	addr := sharedAddr(t)
	prefix := testPrefix(t, addr)
	shop := newStore(t, addr, redisstore.WithPrefix(prefix+"shop:"))
	blog := newStore(t, addr, redisstore.WithPrefix(prefix+"blog:"))
	ctx := context.Background()
	for want := int64(1); want <= 3; want++ {
		n, err := shop.Increment(ctx, "ratelimit:api:192.0.2.1", fixedNow, time.Minute)
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	n, err := blog.Increment(ctx, "ratelimit:api:192.0.2.1", fixedNow, time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	require.NoError(t, shop.Put(ctx, "v", []byte("shop"), time.Minute))
	_, ok, err := blog.Get(ctx, "v")
	require.NoError(t, err)
	require.False(t, ok)
}

// EVALSHA answers NOSCRIPT after SCRIPT FLUSH (and after a restart); the store must load the
// script again by itself. This runs on a private server, since it flushes every script.
func TestIncrementSurvivesScriptFlush(t *testing.T) {
	srv := startRedisServer(t)
	s := newStore(t, srv.addr())
	raw := newClient(t, srv.addr())
	ctx := context.Background()

	n, err := s.Increment(ctx, "k", fixedNow, time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.NoError(t, raw.ScriptFlush(ctx).Err())
	n, err = s.Increment(ctx, "k", fixedNow, time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
}

// A Redis that accepts connections and never answers costs a call no more than its context allows.
func TestIncrementOnHungRedisReturnsAtDeadline(t *testing.T) {
	s := newStore(t, hungServer(t))
	tests := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"increment", func(ctx context.Context) error {
			_, err := s.Increment(ctx, "k", fixedNow, time.Minute)
			return err
		}},
		{"get", func(ctx context.Context) error { _, _, err := s.Get(ctx, "k"); return err }},
		{"put", func(ctx context.Context) error { return s.Put(ctx, "k", []byte("v"), time.Minute) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const deadline = 150 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := tt.call(ctx)
			took := time.Since(start)
			require.Error(t, err)
			require.ErrorContains(t, err, "redisstore: "+tt.name)
			t.Logf("hung Redis, %v deadline: %s returned after %v: %v", deadline, tt.name, took, err)
			require.Less(t, took, deadline+500*time.Millisecond, "the call outlived its deadline")
		})
	}
}

// Why New insists on ContextTimeoutEnabled: without it go-redis bounds a call on a hung server by
// its ReadTimeout, not by the context. Should a go-redis release change this, this test fails and
// New's check can be relaxed.
func TestGoRedisIgnoresDeadlineWithoutContextTimeoutEnabled(t *testing.T) {
	addr := hungServer(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Incr(ctx, "k").Err()
	took := time.Since(start)
	require.Error(t, err)
	t.Logf("ContextTimeoutEnabled false, 100ms deadline, ReadTimeout 1s: returned after %v", took)
	require.GreaterOrEqual(t, took, 900*time.Millisecond)
}

// A one-node Redis Cluster still refuses a command whose keys hash to different slots (CROSSSLOT),
// so counting through a ClusterClient there shows that every command stays within one slot. A Ring
// with one shard shows the third kind of client.
func TestClusterAndRingClients(t *testing.T) {
	ctx := context.Background()
	t.Run("cluster", func(t *testing.T) {
		srv := startRedisServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		admin := newClient(t, srv.addr())
		require.NoError(t, admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err())
		deadline := time.Now().Add(10 * time.Second)
		for {
			info, err := admin.ClusterInfo(ctx).Result()
			require.NoError(t, err)
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			require.True(t, time.Now().Before(deadline), "cluster not ready:\n%s", info)
			time.Sleep(20 * time.Millisecond) // waiting for the server, not for time logic
		}
		// A multi-key command across slots fails here, as it would on a real cluster.
		require.ErrorContains(t, admin.MGet(ctx, "a", "b").Err(), "CROSSSLOT")

		cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.addr()}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = cluster.Close() })
		s, err := redisstore.New(cluster, redisstore.WithPrefix("app:"))
		require.NoError(t, err)
		checkStore(t, s)
	})
	t.Run("ring", func(t *testing.T) {
		addr := sharedAddr(t)
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": addr}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = ring.Close() })
		s, err := redisstore.New(ring, redisstore.WithPrefix(testPrefix(t, addr)))
		require.NoError(t, err)
		checkStore(t, s)
	})
}

// checkStore counts concurrently through s, and puts and gets a value.
func checkStore(t *testing.T, s *redisstore.Store) {
	t.Helper()
	ctx := context.Background()
	const total = 300
	counts := make([]int64, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	for i := range total {
		wg.Go(func() {
			key := "ratelimit:api:192.0.2." + strconv.Itoa(i%3)
			counts[i], errs[i] = s.Increment(ctx, key, fixedNow, time.Minute)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	slices.Sort(counts)
	for i, n := range counts {
		require.Equal(t, int64(i/3+1), n, "each of three keys counts 1..%d", total/3)
	}
	require.NoError(t, s.Put(ctx, "v", []byte("x"), time.Minute))
	v, ok, err := s.Get(ctx, "v")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []byte("x"), v)
}
