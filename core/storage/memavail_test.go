package storage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/kvbmerr"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/memavail"
)

const gib = 1 << 30

// requireOutOfMemory checks err is the driver's out of memory (what the C
// ABI reports as KVBM_ERR_CUDA) naming the bytes requested and available
// ("": any number).
func requireOutOfMemory(t *testing.T, err error, requested uint64, available string) {
	t.Helper()
	require.Error(t, err)
	require.Truef(t, cuda.IsCode(err, cuda.ErrCodeOutOfMemory), "want CUDA_ERROR_OUT_OF_MEMORY, got %v", err)
	if available == "" {
		require.Regexp(t, fmt.Sprintf(`%d bytes requested, \d+ available`, requested), err.Error())
		return
	}
	require.ErrorContains(t, err, fmt.Sprintf("%d bytes requested, %s available", requested, available))
}

// Host memory that cannot fit is refused before a page is touched, just
// over what is available less the margin; just under is allocated. A
// cgroup's limit lower than the host's binds.
func TestHostMemoryThatCannotFitIsRefused(t *testing.T) {
	reading := memavail.Reading{MemTotal: 24 * gib, MemAvailable: 1*gib + 8<<20} // 1 GiB kept free
	defer memavail.Override(func() (memavail.Reading, error) { return reading, nil })()
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	allocs := map[string]func(size uint64) (*Memory, error){
		"shared pinned": func(n uint64) (*Memory, error) { return AllocShared(drv, 0, n, true) },
		"shared":        func(n uint64) (*Memory, error) { return AllocShared(drv, 0, n, false) },
		"pinned":        func(n uint64) (*Memory, error) { return AllocPinned(drv, 0, n) },
		"system":        AllocSystem,
	}
	for name, alloc := range allocs {
		t.Run(name, func(t *testing.T) {
			m, err := alloc(8 << 20)
			require.NoError(t, err, "just under")
			require.NoError(t, m.Close())
			_, err = alloc(8<<20 + 1)
			requireOutOfMemory(t, err, 8<<20+1, fmt.Sprint(8<<20))
			require.ErrorContains(t, err, fmt.Sprintf("MemAvailable %d", 1*gib+8<<20))

			cg := reading
			cg.MemAvailable = 20 * gib
			cg.Cgroup, cg.CgroupLimit, cg.CgroupUsage = "/sys/fs/cgroup/job", 8*gib, 7*gib-8<<20 // 1 GiB kept free
			defer memavail.Override(func() (memavail.Reading, error) { return cg, nil })()
			m, err = alloc(8 << 20)
			require.NoError(t, err, "just under the cgroup's limit")
			require.NoError(t, m.Close())
			_, err = alloc(8<<20 + 1)
			requireOutOfMemory(t, err, 8<<20+1, fmt.Sprint(8<<20))
			require.ErrorContains(t, err, "cgroup /sys/fs/cgroup/job")
		})
	}
}

const oomChildEnv = "KVBM_TEST_OOM_CHILD"

// For real: a child process asks for twice the machine's memory and gets
// out of memory at once, before a page is touched. A regression meets the
// OOM killer instead; the child makes itself its first choice, so that the
// killer takes the child rather than this process (or a neighbour), and a
// child killed by a signal is reported as the failure.
func TestTwiceTheMachineIsRefusedAtOnce(t *testing.T) {
	if os.Getenv(oomChildEnv) == "1" {
		oomChild(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTwiceTheMachineIsRefusedAtOnce$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), oomChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("the child was killed by %v (the OOM killer, or the timeout): memory beyond the machine was not refused "+
			"before its pages were touched\n%s", ws.Signal(), out)
	}
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--- PASS: TestTwiceTheMachineIsRefusedAtOnce")
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
	require.Less(t, rss, int64(1*gib), "the child's peak resident memory: pages were touched")
}

func oomChild(t *testing.T) {
	// Should a regression meet the OOM killer, it kills this child first.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
	r, err := memavail.Source{}.Read()
	require.NoError(t, err)
	size := 2 * r.MemTotal
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	for name, alloc := range map[string]func() (*Memory, error){
		"AllocShared":            func() (*Memory, error) { return AllocShared(drv, 0, size, true) },
		"AllocPinned (emulated)": func() (*Memory, error) { return AllocPinned(drv, 0, size) },
		"AllocSystem":            func() (*Memory, error) { return AllocSystem(size) },
	} {
		start := time.Now()
		m, err := alloc()
		if err == nil {
			m.Close()
		}
		requireOutOfMemory(t, err, size, "")
		require.Less(t, time.Since(start), 5*time.Second, name)
		t.Logf("%s: %v", name, err)
	}
}

// Only memory that cannot fit is the driver's out of memory: a memavail
// refusal (its ErrInsufficient still wrapped) or ENOMEM making the pages
// resident; any other failure to populate keeps its own error and kind.
func TestOnlyOutOfMemoryIsReportedAsOutOfMemory(t *testing.T) {
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	defer func(prev func([]byte, int) error) { populate = prev }(populate)
	for _, errno := range []syscall.Errno{syscall.ENOMEM, syscall.EFAULT, syscall.EIO} {
		populate = func(b []byte, _ int) error { return fmt.Errorf("make %d bytes resident: %w", len(b), errno) }
		_, err := AllocShared(drv, 0, 4<<20, true)
		require.ErrorIs(t, err, errno)
		if errno == syscall.ENOMEM {
			require.Truef(t, cuda.IsCode(err, cuda.ErrCodeOutOfMemory), "%v", err)
			require.Equal(t, kvbmerr.CUDA, kvbmerr.KindOf(err), "%v", err)
			continue
		}
		require.Falsef(t, cuda.IsCode(err, cuda.ErrCodeOutOfMemory), "%v is not out of memory", errno)
		require.Equal(t, kvbmerr.IO, kvbmerr.KindOf(err), "%v", err)
		require.ErrorContains(t, err, errno.Error())
	}
	populate = populateResident

	reading := memavail.Reading{MemTotal: 24 * gib, MemAvailable: 1 * gib} // all kept free
	defer memavail.Override(func() (memavail.Reading, error) { return reading, nil })()
	for name, alloc := range map[string]func() (*Memory, error){
		"AllocShared": func() (*Memory, error) { return AllocShared(drv, 0, 4<<20, true) },
		"AllocSystem": func() (*Memory, error) { return AllocSystem(4 << 20) },
	} {
		_, err := alloc()
		requireOutOfMemory(t, err, 4<<20, "0")
		require.ErrorIs(t, err, memavail.ErrInsufficient, name)
		require.Equal(t, kvbmerr.CUDA, kvbmerr.KindOf(err), "%s: %v", name, err)
	}
}
