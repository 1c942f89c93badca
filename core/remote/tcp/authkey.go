package tcp

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"

	"github.com/kvbm/kvbm/core/transfer"
)

// The deployment key. With KVBM_AUTH_KEY (or KVBM_AUTH_KEY_FILE) set, the
// hello's proofs are made under a key derived from both the capability's
// key and the deployment key (helloKey), so that only instances of one
// deployment connect, even with leaked metadata. Both sides must have the
// same key: a side without it, or with another, makes proofs that do not
// verify, and is closed on at the hello with nothing said, as for any
// other wrong proof. The reading rules are those of the SGLang PD
// backend's (python/kvbmgo/sglang/pd_auth.py), so that one setting keys
// both.
const (
	EnvAuthKey     = "KVBM_AUTH_KEY"
	EnvAuthKeyFile = "KVBM_AUTH_KEY_FILE"
	minAuthKeyLen  = 16
)

// AuthKeyFromEnv reads the deployment key: KVBM_AUTH_KEY's value, or the
// contents of the file KVBM_AUTH_KEY_FILE names (surrounding whitespace
// stripped; a file group or others can read is warned about); nil when
// neither is set. Both set, a key shorter than 16 bytes, or a file that
// cannot be read is an error naming the variable.
func AuthKeyFromEnv() ([]byte, error) {
	value, path := os.Getenv(EnvAuthKey), os.Getenv(EnvAuthKeyFile)
	var key []byte
	var where string
	switch {
	case value != "" && path != "":
		return nil, fmt.Errorf("%w: tcp transport: set %s or %s, not both", transfer.ErrInvalidArgument, EnvAuthKey, EnvAuthKeyFile)
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%w: tcp transport: %s=%s: %w", transfer.ErrInvalidArgument, EnvAuthKeyFile, path, err)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			slog.Warn("tcp transport: the deployment key file can be read by other users; chmod 600 it",
				"variable", EnvAuthKeyFile, "path", path, "mode", fmt.Sprintf("%o", fi.Mode().Perm()))
		}
		key, where = bytes.TrimSpace(b), EnvAuthKeyFile+"="+path
	case value != "":
		key, where = []byte(value), EnvAuthKey
	default:
		return nil, nil
	}
	if len(key) < minAuthKeyLen {
		return nil, fmt.Errorf("%w: tcp transport: the key in %s has %d bytes, at least %d are needed (e.g. openssl rand -hex 32)",
			transfer.ErrInvalidArgument, where, len(key), minAuthKeyLen)
	}
	return key, nil
}

// helloKey is the key a hello's proofs are made under for a capability's
// key: the capability's key itself, or, with a deployment key, an HMAC
// under the deployment key of it (neither alone makes a proof).
func helloKey(deployment []byte, capability []byte) []byte {
	if deployment == nil {
		return capability
	}
	m := hmac.New(sha256.New, deployment)
	m.Write([]byte("kvbm-tcp deployment"))
	m.Write(capability)
	return m.Sum(nil)
}
