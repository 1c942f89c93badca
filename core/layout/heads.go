package layout

import (
	"errors"
	"strconv"
)

// HeadOrder is how a fragment arranges its page's tokens and KV heads.
// A fragment of a layout whose InnerDim spans several heads holds, for
// every token of the page, every head's bytes; which of the two is outer
// decides where one head's bytes lie.
type HeadOrder uint8

const (
	// HeadsOuter is [head][token][bytes]: one head's page is one range
	// (vLLM's HND).
	HeadsOuter HeadOrder = 1
	// TokensOuter is [token][head][bytes]: one head is one range per
	// token (vLLM's NHD).
	TokensOuter HeadOrder = 2
)

func (o HeadOrder) String() string {
	switch o {
	case HeadsOuter:
		return "HeadsOuter"
	case TokensOuter:
		return "TokensOuter"
	}
	return "HeadOrder(" + strconv.Itoa(int(o)) + ")"
}

// Heads is how a layout's fragments hold KV heads: Total heads of
// FragmentSize / (PageSize × Total) bytes each, in Order.
type Heads struct {
	Total int
	Order HeadOrder
}

// MaxSlicePieces bounds the ranges a head slice plans for one fragment
// (heads × tokens, the most it can take): a real KV block of 16 to 256
// tokens of up to 128 heads stays far below it, and a request above it is
// refused instead of planned for minutes.
const MaxSlicePieces = 1 << 16

// HeadSlice moves part of the heads of each fragment: heads [SrcFirst,
// SrcFirst+Count) of the source's fragments fill heads [DstFirst,
// DstFirst+Count) of the destination's, every token of the page; the
// destination's other heads are not written. It is how a decode of one
// tensor-parallel size takes its heads from a prefill of another: the
// fragments of the two sides hold different numbers of heads, in either
// order, of the same size.
type HeadSlice struct {
	Src, Dst           Heads
	SrcFirst, DstFirst int
	Count              int
}

// Check reports why the slice cannot move heads between fragments of src
// and dst, naming the field and its value; nil when it can. The two
// configs must agree in everything a fragment is made of but the number of
// heads: layers, outer dimension, page size and the bytes of one head.
func (s HeadSlice) Check(src, dst Config) error {
	for _, side := range []struct {
		name  string
		h     Heads
		first int
		cfg   Config
	}{{"source", s.Src, s.SrcFirst, src}, {"destination", s.Dst, s.DstFirst, dst}} {
		switch {
		case side.h.Order != HeadsOuter && side.h.Order != TokensOuter:
			return errors.New("head slice: " + side.name + " head order must be 1 (HeadsOuter) or 2 (TokensOuter), got " +
				strconv.Itoa(int(side.h.Order)))
		// Total is bounded by division first, so that the product cannot
		// wrap (Total comes from the ABI as any uint32).
		case side.h.Total <= 0 || side.h.Total > side.cfg.FragmentSize()/side.cfg.PageSize ||
			side.cfg.FragmentSize()%(side.cfg.PageSize*side.h.Total) != 0:
			return errors.New("head slice: " + side.name + " fragments of " + strconv.Itoa(side.cfg.FragmentSize()) +
				" bytes do not hold " + strconv.Itoa(side.h.Total) + " heads of " + strconv.Itoa(side.cfg.PageSize) + " tokens")
		case s.Count <= 0 || side.first < 0 || side.first > side.h.Total-s.Count:
			return errors.New("head slice: " + side.name + " heads [" + strconv.Itoa(side.first) + ", " +
				strconv.Itoa(side.first+s.Count) + ") are not within its " + strconv.Itoa(side.h.Total) + " heads")
		}
	}
	if src.PageSize > MaxSlicePieces/s.Count {
		return errors.New("head slice: " + strconv.Itoa(s.Count) + " heads of " + strconv.Itoa(src.PageSize) +
			" tokens are more than " + strconv.Itoa(MaxSlicePieces) + " ranges a fragment")
	}
	switch {
	case src.NumLayers != dst.NumLayers:
		return incompatible("NumLayers ", src.NumLayers, dst.NumLayers, "")
	case src.OuterDim != dst.OuterDim:
		return incompatible("OuterDim ", src.OuterDim, dst.OuterDim, "")
	case src.PageSize != dst.PageSize:
		return incompatible("PageSize ", src.PageSize, dst.PageSize, "")
	case s.Src.HeadBytes(src) != s.Dst.HeadBytes(dst):
		return incompatible("head size ", s.Src.HeadBytes(src), s.Dst.HeadBytes(dst), " bytes per token")
	}
	return nil
}

// HeadBytes is the bytes of one head of one token in fragments of c that
// hold h.
func (h Heads) HeadBytes(c Config) int { return c.FragmentSize() / (c.PageSize * h.Total) }

// Pieces calls fn with the byte ranges, relative to the start of a
// fragment on each side, that move the slice's heads of one fragment of
// page tokens of headBytes a head: in destination order, a range merged
// with the one before where both sides continue it (one range per fragment
// when both sides are HeadsOuter, one per token when both are
// TokensOuter). The geometry is the source's (Check: the destination's is
// the same but for the number of heads), passed as numbers because a
// bounce buffer holds the source's fragments under a shape of its own.
func (s HeadSlice) Pieces(page, headBytes int, fn func(srcOff, dstOff, size uint64)) {
	hb := uint64(headBytes)
	var run struct{ src, dst, size uint64 }
	emit := func(so, do, size uint64) {
		if run.size > 0 && run.src+run.size == so && run.dst+run.size == do {
			run.size += size
			return
		}
		if run.size > 0 {
			fn(run.src, run.dst, run.size)
		}
		run.src, run.dst, run.size = so, do, size
	}
	at := func(h Heads, head, token int) uint64 {
		if h.Order == HeadsOuter {
			return uint64(head*page+token) * hb
		}
		return uint64(token*h.Total+head) * hb
	}
	outerHeads := s.Dst.Order == HeadsOuter
	for i := 0; i < page*s.Count; i++ {
		head, token := i/page, i%page // destination order: heads outer
		if !outerHeads {
			head, token = i%s.Count, i/s.Count // tokens outer
		}
		emit(at(s.Src, s.SrcFirst+head, token), at(s.Dst, s.DstFirst+head, token), hb)
	}
	if run.size > 0 {
		fn(run.src, run.dst, run.size)
	}
}

// String is a one-line summary for logs and errors.
func (s HeadSlice) String() string {
	return "heads [" + strconv.Itoa(s.SrcFirst) + ", " + strconv.Itoa(s.SrcFirst+s.Count) + ") of " +
		strconv.Itoa(s.Src.Total) + " " + s.Src.Order.String() + " -> [" + strconv.Itoa(s.DstFirst) + ", " +
		strconv.Itoa(s.DstFirst+s.Count) + ") of " + strconv.Itoa(s.Dst.Total) + " " + s.Dst.Order.String()
}
