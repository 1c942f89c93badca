package tcp

import "github.com/kvbm/kvbm/core/remote/capability"

// The deployment key. With KVBM_AUTH_KEY (or KVBM_AUTH_KEY_FILE) set, the
// hello's proofs are made under a key derived from both the capability's
// key and the deployment key (capability.Deployment), so that only
// instances of one deployment connect, even with leaked metadata. The
// reading rules are those of the engines' P/D side channels
// (python/kvbmgo/_control.py), so that one setting keys all of them.
const (
	EnvAuthKey     = capability.EnvAuthKey
	EnvAuthKeyFile = capability.EnvAuthKeyFile
)

// AuthKeyFromEnv reads the deployment key (capability.AuthKeyFromEnv).
func AuthKeyFromEnv() ([]byte, error) { return capability.AuthKeyFromEnv() }
