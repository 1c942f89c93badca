package transfer

import (
	"fmt"
	"time"

	"github.com/kvbm/kvbm/cuda"
)

// ExecuteLayerwiseOnboard copies blocks from a host layout to a device
// layout one layer at a time on one stream, recording events[L] on that
// stream right after layer L's copies, so that the engine can make its
// compute stream wait on layer L's event before attention of layer L while
// later layers are still in flight.
//
// stream is the caller's stream, or nil for one of the manager's. The
// number of events must equal the number of layers, and the id lists must
// have equal lengths; the whole request is validated before any copy is
// enqueued. The events are the caller's: they are recorded, never
// destroyed. The notification completes after the last layer.
func (m *Manager) ExecuteLayerwiseOnboard(src LayoutHandle, srcIDs []int, dst LayoutHandle, dstIDs []int,
	events []cuda.Event, stream *cuda.Stream) (*Notification, error) {
	// prepare checks the ids as for any transfer, their lengths included.
	p, err := m.prepare(src, dst, srcIDs, dstIDs, Options{})
	if err != nil {
		return nil, fmt.Errorf("layer-wise onboard: %w", err)
	}
	numLayers := p.src.layout.Config().NumLayers
	if len(events) != numLayers {
		return nil, fmt.Errorf("%w: layer-wise onboard: %d layer events given, the layout has %d layers",
			ErrInvalidArgument, len(events), numLayers)
	}
	for i, ev := range events {
		if ev == 0 {
			return nil, fmt.Errorf("%w: layer-wise onboard: layer event %d is null", ErrInvalidArgument, i)
		}
	}
	strat, kind, err := strategyOf(p.src, p.dst)
	if err != nil {
		return nil, fmt.Errorf("layer-wise onboard: %w", err)
	}
	if strat != deviceCopy || kind != cuda.HostToDevice {
		return nil, fmt.Errorf("%w: layer-wise onboard moves pinned host blocks to the device, not %v to %v",
			ErrUnsupported, p.src.kind, p.dst.kind)
	}
	var s cuda.Stream
	if stream != nil {
		s = *stream
	} else if s, err = m.h2d.next(); err != nil {
		return nil, err
	}
	release, err := m.hold(p.src, p.dst)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for layer := range numLayers {
		lp := subPlan(p.src, p.dst, srcIDs, dstIDs, LayerRange{layer, layer + 1})
		if err := m.enqueueCopies(lp.ops, kind, s, 0); err != nil {
			release()
			return nil, fmt.Errorf("layer-wise onboard, layer %d: %w", layer, err)
		}
		if err := m.drv.EventRecord(events[layer], s); err != nil {
			release()
			return nil, fmt.Errorf("layer-wise onboard, layer %d: record event: %w", layer, err)
		}
	}
	// An empty plan on the same stream yields the completion of the whole.
	done, err := m.enqueueDevice(subPlan(p.src, p.dst, nil, nil, p.layers), kind, Options{Stream: &s})
	if err != nil {
		release()
		return nil, err
	}
	n := newNotification()
	go func() {
		defer release()
		m.finish(n, p, PathH2D, start, done())
	}()
	return n, nil
}
