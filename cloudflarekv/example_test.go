package cloudflarekv

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/kilat-dev/ratelimit"
)

// Two instances of a server count one client against a limit of 5 per minute. Each counts in
// memory; a sync reads the keys that had requests on the instance and writes its own counts, so
// after it each instance knows what the other admitted. The Cloudflare API is the package's
// httptest fake, and the clock is moved by hand (Run would sync every SyncInterval).
func ExampleSynced() {
	clock := newFakeClock(t0)
	api := newFakeAPI(clock)
	defer api.Close()

	var limiters []*ratelimit.Limiter
	var stores []*Synced
	for _, id := range []string{"web-1", "web-2"} {
		cfg := api.config() // credentials, BaseURL of the fake, Now of the fake clock
		cfg.InstanceID = id
		store, err := NewSynced(cfg)
		if err != nil {
			panic(err)
		}
		defer store.Close()
		l, err := ratelimit.New(ratelimit.Options{Scope: "auth", Max: 5, Window: time.Minute, Store: store, Now: clock.Now})
		if err != nil {
			panic(err)
		}
		stores, limiters = append(stores, store), append(limiters, l)
	}
	login := func(instance int) {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = "203.0.113.7:1234"
		res, _ := limiters[instance].Allow(r)
		fmt.Printf("web-%d: allowed=%v remaining=%d\n", instance+1, res.Allowed, res.Remaining)
	}

	login(0)
	login(0)
	login(0)
	login(1)                                 // web-2 has not heard of web-1's three yet
	_ = stores[0].Sync(context.Background()) // web-1 reads the key (absent) and writes its 3
	clock.Advance(time.Second)
	_ = stores[1].Sync(context.Background()) // web-2 reads web-1's 3 and writes 3+1
	login(1)
	login(1)
	v, _ := api.value("ratelimit:auth:203.0.113.7")
	fmt.Println("in KV:", v)
	fmt.Println("API calls:", stores[0].Stats().Calls+stores[1].Stats().Calls)
	// Output:
	// web-1: allowed=true remaining=4
	// web-1: allowed=true remaining=3
	// web-1: allowed=true remaining=2
	// web-2: allowed=true remaining=4
	// web-2: allowed=true remaining=0
	// web-2: allowed=false remaining=0
	// in KV: {"window":1700000040,"count":4,"instances":{"web-1":3,"web-2":1},"at":1700000041000}
	// API calls: 4
}
