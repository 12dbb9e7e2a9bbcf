package ratelimit

import (
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// counterKey identifies a MemoryKV counter: a 128-bit hash of its key under the store's two
// random seeds. The key itself is not kept. Two keys get one counter only if both 64-bit hashes
// collide, which for a billion keys happens with a probability near 10^-21, and an attacker who
// does not know the seeds cannot aim for it. Without the key text a counter takes less memory and
// a lookup no cache miss to compare text.
type counterKey struct {
	hi uint64 // picks the shard (top bits) and the table slot (bottom bits)
	lo uint64
}

func counterKeyOfBytes(seeds *[2]maphash.Seed, key []byte) counterKey {
	return counterKey{maphash.Bytes(seeds[0], key), maphash.Bytes(seeds[1], key)}
}

func counterKeyOfString(seeds *[2]maphash.Seed, key string) counterKey {
	return counterKey{maphash.String(seeds[0], key), maphash.String(seeds[1], key)}
}

// counterEntry is one counter. Entries live outside the table, each allocated when its key is
// first counted, and are updated under their own lock: counting a known client writes nothing
// but its own entry. (A shard-wide lock, written by every request, made two processors slower
// than one: measured.)
//
// Counters kept inside the table's slots instead were tried: a client met in random order then
// costs one cache miss, not two (26% faster there), but the slots of clients served by different
// processors sit side by side, and the processors' prefetchers pull each other's lines: 65%
// slower in the parallel benchmark without headers, 45% for 100,000 clients met in the order
// first seen (measured). Entries allocated one by one sit with the clients counted around the
// same time.
type counterEntry struct {
	key     counterKey // set before the entry is published, then never changed
	mu      sync.Mutex
	window  int64 // window start, Unix nanoseconds
	expires int64 // Unix nanoseconds; removedEntry once a sweep has taken the entry out
	count   int64
	// full and fullUntil are read without the lock ([counterEntry.exhausted]). They are written
	// under the lock, and only while the counter is marked or being marked (and full is cleared
	// when a new count starts), while the fields above are written on every request without
	// atomic stores, which cost more than the rest of a count (measured).
	full      atomic.Uint64 // a fullMark, or 0
	fullUntil atomic.Int64  // while full is set, expires
}

// fullMark records that a counter has reached a layer's limit in a window: the window's start in
// Unix seconds in the high 40 bits (until the year 36812), the limit in the low 24. Zero is no
// mark.
type fullMark uint64

const fullMarkLimitBits = 24

// makeFullMark returns the mark of limit requests in the window that starts at windowSec, or 0
// when either does not fit: such a layer counts every request under the counter's lock.
func makeFullMark(windowSec, limit int64) fullMark {
	if windowSec < 0 || windowSec >= 1<<(64-fullMarkLimitBits) || limit <= 0 || limit >= 1<<fullMarkLimitBits {
		return 0
	}
	return fullMark(uint64(windowSec)<<fullMarkLimitBits | uint64(limit))
}

func (m fullMark) windowSec() uint64 { return uint64(m) >> fullMarkLimitBits }
func (m fullMark) limit() int64      { return int64(uint64(m) & (1<<fullMarkLimitBits - 1)) }

// removedEntry marks an entry that a sweep took out of its table: whoever still holds it must
// look the key up again. No expiry computed by expiry equals it.
const removedEntry = math.MinInt64

// expiry returns now + ttl in Unix nanoseconds, saturated: a TTL too long to add ("forever")
// expires at the end of time, not in the past.
func expiry(now, ttl int64) int64 {
	if e := now + ttl; (ttl > 0) == (e > now) {
		return e
	}
	if ttl > 0 {
		return math.MaxInt64
	}
	return math.MinInt64 + 1
}

// add counts one request in window at now and returns the count, or false if the entry has been
// removed from its table. When the count reaches full's limit, in full's window, the entry is
// marked full (full is 0 for a caller without a limit, or one too large to mark), unless a mark
// of a higher limit in that window is there already.
//
// A request for the window just before the live count's (its goroutine read the clock just
// before the window turned, or its layer's clock lags) counts in the newer window: resetting it
// would restart the newer window's count. (A counter keeps one window only. The request passes
// if the newer window has room, even when its own was full.) Windows are ttl/2 long. Any other
// window replaces the count.
func (e *counterEntry) add(window, ttl, now int64, full fullMark) (int64, bool) {
	e.mu.Lock()
	if e.expires == removedEntry {
		e.mu.Unlock()
		return 0, false
	}
	live := e.count > 0 && e.expires > now
	switch {
	case live && window == e.window:
	case live && window < e.window && window >= e.window-ttl/2:
		full = 0 // its limit is of the older window
	default:
		e.window, e.count = window, 0
		// An expired counter may start again in the window it was marked in.
		if e.full.Load() != 0 {
			e.full.Store(0)
		}
	}
	e.count++
	e.expires = expiry(now, ttl)
	n := e.count
	// A mark holds while the count it records lives: a marked counter's expiry goes to fullUntil
	// whatever moves it (a count without a mark, a shorter TTL), or a denial could outlive it.
	marking := full != 0 && n >= full.limit()
	if (marking || e.full.Load() != 0) && e.fullUntil.Load() != e.expires {
		e.fullUntil.Store(e.expires) // before the mark: a reader of the mark sees it
	}
	if marking {
		if marked := fullMark(e.full.Load()); marked.windowSec() != full.windowSec() || marked.limit() < full.limit() {
			e.full.Store(uint64(full))
		}
	}
	e.mu.Unlock()
	return n, true
}

// exhausted reports, without the lock, whether e holds at least full's limit of requests in
// full's window at now, as marked by add: a request it denies then costs no write, and a flood
// from one client does not queue on one lock. A mark left by a layer with a higher limit in the
// same window counts too, since the count it records is higher still. A mark holds until the
// count it records expires, and a count in a new window, or after an expiry, clears it.
func (e *counterEntry) exhausted(full fullMark, now int64) bool {
	marked := fullMark(e.full.Load())
	return full != 0 && marked.windowSec() == full.windowSec() && marked.limit() >= full.limit() &&
		now < e.fullUntil.Load()
}

// countIn returns the count in window at now, or false if there is none.
func (e *counterEntry) countIn(window, now int64) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.expires == removedEntry || e.window != window || e.expires <= now {
		return 0, false
	}
	return e.count, true
}

// counterSlot is one slot of a counterTable. Readers load its fields without a lock, so both are
// atomic; the entry's own key is what decides a match, since the two fields may be read across a
// concurrent change.
type counterSlot struct {
	hi atomic.Uint64 // e.key.hi: spares a probe past another key the read of that entry
	e  atomic.Pointer[counterEntry]
}

// counterTable is an open-addressing hash table with linear probing, from counterKey to
// *counterEntry. Lookups take no lock ([counterTable.load]); inserting, resizing and sweeping
// happen under the shard's lock. A lookup that runs into a concurrent change may miss a present
// key, never find a wrong one: the caller then looks again under the lock.
//
// The table stays between 3/8 and 3/4 full while it grows, so a counter costs 21 to 43 bytes of
// table and its 64-byte entry. Deletion shifts entries back (no tombstones), and a table that
// sweeping has left less than 1/8 full is rebuilt at most half full, so that memory is given
// back.
type counterTable struct {
	slots atomic.Pointer[[]counterSlot] // a power of two long, or nil; never full
	used  int                           // entries in slots; guarded by the shard's lock
}

const (
	minCounterSlots = 8
	// A table grows when an insert would make it more than maxLoadNum/maxLoadDen full.
	maxLoadNum, maxLoadDen = 3, 4
	// A sweep that leaves a table less than 1/minLoadDen full rebuilds it at most half full.
	minLoadDen = 8
)

// load returns k's entry, or nil. It takes no lock, and may return nil for a present key while a
// writer changes the table.
func (t *counterTable) load(k counterKey) *counterEntry {
	p := t.slots.Load()
	if p == nil {
		return nil
	}
	slots := *p
	mask := len(slots) - 1
	// A table is never full, but a concurrent writer moves entries and empty slots: bound the
	// walk.
	for n, i := 0, int(k.hi)&mask; n < len(slots); n, i = n+1, (i+1)&mask {
		e := slots[i].e.Load()
		if e == nil {
			return nil
		}
		if slots[i].hi.Load() == k.hi && e.key == k {
			return e
		}
	}
	return nil
}

// find returns the index of k's slot, or of the empty slot where k belongs, in slots. The
// caller holds the shard's lock.
func find(slots []counterSlot, k counterKey) int {
	mask := len(slots) - 1
	for i := int(k.hi) & mask; ; i = (i + 1) & mask {
		if e := slots[i].e.Load(); e == nil || e.key == k {
			return i
		}
	}
}

// lookup is load for a caller that holds the shard's lock: it never misses.
func (t *counterTable) lookup(k counterKey) *counterEntry {
	p := t.slots.Load()
	if p == nil {
		return nil
	}
	return (*p)[find(*p, k)].e.Load()
}

// insert returns k's entry, adding a zero counter for k if there is none. The caller holds the
// shard's lock.
func (t *counterTable) insert(k counterKey) *counterEntry {
	var slots []counterSlot
	if p := t.slots.Load(); p != nil {
		slots = *p
	}
	if (t.used+1)*maxLoadDen > len(slots)*maxLoadNum {
		slots = t.resize(max(minCounterSlots, 2*len(slots)))
	}
	s := &slots[find(slots, k)]
	if e := s.e.Load(); e != nil {
		return e
	}
	e := &counterEntry{key: k}
	s.hi.Store(k.hi)
	s.e.Store(e) // publishes the entry, key included
	t.used++
	return e
}

// resize moves every entry into a new table of n slots (a power of two) and publishes it.
// Readers still walking the old table find the same entries there.
func (t *counterTable) resize(n int) []counterSlot {
	slots := make([]counterSlot, n)
	if p := t.slots.Load(); p != nil {
		for i := range *p {
			if e := (*p)[i].e.Load(); e != nil {
				s := &slots[find(slots, e.key)]
				s.hi.Store(e.key.hi)
				s.e.Store(e)
			}
		}
	}
	t.slots.Store(&slots)
	return slots
}

// deleteAt empties slot i and shifts back the entries after it that would otherwise no longer be
// found (Knuth's algorithm R for linear probing). An entry moves only to a lower slot of its
// cluster, never past an empty slot.
func deleteAt(slots []counterSlot, i int) {
	mask := len(slots) - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		e := slots[j].e.Load()
		if e == nil {
			break
		}
		// The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
		home := int(e.key.hi) & mask
		if (i < j && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			slots[i].hi.Store(e.key.hi)
			slots[i].e.Store(e)
			i = j
		}
	}
	slots[i].e.Store(nil)
	slots[i].hi.Store(0)
}

// sweep removes the entries that have expired at now and, when the table is left mostly empty,
// rebuilds it smaller. The caller holds the shard's lock.
func (t *counterTable) sweep(now int64) {
	p := t.slots.Load()
	if p == nil {
		return
	}
	slots := *p
	for i := range slots {
		// deleteAt may shift a later entry into slot i: look at the slot again. An entry moves
		// only into the slot being looked at, into a later one, or (when a cluster wraps past the
		// end) from slot 0 onward into a slot before it, among entries already looked at: none
		// is passed over.
		for {
			e := slots[i].e.Load()
			if e == nil || !e.removeIfExpired(now) {
				break
			}
			deleteAt(slots, i)
			t.used--
		}
	}
	switch {
	case t.used == 0:
		t.slots.Store(nil)
	case len(slots) > minCounterSlots && t.used*minLoadDen < len(slots):
		t.resize(max(minCounterSlots, 1<<bits.Len(uint(2*t.used-1))))
	}
}

// removeIfExpired marks e removed if it has expired at now, and reports whether it did.
func (e *counterEntry) removeIfExpired(now int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.expires > now {
		return false
	}
	e.expires = removedEntry
	return true
}
