//go:build !unix

package benchmarks

// processCPU is not measured on this platform; the cpu-ns/op metric is left out.
func processCPU() int64 { return -1 }
