package worker

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/ucx"
	"github.com/kvbm/kvbm/core/transfer"
)

// scoped asks the exporter process for metadata that reads blocks of tier
// only.
func (e *exporter) scoped(t *testing.T, tier Tier, blocks ...int) []byte {
	t.Helper()
	s := make([]string, len(blocks))
	for i, b := range blocks {
		s[i] = fmt.Sprint(b)
	}
	return e.metadataOf(t, fmt.Sprintf("scope %d %s", tier, strings.Join(s, ",")))
}

// scopeRoutes are the ways a scoped capability is tested across
// processes: TCP, the same-host route, and UCX's message mode where UCX
// loads.
func scopeRoutes(t *testing.T) []string {
	routes := []string{"tcp", "same host"}
	if err := ucx.Available(); err != nil {
		if os.Getenv("KVBM_REQUIRE_UCX") == "1" {
			t.Fatalf("KVBM_REQUIRE_UCX=1 but UCX does not load: %v", err)
		}
		return routes
	}
	if ucxCannotReachDevice() != "" {
		return routes
	}
	return append(routes, "ucx")
}

// scopeRoute starts the exporter process and the decode worker of route.
func scopeRoute(t *testing.T, route string) (*exporter, *testWorker) {
	switch route {
	case "tcp":
		return startExporter(t, 0xA, "KVBM_SAME_HOST=0"), decodeWorker(t, 10*time.Second)
	case "ucx":
		network, err := remote.Open("ucx", remote.OpenOptions{})
		require.NoError(t, err)
		return startExporter(t, 0xA, "KVBM_TRANSPORT=ucx"), decodeWorkerOn(t, 10*time.Second, network)
	}
	return startExporter(t, 0xA), decodeWorker(t, 10*time.Second)
}

// A decode holding request A's scoped metadata reads A's blocks and
// cannot read request B's, nor G1 when A's scope is G2's, nor write:
// across processes, over TCP and on the same host. Two requests' scopes
// of one prefill are connected at once through one peer, and each leaves
// at its disconnect, taking its blocks with it. Over UCX's message mode
// too.
func TestRequestScopedMetadataReadsThatRequestsBlocksOnly(t *testing.T) {
	for _, route := range scopeRoutes(t) {
		t.Run(route, func(t *testing.T) {
			exp, dec := scopeRoute(t, route)
			size := testConfig(1).BlockSize()
			const a, b InstanceID = 0xA1, 0xB1
			require.NoError(t, dec.ConnectRemote(a, [][]byte{exp.scoped(t, G1, 3, 4)}))
			require.NoError(t, dec.ConnectRemote(b, [][]byte{exp.scoped(t, G1, 9)}))
			dec.mu.RLock()
			require.Len(t, dec.peers, 1, "one peer for the prefill's worker")
			require.Len(t, dec.members, 2)
			dec.mu.RUnlock()
			pull := func(inst InstanceID, tier Tier, src, dst int) error {
				n, err := dec.ExecuteRemoteOnboardForInstance(inst, tier, []int{src}, G2, []int{dst}, transfer.Options{})
				if err != nil {
					return err
				}
				return n.WaitTimeout(-1)
			}
			for _, p := range []struct {
				inst     InstanceID
				src, dst int
			}{{a, 3, 0}, {a, 4, 1}, {b, 9, 2}} {
				require.NoError(t, pull(p.inst, G1, p.src, p.dst), "instance %x block %d", p.inst, p.src)
				require.Equal(t, pattern(size, uint64(G1)<<8|uint64(p.src)), dec.read(t, G2, p.dst))
			}
			// A's capability, B's blocks or another's: refused. (Both scopes
			// name G1's layout, so the peer routes by block: block 5 is
			// nobody's, and block 9 is B's, which A's instance reaches only
			// while B is connected; the server refuses anything a member
			// asks beyond its own scope, tcp's tests show.)
			dec.write(t, G2, 5, pattern(size, 0xFFFF))
			require.ErrorIs(t, pull(a, G1, 5, 5), transfer.ErrUnsupported, "block 5 is in no scope")
			require.Equal(t, pattern(size, 0xFFFF), dec.read(t, G2, 5), "nothing read")
			require.ErrorIs(t, pull(a, G2, 3, 5), transfer.ErrNotFound, "A's metadata names no G2")
			h := requireRemote(t, dec, a, G1)
			n, err := dec.ExecuteRemoteOffload(G2, []int{0}, RemoteLayout(h, []int{3}), transfer.Options{})
			if err == nil {
				err = n.WaitTimeout(-1)
			}
			require.ErrorIs(t, err, transfer.ErrUnsupported, "no write")
			exp.check(t, G1, 3, uint64(G1)<<8|3)

			require.NoError(t, dec.DisconnectRemote(b))
			require.ErrorIs(t, pull(a, G1, 9, 2), transfer.ErrUnsupported, "B's blocks left with B")
			require.NoError(t, pull(a, G1, 3, 0), "A still reads its own")
			require.NoError(t, dec.DisconnectRemote(a))
			dec.mu.RLock()
			require.Empty(t, dec.peers)
			require.Empty(t, dec.members)
			dec.mu.RUnlock()
			require.ErrorIs(t, pull(a, G1, 3, 0), transfer.ErrNotFound, "A disconnected")
		})
	}
}

// revoke asks the exporter process to revoke blocks of tier, returning
// what it answered.
func (e *exporter) revoke(t *testing.T, tier Tier, blocks ...int) string {
	t.Helper()
	s := make([]string, len(blocks))
	for i, b := range blocks {
		s[i] = fmt.Sprint(b)
	}
	return e.command(t, fmt.Sprintf("revoke %d %s", tier, strings.Join(s, ",")))
}

// Request A's scoped metadata dies with A: once the prefill revokes A's
// blocks (they go to request B), the decode still connected with A's
// capability reads none of them, while B's, made afterwards for the same
// blocks, reads them. Across processes, over TCP, on the same host and
// over UCX's message mode.
// A revocation names registered tiers and blocks inside them, or is
// refused whole.
func TestRevokedBlocksAreReadByNoEarlierScope(t *testing.T) {
	for _, route := range scopeRoutes(t) {
		t.Run(route, func(t *testing.T) {
			exp, dec := scopeRoute(t, route)
			size := testConfig(1).BlockSize()
			const a, b InstanceID = 0xA1, 0xB1
			pull := func(inst InstanceID, src, dst int) error {
				n, err := dec.ExecuteRemoteOnboardForInstance(inst, G1, []int{src}, G2, []int{dst}, transfer.Options{})
				if err != nil {
					return err
				}
				return n.WaitTimeout(-1)
			}
			pullTo := func(inst InstanceID, src int, tier Tier, dst int) error {
				n, err := dec.ExecuteRemoteOnboardForInstance(inst, G1, []int{src}, tier, []int{dst}, transfer.Options{})
				if err != nil {
					return err
				}
				return n.WaitTimeout(-1)
			}
			require.NoError(t, dec.ConnectRemote(a, [][]byte{exp.scoped(t, G1, 3, 4)}))
			require.NoError(t, pull(a, 3, 0))
			require.NoError(t, pullTo(a, 3, G1, 6)) // primes the decode's bounce with block 3
			require.Equal(t, pattern(size, uint64(G1)<<8|3), dec.read(t, G1, 6))
			require.Equal(t, "revoked", exp.revoke(t, G1, 3))
			dec.write(t, G2, 1, pattern(size, 0xFFFF))
			err := pull(a, 3, 1)
			require.ErrorIs(t, err, transfer.ErrUnsupported, "A's capability no longer reads block 3")
			require.ErrorContains(t, err, "revoked")
			require.Equal(t, pattern(size, 0xFFFF), dec.read(t, G2, 1), "nothing landed")
			// Into G1 (device memory: two hops through a bounce that holds
			// block 3's bytes from the pull before the revocation): nothing
			// lands either.
			dec.write(t, G1, 7, pattern(size, 0xFFFE))
			require.ErrorContains(t, pullTo(a, 3, G1, 7), "revoked")
			require.Equal(t, pattern(size, 0xFFFE), dec.read(t, G1, 7), "the bounce's stale bytes did not land")
			require.NoError(t, pull(a, 4, 1), "block 4 is still A's")

			require.NoError(t, dec.ConnectRemote(b, [][]byte{exp.scoped(t, G1, 3)}))
			require.NoError(t, pull(b, 3, 2), "B's capability, made after the revocation")
			require.Equal(t, pattern(size, uint64(G1)<<8|3), dec.read(t, G2, 2))

			for what, answer := range map[string]string{
				"block past G1": exp.revoke(t, G1, 4, 1<<20),
				"G3":            exp.revoke(t, G3, 0),
			} {
				require.True(t, strings.HasPrefix(answer, "error "), "%s: %s", what, answer)
			}
			require.NoError(t, pull(a, 4, 1), "a refused revocation revoked nothing")
		})
	}
}
