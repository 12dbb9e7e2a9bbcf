package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The seed's two layers.
const (
	DefaultAuthMax      = 30
	DefaultAuthWindow   = 60 * time.Second
	DefaultGlobalMax    = 200
	DefaultGlobalWindow = 60 * time.Second
)

// DefaultAuthPaths are the paths the auth layer counts by default.
func DefaultAuthPaths() []string {
	return []string{"/login", "/register", "/forgot-password", "/reset-password", "/logout"}
}

// DefaultGlobalExemptPaths are the paths the global layer never counts by default: health
// checks, static assets, well-known probes and avatars.
func DefaultGlobalExemptPaths() []string {
	return []string{"/health", "/assets/*", "/.well-known/*", "/avatars/*"}
}

// Config describes the seed's two layers. Each is a full [Options]: set a Store on both (or on
// either) before calling [NewLayers]; a layer without a store fails open.
type Config struct {
	// Auth is the layer that guards the authentication endpoints against brute force.
	Auth Options
	// Global is the baseline layer over every path but its exempt ones, the auth paths included.
	Global Options
	// TrustedProxies is set by [ConfigFromEnv] from RATE_LIMIT_TRUSTED_PROXIES, whose ClientIP
	// it has already put in both layers; nil otherwise. Keep it to refresh Cloudflare's ranges
	// ([TrustedProxies.RefreshCloudflare]). NewLayers does not read it.
	TrustedProxies *TrustedProxies
}

// DefaultConfig returns the seed's layers, without a store: auth counts 30 requests per 60 s on
// [DefaultAuthPaths]; global counts 200 per 60 s on every path but [DefaultGlobalExemptPaths].
func DefaultConfig() Config {
	return Config{
		Auth: Options{
			Scope:  "auth",
			Max:    DefaultAuthMax,
			Window: DefaultAuthWindow,
			Paths:  DefaultAuthPaths(),
		},
		Global: Options{
			Scope:       "global",
			Max:         DefaultGlobalMax,
			Window:      DefaultGlobalWindow,
			ExemptPaths: DefaultGlobalExemptPaths(),
		},
	}
}

// The environment variables [ConfigFromEnv] reads. Windows are whole seconds.
// EnvTrustedProxies takes the syntax of [ParseTrustedProxies], for example "cloudflare" or
// "cloudflare,10.0.0.0/8".
const (
	EnvGlobalMax      = "RATE_LIMIT_GLOBAL_MAX"
	EnvGlobalWindow   = "RATE_LIMIT_GLOBAL_WINDOW"
	EnvAuthMax        = "RATE_LIMIT_AUTH_MAX"
	EnvAuthWindow     = "RATE_LIMIT_AUTH_WINDOW"
	EnvTrustedProxies = "RATE_LIMIT_TRUSTED_PROXIES"
)

// ConfigFromEnv returns [DefaultConfig] with the RATE_LIMIT_* variables applied. lookup is
// usually [os.LookupEnv]. An unset variable keeps its default; a max of 0 (or less) disables its
// layer; a value that is not a whole number, or a window that is not positive or is longer than
// 365 days, is an error naming the variable and the value. All problems are reported together,
// with an empty Config, which [NewLayers] refuses.
//
// When RATE_LIMIT_TRUSTED_PROXIES is set and not blank, both layers find the client with a
// [TrustedProxies] built from it (also returned in [Config.TrustedProxies]; see
// [ParseTrustedProxies] for the syntax); an entry that is not "cloudflare", "cf-connecting-ip", a
// CIDR prefix or an address is an error naming the entry. Unset or blank,
// the layers keep [RemoteAddrIP] and believe no header.
func ConfigFromEnv(lookup func(string) (string, bool)) (Config, error) {
	cfg := DefaultConfig()
	errs := []error{
		envInt(lookup, EnvAuthMax, &cfg.Auth.Max),
		envSeconds(lookup, EnvAuthWindow, &cfg.Auth.Window),
		envInt(lookup, EnvGlobalMax, &cfg.Global.Max),
		envSeconds(lookup, EnvGlobalWindow, &cfg.Global.Window),
		envTrustedProxies(lookup, EnvTrustedProxies, &cfg),
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// envTrustedProxies reads the trusted proxies from the variable name into both layers of cfg.
func envTrustedProxies(lookup func(string) (string, bool), name string, cfg *Config) error {
	raw, set := lookup(name)
	if !set || strings.TrimSpace(raw) == "" {
		return nil
	}
	opts, errs := parseProxyList(raw)
	for i, err := range errs {
		errs[i] = fmt.Errorf("ratelimit: %s=%q: %w", name, raw, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	proxies, err := NewTrustedProxies(opts)
	if err != nil {
		return fmt.Errorf("ratelimit: %s=%q: %w", name, raw, err)
	}
	cfg.TrustedProxies = proxies
	cfg.Auth.ClientIP = proxies.ClientIP
	cfg.Global.ClientIP = proxies.ClientIP
	return nil
}

// envWhole reads a whole number from the variable name; set is false when it is unset. what
// describes the number in the error.
func envWhole(lookup func(string) (string, bool), name, what string) (n int, raw string, set bool, err error) {
	raw, set = lookup(name)
	if !set {
		return 0, "", false, nil
	}
	n, err = strconv.Atoi(strings.TrimSpace(raw))
	if err != nil {
		return 0, raw, true, fmt.Errorf("ratelimit: %s=%q is not a %s", name, raw, what)
	}
	return n, raw, true, nil
}

func envInt(lookup func(string) (string, bool), name string, dst *int) error {
	n, _, set, err := envWhole(lookup, name, "whole number")
	if set && err == nil {
		*dst = n
	}
	return err
}

func envSeconds(lookup func(string) (string, bool), name string, dst *time.Duration) error {
	sec, raw, set, err := envWhole(lookup, name, "whole number of seconds, such as 60")
	switch {
	case !set || err != nil:
		return err
	case sec <= 0:
		return fmt.Errorf("ratelimit: %s=%q must be a positive number of seconds", name, raw)
	case sec > maxWindowSeconds:
		return fmt.Errorf("ratelimit: %s=%q is longer than 365 days", name, raw)
	}
	*dst = time.Duration(sec) * time.Second
	return nil
}

// Layers holds the seed's two layers.
type Layers struct {
	// Auth counts only its own paths; mount it on the auth routes, or anywhere inside Global.
	Auth *Limiter
	// Global counts every path but its exempt ones; mount it around the whole application.
	Global *Limiter
}

// NewLayers builds both layers of cfg, reporting the problems of both together. A configuration
// it refuses logs nothing and leaves no trace in the store.
func NewLayers(cfg Config) (*Layers, error) {
	if cfg.Auth.Scope == "" && cfg.Global.Scope == "" && cfg.Auth.Max == 0 && cfg.Global.Max == 0 {
		return nil, errors.New("ratelimit: NewLayers got an empty Config: start from DefaultConfig, or check the error of ConfigFromEnv, which returns an empty Config with it")
	}
	var sameScope error
	if cfg.Auth.Scope == cfg.Global.Scope && cfg.Auth.Max > 0 && cfg.Global.Max > 0 {
		// On one store they would share counters (an auth request counted twice in one), and a
		// client could not tell their RateLimit headers apart.
		sameScope = fmt.Errorf("ratelimit: the auth and global layers both have scope %q: give each a scope of its own", cfg.Auth.Scope)
	}
	auth, authErr := build(cfg.Auth)
	global, globalErr := build(cfg.Global)
	if err := errors.Join(sameScope, authErr, globalErr); err != nil {
		return nil, err
	}
	auth.start()
	global.start()
	return &Layers{Auth: auth, Global: global}, nil
}

// Handler mounts both layers on one handler: global outside, auth inside. Because the auth layer
// counts only its own paths, this is the same as mounting auth on the auth routes alone.
func (l *Layers) Handler(next http.Handler) http.Handler {
	if l == nil { // what NewLayers returns with an error
		return (*Limiter)(nil).Handler(next)
	}
	return l.Global.Handler(l.Auth.Handler(next))
}
