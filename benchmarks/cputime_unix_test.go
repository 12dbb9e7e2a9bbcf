//go:build unix

package benchmarks

import "syscall"

// processCPU returns the CPU time the process has used, user and system, in nanoseconds: every
// goroutine of the contender, the garbage collector included, but nothing of other processes.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
