package handoff

// beginCleanup abandons the hand-off: from now on facts are ignored and the
// sides that started are canceled.
func (c *Coordinator) beginCleanup(out []Action) []Action {
	if c.mode == modeComplete {
		return out
	}
	c.becomeCleaningUp()
	return advanceCleanup(c, out)
}

// advanceCleanup appends a cancel for each side that was started and is
// neither cleaned up nor already being canceled — up to two actions — and,
// once no side is left to wait for, completes the hand-off as canceled.
func advanceCleanup(c *Coordinator, out []Action) []Action {
	src, dst := &c.source, &c.destination
	n := len(out)
	if src.submitIssued && !src.cancelIssued && !src.cleanedUp {
		src.cancelIssued = true
		out = c.issue(out, ActionCancelSource)
	}
	if dst.reserveIssued && !dst.cancelIssued && !dst.cleanedUp {
		dst.cancelIssued = true
		out = c.issue(out, ActionCancelDestination)
	}
	sourceDone := !src.submitIssued || src.cleanedUp
	destinationDone := !dst.reserveIssued || dst.cleanedUp
	if len(out) == n && sourceDone && destinationDone {
		out = c.complete(out)
	}
	return out
}
