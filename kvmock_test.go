package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// This file holds the test doubles: a settable clock and stores that fail, hang, return garbage,
// hide an interface, count their calls, or race the way the seed's KV does.

// fakeClock is a clock tests move by hand instead of sleeping.
type fakeClock struct{ nanos atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.nanos.Store(t.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.nanos.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.nanos.Add(int64(d)) }
func (c *fakeClock) Set(t time.Time)         { c.nanos.Store(t.UnixNano()) }

// windowStart is a time at which a 60-second window has just begun.
var windowStart = time.Unix(1_700_000_040, 0) // 1_700_000_040 % 60 == 0

// quietLogger swallows the layer's operator messages in tests that do not read them.
var quietLogger = slog.New(slog.DiscardHandler)

var errBoom = errors.New("boom: store unreachable")

// failingKV fails every call.
type failingKV struct{}

func (failingKV) Get(context.Context, string) ([]byte, bool, error)        { return nil, false, errBoom }
func (failingKV) Put(context.Context, string, []byte, time.Duration) error { return errBoom }
func (failingKV) Increment(context.Context, string, time.Time, time.Duration) (int64, error) {
	return 0, errBoom
}

// hangingKV blocks every call until its context is done, like a store behind a dead network.
type hangingKV struct{}

func (hangingKV) Get(ctx context.Context, _ string) ([]byte, bool, error) {
	<-ctx.Done()
	return nil, false, ctx.Err()
}

func (hangingKV) Put(ctx context.Context, _ string, _ []byte, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingKV) Increment(ctx context.Context, _ string, _ time.Time, _ time.Duration) (int64, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}

// corruptKV returns the same stored value for every key and accepts every write.
type corruptKV struct{ value []byte }

func (c corruptKV) Get(context.Context, string) ([]byte, bool, error)      { return c.value, true, nil }
func (corruptKV) Put(context.Context, string, []byte, time.Duration) error { return nil }

// kvOnly hides every method but Get and Put, so the limiter takes the seed's read/modify/write
// path even over a store that could count.
type kvOnly struct{ kv KV }

func (s kvOnly) Get(ctx context.Context, key string) ([]byte, bool, error) {
	return s.kv.Get(ctx, key)
}

func (s kvOnly) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return s.kv.Put(ctx, key, value, ttl)
}

// counterStore exposes a MemoryKV through the interfaces only, so the limiter takes its generic
// Counter path (with deadlines and the deny cache) instead of the MemoryKV fast path.
type counterStore struct {
	mem   *MemoryKV
	calls atomic.Int64
}

func (s *counterStore) Get(ctx context.Context, key string) ([]byte, bool, error) {
	s.calls.Add(1)
	return s.mem.Get(ctx, key)
}

func (s *counterStore) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	s.calls.Add(1)
	return s.mem.Put(ctx, key, value, ttl)
}

func (s *counterStore) Increment(ctx context.Context, key string, window time.Time, ttl time.Duration) (int64, error) {
	s.calls.Add(1)
	if err := ctx.Err(); err != nil { // as go-redis does before it sends a command
		return 0, err
	}
	return s.mem.Increment(ctx, key, window, ttl)
}

// racyKV is the seed's KV made deterministic: every Get reads, then waits until `readers` Gets
// have read, so all of them see the same count before any writes back, which is what eventual
// consistency allows under a burst.
type racyKV struct {
	kv      KV
	readers int

	mu      sync.Mutex
	arrived int
	release chan struct{}
}

func newRacyKV(kv KV, readers int) *racyKV {
	return &racyKV{kv: kv, readers: readers, release: make(chan struct{})}
}

func (s *racyKV) Get(ctx context.Context, key string) ([]byte, bool, error) {
	value, ok, err := s.kv.Get(ctx, key)
	s.mu.Lock()
	s.arrived++
	if s.arrived == s.readers {
		close(s.release)
	}
	s.mu.Unlock()
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	return value, ok, err
}

func (s *racyKV) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return s.kv.Put(ctx, key, value, ttl)
}
