package handoff

import (
	"strconv"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Order says which side of a hand-off goes first.
//
// The values are stable (see the package documentation).
type Order uint8

const (
	// SourceFirst runs the prefill first; the destination reserves once the
	// source holds the KV. vLLM hands off this way.
	SourceFirst Order = 1
	// DestinationFirst reserves on the destination first; the prefill is
	// submitted once the destination holds room for the KV. SGLang hands off
	// this way.
	DestinationFirst Order = 2
)

// String returns the order's name, or Order(n) for an unknown value.
func (o Order) String() string {
	switch o {
	case SourceFirst:
		return "SourceFirst"
	case DestinationFirst:
		return "DestinationFirst"
	}
	return "Order(" + strconv.Itoa(int(o)) + ")"
}

func (o Order) valid() bool { return o == SourceFirst || o == DestinationFirst }

// Engine is an inference engine whose instances take part in a hand-off.
//
// The values are stable (see the package documentation).
type Engine uint8

const (
	// EngineVLLM is vLLM; it hands off SourceFirst.
	EngineVLLM Engine = 1
	// EngineSGLang is SGLang; it hands off DestinationFirst.
	EngineSGLang Engine = 2
	// EngineTRTLLM is TensorRT-LLM; it does not support destination hand-off.
	EngineTRTLLM Engine = 3
)

// String returns the engine's name, or Engine(n) for an unknown value.
func (e Engine) String() string {
	switch e {
	case EngineVLLM:
		return "vLLM"
	case EngineSGLang:
		return "SGLang"
	case EngineTRTLLM:
		return "TRT-LLM"
	}
	return "Engine(" + strconv.Itoa(int(e)) + ")"
}

// OrderFor returns the order in which engine hands off. It returns an error
// wrapping ErrUnsupportedEngine for TRT-LLM and for unknown engines.
func OrderFor(engine Engine) (Order, error) {
	switch engine {
	case EngineVLLM:
		return SourceFirst, nil
	case EngineSGLang:
		return DestinationFirst, nil
	}
	return 0, kvbmerr.Detail(ErrUnsupportedEngine, engine.String())
}
