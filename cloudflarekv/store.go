package cloudflarekv

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kilat-dev/ratelimit"
)

// Store is the plain, seed-compatible mode: a [ratelimit.KV] over the REST API. Through it the
// limiter does what the seed's Worker does for every request: a GET, then a PUT of
// {"window":<unix seconds>,"count":<n>}, so a Go server and a Worker running the seed can share
// one namespace. It costs up to two API calls per counted request (one once a client is over
// the limit and denied by the limiter's local cache): with Cloudflare's 1,200 calls per
// 5 minutes per token, about 2 requests per second for the whole fleet; on the free plan
// Workers KV takes 1,000 writes a day. Use [Synced] to serve real traffic.
//
// Workers KV takes one write per second per key, and the budget and Cloudflare's 429s stop
// calls altogether for a while. So that a burst is still limited, a Store also remembers, in
// memory, the last value it wrote or meant to write for each key (up to 65,536 keys, each kept
// for the TTL of its last Put; past that, a new key's refused write fails as before):
//
//   - Put sends no write for a key this Store wrote less than a second ago, and does not fail
//     a write that Workers KV refused with its per-key 429, or that the budget or a pause after
//     an API-wide 429 prevented: in each case it keeps the value in memory and returns nil.
//   - Get returns the stored value or the remembered one, whichever is ahead (a later window,
//     or the same window with a larger count); when the budget is spent or the store pauses
//     after a 429, it answers from memory alone, without an error.
//
// What this guarantees under a burst: one instance admits at most Max requests per window from
// one client when the client's requests reach it one after another, whatever KV accepts; the
// API calls stop once the client is denied (the limiter's deny cache). It guarantees nothing
// across instances beyond what KV carries: counts held in memory reach KV only with the key's
// next accepted write (a client denied on this instance causes no further write), and KV's
// reads may lag by up to 60 s, so N instances can admit up to N×Max, and while calls cannot be
// made each instance counts only its own requests. Concurrent requests from one client on one
// instance can still both read the same count (the read-then-write of any plain KV) and
// overshoot. Budget and API-wide 429 fall-backs are logged through [Config.Logger] at most once
// a minute and counted in [Stats].
//
// Failures that are not about capacity still fail: after 5xx answers, timeouts or a rejected
// token the store backs off (exponentially, 1 s doubling to 5 minutes) and calls fail at once
// with [ErrPaused], and the limiter follows its failure policy (fail open by default;
// ratelimit.Options.FailClosed answers 503 instead). Prefer [Synced] to serve traffic (it
// counts exactly in memory and shares counts at a fixed cost in calls), and FailClosed where
// letting requests through unlimited during such an outage is worse than refusing them.
//
// Every call runs under the caller's context; there are no client-side waits or retries. TTLs
// below 60 s are raised to 60 s (the window lives in the value).
//
// A Store is safe for simultaneous use by multiple goroutines and holds no goroutines.
type Store struct {
	c      *client
	local  localValues
	now    func() time.Time
	logger *slog.Logger

	answered, held atomic.Int64
	lastLogged     atomic.Int64
}

// Compile-time check: Store is a plain KV, deliberately not a Counter.
var _ ratelimit.KV = (*Store)(nil)

// NewStore validates cfg and returns a plain-mode store. It makes no API call.
func NewStore(cfg Config) (*Store, error) {
	c, err := newClient(&cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Store{c: c, now: cfg.Now, logger: cfg.Logger}, nil
}

// Get implements [ratelimit.KV]: the value of key, ok false when Cloudflare answers 404 with
// code 10009, or the value this Store last wrote or held for key when that is ahead of it (see
// [Store]). While the budget is spent or the store pauses after a 429, Get makes no call and
// answers from memory, without an error. A 404 with another code (a missing namespace) is an
// [*APIError] that matches [ErrConfiguration].
func (s *Store) Get(ctx context.Context, key string) ([]byte, bool, error) {
	raw, found, err := s.c.get(ctx, key)
	now := s.now().UnixNano()
	if err != nil {
		if !capacityError(err) {
			return nil, false, err
		}
		s.answered.Add(1)
		s.notice(err, now)
		v, ok := s.local.get(key, now)
		return v, ok, nil
	}
	if v, ok := s.local.ahead(key, raw, found, now); ok {
		return v, true, nil
	}
	return raw, found, nil
}

// Put implements [ratelimit.KV] with the single-key PUT and ?expiration_ttl=, the TTL rounded
// up to whole seconds and raised to at least 60 s. The value is kept in memory too. The write is
// not sent when this Store wrote key less than a second ago, and a write refused for capacity
// (Workers KV's per-key 429, an API-wide 429 or the pause after it, the budget) returns nil:
// the value is then held in memory only, and Get counts it (see [Store]).
func (s *Store) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	now := s.now().UnixNano()
	if s.local.writtenWithin(key, now, minWriteGap) && s.local.keep(key, value, ttl, now, false) {
		s.held.Add(1)
		return nil
	}
	err := s.c.put(ctx, key, value, ttl)
	switch {
	case err == nil:
		s.local.keep(key, value, ttl, s.now().UnixNano(), true)
		return nil
	case capacityError(err) && s.local.keep(key, value, ttl, now, false):
		s.held.Add(1)
		if !perKeyLimit(err) {
			s.notice(err, now)
		}
		return nil
	}
	return err
}

// Stats reports the store's API traffic and what it answered from memory.
func (s *Store) Stats() Stats {
	st := s.c.stats()
	st.AnsweredLocally, st.HeldLocally, st.Keys = s.answered.Load(), s.held.Load(), s.local.len()
	return st
}

// notice logs, at most once a minute, that the store answers from memory.
func (s *Store) notice(err error, now int64) {
	last := s.lastLogged.Load()
	if now-last < int64(time.Minute) || !s.lastLogged.CompareAndSwap(last, now) {
		return
	}
	s.logger.Warn("cloudflarekv: no API call possible now; counting in this instance's memory", "error", err)
}

// capacityError reports whether err is about the API's capacity rather than a failure: a 429
// (Workers KV's per-key write limit, or the token's API-wide limit), a pause after an API-wide
// 429, or the budget. The plain Store answers those from memory.
func capacityError(err error) bool {
	return errors.Is(err, ErrRateLimited) || errors.Is(err, ErrBudgetExhausted)
}

// perKeyLimit reports whether err is Workers KV's 429 for a second write to a key within a
// second, which says nothing about other keys.
func perKeyLimit(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == 429 && ae.RetryAfter <= 0 && ae.Code != CodeAPIRateLimited
}

const (
	localShards = 32
	// localMaxKeys bounds the plain Store's memory: past it, new keys are not remembered and
	// their writes refused for capacity fail as the API answered.
	localMaxKeys = 1 << 16
)

// localValues is the plain Store's memory of the last value written or held per key.
type localValues struct {
	shards [localShards]localShard
}

type localShard struct {
	mu        sync.Mutex
	m         map[string]*localValue
	nextSweep int64
	_         [64]byte
}

type localValue struct {
	value     []byte
	window    int64
	count     int64
	seed      bool  // value is {"window","count"}: window and count are set
	expires   int64 // Unix nanoseconds
	lastWrite int64 // when the API last accepted a write of the key, Unix nanoseconds; 0 never
}

// parseCount reads a seed value, as the limiter does.
func parseCount(raw []byte) (window, count int64, ok bool) {
	var v syncedValue
	if json.Unmarshal(raw, &v) != nil || v.Window == nil || v.Count == nil || *v.Count < 0 {
		return 0, 0, false
	}
	return *v.Window, *v.Count, true
}

func (l *localValues) shard(key string) *localShard { return &l.shards[fnv32(key)%localShards] }

// get returns the remembered value of key, if its TTL has not passed.
func (l *localValues) get(key string, now int64) ([]byte, bool) {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil || now >= e.expires {
		return nil, false
	}
	return append([]byte(nil), e.value...), true
}

// ahead returns the remembered value of key when it is ahead of the stored one: the stored
// value is absent or not a counter, or belongs to an earlier window, or counts less.
func (l *localValues) ahead(key string, raw []byte, found bool, now int64) ([]byte, bool) {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil || now >= e.expires || !e.seed {
		return nil, false
	}
	if found {
		if w, n, ok := parseCount(raw); ok && (w > e.window || w == e.window && n >= e.count) {
			return nil, false
		}
	}
	return append([]byte(nil), e.value...), true
}

// writtenWithin reports whether the API accepted a write of key less than gap ago.
func (l *localValues) writtenWithin(key string, now, gap int64) bool {
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	return e != nil && e.lastWrite != 0 && now-e.lastWrite < gap
}

// keep remembers value for key until ttl has passed; written tells that the API accepted it.
// A counter value behind the remembered one (an earlier window, or a smaller count in the same
// window, from a concurrent request) does not replace it. keep reports false when key is new
// and the memory is full.
func (l *localValues) keep(key string, value []byte, ttl time.Duration, now int64, written bool) bool {
	w, n, seed := parseCount(value)
	sh := l.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	switch {
	case e == nil:
		sh.sweep(now)
		if len(sh.m) >= localMaxKeys/localShards {
			return false
		}
		if sh.m == nil {
			sh.m = make(map[string]*localValue)
		}
		e = &localValue{}
		sh.m[key] = e
	case now >= e.expires:
		*e = localValue{lastWrite: e.lastWrite} // kept only for its last write time
	}
	behind := e.seed && seed && (e.window > w || e.window == w && e.count > n)
	if !behind {
		e.value = append(e.value[:0], value...)
		e.window, e.count, e.seed = w, n, seed
	}
	e.expires = max(e.expires, now+int64(ttl))
	if written {
		e.lastWrite = now
	}
	return true
}

// sweep drops expired entries, at most once a second. The caller holds sh.mu.
func (sh *localShard) sweep(now int64) {
	if now < sh.nextSweep {
		return
	}
	sh.nextSweep = now + int64(time.Second)
	for k, e := range sh.m {
		if now >= e.expires && now-e.lastWrite >= minWriteGap {
			delete(sh.m, k)
		}
	}
	if len(sh.m) == 0 {
		sh.m = nil
	}
}

func (l *localValues) len() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
