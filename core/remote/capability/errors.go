package capability

import "github.com/kvbm/kvbm/kvbmerr"

// ErrMalformed is wrapped by every error about a hello or a scope
// descriptor that does not parse: input from whoever reaches the port.
// It reads as remote.ErrBadEndpoint does, which the transports add to it
// where such an error leaves them (this package cannot import
// core/remote), so that what a peer or a log reads is the same.
var ErrMalformed = kvbmerr.New(kvbmerr.InvalidArgument, "bad transport endpoint")
