package cache

import "fmt"

// WriteMode says when blocks are written down to a tier.
type WriteMode uint8

const (
	// WriteAuto: write-back for G3 when the worker has a G3 layout; for
	// G4, write-back from the lowest local tier when it has a store.
	WriteAuto WriteMode = iota
	// WriteOff: the tier is not written by the cache (G4 may still be read).
	WriteOff
	// WriteBack: a block is written down when it is evicted from the tier
	// above it.
	WriteBack
	// WriteThrough: a block is written down as soon as it lands in G2.
	WriteThrough
)

var writeModeNames = [...]string{"auto", "off", "write-back", "write-through"}

func (m WriteMode) String() string {
	if int(m) < len(writeModeNames) {
		return writeModeNames[m]
	}
	return fmt.Sprintf("WriteMode(%d)", m)
}

// ParseWriteMode reads a WriteMode from its name.
func ParseWriteMode(s string) (WriteMode, error) {
	for i, n := range writeModeNames {
		if s == n {
			return WriteMode(i), nil
		}
	}
	return 0, fmt.Errorf("write mode %q: want one of %v", s, writeModeNames)
}
