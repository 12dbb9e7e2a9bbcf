package main

import (
	"bytes"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// The example runs against REDIS_ADDR as the README shows it; without a Redis the test is skipped,
// unless RATELIMIT_REQUIRE_REDIS=1 (as in CI) makes that a failure.
func TestExampleSharesTheLimit(t *testing.T) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
		msg := "examples/redis: no Redis at " + addr + " (" + err.Error() + "); set REDIS_ADDR=host:port to run this test"
		if os.Getenv("RATELIMIT_REQUIRE_REDIS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	} else {
		_ = conn.Close()
	}
	t.Setenv("REDIS_ADDR", addr)

	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("run: %v\n%s", err, &out)
	}
	got := out.String()
	for _, want := range []string{
		"request 1 -> instance A: 200 OK",
		"request 2 -> instance B: 200 OK",
		"request 5 -> instance A: 200 OK",
		"request 6 -> instance B: 429 Too Many Requests",
		"5 of 8 requests admitted",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
