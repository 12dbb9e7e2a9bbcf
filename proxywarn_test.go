package ratelimit

import (
	"bytes"
	"cmp"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWarnsOnceAboutAnIgnoredProxy: a layer that keys clients by RemoteAddr warns, once, when a
// request from a proxy's kind of address carries forwarding headers, since every client behind
// that proxy then shares one budget; a client on the internet sending such headers, a peer that
// sends none, or a layer that already trusts proxies, gets no warning.
func TestWarnsOnceAboutAnIgnoredProxy(t *testing.T) {
	cloudflareEdge := CloudflareRanges()[0].Addr().Next().String()
	var cloudflareEdge6 string
	for _, p := range CloudflareRanges() {
		if p.Addr().Is6() {
			cloudflareEdge6 = "[" + p.Addr().Next().String() + "]"
			break
		}
	}
	for _, tc := range []struct {
		name      string
		peer      string
		header    string
		firstBare bool // the first request carries no forwarding header (a health check)
		max       int  // the layer's Max, 3 if 0: the third request spends the budget
		trusted   bool // the layer trusts proxies: no warning
		remote    bool // the layer counts in a remote store
		wantWarn  string
	}{
		{"ingress on a private network", "10.1.2.3:5000", "X-Forwarded-For", false, 0, false, false, "X-Forwarded-For"},
		{"reverse proxy on this host", "127.0.0.1:5000", "X-Real-Ip", false, 0, false, false, "X-Real-Ip"},
		{"IPv6 loopback, Forwarded", "[::1]:5000", "Forwarded", false, 0, false, false, "Forwarded"},
		{"IPv4-mapped private peer", "[::ffff:10.1.2.3]:5000", "True-Client-Ip", false, 0, false, false, "True-Client-Ip"},
		{"load balancer in shared address space", "100.64.0.9:5000", "X-Forwarded-For", false, 0, false, false, "X-Forwarded-For"},
		{"Unix socket", "@", "X-Forwarded-For", false, 0, false, false, "X-Forwarded-For"},
		{"no RemoteAddr", "", "X-Forwarded-For", false, 0, false, false, "X-Forwarded-For"},
		{"Cloudflare's edge", cloudflareEdge + ":443", "Cf-Connecting-Ip", false, 0, false, false, "CF-Connecting-IP"},
		{"Cloudflare's edge, IPv6", cloudflareEdge6 + ":443", "Cf-Connecting-Ip", false, 0, false, false, "CF-Connecting-IP"},
		{"a health check first, then the budget spent", "10.1.2.3:5000", "X-Forwarded-For", true, 0, false, false, "X-Forwarded-For"},
		{"remote store", "10.1.2.3:5000", "X-Forwarded-For", false, 0, false, true, "X-Forwarded-For"},
		{"remote store, a health check first", "10.1.2.3:5000", "X-Forwarded-For", true, 0, false, true, "X-Forwarded-For"},
		{"remote store, a budget not spent", "10.1.2.3:5000", "X-Forwarded-For", false, 100, false, true, "X-Forwarded-For"},
		{"a health check first, a budget not spent", "10.1.2.3:5000", "X-Forwarded-For", true, 100, false, false, ""},
		{"remote store, a health check first, a budget not spent", "10.1.2.3:5000", "X-Forwarded-For", true, 100, false, true, ""},
		{"internet client forging the header", "203.0.113.7:5000", "X-Forwarded-For", false, 0, false, false, ""},
		{"internet client forging CF-Connecting-IP", "203.0.113.7:5000", "Cf-Connecting-Ip", false, 0, false, false, ""},
		{"private peer without forwarding headers", "10.1.2.3:5000", "", false, 0, false, false, ""},
		{"layer that trusts its proxies", "10.1.2.3:5000", "X-Forwarded-For", false, 0, true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			opts := Options{
				Scope: "global", Max: cmp.Or(tc.max, 3), Window: time.Minute, Store: NewMemoryKV(),
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			}
			if tc.remote {
				opts.Store = &counterStore{mem: NewMemoryKV()}
			}
			if tc.trusted {
				proxies, err := ParseTrustedProxies("10.0.0.0/8")
				require.NoError(t, err)
				opts.ClientIP = proxies.ClientIP
			}
			h := newLimiter(t, opts).Handler(okHandler)
			for i := range 3 { // the budget: the peer's first request, and the one that spends it
				r := newRequest("/", tc.peer)
				if tc.header != "" && !(tc.firstBare && i == 0) {
					r.Header.Set(tc.header, "198.51.100."+string(rune('1'+i)))
				}
				require.Equal(t, http.StatusOK, serve(h, r).Code)
			}
			if tc.wantWarn == "" {
				require.Empty(t, logs.String())
				return
			}
			require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
			require.Contains(t, logs.String(), "all clients behind it share one budget")
			require.Contains(t, logs.String(), "header="+tc.wantWarn)
			require.Contains(t, logs.String(), "scope=global")
		})
	}
}

// TestProxyWarningIsLoggedOnce: many proxies, or many clients, still make one warning a layer.
func TestProxyWarningIsLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	l := newLimiter(t, Options{
		Scope: "global", Max: 100, Window: time.Minute, Store: NewMemoryKV(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	h := l.Handler(okHandler)
	for _, peer := range []string{"10.0.0.1:1", "10.0.0.2:1", "192.168.1.1:1", "10.0.0.1:1"} {
		r := newRequest("/", peer)
		r.Header.Set("X-Forwarded-For", "198.51.100.1")
		serve(h, r)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
}

// TestPublicPeer: the quick look at RemoteAddr never calls a proxy's kind of address public, and
// calls most internet addresses public, without parsing them.
func TestPublicPeer(t *testing.T) {
	for addr, want := range map[string]bool{
		"203.0.113.7:5000": true, "8.8.8.8:53": true, "172.15.0.1:1": true, "172.32.0.1:1": true,
		"192.167.1.1:1": true, "100.63.0.1:1": true, "100.128.0.1:1": true, "[2001:db8::1]:443": true,
		"10.1.2.3:5000": false, "127.0.0.1:1": false, "172.16.0.1:1": false, "172.31.255.255:1": false,
		"192.168.1.1:1": false, "100.64.0.1:1": false, "100.127.255.255:1": false, "[::1]:1": false,
		"[fd00::1]:1": false, "[::ffff:203.0.113.7]:1": false, "@": false, "": false, "1234": false,
		"10": false, "1.": false, "unix:/run/app.sock": false,
	} {
		require.Equal(t, want, publicPeer(addr), addr)
	}
	// Against the full classification, on random IPv4 peers.
	for range 100_000 {
		ip := netip.AddrFrom4([4]byte{byte(rand.IntN(256)), byte(rand.IntN(256)), byte(rand.IntN(256)), byte(rand.IntN(256))})
		local := ip.IsLoopback() || ip.IsPrivate() || sharedAddressSpace.Contains(ip)
		if publicPeer(netip.AddrPortFrom(ip, 1234).String()) {
			require.False(t, local, ip.String())
		} else {
			require.True(t, local || ip.As4()[0] == 0, ip.String())
		}
	}
}
