package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
)

func gomaxprocs() int { return runtime.GOMAXPROCS(0) }

// benchPath is one path of the grid and the baseline it is measured
// against; both return how long one run took.
type benchPath struct {
	name, baseline string
	run, base      func() (time.Duration, error)
}

// benchGrid runs every path for one point of the grid on a worker of its
// own (G1 as vLLM has it, layer-separate, plus a fully contiguous G1 for
// whole blocks; G2; G3 and G4 under dir).
func benchGrid(drv cuda.Driver, cfg benchConfig, p *progress, dir string, tokens, blocks, conc int) (_ []benchResult, err error) {
	if err := os.MkdirAll(filepath.Join(dir, "g3"), 0o700); err != nil {
		return nil, fmt.Errorf("bench directory: %w", err)
	}
	w, err := newTierWorker(drv, tierSpec{name: "bench", id: 0xBE, g1: blocks, g2: blocks, g3: blocks, tokens: tokens,
		diskDir: filepath.Join(dir, "g3"), objectDir: filepath.Join(dir, "g4")})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, w.close()) }()
	lc := w.g1cfg
	blockSize := lc.BlockSize()
	bytes := int64(blocks) * int64(blockSize)
	m := w.Manager()
	whole, err := m.AllocateLayout(storage.Device, lc, transfer.FullyContiguous)
	if err != nil {
		return nil, fmt.Errorf("bench: fully contiguous G1: %w", err)
	}
	h := w.Handles()
	frag, g2, g3 := *h.G1, *h.G2, *h.G3
	ids := seq(0, blocks)
	// Every layout written, so that no copy reads the kernel's shared zero
	// page (which would flatter it).
	for _, t := range []worker.Tier{worker.G1, worker.G2, worker.G3} {
		if err := w.fillBlocks(t, ids, ids); err != nil {
			return nil, err
		}
	}
	wholeIO, err := m.BlockIO(whole)
	if err != nil {
		return nil, fmt.Errorf("bench: fully contiguous G1: %w", err)
	}
	if err := fillIO(wholeIO, "bench whole-block G1", ids, ids); err != nil {
		return nil, err
	}

	ref, err := baseline.NewCopy(copyChunk)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, ref.Close()) }()
	buf, err := storage.AllocSystem(uint64(bytes)) // the disk and file baselines' data, aligned for O_DIRECT
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, buf.Close()) }()
	bb, _ := buf.Bytes()
	blockBufs := make([][]byte, blocks)
	for i := range blockBufs {
		blockBufs[i] = bb[i*blockSize : (i+1)*blockSize]
		fill(blockBufs[i], i)
	}
	plain, err := baseline.CreateDirectFile(filepath.Join(dir, "plain-odirect"), uint64(bytes), blockSize)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, plain.Close()) }()
	files, err := baseline.NewFiles(filepath.Join(dir, "plain-files"), blocks)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, files.Close()) }()
	keys := make([]object.Key, blocks)
	for i := range keys {
		if keys[i], err = object.NewKey(fmt.Appendf(nil, "bench/block-%06d", i)); err != nil {
			return nil, fmt.Errorf("object key %d: %w", i, err)
		}
	}
	keysOf := func(part []int) []object.Key {
		ks := make([]object.Key, len(part))
		for i, id := range part {
			ks[i] = keys[id]
		}
		return ks
	}

	parts := split(ids, conc)
	move := func(what string, src, dst transfer.LayoutHandle) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			return inParallel(parts, func(part []int) error {
				_, err := timed(what, func() (*transfer.Notification, error) {
					return m.ExecuteTransfer(src, part, dst, part, transfer.Options{})
				})
				return err
			})
		}
	}
	copyBase := func() (time.Duration, error) { return ref.Run(bytes, gomaxprocs()), nil }
	// The same fragment copies in a plain Go loop on GOMAXPROCS goroutines:
	// the limit of the fragment paths (the device memory of the emulated
	// device is host memory; a real device's is not, and has no such row).
	loopBase := func(src, dst transfer.LayoutHandle) func() (time.Duration, error) {
		return func() (time.Duration, error) { return fragmentLoop(m, src, dst, ids) }
	}
	diskBase := func(write bool) func() (time.Duration, error) {
		return func() (time.Duration, error) { return plain.IO(bb, write, conc) }
	}
	filesBase := func(write bool) func() (time.Duration, error) {
		return func() (time.Duration, error) { return files.IO(blockBufs, write, conc) }
	}
	ctx := context.Background()
	// The G4 gets (and their baseline) read what the put and its baseline
	// wrote: a get run without the put path runs them once first, untimed
	// (a failure is the get's).
	var putDone bool
	put := func() (time.Duration, error) {
		return inParallel(parts, func(part []int) error {
			return objectErrors("G2→G4 PutBlocks", w.PutBlocks(ctx, keysOf(part), worker.G2, part))
		})
	}
	putBase := func() (time.Duration, error) {
		d, err := filesBase(true)()
		putDone = putDone || err == nil
		return d, err
	}
	ensurePut := func() error {
		if putDone {
			return nil
		}
		if _, err := put(); err != nil {
			return fmt.Errorf("%s first, for the gets: %w", putPath, err)
		}
		_, err := putBase()
		return err
	}
	// The G4 get of every part (the put first, once).
	get := func() (time.Duration, error) {
		if err := ensurePut(); err != nil {
			return 0, err
		}
		return inParallel(parts, func(part []int) error {
			return objectErrors("G4→G2 GetBlocks", w.GetBlocks(ctx, keysOf(part), worker.G2, part))
		})
	}
	fragName := sizeString(blockSize / (lc.NumLayers * lc.OuterDim))
	copyName := fmt.Sprintf("copy ×%d", gomaxprocs())
	paths := []benchPath{
		{"G1→G2 whole blocks", copyName, move("G1→G2", whole, g2), copyBase},
		{"G2→G1 whole blocks", copyName, move("G2→G1", g2, whole), copyBase},
		{"G1→G2 " + fragName + " fragments", copyName, move("G1→G2", frag, g2), copyBase},
		{"G2→G1 " + fragName + " fragments", copyName, move("G2→G1", g2, frag), copyBase},
	}
	if drv.Name() == cuda.EmulatedName {
		loopName := fmt.Sprintf("fragment loop ×%d", gomaxprocs())
		paths = append(paths,
			benchPath{"G1→G2 " + fragName + " fragments, vs loop", loopName, move("G1→G2", frag, g2), loopBase(frag, g2)},
			benchPath{"G2→G1 " + fragName + " fragments, vs loop", loopName, move("G2→G1", g2, frag), loopBase(g2, frag)},
			benchPath{"G2→G1 layer-wise onboard, vs loop", loopName, func() (time.Duration, error) {
				return inParallel(parts, func(part []int) error {
					_, err := layerwiseOnboard(drv, w, part, part)
					return err
				})
			}, loopBase(g2, frag)})
	}
	paths = append(paths, []benchPath{
		{"G2→G1 layer-wise onboard", copyName, func() (time.Duration, error) {
			return inParallel(parts, func(part []int) error {
				_, err := layerwiseOnboard(drv, w, part, part)
				return err
			})
		}, copyBase},
		{"G2→G3 disk write", "O_DIRECT pwrite", move("G2→G3", g2, g3), diskBase(true)},
		{"G3→G2 disk read", "O_DIRECT pread", move("G3→G2", g3, g2), diskBase(false)},
		{putPath, "file+fsync per block", put, putBase},
		{"G4→G2 get", "read file per block", get, filesBase(false)},
		// The same get beside a plain read that also computes the CRC32C the
		// store checks (in pieces, while hot): what verifying costs by
		// itself, which the plain read does not pay.
		{"G4→G2 get, vs read+crc32c", "read+crc32c file per block", get, func() (time.Duration, error) { return files.ReadChecked(blockBufs, conc) }},
		// Cold: both sides' files dropped from the page cache before each run
		// (outside the timing), so that both read the device.
		{"G4→G2 get, cold cache", "read file per block, cold", func() (time.Duration, error) {
			if err := ensurePut(); err != nil {
				return 0, err
			}
			if err := baseline.DropCache(filepath.Join(dir, "g4")); err != nil {
				return 0, err
			}
			return get()
		}, func() (time.Duration, error) {
			if err := files.DropCache(); err != nil {
				return 0, err
			}
			return files.IO(blockBufs, false, conc)
		}},
	}...)
	if cfg.wants(s3GetPath) {
		s3, serr := s3FromEnv()
		if serr != nil {
			return nil, serr
		}
		if s3 != nil {
			defer func() { err = errors.Join(err, s3.close()) }()
			g2IO, gerr := m.BlockIO(g2)
			if gerr != nil {
				return nil, fmt.Errorf("bench: G2: %w", gerr)
			}
			paths = append(paths, s3.path(g2IO, keysOf, parts, blockBufs))
		}
	}
	if cfg.wants(cacheOffloadPath) || cfg.wants(cacheOnboardPath) {
		// Last: the cache owns G2 from now on.
		cps, err := cachePaths(drv, w, parts, ref, bytes)
		if err != nil {
			return nil, err
		}
		paths = append(paths, cps...)
	}
	var results []benchResult
	for _, bp := range paths {
		if !cfg.wants(bp.name) {
			continue
		}
		r := benchResult{Path: bp.name, BlockBytes: blockSize, Blocks: blocks, Concurrency: conc, Unit: "GB/s", Baseline: bp.baseline}
		results = append(results, runPath(cfg.reps, r, bp, func(rep int) {
			p.say(fmt.Sprintf("%s, %s blocks ×%d, concurrency %d", bp.name, sizeString(blockSize), blocks, conc), rep, cfg.reps)
		}, bytes, 0))
	}
	return results, nil
}

// putPath is the G4 put's name; the gets read what it wrote.
const putPath = "G2→G4 put"

// fragmentLoop copies blocks ids of layout src into the same blocks of
// dst fragment by fragment — every (layer, outer) piece, as a transfer
// between a layer-separate and a fully contiguous layout must — in a plain
// Go loop on GOMAXPROCS goroutines, and returns how long it took. Both
// layouts must be host-addressable (the emulated device's memory is).
func fragmentLoop(m *transfer.Manager, src, dst transfer.LayoutHandle, ids []int) (time.Duration, error) {
	sl, _, err := m.Layout(src)
	if err != nil {
		return 0, err
	}
	dl, _, err := m.Layout(dst)
	if err != nil {
		return 0, err
	}
	cfg := sl.Config()
	type piece struct{ s, d, n uint64 }
	pieces := make([]piece, 0, len(ids)*cfg.NumLayers*cfg.OuterDim)
	for _, b := range ids {
		for layer := range cfg.NumLayers {
			for outer := range cfg.OuterDim {
				f, g := sl.Fragment(b, layer, outer), dl.Fragment(b, layer, outer)
				pieces = append(pieces, piece{f.Addr, g.Addr, f.Size})
			}
		}
	}
	return inParallel(split(seq(0, len(pieces)), gomaxprocs()), func(part []int) error {
		for _, i := range part {
			p := pieces[i]
			copy(storage.HostBytes(p.d, p.n), storage.HostBytes(p.s, p.n))
		}
		return nil
	})
}

// runPath measures bp and fills r with its figures, or with its error.
func runPath(reps int, r benchResult, bp benchPath, say func(rep int), bytes int64, ops int) benchResult {
	runs, err := measure(reps, bp, say)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	return summarize(r, runs, bytes, ops)
}

// measure runs a path and its baseline once untimed (warming both), then
// reps times each, the baseline right after the path.
func measure(reps int, bp benchPath, say func(rep int)) ([]sample, error) {
	var runs []sample
	for rep := 0; rep <= reps; rep++ {
		say(rep)
		k, err := bp.run()
		if err != nil {
			return nil, err
		}
		b, err := bp.base()
		if err != nil {
			return nil, fmt.Errorf("baseline %s: %w", bp.baseline, err)
		}
		if rep > 0 {
			runs = append(runs, sample{kvbm: k, base: b})
		}
	}
	return runs, nil
}

// split cuts ids into n contiguous parts of (nearly) equal length.
func split(ids []int, n int) [][]int {
	parts := make([][]int, 0, n)
	for i := range n {
		from, to := len(ids)*i/n, len(ids)*(i+1)/n
		if from < to {
			parts = append(parts, ids[from:to])
		}
	}
	return parts
}

// inParallel runs fn on every part at once, one goroutine each, and
// returns how long it took until the last finished.
func inParallel(parts [][]int, fn func(part []int) error) (time.Duration, error) {
	errs := make([]error, len(parts))
	t0 := time.Now()
	var wg sync.WaitGroup
	for i, part := range parts {
		wg.Go(func() { errs[i] = fn(part) })
	}
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// smallBlockSizes are the block sizes of the small-transfer figures: 4
// KiB (one token of one layer, 2,048 bf16 values), a 32 KiB fragment (16
// tokens of one layer of Llama-3-8B's K or V) and 256 KiB. A call costs
// about the same whatever it moves, so the figures show from which block
// size one-block calls come close to one call.
var smallBlockSizes = []int{4 << 10, 32 << 10, 256 << 10}

// smallBlock is a layout of blocks of one layer and one token of bytes.
func smallBlock(blocks, bytes int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 1, OuterDim: 1, PageSize: 1, InnerDim: bytes / 2, DtypeWidth: 2}
}

// benchSmall measures small transfers G2→G1 for each of smallBlockSizes.
func benchSmall(drv cuda.Driver, cfg benchConfig, p *progress) ([]benchResult, error) {
	var results []benchResult
	for _, size := range smallBlockSizes {
		r, err := benchSmallSize(drv, cfg, p, size)
		results = append(results, r...)
		if err != nil {
			return results, err
		}
	}
	return results, nil
}

// benchSmallSize measures small transfers G2→G1 of blocks of blockBytes:
// one block a call with its wait, beside a copy of the same bytes; and 256
// one-block calls in flight at once, beside one call of the same 256
// blocks.
func benchSmallSize(drv cuda.Driver, cfg benchConfig, p *progress, blockBytes int) (_ []benchResult, err error) {
	const batch = 256
	names := []string{"G2→G1 one-block call+wait", "G2→G1 256 one-block calls"}
	if !cfg.wants(names[0]) && !cfg.wants(names[1]) {
		return nil, nil
	}
	m, err := transfer.NewManager(transfer.Config{WorkerID: 0x5A, Driver: drv})
	if err != nil {
		return nil, fmt.Errorf("small transfers: %w", err)
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	lc := smallBlock(batch, blockBytes)
	g1, err := m.AllocateLayout(storage.Device, lc, transfer.FullyContiguous)
	if err != nil {
		return nil, fmt.Errorf("small transfers: G1: %w", err)
	}
	g2, err := m.AllocateLayout(storage.Pinned, lc, transfer.FullyContiguous)
	if err != nil {
		return nil, fmt.Errorf("small transfers: G2: %w", err)
	}
	bs := lc.BlockSize()
	for _, h := range []transfer.LayoutHandle{g1, g2} {
		bio, err := m.BlockIO(h)
		if err != nil {
			return nil, fmt.Errorf("small transfers: %w", err)
		}
		if err := fillIO(bio, "small transfers", seq(0, batch), seq(0, batch)); err != nil {
			return nil, err
		}
	}
	src, dst := make([]byte, batch*bs), make([]byte, batch*bs)
	fill(src, 1)
	copy(dst, src)
	ops := cfg.smallOps
	rounds := max(1, ops/batch)
	ids := seq(0, batch)
	one := make([][]int, batch)
	for i := range one {
		one[i] = ids[i : i+1]
	}
	paths := []benchPath{
		{names[0], "copy of the block", func() (time.Duration, error) {
			t0 := time.Now()
			for i := range ops {
				n, err := m.ExecuteTransfer(g2, one[i%batch], g1, one[i%batch], transfer.Options{})
				if err != nil {
					return 0, err
				}
				if err := n.WaitTimeout(waitLimit); err != nil {
					return 0, err
				}
			}
			return time.Since(t0), nil
		}, func() (time.Duration, error) {
			t0 := time.Now()
			for i := range ops {
				j := i % batch
				copy(dst[j*bs:(j+1)*bs], src[j*bs:(j+1)*bs])
			}
			return time.Since(t0), nil
		}},
		// Rounds of the batch per timed run, on both sides, so that a run
		// is not one shot of a few hundred microseconds (a GC or a
		// preemption would be most of it).
		{names[1], "one 256-block call", func() (time.Duration, error) {
			ns := make([]*transfer.Notification, batch)
			t0 := time.Now()
			for range rounds {
				for i := range batch {
					n, err := m.ExecuteTransfer(g2, one[i], g1, one[i], transfer.Options{})
					if err != nil {
						return 0, err
					}
					ns[i] = n
				}
				for _, n := range ns {
					if err := n.WaitTimeout(waitLimit); err != nil {
						return 0, err
					}
				}
			}
			return time.Since(t0), nil
		}, func() (time.Duration, error) {
			t0 := time.Now()
			for range rounds {
				if _, err := timed("G2→G1 one 256-block call", func() (*transfer.Notification, error) {
					return m.ExecuteTransfer(g2, ids, g1, ids, transfer.Options{})
				}); err != nil {
					return 0, err
				}
			}
			return time.Since(t0), nil
		}},
	}
	var results []benchResult
	for i, bp := range paths {
		if !cfg.wants(bp.name) {
			continue
		}
		n := ops
		if i == 1 {
			n = batch * rounds
		}
		r := benchResult{Path: bp.name, BlockBytes: bs, Blocks: 1, Concurrency: 1, Unit: "us", Baseline: bp.baseline}
		if i == 1 {
			r.Blocks, r.Concurrency = batch, batch
		}
		results = append(results, runPath(cfg.reps, r, bp, func(rep int) { p.say(bp.name, rep, cfg.reps) }, 0, n))
	}
	return results, nil
}
