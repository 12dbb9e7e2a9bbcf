// Command demo mounts the seed's two rate-limit layers on a real HTTP server on a loopback port,
// drives it with real requests and prints what a client sees. It uses the in-memory store and
// needs no configuration; RATE_LIMIT_* variables are honoured.
//
//	go run ./examples/demo
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
	"strings"
	"time"

	"github.com/kilat-dev/ratelimit"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
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

	mux := http.NewServeMux()
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "welcome") })
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /profile", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "your profile") })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen on loopback: %w", err)
	}
	srv := &http.Server{Handler: layers.Handler(mux), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("serve", "error", err)
		}
	}()
	defer srv.Shutdown(context.Background())
	base := "http://" + ln.Addr().String()
	fmt.Printf("server on %s: auth layer %d req / %v on the login paths, global layer %d req / %v on the rest\n\n",
		base, cfg.Auth.Max, cfg.Auth.Window, cfg.Global.Max, cfg.Global.Window)

	// A window that ends in the middle of the run would hand out a fresh budget; start the run
	// in a fresh window instead.
	if w := cfg.Auth.Window; w > 0 && w <= time.Minute {
		if left := time.Until(time.Now().Truncate(w).Add(w)); left < 3*time.Second {
			time.Sleep(left)
		}
	}

	// 1. Brute force on /login until the auth layer answers 429.
	passed, first429, err := hammer(base, http.MethodPost, "/login", cfg.Auth.Max+5, nil)
	if err != nil {
		return err
	}
	fmt.Printf("POST /login: %d requests passed, then 429 Too Many Requests\n", passed)
	if first429 != nil {
		fmt.Printf("  Retry-After:      %s (seconds until this window ends, not always the full window)\n", first429.Header.Get("Retry-After"))
		// Both layers counted the login, so both report: the auth layer is the one that is out.
		fmt.Printf("  RateLimit-Policy: %s\n", strings.Join(first429.Header.Values("RateLimit-Policy"), ", "))
		fmt.Printf("  RateLimit:        %s\n", strings.Join(first429.Header.Values("RateLimit"), ", "))
	}

	// 2. A forged X-Forwarded-For does not buy a fresh budget: no header is trusted by default.
	spoofed, _, err := hammer(base, http.MethodPost, "/login", 5, func(i int, r *http.Request) {
		r.Header.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
	})
	if err != nil {
		return err
	}
	fmt.Printf("POST /login with a new forged X-Forwarded-For each time: %d of 5 passed\n", spoofed)

	// 3. Health checks are exempt from both layers.
	health, _, err := hammer(base, http.MethodGet, "/health", cfg.Global.Max+50, nil)
	if err != nil {
		return err
	}
	fmt.Printf("GET /health: %d of %d passed: never limited\n", health, cfg.Global.Max+50)

	// 4. Everything else shares the global budget, which the login attempts above used too.
	profile, last, err := hammer(base, http.MethodGet, "/profile", cfg.Global.Max, nil)
	if err != nil {
		return err
	}
	fmt.Printf("GET /profile: %d passed before the global layer answered 429", profile)
	if last != nil {
		fmt.Printf(" (%s)", last.Header.Get("RateLimit"))
	}
	fmt.Println()

	if spoofed != 0 || health != cfg.Global.Max+50 || (cfg.Auth.Max > 0 && passed != cfg.Auth.Max) {
		return errors.New("the server did not limit as configured")
	}
	return nil
}

// hammer sends n requests and returns how many got 200 and the first 429 response.
func hammer(base, method, path string, n int, edit func(int, *http.Request)) (passed int, first429 *http.Response, err error) {
	for i := range n {
		req, err := http.NewRequest(method, base+path, nil)
		if err != nil {
			return 0, nil, err
		}
		if edit != nil {
			edit(i, req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			passed++
		case http.StatusTooManyRequests:
			if first429 == nil {
				first429 = resp
			}
		default:
			return 0, nil, fmt.Errorf("%s %s: unexpected status %s", method, path, resp.Status)
		}
	}
	return passed, first429, nil
}
