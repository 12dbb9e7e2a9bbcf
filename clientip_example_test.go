package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/kilat-dev/ratelimit"
)

// Behind a load balancer in 10.0.0.0/8 that appends to X-Forwarded-For, with Cloudflare in
// front: headers are believed only from those peers, and the client is the first address from
// the right that is not one of them. What a client writes on the left changes nothing.
func ExampleTrustedProxies() {
	proxies, err := ratelimit.NewTrustedProxies(ratelimit.ProxyOptions{
		Prefixes:   []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Cloudflare: true, // Cloudflare's edge ranges; CF-Connecting-IP from them
	})
	if err != nil {
		log.Fatal(err)
	}
	// The same from configuration: ratelimit.ParseTrustedProxies("cloudflare, 10.0.0.0/8"), or
	// RATE_LIMIT_TRUSTED_PROXIES with ConfigFromEnv.

	request := func(remoteAddr string, headers ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remoteAddr
		for i := 0; i+1 < len(headers); i += 2 {
			r.Header.Add(headers[i], headers[i+1])
		}
		return r
	}
	for _, r := range []*http.Request{
		// A direct client: its headers are not believed.
		request("203.0.113.9:50123", "X-Forwarded-For", "198.51.100.1", "CF-Connecting-IP", "198.51.100.2"),
		// Through the load balancer: the spoofed left part is skipped.
		request("10.0.0.7:41000", "X-Forwarded-For", "1.2.3.4, 198.51.100.20, 10.0.0.3"),
		// Through Cloudflare, then the load balancer.
		request("10.0.0.7:41000", "X-Forwarded-For", "1.2.3.4, 2001:db8:1:2::99, 172.64.0.10"),
		// Straight from Cloudflare's edge: CF-Connecting-IP.
		request("[2606:4700::6810:1]:443", "CF-Connecting-IP", "198.51.100.30"),
	} {
		addr, _ := proxies.ClientIP(r)
		fmt.Println(addr)
	}

	// The resolver plugs into a layer. A client rotating the left part of X-Forwarded-For
	// gets no fresh budget.
	now := func() time.Time { return time.Unix(1_800_000_030, 0) } // a fixed clock: stable output
	limiter, err := ratelimit.New(ratelimit.Options{
		Scope:    "api",
		Max:      2,
		Window:   time.Minute,
		Store:    ratelimit.NewMemoryKV(ratelimit.WithClock(now)),
		ClientIP: proxies.ClientIP,
		Now:      now,
	})
	if err != nil {
		log.Fatal(err)
	}
	handler := limiter.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, spoof := range []string{"1.1.1.1", "2.2.2.2", "3.3.3.3"} {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, request("10.0.0.7:41000", "X-Forwarded-For", spoof+", 198.51.100.20"))
		fmt.Println(spoof, rec.Code)
	}
	// Output:
	// 203.0.113.9
	// 198.51.100.20
	// 2001:db8:1:2::99
	// 198.51.100.30
	// 1.1.1.1 200
	// 2.2.2.2 200
	// 3.3.3.3 429
}

// Cloudflare's ranges ship with the library; refresh them at start-up and then daily. A failed
// fetch keeps the list in force and is only reported, never fatal.
func ExampleTrustedProxies_RefreshCloudflare() {
	proxies, err := ratelimit.ParseTrustedProxies("cloudflare")
	if err != nil {
		log.Fatal(err)
	}
	refresh := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := proxies.RefreshCloudflare(ctx, ratelimit.CloudflareSource{}); err != nil {
			slog.Warn("keeping the Cloudflare ranges in force", "error", err)
		}
	}
	refresh()
	go func() {
		for range time.Tick(24 * time.Hour) {
			refresh()
		}
	}()
	// ... ratelimit.Options{ClientIP: proxies.ClientIP, ...}
}
