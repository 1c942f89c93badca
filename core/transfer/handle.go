package transfer

import "fmt"

// LayoutHandle names one registered layout across instances: the 64-bit id
// of the worker that owns the memory and a 16-bit id unique within that
// worker. It travels as 128 bits (see Pack).
type LayoutHandle struct {
	Worker uint64
	Layout uint16
}

// Pack is the 128-bit form: hi is the worker id, lo holds the layout id in
// its low 16 bits.
func (h LayoutHandle) Pack() (hi, lo uint64) { return h.Worker, uint64(h.Layout) }

// UnpackHandle is the inverse of Pack; lo must fit in 16 bits.
func UnpackHandle(hi, lo uint64) (LayoutHandle, error) {
	if lo > 0xFFFF {
		return LayoutHandle{}, fmt.Errorf("%w: layout handle: layout id %#x does not fit in 16 bits", ErrOutOfRange, lo)
	}
	return LayoutHandle{Worker: hi, Layout: uint16(lo)}, nil
}

func (h LayoutHandle) String() string { return fmt.Sprintf("%x/%d", h.Worker, h.Layout) }
