package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kvbm/kvbm/core/object"
)

// s3GetPath is the S3 store's get row; it runs only beside an S3 server.
const s3GetPath = "G4 (S3)→G2 get"

// s3Bench is the S3 store's get, measured when an S3 server is at hand
// (KVBM_S3_BUCKET and AWS_ENDPOINT_URL_S3 set, as scripts/with-s3.sh
// does for `make bench-cmd`): its objects live under a fresh prefix of
// that bucket, removed at close.
type s3Bench struct {
	store  *object.S3Store
	client *minio.Client
	keys   []object.Key
}

// s3FromEnv opens the S3 bench, or returns nil when no server is named.
func s3FromEnv() (*s3Bench, error) {
	bucket, endpoint := os.Getenv("KVBM_S3_BUCKET"), os.Getenv("AWS_ENDPOINT_URL_S3")
	if bucket == "" || endpoint == "" {
		return nil, nil
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	store, err := object.NewS3Store(object.S3Config{Bucket: bucket, Prefix: "kvbm-bench/" + hex.EncodeToString(b[:])})
	if err != nil {
		return nil, fmt.Errorf("S3 bench: %w", err)
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("S3 bench: AWS_ENDPOINT_URL_S3 %q: %w", endpoint, err), store.Close())
	}
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = object.DefaultS3Region
	}
	// The bare client: the same library as the store, with its defaults.
	client, err := minio.New(u.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), os.Getenv("AWS_SESSION_TOKEN")),
		Secure: u.Scheme == "https", Region: region,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("S3 bench: client: %w", err), store.Close())
	}
	return &s3Bench{store: store, client: client}, nil
}

// path is the S3 get of the blocks of dst the parts name, beside bare GETs
// of the same objects (minio-go, one request a block, no header check, no
// checksum) into bufs, at the store's concurrency for each part. The
// objects are put once, untimed, before the first run.
func (s *s3Bench) path(dst object.BlockIO, keys []object.Key, parts [][]int, bufs [][]byte) benchPath {
	ctx := context.Background()
	keysOf := func(part []int) []object.Key {
		ks := make([]object.Key, len(part))
		for i, id := range part {
			ks[i] = keys[id]
		}
		return ks
	}
	var put bool
	ensurePut := func() error {
		if put {
			return nil
		}
		var all []int
		for _, p := range parts {
			all = append(all, p...)
		}
		if err := objectErrors("S3 PutBlocks", s.store.PutBlocksWithLayout(ctx, keysOf(all), dst, all)); err != nil {
			return err
		}
		s.keys, put = keysOf(all), true
		return nil
	}
	get := func() (time.Duration, error) {
		if err := ensurePut(); err != nil {
			return 0, err
		}
		return inParallel(parts, func(part []int) error {
			return objectErrors("S3 GetBlocks", s.store.GetBlocksWithLayout(ctx, keysOf(part), dst, part))
		})
	}
	bare := func() (time.Duration, error) {
		if err := ensurePut(); err != nil {
			return 0, err
		}
		return inParallel(parts, func(part []int) error {
			return s.bareGets(ctx, keys, part, bufs)
		})
	}
	return benchPath{s3GetPath, "bare GET per block", get, bare}
}

// bareGets reads the objects of blocks ids (header and payload, as stored)
// with plain GETs on the store's number of goroutines, the payload into
// bufs[id].
func (s *s3Bench) bareGets(ctx context.Context, keys []object.Key, ids []int, bufs [][]byte) error {
	var next atomic.Int64
	errs := make([]error, object.DefaultS3Concurrency)
	var wg sync.WaitGroup
	for g := range errs {
		wg.Go(func() {
			var head [object.HeaderSize]byte
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ids) {
					return
				}
				id := ids[i]
				o, err := s.client.GetObject(ctx, s.store.Bucket(), s.store.ObjectName(keys[id]), minio.GetObjectOptions{})
				if err == nil {
					if _, err = io.ReadFull(o, head[:]); err == nil {
						_, err = io.ReadFull(o, bufs[id])
					}
					o.Close()
				}
				if err != nil {
					errs[g] = fmt.Errorf("bare GET of block %d: %w", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// close removes the bench's objects and closes the store.
func (s *s3Bench) close() error {
	var err error
	if s.keys != nil {
		err = objectErrors("S3 Delete", s.store.Delete(context.Background(), s.keys))
	}
	return errors.Join(err, s.store.Close())
}
