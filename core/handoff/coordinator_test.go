package handoff

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/internal/datadriven"
)

// TestData runs the scripts in testdata/. Commands:
//
//	new [order=SourceFirst|DestinationFirst] [handoff=N] [fallback=MS]
//	start
//	fact KIND [handoff=N] [mode=FullPrompt|DestinationMissing] [tokens=N]
//	     [kv-bytes=N] [bandwidth=GBS] [transferable=N]
//	outcome ID KIND [msg=TEXT]
//	state
//
// start, fact and outcome print the actions returned, one a line, or "error:"
// and the error, or "ok" when nothing came back. Handoff ids are written as
// small numbers; a coordinator's is 1 unless new says otherwise. Kinds are
// the names String returns, or numbers for values that have none.
func TestData(t *testing.T) {
	datadriven.RunScripts(t, "testdata", func() *script { return &script{} }, map[string]func(*script, *testing.T, datadriven.Command) string{
		"new":     (*script).new,
		"start":   (*script).start,
		"fact":    (*script).fact,
		"outcome": (*script).outcome,
		"state":   (*script).state,
	})
}

// script is what one testdata file drives.
type script struct {
	c *Coordinator
}

func testHandoffID(n uint64) HandoffID {
	var id HandoffID
	for i := 15; n > 0; i-- {
		id[i] = byte(n)
		n >>= 8
	}
	return id
}

func (s *script) new(t *testing.T, cmd datadriven.Command) string {
	order := SourceFirst
	if v, ok := cmd.Arg("order"); ok {
		order = parseEnum[Order](t, v)
	}
	c, err := NewCoordinator(testHandoffID(uintArg(t, cmd, "handoff", 1)), order, floatArg(t, cmd, "fallback", 0))
	if err != nil {
		require.Nil(t, c)
		return "error: " + err.Error()
	}
	s.c = c
	return "ok"
}

func (s *script) start(t *testing.T, _ datadriven.Command) string {
	return printStep(s.coordinator(t).Start(nil), nil)
}

func (s *script) fact(t *testing.T, cmd datadriven.Command) string {
	f := Fact{
		Kind:               parseEnum[FactKind](t, cmd.Word(t, 0)),
		Handoff:            testHandoffID(uintArg(t, cmd, "handoff", 1)),
		TransferableTokens: uintArg(t, cmd, "transferable", 0),
		Timing: TransferTiming{
			Mode:             TimingFullPrompt,
			FullPromptTokens: uintArg(t, cmd, "tokens", 0),
		},
	}
	if v, ok := cmd.Arg("mode"); ok {
		f.Timing.Mode = parseEnum[TimingMode](t, v)
	}
	if _, ok := cmd.Arg("kv-bytes"); ok {
		f.Timing.KVBytesPerToken, f.Timing.HasKVBytesPerToken = uintArg(t, cmd, "kv-bytes", 0), true
	}
	if _, ok := cmd.Arg("bandwidth"); ok {
		f.Timing.BandwidthGBs, f.Timing.HasBandwidthGBs = floatArg(t, cmd, "bandwidth", 0), true
	}
	out, err := s.coordinator(t).Step(f, nil)
	return printStep(out, err)
}

func (s *script) outcome(t *testing.T, cmd datadriven.Command) string {
	id, err := strconv.ParseUint(cmd.Word(t, 0), 10, 64)
	require.NoError(t, err, cmd.Line)
	o := Outcome{Kind: parseEnum[OutcomeKind](t, cmd.Word(t, 1))}
	o.Message, _ = cmd.Arg("msg")
	out, err := s.coordinator(t).Outcome(ActionID(id), o, nil)
	return printStep(out, err)
}

func (s *script) state(t *testing.T, _ datadriven.Command) string {
	c := s.coordinator(t)
	return "mode=" + c.mode.String() +
		" started=" + strconv.FormatBool(c.started) +
		" complete=" + strconv.FormatBool(c.IsComplete()) +
		" completion=" + c.Completion().String()
}

func (s *script) coordinator(t *testing.T) *Coordinator {
	require.NotNil(t, s.c, "no coordinator: the script must begin with new")
	return s.c
}

// printStep formats what start, fact and outcome returned.
func printStep(out []Action, err error) string {
	var lines []string
	for _, a := range out {
		lines = append(lines, a.String())
	}
	if err != nil {
		lines = append(lines, "error: "+err.Error())
	}
	if len(lines) == 0 {
		return "ok"
	}
	return strings.Join(lines, "\n")
}

// parseEnum reads a value of one of the package's enums by the name String
// gives it, or as a number.
func parseEnum[E interface {
	~uint8
	String() string
}](t *testing.T, s string) E {
	t.Helper()
	for v := 0; v < 256; v++ {
		if E(v).String() == s {
			return E(v)
		}
	}
	n, err := strconv.ParseUint(s, 10, 8)
	require.NoError(t, err, "unknown name %q", s)
	return E(n)
}

func uintArg(t *testing.T, cmd datadriven.Command, key string, def uint64) uint64 {
	t.Helper()
	v, ok := cmd.Arg(key)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	require.NoError(t, err, cmd.Line)
	return n
}

func floatArg(t *testing.T, cmd datadriven.Command, key string, def float64) float64 {
	t.Helper()
	v, ok := cmd.Arg(key)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err, cmd.Line)
	return f
}
