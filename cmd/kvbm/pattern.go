package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// fill writes block tag's pattern into b: every 8-byte word holds the tag in
// its high bits and its own offset in the low bits, so that a block in the
// wrong place, or bytes shifted within a block, never match.
func fill(b []byte, tag int) {
	hi := (uint64(tag) + 1) << 32
	for off := 0; off+8 <= len(b); off += 8 {
		binary.LittleEndian.PutUint64(b[off:], hi|uint64(off))
	}
}

// compare checks that got is block tag's pattern, using want as scratch, and
// names the first wrong offset.
func compare(got, want []byte, tag int) error {
	fill(want, tag)
	if bytes.Equal(got, want) {
		return nil
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("byte %d is %#02x, want %#02x (pattern of block %d)", i, got[i], want[i], tag)
		}
	}
	return fmt.Errorf("length %d, want %d", len(got), len(want))
}
