package cache

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/pool"
)

// churn stores and removes keys in a journal of 8 blocks, n times, and
// returns what it should vouch for.
func churn(t *testing.T, j *journal, from, n int) map[int]journalEntry {
	t.Helper()
	for i := from; i < from+n; i++ {
		k, err := pool.NewKey([]byte(fmt.Sprintf("key-%d", i)))
		require.NoError(t, err)
		block := i % 8
		if old, ok := j.live[block]; ok && i%3 == 0 {
			require.NoError(t, j.removed(block, old.key))
			continue
		}
		require.NoError(t, j.stored(block, k, []uint32{uint32(i), uint32(i + 1)}))
	}
	want := map[int]journalEntry{}
	for b, e := range j.live {
		want[b] = e
	}
	return want
}

// Records appended while a compaction runs in the background follow the
// live ones into the new file: the journal read again vouches for exactly
// what the last record of each block says, and the file stays small.
func TestTheJournalCompactsInTheBackground(t *testing.T) {
	dir := t.TempDir()
	shape := journalShape{Blocks: 8, Layers: 2, BlockBytes: 4096}
	j, _, err := openJournal(dir, "id", shape)
	require.NoError(t, err)
	limit := compactAfterLog*8 + 1024
	want := churn(t, j, 0, 5*limit) // several compactions, records queued behind them
	require.NoError(t, j.close())
	st, err := os.Stat(filepath.Join(dir, journalName))
	require.NoError(t, err)
	require.Less(t, st.Size(), int64(2*limit*40), "compacted")
	again, _, err := openJournal(dir, "id", shape)
	require.NoError(t, err)
	require.Equal(t, want, again.live)
	require.NoError(t, again.close())
}

// A compaction that cannot write its new file (here its path is taken by
// a directory, as a full disk would refuse it) keeps the old file and every
// record, warns, and is tried again only much later.
func TestAFailedCompactionLosesNothing(t *testing.T) {
	dir := t.TempDir()
	shape := journalShape{Blocks: 8, Layers: 2, BlockBytes: 4096}
	j, _, err := openJournal(dir, "id", shape)
	require.NoError(t, err)
	require.NoError(t, os.Mkdir(filepath.Join(dir, journalName+".new"), 0o700))
	limit := compactAfterLog*8 + 1024
	want := churn(t, j, 0, 3*limit)
	require.NoError(t, j.close())
	require.Equal(t, 0, len(j.pending))
	require.GreaterOrEqual(t, j.failures, 1)
	require.Less(t, j.failures, 3*limit/10, "retried on every append")
	again, _, err := openJournal(dir, "id", shape)
	require.Error(t, err, "the directory is still in the way of the rewrite at open")
	require.Nil(t, again)
	require.NoError(t, os.Remove(filepath.Join(dir, journalName+".new")))
	again, _, err = openJournal(dir, "id", shape)
	require.NoError(t, err)
	require.Equal(t, want, again.live)
	require.NoError(t, again.close())
}

// holdCompactions makes every compaction wait, as it starts, until the
// returned release is called; started receives once per compaction.
func holdCompactions(t *testing.T) (started <-chan struct{}, release func()) {
	st, rel := make(chan struct{}, 16), make(chan struct{})
	compactStarted = func() { st <- struct{}{}; <-rel }
	var once sync.Once
	release = func() { once.Do(func() { close(rel) }) }
	t.Cleanup(func() { release(); compactStarted = nil })
	return st, release
}

// Records appended while a compaction is held at its start are queued, and
// every one of them reaches the file: in the new file when the compaction
// succeeds, in the old one when it fails.
func TestRecordsQueuedBehindACompactionAreKept(t *testing.T) {
	for _, fails := range []bool{false, true} {
		t.Run(fmt.Sprintf("compaction fails %v", fails), func(t *testing.T) {
			dir := t.TempDir()
			shape := journalShape{Blocks: 8, Layers: 2, BlockBytes: 4096}
			j, _, err := openJournal(dir, "id", shape)
			require.NoError(t, err)
			if fails {
				require.NoError(t, os.Mkdir(filepath.Join(dir, journalName+".new"), 0o700))
			}
			started, release := holdCompactions(t)
			n := 0
			for len(started) == 0 {
				churn(t, j, n, 1)
				n++
				require.Less(t, n, 1<<20, "no compaction started")
			}
			<-started
			want := churn(t, j, n, 40)
			j.mu.Lock()
			queued := len(j.pending)
			j.mu.Unlock()
			require.Positive(t, queued, "records were appended while the compaction was held")
			release()
			require.NoError(t, j.close())
			if fails {
				require.Equal(t, 1, j.failures)
				require.NoError(t, os.Remove(filepath.Join(dir, journalName+".new")))
			}
			again, _, err := openJournal(dir, "id", shape)
			require.NoError(t, err)
			require.Equal(t, want, again.live)
			require.NoError(t, again.close())
		})
	}
}
