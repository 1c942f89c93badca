package worker

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/kvbmerr"
)

// BlockScope is what a request-scoped export covers: some blocks of some
// tiers, read only, until Expires (zero: no end).
type BlockScope struct {
	Blocks  map[Tier][]int
	Expires time.Time
}

// ErrScopedBusy is returned by an import of request-scoped metadata of a
// worker this one reaches at another address with request-scoped
// capabilities still connected: the pulls in flight are never re-pointed
// (the importer waits for them to be disconnected, then imports again).
var ErrScopedBusy = kvbmerr.New(kvbmerr.FailedPrecondition, "request-scoped capabilities of another server in use")

// ExportBlockScopedMetadata is metadata that reads the blocks s names and
// nothing else: it describes s's tiers only, and its holder's requests
// for any other block, any write, or any request after s.Expires are
// refused by this worker's server (a decode pulling one request's blocks
// from a prefill). The server keeps nothing per export. Within this
// process (the loopback) the scope is not enforced: the process is
// trusted. A transport that cannot scope is refused.
func (w *PhysicalWorker) ExportBlockScopedMetadata(s BlockScope) ([]byte, error) {
	const what = "export scoped metadata"
	tiers, ls, err := w.scopeLayouts(what, s.Blocks)
	if err != nil {
		return nil, err
	}
	md := Metadata{WorkerID: w.m.WorkerID()}
	rs := remote.Scope{Expires: s.Expires, Layouts: ls}
	for i, t := range tiers {
		d, err := w.m.Describe(ls[i].Layout)
		if err != nil {
			return nil, fmt.Errorf("%s: %v: %w", what, t, err)
		}
		md.Layouts = append(md.Layouts, LogicalDescriptor{Tier: t, Descriptor: d})
	}
	if w.loopback != nil {
		ep, err := w.loopback.Endpoint()
		if err != nil {
			return nil, fmt.Errorf("export scoped metadata: loopback endpoint: %w", err)
		}
		md.Endpoints = append(md.Endpoints, Endpoint{Transport: w.loopback.Name(), Address: ep})
	}
	if w.network != nil {
		se, ok := w.network.(remote.ScopedEndpointer)
		if !ok {
			return nil, fmt.Errorf("%w: export scoped metadata: %s cannot export a request-scoped capability", kvbmerr.ErrUnsupported, w.network.Name())
		}
		ep, err := se.ScopedEndpoint(rs)
		if err != nil {
			return nil, fmt.Errorf("export scoped metadata: %s endpoint: %w", w.network.Name(), err)
		}
		md.Endpoints = append(md.Endpoints, Endpoint{Transport: w.network.Name(), Address: ep})
	}
	return md.Encode()
}

// RevokeBlocks ends every request-scoped capability of this worker made
// before now that covers one of the blocks named, and returns once no
// request it allowed is still reading them: the blocks can then go to
// their next owner. A P/D prefill revokes a request's blocks when it is
// released (the decode's done, its lease's end, an abort). Capabilities
// made afterwards, for the blocks' next owner, are not touched; nor are
// whole-worker ones (ExportMetadata), which are the deployment's.
// Everything is checked before anything is revoked. A transport that
// cannot scope has nothing to revoke.
func (w *PhysicalWorker) RevokeBlocks(blocks map[Tier][]int) error {
	tiers, ls, err := w.scopeLayouts("revoke", blocks)
	if err != nil {
		return err
	}
	for i, sl := range ls {
		l, _, err := w.m.Layout(sl.Layout)
		if err != nil {
			return fmt.Errorf("revoke: %v: %w", tiers[i], err)
		}
		if j := slices.IndexFunc(sl.Blocks, func(b int) bool { return b < 0 || b >= l.Config().NumBlocks }); j >= 0 {
			return fmt.Errorf("%w: revoke: block %d of %v, which has %d", kvbmerr.ErrOutOfRange, sl.Blocks[j], tiers[i], l.Config().NumBlocks)
		}
	}
	r, ok := w.network.(remote.Revoker)
	if !ok {
		return nil
	}
	return r.RevokeBlocks(ls)
}

// scopeLayouts is the layouts of the tiers blocks names (with their
// blocks), in tier order: what a scope (or a revocation) covers. The tiers
// must be G1 to G3 and registered; what names the call in errors.
func (w *PhysicalWorker) scopeLayouts(what string, blocks map[Tier][]int) ([]Tier, []remote.ScopedLayout, error) {
	if len(blocks) == 0 {
		return nil, nil, fmt.Errorf("%w: %s: the scope names no tier", kvbmerr.ErrInvalidArgument, what)
	}
	tiers := slices.Sorted(maps.Keys(blocks))
	ls := make([]remote.ScopedLayout, 0, len(tiers))
	for _, t := range tiers {
		if !t.valid() {
			return nil, nil, fmt.Errorf("%w: %s: tier %d is not G1, G2 or G3", kvbmerr.ErrInvalidArgument, what, t)
		}
		h, err := w.handle(t, what)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		ls = append(ls, remote.ScopedLayout{Layout: h, Blocks: blocks[t]})
	}
	return tiers, ls, nil
}

// adopt files a peer that connect made for md's worker: a request-scoped
// one joins the worker's current scoped peer when that reaches the same
// server (the attacher is then that peer), and is refused with
// ErrScopedBusy when it reaches another while the current one is
// connected; anything else replaces the current peer, which closes.
// Called with w.mu held; the peer to close is returned.
func (w *PhysicalWorker) adopt(wid uint64, p remote.Peer) (attacher remote.Peer, closeOld remote.Peer, err error) {
	old := w.peers[wid]
	if j, ok := old.(remote.Joiner); ok {
		if j.Join(p) {
			return old, nil, nil
		}
		if _, scoped := p.(remote.Joiner); scoped {
			return nil, p, fmt.Errorf("%w: worker %x is reached at another address with request-scoped capabilities still connected; "+
				"this metadata is imported once they are disconnected", ErrScopedBusy, wid)
		}
	}
	w.peers[wid] = p
	return p, old, nil
}
