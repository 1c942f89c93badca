package worker

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/tcp"
	"github.com/kvbm/kvbm/core/remote/ucx"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/stretchr/testify/require"
)

// The cross-process tests run a prefill-side worker in a helper process —
// this test binary again, running TestExporterProcess — and pull from it
// and push to it over a network transport, as a decode instance would.

const exporterEnv = "KVBM_TEST_EXPORTER"

// exporterBlocks is the number of blocks of the exporter's G1 and G2.
const exporterBlocks = 16

// exporterLayoutEnv, set to "big", gives the exporter (and a decode
// worker made with bigConfig) bigConfig's layout instead of
// testConfig(exporterBlocks)'s.
const exporterLayoutEnv = "KVBM_TEST_EXPORTER_LAYOUT"

// exporterG1Env, set to "host", gives the exporter an engine G1 in host
// memory it did not allocate (vLLM's KV cache on the CPU), instead of
// device memory.
const exporterG1Env = "KVBM_TEST_EXPORTER_G1"

// bigConfig is a layout of 2 blocks of 18 MiB: one block's request is
// larger than both sockets' buffers together.
func bigConfig() layout.Config {
	c := testConfig(2)
	c.InnerDim = 3 << 17
	return c
}

// exporterConfig is the exporter process's layout.
func exporterConfig() layout.Config {
	if os.Getenv(exporterLayoutEnv) == "big" {
		return bigConfig()
	}
	return testConfig(exporterBlocks)
}

// TestExporterProcess is the helper process: a worker with G1 (device,
// layer-separate) and G2 (pinned) filled with pattern(…, tier<<8|block),
// that prints its metadata and then answers commands on stdin:
// "check TIER BLOCK TAG" prints ok or bad; "served" prints how many
// requests its TCP server has answered; "exit" (or EOF) ends it.
func TestExporterProcess(t *testing.T) {
	if os.Getenv(exporterEnv) == "" {
		t.Skip("the exporter helper process of the cross-process tests")
	}
	// The driver of the tests that start it: the real one under
	// KVBM_DEVICE=cuda, so that G1 crosses processes by CUDA IPC there.
	drv := newDriver(t)
	network, err := remote.Open(os.Getenv("KVBM_TRANSPORT"), remote.OpenOptions{})
	require.NoError(t, err)
	id, err := strconv.ParseUint(os.Getenv(exporterEnv), 16, 64)
	require.NoError(t, err)
	w, err := NewStandalone(StandaloneConfig{WorkerID: id, Driver: drv, Network: network, Loopback: remote.NewLoopback()})
	require.NoError(t, err)
	defer w.Close()
	if os.Getenv(benchEnv) != "" {
		serveBench(t, w, drv)
		return
	}
	cfg := exporterConfig()
	_, err = w.AllocateG2(cfg, transfer.FullyContiguous)
	require.NoError(t, err)
	var mems []*storage.Memory
	if os.Getenv(exporterG1Env) == "host" {
		mems = registerEngineHostG1Of(t, w, cfg)
	} else {
		mems = registerEngineG1Of(t, w, drv, cfg)
	}
	defer func() {
		for _, m := range mems {
			m.Close()
		}
	}()
	tw := &testWorker{PhysicalWorker: w}
	size := cfg.BlockSize()
	for _, tier := range []Tier{G1, G2} {
		for b := range cfg.NumBlocks {
			tw.write(t, tier, b, pattern(size, uint64(tier)<<8|uint64(b)))
		}
	}
	md, err := w.ExportMetadata()
	require.NoError(t, err)
	fmt.Printf("metadata %s\n", hex.EncodeToString(md))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 || f[0] == "exit" {
			return
		}
		if f[0] == "ping" {
			fmt.Println("pong")
			continue
		}
		if f[0] == "served" { // how many requests the server answered so far
			tr, ok := network.(interface{ Served() uint64 })
			require.True(t, ok, "served is asked of a transport that counts its answers (TCP, UCX's message mode)")
			fmt.Println(tr.Served())
			continue
		}
		if f[0] == "scope" { // "scope TIER B,B,...": metadata that reads those blocks only
			tier, _ := strconv.Atoi(f[1])
			var blocks []int
			for _, b := range strings.Split(f[2], ",") {
				n, _ := strconv.Atoi(b)
				blocks = append(blocks, n)
			}
			md, err := w.ExportBlockScopedMetadata(BlockScope{Blocks: map[Tier][]int{Tier(tier): blocks}})
			require.NoError(t, err)
			fmt.Printf("metadata %s\n", hex.EncodeToString(md))
			continue
		}
		if f[0] == "unregister-g1" || f[0] == "register-g1" || f[0] == "export" {
			mems = exporterG1Lifecycle(t, w, drv, f[0], mems)
			continue
		}
		if f[0] == "revoke" { // "revoke TIER B,B,...": those blocks change owner
			tier, _ := strconv.Atoi(f[1])
			var blocks []int
			for _, b := range strings.Split(f[2], ",") {
				n, _ := strconv.Atoi(b)
				blocks = append(blocks, n)
			}
			if err := w.RevokeBlocks(map[Tier][]int{Tier(tier): blocks}); err != nil {
				fmt.Printf("error %v\n", err)
			} else {
				fmt.Println("revoked")
			}
			continue
		}
		tier, _ := strconv.Atoi(f[1])
		block, _ := strconv.Atoi(f[2])
		tag, _ := strconv.ParseUint(f[3], 10, 64)
		if string(tw.read(t, Tier(tier), block)) == string(pattern(size, tag)) {
			fmt.Println("ok")
		} else {
			fmt.Println("bad")
		}
	}
}

// exporterG1Lifecycle serves the exporter's commands on its G1's memory:
// "unregister-g1" (the engine takes it back, as vLLM's sleep mode does, and
// frees it), "register-g1" (new memory, every block tagged 0x10000|block),
// "export" (the worker's metadata now). It returns G1's memory.
func exporterG1Lifecycle(t *testing.T, w *PhysicalWorker, drv cuda.Driver, cmd string, mems []*storage.Memory) []*storage.Memory {
	switch cmd {
	case "unregister-g1":
		if err := w.UnregisterG1("sleep mode"); err != nil {
			fmt.Printf("error %v\n", err)
			return mems
		}
		for _, m := range mems {
			require.NoError(t, m.Close())
		}
		fmt.Println("unregistered")
		return nil
	case "register-g1":
		cfg := exporterConfig()
		mems = registerEngineG1Of(t, w, drv, cfg)
		tw := &testWorker{PhysicalWorker: w}
		for b := range cfg.NumBlocks {
			tw.write(t, G1, b, pattern(cfg.BlockSize(), 0x10000|uint64(b)))
		}
		fmt.Println("registered")
		return mems
	}
	md, err := w.ExportMetadata()
	require.NoError(t, err)
	fmt.Printf("metadata %s\n", hex.EncodeToString(md))
	return mems
}

// registerEngineHostG1Of registers host memory this test allocates (not
// the worker) as w's G1, layer-separate with the block second.
func registerEngineHostG1Of(t *testing.T, w *PhysicalWorker, cfg layout.Config) []*storage.Memory {
	t.Helper()
	sizes, err := layout.RegionSizes(cfg, lsSecond.Kind, lsSecond.BlockDim)
	require.NoError(t, err)
	var mems []*storage.Memory
	var ptrs []uint64
	for _, s := range sizes {
		mem, err := storage.AllocSystem(s)
		require.NoError(t, err)
		mems = append(mems, mem)
		ptrs = append(ptrs, mem.Addr())
	}
	_, err = w.RegisterG1Host(cfg, lsSecond, ptrs)
	require.NoError(t, err)
	return mems
}

// exporter is a running helper process.
type exporter struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	out      *bufio.Scanner
	metadata []byte
	lines    []string // what it printed before its metadata
}

func startExporter(t testing.TB, id uint64, env ...string) *exporter {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestExporterProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%x", exporterEnv, id), "KVBM_TCP_LISTEN=127.0.0.1:0")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	e := &exporter{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(e.kill)
	for e.out.Scan() {
		if hexmd, ok := strings.CutPrefix(e.out.Text(), "metadata "); ok {
			e.metadata, err = hex.DecodeString(hexmd)
			require.NoError(t, err)
			return e
		}
		e.lines = append(e.lines, e.out.Text())
	}
	t.Fatalf("the exporter process printed no metadata: %v", e.out.Err())
	return nil
}

func (e *exporter) check(t *testing.T, tier Tier, block int, tag uint64) {
	t.Helper()
	_, err := fmt.Fprintf(e.stdin, "check %d %d %d\n", tier, block, tag)
	require.NoError(t, err)
	require.True(t, e.out.Scan())
	require.Equal(t, "ok", e.out.Text(), "the exporter's %v block %d after the push", tier, block)
}

func (e *exporter) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	require.NoError(t, e.cmd.Process.Signal(s))
	if s == syscall.SIGSTOP {
		waitStopped(t, e)
	}
}

// waitStopped waits until a stopped process is stopped: a signal takes
// effect when the process next runs, and nothing it serves after this
// point may get through.
func waitStopped(t testing.TB, e *exporter) {
	t.Helper()
	stat := fmt.Sprintf("/proc/%d/stat", e.cmd.Process.Pid)
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(stat)
		if err != nil {
			return false
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		return len(f) > 0 && f[0] == "T"
	}, 5*time.Second, time.Millisecond)
}

func (e *exporter) kill() {
	e.cmd.Process.Signal(syscall.SIGCONT)
	e.cmd.Process.Kill()
	e.cmd.Wait()
}

// decodeWorker is this process's worker, on the TCP transport.
func decodeWorker(t *testing.T, deadline time.Duration) *testWorker {
	return decodeWorkerOn(t, deadline, tcp.New(tcp.Config{Listen: "127.0.0.1:0"}))
}

func decodeWorkerOn(t *testing.T, deadline time.Duration, network remote.Transport) *testWorker {
	t.Helper()
	return decodeWorkerOf(t, deadline, network, testConfig(exporterBlocks))
}

// decodeWorkerOf is decodeWorkerOn with G1 and G2 of layout cfg.
func decodeWorkerOf(t *testing.T, deadline time.Duration, network remote.Transport, cfg layout.Config) *testWorker {
	t.Helper()
	drv := newDriver(t)
	w, err := NewStandalone(StandaloneConfig{WorkerID: 0xDEC, Driver: drv, Loopback: remote.NewLoopback(),
		Network: network, RemoteDeadline: deadline})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, w.Close()) })
	_, err = w.AllocateG2(cfg, transfer.FullyContiguous)
	require.NoError(t, err)
	mems := registerEngineG1Of(t, w, drv, cfg)
	t.Cleanup(func() {
		for _, m := range mems {
			m.Close()
		}
	})
	return &testWorker{PhysicalWorker: w}
}

// The decode side pulls the prefill side's G2 and G1 blocks into its own
// G1 and G2, every byte checked, and pushes its blocks into the prefill
// side's G2, checked there.
func TestPullAndPushAcrossProcesses(t *testing.T) {
	t.Run("same host", func(t *testing.T) {
		dec := decodeWorker(t, 10*time.Second)
		pullAndPush(t, startExporter(t, 0xA), dec)
		require.True(t, tcp.SameHost(dec.peers[0xA]), "reached over the Unix socket")
		for _, tier := range []Tier{G1, G2} {
			require.True(t, tcp.Mapped(dec.peers[0xA], requireRemote(t, dec, 7, tier)), "%v mapped (G1 by CUDA IPC)", tier)
		}
	})
	t.Run("same host, engine G1 in host memory", func(t *testing.T) {
		dec := decodeWorker(t, 10*time.Second)
		exp := startExporter(t, 0xA, exporterG1Env+"=host")
		pullAndPush(t, exp, dec)
		g1 := requireRemote(t, dec, 7, G1)
		require.True(t, tcp.Mapped(dec.peers[0xA], g1), "G1 copied process to process")
		// Push scattered fragments into the engine's G1, neighbours checked.
		size := testConfig(1).BlockSize()
		dec.write(t, G2, 3, pattern(size, 0x6001))
		dec.write(t, G2, 4, pattern(size, 0x6002))
		waiter(t)(dec.ExecuteRemoteOffload(G2, []int{3, 4}, RemoteLayout(g1, []int{8, 9}), transfer.Options{}))
		exp.check(t, G1, 8, 0x6001)
		exp.check(t, G1, 9, 0x6002)
		exp.check(t, G1, 7, uint64(G1)<<8|7)
		exp.check(t, G1, 10, uint64(G1)<<8|10)
	})
	t.Run("tcp", func(t *testing.T) {
		dec := decodeWorker(t, 10*time.Second)
		pullAndPush(t, startExporter(t, 0xA, "KVBM_SAME_HOST=0"), dec)
		require.False(t, tcp.SameHost(dec.peers[0xA]))
		require.False(t, tcp.Mapped(dec.peers[0xA], requireRemote(t, dec, 7, G2)))
	})
	t.Run("ucx", func(t *testing.T) {
		if err := ucx.Available(); err != nil {
			if os.Getenv("KVBM_REQUIRE_UCX") == "1" {
				t.Fatalf("KVBM_REQUIRE_UCX=1 but UCX does not load: %v", err)
			}
			t.Skipf("UCX does not load: %v", err)
		}
		if why := ucxCannotReachDevice(); why != "" {
			t.Skip(why)
		}
		// The message mode pulls only: a push is refused, and changes
		// nothing at the peer.
		network, err := remote.Open("ucx", remote.OpenOptions{})
		require.NoError(t, err)
		exp := startExporter(t, 0xA, "KVBM_TRANSPORT=ucx")
		dec := decodeWorkerOn(t, 10*time.Second, network)
		pulls(t, exp, dec)
		h := requireRemote(t, dec, 7, G2)
		n, err := dec.ExecuteRemoteOffload(G1, []int{2}, RemoteLayout(h, []int{11}), transfer.Options{})
		if err == nil {
			err = n.WaitTimeout(-1)
		}
		require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
		exp.check(t, G2, 11, uint64(G2)<<8|11)

		t.Run("one-sided", func(t *testing.T) {
			t.Setenv(ucx.EnvOneSided, "1")
			t.Setenv(ucx.EnvAcceptLateWrites, "1") // refused otherwise (ucx.ErrLateWrites)
			network, err := remote.Open("ucx", remote.OpenOptions{})
			require.NoError(t, err)
			pullAndPush(t, startExporter(t, 0xA, "KVBM_TRANSPORT=ucx", ucx.EnvOneSided+"=1", ucx.EnvAcceptLateWrites+"=1"),
				decodeWorkerOn(t, 10*time.Second, network))
		})
	})
}

// ucxCannotReachDevice says why the UCX cases cannot run, or "": on the
// real driver G1 is device memory, which only a CUDA-enabled libucp
// (KVBM_UCX_LIB) registers; Debian's libucx0 has no CUDA memory domain.
func ucxCannotReachDevice() string {
	if os.Getenv(cuda.EnvDevice) == cuda.RealName && os.Getenv(ucx.EnvLib) == "" {
		return "G1 is device memory (KVBM_DEVICE=cuda): UCX reaches it only through a CUDA-enabled libucp, named by " + ucx.EnvLib
	}
	return ""
}

func pullAndPush(t *testing.T, exp *exporter, dec *testWorker) {
	pulls(t, exp, dec)
	pushes(t, exp, dec, requireRemote(t, dec, 7, G2))
}

// pulls connects dec to exp and pulls blocks of both of exp's tiers into
// both of dec's, every block of the destination checked.
func pulls(t *testing.T, exp *exporter, dec *testWorker) {
	wait := waiter(t)
	require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
	size := testConfig(1).BlockSize()
	for _, src := range []Tier{G1, G2} {
		for _, dst := range []Tier{G1, G2} {
			for b := range exporterBlocks {
				dec.write(t, dst, b, pattern(size, 0xFFFF))
			}
			srcIDs, dstIDs := []int{3, 0, 15, 7}, []int{1, 9, 4, 12}
			wait(dec.ExecuteRemoteOnboardForInstance(7, src, srcIDs, dst, dstIDs, transfer.Options{}))
			pulled := map[int]int{}
			for i, d := range dstIDs {
				pulled[d] = srcIDs[i]
			}
			for b := range exporterBlocks {
				want := pattern(size, 0xFFFF)
				if s, ok := pulled[b]; ok {
					want = pattern(size, uint64(src)<<8|uint64(s))
				}
				require.Equal(t, want, dec.read(t, dst, b), "%v -> %v, block %d", src, dst, b)
			}
		}
	}
}

func pushes(t *testing.T, exp *exporter, dec *testWorker, h transfer.LayoutHandle) {
	wait := waiter(t)
	size := testConfig(1).BlockSize()
	dec.write(t, G1, 2, pattern(size, 0x5001))
	dec.write(t, G1, 5, pattern(size, 0x5002))
	wait(dec.ExecuteRemoteOffload(G1, []int{2, 5}, RemoteLayout(h, []int{11, 6}), transfer.Options{}))
	exp.check(t, G2, 11, 0x5001)
	exp.check(t, G2, 6, 0x5002)
	exp.check(t, G2, 10, uint64(G2)<<8|10) // a neighbour stays as it was
	c := dec.Counters()
	require.NotZero(t, c[transfer.PathRemoteRead].Blocks)
	require.NotZero(t, c[transfer.PathTwoHop].Blocks)
}

func requireRemote(t *testing.T, w *testWorker, instance InstanceID, tier Tier) transfer.LayoutHandle {
	t.Helper()
	w.mu.RLock()
	defer w.mu.RUnlock()
	h, ok := w.remote[remoteTier{instance, tier}]
	require.True(t, ok)
	return h
}

// A peer killed while a pull waits on it fails the pull's blocks at once
// (its sockets reset), later pulls fail at once, and a new peer process
// under the same worker id is reached by importing its metadata again.
func TestKilledPeerFailsItsBlocksAndANewOneIsReconnected(t *testing.T) {
	exp := startExporter(t, 0xA)
	dec := decodeWorker(t, 20*time.Second)
	require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
	exp.signal(t, syscall.SIGSTOP) // the pull is certainly in flight when the kill comes
	n, err := dec.ExecuteRemoteOnboardForInstance(7, G2, []int{1, 2, 3}, G2, []int{4, 5, 6}, transfer.Options{})
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	exp.signal(t, syscall.SIGKILL)
	err = n.WaitTimeout(-1)
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.Equal(t, []int{4, 5, 6}, n.FailedBlocks())
	require.Less(t, time.Since(start), 10*time.Second, "well within the 20 s deadline: the reset is seen at once")

	n, err = dec.ExecuteRemoteOnboardForInstance(7, G2, []int{1}, G2, []int{4}, transfer.Options{})
	require.NoError(t, err)
	require.ErrorIs(t, n.WaitTimeout(-1), remote.ErrPeerUnavailable)

	again := startExporter(t, 0xA)
	require.NoError(t, dec.ConnectRemote(7, [][]byte{again.metadata}))
	waiter(t)(dec.ExecuteRemoteOnboardForInstance(7, G2, []int{1}, G2, []int{4}, transfer.Options{}))
	require.Equal(t, pattern(testConfig(1).BlockSize(), uint64(G2)<<8|1), dec.read(t, G2, 4))
}

// A peer that dies while nothing is asked of it is let go at once (its
// connections, and its memory mapped here): the transport watches an idle
// connection to it. The next pull fails at once, naming why.
func TestDeadPeerIsLetGoWithoutAnOperation(t *testing.T) {
	exp := startExporter(t, 0xA)
	dec := decodeWorker(t, 20*time.Second)
	require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
	h := requireRemote(t, dec, 7, G2)
	require.True(t, tcp.Mapped(dec.peers[0xA], h))
	exp.signal(t, syscall.SIGKILL)
	require.Eventually(t, func() bool { return !tcp.Mapped(dec.peers[0xA], h) }, 5*time.Second, 5*time.Millisecond,
		"the dead peer's G2 is unmapped without a transfer noticing")
	start := time.Now()
	n, err := dec.ExecuteRemoteOnboardForInstance(7, G2, []int{1}, G2, []int{4}, transfer.Options{})
	require.NoError(t, err)
	err = n.WaitTimeout(-1)
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorContains(t, err, "closed its connections")
	require.Less(t, time.Since(start), time.Second)
}

// A frozen peer (SIGSTOP) fails the pull within the deadline; once it runs
// again, importing its metadata again reconnects.
// Both ways a same-host peer is reached: G1 through the socket, G2 through
// its mapped shared memory (the exporter must still answer each copy).
func TestFrozenPeerFailsWithinTheDeadline(t *testing.T) {
	exp := startExporter(t, 0xA)
	const deadline = 500 * time.Millisecond
	dec := decodeWorker(t, deadline)
	require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
	for _, tier := range []Tier{G1, G2} {
		exp.signal(t, syscall.SIGSTOP)
		start := time.Now()
		n, err := dec.ExecuteRemoteOnboardForInstance(7, tier, []int{0, 1}, tier, []int{2, 3}, transfer.Options{})
		require.NoError(t, err)
		err = n.WaitTimeout(-1)
		elapsed := time.Since(start)
		require.ErrorIs(t, err, remote.ErrPeerUnavailable, "%v", tier)
		require.ErrorIs(t, err, transfer.ErrTimeout)
		require.Equal(t, []int{2, 3}, n.FailedBlocks())
		require.GreaterOrEqual(t, elapsed, deadline)
		require.Less(t, elapsed, deadline+2*time.Second)

		exp.signal(t, syscall.SIGCONT)
		require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
		waiter(t)(dec.ExecuteRemoteOnboardForInstance(7, tier, []int{0}, tier, []int{2}, transfer.Options{}))
		require.Equal(t, pattern(testConfig(1).BlockSize(), uint64(tier)<<8|0), dec.read(t, tier, 2))
	}
}

// Metadata that was damaged, or written by a kvbm with another metadata
// version, is refused with the reason before anything connects.
func TestDamagedOrForeignMetadataIsRefused(t *testing.T) {
	exp := startExporter(t, 0xA)
	dec := decodeWorker(t, 5*time.Second)
	bad := append([]byte(nil), exp.metadata...)
	bad[len(bad)/2] ^= 1
	err := dec.ConnectRemote(7, [][]byte{bad})
	require.ErrorIs(t, err, ErrBadMetadata)
	require.ErrorContains(t, err, "checksum")

	for _, v := range []uint16{1, 2} { // 2: endpoints without keys, from an older kvbm
		old := append([]byte(nil), exp.metadata...)
		binary.LittleEndian.PutUint16(old[4:], v)
		binary.LittleEndian.PutUint32(old[len(old)-4:], crc32.Checksum(old[:len(old)-4], crc32.MakeTable(crc32.Castagnoli)))
		err = dec.ConnectRemote(7, [][]byte{old})
		require.ErrorIs(t, err, ErrBadMetadata)
		require.ErrorContains(t, err, fmt.Sprintf("version %d, this library reads version 3", v))
		require.False(t, dec.HasRemoteMetadata(7))
	}
}

// DisconnectRemote forgets an instance: its handles go, its connection
// closes, and connecting again works.
func TestDisconnectRemoteForgetsTheInstance(t *testing.T) {
	exp := startExporter(t, 0xA)
	dec := decodeWorker(t, 5*time.Second)
	require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
	waiter(t)(dec.ExecuteRemoteOnboardForInstance(7, G2, []int{1}, G2, []int{1}, transfer.Options{}))
	h := requireRemote(t, dec, 7, G2)
	require.NoError(t, dec.DisconnectRemote(7))
	require.False(t, dec.HasRemoteMetadata(7))
	dec.mu.RLock()
	require.Empty(t, dec.peers, "the connection to the peer is closed")
	dec.mu.RUnlock()
	_, err := dec.ExecuteRemoteOnboardForInstance(7, G2, []int{1}, G2, []int{1}, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrNotFound)
	_, err = dec.ExecuteRemoteOnboard(RemoteLayout(h, []int{1}), G2, []int{1}, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrNotFound, "the layout is no longer imported")
	require.ErrorIs(t, dec.DisconnectRemote(7), transfer.ErrNotFound)

	require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
	waiter(t)(dec.ExecuteRemoteOnboardForInstance(7, G2, []int{2}, G2, []int{2}, transfer.Options{}))
	require.Equal(t, pattern(testConfig(1).BlockSize(), uint64(G2)<<8|2), dec.read(t, G2, 2))
}
