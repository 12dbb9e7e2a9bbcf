package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// cloudflareShipped is Cloudflare's published edge ranges as of early 2026
// (https://www.cloudflare.com/ips/ and GET https://api.cloudflare.com/client/v4/ips). A constant
// string, so the shipped list cannot be changed at run time; [CloudflareRanges] parses a fresh
// copy on every call.
const cloudflareShipped = "" +
	// IPv4
	"173.245.48.0/20 103.21.244.0/22 103.22.200.0/22 103.31.4.0/22 141.101.64.0/18 " +
	"108.162.192.0/18 190.93.240.0/20 188.114.96.0/20 197.234.240.0/22 198.41.128.0/17 " +
	"162.158.0.0/15 104.16.0.0/13 104.24.0.0/14 172.64.0.0/13 131.0.72.0/22 " +
	// IPv6
	"2400:cb00::/32 2606:4700::/32 2803:f800::/32 2405:b500::/32 2405:8100::/32 " +
	"2a06:98c0::/29 2c0f:f248::/32"

// CloudflareRanges returns a fresh copy of the Cloudflare edge ranges shipped with this library
// (Cloudflare's published IPv4 and IPv6 ranges as of early 2026), IPv4 first. The caller may
// modify the result. Cloudflare changes the list rarely; [TrustedProxies.RefreshCloudflare]
// fetches the current one at run time.
func CloudflareRanges() []netip.Prefix {
	fields := strings.Fields(cloudflareShipped)
	out := make([]netip.Prefix, 0, len(fields))
	for _, f := range fields {
		// The list is a constant and a test parses every entry, so no error is possible here;
		// skipping instead of panicking keeps the no-panic rule without hiding anything.
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// DefaultCloudflareAPI is the base URL of Cloudflare's API that [CloudflareSource] uses by
// default. The IP ranges are at {base}/ips and need no credentials.
const DefaultCloudflareAPI = "https://api.cloudflare.com/client/v4"

// Bounds of a fetch of Cloudflare's ranges.
const (
	// DefaultCloudflareTimeout bounds one fetch when [CloudflareSource.Timeout] is zero.
	DefaultCloudflareTimeout = 10 * time.Second
	// maxCloudflareBody bounds the response body read; today's answer is under 1 KiB.
	maxCloudflareBody = 1 << 20
	// maxCloudflarePrefixes bounds the number of ranges accepted from one answer.
	maxCloudflarePrefixes = 1024
	// A fetched range wider than these is refused: trusting it would trust a large part of the
	// Internet. Cloudflare's widest ranges today are a /13 and a /29.
	minCloudflareBits4 = 8
	minCloudflareBits6 = 16
)

// CloudflareSource says where and how to fetch Cloudflare's current IP ranges. The zero value
// fetches from [DefaultCloudflareAPI] with [http.DefaultClient] within
// [DefaultCloudflareTimeout]. A CloudflareSource is a plain value, safe to copy and to use from
// multiple goroutines.
//
// It speaks to the documented endpoint GET {BaseURL}/ips with net/http rather than through
// github.com/cloudflare/cloudflare-go, whose cloudflare.IPs() takes no context, has no timeout,
// calls http.Get on a package-level URL and ignores the BaseURL option: it could hang a refresh
// forever and cannot be pointed at a test server. The root package also stays standard library
// only.
type CloudflareSource struct {
	// BaseURL is the API's base URL, without "/ips". Default [DefaultCloudflareAPI]. Tests point
	// it at an httptest.Server.
	BaseURL string
	// Client sends the request. Default [http.DefaultClient]; Timeout applies either way.
	Client *http.Client
	// Timeout bounds the whole fetch, on top of any deadline of the context. Default
	// [DefaultCloudflareTimeout].
	Timeout time.Duration
}

// cloudflareIPsResponse is the envelope of GET /ips:
// {"result":{"ipv4_cidrs":[...],"ipv6_cidrs":[...],"etag":"..."},"success":true,"errors":[],"messages":[]}.
type cloudflareIPsResponse struct {
	Success bool `json:"success"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
	Result *struct {
		IPv4CIDRs []string `json:"ipv4_cidrs"`
		IPv6CIDRs []string `json:"ipv6_cidrs"`
	} `json:"result"`
}

// Fetch returns Cloudflare's current edge ranges, IPv4 first. It fails, and returns nothing, when
// the request fails or runs past ctx or the timeout, when the answer is not 200 OK, is larger
// than 1 MiB, is not the documented JSON, reports success false, lacks either the IPv4 or the
// IPv6 list, or holds an entry that is not a CIDR prefix of its family at least /8 (IPv4) or /16
// (IPv6) long: a partial or implausible list is never returned.
func (s CloudflareSource) Fetch(ctx context.Context) ([]netip.Prefix, error) {
	base := s.BaseURL
	if base == "" {
		base = DefaultCloudflareAPI
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("ratelimit: Cloudflare API base URL %q is not an http(s) URL", base)
	}
	endpoint := strings.TrimSuffix(base, "/") + "/ips"
	timeout := s.Timeout
	switch {
	case timeout == 0:
		timeout = DefaultCloudflareTimeout
	case timeout < 0:
		return nil, fmt.Errorf("ratelimit: Cloudflare fetch timeout %v must be positive", timeout)
	}
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: fetch Cloudflare IP ranges: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: fetch Cloudflare IP ranges: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCloudflareBody+1))
	if err != nil {
		return nil, fmt.Errorf("ratelimit: fetch Cloudflare IP ranges: read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ratelimit: fetch Cloudflare IP ranges: GET %s: %s", endpoint, resp.Status)
	}
	if len(body) > maxCloudflareBody {
		return nil, fmt.Errorf("ratelimit: fetch Cloudflare IP ranges: answer larger than %d bytes", maxCloudflareBody)
	}
	return parseCloudflareIPs(body)
}

func parseCloudflareIPs(body []byte) ([]netip.Prefix, error) {
	var resp cloudflareIPsResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("ratelimit: Cloudflare IP ranges: answer is not the documented JSON: %w", err)
	}
	if !resp.Success {
		msg := "success is not true"
		if len(resp.Errors) > 0 {
			msg = fmt.Sprintf("error %d: %.200q", resp.Errors[0].Code, resp.Errors[0].Message)
		}
		return nil, fmt.Errorf("ratelimit: Cloudflare IP ranges: %s", msg)
	}
	if resp.Result == nil || len(resp.Result.IPv4CIDRs) == 0 || len(resp.Result.IPv6CIDRs) == 0 {
		return nil, errors.New("ratelimit: Cloudflare IP ranges: answer lacks ipv4_cidrs or ipv6_cidrs")
	}
	if n := len(resp.Result.IPv4CIDRs) + len(resp.Result.IPv6CIDRs); n > maxCloudflarePrefixes {
		return nil, fmt.Errorf("ratelimit: Cloudflare IP ranges: %d ranges, more than %d", n, maxCloudflarePrefixes)
	}
	out := make([]netip.Prefix, 0, len(resp.Result.IPv4CIDRs)+len(resp.Result.IPv6CIDRs))
	for _, list := range []struct {
		cidrs []string
		v4    bool
	}{{resp.Result.IPv4CIDRs, true}, {resp.Result.IPv6CIDRs, false}} {
		for _, s := range list.cidrs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("ratelimit: Cloudflare IP ranges: %.100q is not a CIDR prefix", s)
			}
			if err := checkCloudflarePrefix(p, list.v4); err != nil {
				return nil, fmt.Errorf("ratelimit: Cloudflare IP ranges: %w", err)
			}
			out = append(out, p.Masked())
		}
	}
	return out, nil
}

// checkCloudflarePrefix refuses a range of the wrong family or implausibly wide.
func checkCloudflarePrefix(p netip.Prefix, wantV4 bool) error {
	a := p.Addr()
	switch {
	case !p.IsValid():
		return fmt.Errorf("range %s is not valid", p)
	case wantV4 && !a.Is4(), !wantV4 && (!a.Is6() || a.Is4In6()):
		return fmt.Errorf("range %s is in the wrong address family", p)
	case a.Is4() && p.Bits() < minCloudflareBits4, a.Is6() && p.Bits() < minCloudflareBits6:
		return fmt.Errorf("range %s is implausibly wide", p)
	}
	return nil
}

// SetCloudflareRanges replaces the Cloudflare ranges that t trusts, for example with a list the
// caller fetched itself. The list must hold at least one IPv4 and one IPv6 range, each at least
// /8 (IPv4) or /16 (IPv6) long; otherwise t keeps its current list and an error is returned.
// The swap is atomic: requests being resolved see the old list or the new one, never a mix. t
// keeps its own copy of prefixes. It fails when t is nil (as [ConfigFromEnv] leaves it without
// RATE_LIMIT_TRUSTED_PROXIES) or was built without the Cloudflare preset.
func (t *TrustedProxies) SetCloudflareRanges(prefixes []netip.Prefix) error {
	if t == nil || t.cloudflare.Load() == nil {
		return errors.New("ratelimit: SetCloudflareRanges: the Cloudflare preset is not enabled")
	}
	var set prefixSet
	for _, p := range prefixes {
		if err := checkCloudflarePrefix(p, p.Addr().Is4()); err != nil {
			return fmt.Errorf("ratelimit: SetCloudflareRanges: %w", err)
		}
		set.add(p.Masked())
	}
	if len(set.v4) == 0 || len(set.v6) == 0 {
		return errors.New("ratelimit: SetCloudflareRanges: need at least one IPv4 and one IPv6 range")
	}
	t.cloudflare.Store(&set)
	return nil
}

// RefreshCloudflare fetches Cloudflare's current ranges from src and, when the fetch succeeds,
// swaps them in atomically (see [TrustedProxies.SetCloudflareRanges]). When it fails, t keeps
// the list it had (at first the shipped one) and the error says why; the library logs nothing,
// so log it if an operator should know. It never blocks past ctx or src's timeout.
//
// Call it at start-up and then, say, once a day from a goroutine of your own; t starts none.
func (t *TrustedProxies) RefreshCloudflare(ctx context.Context, src CloudflareSource) error {
	if t == nil || t.cloudflare.Load() == nil {
		return errors.New("ratelimit: RefreshCloudflare: the Cloudflare preset is not enabled")
	}
	prefixes, err := src.Fetch(ctx)
	if err != nil {
		return err
	}
	return t.SetCloudflareRanges(prefixes)
}

// CloudflareRanges returns a copy of the Cloudflare ranges t trusts now, IPv4 first: the shipped
// list, or the last one set or refreshed. It is nil when the Cloudflare preset is off or t is
// nil.
func (t *TrustedProxies) CloudflareRanges() []netip.Prefix {
	if t == nil {
		return nil
	}
	set := t.cloudflare.Load()
	if set == nil {
		return nil
	}
	return set.all()
}
