// Package ucx is the UCX transport of core/remote. UCX picks the way by
// itself (UCX_TLS): RDMA (rc, dc, ud, EFA's srd) where the hardware is,
// TCP across hosts, shared memory between processes of one host.
//
// In its message mode (the default) the exporter's UCX context has
// active messages only, no RMA: a peer proves the capability its endpoint
// carries with the TCP transport's hello (am.go, serve.go), then asks for
// byte ranges, which the exporter checks against that capability and
// serves from the manager (transfer.Manager.Serve), sending the bytes on
// an endpoint of its own to the importer. The importer never gives UCX
// a destination's address: UCX hands it each piece of the data in UCX's
// own receive memory, and kvbm copies it to its destination only while
// the pull is under way (a sink, pull.go), so that nothing UCX does late
// reaches a destination. It pulls only.
//
// In its one-sided mode (Config.OneSided, refused by remote.Open unless
// EnvAcceptLateWrites) it reads and writes (ucp_get_nbx, ucp_put_nbx)
// memory the exporting worker registered with ucp_mem_map, whose packed
// rkeys travel in its endpoint. Whether the exporter's CPU takes part then
// depends on the memory and on the UCX build. Memory the transport
// allocated (AllocHost) is shared memory that a peer on the same host
// maps and copies itself. Other memory (the manager's own allocations) is
// reached one-sided over RDMA or with a UCX built with xpmem or knem; with
// Debian's libucx0 1.13 between processes of one host, and over TCP, UCX
// emulates the reads and writes with messages that the exporter's progress
// thread answers (UCX's cma transport, which could do them one-sided, is
// not used by UCX 1.13 with error handling mode PEER).
//
// libucp.so.0 is opened with dlopen at first use (KVBM_UCX_LIB names
// another, such as a CUDA/RDMA-enabled build on a GPU cluster); nothing
// links against UCX and no UCX header is needed to build, so libkvbm.so
// loads where UCX is absent and Available says why the transport cannot
// be used.
//
// Each Transport has one UCX context and one worker, owned by a progress
// goroutine locked to its OS thread: every UCX call of the transport is
// made on that thread (UCS_THREAD_MODE_SINGLE, so UCX takes no locks and
// callbacks never race with callers), and callers hand it work through a
// channel. Endpoints use error handling mode PEER: a peer that dies fails
// the operations pending on it and later ones with
// remote.ErrPeerUnavailable; so does a deadline that passes, and an
// exporting process of this host that has exited (checked in the process
// table, since shared memory stays readable after its owner died).
package ucx

import "github.com/kvbm/kvbm/kvbmerr"

// ErrLateWrites is why KVBM_TRANSPORT=ucx in the one-sided mode
// (EnvOneSided; remote.Open) is refused: that mode cannot promise that no
// byte of an operation lands once its notification completed. A push that failed at its deadline, its peer
// frozen, is applied by the peer when it runs again (UCX emulates puts
// with messages the peer's progress thread applies, and the pusher
// cannot take them back), so the blocks a failed push was for may be
// overwritten after they were reused; a pull's requests that closing the
// endpoint does not cancel (reads emulated over messages) are left to
// UCX after the pull completed, their late replies written where the
// pull's blocks were; and a layout unregistered while peers still have it
// imported stays reachable through their rkeys, which on those emulated
// reads and writes makes the exporter touch memory that may be gone.
// EnvAcceptLateWrites opens it anyway; New is not refused.
var ErrLateWrites = kvbmerr.New(kvbmerr.Unsupported, "the UCX transport's one-sided mode is refused: once an operation failed at its deadline, "+
	"a frozen peer that runs again can still apply a failed push's bytes in blocks that were reused, and a pull's "+
	"uncancelled requests are left in flight; a layout unregistered while peers have it imported stays reachable "+
	"through their rkeys. Use its message mode (the default: leave "+EnvOneSided+" unset), or set "+EnvAcceptLateWrites+"=1 to accept this")

// EnvAcceptLateWrites, set to 1, lets KVBM_TRANSPORT=ucx (remote.Open)
// open the transport despite ErrLateWrites.
const EnvAcceptLateWrites = "KVBM_UCX_ACCEPT_LATE_WRITES"

// EnvLib names the libucp to load instead of DefaultLib.
const EnvLib = "KVBM_UCX_LIB"

// DefaultLib is the libucp loaded when EnvLib is not set: Debian's libucx0.
const DefaultLib = "libucp.so.0"

// minMinor is the oldest UCX 1.x we accept: the *_nbx calls came in 1.10,
// the message mode's RNDV_SCHEME=am (exposure.go) in 1.11.
const minMinor = 11

// Config configures a Transport.
type Config struct {
	// Options are UCX configuration entries for this transport's context,
	// named as in the environment without the UCX_ prefix: {"TLS": "tcp"}
	// restricts it to TCP. They override the UCX_* environment variables,
	// which apply otherwise. UCX applies its context's own entries this
	// way (TLS, NET_DEVICES, RNDV_THRESH, …), and a transport's where its
	// table names them without the transport's prefix (MM_SEG_SIZE, for
	// posix, sysv and xpmem); the prefixed names (SYSV_*, TCP_*, IB_*)
	// only from UCX 1.17 on (before, from the environment only). So a
	// prefixed segment size (SYSV_SEG_SIZE) is refused here, as is a
	// name with a wildcard, which UCX 1.22 matches as a pattern
	// (segsize.go).
	Options map[string]string
	// Advertise is the host whose interface UCX's tcp transport uses
	// (default KVBM_TCP_ADVERTISE, else 127.0.0.1; 0.0.0.0: every one),
	// unless Options or UCX_NET_DEVICES name the devices (exposure.go).
	Advertise string
	// MaxInFlight bounds the bytes posted and not yet completed on each
	// endpoint (default DefaultMaxInFlight); an operation larger than it
	// is posted alone.
	MaxInFlight int64
	// DeviceIsHost says that the served manager's device memory is host
	// memory (the emulated device), registered as such. Otherwise device
	// layouts are registered as CUDA memory, which needs a CUDA-enabled
	// UCX (EnvLib); where it cannot, the endpoint carries the reason and
	// attaching such a layout fails with it.
	DeviceIsHost bool
	// OneSided serves and reaches layouts with UCX's RMA (ucp_get_nbx,
	// ucp_put_nbx on registered memory, rkeys in the endpoint), as the
	// transport did before its message mode: refused by remote.Open
	// unless EnvAcceptLateWrites (ErrLateWrites). Both sides must agree
	// (EnvOneSided).
	OneSided bool
	// inPlace has UCX receive a pull's data straight into its
	// destination, without a sink: for the benchmark that measures what
	// the sink costs; a failed pull may then be written late.
	inPlace bool
}

// EnvOneSided, set to 1, opens KVBM_TRANSPORT=ucx in the one-sided mode
// (Config.OneSided), which also needs EnvAcceptLateWrites.
const EnvOneSided = "KVBM_UCX_ONE_SIDED"

// defaultEnv are UCX settings made in the environment when libucp is
// loaded, unless already set there (UCX reads these per component from
// the environment only, not through ucp_config_modify). UCX's shared
// memory transports (sysv, posix) support error handling mode PEER only
// when asked: without this, an endpoint in mode PEER between two
// processes of one host goes over TCP on the loopback device. libucs
// would install handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE that take
// the Go runtime's: a nil dereference would print UCX's backtrace and
// kill the process instead of panicking.
// UCX's own log goes to stderr, beside ours (UCX writes it to stdout,
// which an engine, or a process that speaks a protocol there, keeps for
// its own output), and follows KVBM_LOG: errors only by default, warnings
// too when KVBM_LOG asks for warnings or more.
var defaultEnv = map[string]string{
	"UCX_SYSV_ERROR_HANDLING":  "y",
	"UCX_POSIX_ERROR_HANDLING": "y",
	"UCX_ERROR_SIGNALS":        "",
	"UCX_LOG_LEVEL":            "error",
	"UCX_LOG_FILE":             "stderr",
}

// DefaultMaxInFlight is Config.MaxInFlight's default.
const DefaultMaxInFlight = 16 << 20
