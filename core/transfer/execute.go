package transfer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvbm/kvbm/kvbmerr"
)

// inlineCopyBytes is the most a host copy moves on the caller's goroutine.
const inlineCopyBytes = 256 << 10

// call is a transfer's working state, the plan and its device copies,
// reused from calls once the transfer finished: a small transfer then
// allocates only the notification it returns.
type call struct {
	p plan
	d deviceCopies
}

var calls = sync.Pool{New: func() any { return new(call) }}

// recycle returns c to calls, cleared, once nothing refers to its plan or
// copies any more (after finish, or on a refused request).
func (c *call) recycle() {
	*c = call{}
	calls.Put(c)
}

// finishCall is finish of c's plan; c is recycled after it.
func (m *Manager) finishCall(n *Notification, c *call, path Path, start time.Duration, err error) {
	m.finish(n, &c.p, path, start, err)
	c.recycle()
}

// ExecuteTransfer copies blocks srcIDs of layout src into blocks dstIDs of
// layout dst. The request is validated before any byte moves; a bad request
// returns an error and no notification. Otherwise the returned notification
// completes once the data is in place, or with an Error naming the failed
// destination blocks.
//
// Device copies are enqueued before ExecuteTransfer returns (on
// opts.Stream when set); other paths run in the background.
func (m *Manager) ExecuteTransfer(src LayoutHandle, srcIDs []int, dst LayoutHandle, dstIDs []int, opts Options) (*Notification, error) {
	c := calls.Get().(*call)
	p := &c.p
	refuse := func(err error) (*Notification, error) { c.recycle(); return nil, err }
	if err := m.prepareInto(p, src, dst, srcIDs, dstIDs, opts); err != nil {
		return refuse(err)
	}
	strat, kind, err := strategyOf(p.src, p.dst)
	if err != nil {
		return refuse(err)
	}
	if strat == twoHop && opts.Bounce != nil {
		// Validate the bounce now, so a bad one is a request error.
		if p.bounce, p.bounceIDs, err = m.callerBounce(p, opts.Bounce); err != nil {
			return refuse(err)
		}
	}
	if len(srcIDs) == 0 {
		c.recycle()
		return completed(nil), nil
	}
	release, err := m.hold(p.src, p.dst, p.bounce)
	if err != nil {
		return refuse(err)
	}
	start, path := monotonic(), pathOf(strat, kind)
	// Its done channel is made just before a goroutine may complete it; one
	// completed here, before it is returned, shares an already-closed one.
	n := new(Notification)
	if p.src.remote != nil || p.dst.remote != nil {
		// A peer is involved: the transfer can be canceled, or run past
		// its deadline, and its remote operations then stop.
		ctx, cancel := context.WithCancelCause(context.Background())
		p.ctx, n.cancel = ctx, cancel
		if opts.Deadline > 0 {
			t := time.AfterFunc(opts.Deadline, func() {
				// Its kind is DeadlineExceeded (a status of its own at the
				// ABI), so that a caller tells a deadline from a cancel
				// without a clock; the operations were canceled all the same.
				cancel(fmt.Errorf("%w (%v): %w", kvbmerr.ErrDeadlineExceeded, opts.Deadline, ErrCanceled))
			})
			release0 := release
			release = func() { t.Stop(); release0() }
		}
	}
	if strat == deviceCopy {
		d := &c.d
		if err := m.enqueueDeviceInto(d, p, kind, opts); err != nil {
			release()
			return refuse(err)
		}
		if done, err := d.done(); done { // the device already ran them: no one need wait
			defer release()
			m.finishCall(n, c, path, start, err)
			return n, nil
		}
		n.done = make(chan struct{})
		go func() {
			defer release()
			m.finishCall(n, c, path, start, d.wait())
		}()
		return n, nil
	}
	if strat == hostCopy && opts.Precondition == 0 && p.bytes() <= inlineCopyBytes {
		// A small memcpy costs less than handing it to a goroutine.
		defer release()
		m.finishCall(n, c, path, start, m.copyHost(p))
		return n, nil
	}
	n.done = make(chan struct{})
	go func() {
		defer release()
		if strat == twoHop {
			m.finishCall(n, c, path, start, m.twoHop(p, opts))
			return
		}
		m.finishCall(n, c, path, start, m.runHop(p, opts))
	}()
	return n, nil
}
