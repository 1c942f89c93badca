package worker

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/transfer"
)

// Issue 9, defect 3: the object calls, blocking and in the background,
// refuse a bad request before anything starts, with the statuses of a
// transfer: ids beyond the layout are out of range, repeated destination
// blocks invalid.
func TestObjectCallsRefuseBadRequestsUpFront(t *testing.T) {
	drv := newDriver(t)
	store, err := object.NewFSStore(object.FSConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	w := newWorker(t, drv, 1, nil, store) // G2: 16 blocks
	keys := make([]object.Key, 3)
	for i := range keys {
		keys[i], err = object.NewKey([]byte{byte(i), 0xCD})
		require.NoError(t, err)
	}
	ctx := context.Background()
	for _, r := range w.PutBlocks(ctx, keys, G2, []int{0, 1, 2}) {
		require.NoError(t, r.Err)
	}

	beyond := []int{0, 1, 16}
	_, err = w.ExecuteRemoteOnboard(RemoteObjects(keys), G2, beyond, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrOutOfRange)
	require.ErrorContains(t, err, "16")
	_, err = w.ExecuteRemoteOffload(G2, beyond, RemoteObjects(keys), transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrOutOfRange)
	_, err = w.ExecuteRemoteOnboard(RemoteObjects(keys[:2]), G2, []int{13, 13}, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.NotErrorIs(t, err, transfer.ErrOutOfRange)
	require.ErrorContains(t, err, "13")
	_, err = w.ExecuteRemoteOnboard(RemoteObjects(keys[:2]), G2, []int{1}, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)

	for _, r := range w.PutBlocks(ctx, keys, G2, beyond) {
		require.ErrorIs(t, r.Err, transfer.ErrOutOfRange)
	}
	for _, r := range w.GetBlocks(ctx, keys, G2, beyond) {
		require.ErrorIs(t, r.Err, transfer.ErrOutOfRange)
	}
	for _, r := range w.GetBlocks(ctx, keys[:2], G2, []int{13, 13}) {
		require.ErrorIs(t, r.Err, transfer.ErrInvalidArgument)
		require.NotErrorIs(t, r.Err, transfer.ErrOutOfRange)
	}
	// A source block may go to two keys.
	for _, r := range w.PutBlocks(ctx, keys[:2], G2, []int{5, 5}) {
		require.NoError(t, r.Err)
	}
}
