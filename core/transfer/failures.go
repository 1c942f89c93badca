package transfer

import (
	"errors"
	"slices"
	"sync"
)

// Failures collects which blocks of a batch failed and the first reason,
// for executors that move blocks one by one (or chunk by chunk) and report
// them together. Safe for concurrent use; the zero value is empty and ready.
type Failures struct {
	mu     sync.Mutex
	blocks []int
	first  error
}

// Add records that blocks failed with err. A nil err records nothing, so
// that a result can be added whether it failed or not.
func (f *Failures) Add(err error, blocks ...int) {
	if err == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocks = append(f.blocks, blocks...)
	if f.first == nil {
		f.first = err
	}
}

// Blocks returns the failed blocks in increasing order, each once.
func (f *Failures) Blocks() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := slices.Clone(f.blocks)
	slices.Sort(b)
	return slices.Compact(b)
}

// Len is the number of failed blocks, each counted once.
func (f *Failures) Len() int { return len(f.Blocks()) }

// First is the error of the first failure recorded, nil when none was.
func (f *Failures) First() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.first
}

// blockFailure marks the blocks (indices into the plan's id lists) that an
// executor could not move.
type blockFailure struct {
	indices []int
	err     error
}

func (f *blockFailure) Error() string { return f.err.Error() }
func (f *blockFailure) Unwrap() error { return f.err }

// addPlanRange records a failure of a sub-plan over the plan's blocks lo to
// hi-1: the blocks its blockFailure names (indices into the sub-plan), or
// all of them when it names none.
func (f *Failures) addPlanRange(lo, hi int, err error) {
	if err != nil {
		f.addPlanPicked(lo, seqInts(hi-lo), err)
	}
}

// err is the collected failures as a plan executor reports them: nil, or a
// blockFailure naming the failed indices of the plan.
func (f *Failures) err() error {
	first := f.First()
	if first == nil {
		return nil
	}
	return &blockFailure{indices: f.Blocks(), err: first}
}

// addPlanPicked records err of a hop that moved the blocks picked (indices
// of the plan's blocks from lo): those the hop names, or all of them.
func (f *Failures) addPlanPicked(lo int, picked []int, err error) {
	var bf *blockFailure
	if !errors.As(err, &bf) {
		for _, i := range picked {
			f.Add(err, lo+i)
		}
		return
	}
	for _, i := range bf.indices {
		if i >= 0 && i < len(picked) {
			f.Add(err, lo+picked[i])
		}
	}
}

// hopSurvivors is the indices of a hop of n blocks that err (the hop's)
// does not name as failed: all for nil, none for an error of the whole hop.
func hopSurvivors(err error, n int) []int {
	if err == nil {
		return seqInts(n)
	}
	var bf *blockFailure
	if !errors.As(err, &bf) {
		return nil
	}
	failed := make([]bool, n)
	for _, i := range bf.indices {
		if i >= 0 && i < n {
			failed[i] = true
		}
	}
	var keep []int
	for i, f := range failed {
		if !f {
			keep = append(keep, i)
		}
	}
	return keep
}

func seqInts(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// pick is ids[i] for each i of idx.
func pick(ids []int, idx []int) []int {
	out := make([]int, len(idx))
	for j, i := range idx {
		out[j] = ids[i]
	}
	return out
}
