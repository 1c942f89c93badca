//go:build cgo

package ucx

import (
	"fmt"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// The narrower capabilities of the message mode, as the TCP transport's:
// a read-only endpoint, and one that reads some blocks until they are
// revoked or it expires. The exporter checks every read of a session
// against the capability its hello proved (serve.go).

var (
	_ remote.ReadOnlyEndpointer = (*Transport)(nil)
	_ remote.ScopedEndpointer   = (*Transport)(nil)
	_ remote.Revoker            = (*Transport)(nil)
)

// ReadOnlyEndpoint is an endpoint whose holder reads the worker's layouts
// and writes none (no UCX endpoint writes in the message mode; the scope
// is what the exporter checks).
func (t *Transport) ReadOnlyEndpoint() ([]byte, error) {
	return t.scopedEndpoint(func(info *endpointInfo) error {
		info.scope, info.key = capability.ScopeReadOnly, t.secret.ReadOnly()
		return nil
	})
}

// ScopedEndpoint is an endpoint whose holder reads the blocks s names and
// nothing else, until s.Expires or until they are revoked (RevokeBlocks).
func (t *Transport) ScopedEndpoint(s remote.Scope) ([]byte, error) {
	return t.scopedEndpoint(func(info *endpointInfo) error {
		m := t.manager()
		if _, err := remote.OwnBlocks(m, "block scope", s.Layouts); err != nil {
			return err
		}
		desc, err := remote.EncodeScope(m.WorkerID(), s, t.revoked.Epoch())
		if err != nil {
			return err
		}
		info.scope, info.key, info.desc = capability.ScopeBlocks, t.secret.Blocks(desc), desc
		return nil
	})
}

// RevokeBlocks ends the block scopes made before now that cover one of
// the blocks named, and returns once no read they allowed is still being
// served.
func (t *Transport) RevokeBlocks(layouts []remote.ScopedLayout) error {
	m := t.manager()
	if m == nil {
		return fmt.Errorf("%w: ucx: revoke before Serve", kvbmerr.ErrInvalidArgument)
	}
	rs, err := remote.OwnBlocks(m, "revoke", layouts)
	if err != nil {
		return err
	}
	t.revoked.Revoke(rs...)
	return nil
}

// scopedEndpoint is Endpoint with the capability narrowed by narrow.
func (t *Transport) scopedEndpoint(narrow func(*endpointInfo) error) ([]byte, error) {
	if t.cfg.OneSided {
		return nil, fmt.Errorf("%w: ucx: the one-sided mode carries no capability: its rkeys reach every registered layout", kvbmerr.ErrUnsupported)
	}
	info, err := t.endpointInfo()
	if err != nil {
		return nil, err
	}
	if err := narrow(info); err != nil {
		return nil, err
	}
	return info.encode(), nil
}

func (t *Transport) manager() *transfer.Manager {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.serving
}
