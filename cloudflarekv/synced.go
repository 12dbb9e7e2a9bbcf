package cloudflarekv

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudflare/cloudflare-go"
	"github.com/kilat-dev/ratelimit"
)

// ErrClosed is returned by [Synced.Run] after [Synced.Close].
var ErrClosed = errors.New("cloudflarekv: store closed")

// Synced is the mode for serving: a [ratelimit.Counter] that counts exactly in memory and
// reconciles with the other instances through Workers KV in the background, so that requests
// never wait for the API and the API sees a few calls per sync instead of two per request.
//
// Each key's value is {"window":W,"count":SUM,"instances":{"<id>":n,...},"at":MS}: every
// instance writes its own count for the window (it only grows) and keeps the others' counts,
// merged by taking the largest count seen per instance, and the fleet's count is the sum. at is
// when the writer composed the value (Unix milliseconds). A value overwritten by a writer that
// composed its own later without having seen ours (or, in the same window, that does not say
// when it composed it) heals at the next sync. A read that may merely not show our write yet
// (Workers KV takes up to a minute to show one, and caches "not found" as long) is not taken for
// a loss so soon, so that a key written once is not written again at every sync meanwhile: no
// value at all, until our write is a minute old; an older value, until it is a minute old or
// half a window old, whichever comes first. The seed's Worker reads such a value
// as {"window","count"}. [Synced.Increment] returns this instance's exact count plus the latest
// counts it knows of the others.
//
// [Synced.Sync] (called by [Synced.Run] every [Config.SyncInterval]) first reads the keys that
// had requests on this instance in their current window (those with the most requests since
// their last read first, then the least recently read), then writes, in one bulk call of up to
// 10,000 pairs, every key whose count grew since it was last written: at most once per sync and
// never twice within a second, also across a window boundary (the KV key is the same). Calls per sync are capped at Budget × SyncInterval / BudgetPeriod
// (20 with the defaults) and by the budget itself. After an API-wide 429 the store waits for its
// Retry-After; after 5xx answers, timeouts or a rejected token it backs off exponentially (1 s
// doubling to 5 minutes). Increment is unaffected: it only ever touches memory.
//
// Accuracy, for one client and a limit of M per window, with N instances and sync interval s:
// an instance never admits more than M on its own (its local count is exact), so the fleet admits
// at most N×M in a window. A request admitted by instance j is known to another instance i at
// most L = 2s + D later, where D is the delay before a write shows in the API's reads (Workers
// KV: up to 60 s): j writes it at its next sync, i reads it at its first sync after that. This
// holds once i has served the client at least one sync ago (i reads only the keys it serves) and
// when the budget lets i read the key at every sync (the busiest keys are read first; otherwise
// multiply s by the number of syncs it takes to reach the key). Then, if T is the last admission
// of the window, the fleet admits at most M plus what the other instances admitted during
// (T−L, T]: M + (N−1)×r×L for a client sending r requests per second to each instance, capped at
// N×M. A burst that outruns the first syncs gets N×M; so can anything when D reaches the window.
//
// Memory holds one entry per key active on this instance, dropped when its window ends (the end
// is the window start plus half the TTL: [ratelimit.Limiter] passes a TTL of twice the window),
// or a second after the key's last write if that is later: the key's next window must not write
// it again within the second.
//
// A Synced is safe for simultaneous use by multiple goroutines. It starts no goroutine by itself:
// call [Synced.Run] (usually `go s.Run(ctx)`), and [Synced.Close] to stop it.
type Synced struct {
	c           *client
	id          string
	interval    time.Duration
	callTimeout time.Duration
	perSync     int
	now         func() time.Time
	onError     func(error)
	logger      *slog.Logger

	shards [syncShards]syncShard

	syncMu sync.Mutex // one Sync at a time

	runMu      sync.Mutex
	running    bool
	closed     bool
	done       chan struct{}
	stopCtx    context.Context
	stopCancel context.CancelFunc

	syncs, reads, bulkWrites, pairs, unsuccessful atomic.Int64
	turn                                          atomic.Int64 // alternates reads and writes at one call per sync
	lastLogged                                    atomic.Int64
}

// Compile-time checks: Synced counts (Counter) and is a KV, because Options.Store is a KV.
var (
	_ ratelimit.Counter = (*Synced)(nil)
	_ ratelimit.KV      = (*Synced)(nil)
)

const (
	syncShards = 32
	// minWriteGap is Workers KV's limit of one write per second per key.
	minWriteGap = int64(time.Second)
	// visibleAfter is how long Workers KV may take to show a write to reads elsewhere (about a
	// minute; "not found" answers are cached as long). Until then, a read that does not show a
	// write does not prove it lost.
	visibleAfter = int64(time.Minute)
	// maxRemoteCount caps each count read from KV. Counts past any sensible limit mean the same,
	// and the sum of the counts of as many instances as a value can hold then stays far from
	// overflowing.
	maxRemoteCount = 1 << 32
	// seedInstance names, in the instances map, the count of a writer that left no instances
	// of its own: the seed's Worker sharing the namespace.
	seedInstance = "_seed"
)

type syncShard struct {
	mu        sync.Mutex
	m         map[string]*entry
	nextSweep int64
	_         [64]byte
}

// entry is one key's state for its current window.
type entry struct {
	window    int64 // window start, Unix seconds
	end       int64 // window end, Unix nanoseconds; the entry is dropped then
	ttl       time.Duration
	local     int64            // this instance's exact count
	remote    map[string]int64 // the other instances' counts, largest seen
	remoteSum int64
	written   int64 // local count Cloudflare accepted last
	writtenAt int64 // the at of that write's value, Unix milliseconds
	lastWrite int64 // Unix nanoseconds
	lastRead  int64 // Unix nanoseconds; 0 when never read
	readAt    int64 // local count at the last read
}

// NewSynced validates cfg and returns a synced store. It makes no API call and starts no
// goroutine.
func NewSynced(cfg Config) (*Synced, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("cloudflarekv: "+format, args...)) }
	c, err := newClient(&cfg)
	if err != nil {
		errs = append(errs, err)
	}
	switch iv := cfg.SyncInterval; {
	case iv == 0:
		cfg.SyncInterval = DefaultSyncInterval
	case iv < time.Second || iv%time.Second != 0:
		bad("Config.SyncInterval %v must be a whole number of seconds, at least 1s", iv)
	}
	switch {
	case cfg.CallTimeout == 0:
		cfg.CallTimeout = DefaultCallTimeout
	case cfg.CallTimeout < 0:
		bad("Config.CallTimeout %v must be positive", cfg.CallTimeout)
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = defaultInstanceID()
	} else if !validInstance(cfg.InstanceID) {
		bad("Config.InstanceID %q must be 1 to 64 letters, digits, '-', '_' or '.'", cfg.InstanceID)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Synced{
		c:           c,
		id:          cfg.InstanceID,
		interval:    cfg.SyncInterval,
		callTimeout: cfg.CallTimeout,
		now:         cfg.Now,
		onError:     cfg.OnSyncError,
		logger:      cfg.Logger,
	}
	s.perSync = max(1, int(float64(cfg.Budget)*cfg.SyncInterval.Seconds()/cfg.BudgetPeriod.Seconds()))
	s.stopCtx, s.stopCancel = context.WithCancel(context.Background())
	return s, nil
}

func validInstance(id string) bool {
	if id == "" || len(id) > 64 || id == seedInstance {
		return false
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// InstanceID returns the name of this instance in the shared values.
func (s *Synced) InstanceID() string { return s.id }

func shardOf(key string) int { return int(fnv32(key) % syncShards) }

// fnv32 is FNV-1a.
func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// Increment implements [ratelimit.Counter]. It counts in memory and never calls the API, so it
// never fails and never waits; the count it returns is this instance's exact count plus the
// other instances' counts as of the last sync. A call for a window older than the key's current
// one is counted in the current window, which can only over-count.
func (s *Synced) Increment(_ context.Context, key string, window time.Time, ttl time.Duration) (int64, error) {
	w := window.Unix()
	now := s.now().UnixNano()
	sh := &s.shards[shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil || e.window < w {
		var lastWrite int64
		if e == nil {
			sh.sweep(now)
			if sh.m == nil {
				sh.m = make(map[string]*entry)
			}
		} else {
			// The KV key is the same across windows, and so is its limit of one write per
			// second: the new window's first write waits for the old window's last.
			lastWrite = e.lastWrite
		}
		e = &entry{window: w, end: window.Add(ttl / 2).UnixNano(), ttl: ttl, lastWrite: lastWrite}
		sh.m[key] = e
	}
	e.local++
	return e.local + e.remoteSum, nil
}

// sweep drops entries whose window has ended, at most once a second. An entry written less
// than a second ago is kept until that second has passed, so that a new window of its key still
// knows when the key was last written. The caller holds sh.mu.
func (sh *syncShard) sweep(now int64) {
	if now < sh.nextSweep {
		return
	}
	sh.nextSweep = now + int64(time.Second)
	for k, e := range sh.m {
		if now >= e.end && now-e.lastWrite >= minWriteGap {
			delete(sh.m, k)
		}
	}
	if len(sh.m) == 0 {
		sh.m = nil // give the buckets back
	}
}

// Get implements [ratelimit.KV] with a direct API call, as [Store.Get] does, under the same
// budget. The limiter does not call it: it uses Increment.
func (s *Synced) Get(ctx context.Context, key string) ([]byte, bool, error) {
	return s.c.get(ctx, key)
}

// Put implements [ratelimit.KV] with a direct API call, as [Store.Put] does, under the same
// budget. The limiter does not call it: it uses Increment.
func (s *Synced) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return s.c.put(ctx, key, value, ttl)
}

// Stats reports the store's API traffic and how many keys it holds.
func (s *Synced) Stats() Stats {
	st := s.c.stats()
	st.Syncs, st.Reads, st.BulkWrites = s.syncs.Load(), s.reads.Load(), s.bulkWrites.Load()
	st.PairsWritten, st.UnsuccessfulKeys = s.pairs.Load(), s.unsuccessful.Load()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += len(sh.m)
		sh.mu.Unlock()
	}
	return st
}

// syncedValue is the shared value: the seed's two fields and the per-instance counts.
type syncedValue struct {
	Window    *int64           `json:"window"`
	Count     *int64           `json:"count"`
	Instances map[string]int64 `json:"instances,omitempty"`
	// At is when the writer composed the value, Unix milliseconds of its clock.
	At *int64 `json:"at,omitempty"`
}

type readJob struct {
	key      string
	window   int64
	fresh    int64 // requests since the last read
	lastRead int64
}

type writeJob struct {
	key    string
	window int64
	local  int64
}

// Sync reconciles with KV once: it reads the keys that matter, then writes the counts that
// grew, within the budget. [Synced.Run] calls it every SyncInterval; tests call it directly with
// an injected clock. It makes no call while the store backs off (the error then wraps
// [ErrPaused]). Keys Cloudflare reports as unsuccessful in a bulk write are written again at the
// next sync; the error then says how many. Sync never blocks Increment for longer than it takes
// to copy one shard's keys.
func (s *Synced) Sync(ctx context.Context) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	now := s.now().UnixNano()

	var reads []readJob
	writes := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.nextSweep = 0
		sh.sweep(now)
		for k, e := range sh.m {
			if now >= e.end {
				continue // ended; kept only for its last write time
			}
			reads = append(reads, readJob{key: k, window: e.window, fresh: e.local - e.readAt, lastRead: e.lastRead})
			if e.local > e.written && now-e.lastWrite >= minWriteGap {
				writes++
			}
		}
		sh.mu.Unlock()
	}
	if len(reads) == 0 {
		return nil
	}
	if until := s.c.paused(); !until.IsZero() {
		return fmt.Errorf("%w until %s", ErrPaused, until.UTC().Format(time.RFC3339))
	}
	allowance := min(s.perSync, s.c.available())
	if allowance == 0 {
		return fmt.Errorf("%w: %d calls per %v; sync skipped", ErrBudgetExhausted, s.c.budget.limit, s.c.budget.period)
	}
	s.syncs.Add(1)

	// Plan: reads first, so that the values written next carry the freshest counts of the
	// others, with calls kept back for the write. With a single call to spend, alternate.
	readCalls := 0
	switch writeCalls := (writes + MaxBulkPairs - 1) / MaxBulkPairs; {
	case allowance == 1 && writeCalls > 0:
		if s.turn.Add(1)%2 == 1 {
			readCalls = 1
		}
	default:
		keep := writeCalls
		if keep == 0 && allowance >= 2 {
			keep = 1 // for counts a read finds overwritten
		}
		readCalls = min(len(reads), allowance-keep)
	}
	// The keys with the most new requests first: a client hammering the fleet is read at every
	// sync, quiet clients when calls are left. Then the least recently read.
	slices.SortFunc(reads, func(a, b readJob) int {
		return cmp.Or(cmp.Compare(b.fresh, a.fresh), cmp.Compare(a.lastRead, b.lastRead), cmp.Compare(a.key, b.key))
	})
	var errs []error
	made := 0
	readSome := func(n int) bool {
		for ; n > 0 && len(reads) > 0; n-- {
			if ctx.Err() != nil {
				errs = append(errs, ctx.Err())
				return false
			}
			made++
			job := reads[0]
			reads = reads[1:]
			if err := s.read(ctx, job); err != nil {
				errs = append(errs, err)
				if !s.c.paused().IsZero() {
					return false // backing off: no more calls now
				}
			}
		}
		return true
	}
	if !readSome(readCalls) {
		return errors.Join(errs...)
	}
	// Reads may have found our counts overwritten, so the keys to write are counted now.
	if calls := allowance - made; calls > 0 && ctx.Err() == nil {
		n, err := s.write(ctx, calls)
		made += n
		if err != nil {
			errs = append(errs, err)
		} else if n == 0 && readCalls > 0 {
			readSome(allowance - made) // nothing to write: the calls kept back read more keys
		}
	}
	return errors.Join(errs...)
}

// read fetches one key and merges the other instances' counts.
func (s *Synced) read(ctx context.Context, job readJob) error {
	cctx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()
	raw, found, err := s.c.get(cctx, job.key)
	if err != nil {
		return err
	}
	s.reads.Add(1)
	var v syncedValue
	if found {
		if err := json.Unmarshal(raw, &v); err != nil || v.Window == nil || v.Count == nil || *v.Count < 0 {
			v = syncedValue{} // not a counter value: it will be overwritten by our next write
		}
	}
	sh := &s.shards[shardOf(job.key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[job.key]
	if e == nil || e.window != job.window {
		return nil // the window moved on while we read
	}
	now := s.now().UnixNano()
	e.lastRead, e.readAt = now, e.local
	if v.Window == nil || *v.Window != e.window {
		// Our write of this window is not there. A value of a later window (from a writer whose
		// clock runs ahead) is left alone: writing ours again would replace it.
		if e.written > 0 && (v.Window == nil || *v.Window < e.window) && e.lost(found, v, now) {
			e.written = 0
		}
		return nil
	}
	if v.Instances == nil {
		// Written by the seed's Worker: its count is a total that includes what it read of
		// ours. Attribute to it what we cannot explain.
		known := e.written + e.remoteSum - e.remote[seedInstance]
		if extra := *v.Count - known; extra > e.remote[seedInstance] {
			e.setRemote(seedInstance, extra)
		}
		return nil
	}
	for id, n := range v.Instances {
		if id != s.id && n > e.remote[id] {
			e.setRemote(id, n)
		}
	}
	if mine := v.Instances[s.id]; mine < e.written && e.lost(found, v, now) {
		e.written = mine // our count was overwritten by a writer that had not seen it
	}
	return nil
}

// lost reports whether a read at now that does not show this instance's last write (v, when
// found) means that the write is lost and must be made again:
//
//   - a value of this window that was composed after ours, or that does not say when (written
//     by an older release of this package), overwrote ours without having seen it, and so did
//     one of an older window composed after ours (by a writer whose clock runs behind);
//   - no value at all is a read from before our write became visible: Workers KV caches "not
//     found" for up to a minute, and nothing but the TTL (a minute at least) removes our key;
//   - an older value (the seed Worker's of the last window, say) may be such a read too, or a
//     write composed before ours that landed after it: it is doubted once our write is a minute
//     old, or half a window old in a shorter window, so that it heals while the window lasts.
//
// Writing again at every sync meanwhile would cost a write per sync for every key written lately,
// most of them for nothing.
func (e *entry) lost(found bool, v syncedValue, now int64) bool {
	ours := v.Window != nil && *v.Window == e.window
	switch {
	case !found:
		return now-e.lastWrite >= visibleAfter
	case v.At != nil && *v.At > e.writtenAt, v.At == nil && ours:
		return true
	}
	return now-e.lastWrite >= e.grace()
}

// grace is how long after a write a read that does not show it proves nothing: Workers KV's
// delay before it shows a write (visibleAfter), but at most half the window, so that a write lost
// in a short window is made again while the window lasts.
func (e *entry) grace() int64 {
	return min(visibleAfter, (e.end-e.window*int64(time.Second))/2)
}

func (e *entry) setRemote(id string, n int64) {
	n = min(n, maxRemoteCount)
	if e.remote == nil {
		e.remote = make(map[string]int64)
	}
	e.remoteSum += n - e.remote[id]
	e.remote[id] = n
}

// write sends the counts that grew in at most calls bulk writes.
func (s *Synced) write(ctx context.Context, calls int) (made int, err error) {
	now := s.now().UnixNano()
	at := now / int64(time.Millisecond) // every value of this write says when it was composed
	var jobs []writeJob
	var pairs []cloudflare.WorkersKVPair
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if len(pairs) == calls*MaxBulkPairs {
				break
			}
			if e.local <= e.written || now-e.lastWrite < minWriteGap || now >= e.end {
				continue
			}
			counts := make(map[string]int64, len(e.remote)+1)
			for id, n := range e.remote {
				counts[id] = n
			}
			counts[s.id] = e.local
			total := e.local + e.remoteSum
			value, err := json.Marshal(syncedValue{Window: &e.window, Count: &total, Instances: counts, At: &at})
			if err != nil {
				sh.mu.Unlock()
				return 0, fmt.Errorf("cloudflarekv: encoding %q: %w", k, err)
			}
			jobs = append(jobs, writeJob{key: k, window: e.window, local: e.local})
			pairs = append(pairs, cloudflare.WorkersKVPair{Key: k, Value: string(value), ExpirationTTL: ttlSeconds(e.ttl)})
		}
		sh.mu.Unlock()
	}
	var errs []error
	for start := 0; start < len(pairs); start += MaxBulkPairs {
		end := min(start+MaxBulkPairs, len(pairs))
		cctx, cancel := context.WithTimeout(ctx, s.callTimeout)
		failed, err := s.c.bulkPut(cctx, pairs[start:end])
		cancel()
		made++
		if err != nil {
			errs = append(errs, err)
			break
		}
		s.bulkWrites.Add(1)
		s.pairs.Add(int64(end - start - len(failed)))
		s.unsuccessful.Add(int64(len(failed)))
		if len(failed) > 0 {
			errs = append(errs, fmt.Errorf("cloudflarekv: bulk write: %d of %d keys unsuccessful, written again at the next sync (first %q)",
				len(failed), end-start, failed[0]))
		}
		s.markWritten(jobs[start:end], failed, at, s.now().UnixNano())
	}
	return made, errors.Join(errs...)
}

// markWritten records the counts of jobs that Cloudflare accepted (those not in failed), written
// at now in values composed at at (Unix milliseconds).
func (s *Synced) markWritten(jobs []writeJob, failed []string, at, now int64) {
	skip := make(map[string]bool, len(failed))
	for _, k := range failed {
		skip[k] = true
	}
	for _, j := range jobs {
		if skip[j.key] {
			continue
		}
		sh := &s.shards[shardOf(j.key)]
		sh.mu.Lock()
		if e := sh.m[j.key]; e != nil && e.window == j.window {
			e.written = max(e.written, j.local)
			e.writtenAt, e.lastWrite = at, now
		}
		sh.mu.Unlock()
	}
}

// Run calls [Synced.Sync] every SyncInterval until ctx is done or [Synced.Close] is called,
// and returns nil after Close, ctx.Err() otherwise. Syncs happen at whole seconds offset by a
// phase derived from the instance ID, so instances with synchronised clocks and different
// phases do not write a shared key in the same second (Workers KV takes one write per second
// per key; a collision costs the key one interval, nothing more). Errors go to
// Config.OnSyncError. Run may be called once.
func (s *Synced) Run(ctx context.Context) error {
	s.runMu.Lock()
	switch {
	case s.closed:
		s.runMu.Unlock()
		return ErrClosed
	case s.running:
		s.runMu.Unlock()
		return errors.New("cloudflarekv: Run called twice")
	}
	s.running = true
	done := make(chan struct{})
	s.done = done
	s.runMu.Unlock()
	defer close(done)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.stopCtx, cancel)
	defer stop()

	timer := time.NewTimer(s.untilNextSync(time.Now()))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			if s.stopCtx.Err() != nil {
				return nil
			}
			return ctx.Err()
		case <-timer.C:
		}
		if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
			s.report(err)
		}
		timer.Reset(s.untilNextSync(time.Now()))
	}
}

// untilNextSync is the time to the next sync slot: whole multiples of the interval, shifted
// by this instance's phase (a whole number of seconds derived from its ID).
func (s *Synced) untilNextSync(now time.Time) time.Duration {
	iv := int64(s.interval)
	phase := int64(fnv32(s.id)%uint32(s.interval/time.Second)) * int64(time.Second)
	t := now.UnixNano() - phase
	next := (t/iv+1)*iv + phase
	return time.Duration(next - now.UnixNano())
}

// report hands err to OnSyncError, or logs it at most once a minute. Pauses are not reported
// again: the failure that started them was.
func (s *Synced) report(err error) {
	if errors.Is(err, ErrPaused) {
		return
	}
	if s.onError != nil {
		s.onError(err)
		return
	}
	now := s.now().UnixNano()
	last := s.lastLogged.Load()
	if now-last < int64(time.Minute) || !s.lastLogged.CompareAndSwap(last, now) {
		return
	}
	s.logger.Warn("cloudflarekv: sync failed; counting continues locally", "instance", s.id, "error", err)
}

// Close stops [Synced.Run] and waits for it to return. It makes no API call; counts not yet
// synced stay local. Close is idempotent; Increment keeps working after it.
func (s *Synced) Close() error {
	s.runMu.Lock()
	s.closed = true
	done := s.done
	s.runMu.Unlock()
	s.stopCancel()
	if done != nil {
		<-done
	}
	return nil
}
