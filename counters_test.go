package ratelimit

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkTable requires t to hold exactly the counters of model, each findable, and every slot's
// entry reachable from its home slot without crossing an empty slot.
func checkTable(tb testing.TB, t *counterTable, model map[counterKey]*counterEntry) {
	tb.Helper()
	require.Equal(tb, len(model), t.used, "used")
	for k, e := range model {
		require.Same(tb, e, t.lookup(k), "lookup of %v", k)
	}
	if t.slots == nil {
		require.Zero(tb, t.used)
		return
	}
	n := 0
	mask := len(t.slots) - 1
	for i, s := range t.slots {
		if s.e == nil {
			continue
		}
		n++
		for j := t.home(s.key); j != i; j = (j + 1) & mask {
			require.NotNil(tb, t.slots[j].e, "slot %d (home %d) is cut off by the empty slot %d", i, t.home(s.key), j)
		}
	}
	require.Equal(tb, t.used, n, "occupied slots")
	require.Less(tb, t.used*maxLoadDen, len(t.slots)*maxLoadNum+1, "load")
}

// TestCounterTableMatchesMap runs random inserts, lookups and sweeps against a Go map. Keys share
// a few home slots on purpose, so that probe sequences are long, wrap around the end of the
// table, and deletion must shift entries back across the wrap.
func TestCounterTableMatchesMap(t *testing.T) {
	for _, homes := range []uint64{1, 3, 16, 1 << 20} {
		rng := rand.New(rand.NewPCG(homes, 7))
		var table counterTable
		model := map[counterKey]*counterEntry{}
		key := func() counterKey {
			// hi picks the home slot: few distinct values, some near the table's end.
			return counterKey{hi: rng.Uint64N(homes) - homes/2, lo: rng.Uint64N(200)}
		}
		now := int64(0)
		for step := range 5000 {
			switch op := rng.IntN(10); {
			case op < 6:
				k := key()
				e := table.insert(k)
				if old, ok := model[k]; ok {
					require.Same(t, old, e, "step %d: insert of a present key returns its counter", step)
				} else {
					require.Zero(t, *e, "step %d: a new counter starts at zero", step)
					model[k] = e
				}
				e.expires = now + rng.Int64N(50)
			case op < 9:
				k := key()
				require.Same(t, model[k], table.lookup(k), "step %d", step)
			default:
				now += rng.Int64N(30)
				table.sweep(now)
				for k, e := range model {
					if e.expires <= now {
						delete(model, k)
					}
				}
			}
			checkTable(t, &table, model)
		}
	}
}

// TestCounterTableGivesMemoryBack: a table swept nearly empty is rebuilt small, and an empty one
// holds no slots at all.
func TestCounterTableGivesMemoryBack(t *testing.T) {
	var table counterTable
	model := map[counterKey]*counterEntry{}
	for i := range 10_000 {
		k := counterKey{hi: uint64(i) * 0x9e3779b97f4a7c15, lo: uint64(i)}
		e := table.insert(k)
		e.expires = 100
		if i%100 == 0 {
			e.expires = 200 // survives the first sweep
		}
		model[k] = e
	}
	require.Equal(t, 16384, len(table.slots), "10,000 counters at most 3/4 full")

	table.sweep(100)
	for k, e := range model {
		if e.expires <= 100 {
			delete(model, k)
		}
	}
	checkTable(t, &table, model)
	require.Equal(t, 256, len(table.slots), "100 counters left: rebuilt half full")

	table.sweep(200)
	require.Nil(t, table.slots)
	require.Zero(t, table.used)
	require.Nil(t, table.lookup(counterKey{hi: 1, lo: 1}))
}

// TestCounterKeysDiffer: the two hashes use different seeds, and different stores different
// seeds, so a collision in one hash is not one in the other.
func TestCounterKeysDiffer(t *testing.T) {
	a, b := NewMemoryKV(), NewMemoryKV()
	ka := counterKeyOfString(a.seedsOf(), "ratelimit:x:192.0.2.1")
	require.NotEqual(t, ka.hi, ka.lo)
	require.Equal(t, ka, counterKeyOfBytes(a.seedsOf(), []byte("ratelimit:x:192.0.2.1")), "string and bytes agree")
	require.NotEqual(t, ka, counterKeyOfString(b.seedsOf(), "ratelimit:x:192.0.2.1"), "stores have seeds of their own")
	var zero MemoryKV
	first := counterKeyOfString(zero.seedsOf(), "k")
	require.Equal(t, first, counterKeyOfString(zero.seedsOf(), "k"), "the zero value chooses its seeds once")
}
