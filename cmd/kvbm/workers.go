package main

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/node"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// vLLM's KV cache: one tensor per layer, the block index second
// ([outer][block][page][inner]).
var vllmShape = transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}

// llama3_8B is the cache of Llama-3-8B in blocks of 16 tokens: 32 layers,
// separate K and V, 8 KV heads × 128 dims in bf16. One block is 2 MiB made
// of 64 fragments of 32 KiB.
func llama3_8B(blocks int) layout.Config { return llama3_8BTokens(blocks, 16) }

// llama3_8BTokens is the cache of Llama-3-8B in blocks of tokens tokens:
// 128 KiB a token, fragments of 2 KiB a token.
func llama3_8BTokens(blocks, tokens int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: tokens, InnerDim: 8 * 128, DtypeWidth: 2}
}

// waitLimit bounds every wait, so that a hang is an error, not a stuck run.
const waitLimit = 2 * time.Minute

// tierWorker is a node's worker (its own transfer manager, G3 and G4; no
// network transport: loopback only) with what the demo owns around it: the
// "engine" tensors registered as its G1.
type tierWorker struct {
	*worker.PhysicalWorker
	node  *node.Node // its cache, once made, closes with it
	name  string
	g1cfg layout.Config
	g1mem []*storage.Memory
}

type tierSpec struct {
	name       string
	id         uint64
	g1, g2, g3 int // blocks per tier; 0 leaves the tier out
	tokens     int // tokens per block; 0 is 16 (2 MiB blocks)
	diskDir    string
	objectDir  string // "": no G4
	loop       *remote.Loopback
}

// newTierWorker builds a worker as an engine process would through the C
// ABI: G1 as the engine has it (one device allocation per layer, registered
// by pointer), G2 pinned and fully contiguous, G3 on disk.
func newTierWorker(drv cuda.Driver, s tierSpec) (w *tierWorker, err error) {
	n, err := node.New(node.Config{Worker: worker.StandaloneConfig{WorkerID: s.id, Driver: drv,
		DiskDir: s.diskDir, ObjectDir: s.objectDir, Loopback: s.loop}, Transport: "loopback"})
	if err != nil {
		return nil, fmt.Errorf("%s: worker: %w", s.name, err)
	}
	pw := n.Worker()
	w = &tierWorker{PhysicalWorker: pw, node: n, name: s.name}
	defer func() {
		if err != nil {
			err = errors.Join(err, w.close())
		}
	}()

	if s.tokens == 0 {
		s.tokens = 16
	}
	g1 := llama3_8BTokens(s.g1, s.tokens)
	w.g1cfg = g1
	sizes, err := layout.RegionSizes(g1, vllmShape.Kind, vllmShape.BlockDim)
	if err != nil {
		return w, fmt.Errorf("%s: G1 region sizes: %w", s.name, err)
	}
	ptrs := make([]uint64, 0, len(sizes))
	for layer, size := range sizes {
		mem, err := storage.AllocDevice(drv, 0, size) // the engine's cudaMalloc'd tensor for this layer
		if err != nil {
			return w, fmt.Errorf("%s: G1 layer %d: allocate %d bytes of device memory: %w", s.name, layer, size, err)
		}
		w.g1mem = append(w.g1mem, mem)
		ptrs = append(ptrs, mem.Addr())
	}
	if _, err := pw.RegisterG1(g1, vllmShape, ptrs); err != nil {
		return w, fmt.Errorf("%s: %w", s.name, err)
	}
	if _, err := pw.AllocateG2(llama3_8BTokens(s.g2, s.tokens), transfer.FullyContiguous); err != nil {
		return w, fmt.Errorf("%s: %w", s.name, err)
	}
	if s.g3 > 0 {
		if _, err := pw.AllocateG3(llama3_8BTokens(s.g3, s.tokens), transfer.FullyContiguous); err != nil {
			return w, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return w, nil
}

// close releases the node (its cache, then the worker: waiting for
// transfers in flight, freeing G2 and G3, leaving the loopback) and then the
// engine's G1 tensors.
func (w *tierWorker) close() error {
	var errs []error
	if err := w.node.Close(); err != nil {
		errs = append(errs, fmt.Errorf("%s: close worker: %w", w.name, err))
	}
	for i, mem := range w.g1mem {
		if err := mem.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: free G1 layer %d: %w", w.name, i, err))
		}
	}
	return errors.Join(errs...)
}

// blockIO is byte access to whole blocks of tier t.
func (w *tierWorker) blockIO(t worker.Tier) (*transfer.BlockIO, error) {
	h := w.Handles()
	var hp *transfer.LayoutHandle
	switch t {
	case worker.G1:
		hp = h.G1
	case worker.G2:
		hp = h.G2
	case worker.G3:
		hp = h.G3
	}
	if hp == nil {
		return nil, fmt.Errorf("%s: tier %v is not registered", w.name, t)
	}
	bio, err := w.Manager().BlockIO(*hp)
	if err != nil {
		return nil, fmt.Errorf("%s: block access to %v: %w", w.name, t, err)
	}
	return bio, nil
}

// parallel runs fn(i) for i in [0, n) on GOMAXPROCS goroutines, each with
// two block-sized buffers of its own; it returns the first error.
func parallel(n, blockSize int, fn func(i int, a, b []byte) error) error {
	procs := min(runtime.GOMAXPROCS(0), n)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	for range procs {
		wg.Go(func() {
			a, b := make([]byte, blockSize), make([]byte, blockSize)
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if stop || i >= n {
					return
				}
				if err := fn(i, a, b); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}

// fillBlocks writes the pattern of block tags[i] into block ids[i] of t.
func (w *tierWorker) fillBlocks(t worker.Tier, ids, tags []int) error {
	bio, err := w.blockIO(t)
	if err != nil {
		return err
	}
	return fillIO(bio, fmt.Sprintf("%s %v", w.name, t), ids, tags)
}

// fillIO writes the pattern of block tags[i] into block ids[i] of any block
// store.
func fillIO(bio object.BlockIO, what string, ids, tags []int) error {
	return parallel(len(ids), bio.BlockSize(), func(i int, a, _ []byte) error {
		fill(a, tags[i])
		if err := bio.WriteBlock(ids[i], a); err != nil {
			return fmt.Errorf("%s: write block %d: %w", what, ids[i], err)
		}
		return nil
	})
}

// clearBlocks zeroes blocks ids of t.
func (w *tierWorker) clearBlocks(t worker.Tier, ids []int) error {
	bio, err := w.blockIO(t)
	if err != nil {
		return err
	}
	zero := make([]byte, bio.BlockSize())
	return parallel(len(ids), bio.BlockSize(), func(i int, _, _ []byte) error {
		if err := bio.WriteBlock(ids[i], zero); err != nil {
			return fmt.Errorf("%s: clear %v block %d: %w", w.name, t, ids[i], err)
		}
		return nil
	})
}

// verifyBlocks checks every byte of blocks ids of t against the patterns of
// tags.
func (w *tierWorker) verifyBlocks(t worker.Tier, ids, tags []int) error {
	bio, err := w.blockIO(t)
	if err != nil {
		return err
	}
	return verifyIO(bio, fmt.Sprintf("%s %v", w.name, t), ids, tags)
}

// verifyIO checks every byte of blocks ids of any block store.
func verifyIO(bio object.BlockIO, what string, ids, tags []int) error {
	return parallel(len(ids), bio.BlockSize(), func(i int, got, want []byte) error {
		if err := bio.ReadBlock(ids[i], got); err != nil {
			return fmt.Errorf("%s: read block %d: %w", what, ids[i], err)
		}
		if err := compare(got, want, tags[i]); err != nil {
			return fmt.Errorf("%s block %d: %w", what, ids[i], err)
		}
		return nil
	})
}
