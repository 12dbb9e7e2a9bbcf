package ratelimit

import (
	"hash/maphash"
	"math/bits"
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

// counterSlot is one slot of a counterTable.
type counterSlot struct {
	key counterKey
	e   *counterEntry // nil when the slot is empty
}

// counterEntry is a counter. Entries live outside the table, each allocated when its key is
// first counted: the table is then only read once a client is known, and an entry is allocated
// from the memory of the processor that created it, so the counters of clients served on
// different processors rarely share a cache line. Counters inside the table, next to those of
// other clients, made two processors slower than one (measured).
type counterEntry struct {
	window  int64 // window start, Unix nanoseconds
	expires int64 // Unix nanoseconds
	count   int64
}

// counterTable is an open-addressing hash table with linear probing, from counterKey to counter.
// Against a Go map keyed by the key text, a lookup compares no key text (a cache miss of its
// own) and the table holds 24 bytes per slot.
//
// It stays between 3/8 and 3/4 full while it grows, so a counter costs 32 to 64 bytes of table
// and its 24-byte entry. Deletion shifts entries back (no tombstones), and a table that sweeping
// has left less than 1/8 full is rebuilt half full, so that memory is given back.
type counterTable struct {
	slots []counterSlot // a power of two long, or nil; at least one slot is always empty
	used  int
}

const (
	minCounterSlots = 8
	// A table grows when an insert would make it more than maxLoadNum/maxLoadDen full.
	maxLoadNum, maxLoadDen = 3, 4
	// A table shrinks to half full after a sweep that leaves it less than 1/minLoadDen full.
	minLoadDen = 8
)

// home returns the slot where k's probe sequence starts.
func (t *counterTable) home(k counterKey) int { return int(k.hi) & (len(t.slots) - 1) }

// find returns the slot that holds k, or the empty slot where k belongs. The table must not be
// nil.
func (t *counterTable) find(k counterKey) *counterSlot {
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == k || s.e == nil {
			return s
		}
	}
}

// lookup returns k's counter, or nil.
func (t *counterTable) lookup(k counterKey) *counterEntry {
	if t.slots == nil {
		return nil
	}
	return t.find(k).e
}

// insert returns k's counter, adding a zero counter for k if there is none.
func (t *counterTable) insert(k counterKey) *counterEntry {
	if (t.used+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.resize(max(minCounterSlots, 2*len(t.slots)))
	}
	s := t.find(k)
	if s.e == nil {
		*s = counterSlot{key: k, e: new(counterEntry)}
		t.used++
	}
	return s.e
}

// resize moves every counter into a new table of n slots (a power of two).
func (t *counterTable) resize(n int) {
	old := t.slots
	t.slots = make([]counterSlot, n)
	for i := range old {
		if old[i].e != nil {
			*t.find(old[i].key) = old[i]
		}
	}
}

// deleteAt empties slot i and shifts back the entries after it that would otherwise no longer be
// found (Knuth's algorithm R for linear probing). An entry moves only to a lower slot of its
// cluster, never past an empty slot.
func (t *counterTable) deleteAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].e != nil; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
		home := t.home(t.slots[j].key)
		if (i < j && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = counterSlot{}
	t.used--
}

// sweep deletes the counters that have expired at now and, when the table is left mostly empty,
// rebuilds it smaller.
func (t *counterTable) sweep(now int64) {
	if t.used == 0 {
		t.slots = nil
		return
	}
	for i := range t.slots {
		// deleteAt may shift a later entry into slot i: look at the slot again. Entries move
		// only into the slot being looked at or into later ones, so none is passed over.
		for t.slots[i].e != nil && t.slots[i].e.expires <= now {
			t.deleteAt(i)
		}
	}
	switch {
	case t.used == 0:
		t.slots = nil
	case len(t.slots) > minCounterSlots && t.used*minLoadDen < len(t.slots):
		t.resize(max(minCounterSlots, 1<<bits.Len(uint(2*t.used-1))))
	}
}
