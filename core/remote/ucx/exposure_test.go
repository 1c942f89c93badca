//go:build cgo

package ucx

import (
	"context"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

// What an rkey guards where UCX emulates reads with messages (tcp, here
// between two workers of one process): a peer that holds any rkey of the
// exporter asks for bytes at an address outside every registered region,
// here a secret in memory the exporter never registered. Our own client
// refuses such an address (rma); a peer that is not our client need not,
// so this widens the importer's view of the region to stand in for one.
// The test records what the exporter's UCX does: it reads and sends the
// bytes, whatever the rkey covers (a hardware rkey would fault instead).
func TestEmulatedReadsAreNotBoundedByTheRkey(t *testing.T) {
	needUCX(t)
	// TCP only: in one process UCX's default may pick its self transport,
	// which reads the process's own memory by design.
	for _, tc := range tlsCases[1:] {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{OneSided: true, Options: tc.opts}, 5*time.Second)
			imp := newSide(t, emu, 0x1, Config{OneSided: true, Options: tc.opts}, 5*time.Second)
			h := exp.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			secret, sb, dst := secretAndDestination(t, emu)
			p := imp.importAll(t, exp)
			l := p.layouts[h]
			l.regions = l.regions[:1]
			l.regions[0].base, l.regions[0].size = 0, 1<<62 // a client that checks nothing
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := p.Read(ctx, h, []transfer.RemoteOp{{Remote: secret, Local: dst, Size: secretSize}})
			db, berr := emu.Bytes(dst, secretSize)
			require.NoError(t, berr)
			leaked := err == nil && string(db) == string(sb)
			t.Logf("UCX %s, %s: read outside every registered region: err=%v, secret copied: %v", Version(), tc.name, err, leaked)
			require.True(t, leaked, "the emulated read was refused: UCX checks the address here, update docs/data-plane.md")
		})
	}
}

// The message mode's exporter has no RMA: the same forged read (UCX's
// software RMA, an rkey of another worker, an address the exporter never
// registered) reaches no handler there. The read fails at its deadline,
// the secret stays where it is, and the exporter serves its own importers
// on.
func TestTheMessageModeServesNoRMA(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases[1:] {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{Options: tc.opts}, 5*time.Second)
			keys := newSide(t, emu, 0xF, Config{OneSided: true, Options: tc.opts}, 5*time.Second)
			attacker := newSide(t, emu, 0x1, Config{OneSided: true, Options: tc.opts}, 300*time.Millisecond)
			h := exp.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			exp.fill(t, h, 0x100)
			keys.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			secret, sb, dst := secretAndDestination(t, emu)

			// The exporter's address, with an rkey UCX will unpack.
			ep, err := exp.tr.Endpoint()
			require.NoError(t, err)
			info, err := decodeEndpoint(ep)
			require.NoError(t, err)
			kep, err := keys.tr.Endpoint()
			require.NoError(t, err)
			kinfo, err := decodeEndpoint(kep)
			require.NoError(t, err)
			info.mode = modeOneSided
			info.layouts[0].regions = []regionInfo{{base: 0, size: 1 << 62, rkey: kinfo.layouts[0].regions[0].rkey}}
			info.layouts = info.layouts[:1]
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			p, err := attacker.tr.Connect(ctx, info.encode())
			require.NoError(t, err, "UCX connects: the endpoint is reachable")
			t.Cleanup(func() { require.NoError(t, p.Close()) })
			rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer rcancel()
			err = p.(*Peer).Read(rctx, info.layouts[0].handle, []transfer.RemoteOp{{Remote: secret, Local: dst, Size: secretSize}})
			require.ErrorIs(t, err, remote.ErrPeerUnavailable)
			db, err := emu.Bytes(dst, secretSize)
			require.NoError(t, err)
			require.NotEqual(t, string(sb), string(db), "the secret was read")

			imp := newSide(t, emu, 0x2, Config{Options: tc.opts}, 5*time.Second)
			imp.importAll(t, exp)
			local := imp.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			require.NoError(t, move(t, imp.m, h, []int{0, 1}, local, []int{0, 1}))
			imp.check(t, local, 1, 0x101)
		})
	}
}

// secretSize is the size of secretAndDestination's buffers.
const secretSize = 4096

// secretAndDestination allocates host memory of the process that no
// layout registers, holding a pattern (the secret, and its bytes), and a
// buffer to read it into.
func secretAndDestination(t *testing.T, emu *cuda.Emulated) (secret uint64, sb []byte, dst uint64) {
	t.Helper()
	secret, err := emu.HostAlloc(0, secretSize)
	require.NoError(t, err)
	dst, err = emu.HostAlloc(0, secretSize)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, emu.HostFree(secret)); require.NoError(t, emu.HostFree(dst)) })
	sb, err = emu.Bytes(secret, secretSize)
	require.NoError(t, err)
	copy(sb, pattern(secretSize, 0x5EC))
	return secret, sb, dst
}

// A worker listens on nothing until it is asked to serve (an export) or
// to reach a peer (a connect), and then only on the interface it
// advertises (127.0.0.1 by default), as the TCP transport does: UCX's tcp
// transport listens on every device its worker uses.
func TestAWorkerListensOnlyWhenAskedAndWhereItAdvertises(t *testing.T) {
	needUCX(t)
	before := listening(t)
	emu := newEmu(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // the listening host; "" every interface
	}{
		{"default", Config{Options: map[string]string{"TLS": "tcp"}}, "127.0.0.1"},
		{"an advertised address", Config{Options: map[string]string{"TLS": "tcp"}, Advertise: firstAddress(t)}, firstAddress(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSide(t, emu, 0xE, tc.cfg, 5*time.Second)
			s.alloc(t, storage.Pinned, smallConfig(1), transfer.FullyContiguous)
			require.Empty(t, newSockets(before, listening(t)), "listening before an export")
			_, err := s.tr.Endpoint()
			require.NoError(t, err)
			got := newSockets(before, listening(t))
			require.NotEmpty(t, got, "UCX's tcp transport listens once the worker serves")
			for _, a := range got {
				require.Equal(t, tc.want, a.IP.String(), "listening on %v", a)
			}
			require.NoError(t, s.tr.Close())
		})
	}
}

// firstAddress is this host's first non-loopback IPv4 address.
func firstAddress(t *testing.T) string {
	ifaces, err := net.Interfaces()
	require.NoError(t, err)
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	t.Skip("no non-loopback IPv4 address")
	return ""
}

// listening lists this process's listening TCP sockets (IPv4 and IPv6),
// by inode.
func listening(t *testing.T) map[string]*net.TCPAddr {
	t.Helper()
	ours := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, fd := range fds {
		l, _ := os.Readlink("/proc/self/fd/" + fd.Name()) // gone meanwhile: not a socket of ours
		if inode, ok := strings.CutPrefix(l, "socket:["); ok {
			ours[strings.TrimSuffix(inode, "]")] = true
		}
	}
	out := map[string]*net.TCPAddr{}
	for _, file := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(file)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !ours[f[9]] { // 0A: LISTEN
				continue
			}
			out[f[9]] = procAddr(t, f[1])
		}
	}
	return out
}

// procAddr decodes /proc/net/tcp's "0100007F:1F90" (each 32-bit word in
// host order, little-endian here).
func procAddr(t *testing.T, s string) *net.TCPAddr {
	host, port, ok := strings.Cut(s, ":")
	require.True(t, ok, s)
	raw, err := hex.DecodeString(host)
	require.NoError(t, err)
	for i := 0; i+4 <= len(raw); i += 4 {
		slices.Reverse(raw[i : i+4])
	}
	p, err := strconv.ParseUint(port, 16, 16)
	require.NoError(t, err)
	ip := net.IP(raw)
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return &net.TCPAddr{IP: ip, Port: int(p)}
}

func newSockets(before, now map[string]*net.TCPAddr) []*net.TCPAddr {
	var out []*net.TCPAddr
	for inode, a := range now {
		if before[inode] == nil {
			out = append(out, a)
		}
	}
	return out
}

// An operator's ucx.conf is UCX's own setting, as the environment is: the
// network devices it names are left to UCX, and its rendezvous is
// overridden in the message mode. UCX reads its configuration files once
// a process, so each case runs in a process of its own (the test binary,
// UCX_CONFIG_DIR naming the file's directory).
func TestContextOptionsKeepAUCXConf(t *testing.T) {
	needUCX(t)
	if os.Getenv("KVBM_TEST_CONTEXT_OPTIONS") != "" {
		opts, err := Config{Advertise: "127.0.0.1"}.contextOptions(cachedResources, Settings)
		require.NoError(t, err)
		t.Logf("options: NET_DEVICES=%q RNDV_SCHEME=%q", opts["NET_DEVICES"], opts["RNDV_SCHEME"])
		return
	}
	run := func(t *testing.T, conf string) string {
		dir := t.TempDir()
		if conf != "" {
			require.NoError(t, os.WriteFile(dir+"/ucx.conf", []byte(conf), 0o644))
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestContextOptionsKeepAUCXConf$", "-test.v")
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "UCX_NET_DEVICES=") || strings.HasPrefix(kv, "UCX_RNDV_SCHEME=")
		})
		cmd.Env = append(cmd.Env, "KVBM_TEST_CONTEXT_OPTIONS=1", "UCX_CONFIG_DIR="+dir)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		_, line, ok := strings.Cut(string(out), "options: ")
		require.True(t, ok, "%s", out)
		line, _, _ = strings.Cut(line, "\n")
		return line
	}
	require.Equal(t, `NET_DEVICES="lo" RNDV_SCHEME="am"`, run(t, ""), "kvbm's default: tcp on the advertised interface")
	require.Equal(t, `NET_DEVICES="" RNDV_SCHEME="am"`, run(t, "UCX_NET_DEVICES=eth0\nUCX_RNDV_SCHEME=get_zcopy\n"),
		"the operator's devices kept, the rendezvous overridden")
}
