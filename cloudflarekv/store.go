package cloudflarekv

import (
	"context"
	"time"

	"github.com/kilat-dev/ratelimit"
)

// Store is the plain, seed-compatible mode: a [ratelimit.KV] over the REST API. Through it the
// limiter does what the seed's Worker does for every request: a GET, then a PUT of
// {"window":<unix seconds>,"count":<n>}, so a Go server and a Worker running the seed can share
// one namespace. It costs two API calls per counted request (one once a client is over the
// limit and denied by the limiter's local cache): with Cloudflare's 1,200 calls per 5 minutes
// per token, about 2 requests per second for the whole fleet, and Workers KV takes one write per
// second per key (a client sending faster gets write errors) and, on the free plan, 1,000 writes
// a day. Use [Synced] to serve real traffic.
//
// Every call runs under the caller's context; there are no client-side waits or retries. TTLs
// below 60 s are raised to 60 s (the window lives in the value). While the store backs off
// (after an API-wide 429 with Retry-After, 5xx answers, timeouts or a rejected token) or once
// [Config.Budget] is spent, calls fail at once with [ErrPaused] or [ErrBudgetExhausted], and the
// limiter follows its failure policy.
//
// A Store is safe for simultaneous use by multiple goroutines and holds no goroutines.
type Store struct {
	c *client
}

// Compile-time check: Store is a plain KV, deliberately not a Counter.
var _ ratelimit.KV = (*Store)(nil)

// NewStore validates cfg and returns a plain-mode store. It makes no API call.
func NewStore(cfg Config) (*Store, error) {
	c, err := newClient(&cfg)
	if err != nil {
		return nil, err
	}
	return &Store{c: c}, nil
}

// Get implements [ratelimit.KV]: the value of key, ok false when Cloudflare answers 404 with
// code 10009. A 404 with another code (a missing namespace) is an [*APIError] that matches
// [ErrConfiguration].
func (s *Store) Get(ctx context.Context, key string) ([]byte, bool, error) {
	return s.c.get(ctx, key)
}

// Put implements [ratelimit.KV] with the single-key PUT and ?expiration_ttl=, the TTL rounded
// up to whole seconds and raised to at least 60 s.
func (s *Store) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return s.c.put(ctx, key, value, ttl)
}

// Stats reports the store's API traffic.
func (s *Store) Stats() Stats { return s.c.stats() }
