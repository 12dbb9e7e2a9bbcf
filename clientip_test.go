package ratelimit

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Addresses used throughout: 10.0.0.0/8 and 2001:db8:ffff::/48 are the user's proxies;
// 172.64.0.1, 162.158.0.1 and 2606:4700::1 are Cloudflare edges; 2a06:98c0:3600::103 is the
// Cloudflare address a Worker's subrequest comes from; 198.51.100.0/24, 203.0.113.0/24 and
// 2001:db8:1::/48 are clients.

// cipRequest builds a GET request from remote with headers given as name, value pairs; each pair
// adds one header line.
func cipRequest(remote string, headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func cipProxies(t testing.TB, opts ProxyOptions) *TrustedProxies {
	t.Helper()
	p, err := NewTrustedProxies(opts)
	require.NoError(t, err)
	return p
}

// cipDefaultProxies trusts the user's proxies and Cloudflare.
func cipDefaultProxies(t testing.TB) *TrustedProxies {
	t.Helper()
	return cipProxies(t, ProxyOptions{
		Prefixes:   []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")},
		Cloudflare: true,
	})
}

// cipResult renders a ClientIPFunc's answer: the address, or "!ok".
func cipResult(addr netip.Addr, ok bool) string {
	if !ok {
		return "!ok"
	}
	return addr.String()
}

const (
	xff  = "X-Forwarded-For"
	cfh  = "CF-Connecting-IP"
	cfh6 = "CF-Connecting-IPv6"
)

func TestParseIPClientIP(t *testing.T) {
	long := strings.Repeat("1", maxAddrText+1)
	tests := []struct {
		in, want string // want "" means not an address
	}{
		{"192.0.2.1", "192.0.2.1"},
		{"  192.0.2.1\t", "192.0.2.1"},
		{"192.0.2.1:8080", "192.0.2.1"},
		{"192.0.2.1:65535", "192.0.2.1"},
		{"2001:db8::1", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"[2001:db8::1]:443", "2001:db8::1"},
		{" [2001:db8::1]:443 ", "2001:db8::1"},
		{"fe80::1%eth0", "fe80::1"},
		{"[fe80::1%eth0]:80", "fe80::1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"[::ffff:192.0.2.1]:80", "192.0.2.1"},
		{"::ffff:c000:201", "192.0.2.1"},
		{"::1", "::1"},
		{"0.0.0.0", "0.0.0.0"},
		{"", ""},
		{"   ", ""},
		{"unknown", ""},
		{"_hidden", ""},
		{"example.com", ""},
		{"example.com:80", ""},
		{"192.0.2.1:", ""},
		{"192.0.2.1:port", ""},
		{"192.0.2.1:123456", ""},
		{"192.0.2.1:-1", ""},
		{"192.0.2.256", ""},
		{"192.0.2", ""},
		{"01.2.3.4", ""},
		{"192.0.2.1%eth0", ""},
		{"fe80::1%", ""},
		{"[192.0.2.1]", ""},
		{"[192.0.2.1]:80", ""},
		{"[2001:db8::1", ""},
		{"2001:db8::1]", ""},
		{"[2001:db8::1]:", ""},
		{"[2001:db8::1]x", ""},
		{"[2001:db8::1]]:80", ""},
		{"[[2001:db8::1]]", ""},
		{"[]", ""},
		{"[]:80", ""},
		{"2001:db8::1::2", ""},
		{"192.0.2.1, 192.0.2.2", ""},
		{"192.0.2.1 192.0.2.2", ""},
		{"for=192.0.2.1", ""},
		{"\"192.0.2.1\"", ""},
		{"192.0.2.1\x00", ""},
		{long, ""},
		{strings.Repeat(" ", maxAddrText) + "192.0.2.1", ""},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.in), func(t *testing.T) {
			addr, ok := parseIP(tt.in)
			if tt.want == "" {
				require.False(t, ok, "parsed as %v", addr)
				return
			}
			require.True(t, ok)
			require.Equal(t, tt.want, addr.String())
			require.False(t, addr.Is4In6())
			require.Empty(t, addr.Zone())
		})
	}
}

func TestClientKeyCanonicalClientIP(t *testing.T) {
	tests := []struct {
		name   string
		addr   string // "" is the zero Addr
		ok     bool
		v6Bits int
		want   string
	}{
		{"IPv4", "192.0.2.1", true, 64, "192.0.2.1"},
		{"IPv4-mapped becomes IPv4", "::ffff:192.0.2.1", true, 64, "192.0.2.1"},
		{"IPv4-mapped is not grouped", "::ffff:192.0.2.1", true, 8, "192.0.2.1"},
		{"IPv6 grouped by /64", "2001:db8:1:2:3:4:5:6", true, 64, "2001:db8:1:2::"},
		{"same /64, other host", "2001:db8:1:2:ffff:ffff:ffff:ffff", true, 64, "2001:db8:1:2::"},
		{"next /64", "2001:db8:1:3::1", true, 64, "2001:db8:1:3::"},
		{"IPv6 grouped by /48", "2001:db8:1:2:3:4:5:6", true, 48, "2001:db8:1::"},
		{"IPv6 grouped by /56", "2001:db8:1:2ff:3:4:5:6", true, 56, "2001:db8:1:200::"},
		{"IPv6 by /128", "2001:db8:1:2:3:4:5:6", true, 128, "2001:db8:1:2:3:4:5:6"},
		{"zone dropped", "fe80::1%eth0", true, 128, "fe80::1"},
		{"zone dropped, grouped", "fe80::1:2:3:4%eth0", true, 64, "fe80::"},
		{"longest key", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", true, 128, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"},
		{"not ok", "192.0.2.1", false, 64, "unknown"},
		{"zero address", "", true, 64, "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var addr netip.Addr
			if tt.addr != "" {
				addr = netip.MustParseAddr(tt.addr)
			}
			key := string(appendClientKey([]byte("ratelimit:x:"), addr, tt.ok, tt.v6Bits))
			require.Equal(t, "ratelimit:x:"+tt.want, key)
			requireSafeKey(t, strings.TrimPrefix(key, "ratelimit:x:"))
		})
	}
}

// requireSafeKey checks that a client key is short, printable and safe in a KV key and a URL path.
func requireSafeKey(t testing.TB, key string) {
	t.Helper()
	if key == unknownClient {
		return
	}
	require.NotEmpty(t, key)
	require.LessOrEqual(t, len(key), 39, "key %q", key)
	for i := 0; i < len(key); i++ {
		c := key[i]
		require.True(t, '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || c == '.' || c == ':', "key %q holds %q", key, c)
	}
}

func TestRemoteAddrIPIgnoresHeadersClientIP(t *testing.T) {
	r := cipRequest("203.0.113.9:5555", xff, "198.51.100.1", cfh, "198.51.100.2")
	require.Equal(t, "203.0.113.9", cipResult(RemoteAddrIP(r)))
	require.Equal(t, "!ok", cipResult(RemoteAddrIP(cipRequest("@"))))
}

func TestTrustedProxiesClientIP(t *testing.T) {
	p := cipDefaultProxies(t)
	tests := []struct {
		name    string
		remote  string
		headers []string
		want    string
	}{
		// The peer is not trusted: no header is read.
		{"untrusted peer, no headers", "203.0.113.9:5555", nil, "203.0.113.9"},
		{"untrusted peer, X-Forwarded-For ignored", "203.0.113.9:5555", []string{xff, "198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer, CF-Connecting-IP ignored", "203.0.113.9:5555", []string{cfh, "198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer claiming a trusted hop", "203.0.113.9:5555", []string{xff, "198.51.100.1, 10.0.0.2"}, "203.0.113.9"},
		{"untrusted IPv6 peer", "[2001:db8:1::9]:5555", []string{xff, "198.51.100.1"}, "2001:db8:1::9"},
		{"peer not an address", "@", []string{xff, "198.51.100.1"}, "!ok"},
		{"empty RemoteAddr", "", []string{cfh, "198.51.100.1"}, "!ok"},

		// A trusted proxy: walk X-Forwarded-For from the right.
		{"trusted peer, no header", "10.0.0.1:5555", nil, "10.0.0.1"},
		{"trusted peer, empty header", "10.0.0.1:5555", []string{xff, ""}, "10.0.0.1"},
		{"one client", "10.0.0.1:5555", []string{xff, "198.51.100.1"}, "198.51.100.1"},
		{"client-controlled left part", "10.0.0.1:5555", []string{xff, "1.1.1.1, 2.2.2.2, 198.51.100.1"}, "198.51.100.1"},
		{"trusted hops skipped", "10.0.0.1:5555", []string{xff, "1.1.1.1, 198.51.100.1, 10.0.0.3, 10.0.0.2"}, "198.51.100.1"},
		{"only trusted hops: the leftmost", "10.0.0.1:5555", []string{xff, "10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"no spaces", "10.0.0.1:5555", []string{xff, "1.1.1.1,198.51.100.1,10.0.0.2"}, "198.51.100.1"},
		{"tabs and spaces", "10.0.0.1:5555", []string{xff, "1.1.1.1 ,\t198.51.100.1\t, 10.0.0.2 "}, "198.51.100.1"},
		{"lines form one list", "10.0.0.1:5555", []string{xff, "1.1.1.1, 198.51.100.1", xff, "10.0.0.3", xff, "10.0.0.2"}, "198.51.100.1"},
		{"last line is the right end", "10.0.0.1:5555", []string{xff, "198.51.100.1", xff, "198.51.100.2"}, "198.51.100.2"},
		{"empty entries skipped", "10.0.0.1:5555", []string{xff, "1.1.1.1, 198.51.100.1, , 10.0.0.2,"}, "198.51.100.1"},
		{"empty line skipped", "10.0.0.1:5555", []string{xff, "198.51.100.1", xff, ""}, "198.51.100.1"},
		{"only commas", "10.0.0.1:5555", []string{xff, ",,, ,"}, "10.0.0.1"},
		{"unknown stops at the peer", "10.0.0.1:5555", []string{xff, "198.51.100.1, unknown"}, "10.0.0.1"},
		{"unknown stops at the last trusted hop", "10.0.0.1:5555", []string{xff, "1.1.1.1, unknown, 10.0.0.2"}, "10.0.0.2"},
		{"garbage stops", "10.0.0.1:5555", []string{xff, "1.1.1.1, 198.51.100.1x"}, "10.0.0.1"},
		{"obfuscated name stops", "10.0.0.1:5555", []string{xff, "1.1.1.1, _hidden, 10.0.0.2"}, "10.0.0.2"},
		{"host name stops", "10.0.0.1:5555", []string{xff, "1.1.1.1, example.com"}, "10.0.0.1"},
		{"Forwarded syntax stops", "10.0.0.1:5555", []string{xff, "1.1.1.1, for=198.51.100.1"}, "10.0.0.1"},
		{"IPv4 with port", "10.0.0.1:5555", []string{xff, "198.51.100.7:4711"}, "198.51.100.7"},
		{"IPv6 with port", "10.0.0.1:5555", []string{xff, "[2001:db8:1::7]:443"}, "2001:db8:1::7"},
		{"IPv6 in brackets", "10.0.0.1:5555", []string{xff, "[2001:db8:1::7]"}, "2001:db8:1::7"},
		{"IPv4 in brackets stops", "10.0.0.1:5555", []string{xff, "1.1.1.1, [198.51.100.7]"}, "10.0.0.1"},
		{"IPv6 with zone", "10.0.0.1:5555", []string{xff, "fe80::7%eth0"}, "fe80::7"},
		{"IPv4-mapped client", "10.0.0.1:5555", []string{xff, "::ffff:198.51.100.7"}, "198.51.100.7"},
		{"IPv4-mapped trusted hop", "10.0.0.1:5555", []string{xff, "198.51.100.7, ::ffff:10.0.0.2"}, "198.51.100.7"},
		{"IPv4-mapped peer", "[::ffff:10.0.0.1]:5555", []string{xff, "198.51.100.7"}, "198.51.100.7"},
		{"IPv6 trusted peer", "[2001:db8:ffff::1]:5555", []string{xff, "1.1.1.1, 2001:db8:1::7, 2001:db8:ffff::2"}, "2001:db8:1::7"},
		{"entry longer than an address", "10.0.0.1:5555", []string{xff, "1.1.1.1, " + strings.Repeat("9", 200)}, "10.0.0.1"},
		{"CF-Connecting-IP from a non-Cloudflare trusted peer ignored", "10.0.0.1:5555", []string{cfh, "1.1.1.1", xff, "198.51.100.1"}, "198.51.100.1"},

		// Cloudflare.
		{"Cloudflare peer: CF-Connecting-IP", "172.64.0.1:5555", []string{cfh, "198.51.100.1", xff, "1.1.1.1"}, "198.51.100.1"},
		{"Cloudflare IPv6 peer: CF-Connecting-IP IPv6", "[2606:4700::1]:5555", []string{cfh, "2001:db8:1::7"}, "2001:db8:1::7"},
		{"Cloudflare peer: CF-Connecting-IP with spaces", "162.158.0.1:5555", []string{cfh, " 198.51.100.1 "}, "198.51.100.1"},
		{"Cloudflare peer: no CF-Connecting-IP, X-Forwarded-For", "172.64.0.1:5555", []string{xff, "1.1.1.1, 198.51.100.1"}, "198.51.100.1"},
		{"Cloudflare peer: two CF-Connecting-IP lines ignored", "172.64.0.1:5555", []string{cfh, "1.1.1.1", cfh, "2.2.2.2", xff, "198.51.100.1"}, "198.51.100.1"},
		{"Cloudflare peer: invalid CF-Connecting-IP ignored", "172.64.0.1:5555", []string{cfh, "unknown", xff, "198.51.100.1"}, "198.51.100.1"},
		{"Cloudflare peer: nothing usable", "172.64.0.1:5555", []string{cfh, "junk"}, "172.64.0.1"},
		{"Worker subrequest: CF-Connecting-IP in Cloudflare's ranges", "172.64.0.1:5555", []string{cfh, "2a06:98c0:3600::103", xff, "1.1.1.1"}, "2a06:98c0:3600::103"},
		{"Worker subrequest: Cloudflare's client is not skipped", "172.64.0.1:5555", []string{xff, "1.1.1.1, 2a06:98c0:3600::103"}, "2a06:98c0:3600::103"},
		{"Cloudflare peer: Pseudo IPv4 rewrite, CF-Connecting-IPv6 believed", "172.64.0.1:5555", []string{cfh, "240.16.0.1", cfh6, "2001:db8:1:2::7"}, "2001:db8:1:2::7"},
		{"Cloudflare peer: real CF-Connecting-IP, CF-Connecting-IPv6 ignored", "172.64.0.1:5555", []string{cfh, "198.51.100.1", cfh6, "2001:db8:1:2::7"}, "198.51.100.1"},
		{"Cloudflare peer: CF-Connecting-IPv6 must be IPv6", "172.64.0.1:5555", []string{cfh, "198.51.100.1", cfh6, "198.51.100.9"}, "198.51.100.1"},
		{"Cloudflare peer: CF-Connecting-IPv6 invalid", "172.64.0.1:5555", []string{cfh, "198.51.100.1", cfh6, "nope"}, "198.51.100.1"},
		{"untrusted peer, CF-Connecting-IPv6 ignored", "203.0.113.9:5555", []string{cfh6, "2001:db8:1:2::7"}, "203.0.113.9"},
		{"trusted non-Cloudflare peer, CF-Connecting-IPv6 ignored", "10.0.0.1:5555", []string{cfh6, "2001:db8:1:2::7", xff, "198.51.100.1"}, "198.51.100.1"},
		{"chain through Cloudflare and a proxy", "10.0.0.1:5555", []string{xff, "1.1.1.1, 198.51.100.1, 172.64.0.1"}, "198.51.100.1"},
		{"chain: Worker behind Cloudflare and a proxy", "10.0.0.1:5555", []string{xff, "1.1.1.1, 2a06:98c0:3600::103, 172.64.0.1"}, "2a06:98c0:3600::103"},
		{"chain: Cloudflare reports a trusted proxy of yours", "10.0.0.1:5555", []string{xff, "1.1.1.1, 10.9.9.9, 172.64.0.1"}, "10.9.9.9"},
		{"chain: CF-Connecting-IP through a proxy ignored", "10.0.0.1:5555", []string{cfh, "1.1.1.1", xff, "198.51.100.1, 172.64.0.1"}, "198.51.100.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, cipResult(p.ClientIP(cipRequest(tt.remote, tt.headers...))))
		})
	}
}

func TestTrustCFConnectingIPFromAnyTrustedPeerClientIP(t *testing.T) {
	p := cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, TrustCFConnectingIP: true})
	tests := []struct {
		name    string
		remote  string
		headers []string
		want    string
	}{
		{"trusted peer: CF-Connecting-IP", "127.0.0.1:5555", []string{cfh, "198.51.100.1", xff, "1.1.1.1"}, "198.51.100.1"},
		{"trusted peer: no CF-Connecting-IP", "127.0.0.1:5555", []string{xff, "1.1.1.1, 198.51.100.2"}, "198.51.100.2"},
		{"untrusted peer: ignored", "203.0.113.9:5555", []string{cfh, "198.51.100.1"}, "203.0.113.9"},
		{"Cloudflare peer without the preset: untrusted", "172.64.0.1:5555", []string{cfh, "198.51.100.1"}, "172.64.0.1"},
		{"trusted peer: CF-Connecting-IPv6 next to a pseudo IPv4 address", "127.0.0.1:5555", []string{cfh, "240.16.0.1", cfh6, "2001:db8:1::7"}, "2001:db8:1::7"},
		{"trusted peer: CF-Connecting-IPv6 next to a real address ignored", "127.0.0.1:5555", []string{cfh, "198.51.100.1", cfh6, "2001:db8:1::7"}, "198.51.100.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, cipResult(p.ClientIP(cipRequest(tt.remote, tt.headers...))))
		})
	}
}

// TestCloudflareIPv6HeaderRuleClientIP pins down when CF-Connecting-IPv6 is believed: only when
// CF-Connecting-IP is absent or holds a pseudo IPv4 address from 240.0.0.0/4, which is what
// Cloudflare sends with Pseudo IPv4 set to "Overwrite headers". Next to a real CF-Connecting-IP it
// may be the client's own and is ignored. The rule is the same for every resolver that reads the
// Cloudflare headers.
func TestCloudflareIPv6HeaderRuleClientIP(t *testing.T) {
	const (
		v6      = "2001:db8:1:2::7"
		real4   = "198.51.100.7"
		pseudo4 = "240.16.0.1"
		right   = "203.0.113.50" // the rightmost X-Forwarded-For entry, sent with every case
	)
	resolvers := []struct {
		name   string
		fn     ClientIPFunc
		remote string
	}{
		{"Cloudflare preset", cipDefaultProxies(t).ClientIP, "172.64.1.1:5555"},
		{"Cloudflare preset, IPv6 edge", cipDefaultProxies(t).ClientIP, "[2606:4700::1]:5555"},
		{"TrustCFConnectingIP", cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, TrustCFConnectingIP: true}).ClientIP, "10.0.0.1:5555"},
		{"HeadersFromAnyPeerIP", HeadersFromAnyPeerIP, "203.0.113.9:5555"},
	}
	tests := []struct {
		name    string
		headers []string
		want    string
	}{
		// CF-Connecting-IP absent: CF-Connecting-IPv6 is used.
		{"absent IPv4: IPv6 used", []string{cfh6, v6}, v6},
		{"absent IPv4: IPv6 with spaces and brackets used", []string{cfh6, " [" + v6 + "] "}, v6},
		{"absent IPv4: IPv6 header holding IPv4 ignored", []string{cfh6, real4}, right},
		{"absent IPv4: IPv6 header holding IPv4-mapped ignored", []string{cfh6, "::ffff:" + real4}, right},
		{"absent IPv4: invalid IPv6 ignored", []string{cfh6, "nope"}, right},
		{"absent IPv4: two IPv6 lines ignored", []string{cfh6, v6, cfh6, "2001:db8:9::9"}, right},

		// CF-Connecting-IP a pseudo IPv4 address: CF-Connecting-IPv6 is used.
		{"pseudo IPv4: IPv6 used", []string{cfh, pseudo4, cfh6, v6}, v6},
		{"pseudo IPv4, first of the range: IPv6 used", []string{cfh, "240.0.0.0", cfh6, v6}, v6},
		{"pseudo IPv4, last of the range: IPv6 used", []string{cfh, "255.255.255.255", cfh6, v6}, v6},
		{"pseudo IPv4, IPv4-mapped: IPv6 used", []string{cfh, "::ffff:" + pseudo4, cfh6, v6}, v6},
		{"pseudo IPv4 with spaces: IPv6 used", []string{cfh, " " + pseudo4 + "\t", cfh6, v6}, v6},
		{"pseudo IPv4, invalid IPv6: IPv4 used", []string{cfh, pseudo4, cfh6, "nope"}, pseudo4},
		{"pseudo IPv4, IPv6 header holding IPv4: IPv4 used", []string{cfh, pseudo4, cfh6, real4}, pseudo4},
		{"pseudo IPv4, two IPv6 lines: IPv4 used", []string{cfh, pseudo4, cfh6, v6, cfh6, "2001:db8:9::9"}, pseudo4},
		{"pseudo IPv4, no IPv6: IPv4 used", []string{cfh, pseudo4}, pseudo4},

		// CF-Connecting-IP a real address: CF-Connecting-IPv6 is ignored.
		{"real IPv4: IPv6 ignored", []string{cfh, real4, cfh6, v6}, real4},
		{"real IPv4 just below the range: IPv6 ignored", []string{cfh, "239.255.255.255", cfh6, v6}, "239.255.255.255"},
		{"real IPv4 in Cloudflare's ranges: IPv6 ignored", []string{cfh, "172.64.0.9", cfh6, v6}, "172.64.0.9"},
		{"real IPv6 client: IPv6 header ignored", []string{cfh, "2001:db8:5::5", cfh6, v6}, "2001:db8:5::5"},
		{"real IPv4, invalid IPv6: IPv4 used", []string{cfh, real4, cfh6, "nope"}, real4},
		{"real IPv4, IPv6 header first in the request: ignored", []string{cfh6, v6, cfh, real4}, real4},

		// CF-Connecting-IP present but unusable: not absent, so CF-Connecting-IPv6 is ignored too
		// and X-Forwarded-For decides.
		{"invalid IPv4: IPv6 ignored", []string{cfh, "junk", cfh6, v6}, right},
		{"empty IPv4: IPv6 ignored", []string{cfh, "", cfh6, v6}, right},
		{"two IPv4 lines: IPv6 ignored", []string{cfh, pseudo4, cfh, pseudo4, cfh6, v6}, right},
	}
	for _, rv := range resolvers {
		for _, tt := range tests {
			t.Run(rv.name+"/"+tt.name, func(t *testing.T) {
				r := cipRequest(rv.remote, append([]string{xff, "1.1.1.1, " + right}, tt.headers...)...)
				require.Equal(t, tt.want, cipResult(rv.fn(r)))
			})
		}
	}
	// Peers that may not set the Cloudflare headers are not moved by CF-Connecting-IPv6 either.
	p := cipDefaultProxies(t)
	for _, remote := range []string{"203.0.113.9:5555", "10.0.0.1:5555"} {
		r := cipRequest(remote, cfh, pseudo4, cfh6, v6, xff, right)
		require.NotEqual(t, v6, cipResult(p.ClientIP(r)), "peer %s", remote)
	}
}

// TestPseudoIPv4InForwardedClientIP covers Cloudflare's Pseudo IPv4 in "Overwrite headers" mode
// behind a proxy of the user's, where CF-Connecting-IP is not read: Cloudflare writes its made-up
// address into X-Forwarded-For too, and the client is then CF-Connecting-IPv6, when a Cloudflare
// hop reported the address (or, with TrustCFConnectingIP, any trusted hop).
func TestPseudoIPv4InForwardedClientIP(t *testing.T) {
	const (
		v6      = "2001:db8:1:2::7"
		pseudo4 = "240.16.0.1"
	)
	chain := cipDefaultProxies(t).ClientIP // Cloudflare, then the user's proxies in 10.0.0.0/8
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}
	tunnel := cipProxies(t, ProxyOptions{Prefixes: loopback, TrustCFConnectingIP: true}).ClientIP
	localProxy := cipProxies(t, ProxyOptions{Prefixes: loopback}).ClientIP
	ingress := cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}).ClientIP
	// A (strange) proxy of the user's inside 240.0.0.0/4: its own address is no pseudo address.
	classE := cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("240.1.0.0/16")}}).ClientIP
	tests := []struct {
		name    string
		fn      ClientIPFunc
		remote  string
		headers []string
		want    string
	}{
		{"Cloudflare then a proxy: IPv6 used", chain, "10.0.0.1:5555", []string{xff, "1.1.1.1, " + pseudo4 + ", 172.64.0.1", cfh, pseudo4, cfh6, v6}, v6},
		{"Cloudflare then a proxy, no CF-Connecting-IP: IPv6 used", chain, "10.0.0.1:5555", []string{xff, pseudo4 + ", 172.64.0.1", cfh6, v6}, v6},
		{"Cloudflare then two proxies: IPv6 used", chain, "10.0.0.1:5555", []string{xff, pseudo4 + ", 172.64.0.1, 10.0.0.2", cfh6, v6}, v6},
		{"Tunnel, TrustCFConnectingIP: IPv6 used", tunnel, "127.0.0.1:5555", []string{xff, pseudo4, cfh, pseudo4, cfh6, v6}, v6},
		{"Tunnel, TrustCFConnectingIP, no CF-Connecting-IP: IPv6 used", tunnel, "[::1]:5555", []string{xff, pseudo4, cfh6, v6}, v6},
		{"a proxy of yours reports a 240.0.0.0/4 address: taken as it is", localProxy, "127.0.0.1:5555", []string{xff, pseudo4, cfh, pseudo4, cfh6, v6}, pseudo4},
		{"an ingress reports a host's real 240.0.0.0/4 address: taken as it is", ingress, "10.0.0.1:5555", []string{xff, "240.10.0.5", cfh6, v6}, "240.10.0.5"},
		{"any peer: IPv6 used", HeadersFromAnyPeerIP, "203.0.113.9:5555", []string{xff, "1.1.1.1, " + pseudo4, cfh6, v6}, v6},
		{"pseudo address, no IPv6 header: pseudo address", chain, "10.0.0.1:5555", []string{xff, pseudo4 + ", 172.64.0.1"}, pseudo4},
		{"pseudo address, two IPv6 lines: pseudo address", tunnel, "127.0.0.1:5555", []string{xff, pseudo4, cfh6, v6, cfh6, "2001:db8:9::9"}, pseudo4},
		{"pseudo address, IPv6 header holding IPv4: pseudo address", tunnel, "127.0.0.1:5555", []string{xff, pseudo4, cfh6, "198.51.100.7"}, pseudo4},
		{"pseudo address, invalid IPv6 header: pseudo address", tunnel, "127.0.0.1:5555", []string{xff, pseudo4, cfh6, "nope"}, pseudo4},
		{"real address: IPv6 header ignored", chain, "10.0.0.1:5555", []string{xff, "198.51.100.1, 172.64.0.1", cfh6, v6}, "198.51.100.1"},
		{"real address through a proxy of yours: IPv6 header ignored", localProxy, "127.0.0.1:5555", []string{xff, "198.51.100.1", cfh6, v6}, "198.51.100.1"},
		{"walk stopped at a trusted hop: IPv6 header ignored", chain, "10.0.0.1:5555", []string{xff, pseudo4 + ", unknown", cfh6, v6}, "10.0.0.1"},
		{"untrusted peer: IPv6 header ignored", chain, "203.0.113.9:5555", []string{xff, pseudo4, cfh6, v6}, "203.0.113.9"},
		{"trusted peer inside 240.0.0.0/4, no entry: the peer", classE, "240.1.0.1:5555", []string{cfh6, v6}, "240.1.0.1"},
		{"trusted hop inside 240.0.0.0/4 ends the walk: the hop", classE, "240.1.0.1:5555", []string{xff, "unknown, 240.1.0.2", cfh6, v6}, "240.1.0.2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, cipResult(tt.fn(cipRequest(tt.remote, tt.headers...))))
		})
	}
}

func TestZeroTrustedProxiesIsRemoteAddrClientIP(t *testing.T) {
	var p TrustedProxies
	r := cipRequest("203.0.113.9:5555", xff, "198.51.100.1", cfh, "198.51.100.2")
	require.Equal(t, "203.0.113.9", cipResult(p.ClientIP(r)))
	require.Nil(t, p.CloudflareRanges())
}

func TestHeadersFromAnyPeerIPClientIP(t *testing.T) {
	tests := []struct {
		name    string
		remote  string
		headers []string
		want    string
	}{
		{"no headers", "203.0.113.9:5555", nil, "203.0.113.9"},
		{"CF-Connecting-IP from any peer", "203.0.113.9:5555", []string{cfh, "198.51.100.1", xff, "1.1.1.1"}, "198.51.100.1"},
		{"rightmost X-Forwarded-For, not the client-written leftmost", "203.0.113.9:5555", []string{xff, "1.1.1.1, 198.51.100.1"}, "198.51.100.1"},
		{"lines form one list", "203.0.113.9:5555", []string{xff, "1.1.1.1", xff, "198.51.100.1"}, "198.51.100.1"},
		{"trailing empty entry skipped", "203.0.113.9:5555", []string{xff, "198.51.100.1, "}, "198.51.100.1"},
		{"unusable rightmost: the peer", "203.0.113.9:5555", []string{xff, "198.51.100.1, unknown"}, "203.0.113.9"},
		{"two CF-Connecting-IP lines ignored", "203.0.113.9:5555", []string{cfh, "1.1.1.1", cfh, "2.2.2.2"}, "203.0.113.9"},
		{"CF-Connecting-IPv6 next to a pseudo IPv4 address", "203.0.113.9:5555", []string{cfh, "240.16.0.1", cfh6, "2001:db8:1::7"}, "2001:db8:1::7"},
		{"CF-Connecting-IPv6 next to a real address ignored", "203.0.113.9:5555", []string{cfh, "198.51.100.1", cfh6, "2001:db8:1::7"}, "198.51.100.1"},
		{"Unix socket peer: headers still read", "@", []string{xff, "198.51.100.1"}, "198.51.100.1"},
		{"Unix socket peer, no headers", "@", nil, "!ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, cipResult(HeadersFromAnyPeerIP(cipRequest(tt.remote, tt.headers...))))
		})
	}
}

// TestForwardedBoundsClientIP shows that the work per request is bounded: long and numerous
// X-Forwarded-For entries stop the walk at the last trusted hop within the bounds.
func TestForwardedBoundsClientIP(t *testing.T) {
	p := cipDefaultProxies(t)
	hop := func(i int) string { return "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) }
	// 10,000 trusted hops (numbered from the right) with a client at the far left.
	entries := []string{"198.51.100.1"}
	for i := 10000; i >= 1; i-- {
		entries = append(entries, hop(i))
	}
	lastReachable := hop(MaxForwardedHops) // the 32nd entry from the right

	t.Run("thousands of entries on one line", func(t *testing.T) {
		r := cipRequest("10.0.0.1:5555", xff, strings.Join(entries, ","))
		require.Equal(t, lastReachable, cipResult(p.ClientIP(r)))
	})
	t.Run("thousands of lines", func(t *testing.T) {
		r := cipRequest("10.0.0.1:5555")
		r.Header[xff] = entries
		require.Equal(t, lastReachable, cipResult(p.ClientIP(r)))
	})
	t.Run("thousands of empty lines", func(t *testing.T) {
		r := cipRequest("10.0.0.1:5555")
		r.Header[xff] = append([]string{"198.51.100.1"}, make([]string, 10000)...)
		require.Equal(t, "10.0.0.1", cipResult(p.ClientIP(r)))
	})
	t.Run("a megabyte of commas", func(t *testing.T) {
		r := cipRequest("10.0.0.1:5555", xff, "198.51.100.1"+strings.Repeat(",", 1<<20))
		require.Equal(t, "10.0.0.1", cipResult(p.ClientIP(r)))
	})
	t.Run("a megabyte without a comma", func(t *testing.T) {
		r := cipRequest("10.0.0.1:5555", xff, strings.Repeat("9", 1<<20))
		require.Equal(t, "10.0.0.1", cipResult(p.ClientIP(r)))
	})
	t.Run("a long line whose right end holds the client", func(t *testing.T) {
		r := cipRequest("10.0.0.1:5555", xff, strings.Repeat("1.1.1.1, ", 100000)+"198.51.100.1, 10.0.0.2")
		require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(r)))
	})
	t.Run("byte budget: an entry past it is not read", func(t *testing.T) {
		// From the right: a trusted hop (9 bytes with its comma), 25 blank entries of 100 bytes,
		// one blank entry of n bytes, then the client's 12 bytes, which fit while n <= 1549.
		line := func(n int) string {
			return "198.51.100.1," + strings.Repeat(" ", n) + "," + strings.Repeat(strings.Repeat(" ", 100)+",", 25) + "10.0.0.2"
		}
		fits := MaxForwardedBytes - 9 - 25*101 - 1 - len("198.51.100.1")
		require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(cipRequest("10.0.0.1:5555", xff, line(fits)))))
		require.Equal(t, "10.0.0.2", cipResult(p.ClientIP(cipRequest("10.0.0.1:5555", xff, line(fits+1)))))
	})
	t.Run("whether an entry fits does not depend on the text to its left", func(t *testing.T) {
		// The client's entry ends the budget exactly (or overshoots it by one byte); what the
		// client writes further left must not change the result.
		right := func(n int) string { return "," + strings.Repeat(" ", n) + ",10.0.0.2" }
		fits := MaxForwardedBytes - 9 - 1 - len("198.51.100.1")
		for _, left := range []string{"", ",", "1.1.1.1,", " ,", strings.Repeat("x", 5000) + ","} {
			r := cipRequest("10.0.0.1:5555", xff, left+"198.51.100.1"+right(fits))
			require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(r)), "left part %.20q", left)
			r = cipRequest("10.0.0.1:5555", xff, left+"198.51.100.1"+right(fits+1))
			require.Equal(t, "10.0.0.2", cipResult(p.ClientIP(r)), "left part %.20q", left)
		}
	})
}

// cipLimiter is one layer with Max 3 per minute in a MemoryKV, its clock fixed mid-window.
func cipLimiter(t *testing.T, clientIP ClientIPFunc) http.Handler {
	t.Helper()
	now := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	l, err := New(Options{
		Scope: "spoof", Max: 3, Window: time.Minute,
		Store:    NewMemoryKV(WithClock(clock)),
		ClientIP: clientIP,
		Now:      clock,
		Logger:   slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	return l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
}

func cipStatus(h http.Handler, r *http.Request) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Code
}

// requireNoFreshBudget sends ten requests, each built by req(i) with a fresh spoofed value:
// the first three pass, every later one gets 429. A request from another client then still
// passes, so the 429s come from this client's key, not from a limiter that denies everyone.
func requireNoFreshBudget(t *testing.T, h http.Handler, req func(i int) *http.Request, other *http.Request) {
	t.Helper()
	for i := range 10 {
		want := http.StatusNoContent
		if i >= 3 {
			want = http.StatusTooManyRequests
		}
		require.Equal(t, want, cipStatus(h, req(i)), "request %d", i+1)
	}
	require.Equal(t, http.StatusNoContent, cipStatus(h, other), "another client")
}

func fresh(i int) string { return "198.51.100." + strconv.Itoa(i+1) }

func TestSpoofableRegression_FreshXForwardedForFromUntrustedPeer(t *testing.T) {
	for name, clientIP := range map[string]ClientIPFunc{
		"RemoteAddrIP":   RemoteAddrIP,
		"TrustedProxies": cipDefaultProxies(t).ClientIP,
	} {
		t.Run(name, func(t *testing.T) {
			h := cipLimiter(t, clientIP)
			requireNoFreshBudget(t, h, func(i int) *http.Request {
				return cipRequest("203.0.113.9:"+strconv.Itoa(1000+i), xff, fresh(i))
			}, cipRequest("203.0.113.10:1000", xff, fresh(0)))
		})
	}
}

func TestSpoofableRegression_FreshCFConnectingIPFromUntrustedPeer(t *testing.T) {
	for name, clientIP := range map[string]ClientIPFunc{
		"RemoteAddrIP":   RemoteAddrIP,
		"TrustedProxies": cipDefaultProxies(t).ClientIP,
	} {
		t.Run(name, func(t *testing.T) {
			h := cipLimiter(t, clientIP)
			requireNoFreshBudget(t, h, func(i int) *http.Request {
				return cipRequest("203.0.113.9:1000", cfh, fresh(i), cfh6, "2001:db8:"+strconv.Itoa(i+1)+"::1", xff, fresh(i+100))
			}, cipRequest("203.0.113.10:1000", cfh, fresh(0)))
		})
	}
}

func TestSpoofableRegression_ClientControlledLeftPartOfXForwardedForBehindTrustedChain(t *testing.T) {
	h := cipLimiter(t, cipDefaultProxies(t).ClientIP)
	// Load balancer 10.0.0.1 <- ingress 10.0.0.2 <- Cloudflare 172.64.0.1 <- client 203.0.113.7,
	// which writes whatever it likes on the left, including addresses of trusted proxies.
	requireNoFreshBudget(t, h, func(i int) *http.Request {
		left := fresh(i) + ", 10.0.0." + strconv.Itoa(100+i) + ", unknown, " + fresh(i+50)
		return cipRequest("10.0.0.1:5555", xff, left+", 203.0.113.7, 172.64.0.1, 10.0.0.2")
	}, cipRequest("10.0.0.1:5555", xff, "203.0.113.8, 172.64.0.1, 10.0.0.2"))

	// The same client, sending its own X-Forwarded-For line ahead of the proxies' lines.
	h = cipLimiter(t, cipDefaultProxies(t).ClientIP)
	requireNoFreshBudget(t, h, func(i int) *http.Request {
		return cipRequest("10.0.0.1:5555", xff, fresh(i), xff, "203.0.113.7, 172.64.0.1", xff, "10.0.0.2")
	}, cipRequest("10.0.0.1:5555", xff, "203.0.113.8, 172.64.0.1", xff, "10.0.0.2"))
}

func TestSpoofableRegression_CFConnectingIPFromNonCloudflarePeerIgnored(t *testing.T) {
	// Cloudflare preset plus a trusted load balancer: CF-Connecting-IP is believed from
	// Cloudflare's ranges only, not from the load balancer nor from a direct client.
	p := cipDefaultProxies(t)
	for name, remote := range map[string]string{
		"direct client":                "203.0.113.9:1000",
		"trusted non-Cloudflare proxy": "10.0.0.1:1000",
		"IPv6 client":                  "[2001:db8:1::9]:1000",
		"IPv4-mapped direct client":    "[::ffff:203.0.113.9]:1000",
		"address just outside a range": "172.72.0.1:1000", // 172.64.0.0/13 ends at 172.71.255.255
		"IPv6 just outside a CF range": "[2606:4701::1]:1000",
	} {
		t.Run(name, func(t *testing.T) {
			h := cipLimiter(t, p.ClientIP)
			requireNoFreshBudget(t, h, func(i int) *http.Request {
				return cipRequest(remote, cfh, fresh(i), xff, "172.64.0.1")
			}, cipRequest("203.0.113.200:1000", cfh, fresh(0)))
		})
	}
	// Control: from Cloudflare's edge the header is believed, so each client has its own budget.
	h := cipLimiter(t, p.ClientIP)
	for i := range 10 {
		require.Equal(t, http.StatusNoContent, cipStatus(h, cipRequest("172.64.0.1:1000", cfh, fresh(i))))
	}
}

// TestSpoofableRegression_CFConnectingIPv6WithRealIPv4 is the review finding: from a Cloudflare
// edge (172.64.1.1) with a real CF-Connecting-IP, a client-supplied CF-Connecting-IPv6 that
// differs on every request used to be believed, and 20 of 20 requests passed a limiter with Max 1.
// CF-Connecting-IPv6 now counts only next to a pseudo IPv4 address (240.0.0.0/4) or no
// CF-Connecting-IP at all, so every request after the first is refused.
func TestSpoofableRegression_CFConnectingIPv6WithRealIPv4(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	limiter := func(t *testing.T, clientIP ClientIPFunc) http.Handler {
		t.Helper()
		l, err := New(Options{
			Scope: "spoof6", Max: 1, Window: time.Minute,
			Store:    NewMemoryKV(WithClock(clock)),
			ClientIP: clientIP,
			Now:      clock,
			Logger:   slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		return l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		}))
	}
	// A different /48 every time, so no IPv6 grouping can hide a fresh key.
	spoofed := func(i int) string { return "2001:db8:" + strconv.FormatInt(int64(i+1), 16) + "::1" }
	resolvers := []struct {
		name string
		fn   ClientIPFunc
	}{
		{"Cloudflare preset", cipDefaultProxies(t).ClientIP},
		{"TrustCFConnectingIP", cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("172.64.0.0/13")}, TrustCFConnectingIP: true}).ClientIP},
		{"HeadersFromAnyPeerIP", HeadersFromAnyPeerIP},
	}
	for _, rv := range resolvers {
		for _, client := range []string{"198.51.100.7", "2001:db8:77::7"} {
			t.Run(rv.name+"/CF-Connecting-IP "+client, func(t *testing.T) {
				h := limiter(t, rv.fn)
				for i := range 20 {
					want := http.StatusNoContent
					if i > 0 {
						want = http.StatusTooManyRequests
					}
					r := cipRequest("172.64.1.1:"+strconv.Itoa(1000+i), cfh, client, cfh6, spoofed(i))
					require.Equal(t, want, cipStatus(h, r), "request %d", i+1)
				}
				// Another client still has its budget: the 429s are this client's.
				require.Equal(t, http.StatusNoContent, cipStatus(h, cipRequest("172.64.1.1:999", cfh, "198.51.100.8", cfh6, spoofed(0))))
			})
		}
		// Control: with a pseudo IPv4 address, as Cloudflare sends it, CF-Connecting-IPv6 is the
		// client, and one /64 still shares one budget however the pseudo address varies.
		t.Run(rv.name+"/pseudo IPv4 control", func(t *testing.T) {
			h := limiter(t, rv.fn)
			for i := range 5 {
				r := cipRequest("172.64.1.1:1000", cfh, "240.16.0."+strconv.Itoa(i+1), cfh6, spoofed(i))
				require.Equal(t, http.StatusNoContent, cipStatus(h, r), "IPv6 client %d", i+1)
			}
			for i := range 5 {
				r := cipRequest("172.64.1.1:1000", cfh, "240.17.0."+strconv.Itoa(i+1), cfh6, "2001:db8:1::"+strconv.Itoa(i+2))
				require.Equal(t, http.StatusTooManyRequests, cipStatus(h, r), "same /64, request %d", i+1)
			}
		})
	}
}

// TestSpoofableRegression_PseudoIPv4BehindAProxy: with Pseudo IPv4 set to "Overwrite headers",
// the addresses of one /64 get made-up IPv4 addresses of their own in X-Forwarded-For. Behind
// Cloudflare and a proxy of the user's, or Cloudflare Tunnel as the README sets it up for this
// mode, they must still share one budget.
func TestSpoofableRegression_PseudoIPv4BehindAProxy(t *testing.T) {
	tunnel, err := ParseTrustedProxies("127.0.0.1, ::1, cf-connecting-ip") // as the README sets it up
	require.NoError(t, err)
	for _, tc := range []struct {
		name, peer, edge string
		clientIP         ClientIPFunc
	}{
		{"Cloudflare then a load balancer", "10.0.0.1:5555", ", 172.64.0.1", cipDefaultProxies(t).ClientIP},
		{"Cloudflare Tunnel", "127.0.0.1:5555", "", tunnel.ClientIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := cipLimiter(t, tc.clientIP)
			request := func(pseudo, v6 string) *http.Request {
				return cipRequest(tc.peer, xff, pseudo+tc.edge, cfh, pseudo, cfh6, v6)
			}
			requireNoFreshBudget(t, h, func(i int) *http.Request {
				n := strconv.Itoa(i + 1)
				return request("240.16.0."+n, "2001:db8:1:2::"+n)
			}, request("240.16.0.99", "2001:db8:1:3::1"))
		})
	}
}

// TestSpoofableRegression_ClassEHostBehindAnIngress: some networks (GCP subnets, GKE pods) give
// hosts real addresses in 240.0.0.0/4. Such a host behind an ingress of the user's that passes
// client headers on must not choose its key with a CF-Connecting-IPv6 of its own.
func TestSpoofableRegression_ClassEHostBehindAnIngress(t *testing.T) {
	ingress := cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	h := cipLimiter(t, ingress.ClientIP)
	requireNoFreshBudget(t, h, func(i int) *http.Request {
		return cipRequest("10.0.0.1:5555", xff, "240.10.0.5", cfh6, "2001:db8:"+strconv.Itoa(i+1)+"::1")
	}, cipRequest("10.0.0.1:5555", xff, "240.10.0.6", cfh6, "2001:db8:1::1"))
}

func TestSpoofableRegression_IPv6RotationWithinSlash64ClientIP(t *testing.T) {
	h := cipLimiter(t, RemoteAddrIP)
	requireNoFreshBudget(t, h, func(i int) *http.Request {
		return cipRequest("[2001:db8:1:2:" + strconv.FormatInt(int64(i*4099+1), 16) + "::1]:443")
	}, cipRequest("[2001:db8:1:3::1]:443"))
	// Behind a trusted proxy, the same holds for the address it reports.
	h = cipLimiter(t, cipDefaultProxies(t).ClientIP)
	requireNoFreshBudget(t, h, func(i int) *http.Request {
		return cipRequest("10.0.0.1:5555", xff, "2001:db8:1:2:"+strconv.Itoa(i+1)+"::9")
	}, cipRequest("10.0.0.1:5555", xff, "2001:db8:1:3::9"))
}

func TestIPv4MappedPeerSharesIPv4BudgetClientIP(t *testing.T) {
	h := cipLimiter(t, RemoteAddrIP)
	requireNoFreshBudget(t, h, func(i int) *http.Request {
		if i%2 == 0 {
			return cipRequest("203.0.113.9:1000")
		}
		return cipRequest("[::ffff:203.0.113.9]:1000")
	}, cipRequest("203.0.113.10:1000"))
}

func TestNoAddressIsCountedUnderOneKeyClientIP(t *testing.T) {
	p := cipDefaultProxies(t)
	h := cipLimiter(t, p.ClientIP)
	requireNoFreshBudget(t, h, func(i int) *http.Request {
		return cipRequest("not-an-address-"+strconv.Itoa(i), xff, fresh(i))
	}, cipRequest("203.0.113.9:1000"))
}

func TestClientIPAllocs(t *testing.T) {
	p := cipDefaultProxies(t)
	buf := make([]byte, 0, 96)
	for _, tt := range []struct {
		name string
		fn   ClientIPFunc
		r    *http.Request
	}{
		{"RemoteAddrIP IPv4", RemoteAddrIP, cipRequest("203.0.113.9:5555")},
		{"RemoteAddrIP IPv6", RemoteAddrIP, cipRequest("[2001:db8:1:2:3:4:5:6]:5555")},
		{"RemoteAddrIP IPv4-mapped", RemoteAddrIP, cipRequest("[::ffff:203.0.113.9]:5555")},
		{"TrustedProxies untrusted peer", p.ClientIP, cipRequest("203.0.113.9:5555", xff, "1.1.1.1")},
		{"TrustedProxies chain", p.ClientIP, cipRequest("10.0.0.1:5555", xff, "1.1.1.1, 2001:db8:1::7, 172.64.0.1, 10.0.0.2")},
		{"TrustedProxies Cloudflare", p.ClientIP, cipRequest("[2606:4700::1]:5555", cfh, "2001:db8:1::7")},
		{"TrustedProxies Cloudflare pseudo IPv4", p.ClientIP, cipRequest("172.64.0.1:5555", cfh, "240.16.0.1", cfh6, "2001:db8:1::7")},
		{"TrustedProxies Cloudflare real IPv4, IPv6 ignored", p.ClientIP, cipRequest("172.64.0.1:5555", cfh, "198.51.100.7", cfh6, "2001:db8:1::7")},
		{"TrustedProxies Cloudflare IPv6 header alone", p.ClientIP, cipRequest("172.64.0.1:5555", cfh6, "2001:db8:1::7")},
		{"TrustedProxies many lines", p.ClientIP, cipRequest("10.0.0.1:5555", xff, "1.1.1.1", xff, "10.0.0.3", xff, "10.0.0.2")},
		{"HeadersFromAnyPeerIP", HeadersFromAnyPeerIP, cipRequest("203.0.113.9:5555", xff, "1.1.1.1, 198.51.100.1")},
		{"HeadersFromAnyPeerIP pseudo IPv4", HeadersFromAnyPeerIP, cipRequest("203.0.113.9:5555", cfh, "240.16.0.1", cfh6, "2001:db8:1::7")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(200, func() {
				addr, ok := tt.fn(tt.r)
				buf = appendClientKey(buf[:0], addr, ok, DefaultIPv6PrefixBits)
			})
			require.Zero(t, allocs)
		})
	}
}

func TestProxyOptionsRejected(t *testing.T) {
	tests := []struct {
		name string
		opts ProxyOptions
		want []string
	}{
		{"nothing trusted", ProxyOptions{}, []string{"ratelimit: ProxyOptions trusts no proxy"}},
		{"CF-Connecting-IP switch alone", ProxyOptions{TrustCFConnectingIP: true}, []string{"trusts no proxy"}},
		{"zero prefix", ProxyOptions{Prefixes: []netip.Prefix{{}}}, []string{"ratelimit: ProxyOptions.Prefixes[0]: not a valid prefix"}},
		{"IPv4 /0", ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("0.0.0.0/0")}},
			[]string{"Prefixes[1]: prefix 0.0.0.0/0 trusts every address", "HeadersFromAnyPeerIP"}},
		{"IPv6 /0", ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("::/0")}, Cloudflare: true}, []string{"prefix ::/0 trusts every address"}},
		{"IPv4-mapped /96", ProxyOptions{Prefixes: []netip.Prefix{netip.MustParsePrefix("::ffff:0.0.0.0/96")}}, []string{"trusts every address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewTrustedProxies(tt.opts)
			require.Nil(t, p)
			require.Error(t, err)
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestProxyOptionsNormalised(t *testing.T) {
	p := cipProxies(t, ProxyOptions{Prefixes: []netip.Prefix{
		netip.MustParsePrefix("::ffff:10.1.0.0/112"), // IPv4-mapped: 10.1.0.0/16
		netip.MustParsePrefix("192.0.2.77/24"),       // host bits set: masked
	}})
	require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(cipRequest("10.1.2.3:1", xff, "198.51.100.1"))))
	require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(cipRequest("192.0.2.1:1", xff, "198.51.100.1"))))
	require.Equal(t, "10.2.0.1", cipResult(p.ClientIP(cipRequest("10.2.0.1:1", xff, "198.51.100.1"))))
	require.Nil(t, p.CloudflareRanges(), "no preset")
}

// TestProxyListTrustCFConnectingIP: the entry "cf-connecting-ip" believes CF-Connecting-IP from
// every proxy listed, as ProxyOptions.TrustCFConnectingIP does; without it, only the
// X-Forwarded-For walk decides.
func TestProxyListTrustCFConnectingIP(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"127.0.0.1, ::1, cf-connecting-ip", "198.51.100.1"},
		{"CF-Connecting-IP,127.0.0.1", "198.51.100.1"},
		{"127.0.0.1, ::1", "203.0.113.5"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			p, err := ParseTrustedProxies(tc.in)
			require.NoError(t, err)
			r := cipRequest("127.0.0.1:5555", cfh, "198.51.100.1", xff, "203.0.113.5")
			require.Equal(t, tc.want, cipResult(p.ClientIP(r)))
			// From a peer that is not listed, nothing is believed.
			require.Equal(t, "192.0.2.9", cipResult(p.ClientIP(cipRequest("192.0.2.9:5555", cfh, "198.51.100.1"))))
		})
	}
}

func TestProxyListSyntax(t *testing.T) {
	valid := []struct {
		in         string
		cloudflare bool
		trusted    []string // peers that must be trusted
		untrusted  []string
	}{
		{"cloudflare", true, []string{"172.64.0.1", "2606:4700::1"}, []string{"10.0.0.1"}},
		{" CloudFlare ", true, []string{"172.64.0.1"}, nil},
		{"10.0.0.0/8", false, []string{"10.1.2.3"}, []string{"172.64.0.1", "11.0.0.1"}},
		{"cloudflare,10.0.0.0/8", true, []string{"172.64.0.1", "10.1.2.3"}, []string{"11.0.0.1"}},
		{"10.0.0.0/8 , 2001:db8::/32, cloudflare", true, []string{"10.1.2.3", "2001:db8::5", "2606:4700::1"}, []string{"2001:db9::1"}},
		{"192.0.2.7", false, []string{"192.0.2.7"}, []string{"192.0.2.8"}},
		{"2001:db8::7", false, []string{"2001:db8::7"}, []string{"2001:db8::8"}},
		{"192.0.2.7/24", false, []string{"192.0.2.200"}, nil},
		{"cloudflare,cloudflare", true, []string{"172.64.0.1"}, nil},
	}
	for _, tt := range valid {
		t.Run(tt.in, func(t *testing.T) {
			p, err := ParseTrustedProxies(tt.in)
			require.NoError(t, err)
			require.Equal(t, tt.cloudflare, p.CloudflareRanges() != nil)
			for _, a := range tt.trusted {
				r := cipRequest(netip.AddrPortFrom(netip.MustParseAddr(a), 1).String(), xff, "198.51.100.1")
				require.Equal(t, "198.51.100.1", cipResult(p.ClientIP(r)), "peer %s", a)
			}
			for _, a := range tt.untrusted {
				r := cipRequest(netip.AddrPortFrom(netip.MustParseAddr(a), 1).String(), xff, "198.51.100.1")
				require.Equal(t, a, cipResult(p.ClientIP(r)), "peer %s", a)
			}
		})
	}

	invalid := []struct {
		in   string
		want []string
	}{
		{"", []string{"ratelimit: trusted proxies: no entries"}},
		{" , ", []string{`entry ""`}},
		{"cloudfare", []string{`ratelimit: trusted proxies: entry "cloudfare" is not "cloudflare", "cf-connecting-ip", a CIDR prefix or an IP address`}},
		{"cf-connecting-ip", []string{`ratelimit: trusted proxies: lists no proxy: "cf-connecting-ip" needs the proxies it applies to`}},
		{" CF-Connecting-IP ,cf-connecting-ip", []string{"lists no proxy"}},
		{"cf-connecting", []string{`entry "cf-connecting"`}},
		{"10.0.0.0/33", []string{`entry "10.0.0.0/33"`}},
		{"10.0.0.0/8,", []string{`entry ""`}},
		{"10.0.0.0/8,,cloudflare", []string{`entry ""`}},
		{"10.0.0.0/8 192.168.0.0/16", []string{`entry "10.0.0.0/8 192.168.0.0/16"`}},
		{"0.0.0.0/0", []string{`entry "0.0.0.0/0": prefix 0.0.0.0/0 trusts every address`}},
		{"::/0,cloudflare", []string{`entry "::/0"`}},
		{"fe80::1%eth0", []string{`entry "fe80::1%eth0"`}},
		{"example.com", []string{`entry "example.com"`}},
		{"*", []string{`entry "*"`}},
		{"10.0.0.1:80", []string{`entry "10.0.0.1:80"`}},
		{"bad1, 10.0.0.0/8, bad2", []string{`entry "bad1"`, `entry "bad2"`}},
	}
	for _, tt := range invalid {
		t.Run("invalid "+strconv.Quote(tt.in), func(t *testing.T) {
			p, err := ParseTrustedProxies(tt.in)
			require.Nil(t, p)
			require.Error(t, err)
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestConfigFromEnvTrustedProxies(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	cfReq := func() *http.Request { return cipRequest("172.64.0.1:1", cfh, "198.51.100.1") }
	lbReq := func() *http.Request { return cipRequest("10.0.0.1:1", xff, "1.1.1.1, 198.51.100.2") }

	t.Run("unset keeps RemoteAddrIP", func(t *testing.T) {
		cfg, err := ConfigFromEnv(env())
		require.NoError(t, err)
		require.Nil(t, cfg.TrustedProxies)
		require.Nil(t, cfg.Auth.ClientIP)
		require.Nil(t, cfg.Global.ClientIP)
	})
	t.Run("blank keeps RemoteAddrIP", func(t *testing.T) {
		cfg, err := ConfigFromEnv(env(EnvTrustedProxies, "  "))
		require.NoError(t, err)
		require.Nil(t, cfg.TrustedProxies)
		require.Nil(t, cfg.Auth.ClientIP)
	})
	t.Run("cloudflare and a CIDR", func(t *testing.T) {
		cfg, err := ConfigFromEnv(env(EnvTrustedProxies, "cloudflare, 10.0.0.0/8"))
		require.NoError(t, err)
		require.NotNil(t, cfg.TrustedProxies)
		require.Equal(t, CloudflareRanges(), cfg.TrustedProxies.CloudflareRanges())
		for _, o := range []Options{cfg.Auth, cfg.Global} {
			require.NotNil(t, o.ClientIP)
			require.Equal(t, "198.51.100.1", cipResult(o.ClientIP(cfReq())))
			require.Equal(t, "198.51.100.2", cipResult(o.ClientIP(lbReq())))
			require.Equal(t, "203.0.113.9", cipResult(o.ClientIP(cipRequest("203.0.113.9:1", cfh, "198.51.100.1"))))
		}
		cfg.Auth.Store, cfg.Global.Store = NewMemoryKV(), NewMemoryKV()
		layers, err := NewLayers(cfg)
		require.NoError(t, err)
		require.NotNil(t, layers)
	})
	t.Run("CIDRs only: CF-Connecting-IP not believed", func(t *testing.T) {
		cfg, err := ConfigFromEnv(env(EnvTrustedProxies, "10.0.0.0/8,2001:db8::/32"))
		require.NoError(t, err)
		require.Nil(t, cfg.TrustedProxies.CloudflareRanges())
		require.Equal(t, "172.64.0.1", cipResult(cfg.Auth.ClientIP(cfReq())))
		require.Equal(t, "198.51.100.2", cipResult(cfg.Global.ClientIP(lbReq())))
	})
	t.Run("invalid entries are named", func(t *testing.T) {
		cfg, err := ConfigFromEnv(env(EnvTrustedProxies, "cloudflare, 10.0.0.0/33, clodflare"))
		require.Error(t, err)
		require.Equal(t, Config{}, cfg)
		require.ErrorContains(t, err, `ratelimit: RATE_LIMIT_TRUSTED_PROXIES="cloudflare, 10.0.0.0/33, clodflare": entry "10.0.0.0/33"`)
		require.ErrorContains(t, err, `entry "clodflare"`)
	})
	t.Run("empty entry and /0", func(t *testing.T) {
		_, err := ConfigFromEnv(env(EnvTrustedProxies, "10.0.0.0/8,,0.0.0.0/0"))
		require.ErrorContains(t, err, `entry ""`)
		require.ErrorContains(t, err, `entry "0.0.0.0/0"`)
	})
	t.Run("reported with the other variables' problems", func(t *testing.T) {
		_, err := ConfigFromEnv(env(EnvTrustedProxies, "nope", EnvAuthMax, "lots"))
		require.ErrorContains(t, err, `entry "nope"`)
		require.ErrorContains(t, err, EnvAuthMax)
	})
}

func BenchmarkClientIP(b *testing.B) {
	p := cipDefaultProxies(b)
	many := "198.51.100.1," + strings.Repeat("10.0.0.2,", 100) + "10.0.0.3" // past the hop bound
	for _, bb := range []struct {
		name string
		fn   ClientIPFunc
		r    *http.Request
	}{
		{"RemoteAddrIP/IPv4", RemoteAddrIP, cipRequest("203.0.113.9:5555")},
		{"RemoteAddrIP/IPv6", RemoteAddrIP, cipRequest("[2001:db8:1:2:3:4:5:6]:5555")},
		{"TrustedProxies/untrusted", p.ClientIP, cipRequest("203.0.113.9:5555", xff, "1.1.1.1")},
		{"TrustedProxies/chain", p.ClientIP, cipRequest("10.0.0.1:5555", xff, "1.1.1.1, 2001:db8:1::7, 172.64.0.1, 10.0.0.2")},
		{"TrustedProxies/Cloudflare", p.ClientIP, cipRequest("[2606:4700::1]:5555", cfh, "2001:db8:1::7")},
		{"TrustedProxies/32-trusted-hops", p.ClientIP, cipRequest("10.0.0.1:5555", xff, many)},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 96)
			for b.Loop() {
				addr, ok := bb.fn(bb.r)
				buf = appendClientKey(buf[:0], addr, ok, DefaultIPv6PrefixBits)
			}
		})
	}
}

func TestAppendIPv4Port(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" when the fast path declines
	}{
		{"192.0.2.1:80", "192.0.2.1"},
		{"0.0.0.0:1", "0.0.0.0"},
		{"255.255.255.255:65535", "255.255.255.255"},
		{"10.20.30.40:99999", "10.20.30.40"},
		{"1.2.3.4", ""},             // no port
		{"1.2.3.4:", ""},            // empty port
		{"1.2.3.4:123456", ""},      // port too long
		{"1.2.3.4:8a", ""},          // port not digits
		{"01.2.3.4:80", ""},         // leading zero
		{"1.2.3.00:80", ""},         // leading zero
		{"256.1.1.1:80", ""},        // octet too large
		{"1.2.3:80", ""},            // three octets
		{"1.2.3.4.5:80", ""},        // five octets
		{"1..3.4:80", ""},           // empty octet
		{" 1.2.3.4:80", ""},         // blank: left to parseIP
		{"[::ffff:1.2.3.4]:80", ""}, // mapped IPv6: left to parseIP
		{"[2001:db8::1]:80", ""},
		{"", ""},
	} {
		got, ok := appendIPv4Port([]byte("k:"), tc.in)
		if tc.want == "" {
			require.False(t, ok, "%q", tc.in)
			require.Equal(t, "k:", string(got), "%q", tc.in)
			continue
		}
		require.True(t, ok, "%q", tc.in)
		require.Equal(t, "k:"+tc.want, string(got), "%q", tc.in)
	}
}
