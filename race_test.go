//go:build race

package ratelimit

// raceEnabled: the race detector is on. sync.Pool then drops items at random, so the header
// arenas are rebuilt often and allocation counts are meaningless.
const raceEnabled = true
