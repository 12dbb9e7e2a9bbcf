package ratelimit

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSystemClockFollowsTimeNow: outside a synctest bubble the clock starts its timer and reads
// the second of time.Now. A reading may lag a new second by the timer's latency; the tolerance
// is generous for a loaded machine, and the timing itself is tested in a bubble below.
func TestSystemClockFollowsTimeNow(t *testing.T) {
	const tolerance = time.Second
	var c systemClock
	for start := time.Now(); time.Since(start) < 20*time.Millisecond; {
		before := time.Now()
		got := c.unixSec()
		after := time.Now()
		require.LessOrEqual(t, before.Add(-tolerance).Unix(), got)
		require.LessOrEqual(t, got, after.Unix())
	}
	c.mu.Lock()
	started := c.timer != nil
	c.mu.Unlock()
	require.True(t, started, "outside a bubble the clock runs on its timer")
	require.NotZero(t, c.sec.Load())
}

// TestSystemClockTicks drives the timer in a synctest bubble, where it fires exactly on time: the
// clock reads whole seconds, moves at each new second, follows a step of the system clock,
// stops after a second without readings and starts again at the next reading.
func TestSystemClockTicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var step atomic.Int64 // added to time.Now: a step of the system clock
		c := systemClock{
			canTick: func(time.Time) bool { return true },
			timeNow: func() time.Time { return time.Now().Add(time.Duration(step.Load())) },
		}
		time.Sleep(300 * time.Millisecond) // mid-second
		t0 := time.Now().Unix()
		require.Equal(t, t0, c.unixSec())
		require.Equal(t, t0, c.sec.Load(), "the first reading starts the clock")

		sleepUntil(t0 + 1) // exactly the new second: the tick has run, no later
		require.Equal(t, t0+1, c.sec.Load())
		require.Equal(t, time.Unix(t0+1, 0), c.now())

		// Read in second t0+1, then idle: the tick at t0+2 advances (the second before was
		// read), the tick at t0+3 stops the clock.
		sleepUntil(t0 + 2)
		require.Equal(t, t0+2, c.sec.Load())
		sleepUntil(t0 + 3)
		require.Zero(t, c.sec.Load(), "a second without readings stops the clock")

		time.Sleep(1500 * time.Millisecond) // t0+4.5
		require.Equal(t, t0+4, c.unixSec(), "the next reading reads time.Now")
		require.Equal(t, t0+4, c.sec.Load(), "and starts the clock again")
		sleepUntil(t0 + 5)
		require.Equal(t, t0+5, c.sec.Load(), "the reading that started it counts as a use")

		step.Store(int64(time.Hour)) // the system clock is set an hour ahead
		require.Equal(t, t0+5, c.unixSec())
		sleepUntil(t0 + 6)
		require.Equal(t, t0+6+3600, c.unixSec(), "each tick reads the system clock")

		time.Sleep(3 * time.Second) // let it stop, so that the bubble ends with no timer
		require.Zero(t, c.sec.Load())
	})
}

// sleepUntil sleeps until Unix second sec of the bubble's clock and lets the timers due then
// run.
func sleepUntil(sec int64) {
	time.Sleep(time.Until(time.Unix(sec, 0)))
	synctest.Wait()
}

// TestSystemClockNeverGoesBack: a reading that read the system clock and was then held up while
// another reading started the clock and the clock stopped again must not set its old second.
func TestSystemClockNeverGoesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var stallNext atomic.Bool
		release := make(chan struct{})
		c := systemClock{
			canTick: func(time.Time) bool { return true },
			timeNow: func() time.Time {
				now := time.Now()
				if stallNext.Swap(false) {
					<-release
				}
				return now
			},
		}
		t0 := time.Now().Unix()
		stallNext.Store(true)
		late := make(chan int64)
		go func() { late <- c.unixSec() }() // reads t0, then stalls
		synctest.Wait()

		time.Sleep(1500 * time.Millisecond)
		require.Equal(t, t0+1, c.unixSec()) // starts the clock
		time.Sleep(3 * time.Second)         // and it stops again
		require.Zero(t, c.sec.Load())

		close(release)
		require.Equal(t, t0+4, <-late)
		require.Equal(t, t0+4, c.sec.Load(), "the clock holds the current second, not the stalled reading's")
		time.Sleep(3 * time.Second)
	})
}

// TestSystemClockInBubble: inside a synctest bubble the default clock makes no timer (it would
// belong to the bubble) and reads time.Now every time, so that a layer's windows follow the
// bubble's fake time exactly.
func TestSystemClockInBubble(t *testing.T) {
	require.True(t, hasMonotonic(time.Now()))
	synctest.Test(t, func(t *testing.T) {
		require.False(t, hasMonotonic(time.Now()))
		l := newLimiter(t, Options{Scope: "bubble", Max: 2, Window: time.Second, Store: NewMemoryKV()})
		h := l.Handler(okHandler)
		serve := func() int { return serve(h, newRequest("/", "192.0.2.1:1234")).Code }
		time.Sleep(999 * time.Millisecond)
		require.Equal(t, 200, serve())
		require.Equal(t, 200, serve())
		require.Equal(t, 429, serve())
		time.Sleep(time.Millisecond) // the next window, to the nanosecond
		require.Equal(t, 200, serve())
		l.clock.mu.Lock()
		defer l.clock.mu.Unlock()
		require.Nil(t, l.clock.timer)
		require.Zero(t, l.clock.sec.Load())
	})
}

// TestSystemClockConcurrent races readings against ticks that stop and start the clock: under
// -race this checks the synchronisation, and every goroutine's readings must never go back. The
// clock's time is fake: a second passes per time.Now, which reads 1 ms before a new second, so
// the timer fires after a millisecond; one reader leaves gaps, all of them now and then, so the
// clock stops and starts again many times.
func TestSystemClockConcurrent(t *testing.T) {
	var fake, starts atomic.Int64
	fake.Store(1_800_000_000)
	c := systemClock{
		timeNow: func() time.Time { return time.Unix(fake.Add(1), int64(time.Second-time.Millisecond)) },
		canTick: func(time.Time) bool { starts.Add(1); return true },
	}
	var wg sync.WaitGroup
	var backwards atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			last := int64(0)
			for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
				got := c.unixSec()
				if got < last {
					backwards.Add(1)
				}
				last = got
				if g == 0 || time.Since(start)%(20*time.Millisecond) < 10*time.Millisecond {
					time.Sleep(3 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, backwards.Load(), "readings that went back")
	require.Greater(t, starts.Load(), int64(3), "the clock stopped and started again")
	require.Greater(t, fake.Load()-starts.Load(), int64(1_800_000_010), "the timer ticked")
}

// TestDefaultClockWholeSeconds: with the default clock a Result's Reset is whole seconds, the most
// that can be left in the window.
func TestDefaultClockWholeSeconds(t *testing.T) {
	l := newLimiter(t, Options{Scope: "whole", Max: 5, Window: time.Minute, Store: NewMemoryKV()})
	before := time.Now()
	res, err := l.Allow(newRequest("/", "192.0.2.1:1234"))
	require.NoError(t, err)
	require.Zero(t, res.Reset%time.Second)
	exact := time.Unix(before.Unix()/60*60+60, 0).Sub(before)
	require.GreaterOrEqual(t, res.Reset, exact-time.Second, "lags by at most the timer")
	require.LessOrEqual(t, res.Reset, exact+time.Second)
}

// TestLayersShareTheMemoryKVClock: layers counting in one MemoryKV read one clock, so that they
// agree on the second (a counter shared by two layers of one scope is never moved back and forth
// between windows at a new second) and share one timer. A layer on another store has its own.
func TestLayersShareTheMemoryKVClock(t *testing.T) {
	mem := NewMemoryKV()
	auth := newLimiter(t, Options{Scope: "auth", Max: 5, Window: time.Minute, Store: mem})
	global := newLimiter(t, Options{Scope: "global", Max: 5, Window: time.Minute, Store: mem})
	require.Same(t, &mem.layerClock, auth.clock)
	require.Same(t, &mem.layerClock, global.clock)

	remote := newLimiter(t, Options{Scope: "remote", Max: 5, Window: time.Minute, Store: &counterStore{mem: NewMemoryKV()}})
	require.Same(t, &remote.ownedClock, remote.clock)

	_, err := auth.Allow(newRequest("/", "192.0.2.1:1234"))
	require.NoError(t, err)
	require.NotZero(t, mem.layerClock.sec.Load(), "the layer reads the store's clock")
}

// TestLayerReadsTheMemoryKVsInjectedClock: a test that gives only the MemoryKV its clock moves
// the layer's windows with it; a layer's own Now still wins.
func TestLayerReadsTheMemoryKVsInjectedClock(t *testing.T) {
	now := time.Unix(1_800_000_045, 0) // 15 s before a minute ends
	mem := NewMemoryKV(WithClock(func() time.Time { return now }))
	l := newLimiter(t, Options{Scope: "login", Max: 1, Window: time.Minute, Store: mem})
	r := newRequest("/", "192.0.2.1:1234")

	res, err := l.Allow(r)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Equal(t, 15*time.Second, res.Reset)
	res, err = l.Allow(r)
	require.NoError(t, err)
	require.False(t, res.Allowed)

	now = now.Add(time.Minute)
	res, err = l.Allow(r)
	require.NoError(t, err)
	require.True(t, res.Allowed, "the next window, on the store's clock")

	own := time.Unix(1_800_000_010, 0)
	mine := newLimiter(t, Options{Scope: "mine", Max: 1, Window: time.Minute, Store: mem, Now: func() time.Time { return own }})
	res, err = mine.Allow(r)
	require.NoError(t, err)
	require.Equal(t, 50*time.Second, res.Reset, "Options.Now wins")
}

// TestInjectedClockIsReadOncePerRequest: a layer on a MemoryKV's injected clock reads it once a
// request, and the store takes that reading instead of reading the clock again.
func TestInjectedClockIsReadOncePerRequest(t *testing.T) {
	var reads int
	mem := NewMemoryKV(WithClock(func() time.Time { reads++; return time.Unix(1_800_000_000, 0) }))
	h := newLimiter(t, Options{Scope: "api", Max: 5, Window: time.Minute, Store: mem}).Handler(okHandler)
	serve(h, newRequest("/", "192.0.2.1:1"))
	reads = 0
	serve(h, newRequest("/", "192.0.2.1:1"))
	require.Equal(t, 1, reads)
}
