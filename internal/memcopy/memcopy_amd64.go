package memcopy

import "unsafe"

// SSE2 is part of amd64: no feature check.
const haveNT = true

// Under the race detector Copy is copy, so that it sees every write (the
// assembly is not instrumented); the tests still run the assembly.
const streaming = !raceEnabled

// copyNT copies n bytes (a multiple of 64) from src to dst (64-byte
// aligned) with non-temporal stores, and fences them.
//
//go:noescape
func copyNT(dst, src unsafe.Pointer, n uintptr)
