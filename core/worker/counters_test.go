package worker

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/transfer"
)

// The worker's counters are its manager's, read without reaching into it.
func TestCountersCountTheWorkersTransfers(t *testing.T) {
	wait := waiter(t)
	w := newWorker(t, newDriver(t), 1, nil, nil)
	require.Zero(t, w.Counters()[transfer.PathHostCopy].Transfers)
	wait(w.ExecuteLocalTransfer(G2, G2, []int{0, 1}, []int{2, 3}, transfer.Options{}))
	c := w.Counters()[transfer.PathHostCopy]
	require.Equal(t, uint64(1), c.Transfers)
	require.Equal(t, uint64(2), c.Blocks)
	require.Equal(t, w.Counters(), w.Manager().Counters())
}
