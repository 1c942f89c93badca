package crc32c

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// guard is memory with an unmapped (PROT_NONE) page on either side of a
// region of at least n bytes.
type guard struct {
	mem   []byte
	inner []byte
}

func guarded(t *testing.T, n int) *guard {
	page := unix.Getpagesize()
	size := (n + page - 1) / page * page
	mem, err := unix.Mmap(-1, 0, size+2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	require.NoError(t, unix.Mprotect(mem[:page], unix.PROT_NONE))
	require.NoError(t, unix.Mprotect(mem[page+size:], unix.PROT_NONE))
	return &guard{mem: mem, inner: mem[page : page+size]}
}

// atStart is n bytes starting right after the leading guard page.
func (g *guard) atStart(n int) []byte { return g.inner[:n:n] }

// atEnd is n bytes ending right before the trailing guard page.
func (g *guard) atEnd(n int) []byte { return g.inner[len(g.inner)-n:] }
