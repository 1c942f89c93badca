package capability

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Block scopes: a capability that reads some blocks of some layouts and
// nothing else (a decode pulling one request's blocks from a prefill),
// until an optional expiry, or until its blocks change owner. It is
// stateless on the server: the scope's descriptor travels in the endpoint
// and in the hello, and its key is HMAC(secret, "kvbm-tcp block scope" |
// descriptor) (Secret.Blocks), so the server keeps nothing per export and
// checks every request of a connection against the descriptor its hello
// proved. The epoch is the server's revocation epoch when the scope was
// made: a block revoked since (revoke.go) is no longer the scope's. The
// descriptor, little endian:
//
//	version u8 (2) | expires u64 (Unix seconds; 0: never) | epoch u64 |
//	layout count u8 |
//	count × { layout u16 | range count u16 | ranges × { first block u32 | blocks u32 } }
//
// in canonical form: layouts in increasing order, each with its ranges
// sorted, none empty, none touching the next (an exporter merges them).
const (
	ScopeVersion    = 2        // 1 had no epoch: its scopes could not be revoked
	MaxScopeLen     = 32 << 10 // what a hello may carry: about 4000 ranges
	MaxScopeLayouts = 16
	ScopeHeadLen    = 1 + 8 + 8 + 1
)

// BlockScope is a decoded descriptor.
type BlockScope struct {
	Expires uint64 // Unix seconds; 0: never
	Epoch   uint64 // the server's revocation epoch when it was made (Revocations.Epoch)
	Layouts []LayoutRanges
}

// LayoutRanges is the blocks of one layout a block scope covers.
type LayoutRanges struct {
	Layout uint16
	Ranges Ranges
}

// Ranges are sorted, disjoint ranges of blocks.
type Ranges []BlockRange

// BlockRange is blocks [First, First+Count).
type BlockRange struct{ First, Count uint64 }

// Handle names a layout of a worker, as transfer.LayoutHandle does (one
// converts to the other).
type Handle struct {
	Worker uint64
	Layout uint16
}

func (h Handle) String() string { return fmt.Sprintf("%x/%d", h.Worker, h.Layout) }

// LayoutBlocks is the blocks of one layout a block scope is asked to
// cover.
type LayoutBlocks struct {
	Handle Handle
	Blocks []int
}

// EncodeBlockScope makes the canonical descriptor of the scope that reads
// the blocks of layouts, which must be those of worker, until expires
// (zero: never; rounded up to the second) or until they are revoked after
// epoch (the server's Revocations.Epoch now).
func EncodeBlockScope(worker uint64, layouts []LayoutBlocks, expires time.Time, epoch uint64) ([]byte, error) {
	if len(layouts) == 0 || len(layouts) > MaxScopeLayouts {
		return nil, fmt.Errorf("%w: a block scope names 1 to %d layouts, got %d", kvbmerr.ErrInvalidArgument, MaxScopeLayouts, len(layouts))
	}
	bs := BlockScope{Epoch: epoch}
	if !expires.IsZero() {
		if !expires.After(time.Now()) {
			return nil, fmt.Errorf("%w: a block scope that expires at %v, in the past", kvbmerr.ErrInvalidArgument, expires)
		}
		bs.Expires = uint64(expires.Add(time.Second - 1).Unix()) // rounded up: never shorter than asked
	}
	ls := slices.Clone(layouts)
	sort.Slice(ls, func(i, j int) bool { return ls[i].Handle.Layout < ls[j].Handle.Layout })
	for i, l := range ls {
		if l.Handle.Worker != worker {
			return nil, fmt.Errorf("%w: block scope layout %v is not worker %x's", kvbmerr.ErrInvalidArgument, l.Handle, worker)
		}
		if i > 0 && ls[i-1].Handle == l.Handle {
			return nil, fmt.Errorf("%w: block scope names layout %v twice", kvbmerr.ErrInvalidArgument, l.Handle)
		}
		ranges, err := blockRanges(l.Blocks)
		if err != nil {
			return nil, fmt.Errorf("block scope layout %v: %w", l.Handle, err)
		}
		if len(ranges) > 0xFFFF {
			return nil, fmt.Errorf("%w: block scope layout %v: %d ranges, at most 65535", kvbmerr.ErrInvalidArgument, l.Handle, len(ranges))
		}
		bs.Layouts = append(bs.Layouts, LayoutRanges{Layout: l.Handle.Layout, Ranges: ranges})
	}
	b := bs.AppendTo(nil)
	if len(b) > MaxScopeLen {
		return nil, fmt.Errorf("%w: block scope of %d bytes, at most %d (its blocks form too many ranges; a hello carries at most that)",
			kvbmerr.ErrInvalidArgument, len(b), MaxScopeLen)
	}
	return b, nil
}

// AppendTo appends the descriptor's encoding (canonical when s came from
// EncodeBlockScope or ParseBlockScope).
func (s BlockScope) AppendTo(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(append(b, ScopeVersion), s.Expires)
	b = binary.LittleEndian.AppendUint64(b, s.Epoch)
	b = append(b, byte(len(s.Layouts)))
	for _, l := range s.Layouts {
		b = binary.LittleEndian.AppendUint16(b, l.Layout)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(l.Ranges)))
		for _, r := range l.Ranges {
			b = binary.LittleEndian.AppendUint32(b, uint32(r.First))
			b = binary.LittleEndian.AppendUint32(b, uint32(r.Count))
		}
	}
	return b
}

// blockRanges sorts and merges block ids into ranges.
func blockRanges(blocks []int) (Ranges, error) {
	if len(blocks) == 0 {
		return nil, fmt.Errorf("%w: no blocks", kvbmerr.ErrInvalidArgument)
	}
	ids := slices.Clone(blocks)
	slices.Sort(ids)
	var out Ranges
	for _, id := range ids {
		if id < 0 || id > 1<<32-2 {
			return nil, fmt.Errorf("%w: block id %d", kvbmerr.ErrOutOfRange, id)
		}
		if n := len(out); n > 0 && out[n-1].First+out[n-1].Count >= uint64(id) {
			out[n-1].Count = max(out[n-1].Count, uint64(id)+1-out[n-1].First) // a repeat, or the next
			continue
		}
		out = append(out, BlockRange{uint64(id), 1})
	}
	return out, nil
}

// ParseBlockScope decodes a descriptor, refusing anything but the
// canonical form with an error wrapping ErrMalformed; it never panics.
func ParseBlockScope(b []byte) (BlockScope, error) {
	bad := func(format string, args ...any) (BlockScope, error) {
		return BlockScope{}, fmt.Errorf("%w: block scope: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	if len(b) > MaxScopeLen {
		return bad("%d bytes, at most %d", len(b), MaxScopeLen)
	}
	if len(b) < ScopeHeadLen {
		return bad("%d bytes, shorter than its %d-byte head", len(b), ScopeHeadLen)
	}
	if b[0] != ScopeVersion {
		return bad("version %d, this library reads %d", b[0], ScopeVersion)
	}
	s := BlockScope{Expires: binary.LittleEndian.Uint64(b[1:]), Epoch: binary.LittleEndian.Uint64(b[9:])}
	n := int(b[ScopeHeadLen-1])
	if n == 0 || n > MaxScopeLayouts {
		return bad("%d layouts, 1 to %d", n, MaxScopeLayouts)
	}
	r := b[ScopeHeadLen:]
	for i := range n {
		if len(r) < 4 {
			return bad("layout %d: truncated", i)
		}
		l := LayoutRanges{Layout: binary.LittleEndian.Uint16(r)}
		if i > 0 && l.Layout <= s.Layouts[i-1].Layout {
			return bad("layout %d (%d) after layout %d: not in increasing order", i, l.Layout, s.Layouts[i-1].Layout)
		}
		k := int(binary.LittleEndian.Uint16(r[2:]))
		r = r[4:]
		if k == 0 || len(r) < 8*k {
			return bad("layout %d: %d ranges in the %d bytes left", l.Layout, k, len(r))
		}
		l.Ranges = make(Ranges, k)
		for j := range k {
			br := BlockRange{uint64(binary.LittleEndian.Uint32(r[8*j:])), uint64(binary.LittleEndian.Uint32(r[8*j+4:]))}
			if br.Count == 0 || (j > 0 && br.First <= l.Ranges[j-1].First+l.Ranges[j-1].Count) {
				return bad("layout %d: range %d [%d, +%d) is empty, out of order, or touches the one before", l.Layout, j, br.First, br.Count)
			}
			l.Ranges[j] = br
		}
		r = r[8*k:]
		s.Layouts = append(s.Layouts, l)
	}
	if len(r) != 0 {
		return bad("%d bytes after the last layout", len(r))
	}
	return s, nil
}

// Expired reports whether the scope has expired at now.
func (s *BlockScope) Expired(now time.Time) bool {
	return s.Expires != 0 && uint64(now.Unix()) >= s.Expires
}

// Ranges is the blocks the scope covers of layout (ok false: it does not
// name the layout).
func (s *BlockScope) Ranges(layout uint16) (r Ranges, ok bool) {
	i := slices.IndexFunc(s.Layouts, func(l LayoutRanges) bool { return l.Layout == layout })
	if i < 0 {
		return nil, false
	}
	return s.Layouts[i].Ranges, true
}

// Covers reports whether blocks first to last are all in one range.
func (r Ranges) Covers(first, last int) bool {
	j := sort.Search(len(r), func(j int) bool { return r[j].First+r[j].Count > uint64(first) })
	return j < len(r) && r[j].First <= uint64(first) && uint64(last) < r[j].First+r[j].Count
}
