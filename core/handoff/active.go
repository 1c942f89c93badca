package handoff

import "github.com/kvbm/kvbm/kvbmerr"

// stepActive applies a fact while ownership is moving forward.
func stepActive(c *Coordinator, f Fact, out []Action) ([]Action, error) {
	switch f.Kind {
	case FactSourceHeld:
		return c.sourceHeld(f.Timing, out)
	case FactDestinationReserved:
		return c.destinationReserved(f.TransferableTokens, out)
	case FactTransferCompleted:
		return c.transferCompleted(out)
	default: // FactFailed, FactTimedOut, FactCanceled
		return c.beginCleanup(out), nil
	}
}

func (c *Coordinator) sourceHeld(timing TransferTiming, out []Action) ([]Action, error) {
	if c.source.held {
		return out, nil
	}
	if !c.source.submitted {
		return out, kvbmerr.Detail(ErrFactOutOfOrder, FactSourceHeld.String()+" before "+ActionSubmitPrefill.String()+" was acknowledged")
	}
	if err := timing.Validate(); err != nil {
		return out, err
	}
	c.source.held = true
	c.source.timing = timing
	return advanceActive(c, out), nil
}

func (c *Coordinator) destinationReserved(transferableTokens uint64, out []Action) ([]Action, error) {
	if c.destination.reserved {
		return out, nil
	}
	if !c.destination.accepted {
		return out, kvbmerr.Detail(ErrFactOutOfOrder, FactDestinationReserved.String()+" before "+ActionReserveDestination.String()+" was accepted")
	}
	c.destination.reserved = true
	c.destination.transferableTokens = transferableTokens
	return advanceActive(c, out), nil
}

func (c *Coordinator) transferCompleted(out []Action) ([]Action, error) {
	if c.transfer.completed {
		return out, nil
	}
	if !c.transfer.scheduled {
		return out, kvbmerr.Detail(ErrFactOutOfOrder, FactTransferCompleted.String()+" before "+ActionStartTransfer.String()+" was scheduled")
	}
	c.transfer.completed = true
	return advanceActive(c, out), nil
}

// advanceActive appends the one next action that the progress allows, if
// any. Each input (fact or outcome) unlocks at most one step of the happy
// path, so one action per call is enough to never stall.
func advanceActive(c *Coordinator, out []Action) []Action {
	src, dst, xfer := &c.source, &c.destination, &c.transfer
	switch {
	case c.order == SourceFirst && src.held && !dst.reserveIssued:
		return c.issueReserveDestination(out)
	case c.order == DestinationFirst && dst.reserved && !src.submitIssued:
		return c.issueSubmitPrefill(out)
	case src.held && dst.reserved && !xfer.issued:
		xfer.issued = true
		delay, ok := src.timing.DelayMs(dst.transferableTokens)
		if !ok {
			delay = c.fallbackDelayMs
		}
		out = c.issue(out, ActionStartTransfer)
		out[len(out)-1].DelayMs = delay
		return out
	case xfer.completed && !dst.activationIssued:
		dst.activationIssued = true
		return c.issue(out, ActionActivateDestination)
	case dst.activated && !src.releaseIssued:
		src.releaseIssued = true
		return c.issue(out, ActionReleaseSource)
	case src.cleanedUp:
		// Only ReleaseSource cleans the source up while active, and it is
		// issued last: this is the end of the happy path.
		return c.complete(out)
	}
	return out
}
