package ratelimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/kilat-dev/ratelimit"
)

// A layer wraps any handler: here 3 requests per minute for each client.
func Example() {
	limiter, err := ratelimit.New(ratelimit.Options{
		Scope:  "api",
		Max:    3,
		Window: time.Minute,
		Store:  ratelimit.NewMemoryKV(),
		// A fixed clock keeps this example's output stable; leave Now unset in real code.
		Now: func() time.Time { return time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC) },
	})
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	handler := limiter.Handler(hello)

	for range 4 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil) // from 192.0.2.1
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "api";q=3;w=60
	// 200 "api";q=3;w=60
	// 200 "api";q=3;w=60
	// 429 "api";q=3;w=60
}

// The seed's two layers, tuned from RATE_LIMIT_* variables, sharing one store and mounted on a
// whole application. The auth layer counts only its own paths.
func ExampleNewLayers() {
	env := map[string]string{"RATE_LIMIT_AUTH_MAX": "2"} // os.LookupEnv in a real program
	cfg, err := ratelimit.ConfigFromEnv(func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	})
	if err != nil {
		log.Fatal(err)
	}
	store := ratelimit.NewMemoryKV()
	cfg.Auth.Store, cfg.Global.Store = store, store
	// A fixed clock at the start of a minute keeps this example's output stable.
	fixed := func() time.Time { return time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC) }
	cfg.Auth.Now, cfg.Global.Now = fixed, fixed
	layers, err := ratelimit.NewLayers(cfg)
	if err != nil {
		log.Fatal(err)
	}
	app := layers.Handler(http.NotFoundHandler())

	for _, path := range []string{"/login", "/login", "/login", "/health", "/profile"} {
		rec := httptest.NewRecorder()
		app.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%-8s %d %s", path, rec.Code, strings.Join(rec.Header().Values("RateLimit"), ", "))))
	}
	// Output:
	// /login   404 "global";r=199;t=60, "auth";r=1;t=60
	// /login   404 "global";r=198;t=60, "auth";r=0;t=60
	// /login   429 "global";r=197;t=60, "auth";r=0;t=60
	// /health  404
	// /profile 404 "global";r=196;t=60
}

// Allow decides without writing a response, for code that is not an http.Handler chain. The
// clock is fixed here so that the output is stable.
func ExampleLimiter_AllowAt() {
	limiter, err := ratelimit.New(ratelimit.Options{Scope: "auth", Max: 2, Window: time.Minute, Store: ratelimit.NewMemoryKV()})
	if err != nil {
		log.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/login", nil)
	now := time.Date(2026, 1, 2, 3, 4, 50, 0, time.UTC)
	for range 3 {
		res, err := limiter.AllowAt(req, now)
		if err != nil {
			log.Print(err) // a store failure; res already follows the failure policy
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=10s
}

// Unit-testing your own handler behind the limiter: give each test a fresh MemoryKV and a clock
// you control, and move the clock instead of sleeping.
func ExampleMemoryKV() {
	now := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	limiter, err := ratelimit.New(ratelimit.Options{
		Scope: "auth", Max: 1, Window: time.Minute,
		Store: ratelimit.NewMemoryKV(ratelimit.WithClock(clock)), // the layer reads it too
	})
	if err != nil {
		log.Fatal(err)
	}
	handler := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	try := func() int {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/login", nil))
		return rec.Code
	}
	fmt.Println(try(), try())
	now = now.Add(time.Minute) // the next window
	fmt.Println(try())
	// Output:
	// 204 429
	// 204
}

// A DenyHandler writes the 429 of an API in its own format; the rate-limit headers and
// Retry-After are already set when it runs.
func ExampleOptions_denyHandler() {
	now := time.Date(2026, 1, 2, 3, 4, 30, 0, time.UTC)
	limiter, err := ratelimit.New(ratelimit.Options{
		Scope: "api", Max: 1, Window: time.Minute,
		Store: ratelimit.NewMemoryKV(ratelimit.WithClock(func() time.Time { return now })),
		DenyHandler: func(w http.ResponseWriter, _ *http.Request, res ratelimit.Result) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			// Retry-After holds res.RetryAfter rounded up to whole seconds, at least 1.
			fmt.Fprintf(w, `{"error":"rate_limited","limit":%d,"retry_after_seconds":%s}`+"\n",
				res.Limit, w.Header().Get("Retry-After"))
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	handler := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, `{"ok":true}`)
	}))
	for range 2 {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/items", nil))
		fmt.Print(rec.Code, " ", rec.Header().Get("Retry-After"), " ", rec.Body.String())
	}
	// Output:
	// 200  {"ok":true}
	// 429 30 {"error":"rate_limited","limit":1,"retry_after_seconds":30}
}
