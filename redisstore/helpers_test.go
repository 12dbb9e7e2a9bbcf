package redisstore_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilat-dev/ratelimit"
	"github.com/kilat-dev/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The environment the tests read. .ci/run sets both: a missing Redis there is a failure.
const (
	envAddr     = "REDIS_ADDR"              // the shared server; default defaultAddr
	envRequire  = "RATELIMIT_REQUIRE_REDIS" // "1": no Redis is a failure, not a skip
	defaultAddr = "127.0.0.1:6379"
)

// unavailable skips the test with msg, or fails it when Redis is required.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(envRequire) == "1" {
		t.Fatalf("%s (%s=1, so Redis is required)", msg, envRequire)
	}
	t.Skip(msg)
}

// newClient returns a go-redis client with the settings the package documents.
func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sharedAddr returns the address of the shared Redis (REDIS_ADDR), or skips the test when
// nothing answers PING there.
func sharedAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv(envAddr)
	if addr == "" {
		addr = defaultAddr
	}
	if err := ping(addr, time.Second); err != nil {
		unavailable(t, "redisstore: no Redis answers at %s (%v); set %s=host:port to run the Redis tests, "+
			"e.g. `redis-server --port 6390 --save ''` and %s=127.0.0.1:6390", addr, err, envAddr, envAddr)
	}
	return addr
}

// prefixedStore returns a Store on the shared Redis under a prefix of the test's own, a raw
// client to look at its keys, and the prefix.
func prefixedStore(t *testing.T) (*redisstore.Store, *redis.Client, string) {
	t.Helper()
	addr := sharedAddr(t)
	prefix := testPrefix(t, addr)
	return newStore(t, addr, redisstore.WithPrefix(prefix)), newClient(t, addr), prefix
}

// testPrefix is a key prefix that belongs to this test alone, so that tests (and test runs)
// sharing one Redis never see each other's keys. Its keys are deleted when the test ends.
func testPrefix(t *testing.T, addr string) string {
	t.Helper()
	name := strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, t.Name())
	prefix := fmt.Sprintf("rltest:%d:%s:", time.Now().UnixNano(), name)
	t.Cleanup(func() {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, k := range scanKeys(t, ctx, c, prefix) {
			c.Del(ctx, k)
		}
	})
	return prefix
}

// scanKeys lists the keys that start with prefix.
func scanKeys(t *testing.T, ctx context.Context, c redis.UniversalClient, prefix string) []string {
	t.Helper()
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	return keys
}

// newStore builds a Store on its own client.
func newStore(t *testing.T, addr string, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(newClient(t, addr), opts...)
	require.NoError(t, err)
	return s
}

// ping sends PING over a fresh connection and expects +PONG.
func ping(addr string, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// redisServer is a redis-server of the test's own, which the test may stop and restart.
type redisServer struct {
	t    *testing.T
	bin  string
	port int
	dir  string
	args []string // more redis-server arguments
	cmd  *exec.Cmd
	out  *bytes.Buffer
}

// startRedisServer starts a private redis-server on a free loopback port, without persistence,
// and stops it when the test ends. Without the redis-server binary the test is skipped (or fails
// when Redis is required).
func startRedisServer(t *testing.T, extraArgs ...string) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redisstore: this test starts and stops a redis-server of its own, and none is on PATH (%v); "+
			"install one, e.g. apt-get install redis-server", err)
	}
	s := &redisServer{t: t, bin: bin, port: freePort(t), dir: t.TempDir(), args: extraArgs}
	t.Cleanup(s.stop)
	s.start()
	return s
}

// freePort finds a loopback port nobody listens on, below Linux's default range of ephemeral
// ports (32768 and up). While the server is stopped its clients keep dialing the port; were it an
// ephemeral port, a dial could be given it as its own local port and connect to itself (a TCP
// simultaneous open), holding the port so that the server could not start again.
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			require.NoError(t, ln.Close())
			return port
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (s *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// start runs the server and waits, at most 10 s, until it answers PING.
func (s *redisServer) start() {
	s.t.Helper()
	require.Nil(s.t, s.cmd, "server already running")
	s.out = new(bytes.Buffer)
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir}, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = s.out, s.out
	require.NoError(s.t, cmd.Start())
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ping(s.addr(), 200*time.Millisecond)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s did not answer within 10s: %v\n%s", s.addr(), err, s.out)
		}
		time.Sleep(20 * time.Millisecond) // waiting for a process, not for time logic
	}
}

// stop kills the server, as a crash would, and waits for it to exit.
func (s *redisServer) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// hungServer listens on loopback, accepts connections and never answers: a Redis that hangs.
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// fixedNow is the clock of the layers in these tests: the start of a 60 s window, so that no
// window boundary falls inside a test.
var fixedNow = time.Unix(1_800_000_000, 0)

// errorLog records the errors a layer reports through OnError.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (e *errorLog) record(_ *http.Request, err error) {
	e.mu.Lock()
	e.errs = append(e.errs, err)
	e.mu.Unlock()
}

func (e *errorLog) take() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	errs := e.errs
	e.errs = nil
	return errs
}

// newLayer builds a layer on store: scope "api", a 60 s window, the fixed clock, errors into log.
func newLayer(t *testing.T, store ratelimit.KV, limit int, log *errorLog, edit func(*ratelimit.Options)) *ratelimit.Limiter {
	t.Helper()
	opts := ratelimit.Options{
		Scope:        "api",
		Max:          limit,
		Window:       time.Minute,
		Store:        store,
		StoreTimeout: 2 * time.Second,
		Now:          func() time.Time { return fixedNow },
		Logger:       slog.New(slog.DiscardHandler),
	}
	if log != nil {
		opts.OnError = log.record
	}
	if edit != nil {
		edit(&opts)
	}
	l, err := ratelimit.New(opts)
	require.NoError(t, err)
	return l
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })

// serve sends one request from client address 203.0.113.7 through h.
func serve(h http.Handler) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/things", nil)
	req.RemoteAddr = "203.0.113.7:40000"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// timedServe is serve, and how long it took.
func timedServe(h http.Handler) (*httptest.ResponseRecorder, time.Duration) {
	start := time.Now()
	rec := serve(h)
	return rec, time.Since(start)
}
