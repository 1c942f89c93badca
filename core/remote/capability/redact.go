package capability

import (
	"errors"
	"fmt"
	"io"
)

// incomparable, a secret's first field, makes == on it a compile error:
// == is not constant-time.
type incomparable [0]func()

// errMarshal is what a secret's MarshalText returns.
var errMarshal = errors.New("capability: a secret is not marshalled")

// redact is how a secret prints, whatever the verb.
func redact(f fmt.State, what string) { io.WriteString(f, "capability."+what+"{redacted}") }
