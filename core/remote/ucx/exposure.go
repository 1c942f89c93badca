package ucx

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/kvbm/kvbm/kvbmerr"
)

// What a transport's UCX context may expose, set where neither
// Config.Options nor UCX's own settings (the environment's UCX_*, or a
// ucx.conf UCX reads) say otherwise:
//
//   - Its network devices: the RDMA ones, and for UCX's tcp transport only
//     the interface of the advertised host (Config.Advertise): UCX's tcp
//     transport listens on every device it uses, and a worker listens on
//     the interface it advertises, never on every interface, as the TCP
//     transport does. An unspecified host (0.0.0.0) means every interface.
//   - Its shared-memory segment: the largest UCX's FIFO carries
//     (segsize.go).
//   - In the message mode, the rendezvous: "am", whose data travels in
//     messages both sides copy. The zero-copy schemes register memory for
//     the peer's RDMA, beyond kvbm's checks and for as long as UCX keeps
//     the registration cached: the sender's (get_zcopy, get_ppln,
//     rkey_ptr: the exporter's layouts and staging, read by any importer
//     that kept the key, its scope or revocation notwithstanding), or the
//     receiver's buffers (put_zcopy, put_ppln: writable later by an
//     exporter the importer pulled from). "auto" picks get_zcopy where
//     there is RDMA. UCX 1.13's protocols also register a contiguous
//     receive buffer and send its key to the sender, whatever the scheme;
//     so the importer receives through a datatype of its own (a sink,
//     shim_am.c), which no version can register or send a key for. So
//     the message mode takes "am" only: another in
//     Config.Options is refused, one in UCX_RNDV_SCHEME (which tunes every
//     UCX of the process) overridden with a warning.
//
// An advertised host that no interface here carries (an address behind
// NAT) leaves UCX's tcp transport out; with no RDMA device either, New
// fails, naming the settings that fix it.

// contextOptions are the entries the context is made with: cfg.Options
// and the defaults above; resources lists UCX's resources (Resources),
// settings gives UCX's own settings (Settings).
func (cfg Config) contextOptions(resources func() ([]string, error), settings func() (map[string]string, error)) (map[string]string, error) {
	if err := checkSegSize(cfg.Options); err != nil {
		return nil, err
	}
	opts := make(map[string]string, len(cfg.Options)+4)
	for k, v := range cfg.Options {
		opts[k] = v
	}
	addSegDefaults(opts)
	ucx, err := settings()
	if err != nil {
		return nil, err
	}
	if !cfg.OneSided {
		if scheme := opts["RNDV_SCHEME"]; scheme != "" && !strings.EqualFold(scheme, rndvScheme) {
			return nil, fmt.Errorf("%w: ucx: option RNDV_SCHEME=%s: the message mode takes the %q rendezvous only; a zero-copy one "+
				"registers memory for a peer's RDMA beyond kvbm's checks (the exporter's for get_zcopy, get_ppln, rkey_ptr "+
				"and auto; the importer's receive buffers for put_zcopy, put_ppln)", kvbmerr.ErrUnsupported, scheme, rndvScheme)
		}
		scheme := os.Getenv("UCX_RNDV_SCHEME")
		if v := ucx["RNDV_SCHEME"]; scheme == "" && v != "auto" {
			scheme = v // a ucx.conf's
		}
		if scheme != "" && !strings.EqualFold(scheme, rndvScheme) {
			// The environment, or a ucx.conf, tunes UCX for every library
			// of the process (NIXL's too): this context overrides it, and
			// says so.
			slog.Warn("ucx: UCX_RNDV_SCHEME is overridden: the message mode takes the \"am\" rendezvous only "+
				"(a zero-copy one registers memory for a peer's RDMA)", "UCX_RNDV_SCHEME", scheme)
		}
		opts["RNDV_SCHEME"] = rndvScheme
	}
	if v, ok := ucx["NET_DEVICES"]; opts["NET_DEVICES"] != "" || os.Getenv("UCX_NET_DEVICES") != "" || (ok && v != "all") {
		return opts, nil // named by the caller, or by UCX's settings (a ucx.conf: the operator's)
	}
	host := cmp.Or(cfg.Advertise, os.Getenv(envAdvertise), "127.0.0.1")
	ips, err := hostIPs(host)
	if err != nil {
		return nil, err
	}
	if slices.ContainsFunc(ips, net.IP.IsUnspecified) {
		return opts, nil // every interface, as asked
	}
	rs, err := resources()
	if err != nil {
		return nil, err
	}
	ifaces, err := interfacesOf(ips)
	if err != nil {
		return nil, err
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Zone() != "" {
		// An IPv6 address with a zone (fe80::1%eth1): the zone's
		// interface, where one carries it, not every one that does.
		ifaces = slices.DeleteFunc(ifaces, func(name string) bool { return name != a.Zone() })
	}
	hasTCP := slices.ContainsFunc(rs, func(r string) bool { return strings.HasPrefix(r, "tcp/") })
	if !hasTCP && len(netDevices(rs, nil)) == 0 {
		return opts, nil // no network device at all (UCX_TLS=sm): nothing listens
	}
	devs := netDevices(rs, ifaces)
	if len(ifaces) == 0 && hasTCP {
		// An address peers dial that no interface here carries (NAT):
		// UCX's tcp transport is left out rather than opened everywhere.
		slog.Warn("ucx: the advertised host is on no interface of this host: UCX's tcp transport is not used "+
			"(set "+envAdvertise+" to an address of this host, or UCX_NET_DEVICES)", "host", host)
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("%w: ucx: no network device to use: the advertised host %s is on no interface UCX's tcp "+
			"transport has, and UCX finds no RDMA device (%s); set %s to an address of this host (0.0.0.0: every interface), "+
			"or UCX_NET_DEVICES", kvbmerr.ErrInvalidArgument, host, strings.Join(rs, " "), envAdvertise)
	}
	opts["NET_DEVICES"] = strings.Join(devs, ",")
	return opts, nil
}

// rndvScheme is the message mode's rendezvous (above).
const rndvScheme = "am"

// envAdvertise is the advertised host's default, shared with the TCP
// transport.
const envAdvertise = "KVBM_TCP_ADVERTISE"

// hostIPs resolves the advertised host.
func hostIPs(host string) ([]net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return []net.IP{ip}, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return nil, fmt.Errorf("%w: ucx: the advertised host %q does not resolve (%v); set %s to an address of this host, "+
			"or UCX_NET_DEVICES", kvbmerr.ErrInvalidArgument, host, err, envAdvertise)
	}
	return ips, nil
}

// interfacesOf names the interfaces of this host that carry one of ips
// (any loopback one for a loopback address: 127.0.1.1 too).
func interfacesOf(ips []net.IP) ([]string, error) {
	all, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("ucx: list the network interfaces: %w", err)
	}
	var out []string
	for _, ifc := range all {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if ok && slices.ContainsFunc(ips, func(ip net.IP) bool {
				return ip.Equal(ipn.IP) || (ip.IsLoopback() && ifc.Flags&net.FlagLoopback != 0)
			}) {
				out = append(out, ifc.Name)
				break
			}
		}
	}
	return out, nil
}

// localTransports are UCX's transports within a host (shared memory,
// GPUs): their devices are not network devices.
var localTransports = []string{"self", "sysv", "posix", "cma", "knem", "xpmem", "cuda_copy", "cuda_ipc", "gdr_copy",
	"rocm_copy", "rocm_ipc", "rocm_gdr", "ze_copy", "ze_ipc", "ze_gpu"}

// netDevices are the network devices of resources ("transport/device")
// a worker uses: every one but tcp's, and tcp's on ifaces.
func netDevices(resources, ifaces []string) []string {
	var out []string
	for _, r := range resources {
		tl, dev, ok := strings.Cut(r, "/")
		if !ok || slices.Contains(localTransports, tl) || slices.Contains(out, dev) {
			continue
		}
		if tl == "tcp" && !slices.Contains(ifaces, dev) {
			continue
		}
		out = append(out, dev)
	}
	return out
}
