//go:build !amd64

package memcopy

import "unsafe"

// Elsewhere Copy is copy.
const haveNT, streaming = false, false

func copyNT(dst, src unsafe.Pointer, n uintptr) {
	panic("memcopy: no streaming copy on this architecture")
}
