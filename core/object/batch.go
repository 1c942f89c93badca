package object

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// checkBatch validates a put or get batch before any byte moves. role names
// the layout in errors ("source" or "destination"); a destination must not
// repeat a block id, since two objects landing in one block would leave it
// holding whichever finished last.
func checkBatch(keys []Key, blocks BlockIO, blockIDs []int, role string) error {
	if blocks == nil {
		return fmt.Errorf("%w: %s layout is nil", ErrInvalidArgument, role)
	}
	if len(keys) != len(blockIDs) {
		return fmt.Errorf("%w: %d keys but %d %s block ids", ErrInvalidArgument, len(keys), len(blockIDs), role)
	}
	if bs := blocks.BlockSize(); bs <= 0 {
		return fmt.Errorf("%w: %s block size %d", ErrInvalidArgument, role, bs)
	}
	n := blocks.NumBlocks()
	var seen map[int]int
	if role == roleDestination {
		seen = make(map[int]int, len(blockIDs))
	}
	for i, id := range blockIDs {
		if err := keys[i].valid(); err != nil {
			return fmt.Errorf("%w: key at index %d: %v", ErrInvalidArgument, i, err)
		}
		if id < 0 || id >= n {
			return fmt.Errorf("%w: %s block id %d at index %d out of range [0, %d)", ErrInvalidArgument, role, id, i, n)
		}
		if seen != nil {
			if j, dup := seen[id]; dup {
				return fmt.Errorf("%w: duplicate %s block id %d at indexes %d and %d", ErrInvalidArgument, role, id, j, i)
			}
			seen[id] = i
		}
	}
	return nil
}

const (
	roleSource      = "source"
	roleDestination = "destination"
)

// failAll returns one failed result per key, all carrying err.
func failAll(keys []Key, err error) []Result {
	results := make([]Result, len(keys))
	for i, k := range keys {
		results[i] = Result{Key: k, Err: err}
	}
	return results
}

// anySucceeded reports whether at least one block of a batch succeeded.
func anySucceeded(results []Result) bool {
	for _, r := range results {
		if r.Err == nil {
			return true
		}
	}
	return false
}

// eachKey runs one(i) for every key of a batch on at most limit
// goroutines and returns one result per key, in input order.
func eachKey(ctx context.Context, keys []Key, limit int, one func(i int) error) []Result {
	out := make([]Result, len(keys))
	forEach(ctx, len(keys), limit,
		func() func(int) {
			return func(i int) { out[i] = Result{Key: keys[i], Err: one(i)} }
		},
		func(i int, err error) { out[i] = Result{Key: keys[i], Err: err} })
	return out
}

// eachBlock checks a batch of blocks of bio (as the source or destination
// role), then runs one(i, buf) for every key as eachKey does, where buf
// returns a buffer of extra bytes and one block that each goroutine owns
// for its lifetime, allocated on its first call (a get that reads straight
// into its destination blocks never needs one).
func eachBlock(ctx context.Context, keys []Key, bio BlockIO, blockIDs []int, role string, limit, extra int,
	one func(i int, buf func() []byte) error) []Result {
	if err := checkBatch(keys, bio, blockIDs, role); err != nil {
		return failAll(keys, err)
	}
	bufSize := extra + bio.BlockSize()
	out := make([]Result, len(keys))
	forEach(ctx, len(keys), limit,
		func() func(int) {
			var b []byte
			buf := func() []byte {
				if b == nil {
					b = make([]byte, bufSize)
				}
				return b
			}
			return func(i int) { out[i] = Result{Key: keys[i], Err: one(i, buf)} }
		},
		func(i int, err error) { out[i] = Result{Key: keys[i], Err: err} })
	return out
}

// forEach runs the blocks 0 to n-1 on at most limit goroutines and returns
// when all are done, so no goroutine outlives the call. Each goroutine gets
// its own do from newWorker (to own a buffer for its lifetime). Once ctx is
// done, blocks that have not started are handed to skip with ctx.Err()
// instead; blocks already running finish.
func forEach(ctx context.Context, n, limit int, newWorker func() func(i int), skip func(i int, err error)) {
	workers := min(limit, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var do func(int)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := ctx.Err(); err != nil {
					skip(i, err)
					continue
				}
				if do == nil {
					do = newWorker()
				}
				do(i)
			}
		})
	}
	wg.Wait()
}
