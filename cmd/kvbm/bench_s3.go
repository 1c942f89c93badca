package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvbm/kvbm/core/object"
)

// s3GetPath is the S3 store's get row; it runs only beside an S3 server.
const s3GetPath = "G4 (S3)→G2 get"

// s3Bench is the S3 store's get, measured when an S3 server is at hand
// (KVBM_S3_BUCKET and AWS_ENDPOINT_URL_S3 set, as scripts/with-s3.sh
// does for `make bench-cmd`): its objects live under a fresh prefix of
// that bucket, removed at close.
type s3Bench struct {
	store *object.S3Store
	keys  []object.Key // the objects put, deleted at close
}

// s3FromEnv opens the S3 bench, or returns nil when no server is named.
func s3FromEnv() (*s3Bench, error) {
	bucket := os.Getenv("KVBM_S3_BUCKET")
	if bucket == "" || os.Getenv("AWS_ENDPOINT_URL_S3") == "" {
		return nil, nil
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	store, err := object.NewS3Store(object.S3Config{Bucket: bucket, Prefix: "kvbm-bench/" + hex.EncodeToString(b[:])})
	if err != nil {
		return nil, fmt.Errorf("S3 bench: %w", err)
	}
	return &s3Bench{store: store}, nil
}

// path is the S3 get of the blocks of dst the parts name, beside bare GETs
// of the same objects (minio-go, one request a block, no header check, no
// checksum) into bufs, at the store's concurrency for each part. The
// objects are put once, untimed, before the first run.
func (s *s3Bench) path(dst object.BlockIO, keysOf func(ids []int) []object.Key, parts [][]int, bufs [][]byte) benchPath {
	ctx := context.Background()
	ensurePut := func() error {
		if s.keys != nil {
			return nil
		}
		var all []int
		for _, p := range parts {
			all = append(all, p...)
		}
		if err := objectErrors("S3 PutBlocks", s.store.PutBlocksWithLayout(ctx, keysOf(all), dst, all)); err != nil {
			return err
		}
		s.keys = keysOf(all)
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
			return s.bareGets(ctx, keysOf(part), part, bufs)
		})
	}
	return benchPath{s3GetPath, "bare GET per block", get, bare}
}

// bareGets reads the objects keys of blocks ids (header and payload, as stored)
// with plain GETs through the store's own client (the same endpoint and
// transport) on the store's number of goroutines, the payload into
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
				o, err := s.store.Client().GetObject(ctx, s.store.Bucket(), s.store.ObjectName(keys[i]), minio.GetObjectOptions{})
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
