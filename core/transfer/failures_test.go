package transfer

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFailuresCollect(t *testing.T) {
	var f Failures
	require.NoError(t, f.First())
	require.NoError(t, f.err())
	require.Empty(t, f.Blocks())

	f.Add(nil, 1) // a success records nothing
	require.Zero(t, f.Len())

	first, second := errors.New("first"), errors.New("second")
	f.Add(first, 5)
	f.Add(second, 2, 5)
	require.Equal(t, first, f.First())
	require.Equal(t, []int{2, 5}, f.Blocks(), "sorted, each once")
	require.Equal(t, 2, f.Len())

	var bf *blockFailure
	require.ErrorAs(t, f.err(), &bf)
	require.Equal(t, []int{2, 5}, bf.indices)
	require.ErrorIs(t, f.err(), first)
}

// A sub-plan's failure lands on the plan's indices: the blocks it names, or
// its whole range when it names none.
func TestFailuresAddPlanRange(t *testing.T) {
	var f Failures
	f.addPlanRange(4, 8, nil)
	require.Zero(t, f.Len())
	f.addPlanRange(4, 8, &blockFailure{indices: []int{1, 3}, err: ErrCorrupt})
	f.addPlanRange(10, 12, fmt.Errorf("hop: %w", ErrClosed))
	require.Equal(t, []int{5, 7, 10, 11}, f.Blocks())
	require.ErrorIs(t, f.First(), ErrCorrupt)
}

func TestFailuresConcurrent(t *testing.T) {
	var f Failures
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() { f.Add(fmt.Errorf("block %d", i), i) })
	}
	wg.Wait()
	require.Len(t, f.Blocks(), 32)
	require.Error(t, f.First())
}
