package crc32c

import (
	"hash/crc32"
	"testing"
)

// BenchmarkChecksum puts the folded CRC32C beside hash/crc32's on the
// same 256 KiB piece (the size a G4 get checks at a time), in the same
// run; the ratio is hash/crc32's time over ours.
func BenchmarkChecksum(b *testing.B) {
	p := make([]byte, 256<<10)
	for i := range p {
		p[i] = byte(i * 31)
	}
	var std, ours float64
	b.Run("hash-crc32", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			crc32.Checksum(p, table)
		}
		std = b.Elapsed().Seconds() / float64(b.N)
	})
	b.Run("kvbm", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			Checksum(p)
		}
		ours = b.Elapsed().Seconds() / float64(b.N)
		if std > 0 {
			b.ReportMetric(std/ours, "x_hash-crc32")
		}
	})
}
