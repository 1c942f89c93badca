package capability

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"

	"github.com/kvbm/kvbm/kvbmerr"
)

// EnvAuthKeyFile names a file holding the deployment key, instead of
// EnvAuthKey's value. The reading rules are those of the engines' P/D
// side channels (python/kvbmgo/_control.py), so that one setting keys all
// of them and every transport.
const EnvAuthKeyFile = "KVBM_AUTH_KEY_FILE"

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
		return nil, fmt.Errorf("%w: deployment key: set %s or %s, not both", kvbmerr.ErrInvalidArgument, EnvAuthKey, EnvAuthKeyFile)
	case path != "":
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%w: deployment key: %s=%s: %w", kvbmerr.ErrInvalidArgument, EnvAuthKeyFile, path, err)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			slog.Warn("deployment key: the deployment key file can be read by other users; chmod 600 it",
				"variable", EnvAuthKeyFile, "path", path, "mode", fmt.Sprintf("%o", fi.Mode().Perm()))
		}
		key, where = bytes.TrimSpace(b), EnvAuthKeyFile+"="+path
	case value != "":
		key, where = []byte(value), EnvAuthKey
	default:
		return nil, nil
	}
	if len(key) < MinDeploymentKeyLen {
		return nil, fmt.Errorf("%w: deployment key: the key in %s has %d bytes, at least %d are needed (e.g. openssl rand -hex 32)",
			kvbmerr.ErrInvalidArgument, where, len(key), MinDeploymentKeyLen)
	}
	return key, nil
}
