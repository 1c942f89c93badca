// Package tcp is the network transport that always works: plain TCP
// streams between any two processes (transport.go, the peer in peer.go,
// the server in server.go, the wire format in wire.go, the hello that
// proves the metadata's key in auth.go, optional TLS in tls.go), and the same-host
// route (samehost.go), over which two processes of one host talk on a Unix
// socket and map each other's shared host layouts.
//
// It implements the remote.Transport seam and registers itself as "tcp"
// when it is linked in (register.go): what KVBM_TRANSPORT=tcp and "auto"
// open through remote.Open.
package tcp
