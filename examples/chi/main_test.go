package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
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
	values := rec.Header().Values("RateLimit") // both layers counted it; the clock is real, so t varies
	require.Len(t, values, 2)
	require.True(t, strings.HasPrefix(values[0], `"global";r=197;t=`), values[0])
	require.True(t, strings.HasPrefix(values[1], `"auth";r=0;t=`), values[1])

	rec = do(http.MethodGet, "/auth/me")
	require.Equal(t, http.StatusOK, rec.Code, "not an auth path")
	values = rec.Header().Values("RateLimit")
	require.Len(t, values, 1)
	require.True(t, strings.HasPrefix(values[0], `"global";r=196;t=`), "the global layer counted all four: %s", values[0])
	require.Empty(t, do(http.MethodGet, "/health").Header().Get("RateLimit"), "exempt")
}
