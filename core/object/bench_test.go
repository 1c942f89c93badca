package object

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkPutGet moves 256 blocks of 2 MiB (a Llama-3-8B block of 16
// tokens) to and from an FSStore in the benchmark's temporary directory, and
// in the same iteration writes and reads the same bytes as plain files with
// os.WriteFile and os.ReadFile (one file per block, one at a time, no
// fsync), the limit the store is measured against. A second baseline adds
// an fsync per file, the durability the store pays for. Reported:
// throughputs in MB/s and time ratios store/baseline (1 = as fast as the
// baseline). -short moves 32 blocks.
//
// Reads of both come from the page cache, since both were just written.
func BenchmarkPutGet(b *testing.B) {
	const blockSize = 2 << 20
	n := 256
	if testing.Short() {
		n = 32
	}
	dir := b.TempDir()
	s, err := NewFSStore(FSConfig{Dir: filepath.Join(dir, "store"), HasRank: true, Rank: 0})
	if err != nil {
		b.Fatal(err)
	}
	plainDir := filepath.Join(dir, "plain")
	if err := os.Mkdir(plainDir, 0o755); err != nil {
		b.Fatal(err)
	}

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
	plainPaths := make([]string, n)
	for i := range keys {
		keys[i], err = NewKey(fmt.Appendf(nil, "bench-block-%04d", i))
		if err != nil {
			b.Fatal(err)
		}
		plainPaths[i] = filepath.Join(plainDir, keys[i].String())
	}
	ids := seq(0, n)
	ctx := context.Background()

	var put, get, write, writeSync, read time.Duration
	b.SetBytes(int64(n) * blockSize)
	for b.Loop() {
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
		for i, p := range plainPaths {
			if err := os.WriteFile(p, src.Block(i), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		for i, p := range plainPaths {
			got, err := os.ReadFile(p)
			if err != nil {
				b.Fatal(err)
			}
			copy(dst.Block(i), got)
		}
		t4 := time.Now()
		for i, p := range plainPaths {
			if err := writeFileSync(p, src.Block(i)); err != nil {
				b.Fatal(err)
			}
		}
		t5 := time.Now()
		put += t1.Sub(t0)
		get += t2.Sub(t1)
		write += t3.Sub(t2)
		read += t4.Sub(t3)
		writeSync += t5.Sub(t4)
	}
	b.StopTimer()
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		b.Fatal("blocks read back differ from blocks written")
	}

	mbps := func(d time.Duration) float64 {
		return float64(b.N) * float64(n) * blockSize / 1e6 / d.Seconds()
	}
	b.ReportMetric(mbps(put), "put-MB/s")
	b.ReportMetric(mbps(get), "get-MB/s")
	b.ReportMetric(mbps(write), "writefile-MB/s")
	b.ReportMetric(mbps(writeSync), "writefile+fsync-MB/s")
	b.ReportMetric(mbps(read), "readfile-MB/s")
	b.ReportMetric(put.Seconds()/write.Seconds(), "put/writefile")
	b.ReportMetric(put.Seconds()/writeSync.Seconds(), "put/writefile+fsync")
	b.ReportMetric(get.Seconds()/read.Seconds(), "get/readfile")
}

// writeFileSync is os.WriteFile followed by an fsync of the file.
func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
