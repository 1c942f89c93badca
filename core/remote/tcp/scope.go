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
	if _, err := remote.OwnBlocks(t.m, "block scope", s.Layouts); err != nil {
		return nil, err
	}
	desc, err := remote.EncodeScope(t.m.WorkerID(), s, t.revoked.Epoch())
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ep := t.ep
	ep.scope, ep.key, ep.desc = capability.ScopeBlocks, t.secret.Blocks(desc), desc
	return ep.append(nil), nil
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
			err = remote.Covers(bs, &t.revoked, q.handle, l, q.ops)
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
	rs, err := remote.OwnBlocks(t.m, "revoke", layouts) // all checked before any is revoked
	if err != nil {
		return err
	}
	t.revoked.Revoke(rs...)
	return nil
}
