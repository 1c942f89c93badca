package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every length around the fold's steps, at every alignment of a 64-byte
// line, from random running values: the same value as hash/crc32.
func TestUpdateIsHashCRC32Castagnoli(t *testing.T) {
	if !Folded() {
		t.Log("this CPU takes hash/crc32's path for every length")
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 9000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 0; n <= 4200; n++ {
		off := n % 64
		p := buf[off : off+n]
		crc := r.Uint32()
		require.Equal(t, crc32.Update(crc, table, p), Update(crc, p), "length %d at offset %d from 0x%08x", n, off, crc)
	}
	require.Equal(t, crc32.Checksum(buf, table), Checksum(buf))
}

// A folded update split anywhere continues exactly as one update.
func TestUpdateInPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 1<<20+37)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	want := crc32.Checksum(buf, table)
	for range 50 {
		cut := r.IntN(len(buf))
		require.Equal(t, want, Update(Checksum(buf[:cut]), buf[cut:]), "cut at %d", cut)
	}
}

// One flipped bit anywhere in a long input changes its CRC.
func TestUpdateSeesEveryBit(t *testing.T) {
	buf := make([]byte, 4096)
	want := Checksum(buf)
	for bit := 0; bit < len(buf)*8; bit += 13 {
		buf[bit/8] ^= 1 << (bit % 8)
		require.NotEqual(t, want, Checksum(buf), "bit %d", bit)
		require.Equal(t, crc32.Checksum(buf, table), Checksum(buf), "bit %d", bit)
		buf[bit/8] ^= 1 << (bit % 8)
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 3000))
	f.Add(uint32(0xffffffff), []byte("kvbm"))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		require.Equal(t, crc32.Update(crc, table, p), Update(crc, p))
	})
}
