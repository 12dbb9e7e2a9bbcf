// Command chi mounts the two rate-limit layers on a chi router: the global layer on the whole
// router with Use, the auth layer on the /auth sub-router with Route. It lives in its own module
// so that the library itself does not depend on chi.
//
//	cd examples/chi && go run .
//
// chi routes sub-routers by its own route context and leaves r.URL.Path whole, so the auth
// layer's patterns are full paths ("/auth/login"), unlike under http.StripPrefix.
package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/kilat-dev/ratelimit"
)

func main() {
	handler, err := newRouter(ratelimit.NewMemoryKV())
	if err != nil {
		slog.Error("configure rate limits", "error", err)
		os.Exit(1)
	}
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	slog.Info("listening", "addr", srv.Addr)
	if err := srv.ListenAndServe(); err != nil {
		slog.Error("serve", "error", err)
		os.Exit(1)
	}
}

func newRouter(store ratelimit.KV) (http.Handler, error) {
	cfg, err := ratelimit.ConfigFromEnv(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	cfg.Auth.Store, cfg.Global.Store = store, store
	cfg.Auth.Paths = []string{"/auth/login", "/auth/register", "/auth/forgot-password", "/auth/reset-password", "/auth/logout"}
	layers, err := ratelimit.NewLayers(cfg)
	if err != nil {
		return nil, err
	}

	r := chi.NewRouter()
	r.Use(layers.Global.Handler)
	r.Get("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	r.Get("/api/hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	r.Route("/auth", func(r chi.Router) {
		r.Use(layers.Auth.Handler)
		r.Post("/login", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "welcome") })
		r.Get("/me", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "you") })
	})
	return r, nil
}
