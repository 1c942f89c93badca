package memcopy

import "unsafe"

// SSE2 is part of amd64: no feature check.
const streaming = true

// copyNT copies n bytes (a multiple of 64) from src to dst (64-byte
// aligned) with non-temporal stores, and fences them.
//
//go:noescape
func copyNT(dst, src unsafe.Pointer, n uintptr)
