package storage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/memavail"
	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/kvbm/kvbm/kvbmerr/stdkind"
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
		require.Equal(t, kvbmerr.IO, stdkind.KindOf(err), "%v: the kind the C ABI reads", err)
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

const pairChildEnv = "KVBM_TEST_PAIR_CHILD"

// Two processes of this host reserving at once do not both count the same
// free memory (the host lock): two children each ask AllocShared for 60%
// of MemAvailable at the same moment. One is granted; the other waits in
// its reservation, without reading MemAvailable, until the first's pages
// are resident, then reads what is left and is refused with out of memory.
// The children pause after the grant, before a page is touched (populate,
// replaced): had both been granted (what happened without the host lock),
// the test fails there and neither touches a page, so that it cannot
// overshoot the machine. Both children are the OOM killer's first choice
// all the same, and a child killed by a signal is the failure.
func TestTwoProcessesDoNotBothCountTheSameFreeMemory(t *testing.T) {
	if os.Getenv(pairChildEnv) != "" {
		pairChild(t)
		return
	}
	r, err := memavail.Source{}.Read()
	require.NoError(t, err)
	size := r.Available() / 10 * 6
	if r.Usable() < size {
		t.Skipf("60%% of available memory (%d) is more than Reserve grants (%s)", size, r)
	}
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines chan string
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var kids [2]*child
	for i := range kids {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTwoProcessesDoNotBothCountTheSameFreeMemory$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", pairChildEnv, size))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		k := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 8)}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				k.lines <- sc.Text()
			}
			close(k.lines)
		}()
		kids[i] = k
	}
	next := func(k *child, within time.Duration) (string, bool) {
		select {
		case l, ok := <-k.lines:
			require.True(t, ok, "the child ended early")
			return l, true
		case <-time.After(within):
			return "", false
		}
	}
	say := func(k *child, s string) { fmt.Fprintln(k.stdin, s) }
	for _, k := range kids {
		l, _ := next(k, time.Minute)
		require.Equal(t, "ready", l)
	}
	for _, k := range kids {
		say(k, "go")
	}
	// The first to answer is granted; the other answers nothing while
	// the first holds its grant.
	var winner, loser *child
	select {
	case l := <-kids[0].lines:
		require.Equal(t, "granted", l)
		winner, loser = kids[0], kids[1]
	case l := <-kids[1].lines:
		require.Equal(t, "granted", l)
		winner, loser = kids[1], kids[0]
	case <-time.After(time.Minute):
		t.Fatal("no child was granted its memory")
	}
	if l, ok := next(loser, 2*time.Second); ok {
		say(winner, "abort")
		say(loser, "abort")
		t.Fatalf("while one child held a grant of %d bytes (60%% of available), the other answered %q: "+
			"both read the same free memory", size, l)
	}
	say(winner, "populate")
	l, _ := next(winner, time.Minute)
	require.Equal(t, "resident", l)
	l, _ = next(loser, time.Minute)
	require.Regexp(t, `^refused: .*CUDA_ERROR_OUT_OF_MEMORY.*not enough host memory: \d+ bytes requested`, l)
	say(winner, "exit")
	for _, k := range kids {
		err := k.cmd.Wait()
		if ws, ok := k.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("a child was killed by %v (the OOM killer, or the timeout)", ws.Signal())
		}
		require.NoError(t, err)
	}
}

// pairChild allocates the size its parent names: "ready", then on "go"
// AllocShared, pausing after the grant ("granted", then "populate" or
// "abort"); "resident" or "refused: ERR" or "aborted"; the winner holds its
// memory until "exit".
func pairChild(t *testing.T) {
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
	size, err := strconv.ParseUint(os.Getenv(pairChildEnv), 10, 64)
	require.NoError(t, err)
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	require.True(t, in.Scan())
	require.Equal(t, "go", in.Text())
	populate = func(b []byte, node int) error {
		fmt.Println("granted")
		if !in.Scan() || in.Text() != "populate" {
			return errors.New("aborted")
		}
		return populateResident(b, node)
	}
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	m, err := AllocShared(drv, 0, size, false)
	switch {
	case err == nil:
		fmt.Println("resident")
		in.Scan() // exit
		require.NoError(t, m.Close())
	case errors.Is(err, memavail.ErrInsufficient):
		require.True(t, cuda.IsCode(err, cuda.ErrCodeOutOfMemory), "%v", err)
		fmt.Println("refused: " + err.Error())
	default:
		fmt.Println("aborted")
	}
}
