//go:build cgo

package ucx

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/stretchr/testify/require"
)

// An importer refuses an exporter of its host that runs other segments,
// before it makes a UCX endpoint (nothing moves either way); peers with
// the same segments pull, and an exporter on another boot is not
// compared: segments matter to shared memory only.
func TestPeersOfAHostRunTheSameSegments(t *testing.T) {
	needUCX(t)
	unsetEnv(t, segSizeVars...)
	emu := newEmu(t)
	small := Config{Options: map[string]string{"MM_SEG_SIZE": "16k"}}
	exp := newSide(t, emu, 0xE, small, 5*time.Second)
	src := exp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
	exp.fill(t, src, 0x100)
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	d, err := exp.m.Describe(src)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pull := func(t *testing.T, imp *side, endpoint []byte) error {
		p, err := imp.tr.Connect(ctx, endpoint)
		if err != nil {
			return err
		}
		defer func() { require.NoError(t, p.Close()) }()
		hs, err := imp.m.Import(p, []transfer.Descriptor{d})
		require.NoError(t, err)
		dst := imp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
		imp.fill(t, dst, 0x900)
		require.NoError(t, move(t, imp.m, hs[0], seq(0, 4), dst, seq(0, 4)))
		for id := 0; id < 4; id++ {
			imp.check(t, dst, id, 0x100+uint64(id))
		}
		return nil
	}

	imp := newSide(t, emu, 0x1, Config{}, 5*time.Second)
	require.Equal(t, shmSegs{16384, 16384, 16384}, exp.tr.segs)
	require.Equal(t, shmSegs{maxSegSize, maxSegSize, maxSegSize}, imp.tr.segs)
	err = pull(t, imp, ep)
	require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
	require.ErrorContains(t, err, "runs on this host with shared-memory segments (bytes) posix 16384, sysv 16384, xpmem 16384, "+
		"this transport with posix 65535, sysv 65535, xpmem 65535")
	var opened bool
	require.NoError(t, imp.tr.do(func() error { opened = imp.tr.worker != 0; return nil }))
	require.False(t, opened, "the importer opened its UCX worker for an exporter it refused")

	require.NoError(t, pull(t, newSide(t, emu, 0x2, small, 5*time.Second), ep))

	// Another boot's exporter: not compared (here the bytes still go over
	// shared memory, from the smaller segment into the larger, which is safe).
	info, err := decodeEndpoint(ep)
	require.NoError(t, err)
	info.proc.bootID = "another-boot"
	require.NoError(t, pull(t, imp, info.encode()))
}

// UCX itself applies kvbm's segment to its shared-memory transports'
// settings (its debug log says so, "apply UCT configuration", once per
// transport it opens), and none where the environment names one. UCX's
// log goes to the process's stderr (UCX_LOG_FILE), never its stdout, so
// each case runs in a process of its own (the test binary).
func TestUCXAppliesTheSegment(t *testing.T) {
	needUCX(t)
	if os.Getenv("KVBM_TEST_SEGMENT") != "" {
		tr, err := New(Config{DeviceIsHost: true})
		require.NoError(t, err)
		_, err = tr.Probe() // opens the worker, and with it the transports
		require.NoError(t, err)
		require.NoError(t, tr.Close())
		return
	}
	run := func(t *testing.T, env ...string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUCXAppliesTheSegment$")
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "UCX_LOG_") || strings.Contains(kv, "SEG_SIZE=") || strings.Contains(kv, "RX_BUFS_GROW=")
		})
		cmd.Env = append(cmd.Env, append(env, "KVBM_TEST_SEGMENT=1", "UCX_LOG_LEVEL=debug", "UCX_TLS=sm,self")...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.Output()
		require.NoError(t, err, "%s%s", stdout, stderr.String())
		require.NotContains(t, string(stdout), "UCX ", "UCX's log on stdout")
		if !strings.Contains(stderr.String(), "DEBUG") {
			t.Skip("this UCX was built without its debug log")
		}
		return stderr.String()
	}
	out := run(t)
	require.GreaterOrEqual(t, strings.Count(out, "apply UCT configuration MM_SEG_SIZE=65535"), 1, "%s", out)
	require.GreaterOrEqual(t, strings.Count(out, "apply UCT configuration MM_RX_BUFS_GROW=64"), 1)
	out = run(t, "UCX_MM_SEG_SIZE=16k")
	require.NotContains(t, out, "apply UCT configuration MM_SEG_SIZE")
	require.NotContains(t, out, "apply UCT configuration MM_RX_BUFS_GROW")
}
