package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
)

// demoCommand is `kvbm demo`: kvbm's end-to-end flow on a Llama-3-8B-shaped
// KV cache: G1 (device) → G2 (pinned host) → G3 (disk) and G4 (object
// store) and back, a layer-wise onboard into G1, a prefill→decode hand-off
// between two workers, and the tiered prefix cache (two requests sharing a
// long prefix: the second onboards it from G2, G3 and G4 and computes only
// the rest), verifying every byte of every block on the way.
//
// The device is cuda.Open(""): KVBM_DEVICE chooses, the emulated device
// when there is no GPU.
func demoCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbm demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "directory for the disk tier (G3) and the object store (G4); created if missing, what is created is removed at the end (required)")
	blocks := fs.Int("blocks", 256, "number of 2 MiB blocks moved on every path")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return runDemo(stdout, *dir, *blocks)
}

func runDemo(stdout io.Writer, dir string, n int) (err error) {
	if dir == "" {
		return errors.New("-dir is required: where the disk tier and the object store live")
	}
	if n < 1 {
		return fmt.Errorf("-blocks must be at least 1, got %d", n)
	}
	root, cleanupDir, err := makeWorkDir(dir)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cleanupDir()) }()

	drv, err := cuda.Open("")
	if err != nil {
		return fmt.Errorf("open device: %w", err)
	}
	if c, ok := drv.(io.Closer); ok {
		defer func() {
			if cerr := c.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("close device: %w", cerr))
			}
		}()
	}
	info, err := drv.Device(0)
	if err != nil {
		return fmt.Errorf("device 0: %w", err)
	}
	fmt.Fprintf(stdout, "device backend: %s (device 0: %s, %.1f GiB)\n", drv.Name(), info.Name, float64(info.TotalMemory)/(1<<30))

	d := &demo{drv: drv, n: n, blockSize: llama3_8B(1).BlockSize()}
	defer func() { err = errors.Join(err, d.close()) }()
	if err := d.setup(root); err != nil {
		return err
	}
	runErr := d.paths()
	prefix, prefixErr := runPrefix(drv, root, d.tierLimit)
	printTable(stdout, d.rows)
	if d.handoff != nil {
		fmt.Fprintf(stdout, "handoff (SourceFirst, vLLM): %s\n", strings.Join(d.handoff.trace, " · "))
	}
	if prefix != nil {
		printPrefix(stdout, prefix, d.blockSize)
	}
	var bad []string
	for _, r := range d.rows {
		if r.err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", r.path, r.err))
		}
	}
	if runErr != nil {
		bad = append(bad, runErr.Error())
	}
	if prefixErr != nil {
		bad = append(bad, prefixErr.Error())
	} else if prefix.verified != nil {
		bad = append(bad, fmt.Sprintf("prefix cache onboard: %v", prefix.verified))
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	fmt.Fprintf(stdout, "all %d blocks verified on every path\n", n)
	return nil
}

// makeWorkDir prepares where G3 and G4 live. A missing dir is created and,
// at the end, removed from the first directory the demo created; an
// existing dir gets a fresh subdirectory, removed at the end.
func makeWorkDir(dir string) (string, func() error, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", nil, fmt.Errorf("-dir %q: %w", dir, err)
	}
	if st, err := os.Stat(abs); err == nil {
		if !st.IsDir() {
			return "", nil, fmt.Errorf("-dir %q is not a directory", dir)
		}
		root, err := os.MkdirTemp(abs, "kvbm-demo-")
		if err != nil {
			return "", nil, fmt.Errorf("-dir %q: %w", dir, err)
		}
		return root, func() error { return removeDir(root) }, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", nil, fmt.Errorf("-dir %q: %w", dir, err)
	}
	created := abs // the topmost directory that does not exist yet
	for parent := filepath.Dir(created); parent != created; parent = filepath.Dir(created) {
		if _, err := os.Stat(parent); err == nil {
			break
		}
		created = parent
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", nil, fmt.Errorf("-dir %q: %w", dir, err)
	}
	return abs, func() error { return removeDir(created) }, nil
}

func removeDir(p string) error {
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// row is one path of the table.
type row struct {
	path    string
	blocks  int
	bytes   int64
	elapsed time.Duration
	limit   limit // the same bytes moved the plain way, measured right after the path
	err     error // the transfer or its verification failed
}

type demo struct {
	drv       cuda.Driver
	n         int
	blockSize int
	loop      *remote.Loopback
	store     object.Store
	prefill   *tierWorker
	decode    *tierWorker
	rows      []row
	handoff   *handoffRun
	copy      *baseline.Copy // the limit of the memory paths
	media     *mediaLimits   // the limits of the disk and object paths
}

func (d *demo) setup(root string) (err error) {
	if d.copy, err = baseline.NewCopy(copyChunk); err != nil {
		return err
	}
	d.loop = remote.NewLoopback()
	g3, g4 := filepath.Join(root, "g3"), filepath.Join(root, "g4")
	if err := os.MkdirAll(g3, 0o700); err != nil {
		return fmt.Errorf("G3 directory: %w", err)
	}
	if d.media, err = newMediaLimits(g3, filepath.Join(root, "limits"), d.blockSize); err != nil {
		return err
	}
	if g4, err = objectLocation(g4); err != nil {
		return err
	}
	// The prefill worker's G2 holds two copies: blocks [0, n) and [n, 2n).
	d.prefill, err = newTierWorker(d.drv, tierSpec{name: "prefill", id: 0xA, g1: d.n, g2: 2 * d.n, g3: d.n,
		diskDir: g3, objectDir: g4, loop: d.loop})
	if err != nil {
		return err
	}
	// A store of the demo's own over the prefill worker's directory (rank
	// 0), so that the check reads what the worker left there.
	if d.store, err = object.Open(object.Location{URL: g4, HasRank: true, Rank: d.prefill.Rank()}); err != nil {
		return fmt.Errorf("G4 object store: %w", err)
	}
	d.decode, err = newTierWorker(d.drv, tierSpec{name: "decode", id: 0xB, g1: d.n, g2: d.n, loop: d.loop})
	return err
}

func (d *demo) close() error {
	var errs []error
	if d.copy != nil {
		errs = append(errs, d.copy.Close())
	}
	if d.media != nil {
		errs = append(errs, d.media.close())
	}
	// The decode worker imported prefill's layouts: it goes first.
	for _, w := range []*tierWorker{d.decode, d.prefill} {
		if w != nil {
			errs = append(errs, w.close())
		}
	}
	return errors.Join(errs...)
}

func seq(from, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = from + i
	}
	return ids
}

// copyChunk is the size of the copy baseline's buffers (a plain copy on
// GOMAXPROCS goroutines, as many as kvbm's own copies use): larger than the
// caches, and warm (written before the first timing), as G2 is since its
// allocation populates it.
const copyChunk = 64 << 20

// record adds a row for a path that moved d.n blocks in elapsed, verified
// by verify, and measures its limit on the same bytes right after it (nil:
// a plain copy), so that both see the machine in the same state.
func (d *demo) record(path string, elapsed time.Duration, lim func(int64) (limit, error), verify func() error) error {
	bytes := int64(d.n) * int64(d.blockSize)
	if lim == nil {
		lim = func(b int64) (limit, error) { return limit{name: "copy", gbs: d.copy.LimitGBs(b)}, nil }
	}
	l, err := lim(bytes)
	if err != nil {
		return err
	}
	d.rows = append(d.rows, row{path: path, blocks: d.n, bytes: bytes, elapsed: elapsed, limit: l, err: verify()})
	return nil
}

// tierLimit is the limit of an onboard of blocks from several tiers: each
// tier's bytes at that tier's plain rate (G2 a copy, G3 an O_DIRECT read,
// G4 a file read), read the faster of two plain ways: one tier after
// another, or all tiers at once (the three plain reads run together and
// the slowest sets the time). Both are named with the figure.
func (d *demo) tierLimit(byTier map[worker.Tier]int) (limit, error) {
	var total int64
	var sequential, atOnce float64 // seconds
	var mu sync.Mutex
	var errs []error
	rate := func(t worker.Tier, b int64) (float64, error) {
		switch t {
		case worker.G3:
			l, err := d.diskRead(b)
			return l.gbs, err
		case worker.G4:
			l, err := d.fileRead(b)
			return l.gbs, err
		}
		return d.copy.LimitGBs(b), nil
	}
	tiers := []worker.Tier{}
	for _, t := range []worker.Tier{worker.G2, worker.G3, worker.G4} {
		if byTier[t] > 0 {
			tiers = append(tiers, t)
		}
	}
	bytesOf := func(t worker.Tier) int64 { return int64(byTier[t]) * int64(d.blockSize) }
	for _, t := range tiers { // one after another
		gbs, err := rate(t, bytesOf(t))
		if err != nil {
			return limit{}, err
		}
		total += bytesOf(t)
		sequential += float64(bytesOf(t)) / (gbs * 1e9)
	}
	var wg sync.WaitGroup
	for _, t := range tiers { // then all at once
		b := bytesOf(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			gbs, err := rate(t, b)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			atOnce = max(atOnce, float64(b)/(gbs*1e9))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return limit{}, err
	}
	if total == 0 {
		return limit{name: "G2 copy, G3 O_DIRECT read, G4 file read"}, nil
	}
	seq, once := float64(total)/sequential/1e9, float64(total)/atOnce/1e9
	name := fmt.Sprintf("G2 copy, G3 O_DIRECT read, G4 file read: one after another %.2f GB/s, at once %.2f GB/s; the faster", seq, once)
	return limit{name: name, gbs: max(seq, once)}, nil
}

// limits of the disk and object rows.
func (d *demo) diskWrite(b int64) (limit, error) { return d.media.disk(true, b) }
func (d *demo) diskRead(b int64) (limit, error)  { return d.media.disk(false, b) }
func (d *demo) fileWrite(b int64) (limit, error) { return d.media.file(true, b) }
func (d *demo) fileRead(b int64) (limit, error)  { return d.media.file(false, b) }

// timed runs one transfer and waits for it.
func timed(what string, start func() (*transfer.Notification, error)) (time.Duration, error) {
	t0 := time.Now()
	nt, err := start()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if err := nt.WaitTimeout(waitLimit); err != nil {
		return 0, fmt.Errorf("%s: %w (failed blocks %v)", what, err, nt.FailedBlocks())
	}
	return time.Since(t0), nil
}

func objectErrors(what string, results []object.Result) error {
	var errs []error
	for _, r := range results {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("key %s: %w", r.Key, r.Err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %d of %d blocks failed: %w", what, len(errs), len(results), errors.Join(errs[:min(3, len(errs))]...))
}

// paths runs every path in turn. A transfer that fails stops the run; a
// verification that fails is recorded in its row and the run goes on.
func (d *demo) paths() error {
	n, p := d.n, d.prefill
	ids := seq(0, n)  // G1, G3 blocks; G2's first copy; object i ↔ block i
	ids2 := seq(n, n) // G2's second copy
	tags := ids       // block i of the cache carries pattern i
	keys := make([]object.Key, n)
	for i := range keys {
		k, err := object.NewKey(fmt.Appendf(nil, "llama3-8b/seq-demo/block-%05d", i))
		if err != nil {
			return fmt.Errorf("object key %d: %w", i, err)
		}
		keys[i] = k
	}
	ctx := context.Background()

	// The engine's prefill wrote the KV cache into G1.
	if err := p.fillBlocks(worker.G1, ids, tags); err != nil {
		return fmt.Errorf("fill G1: %w", err)
	}

	el, err := timed("G1→G2", func() (*transfer.Notification, error) {
		return p.ExecuteLocalTransfer(worker.G1, worker.G2, ids, ids, transfer.Options{})
	})
	if err != nil {
		return err
	}
	if err := d.record("G1→G2 offload", el, nil, func() error { return p.verifyBlocks(worker.G2, ids, tags) }); err != nil {
		return err
	}

	el, err = timed("G2→G3", func() (*transfer.Notification, error) {
		return p.ExecuteLocalTransfer(worker.G2, worker.G3, ids, ids, transfer.Options{})
	})
	if err != nil {
		return err
	}
	if err := d.record("G2→G3 disk", el, d.diskWrite, func() error { return p.verifyBlocks(worker.G3, ids, tags) }); err != nil {
		return err
	}

	t0 := time.Now()
	if err := objectErrors("G2→G4 PutBlocks", p.PutBlocks(ctx, keys, worker.G2, ids)); err != nil {
		return err
	}
	if err := d.record("G2→G4 PutBlocks", time.Since(t0), d.fileWrite, func() error { return d.verifyObjects(ctx, keys, tags) }); err != nil {
		return err
	}

	// Forget the KV on the fast tiers: it must come back from G3 and G4.
	if err := p.clearBlocks(worker.G1, ids); err != nil {
		return err
	}
	if err := p.clearBlocks(worker.G2, seq(0, 2*n)); err != nil {
		return err
	}

	t0 = time.Now()
	if err := objectErrors("G4→G2 GetBlocks", p.GetBlocks(ctx, keys, worker.G2, ids)); err != nil {
		return err
	}
	if err := d.record("G4→G2 GetBlocks", time.Since(t0), d.fileRead, func() error { return p.verifyBlocks(worker.G2, ids, tags) }); err != nil {
		return err
	}

	el, err = timed("G3→G2", func() (*transfer.Notification, error) {
		return p.ExecuteLocalTransfer(worker.G3, worker.G2, ids, ids2, transfer.Options{})
	})
	if err != nil {
		return err
	}
	if err := d.record("G3→G2 (2nd copy)", el, d.diskRead, func() error { return d.compareCopies(ids, ids2, tags) }); err != nil {
		return err
	}

	el, err = d.layerwise(ids2, ids)
	if err != nil {
		return err
	}
	if err := d.record("G2→G1 layer-wise", el, nil, func() error { return p.verifyBlocks(worker.G1, ids, tags) }); err != nil {
		return err
	}

	// Prefill → decode: prefill's G2 copy from G4 lands in the decode
	// worker's G1, in reverse block order.
	rev := make([]int, n)
	for i := range rev {
		rev[i] = n - 1 - i
	}
	if err := d.decode.clearBlocks(worker.G1, ids); err != nil {
		return err
	}
	d.handoff, err = runHandoff(p, d.decode, ids, rev, d.blockSize)
	if err != nil {
		return err
	}
	revTags := make([]int, n) // decode block rev[i] holds pattern i
	for i, dst := range rev {
		revTags[dst] = i
	}
	return d.record("prefill G2→decode G1 handoff", d.handoff.transfer, nil, func() error {
		return d.decode.verifyBlocks(worker.G1, ids, revTags)
	})
}

// verifyObjects reads the objects back straight from the store, a batch at
// a time, and checks every byte.
func (d *demo) verifyObjects(ctx context.Context, keys []object.Key, tags []int) error {
	const batch = 16
	mb, err := object.NewMemoryBlocks(batch, d.blockSize)
	if err != nil {
		return err
	}
	for from := 0; from < len(keys); from += batch {
		to := min(from+batch, len(keys))
		local := seq(0, to-from)
		if err := objectErrors("read back G4", d.store.GetBlocksWithLayout(ctx, keys[from:to], mb, local)); err != nil {
			return err
		}
		if err := verifyIO(mb, fmt.Sprintf("G4 objects %d..%d", from, to-1), local, tags[from:to]); err != nil {
			return err
		}
	}
	return nil
}

// compareCopies checks both G2 copies — from G4 and from G3 — block by
// block, against each other and the pattern.
func (d *demo) compareCopies(a, b, tags []int) error {
	bio, err := d.prefill.blockIO(worker.G2)
	if err != nil {
		return err
	}
	if err := verifyIO(bio, "G2 copy from G3", b, tags); err != nil {
		return err
	}
	return parallel(len(a), d.blockSize, func(i int, x, y []byte) error {
		if err := bio.ReadBlock(a[i], x); err != nil {
			return err
		}
		if err := bio.ReadBlock(b[i], y); err != nil {
			return err
		}
		if string(x) != string(y) {
			return fmt.Errorf("G2 block %d (from G4) differs from block %d (from G3)", a[i], b[i])
		}
		return nil
	})
}

// layerwise onboards prefill's G2 blocks src into its G1 blocks dst.
func (d *demo) layerwise(src, dst []int) (time.Duration, error) {
	return layerwiseOnboard(d.drv, d.prefill, src, dst)
}

// layerwiseOnboard onboards w's G2 blocks src into its G1 blocks dst one
// layer at a time, with one driver event per layer recorded after that
// layer's copies, and waits on the last layer's event and the
// notification, as the engine's attention would; every layer's event must
// be complete by then.
func layerwiseOnboard(drv cuda.Driver, w *tierWorker, src, dst []int) (time.Duration, error) {
	return timeLayerwise(drv, w.g1cfg.NumLayers, "layer-wise onboard", func(events []cuda.Event) (*transfer.Notification, error) {
		return w.ExecuteLayerwiseOnboard(src, dst, events, nil)
	})
}

// timeLayerwise makes one driver event per layer, starts a layer-wise load
// that records them, and times it to the last layer's event and the
// notification, as the engine's attention would wait; every layer's event
// must be complete by then. what names the load in errors.
func timeLayerwise(drv cuda.Driver, layers int, what string,
	start func(events []cuda.Event) (*transfer.Notification, error)) (time.Duration, error) {
	events := make([]cuda.Event, 0, layers)
	defer func() {
		for _, ev := range events {
			_ = drv.EventDestroy(ev)
		}
	}()
	for l := range layers {
		ev, err := drv.EventCreate(0)
		if err != nil {
			return 0, fmt.Errorf("%s: create event for layer %d: %w", what, l, err)
		}
		events = append(events, ev)
	}
	t0 := time.Now()
	nt, err := start(events)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	// What the engine's attention for the last layer would wait for.
	if err := drv.EventSynchronize(events[layers-1]); err != nil {
		return 0, fmt.Errorf("%s: last layer's event: %w", what, err)
	}
	if err := nt.WaitTimeout(waitLimit); err != nil {
		return 0, fmt.Errorf("%s: %w (failed blocks %v)", what, err, nt.FailedBlocks())
	}
	el := time.Since(t0)
	for l, ev := range events {
		done, err := drv.EventQuery(ev)
		if err != nil {
			return 0, fmt.Errorf("%s: layer %d's event: %w", what, l, err)
		}
		if !done {
			return 0, fmt.Errorf("%s: layer %d's event is not complete after the last layer", what, l)
		}
	}
	return el, nil
}
