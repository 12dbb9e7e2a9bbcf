package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// systemClock is the default clock of a layer: the system clock to the whole second, kept in an
// atomic that a timer advances at each new second while the layer is in use. A request reads
// the clock with one atomic load, where time.Now costs 30 to 60 ns on a virtual machine; nginx's
// limit_req reads a cached clock the same way.
//
// Whole seconds lose nothing the limiter reports. Windows are whole seconds long and start at
// whole seconds, and the headers give the seconds left rounded up, which for a window ending at
// the whole second end and a time t is end-floor(t) exactly. What the coarse clock changes is
// when a new second starts: the timer's latency after the second begins (microseconds; on a
// saturated machine, milliseconds), as if the requests of that moment had arrived that much
// earlier.
//
// The timer runs only while the layer is used: at a new second that found no reading in the
// second before, it stops, and the next reading reads time.Now and starts it again. A layer left
// idle holds no timer and no goroutine after two seconds; a stopped clock costs its next reading
// about a microsecond. The timer counts monotonic time, so after the machine is suspended, or the
// system clock is stepped, the clock follows within a second.
//
// Layers that count in one MemoryKV share the store's clock: they agree on the second, and a
// counter that two layers of one scope share never moves back and forth between two windows
// while one layer's timer has fired and the other's has not.
//
// Inside a testing/synctest bubble the clock never starts its timer and reads time.Now every
// time: a timer belongs to the bubble that made it, and a layer shared between bubbles (or with
// code outside them) must not be left with a clock that only a finished bubble could advance.
// The check is made when the clock starts: a layer whose timer runs, started outside a bubble,
// gives code inside one the real second, and so does a MemoryKV's shared clock to a layer made
// inside a bubble.
type systemClock struct {
	sec  atomic.Int64 // the current Unix second while the timer runs; 0 while it is stopped
	used atomic.Bool  // read since the timer last fired

	mu    sync.Mutex  // serialises starting, advancing and stopping
	timer *time.Timer // nil until the clock first starts; guarded by mu

	// Replaced by tests only.
	timeNow func() time.Time     // time.Now
	canTick func(time.Time) bool // false inside a synctest bubble
}

// unixSec returns the time in whole Unix seconds.
func (c *systemClock) unixSec() int64 {
	if s := c.sec.Load(); s != 0 {
		if !c.used.Load() {
			c.used.Store(true)
		}
		return s
	}
	return c.start()
}

// now returns the time, to the whole second.
func (c *systemClock) now() time.Time { return time.Unix(c.unixSec(), 0) }

// start reads the system clock, and starts the timer unless another reading already has.
func (c *systemClock) start() int64 {
	if now := c.readTime(); !c.ticks(now) {
		return now.Unix()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sec.Load(); s != 0 {
		return s // started by another reading meanwhile
	}
	// Read again under the lock: a reading taken before it may be older than the second that
	// another start and a stopping tick left behind, and the clock must not go back on its own
	// (only with a step back of the system clock, which each tick follows).
	now := c.readTime()
	c.used.Store(true) // this reading is a use: the clock runs for the next second at least
	c.advance(now)
	return now.Unix()
}

// tick runs when a new second begins: it advances the clock, or stops it if nothing read it in
// the second before.
func (c *systemClock) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.used.Swap(false) {
		c.sec.Store(0)
		return
	}
	c.advance(c.readTime())
}

// advance sets the clock to now and arms the timer for the next second. c.mu must be held.
func (c *systemClock) advance(now time.Time) {
	c.sec.Store(now.Unix())
	untilNext := time.Second - time.Duration(now.Nanosecond())
	if c.timer == nil {
		c.timer = time.AfterFunc(untilNext, c.tick)
		return
	}
	// The timer is idle here: tick re-arms it from its own callback, and start only after a
	// tick stopped the clock (under c.mu, so that tick has finished). One timer, one chain.
	c.timer.Reset(untilNext)
}

func (c *systemClock) readTime() time.Time {
	if c.timeNow != nil {
		return c.timeNow()
	}
	return time.Now()
}

func (c *systemClock) ticks(now time.Time) bool {
	if c.canTick != nil {
		return c.canTick(now)
	}
	return hasMonotonic(now)
}

// hasMonotonic reports whether t carries a monotonic clock reading, which time.Now always gives
// except inside a testing/synctest bubble. Round(0) strips the reading and nothing else.
func hasMonotonic(t time.Time) bool { return t != t.Round(0) }
