// Package handoff sequences one prefill→decode hand-off of a request's KV
// cache: the prefill instance (the source) computes and holds the KV, the
// decode instance (the destination) reserves room for it, the KV moves, the
// destination takes ownership and the source lets go.
//
// A Coordinator is a pure state machine in the style of etcd-io/raft's
// RawNode: it does no I/O, starts no goroutines and reads no clock. Facts
// about the world (the source holds the KV, a timeout fired, …) and the
// outcomes of the actions it asked for go in; the actions still to be done
// come out. The driver — the engine connector — executes the actions and
// reports back. Time and failure reach the coordinator only as facts.
//
// # The caller's loop
//
//  1. Make one Coordinator per hand-off with NewCoordinator, giving the
//     hand-off's id, the Order of the engine (OrderFor maps an Engine to its
//     Order) and the delay to put on StartTransfer when the transfer timing
//     gives none.
//
//  2. Call Start once. It appends the first action to the slice you pass:
//     SubmitPrefill for SourceFirst (vLLM), ReserveDestination for
//     DestinationFirst (SGLang).
//
//  3. Execute every action you get, in the order given. A call returns at
//     most MaxActionsPerCall actions, and two only during cleanup:
//     CancelSource and CancelDestination, which touch different instances and
//     may run concurrently.
//
//  4. When an action has been executed, report how it went with Outcome,
//     passing the action's ID and the Outcome its kind accepts (see
//     ActionKind). Report OutcomeFailed, with a message, when it could not be
//     done; that begins cleanup. A cancel cannot fail: retry it until it
//     reports OutcomeApplied or OutcomeNoop. Reporting the same outcome again
//     is harmless; a different one is an error. ActionComplete needs no
//     outcome.
//
//  5. When the engines tell you something, Step the matching Fact:
//     FactSourceHeld once the source holds the prefilled KV,
//     FactDestinationReserved once the destination has reserved blocks,
//     FactTransferCompleted once the KV has arrived, and FactFailed,
//     FactTimedOut or FactCanceled when the hand-off must be abandoned.
//     Timeouts are yours to measure; the coordinator has no clock.
//
//  6. Every call of Start, Step and Outcome may return more actions: go back
//     to step 3. Actions are appended to the slice you pass, so a driver that
//     reuses one buffer (out, err = c.Step(f, out[:0])) allocates nothing.
//
//  7. The hand-off is over when an ActionComplete comes back: its Completion
//     (also Coordinator.Completion) says whether ownership moved
//     (CompletionSuccess) or every side that started was canceled
//     (CompletionCanceled).
//     Release whatever you keep for the hand-off and drop the coordinator.
//     From then on every call returns nothing (a fact for another hand-off,
//     or of an unknown kind, is still an error).
//
// An error means the input was wrong — a fact for another hand-off, a fact
// that cannot have happened yet, an outcome that does not fit its action — and
// it was not applied: the coordinator is exactly as it was. A driver can fix
// the input and retry, or Step FactFailed to clean up.
//
// A Coordinator is not safe for concurrent use; the driver serialises calls,
// as it does for a raft RawNode.
//
// # Stable numbers
//
// Order, FactKind, TimingMode, ActionKind, OutcomeKind and Completion are
// numeric types whose values are part of the C ABI: include/kvbm.h mirrors
// them (kvbm_handoff_order_t, kvbm_handoff_fact_kind_t, …) and they must
// never be renumbered. Zero is never a valid value, except CompletionNone,
// so a zeroed C struct is caught. MaxActionsPerCall is mirrored as
// KVBM_HANDOFF_MAX_ACTIONS. Engine is not in the C ABI — a C driver passes
// the Order itself — but its values are kept stable as well.
package handoff
