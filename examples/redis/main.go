// Command redis runs two instances of a server, on two loopback ports, that share one rate limit
// through Redis, and shows it with real HTTP requests sent to each in turn.
//
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/redis
//
// REDIS_ADDR defaults to 127.0.0.1:6379. The program exits with status 1 when Redis cannot be
// reached, or when the two instances do not share the limit exactly.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/kilat-dev/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

const (
	maxRequests = 5
	window      = 10 * time.Minute
	requests    = 8
)

func main() {
	// go-redis logs every failed dial to stderr through a logger of its own; this program reports
	// failures itself. A real server would route them to its logger with redis.SetLogger.
	redis.SetLogger(quietLogger{})
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "examples/redis:", err)
		os.Exit(1)
	}
}

// instance is one server: its own go-redis client, store, limiter and listener.
type instance struct {
	name   string
	url    string
	client *redis.Client
	server *http.Server
	done   chan error
}

func run(out io.Writer) error {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	// Each run counts under a prefix of its own, so that every run starts from zero.
	prefix := fmt.Sprintf("example:%d:", time.Now().UnixNano())

	var storeErrs errorList
	var instances []*instance
	defer func() {
		for _, in := range instances {
			in.stop()
		}
	}()
	for _, name := range []string{"A", "B"} {
		in, err := start(name, addr, prefix, &storeErrs)
		if err != nil {
			return err
		}
		instances = append(instances, in)
	}

	fmt.Fprintf(out, "Redis %s; layer %q: %d requests per %v per client, counted in Redis under %q\n",
		addr, "login", maxRequests, window, prefix+"ratelimit:login:127.0.0.1:{window}")
	for _, in := range instances {
		fmt.Fprintf(out, "instance %s listens on %s\n", in.name, in.url)
	}
	fmt.Fprintln(out)

	hc := &http.Client{Timeout: 5 * time.Second}
	admitted := 0
	for i := range requests {
		in := instances[i%len(instances)]
		resp, err := hc.Get(in.url + "/login")
		if err != nil {
			return fmt.Errorf("request %d to instance %s: %w", i+1, in.name, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		line := fmt.Sprintf("request %d -> instance %s: %s", i+1, in.name, resp.Status)
		if v := resp.Header.Get("RateLimit"); v != "" {
			line += "  RateLimit: " + v
		}
		if v := resp.Header.Get("Retry-After"); v != "" {
			line += "  Retry-After: " + v
		}
		fmt.Fprintln(out, line)
		if resp.StatusCode == http.StatusOK {
			admitted++
		}
	}
	fmt.Fprintln(out)

	if err := storeErrs.join(); err != nil {
		return fmt.Errorf("the store failed during the run, so the layers failed open: %w", err)
	}
	if admitted != maxRequests {
		return fmt.Errorf("%d of %d requests were admitted, want exactly %d: the instances do not share the limit", admitted, requests, maxRequests)
	}
	fmt.Fprintf(out, "%d of %d requests admitted, alternating between two instances: they share one limit of %d.\n",
		admitted, requests, maxRequests)
	return nil
}

// start builds one instance and starts serving. It fails when Redis does not answer.
func start(name, addr, prefix string, storeErrs *errorList) (*instance, error) {
	client := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true, // required: the layer's StoreTimeout bounds every Redis call
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("cannot reach Redis at %s (%v); start one (redis-server) or set REDIS_ADDR=host:port", addr, err)
	}
	store, err := redisstore.New(client, redisstore.WithPrefix(prefix))
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	limiter, err := ratelimit.New(ratelimit.Options{
		Scope:   "login",
		Max:     maxRequests,
		Window:  window,
		Store:   store,
		OnError: func(_ *http.Request, err error) { storeErrs.add(err) },
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "hello from instance %s\n", name)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	in := &instance{
		name:   name,
		url:    "http://" + ln.Addr().String(),
		client: client,
		server: &http.Server{Handler: limiter.Handler(mux), ReadHeaderTimeout: 5 * time.Second},
		done:   make(chan error, 1),
	}
	go func() { in.done <- in.server.Serve(ln) }()
	return in, nil
}

func (in *instance) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = in.server.Shutdown(ctx)
	if err := <-in.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "examples/redis: instance %s: %v\n", in.name, err)
	}
	_ = in.client.Close()
}

// errorList collects the store errors the layers report.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (e *errorList) add(err error) {
	e.mu.Lock()
	e.errs = append(e.errs, err)
	e.mu.Unlock()
}

func (e *errorList) join() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return errors.Join(e.errs...)
}

// quietLogger drops go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
