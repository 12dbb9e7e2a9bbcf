package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kilat-dev/ratelimit"
	"github.com/stretchr/testify/require"
)

func TestChiMounting(t *testing.T) {
	t.Setenv("RATE_LIMIT_AUTH_MAX", "2")
	router, err := newRouter(ratelimit.NewMemoryKV())
	require.NoError(t, err)
	do := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}

	require.Equal(t, http.StatusOK, do(http.MethodPost, "/auth/login").Code)
	require.Equal(t, http.StatusOK, do(http.MethodPost, "/auth/login").Code)
	rec := do(http.MethodPost, "/auth/login")
	require.Equal(t, http.StatusTooManyRequests, rec.Code, "the auth layer sees the full path under chi")
	require.Contains(t, rec.Header().Get("RateLimit"), `"auth";r=0`)

	rec = do(http.MethodGet, "/auth/me")
	require.Equal(t, http.StatusOK, rec.Code, "not an auth path")
	require.Contains(t, rec.Header().Get("RateLimit"), `"global";r=196`, "the global layer counted all four")
	require.Empty(t, do(http.MethodGet, "/health").Header().Get("RateLimit"), "exempt")
}
