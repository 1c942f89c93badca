package object

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvbm/kvbm/internal/s3test"
)

// bareConcurrently runs do(0) to do(n-1) on limit goroutines, the
// concurrency the store is given, and returns the first error.
func bareConcurrently(n, limit int, do func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := do(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	wg.Wait()
	return first
}

// BenchmarkS3PutGet moves 256 blocks of 2 MiB (a Llama-3-8B block of 16
// tokens) to and from an S3Store on the server `make bench` starts, and in
// the same iteration PUTs and GETs the same bytes with the same client
// library (minio-go's PutObject and GetObject, one object per block, no
// header, no checks) at the same concurrency, the limit the store is
// measured against. A second GET baseline also does what verifying before
// writing costs: each GET into a buffer of its own, a CRC32C of it, then a
// copy into the destination block. Reported: throughputs in MB/s and the
// ratios baseline time / store time (1 = as fast as the baseline; the
// issue asks for at least 0.9 of bare requests). -short moves 32 blocks.
func BenchmarkS3PutGet(b *testing.B) {
	const blockSize = 2 << 20
	n := 256
	if testing.Short() {
		n = 32
	}
	srv := s3test.Shared(b)
	bucket := srv.NewBucket(b)
	s, err := NewS3Store(S3Config{Bucket: bucket, Prefix: "bench", HasRank: true, Endpoint: srv.Endpoint,
		Region: srv.Region, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	client := srv.Client(b)
	conc := s.concurrency

	src, err := NewMemoryBlocks(n, blockSize)
	if err != nil {
		b.Fatal(err)
	}
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + i>>13)
	}
	dst, err := NewMemoryBlocks(n, blockSize)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]Key, n)
	bare := make([]string, n)
	for i := range keys {
		keys[i], err = NewKey(fmt.Appendf(nil, "bench-block-%04d", i))
		if err != nil {
			b.Fatal(err)
		}
		bare[i] = "bare/" + keys[i].String()
	}
	ids := seq(0, n)
	wantCRC := make([]uint32, n)
	for i := range wantCRC {
		wantCRC[i] = payloadCRC(src.Block(i))
	}
	ctx := context.Background()

	var put, get, barePut, bareGet, bareGetVerify time.Duration
	verifyBufs := make(chan []byte, conc)
	for range conc {
		verifyBufs <- make([]byte, blockSize)
	}
	b.SetBytes(int64(n) * blockSize)
	for b.Loop() {
		// Each iteration writes new objects: a put over its own earlier
		// object would be answered by the conditional PUT's 412.
		for _, r := range s.Delete(ctx, keys) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		t0 := time.Now()
		for _, r := range s.PutBlocksWithLayout(ctx, keys, src, ids) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		t1 := time.Now()
		for _, r := range s.GetBlocksWithLayout(ctx, keys, dst, ids) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		t2 := time.Now()
		if err := bareConcurrently(n, conc, func(i int) error {
			_, err := client.PutObject(ctx, bucket, bare[i], bytes.NewReader(src.Block(i)), blockSize,
				minio.PutObjectOptions{ContentType: "application/octet-stream"})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if err := bareConcurrently(n, conc, func(i int) error {
			o, err := client.GetObject(ctx, bucket, bare[i], minio.GetObjectOptions{})
			if err != nil {
				return err
			}
			defer o.Close()
			_, err = io.ReadFull(o, dst.Block(i))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		if err := bareConcurrently(n, conc, func(i int) error {
			buf := <-verifyBufs
			defer func() { verifyBufs <- buf }()
			o, err := client.GetObject(ctx, bucket, bare[i], minio.GetObjectOptions{})
			if err != nil {
				return err
			}
			defer o.Close()
			if _, err = io.ReadFull(o, buf); err != nil {
				return err
			}
			if payloadCRC(buf) != wantCRC[i] {
				return fmt.Errorf("block %d: crc32c mismatch", i)
			}
			copy(dst.Block(i), buf)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		t5 := time.Now()
		bareGetVerify += t5.Sub(t4)
		put += t1.Sub(t0)
		get += t2.Sub(t1)
		barePut += t3.Sub(t2)
		bareGet += t4.Sub(t3)
	}
	b.StopTimer()
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		b.Fatal("blocks read back differ from blocks written")
	}
	mbps := func(d time.Duration) float64 {
		return float64(b.N) * float64(n) * blockSize / 1e6 / d.Seconds()
	}
	b.ReportMetric(mbps(put), "put-MB/s")
	b.ReportMetric(mbps(barePut), "bare-put-MB/s")
	b.ReportMetric(mbps(get), "get-MB/s")
	b.ReportMetric(mbps(bareGet), "bare-get-MB/s")
	b.ReportMetric(mbps(bareGetVerify), "bare-get+crc+copy-MB/s")
	b.ReportMetric(barePut.Seconds()/put.Seconds(), "put/bare-put")
	b.ReportMetric(bareGet.Seconds()/get.Seconds(), "get/bare-get")
	b.ReportMetric(bareGetVerify.Seconds()/get.Seconds(), "get/bare-get+crc+copy")
}

// BenchmarkS3HasBlocks asks HasBlocks about 1,024 keys (768 present, 256
// missing) and, in the same iteration, issues one bare HEAD (minio-go's
// StatObject) per key at the same concurrency, the limit it is measured
// against. Reported: the times per key and the ratio store time / bare
// time (the issue asks for at most 2).
func BenchmarkS3HasBlocks(b *testing.B) {
	const n, present, blockSize = 1024, 768, 4096
	srv := s3test.Shared(b)
	bucket := srv.NewBucket(b)
	s, err := NewS3Store(S3Config{Bucket: bucket, Prefix: "bench", HasRank: true, Endpoint: srv.Endpoint,
		Region: srv.Region, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	client := srv.Client(b)
	keys := make([]Key, n)
	for i := range keys {
		keys[i], err = NewKey(fmt.Appendf(nil, "has-%05d", i))
		if err != nil {
			b.Fatal(err)
		}
	}
	src, err := NewMemoryBlocks(present, blockSize)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, r := range s.PutBlocksWithLayout(ctx, keys[:present], src, seq(0, present)) {
		if r.Err != nil {
			b.Fatal(r.Err)
		}
	}

	var has, head time.Duration
	for b.Loop() {
		t0 := time.Now()
		found := 0
		for _, p := range s.HasBlocks(ctx, keys) {
			if p.Err != nil {
				b.Fatal(p.Err)
			}
			if p.Found {
				found++
			}
		}
		t1 := time.Now()
		var heads atomic.Int64
		if err := bareConcurrently(n, s.concurrency, func(i int) error {
			_, err := client.StatObject(ctx, bucket, s.ObjectName(keys[i]), minio.StatObjectOptions{})
			if err == nil {
				heads.Add(1)
			} else if minio.ToErrorResponse(err).StatusCode != 404 {
				return err
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if found != present || heads.Load() != present {
			b.Fatalf("found %d by HasBlocks and %d by HEAD, want %d", found, heads.Load(), present)
		}
		has += t1.Sub(t0)
		head += t2.Sub(t1)
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) / n }
	b.ReportMetric(per(has), "has-us/key")
	b.ReportMetric(per(head), "bare-head-us/key")
	b.ReportMetric(has.Seconds()/head.Seconds(), "has/bare-head")
}
