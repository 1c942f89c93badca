// Package tcp is the network transport that always works: plain TCP
// streams between any two processes (transport.go, the peer in peer.go,
// the server in server.go, the wire format in wire.go, what a proved
// capability lets a connection do in auth.go and scope.go, optional TLS in
// tls.go, the budget of connections still at their hello in admission.go,
// the other bounds on what peers may hold in limits.go), and the same-host
// route (the exporter's side in samehost_server.go, the importer's in
// samehost_peer.go), over which two processes of one host talk on a Unix
// socket and map each other's shared host layouts. The keys, the hello that proves one and the scopes are
// package capability's, which opens no socket.
//
// It implements the remote.Transport seam and registers itself as "tcp"
// when it is linked in (register.go): what KVBM_TRANSPORT=tcp and "auto"
// open through remote.Open.
package tcp
