package cache

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/pool"
)

// FuzzJournalReplay feeds arbitrary bytes after a valid header to the
// journal's reader: it never panics, every block it vouches for is in
// range with one checksum per layer, no key is held by two blocks, and the
// file it rewrites reads back the same.
func FuzzJournalReplay(f *testing.F) {
	shape := journalShape{Blocks: 8, Layers: 2, BlockBytes: 4096}
	k, _ := pool.NewKey([]byte("key-a"))
	f.Add(encodeRecord(recordStored, 3, journalEntry{key: k, crcs: []uint32{1, 2}}))
	f.Add(append(encodeRecord(recordStored, 3, journalEntry{key: k, crcs: []uint32{1, 2}}),
		encodeRecord(recordRemoved, 3, journalEntry{key: k})...))
	f.Add([]byte{40, 0, 0, 0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, tail []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, journalName)
		require.NoError(t, os.WriteFile(path, append(encodeHeader("id", shape), tail...), 0o600))
		j, reset, err := openJournal(dir, "id", shape)
		require.NoError(t, err)
		require.False(t, reset)
		owners := map[pool.Key]int{}
		for block, e := range j.live {
			require.True(t, block >= 0 && block < int(shape.Blocks))
			require.Len(t, e.crcs, int(shape.Layers))
			_, dup := owners[e.key]
			require.False(t, dup, "key %v held twice", e.key)
			owners[e.key] = block
		}
		live := j.live
		require.NoError(t, j.close())
		again, _, err := openJournal(dir, "id", shape)
		require.NoError(t, err)
		require.Equal(t, live, again.live)
		require.NoError(t, again.close())
	})
}

func TestARecordOfAnotherLayerCountIsNotVouchedFor(t *testing.T) {
	dir := t.TempDir()
	shape := journalShape{Blocks: 8, Layers: 2, BlockBytes: 4096}
	k, err := pool.NewKey([]byte("key-a"))
	require.NoError(t, err)
	body := append(encodeHeader("id", shape), encodeRecord(recordStored, 1, journalEntry{key: k, crcs: []uint32{1, 2, 3}})...)
	require.NoError(t, os.WriteFile(filepath.Join(dir, journalName), body, 0o600))
	j, _, err := openJournal(dir, "id", shape)
	require.NoError(t, err)
	require.Empty(t, j.live)
	require.NoError(t, j.close())
}
