package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Block scopes: a capability that reads some blocks of some layouts and
// nothing else, until an optional expiry (capability.BlockScope: its
// descriptor and key). Here: the endpoint that carries one, the server's
// check of every request of a connection whose hello proved one; the
// client's side, a peer per scope joined per server, is scopedpeer.go.

// ScopedEndpoint is an endpoint whose holder reads the blocks s names
// and nothing else, until s.Expires: the server refuses any other range,
// any write, and a request after the expiry.
func (t *Transport) ScopedEndpoint(s remote.Scope) ([]byte, error) {
	if _, err := t.Endpoint(); err != nil { // listens, unless it does
		return nil, err
	}
	if _, err := t.ownBlocks("block scope", s.Layouts); err != nil {
		return nil, err
	}
	desc, err := encodeScope(t.m.WorkerID(), s, t.revoked.Epoch())
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ep := t.ep
	ep.scope, ep.key, ep.desc = capability.ScopeBlocks, t.secret.Blocks(desc), desc
	return ep.append(nil), nil
}

// encodeScope makes the canonical descriptor of s, whose layouts must be
// this worker's, made at revocation epoch epoch.
func encodeScope(worker uint64, s remote.Scope, epoch uint64) ([]byte, error) {
	layouts := make([]capability.LayoutBlocks, len(s.Layouts))
	for i, l := range s.Layouts {
		layouts[i] = capability.LayoutBlocks{Handle: capability.Handle(l.Layout), Blocks: l.Blocks}
	}
	return capability.EncodeBlockScope(worker, layouts, s.Expires, epoch)
}

// cutScope takes the length-prefixed descriptor at ep[at:] out of an
// endpoint, returning it and the endpoint without it.
func cutScope(ep []byte, at int) (desc, rest []byte, err error) {
	if len(ep) < at+2 {
		return nil, nil, fmt.Errorf("%w: tcp endpoint of %d bytes ends before its scope", remote.ErrBadEndpoint, len(ep))
	}
	n := int(binary.LittleEndian.Uint16(ep[at:]))
	if len(ep) < at+2+n {
		return nil, nil, fmt.Errorf("%w: tcp endpoint of %d bytes is too short for its %d-byte scope", remote.ErrBadEndpoint, len(ep), n)
	}
	desc = slices.Clone(ep[at+2 : at+2+n])
	if _, err := capability.ParseBlockScope(desc); err != nil {
		return nil, nil, err
	}
	return desc, append(slices.Clone(ep[:at]), ep[at+2+n:]...), nil
}

// covers checks that ops of layout h, laid out as l, touch only blocks
// the scope covers (the client routes by it too: scopedpeer.go) and,
// with revoked (the server's), none revoked since the scope was made.
func covers(s *capability.BlockScope, revoked *capability.Revocations, h transfer.LayoutHandle, l *layout.Layout, ops []transfer.RemoteOp) error {
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

// inScope checks a request of a connection whose hello proved block
// scope bs: a read of blocks it covers, before it expires, none of them
// revoked since it was made (called between Revocations.Enter and Exit).
// A refusal is counted and logged as the server's others are.
func (t *Transport) inScope(bs *capability.BlockScope, c net.Conn, q request) error {
	var err error
	switch {
	case q.op != opRead:
		err = fmt.Errorf("%w: the peer holds a request-scoped capability of worker %x, which reads only: %s is refused", kvbmerr.ErrUnsupported, t.m.WorkerID(), q.op)
	case bs.Expired(time.Now()):
		err = fmt.Errorf("%w: the peer's request-scoped capability of worker %x expired", kvbmerr.ErrUnsupported, t.m.WorkerID())
	case q.handle.Worker != t.m.WorkerID():
		err = fmt.Errorf("%w: layout %v is not worker %x's", transfer.ErrNotFound, q.handle, t.m.WorkerID())
	default:
		var l *layout.Layout
		if l, _, err = t.m.Layout(q.handle); err == nil {
			err = covers(bs, &t.revoked, q.handle, l, q.ops)
		}
	}
	if err != nil && !errors.Is(err, transfer.ErrWithdrawn) { // withdrawn: the owner's doing, not the peer's
		n := t.refusedScope.Add(1)
		t.logRefusal(c.RemoteAddr().String(), "scope", "kvbm tcp: refused a request outside its request-scoped capability",
			"worker", fmt.Sprintf("%#x", t.m.WorkerID()), "reason", err.Error(), "refused so far", n)
	}
	return err
}

// RefusedOutOfScope is the number of requests refused for being outside
// the request-scoped capability their connection proved.
func (t *Transport) RefusedOutOfScope() uint64 { return t.refusedScope.Load() }

// RevokeBlocks ends every request-scoped capability made before now that
// covers one of the blocks named, and returns once no request it allowed
// is still reading them: the blocks can go to their next owner (P/D: a
// request released, its lease ended, or it was aborted). Capabilities
// made after it, for the blocks' new owner, are not touched.
// Whole-worker capabilities are not revoked.
func (t *Transport) RevokeBlocks(layouts []remote.ScopedLayout) error {
	rs, err := t.ownBlocks("revoke", layouts) // all checked before any is revoked
	if err != nil {
		return err
	}
	t.revoked.Revoke(rs...)
	return nil
}

// ownBlocks checks that layouts are this worker's and their blocks inside
// them (what is a scope's, or a revocation's), and returns them with their
// sizes.
func (t *Transport) ownBlocks(what string, layouts []remote.ScopedLayout) ([]capability.LayoutBlocksRevoked, error) {
	rs := make([]capability.LayoutBlocksRevoked, 0, len(layouts))
	for _, sl := range layouts {
		l, _, err := t.m.Layout(sl.Layout)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if sl.Layout.Worker != t.m.WorkerID() {
			return nil, fmt.Errorf("%w: %s: layout %v is not worker %x's", kvbmerr.ErrInvalidArgument, what, sl.Layout, t.m.WorkerID())
		}
		n := l.Config().NumBlocks
		if i := slices.IndexFunc(sl.Blocks, func(b int) bool { return b < 0 || b >= n }); i >= 0 {
			return nil, fmt.Errorf("%w: %s: block %d of layout %v, which has %d", kvbmerr.ErrOutOfRange, what, sl.Blocks[i], sl.Layout, n)
		}
		rs = append(rs, capability.LayoutBlocksRevoked{Layout: sl.Layout.Layout, NumBlocks: n, Blocks: sl.Blocks})
	}
	return rs, nil
}
