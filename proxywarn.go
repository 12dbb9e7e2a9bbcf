package ratelimit

import (
	"net/http"
	"net/netip"
)

// forwardingHeaders are the headers by which proxies name the client, canonical.
var forwardingHeaders = [...]string{"X-Forwarded-For", "Forwarded", "X-Real-Ip", "Cf-Connecting-Ip", "True-Client-Ip"}

// sharedAddressSpace is 100.64.0.0/10 (RFC 6598), where some load balancers and cluster networks
// live, though it is not private in the sense of [netip.Addr.IsPrivate].
var sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")

// proxyWarning watches a layer that keys clients by [RemoteAddrIP] for requests that came
// through a proxy: from a loopback, private or shared-space peer or a Unix socket, or from
// Cloudflare's edge with CF-Connecting-IP, carrying forwarding headers the layer ignores. Every client behind that proxy
// shares one budget, which its operator wants to know before it takes the site down; the layer
// says so once.
type proxyWarning struct {
	cloudflare prefixSet // the shipped ranges
}

func newProxyWarning() *proxyWarning {
	w := &proxyWarning{}
	for _, p := range CloudflareRanges() {
		w.cloudflare.add(p)
	}
	return w
}

// throughProxy returns the first forwarding header that shows r came through a proxy, or "".
// A peer that is no IP address (a Unix socket) is local: only a proxy of the operator's sends
// through it.
func (w *proxyWarning) throughProxy(r *http.Request) string {
	if publicPeer(r.RemoteAddr) && len(r.Header["Cf-Connecting-Ip"]) == 0 {
		return "" // the common case, a client on the internet, without parsing its address
	}
	peer, ok := RemoteAddrIP(r) // IPv4-mapped addresses come unmapped
	if !ok || peer.IsLoopback() || peer.IsPrivate() || sharedAddressSpace.Contains(peer) {
		for _, name := range forwardingHeaders {
			if len(r.Header[name]) > 0 {
				return name
			}
		}
		return ""
	}
	if len(r.Header["Cf-Connecting-Ip"]) > 0 && w.cloudflare.contains(peer) {
		return "CF-Connecting-IP"
	}
	return "" // a client on the internet, whose headers are its own to forge
}

// publicPeer reports, from the first characters of addr (a RemoteAddr), that it is an IPv4
// address outside the loopback, private and shared ranges, or a global unicast IPv6 address
// (2000::/3). False means only "look closer".
func publicPeer(addr string) bool {
	if len(addr) > 1 && addr[0] == '[' {
		return addr[1] == '2' || addr[1] == '3'
	}
	a, rest, ok := leadingOctet(addr)
	if !ok {
		return false
	}
	b, _, ok := leadingOctet(rest)
	if !ok {
		return false
	}
	switch {
	case a == 10, a == 127, a == 0:
		return false
	case a == 172:
		return b < 16 || b > 31
	case a == 192:
		return b != 168
	case a == 100:
		return b < 64 || b > 127
	}
	return a <= 255
}

// leadingOctet reads a decimal number of 1 to 3 digits and the dot after it from s.
func leadingOctet(s string) (n int, rest string, ok bool) {
	i := 0
	for ; i < len(s) && i < 3 && '0' <= s[i] && s[i] <= '9'; i++ {
		n = n*10 + int(s[i]-'0')
	}
	if i == 0 || i == len(s) || s[i] != '.' {
		return 0, "", false
	}
	return n, s[i+1:], true
}

// warnIfThroughProxy logs the warning for r, at most once per layer. The layer calls it only for
// a client's first request in a window and for the one that spends its budget, which a proxy's
// shared key soon reaches, so that other requests pay two comparisons.
func (l *Limiter) warnIfThroughProxy(r *http.Request) {
	if l.proxyWarning == nil || l.proxyWarned.Load() {
		return
	}
	header := l.proxyWarning.throughProxy(r)
	if header == "" || !l.proxyWarned.CompareAndSwap(false, true) {
		return
	}
	l.log().Warn("ratelimit: requests arrive through a proxy, but the layer keys clients by the proxy's address "+
		"and believes no forwarding header, so all clients behind it share one budget; set RATE_LIMIT_TRUSTED_PROXIES "+
		"or Options.ClientIP (README: Which setting for which deployment)",
		"scope", l.scope, "peer", r.RemoteAddr, "header", header)
}
