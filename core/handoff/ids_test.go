package handoff

import (
	"encoding/hex"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// A HandoffID reads as a UUID, 8-4-4-4-12 lowercase hex, as encoding/hex
// would write its groups (handoff does without encoding/hex: it imports os).
func TestHandoffIDString(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		var id HandoffID
		for i := range id {
			id[i] = byte(r.Uint32())
		}
		h := hex.EncodeToString(id[:])
		require.Equal(t, h[0:8]+"-"+h[8:12]+"-"+h[12:16]+"-"+h[16:20]+"-"+h[20:32], id.String())
	}
	require.Equal(t, "00000000-0000-0000-0000-000000000000", HandoffID{}.String())
}
