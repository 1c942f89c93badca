package memavail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

const gib = 1 << 30

// fakeRoot writes files (path relative to the root: contents) under a new
// directory, the root of a Source.
func fakeRoot(t *testing.T, files map[string]string) Source {
	t.Helper()
	root := t.TempDir()
	for p, s := range files {
		full := filepath.Join(root, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(s), 0o644))
	}
	return Source{Root: root}
}

func meminfoOf(total, avail uint64) string {
	return fmt.Sprintf("MemTotal:       %d kB\nMemFree:         1234 kB\nMemAvailable:   %d kB\nShmem:  0 kB\n", total>>10, avail>>10)
}

const (
	v2Mount = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
	v1Mount = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n" +
		"35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"36 31 0:33 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
)

func TestReadsTheTightestOfMemAvailableAndTheCgroups(t *testing.T) {
	for _, tc := range []struct {
		name       string
		files      map[string]string
		avail      uint64
		cgroup     string
		limit, use uint64
	}{{
		name:  "no cgroup file",
		files: map[string]string{},
		avail: 20 * gib,
	}, {
		name: "v2 max: no limit",
		files: map[string]string{
			"proc/self/cgroup":                       "0::/a/b\n",
			"proc/self/mountinfo":                    v2Mount,
			"sys/fs/cgroup/a/b/memory.max":           "max\n",
			"sys/fs/cgroup/a/b/memory.current":       "1000\n",
			"sys/fs/cgroup/a/memory.max":             "max\n",
			"sys/fs/cgroup/a/memory.current":         "1000\n",
			"sys/fs/cgroup/memory.stat":              "anon 1\n", // the root has no memory.max
			"sys/fs/cgroup/unrelated/memory.max":     "1\n",
			"sys/fs/cgroup/unrelated/memory.current": "0\n",
		},
		avail: 20 * gib,
	}, {
		name: "v2 limit below the host's, less page cache (active and inactive)",
		files: map[string]string{
			"proc/self/cgroup":                 "0::/a/b\n",
			"proc/self/mountinfo":              v2Mount,
			"sys/fs/cgroup/a/b/memory.max":     fmt.Sprint(8 * gib),
			"sys/fs/cgroup/a/b/memory.current": fmt.Sprint(3 * gib),
			"sys/fs/cgroup/a/b/memory.stat":    fmt.Sprintf("anon 5\nactive_file %d\ninactive_file %d\nactive_anon 7\n", gib/2, gib),
		},
		avail: 6*gib + gib/2, cgroup: "/sys/fs/cgroup/a/b", limit: 8 * gib, use: 3 * gib / 2,
	}, {
		// A container that read its model weights: its page cache is
		// mostly active, reclaimed before the OOM killer runs.
		name: "v2 active page cache is available",
		files: map[string]string{
			"proc/self/cgroup":               "0::/a\n",
			"proc/self/mountinfo":            v2Mount,
			"sys/fs/cgroup/a/memory.max":     fmt.Sprint(16 * gib),
			"sys/fs/cgroup/a/memory.current": fmt.Sprint(15 * gib),
			"sys/fs/cgroup/a/memory.stat":    fmt.Sprintf("anon %d\nfile %d\nactive_file %d\ninactive_file %d\n", 3*gib, 12*gib, 11*gib, gib),
		},
		avail: 13 * gib, cgroup: "/sys/fs/cgroup/a", limit: 16 * gib, use: 3 * gib,
	}, {
		name: "v2 the tightest ancestor counts",
		files: map[string]string{
			"proc/self/cgroup":                 "0::/a/b\n",
			"proc/self/mountinfo":              v2Mount,
			"sys/fs/cgroup/a/b/memory.max":     "max",
			"sys/fs/cgroup/a/b/memory.current": fmt.Sprint(1 * gib),
			"sys/fs/cgroup/a/memory.max":       fmt.Sprint(4 * gib),
			"sys/fs/cgroup/a/memory.current":   fmt.Sprint(3 * gib),
		},
		avail: 1 * gib, cgroup: "/sys/fs/cgroup/a", limit: 4 * gib, use: 3 * gib,
	}, {
		name: "v2 a cgroup over its limit leaves nothing",
		files: map[string]string{
			"proc/self/cgroup":               "0::/a\n",
			"proc/self/mountinfo":            v2Mount,
			"sys/fs/cgroup/a/memory.max":     fmt.Sprint(4 * gib),
			"sys/fs/cgroup/a/memory.current": fmt.Sprint(5 * gib),
		},
		avail: 0, cgroup: "/sys/fs/cgroup/a", limit: 4 * gib, use: 5 * gib,
	}, {
		name: "v1 memory controller beside v2 without one (hybrid)",
		files: map[string]string{
			"proc/self/cgroup": "9:name=systemd:/\n5:cpu,cpuacct:/x\n4:memory:/x/y\n0::/\n",
			"proc/self/mountinfo": v1Mount +
				"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
			"sys/fs/cgroup/memory/x/y/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/x/y/memory.usage_in_bytes": "100\n",
			"sys/fs/cgroup/memory/x/memory.limit_in_bytes":   fmt.Sprint(10 * gib),
			"sys/fs/cgroup/memory/x/memory.usage_in_bytes":   fmt.Sprint(3 * gib),
			"sys/fs/cgroup/memory/x/memory.stat":             fmt.Sprintf("active_file 3\ninactive_file 5\ntotal_active_file %d\ntotal_inactive_file %d\n", gib/2, gib),
			"sys/fs/cgroup/memory/memory.limit_in_bytes":     "9223372036854771712\n",
			"sys/fs/cgroup/memory/memory.usage_in_bytes":     "100\n",
		},
		avail: 8*gib + gib/2, cgroup: "/sys/fs/cgroup/memory/x", limit: 10 * gib, use: 3 * gib / 2,
	}, {
		name: "v1 mount showing the container's own cgroup",
		files: map[string]string{
			"proc/self/cgroup":                           "4:memory:/docker/abc\n",
			"proc/self/mountinfo":                        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": fmt.Sprint(2 * gib),
			"sys/fs/cgroup/memory/memory.usage_in_bytes": fmt.Sprint(gib / 2),
		},
		avail: 3 * gib / 2, cgroup: "/sys/fs/cgroup/memory", limit: 2 * gib, use: gib / 2,
	}, {
		name: "v2 mount point with a space, no mountinfo entry for v1",
		files: map[string]string{
			"proc/self/cgroup":              "0::/a\n",
			"proc/self/mountinfo":           `30 23 0:27 / /sys/fs/cg\040v2 rw - cgroup2 cgroup2 rw` + "\n",
			"sys/fs/cg v2/a/memory.max":     fmt.Sprint(4 * gib),
			"sys/fs/cg v2/a/memory.current": fmt.Sprint(1 * gib),
		},
		avail: 3 * gib, cgroup: "/sys/fs/cg v2/a", limit: 4 * gib, use: gib,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.files["proc/meminfo"] = meminfoOf(24*gib, 20*gib)
			r, err := fakeRoot(t, tc.files).Read()
			require.NoError(t, err)
			require.Equal(t, Reading{MemTotal: 24 * gib, MemAvailable: 20 * gib,
				Cgroup: tc.cgroup, CgroupLimit: tc.limit, CgroupUsage: tc.use}, r)
			require.Equal(t, tc.avail, r.Available())
		})
	}
}

func TestReadNeedsMeminfo(t *testing.T) {
	_, err := fakeRoot(t, nil).Read()
	require.Error(t, err)
	_, err = fakeRoot(t, map[string]string{"proc/meminfo": "MemFree: 1 kB\n"}).Read()
	require.ErrorContains(t, err, "MemTotal")
	r, err := fakeRoot(t, map[string]string{"proc/meminfo": "MemTotal: 8 kB\nMemFree: 4 kB\n"}).Read()
	require.NoError(t, err)
	require.Equal(t, Reading{MemTotal: 8 << 10, MemAvailable: 4 << 10}, r, "MemFree before Linux 3.14")
}

func TestMarginIsAThirtySecondAtLeastAGiBAtMostAnEighth(t *testing.T) {
	require.Equal(t, uint64(gib), Reading{MemTotal: 24 * gib}.Margin())
	require.Equal(t, uint64(8*gib), Reading{MemTotal: 256 * gib}.Margin())
	require.Equal(t, uint64(gib/4), Reading{MemTotal: 2 * gib}.Margin())
	require.Equal(t, uint64(gib/4), Reading{MemTotal: 24 * gib, Cgroup: "/c", CgroupLimit: 2 * gib}.Margin(),
		"a cgroup's limit below the host's binds")
	require.Equal(t, uint64(gib), Reading{MemTotal: 24 * gib, Cgroup: "/c", CgroupLimit: 64 * gib}.Margin())
}

// This machine's own figures read, whatever its cgroups.
func TestReadsThisMachine(t *testing.T) {
	r, err := Source{}.Read()
	require.NoError(t, err)
	require.NotZero(t, r.MemTotal)
	require.LessOrEqual(t, r.Available(), r.MemTotal)
	t.Log(r)
}

func inject(t *testing.T, r Reading) {
	t.Cleanup(Override(func() (Reading, error) { return r, nil }))
}

func TestReserveRefusesJustOverAndGrantsJustUnder(t *testing.T) {
	host := Reading{MemTotal: 24 * gib, MemAvailable: 20 * gib} // 1 GiB kept free
	inject(t, host)
	release, err := Reserve(19 * gib)
	require.NoError(t, err, "just under")
	release()
	release() // once only
	_, err = Reserve(19*gib + 1)
	require.ErrorIs(t, err, ErrInsufficient, "just over")
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes requested, %d available (MemAvailable %d of MemTotal %d, %d kept free)",
		19*gib+1, 19*gib, 20*gib, 24*gib, gib))
	require.NoError(t, Check(19*gib))
	require.ErrorIs(t, Check(19*gib+1), ErrInsufficient)

	// A cgroup's limit lower than the host's: 6 GiB left in it, 1 GiB kept free.
	cg := host
	cg.Cgroup, cg.CgroupLimit, cg.CgroupUsage = "/sys/fs/cgroup/job", 8*gib, 2*gib
	inject(t, cg)
	require.NoError(t, Check(5*gib))
	err = Check(5*gib + 1)
	require.ErrorIs(t, err, ErrInsufficient)
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes requested, %d available", 5*gib+1, 5*gib))
	require.ErrorContains(t, err, fmt.Sprintf("cgroup /sys/fs/cgroup/job: limit %d, in use %d", 8*gib, 2*gib))
}

// Two allocations at once cannot both count the same free memory: what
// one reserved is taken for the other until it is released.
func TestReservationsInFlightCount(t *testing.T) {
	inject(t, Reading{MemTotal: 24 * gib, MemAvailable: 20 * gib})
	a, err := Reserve(12 * gib)
	require.NoError(t, err)
	_, err = Reserve(8 * gib)
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes requested, %d available", 8*gib, 7*gib))
	require.ErrorContains(t, err, fmt.Sprintf("%d being allocated by this process", 12*gib))
	a()
	b, err := Reserve(8 * gib)
	require.NoError(t, err)
	b()
}

func TestUnreadableFiguresRefuseNothing(t *testing.T) {
	t.Cleanup(Override(func() (Reading, error) { return Reading{}, errors.New("no /proc") }))
	release, err := Reserve(1 << 60)
	require.NoError(t, err)
	release()
}
