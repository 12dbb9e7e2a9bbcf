// Package cloudflarekv keeps rate-limit counters in Cloudflare Workers KV, through Cloudflare's
// REST API (github.com/cloudflare/cloudflare-go), within the API's real limits: 1,200 calls per
// 5 minutes per token, one write per second per key, expiries of at least 60 s, and reads that
// may lag writes by up to 60 s.
//
// Two stores, built from a [Config] ([ConfigFromEnv] reads the credentials):
//
//   - [Synced], for serving: a ratelimit.Counter that counts exactly in memory on each instance
//     and reconciles with the fleet in the background ([Synced.Run], [Synced.Sync]), a few API
//     calls per sync interval whatever the traffic. Requests never wait for the API. The price
//     is a bounded overshoot when several instances see one client (see [Synced]).
//   - [Store], the seed's plain mode: a ratelimit.KV the limiter reads and writes on every
//     request, in the seed's format, so a Go server can share counters with a Worker running
//     the seed. Up to two API calls per request: about 2 requests per second for the whole
//     fleet. Writes KV refuses or cannot take now (one write per second per key, the budget,
//     Cloudflare's 429s) are held in the Store's memory and counted by its reads, so under a
//     burst one instance still admits at most the limit per client (requests taken one after
//     another); across instances the count is only as good as what KV took, up to N times the
//     limit with N instances. Other failures (5xx, timeouts, a rejected token) follow the
//     limiter's failure policy: prefer [Synced] to serve, and ratelimit.Options.FailClosed
//     where letting requests through during an outage is worse than refusing them.
//
// Both send every call under the caller's context, with the SDK's client-side rate limiter and
// retry sleeps turned off, honour Retry-After after a 429 and back off exponentially after 5xx
// answers, timeouts and rejected tokens, and report failures as [*APIError] with Cloudflare's
// error code. A missing key (404, code 10009) is absent; any other 404, like a missing
// namespace (code 10013), is a configuration error ([ErrConfiguration]).
//
// Wiring, with the layers failing open when no credentials are set:
//
//	cfg, err := cloudflarekv.ConfigFromEnv(os.LookupEnv)
//	layers := ratelimit.DefaultConfig()
//	if err == nil {
//		store, err := cloudflarekv.NewSynced(cfg)
//		if err != nil {
//			log.Fatal(err)
//		}
//		go store.Run(ctx)
//		defer store.Close()
//		layers.Auth.Store, layers.Global.Store = store, store
//	} // else: log err; both layers fail open and log it once
//
// A nil *Synced left in ratelimit.Options.Store by a failed constructor counts as no store: the
// layer fails open and says so once, as with a nil Store.
package cloudflarekv
