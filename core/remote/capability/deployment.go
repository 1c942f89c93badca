package capability

import (
	"fmt"
	"slices"
)

// The deployment key. With one (KVBM_AUTH_KEY, read by the transport), a
// hello's proofs are made under a key derived from both the capability's
// key and the deployment key (Key.HelloKey), so that only instances of
// one deployment connect, even with leaked metadata. Both sides must have
// the same key: a side without it, or with another, makes proofs that do
// not verify, and is closed on at the hello with nothing said, as for any
// other wrong proof.
const (
	// EnvAuthKey names the deployment key's variable, in the reasons a
	// hello is refused for.
	EnvAuthKey = "KVBM_AUTH_KEY"
	// MinDeploymentKeyLen is the shortest deployment key read from the
	// environment.
	MinDeploymentKeyLen = 16
)

// Deployment is a deployment key; the zero value is none.
type Deployment struct {
	_ incomparable
	k []byte // nil: none
}

// NewDeployment is the deployment key raw (a copy); nil is none.
func NewDeployment(raw []byte) Deployment { return Deployment{k: slices.Clone(raw)} }

// IsZero reports whether d is no key.
func (d Deployment) IsZero() bool { return d.k == nil }

// MarshalText refuses: a secret is not marshalled.
func (Deployment) MarshalText() ([]byte, error) { return nil, errMarshal }

// Format prints the key redacted.
func (Deployment) Format(f fmt.State, _ rune) { redact(f, "Deployment") }
