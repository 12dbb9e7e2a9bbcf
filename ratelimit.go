// Package ratelimit is a fixed-window rate limiter for net/http servers: a counter per layer
// ("scope") and client, kept in a key-value store under "ratelimit:{scope}:{client}" with a TTL of
// twice the window. A request over the limit gets 429 Too Many Requests with Retry-After.
//
// A [Limiter] is one layer. [Limiter.Allow] decides; [Limiter.Handler] is the middleware, a
// func(http.Handler) http.Handler that turns the decision into headers and a status. [NewLayers]
// builds the two layers of the seed design (auth and global) from a [Config], which
// [ConfigFromEnv] reads from RATE_LIMIT_* variables.
//
// Counters live in a [KV] (Get and Put with a TTL, as Cloudflare Workers KV offers) or, exactly,
// in a store that also implements [Counter]. [MemoryKV] is the in-process store of both kinds;
// the subpackages cloudflarekv and redisstore hold the shared stores.
package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Errors the limiter reports through [Options.OnError] and returns from [Limiter.Allow]; test
// with [errors.Is].
var (
	// ErrStoreFailed marks a store call that failed or ran past [Options.StoreTimeout]. The
	// request then follows the failure policy (see [Options.FailClosed]).
	ErrStoreFailed = errors.New("ratelimit: store failed")
	// ErrCorruptValue marks a stored value that is not the seed's JSON
	// {"window":<unix seconds>,"count":<n>}. The request is counted as the first of a fresh
	// window and the value is overwritten.
	ErrCorruptValue = errors.New("ratelimit: corrupt stored value")
)

// HeaderStyle chooses the rate-limit headers a layer adds to the responses it counts.
type HeaderStyle int

const (
	// HeadersStandard, the zero value, sends RateLimit-Policy and RateLimit as in
	// draft-ietf-httpapi-ratelimit-headers, for example `RateLimit-Policy: "auth";q=30;w=60`
	// and `RateLimit: "auth";r=0;t=37`.
	HeadersStandard HeaderStyle = iota
	// HeadersLegacy sends only X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset
	// (the Unix time, in seconds, at which the window ends).
	HeadersLegacy
	// HeadersBoth sends the standard and the legacy headers.
	HeadersBoth
	// HeadersNone sends no rate-limit headers; a 429 still carries Retry-After.
	HeadersNone
)

// Defaults applied by [New] to zero-valued [Options] fields.
const (
	DefaultStoreTimeout   = 500 * time.Millisecond
	DefaultIPv6PrefixBits = 64
)

// maxWindowSeconds bounds a window to 365 days, far from any overflow of twice the window.
const maxWindowSeconds = 365 * 24 * 60 * 60

// Options configures one layer. The zero value of every field but Scope, Max and Window is a
// documented default.
type Options struct {
	// Scope names the layer in its store keys ("ratelimit:{Scope}:{client}") and in its
	// headers. Required: 1 to 64 letters, digits, '-', '_' or '.'. Layers that share a store and
	// a scope share their counters, as in the seed: give each layer a scope of its own, or the
	// same Window, since a counter keeps one window at a time. New logs a warning when a layer's
	// scope had another window in the same [MemoryKV]; other stores cannot tell.
	Scope string
	// Max is how many requests one client may make per window. Zero or less disables the
	// layer: every request passes, uncounted.
	Max int
	// Window is the length of the fixed window: a whole number of seconds, from 1s to 365 days.
	// Windows are aligned to the Unix epoch, so every instance agrees on when one starts.
	Window time.Duration
	// Paths, when not empty, restricts the layer to requests whose path matches one of these
	// patterns. A pattern is exact ("/login") or a prefix ("/assets/*" matches "/assets" and
	// everything below it); "/*" matches everything. Paths are cleaned before matching, so
	// "/login/", "//login" and "/x/../login" all match "/login".
	Paths []string
	// ExemptPaths are never counted, even when they match Paths. Same patterns as Paths.
	ExemptPaths []string
	// Store keeps the counters. When it also implements [Counter], counting is atomic and exact;
	// otherwise the limiter reads, then writes the seed's JSON value. Nil, or a nil pointer, means
	// the layer fails open: it passes every request, and New logs one warning.
	Store KV
	// ClientIP finds the client's address. Default: [RemoteAddrIP], which believes no header.
	// With the default, the layer logs one warning when a request from a loopback, private or
	// shared (100.64.0.0/10) address or a Unix socket, or from Cloudflare with
	// CF-Connecting-IP, carries a forwarding header (it looks at a client's first request in a
	// window and at the one that spends its budget): behind such a proxy every client shares the
	// proxy's budget, and [TrustedProxies] is the fix.
	ClientIP ClientIPFunc
	// IPv6PrefixBits is how many leading bits of an IPv6 address identify one client, since one
	// subscriber usually holds a whole /64. Default 64; 128 counts every address on its own.
	IPv6PrefixBits int
	// StoreTimeout bounds the time one request spends in the store. Default
	// [DefaultStoreTimeout]. A [MemoryKV] never waits and is not given a deadline.
	StoreTimeout time.Duration
	// FailClosed answers 503 Service Unavailable when the store fails. By default (false) the
	// layer fails open, as the seed does: the request passes uncounted.
	FailClosed bool
	// OnError receives every store failure ([ErrStoreFailed]) and corrupt stored value
	// ([ErrCorruptValue]). It runs on the request's goroutine and must be safe for simultaneous
	// use. Default: logged through Logger, at most once a minute per layer.
	OnError func(r *http.Request, err error)
	// DenyHandler writes the response for a request over the limit. The rate-limit headers and
	// Retry-After are already set when it runs. Default: 429 with a short plain-text body.
	DenyHandler func(w http.ResponseWriter, r *http.Request, res Result)
	// Headers chooses the rate-limit headers. Default: [HeadersStandard].
	Headers HeaderStyle
	// Logger receives the layer's few operator messages. Default: [slog.Default] at the time of
	// each message, so a later [slog.SetDefault] is honoured.
	Logger *slog.Logger
	// Now reads the clock. Default: the store's clock when Store is a [MemoryKV] built
	// [WithClock], so that a test injects its clock once; else the system clock to the whole
	// second, which a timer keeps current while the layer is in use, so that a request does not
	// pay for a [time.Now]. The headers lose nothing by it (windows and the seconds they report
	// are whole), but [Result.Reset] and [Result.RetryAfter] are whole seconds, the most that can
	// be left, and a new second reaches the layer after the timer's latency (microseconds;
	// milliseconds on a saturated machine), and after a suspend or a step of the system clock
	// within a second. The timer stops after a second without requests. Inside a
	// testing/synctest bubble the default reads time.Now on every request; give such tests layers
	// and MemoryKVs of their own, since a layer already running on the real clock keeps it, and
	// layers that count in one MemoryKV share the store's clock.
	Now func() time.Time
}

// Result is the decision for one request.
type Result struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Limit is the layer's Max, or zero when the layer did not apply its limit to the request
	// (its path is not limited, the layer is disabled or has no store, or the store failed).
	Limit int
	// Remaining is how many more requests the client may make in this window.
	Remaining int
	// Reset is the time left until the current window ends and the count starts again. With
	// the system clock, the default, it is whole seconds (see [Options.Now]).
	Reset time.Duration
	// RetryAfter is how long a denied client should wait; zero when Allowed.
	RetryAfter time.Duration
}

// Counted reports whether the layer applied its limit to the request: its path is limited and
// its store answered. A request of a client already over the limit is denied without adding to
// the stored count (as in the seed); it is still Counted in this sense.
func (r Result) Counted() bool { return r.Limit > 0 }

// Limiter is one rate-limiting layer. Build it with [New]; it is safe for simultaneous use by
// multiple goroutines. It starts no goroutines of its own; while it serves requests, its default
// clock's timer fires once a second (see [Options.Now]).
type Limiter struct {
	scope     string
	max       int64
	windowSec int64
	ttl       time.Duration
	filter    pathFilter
	countAll  bool   // filter has no patterns: every path is counted
	keyPrefix string // "ratelimit:{scope}:"
	v6Bits    int

	// counting is set by New for an enabled layer with a store. A disabled layer, one without a
	// store, and a Limiter not built by New pass every request: the middleware is next itself.
	counting bool
	mem      *MemoryKV
	memNow   bool // the layer reads mem's clock (the system's, or mem's injected one): its reading serves mem
	counter  Counter
	kv       KV
	denied   *MemoryKV // clients over the limit, so a remote store is not asked again this window

	clientIP     ClientIPFunc
	remoteAddrIP bool // clientIP is the default, RemoteAddrIP, which has a fast path
	timeout      time.Duration
	failClosed   bool
	onError      func(*http.Request, error)
	deny         func(http.ResponseWriter, *http.Request, Result)
	headers      HeaderStyle
	now          func() time.Time
	defaultClock bool // now is clock.now, which unixNow reads without building a time.Time

	// Header values that never change, computed once.
	policyValue     string
	limitValue      string
	allowValues     int    // how many header values an allowed response gets
	rateLimitPrefix string // of RateLimit: "scope";r=
	// The header texts of the last second left in a window that a response needed.
	lastSecond atomic.Pointer[secondsLeftValues]
	// RateLimit values by remaining count, and what each slot last missed on.
	rateLimitTexts  [rateLimitTextSlots]atomic.Pointer[rateLimitText]
	rateLimitMisses [rateLimitTextSlots]atomic.Int64
	arenas          sync.Pool // of *headerArena

	// The default clock: the MemoryKV's when the layer counts in one (so that all its layers
	// agree on the second, and share one timer), else ownedClock.
	clock      *systemClock
	ownedClock systemClock

	logger       *slog.Logger
	proxyWarning *proxyWarning // while the layer keys clients by RemoteAddrIP
	proxyWarned  atomic.Bool
	lastLogged   atomic.Int64 // Unix nanoseconds of the last default OnError log line
	unlogged     atomic.Int64 // errors not logged since then
	errorsTotal  atomic.Int64
}

// New validates opts and builds a layer. Every problem in opts is reported, joined in one error;
// New never panics and never silently ignores a value.
func New(opts Options) (*Limiter, error) {
	l, err := build(opts)
	if err != nil {
		return nil, err
	}
	l.start()
	return l, nil
}

// build is New without start: it validates opts and builds the layer, and changes nothing else.
func build(opts Options) (*Limiter, error) {
	l := &Limiter{
		scope:      opts.Scope,
		max:        int64(opts.Max),
		clientIP:   opts.ClientIP,
		v6Bits:     opts.IPv6PrefixBits,
		timeout:    opts.StoreTimeout,
		failClosed: opts.FailClosed,
		onError:    opts.OnError,
		deny:       opts.DenyHandler,
		headers:    opts.Headers,
		logger:     opts.Logger,
		now:        opts.Now,
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("ratelimit: layer %q: "+format, append([]any{opts.Scope}, args...)...))
	}
	if err := checkScope(opts.Scope); err != nil {
		bad("%v", err)
	}
	switch w := opts.Window; {
	case w < 0, opts.Max > 0 && w == 0:
		bad("window %v must be positive", w)
	case w%time.Second != 0:
		bad("window %v is not a whole number of seconds", w)
	case w > maxWindowSeconds*time.Second:
		bad("window %v is longer than 365 days", w)
	}
	var err error
	if l.filter.only, err = compilePatterns(opts.Paths); err != nil {
		bad("Paths: %v", err)
	}
	if l.filter.exempt, err = compilePatterns(opts.ExemptPaths); err != nil {
		bad("ExemptPaths: %v", err)
	}
	switch {
	case l.v6Bits == 0:
		l.v6Bits = DefaultIPv6PrefixBits
	case l.v6Bits < 1 || l.v6Bits > 128:
		bad("IPv6PrefixBits %d is outside 1..128", l.v6Bits)
	}
	switch {
	case l.timeout == 0:
		l.timeout = DefaultStoreTimeout
	case l.timeout < 0:
		bad("StoreTimeout %v must be positive", l.timeout)
	}
	if l.headers < HeadersStandard || l.headers > HeadersNone {
		bad("unknown HeaderStyle %d", l.headers)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	l.countAll = l.filter.only.empty() && l.filter.exempt.empty()

	if l.clientIP == nil {
		l.clientIP = RemoteAddrIP
		l.remoteAddrIP = true
		l.proxyWarning = newProxyWarning()
	}
	if mem, ok := opts.Store.(*MemoryKV); ok && mem != nil && mem.now != nil && l.now == nil {
		// A test that gave the store its clock means the layer's windows too.
		l.now = mem.now
	}
	if l.now == nil {
		l.clock = &l.ownedClock
		l.now = func() time.Time { return l.clock.now() }
		l.defaultClock = true
	}
	l.arenas.New = func() any { return new(headerArena) }
	l.windowSec = int64(opts.Window / time.Second)
	l.ttl = 2 * opts.Window
	l.keyPrefix = "ratelimit:" + opts.Scope + ":"
	l.rateLimitPrefix = strconv.Quote(opts.Scope) + ";r="
	l.policyValue = fmt.Sprintf("%q;q=%d;w=%d", opts.Scope, opts.Max, l.windowSec)
	l.limitValue = strconv.Itoa(opts.Max)
	switch l.headers {
	case HeadersStandard:
		l.allowValues = 2
	case HeadersLegacy:
		l.allowValues = 3
	case HeadersBoth:
		l.allowValues = 5
	}

	if opts.Max > 0 && !isNil(opts.Store) {
		l.counting = true
		l.kv = opts.Store
		if mem, ok := opts.Store.(*MemoryKV); ok {
			l.mem = mem
			// The layer's reading of the clock serves the store too: both read the system
			// clock, or both the store's injected one.
			l.memNow = opts.Now == nil
			if l.memNow && mem.now == nil {
				l.clock = &mem.layerClock
			}
		} else {
			l.counter, _ = opts.Store.(Counter)
			l.denied = NewMemoryKV(WithClock(l.now))
		}
	}
	return l, nil
}

// start does what a new layer does to the world outside it once it is built and valid: it says
// what the operator should know, and records its window in its MemoryKV. [NewLayers] starts its
// layers only once both are valid, so that a rejected configuration leaves no trace.
func (l *Limiter) start() {
	window := time.Duration(l.windowSec) * time.Second
	switch {
	case l.max <= 0:
		l.log().Info("ratelimit: layer disabled because its max is zero or less", "scope", l.scope)
	case !l.counting:
		l.log().Warn("ratelimit: no store configured; the layer fails open and lets every request through", "scope", l.scope)
	case l.mem != nil:
		if earlier, changed := l.mem.claimScope(l.scope, window); changed {
			l.log().Warn("ratelimit: a layer of this scope was built on this MemoryKV with another window; "+
				"they share counters, which keep one window at a time, so if both count, they upset each other's "+
				"counts: give each layer a scope of its own (if this layer replaces the other, a reload, a client's "+
				"count may restart or carry over until its next window begins)",
				"scope", l.scope, "window", window, "earlier_window", earlier)
		}
	}
}

// isNil reports whether store is nil or a nil pointer in a non-nil interface, such as a
// (*cloudflarekv.Synced)(nil) left by a failed constructor: both mean "no store", never a panic at
// request time.
func isNil(store KV) bool {
	if store == nil {
		return true
	}
	v := reflect.ValueOf(store)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func checkScope(scope string) error {
	if scope == "" || len(scope) > 64 {
		return fmt.Errorf("scope %q must be 1 to 64 bytes long", scope)
	}
	for _, c := range []byte(scope) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("scope %q may hold only letters, digits, '-', '_' and '.'", scope)
		}
	}
	return nil
}

// Scope returns the layer's scope.
func (l *Limiter) Scope() string {
	if l == nil {
		return ""
	}
	return l.scope
}

// Allow decides whether r may proceed. It is shorthand for AllowAt(r, now) with the layer's clock.
func (l *Limiter) Allow(r *http.Request) (Result, error) {
	if l == nil || !l.counting {
		return Result{Allowed: true}, nil // and a zero Limiter has no clock
	}
	sec, nsec := l.unixNow()
	return l.allowAt(r, sec, nsec, l.memNow, nil)
}

// AllowAt decides whether r, arriving at now, may proceed, and counts it.
//
// Over the limit is a Result with Allowed false, not an error. A non-nil error wraps
// [ErrStoreFailed] or [ErrCorruptValue]; the Result then already follows the failure policy:
// after a store failure it is uncounted and Allowed unless [Options.FailClosed] is set, and after
// a corrupt value the request counts as the first of a fresh window.
func (l *Limiter) AllowAt(r *http.Request, now time.Time) (Result, error) {
	if l == nil {
		return Result{Allowed: true}, nil
	}
	return l.allowAt(r, now.Unix(), int64(now.Nanosecond()), false, nil)
}

// unixNow reads the layer's clock: Unix seconds, and nanoseconds within the second.
func (l *Limiter) unixNow() (sec, nsec int64) {
	if l.defaultClock {
		return l.clock.unixSec(), 0
	}
	t := l.now()
	return t.Unix(), int64(t.Nanosecond())
}

// allowAt is AllowAt at sec seconds and nsec nanoseconds (0 to 999,999,999) of Unix time, a
// form that holds any time.Time without overflow. memNow tells that the time was read from the
// MemoryKV's own clock (the system clock, or the store's injected one), so that the store need
// not read the clock again (a time.Now costs about as much as the rest of the MemoryKV path).
//
// When early holds a header map, a request counted in a MemoryKV starts on its headers
// (startHeaders) between the lookup of its counter and the count: for a client not seen lately
// the lookup misses the processor's caches, and the header work then runs while the counter is
// fetched.
func (l *Limiter) allowAt(r *http.Request, sec, nsec int64, memNow bool, early *responseHeaders) (Result, error) {
	if !l.counting || !l.countAll && !l.filter.match(r.URL) {
		return Result{Allowed: true}, nil
	}
	var buf [128]byte // the longest key: 10 + 64 (scope) + 1 + 39 (IPv6) bytes
	key := append(buf[:0], l.keyPrefix...)
	var done bool
	if l.remoteAddrIP {
		key, done = appendIPv4Port(key, r.RemoteAddr)
	}
	if !done {
		addr, ok := l.clientIP(r)
		key = appendClientKey(key, addr, ok, l.v6Bits)
	}

	start := sec - sec%l.windowSec
	if start > sec { // before 1970 the remainder is negative: round down, not toward zero
		start -= l.windowSec
	}
	// At most a window (365 days) of nanoseconds: no overflow, whatever the year.
	reset := time.Duration((start+l.windowSec-sec)*int64(time.Second) - nsec)
	if l.mem != nil {
		c := l.mem.findCounter(counterKeyOfBytes(l.mem.seedsOf(), key))
		if early != nil && early.h != nil {
			l.startHeaders(early)
		}
		now := sec*int64(time.Second) + nsec
		if !memNow {
			now = l.mem.clock()
		}
		// A client at its limit is denied without counting, as the seed does, and as l.denied
		// does for a remote store.
		full := makeFullMark(start, l.max)
		if c.e != nil && c.e.exhausted(full, now) {
			return l.result(l.max+1, reset), nil
		}
		n := l.mem.incrementFound(c, start*int64(time.Second), l.ttl, now, full)
		if n == 1 || n == l.max {
			l.warnIfThroughProxy(r)
		}
		return l.result(n, reset), nil
	}
	deniedKey := counterKeyOfBytes(l.denied.seedsOf(), key)
	// Windows in Unix nanoseconds, as every MemoryKV counter keeps them.
	if _, denied := l.denied.peek(deniedKey, start*int64(time.Second)); denied {
		return l.result(l.max+1, reset), nil
	}
	// The client's going away must not cancel the count: a client that resets its stream after
	// sending a request would otherwise fail the store call and pass uncounted. The deadline
	// still bounds the wait.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), l.timeout)
	defer cancel()
	count, err := l.count(ctx, string(key), start)
	if errors.Is(err, ErrStoreFailed) {
		return Result{Allowed: !l.failClosed}, err
	}
	if count == 1 || count == l.max {
		l.warnIfThroughProxy(r)
	}
	res := l.result(count, reset)
	if !res.Allowed {
		l.denied.incrementAt(deniedKey, start*int64(time.Second), reset, l.denied.clock(), 0)
	}
	return res, err
}

// count adds the request to the store and returns the window's count including it.
func (l *Limiter) count(ctx context.Context, key string, start int64) (int64, error) {
	if l.counter != nil {
		n, err := l.counter.Increment(ctx, key, time.Unix(start, 0), l.ttl)
		if err != nil {
			return 0, fmt.Errorf("%w: layer %q: increment %q: %w", ErrStoreFailed, l.scope, key, err)
		}
		return n, nil
	}
	// The seed's algorithm: read, and write back count+1 unless the client is already over.
	raw, found, err := l.kv.Get(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("%w: layer %q: get %q: %w", ErrStoreFailed, l.scope, key, err)
	}
	var n int64
	var corrupt error
	window := start // the window the count is kept in
	if found {
		stored, count, perr := parseSeedValue(raw)
		switch {
		case perr != nil:
			corrupt = fmt.Errorf("%w: layer %q: key %q: %w", ErrCorruptValue, l.scope, key, perr)
		case stored == start:
			n = count
		case stored == start+l.windowSec:
			// The next window's count, written by an instance whose clock runs ahead, or by a
			// request that read the clock after this one: count in it, as MemoryKV does,
			// rather than restart it.
			n, window = count, stored
		}
	}
	if n >= l.max {
		return min(n, math.MaxInt64-1) + 1, corrupt // a stored count may be any size
	}
	if err := l.kv.Put(ctx, key, appendSeedValue(nil, window, n+1), l.ttl); err != nil {
		return 0, fmt.Errorf("%w: layer %q: put %q: %w", ErrStoreFailed, l.scope, key, err)
	}
	return n + 1, corrupt
}

func (l *Limiter) result(count int64, reset time.Duration) Result {
	res := Result{Limit: int(l.max), Reset: reset, Allowed: count <= l.max}
	res.Remaining = int(max(0, l.max-count))
	if !res.Allowed {
		res.RetryAfter = reset
	}
	return res
}

// seedValue is the JSON value of the seed: {"window":<unix seconds>,"count":<n>}. Pointers tell a
// missing field from a zero one; other fields are ignored, so richer values stay readable.
type seedValue struct {
	Window *int64 `json:"window"`
	Count  *int64 `json:"count"`
}

func parseSeedValue(raw []byte) (window, count int64, err error) {
	var v seedValue
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, 0, fmt.Errorf("not JSON: %w", err)
	}
	if v.Window == nil || v.Count == nil || *v.Count < 0 {
		return 0, 0, fmt.Errorf("want {\"window\":<unix seconds>,\"count\":<n >= 0>}, got %.100q", raw)
	}
	return *v.Window, *v.Count, nil
}

func appendSeedValue(dst []byte, window, count int64) []byte {
	dst = append(dst, `{"window":`...)
	dst = strconv.AppendInt(dst, window, 10)
	dst = append(dst, `,"count":`...)
	dst = strconv.AppendInt(dst, count, 10)
	return append(dst, '}')
}

// ceilSeconds rounds d up to whole seconds, at least 1: the delay-seconds of Retry-After and the
// t parameter of RateLimit must not tell a client to come back before the window ends.
func ceilSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// log returns the layer's logger; without one, the default logger at the time of the call, so
// that a later slog.SetDefault is honoured.
func (l *Limiter) log() *slog.Logger {
	if l.logger != nil {
		return l.logger
	}
	return slog.Default()
}

// report passes err to OnError, or logs it at most once a minute.
func (l *Limiter) report(r *http.Request, err error) {
	l.errorsTotal.Add(1)
	if l.onError != nil {
		l.onError(r, err)
		return
	}
	now := l.now().UnixNano()
	last := l.lastLogged.Load()
	if now-last < int64(time.Minute) || !l.lastLogged.CompareAndSwap(last, now) {
		l.unlogged.Add(1)
		return
	}
	l.log().Warn("ratelimit: store problem", "scope", l.scope, "error", err,
		"unlogged_since_last", l.unlogged.Swap(0), "errors_total", l.errorsTotal.Load())
}
