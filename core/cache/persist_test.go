package cache

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// A persistent G3 (persist.go): what one process wrote to G3 a new one over
// the same directory and id finds, each block vouched for by the
// checksums recorded when it was written; nothing else is ever a hit.

const persistID = "model=tiny;dtype=bf16;layout=LBNHC;rank=0"

// persistent is a fixture whose worker is a standalone one with a
// persistent G3 of g3 blocks in dir under id, G3 written through (every
// offloaded block reaches G3 at once). close ends it early: a clean
// shutdown.
type persistent struct {
	*fixture
	close func()
}

func newPersistent(t *testing.T, dir, id string, g3 int, opts ...func(*Config)) (*persistent, error) {
	t.Helper()
	f := &fixture{t: t, emu: cuda.NewEmulated(1), diskDir: dir}
	w, err := worker.NewStandalone(worker.StandaloneConfig{WorkerID: 9, Driver: f.emu, DiskDir: dir, G3PersistID: id})
	require.NoError(t, err)
	f.w = w
	g1Shape := transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}
	sizes, err := layout.RegionSizes(shape(8), g1Shape.Kind, g1Shape.BlockDim)
	require.NoError(t, err)
	var ptrs []uint64
	var mems []*storage.Memory
	for _, s := range sizes {
		mem, err := storage.AllocDevice(f.emu, 0, s)
		require.NoError(t, err)
		mems = append(mems, mem)
		ptrs = append(ptrs, mem.Addr())
	}
	release := func() {
		require.NoError(t, w.Close())
		for _, mem := range mems {
			require.NoError(t, mem.Close())
		}
		require.NoError(t, f.emu.Close())
	}
	_, err = w.RegisterG1(shape(8), g1Shape, ptrs)
	require.NoError(t, err)
	_, err = w.AllocateG2(shape(4), transfer.FullyContiguous)
	require.NoError(t, err)
	if _, err = w.AllocateG3(shape(g3), transfer.FullyContiguous); err != nil {
		release()
		return nil, err
	}
	cfg := Config{Worker: w, G3: WriteThrough}
	for _, o := range opts {
		o(&cfg)
	}
	if f.c, err = New(cfg); err != nil {
		release()
		return nil, err
	}
	p := &persistent{fixture: f}
	done := false
	p.close = func() {
		if !done {
			done = true
			require.NoError(t, f.c.Close())
			release()
		}
	}
	t.Cleanup(p.close)
	return p, nil
}

// restored waits for the background restore and returns the stats.
func (p *persistent) restored() Stats {
	p.quiesce()
	return p.c.Stats()
}

// write offloads keys [from, from+n) through G1 blocks 0.. and waits until
// they are in G3.
func (p *persistent) write(from, n int) {
	for i := 0; i < n; i += 4 {
		k := min(4, n-i)
		p.offload(from+i, seq(0, k))
		p.quiesce()
	}
	require.GreaterOrEqual(p.t, p.c.Stats().G3.Registered, min(n, p.c.g3.Blocks()))
}

// requireHits onboards keys [from, from+n) (all from G3) and checks every
// byte.
func (p *persistent) requireHits(from, n int) {
	p.t.Helper()
	p.clearG1()
	matched, tiers, err := p.c.Match(keyRange(from, n))
	require.NoError(p.t, err)
	require.Equal(p.t, n, matched)
	require.Equal(p.t, repeat(worker.G3, n), tiers)
	nt, err := p.c.Onboard(keyRange(from, n), seq(0, n), nil, nil)
	require.NoError(p.t, err)
	require.NoError(p.t, nt.WaitTimeout(10*time.Second))
	p.requireLoaded(seq(0, n), from)
}

func TestAPersistentG3ComesBackInANewWorker(t *testing.T) {
	dir := t.TempDir()
	a, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	a.write(0, 6)
	a.close()

	b, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	st := b.restored()
	require.Equal(t, uint64(6), st.G3Restored)
	require.Zero(t, st.G3Refused)
	// The scheduler hears of them: a STORED event of G3 for each.
	var stored []string
	for _, e := range b.c.DrainEvents(nil, 0) {
		if e.Kind == pool.Stored && e.Tier == int(worker.G3) {
			stored = append(stored, string(e.Key.Bytes()))
		}
	}
	require.ElementsMatch(t, []string{string(key(0)), string(key(1)), string(key(2)), string(key(3)),
		string(key(4)), string(key(5))}, stored)
	b.requireHits(0, 4)
	b.requireHits(4, 2)
}

func TestAnotherIDOrLayoutFindsNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		id   string
		g3   int
	}{{"another id", persistID + ";other-model", 16}, {"another G3 size", persistID, 12}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			a, err := newPersistent(t, dir, persistID, 16)
			require.NoError(t, err)
			a.write(0, 4)
			a.close()
			b, err := newPersistent(t, dir, c.id, c.g3)
			require.NoError(t, err)
			st := b.restored()
			require.Zero(t, st.G3Restored)
			require.Zero(t, st.G3.Registered)
			matched, _, err := b.c.Match(keyRange(0, 4))
			require.NoError(t, err)
			require.Zero(t, matched)
		})
	}
}

func TestABlockWhoseBytesChangedIsNeverAHit(t *testing.T) {
	dir := t.TempDir()
	a, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	a.write(0, 6)
	// Where key 2 lives, and a byte of it flipped on disk after the run
	// (a bit flip, or a write the process did not finish).
	id, ok := a.c.g3.Get(mustKey(t, key(2)))
	require.True(t, ok)
	l, _, err := a.w.Manager().Layout(*a.w.Handles().G3)
	require.NoError(t, err)
	off := int64(l.Fragment(id, 1, 0).Addr) + 100 // its bytes in the file
	a.close()
	path := filepath.Join(dir, worker.G3FileName)
	fd, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	one := make([]byte, 1)
	_, err = fd.ReadAt(one, off)
	require.NoError(t, err)
	one[0] ^= 0x10
	_, err = fd.WriteAt(one, off)
	require.NoError(t, err)
	require.NoError(t, fd.Close())

	b, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	st := b.restored()
	require.Equal(t, uint64(5), st.G3Restored)
	require.Equal(t, uint64(1), st.G3Refused)
	matched, _, err := b.c.Match(keyRange(2, 1))
	require.NoError(t, err)
	require.Zero(t, matched, "the changed block is no hit")
	b.requireHits(0, 2)
	b.requireHits(3, 3)
}

func TestATruncatedFileOrATornJournalLosesOnlyWhatTheyLost(t *testing.T) {
	dir := t.TempDir()
	a, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	a.write(0, 4)
	a.close()
	// A torn last record (the process died writing it): the records
	// before it hold.
	jf, err := os.OpenFile(filepath.Join(dir, journalName), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = jf.Write([]byte{40, 0, 0, 0, 1, 2, 3})
	require.NoError(t, err)
	require.NoError(t, jf.Close())
	b, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	require.Equal(t, uint64(4), b.restored().G3Restored)
	b.requireHits(0, 4)
	b.close()

	// The G3 file cut short: its blocks are not what was written, none is
	// a hit.
	require.NoError(t, os.Truncate(filepath.Join(dir, worker.G3FileName), int64(3*shape(1).BlockSize())))
	c, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	st := c.restored()
	require.Zero(t, st.G3Restored)
	matched, _, err := c.c.Match(keyRange(0, 4))
	require.NoError(t, err)
	require.Zero(t, matched)
}

func TestAResetIsNotUndoneByARestart(t *testing.T) {
	dir := t.TempDir()
	a, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	a.write(0, 4)
	_, g3, err := a.c.Reset()
	require.NoError(t, err)
	require.Equal(t, 4, g3)
	a.write(10, 2)
	a.close()
	b, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	require.Equal(t, uint64(2), b.restored().G3Restored)
	b.requireHits(10, 2)
	matched, _, err := b.c.Match(keyRange(0, 1))
	require.NoError(t, err)
	require.Zero(t, matched)
}

func TestOneProcessAtATimeOwnsAPersistentG3(t *testing.T) {
	dir := t.TempDir()
	_, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	_, err = newPersistent(t, dir, persistID, 16)
	require.ErrorIs(t, err, syscall.EWOULDBLOCK)
	require.ErrorContains(t, err, "another process has it open")
}

// TestPersistentG3Writer is the process TestAPersistentG3SurvivesSIGKILL
// kills: it writes keys to G3, says so, and waits to be killed.
func TestPersistentG3Writer(t *testing.T) {
	dir := os.Getenv("KVBM_TEST_PERSIST_DIR")
	if dir == "" {
		t.Skip("the SIGKILL test's child process")
	}
	p, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	p.write(0, 6)
	os.Stdout.WriteString("written\n")
	time.Sleep(time.Minute) // killed long before
}

func TestAPersistentG3SurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPersistentG3Writer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVBM_TEST_PERSIST_DIR="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(line, "written\n"), line)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	b, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	require.Equal(t, uint64(6), b.restored().G3Restored)
	b.requireHits(0, 4)
	b.requireHits(4, 2)
}

func mustKey(t *testing.T, b []byte) pool.Key {
	k, err := pool.NewKey(b)
	require.NoError(t, err)
	return k
}

// A restore never drops its STORED events: with a queue of 4 it waits for
// the engine to drain them, and every restored key is announced.
func TestARestoreWaitsForTheEngineToDrainItsEvents(t *testing.T) {
	dir := t.TempDir()
	a, err := newPersistent(t, dir, persistID, 16)
	require.NoError(t, err)
	a.write(0, 12)
	a.close()
	b, err := newPersistent(t, dir, persistID, 16, func(c *Config) { c.MaxEvents = 4 })
	require.NoError(t, err)
	var stored int
	require.Eventually(t, func() bool {
		for _, e := range b.c.DrainEvents(nil, 0) {
			if e.Kind == pool.Stored && e.Tier == int(worker.G3) {
				stored++
			}
		}
		return stored == 12
	}, 10*time.Second, restoreWait)
	st := b.restored()
	require.Equal(t, uint64(12), st.G3Restored)
	require.Zero(t, st.EventsDropped)
}
