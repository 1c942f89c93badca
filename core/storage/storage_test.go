package storage

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("unlinked=%v", named), func(t *testing.T) {
			noTmpfile = named
			defer func() { noTmpfile = false }()
			testDiskFileRoundTrip(t)
		})
	}
}

func testDiskFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	d, err := CreateDiskFile(dir, 64<<10)
	require.NoError(t, err)
	requireEmptyDir(t, dir, "the file has no name")
	if directIOWorks(t, dir) {
		require.True(t, d.Direct(), "O_DIRECT on the unnamed file where the filesystem allows it")
	}

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
	requireEmptyDir(t, dir, "nothing left after close")
	require.NoError(t, d.Close())
}

func requireEmptyDir(t *testing.T, dir, msg string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, ents, msg)
}

// directIOWorks says whether dir's filesystem takes O_DIRECT on a named file.
func directIOWorks(t *testing.T, dir string) bool {
	p := filepath.Join(dir, "probe")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	if err == nil {
		f.Close()
	}
	os.Remove(p)
	return err == nil
}

// A process killed with SIGKILL while its disk file is open leaves nothing
// in the directory: the file never had a name. The child is this test
// binary, re-run to create a file and wait to be killed.
func TestDiskFileLeavesNothingAfterSIGKILL(t *testing.T) {
	if dir := os.Getenv("KVBM_TEST_DISK_CHILD"); dir != "" {
		d, err := CreateDiskFile(dir, 1<<20)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		if err := d.WriteAt(make([]byte, 4096), 0); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		select {}
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestDiskFileLeavesNothingAfterSIGKILL$")
	cmd.Env = append(os.Environ(), "KVBM_TEST_DISK_CHILD="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	// The child holds a 1 MiB G3 file open: it is in no directory entry.
	requireEmptyDir(t, dir, "an open disk file has no name")
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
	require.NoError(t, err)
	held := false
	for _, e := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", cmd.Process.Pid, e.Name())); err == nil &&
			strings.HasPrefix(target, dir) {
			held = true
		}
	}
	require.True(t, held, "the child holds a file in %s", dir)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	requireEmptyDir(t, dir, "nothing left after SIGKILL")
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
