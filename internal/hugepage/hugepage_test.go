package hugepage

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/internal/memfd"
)

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// smapsKB is the field (AnonHugePages, ShmemPmdMapped...) of the mapping
// holding b, in KiB, from /proc/self/smaps.
func smapsKB(t *testing.T, b []byte, field string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	in := false
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			lo, hi, _ := strings.Cut(fields[0], "-")
			l, _ := strconv.ParseUint(lo, 16, 64)
			h, _ := strconv.ParseUint(hi, 16, 64)
			in = uintptr(l) <= addr(b) && addr(b) < uintptr(h)
			continue
		}
		if in && strings.HasPrefix(line, field+":") {
			kb, err := strconv.Atoi(strings.Fields(line)[1])
			require.NoError(t, err)
			return kb
		}
	}
	t.Fatalf("no %s for the mapping at %#x in /proc/self/smaps", field, addr(b))
	return 0
}

func TestMapIsAlignedAndUsable(t *testing.T) {
	f, err := memfd.New("test", 3*Size+4096)
	require.NoError(t, err)
	defer f.Close()
	for _, tc := range []struct {
		name string
		size uint64
		fd   int
	}{
		{"private, one page", 4096, -1},
		{"private, odd size", 3*Size + 123, -1},
		{"shared", 3*Size + 4096, int(f.Fd())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Map(tc.size, tc.fd)
			require.NoError(t, err)
			require.Len(t, b, int(tc.size))
			require.Zero(t, addr(b)%Size, "mapped at %#x", addr(b))
			require.NoError(t, Populate(b, tc.fd >= 0))
			require.Equal(t, -1, firstNot(b, func(int) byte { return 0 }), "fresh memory is zeroed")
			for i := range b {
				b[i] = byte(i)
			}
			require.Equal(t, -1, firstNot(b, func(i int) byte { return byte(i) }))
			require.NoError(t, Unmap(b))
		})
	}
	// The shared mapping's bytes stayed in the file.
	got := make([]byte, 4096)
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, -1, firstNot(got, func(i int) byte { return byte(i) }))
}

// firstNot is the first index where b differs from want, or -1.
func firstNot(b []byte, want func(int) byte) int {
	for i := range b {
		if b[i] != want(i) {
			return i
		}
	}
	return -1
}

func TestMapRefusesZero(t *testing.T) {
	_, err := Map(0, -1)
	require.ErrorIs(t, err, unix.EINVAL)
}

// thpMode is the bracketed word of a transparent_hugepage setting.
func thpMode(t *testing.T, name string) string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/" + name)
	if err != nil {
		t.Skipf("no transparent huge pages here: %v", err)
	}
	s := string(b)
	_, after, _ := strings.Cut(s, "[")
	mode, _, _ := strings.Cut(after, "]")
	return mode
}

// probeCollapse is MADV_COLLAPSE's answer for a fresh 2 MiB mapping with
// one page present: EINVAL where the kernel lacks it (before 6.1), EAGAIN
// or ENOMEM where it has no free huge page.
func probeCollapse(t *testing.T) error {
	probe, err := Map(Size, -1)
	require.NoError(t, err)
	defer Unmap(probe)
	require.NoError(t, unix.Madvise(probe[:4096], unix.MADV_POPULATE_WRITE))
	return unix.Madvise(probe, unix.MADV_COLLAPSE)
}

// skipWithoutFreeHugePages skips when b is not all huge pages because the
// kernel has none free (memory too fragmented). Any other shortfall is
// left to fail the test (b itself is not touched).
func skipWithoutFreeHugePages(t *testing.T, b []byte, field string) {
	if smapsKB(t, b, field) == len(b)/1024 {
		return
	}
	if err := probeCollapse(t); err == unix.EAGAIN || err == unix.ENOMEM {
		t.Skipf("no free huge pages here (MADV_COLLAPSE: %v)", err)
	}
}

// On this project's machines (Linux 6.x, THP "madvise" or "always"),
// both kinds of memory come out as huge pages; where the kernel cannot
// give them the test says why and skips.
func TestPopulateGivesHugePages(t *testing.T) {
	const size = 4 * Size
	t.Run("private", func(t *testing.T) {
		if mode := thpMode(t, "enabled"); mode == "never" {
			t.Skip("transparent huge pages are off (never)")
		}
		b, err := Map(size, -1)
		require.NoError(t, err)
		defer Unmap(b)
		require.NoError(t, Populate(b, false))
		skipWithoutFreeHugePages(t, b, "AnonHugePages")
		require.Equal(t, size/1024, smapsKB(t, b, "AnonHugePages"))
	})
	t.Run("shared", func(t *testing.T) {
		if thpMode(t, "shmem_enabled") == "deny" {
			t.Skip("shmem huge pages denied")
		}
		f, err := memfd.New("test", size)
		require.NoError(t, err)
		defer f.Close()
		b, err := Map(size, int(f.Fd()))
		require.NoError(t, err)
		defer Unmap(b)
		if err := probeCollapse(t); err == unix.EINVAL {
			t.Skipf("MADV_COLLAPSE unsupported here (Linux < 6.1): %v", err)
		}
		require.NoError(t, Populate(b, true))
		skipWithoutFreeHugePages(t, b, "ShmemPmdMapped")
		require.Equal(t, size/1024, smapsKB(t, b, "ShmemPmdMapped"), fmt.Sprintf("Rss %d KiB", smapsKB(t, b, "Rss")))
	})
}
