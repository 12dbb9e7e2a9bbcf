// Command cloudflare serves the seed's two rate-limit layers with their counters in Cloudflare
// Workers KV, through the synced store of package cloudflarekv, and prints what it does.
//
// It needs real credentials:
//
//	CLOUDFLARE_API_TOKEN         a token with the "Workers KV Storage: Edit" permission
//	CLOUDFLARE_ACCOUNT_ID        the account that owns the namespace
//	RATE_LIMIT_KV_NAMESPACE_ID   the namespace (the Worker's RATE_LIMIT_KV binding, if one shares it)
//
// and reads the layers' RATE_LIMIT_AUTH_MAX, RATE_LIMIT_AUTH_WINDOW, RATE_LIMIT_GLOBAL_MAX and
// RATE_LIMIT_GLOBAL_WINDOW like the seed. Without the credentials it names the missing variables
// and exits; a server would instead leave the store unset and fail open.
//
//	go run ./examples/cloudflare              # serve on :8080 until interrupted
//	go run ./examples/cloudflare -demo        # send 35 logins through the layers, sync, print, exit
//	go run ./examples/cloudflare -plain -demo # the same in the seed's plain mode (2 API calls a request)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/kilat-dev/ratelimit/cloudflarekv"
)

func main() {
	addr := flag.String("addr", ":8080", "address to serve on")
	demo := flag.Bool("demo", false, "send 35 logins from one client through the layers, print the decisions and exit")
	plain := flag.Bool("plain", false, "use the seed's plain mode (a GET and a PUT per request) instead of the synced store")
	instances := flag.Int("instances", 1, "how many instances share the token: each gets 1/instances of the API budget")
	flag.Parse()
	if err := run(*addr, *demo, *plain, *instances); err != nil {
		fmt.Fprintln(os.Stderr, "cloudflare:", err)
		os.Exit(1)
	}
}

func run(addr string, demo, plain bool, instances int) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	kvCfg, err := cloudflarekv.ConfigFromEnv(os.LookupEnv)
	if errors.Is(err, cloudflarekv.ErrNotConfigured) {
		fmt.Fprintf(os.Stderr, "%v\nSet them to a Cloudflare account, a Workers KV namespace and an API token with the \"Workers KV Storage: Edit\" permission.\n", err)
		os.Exit(2)
	}
	if err != nil {
		return err
	}
	if instances < 1 {
		return fmt.Errorf("-instances %d must be at least 1", instances)
	}
	kvCfg.Budget = max(1, cloudflarekv.DefaultBudget/instances) // each instance's share of 600 per 5 minutes
	kvCfg.Logger = logger
	cfg, err := ratelimit.ConfigFromEnv(os.LookupEnv)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var store ratelimit.KV
	var stats func() cloudflarekv.Stats
	var syncNow func(context.Context) error
	if plain {
		s, err := cloudflarekv.NewStore(kvCfg)
		if err != nil {
			return err
		}
		store, stats = s, s.Stats
		fmt.Printf("plain mode: every counted request makes a GET and a PUT on namespace %s (budget %d calls per %v)\n",
			kvCfg.NamespaceID, kvCfg.Budget, cloudflarekv.DefaultBudgetPeriod)
	} else {
		s, err := cloudflarekv.NewSynced(kvCfg)
		if err != nil {
			return err
		}
		defer s.Close()
		go func() {
			if err := s.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				logger.Error("sync loop stopped", "error", err)
			}
		}()
		store, stats, syncNow = s, s.Stats, s.Sync
		fmt.Printf("synced mode: instance %s counts in memory and syncs with namespace %s every %v (budget %d calls per %v)\n",
			s.InstanceID(), kvCfg.NamespaceID, cloudflarekv.DefaultSyncInterval, kvCfg.Budget, cloudflarekv.DefaultBudgetPeriod)
	}

	// One call up front, so that a wrong token or namespace shows now, not as a silent fail-open.
	probeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, _, err = store.Get(probeCtx, "ratelimit:probe")
	cancel()
	if err != nil {
		var ae *cloudflarekv.APIError
		if errors.As(err, &ae) {
			return fmt.Errorf("checking the namespace: Cloudflare answered HTTP %d, code %d: %s", ae.Status, ae.Code, ae.Message)
		}
		return fmt.Errorf("checking the namespace: %w", err)
	}
	fmt.Println("namespace reachable: token and namespace accepted")

	cfg.Auth.Store, cfg.Global.Store = store, store
	cfg.Auth.Logger, cfg.Global.Logger = logger, logger
	layers, err := ratelimit.NewLayers(cfg)
	if err != nil {
		return err
	}
	fmt.Printf("layers: auth %d per %v on %v; global %d per %v except %v\n",
		cfg.Auth.Max, cfg.Auth.Window, cfg.Auth.Paths, cfg.Global.Max, cfg.Global.Window, cfg.Global.ExemptPaths)

	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/login", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "login page") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	handler := layers.Handler(mux)

	if demo {
		for i := 1; i <= 35; i++ {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/login", nil)
			req.RemoteAddr = "192.0.2.10:40000" // a documentation address: one client
			handler.ServeHTTP(rec, req)
			fmt.Printf("login %2d: %d %s RateLimit: %s\n", i, rec.Code, http.StatusText(rec.Code), strings.Join(rec.Header().Values("RateLimit"), ", "))
		}
		if syncNow != nil {
			syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := syncNow(syncCtx)
			cancel()
			fmt.Println("sync:", errText(err))
		}
		st := stats()
		fmt.Printf("API calls: %d (failed %d), keys written: %d, keys in memory: %d\n", st.Calls, st.Failed, st.PairsWritten, st.Keys)
		return nil
	}

	srv := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				st := stats()
				fmt.Printf("store: %d API calls (%d failed), %d keys written, %d keys in memory, paused until %v\n",
					st.Calls, st.Failed, st.PairsWritten, st.Keys, st.PausedUntil)
			}
		}
	}()
	fmt.Printf("serving on %s; try: curl -i -X POST http://localhost%s/login\n", addr, addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	fmt.Println("stopped")
	return nil
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
