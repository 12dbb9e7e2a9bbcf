package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
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
// every client shares the proxy's budget unless the proxy is trusted explicitly with
// [TrustedProxies].
func RemoteAddrIP(r *http.Request) (netip.Addr, bool) {
	return parseIP(r.RemoteAddr)
}

// HeadersFromAnyPeerIP believes the proxy headers from whatever peer sent them, as the seed did
// on Cloudflare Workers, where only the edge can reach the code: CF-Connecting-IP when the
// request holds exactly one valid one (or CF-Connecting-IPv6 when CF-Connecting-IP is absent or a
// pseudo IPv4 address, by the rule of [TrustedProxies.ClientIP]), else the rightmost
// X-Forwarded-For entry (the one the edge added) when it is an address, else [RemoteAddrIP].
// Unlike the seed it never takes the leftmost entry, which the client writes itself even when the
// edge appends to the header. It reads the headers even when RemoteAddr is not an IP address (a
// Unix socket).
//
// It is safe only when nothing but a proxy that sets these headers can reach the server: an
// origin that accepts connections from its edge alone (a firewall or Cloudflare Tunnel, for
// example) or a platform whose router is the only way in. Anywhere a client can connect directly
// it sends a fresh header with every request and is never limited; use [TrustedProxies] there.
func HeadersFromAnyPeerIP(r *http.Request) (netip.Addr, bool) {
	return resolveClientIP(nil, true, r)
}

// Bounds on the work spent on the proxy headers of one request. Past them the walk stops as it
// does at an unusable entry (see [TrustedProxies.ClientIP]).
const (
	// MaxForwardedHops is how many X-Forwarded-For entries, counted from the right and across
	// all header lines, are examined at most.
	MaxForwardedHops = 32
	// MaxForwardedBytes is how many bytes of X-Forwarded-For, counted from the right, are
	// examined at most.
	MaxForwardedBytes = 4096
	// maxAddrText bounds one address as written (with spaces, brackets, port or zone); longer
	// text is not an address and is not parsed.
	maxAddrText = 128
)

// Canonical header names, so that looking them up needs no canonicalisation.
const (
	headerXForwardedFor    = "X-Forwarded-For"
	headerCFConnectingIP   = "Cf-Connecting-Ip"
	headerCFConnectingIPv6 = "Cf-Connecting-Ipv6"
)

// ProxyOptions configures [NewTrustedProxies]. Its zero value trusts no proxy, which
// NewTrustedProxies refuses: that is [RemoteAddrIP], the default.
type ProxyOptions struct {
	// Prefixes are the networks of the proxies in front of the server (load balancers, ingress,
	// a CDN's edge): a peer or X-Forwarded-For hop inside one is trusted to report who connected
	// to it. A single address is a /32 or /128 prefix. IPv4-mapped IPv6 prefixes are read as
	// IPv4. A prefix of length 0 is refused: it trusts everyone (see [HeadersFromAnyPeerIP]).
	Prefixes []netip.Prefix
	// Cloudflare trusts Cloudflare's published edge ranges (see [CloudflareRanges] and
	// [TrustedProxies.RefreshCloudflare]) and believes CF-Connecting-IP (and
	// CF-Connecting-IPv6) from a peer inside them.
	Cloudflare bool
	// TrustCFConnectingIP believes CF-Connecting-IP (and CF-Connecting-IPv6) from every trusted
	// peer, not only from Cloudflare's ranges: for a proxy of yours between Cloudflare and the
	// server that passes the header on. It is safe only if that proxy cannot be reached except
	// through Cloudflare, or removes both headers from other traffic (CF-Connecting-IPv6 is
	// believed when CF-Connecting-IP is absent); otherwise leave it off, and the X-Forwarded-For
	// walk (with Cloudflare set) finds the client through the chain. In
	// RATE_LIMIT_TRUSTED_PROXIES it is the entry "cf-connecting-ip".
	TrustCFConnectingIP bool
}

// TrustedProxies finds the client's address behind trusted reverse proxies. Its ClientIP method
// is a [ClientIPFunc] for [Options.ClientIP]. Build it with [NewTrustedProxies] or
// [ParseTrustedProxies]; the zero value trusts no proxy and behaves as [RemoteAddrIP].
//
// A TrustedProxies is safe for simultaneous use by multiple goroutines, including a
// [TrustedProxies.RefreshCloudflare] while requests are served. It must not be copied after first
// use.
type TrustedProxies struct {
	user       prefixSet                 // Options.Prefixes, fixed at construction
	cloudflare atomic.Pointer[prefixSet] // nil unless the Cloudflare preset is on
	cfAny      bool                      // TrustCFConnectingIP
}

// NewTrustedProxies validates opts and builds a [TrustedProxies]. Every problem is reported,
// joined in one error.
func NewTrustedProxies(opts ProxyOptions) (*TrustedProxies, error) {
	t := &TrustedProxies{cfAny: opts.TrustCFConnectingIP}
	var errs []error
	for i, p := range opts.Prefixes {
		np, err := normalizeProxyPrefix(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("ratelimit: ProxyOptions.Prefixes[%d]: %w", i, err))
			continue
		}
		t.user.add(np)
	}
	if len(opts.Prefixes) == 0 && !opts.Cloudflare {
		errs = append(errs, errors.New("ratelimit: ProxyOptions trusts no proxy: set Prefixes or Cloudflare (or use RemoteAddrIP)"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if opts.Cloudflare {
		var cf prefixSet
		for _, p := range CloudflareRanges() {
			cf.add(p)
		}
		t.cloudflare.Store(&cf)
	}
	return t, nil
}

// normalizeProxyPrefix masks p, turns an IPv4-mapped prefix into IPv4 and refuses what cannot be
// meant.
func normalizeProxyPrefix(p netip.Prefix) (netip.Prefix, error) {
	if !p.IsValid() {
		return netip.Prefix{}, errors.New("not a valid prefix (zero value, or bits out of range)")
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	if p.Bits() == 0 {
		return netip.Prefix{}, fmt.Errorf("prefix %s trusts every address; if only your proxy can reach the server, use HeadersFromAnyPeerIP", p)
	}
	return p.Masked(), nil
}

// ParseTrustedProxies builds a [TrustedProxies] from the syntax of RATE_LIMIT_TRUSTED_PROXIES: a
// comma-separated list of "cloudflare" (any case: the Cloudflare preset), CIDR prefixes
// ("10.0.0.0/8", "2001:db8::/32") and single addresses ("192.0.2.7"), with optional spaces, and
// "cf-connecting-ip" (any case: [ProxyOptions.TrustCFConnectingIP], for the proxies listed).
// Every entry that is none of these, is empty, or is a prefix of length 0 is reported by name,
// joined in one error.
func ParseTrustedProxies(s string) (*TrustedProxies, error) {
	opts, errs := parseProxyList(s)
	if len(errs) > 0 {
		for i, err := range errs {
			errs[i] = fmt.Errorf("ratelimit: trusted proxies: %w", err)
		}
		return nil, errors.Join(errs...)
	}
	return NewTrustedProxies(opts)
}

// parseProxyList parses the RATE_LIMIT_TRUSTED_PROXIES syntax; its errors carry no prefix, so
// that callers can name their source.
func parseProxyList(s string) (ProxyOptions, []error) {
	var opts ProxyOptions
	var errs []error
	if strings.TrimSpace(s) == "" {
		return opts, []error{errors.New("no entries: want \"cloudflare\", CIDR prefixes or addresses, comma-separated")}
	}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if strings.EqualFold(entry, "cloudflare") {
			opts.Cloudflare = true
			continue
		}
		if strings.EqualFold(entry, "cf-connecting-ip") {
			opts.TrustCFConnectingIP = true
			continue
		}
		var p netip.Prefix
		var err error
		if strings.Contains(entry, "/") {
			p, err = netip.ParsePrefix(entry)
		} else {
			var a netip.Addr
			// A zone names an interface of this host, not a proxy: refused, not dropped.
			if a, err = netip.ParseAddr(entry); err == nil && a.Zone() == "" {
				p, err = a.Prefix(a.BitLen())
			} else if err == nil {
				err = errors.New("has a zone")
			}
		}
		if err != nil || entry == "" {
			errs = append(errs, fmt.Errorf("entry %q is not \"cloudflare\", \"cf-connecting-ip\", a CIDR prefix or an IP address", entry))
			continue
		}
		if _, err := normalizeProxyPrefix(p); err != nil {
			errs = append(errs, fmt.Errorf("entry %q: %w", entry, err))
			continue
		}
		opts.Prefixes = append(opts.Prefixes, p)
	}
	if len(errs) == 0 && len(opts.Prefixes) == 0 && !opts.Cloudflare {
		errs = append(errs, errors.New("lists no proxy: \"cf-connecting-ip\" needs the proxies it applies to (\"cloudflare\", CIDR prefixes or addresses) next to it"))
	}
	return opts, errs
}

// ClientIP is a [ClientIPFunc] that believes proxy headers only from trusted peers:
//
//  1. The peer is the host of r.RemoteAddr. If it is not a trusted proxy, it is the client, and
//     no header is read.
//  2. If the peer is in Cloudflare's ranges (with the Cloudflare preset) or TrustCFConnectingIP
//     is set, and the request holds exactly one CF-Connecting-IP that is a valid address, that
//     address is the client. CF-Connecting-IPv6 (one line, an IPv6 address), which Cloudflare
//     adds when its Pseudo IPv4 setting overwrites CF-Connecting-IP with an address from
//     240.0.0.0/4, is the client instead, but only when CF-Connecting-IP holds such a pseudo IPv4
//     address or is absent: next to a real address it could be the client's own and is ignored.
//  3. Otherwise X-Forwarded-For is walked from the right (all header lines form one list, the
//     last line last). Each entry is what the hop to its right saw connecting to it. Empty
//     entries are skipped. A trusted proxy is skipped, and its own entry is read next. The first
//     address that is not a trusted proxy is the client. An address reported by a Cloudflare hop
//     is the client even when it is itself in Cloudflare's ranges (a Worker's subrequest comes
//     from there, and skipping it would let the Worker's author choose the key); this agrees
//     with CF-Connecting-IP. When the client found is a pseudo IPv4 address (240.0.0.0/4) that
//     a Cloudflare hop reported, Cloudflare's Pseudo IPv4 in "Overwrite headers" mode wrote it,
//     into X-Forwarded-For as well: a CF-Connecting-IPv6 of one line holding an IPv6 address is
//     the client instead, as in step 2. This keeps the /64 grouping of IPv6 clients behind
//     Cloudflare and a proxy of yours. Such an address reported by a proxy of yours is believed
//     as it is: some networks give hosts real addresses there.
//  4. The walk stops at an entry that is not an address ("unknown", an obfuscated name, garbage,
//     longer than an address can be), after [MaxForwardedHops] entries or [MaxForwardedBytes]
//     bytes, and at the left end of the list. The client is then the last trusted hop reached:
//     the peer if the walk got no further. Everything in the list beyond that point could have
//     been written by the client, so a request can never move its key further left by putting
//     something unusable in the way.
//
// ok is false only when r.RemoteAddr is not an address. ClientIP does not allocate for valid
// input.
func (t *TrustedProxies) ClientIP(r *http.Request) (netip.Addr, bool) {
	return resolveClientIP(t, false, r)
}

// hopKind is how far a peer or X-Forwarded-For hop is trusted.
type hopKind uint8

const (
	untrustedHop  hopKind = iota
	trustedHop            // inside ProxyOptions.Prefixes
	cloudflareHop         // inside Cloudflare's ranges, with the preset on
)

func (t *TrustedProxies) classify(a netip.Addr) hopKind {
	if t == nil {
		return untrustedHop
	}
	if cf := t.cloudflare.Load(); cf != nil && cf.contains(a) {
		return cloudflareHop
	}
	if t.user.contains(a) {
		return trustedHop
	}
	return untrustedHop
}

// resolveClientIP implements [TrustedProxies.ClientIP] (t may be nil: nothing is trusted) and,
// with anyPeer, [HeadersFromAnyPeerIP], for which the peer is trusted whatever its address.
func resolveClientIP(t *TrustedProxies, anyPeer bool, r *http.Request) (netip.Addr, bool) {
	peer, ok := parseIP(r.RemoteAddr)
	kind := untrustedHop
	if ok {
		kind = t.classify(peer)
	}
	if kind == untrustedHop && !anyPeer {
		return peer, ok
	}
	if kind == cloudflareHop || anyPeer || (t != nil && t.cfAny) {
		if a, ok := cfConnectingIP(r.Header); ok {
			return a, true
		}
	}
	client, byCloudflare := walkForwarded(t, r.Header[headerXForwardedFor], peer, kind == cloudflareHop)
	// Cloudflare's Pseudo IPv4 in "Overwrite headers" mode writes its made-up address into
	// X-Forwarded-For as well, and the real one into CF-Connecting-IPv6: behind a proxy of
	// yours, where CF-Connecting-IP is not read, the walk finds the made-up one. Only a Cloudflare
	// hop's report is taken for one: some networks give hosts real addresses in 240.0.0.0/4, and
	// a proxy of yours that reports one may pass on a CF-Connecting-IPv6 that the client wrote.
	// (Where CF-Connecting-IP is believed from every peer, step 2 has already applied the rule.)
	if byCloudflare && pseudoIPv4.Contains(client) {
		if a, ok := cfConnectingIPv6(r.Header); ok {
			return a, true
		}
	}
	return client, client.IsValid()
}

// pseudoIPv4 is the Class E range from which Cloudflare's Pseudo IPv4 draws the made-up address
// it writes in CF-Connecting-IP for an IPv6 client.
var pseudoIPv4 = netip.MustParsePrefix("240.0.0.0/4")

// cfConnectingIP reads the client's address from CF-Connecting-IP and CF-Connecting-IPv6. A
// header counts only when the request holds exactly one line of it with a valid address.
//
// With Pseudo IPv4 set to "Overwrite headers", Cloudflare puts a made-up address from
// 240.0.0.0/4 in CF-Connecting-IP (one per IPv6 address, which would defeat the /64 grouping) and
// the real one in CF-Connecting-IPv6; otherwise it does not set CF-Connecting-IPv6, and whether it
// removes a client's own is undocumented (and a Worker's subrequest could set it). So
// CF-Connecting-IPv6, when it holds an IPv6 address, is believed only when CF-Connecting-IP is
// absent (no line at all) or holds a pseudo IPv4 address; otherwise CF-Connecting-IP is the
// client.
func cfConnectingIP(h http.Header) (netip.Addr, bool) {
	v4Lines := h[headerCFConnectingIP]
	var v4 netip.Addr
	v4OK := false
	if len(v4Lines) == 1 {
		v4, v4OK = parseIP(v4Lines[0])
	}
	if len(v4Lines) == 0 || (v4OK && pseudoIPv4.Contains(v4)) {
		if a, ok := cfConnectingIPv6(h); ok {
			return a, true
		}
	}
	return v4, v4OK
}

// cfConnectingIPv6 returns the address in CF-Connecting-IPv6 when the request holds exactly one
// line of it with an IPv6 address.
func cfConnectingIPv6(h http.Header) (netip.Addr, bool) {
	if v := h[headerCFConnectingIPv6]; len(v) == 1 {
		if a, ok := parseIP(v[0]); ok && a.Is6() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// walkForwarded walks the X-Forwarded-For lines from the right, starting at the trusted peer
// client, as [TrustedProxies.ClientIP] describes. byCloudflare tells that a Cloudflare hop
// reported the client found. It does not allocate for valid entries and examines at most
// MaxForwardedHops entries and MaxForwardedBytes bytes.
func walkForwarded(t *TrustedProxies, lines []string, client netip.Addr, fromCloudflare bool) (_ netip.Addr, byCloudflare bool) {
	hops, budget := MaxForwardedHops, MaxForwardedBytes
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for {
			if hops <= 0 || budget <= 0 {
				return client, false
			}
			hops--
			// The entry may use the rest of the budget; look one byte further, for the comma
			// before it. Whether an entry fits depends on its own length alone, never on the
			// text to its left, and a comma-free megabyte costs no more than the budget.
			lo := max(0, len(line)-budget-1)
			comma := strings.LastIndexByte(line[lo:], ',')
			first := comma < 0 // the line's leftmost entry
			if first && len(line) > budget {
				return client, false // the entry is longer than the budget left
			}
			entry := line[lo+comma+1:]
			budget -= len(entry) + 1
			if !blank(entry) {
				a, ok := parseIP(entry)
				if !ok {
					return client, false
				}
				if fromCloudflare {
					return a, true
				}
				kind := t.classify(a)
				if kind == untrustedHop {
					return a, false
				}
				client, fromCloudflare = a, kind == cloudflareHop
			}
			if first {
				break
			}
			line = line[:lo+comma]
		}
	}
	return client, false
}

// blank reports whether s holds only spaces and tabs.
func blank(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != ' ' && s[i] != '\t' {
			return false
		}
	}
	return true
}

// trimBlank drops leading and trailing spaces and tabs. strings.Trim would build its cutset on
// every call: about 10 ns, some 5% of the limiter's whole in-memory path.
func trimBlank(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// parseIP reads an address written bare ("192.0.2.1", "2001:db8::1"), with a port
// ("192.0.2.1:80", "[2001:db8::1]:80"), or in brackets ("[2001:db8::1]"), with surrounding
// spaces and tabs. IPv6 zones are dropped and IPv4-mapped addresses become IPv4. Brackets are
// accepted around IPv6 only, and a port must be 1 to 5 digits. Text longer than an address can
// be is refused before parsing. It does not allocate for valid input.
func parseIP(s string) (netip.Addr, bool) {
	if len(s) > maxAddrText {
		return netip.Addr{}, false
	}
	s = trimBlank(s)
	if s == "" {
		return netip.Addr{}, false
	}
	host := s
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		if port := s[end+1:]; port != "" && !isPort(port) {
			return netip.Addr{}, false
		}
		host = s[1:end]
		if strings.IndexByte(host, ':') < 0 {
			return netip.Addr{}, false // brackets are for IPv6
		}
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		// One colon: an IPv4 address with a port. (Two or more: an IPv6 address.)
		if !isPort(s[i:]) {
			return netip.Addr{}, false
		}
		host = s[:i]
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		// A zone names the interface, not the client: drop it, but only after an IPv6 address.
		if i == len(host)-1 || strings.IndexByte(host[:i], ':') < 0 {
			return netip.Addr{}, false
		}
		host = host[:i]
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// isPort reports whether s is ":" and 1 to 5 digits.
func isPort(s string) bool {
	if len(s) < 2 || len(s) > 6 || s[0] != ':' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// appendIPv4Port appends the client key of s when s is an IPv4 address and a port, as
// RemoteAddr almost always is ("192.0.2.1:49152"), and reports whether it was. Such an address
// is its own key: a valid one has no leading zeros and is written as AppendTo writes it, so it
// is only checked, not parsed and written again. Anything else is left to parseIP and
// appendClientKey, and dst is returned unchanged; where this accepts, they agree (a fuzz test
// checks it).
func appendIPv4Port(dst []byte, s string) ([]byte, bool) {
	dots, digits, octet := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			if digits > 0 && octet == 0 {
				return dst, false // a leading zero
			}
			octet = octet*10 + int(c-'0')
			digits++
			if octet > 255 {
				return dst, false
			}
		case c == '.' && digits > 0 && dots < 3:
			dots++
			digits, octet = 0, 0
		case c == ':' && digits > 0 && dots == 3 && isPort(s[i:]):
			return append(dst, s[:i]...), true
		default:
			return dst, false
		}
	}
	return dst, false
}

// unknownClient is the client key of requests whose address could not be found.
const unknownClient = "unknown"

// appendClientKey appends the key that identifies addr's client: the IPv4 address, or the IPv6
// address masked to its first v6Bits bits, so that rotating through one network's addresses
// gives no fresh budget. The result holds only hex digits, dots and colons (or is "unknown"), is
// at most 39 bytes long, and is safe inside a KV key and a URL path.
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

// prefixSet holds trusted networks by family. Addresses are looked up unmapped and without zone.
type prefixSet struct {
	v4, v6 []netip.Prefix
}

func (s *prefixSet) add(p netip.Prefix) {
	if p.Addr().Is4() {
		s.v4 = append(s.v4, p)
	} else {
		s.v6 = append(s.v6, p)
	}
}

func (s *prefixSet) contains(a netip.Addr) bool {
	list := s.v6
	if a.Is4() {
		list = s.v4
	}
	for _, p := range list {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// all returns a copy of the set, IPv4 first.
func (s *prefixSet) all() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(s.v4)+len(s.v6))
	return append(append(out, s.v4...), s.v6...)
}
