package redisstore_test

import (
	"log"
	"net/http"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/kilat-dev/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// Every instance of a server builds its layer the same way; they share one exact limit through
// Redis. The example has no output to check, since it needs a Redis to run.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		ContextTimeoutEnabled: true, // required: the layer's StoreTimeout bounds every call
	})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.WithPrefix("shop:"))
	if err != nil {
		log.Fatal(err)
	}
	login, err := ratelimit.New(ratelimit.Options{
		Scope:        "auth",
		Max:          30,
		Window:       time.Minute,
		Paths:        []string{"/login"},
		Store:        store,
		StoreTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := &http.Server{Addr: ":8080", Handler: login.Handler(mux), ReadHeaderTimeout: 5 * time.Second}
	_ = srv // srv.ListenAndServe() in a real program
}

// A Redis Cluster (or Sentinel, through redis.NewFailoverClusterClient or a UniversalClient with
// MasterName) works the same way: every command touches one key.
func ExampleNew_cluster() {
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	if _, err := redisstore.New(client); err != nil {
		log.Fatal(err)
	}
}
