package handoff

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The numeric values are part of the C ABI. This table is what the C header
// mirrors; a change here is an ABI break.
func TestStableEnumValues(t *testing.T) {
	for _, tc := range []struct {
		value fmt.Stringer
		num   uint8
		name  string
	}{
		{SourceFirst, 1, "SourceFirst"},
		{DestinationFirst, 2, "DestinationFirst"},
		{Order(0), 0, "Order(0)"},

		{EngineVLLM, 1, "vLLM"},
		{EngineSGLang, 2, "SGLang"},
		{EngineTRTLLM, 3, "TRT-LLM"},
		{Engine(4), 4, "Engine(4)"},

		{FactSourceHeld, 1, "SourceHeld"},
		{FactDestinationReserved, 2, "DestinationReserved"},
		{FactTransferCompleted, 3, "TransferCompleted"},
		{FactFailed, 4, "Failed"},
		{FactTimedOut, 5, "TimedOut"},
		{FactCanceled, 6, "Canceled"},
		{FactKind(7), 7, "FactKind(7)"},

		{TimingFullPrompt, 1, "FullPrompt"},
		{TimingDestinationMissing, 2, "DestinationMissing"},
		{TimingMode(0), 0, "TimingMode(0)"},

		{ActionSubmitPrefill, 1, "SubmitPrefill"},
		{ActionReserveDestination, 2, "ReserveDestination"},
		{ActionStartTransfer, 3, "StartTransfer"},
		{ActionActivateDestination, 4, "ActivateDestination"},
		{ActionReleaseSource, 5, "ReleaseSource"},
		{ActionCancelSource, 6, "CancelSource"},
		{ActionCancelDestination, 7, "CancelDestination"},
		{ActionComplete, 8, "Complete"},
		{ActionKind(9), 9, "ActionKind(9)"},

		{OutcomeSubmitted, 1, "Submitted"},
		{OutcomeAccepted, 2, "Accepted"},
		{OutcomeScheduled, 3, "Scheduled"},
		{OutcomeApplied, 4, "Applied"},
		{OutcomeNoop, 5, "Noop"},
		{OutcomeFailed, 6, "Failed"},
		{OutcomeKind(0), 0, "OutcomeKind(0)"},

		{CompletionNone, 0, "None"},
		{CompletionSuccess, 1, "Success"},
		{CompletionCanceled, 2, "Canceled"},
		{Completion(3), 3, "Completion(3)"},

		{EventSourceHeld, 1, "SourceHeld"},
		{EventDestinationAccepted, 2, "DestinationAccepted"},
		{EventDestinationReserved, 3, "DestinationReserved"},
		{EventDestinationActivated, 4, "DestinationActivated"},
		{EventSourceReleased, 5, "SourceReleased"},
		{EventCompleted, 6, "Completed"},
		{NormalizedEvent(0), 0, "NormalizedEvent(0)"},
	} {
		require.Equal(t, tc.name, tc.value.String())
		require.Equal(t, fmt.Sprint(tc.num), fmt.Sprintf("%d", tc.value), tc.name)
	}
}

func TestStrings(t *testing.T) {
	id := HandoffID{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}
	require.Equal(t, "12345678-9abc-def0-0123-456789abcdef", id.String())
	require.Equal(t, "Failed(\"no \\\"room\\\"\")", Outcome{Kind: OutcomeFailed, Message: `no "room"`}.String())
	require.Equal(t, "Applied", Outcome{Kind: OutcomeApplied, Message: "ignored"}.String())
	require.Equal(t, "7 StartTransfer delay=0.25ms", Action{ID: 7, Kind: ActionStartTransfer, DelayMs: 0.25}.String())
	require.Equal(t, "8 Complete Success", Action{ID: 8, Kind: ActionComplete, Completion: CompletionSuccess}.String())
	require.Equal(t, "2 CancelSource", Action{ID: 2, Kind: ActionCancelSource}.String())
}
