package ratelimit

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMemoryKVGetPut(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock(windowStart)
	m := NewMemoryKV(WithClock(clock.Now))

	_, ok, err := m.Get(ctx, "missing")
	require.NoError(t, err)
	require.False(t, ok)

	value := []byte("v1")
	require.NoError(t, m.Put(ctx, "k", value, time.Minute))
	value[0] = 'X' // the store keeps its own copy
	got, ok, err := m.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "v1", string(got))
	got[0] = 'Y' // and hands out copies
	got, _, _ = m.Get(ctx, "k")
	require.Equal(t, "v1", string(got))

	clock.Advance(time.Minute - time.Nanosecond)
	_, ok, _ = m.Get(ctx, "k")
	require.True(t, ok, "alive until its TTL")
	clock.Advance(time.Nanosecond)
	_, ok, _ = m.Get(ctx, "k")
	require.False(t, ok, "expired at its TTL")

	require.NoError(t, m.Put(ctx, "k", []byte("v2"), time.Minute))
	require.NoError(t, m.Put(ctx, "k", []byte("v3"), 0))
	_, ok, _ = m.Get(ctx, "k")
	require.False(t, ok, "a TTL that is not positive removes the key")
}

func TestMemoryKVIncrement(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock(windowStart)
	m := NewMemoryKV(WithClock(clock.Now))
	w1, w2 := windowStart, windowStart.Add(time.Minute)

	for want := int64(1); want <= 3; want++ {
		n, err := m.Increment(ctx, "k", w1, 2*time.Minute)
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	n, _ := m.Increment(ctx, "other", w1, 2*time.Minute)
	require.EqualValues(t, 1, n, "keys count separately")
	n, _ = m.Increment(ctx, "k", w2, 2*time.Minute)
	require.EqualValues(t, 1, n, "a new window starts from zero")
	// A late call for the old window (a clock that lags, a goroutine that read it just before
	// the window turned) counts in the new window and does not reset it.
	n, _ = m.Increment(ctx, "k", w1, 2*time.Minute)
	require.EqualValues(t, 2, n, "a late call for the old window counts in the new one")
	n, _ = m.Increment(ctx, "k", w2, 2*time.Minute)
	require.EqualValues(t, 3, n, "the new window's count goes on")
	n, _ = m.Increment(ctx, "k", w1, 2*time.Minute)
	require.EqualValues(t, 4, n)

	clock.Advance(2 * time.Minute)
	n, _ = m.Increment(ctx, "k", w1, 2*time.Minute)
	require.EqualValues(t, 1, n, "an expired count starts again")

	_, ok, _ := m.Get(ctx, "k")
	require.False(t, ok, "counters and values are kept apart")
}

func TestMemoryKVZeroValueIsUsable(t *testing.T) {
	var m MemoryKV
	ctx := context.Background()
	n, err := m.Increment(ctx, "k", time.Now(), time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, m.Put(ctx, "k", []byte("v"), time.Minute))
	got, ok, err := m.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "v", string(got))
	require.Equal(t, 2, m.Len())
}

func TestMemoryKVConcurrentIncrementIsExact(t *testing.T) {
	m := NewMemoryKV()
	window := time.Now()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				_, _ = m.Increment(context.Background(), fmt.Sprint("k", i%10), window, time.Minute)
				_ = m.Put(context.Background(), fmt.Sprint("v", g, i%10), []byte("x"), time.Minute)
			}
		})
	}
	wg.Wait()
	for i := range 10 {
		n, _ := m.Increment(context.Background(), fmt.Sprint("k", i), window, time.Minute)
		require.EqualValues(t, 801, n)
	}
}

// A flood of distinct clients must not grow memory without bound once their windows pass: expired
// entries are swept on later writes and the maps that held them are rebuilt smaller.
func TestMemoryKVGivesMemoryBack(t *testing.T) {
	const flood = 200_000
	ctx := context.Background()
	clock := newFakeClock(windowStart)
	m := NewMemoryKV(WithClock(clock.Now))

	before := liveHeap()
	for i := range flood {
		key := fmt.Sprintf("ratelimit:global:10.%d.%d.%d", i>>16, (i>>8)&0xff, i&0xff)
		_, _ = m.Increment(ctx, key, windowStart, 2*time.Minute)
		if i%2 == 0 {
			_ = m.Put(ctx, key, []byte(`{"window":1,"count":1}`), 2*time.Minute)
		}
	}
	require.Equal(t, flood+flood/2, m.Len())
	full := liveHeap()

	// Two windows later every entry has expired; a new window's traffic sweeps every shard.
	clock.Advance(2*time.Minute + time.Duration(sweepEvery))
	for i := range 2000 {
		_, _ = m.Increment(ctx, fmt.Sprint("ratelimit:global:fresh-", i), windowStart.Add(3*time.Minute), 2*time.Minute)
		_ = m.Put(ctx, fmt.Sprint("ratelimit:auth:fresh-", i), []byte("x"), 2*time.Minute)
	}
	require.Equal(t, 4000, m.Len(), "only the fresh entries remain")
	after := liveHeap()
	runtime.KeepAlive(m) // measured while the store is still in use
	grown := full - before
	require.Less(t, after-min(after, before), grown/5,
		"heap before %d, full %d, after sweeping %d: the swept maps must give their memory back", before, full, after)
}
