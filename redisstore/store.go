// Package redisstore keeps rate-limit counters in Redis, so that several instances of a server
// share one exact limit.
//
// A [Store] implements [ratelimit.Counter]: every request is one round trip, a Lua script that
// increments the window's counter and sets its expiry together, atomically. No crash or race can
// leave a counter without a TTL or lose an increment, and under any concurrency, on any number of
// instances, a layer admits exactly its Max requests per client and window. A Store also
// implements [ratelimit.KV] (plain GET and SET PX), which [ratelimit.Options.Store] requires; the
// limiter uses only Increment.
//
// # The client must honour deadlines
//
// go-redis applies a context's deadline to socket reads and writes only when the client was built
// with ContextTimeoutEnabled: true. Without it a hung or paused Redis holds every request for the
// client's ReadTimeout (5 s by default) whatever the layer's [ratelimit.Options.StoreTimeout] says,
// and the limiter's promise that a slow store costs a request at most that deadline is broken.
// [New] therefore refuses a *redis.Client, *redis.ClusterClient or *redis.Ring built without
// ContextTimeoutEnabled, or with a ReadTimeout or WriteTimeout of -2 (which turns socket
// deadlines off altogether). A client of another type cannot be inspected; it must follow the
// same rule. The store does not run commands on goroutines of its own to cut them short: a
// command abandoned that way would keep its connection busy until ReadTimeout anyway.
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "127.0.0.1:6379",
//		ContextTimeoutEnabled: true, // required: StoreTimeout bounds every call
//	})
//	store, err := redisstore.New(client, redisstore.WithPrefix("shop:"))
//
// # Keys
//
// Increment keeps the count of key in the window that starts at window under
// "{prefix}{key}:{window}", where {window} is the window's start in Unix seconds (with a
// fraction, only when the start is not a whole second). A new window is a new key, so a count
// can never leak from one window into the next, even while instances disagree about which window
// it is. Get and Put use "{prefix}{key}". Every command touches one key, so the store is safe on
// Redis Cluster: keys spread over the slots by their whole name.
//
// # Time
//
// The limiter owns the window arithmetic: each instance computes the window from its own clock
// and the store counts what it is told. Within one window key the count is exact whatever the
// clocks say. When instance clocks disagree by a skew s, each instance draws the window boundary
// at its own time: for s after each boundary, requests that reach an instance whose clock lags
// still count in the old window while the others count in the new one. A client that can choose
// its instance can therefore get up to Max more requests around a boundary than the fixed-window
// bound, and Reset and Retry-After are off by up to s. Keep clocks synchronised (NTP keeps them
// within milliseconds) and the effect vanishes. The Redis server's clock is not used.
//
// # Outages
//
// A call that fails or runs out of time returns an error, and the layer follows its failure policy
// ([ratelimit.Options.FailClosed]). Nothing has to be done when Redis comes back: go-redis redials
// by itself (after a burst of failed dials it probes once a second), and the script, which a
// restarted Redis has forgotten, is sent again on the first NOSCRIPT answer. A Redis without
// persistence comes back empty, so every client starts a fresh window.
//
// Two go-redis behaviours are worth knowing. It logs each failed dial through its own logger
// (see redis.SetLogger), so an outage logs once per request there. And it retries a command after
// a network error (Options.MaxRetries): when a reply is lost after the script ran, the request is
// counted twice. That errs towards denying, never towards letting more through; MaxRetries: -1
// turns it off, at the price of failing the first request on each connection that a restart broke.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/redis/go-redis/v9"
)

// Compile-time checks that Store satisfies both store contracts.
var (
	_ ratelimit.Counter = (*Store)(nil)
	_ ratelimit.KV      = (*Store)(nil)
)

// MaxPrefixLen is the longest key prefix [WithPrefix] accepts, in bytes.
const MaxPrefixLen = 128

// incrementScript adds one to the window's counter and (re)sets its expiry in the same atomic
// step. PEXPIRE runs on every call, so a counter that somehow exists without a TTL gets one on
// its next increment, and the count is kept for at least ttl after the latest call. When INCR
// fails (the key holds something that is not a counter) the script stops before PEXPIRE and
// creates nothing.
const incrementScript = `
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
`

// Store is a Redis-backed [ratelimit.Counter] and [ratelimit.KV]. Build it with [New]; the zero
// value is not usable. A Store is safe for simultaneous use by multiple goroutines and holds no
// goroutines of its own; several Stores, in one process or many, may share one Redis.
type Store struct {
	client redis.UniversalClient
	prefix string
	incr   *redis.Script
}

// Option configures a [Store] built by [New].
type Option func(*config)

type config struct {
	prefix string
}

// WithPrefix puts prefix before every key the store writes, so that several applications can
// share one Redis; for example "shop:" turns the limiter's "ratelimit:auth:192.0.2.1" into
// "shop:ratelimit:auth:192.0.2.1:{window}". The default is no prefix.
//
// A prefix is at most [MaxPrefixLen] bytes of printable ASCII without spaces, and without '{' or
// '}': braces would make a Redis Cluster hash tag and put every counter of the application in one
// slot, on one node. New reports a prefix that breaks these rules.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// New returns a Store that runs its commands on client: a single node, Sentinel (failover) or
// Cluster client, or anything else that implements [redis.UniversalClient]. The client must
// honour context deadlines (see the package documentation); New reports one that visibly does
// not. New sends nothing to Redis, so it succeeds while Redis is down.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: client is nil")
	}
	var cfg config
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	if err := checkPrefix(cfg.prefix); err != nil {
		return nil, err
	}
	if err := checkDeadlines(client); err != nil {
		return nil, err
	}
	return &Store{client: client, prefix: cfg.prefix, incr: redis.NewScript(incrementScript)}, nil
}

func checkPrefix(p string) error {
	if len(p) > MaxPrefixLen {
		return fmt.Errorf("redisstore: prefix %.40q... is %d bytes long, more than %d", p, len(p), MaxPrefixLen)
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '{' || c == '}':
			return fmt.Errorf("redisstore: prefix %q contains %q: braces would make a Redis Cluster hash tag and put every key in one slot", p, c)
		case c <= ' ' || c >= 0x7f:
			return fmt.Errorf("redisstore: prefix %q may hold only printable ASCII without spaces", p)
		}
	}
	return nil
}

// checkDeadlines reports a client that would not apply a context's deadline to its socket reads
// and writes. The timeouts are read as the clients keep them: *redis.Client and
// *redis.ClusterClient have already turned -2 into a negative value and -1 into 0, a *redis.Ring
// hands its raw values to its shards, where -1 means "no timeout of its own" and -2 "no socket
// deadline at all".
func checkDeadlines(client redis.UniversalClient) error {
	var kind string
	var ctxEnabled bool
	var read, write, lowest time.Duration
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		kind, ctxEnabled, read, write, lowest = "redis.Options", o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout, 0
	case *redis.ClusterClient:
		o := c.Options()
		kind, ctxEnabled, read, write, lowest = "redis.ClusterOptions", o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout, 0
	case *redis.Ring:
		o := c.Options()
		kind, ctxEnabled, read, write, lowest = "redis.RingOptions", o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout, -1
	default:
		return nil // cannot be inspected; the package documentation states the rule
	}
	if !ctxEnabled {
		return fmt.Errorf("redisstore: the client does not honour context deadlines: set ContextTimeoutEnabled: true in its %s, "+
			"or a slow Redis holds each request for the client's ReadTimeout (%v) instead of the layer's StoreTimeout", kind, read)
	}
	if read < lowest || write < lowest {
		return fmt.Errorf("redisstore: the client's ReadTimeout or WriteTimeout is -2, which turns socket deadlines off, "+
			"so no context deadline can bound a call; use -1 (no timeout of its own) or a positive duration in its %s", kind)
	}
	return nil
}

// Prefix returns the key prefix set with [WithPrefix].
func (s *Store) Prefix() string { return s.prefix }

// Increment implements [ratelimit.Counter]: it adds one to the count of key in the window that
// starts at window, sets the counter to expire ttl from now, and returns the count including
// this call, in one round trip. ttl must be positive (the limiter passes twice the window); it
// is rounded up to whole milliseconds. Increment returns when ctx's deadline passes, at the
// latest, if the client honours deadlines (ContextTimeoutEnabled): go-redis applies a context's
// deadline to the connection, but a context cancelled without one does not stop a blocked read
// before ReadTimeout. The limiter always passes a deadline ([ratelimit.Options.StoreTimeout]).
//
// After Redis restarts, or its script cache is flushed, the first call on each connection's
// server loads the script again (EVALSHA answers NOSCRIPT, and EVAL follows); nothing else is
// needed for counting to resume.
func (s *Store) Increment(ctx context.Context, key string, window time.Time, ttl time.Duration) (int64, error) {
	k := s.counterKey(key, window)
	if ttl <= 0 {
		return 0, fmt.Errorf("redisstore: increment %q: ttl %v must be positive", k, ttl)
	}
	n, err := s.incr.Run(ctx, s.client, []string{k}, ceilMillis(ttl)).Int64()
	if err != nil {
		return 0, fmt.Errorf("redisstore: increment %q: %w", k, err)
	}
	return n, nil
}

// Get implements [ratelimit.KV] with GET "{prefix}{key}". A missing key is (nil, false, nil).
func (s *Store) Get(ctx context.Context, key string) ([]byte, bool, error) {
	k := s.prefix + key
	v, err := s.client.Get(ctx, k).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("redisstore: get %q: %w", k, err)
	}
	return v, true, nil
}

// Put implements [ratelimit.KV] with SET "{prefix}{key}" value PX ttl, ttl rounded up to whole
// milliseconds. As with [ratelimit.MemoryKV], a ttl that is not positive removes the key, so Put
// never leaves a key without an expiry.
func (s *Store) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	k := s.prefix + key
	var err error
	if ttl <= 0 {
		err = s.client.Del(ctx, k).Err()
	} else {
		// go-redis takes a Duration: whole milliseconds that still fit in one.
		ms := min(ceilMillis(ttl), math.MaxInt64/int64(time.Millisecond))
		err = s.client.Set(ctx, k, value, time.Duration(ms)*time.Millisecond).Err()
	}
	if err != nil {
		return fmt.Errorf("redisstore: put %q: %w", k, err)
	}
	return nil
}

// counterKey is "{prefix}{key}:{window}", the window in Unix seconds, with a fraction of a second
// only when there is one.
func (s *Store) counterKey(key string, window time.Time) string {
	buf := make([]byte, 0, len(s.prefix)+len(key)+32)
	buf = append(buf, s.prefix...)
	buf = append(buf, key...)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, window.Unix(), 10)
	if ns := window.Nanosecond(); ns != 0 {
		frac := strconv.AppendInt(nil, int64(ns)+1e9, 10)[1:] // nine digits, leading zeros kept
		for frac[len(frac)-1] == '0' {
			frac = frac[:len(frac)-1]
		}
		buf = append(buf, '.')
		buf = append(buf, frac...)
	}
	return string(buf)
}

// ceilMillis rounds d up to whole milliseconds, the resolution of PEXPIRE and SET PX. A positive
// d stays positive: rounding up near the largest Duration ("forever") must not wrap around into
// a negative PEXPIRE, which would delete the counter, or into a SET without an expiry.
func ceilMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}
