// Package benchmarks compares github.com/kilat-dev/ratelimit with other Go rate limiters, side by
// side, on one trivial handler. It holds only tests and benchmarks; run.sh runs them and prints a
// benchstat table. It is its own module so that the library itself needs no third-party code.
package benchmarks
