package storage

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/internal/memavail"
)

func TestSystemMemory(t *testing.T) {
	m, err := AllocSystem(1 << 20)
	require.NoError(t, err)
	b, err := m.Bytes()
	require.NoError(t, err)
	require.Len(t, b, 1<<20)
	require.Zero(t, m.Addr()%4096, "mmap'd memory is page-aligned")
	b[0], b[len(b)-1] = 1, 2
	require.Equal(t, byte(2), HostBytes(m.Addr(), m.Size())[m.Size()-1])
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "Close is idempotent")
	_, err = AllocSystem(0)
	require.Error(t, err)
}

func TestDiskFileRoundTripAndRemoval(t *testing.T) {
	dir := t.TempDir()
	d, err := CreateDiskFile(dir, 64<<10)
	require.NoError(t, err)
	require.Equal(t, dir, filepath.Dir(d.Path()))

	m, err := AllocSystem(64 << 10)
	require.NoError(t, err)
	defer m.Close()
	src, _ := m.Bytes()
	for i := range src {
		src[i] = byte(i * 7)
	}
	// Aligned (direct when available) and unaligned (buffered) I/O.
	require.NoError(t, d.WriteAt(src[:8192], 0))
	require.NoError(t, d.WriteAt(src[8192:8192+100], 8192))
	got := make([]byte, 8192+100)
	require.NoError(t, d.ReadAt(got, 0))
	require.Equal(t, src[:8192+100], got)

	err = d.WriteAt(src[:10], 64<<10-5)
	require.ErrorContains(t, err, "beyond the file's")

	require.NoError(t, d.Close())
	_, err = os.Stat(d.Path())
	require.True(t, os.IsNotExist(err), "the file is removed on close")
	require.NoError(t, d.Close())
}

func TestDiskFileErrors(t *testing.T) {
	_, err := CreateDiskFile("", 4096)
	require.ErrorContains(t, err, "directory must be set")
	_, err = CreateDiskFile(filepath.Join(t.TempDir(), "missing"), 4096)
	require.ErrorContains(t, err, "missing")

	d, err := CreateDiskFile(t.TempDir(), 4096)
	require.NoError(t, err)
	defer d.Close()
	boom := errors.New("injected EIO")
	d.SetFaultInjector(func(op string, off int64, n int) error {
		if op == "write" {
			return boom
		}
		return nil
	})
	err = d.WriteAt(make([]byte, 4096), 0)
	require.ErrorIs(t, err, boom)
	require.NoError(t, d.ReadAt(make([]byte, 4096), 0))
}

// A file cut short behind the layout's back reads as a short read, for
// aligned (direct) and unaligned (buffered) reads alike.
func TestDiskFileTruncatedReadsShort(t *testing.T) {
	d, err := CreateDiskFile(t.TempDir(), 4*4096)
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, os.Truncate(d.Path(), 4096+100))
	require.NoError(t, d.ReadAt(make([]byte, 4096), 0))
	for _, c := range []struct {
		off uint64
		n   int
	}{{4096, 4096}, {8192, 4096}, {4096 + 50, 100}} {
		err := d.ReadAt(make([]byte, c.n), c.off)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "offset %d", c.off)
		require.ErrorContains(t, err, "the file ends before its layout does")
	}
}

// A disk layout larger than its filesystem's free space is refused before
// a block is reserved, naming the bytes requested and free.
func TestDiskFileLargerThanTheFreeSpaceIsRefused(t *testing.T) {
	dir := t.TempDir()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	free := availBytes(&st)
	_, err := CreateDiskFile(dir, free+1<<40)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes requested, ", free+1<<40))
	require.ErrorContains(t, err, " free")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "no file is left behind")
}

// The free space is Bavail fragments of Frsize bytes, as statvfs counts
// it, not of Bsize (the preferred I/O size, here 256 times larger): a
// layout that fits the fragments' count fits, one byte more is refused.
// Frsize 0 falls back to Bsize.
func TestDiskFreeSpaceCountsFragments(t *testing.T) {
	fake := syscall.Statfs_t{Bsize: 1 << 20, Frsize: 4096, Bavail: 1000}
	defer func(prev func(string, *syscall.Statfs_t) error) { statfs = prev }(statfs)
	statfs = func(_ string, st *syscall.Statfs_t) error { *st = fake; return nil }
	dir := t.TempDir()
	free, ok := freeBytes(dir)
	require.True(t, ok)
	require.Equal(t, uint64(1000*4096), free)
	_, err := CreateDiskFile(dir, 1000*4096+1)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes requested, %d free", 1000*4096+1, 1000*4096))
	f, err := CreateDiskFile(dir, 1000*4096)
	require.NoError(t, err, "what the fragments hold fits")
	require.NoError(t, f.Close())

	fake.Frsize = 0
	free, _ = freeBytes(dir)
	require.Equal(t, uint64(1000<<20), free, "no Frsize: Bsize")
}

// A disk layout on tmpfs is memory (shmem): it is refused as host memory
// is when it cannot fit.
func TestDiskFileOnTmpfsIsCheckedAgainstMemory(t *testing.T) {
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) != nil || st.Type != tmpfsMagic {
		t.Skip("no tmpfs at /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "kvbm-test-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	reading := memavail.Reading{MemTotal: 24 << 30, MemAvailable: 1<<30 + 8<<20} // 1 GiB kept free
	defer memavail.Override(func() (memavail.Reading, error) { return reading, nil })()
	d, err := CreateDiskFile(dir, 8<<20)
	require.NoError(t, err, "just under")
	require.NoError(t, d.Close())
	_, err = CreateDiskFile(dir, 8<<20+1)
	require.ErrorIs(t, err, memavail.ErrInsufficient)
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes requested, %d available", 8<<20+1, 8<<20))
}
