package ratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The list in shared/reference/cloudflare-kv-api.md and at https://www.cloudflare.com/ips/.
var publishedCloudflareRanges = []string{
	"173.245.48.0/20", "103.21.244.0/22", "103.22.200.0/22", "103.31.4.0/22", "141.101.64.0/18",
	"108.162.192.0/18", "190.93.240.0/20", "188.114.96.0/20", "197.234.240.0/22", "198.41.128.0/17",
	"162.158.0.0/15", "104.16.0.0/13", "104.24.0.0/14", "172.64.0.0/13", "131.0.72.0/22",
	"2400:cb00::/32", "2606:4700::/32", "2803:f800::/32", "2405:b500::/32", "2405:8100::/32",
	"2a06:98c0::/29", "2c0f:f248::/32",
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func TestCloudflareRangesShipped(t *testing.T) {
	require.Len(t, strings.Fields(cloudflareShipped), len(publishedCloudflareRanges), "every shipped entry parses")
	got := CloudflareRanges()
	require.Equal(t, publishedCloudflareRanges, prefixStrings(got))
	for _, p := range got {
		require.Equal(t, p, p.Masked(), "%s is masked", p)
		require.NoError(t, checkCloudflarePrefix(p, p.Addr().Is4()))
	}

	// Copies: changing one changes neither the next nor a resolver's list.
	got[0] = netip.MustParsePrefix("0.0.0.0/0")
	require.Equal(t, publishedCloudflareRanges, prefixStrings(CloudflareRanges()))
	p := cipDefaultProxies(t)
	mine := p.CloudflareRanges()
	mine[0] = netip.MustParsePrefix("203.0.113.0/24")
	require.Equal(t, publishedCloudflareRanges, prefixStrings(p.CloudflareRanges()))
	require.Equal(t, "203.0.113.9", cipResult(p.ClientIP(cipRequest("203.0.113.9:1", cfh, "198.51.100.1"))))
}

const fakeIPsBody = `{"result":{"ipv4_cidrs":["198.18.0.0/15"],"ipv6_cidrs":["2001:db8:cf::/48"],"etag":"38f79d050aa027e3be3865e495dcc9bc"},"success":true,"errors":[],"messages":[]}`

// fakeCloudflareAPI serves GET /ips with handler and records the paths requested.
func fakeCloudflareAPI(t *testing.T, handler http.HandlerFunc) (CloudflareSource, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		handler(w, r)
	}))
	t.Cleanup(srv.Close)
	return CloudflareSource{BaseURL: srv.URL, Client: srv.Client(), Timeout: 5 * time.Second}, &paths
}

func TestRefreshCloudflareSwapsTheRanges(t *testing.T) {
	src, paths := fakeCloudflareAPI(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(fakeIPsBody))
	})
	p := cipDefaultProxies(t)
	require.NoError(t, p.RefreshCloudflare(context.Background(), src))
	require.Equal(t, []string{"GET /ips"}, *paths)
	require.Equal(t, []string{"198.18.0.0/15", "2001:db8:cf::/48"}, prefixStrings(p.CloudflareRanges()))

	// The new edges are believed, the old ones no longer; the user's prefixes are untouched.
	require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(cipRequest("198.19.0.1:1", cfh, "198.51.100.1"))))
	require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(cipRequest("[2001:db8:cf::1]:1", cfh, "198.51.100.1"))))
	require.Equal(t, "172.64.0.1", cipResult(p.ClientIP(cipRequest("172.64.0.1:1", cfh, "198.51.100.1"))))
	require.Equal(t, "198.51.100.2", cipResult(p.ClientIP(cipRequest("10.0.0.1:1", xff, "198.51.100.2"))))

	// A trailing slash on the base URL is fine.
	src.BaseURL += "/"
	require.NoError(t, p.RefreshCloudflare(context.Background(), src))
	require.Equal(t, []string{"GET /ips", "GET /ips"}, *paths)
}

func TestRefreshCloudflareKeepsTheListOnFailure(t *testing.T) {
	respond := func(status int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
		}
	}
	ok := func(v4, v6 string) string {
		return `{"result":{"ipv4_cidrs":[` + v4 + `],"ipv6_cidrs":[` + v6 + `]},"success":true,"errors":[],"messages":[]}`
	}
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"500", respond(500, `{"success":false}`), "500 Internal Server Error"},
		{"429", respond(429, `{"success":false,"errors":[{"code":971,"message":"Please wait"}]}`), "429"},
		{"garbage JSON", respond(200, `<html>not json</html>`), "not the documented JSON"},
		{"truncated JSON", respond(200, fakeIPsBody[:40]), "not the documented JSON"},
		{"empty body", respond(200, ``), "not the documented JSON"},
		{"success false", respond(200, `{"success":false,"errors":[{"code":10000,"message":"Authentication error"}],"result":null}`), `error 10000: "Authentication error"`},
		{"no result", respond(200, `{"success":true}`), "lacks ipv4_cidrs or ipv6_cidrs"},
		{"no IPv6 list", respond(200, ok(`"198.18.0.0/15"`, ``)), "lacks ipv4_cidrs or ipv6_cidrs"},
		{"not a CIDR", respond(200, ok(`"198.18.0.0/15","banana"`, `"2001:db8::/32"`)), `"banana" is not a CIDR prefix`},
		{"IPv4 /0", respond(200, ok(`"0.0.0.0/0"`, `"2001:db8::/32"`)), "0.0.0.0/0 is implausibly wide"},
		{"IPv6 /8", respond(200, ok(`"198.18.0.0/15"`, `"2000::/8"`)), "2000::/8 is implausibly wide"},
		{"IPv6 in the IPv4 list", respond(200, ok(`"2001:db8::/32"`, `"2001:db8::/32"`)), "wrong address family"},
		{"IPv4-mapped in the IPv6 list", respond(200, ok(`"198.18.0.0/15"`, `"::ffff:198.18.0.0/111"`)), "wrong address family"},
		{"too many ranges", respond(200, ok(strings.Repeat(`"198.18.0.0/15",`, 1100)+`"198.18.0.0/15"`, `"2001:db8::/32"`)), "more than 1024"},
		{"too large", respond(200, `{"success":true,"x":"`+strings.Repeat("a", 2<<20)+`"}`), "larger than"},
		{"hangs", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, "context deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, _ := fakeCloudflareAPI(t, tt.handler)
			src.Timeout = 200 * time.Millisecond
			p := cipDefaultProxies(t)
			start := time.Now()
			err := p.RefreshCloudflare(context.Background(), src)
			require.Less(t, time.Since(start), 5*time.Second)
			require.ErrorContains(t, err, tt.want)
			require.True(t, strings.HasPrefix(err.Error(), "ratelimit: "), err.Error())
			require.Equal(t, publishedCloudflareRanges, prefixStrings(p.CloudflareRanges()), "shipped list kept")
			require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(cipRequest("172.64.0.1:1", cfh, "198.51.100.1"))))
		})
	}

	t.Run("a failure after a success keeps the fetched list", func(t *testing.T) {
		fail := false
		src, _ := fakeCloudflareAPI(t, func(w http.ResponseWriter, _ *http.Request) {
			if fail {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			_, _ = w.Write([]byte(fakeIPsBody))
		})
		p := cipDefaultProxies(t)
		require.NoError(t, p.RefreshCloudflare(context.Background(), src))
		fail = true
		require.ErrorContains(t, p.RefreshCloudflare(context.Background(), src), "502")
		require.Equal(t, []string{"198.18.0.0/15", "2001:db8:cf::/48"}, prefixStrings(p.CloudflareRanges()))
	})
}

func TestRefreshCloudflareHonoursTheContext(t *testing.T) {
	src, _ := fakeCloudflareAPI(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	src.Timeout = time.Minute
	p := cipDefaultProxies(t)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.RefreshCloudflare(ctx, src)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, p.RefreshCloudflare(ctx, src), context.Canceled)
	require.Equal(t, publishedCloudflareRanges, prefixStrings(p.CloudflareRanges()))
}

func TestCloudflareSourceRejectsBadSettings(t *testing.T) {
	ctx := context.Background()
	for _, base := range []string{"ftp://example.com", "api.cloudflare.com/client/v4", "http://", "://x", "https://exa mple.com"} {
		_, err := CloudflareSource{BaseURL: base}.Fetch(ctx)
		require.ErrorContains(t, err, "ratelimit: Cloudflare API base URL", base)
	}
	_, err := CloudflareSource{BaseURL: "http://127.0.0.1:1", Timeout: -time.Second}.Fetch(ctx)
	require.ErrorContains(t, err, "ratelimit: Cloudflare fetch timeout -1s must be positive")

	// Without the preset there is nothing to refresh: an error, not a silent no-op.
	p := cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	require.ErrorContains(t, p.RefreshCloudflare(ctx, CloudflareSource{}), "the Cloudflare preset is not enabled")
	require.ErrorContains(t, p.SetCloudflareRanges(CloudflareRanges()), "the Cloudflare preset is not enabled")
	require.Nil(t, p.CloudflareRanges())
}

func TestSetCloudflareRanges(t *testing.T) {
	p := cipDefaultProxies(t)
	for name, tt := range map[string]struct {
		in   []string
		want string
	}{
		"empty":            {nil, "need at least one IPv4 and one IPv6 range"},
		"IPv4 only":        {[]string{"198.18.0.0/15"}, "need at least one IPv4 and one IPv6 range"},
		"IPv4 /0":          {[]string{"0.0.0.0/0", "2001:db8::/32"}, "implausibly wide"},
		"IPv4-mapped IPv6": {[]string{"198.18.0.0/15", "::ffff:198.18.0.0/111"}, "wrong address family"},
	} {
		t.Run(name, func(t *testing.T) {
			var in []netip.Prefix
			for _, s := range tt.in {
				in = append(in, netip.MustParsePrefix(s))
			}
			require.ErrorContains(t, p.SetCloudflareRanges(in), tt.want)
			require.Equal(t, publishedCloudflareRanges, prefixStrings(p.CloudflareRanges()))
		})
	}
	t.Run("zero prefix", func(t *testing.T) {
		require.ErrorContains(t, p.SetCloudflareRanges([]netip.Prefix{{}}), "not valid")
	})

	in := []netip.Prefix{netip.MustParsePrefix("198.18.0.77/15"), netip.MustParsePrefix("2001:db8:cf::/48")}
	require.NoError(t, p.SetCloudflareRanges(in))
	in[0] = netip.MustParsePrefix("203.0.113.0/24") // the caller's slice is not kept
	require.Equal(t, []string{"198.18.0.0/15", "2001:db8:cf::/48"}, prefixStrings(p.CloudflareRanges()))
}

// TestNilTrustedProxies: ConfigFromEnv leaves cfg.TrustedProxies nil without
// RATE_LIMIT_TRUSTED_PROXIES, and the README tells its readers to refresh that one: a nil
// resolver trusts no proxy, and its Cloudflare methods report that the preset is off, without
// fetching anything.
func TestNilTrustedProxies(t *testing.T) {
	cfg, err := ConfigFromEnv(func(string) (string, bool) { return "", false })
	require.NoError(t, err)
	p := cfg.TrustedProxies
	require.Nil(t, p)

	require.Equal(t, "203.0.113.9", cipResult(p.ClientIP(cipRequest("203.0.113.9:1", xff, "198.51.100.1", cfh, "198.51.100.2"))))
	require.Nil(t, p.CloudflareRanges())
	in := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8:cf::/48")}
	require.ErrorContains(t, p.SetCloudflareRanges(in), "the Cloudflare preset is not enabled")
	src, paths := fakeCloudflareAPI(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(fakeIPsBody)) })
	require.ErrorContains(t, p.RefreshCloudflare(context.Background(), src), "the Cloudflare preset is not enabled")
	require.Empty(t, *paths)
}

// TestRefreshCloudflareWhileServing swaps the ranges while requests are resolved; run with -race.
func TestRefreshCloudflareWhileServing(t *testing.T) {
	src, _ := fakeCloudflareAPI(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(fakeIPsBody)) })
	p := cipDefaultProxies(t)
	shipped, fetched := CloudflareRanges(), []netip.Prefix(nil)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Either list is in force, never a mix: an edge of one list is believed only if
				// that list is.
				got := cipResult(p.ClientIP(cipRequest("172.64.0.1:1", cfh, "198.51.100.1")))
				if got != "198.51.100.1" && got != "172.64.0.1" {
					t.Errorf("ClientIP = %s", got)
					return
				}
			}
		})
	}
	for i := range 20 {
		if i%2 == 0 {
			require.NoError(t, p.RefreshCloudflare(context.Background(), src))
			fetched = p.CloudflareRanges()
		} else {
			require.NoError(t, p.SetCloudflareRanges(shipped))
		}
	}
	close(stop)
	wg.Wait()
	require.Equal(t, []string{"198.18.0.0/15", "2001:db8:cf::/48"}, prefixStrings(fetched))
}
