package capability

import "time"

// Verifier checks the hellos a server is sent: it holds the hello keys of
// the fixed scopes, and derives a block scope's from the descriptor a
// hello carries.
type Verifier struct {
	secret     Secret
	deployment Deployment
	rw, ro     HelloKey
}

// NewVerifier is the verifier of the keys derived from s, with deployment
// key d.
func NewVerifier(s Secret, d Deployment) *Verifier {
	return &Verifier{secret: s, deployment: d, rw: s.ReadWrite().HelloKey(d), ro: s.ReadOnly().HelloKey(d)}
}

// Verify finds the scope whose key made the hello's proof, for the server
// worker that sent the challenge sn, at now: the grant, and the proof the
// server answers with. When none did, answer is nil and why says, for the
// server's log only (the client is told nothing), why. Both fixed scopes'
// keys are always tried, each compared in constant time; a block scope's
// descriptor names its key.
func (v *Verifier) Verify(h Hello, sn []byte, server uint64, now time.Time) (g Grant, answer []byte, why string) {
	t := Transcript{SN: sn, CN: h.CN, Server: server, Client: h.Client}
	if len(h.Scope) > 0 {
		bs, err := ParseBlockScope(h.Scope)
		if err != nil {
			return Grant{}, nil, err.Error()
		}
		capKey := v.secret.Blocks(h.Scope)
		key := capKey.HelloKey(v.deployment)
		if !key.checkClientProof(t, h.Proof) {
			return Grant{}, nil, v.whyNot(t, h.Proof, capKey)
		}
		if bs.Expired(now) {
			return Grant{}, nil, "the hello's block-scoped capability expired"
		}
		return Grant{Scope: ScopeBlocks, Blocks: &bs}, key.ServerProof(t), ""
	}
	okRW, okRO := v.rw.checkClientProof(t, h.Proof), v.ro.checkClientProof(t, h.Proof)
	switch {
	case okRW:
		return Grant{Scope: ScopeReadWrite}, v.rw.ServerProof(t), ""
	case okRO:
		return Grant{Scope: ScopeReadOnly}, v.ro.ServerProof(t), ""
	}
	return Grant{}, nil, v.whyNot(t, h.Proof, v.secret.ReadWrite(), v.secret.ReadOnly())
}

// whyNot says why a hello's proof did not verify: with a deployment key,
// a proof made under a capability's key alone is a client without
// KVBM_AUTH_KEY.
func (v *Verifier) whyNot(t Transcript, proof []byte, capKeys ...Key) string {
	if !v.deployment.IsZero() {
		for _, k := range capKeys {
			if k.HelloKey(Deployment{}).checkClientProof(t, proof) {
				return "the client holds this worker's metadata but no " + EnvAuthKey + " (this worker has one): not of this deployment"
			}
		}
		return "the hello's proof does not verify: not this worker's current metadata (stale, another worker's, tampered, or replayed), or another " + EnvAuthKey
	}
	return "the hello's proof does not verify: not this worker's current metadata (stale, another worker's, tampered, or replayed), or the client has " +
		EnvAuthKey + " set and this worker has not"
}
