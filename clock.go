package ratelimit

import (
	"sync/atomic"
	"time"
)

// reanchorEvery is how long one reading of the system clock serves as the anchor of monotonic
// time.
const reanchorEvery = time.Second

// systemClock is the default clock of a layer: the wall-clock time, read with time.Now once a
// second and advanced in between by the monotonic clock. time.Now reads both clocks; reading the
// monotonic clock alone costs half as much (about 30 ns against 60 on a virtual machine), and the
// clock is read on every request.
//
// The two agree while the system clock runs, since NTP slews the monotonic clock at the rate of
// the wall clock. Only a step of the wall clock (settimeofday, a virtual machine resumed from a
// snapshot) or a suspension of the machine, which the monotonic clock does not count, separates
// them, and then for at most reanchorEvery of monotonic time. Each layer has its own anchor, so
// two layers may disagree for that second; nothing else notices.
type systemClock struct {
	anchor atomic.Pointer[clockAnchor]
}

type clockAnchor struct {
	at       time.Time // a time.Now reading, with its monotonic clock reading
	unixNano int64     // at in Unix nanoseconds
}

// unixNano returns the time in Unix nanoseconds.
func (c *systemClock) unixNano() int64 {
	a := c.anchor.Load()
	if a != nil {
		// time.Since of a time.Now reading reads only the monotonic clock.
		if d := time.Since(a.at); 0 <= d && d < reanchorEvery {
			return a.unixNano + int64(d)
		}
	}
	t := time.Now()
	// Of the callers that found the anchor old at once, one replaces it; none puts an older
	// reading back.
	c.anchor.CompareAndSwap(a, &clockAnchor{at: t, unixNano: t.UnixNano()})
	return t.UnixNano()
}

// now returns the time.
func (c *systemClock) now() time.Time { return time.Unix(0, c.unixNano()) }
