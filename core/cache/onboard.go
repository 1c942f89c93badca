package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
)

// ErrNotCached: a key to onboard is in no tier (evicted since it was
// matched); its block fails.
var ErrNotCached = kvbmerr.New(kvbmerr.NotFound, "not cached")

// onboard is one Onboard in progress.
type onboard struct {
	from3  blocks // G3 source (pinned), G1 destination
	stage3 []int  // the G2 blocks from3 is staged in
	from4  blocks // G1 destination
	stage4 []int  // the G2 blocks from4 is staged in
	// direct3 and direct4 go straight to G1 (G3 through the transfer
	// manager's bounce buffers) when G2 has no room to stage them.
	direct3, direct4 blocks
	// ready are the G2 blocks to copy to G1, and their destinations;
	// readyFrom the tier each was found in.
	ready     blocks
	readyFrom []worker.Tier
	failures  transfer.Failures // by G1 block
	wd        writeDown
	// early is the copy of the blocks G2 held at the start, run while G3
	// and G4 blocks are staged (nil when there is nothing to stage): the
	// first early.n entries of ready.
	early *g2Copy
	// copyStart is when the G2→G1 copy after staging started; planned the
	// bytes planned per tier (rates.go). reached, on the caller's stream,
	// says when the stream reached the first copy (the copies' time starts
	// there, not behind the caller's work).
	copyStart time.Time
	reached   <-chan time.Time
	planned   [5]float64
	// promote are the keys loaded straight from G3 or G4 (G2 had no free
	// block to stage them in), for G2 after the load (promote.go).
	promote []pool.Key
}

// Onboard loads keys[i] into G1 block g1[i] from the tier that caches it:
// from G2 directly, from G3 and G4 through G2 (where the block stays, for
// the next hit). Every block is loaded or reported failed — never both —
// and the notification names the G1 blocks that failed (a key evicted
// since it was matched, a corrupt G3 or G4 block, a failed copy). A
// corrupt block is removed from its tier.
//
// With events (one per layer), the G2→G1 copies go layer by layer on
// stream (nil: one of the worker's) and events[L] is recorded after layer
// L, so that the engine can start attention of layer L while later layers
// are in flight; G3 and G4 blocks are then staged within this call, so that
// every event is recorded when it returns. Without events the whole load
// runs in the background.
func (c *Cache) Onboard(raw [][]byte, g1 []int, events []cuda.Event, stream *cuda.Stream) (*transfer.Notification, error) {
	if len(raw) != len(g1) {
		return nil, fmt.Errorf("%w: onboard: %d keys but %d G1 block ids", kvbmerr.ErrInvalidArgument, len(raw), len(g1))
	}
	keys, err := keysOf(raw)
	if err != nil {
		return nil, fmt.Errorf("onboard: %w", err)
	}
	if err := c.checkG1(g1, true); err != nil {
		return nil, fmt.Errorf("onboard: %w", err)
	}
	if events != nil && len(events) != c.g1Layers {
		return nil, fmt.Errorf("%w: onboard: %d layer events given, G1 has %d layers", kvbmerr.ErrInvalidArgument, len(events), c.g1Layers)
	}
	for i, ev := range events {
		if ev == 0 {
			return nil, fmt.Errorf("%w: onboard: layer event %d is null", kvbmerr.ErrInvalidArgument, i)
		}
	}
	c.mu.Lock()
	if err := c.begin(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	o := c.planOnboard(keys, g1)
	c.mu.Unlock()
	if events == nil {
		return transfer.Go(func() error {
			defer c.inflight.Done()
			c.stageBeside(o, stream)
			src, dst := o.ready.src[o.early.count():], o.ready.dst[o.early.count():]
			n, err := c.w.ExecuteLocalTransfer(worker.G2, worker.G1, src, dst, transfer.Options{Stream: stream})
			return c.loaded(o, len(keys), n, err)
		}), nil
	}
	// The layers' events are recorded after the staged blocks' copies, and
	// behind the early copy on the caller's stream, or after it is over on
	// the worker's (stageBeside): each event covers every block of its
	// layer.
	c.stageBeside(o, stream)
	src, dst := o.ready.src[o.early.count():], o.ready.dst[o.early.count():]
	n, err := c.w.ExecuteLayerwiseOnboard(src, dst, events, stream)
	return transfer.Go(func() error {
		defer c.inflight.Done()
		return c.loaded(o, len(keys), n, err)
	}), nil
}

// planOnboard finds each key's tier, pins its block, and allocates G2
// blocks to stage G3 and G4 blocks in; callers hold c.mu.
func (c *Cache) planOnboard(keys []pool.Key, g1 []int) *onboard {
	o := &onboard{}
	var staged []int // indices of keys, in order
	for i, k := range keys {
		if id, ok := c.g2.Acquire(k); ok {
			o.ready.add(k, id, g1[i]) // pinned: unpinned once loaded
			o.readyFrom = append(o.readyFrom, worker.G2)
			continue
		}
		if c.g3 != nil {
			if _, ok := c.g3.Get(k); ok {
				staged = append(staged, i)
				continue
			}
		}
		if c.g4 != nil {
			staged = append(staged, i)
			continue
		}
		o.failures.Add(fmt.Errorf("%w: key %v is in no tier", ErrNotCached, k), g1[i])
	}
	// Stage what G2 has free blocks for, in key order; the rest go to G1
	// directly. Not into blocks it would evict: their write-down would come
	// first, on the load's path (the staged copy is only for a later hit).
	room := min(len(staged), c.g2.Stats().Free)
	stageIDs, _ := c.g2.Allocate(room, nil) // room was checked
	for j, i := range staged {
		k := keys[i]
		if c.g3 != nil {
			if id, ok := c.g3.Acquire(k); ok {
				if j < room {
					o.from3.add(k, id, g1[i])
					o.stage3 = append(o.stage3, stageIDs[j])
				} else {
					o.direct3.add(k, id, g1[i])
				}
				continue
			}
		}
		if j < room {
			o.from4.add(k, -1, g1[i])
			o.stage4 = append(o.stage4, stageIDs[j])
		} else {
			o.direct4.add(k, -1, g1[i])
		}
	}
	o.wd = c.planWriteDown()
	c.collectEvents()
	o.planned[worker.G2] = c.bytesOf(len(o.ready.keys) + len(o.from3.keys) + len(o.from4.keys))
	o.planned[worker.G3] = c.bytesOf(len(o.from3.keys) + len(o.direct3.keys))
	o.planned[worker.G4] = c.bytesOf(len(o.from4.keys) + len(o.direct4.keys))
	for _, t := range []worker.Tier{worker.G2, worker.G3, worker.G4} {
		c.rates.start(t, o.planned[t])
	}
	return o
}

// bytesOf is the bytes of n blocks.
func (c *Cache) bytesOf(n int) float64 { return float64(n) * float64(c.blockBytes) }

// stageBeside stages o's G3 and G4 blocks while the blocks G2 holds are
// copied into G1 (the two share no resource but the host's memory bus),
// waits for that copy, and marks when the copy of the staged blocks starts.
func (c *Cache) stageBeside(o *onboard, stream *cuda.Stream) {
	if stream != nil {
		o.reached = c.m.StreamReached(*stream)
	}
	c.stage(o, func() {
		if len(o.ready.keys) > 0 && o.staging() {
			o.early = c.startG2Copy(o.ready.src, o.ready.dst, stream)
		}
	})
	if stream == nil {
		// The copies after staging go on another stream: the layers'
		// events must cover the early copy, so it is over first. On the
		// caller's stream they queue behind it (loaded waits for it).
		o.early.wait()
	}
	o.copyStart = time.Now()
}

// g2Time is how long o's copies into G1 ran, once they are over: the early
// copy's, from when its stream reached it, and the copy's after staging,
// from when it was queued or the early copy ended. 0 (no sample) when a
// stamp taken by another goroutine came after the end it should precede.
func (o *onboard) g2Time() time.Duration {
	end := time.Now()
	var reached time.Time
	if o.reached != nil {
		if reached = <-o.reached; reached.After(end) {
			return 0
		}
	}
	if o.early == nil {
		return end.Sub(later(o.copyStart, reached))
	}
	early := o.early.ran(reached)
	if early < 0 {
		return 0
	}
	return early + end.Sub(later(o.copyStart, o.early.end))
}

// staging reports whether o brings blocks from G3 or G4.
func (o *onboard) staging() bool {
	return len(o.from3.keys)+len(o.direct3.keys)+len(o.from4.keys)+len(o.direct4.keys) > 0
}

// stage writes down what staging evicted, then brings G3 and G4 blocks
// into their G2 blocks, and adds those that arrived to o.ready. A G3 or G4
// block that fails is removed from its tier. beside (may be nil) starts
// other work once the G3 reads are under way.
func (c *Cache) stage(o *onboard, beside func()) {
	c.runWriteDown(o.wd)
	t3 := time.Now()
	g3 := c.startCopy(worker.G3, worker.G2, o.from3.src, o.stage3)
	g3direct := c.startCopy(worker.G3, worker.G1, o.direct3.src, o.direct3.dst)
	// The disk is the slowest medium here: its reads go first. Without
	// this yield, the goroutine that issues them waited behind the G2
	// copy's and the G4 reads' (Go lets a running goroutine keep its P up
	// to 10 ms): 3 to 11 ms of an onboard of about 50 ms in kvbm demo.
	runtime.Gosched()
	if beside != nil {
		beside()
	}
	var results4, direct4 []object.Result
	if len(o.stage4) > 0 {
		results4 = c.w.GetBlocks(context.Background(), objectKeys(o.from4.keys), worker.G2, o.stage4)
	}
	if len(o.direct4.keys) > 0 {
		direct4 = c.w.GetBlocks(context.Background(), objectKeys(o.direct4.keys), worker.G1, o.direct4.dst)
	}
	d4 := time.Since(t3)
	failed3, err3 := g3()
	failed3direct, err3direct := g3direct()
	d3 := time.Since(t3)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rates.done(worker.G3, o.planned[worker.G3], d3)
	c.rates.done(worker.G4, o.planned[worker.G4], d4)
	for i, k := range o.from3.keys {
		if c.fromG3(k, o.from3.src[i], failed3(o.stage3[i]), err3, o.from3.dst[i], o) {
			o.ready.add(k, o.stage3[i], o.from3.dst[i])
			o.readyFrom = append(o.readyFrom, worker.G3)
		} else {
			_ = c.g2.Release(o.stage3[i : i+1])
		}
	}
	for i, k := range o.direct3.keys {
		if c.fromG3(k, o.direct3.src[i], failed3direct(o.direct3.dst[i]), err3direct, o.direct3.dst[i], o) {
			c.counters.onboarded++
			c.counters.onboardedFrom[worker.G3]++
			o.promote = append(o.promote, k)
		}
	}
	for i, k := range o.from4.keys {
		if c.fromG4(k, results4[i].Err, o.from4.dst[i], o) {
			o.ready.add(k, o.stage4[i], o.from4.dst[i])
			o.readyFrom = append(o.readyFrom, worker.G4)
		} else {
			_ = c.g2.Release(o.stage4[i : i+1])
		}
	}
	for i, k := range o.direct4.keys {
		if c.fromG4(k, direct4[i].Err, o.direct4.dst[i], o) {
			c.counters.onboarded++
			c.counters.onboardedFrom[worker.G4]++
			o.promote = append(o.promote, k)
		}
	}
	c.collectEvents()
}

// startCopy starts a copy between two tiers (nothing when ids is empty)
// and returns the wait for it.
func (c *Cache) startCopy(src, dst worker.Tier, srcIDs, dstIDs []int) func() (func(int) bool, error) {
	if len(srcIDs) == 0 {
		return func() (func(int) bool, error) { return func(int) bool { return false }, nil }
	}
	n, err := c.w.ExecuteLocalTransfer(src, dst, srcIDs, dstIDs, transfer.Options{})
	return func() (func(int) bool, error) { return failedOf(n, err) }
}

// fromG3 ends the read of G3 block id for key k: it unpins the block and,
// when the read failed, removes the key from G3 (its data is unusable) and
// fails G1 block g1. It reports whether the read succeeded; callers hold
// c.mu.
func (c *Cache) fromG3(k pool.Key, id int, failed bool, err error, g1 int, o *onboard) bool {
	if failed {
		c.g3.Remove([]pool.Key{k}) // freed at the unpin below
		c.journalRemoved(k, id)
		o.failures.Add(fmt.Errorf("onboard from G3: %w", err), g1)
	}
	_ = c.g3.Unpin([]int{id})
	return !failed
}

// fromG4 ends the get of key k's object: a corrupt object is forgotten and
// reported removed, and any failure fails G1 block g1. It reports whether
// the get succeeded; callers hold c.mu.
func (c *Cache) fromG4(k pool.Key, err error, g1 int, o *onboard) bool {
	if err != nil {
		c.g4.drop(k)
		if errors.Is(err, object.ErrCorrupt) {
			c.record(pool.Removed, k)
			c.counters.g4Corrupt++
		}
		c.counters.g4Misses++
		o.failures.Add(fmt.Errorf("onboard from G4: %w", err), g1)
		return false
	}
	c.g4.add(k)
	c.counters.g4Hits++
	return true
}

// loaded ends an onboard once its G2→G1 copy (n, or err when it could not
// start) is over: it releases the G2 pins, keeps the staged blocks in G2,
// and reports the G1 blocks that failed.
func (c *Cache) loaded(o *onboard, total int, n *transfer.Notification, err error) error {
	o.early.wait()
	early := o.early.count()
	failed := func(int) bool { return true }
	if len(o.ready.keys) == early {
		failed = func(int) bool { return false }
		if err == nil && n != nil {
			_ = n.Wait(context.Background())
		}
	} else {
		failed, err = failedOf(n, err)
	}
	took := o.g2Time()
	c.mu.Lock()
	for i, k := range o.ready.keys {
		if i < early && o.early.failed(o.ready.dst[i]) {
			o.failures.Add(fmt.Errorf("onboard G2→G1: %w", o.early.err), o.ready.dst[i])
		} else if i >= early && failed(o.ready.dst[i]) {
			o.failures.Add(fmt.Errorf("onboard G2→G1: %w", err), o.ready.dst[i])
		} else {
			c.counters.onboarded++
			c.counters.onboardedFrom[o.readyFrom[i]]++
		}
		if o.readyFrom[i] == worker.G2 {
			_ = c.g2.Unpin(o.ready.src[i : i+1])
			continue
		}
		// A staged block stays in G2 (unless another call stored the key
		// meanwhile).
		if c.g2.Register([]pool.Key{k}, o.ready.src[i:i+1]) != nil {
			_ = c.g2.Release(o.ready.src[i : i+1])
		}
	}
	bad := o.failures.Blocks()
	c.counters.onboardFailed += uint64(len(bad))
	c.collectEvents()
	c.rates.done(worker.G2, o.planned[worker.G2], took)
	if len(o.promote) > 0 && !c.closed {
		c.inflight.Add(1)
		go c.promote(o.promote)
	}
	c.mu.Unlock()
	if len(bad) == 0 {
		return nil
	}
	return transfer.Failed(transfer.LayoutHandle{}, transfer.LayoutHandle{}, bad,
		fmt.Errorf("onboard: %d of %d G1 blocks not loaded, first: %w", len(bad), total, o.failures.First()))
}
