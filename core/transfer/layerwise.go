package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/cuda"
)

// ExecuteLayerwiseOnboard copies blocks from a host layout to a device
// layout one layer at a time, recording events[L] on the stream right after
// layer L's copies (and those of every layer before it), so that the engine
// can make its compute stream wait on layer L's event before attention of
// layer L while later layers are still in flight. Large layers are split
// over two streams (enqueueLayers).
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
	start := monotonic()
	if err := m.enqueueLayers(p, srcIDs, dstIDs, events, s, kind); err != nil {
		release()
		return nil, err
	}
	// An empty plan on the same stream yields the completion of the whole.
	done, err := m.enqueueDevice(subPlan(p.src, p.dst, nil, nil, p.layers), kind, Options{Stream: &s})
	if err != nil {
		m.settleStreams(s) // the layers' copies, queued: done before the layouts are let go
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

// layerSplitBytes is the least a layer moves for its copies to be split
// over two streams.
const layerSplitBytes = 256 << 10

// enqueueLayers enqueues each layer's copies and records its event on s.
// A large layer's copies are split in two: one half on s, the other on a
// second stream that runs ahead of s through the layers, and s waits for
// that half before it records the layer's event. So layer L's event still
// covers layers 0..L (a reader that waits on it sees them all), and the two
// halves copy at once where the device has the engines (or host cores) for
// it. The second stream first waits for the work queued on s before the
// call, as the copies on s do.
func (m *Manager) enqueueLayers(p *plan, srcIDs, dstIDs []int, events []cuda.Event, s cuda.Stream, kind cuda.CopyKind) (err error) {
	numLayers := len(events)
	var side cuda.Stream
	defer func() {
		if err != nil { // the copies already queued run to their end before the layouts are let go
			m.settleStreams(s, side)
		}
	}()
	if p.bytes()/uint64(numLayers) >= layerSplitBytes && m.cfg.StreamsPerDirection > 1 {
		for range m.cfg.StreamsPerDirection { // a pool stream other than s
			next, err := m.h2d.next()
			if err != nil {
				return err
			}
			if next != s {
				side = next
				break
			}
		}
	}
	if side != 0 {
		if err := m.chain(s, side); err != nil {
			return fmt.Errorf("layer-wise onboard: %w", err)
		}
	}
	for layer := range numLayers {
		ops := subPlan(p.src, p.dst, srcIDs, dstIDs, LayerRange{layer, layer + 1}).ops
		if side != 0 && len(ops) > 1 {
			half := len(ops) / 2
			if err := m.enqueueCopies(nil, ops[half:], kind, side, 0); err != nil {
				return fmt.Errorf("layer-wise onboard, layer %d: %w", layer, err)
			}
			if err := m.chain(side, s); err != nil {
				return fmt.Errorf("layer-wise onboard, layer %d: %w", layer, err)
			}
			ops = ops[:half]
		}
		if err := m.enqueueCopies(nil, ops, kind, s, 0); err != nil {
			return fmt.Errorf("layer-wise onboard, layer %d: %w", layer, err)
		}
		if err := m.drv.EventRecord(events[layer], s); err != nil {
			return fmt.Errorf("layer-wise onboard, layer %d: record event: %w", layer, err)
		}
	}
	return nil
}

// chain makes work queued on to from now on wait for the work queued on
// from so far.
func (m *Manager) chain(from, to cuda.Stream) error {
	ev, err := m.events.get()
	if err != nil {
		return err
	}
	defer m.events.put(ev) // a wait captures the record at the call: reuse is safe
	if err := m.drv.EventRecord(ev, from); err != nil {
		return fmt.Errorf("record join event: %w", err)
	}
	return m.drv.StreamWaitEvent(to, ev)
}
