package capability

import "github.com/kvbm/kvbm/kvbmerr"

// ErrMalformed is wrapped by every error about a hello or a scope
// descriptor that does not parse: input from whoever reaches the port.
// core/remote names it ErrBadEndpoint (this package stands below it), so
// a transport passes it on as it is.
var ErrMalformed = kvbmerr.New(kvbmerr.InvalidArgument, "bad transport endpoint")
