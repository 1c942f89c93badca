package worker

import (
	"context"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/internal/s3test"
)

// A worker whose ObjectDir is an s3:// location offloads to and onboards
// from S3; when its server is killed and started again, the same worker
// recovers; another key's object copied under a key fails that block as
// corrupt data, its destination untouched.
func TestStandaloneOnS3(t *testing.T) {
	srv := s3test.StartPrivate(t)
	bucket := srv.NewBucket(t)
	drv := newDriver(t)
	const rank = 3
	pw, err := NewStandalone(StandaloneConfig{WorkerID: 1, Driver: drv, Rank: rank,
		ObjectDir: "s3://" + bucket + "/deploy/llama?endpoint=" + srv.Endpoint,
		S3:        object.S3Config{AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, OpTimeout: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pw.Close()) })
	w := &testWorker{PhysicalWorker: pw}
	_, err = w.AllocateG2(testConfig(16), transfer.FullyContiguous)
	require.NoError(t, err)
	size := testConfig(1).BlockSize()
	keys := make([]object.Key, 3)
	for i := range keys {
		keys[i], err = object.NewKey([]byte{byte(i), 0xE4})
		require.NoError(t, err)
		w.write(t, G2, i, pattern(size, uint64(500+i)))
	}
	ctx := context.Background()
	for _, r := range w.PutBlocks(ctx, keys, G2, []int{0, 1, 2}) {
		require.NoError(t, r.Err)
	}
	// Objects are namespaced by the location's prefix and the rank.
	_, err = srv.Client(t).StatObject(ctx, bucket, "deploy/llama/3/"+keys[0].String(), minio.StatObjectOptions{})
	require.NoError(t, err)

	srv.Stop()
	for _, r := range w.GetBlocks(ctx, keys, G2, []int{4, 5, 6}) {
		require.Error(t, r.Err)
	}
	srv.Start()
	for _, r := range w.GetBlocks(ctx, keys, G2, []int{4, 5, 6}) {
		require.NoError(t, r.Err)
	}
	for i := range keys {
		require.Equal(t, pattern(size, uint64(500+i)), w.read(t, G2, 4+i))
	}

	_, err = srv.Client(t).CopyObject(ctx,
		minio.CopyDestOptions{Bucket: bucket, Object: "deploy/llama/3/" + keys[1].String()},
		minio.CopySrcOptions{Bucket: bucket, Object: "deploy/llama/3/" + keys[0].String()})
	require.NoError(t, err)
	guard := pattern(size, 999)
	for id := 8; id < 11; id++ {
		w.write(t, G2, id, guard)
	}
	n, err := w.ExecuteRemoteOnboard(RemoteObjects(keys), G2, []int{8, 9, 10}, transfer.Options{})
	require.NoError(t, err)
	err = n.WaitTimeout(-1)
	require.ErrorIs(t, err, object.ErrCorrupt)
	require.Equal(t, []int{9}, n.FailedBlocks())
	require.Equal(t, guard, w.read(t, G2, 9), "the refused object's destination is untouched")
	require.Equal(t, pattern(size, 500), w.read(t, G2, 8))
	has := w.HasBlocks(ctx, keys)
	require.ErrorIs(t, has[1].Err, object.ErrCorrupt)
	require.True(t, has[2].Found)
}
