// Package crc32c is the CRC32C (Castagnoli) of kvbm's checked bytes: G4
// objects, G3 blocks and metadata. Its values are hash/crc32's with the
// Castagnoli table, byte for byte; only the speed differs. On x86-64 with
// AVX-512 and VPCLMULQDQ a long input is folded 256 bytes at a time with
// carry-less multiplies, past the crc32 instruction's 8 bytes a cycle that
// hash/crc32 is bound by (about twice its speed on CI's AMD EPYC), so that
// checking a block costs a fraction of reading it. Elsewhere (other CPUs,
// other architectures, builds without cgo) and for short inputs it is
// hash/crc32.
package crc32c

import "hash/crc32"

var table = crc32.MakeTable(crc32.Castagnoli)

// foldMin is the shortest input worth the folded path: below it the
// crc32 instruction is as fast and the call into C costs more than it
// saves.
const foldMin = 2048

// Update returns the CRC32C of the bytes whose CRC32C is crc followed by
// p, exactly as crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p).
func Update(crc uint32, p []byte) uint32 {
	if len(p) >= foldMin && folds {
		return ^fold(^crc, p)
	}
	return crc32.Update(crc, table, p)
}

// Checksum returns the CRC32C of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// Implementation names the path long inputs take here, for reports.
func Implementation() string {
	if folds {
		return "folded (AVX-512 VPCLMULQDQ)"
	}
	return "hash/crc32"
}
