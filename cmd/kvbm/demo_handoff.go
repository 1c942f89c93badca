package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvbm/kvbm/core/handoff"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
)

// prefillInstance is the id under which the decode worker knows the prefill
// instance.
const prefillInstance worker.InstanceID = 0xA11CE

// handoffRun is what one hand-off did.
type handoffRun struct {
	trace      []string      // actions, outcomes and facts in order
	transfer   time.Duration // issue to completion of the KV pull
	completion handoff.Completion
}

// runHandoff hands the KV in prefill's G2 blocks srcIDs over to decode's G1
// blocks dstIDs, vLLM style (SourceFirst), by driving a handoff.Coordinator:
// every action it returns is executed here and its outcome reported, and the
// facts the two workers produce are stepped in.
func runHandoff(prefill, decode *tierWorker, srcIDs, dstIDs []int, blockSize int) (*handoffRun, error) {
	id := handoff.HandoffID{0x6b, 0x76, 0x62, 0x6d, 0x2d, 0x64, 0x65, 0x6d, 0x6f, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01}
	order, err := handoff.OrderFor(handoff.EngineVLLM)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	c, err := handoff.NewCoordinator(id, order, 0)
	if err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	run := &handoffRun{}
	tokens := uint64(len(srcIDs) * llama3_8B(1).PageSize)

	var queue []handoff.Action
	step := func(f handoff.Fact) error {
		f.Handoff = id
		run.trace = append(run.trace, "fact "+f.Kind.String())
		out, err := c.Step(f, nil)
		if err != nil {
			return fmt.Errorf("handoff: step %s: %w", f.Kind, err)
		}
		queue = append(queue, out...)
		return nil
	}
	report := func(a handoff.Action, o handoff.Outcome) error {
		run.trace = append(run.trace, a.Kind.String()+"→"+o.String())
		out, err := c.Outcome(a.ID, o, nil)
		if err != nil {
			return fmt.Errorf("handoff: outcome %s of %s: %w", o, a, err)
		}
		queue = append(queue, out...)
		return nil
	}
	var failure error
	fail := func(a handoff.Action, err error) error {
		failure = errors.Join(failure, fmt.Errorf("%s: %w", a.Kind, err))
		return report(a, handoff.Outcome{Kind: handoff.OutcomeFailed, Message: err.Error()})
	}

	queue = c.Start(queue)
	for len(queue) > 0 {
		a := queue[0]
		queue = queue[1:]
		var err error
		switch a.Kind {
		case handoff.ActionSubmitPrefill:
			// The prefill already ran: its KV is in prefill's G2.
			if err = report(a, handoff.Outcome{Kind: handoff.OutcomeSubmitted}); err == nil {
				err = step(handoff.Fact{Kind: handoff.FactSourceHeld, Timing: handoff.TransferTiming{
					Mode: handoff.TimingFullPrompt, FullPromptTokens: tokens,
					KVBytesPerToken: uint64(blockSize) / uint64(llama3_8B(1).PageSize), HasKVBytesPerToken: true,
				}})
			}
		case handoff.ActionReserveDestination:
			// The decode worker's G1 blocks dstIDs are reserved for the request.
			if err = report(a, handoff.Outcome{Kind: handoff.OutcomeAccepted}); err == nil {
				err = step(handoff.Fact{Kind: handoff.FactDestinationReserved, TransferableTokens: tokens})
			}
		case handoff.ActionStartTransfer:
			var n *transfer.Notification
			start := time.Now()
			n, err = startPull(prefill, decode, srcIDs, dstIDs)
			if err != nil {
				err = fail(a, err)
				break
			}
			if err = report(a, handoff.Outcome{Kind: handoff.OutcomeScheduled}); err != nil {
				break
			}
			if werr := n.WaitTimeout(waitLimit); werr != nil {
				failure = errors.Join(failure, fmt.Errorf("pull prefill G2 → decode G1: %w", werr))
				err = step(handoff.Fact{Kind: handoff.FactFailed})
				break
			}
			run.transfer = time.Since(start)
			err = step(handoff.Fact{Kind: handoff.FactTransferCompleted})
		case handoff.ActionActivateDestination:
			// The decode side may now read the KV in its G1.
			err = report(a, handoff.Outcome{Kind: handoff.OutcomeApplied})
		case handoff.ActionReleaseSource:
			// The prefill side lets go of its G2 blocks.
			err = report(a, handoff.Outcome{Kind: handoff.OutcomeApplied})
		case handoff.ActionCancelSource, handoff.ActionCancelDestination:
			err = report(a, handoff.Outcome{Kind: handoff.OutcomeApplied})
		case handoff.ActionComplete:
			run.trace = append(run.trace, "Complete("+a.Completion.String()+")")
			run.completion = a.Completion
		default:
			err = fmt.Errorf("handoff: unexpected action %s", a)
		}
		if err != nil {
			return run, errors.Join(err, failure)
		}
	}
	if failure != nil {
		return run, fmt.Errorf("handoff ended %s: %w", c.Completion(), failure)
	}
	if !c.IsComplete() || c.Completion() != handoff.CompletionSuccess {
		return run, fmt.Errorf("handoff ended %s after %s", c.Completion(), strings.Join(run.trace, ", "))
	}
	return run, nil
}

// startPull connects the decode worker to the prefill instance (its exported
// metadata, over the loopback transport both share) and starts pulling
// prefill's G2 blocks into the decode worker's G1.
func startPull(prefill, decode *tierWorker, srcIDs, dstIDs []int) (*transfer.Notification, error) {
	md, err := prefill.ExportMetadata()
	if err != nil {
		return nil, fmt.Errorf("export prefill metadata: %w", err)
	}
	if !decode.HasRemoteMetadata(prefillInstance) {
		if err := decode.ConnectRemote(prefillInstance, [][]byte{md}); err != nil {
			return nil, fmt.Errorf("decode connect to prefill: %w", err)
		}
	}
	n, err := decode.ExecuteRemoteOnboardForInstance(prefillInstance, worker.G2, srcIDs, worker.G1, dstIDs, transfer.Options{})
	if err != nil {
		return nil, fmt.Errorf("pull prefill G2 → decode G1: %w", err)
	}
	return n, nil
}
