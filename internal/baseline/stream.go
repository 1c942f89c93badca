package baseline

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// The plain TCP stream: the limit of a network transport between two
// processes (or two workers of one), one connection moving the bytes with
// nothing around them. ServeStream runs on one side; Stream dials it.

// ServeStream answers stream requests on ln until it is closed: 'r' n
// writes the first n bytes of mem, 'w' n reads n bytes into mem and answers
// one byte. mem should be as large as the transfers it stands beside, so
// that the stream moves as many distinct bytes.
func ServeStream(ln net.Listener, mem []byte) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var head [9]byte
			for {
				if _, err := io.ReadFull(c, head[:]); err != nil {
					return
				}
				n := min(binary.LittleEndian.Uint64(head[1:]), uint64(len(mem)))
				var err error
				if head[0] == 'r' {
					_, err = c.Write(mem[:n])
				} else {
					_, err = io.ReadFull(c, mem[:n])
					if err == nil {
						_, err = c.Write(head[:1])
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// Stream is a connection to a ServeStream server.
type Stream struct{ c net.Conn }

// DialStream connects to a ServeStream server.
func DialStream(addr string) (*Stream, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("baseline stream: %w", err)
	}
	return &Stream{c: c}, nil
}

// Pull reads len(dst) bytes from the server into dst and returns how long
// that took; Push writes src to it.
func (s *Stream) Pull(dst []byte) (time.Duration, error) { return s.move(dst, true) }

// Push writes src to the server and returns how long that took.
func (s *Stream) Push(src []byte) (time.Duration, error) { return s.move(src, false) }

func (s *Stream) move(buf []byte, pull bool) (time.Duration, error) {
	t0 := time.Now()
	var head [9]byte
	head[0] = 'w'
	if pull {
		head[0] = 'r'
	}
	binary.LittleEndian.PutUint64(head[1:], uint64(len(buf)))
	if _, err := s.c.Write(head[:]); err != nil {
		return 0, fmt.Errorf("baseline stream: %w", err)
	}
	var err error
	if pull {
		_, err = io.ReadFull(s.c, buf)
	} else if _, err = s.c.Write(buf); err == nil {
		_, err = io.ReadFull(s.c, head[:1])
	}
	if err != nil {
		return 0, fmt.Errorf("baseline stream: %w", err)
	}
	return time.Since(t0), nil
}

// Close closes the connection.
func (s *Stream) Close() error { return s.c.Close() }
