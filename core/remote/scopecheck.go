package remote

import (
	"fmt"
	"slices"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Covers checks that ops of layout h, laid out as l, touch only blocks
// the scope covers (a TCP client routes by it too) and,
// with revoked (the server's), none revoked since the scope was made.
func Covers(s *capability.BlockScope, revoked *capability.Revocations, h transfer.LayoutHandle, l *layout.Layout, ops []transfer.RemoteOp) error {
	ranges, ok := s.Ranges(h.Layout)
	if !ok {
		return fmt.Errorf("%w: the request-scoped capability does not cover layout %v", kvbmerr.ErrUnsupported, h)
	}
	for _, o := range ops {
		first, last, ok := l.BlocksTouched(o.Remote, o.Size)
		if !ok {
			return fmt.Errorf("%w: bytes [%#x, +%d) are not inside one region of layout %v", kvbmerr.ErrOutOfRange, o.Remote, o.Size, h)
		}
		if !ranges.Covers(first, last) {
			return fmt.Errorf("%w: the request-scoped capability does not cover blocks %d to %d of layout %v", kvbmerr.ErrUnsupported, first, last, h)
		}
		if revoked != nil && !revoked.Allows(s.Epoch, h.Layout, first, last) {
			return fmt.Errorf("%w: the request-scoped capability was revoked: blocks %d to %d of layout %v changed owner since it was made", kvbmerr.ErrUnsupported, first, last, h)
		}
	}
	return nil
}

// EncodeScope makes the canonical descriptor of s, whose layouts must be
// this worker's, made at revocation epoch epoch.
func EncodeScope(worker uint64, s Scope, epoch uint64) ([]byte, error) {
	layouts := make([]capability.LayoutBlocks, len(s.Layouts))
	for i, l := range s.Layouts {
		layouts[i] = capability.LayoutBlocks{Handle: capability.Handle(l.Layout), Blocks: l.Blocks}
	}
	return capability.EncodeBlockScope(worker, layouts, s.Expires, epoch)
}

// OwnBlocks checks that layouts are m's and their blocks inside them
// (what is a scope's, or a revocation's), and returns them with their
// sizes.
func OwnBlocks(m *transfer.Manager, what string, layouts []ScopedLayout) ([]capability.LayoutBlocksRevoked, error) {
	rs := make([]capability.LayoutBlocksRevoked, 0, len(layouts))
	for _, sl := range layouts {
		l, _, err := m.Layout(sl.Layout)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if sl.Layout.Worker != m.WorkerID() {
			return nil, fmt.Errorf("%w: %s: layout %v is not worker %x's", kvbmerr.ErrInvalidArgument, what, sl.Layout, m.WorkerID())
		}
		n := l.Config().NumBlocks
		if i := slices.IndexFunc(sl.Blocks, func(b int) bool { return b < 0 || b >= n }); i >= 0 {
			return nil, fmt.Errorf("%w: %s: block %d of layout %v, which has %d", kvbmerr.ErrOutOfRange, what, sl.Blocks[i], sl.Layout, n)
		}
		rs = append(rs, capability.LayoutBlocksRevoked{Layout: sl.Layout.Layout, NumBlocks: n, Blocks: sl.Blocks})
	}
	return rs, nil
}
