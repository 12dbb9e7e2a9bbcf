package ratelimit

import (
	"bytes"
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// KV is the storage contract of the seed: a key-value store with expiring entries, such as
// Cloudflare Workers KV. It may be eventually consistent; through a plain KV the limiter does a
// read, then a write, so concurrent requests can under-count (see [Counter] for exact counting).
//
// Implementations must be safe for simultaneous use by multiple goroutines and must return promptly
// once ctx is done: the limiter bounds every request's time in the store with ctx's deadline.
type KV interface {
	// Get returns the value stored under key. ok is false, with a nil error, when the key is
	// absent or has expired.
	Get(ctx context.Context, key string) (value []byte, ok bool, err error)
	// Put stores value under key. The store may forget the entry once ttl has passed; ttl is
	// always positive.
	Put(ctx context.Context, key string, value []byte, ttl time.Duration) error
}

// Counter is implemented by stores that can count atomically. When a layer's store implements
// Counter, the limiter uses Increment instead of the KV read and write, and counting is exact
// under any concurrency.
//
// The limiter owns the window arithmetic: window is the start of the current fixed window,
// identical for every caller that counts the same window, and a store only compares it for
// equality. Implementations must be safe for simultaneous use by multiple goroutines and must
// return promptly once ctx is done.
type Counter interface {
	// Increment adds one to the count of key for the window that starts at window and returns
	// the count including this call. Each window starts from zero: a stored count of an earlier
	// window is discarded first (or kept apart, under a key of its own). A late call for the
	// window just before the stored count's (from a caller whose clock lags, or that read it just
	// before the window turned) must not restart the newer count: a store keeps that window's
	// count apart (as redisstore does) or counts the call in the newer window (as MemoryKV
	// does, which errs towards denying). The store keeps the count for at least ttl after the
	// call; the limiter always passes twice the window's length, as the seed does, so the window
	// ends at window + ttl/2.
	Increment(ctx context.Context, key string, window time.Time, ttl time.Duration) (count int64, err error)
}

// MemoryKV is an in-process store that implements both [KV] and [Counter]. Counting through it is
// exact under any concurrency: every request is counted once, in its window, or (a request of
// the window before that arrives after the next window's first count) in the newer window.
// Entries expire at their TTL and the memory they held is given back,
// so a flood of distinct clients costs memory only while their windows last. It suits a single
// instance, local development and unit tests of handlers; several instances need a shared store.
//
// Counters are kept by a 128-bit hash of their key under random seeds of the store, not by the
// key text: a counter then takes about 100 bytes, and two keys share one only with a probability
// of about 10^-21 for a billion keys. A layer that counts here denies a client already at its
// limit on a lock-free read, without counting the request (as the seed does), so that a flood from
// one client writes nothing and waits on no lock. (Layers with a Max of 2^24 or more, or windows
// before 1970, count every request under the counter's lock instead.)
//
// The zero value is ready to use and reads the time with [time.Now]; [NewMemoryKV] can inject a
// clock. A MemoryKV is safe for simultaneous use by multiple goroutines and must not be copied
// after first use. Counters written by Increment and values written by Put are kept apart, even
// under the same key.
type MemoryKV struct {
	now    func() time.Time
	seeded atomic.Bool
	seedMu sync.Mutex
	seeds  [2]maphash.Seed // of counter keys; set on first use, so that the zero value works
	shards [memoryShards]memoryShard
	// The default clock of the layers that count here and read the system clock.
	layerClock systemClock
	scopesMu   sync.Mutex
	scopes     map[string]time.Duration // the window of each scope a layer counts in here
}

// claimScope records that a layer counts scope's clients here in windows of window, and returns
// the window of the layer of that scope built here before it, if another: the two share counters
// that keep one window at a time. The store cannot tell whether that layer is still in use (a
// reload replaces it), so the newest window is kept, and the caller warns.
func (m *MemoryKV) claimScope(scope string, window time.Duration) (earlier time.Duration, changed bool) {
	m.scopesMu.Lock()
	defer m.scopesMu.Unlock()
	earlier, ok := m.scopes[scope]
	if m.scopes == nil {
		m.scopes = make(map[string]time.Duration)
	}
	m.scopes[scope] = window
	return earlier, ok && earlier != window
}

// MemoryOption configures a [MemoryKV] built by [NewMemoryKV].
type MemoryOption func(*MemoryKV)

// WithClock makes a [MemoryKV] read the time from now instead of [time.Now], so that tests can
// expire entries without sleeping. Layers that count in the store read the same clock, unless
// their [Options.Now] is set.
func WithClock(now func() time.Time) MemoryOption {
	return func(m *MemoryKV) { m.now = now }
}

// NewMemoryKV returns an empty [MemoryKV].
func NewMemoryKV(opts ...MemoryOption) *MemoryKV {
	m := &MemoryKV{}
	for _, opt := range opts {
		opt(m)
	}
	m.seedsOf()
	return m
}

// seedsOf returns the seeds of counter keys, choosing them on first use.
func (m *MemoryKV) seedsOf() *[2]maphash.Seed {
	if !m.seeded.Load() {
		m.seedMu.Lock()
		if !m.seeded.Load() {
			m.seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
			m.seeded.Store(true)
		}
		m.seedMu.Unlock()
	}
	return &m.seeds
}

// Compile-time checks that MemoryKV satisfies both store contracts.
var (
	_ KV      = (*MemoryKV)(nil)
	_ Counter = (*MemoryKV)(nil)
)

const (
	// memoryShards spreads keys over independent locks. Counting a known key takes no shard
	// lock; adding a key, sweeping and the KV values do, and rarely wait for each other.
	memoryShardBits = 6
	memoryShards    = 1 << memoryShardBits
	// sweepEvery is how often, at most, a shard walks its entries to drop expired ones. The walk
	// happens on a write, so a shard nobody writes to keeps its memory until the next write.
	sweepEvery = int64(5 * time.Second)
	// shrinkBelow: once a map holds fewer than 1/shrinkBelow of the entries it once held, it is
	// rebuilt, because a Go map never returns the buckets of deleted entries.
	shrinkBelow = 4
	// shrinkMin keeps small maps from being rebuilt over and over.
	shrinkMin = 1024
)

type valueEntry struct {
	value   []byte
	expires int64 // Unix nanoseconds
}

type memoryShard struct {
	mu         sync.Mutex
	counters   counterTable
	values     map[string]valueEntry
	valuesPeak int
	nextSweep  int64
	_          [64]byte // keeps neighbouring shards' locks off one cache line
}

func (m *MemoryKV) clock() int64 {
	if m.now == nil {
		return time.Now().UnixNano()
	}
	return m.now().UnixNano()
}

// shardOf picks a counter's shard by the top bits of its hash; the table slot uses the bottom ones.
func shardOf(k counterKey) int { return int(k.hi >> (64 - memoryShardBits)) }

// valueShard picks the shard of a KV value, as shardOf does for a counter of the same key.
func (m *MemoryKV) valueShard(key string) *memoryShard {
	return &m.shards[shardOf(counterKey{hi: maphash.String(m.seedsOf()[0], key)})]
}

// Get implements [KV]. It returns a copy of the stored value.
func (m *MemoryKV) Get(_ context.Context, key string) ([]byte, bool, error) {
	now := m.clock()
	s := m.valueShard(key)
	s.mu.Lock()
	e, ok := s.values[key]
	s.mu.Unlock()
	if !ok || e.expires <= now {
		return nil, false, nil
	}
	return bytes.Clone(e.value), true, nil
}

// Put implements [KV]. It stores a copy of value. A ttl that is not positive removes the key.
func (m *MemoryKV) Put(_ context.Context, key string, value []byte, ttl time.Duration) error {
	now := m.clock()
	s := m.valueShard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(now)
	if ttl <= 0 {
		delete(s.values, key)
		return nil
	}
	if s.values == nil {
		s.values = make(map[string]valueEntry)
	}
	s.values[key] = valueEntry{value: bytes.Clone(value), expires: expiry(now, int64(ttl))}
	s.valuesPeak = max(s.valuesPeak, len(s.values))
	return nil
}

// Increment implements [Counter]. It never fails.
func (m *MemoryKV) Increment(_ context.Context, key string, window time.Time, ttl time.Duration) (int64, error) {
	return m.incrementAt(counterKeyOfString(m.seedsOf(), key), window.UnixNano(), ttl, m.clock(), 0), nil
}

// incrementAt is Increment of the counter k at the time now, in Unix nanoseconds of m's clock.
// The limiter calls it with a key hashed from a byte slice on its stack, and with the time it
// has already read when m's clock is the system clock.
//
// A known key is counted under its entry's lock alone; the shard's lock is taken to add a key,
// or when the lock-free lookup ran into a concurrent change of the table.
func (m *MemoryKV) incrementAt(k counterKey, window int64, ttl time.Duration, now int64, full fullMark) int64 {
	return m.incrementFound(m.findCounter(k), window, ttl, now, full)
}

// foundCounter is a counter looked up without a lock: its key, and its entry or nil.
type foundCounter struct {
	k counterKey
	e *counterEntry
}

// findCounter looks up the counter k without a lock; incrementFound counts in it.
func (m *MemoryKV) findCounter(k counterKey) foundCounter {
	return foundCounter{k: k, e: m.shards[shardOf(k)].counters.load(k)}
}

// incrementFound is incrementAt of a counter that findCounter looked up. The entry may have been
// swept since; then, as when findCounter found none, the count goes through the shard's lock.
func (m *MemoryKV) incrementFound(c foundCounter, window int64, ttl time.Duration, now int64, full fullMark) int64 {
	k := c.k
	if c.e != nil {
		if n, ok := c.e.add(window, int64(ttl), now, full); ok {
			return n
		}
	}
	s := &m.shards[shardOf(k)]
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.counters.lookup(k)
	if e == nil {
		s.sweep(now) // before inserting: a sweep may rebuild the table
		e = s.counters.insert(k)
	}
	// Only a sweep removes entries, under the lock held here: e is in the table and counts.
	n, _ := e.add(window, int64(ttl), now, full)
	return n
}

// peek returns the count of k in window without changing it; ok is false when there is none.
// Like a lookup without the shard's lock, it may miss a count while the table changes.
func (m *MemoryKV) peek(k counterKey, window int64) (count int64, ok bool) {
	e := m.shards[shardOf(k)].counters.load(k)
	if e == nil {
		return 0, false
	}
	return e.countIn(window, m.clock())
}

// Len reports how many entries the store holds, counters and values together. Expired entries
// count until a write to their shard sweeps them away.
func (m *MemoryKV) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += s.counters.used + len(s.values)
		s.mu.Unlock()
	}
	return n
}

// sweep drops expired entries, at most once per sweepEvery, and gives back the memory of a
// table or map that has shrunk far below its peak. The caller holds s.mu.
func (s *memoryShard) sweep(now int64) {
	if now < s.nextSweep {
		return
	}
	s.nextSweep = now + sweepEvery
	s.counters.sweep(now)
	s.sweepValues(now)
}

// sweepValues drops expired KV values and rebuilds the map once it holds far fewer than its
// peak, because a Go map never returns the buckets of deleted entries.
func (s *memoryShard) sweepValues(now int64) {
	for k, v := range s.values {
		if v.expires <= now {
			delete(s.values, k)
		}
	}
	if s.valuesPeak < shrinkMin || len(s.values) >= s.valuesPeak/shrinkBelow {
		return
	}
	if len(s.values) == 0 {
		s.values, s.valuesPeak = nil, 0
		return
	}
	// A fresh map sized to what is live: maps.Clone would keep the old capacity.
	rebuilt := make(map[string]valueEntry, len(s.values))
	for k, v := range s.values {
		rebuilt[k] = v
	}
	s.values, s.valuesPeak = rebuilt, len(rebuilt)
}
