package cloudflarekv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudflare/cloudflare-go"
)

// The environment variables [ConfigFromEnv] reads.
const (
	EnvAPIToken    = "CLOUDFLARE_API_TOKEN"
	EnvAccountID   = "CLOUDFLARE_ACCOUNT_ID"
	EnvNamespaceID = "RATE_LIMIT_KV_NAMESPACE_ID"
)

// Defaults applied to zero-valued [Config] fields.
const (
	DefaultBaseURL      = "https://api.cloudflare.com/client/v4"
	DefaultBudget       = 600
	DefaultBudgetPeriod = 5 * time.Minute
	DefaultSyncInterval = 10 * time.Second
	DefaultCallTimeout  = 5 * time.Second
)

// Limits of Cloudflare's API and of Workers KV that the package enforces.
const (
	// APIRequestLimit is the documented limit of the whole Cloudflare API: 1,200 requests per
	// 5 minutes per user or token, shared by every instance that uses the token.
	APIRequestLimit = 1200
	// MinTTL is the shortest expiry Workers KV accepts. Shorter TTLs are raised to it; the
	// logical window lives in the value, so a longer expiry changes no count.
	MinTTL = 60 * time.Second
	// MaxKeyLen is the longest key Workers KV accepts, in bytes.
	MaxKeyLen = 512
	// MaxBulkPairs is how many pairs one bulk write may carry.
	MaxBulkPairs = 10000
	// MaxBudget is the largest [Config.Budget] accepted, whatever the BudgetPeriod: the store
	// remembers the time of each call of the period (8 bytes a call, 800 KB at this maximum), so
	// a long period with a proportionally large budget could otherwise claim gigabytes.
	MaxBudget = 100_000
)

// Cloudflare error codes the package gives a meaning to.
const (
	CodeKeyNotFound       = 10009 // a missing key: not an error, the key is absent
	CodeNamespaceNotFound = 10013 // the namespace does not exist: a configuration error
	CodeAPIRateLimited    = 971   // the token's 1,200 calls per 5 minutes are spent
)

// Sentinel errors; test with [errors.Is].
var (
	// ErrNotConfigured is returned by [ConfigFromEnv] when a variable is missing. The caller
	// should leave ratelimit.Options.Store nil: the layer then fails open and logs it once, as
	// the seed does without its KV binding.
	ErrNotConfigured = errors.New("cloudflarekv: not configured")
	// ErrConfiguration matches an [*APIError] that no retry will fix: the token was rejected
	// (401, 403) or the account or namespace does not exist (404 with a code other than
	// [CodeKeyNotFound]).
	ErrConfiguration = errors.New("cloudflarekv: configuration error")
	// ErrRateLimited matches an [*APIError] with HTTP status 429.
	ErrRateLimited = errors.New("cloudflarekv: rate limited by Cloudflare")
	// ErrPaused is returned, without an API call, while the store backs off after a failure:
	// for the Retry-After of a 429, or exponentially after 5xx answers, timeouts and
	// configuration errors. The error also wraps the failure that started the pause.
	ErrPaused = errors.New("cloudflarekv: paused after an API failure")
	// ErrBudgetExhausted is returned, without an API call, when the call would exceed
	// [Config.Budget].
	ErrBudgetExhausted = errors.New("cloudflarekv: API call budget exhausted")
)

// APIError is an answer from Cloudflare's API that is not a success: the HTTP status and the
// first error of the JSON envelope. Match it with [errors.As]; it also matches
// [ErrConfiguration] and [ErrRateLimited] with [errors.Is].
type APIError struct {
	Op         string        // "get", "put" or "bulk write"
	Key        string        // the key, for single-key operations
	Status     int           // HTTP status code
	Code       int           // Cloudflare error code; 0 when the body held none
	Message    string        // Cloudflare error message, or a short excerpt of a non-JSON body
	RetryAfter time.Duration // the Retry-After of a 429, zero when absent
	RayID      string        // the cf-ray header, for Cloudflare support
}

// Error reads like `cloudflarekv: get "key": HTTP 404, code 10013: get: 'namespace not found'`.
func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("cloudflarekv: ")
	b.WriteString(e.Op)
	if e.Key != "" {
		fmt.Fprintf(&b, " %q", e.Key)
	}
	fmt.Fprintf(&b, ": HTTP %d", e.Status)
	if e.Code != 0 {
		fmt.Fprintf(&b, ", code %d", e.Code)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %v)", e.RetryAfter)
	}
	return b.String()
}

// Is reports whether e belongs to the class target names.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrConfiguration:
		return e.configuration()
	case ErrRateLimited:
		return e.Status == http.StatusTooManyRequests
	}
	return false
}

func (e *APIError) configuration() bool {
	return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden ||
		e.Status == http.StatusNotFound && e.Code != CodeKeyNotFound
}

func (e *APIError) notFound() bool {
	return e.Status == http.StatusNotFound && e.Code == CodeKeyNotFound
}

// Config holds the credentials and the settings of a [Store] or a [Synced]. The three
// credentials are required; every other field has a documented default for its zero value.
type Config struct {
	// APIToken is a Cloudflare API token with the "Workers KV Storage: Edit" permission.
	APIToken string
	// AccountID is the Cloudflare account that owns the namespace.
	AccountID string
	// NamespaceID is the Workers KV namespace (the id of the Worker's RATE_LIMIT_KV binding
	// when a Worker shares the counters).
	NamespaceID string

	// BaseURL is the API's address. Default [DefaultBaseURL]. Tests point it at an httptest
	// server, which then receives /accounts/... paths.
	BaseURL string
	// HTTPClient sends the requests. Default: a client with http.DefaultTransport. Its
	// Transport is wrapped, not changed; every call is bounded by its context, not by
	// HTTPClient.Timeout.
	HTTPClient *http.Client
	// Now reads the clock for budgets, back-off and windows. Default [time.Now].
	Now func() time.Time

	// Budget is how many API calls this instance may make per BudgetPeriod, counting every
	// attempt. Default [DefaultBudget] (600) per [DefaultBudgetPeriod] (5 minutes), half of
	// Cloudflare's 1,200 per 5 minutes for the token. The token's limit is shared by every
	// instance and every other use of the token: with N instances, give each one its share
	// (for example 600/N). A call past the budget is not sent and fails with
	// [ErrBudgetExhausted]. A budget above 1,200 per 5 minutes, or above [MaxBudget] calls in
	// one BudgetPeriod, is rejected.
	Budget int
	// BudgetPeriod is the period of Budget. Default 5 minutes.
	BudgetPeriod time.Duration

	// Logger receives the few operator messages: those of [Synced.Run], and a [Store]'s notice
	// that it answers from memory because the budget is spent or the API answered 429. Default
	// [slog.Default].
	Logger *slog.Logger

	// The fields below apply to [Synced] only.

	// InstanceID names this instance in the shared values. Default: the host name and a
	// random suffix. 1 to 64 letters, digits, '-', '_' or '.'; every instance needs its own.
	InstanceID string
	// SyncInterval is how often [Synced.Run] reconciles with KV: a whole number of seconds,
	// at least 1 s. Default [DefaultSyncInterval]. Each key is written at most once per sync.
	SyncInterval time.Duration
	// CallTimeout bounds each API call a background sync makes. Default [DefaultCallTimeout].
	CallTimeout time.Duration
	// OnSyncError receives the errors of the syncs [Synced.Run] makes. Default: logged
	// through Logger, at most once a minute.
	OnSyncError func(error)
}

// ConfigFromEnv reads the credentials from CLOUDFLARE_API_TOKEN, CLOUDFLARE_ACCOUNT_ID and
// RATE_LIMIT_KV_NAMESPACE_ID through lookup (usually [os.LookupEnv]); other fields keep their
// zero value. When any is missing or blank, the error wraps [ErrNotConfigured] and names the
// missing variables: the caller should then run without a store (leave ratelimit.Options.Store
// nil), so the layer fails open and logs it once.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, error) {
	var cfg Config
	var missing []string
	for _, v := range []struct {
		name string
		dst  *string
	}{
		{EnvAPIToken, &cfg.APIToken},
		{EnvAccountID, &cfg.AccountID},
		{EnvNamespaceID, &cfg.NamespaceID},
	} {
		s, _ := lookup(v.name)
		*v.dst = strings.TrimSpace(s)
		if *v.dst == "" {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return Config{}, fmt.Errorf("%w: %s not set", ErrNotConfigured, strings.Join(missing, ", "))
	}
	return cfg, nil
}

// client is the REST client both stores share. It keeps the budget and the back-off.
//
// Why not the SDK's request path alone: cloudflare-go v0.119.0 sends every call through a
// client-side rate.Limiter (4/s, burst 1) and a retry loop (1+2+4 s sleeps) that ignores
// Retry-After, hides the status and Cloudflare code of 429 and 5xx answers behind plain errors,
// and leaves their bodies open. We keep the SDK for the calls themselves (GetWorkersKV, and Raw
// for the documented PUT with ?expiration_ttl= and the bulk write whose unsuccessful_keys the SDK's
// WriteWorkersKVEntries discards), but neutralise both defaults (UsingRateLimit(math.MaxFloat64),
// UsingRetryPolicy(0, 0, 0): one attempt, no waiting) and wrap the HTTP transport: it reads and
// closes every response body itself, so no body is ever leaked, and records the status, headers
// and error envelope of the one attempt, so errors carry the Cloudflare code and 429s their
// Retry-After. Budget and back-off are ours, driven by the caller's clock.
type client struct {
	sdk     *cloudflare.API
	account *cloudflare.ResourceContainer
	nsPath  string // "/accounts/{account}/storage/kv/namespaces/{namespace}"
	nsID    string
	now     func() time.Time

	budget budget

	mu          sync.Mutex
	pausedUntil time.Time
	pauseCause  error
	failures    int // consecutive failures, for exponential back-off

	calls, failed atomic.Int64
}

// newClient validates the shared fields of cfg; every problem is reported.
func newClient(cfg *Config) (*client, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("cloudflarekv: "+format, args...)) }
	if cfg.APIToken == "" {
		bad("Config.APIToken is empty")
	}
	if !validID(cfg.AccountID) {
		bad("Config.AccountID %q is not a Cloudflare account id", cfg.AccountID)
	}
	if !validID(cfg.NamespaceID) {
		bad("Config.NamespaceID %q is not a Workers KV namespace id", cfg.NamespaceID)
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if u, err := url.Parse(cfg.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("Config.BaseURL %q is not an http(s) URL", cfg.BaseURL)
	}
	cfg.BaseURL = strings.TrimSuffix(cfg.BaseURL, "/")
	if cfg.BudgetPeriod == 0 {
		cfg.BudgetPeriod = DefaultBudgetPeriod
	}
	if cfg.Budget == 0 {
		cfg.Budget = DefaultBudget
	}
	switch {
	case cfg.BudgetPeriod < time.Second:
		bad("Config.BudgetPeriod %v must be at least 1s", cfg.BudgetPeriod)
	case cfg.Budget < 0:
		bad("Config.Budget %d must be positive", cfg.Budget)
	case cfg.Budget > MaxBudget:
		bad("Config.Budget %d per %v is more than the %d calls per period the store can track", cfg.Budget, cfg.BudgetPeriod, MaxBudget)
	case float64(cfg.Budget)/cfg.BudgetPeriod.Seconds() > APIRequestLimit/300.0:
		bad("Config.Budget %d per %v is more than Cloudflare's %d per 5m", cfg.Budget, cfg.BudgetPeriod, APIRequestLimit)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	hc := &http.Client{}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient // a shallow copy: the caller's client keeps its own transport
		hc = &c
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc.Transport = &capture{base: base}
	sdk, err := cloudflare.NewWithAPIToken(cfg.APIToken,
		cloudflare.BaseURL(cfg.BaseURL),
		cloudflare.HTTPClient(hc),
		cloudflare.UsingRateLimit(math.MaxFloat64), // rate.Inf: the SDK never waits
		cloudflare.UsingRetryPolicy(0, 0, 0),       // one attempt, no sleeps
	)
	if err != nil {
		return nil, fmt.Errorf("cloudflarekv: %w", err)
	}
	c := &client{
		sdk:     sdk,
		account: cloudflare.AccountIdentifier(cfg.AccountID),
		nsPath:  "/accounts/" + url.PathEscape(cfg.AccountID) + "/storage/kv/namespaces/" + url.PathEscape(cfg.NamespaceID),
		nsID:    cfg.NamespaceID,
		now:     cfg.Now,
	}
	c.budget.init(cfg.Budget, cfg.BudgetPeriod)
	return c, nil
}

// validID accepts Cloudflare's ids (32 hex digits) and the shorter ids of tests: a safe
// alphabet that needs no escaping in a path.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// checkKey enforces Workers KV's key rules before a call is spent on them.
func checkKey(key string) error {
	switch {
	case key == "", len(key) > MaxKeyLen:
		return fmt.Errorf("cloudflarekv: key %.64q must be 1 to %d bytes long, not %d", key, MaxKeyLen, len(key))
	case key == "." || key == "..":
		return fmt.Errorf("cloudflarekv: key %q is not allowed by Workers KV", key)
	}
	return nil
}

// ttlSeconds is the expiration_ttl to send: ttl rounded up to whole seconds, at least MinTTL.
func ttlSeconds(ttl time.Duration) int {
	s := int64((ttl + time.Second - 1) / time.Second)
	return int(max(s, int64(MinTTL/time.Second)))
}

// reserve takes n calls from the budget unless the client is paused or the budget is spent.
func (c *client) reserve(n int) error {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Before(c.pausedUntil) {
		return fmt.Errorf("%w until %s: %w", ErrPaused, c.pausedUntil.UTC().Format(time.RFC3339), c.pauseCause)
	}
	if !c.budget.take(now.UnixNano(), n) {
		return fmt.Errorf("%w: %d calls per %v", ErrBudgetExhausted, c.budget.limit, c.budget.period)
	}
	return nil
}

// available reports how many calls could be made now.
func (c *client) available() int {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Before(c.pausedUntil) {
		return 0
	}
	return c.budget.available(now.UnixNano())
}

// paused reports when the current back-off ends, or the zero time.
func (c *client) paused() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now().Before(c.pausedUntil) {
		return c.pausedUntil
	}
	return time.Time{}
}

const (
	backoffMin         = time.Second
	backoffMax         = 5 * time.Minute // Cloudflare's own lock-out lasts up to 5 minutes
	defaultRetryAfter  = time.Minute     // a 429 without Retry-After
	maxResponseBody    = 1 << 20         // counter values are tiny; more is not ours
	errorExcerptLength = 200
)

// settle records the outcome of a call: success clears the back-off, a 429 pauses for its
// Retry-After, and other failures that a retry could meet again pause exponentially.
func (c *client) settle(ctx context.Context, err error) {
	c.calls.Add(1)
	if err == nil {
		c.mu.Lock()
		c.failures = 0
		c.mu.Unlock()
		return
	}
	var pause time.Duration
	var ae *APIError
	switch {
	case errors.As(err, &ae) && ae.notFound():
		c.mu.Lock()
		c.failures = 0
		c.mu.Unlock()
		return // an absent key is an answer, not a failure
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return // the caller went away; says nothing about the API
	}
	c.failed.Add(1)
	switch {
	case ae != nil && ae.Status == http.StatusTooManyRequests && (ae.RetryAfter > 0 || ae.Code == CodeAPIRateLimited):
		pause = ae.RetryAfter // the token's API-wide limit: every call would get 429 now
		if pause <= 0 {
			pause = defaultRetryAfter
		}
	case ae != nil && ae.Status < 500 && !ae.configuration():
		// A bad request (400), or a 429 without Retry-After: Workers KV's one write per
		// second per key (its code is not documented). About this call only.
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if pause == 0 {
		c.failures++
		pause = backoffMin << min(c.failures-1, 20)
		pause = min(pause, backoffMax)
	}
	if until := now.Add(pause); until.After(c.pausedUntil) {
		c.pausedUntil = until
		c.pauseCause = err
	}
}

// get reads key. ok is false when the key is absent (404 with code 10009).
func (c *client) get(ctx context.Context, key string) (value []byte, ok bool, err error) {
	if err := checkKey(key); err != nil {
		return nil, false, err
	}
	if err := c.reserve(1); err != nil {
		return nil, false, err
	}
	var m meta
	value, err = c.sdk.GetWorkersKV(withMeta(ctx, &m), c.account, cloudflare.GetWorkersKVParams{NamespaceID: c.nsID, Key: key})
	err = m.check("get", key, err, c.now())
	c.settle(ctx, err)
	var ae *APIError
	if errors.As(err, &ae) && ae.notFound() {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return value, true, nil
}

// put writes one key with the documented single-key PUT and ?expiration_ttl=, which the SDK's
// WriteWorkersKVEntry cannot send.
func (c *client) put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := c.reserve(1); err != nil {
		return err
	}
	var m meta
	uri := c.nsPath + "/values/" + url.PathEscape(key) + "?expiration_ttl=" + strconv.Itoa(ttlSeconds(ttl))
	_, err := c.sdk.Raw(withMeta(ctx, &m), http.MethodPut, uri, value,
		http.Header{"Content-Type": []string{"application/octet-stream"}})
	err = m.check("put", key, err, c.now())
	c.settle(ctx, err)
	return err
}

// bulkResult is the result of a bulk write, which the SDK's WriteWorkersKVEntries discards.
type bulkResult struct {
	SuccessfulKeyCount int      `json:"successful_key_count"`
	UnsuccessfulKeys   []string `json:"unsuccessful_keys"`
}

// bulkPut writes up to MaxBulkPairs pairs in one call and returns the keys Cloudflare reports
// as unsuccessful; they should be written again later.
func (c *client) bulkPut(ctx context.Context, pairs []cloudflare.WorkersKVPair) (unsuccessful []string, err error) {
	if err := c.reserve(1); err != nil {
		return nil, err
	}
	var m meta
	raw, err := c.sdk.Raw(withMeta(ctx, &m), http.MethodPut, c.nsPath+"/bulk", pairs,
		http.Header{"Content-Type": []string{"application/json"}})
	err = m.check("bulk write", "", err, c.now())
	c.settle(ctx, err)
	if err != nil {
		return nil, err
	}
	var res bulkResult
	if len(raw.Result) > 0 && string(raw.Result) != "null" {
		if err := json.Unmarshal(raw.Result, &res); err != nil {
			return nil, fmt.Errorf("cloudflarekv: bulk write: unreadable result %.200q: %w", raw.Result, err)
		}
	}
	return res.UnsuccessfulKeys, nil
}

// meta is what the transport saw of the one attempt of a call.
type meta struct {
	seen   bool
	status int
	header http.Header
	body   []byte
}

type metaKey struct{}

func withMeta(ctx context.Context, m *meta) context.Context {
	return context.WithValue(ctx, metaKey{}, m)
}

// check turns the outcome of an SDK call into our error: an *APIError built from the response
// the transport recorded when the API answered with an error status, the SDK's error (a
// transport failure or a timeout, matching context.DeadlineExceeded) otherwise. now is the
// store's clock, against which a Retry-After date is read.
func (m *meta) check(op, key string, sdkErr error, now time.Time) error {
	if m.seen && m.status >= 400 {
		ae := &APIError{Op: op, Key: key, Status: m.status, RayID: m.header.Get("Cf-Ray")}
		var env cloudflare.Response
		if json.Unmarshal(m.body, &env) == nil && len(env.Errors) > 0 {
			ae.Code, ae.Message = env.Errors[0].Code, env.Errors[0].Message
		} else {
			ae.Message = excerpt(m.body)
		}
		if m.status == http.StatusTooManyRequests {
			ae.RetryAfter = parseRetryAfter(m.header.Get("Retry-After"), now)
		}
		return ae
	}
	if sdkErr != nil {
		if key != "" {
			return fmt.Errorf("cloudflarekv: %s %q: %w", op, key, sdkErr)
		}
		return fmt.Errorf("cloudflarekv: %s: %w", op, sdkErr)
	}
	return nil
}

func excerpt(body []byte) string {
	s := strings.Join(strings.Fields(string(body)), " ")
	if len(s) > errorExcerptLength {
		s = s[:errorExcerptLength] + "..."
	}
	return s
}

// parseRetryAfter reads delay-seconds or an HTTP date, the date measured from now (the store's
// clock, [Config.Now]); zero when absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(min(max(s, 0), 3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, min(t.Sub(now), time.Hour))
	}
	return 0
}

// capture wraps the transport: it reads and closes every response body, hands the SDK an
// in-memory copy (so a body the SDK forgets to close holds nothing), and records the response
// in the call's meta.
type capture struct{ base http.RoundTripper }

func (t *capture) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	if len(body) > maxResponseBody {
		return nil, fmt.Errorf("response larger than %d bytes", maxResponseBody)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	if m, ok := req.Context().Value(metaKey{}).(*meta); ok {
		m.seen, m.status, m.header, m.body = true, resp.StatusCode, resp.Header, body
	}
	return resp, nil
}

// budget allows at most limit calls in any span of period: a sliding log of call times.
type budget struct {
	limit  int
	period time.Duration
	times  []int64 // ring of the last limit call times, Unix nanoseconds
	head   int     // oldest
	n      int
}

func (b *budget) init(limit int, period time.Duration) {
	b.limit, b.period, b.times = limit, period, make([]int64, limit)
}

func (b *budget) expire(now int64) {
	for b.n > 0 && b.times[b.head] <= now-int64(b.period) {
		b.head = (b.head + 1) % b.limit
		b.n--
	}
}

func (b *budget) available(now int64) int {
	b.expire(now)
	return b.limit - b.n
}

func (b *budget) take(now int64, n int) bool {
	if b.available(now) < n {
		return false
	}
	for range n {
		b.times[(b.head+b.n)%b.limit] = now
		b.n++
	}
	return true
}

// Stats counts a store's API traffic since it was built.
type Stats struct {
	Calls       int64     // API calls made (attempts, as Cloudflare counts them)
	Failed      int64     // calls that failed, other than "key not found"
	PausedUntil time.Time // the end of the current back-off; zero when not paused
	Keys        int       // keys held in memory
	// The fields below are for [Store] only.
	AnsweredLocally int64 // Gets answered from memory: budget spent, or paused after a 429
	HeldLocally     int64 // Puts kept in memory only: key written < 1 s ago, a 429, or the budget
	// The fields below are for [Synced] only.
	Syncs            int64 // syncs that made calls
	Reads            int64 // keys read
	BulkWrites       int64 // bulk write calls
	PairsWritten     int64 // pairs Cloudflare accepted (free plan: 1,000 writes a day)
	UnsuccessfulKeys int64 // pairs Cloudflare reported unsuccessful, written again later
}

func (c *client) stats() Stats {
	return Stats{Calls: c.calls.Load(), Failed: c.failed.Load(), PausedUntil: c.paused()}
}

// defaultInstanceID is the host name and 6 random hex digits.
func defaultInstanceID() string {
	host, _ := os.Hostname()
	var b strings.Builder
	for _, c := range []byte(host) {
		if len(b.String()) >= 48 {
			break
		}
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' {
			b.WriteByte(c)
		}
	}
	if b.Len() == 0 {
		b.WriteString("go")
	}
	var r [3]byte
	_, _ = rand.Read(r[:])
	return b.String() + "-" + hex.EncodeToString(r[:])
}
