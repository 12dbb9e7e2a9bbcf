package benchmarks

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/didip/tollbooth/v8"
	tblimiter "github.com/didip/tollbooth/v8/limiter"
	"github.com/go-chi/httprate"
	"github.com/kilat-dev/ratelimit"
	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululememory "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// A contender wraps next in a limiter that lets each client (keyed by the IP of RemoteAddr) make
// limit requests per window, with its idiomatic in-memory store and its default headers.
type contender struct {
	name string
	// limiter is false for the no-middleware baseline, the only contender that does not limit.
	limiter bool
	wrap    func(tb testing.TB, limit int, window time.Duration, next http.Handler) http.Handler
}

var contenders = []contender{
	{name: "ratelimit", limiter: true, wrap: wrapRatelimit(ratelimit.HeadersStandard)},
	{name: "ratelimit-noheaders", limiter: true, wrap: wrapRatelimit(ratelimit.HeadersNone)},
	{name: "ref-fresh", limiter: true, wrap: wrapTwoHeaders(freshValues)},
	{name: "ref-shared", limiter: true, wrap: wrapTwoHeaders(sharedValues)},
	{name: "xtimerate", limiter: true, wrap: wrapXTimeRate},
	{name: "ulule", limiter: true, wrap: wrapUlule},
	{name: "httprate", limiter: true, wrap: wrapHTTPRate},
	{name: "golimiter", limiter: true, wrap: wrapGoLimiter},
	{name: "tollbooth", limiter: true, wrap: wrapTollbooth},
	{name: "throttled", limiter: true, wrap: wrapThrottled},
	{name: "baseline", wrap: func(_ testing.TB, _ int, _ time.Duration, next http.Handler) http.Handler {
		return next
	}},
}

// This library: MemoryKV, one layer keyed by the client's IP.
func wrapRatelimit(headers ratelimit.HeaderStyle) func(testing.TB, int, time.Duration, http.Handler) http.Handler {
	return func(tb testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
		l, err := ratelimit.New(ratelimit.Options{
			Scope:   "bench",
			Max:     limit,
			Window:  window,
			Store:   ratelimit.NewMemoryKV(),
			Headers: headers,
		})
		if err != nil {
			tb.Fatal(err)
		}
		return l.Handler(next)
	}
}

// The references ref-fresh and ref-shared measure the standard headers stripped to their storage:
// the library without headers, behind a middleware that only stores two constant values, as long
// as this library's, in the response's header map. They format nothing and read no count.
//
// ref-fresh gives every response header slices of its own, as this library does (there cut from
// shared blocks); ref-shared gives every response the same slices, which is unsafe: code that
// writes into a value's slice in place changes every response's, in a data race (the class of bug
// of rs/cors#198 and jub0bs/cors#14). The gap between the two is what that guarantee costs.
const (
	refPolicy    = `"bench";q=1073741824;w=3600`
	refRateLimit = `"bench";r=1073741823;t=3600`
)

type headerValues func() (policy, rateLimit []string)

func freshValues() (policy, rateLimit []string) {
	return []string{refPolicy}, []string{refRateLimit}
}

var sharedPolicy, sharedRateLimit = []string{refPolicy}, []string{refRateLimit}

func sharedValues() (policy, rateLimit []string) { return sharedPolicy, sharedRateLimit }

func wrapTwoHeaders(values headerValues) func(testing.TB, int, time.Duration, http.Handler) http.Handler {
	return func(tb testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
		limited := wrapRatelimit(ratelimit.HeadersNone)(tb, limit, window, next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h["Ratelimit-Policy"], h["Ratelimit"] = values()
			limited.ServeHTTP(w, r)
		})
	}
}

// xtimerate is the lower reference: a hand-rolled mutex and map of golang.org/x/time/rate token
// buckets, the least a limiter can do. It sets no headers and never forgets a client.
func wrapXTimeRate(_ testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
	var (
		mu       sync.Mutex
		limiters = make(map[string]*rate.Limiter)
	)
	every := rate.Every(window / time.Duration(limit))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			ip = r.RemoteAddr
		}
		mu.Lock()
		l, ok := limiters[ip]
		if !ok {
			l = rate.NewLimiter(every, limit)
			limiters[ip] = l
		}
		mu.Unlock()
		if !l.Allow() {
			http.Error(w, "Too Many Requests", http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ulule/limiter v3: the memory store and the net/http middleware, keyed by its default IP key
// (RemoteAddr; forwarding headers are not trusted by default).
func wrapUlule(_ testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
	l := ulule.New(ululememory.NewStore(), ulule.Rate{Period: window, Limit: int64(limit)})
	return stdlib.NewMiddleware(l).Handler(next)
}

// go-chi/httprate: its local counter, keyed by the IP of RemoteAddr as its documentation shows
// (KeyByIP's exact behaviour, without the deprecated name).
func wrapHTTPRate(_ testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
	keyByIP := func(r *http.Request) (string, error) {
		ip, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			ip = r.RemoteAddr
		}
		return httprate.CanonicalizeIP(ip), nil
	}
	return httprate.LimitBy(limit, window, keyByIP)(next)
}

// sethvargo/go-limiter: memorystore and httplimit with IPKeyFunc (RemoteAddr).
func wrapGoLimiter(tb testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
	store, err := memorystore.New(&memorystore.Config{Tokens: uint64(limit), Interval: window})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = store.Close(context.Background()) })
	mw, err := httplimit.NewMiddleware(store, httplimit.IPKeyFunc())
	if err != nil {
		tb.Fatal(err)
	}
	return mw.Handle(next)
}

// didip/tollbooth v8: a token bucket of limit per window (its max is per second), burst limit,
// keyed by RemoteAddr.
func wrapTollbooth(_ testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
	lmt := tollbooth.NewLimiter(float64(limit)/window.Seconds(), &tblimiter.ExpirableOptions{DefaultExpirationTTL: window})
	lmt.SetBurst(limit)
	lmt.SetIPLookup(tblimiter.IPLookup{Name: "RemoteAddr"})
	return tollbooth.LimitHandler(lmt, next)
}

// throttled/throttled v2: GCRA over memstore (an LRU large enough for every benchmark client),
// varying by RemoteAddr. MaxBurst is the number of requests allowed beyond the first.
func wrapThrottled(tb testing.TB, limit int, window time.Duration, next http.Handler) http.Handler {
	store, err := memstore.NewCtx(1 << 20)
	if err != nil {
		tb.Fatal(err)
	}
	rl, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{
		MaxRate:  throttled.PerDuration(limit, window),
		MaxBurst: limit - 1,
	})
	if err != nil {
		tb.Fatal(err)
	}
	h := &throttled.HTTPRateLimiterCtx{RateLimiter: rl, VaryBy: &throttled.VaryBy{RemoteAddr: true}}
	return h.RateLimit(next)
}

// okHandler is the trivial handler every contender wraps.
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write(okBody)
})

var okBody = []byte("ok\n")

// recorder is a minimal reusable http.ResponseWriter, identical for every contender: reset clears
// its header map (keeping the map) between requests, so no contender pays for the harness.
type recorder struct {
	header http.Header
	status int
}

func newRecorder() *recorder { return &recorder{header: make(http.Header, 8)} }

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}

func (w *recorder) reset() {
	clear(w.header)
	w.status = 0
}

// clientRequest returns a GET / from client number i: the IPv4 address 10.x.y.z (i < 2^24), with a
// fixed source port so that every contender sees the same RemoteAddr for the same client. The
// requests share their URL and (empty) header map, which limiters only read, to keep the
// harness's live heap, and so the garbage collector's work, small.
func clientRequest(i int) *http.Request {
	return &http.Request{
		Method:     http.MethodGet,
		URL:        sharedURL,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     sharedHeader,
		Host:       sharedURL.Host,
		RequestURI: "/",
		RemoteAddr: "10." + strconv.Itoa(i>>16&0xff) + "." + strconv.Itoa(i>>8&0xff) + "." + strconv.Itoa(i&0xff) + ":40000",
	}
}

var (
	sharedURL    = &url.URL{Scheme: "http", Host: "example.com", Path: "/"}
	sharedHeader = http.Header{}
)
