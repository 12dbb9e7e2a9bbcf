package ratelimit

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// FuzzClientIP feeds arbitrary RemoteAddr, X-Forwarded-For lines, CF-Connecting-IP and
// CF-Connecting-IPv6 to every ClientIPFunc and checks that nothing panics, that the answer is an
// address somebody actually wrote (the peer or a header entry), that the key is short and
// printable, that an untrusted peer is never replaced by a header, that a client-controlled left
// part of X-Forwarded-For changes the answer only when every hop to its right was trusted, and
// that CF-Connecting-IPv6 decides the answer exactly when CF-Connecting-IP is absent or a pseudo
// IPv4 address (240.0.0.0/4). An empty cf or cf6 means the header is not sent.
//
//	go test -run '^$' -fuzz '^FuzzClientIP$' -fuzztime 20s .
func FuzzClientIP(f *testing.F) {
	seeds := []struct{ remote, xff1, xff2, cf, cf6 string }{
		{"203.0.113.9:5555", "", "", "", ""},
		{"203.0.113.9:5555", "198.51.100.1", "", "198.51.100.2", ""},
		{"10.0.0.1:5555", "1.1.1.1, 198.51.100.1", "10.0.0.2", "", ""},
		{"10.0.0.1:5555", "1.1.1.1, 198.51.100.1, 172.64.0.1", "", "1.1.1.1", ""},
		{"10.0.0.1:5555", "10.0.0.3, 10.0.0.2", "", "", ""},
		{"10.0.0.1:5555", "1.1.1.1, unknown", "10.0.0.2", "", ""},
		{"10.0.0.1:5555", ", , ,", "", "", ""},
		{"10.0.0.1:5555", "[2001:db8:1::7]:443", "::ffff:10.0.0.2", "", ""},
		{"10.0.0.1:5555", "fe80::7%eth0, [198.51.100.7]", "198.51.100.7:80", "", ""},
		{"[::ffff:10.0.0.1]:5555", "::ffff:198.51.100.7", "", "", ""},
		{"[2001:db8:ffff::1]:5555", "2001:db8:1:2:3:4:5:6", "", "", ""},
		{"172.64.0.1:5555", "1.1.1.1", "", "198.51.100.1", ""},
		{"172.64.0.1:5555", "1.1.1.1, 2a06:98c0:3600::103", "", "", ""},
		{"[2606:4700::1]:5555", "", "", "2a06:98c0:3600::103", ""},
		{"[2606:4700::1]:5555", "", "", " [2001:db8::1] ", ""},
		{"@", "198.51.100.1", "", "198.51.100.2", ""},
		{"", "", "", "", ""},
		{"10.0.0.1:5555", strings.Repeat("10.0.0.2,", 100) + "198.51.100.1", "", "", ""},
		{"10.0.0.1:5555", strings.Repeat(" ", 5000) + "198.51.100.1", "", "", ""},
		{"10.0.0.1:5555", "198.51.100.1" + strings.Repeat(",", 5000), "", "", ""},
		{"10.0.0.1:5555", "\x00\xff,\t,192.0.2.1\r", "", "\xff", ""},
		{"172.64.1.1:5555", "", "", "198.51.100.7", "2001:db8:1::7"},
		{"172.64.1.1:5555", "1.1.1.1", "", "240.16.0.1", "2001:db8:1::7"},
		{"172.64.1.1:5555", "1.1.1.1", "", "", "[2001:db8:1::7]:443"},
		{"172.64.1.1:5555", "1.1.1.1", "", "240.0.0.0", "198.51.100.9"},
		{"172.64.1.1:5555", "1.1.1.1", "", "::ffff:255.255.255.255", "nope"},
		{"172.64.1.1:5555", "1.1.1.1", "", "239.255.255.255", "2001:db8:1::7"},
		{"10.0.0.1:5555", "1.1.1.1", "", "240.16.0.1", "2001:db8:1::7"},
		{"203.0.113.9:5555", "1.1.1.1", "", "2001:db8:5::5", "2001:db8:1::7"},
		{"@", "", "", "", "2001:db8:1::7"},
	}
	for _, s := range seeds {
		f.Add(s.remote, s.xff1, s.xff2, s.cf, s.cf6)
	}

	trusted, err := NewTrustedProxies(ProxyOptions{
		Prefixes:   []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")},
		Cloudflare: true,
	})
	if err != nil {
		f.Fatal(err)
	}
	cfAny, err := NewTrustedProxies(ProxyOptions{
		Prefixes:            []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		TrustCFConnectingIP: true,
	})
	if err != nil {
		f.Fatal(err)
	}
	const leftAddr = "203.0.113.66"
	resolvers := map[string]ClientIPFunc{
		"RemoteAddrIP":         RemoteAddrIP,
		"HeadersFromAnyPeerIP": HeadersFromAnyPeerIP,
		"TrustedProxies":       trusted.ClientIP,
		"TrustCFConnectingIP":  cfAny.ClientIP,
	}
	// Two IPv6 addresses written nowhere else by the seeds, to swap in for CF-Connecting-IPv6.
	otherV6 := [2]netip.Addr{netip.MustParseAddr("2001:db8:beef::1"), netip.MustParseAddr("2001:db8:cafe::1")}

	f.Fuzz(func(t *testing.T, remote, xff1, xff2, cf, cf6 string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		var lines []string
		for _, l := range []string{xff1, xff2} {
			if l != "" {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			r.Header[headerXForwardedFor] = lines
		}
		if cf != "" {
			r.Header[headerCFConnectingIP] = []string{cf}
		}
		if cf6 != "" {
			r.Header[headerCFConnectingIPv6] = []string{cf6}
		}

		// Every address a ClientIPFunc may answer: the peer and anything written in a header.
		written := map[netip.Addr]bool{}
		peer, peerOK := parseIP(remote)
		if peerOK {
			written[peer] = true
		}
		for _, s := range append(strings.Split(strings.Join(lines, ","), ","), cf, cf6) {
			if a, ok := parseIP(s); ok {
				written[a] = true
			}
		}

		for name, fn := range resolvers {
			addr, ok := fn(r)
			if ok {
				if !addr.IsValid() || addr.Zone() != "" || addr.Is4In6() {
					t.Fatalf("%s: not canonical: %#v", name, addr)
				}
				if !written[addr] {
					t.Fatalf("%s: %v was written nowhere", name, addr)
				}
			} else if peerOK {
				t.Fatalf("%s: !ok although the peer %v is an address", name, peer)
			}
			for _, bits := range []int{1, 48, 64, 127, 128} {
				key := string(appendClientKey(nil, addr, ok, bits))
				if key == unknownClient {
					continue
				}
				if len(key) == 0 || len(key) > 39 || strings.Trim(key, "0123456789abcdef.:") != "" {
					t.Fatalf("%s: key %q is not short and safe", name, key)
				}
			}
		}

		// An untrusted peer is the client, whatever the headers say.
		if peerOK && trusted.classify(peer) == untrustedHop {
			if got, _ := trusted.ClientIP(r); got != peer {
				t.Fatalf("untrusted peer %v replaced by %v", peer, got)
			}
		}

		// CF-Connecting-IPv6 is believed only when CF-Connecting-IP is absent or a pseudo IPv4
		// address. Otherwise another value, or none, leaves every answer as it was; when it is
		// believed, a valid IPv6 address in it is the answer of every resolver that reads the
		// Cloudflare headers from this peer.
		v4, v4OK := parseIP(cf)
		v6Allowed := cf == "" || (v4OK && pseudoIPv4.Contains(v4))
		swapped := otherV6[0]
		if a, ok := parseIP(cf6); ok && a == swapped {
			swapped = otherV6[1]
		}
		for _, alt := range []string{"", swapped.String()} {
			r3 := &http.Request{RemoteAddr: remote, Header: r.Header.Clone()}
			delete(r3.Header, headerCFConnectingIPv6)
			if alt != "" {
				r3.Header[headerCFConnectingIPv6] = []string{alt}
			}
			for name, fn := range resolvers {
				got, gotOK := fn(r)
				got3, got3OK := fn(r3)
				if !v6Allowed && (got != got3 || gotOK != got3OK) {
					t.Fatalf("%s: CF-Connecting-IPv6 %q moved the key from %v to %v next to CF-Connecting-IP %q", name, alt, got, got3, cf)
				}
				if v6Allowed && alt != "" {
					readsCF := name == "HeadersFromAnyPeerIP" ||
						(name == "TrustedProxies" && peerOK && trusted.classify(peer) == cloudflareHop) ||
						(name == "TrustCFConnectingIP" && peerOK && cfAny.classify(peer) != untrustedHop)
					if readsCF && got3 != swapped {
						t.Fatalf("%s: CF-Connecting-IPv6 %v ignored next to CF-Connecting-IP %q: got %v", name, swapped, cf, got3)
					}
				}
			}
		}

		// Prepending a client-written entry to the first line changes the answer only to that
		// entry, and only when the walk had reached the left end through trusted hops.
		if len(lines) > 0 {
			before, okBefore := trusted.ClientIP(r)
			r2 := &http.Request{RemoteAddr: remote, Header: r.Header.Clone()}
			r2.Header[headerXForwardedFor][0] = leftAddr + "," + lines[0]
			after, okAfter := trusted.ClientIP(r2)
			if okAfter != okBefore || (after != before && after.String() != leftAddr) {
				t.Fatalf("left part moved the key from %v to %v", before, after)
			}
		}
	})
}

// FuzzRemoteIPv4FastPath: wherever the limiter's fast path for RemoteAddr accepts, it builds the
// key that RemoteAddrIP and appendClientKey build, and it leaves dst alone where it declines.
//
//	go test -run '^$' -fuzz '^FuzzRemoteIPv4FastPath$' -fuzztime 10s .
func FuzzRemoteIPv4FastPath(f *testing.F) {
	for _, s := range []string{
		"192.0.2.1:80", "0.0.0.0:1", "255.255.255.255:65535", "1.2.3.4:999999", "01.2.3.4:80",
		"1.2.3.4", "1.2.3.4:", "256.1.1.1:80", "1.2.3:80", "1.2.3.4.5:80", " 1.2.3.4:80",
		"[::ffff:1.2.3.4]:80", "1.2.3.4:8a", "1..2.3:80", "1.2.3.4%eth0:80", "", ":80",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		prefix := []byte("ratelimit:x:")
		got, ok := appendIPv4Port(prefix, s)
		if !ok {
			if string(got) != string(prefix) {
				t.Fatalf("%q declined, but dst became %q", s, got)
			}
			return
		}
		addr, valid := parseIP(s)
		want := appendClientKey(prefix, addr, valid, DefaultIPv6PrefixBits)
		if !valid || !addr.Is4() || string(got) != string(want) {
			t.Fatalf("%q: fast path key %q, RemoteAddrIP key %q (valid %v)", s, got, want, valid)
		}
	})
}
