package worker

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// command sends the exporter process a line and returns its answer.
func (e *exporter) command(t *testing.T, line string) string {
	t.Helper()
	_, err := e.stdin.Write([]byte(line + "\n"))
	require.NoError(t, err)
	require.True(t, e.out.Scan())
	return e.out.Text()
}

// metadataOf sends the exporter process a line it answers with metadata.
func (e *exporter) metadataOf(t *testing.T, line string) []byte {
	t.Helper()
	answer := e.command(t, line)
	hexmd, ok := strings.CutPrefix(answer, "metadata ")
	require.True(t, ok, answer)
	md, err := hex.DecodeString(hexmd)
	require.NoError(t, err)
	return md
}

// A prefill whose engine takes G1's memory back (vLLM's sleep mode) and
// frees it: a decode that still holds its metadata, whole-worker or
// request-scoped, is refused at once, told why, and G2 is still served;
// once G1 is registered again on other memory, the old metadata reaches
// none of it and new metadata reads the new memory. Across processes,
// over TCP and on the same host.
func TestUnregisteredG1IsRefusedWithItsReasonAndComesBack(t *testing.T) {
	for _, route := range []string{"tcp", "same host"} {
		t.Run(route, func(t *testing.T) {
			var env []string
			if route == "tcp" {
				env = append(env, "KVBM_SAME_HOST=0")
			}
			exp := startExporter(t, 0xA, env...)
			// One decode holds whole-worker metadata, another a request's.
			dec, decScoped := decodeWorker(t, 10*time.Second), decodeWorker(t, 10*time.Second)
			size := testConfig(1).BlockSize()
			const whole, scoped InstanceID = 0xA1, 0xA2
			require.NoError(t, dec.ConnectRemote(whole, [][]byte{exp.metadata}))
			require.NoError(t, decScoped.ConnectRemote(scoped, [][]byte{exp.scoped(t, G1, 3)}))
			pull := func(inst InstanceID, tier Tier, src, dst int) error {
				d := dec
				if inst == scoped {
					d = decScoped
				}
				n, err := d.ExecuteRemoteOnboardForInstance(inst, tier, []int{src}, G2, []int{dst}, transfer.Options{})
				if err != nil {
					return err
				}
				return n.WaitTimeout(-1)
			}
			for _, inst := range []InstanceID{whole, scoped} {
				require.NoError(t, pull(inst, G1, 3, 0))
			}
			require.Equal(t, pattern(size, uint64(G1)<<8|3), dec.read(t, G2, 0))

			require.Equal(t, "unregistered", exp.command(t, "unregister-g1"))
			dec.write(t, G2, 1, pattern(size, 0xFFFF))
			decScoped.write(t, G2, 1, pattern(size, 0xFFFF))
			for _, inst := range []InstanceID{whole, scoped} {
				err := pull(inst, G1, 3, 1)
				require.ErrorIs(t, err, transfer.ErrWithdrawn)
				require.ErrorContains(t, err, "unregistered by its owner: sleep mode")
			}
			require.Equal(t, pattern(size, 0xFFFF), dec.read(t, G2, 1), "nothing landed")
			require.Equal(t, pattern(size, 0xFFFF), decScoped.read(t, G2, 1), "nothing landed")
			require.NoError(t, pull(whole, G2, 5, 2), "G2 is still served")
			require.Equal(t, pattern(size, uint64(G2)<<8|5), dec.read(t, G2, 2))
			require.True(t, strings.HasPrefix(exp.command(t, "unregister-g1"), "error "), "twice")

			require.Equal(t, "registered", exp.command(t, "register-g1"))
			require.ErrorContains(t, pull(whole, G1, 3, 1), "unregistered by its owner", "old metadata names the old G1")
			const again InstanceID = 0xA3
			require.NoError(t, dec.ConnectRemote(again, [][]byte{exp.metadataOf(t, "export")}))
			require.NoError(t, pull(again, G1, 3, 1))
			require.Equal(t, pattern(size, 0x10000|3), dec.read(t, G2, 1))
		})
	}
}

// Pulls in flight from another process while its engine takes G1 back and
// frees the memory: each either completes with the right bytes or is
// refused as withdrawn; none reads the memory after it went (the exporter,
// whose freed memory is unmapped, would fault and die). Three sleeps and
// wake-ups, over TCP and on the same host.
func TestUnregisterG1UnderConcurrentPulls(t *testing.T) {
	for _, route := range []string{"tcp", "same host"} {
		t.Run(route, func(t *testing.T) {
			var env []string
			if route == "tcp" {
				env = append(env, "KVBM_SAME_HOST=0")
			}
			exp := startExporter(t, 0xA, env...)
			dec := decodeWorker(t, 10*time.Second)
			size := testConfig(1).BlockSize()
			md, tag := exp.metadata, uint64(G1)<<8
			for cycle := range 3 {
				inst := InstanceID(0xC0 + cycle)
				require.NoError(t, dec.ConnectRemote(inst, [][]byte{md}))
				var wg sync.WaitGroup
				pulled := make([]int, 4)
				errs := make(chan error, 4)
				for g := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							src := (g*3 + pulled[g]) % exporterBlocks
							n, err := dec.ExecuteRemoteOnboardForInstance(inst, G1, []int{src}, G2, []int{g}, transfer.Options{})
							if err == nil {
								err = n.WaitTimeout(-1)
							}
							if errors.Is(err, transfer.ErrWithdrawn) {
								return
							}
							if err != nil {
								errs <- err
								return
							}
							if got := dec.read(t, G2, g); string(got) != string(pattern(size, tag|uint64(src))) {
								errs <- fmt.Errorf("goroutine %d: block %d came with other bytes", g, src)
								return
							}
							pulled[g]++
						}
					}()
				}
				time.Sleep(20 * time.Millisecond)
				require.Equal(t, "unregistered", exp.command(t, "unregister-g1"))
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
				require.Equal(t, "pong", exp.command(t, "ping"), "the exporter is alive: nothing touched the freed memory")
				t.Logf("cycle %d: pulls completed before the sleep: %v", cycle, pulled)
				require.Positive(t, pulled[0]+pulled[1]+pulled[2]+pulled[3], "the pulls were under way when G1 went")
				require.Equal(t, "registered", exp.command(t, "register-g1"))
				md, tag = exp.metadataOf(t, "export"), 0x10000
			}
		})
	}
}

// G1 comes back with the config and shape it had, as the caller gave them
// (a fully contiguous layout's block dim names nothing, whichever is
// given); another config is refused, naming both, and G1 stays away.
func TestG1ComesBackAsItLeft(t *testing.T) {
	drv := newDriver(t)
	m, err := transfer.NewManager(transfer.Config{WorkerID: 0xB1, Driver: drv})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	w, err := NewPhysical(PhysicalConfig{Manager: m})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, w.Close()) })
	cfg := testConfig(4)
	_, err = w.AllocateG2(cfg, transfer.FullyContiguous)
	require.NoError(t, err)
	fcSecond := transfer.Shape{Kind: layout.FullyContiguous, BlockDim: layout.BlockIsSecondDim}
	alloc := func() uint64 {
		mem, err := storage.AllocDevice(drv, 0, uint64(cfg.BlockSize()*cfg.NumBlocks))
		require.NoError(t, err)
		t.Cleanup(func() { mem.Close() })
		return mem.Addr()
	}
	_, err = w.RegisterG1(cfg, fcSecond, []uint64{alloc()})
	require.NoError(t, err)
	require.NoError(t, w.UnregisterG1(""))
	err = w.UnregisterG1("")
	require.ErrorIs(t, err, transfer.ErrNotFound)
	require.ErrorContains(t, err, "G1 was unregistered (its memory was taken back)")
	_, err = w.ExecuteLocalTransfer(G2, G1, []int{0}, []int{0}, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrWithdrawn)

	other := cfg
	other.NumBlocks = 2
	_, err = w.RegisterG1(other, fcSecond, []uint64{alloc()})
	require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument)
	require.ErrorContains(t, err, "G1 comes back as it was unregistered")
	_, err = w.RegisterG1(cfg, fcSecond, []uint64{alloc()})
	require.NoError(t, err, "the shape as it was given the first time")
	require.NoError(t, w.UnregisterG1("again"))
	_, err = w.RegisterG1(cfg, transfer.FullyContiguous, []uint64{alloc()})
	require.NoError(t, err)
}
