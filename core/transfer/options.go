package transfer

import (
	"fmt"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/cuda"
)

// LayerRange is the half-open range of layers [Start, End) a transfer moves.
type LayerRange struct{ Start, End int }

// Options tune one transfer. The zero value moves all layers on the
// manager's own streams with no precondition.
type Options struct {
	// Layers limits the transfer to a range of layers; nil moves all.
	Layers *LayerRange
	// Stream, when set, is the stream device copies are enqueued on, in call
	// order, so that an event the caller records on it afterwards covers
	// them. It applies to single-hop device copies (pinned↔device,
	// device↔device); other paths use the manager's own.
	Stream *cuda.Stream
	// Bounce is pinned memory for two-hop transfers (disk↔device,
	// disk↔disk); without it the manager uses buffers of its own.
	Bounce *Bounce
	// Precondition, when non-zero, is an event the copy must wait for: the
	// engine's compute event, so that a copy never reads KV still being
	// written.
	Precondition cuda.Event
	// Deadline, when set, bounds the transfer's operations on a peer's
	// memory as a whole: when it passes, those not complete stop and their
	// blocks fail (as Notification.Cancel, with an error that is also
	// kvbmerr.ErrDeadlineExceeded and of its kind), the peer staying
	// connected.
	// Each operation also has the manager's RemoteDeadline.
	Deadline time.Duration
	// Heads, when set, moves a slice of each fragment's KV heads instead
	// of whole fragments (heterogeneous tensor parallelism: the two
	// layouts' fragments hold different numbers of heads of one size).
	// Between memory layouts only (host, device, a peer's): disk blocks
	// are checksummed whole.
	Heads *layout.HeadSlice
}

// Bounce names blocks of a registered pinned layout used as staging space.
type Bounce struct {
	Handle   LayoutHandle
	BlockIDs []int
}

// Layers is a convenience for an Options.Layers value.
func Layers(start, end int) *LayerRange { return &LayerRange{Start: start, End: end} }

// StreamOf is a convenience for an Options.Stream value.
func StreamOf(s cuda.Stream) *cuda.Stream { return &s }

func (r *LayerRange) resolve(numLayers int) (LayerRange, error) {
	if r == nil {
		return LayerRange{0, numLayers}, nil
	}
	if r.Start < 0 || r.End > numLayers || r.Start >= r.End {
		return LayerRange{}, fmt.Errorf("%w: layer range [%d, %d) is not within [0, %d) or is empty",
			ErrOutOfRange, r.Start, r.End, numLayers)
	}
	return *r, nil
}
