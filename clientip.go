package ratelimit

import (
	"net/http"
	"net/netip"
	"strings"
)

// ClientIPFunc reports the address of the client that sent r. ok is false when no address can be
// found; the limiter then counts the request under the fixed client key "unknown" rather than
// letting it through. The limiter canonicalises the address itself (IPv4-mapped IPv6 becomes
// IPv4, zones are dropped, IPv6 is grouped by prefix), so a ClientIPFunc need not.
//
// A ClientIPFunc must be safe for simultaneous use by multiple goroutines.
type ClientIPFunc func(r *http.Request) (addr netip.Addr, ok bool)

// RemoteAddrIP is the default [ClientIPFunc]: the host part of r.RemoteAddr, the address of the
// immediate peer. It believes no header, so clients cannot choose their own key; behind a proxy
// every client shares the proxy's budget unless the proxy is trusted explicitly.
func RemoteAddrIP(r *http.Request) (netip.Addr, bool) {
	return parseIP(r.RemoteAddr)
}

// HeadersFromAnyPeerIP is the seed's rule: CF-Connecting-IP, else the first X-Forwarded-For
// entry, else [RemoteAddrIP]. It believes those headers from any peer, so it is safe only where
// nothing but a proxy that overwrites them can reach the server (for example an origin that
// accepts connections from Cloudflare's edge alone). Anywhere else a client sends a fresh header
// with every request and is never limited.
func HeadersFromAnyPeerIP(r *http.Request) (netip.Addr, bool) {
	if addr, ok := parseIP(r.Header.Get("Cf-Connecting-Ip")); ok {
		return addr, true
	}
	if fwd := r.Header.Get("X-Forwarded-For"); fwd != "" {
		first, _, _ := strings.Cut(fwd, ",")
		if addr, ok := parseIP(first); ok {
			return addr, true
		}
	}
	return RemoteAddrIP(r)
}

// parseIP reads an address written as an IP, an IP with a port ("1.2.3.4:80", "[::1]:80"), or a
// bracketed IPv6 address, with surrounding spaces. IPv6 zones are dropped and IPv4-mapped
// addresses become IPv4.
func parseIP(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		if perr != nil {
			if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
				return parseIP(s[1 : len(s)-1])
			}
			return netip.Addr{}, false
		}
		addr = ap.Addr()
	}
	return addr.WithZone("").Unmap(), true
}

// unknownClient is the client key of requests whose address could not be found.
const unknownClient = "unknown"

// appendClientKey appends the key that identifies addr's client: the IPv4 address, or the IPv6
// address masked to its first v6Bits bits, so that rotating through one network's addresses
// gives no fresh budget. The result holds only hex digits, dots and colons.
func appendClientKey(dst []byte, addr netip.Addr, ok bool, v6Bits int) []byte {
	if !ok || !addr.IsValid() {
		return append(dst, unknownClient...)
	}
	addr = addr.WithZone("").Unmap()
	if addr.Is6() && v6Bits < 128 {
		if p, err := addr.Prefix(v6Bits); err == nil {
			addr = p.Addr()
		}
	}
	return addr.AppendTo(dst)
}
