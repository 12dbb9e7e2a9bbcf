// Command server is a small application behind the seed's two rate-limit layers, to start and
// try with curl:
//
//	go run ./examples/server
//	curl -i -X POST localhost:8080/auth/login      # the 31st within a minute gets 429
//	curl -i localhost:8080/api/hello               # the global layer, 200 per minute
//	curl -i localhost:8080/health                  # never limited
//
// The auth routes live on their own sub-router under /auth/, mounted with http.StripPrefix, so
// the auth layer's patterns ("/login", ...) are relative to that mount point. ADDR sets the
// listen address (default 127.0.0.1:8080); the RATE_LIMIT_* variables tune the layers.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kilat-dev/ratelimit"
)

func main() {
	if err := run(); err != nil {
		slog.Error("server stopped", "error", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := ratelimit.ConfigFromEnv(os.LookupEnv)
	if err != nil {
		return err
	}
	store := ratelimit.NewMemoryKV()
	cfg.Auth.Store, cfg.Global.Store = store, store
	layers, err := ratelimit.NewLayers(cfg)
	if err != nil {
		return err
	}

	auth := http.NewServeMux()
	for _, p := range ratelimit.DefaultAuthPaths() {
		auth.HandleFunc("POST "+p, func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "%s: ok\n", p)
		})
	}

	root := http.NewServeMux()
	root.Handle("/auth/", http.StripPrefix("/auth", layers.Auth.Handler(auth)))
	root.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	root.HandleFunc("GET /api/hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })

	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	srv := &http.Server{Addr: addr, Handler: layers.Global.Handler(root), ReadHeaderTimeout: 5 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	slog.Info("listening", "addr", addr, "auth_max", cfg.Auth.Max, "global_max", cfg.Global.Max)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
