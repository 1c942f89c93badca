package tcp

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
)

// Block scopes: a capability that reads some blocks of some layouts and
// nothing else (a decode pulling one request's blocks from a prefill),
// until an optional expiry. It is stateless on the server: the scope's
// descriptor travels in the endpoint and in the hello, and its key is
// HMAC(secret, "kvbm-tcp block scope" | descriptor), so the server keeps
// nothing per export and checks every request of a connection against
// the descriptor its hello proved. The descriptor, little endian:
//
//	version u8 (1) | expires u64 (Unix seconds; 0: never) | layout count u8 |
//	count × { layout u16 | range count u16 | ranges × { first block u32 | blocks u32 } }
//
// in canonical form: layouts in increasing order, each with its ranges
// sorted, none empty, none touching the next (an exporter merges them).

const (
	scopeVersion    = 1
	maxScopeLen     = 32 << 10 // what a hello may carry: about 4000 ranges
	maxScopeLayouts = 16
	scopeHeadLen    = 1 + 8 + 1
)

// blockScope is a decoded descriptor.
type blockScope struct {
	expires uint64 // Unix seconds; 0: never
	layouts []scopeLayout
}

type scopeLayout struct {
	layout uint16
	ranges []blockRange
}

type blockRange struct{ first, count uint64 }

// encodeScope makes the canonical descriptor of s, whose layouts must be
// this worker's.
func encodeScope(worker uint64, s remote.Scope) ([]byte, error) {
	if len(s.Layouts) == 0 || len(s.Layouts) > maxScopeLayouts {
		return nil, fmt.Errorf("%w: a block scope names 1 to %d layouts, got %d", transfer.ErrInvalidArgument, maxScopeLayouts, len(s.Layouts))
	}
	var expires uint64
	if !s.Expires.IsZero() {
		if !s.Expires.After(time.Now()) {
			return nil, fmt.Errorf("%w: a block scope that expires at %v, in the past", transfer.ErrInvalidArgument, s.Expires)
		}
		expires = uint64(s.Expires.Add(time.Second - 1).Unix()) // rounded up: never shorter than asked
	}
	ls := slices.Clone(s.Layouts)
	sort.Slice(ls, func(i, j int) bool { return ls[i].Layout.Layout < ls[j].Layout.Layout })
	bs := blockScope{expires: expires}
	for i, l := range ls {
		if l.Layout.Worker != worker {
			return nil, fmt.Errorf("%w: block scope layout %v is not worker %x's", transfer.ErrInvalidArgument, l.Layout, worker)
		}
		if i > 0 && ls[i-1].Layout == l.Layout {
			return nil, fmt.Errorf("%w: block scope names layout %v twice", transfer.ErrInvalidArgument, l.Layout)
		}
		ranges, err := blockRanges(l.Blocks)
		if err != nil {
			return nil, fmt.Errorf("block scope layout %v: %w", l.Layout, err)
		}
		if len(ranges) > 0xFFFF {
			return nil, fmt.Errorf("%w: block scope layout %v: %d ranges, at most 65535", transfer.ErrInvalidArgument, l.Layout, len(ranges))
		}
		bs.layouts = append(bs.layouts, scopeLayout{layout: l.Layout.Layout, ranges: ranges})
	}
	b := bs.append(nil)
	if len(b) > maxScopeLen {
		return nil, fmt.Errorf("%w: block scope of %d bytes, at most %d (its blocks form too many ranges; a hello carries at most that)",
			transfer.ErrInvalidArgument, len(b), maxScopeLen)
	}
	return b, nil
}

// append is the descriptor's encoding.
func (s blockScope) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(append(b, scopeVersion), s.expires)
	b = append(b, byte(len(s.layouts)))
	for _, l := range s.layouts {
		b = binary.LittleEndian.AppendUint16(b, l.layout)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(l.ranges)))
		for _, r := range l.ranges {
			b = binary.LittleEndian.AppendUint32(b, uint32(r.first))
			b = binary.LittleEndian.AppendUint32(b, uint32(r.count))
		}
	}
	return b
}

// blockRanges sorts and merges block ids into ranges.
func blockRanges(blocks []int) ([]blockRange, error) {
	if len(blocks) == 0 {
		return nil, fmt.Errorf("%w: no blocks", transfer.ErrInvalidArgument)
	}
	ids := slices.Clone(blocks)
	slices.Sort(ids)
	var out []blockRange
	for _, id := range ids {
		if id < 0 || id > 1<<32-2 {
			return nil, fmt.Errorf("%w: block id %d", transfer.ErrOutOfRange, id)
		}
		if n := len(out); n > 0 && out[n-1].first+out[n-1].count >= uint64(id) {
			out[n-1].count = max(out[n-1].count, uint64(id)+1-out[n-1].first) // a repeat, or the next
			continue
		}
		out = append(out, blockRange{uint64(id), 1})
	}
	return out, nil
}

// parseScope decodes a descriptor, refusing anything but the canonical
// form; it never panics.
func parseScope(b []byte) (blockScope, error) {
	bad := func(format string, args ...any) (blockScope, error) {
		return blockScope{}, fmt.Errorf("%w: block scope: %s", remote.ErrBadEndpoint, fmt.Sprintf(format, args...))
	}
	if len(b) > maxScopeLen {
		return bad("%d bytes, at most %d", len(b), maxScopeLen)
	}
	if len(b) < scopeHeadLen {
		return bad("%d bytes, shorter than its %d-byte head", len(b), scopeHeadLen)
	}
	if b[0] != scopeVersion {
		return bad("version %d, this library reads %d", b[0], scopeVersion)
	}
	s := blockScope{expires: binary.LittleEndian.Uint64(b[1:])}
	n := int(b[9])
	if n == 0 || n > maxScopeLayouts {
		return bad("%d layouts, 1 to %d", n, maxScopeLayouts)
	}
	r := b[scopeHeadLen:]
	for i := range n {
		if len(r) < 4 {
			return bad("layout %d: truncated", i)
		}
		l := scopeLayout{layout: binary.LittleEndian.Uint16(r)}
		if i > 0 && l.layout <= s.layouts[i-1].layout {
			return bad("layout %d (%d) after layout %d: not in increasing order", i, l.layout, s.layouts[i-1].layout)
		}
		k := int(binary.LittleEndian.Uint16(r[2:]))
		r = r[4:]
		if k == 0 || len(r) < 8*k {
			return bad("layout %d: %d ranges in the %d bytes left", l.layout, k, len(r))
		}
		l.ranges = make([]blockRange, k)
		for j := range k {
			br := blockRange{uint64(binary.LittleEndian.Uint32(r[8*j:])), uint64(binary.LittleEndian.Uint32(r[8*j+4:]))}
			if br.count == 0 || (j > 0 && br.first <= l.ranges[j-1].first+l.ranges[j-1].count) {
				return bad("layout %d: range %d [%d, +%d) is empty, out of order, or touches the one before", l.layout, j, br.first, br.count)
			}
			l.ranges[j] = br
		}
		r = r[8*k:]
		s.layouts = append(s.layouts, l)
	}
	if len(r) != 0 {
		return bad("%d bytes after the last layout", len(r))
	}
	return s, nil
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
	if _, err := parseScope(desc); err != nil {
		return nil, nil, err
	}
	return desc, append(slices.Clone(ep[:at]), ep[at+2+n:]...), nil
}

// blockScopeKey is a descriptor's key.
func blockScopeKey(secret [32]byte, desc []byte) (k [keyLen]byte) {
	m := hmac.New(sha256.New, secret[:])
	m.Write([]byte("kvbm-tcp block scope"))
	m.Write(desc)
	copy(k[:], m.Sum(nil))
	return k
}

func (s *blockScope) expired(now time.Time) bool {
	return s.expires != 0 && uint64(now.Unix()) >= s.expires
}

// allows checks that ops of layout h, laid out as l, touch only blocks
// the scope covers.
func (s *blockScope) allows(h transfer.LayoutHandle, l *layout.Layout, ops []transfer.RemoteOp) error {
	i := slices.IndexFunc(s.layouts, func(sl scopeLayout) bool { return sl.layout == h.Layout })
	if i < 0 {
		return fmt.Errorf("%w: the request-scoped capability does not cover layout %v", transfer.ErrUnsupported, h)
	}
	ranges := s.layouts[i].ranges
	for _, o := range ops {
		first, last, ok := l.BlocksTouched(o.Remote, o.Size)
		if !ok {
			return fmt.Errorf("%w: bytes [%#x, +%d) are not inside one region of layout %v", transfer.ErrOutOfRange, o.Remote, o.Size, h)
		}
		j := sort.Search(len(ranges), func(j int) bool { return ranges[j].first+ranges[j].count > uint64(first) })
		if j == len(ranges) || ranges[j].first > uint64(first) || uint64(last) >= ranges[j].first+ranges[j].count {
			return fmt.Errorf("%w: the request-scoped capability does not cover blocks %d to %d of layout %v", transfer.ErrUnsupported, first, last, h)
		}
	}
	return nil
}

// inScope checks a request of a connection whose hello proved block
// scope bs: a read of blocks it covers, before it expires. A refusal is
// counted and logged as the server's others are.
func (t *Transport) inScope(bs *blockScope, c net.Conn, q request) error {
	var err error
	switch {
	case q.op != opRead:
		err = fmt.Errorf("%w: the peer holds a request-scoped capability of worker %x, which reads only: %s is refused", transfer.ErrUnsupported, t.m.WorkerID(), q.op)
	case bs.expired(time.Now()):
		err = fmt.Errorf("%w: the peer's request-scoped capability of worker %x expired", transfer.ErrUnsupported, t.m.WorkerID())
	case q.handle.Worker != t.m.WorkerID():
		err = fmt.Errorf("%w: layout %v is not worker %x's", transfer.ErrNotFound, q.handle, t.m.WorkerID())
	default:
		var l *layout.Layout
		if l, _, err = t.m.Layout(q.handle); err == nil {
			err = bs.allows(q.handle, l, q.ops)
		}
	}
	if err != nil {
		n := t.refusedScope.Add(1)
		t.logRefusal(c.RemoteAddr().String(), "scope", "kvbm tcp: refused a request outside its request-scoped capability",
			"worker", fmt.Sprintf("%#x", t.m.WorkerID()), "reason", err.Error(), "refused so far", n)
	}
	return err
}

// RefusedOutOfScope is the number of requests refused for being outside
// the request-scoped capability their connection proved.
func (t *Transport) RefusedOutOfScope() uint64 { return t.refusedScope.Load() }

// ScopedEndpoint is an endpoint whose holder reads the blocks s names
// and nothing else, until s.Expires: the server refuses any other range,
// any write, and a request after the expiry.
func (t *Transport) ScopedEndpoint(s remote.Scope) ([]byte, error) {
	if _, err := t.Endpoint(); err != nil { // listens, unless it does
		return nil, err
	}
	for _, sl := range s.Layouts {
		l, _, err := t.m.Layout(sl.Layout)
		if err != nil {
			return nil, fmt.Errorf("block scope: %w", err)
		}
		for _, b := range sl.Blocks {
			if b < 0 || b >= l.Config().NumBlocks {
				return nil, fmt.Errorf("%w: block scope: block %d of layout %v, which has %d", transfer.ErrOutOfRange, b, sl.Layout, l.Config().NumBlocks)
			}
		}
	}
	desc, err := encodeScope(t.m.WorkerID(), s)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ep := t.ep
	ep.scope, ep.key, ep.desc = scopeBlocks, blockScopeKey(t.secret, desc), desc
	return ep.append(nil), nil
}

// scopedPeer is a connection made with a block-scoped endpoint (own), and
// the set of those of one server it carries (members: itself, and those
// it joined, remote.Joiner): an imported layout reaches the server through
// the member whose scope covers a transfer's blocks, so that a worker
// pulling many requests of one server imports its layouts once per
// request's scope, not once per worker, and never re-points a pull in
// flight.
type scopedPeer struct {
	own   *tcpPeer
	scope blockScope

	mu      sync.Mutex
	members []*scopedPeer
	layouts map[transfer.LayoutHandle]*layout.Layout // attached, to route by
}

func newScopedPeer(p *tcpPeer, desc []byte) (*scopedPeer, error) {
	bs, err := parseScope(desc)
	if err != nil { // parsed already with the endpoint
		p.Close()
		return nil, err
	}
	s := &scopedPeer{own: p, scope: bs, layouts: map[transfer.LayoutHandle]*layout.Layout{}}
	s.members = []*scopedPeer{s}
	return s, nil
}

// Join takes other over when it is a block-scoped peer of the same
// server (worker, route and address).
func (s *scopedPeer) Join(other remote.Peer) bool {
	o, ok := other.(*scopedPeer)
	if !ok || o == s || o.own.worker != s.own.worker || o.own.network != s.own.network || o.own.addr != s.own.addr {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members = append(s.members, o)
	return true
}

// Leave closes other's connections (a member, or s itself) and reports
// whether no member is left.
func (s *scopedPeer) Leave(other remote.Peer) bool {
	s.mu.Lock()
	i := slices.IndexFunc(s.members, func(m *scopedPeer) bool { return m == other })
	var gone *scopedPeer
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
func (s *scopedPeer) Attach(d transfer.Descriptor) (transfer.Attachment, error) {
	if d.Handle.Worker != s.own.worker {
		return transfer.Attachment{}, fmt.Errorf("%w: layout %v is not worker %x's, which this connection reaches",
			transfer.ErrInvalidArgument, d.Handle, s.own.worker)
	}
	l, err := layout.New(d.Config, d.Shape.Kind, d.Shape.BlockDim, d.Bases)
	if err != nil {
		return transfer.Attachment{}, fmt.Errorf("%w: layout %v: %w", transfer.ErrInvalidArgument, d.Handle, err)
	}
	s.mu.Lock()
	s.layouts[d.Handle] = l
	s.mu.Unlock()
	return transfer.Attachment{Memory: s}, nil
}

// Read reads through the first member whose scope covers ops (one that
// is not broken, if there is one).
func (s *scopedPeer) Read(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp) error {
	s.mu.Lock()
	l := s.layouts[h]
	var pick *tcpPeer
	for _, m := range s.members {
		if l != nil && m.scope.allows(h, l, ops) == nil {
			if pick = m.own; pick.brokenErr() == nil {
				break
			}
		}
	}
	s.mu.Unlock()
	if pick == nil {
		return fmt.Errorf("%w: no request-scoped capability held for worker %x covers these blocks of layout %v (import the metadata the request was given)",
			transfer.ErrUnsupported, s.own.worker, h)
	}
	return pick.Read(ctx, h, ops)
}

// Write is refused: a block scope reads only.
func (s *scopedPeer) Write(_ context.Context, h transfer.LayoutHandle, _ []transfer.RemoteOp) error {
	return fmt.Errorf("%w: worker %x's layout %v is reached with request-scoped capabilities, which read only", transfer.ErrUnsupported, s.own.worker, h)
}

// Close closes every member's connections.
func (s *scopedPeer) Close() error {
	s.mu.Lock()
	members := s.members
	s.members = nil
	s.mu.Unlock()
	for _, m := range members {
		m.own.Close()
	}
	return nil
}

var _ remote.Joiner = (*scopedPeer)(nil)
