package transfer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Notification is the completion of one transfer. It completes exactly once,
// with success or an error naming what failed; it is never dropped, and a
// failed transfer is never reported as done. Safe for concurrent use.
type Notification struct {
	done   chan struct{}
	ended  atomic.Bool // set by the first completion, the only one that counts
	err    error
	failed []int
	// cancel stops the transfer's remote operations (nil when it has none).
	cancel context.CancelCauseFunc
}

// ErrCanceled is wrapped by the errors of blocks whose transfer was
// canceled (Notification.Cancel) or ran past its Options.Deadline; past the
// deadline they also wrap kvbmerr.ErrDeadlineExceeded, which gives them
// their kind.
var ErrCanceled = kvbmerr.New(kvbmerr.Canceled, "transfer canceled")

// Cancel stops the transfer's operations on a peer's memory that have not
// completed: their blocks fail with an error wrapping ErrCanceled, the
// others complete as they would. Once the notification completes nothing
// more is written to the destination blocks, so that the caller can reuse
// them. Copies already handed to the device or the disk finish first; a
// transfer without remote operations is not changed. Safe to call at any
// time, more than once.
func (n *Notification) Cancel() {
	if n.cancel != nil {
		n.cancel(fmt.Errorf("%w by the caller", ErrCanceled))
	}
}

func newNotification() *Notification { return &Notification{done: make(chan struct{})} }

// completed returns a notification that is already complete.
func completed(err error) *Notification {
	n := &Notification{}
	n.complete(err)
	return n
}

// complete records the result; only the first call counts.
func (n *Notification) complete(err error) {
	if err == nil {
		n.completeWith(nil, nil)
		return
	}
	n.completeWith(err, failedBlocks(err))
}

// closedDone is the done channel of notifications completed before anyone
// else could see them (a small transfer finished inside its call): one
// channel for all, already closed, instead of one made and closed each.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// completeWith is complete with err's failed blocks already worked out. A
// notification without a done channel must not have been handed out yet.
func (n *Notification) completeWith(err error, failed []int) {
	if !n.ended.CompareAndSwap(false, true) {
		return
	}
	n.err, n.failed = err, failed
	if n.done == nil {
		n.done = closedDone
		return
	}
	close(n.done)
}

// failedBlocks is the sorted, distinct failed blocks of an *Error in err.
func failedBlocks(err error) []int {
	var te *Error
	if !errors.As(err, &te) {
		return nil
	}
	failed := slices.Clone(te.FailedBlocks)
	slices.Sort(failed)
	return slices.Compact(failed)
}

// Done is closed when the transfer completes.
func (n *Notification) Done() <-chan struct{} { return n.done }

// Poll reports whether the transfer completed and, if so, its result.
func (n *Notification) Poll() (bool, error) {
	select {
	case <-n.done:
		return true, n.err
	default:
		return false, nil
	}
}

// Wait blocks until the transfer completes or ctx ends. A context that ends
// first returns an error wrapping ErrTimeout and ctx.Err(); the transfer
// goes on and can be waited for again.
func (n *Notification) Wait(ctx context.Context) error {
	if done, err := n.Poll(); done {
		return err // completion wins over a context that ended too
	}
	select {
	case <-n.done:
		return n.err
	case <-ctx.Done():
		return fmt.Errorf("%w waiting for transfer: %w", ErrTimeout, ctx.Err())
	}
}

// WaitTimeout is Wait with a timeout; a negative timeout waits forever.
func (n *Notification) WaitTimeout(timeout time.Duration) error {
	// A poll first: it takes no lock, where a blocking receive takes the
	// channel's, and transfers completed in their call share one channel
	// (closedDone) across every worker. It also keeps a select below from
	// picking the timer half the time.
	if done, err := n.Poll(); done {
		return err
	}
	if timeout < 0 {
		<-n.done
		return n.err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-n.done:
		return n.err
	case <-t.C:
		return fmt.Errorf("%w: transfer not complete after %v", ErrTimeout, timeout)
	}
}

// FailedBlocks are the destination block ids whose data is not valid, sorted;
// empty while pending or on success.
func (n *Notification) FailedBlocks() []int {
	select {
	case <-n.done:
		return slices.Clone(n.failed)
	default:
		return nil
	}
}

// Aggregate completes when all of ns have, with the errors of those that
// failed joined and their failed blocks merged.
func Aggregate(ns ...*Notification) *Notification {
	out := newNotification()
	go func() {
		var errs []error
		var failed []int
		for _, n := range ns {
			<-n.done
			if n.err != nil {
				errs = append(errs, n.err)
				failed = append(failed, n.failed...)
			}
		}
		if len(errs) == 0 {
			out.complete(nil)
			return
		}
		out.complete(&Error{FailedBlocks: failed, Err: errors.Join(errs...)})
	}()
	return out
}

// Go runs fn in the background and returns a notification that completes
// with its result; an *Error from fn carries its failed blocks.
func Go(fn func() error) *Notification {
	n := newNotification()
	go func() { n.complete(fn()) }()
	return n
}

// Go is the package's Go for work on this manager's layouts outside
// ExecuteTransfer (object store I/O): Close waits for it, and once the
// manager is closed it is refused.
func (m *Manager) Go(fn func() error) (*Notification, error) {
	if err := m.begin(); err != nil {
		return nil, err
	}
	n := newNotification()
	go func() {
		defer m.inflight.leave()
		n.complete(fn())
	}()
	return n, nil
}
