package capability

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
)

// NonceLen and ProofLen are the sizes of each side's nonce and proof.
const (
	NonceLen = 32
	ProofLen = sha256.Size
)

// The labels of the two sides' proofs.
const (
	labelClient = "kvbm-tcp client"
	labelServer = "kvbm-tcp server"
)

// Transcript is what both proofs of one handshake cover: the server's
// nonce (its challenge), the client's, and both workers.
type Transcript struct {
	SN, CN         []byte
	Server, Client uint64
}

// NewNonce draws a nonce from the OS.
func NewNonce() ([]byte, error) {
	n := make([]byte, NonceLen)
	if _, err := rand.Read(n); err != nil {
		return nil, err
	}
	return n, nil
}

// proof is one side's MAC over both nonces and both workers.
func (k HelloKey) proof(label string, t Transcript) []byte {
	m := hmac.New(sha256.New, k.k)
	m.Write([]byte(label))
	m.Write(t.SN)
	m.Write(t.CN)
	var ids [16]byte
	binary.LittleEndian.PutUint64(ids[:], t.Server)
	binary.LittleEndian.PutUint64(ids[8:], t.Client)
	m.Write(ids[:])
	return m.Sum(nil)
}

// ServerProof is the server's answer to a hello that verified under k.
func (k HelloKey) ServerProof(t Transcript) []byte { return k.proof(labelServer, t) }

// CheckServerProof reports, in constant time, whether got is the
// server's proof under k: whether the server holds the key too.
func (k HelloKey) CheckServerProof(t Transcript, got []byte) bool {
	return hmac.Equal(got, k.proof(labelServer, t))
}

// checkClientProof reports, in constant time, whether got is the
// client's proof under k.
func (k HelloKey) checkClientProof(t Transcript, got []byte) bool {
	return hmac.Equal(k.proof(labelClient, t), got)
}
