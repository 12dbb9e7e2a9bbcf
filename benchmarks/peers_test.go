package benchmarks

import (
	"net/http"
	"regexp"
	"testing"
	"time"
)

// TestContendersAreRealLimiters proves that every contender but the baseline limits: at 5 requests
// per minute a client's 6th request is a 429, and other clients keep their own budget. A
// pass-through would win every benchmark, so no contender is benchmarked without passing this.
func TestContendersAreRealLimiters(t *testing.T) {
	for _, c := range contenders {
		if !c.limiter {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			h := c.wrap(t, 5, time.Minute, okHandler)
			a, b, c := clientRequest(1), clientRequest(2), clientRequest(3)
			for i := 1; i <= 5; i++ {
				expectStatus(t, h, a, http.StatusOK, "client A, request", i)
			}
			expectStatus(t, h, a, http.StatusTooManyRequests, "client A, request", 6)
			expectStatus(t, h, a, http.StatusTooManyRequests, "client A, request", 7)
			for i := 1; i <= 5; i++ {
				expectStatus(t, h, b, http.StatusOK, "client B, request", i)
			}
			expectStatus(t, h, b, http.StatusTooManyRequests, "client B, request", 6)
			expectStatus(t, h, c, http.StatusOK, "client C, request", 1)
		})
	}
}

// TestBaselineDoesNotLimit keeps the baseline honest in the other direction.
func TestBaselineDoesNotLimit(t *testing.T) {
	if c := contenders[len(contenders)-1]; c.name != "baseline" || c.limiter {
		t.Fatalf("the last contender is %q, want the baseline", c.name)
	}
	h := contenders[len(contenders)-1].wrap(t, 5, time.Minute, okHandler)
	for i := 1; i <= 10; i++ {
		expectStatus(t, h, clientRequest(1), http.StatusOK, "request", i)
	}
}

// TestBenchmarkLimitsStayAllowed checks the settings of the allow scenarios: a client may make
// many requests in a row, and every contender answers them all with 200.
func TestBenchmarkLimitsStayAllowed(t *testing.T) {
	for _, c := range contenders {
		t.Run(c.name, func(t *testing.T) {
			h := c.wrap(t, allowLimit, allowWindow, okHandler)
			r := clientRequest(1)
			for i := 1; i <= 1000; i++ {
				expectStatus(t, h, r, http.StatusOK, "request", i)
			}
		})
	}
}

func expectStatus(t *testing.T, h http.Handler, r *http.Request, want int, what string, i int) {
	t.Helper()
	w := newRecorder()
	h.ServeHTTP(w, r)
	if w.status != want {
		t.Fatalf("%s %d from %s: status %d, want %d (headers %v)", what, i, r.RemoteAddr, w.status, want, w.header)
	}
}

// TestHeaderReferences checks that the two header references are what they claim: both send
// the two values, ref-fresh in slices of each response's own, ref-shared in the same slices.
func TestHeaderReferences(t *testing.T) {
	for _, tc := range []struct {
		values headerValues
		shared bool
	}{
		{freshValues, false},
		{sharedValues, true},
	} {
		h := wrapTwoHeaders(tc.values)(t, allowLimit, allowWindow, okHandler)
		first, second := newRecorder(), newRecorder()
		h.ServeHTTP(first, clientRequest(1))
		h.ServeHTTP(second, clientRequest(1))
		for _, name := range []string{"Ratelimit-Policy", "Ratelimit"} {
			want := map[string]string{"Ratelimit-Policy": refPolicy, "Ratelimit": refRateLimit}[name]
			a, b := first.header[name], second.header[name]
			if len(a) != 1 || len(b) != 1 || a[0] != want || b[0] != want {
				t.Fatalf("%s: %q and %q, want [%q] each", name, a, b, want)
			}
			if same := &a[0] == &b[0]; same != tc.shared {
				t.Errorf("%s: the two responses share its slice: %v, want %v", name, same, tc.shared)
			}
		}
	}
}

// TestContenderNames keeps contender names unique and to lower-case letters and '-': run.sh reads
// them from the benchmark names and passes them, unescaped, in a -test.bench pattern.
func TestContenderNames(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z][a-z-]*$`)
	seen := make(map[string]bool)
	for _, c := range contenders {
		if !valid.MatchString(c.name) {
			t.Errorf("contender %q: want lower-case letters and '-' only", c.name)
		}
		if seen[c.name] {
			t.Errorf("contender %q: named twice", c.name)
		}
		seen[c.name] = true
	}
}
