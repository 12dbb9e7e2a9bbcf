package ratelimit

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSystemClockFollowsTimeNow: between two time.Now readings, the clock reads a time between
// them. The tolerance allows for the moment between time.Now's two readings (wall and monotonic)
// of the anchor, which a descheduled thread can stretch; the test runs long enough that a clock
// that did not advance, or advanced twice as fast, would fall outside it.
func TestSystemClockFollowsTimeNow(t *testing.T) {
	const tolerance = 5 * time.Millisecond
	var c systemClock
	for start := time.Now(); time.Since(start) < 4*tolerance; {
		before := time.Now()
		got := time.Unix(0, c.unixNano())
		after := time.Now()
		require.False(t, got.Before(before.Add(-tolerance)), "clock %v, time.Now before it %v", got, before)
		require.False(t, got.After(after.Add(tolerance)), "clock %v, time.Now after it %v", got, after)
	}
	require.WithinDuration(t, time.Now(), c.now(), time.Second)
}

// TestSystemClockReanchors: the anchor lasts reanchorEvery, then time.Now is read again. In a
// synctest bubble time.Now carries no monotonic reading, so the clock reads the bubble's time.
func TestSystemClockReanchors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c systemClock
		require.Equal(t, time.Now().UnixNano(), c.unixNano())
		first := c.anchor.Load()

		time.Sleep(reanchorEvery / 2)
		require.Equal(t, time.Now().UnixNano(), c.unixNano())
		require.Same(t, first, c.anchor.Load(), "within reanchorEvery the anchor stays")

		time.Sleep(reanchorEvery / 2)
		require.Equal(t, time.Now().UnixNano(), c.unixNano())
		second := c.anchor.Load()
		require.NotSame(t, first, second, "after reanchorEvery the clock reads time.Now again")
		require.Equal(t, time.Now().UnixNano(), second.unixNano)
	})
}
