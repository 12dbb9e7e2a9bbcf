package cloudflarekv

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file is a fake of Cloudflare's Workers KV REST API, served by httptest, that behaves as
// documented: a bearer token, the JSON error envelope, 404 with 10009 for a missing key and
// 10013 for a missing namespace, 400 for an expiration_ttl below 60, 429 for a second write to a
// key within a second (a bulk write lists such keys in unsuccessful_keys), and a request budget
// per period that answers 429 with Retry-After once exceeded. It can also be slow, hang, answer
// 5xx, or hold requests until several are in flight together. Its time is the tests' fake clock.

const (
	fakeToken     = "test-token"
	fakeAccount   = "acc0123456789abcdef"
	fakeNamespace = "ns0123456789abcdef"
)

// fakeClock is a clock tests move by hand instead of sleeping.
type fakeClock struct{ nanos atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.nanos.Store(t.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.nanos.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.nanos.Add(int64(d)) }
func (c *fakeClock) Set(t time.Time)         { c.nanos.Store(t.UnixNano()) }

// t0 starts a 60-second window.
var t0 = time.Unix(1_700_000_040, 0)

type fakeValue struct {
	value   []byte
	expires time.Time
	written time.Time
}

type fakeAPI struct {
	srv   *httptest.Server
	clock *fakeClock

	mu     sync.Mutex
	values map[string]fakeValue
	// readLag makes a GET see a key as it was readLag ago, as Workers KV's reads may (and
	// "not found" too), instead of the latest write; history holds every write for it.
	readLag    time.Duration
	history    map[string][]fakeValue
	lastWrite  map[string]time.Time
	budget     int           // requests per budgetWin; 0 = unlimited
	budgetWin  time.Duration // default 5 minutes
	retryAfter int           // seconds, sent with a budget 429
	// retryAfterDate sends that Retry-After as an HTTP date of the fake clock instead.
	retryAfterDate bool
	callTimes      []time.Time
	latency        time.Duration // real time each request takes before it is answered
	outage         int           // when not 0, every request gets this status with an HTML body
	hang           chan struct{} // when not nil, requests wait until it is closed or the client leaves
	barrier        int           // when > 1, requests wait until this many are in flight
	waiting        int
	release        chan struct{}
	ttls           []int // expiration_ttl of every accepted write
	log            []string

	calls        atomic.Int64 // every request
	rejected     atomic.Int64 // answers other than success and 404 10009
	unsuccessful atomic.Int64 // pairs refused inside successful bulk writes
	inFlight     atomic.Int64
}

func newFakeAPI(clock *fakeClock) *fakeAPI {
	f := &fakeAPI{
		clock:      clock,
		values:     map[string]fakeValue{},
		history:    map[string][]fakeValue{},
		lastWrite:  map[string]time.Time{},
		budgetWin:  5 * time.Minute,
		retryAfter: 30,
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	return f
}

func (f *fakeAPI) Close() {
	f.mu.Lock()
	if f.hang != nil {
		close(f.hang)
		f.hang = nil
	}
	f.mu.Unlock()
	f.srv.Close()
}

// config returns a valid Config for this fake.
func (f *fakeAPI) config() Config {
	return Config{
		APIToken:    fakeToken,
		AccountID:   fakeAccount,
		NamespaceID: fakeNamespace,
		BaseURL:     f.srv.URL,
		Now:         f.clock.Now,
	}
}

func (f *fakeAPI) setHang(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case on && f.hang == nil:
		f.hang = make(chan struct{})
	case !on && f.hang != nil:
		close(f.hang)
		f.hang = nil
	}
}

func (f *fakeAPI) set(fn func(f *fakeAPI)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// value returns the stored value of key, as the API would.
func (f *fakeAPI) value(key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.values[key]
	if !ok || !f.clock.Now().Before(v.expires) {
		return "", false
	}
	return string(v.value), true
}

// store writes key as a Worker would, bypassing the API's limits.
func (f *fakeAPI) store(key, value string, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	f.write(key, fakeValue{value: []byte(value), expires: now.Add(ttl), written: now})
}

// write stores v under key. The caller holds f.mu.
func (f *fakeAPI) write(key string, v fakeValue) {
	f.values[key] = v
	f.history[key] = append(f.history[key], v)
}

// read returns the value of key that a GET at now sees. The caller holds f.mu.
func (f *fakeAPI) read(key string, now time.Time) (fakeValue, bool) {
	if f.readLag == 0 {
		v, ok := f.values[key]
		return v, ok
	}
	versions := f.history[key]
	for i := len(versions) - 1; i >= 0; i-- {
		if !versions[i].written.After(now.Add(-f.readLag)) {
			return versions[i], true
		}
	}
	return fakeValue{}, false
}

func writeEnvelope(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if code == 0 {
		fmt.Fprint(w, `{"result":null,"success":true,"errors":[],"messages":[]}`)
		return
	}
	b, _ := json.Marshal(map[string]any{
		"result": nil, "success": false, "messages": []any{},
		"errors": []any{map[string]any{"code": code, "message": msg}},
	})
	w.Write(b)
}

func (f *fakeAPI) reject(w http.ResponseWriter, status, code int, msg string) {
	f.rejected.Add(1)
	writeEnvelope(w, status, code, msg)
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	now := f.clock.Now()

	f.mu.Lock()
	f.log = append(f.log, r.Method+" "+r.URL.RequestURI())
	hang, outage, latency := f.hang, f.outage, f.latency
	var release chan struct{}
	if f.barrier > 1 {
		if f.release == nil {
			f.release = make(chan struct{})
		}
		release = f.release
		f.waiting++
		if f.waiting == f.barrier {
			close(f.release)
			f.release, f.waiting = nil, 0
		}
	}
	f.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
	}
	if latency > 0 {
		timer := time.NewTimer(latency)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
			return
		}
	}
	if release != nil {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
	}
	if outage != 0 {
		f.rejected.Add(1)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(outage)
		fmt.Fprintf(w, "<html><body><h1>%d %s</h1>\n<p>cloudflare</p></body></html>", outage, http.StatusText(outage))
		return
	}

	// The whole API's request budget, counted over a sliding period.
	f.mu.Lock()
	if f.budget > 0 {
		live := f.callTimes[:0]
		for _, t := range f.callTimes {
			if now.Sub(t) < f.budgetWin {
				live = append(live, t)
			}
		}
		f.callTimes = live
		if len(f.callTimes) >= f.budget {
			retryAfter := strconv.Itoa(f.retryAfter)
			if f.retryAfterDate {
				retryAfter = now.Add(time.Duration(f.retryAfter) * time.Second).UTC().Format(http.TimeFormat)
			}
			f.mu.Unlock()
			w.Header().Set("Retry-After", retryAfter)
			w.Header().Set("Ratelimit-Policy", fmt.Sprintf(`"default";q=%d;w=300`, f.budget))
			f.reject(w, http.StatusTooManyRequests, 971, "Please wait and consider throttling your request speed")
			return
		}
		f.callTimes = append(f.callTimes, now)
	}
	f.mu.Unlock()

	if r.Header.Get("Authorization") != "Bearer "+fakeToken {
		f.reject(w, http.StatusForbidden, 10000, "Authentication error")
		return
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/accounts/"+fakeAccount+"/storage/kv/namespaces/")
	if !ok {
		f.reject(w, http.StatusForbidden, 10000, "Authentication error")
		return
	}
	ns, rest, _ := strings.Cut(rest, "/")
	if ns != fakeNamespace {
		f.reject(w, http.StatusNotFound, 10013, "get: 'namespace not found'")
		return
	}
	switch {
	case rest == "bulk" && r.Method == http.MethodPut:
		f.bulk(w, r, now)
	case strings.HasPrefix(rest, "values/"):
		key, err := url.PathUnescape(strings.TrimPrefix(rest, "values/"))
		if err != nil || key == "" || len(key) > 512 || key == "." || key == ".." {
			f.reject(w, http.StatusBadRequest, 10019, "invalid key name")
			return
		}
		switch r.Method {
		case http.MethodGet:
			f.mu.Lock()
			v, ok := f.read(key, now)
			f.mu.Unlock()
			if !ok || !now.Before(v.expires) {
				writeEnvelope(w, http.StatusNotFound, 10009, "get: 'key not found'")
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(v.value)
		case http.MethodPut:
			f.put(w, r, key, now)
		default:
			f.reject(w, http.StatusMethodNotAllowed, 10000, "method not allowed")
		}
	default:
		f.reject(w, http.StatusNotFound, 7003, "Could not route to "+r.URL.Path)
	}
}

func ttlError(ttl int) string {
	return fmt.Sprintf("Invalid expiration_ttl of %d. Expiration TTL must be at least 60.", ttl)
}

func (f *fakeAPI) put(w http.ResponseWriter, r *http.Request, key string, now time.Time) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		f.reject(w, http.StatusBadRequest, 10000, "unreadable body")
		return
	}
	ttl := 0
	if s := r.URL.Query().Get("expiration_ttl"); s != "" {
		if ttl, err = strconv.Atoi(s); err != nil || ttl < 60 {
			f.reject(w, http.StatusBadRequest, 10014, ttlError(ttl))
			return
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if last, ok := f.lastWrite[key]; ok && now.Sub(last) < time.Second {
		f.rejected.Add(1)
		writeEnvelope(w, http.StatusTooManyRequests, 10100, "KV PUT failed: 429 Too Many Requests")
		return
	}
	f.lastWrite[key] = now
	f.ttls = append(f.ttls, ttl)
	exp := now.Add(365 * 24 * time.Hour)
	if ttl > 0 {
		exp = now.Add(time.Duration(ttl) * time.Second)
	}
	f.write(key, fakeValue{value: body, expires: exp, written: now})
	writeEnvelope(w, http.StatusOK, 0, "")
}

type fakePair struct {
	Key           string `json:"key"`
	Value         string `json:"value"`
	ExpirationTTL int    `json:"expiration_ttl"`
}

func (f *fakeAPI) bulk(w http.ResponseWriter, r *http.Request, now time.Time) {
	var pairs []fakePair
	if err := json.NewDecoder(r.Body).Decode(&pairs); err != nil {
		f.reject(w, http.StatusBadRequest, 10026, "could not parse request body")
		return
	}
	if len(pairs) > 10000 {
		f.reject(w, http.StatusBadRequest, 10026, "too many pairs")
		return
	}
	for _, p := range pairs {
		if p.ExpirationTTL != 0 && p.ExpirationTTL < 60 {
			f.reject(w, http.StatusBadRequest, 10014, ttlError(p.ExpirationTTL))
			return
		}
	}
	f.mu.Lock()
	var failed []string
	for _, p := range pairs {
		if last, ok := f.lastWrite[p.Key]; ok && now.Sub(last) < time.Second {
			failed = append(failed, p.Key)
			continue
		}
		f.lastWrite[p.Key] = now
		f.ttls = append(f.ttls, p.ExpirationTTL)
		f.write(p.Key, fakeValue{value: []byte(p.Value), expires: now.Add(time.Duration(p.ExpirationTTL) * time.Second), written: now})
	}
	f.mu.Unlock()
	f.unsuccessful.Add(int64(len(failed)))
	if failed == nil {
		failed = []string{}
	}
	w.Header().Set("Content-Type", "application/json")
	b, _ := json.Marshal(map[string]any{
		"success": true, "errors": []any{}, "messages": []any{},
		"result": map[string]any{"successful_key_count": len(pairs) - len(failed), "unsuccessful_keys": failed},
	})
	w.Write(b)
}
