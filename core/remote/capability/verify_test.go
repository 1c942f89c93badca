package capability

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hello is the hello k's holder sends worker 0xE1 for challenge sn,
// parsed as the server reads it.
func hello(t *testing.T, k HelloKey, sn []byte, desc []byte) Hello {
	t.Helper()
	cn, err := NewNonce()
	require.NoError(t, err)
	b := k.AppendHello(nil, Transcript{SN: sn, CN: cn, Server: 0xE1, Client: 0x11}, desc)
	h, err := ParseHello(b[:HelloLen])
	require.NoError(t, err)
	if h.ScopeLen > 0 {
		h.Scope = b[HelloLen:]
	}
	return h
}

// The verifier grants the scope whose key made the proof, answers with
// the server's proof under it, and refuses anything else with a reason
// for the log: another secret's key, a tampered or widened descriptor,
// an expired scope, another challenge.
func TestTheVerifierGrantsTheScopeThatProvedItself(t *testing.T) {
	s, err := NewSecret()
	require.NoError(t, err)
	other, err := NewSecret()
	require.NoError(t, err)
	v := NewVerifier(s, Deployment{})
	sn, err := NewNonce()
	require.NoError(t, err)
	now := time.Now()
	desc, err := EncodeBlockScope(0xE1, []LayoutBlocks{{Handle: Handle{0xE1, 1}, Blocks: []int{2}}}, now.Add(time.Minute), 1)
	require.NoError(t, err)
	for name, c := range map[string]struct {
		key   Key
		desc  []byte
		scope Scope
	}{"read-write": {s.ReadWrite(), nil, ScopeReadWrite}, "read-only": {s.ReadOnly(), nil, ScopeReadOnly}, "blocks": {s.Blocks(desc), desc, ScopeBlocks}} {
		hk := c.key.HelloKey(Deployment{})
		h := hello(t, hk, sn, c.desc)
		g, answer, why := v.Verify(h, sn, 0xE1, now)
		require.Empty(t, why, name)
		require.Equal(t, c.scope, g.Scope, name)
		require.Equal(t, c.scope == ScopeBlocks, g.Blocks != nil, name)
		require.True(t, hk.CheckServerProof(Transcript{SN: sn, CN: h.CN, Server: 0xE1, Client: 0x11}, answer), name)

		_, answer, why = v.Verify(h, sn, 0xE2, now)
		require.Nil(t, answer, "%s: proved for another worker", name)
		require.Contains(t, why, "does not verify")
		fresh, _ := NewNonce()
		_, answer, _ = v.Verify(h, fresh, 0xE1, now)
		require.Nil(t, answer, "%s: replayed against another challenge", name)
	}
	_, answer, _ := v.Verify(hello(t, other.ReadWrite().HelloKey(Deployment{}), sn, nil), sn, 0xE1, now)
	require.Nil(t, answer, "another secret's key")

	wider, err := EncodeBlockScope(0xE1, []LayoutBlocks{{Handle: Handle{0xE1, 1}, Blocks: []int{2, 3}}}, now.Add(time.Minute), 1)
	require.NoError(t, err)
	h := hello(t, s.Blocks(desc).HelloKey(Deployment{}), sn, wider)
	_, answer, why := v.Verify(h, sn, 0xE1, now)
	require.Nil(t, answer, "widened under the narrower key")
	require.Contains(t, why, "does not verify")
	h = hello(t, s.Blocks(desc).HelloKey(Deployment{}), sn, desc)
	_, answer, why = v.Verify(h, sn, 0xE1, now.Add(2*time.Minute))
	require.Nil(t, answer)
	require.Equal(t, "the hello's block-scoped capability expired", why)
	h.Scope = []byte{9}
	_, answer, why = v.Verify(h, sn, 0xE1, now)
	require.Nil(t, answer)
	require.Contains(t, why, "bad transport endpoint: block scope: ")
}

// With a deployment key only a hello made under the same key verifies;
// the reason for the log tells a client without one from one with
// another, and a server without one says the client may have one.
func TestTheVerifierAndTheDeploymentKey(t *testing.T) {
	s, err := NewSecret()
	require.NoError(t, err)
	key, another := NewDeployment([]byte("0123456789abcdef-A")), NewDeployment([]byte("0123456789abcdef-B"))
	sn, _ := NewNonce()
	for _, c := range []struct {
		name           string
		server, client Deployment
		why            string
	}{
		{"same key", key, key, ""},
		{"another key", key, another, "or another " + EnvAuthKey},
		{"client without key", key, Deployment{}, "but no " + EnvAuthKey},
		{"server without key", Deployment{}, key, "the client has " + EnvAuthKey + " set and this worker has not"},
		{"neither", Deployment{}, Deployment{}, ""},
	} {
		v := NewVerifier(s, c.server)
		g, answer, why := v.Verify(hello(t, s.ReadOnly().HelloKey(c.client), sn, nil), sn, 0xE1, time.Now())
		if c.why == "" {
			require.NotNil(t, answer, c.name)
			require.Equal(t, ScopeReadOnly, g.Scope, c.name)
			continue
		}
		require.Nil(t, answer, c.name)
		require.Contains(t, why, c.why, c.name)
	}
}
