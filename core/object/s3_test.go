package object

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/internal/s3test"
)

// newS3TestStore opens a store on a fresh bucket of srv (rank 0, prefix
// "deploy/model"), closed when the test ends.
func newS3TestStore(t *testing.T, srv s3test.Server, cfg S3Config) *S3Store {
	t.Helper()
	if cfg.Bucket == "" {
		cfg.Bucket = srv.NewBucket(t)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "deploy/model"
		cfg.HasRank = true
	}
	cfg.Endpoint, cfg.Region = srv.Endpoint, srv.Region
	if cfg.AccessKeyID == "" {
		cfg.AccessKeyID, cfg.SecretAccessKey = srv.AccessKey, srv.SecretKey
	}
	s, err := NewS3Store(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// rawPut stores bytes under key's object name, bypassing the store, with
// the metadata the store would give them when withMeta.
func rawPut(t *testing.T, srv s3test.Server, s *S3Store, key Key, b []byte, withMeta bool) {
	t.Helper()
	var opts minio.PutObjectOptions
	if withMeta && len(b) >= HeaderSize {
		h, err := decodeHeader(b[:HeaderSize])
		require.NoError(t, err)
		opts.UserMetadata = map[string]string{metaName: objectMeta(h.key, int(h.length), h.crc)}
	}
	_, err := srv.Client(t).PutObject(context.Background(), s.Bucket(), s.ObjectName(key),
		bytes.NewReader(b), int64(len(b)), opts)
	require.NoError(t, err)
}

// rawCopy copies from's object, metadata included, to key's name, as a
// server-side copy by an operator would.
func rawCopy(t *testing.T, srv s3test.Server, s *S3Store, from, key Key) {
	t.Helper()
	_, err := srv.Client(t).CopyObject(context.Background(),
		minio.CopyDestOptions{Bucket: s.Bucket(), Object: s.ObjectName(key)},
		minio.CopySrcOptions{Bucket: s.Bucket(), Object: s.ObjectName(from)})
	require.NoError(t, err)
}

// rawGet returns the bytes of key's object, bypassing the store.
func rawGet(t *testing.T, srv s3test.Server, s *S3Store, key Key) []byte {
	t.Helper()
	o, err := srv.Client(t).GetObject(context.Background(), s.Bucket(), s.ObjectName(key), minio.GetObjectOptions{})
	require.NoError(t, err)
	defer o.Close()
	b, err := io.ReadAll(o)
	require.NoError(t, err)
	return b
}

// Every byte of every block comes back, for keys of every length, and
// HasBlocks reports each payload's size.
func TestS3RoundTrip(t *testing.T) {
	srv := s3test.Shared(t)
	s := newS3TestStore(t, srv, S3Config{Concurrency: 4})
	const n = 64
	keys := testKeys(t, n, "s3-round-trip")
	src := randomBlocks(t, n, testBlockSize, 12)
	ctx := context.Background()
	requireAllOK(t, keys, s.PutBlocksWithLayout(ctx, keys, src, seq(0, n)))

	for i, p := range s.HasBlocks(ctx, keys) {
		require.Equal(t, keys[i], p.Key)
		require.NoError(t, p.Err, "key %d", i)
		require.True(t, p.Found, "key %d", i)
		require.EqualValues(t, testBlockSize, p.Size)
	}
	// Into a destination of n+2 guarded blocks, reversed: block 0 and the
	// last stay untouched.
	dst := guardedBlocks(t, n+2, testBlockSize)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = n - i
	}
	requireAllOK(t, keys, s.GetBlocksWithLayout(ctx, keys, dst, ids))
	for i := range keys {
		requireSameBlock(t, src.Block(i), dst.Block(ids[i]), "block %d", i)
	}
	requireGuarded(t, dst.Block(0), "guard block 0")
	requireGuarded(t, dst.Block(n+1), "guard block %d", n+1)

	// The object is the FSStore's format, under prefix/rank/hex key.
	obj := rawGet(t, srv, s, keys[5])
	k, payload, err := decodeObject(obj)
	require.NoError(t, err)
	require.Equal(t, keys[5], k)
	requireSameBlock(t, src.Block(5), payload, "raw object 5")
	require.Equal(t, "deploy/model/0/"+keys[5].String(), s.ObjectName(keys[5]))

	// A put over existing objects with other bytes replaces them.
	src2 := randomBlocks(t, n, testBlockSize, 13)
	requireAllOK(t, keys, s.PutBlocksWithLayout(ctx, keys, src2, seq(0, n)))
	requireAllOK(t, keys, s.GetBlocksWithLayout(ctx, keys, dst, ids))
	for i := range keys {
		requireSameBlock(t, src2.Block(i), dst.Block(ids[i]), "replaced block %d", i)
	}

	requireAllOK(t, keys, s.Delete(ctx, keys))
	requireAllOK(t, keys, s.Delete(ctx, keys)) // already gone: still fine
	for _, p := range s.HasBlocks(ctx, keys) {
		require.NoError(t, p.Err)
		require.False(t, p.Found)
	}
	for _, r := range s.GetBlocksWithLayout(ctx, keys[:1], dst, []int{0}) {
		require.ErrorIs(t, r.Err, ErrNotFound)
	}
}

// Two ranks, and two prefixes, sharing a bucket never see each other's
// objects.
func TestS3NamespacesDoNotCollide(t *testing.T) {
	srv := s3test.Shared(t)
	bucket := srv.NewBucket(t)
	a := newS3TestStore(t, srv, S3Config{Bucket: bucket, Prefix: "m1", HasRank: true, Rank: 0})
	b := newS3TestStore(t, srv, S3Config{Bucket: bucket, Prefix: "m1", HasRank: true, Rank: 1})
	c := newS3TestStore(t, srv, S3Config{Bucket: bucket, Prefix: "m2", HasRank: true, Rank: 0})
	keys := testKeys(t, 2, "ns")
	ctx := context.Background()
	requireAllOK(t, keys, a.PutBlocksWithLayout(ctx, keys, randomBlocks(t, 2, testBlockSize, 1), seq(0, 2)))
	for _, other := range []*S3Store{b, c} {
		for _, p := range other.HasBlocks(ctx, keys) {
			require.NoError(t, p.Err)
			require.False(t, p.Found, other.Location())
		}
	}
}

// 16 writers of one key at once, with different bytes, leave one whole
// object: one of theirs, and all of them succeed. With the same bytes
// (what writers of one key normally hold) the conditional PUT keeps the
// first object.
func TestS3ConcurrentWritersOfOneKey(t *testing.T) {
	srv := s3test.Shared(t)
	s := newS3TestStore(t, srv, S3Config{})
	const writers = 16
	key := testKeys(t, 1, "contended")[0]
	ctx := context.Background()
	for _, same := range []bool{false, true} {
		srcs := make([]*MemoryBlocks, writers)
		for w := range srcs {
			seed := uint64(100 + w)
			if same {
				seed = 7
			}
			srcs[w] = randomBlocks(t, 1, 64<<10, seed)
		}
		var wg sync.WaitGroup
		errs := make([]error, writers)
		start := make(chan struct{})
		for w := range writers {
			wg.Go(func() {
				<-start
				errs[w] = s.PutBlocksWithLayout(ctx, []Key{key}, srcs[w], []int{0})[0].Err
			})
		}
		close(start)
		wg.Wait()
		for w, err := range errs {
			require.NoError(t, err, "writer %d (same bytes: %v)", w, same)
		}
		dst := guardedBlocks(t, 1, 64<<10)
		requireAllOK(t, []Key{key}, s.GetBlocksWithLayout(ctx, []Key{key}, dst, []int{0}))
		matched := -1
		for w := range srcs {
			if bytes.Equal(srcs[w].Block(0), dst.Block(0)) {
				matched = w
				break
			}
		}
		require.GreaterOrEqual(t, matched, 0, "the object is none of the writers' blocks (same bytes: %v)", same)
		require.NoError(t, s.Delete(ctx, []Key{key})[0].Err)
	}
}

// HasBlocks tells missing (not found, no error), present (found, size) and
// corrupt (not found, ErrCorrupt) objects apart, each on its own.
func TestS3HasBlocks(t *testing.T) {
	srv := s3test.Shared(t)
	s := newS3TestStore(t, srv, S3Config{})
	keys := testKeys(t, 7, "has")
	ctx := context.Background()
	src := randomBlocks(t, 2, testBlockSize, 3)
	requireAllOK(t, keys[:2], s.PutBlocksWithLayout(ctx, keys[:2], src, seq(0, 2)))
	// keys[2]: missing. keys[3..6]: corrupt in four ways.
	good := encodeObject(keys[3], src.Block(0))
	rawPut(t, srv, s, keys[3], good[:HeaderSize+100], true) // truncated, its metadata recording the whole
	rawPut(t, srv, s, keys[4], []byte("not an object"), false)
	rawCopy(t, srv, s, keys[0], keys[5])    // another key's valid object, with its metadata
	rawPut(t, srv, s, keys[6], good, false) // a valid object without the store's metadata

	ps := s.HasBlocks(ctx, keys)
	require.Len(t, ps, len(keys))
	for i, p := range ps {
		require.Equal(t, keys[i], p.Key)
	}
	for i := range 2 {
		require.NoError(t, ps[i].Err)
		require.True(t, ps[i].Found)
		require.EqualValues(t, testBlockSize, ps[i].Size)
	}
	require.NoError(t, ps[2].Err)
	require.False(t, ps[2].Found)
	for i := 3; i < 7; i++ {
		require.ErrorIs(t, ps[i].Err, ErrCorrupt, "key %d", i)
		require.False(t, ps[i].Found, "key %d", i)
	}
	require.ErrorContains(t, ps[3].Err, "length mismatch")
	require.ErrorContains(t, ps[4].Err, "no x-amz-meta-kvbm-object")
	require.ErrorContains(t, ps[5].Err, "holds the object of key "+keys[0].String())
	require.ErrorContains(t, ps[6].Err, "no x-amz-meta-kvbm-object")
}

// A corrupt object, or another key's valid object under this key, fails
// its block with ErrCorrupt while the other blocks of the batch load. A
// damaged header or another key's object is refused before any payload
// byte lands; a damaged payload is streamed into the destination and then
// refused: the block holds what landed, yet is reported failed.
func TestS3CorruptAndForeignObjectsFailTheirBlock(t *testing.T) {
	srv := s3test.Shared(t)
	s := newS3TestStore(t, srv, S3Config{})
	keys := testKeys(t, 5, "corrupt")
	ctx := context.Background()
	src := randomBlocks(t, 5, testBlockSize, 4)
	requireAllOK(t, keys, s.PutBlocksWithLayout(ctx, keys, src, seq(0, 5)))

	// Damage that HEAD cannot see (metadata as the store writes it) is
	// found by Get's checks of the bytes.
	flipped := encodeObject(keys[1], src.Block(1))
	flipped[HeaderSize+testBlockSize/2] ^= 0x40
	rawPut(t, srv, s, keys[1], flipped, true)
	rawCopy(t, srv, s, keys[0], keys[2])
	header := encodeObject(keys[3], src.Block(3))
	rawPut(t, srv, s, keys[3], header, true)
	header[9] ^= 0x01 // the length, under the header's CRC
	rawPut(t, srv, s, keys[3], header, false)

	dst := guardedBlocks(t, 5, testBlockSize)
	res := s.GetBlocksWithLayout(ctx, keys, dst, seq(0, 5))
	require.Len(t, res, 5)
	for _, i := range []int{0, 4} {
		require.NoError(t, res[i].Err)
		requireSameBlock(t, src.Block(i), dst.Block(i), "block %d", i)
	}
	for _, i := range []int{1, 2, 3} {
		require.ErrorIs(t, res[i].Err, ErrCorrupt, "block %d", i)
	}
	requireSameBlock(t, flipped[HeaderSize:], dst.Block(1), "the damaged payload landed in block 1")
	for _, i := range []int{2, 3} {
		requireGuarded(t, dst.Block(i), "block %d", i)
	}

	// Into a destination that lends no memory (device memory), a damaged
	// payload is checked in a buffer and never written.
	bounce := &probeBlocks{MemoryBlocks: guardedBlocks(t, 5, testBlockSize)}
	res = s.GetBlocksWithLayout(ctx, keys, bounce, seq(0, 5))
	for _, i := range []int{0, 4} {
		require.NoError(t, res[i].Err)
		requireSameBlock(t, src.Block(i), bounce.Block(i), "bounced block %d", i)
	}
	for _, i := range []int{1, 2, 3} {
		require.ErrorIs(t, res[i].Err, ErrCorrupt, "bounced block %d", i)
		requireGuarded(t, bounce.Block(i), "bounced block %d", i)
	}
	require.ErrorContains(t, res[1].Err, "crc32c mismatch")
	require.ErrorContains(t, res[2].Err, "holds the object of key "+keys[0].String())
	require.ErrorContains(t, res[3].Err, "header crc32c mismatch")

	// A put repairs a corrupt object whose metadata differs from the
	// block's: the conditional PUT finds it, and it is replaced. (keys[1]'s
	// damage is under metadata that matches: it stays until deleted.)
	requireAllOK(t, keys[1:2], s.Delete(ctx, keys[1:2]))
	requireAllOK(t, keys[1:4], s.PutBlocksWithLayout(ctx, keys[1:4], src, seq(1, 3)))
	requireAllOK(t, keys, s.GetBlocksWithLayout(ctx, keys, dst, seq(0, 5)))
	for i := range keys {
		requireSameBlock(t, src.Block(i), dst.Block(i), "repaired block %d", i)
	}
}

// Wrong credentials are refused when the store opens, with a message that
// says so and names the variables to check; so are a missing bucket and
// missing credentials.
func TestS3RefusesBadConfiguration(t *testing.T) {
	srv := s3test.Shared(t)
	bucket := srv.NewBucket(t)
	for _, tc := range []struct {
		name    string
		id, key string
	}{
		{"wrong secret", srv.AccessKey, "not-the-secret"},
		{"unknown access key", "nobody", srv.SecretKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewS3Store(S3Config{Bucket: bucket, Endpoint: srv.Endpoint, Region: srv.Region,
				AccessKeyID: tc.id, SecretAccessKey: tc.key, OpTimeout: 5 * time.Second})
			require.ErrorIs(t, err, ErrIO)
			require.ErrorContains(t, err, "credentials refused")
			require.ErrorContains(t, err, "AWS_ACCESS_KEY_ID")
			require.ErrorContains(t, err, bucket)
		})
	}
	_, err := NewS3Store(S3Config{Bucket: "kvbm-no-such-bucket", Endpoint: srv.Endpoint, Region: srv.Region,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey})
	require.ErrorIs(t, err, ErrIO)
	require.ErrorContains(t, err, `bucket "kvbm-no-such-bucket" does not exist`)

	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	_, err = NewS3Store(S3Config{Bucket: bucket, Endpoint: srv.Endpoint})
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "no credentials")
}

// gatedTransport passes requests to the network, except that the first PUT
// body it sees stops after half its bytes and tells the test, which then
// decides what happens to the server before letting it go on.
type gatedTransport struct {
	next    http.RoundTripper
	once    sync.Once
	reached chan struct{} // closed when the first PUT is half sent
	release chan struct{} // closed by the test
}

func (g *gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPut && req.Body != nil && req.ContentLength > 0 {
		gate := false
		g.once.Do(func() { gate = true })
		if gate {
			req.Body = &gatedBody{ReadCloser: req.Body, left: req.ContentLength / 2, g: g}
		}
	}
	return g.next.RoundTrip(req)
}

type gatedBody struct {
	io.ReadCloser
	left int64
	g    *gatedTransport
	done bool
}

func (b *gatedBody) Read(p []byte) (int, error) {
	if !b.done && b.left <= 0 {
		b.done = true
		close(b.g.reached)
		<-b.g.release
	}
	if !b.done && int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// The server killed while half an object's bytes have reached it: the put
// fails within its deadline, and once the server is back the object is
// absent, not partial. The store then works again without being reopened.
func TestS3ServerStoppedMidPut(t *testing.T) {
	srv := s3test.StartPrivate(t)
	tr, err := minio.DefaultTransport(false)
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	gate := &gatedTransport{next: tr, reached: make(chan struct{}), release: make(chan struct{})}
	const opTimeout = 3 * time.Second
	s := newS3TestStore(t, srv.Server, S3Config{Transport: gate, OpTimeout: opTimeout})
	ctx := context.Background()
	const blockSize = 1 << 20
	keys := testKeys(t, 1, "mid-put")
	src := randomBlocks(t, 1, blockSize, 5)

	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.PutBlocksWithLayout(ctx, keys, src, []int{0})[0].Err }()
	select {
	case <-gate.reached:
	case err := <-done:
		t.Fatalf("put finished before half its body was sent: %v", err)
	}
	srv.Stop()
	close(gate.release)
	err = <-done
	elapsed := time.Since(start)
	require.Error(t, err)
	require.Less(t, elapsed, opTimeout+2*time.Second, "the put failed after its deadline: %v", err)
	t.Logf("put failed after %v: %v", elapsed, err)

	srv.Start()
	p := s.HasBlocks(ctx, keys)[0]
	require.NoError(t, p.Err)
	require.False(t, p.Found, "a partial object is visible after the restart")
	require.ErrorIs(t, s.GetBlocksWithLayout(ctx, keys, guardedBlocks(t, 1, blockSize), []int{0})[0].Err, ErrNotFound)

	// The same store, not reopened, works again.
	requireAllOK(t, keys, s.PutBlocksWithLayout(ctx, keys, src, []int{0}))
	dst := guardedBlocks(t, 1, blockSize)
	requireAllOK(t, keys, s.GetBlocksWithLayout(ctx, keys, dst, []int{0}))
	requireSameBlock(t, src.Block(0), dst.Block(0), "after restart")
}

// While the server is down every call fails, each block within its
// deadline and with an error of its own; when it is back, the same store
// serves the objects stored before and takes new ones.
func TestS3RecoversAfterServerRestart(t *testing.T) {
	srv := s3test.StartPrivate(t)
	const opTimeout = 2 * time.Second
	s := newS3TestStore(t, srv.Server, S3Config{OpTimeout: opTimeout, Concurrency: 4})
	ctx := context.Background()
	keys := testKeys(t, 8, "restart")
	src := randomBlocks(t, 8, testBlockSize, 6)
	requireAllOK(t, keys[:4], s.PutBlocksWithLayout(ctx, keys[:4], src, seq(0, 4)))

	srv.Stop()
	start := time.Now()
	res := s.PutBlocksWithLayout(ctx, keys[4:], src, seq(4, 4))
	for i, r := range res {
		require.Error(t, r.Err, "block %d put while the server is down", i)
		require.Equal(t, keys[4+i], r.Key)
	}
	for _, p := range s.HasBlocks(ctx, keys[:1]) {
		require.Error(t, p.Err)
		require.False(t, p.Found)
	}
	// Two batches of blocks at concurrency 4: each block within its deadline.
	require.Less(t, time.Since(start), 2*opTimeout+2*time.Second)

	srv.Start()
	requireAllOK(t, keys[4:], s.PutBlocksWithLayout(ctx, keys[4:], src, seq(4, 4)))
	dst := guardedBlocks(t, 8, testBlockSize)
	requireAllOK(t, keys, s.GetBlocksWithLayout(ctx, keys, dst, seq(0, 8)))
	for i := range keys {
		requireSameBlock(t, src.Block(i), dst.Block(i), "block %d", i)
	}
}

// A canceled batch stops: blocks not started fail with the context's error.
func TestS3ContextCanceled(t *testing.T) {
	srv := s3test.Shared(t)
	s := newS3TestStore(t, srv, S3Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	keys := testKeys(t, 3, "canceled")
	for _, r := range s.PutBlocksWithLayout(ctx, keys, randomBlocks(t, 3, testBlockSize, 1), seq(0, 3)) {
		require.ErrorIs(t, r.Err, context.Canceled)
	}
	for _, p := range s.HasBlocks(context.Background(), keys) {
		require.NoError(t, p.Err)
		require.False(t, p.Found)
	}
}

// countingTransport counts requests by method.
type countingTransport struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    map[string]int
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[req.Method]++
	c.mu.Unlock()
	return c.next.RoundTrip(req)
}

func (c *countingTransport) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// A put of a block already stored sends one conditional PUT, which the
// server refuses, and one HEAD that finds the same block: nothing is
// written again. A put of other bytes under the key replaces the object
// with a second, unconditional PUT.
func TestS3PutDedupes(t *testing.T) {
	srv := s3test.Shared(t)
	tr, err := minio.DefaultTransport(false)
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	count := &countingTransport{next: tr, n: map[string]int{}}
	s := newS3TestStore(t, srv, S3Config{Transport: count})
	keys := testKeys(t, 4, "dedupe")
	src := randomBlocks(t, 4, testBlockSize, 8)
	ctx := context.Background()
	count.take()
	requireAllOK(t, keys, s.PutBlocksWithLayout(ctx, keys, src, seq(0, 4)))
	require.Equal(t, map[string]int{http.MethodPut: 4}, count.take())

	requireAllOK(t, keys, s.PutBlocksWithLayout(ctx, keys, src, seq(0, 4)))
	require.Equal(t, map[string]int{http.MethodPut: 4, http.MethodHead: 4}, count.take(),
		"a stored block is put again only conditionally")

	other := randomBlocks(t, 4, testBlockSize, 9)
	requireAllOK(t, keys, s.PutBlocksWithLayout(ctx, keys, other, seq(0, 4)))
	require.Equal(t, map[string]int{http.MethodPut: 8, http.MethodHead: 4}, count.take())
	dst := guardedBlocks(t, 4, testBlockSize)
	requireAllOK(t, keys, s.GetBlocksWithLayout(ctx, keys, dst, seq(0, 4)))
	requireSameBlock(t, other.Bytes(), dst.Bytes(), "replaced blocks")
}
