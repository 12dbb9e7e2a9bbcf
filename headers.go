package ratelimit

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// Handler is the middleware: it counts each request, sets the rate-limit headers, and passes the
// request to next, or answers 429 (or 503 when the store fails and FailClosed is set). A disabled
// layer, or one without a store, returns next itself; so does a nil or zero Limiter, which New
// did not build, after logging an error.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	if l == nil || l.keyPrefix == "" {
		slog.Error("ratelimit: Handler of a Limiter that New did not build (nil, or a zero value): " +
			"it limits nothing; build layers with New or NewLayers")
		return next
	}
	if !l.counting {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sec, nsec := l.unixNow()
		var rh responseHeaders
		if l.allowValues > 0 {
			rh.h = w.Header() // allowAt may start on the headers (startHeaders)
		}
		res, err := l.allowAt(r, sec, nsec, l.memNow, &rh)
		if err != nil {
			l.report(r, err)
		}
		// Not counted. allowAt starts the headers only of a request it counts in a MemoryKV,
		// which always has Limit > 0: rh holds no arena here.
		if res.Limit == 0 {
			if res.Allowed {
				next.ServeHTTP(w, r)
				return
			}
			a := l.arenas.Get().(*headerArena)
			rh := responseHeaders{h: w.Header(), vals: a.values(plainValues)}
			l.arenas.Put(a)
			writePlain(w, &rh, http.StatusServiceUnavailable, unavailableBody)
			return
		}
		if l.allowValues > 0 {
			if rh.arena == nil {
				l.startHeaders(&rh)
			}
			l.finishHeaders(&rh, res, sec, nsec)
		}
		if res.Allowed {
			if rh.arena != nil {
				l.arenas.Put(rh.arena)
			}
			next.ServeHTTP(w, r)
			return
		}
		if rh.arena == nil {
			h := w.Header()
			rh = responseHeaders{h: h, arena: l.arenas.Get().(*headerArena), empty: len(h) == 0}
		}
		rh.vals = rh.arena.values(deniedValues)
		rh.set("Retry-After", l.secondValues(ceilSeconds(res.RetryAfter)).retryAfter)
		l.arenas.Put(rh.arena)
		rh.arena = nil // another goroutine's now: writePlain only sets, into rh.vals
		if l.deny != nil {
			l.deny(w, r, res)
			return
		}
		writePlain(w, &rh, http.StatusTooManyRequests, tooManyBody)
	})
}

var (
	tooManyBody     = []byte("Too Many Requests\n")
	unavailableBody = []byte("Service Unavailable\n")
)

// plainValues is how many header values writePlain sets: Content-Type and X-Content-Type-Options.
const plainValues = 2

// deniedValues is how many header values a denied response gets beyond the rate-limit headers:
// Retry-After, and those of writePlain.
const deniedValues = 1 + plainValues

func writePlain(w http.ResponseWriter, rh *responseHeaders, status int, body []byte) {
	rh.set("Content-Type", "text/plain; charset=utf-8")
	rh.set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// headerArena hands out the memory of header values, so that a response's headers cost no
// allocation of their own: a layer's responses take their value slices and value text from large
// blocks, allocated once per some hundred responses. A block is never written twice: every
// response gets slices and text of its own, and a handler that edits its headers in place cannot
// change another response's.
//
// An arena is used by one goroutine at a time (the layer keeps them in a sync.Pool); the blocks
// it has handed out are shared, read-only, with the responses that hold parts of them.
type headerArena struct {
	// A block of values, and a block of text, each handed out up to its used count. Counts, not
	// re-sliced blocks, mark the progress, so that a request writes a pointer into the arena (a
	// write barrier while the garbage collector marks) only when it starts a block.
	vals     []string
	valsUsed int
	text     []byte // len == cap
	textUsed int
	// Each request writes its arena: keep two arenas, used on two processors, off one cache line.
	_ [cacheLine]byte
}

// cacheLine is the size of a CPU cache line, or a multiple of it.
const cacheLine = 64

// Sizes of an arena's blocks. A block is kept alive by any header value cut from it, so they are
// small: a handler that keeps one value keeps at most one block.
const (
	arenaValues = 128
	arenaText   = 4096
	// maxValueText bounds the text of one header value the arena builds: the longest is a
	// RateLimit value, `"` + scope (64) + `";r=` + remaining (20) + `;t=` + seconds (20).
	maxValueText = 1 + 64 + 4 + 20 + 3 + 20
)

// values returns an empty slice with room for exactly n values.
func (a *headerArena) values(n int) []string {
	if len(a.vals)-a.valsUsed < n {
		a.vals = make([]string, max(n, arenaValues))
		a.valsUsed = 0
	}
	i := a.valsUsed
	a.valsUsed = i + n
	return a.vals[i : i : i+n]
}

// textBuffer returns the arena's text block with room for a value of up to maxValueText bytes
// after len; the caller appends the value and passes the block to string.
func (a *headerArena) textBuffer() []byte {
	if len(a.text)-a.textUsed < maxValueText {
		a.text = make([]byte, arenaText)
		a.textUsed = 0
	}
	return a.text[:a.textUsed]
}

// string takes text[start:] as a string that shares the block, as strings.Builder does: the bytes
// are never written again, because the arena only appends after them, into a block's unused
// capacity, or starts a new block. text is the block that textBuffer returned, extended in place.
func (a *headerArena) string(text []byte, start int) string {
	// A value that outgrew the room left in the block made append move text to a larger array:
	// len(text) then exceeds the block, and the next textBuffer starts a block of its own.
	a.textUsed = len(text)
	return unsafe.String(&text[start], len(text)-start)
}

// responseHeaders writes one response's headers into h, each value with a one-element slice of
// its own cut from vals.
type responseHeaders struct {
	h    http.Header
	vals []string
	// arena supplies the slice of a value added to values that an outer layer already set.
	arena *headerArena
	// empty tells that h held nothing before this layer's values, the common case: there are no
	// earlier values to look up.
	empty bool
}

// set replaces the values of name with value. Header names are given in canonical form, so no
// per-request canonicalisation is needed.
func (rh *responseHeaders) set(name, value string) {
	rh.vals = append(rh.vals, value)
	n := len(rh.vals)
	rh.h[name] = rh.vals[n-1 : n : n]
}

// add appends value to the values of name. RateLimit and RateLimit-Policy are lists: when two
// layers count one request, the client sees both policies and both counts.
func (rh *responseHeaders) add(name, value string) {
	if !rh.empty {
		if old := rh.h[name]; len(old) > 0 {
			// A slice of its own, not old's spare capacity, which another response may share.
			vals := append(rh.arena.values(len(old)+1), old...)
			rh.h[name] = append(vals, value)
			return
		}
	}
	rh.set(name, value)
}

// startHeaders takes an arena and sets the rate-limit headers of a counted request that do not
// depend on its count: RateLimit-Policy. rh.h is the response's header map; rh gets room for the
// values of an allowed response.
func (l *Limiter) startHeaders(rh *responseHeaders) {
	a := l.arenas.Get().(*headerArena)
	*rh = responseHeaders{h: rh.h, vals: a.values(l.allowValues), arena: a, empty: len(rh.h) == 0}
	if l.headers == HeadersStandard || l.headers == HeadersBoth {
		rh.add("Ratelimit-Policy", l.policyValue)
	}
}

// finishHeaders sets the rate-limit headers that depend on the count, decided at sec and nsec of
// Unix time: RateLimit, and the legacy trio.
func (l *Limiter) finishHeaders(rh *responseHeaders, res Result, sec, nsec int64) {
	resetSec := ceilSeconds(res.Reset)
	if l.headers == HeadersStandard || l.headers == HeadersBoth {
		var rateLimit string
		if res.Remaining == 0 {
			rateLimit = l.secondValues(resetSec).exhausted
		} else {
			rateLimit = l.rateLimitValue(rh.arena, res.Remaining, resetSec)
		}
		rh.add("Ratelimit", rateLimit)
	}
	if l.headers == HeadersLegacy || l.headers == HeadersBoth {
		// The legacy trio holds one policy: keep the most restrictive layer's.
		if old := rh.h["X-Ratelimit-Remaining"]; len(old) > 0 {
			if n, err := strconv.Atoi(old[0]); err == nil && n <= res.Remaining {
				return
			}
		}
		a := rh.arena
		rh.set("X-Ratelimit-Limit", l.limitValue)
		text := a.textBuffer()
		start := len(text)
		rh.set("X-Ratelimit-Remaining", a.string(strconv.AppendInt(text, int64(res.Remaining), 10), start))
		text = a.textBuffer()
		start = len(text)
		rh.set("X-Ratelimit-Reset", a.string(strconv.AppendInt(text, sec+(nsec+int64(res.Reset))/int64(time.Second), 10), start))
	}
}

// appendRateLimit appends the value of the RateLimit header: "scope";r=remaining;t=resetSec.
func (l *Limiter) appendRateLimit(dst []byte, remaining int, resetSec int64) []byte {
	dst = append(dst, l.rateLimitPrefix...)
	dst = strconv.AppendInt(dst, int64(remaining), 10)
	return append(dst, l.secondValues(resetSec).rateLimitSuffix...)
}

// rateLimitText is a RateLimit value of the layer's cache.
type rateLimitText struct {
	remaining int
	resetSec  int64
	value     string
}

// rateLimitTextSlots is the size of a layer's cache of RateLimit values.
const rateLimitTextSlots = 256

// rateLimitValue returns the RateLimit value for remaining and resetSec. The value depends on
// these two numbers only, and in a busy second many clients share them, so the layer caches
// values by remaining count. A value is cached when it is needed a second time while its slot
// last missed on it: a single busy client, whose remaining count changes with every request,
// then costs the cache nothing, and neither does it evict the values many clients share.
func (l *Limiter) rateLimitValue(a *headerArena, remaining int, resetSec int64) string {
	slot := uint(remaining) % rateLimitTextSlots
	if v := l.rateLimitTexts[slot].Load(); v != nil && v.remaining == remaining && v.resetSec == resetSec {
		return v.value
	}
	text := a.textBuffer()
	start := len(text)
	value := a.string(l.appendRateLimit(text, remaining, resetSec), start)
	// Any collision of this tag only caches a value early.
	tag := int64(remaining)<<32 ^ resetSec
	if l.rateLimitMisses[slot].Swap(tag) == tag {
		// A copy of its own, so that the cache does not keep the arena's blocks alive.
		l.rateLimitTexts[slot].Store(&rateLimitText{remaining: remaining, resetSec: resetSec, value: strings.Clone(value)})
	}
	return value
}

// secondsLeftValues are the header texts that depend only on the seconds left in the window.
type secondsLeftValues struct {
	resetSec        int64
	rateLimitSuffix string // of RateLimit: ";t=resetSec"
	exhausted       string // RateLimit with nothing remaining: "scope";r=0;t=resetSec
	retryAfter      string // Retry-After: resetSec
}

// secondValues returns the texts for resetSec, building them once per second of the window,
// so that a flood of denied requests builds no header text and an allowed one builds only the
// remaining count.
func (l *Limiter) secondValues(resetSec int64) *secondsLeftValues {
	if v := l.lastSecond.Load(); v != nil && v.resetSec == resetSec {
		return v
	}
	v := &secondsLeftValues{
		resetSec:        resetSec,
		rateLimitSuffix: ";t=" + strconv.FormatInt(resetSec, 10),
		retryAfter:      strconv.FormatInt(resetSec, 10),
	}
	v.exhausted = l.rateLimitPrefix + "0" + v.rateLimitSuffix
	l.lastSecond.Store(v)
	return v
}
