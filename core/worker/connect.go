package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Endpoint is one transport's address of a worker, as its metadata
// carries it: the transport's name and its opaque endpoint.
type Endpoint struct {
	Transport string
	Address   []byte
}

// serve makes the worker's layouts reachable on each transport it has.
func (w *PhysicalWorker) serve(loop *remote.Loopback, network remote.Transport) error {
	if loop != nil {
		if err := loop.Serve(w.m); err != nil {
			return err
		}
		w.loopback = loop
	}
	if network != nil {
		if err := w.ServeNetwork(network); err != nil {
			return errors.Join(err, w.leave())
		}
	}
	return nil
}

// ServeNetwork makes the worker's layouts reachable by other processes
// over network (TCP or UCX), and theirs through it: the transport starts
// listening here. The worker takes network over and closes it, at Close,
// or at once when serving fails. A worker has one network transport, set
// before the worker is shared between goroutines (core/node does it at
// create).
func (w *PhysicalWorker) ServeNetwork(network remote.Transport) error {
	if w.network != nil {
		return errors.Join(fmt.Errorf("%w: worker %x serves on %s already", ErrAlreadyExists, w.m.WorkerID(), w.network.Name()),
			network.Close())
	}
	if err := network.Serve(w.m); err != nil {
		return errors.Join(fmt.Errorf("serve on %s: %w", network.Name(), err), network.Close())
	}
	w.network = network
	return nil
}

// transports are the worker's transports, loopback first.
func (w *PhysicalWorker) transports() []remote.Transport {
	var out []remote.Transport
	if w.loopback != nil {
		out = append(out, w.loopback)
	}
	if w.network != nil {
		out = append(out, w.network)
	}
	return out
}

// exportEndpoints asks each transport for its current endpoint, a
// read-only one when readOnly (the loopback's reaches this process only,
// which is trusted; a transport that cannot scope is refused).
func (w *PhysicalWorker) exportEndpoints(readOnly bool) ([]Endpoint, error) {
	var out []Endpoint
	for _, t := range w.transports() {
		get := t.Endpoint
		if ro, ok := t.(remote.ReadOnlyEndpointer); ok && readOnly {
			get = ro.ReadOnlyEndpoint
		} else if readOnly && t.Name() != "loopback" {
			return nil, fmt.Errorf("%w: %s cannot export a read-only capability", kvbmerr.ErrUnsupported, t.Name())
		}
		ep, err := get()
		if err != nil {
			return nil, fmt.Errorf("%s endpoint: %w", t.Name(), err)
		}
		out = append(out, Endpoint{Transport: t.Name(), Address: ep})
	}
	return out, nil
}

// leave stops serving and closes the peers.
func (w *PhysicalWorker) leave() error {
	if w.loopback != nil {
		w.loopback.Remove(w.m)
	}
	if w.network != nil {
		return w.network.Close() // closes its peers too
	}
	return nil
}

// Transports names the transports the worker serves on, loopback first.
func (w *PhysicalWorker) Transports() []string {
	var out []string
	for _, t := range w.transports() {
		out = append(out, t.Name())
	}
	return out
}

// connect picks how to reach the worker of md: directly when it lives in
// this process, otherwise over the network transport, connecting afresh
// (a reimport after a peer failed reconnects it). made is the network
// peer it connected (nil for the loopback): a request-scoped one may have
// joined the worker's current peer (adopt), which is then the attacher.
func (w *PhysicalWorker) connect(md Metadata) (a transfer.Attacher, made remote.Peer, err error) {
	if len(md.Endpoints) == 0 && w.loopback != nil {
		return w.loopback, nil, nil // metadata made without transports: this process only
	}
	for _, ep := range md.Endpoints {
		if ep.Transport == "loopback" && w.loopback != nil && w.loopback.Local(ep.Address) {
			return w.loopback, nil, nil
		}
	}
	if w.network != nil {
		for _, ep := range md.Endpoints {
			if ep.Transport != w.network.Name() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), w.m.RemoteDeadline())
			defer cancel()
			p, err := w.network.Connect(ctx, ep.Address)
			if err != nil {
				return nil, nil, fmt.Errorf("connect over %s: %w", ep.Transport, err)
			}
			w.mu.Lock()
			attacher, old, err := w.adopt(md.WorkerID, p)
			w.mu.Unlock()
			if old != nil {
				old.Close()
			}
			if err != nil {
				return nil, nil, err
			}
			return attacher, p, nil
		}
	}
	offered := make([]string, len(md.Endpoints))
	for i, ep := range md.Endpoints {
		offered[i] = ep.Transport
	}
	have := "no transport"
	if len(w.transports()) > 0 {
		have = "[" + strings.Join(w.Transports(), ", ") + "] (KVBM_TRANSPORT selects)"
	}
	return nil, nil, fmt.Errorf("%w: the worker offers [%s] (loopback only within its own process); this worker has %s",
		kvbmerr.ErrUnsupported, strings.Join(offered, ", "), have)
}

// DisconnectRemote forgets a connected instance: its layouts are no longer
// imported (unless another instance imported them too), and the
// connection to its worker closes unless another instance still uses it
// (a request-scoped one's own connections close). Transfers in flight on
// what closes fail. Engines call it for a peer that left, so that
// connections and imports do not pile up.
func (w *PhysicalWorker) DisconnectRemote(instance InstanceID) error {
	w.mu.Lock()
	var handles, unregister []transfer.LayoutHandle
	for k, h := range w.remote {
		if k.instance == instance {
			handles = append(handles, h)
			delete(w.remote, k)
		}
	}
	member := w.members[instance]
	delete(w.members, instance)
	var peers []remote.Peer
	left := map[uint64]bool{}
	for _, h := range handles {
		stillLayout, stillWorker := false, false
		for _, other := range w.remote {
			stillLayout = stillLayout || other == h
			stillWorker = stillWorker || other.Worker == h.Worker
		}
		if !stillLayout {
			unregister = append(unregister, h)
		}
		p, ok := w.peers[h.Worker]
		switch {
		case !ok || left[h.Worker]:
		case !stillWorker:
			peers = append(peers, p)
			delete(w.peers, h.Worker)
		case member != nil:
			if j, ok := p.(remote.Joiner); ok && j.Leave(member) {
				delete(w.peers, h.Worker) // nobody's left (instances connected otherwise)
			}
		}
		left[h.Worker] = true
	}
	w.mu.Unlock()
	if len(handles) == 0 {
		return fmt.Errorf("%w: instance %x is not connected", transfer.ErrNotFound, uint64(instance))
	}
	var errs []error
	for _, h := range unregister {
		if err := w.m.Unregister(h); err != nil && !errors.Is(err, transfer.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	for _, p := range peers {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
