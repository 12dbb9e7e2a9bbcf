package ratelimit

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func envOf(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func TestDefaultConfigIsTheSeeds(t *testing.T) {
	cfg := DefaultConfig()
	require.Equal(t, Options{
		Scope: "auth", Max: 30, Window: time.Minute,
		Paths: []string{"/login", "/register", "/forgot-password", "/reset-password", "/logout"},
	}, cfg.Auth)
	require.Equal(t, Options{
		Scope: "global", Max: 200, Window: time.Minute,
		ExemptPaths: []string{"/health", "/assets/*", "/.well-known/*", "/avatars/*"},
	}, cfg.Global)

	// The default lists are fresh copies: changing one cannot change the next config.
	cfg.Auth.Paths[0] = "/changed"
	require.Equal(t, "/login", DefaultConfig().Auth.Paths[0])
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name                     string
		env                      map[string]string
		authMax, globalMax       int
		authWindow, globalWindow time.Duration
	}{
		{"unset keeps the defaults", nil, 30, 200, time.Minute, time.Minute},
		{"every variable", map[string]string{
			EnvAuthMax: "5", EnvAuthWindow: "300", EnvGlobalMax: "1000", EnvGlobalWindow: "1",
		}, 5, 1000, 5 * time.Minute, time.Second},
		{"zero disables auth", map[string]string{EnvAuthMax: "0"}, 0, 200, time.Minute, time.Minute},
		{"negative disables global", map[string]string{EnvGlobalMax: "-1"}, 30, -1, time.Minute, time.Minute},
		{"spaces around a number", map[string]string{EnvAuthMax: " 7 ", EnvAuthWindow: "\t90\n"}, 7, 200, 90 * time.Second, time.Minute},
		{"longest window", map[string]string{EnvGlobalWindow: "31536000"}, 30, 200, time.Minute, 365 * 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ConfigFromEnv(envOf(tt.env))
			require.NoError(t, err)
			require.Equal(t, tt.authMax, cfg.Auth.Max)
			require.Equal(t, tt.globalMax, cfg.Global.Max)
			require.Equal(t, tt.authWindow, cfg.Auth.Window)
			require.Equal(t, tt.globalWindow, cfg.Global.Window)
			cfg.Auth.Logger, cfg.Global.Logger = quietLogger, quietLogger
			_, err = NewLayers(cfg)
			require.NoError(t, err, "every accepted environment builds")
		})
	}
}

func TestConfigFromEnvRejectsBadValues(t *testing.T) {
	tests := []struct {
		name, variable, value, want string
	}{
		{"empty max", EnvAuthMax, "", `RATE_LIMIT_AUTH_MAX="" is not a whole number`},
		{"word", EnvGlobalMax, "lots", `RATE_LIMIT_GLOBAL_MAX="lots" is not a whole number`},
		{"fraction", EnvGlobalMax, "1.5", `RATE_LIMIT_GLOBAL_MAX="1.5" is not a whole number`},
		{"overflow", EnvAuthMax, "99999999999999999999", `"99999999999999999999" is not a whole number`},
		{"hex", EnvAuthMax, "0x10", `"0x10" is not a whole number`},
		{"duration syntax", EnvAuthWindow, "60s", `RATE_LIMIT_AUTH_WINDOW="60s" is not a whole number of seconds, such as 60`},
		{"zero window", EnvAuthWindow, "0", `RATE_LIMIT_AUTH_WINDOW="0" must be a positive number of seconds`},
		{"negative window", EnvGlobalWindow, "-60", `RATE_LIMIT_GLOBAL_WINDOW="-60" must be a positive number of seconds`},
		{"empty window", EnvGlobalWindow, "", `RATE_LIMIT_GLOBAL_WINDOW="" is not a whole number`},
		{"window over a year", EnvGlobalWindow, "31536001", `RATE_LIMIT_GLOBAL_WINDOW="31536001" is longer than 365 days`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ConfigFromEnv(envOf(map[string]string{tt.variable: tt.value}))
			require.ErrorContains(t, err, tt.want)
			require.True(t, strings.HasPrefix(err.Error(), "ratelimit: "), err.Error())
			require.Equal(t, Config{}, cfg, "no half-applied config on error")
		})
	}

	t.Run("every problem at once", func(t *testing.T) {
		_, err := ConfigFromEnv(envOf(map[string]string{EnvAuthMax: "x", EnvGlobalWindow: "0"}))
		require.ErrorContains(t, err, EnvAuthMax)
		require.ErrorContains(t, err, EnvGlobalWindow)
	})
}

func TestNewLayersReportsBothLayers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Auth.Paths = []string{"login"}
	cfg.Global.Scope = "bad scope"
	_, err := NewLayers(cfg)
	require.ErrorContains(t, err, `layer "auth": Paths`)
	require.ErrorContains(t, err, `layer "bad scope": scope`)
}

// TestNewLayersRefusesOneScopeForBoth: the two layers need scopes of their own, unless one is
// disabled.
func TestNewLayersRefusesOneScopeForBoth(t *testing.T) {
	for _, tc := range []struct {
		name            string
		authMax, global int
		wantErr         bool
	}{
		{"both enabled", 30, 200, true},
		{"auth disabled", 0, 200, false},
		{"global disabled", 30, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Auth.Scope, cfg.Global.Scope = "api", "api"
			cfg.Auth.Max, cfg.Global.Max = tc.authMax, tc.global
			cfg.Auth.Store, cfg.Global.Store = NewMemoryKV(), NewMemoryKV()
			_, err := NewLayers(cfg)
			if tc.wantErr {
				require.ErrorContains(t, err, `the auth and global layers both have scope "api"`)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

// TestNewLayersRefusesAnEmptyConfig: the Config that ConfigFromEnv returns with its error gets
// an error that points back there, not one about empty scopes.
func TestNewLayersRefusesAnEmptyConfig(t *testing.T) {
	cfg, err := ConfigFromEnv(envOf(map[string]string{EnvAuthWindow: "60s"}))
	require.Error(t, err)
	_, err = NewLayers(cfg)
	require.EqualError(t, err, "ratelimit: NewLayers got an empty Config: start from DefaultConfig, or check the error of ConfigFromEnv, which returns an empty Config with it")
}

// TestNewLayersReportsOneScopeWithTheOtherProblems: the shared scope is reported together with
// the layers' own problems, not instead of them.
func TestNewLayersReportsOneScopeWithTheOtherProblems(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Auth.Scope, cfg.Global.Scope = "api", "api"
	cfg.Auth.Paths = []string{"login"}
	_, err := NewLayers(cfg)
	require.ErrorContains(t, err, `both have scope "api"`)
	require.ErrorContains(t, err, `path pattern "login" must start with "/"`)
}

// TestRejectedNewLayersLeavesNoTrace: a configuration NewLayers refuses logs nothing and records
// no window in the store, so that the next good one, with the running window, warns of nothing.
func TestRejectedNewLayersLeavesNoTrace(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	store := NewMemoryKV()
	config := func(globalWindow time.Duration, authPaths ...string) Config {
		cfg := DefaultConfig()
		cfg.Auth.Store, cfg.Global.Store = store, store
		cfg.Auth.Logger, cfg.Global.Logger = logger, logger
		cfg.Global.Window = globalWindow
		if authPaths != nil {
			cfg.Auth.Paths = authPaths
		}
		return cfg
	}
	_, err := NewLayers(config(time.Minute))
	require.NoError(t, err)
	bad := config(2*time.Minute, "login")
	bad.Auth.Max = 0 // a disabled layer is announced only when its configuration is taken
	_, err = NewLayers(bad)
	require.Error(t, err)
	_, err = NewLayers(config(time.Minute))
	require.NoError(t, err)
	require.Empty(t, logs.String())
}
