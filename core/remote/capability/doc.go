// Package capability is what makes exported metadata a capability, with
// no socket in it: the keys (one file per kind, as tailscale's types/key),
// the hello that proves one, and the scopes a key grants. It opens no
// connection and starts no goroutine; the TCP transport and its same-host
// route (core/remote/tcp) call it on both sides of every connection.
//
// A serving transport draws a Secret when it starts listening; its
// exported endpoint carries the Key of one scope, derived from it
// (secret.go), so that the metadata is the capability. Every connection
// proves the key both ways before a request is read, in one round trip
// after the connect:
//
//	server → challenge: nonce sn [32]                     (at accept)
//	client → hello:     magic "KVBT" | version u16 | client worker u64 |
//	                    nonce cn [32] | HMAC(key, "kvbm-tcp client" | sn | cn | server worker u64 | client worker u64) |
//	                    scope length u16 | scope descriptor (a block scope's, blockscope.go; none for the others)
//	server → proof:     HMAC(key, "kvbm-tcp server" | sn | cn | server worker u64 | client worker u64)
//
// The key the proofs are made under is the scope's HelloKey: the scope's
// key itself, or, with a deployment key, derived from both
// (hellokey.go). A block scope's key is HMAC(secret, descriptor), so the
// server keeps nothing per export: the descriptor the hello carries is
// the one whose key proved it (verify.go).
//
// The server answers nothing but its nonce to a client that has not
// proved the key: a wrong key, another worker's metadata, a tampered or
// replayed hello (the server's nonce is fresh) are closed on with nothing
// said, the reason going to the server's log. The client checks the
// server's proof in turn, so that a process that took over the address
// is not sent a byte of a write nor believed for a read. The scope is the
// key that verified: a read-only key cannot write.
//
// Secrets (Secret, Key, HelloKey, Deployment) cannot be compared with ==
// (== is not constant-time: Key.Equal is), print as redacted whatever the
// verb, and refuse to be marshalled; a Key's bytes reach an endpoint only
// through AppendTo. fmt cannot reach Format through an unexported field, so
// a struct that holds one must not be printed with %+v or %#v.
package capability
