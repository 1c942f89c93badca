package remote

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// ScopeMember is a transport's peer connected with one block-scoped
// capability: what a ScopedPeer routes to.
type ScopeMember interface {
	transfer.RemoteMemory
	Close() error
	// Server names the server it reaches (its worker, route and address):
	// members of one ScopedPeer reach the same.
	Server() string
	// Worker is the server's worker id.
	Worker() uint64
	// Broken says why it can no longer be used, or nil.
	Broken() error
}

// ScopedPeer is a peer connected with a block-scoped endpoint (own), and
// the set of those of one server it carries (members: itself, and those
// it joined, Joiner): an imported layout reaches the server through the
// member whose scope covers a transfer's blocks, so that a worker
// pulling many requests of one server imports its layouts once per
// request's scope, not once per worker, and never re-points a pull in
// flight. The TCP and UCX transports return one for a block-scoped
// endpoint.
type ScopedPeer struct {
	own   ScopeMember
	scope capability.BlockScope

	mu      sync.Mutex
	members []*ScopedPeer
	layouts map[transfer.LayoutHandle]*layout.Layout // attached, to route by
}

// NewScopedPeer is the scoped peer of p, connected with the block scope
// desc (closed when desc does not parse).
func NewScopedPeer(p ScopeMember, desc []byte) (*ScopedPeer, error) {
	bs, err := capability.ParseBlockScope(desc)
	if err != nil { // parsed already with the endpoint
		p.Close()
		return nil, err
	}
	s := &ScopedPeer{own: p, scope: bs, layouts: map[transfer.LayoutHandle]*layout.Layout{}}
	s.members = []*ScopedPeer{s}
	return s, nil
}

// Own is the peer s was connected as.
func (s *ScopedPeer) Own() ScopeMember { return s.own }

// Join takes other over when it is a block-scoped peer of the same
// server.
func (s *ScopedPeer) Join(other Peer) bool {
	o, ok := other.(*ScopedPeer)
	if !ok || o == s || o.own.Server() != s.own.Server() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members = append(s.members, o)
	return true
}

// Leave closes other's connections (a member, or s itself) and reports
// whether no member is left.
func (s *ScopedPeer) Leave(other Peer) bool {
	s.mu.Lock()
	i := slices.IndexFunc(s.members, func(m *ScopedPeer) bool { return m == other })
	var gone *ScopedPeer
	if i >= 0 {
		gone = s.members[i]
		s.members = slices.Delete(s.members, i, i+1)
	}
	empty := len(s.members) == 0
	s.mu.Unlock()
	if gone != nil {
		gone.own.Close()
	}
	return empty
}

// Attach remembers the layout, to route transfers on it by block.
func (s *ScopedPeer) Attach(d transfer.Descriptor) (transfer.Attachment, error) {
	if d.Handle.Worker != s.own.Worker() {
		return transfer.Attachment{}, fmt.Errorf("%w: layout %v is not worker %x's, which this connection reaches",
			kvbmerr.ErrInvalidArgument, d.Handle, s.own.Worker())
	}
	l, err := layout.New(d.Config, d.Shape.Kind, d.Shape.BlockDim, d.Bases)
	if err != nil {
		return transfer.Attachment{}, fmt.Errorf("%w: layout %v: %w", kvbmerr.ErrInvalidArgument, d.Handle, err)
	}
	s.mu.Lock()
	s.layouts[d.Handle] = l
	s.mu.Unlock()
	return transfer.Attachment{Memory: s}, nil
}

// Read reads through the newest member whose scope covers ops (one that
// is not broken, if there is one): blocks given to a newer request are
// read with its capability, the older one's having been revoked. Ops of
// more than one request's blocks (a transfer of several requests, whose
// reads the manager cuts where it likes) are read in runs, each through
// the member that covers it, one after another.
func (s *ScopedPeer) Read(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp) error {
	s.mu.Lock()
	runs := s.runs(h, ops)
	s.mu.Unlock()
	if runs == nil {
		return fmt.Errorf("%w: no request-scoped capability held for worker %x covers these blocks of layout %v (import the metadata the request was given)",
			kvbmerr.ErrUnsupported, s.own.Worker(), h)
	}
	for _, r := range runs {
		if err := r.member.Read(ctx, h, r.ops); err != nil {
			return err
		}
	}
	return nil
}

// scopedRun is ops read through one member.
type scopedRun struct {
	member ScopeMember
	ops    []transfer.RemoteOp
}

// runs routes ops of layout h: one run when a member covers them all,
// else consecutive ops covered by one member together; nil when an op is
// covered by none. s.mu is held.
func (s *ScopedPeer) runs(h transfer.LayoutHandle, ops []transfer.RemoteOp) []scopedRun {
	l := s.layouts[h]
	if l == nil {
		return nil
	}
	if m := s.pick(h, l, ops); m != nil {
		return []scopedRun{{m, ops}}
	}
	var runs []scopedRun
	for i := range ops {
		m := s.pick(h, l, ops[i:i+1])
		if m == nil {
			return nil
		}
		if last := len(runs) - 1; last >= 0 && runs[last].member == m {
			runs[last].ops = runs[last].ops[:len(runs[last].ops)+1] // ops[i] follows it in ops
		} else {
			runs = append(runs, scopedRun{m, ops[i : i+1]})
		}
	}
	return runs
}

// pick is the newest member whose scope covers ops, not broken if one
// is; nil when none covers them.
func (s *ScopedPeer) pick(h transfer.LayoutHandle, l *layout.Layout, ops []transfer.RemoteOp) ScopeMember {
	var pick ScopeMember
	for _, m := range slices.Backward(s.members) {
		if Covers(&m.scope, nil, h, l, ops) == nil {
			if pick = m.own; pick.Broken() == nil {
				break
			}
		}
	}
	return pick
}

// OpBytes is its own peer's (transfer.OpSizer), or the manager's own
// size when that says none.
func (s *ScopedPeer) OpBytes() uint64 {
	if o, ok := s.own.(transfer.OpSizer); ok {
		return o.OpBytes()
	}
	return 0
}

// Write is refused: a block scope reads only.
func (s *ScopedPeer) Write(_ context.Context, h transfer.LayoutHandle, _ []transfer.RemoteOp) error {
	return fmt.Errorf("%w: worker %x's layout %v is reached with request-scoped capabilities, which read only", kvbmerr.ErrUnsupported, s.own.Worker(), h)
}

// Close closes every member's connections.
func (s *ScopedPeer) Close() error {
	s.mu.Lock()
	members := s.members
	s.members = nil
	s.mu.Unlock()
	for _, m := range members {
		m.own.Close()
	}
	return nil
}

var _ Joiner = (*ScopedPeer)(nil)
