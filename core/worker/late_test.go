package worker

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/tcp"
	"github.com/kvbm/kvbm/core/remote/ucx"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/stretchr/testify/require"
)

// lateCase is one way of reaching the exporter process.
type lateCase struct {
	name    string
	env     []string // the exporter's
	network func(t *testing.T) remote.Transport
	// counted: the exporter's server counts its answers ("served"), so
	// that the test knows when the late one was made; otherwise it waits
	// lateWait.
	counted bool
	// latePushes: a failed push may still be applied (why UCX's one-sided
	// mode is refused: ucx.ErrLateWrites).
	latePushes bool
	// pullsOnly: a push is refused (UCX's message mode: the receiver pulls).
	pullsOnly bool
}

// lateRoundsEnv sets how many times each late test repeats each case
// (default 1; the UCX transport's "done when" ran 100).
const lateRoundsEnv = "KVBM_TEST_LATE_ROUNDS"

func lateRounds(t *testing.T) int {
	n, err := strconv.Atoi(os.Getenv(lateRoundsEnv))
	if err != nil || n < 1 {
		return 1
	}
	t.Logf("%s=%d rounds", lateRoundsEnv, n)
	return n
}

// latePushEnv, set to 1, runs the late push test on a transport known to
// apply a failed push late (it then fails).
const latePushEnv = "KVBM_TEST_LATE_PUSH"

// lateWait is how long a test without the exporter's count waits for
// its late answer. UCX's operations are one-sided: the exporter's process
// takes no part in them that it could count (its UCX worker's progress
// moves the bytes, and UCX reports nothing on the target side), so the
// test can only wait until the exporter answers on stdin again — it runs
// — and then some.
const lateWait = time.Second

// Only the operation the exporter is frozen for has a short deadline (the
// transfer's, Options.Deadline): connecting, the hellos and whatever runs
// after SIGCONT have the generous remote deadline, so that a loaded
// machine (2 cores, -race) does not time them out.
const (
	frozenDeadline   = 300 * time.Millisecond
	generousDeadline = 30 * time.Second
)

func lateCases(t *testing.T) []lateCase {
	overTCP := func(*testing.T) remote.Transport { return tcp.New(tcp.Config{Listen: "127.0.0.1:0"}) }
	cases := []lateCase{
		{name: "tcp", env: []string{"KVBM_SAME_HOST=0"}, network: overTCP, counted: true},
		{name: "same host", network: overTCP, counted: true},
	}
	if err := ucx.Available(); err != nil {
		if os.Getenv("KVBM_REQUIRE_UCX") == "1" {
			t.Fatalf("KVBM_REQUIRE_UCX=1 but UCX does not load: %v", err)
		}
		t.Logf("no ucx case: UCX does not load: %v", err)
		return cases
	}
	if why := ucxCannotReachDevice(); why != "" {
		t.Logf("no ucx case: %s", why)
		return cases
	}
	// The message mode over UCX's shared memory and tcp transports (both
	// processes on this host), and the one-sided mode as it was.
	for _, tls := range []string{"sm", "tcp"} {
		cases = append(cases, lateCase{name: "ucx " + tls, env: []string{"KVBM_TRANSPORT=ucx", "UCX_TLS=" + tls}, counted: true, pullsOnly: true,
			network: func(t *testing.T) remote.Transport {
				t.Setenv("UCX_TLS", tls)
				n, err := remote.Open("ucx", remote.OpenOptions{})
				require.NoError(t, err)
				return n
			}})
	}
	return append(cases, lateCase{name: "ucx one-sided",
		env:        []string{"KVBM_TRANSPORT=ucx", ucx.EnvOneSided + "=1", ucx.EnvAcceptLateWrites + "=1"},
		latePushes: true,
		network: func(t *testing.T) remote.Transport {
			t.Setenv(ucx.EnvOneSided, "1")
			t.Setenv(ucx.EnvAcceptLateWrites, "1")
			n, err := remote.Open("ucx", remote.OpenOptions{})
			require.NoError(t, err)
			return n
		}})
}

// ping waits until the exporter answers on stdin.
func (e *exporter) ping(t *testing.T) {
	t.Helper()
	_, err := fmt.Fprintln(e.stdin, "ping")
	require.NoError(t, err)
	require.True(t, e.out.Scan())
	require.Equal(t, "pong", e.out.Text())
}

func (e *exporter) served(t *testing.T) uint64 {
	t.Helper()
	_, err := fmt.Fprintln(e.stdin, "served")
	require.NoError(t, err)
	require.True(t, e.out.Scan())
	n, err := strconv.ParseUint(e.out.Text(), 10, 64)
	require.NoError(t, err, "served printed %q", e.out.Text())
	return n
}

// awaitLate waits, once the frozen exporter runs again, until it has
// answered the request the importer gave up on (more than before
// requests answered), or lateWait where it does not count them.
func (e *exporter) awaitLate(t *testing.T, c lateCase, before uint64) {
	t.Helper()
	if !c.counted {
		e.ping(t) // it runs again
		time.Sleep(lateWait)
		return
	}
	require.Eventually(t, func() bool { return e.served(t) > before }, 10*time.Second, 5*time.Millisecond,
		"the exporter answers the request it was frozen before")
	time.Sleep(50 * time.Millisecond) // and whatever that answer sets off lands
}

// Once a pull's notification completes — here failed, at its deadline,
// the exporter frozen (SIGSTOP) before it answered — no byte of it lands
// in the destination blocks: the test reuses them at once, then lets the
// exporter run, waits until it has answered the pull it was frozen
// before, and finds every block of the destination tier (the failed
// ones and their neighbours) as it left them, byte for byte. For each
// way of reaching the exporter, into host memory (G2, straight from the
// transport) and device memory (G1, through a bounce buffer), from both
// of the exporter's tiers.
func TestNoByteOfAFailedPullLandsAfterItCompletes(t *testing.T) {
	size := testConfig(1).BlockSize()
	for _, c := range lateCases(t) {
		t.Run(c.name, func(t *testing.T) {
			exp := startExporter(t, 0xA, c.env...)
			dec := decodeWorkerOn(t, generousDeadline, c.network(t))
			for range lateRounds(t) {
				for _, src := range []Tier{G1, G2} {
					for _, dst := range []Tier{G2, G1} {
						require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
						for b := range exporterBlocks {
							dec.write(t, dst, b, pattern(size, 0xFFFF))
						}
						var before uint64
						if c.counted {
							before = exp.served(t)
						}
						exp.signal(t, syscall.SIGSTOP)
						srcIDs, dstIDs := []int{3, 0, 15, 7}, []int{1, 9, 4, 12}
						n, err := dec.ExecuteRemoteOnboardForInstance(7, src, srcIDs, dst, dstIDs, transfer.Options{Deadline: frozenDeadline})
						require.NoError(t, err)
						err = n.WaitTimeout(-1)
						require.ErrorIs(t, err, transfer.ErrCanceled, "%v -> %v: its deadline passed", src, dst)
						require.Equal(t, kvbmerr.DeadlineExceeded, kvbmerr.KindOf(err), "a deadline, not a cancel: %v", err)
						require.Equal(t, []int{1, 4, 9, 12}, n.FailedBlocks())
						// The engine reuses the failed blocks at once.
						for _, b := range dstIDs {
							dec.write(t, dst, b, pattern(size, 0xBEEF))
						}
						exp.signal(t, syscall.SIGCONT)
						exp.awaitLate(t, c, before)
						for b := range exporterBlocks {
							want := pattern(size, 0xFFFF)
							for _, d := range dstIDs {
								if d == b {
									want = pattern(size, 0xBEEF)
								}
							}
							require.Equal(t, want, dec.read(t, dst, b), "%v -> %v: block %d after the late answer", src, dst, b)
						}
					}
				}
			}
		})
	}
}

// A push reads the pusher's blocks and writes the peer's. Once its
// notification completes, the pusher's memory is free: nothing reads the
// source blocks (the engine may overwrite them) and nothing writes here.
// The peer's destination blocks of a failed push hold undefined bytes;
// but a push the pusher gave up on is not applied there later: the
// exporter, frozen before it took the push's bytes off the socket and run
// again after the pusher's deadline, sees that the pusher closed the
// connection and drops them (TCP; the same-host route copies the bytes
// itself, from the pusher, and stops before the push completes). Every
// block of the exporter's tier is checked after its late answer. UCX
// fails this (it is refused for it, ucx.ErrLateWrites): skipped.
func TestAFailedPushIsNotAppliedLate(t *testing.T) {
	size := testConfig(1).BlockSize()
	for _, c := range lateCases(t) {
		t.Run(c.name, func(t *testing.T) {
			if c.latePushes && os.Getenv(latePushEnv) != "1" {
				t.Skipf("%s applies a failed push's bytes when its frozen peer runs again (%v); %s=1 runs this anyway, to see it",
					c.name, ucx.ErrLateWrites, latePushEnv)
			}
			exp := startExporter(t, 0xA, c.env...)
			dec := decodeWorkerOn(t, generousDeadline, c.network(t))
			for _, dst := range []Tier{G2, G1} {
				for _, src := range []Tier{G2, G1} {
					require.NoError(t, dec.ConnectRemote(7, [][]byte{exp.metadata}))
					h := requireRemote(t, dec, 7, dst)
					srcIDs, dstIDs := []int{2, 5}, []int{11, 6}
					for i, b := range srcIDs {
						dec.write(t, src, b, pattern(size, 0x5000+uint64(i)))
					}
					var before uint64
					if c.counted {
						before = exp.served(t)
					}
					exp.signal(t, syscall.SIGSTOP)
					n, err := dec.ExecuteRemoteOffload(src, srcIDs, RemoteLayout(h, dstIDs), transfer.Options{Deadline: frozenDeadline})
					if c.pullsOnly { // refused before anything is sent
						if err == nil {
							err = n.WaitTimeout(-1)
						}
						require.ErrorIs(t, err, kvbmerr.ErrUnsupported, "%v -> %v: a push over %s", src, dst, c.name)
						exp.signal(t, syscall.SIGCONT)
						for b := range exporterBlocks {
							exp.check(t, dst, b, uint64(dst)<<8|uint64(b))
						}
						continue
					}
					require.NoError(t, err)
					err = n.WaitTimeout(-1)
					require.ErrorIs(t, err, transfer.ErrCanceled, "%v -> %v: its deadline passed", src, dst)
					require.Equal(t, kvbmerr.DeadlineExceeded, kvbmerr.KindOf(err), "a deadline, not a cancel: %v", err)
					require.Equal(t, []int{6, 11}, n.FailedBlocks())
					for _, b := range srcIDs { // the engine reuses its source blocks at once
						dec.write(t, src, b, pattern(size, 0xBEEF))
					}
					exp.signal(t, syscall.SIGCONT)
					exp.awaitLate(t, c, before)
					for b := range exporterBlocks {
						exp.check(t, dst, b, uint64(dst)<<8|uint64(b))
					}
				}
			}
		})
	}
}

// A push larger than both sockets' buffers together is not applied late
// either, at either give-up (the transfer's deadline, or the remote
// deadline of the operation): a pusher that closed its connection
// normally would send its FIN after the bytes it had not sent yet, and the
// frozen exporter, run again, would read megabytes into its layout before
// it saw the close; the pusher resets the connection instead, and the
// exporter reads a block of 18 MiB in chunks, looking for the reset
// between them. A push of one block of 18 MiB, into the exporter's host (G2: straight into the layout)
// and device (G1: staged) tiers; every byte of the exporter's tier is
// checked after its late answer.
func TestAFailedLargePushIsNotAppliedLate(t *testing.T) {
	cfg := bigConfig()
	size := cfg.BlockSize()
	require.Greater(t, size, 16<<20)
	for _, giveUp := range []struct {
		name     string
		remote   time.Duration // the decode worker's remote deadline
		opts     transfer.Options
		wantErr  error
		connects int // tries to connect: a short remote deadline may time out a connection on a loaded machine
	}{
		{"the transfer's deadline", generousDeadline, transfer.Options{Deadline: frozenDeadline}, transfer.ErrCanceled, 1},
		{"the remote deadline", time.Second, transfer.Options{}, transfer.ErrTimeout, 10},
	} {
		t.Run(giveUp.name, func(t *testing.T) {
			exp := startExporter(t, 0xA, "KVBM_SAME_HOST=0", exporterLayoutEnv+"=big")
			dec := decodeWorkerOf(t, giveUp.remote, tcp.New(tcp.Config{Listen: "127.0.0.1:0"}), cfg)
			srcIDs, dstIDs := []int{0}, []int{1}
			for _, dst := range []Tier{G2, G1} {
				var err error
				for range giveUp.connects {
					if err = dec.ConnectRemote(7, [][]byte{exp.metadata}); err == nil {
						break
					}
					require.ErrorIs(t, err, transfer.ErrTimeout)
				}
				require.NoError(t, err)
				h := requireRemote(t, dec, 7, dst)
				for i, b := range srcIDs {
					dec.write(t, G2, b, pattern(size, 0x5000+uint64(i)))
				}
				before := exp.served(t)
				exp.signal(t, syscall.SIGSTOP)
				n, err := dec.ExecuteRemoteOffload(G2, srcIDs, RemoteLayout(h, dstIDs), giveUp.opts)
				require.NoError(t, err)
				err = n.WaitTimeout(-1)
				require.ErrorIs(t, err, giveUp.wantErr, "G2 -> %v", dst)
				require.Equal(t, []int{1}, n.FailedBlocks())
				for _, b := range srcIDs { // the engine reuses its source blocks at once
					dec.write(t, G2, b, pattern(size, 0xBEEF))
				}
				exp.signal(t, syscall.SIGCONT)
				exp.awaitLate(t, lateCase{counted: true}, before)
				for b := range cfg.NumBlocks {
					exp.check(t, dst, b, uint64(dst)<<8|uint64(b))
				}
			}
		})
	}
}
