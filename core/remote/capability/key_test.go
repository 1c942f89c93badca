package capability

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mac is HMAC-SHA256(key, parts...), written out as the wire format
// documents it.
func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// Each key is derived as the wire format has it: the scopes' keys
// HMAC(secret, label [| descriptor]), the hello key the scope's key or,
// with a deployment key, HMAC(deployment, "kvbm-tcp deployment" | key).
func TestTheKeysAreDerivedAsTheWireFormatSays(t *testing.T) {
	var s Secret
	for i := range s.k {
		s.k[i] = byte(i)
	}
	require.Equal(t, mac(s.k[:], "kvbm-tcp read-write"), s.ReadWrite().AppendTo(nil))
	require.Equal(t, mac(s.k[:], "kvbm-tcp read-only"), s.ReadOnly().AppendTo(nil))
	require.Equal(t, mac(s.k[:], "kvbm-tcp block scope", "\x01desc"), s.Blocks([]byte("\x01desc")).AppendTo(nil))
	require.False(t, s.ReadWrite().Equal(s.ReadOnly()))
	require.True(t, s.ReadWrite().Equal(s.ReadWrite()))

	k := s.ReadOnly()
	require.Equal(t, k.AppendTo(nil), k.HelloKey(Deployment{}).k, "no deployment key: the scope's key itself")
	d := NewDeployment([]byte("0123456789abcdef-deployment"))
	require.Equal(t, mac([]byte("0123456789abcdef-deployment"), "kvbm-tcp deployment", string(k.AppendTo(nil))), k.HelloKey(d).k)
	require.True(t, Deployment{}.IsZero())
	require.True(t, NewDeployment(nil).IsZero())
	require.False(t, d.IsZero())

	a, err := NewSecret()
	require.NoError(t, err)
	b, err := NewSecret()
	require.NoError(t, err)
	require.False(t, a.ReadWrite().Equal(b.ReadWrite()), "each secret is drawn")
	require.Equal(t, []byte{7, 0, 9}, KeyFromRaw32([KeyLen]byte{7, 0, 9}).AppendTo(nil)[:3])
}

// No secret prints, whatever the verb, nor marshals, nor logs.
func TestSecretsDoNotPrint(t *testing.T) {
	var s Secret
	for i := range s.k {
		s.k[i] = 0x5A
	}
	k := s.ReadWrite()
	secrets := map[string]any{"Secret": s, "Key": k, "HelloKey": k.HelloKey(NewDeployment([]byte("ZZZZZZZZZZZZZZZZ"))),
		"Deployment": NewDeployment([]byte("ZZZZZZZZZZZZZZZZ"))}
	for name, v := range secrets {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%d", "%q"} {
			out := fmt.Sprintf(verb, v)
			require.Equal(t, "capability."+name+"{redacted}", out, "%s %s", name, verb)
		}
		require.Equal(t, "{capability."+name+"{redacted}}", fmt.Sprintf("%v", struct{ V any }{v}), "%s inside a struct", name)
		_, err := json.Marshal(v)
		require.ErrorIs(t, err, errMarshal, name)
		var log strings.Builder
		noTime := func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
		slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{ReplaceAttr: noTime})).Info("x", "v", v)
		require.NotContains(t, log.String(), "5a", name)
		require.NotContains(t, log.String(), "ZZ", name)
		require.NotContains(t, log.String(), "90", name)
	}
}
