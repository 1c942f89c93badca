package capability

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
)

// HelloKey is the key a hello's proofs are made under for a scope's key
// (proof.go): the scope's key itself, or, with a deployment key, an HMAC
// under the deployment key of it, so that neither alone makes a proof.
type HelloKey struct {
	_ incomparable
	k []byte
}

const labelDeployment = "kvbm-tcp deployment"

// HelloKey is the key the hellos of k's holder are proved under, with
// deployment key d: the one derivation, for the client that holds k and
// for the server that checks it.
func (k Key) HelloKey(d Deployment) HelloKey {
	if d.k == nil {
		return HelloKey{k: k.k[:]}
	}
	m := hmac.New(sha256.New, d.k)
	m.Write([]byte(labelDeployment))
	m.Write(k.k[:])
	return HelloKey{k: m.Sum(nil)}
}

// MarshalText refuses: a secret is not marshalled.
func (HelloKey) MarshalText() ([]byte, error) { return nil, errMarshal }

// Format prints the key redacted.
func (HelloKey) Format(f fmt.State, _ rune) { redact(f, "HelloKey") }
